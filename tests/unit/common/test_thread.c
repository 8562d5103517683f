/* tests/unit/common/test_thread.c: a thread started by util_thread_start runs its function
 * with its argument, carries its (cut) name, and blocks the signals the loop thread handles. */
#include "common/thread.h"

#include <signal.h>
#include <string.h>

#include "tests/unit/unit.h"

typedef struct seen {
    int arg;
    char name[16];
    int term_blocked, hup_blocked, usr1_blocked;
} seen;

static void *body(void *arg)
{
    seen *s = arg;
    s->arg = 42;
    pthread_getname_np(pthread_self(), s->name, sizeof s->name);
    sigset_t cur;
    pthread_sigmask(SIG_BLOCK, NULL, &cur);
    s->term_blocked = sigismember(&cur, SIGTERM);
    s->hup_blocked = sigismember(&cur, SIGHUP);
    s->usr1_blocked = sigismember(&cur, SIGUSR1);
    return NULL;
}

static void runs_named_with_signals_blocked(void **state)
{
    (void)state;
    seen s = {0};
    pthread_t t;
    util_err err = {0};
    assert_int_equal(util_thread_start(&t, "sched-a-very-long-tier-name", body, &s, &err), 0);
    util_thread_join(t);
    assert_int_equal(s.arg, 42);
    assert_string_equal(s.name, "sched-a-very-lo");   /* 15 characters kept */
    assert_int_equal(s.term_blocked, 1);
    assert_int_equal(s.hup_blocked, 1);
    assert_int_equal(s.usr1_blocked, 0);              /* only the loop's signals */
    /* The caller's own mask is as it was. */
    sigset_t cur;
    pthread_sigmask(SIG_BLOCK, NULL, &cur);
    assert_int_equal(sigismember(&cur, SIGTERM), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(runs_named_with_signals_blocked),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
