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

/* Many times: the name must be set before the body runs (it used to be set after create). */
static void runs_named_with_signals_blocked(void **state)
{
    (void)state;
    sigset_t before;
    pthread_sigmask(SIG_BLOCK, NULL, &before);   /* whatever the test runner gave us */
    seen s = {0};
    for (int i = 0; i < 200; i++) {
        memset(&s, 0, sizeof s);
        pthread_t t;
        util_err err = {0};
        assert_int_equal(util_thread_start(&t, "sched-a-very-long-tier-name", body, &s, &err), 0);
        util_thread_join(t);
        assert_int_equal(s.arg, 42);
        assert_string_equal(s.name, "sched-a-very-lo");   /* 15 characters kept */
    }
    assert_int_equal(s.term_blocked, 1);
    assert_int_equal(s.hup_blocked, 1);
    /* Only the loop's signals are added: others stay as the caller had them. */
    assert_int_equal(s.usr1_blocked, sigismember(&before, SIGUSR1));
    /* The caller's own mask is as it was. */
    sigset_t cur;
    pthread_sigmask(SIG_BLOCK, NULL, &cur);
    assert_int_equal(sigismember(&cur, SIGTERM), sigismember(&before, SIGTERM));
    assert_int_equal(sigismember(&cur, SIGHUP), sigismember(&before, SIGHUP));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(runs_named_with_signals_blocked),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
