/* tests/unit/common/test_worker.c: jobs run on the worker's thread, in the order posted (also
 * when several threads post), exactly once; stop runs what is still queued before it joins. */
#include "common/worker.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#include "tests/unit/unit.h"

typedef struct job {
    util_job j;
    int poster, seq;
    int *last;                 /* [posters]: the last seq run per poster */
    atomic_int *ran;
    atomic_int *out_of_order;
    pthread_t *ran_on;
} job;

static void run(void *arg)
{
    job *x = arg;
    if (x->seq != x->last[x->poster] + 1)
        atomic_fetch_add(x->out_of_order, 1);
    x->last[x->poster] = x->seq;
    *x->ran_on = pthread_self();
    atomic_fetch_add(x->ran, 1);
}

static void in_order_on_its_thread(void **state)
{
    (void)state;
    util_worker *w = NULL;
    util_err err = {0};
    assert_int_equal(util_worker_start(&w, "test-worker", &err), 0);
    enum { N = 10000 };
    job *jobs = calloc(N, sizeof *jobs);
    int last[1] = {-1};
    atomic_int ran = 0, bad = 0;
    pthread_t on = pthread_self();
    for (int i = 0; i < N; i++) {
        jobs[i] = (job){.j = {.fn = run, .arg = &jobs[i]}, .poster = 0, .seq = i, .last = last,
                        .ran = &ran, .out_of_order = &bad, .ran_on = &on};
        util_worker_post(w, &jobs[i].j);
    }
    util_worker_stop(w);           /* drains: every job ran before it returns */
    assert_int_equal(atomic_load(&ran), N);
    assert_int_equal(atomic_load(&bad), 0);
    assert_false(pthread_equal(on, pthread_self()));
    free(jobs);
}

typedef struct poster {
    util_worker *w;
    job *jobs;
    int n;
} poster;

static void *post_all(void *arg)
{
    poster *p = arg;
    for (int i = 0; i < p->n; i++)
        util_worker_post(p->w, &p->jobs[i].j);
    return NULL;
}

static void many_posters(void **state)
{
    (void)state;
    enum { P = 4, N = 5000 };
    util_worker *w = NULL;
    util_err err = {0};
    assert_int_equal(util_worker_start(&w, "test-worker", &err), 0);
    job *jobs = calloc(P * N, sizeof *jobs);
    int last[P] = {-1, -1, -1, -1};
    atomic_int ran = 0, bad = 0;
    pthread_t on;
    poster ps[P];
    pthread_t th[P];
    for (int p = 0; p < P; p++) {
        for (int i = 0; i < N; i++)
            jobs[p * N + i] = (job){.j = {.fn = run, .arg = &jobs[p * N + i]}, .poster = p,
                                    .seq = i, .last = last, .ran = &ran, .out_of_order = &bad,
                                    .ran_on = &on};
        ps[p] = (poster){w, jobs + p * N, N};
        pthread_create(&th[p], NULL, post_all, &ps[p]);
    }
    for (int p = 0; p < P; p++)
        pthread_join(th[p], NULL);
    util_worker_stop(w);
    assert_int_equal(atomic_load(&ran), P * N);
    assert_int_equal(atomic_load(&bad), 0);   /* each poster's jobs in its order */
    free(jobs);
}

static void stop_idle_and_null(void **state)
{
    (void)state;
    util_worker *w = NULL;
    util_err err = {0};
    assert_int_equal(util_worker_start(&w, "a-name-longer-than-fifteen", &err), 0);
    usleep(1000);                  /* the thread waits on its condition */
    util_worker_stop(w);
    util_worker_stop(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(in_order_on_its_thread),
        cmocka_unit_test(many_posters),
        cmocka_unit_test(stop_idle_and_null),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
