/* common/thread.c: see thread.h. */
#include "common/thread.h"

#include <signal.h>
#include <stdio.h>
#include <string.h>

int util_thread_start(pthread_t *t, const char *name, void *(*fn)(void *), void *arg,
                      util_err *err)
{
    /* The new thread inherits this mask: block the loop's signals around the create. */
    sigset_t block, old;
    sigemptyset(&block);
    sigaddset(&block, SIGTERM);
    sigaddset(&block, SIGINT);
    sigaddset(&block, SIGHUP);
    sigaddset(&block, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &block, &old);
    int rc = pthread_create(t, NULL, fn, arg);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0)
        return util_err_set(err, LLMGW_EIO, "cannot start the %s thread: %s", name, strerror(rc));
    char short_name[16];
    snprintf(short_name, sizeof short_name, "%s", name);
    pthread_setname_np(*t, short_name);
    return 0;
}

void util_thread_join(pthread_t t)
{
    pthread_join(t, NULL);
}
