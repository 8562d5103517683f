/* kernels/cuda/device.h: the CUDA side, built only when nvcc is found (LLMGW_HAVE_CUDA). */
#ifndef LLMGW_KERNELS_CUDA_DEVICE_H
#define LLMGW_KERNELS_CUDA_DEVICE_H

#ifdef __cplusplus
extern "C" {
#endif

/* Number of usable CUDA devices; 0 when there is no driver or no GPU (never an error). */
int kern_cuda_device_count(void);

#ifdef __cplusplus
}
#endif

#endif
