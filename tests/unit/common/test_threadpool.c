/* tests/unit/common/test_threadpool.c: util_pool (every thread runs each part exactly once per
 * run, across many back-to-back runs, after the workers have gone to sleep, and with uneven work)
 * and util_pool_split (exact, near-equal cover); a second caller during a run stops the process
 * with the reason instead of hanging. */
#include "common/threadpool.h"

#include "tests/unit/unit.h"

#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static void split_covers_range(void **state)
{
    (void)state;
    for (long n = 0; n < 200; n++)
        for (int nth = 1; nth <= 9; nth++) {
            long expect_lo = 0;
            for (int i = 0; i < nth; i++) {
                long lo, hi;
                util_pool_split(n, i, nth, &lo, &hi);
                assert_int_equal(lo, expect_lo);
                assert_true(hi >= lo);
                assert_true(hi - lo == n / nth || hi - lo == n / nth + 1);
                expect_lo = hi;
            }
            assert_int_equal(expect_lo, n);
        }
}

typedef struct counts {
    _Atomic long calls[8];
    _Atomic long bad_nth;
    long work;                 /* iterations of busy work per call, varied by ith */
    volatile long sink;
} counts;

static void count_fn(void *arg, int ith, int nth)
{
    counts *c = arg;
    atomic_fetch_add(&c->calls[ith], 1);
    if (nth < 1 || nth > 8)
        atomic_fetch_add(&c->bad_nth, 1);
    long s = 0;
    for (long i = 0; i < c->work * (ith + 1); i++)
        s += i;
    c->sink = s;
}

static void check_runs(int n_threads, long runs, long work)
{
    util_pool *p = NULL;
    assert_int_equal(util_pool_new(&p, n_threads), 0);
    assert_int_equal(util_pool_size(p), n_threads);
    counts *c = calloc(1, sizeof *c);
    c->work = work;
    for (long r = 0; r < runs; r++) {
        util_pool_run(p, count_fn, c);
        /* Every part has finished when run returns: the counts are exact after each run. */
        for (int i = 0; i < n_threads; i++)
            if (atomic_load(&c->calls[i]) != r + 1) {
                print_error("run %ld thread %d: %ld calls\n", r, i, atomic_load(&c->calls[i]));
                fail();
            }
    }
    assert_int_equal(atomic_load(&c->bad_nth), 0);
    for (int i = n_threads; i < 8; i++)
        assert_int_equal(atomic_load(&c->calls[i]), 0);
    free(c);
    util_pool_free(p);
}

static void single_thread_runs_inline(void **state)
{
    (void)state;
    check_runs(1, 1000, 0);
}

static void many_back_to_back_runs(void **state)
{
    (void)state;
    check_runs(2, 100000, 0);
    check_runs(4, 20000, 0);
    /* More threads than cores: workers are often descheduled between seeing a run and claiming
     * their part, and the caller takes their parts; each must still run exactly once. */
    check_runs(8, 20000, 0);
}

static void uneven_work(void **state)
{
    (void)state;
    check_runs(3, 2000, 500);
}

/* The workers fall asleep after a fraction of a millisecond idle; runs must still wake them. */
static void runs_after_sleep(void **state)
{
    (void)state;
    util_pool *p = NULL;
    assert_int_equal(util_pool_new(&p, 3), 0);
    counts *c = calloc(1, sizeof *c);
    for (int r = 0; r < 20; r++) {
        struct timespec ts = {0, 2 * 1000 * 1000};
        nanosleep(&ts, NULL);
        util_pool_run(p, count_fn, c);
        util_pool_run(p, count_fn, c);
    }
    for (int i = 0; i < 3; i++)
        assert_int_equal(atomic_load(&c->calls[i]), 40);
    free(c);
    util_pool_free(p);
}

/* A lingering pool: runs during the linger (workers polling with sched_yield), after it
 * (workers asleep again), and a free while they linger, which must not wait the linger out. */
static void runs_while_lingering(void **state)
{
    (void)state;
    util_pool *p = NULL;
    assert_int_equal(util_pool_new(&p, 3), 0);
    util_pool_set_linger(p, 30ull * 1000 * 1000);
    counts *c = calloc(1, sizeof *c);
    static const long sleeps_ms[] = {1, 5, 1, 40, 2};
    for (int r = 0; r < 5; r++) {
        struct timespec ts = {0, sleeps_ms[r] * 1000 * 1000};
        nanosleep(&ts, NULL);
        util_pool_run(p, count_fn, c);
    }
    for (int i = 0; i < 3; i++)
        assert_int_equal(atomic_load(&c->calls[i]), 5);
    util_pool_set_linger(p, 10ull * 1000 * 1000 * 1000);  /* 10 s: free must not wait for it */
    util_pool_run(p, count_fn, c);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    util_pool_free(p);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    assert_true(t1.tv_sec - t0.tv_sec < 5);
    free(c);
}

typedef struct sum_job {
    const int *v;
    long n;
    long partial[8];
} sum_job;

static void sum_fn(void *arg, int ith, int nth)
{
    sum_job *j = arg;
    long lo, hi, s = 0;
    util_pool_split(j->n, ith, nth, &lo, &hi);
    for (long i = lo; i < hi; i++)
        s += j->v[i];
    j->partial[ith] = s;
}

/* What a kernel does: split an array, each part writes its own slot, the owner reads them all. */
static void parallel_sum(void **state)
{
    (void)state;
    enum { N = 100003 };
    int *v = malloc(N * sizeof *v);
    long expect = 0;
    for (long i = 0; i < N; i++) {
        v[i] = (int)(i * 7919 % 1000) - 500;
        expect += v[i];
    }
    util_pool *p = NULL;
    assert_int_equal(util_pool_new(&p, 4), 0);
    for (int r = 0; r < 500; r++) {
        sum_job j = {.v = v, .n = N - r};
        util_pool_run(p, sum_fn, &j);
        long s = 0;
        for (int i = 0; i < 4; i++)
            s += j.partial[i];
        long e = expect;
        for (long i = N - r; i < N; i++)
            e -= v[i];
        assert_int_equal(s, e);
    }
    util_pool_free(p);
    free(v);
}

static void create_and_free_many(void **state)
{
    (void)state;
    for (int i = 0; i < 50; i++) {
        util_pool *p = NULL;
        assert_int_equal(util_pool_new(&p, 1 + i % 4), 0);
        if (i % 2 == 0)
            check_runs(1 + i % 4, 3, 0);
        util_pool_free(p);
    }
    util_pool_free(NULL);
}

static util_pool *g_nested_pool;

static void nested_fn(void *arg, int ith, int nth)
{
    (void)arg;
    (void)nth;
    if (ith == 0)
        util_pool_run(g_nested_pool, sum_fn, NULL);   /* never returns: aborts */
}

/* Two callers on one pool would overwrite each other's run and wait for ever; the pool notices
 * and aborts. A nested run from part 0 is the simplest second caller. */
static void second_caller_aborts(void **state)
{
    (void)state;
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        if (util_pool_new(&g_nested_pool, 2) != 0)
            _exit(2);
        util_pool_run(g_nested_pool, nested_fn, NULL);
        _exit(0);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFSIGNALED(status));
    assert_int_equal(WTERMSIG(status), SIGABRT);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(split_covers_range),
        cmocka_unit_test(second_caller_aborts),
        cmocka_unit_test(single_thread_runs_inline),
        cmocka_unit_test(many_back_to_back_runs),
        cmocka_unit_test(uneven_work),
        cmocka_unit_test(runs_after_sleep),
        cmocka_unit_test(runs_while_lingering),
        cmocka_unit_test(parallel_sum),
        cmocka_unit_test(create_and_free_many),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
