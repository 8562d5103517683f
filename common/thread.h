/* common/thread.h: starting and joining llmgw's own threads, in one place. Every background
 * thread (engine schedulers, the encoder, kernel pool workers, job workers) starts here: it is
 * named (as top, perf and gdb show it) and blocks the signals the event loop handles (SIGTERM,
 * SIGINT, SIGHUP, SIGPIPE), so they always reach the loop thread. */
#ifndef LLMGW_COMMON_THREAD_H
#define LLMGW_COMMON_THREAD_H

#include "common/err.h"

#include <pthread.h>

/* fn(arg) on a new thread called `name` (at most 15 characters are kept). 0, or LLMGW_EIO with
 * a message naming the thread. */
int  util_thread_start(pthread_t *t, const char *name, void *(*fn)(void *), void *arg,
                       util_err *err);
/* Waits for the thread to return. */
void util_thread_join(pthread_t t);

#endif
