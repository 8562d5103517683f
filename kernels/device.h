/* kernels/device.h: where a backend computes, by name, and opening a backend there: the CPU
 * (always built), a CUDA device (kernels/cuda/, when nvcc was found), or the shadow CPU
 * (kernels/shadow.h). */
#ifndef LLMGW_KERNELS_DEVICE_H
#define LLMGW_KERNELS_DEVICE_H

#include "common/err.h"
#include "kernels/backend.h"

/* Where a backend computes: "cpu", "cuda" (= "cuda:0"), "cuda:N", or "auto" (the first CUDA
 * device when this build has a CUDA backend and the machine a device, else the CPU); and
 * "shadow", the CPU under a device's memory discipline, for tests (kernels/shadow.h). */
typedef struct kern_device {
    enum { KERN_DEV_AUTO, KERN_DEV_CPU, KERN_DEV_CUDA, KERN_DEV_SHADOW } kind;
    int index;   /* CUDA device number */
} kern_device;

/* Parses a device name; 0, or -1 when it is none of the above (NULL reads as "auto"). */
int kern_device_parse(const char *name, kern_device *out);

/* Opens a backend on a device with n_threads CPU threads (0 = one per online CPU): 0, or an
 * LLMGW_E* code with err saying why (a CUDA device in a build without the CUDA backend, no
 * such device, no memory). */
int kern_backend_open(const char *device, int n_threads, kern_backend **out, util_err *err);

/* CUDA devices this build can use: 0 without the CUDA backend, a driver or a GPU. */
int kern_cuda_devices(void);

#endif
