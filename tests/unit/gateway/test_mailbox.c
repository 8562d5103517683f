/* tests/unit/gateway/test_mailbox.c: letters from several threads reach the loop, each thread's
 * in the order it posted them, every one exactly once; what is left at free is handed back. */
#include "gateway/mailbox.h"

#include <event2/event.h>
#include <event2/thread.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>

#include "tests/unit/unit.h"

enum { THREADS = 4, PER_THREAD = 20000 };

typedef struct note {
    gw_letter link;
    int thread, seq;
} note;

typedef struct sink {
    int got;
    int last[THREADS];
    bool in_order;
    struct event_base *base;
} sink;

static void on_mail(gw_letter *first, void *arg)
{
    sink *s = arg;
    for (gw_letter *l = first, *n; l != NULL; l = n) {
        n = l->next;
        note *x = (note *)l;
        if (x->seq != s->last[x->thread] + 1)
            s->in_order = false;
        s->last[x->thread] = x->seq;
        s->got++;
        free(x);
    }
    if (s->got == THREADS * PER_THREAD)
        event_base_loopbreak(s->base);
}

typedef struct poster {
    gw_mailbox *m;
    int thread;
} poster;

static void *post_many(void *arg)
{
    poster *p = arg;
    for (int i = 1; i <= PER_THREAD; i++) {
        note *x = malloc(sizeof *x);
        x->thread = p->thread;
        x->seq = i;
        gw_mailbox_post(p->m, &x->link);
    }
    return NULL;
}

static void threads_to_loop(void **state)
{
    (void)state;
    struct event_base *base = event_base_new();
    sink s = {.in_order = true, .base = base};
    gw_mailbox *m = gw_mailbox_new(base, on_mail, &s);
    assert_non_null(m);
    pthread_t t[THREADS];
    poster p[THREADS];
    for (int i = 0; i < THREADS; i++) {
        p[i] = (poster){m, i};
        pthread_create(&t[i], NULL, post_many, &p[i]);
    }
    /* A timer guards against a lost wake-up: the test fails instead of hanging. */
    struct timeval limit = {20, 0};
    event_base_loopexit(base, &limit);
    event_base_dispatch(base);
    for (int i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
    assert_int_equal(s.got, THREADS * PER_THREAD);
    assert_true(s.in_order);
    assert_null(gw_mailbox_free(m));
    event_base_free(base);
}

static void leftovers_are_handed_back(void **state)
{
    (void)state;
    struct event_base *base = event_base_new();
    sink s = {.in_order = true, .base = base};
    gw_mailbox *m = gw_mailbox_new(base, on_mail, &s);
    note a = {.thread = 0, .seq = 1}, b = {.thread = 0, .seq = 2};
    gw_mailbox_post(m, &a.link);
    gw_mailbox_post(m, &b.link);
    gw_letter *left = gw_mailbox_free(m);  /* the loop never ran: both come back, in order */
    assert_ptr_equal(left, &a.link);
    assert_ptr_equal(left->next, &b.link);
    assert_null(b.link.next);
    assert_int_equal(s.got, 0);
    assert_null(gw_mailbox_free(NULL));
    event_base_free(base);
}

int main(void)
{
    evthread_use_pthreads();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(threads_to_loop),
        cmocka_unit_test(leftovers_are_handed_back),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
