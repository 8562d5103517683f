/* kernels/shadow.h: the CPU backend under a GPU's memory discipline, the CPU twin that tests
 * the device path of everything above kernels/ where no GPU is (device name "shadow").
 *
 * Its buffers are host memory the host may not touch: between the backend's calls they are
 * PROT_NONE, so an activation read in place, logits not copied out or a weight never placed
 * faults at once; every float, weight or page pointer an entry takes must lie inside one of
 * its buffers (it aborts naming the entry and the argument otherwise), and host_memory is
 * false, so models place their weights and copy results out exactly as on a GPU. The
 * arithmetic is the CPU backend's, so results equal the CPU's bit for bit. Slower than the CPU
 * backend (a few mprotect calls per call): for tests and debugging. */
#ifndef LLMGW_KERNELS_SHADOW_H
#define LLMGW_KERNELS_SHADOW_H

#include "kernels/backend.h"

/* The shadow backend over a CPU backend of n_threads threads; NULL on failure. */
kern_backend *kern_shadow_new(int n_threads);

#endif
