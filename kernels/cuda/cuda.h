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

/* Decode steps as CUDA graphs (kern_backend.step_record): off unless LLMGW_CUDA_GRAPHS=1 is
 * set when the backend is made (whether they pay is measured by scripts/gpu-check). Steps of
 * up to KERN_CUDA_GRAPH_MAX_TOK tokens whose products all go through the backend's own kernels
 * (not cuBLAS: any product of up to 8 tokens, quantized weights up to 64 in int8): a recording
 * that reaches a cuBLAS product is dropped, and steps of its key and size are not recorded
 * again. What a CUDA backend did with them so far: */
enum { KERN_CUDA_GRAPH_MAX_TOK = 64 };   /* the largest step recorded, in tokens */
typedef struct kern_cuda_graph_stats {
    unsigned long long steps;     /* steps run as one graph launch */
    unsigned long long built;     /* graphs instantiated anew */
    unsigned long long updated;   /* steps that updated the graph of an earlier step in place */
    unsigned long long dropped;   /* recordings that failed (the step then ran unrecorded) */
} kern_cuda_graph_stats;
/* b's counts (zeros for a backend that is not a CUDA one). */
kern_cuda_graph_stats kern_cuda_graphs(const kern_backend *b);

#ifdef __cplusplus
}
#endif

#endif
