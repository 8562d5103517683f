/* kernels/cuda/cuda.h: the CUDA backend's contract, built only when nvcc is found
 * (LLMGW_HAVE_CUDA); kernels/device.c opens it for "cuda" and "cuda:N" devices. */
#ifndef LLMGW_KERNELS_CUDA_CUDA_H
#define LLMGW_KERNELS_CUDA_CUDA_H

#ifdef __cplusplus
extern "C" {
#endif

#include "kernels/backend.h"

#include <stddef.h>

/* Number of usable CUDA devices; 0 when there is no driver or no GPU (never an error). */
int kern_cuda_device_count(void);

/* A CUDA backend on device index (its own stream and cuBLAS handle), or NULL with why (a
 * sentence naming the device) written into why[cap]. */
kern_backend *kern_cuda_backend_new(int index, char *why, size_t cap);

#ifdef __cplusplus
}
#endif

#endif
