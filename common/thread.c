/* common/thread.c: see thread.h. */
#include "common/thread.h"

#include "common/arena.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct start {
    void *(*fn)(void *);
    void *arg;
    char name[16];
} start;

/* The thread names itself before anything else runs on it, so its body always sees its name. */
static void *trampoline(void *p)
{
    start st = *(start *)p;
    free(p);
    pthread_setname_np(pthread_self(), st.name);
    return st.fn(st.arg);
}

int util_thread_start(pthread_t *t, const char *name, void *(*fn)(void *), void *arg,
                      util_err *err)
{
    start *st = util_xmalloc(sizeof *st);
    st->fn = fn;
    st->arg = arg;
    snprintf(st->name, sizeof st->name, "%s", name);
    /* The new thread inherits this mask: block the loop's signals around the create. */
    sigset_t block, old;
    sigemptyset(&block);
    sigaddset(&block, SIGTERM);
    sigaddset(&block, SIGINT);
    sigaddset(&block, SIGHUP);
    sigaddset(&block, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &block, &old);
    int rc = pthread_create(t, NULL, trampoline, st);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        free(st);
        return util_err_set(err, LLMGW_EIO, "cannot start the %s thread: %s", name, strerror(rc));
    }
    return 0;
}

void util_thread_join(pthread_t t)
{
    pthread_join(t, NULL);
}
