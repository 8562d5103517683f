/* common/threadpool.h: a fixed pool of worker threads for data-parallel kernels. One run at a
 * time: util_pool_run(fn) calls fn(arg, ith, nth) once for every part ith < nth (part 0 on the
 * caller, part i on worker i, or on the caller when worker i has not started it by the time the
 * caller is done, so a descheduled worker never stalls a run) and returns when all have
 * finished. Workers spin briefly between runs (a decode step issues hundreds of runs in a few
 * milliseconds) and then sleep, so an idle pool costs no CPU.
 * Runs must come from one thread at a time (the owner). */
#ifndef LLMGW_COMMON_THREADPOOL_H
#define LLMGW_COMMON_THREADPOOL_H

#include <stdint.h>

typedef struct util_pool util_pool;

typedef void (*util_pool_fn)(void *arg, int ith, int nth);

/* n_threads >= 1 (1: no workers, runs inline). 0 or LLMGW_ENOMEM / LLMGW_EIO. */
int  util_pool_new(util_pool **out, int n_threads);
void util_pool_free(util_pool *p);  /* joins the workers; NULL is a no-op */
int  util_pool_size(const util_pool *p);
/* After their brief spin, idle workers keep polling, yielding the CPU at every check, until
 * they have been idle for ns (0, the default: they sleep at once). For pools whose runs come
 * in bursts with short gaps (the sentence encoder): a sleeping worker's CPU may take a
 * millisecond or more to be running again on a virtual machine. Any thread may call it. */
void util_pool_set_linger(util_pool *p, uint64_t ns);
void util_pool_run(util_pool *p, util_pool_fn fn, void *arg);

/* Splits [0, n) into nth near-equal parts; part ith is [*lo, *hi). */
void util_pool_split(long n, int ith, int nth, long *lo, long *hi);

#endif
