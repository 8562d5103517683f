/* common/worker.h: one background thread that runs posted jobs in order. For work that must
 * leave an event loop's thread (tokenizing a prompt, say) but needs no pool. util_worker_stop
 * runs what is still queued, then joins. Any thread may post; start and stop from the owner. */
#ifndef LLMGW_COMMON_WORKER_H
#define LLMGW_COMMON_WORKER_H

#include "common/err.h"

typedef struct util_worker util_worker;

/* A job: fn(arg) on the worker thread. The job struct is the caller's (embed it in yours);
 * it must stay alive until fn has run. */
typedef struct util_job {
    void (*fn)(void *arg);
    void *arg;
    struct util_job *next;
} util_job;

int  util_worker_start(util_worker **out, const char *name, util_err *err);
/* Runs every job still queued, then joins the thread. NULL is a no-op. */
void util_worker_stop(util_worker *w);
/* Queues j (fn and arg set by the caller). Jobs posted while util_worker_stop drains the queue
 * still run; none may be posted after it returned. */
void util_worker_post(util_worker *w, util_job *j);

#endif
