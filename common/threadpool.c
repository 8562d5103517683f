/* common/threadpool.c: the worker pool behind the CPU kernels.
 *
 * Dispatch is one atomic generation counter. util_pool_run publishes (fn, arg), bumps the
 * generation and runs part 0 itself; each worker notices the new generation, claims its part
 * (an atomic exchange of the part's generation) and runs it. When the caller is done with part
 * 0 it claims and runs every part no worker has claimed yet, then waits for the claimed ones.
 * So a worker that is descheduled (the cores are shared with other processes) or still waking
 * from sleep costs at most its share of the work, never a scheduler time slice of waiting.
 *
 * A worker that has seen no new generation for SPIN_NS sleeps on the generation word with a
 * futex (or, with a linger set, keeps polling with sched_yield until the linger is over: other
 * threads that want the CPU get it, but the worker's CPU stays awake, which on a virtual
 * machine is what keeps a woken pool from running at half speed for the next millisecond or
 * two), and announces it in `sleepers` first, so the caller only pays for a wake-up syscall
 * when someone sleeps. Both sides use sequentially consistent operations on `gen` and
 * `sleepers`, so either the worker sees the new generation before sleeping or the caller sees
 * the sleeper (and FUTEX_WAIT re-checks the word atomically anyway): no wake-up is lost. */
#include "common/threadpool.h"

#include "common/err.h"
#include "common/thread.h"

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#elif defined(__aarch64__)
#define cpu_relax() __asm__ __volatile__("yield" ::: "memory")
#else
#define cpu_relax() ((void)0)
#endif

/* How long an idle worker spins before it sleeps: long enough to cover the gaps between the
 * runs of one decode step (a few microseconds of serial work on thread 0), short enough that an
 * idle engine stops burning CPU at once. */
#define SPIN_NS 200000ull

typedef struct worker {
    util_pool *pool;
    int ith;
    pthread_t thread;
    alignas(64) _Atomic uint32_t claim;   /* the last generation whose part ith was claimed */
} worker;

struct util_pool {
    /* Written by the owner per run, read by the workers: one cache line. */
    alignas(64) _Atomic uint32_t gen;
    util_pool_fn fn;
    void *arg;
    int n;
    _Atomic int stop;
    _Atomic uint64_t linger_ns;  /* util_pool_set_linger */
    _Atomic int running;         /* a run is in progress: a second caller is a bug */
    /* Written by the workers: parts 1..n-1 not finished yet. */
    alignas(64) _Atomic int pending;
    alignas(64) _Atomic int sleepers;
    worker *workers;
    int started;
};

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void futex_wait(_Atomic uint32_t *word, uint32_t expect)
{
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT_PRIVATE, expect, NULL, NULL, 0);
}

static void futex_wake_all(_Atomic uint32_t *word)
{
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

/* Waits until the generation differs from `seen` and returns the new one. */
static uint32_t wait_generation(util_pool *p, uint32_t seen)
{
    uint32_t g;
    for (;;) {
        uint64_t t0 = now_ns();
        for (;;) {
            for (int i = 0; i < 64; i++) {
                g = atomic_load_explicit(&p->gen, memory_order_acquire);
                if (g != seen)
                    return g;
                cpu_relax();
            }
            uint64_t idle = now_ns() - t0;
            if (idle > SPIN_NS) {
                if (idle > atomic_load_explicit(&p->linger_ns, memory_order_relaxed))
                    break;
                sched_yield();
            }
        }
        atomic_fetch_add(&p->sleepers, 1);
        if (atomic_load(&p->gen) == seen)
            futex_wait(&p->gen, seen);
        atomic_fetch_sub(&p->sleepers, 1);
    }
}

/* Runs part ith of generation g unless it is claimed already. A claim only moves forward: a
 * worker that saw generation g, was descheduled, and comes back after the caller has taken
 * part ith of g and of a later run too must not take the later one (it would run it twice).
 * While part ith of g is unclaimed, g cannot have finished, so fn and arg are g's. */
static void run_part(util_pool *p, worker *w, uint32_t g)
{
    uint32_t c = atomic_load(&w->claim);
    do {
        if ((int32_t)(c - g) >= 0)
            return;
    } while (!atomic_compare_exchange_weak(&w->claim, &c, g));
    p->fn(p->arg, w->ith, p->n);
    atomic_fetch_sub_explicit(&p->pending, 1, memory_order_release);
}

static void *worker_main(void *argp)
{
    worker *w = argp;
    util_pool *p = w->pool;
    uint32_t seen = 0;   /* the generation at creation: no run can start before the pool exists */
    for (;;) {
        seen = wait_generation(p, seen);
        if (atomic_load_explicit(&p->stop, memory_order_acquire))
            return NULL;
        run_part(p, w, seen);
    }
}

int util_pool_new(util_pool **out, int n_threads)
{
    if (n_threads < 1)
        n_threads = 1;
    util_pool *p = aligned_alloc(64, sizeof *p);
    if (p == NULL)
        return LLMGW_ENOMEM;
    *p = (util_pool){.n = n_threads};
    atomic_init(&p->gen, 0);
    atomic_init(&p->stop, 0);
    atomic_init(&p->linger_ns, 0);
    atomic_init(&p->running, 0);
    atomic_init(&p->pending, 0);
    atomic_init(&p->sleepers, 0);
    if (n_threads > 1) {
        p->workers = aligned_alloc(64, (size_t)n_threads * sizeof *p->workers);
        if (p->workers == NULL) {
            free(p);
            return LLMGW_ENOMEM;
        }
        for (int i = 1; i < n_threads; i++) {
            p->workers[i].pool = p;
            p->workers[i].ith = i;
            atomic_init(&p->workers[i].claim, 0);
            char name[16];
            snprintf(name, sizeof name, "kern-%d", i);
            util_err err = {0};
            if (util_thread_start(&p->workers[i].thread, name, worker_main, &p->workers[i],
                                  &err) != 0) {
                util_pool_free(p);
                return LLMGW_EIO;
            }
            p->started = i;
        }
    }
    *out = p;
    return 0;
}

void util_pool_free(util_pool *p)
{
    if (p == NULL)
        return;
    if (p->started > 0) {
        atomic_store(&p->stop, 1);
        atomic_fetch_add(&p->gen, 1);
        futex_wake_all(&p->gen);
        for (int i = 1; i <= p->started; i++)
            util_thread_join(p->workers[i].thread);
    }
    free(p->workers);
    free(p);
}

void util_pool_set_linger(util_pool *p, uint64_t ns)
{
    atomic_store_explicit(&p->linger_ns, ns, memory_order_relaxed);
}

int util_pool_size(const util_pool *p)
{
    return p->n;
}

void util_pool_run(util_pool *p, util_pool_fn fn, void *arg)
{
    if (p->n == 1) {
        fn(arg, 0, 1);
        return;
    }
    /* Two callers at once would overwrite each other's fn, arg and count and then wait for
     * ever: stop with the reason instead. */
    if (atomic_exchange_explicit(&p->running, 1, memory_order_acquire)) {
        fprintf(stderr, "util_pool_run: two threads run on one pool at once "
                        "(a pool takes runs from its owner only)\n");
        abort();
    }
    p->fn = fn;
    p->arg = arg;
    atomic_store_explicit(&p->pending, p->n - 1, memory_order_relaxed);
    uint32_t g = atomic_fetch_add(&p->gen, 1) + 1;   /* seq_cst: publishes fn, arg, pending */
    if (atomic_load(&p->sleepers) > 0)
        futex_wake_all(&p->gen);
    fn(arg, 0, p->n);
    for (int i = 1; i < p->n; i++)    /* parts no worker has picked up yet */
        run_part(p, &p->workers[i], g);
    /* Join the parts workers are running. One may be descheduled mid-part: after a while,
     * yield the CPU instead of spinning against it. */
    for (unsigned spins = 0; atomic_load_explicit(&p->pending, memory_order_acquire) != 0;
         spins++) {
        if (spins < 4096)
            cpu_relax();
        else
            sched_yield();
    }
    atomic_store_explicit(&p->running, 0, memory_order_release);
}

void util_pool_split(long n, int ith, int nth, long *lo, long *hi)
{
    long base = n / nth, rem = n % nth;
    *lo = ith * base + (ith < rem ? ith : rem);
    *hi = *lo + base + (ith < rem ? 1 : 0);
}
