/* kernels/timed.h: a kern_backend that hands every call to another backend and adds up the wall
 * time of each kind of call (matmuls apart by weight shape and type), so a forward's time can be
 * split into stages (llmgw-bench --stages). A host backend's calls are synchronous, so a call's
 * wall time is its whole cost: the threads' wake-ups and joins included. A device backend (not
 * host_memory) returns before its work is done: after each call the wrapper copies 4 bytes of
 * the device's out, which waits for the work queued before, so the time is the work's (plus a
 * copy's round trip, some microseconds, in every stage; steps are not recorded as graphs).
 * Profiling only: ~100 ns a call on the host. */
#ifndef LLMGW_KERNELS_TIMED_H
#define LLMGW_KERNELS_TIMED_H

#include "kernels/backend.h"

#include <stdint.h>

typedef struct kern_stage {
    char name[48];        /* "matmul 576x576 F16", "attention", "rmsnorm", ... */
    uint64_t calls;
    uint64_t ns;
} kern_stage;

/* Wraps inner (taken over: destroying the result destroys inner too, and so does a failure);
 * NULL without memory. */
kern_backend *kern_timed_new(kern_backend *inner);
/* The stages so far, most time first; returns how many (at most max). */
int kern_timed_stages(const kern_backend *timed, kern_stage *out, int max);
void kern_timed_reset(kern_backend *timed);

#endif
