/* kernels/device.c: device names and opening a backend on one. The CPU backend is always
 * built; the CUDA backend (kernels/cuda/) when nvcc was found, and then "auto" is the first
 * CUDA device when the machine has one. */
#include "kernels/device.h"
#include "kernels/shadow.h"
#ifdef LLMGW_HAVE_CUDA
#include "kernels/cuda/cuda.h"
#endif

#include <stdlib.h>
#include <string.h>

int kern_cuda_devices(void)
{
#ifdef LLMGW_HAVE_CUDA
    return kern_cuda_device_count();
#else
    return 0;
#endif
}

int kern_device_parse(const char *name, kern_device *out)
{
    *out = (kern_device){.kind = KERN_DEV_AUTO, .index = 0};
    if (name == NULL || strcmp(name, "auto") == 0)
        return 0;
    if (strcmp(name, "cpu") == 0 || strcmp(name, "shadow") == 0) {
        out->kind = name[0] == 'c' ? KERN_DEV_CPU : KERN_DEV_SHADOW;
        return 0;
    }
    if (strncmp(name, "cuda", 4) != 0)
        return -1;
    out->kind = KERN_DEV_CUDA;
    if (name[4] == '\0')
        return 0;
    if (name[4] != ':' || name[5] < '0' || name[5] > '9')
        return -1;
    char *end;
    long n = strtol(name + 5, &end, 10);
    if (*end != '\0' || n > 255)
        return -1;
    out->index = (int)n;
    return 0;
}

int kern_backend_open(const char *device, int n_threads, kern_backend **out, util_err *err)
{
    *out = NULL;
    kern_device d;
    if (kern_device_parse(device, &d) != 0)
        return util_err_set(err, LLMGW_EINVAL, "device '%s': expected cpu, cuda, cuda:N or auto",
                            device);
#ifdef LLMGW_HAVE_CUDA
    if (d.kind == KERN_DEV_AUTO && kern_cuda_device_count() > 0)
        d.kind = KERN_DEV_CUDA;
    if (d.kind == KERN_DEV_CUDA) {
        char why[200];
        kern_backend *b = kern_cuda_backend_new(d.index, why, sizeof why);
        if (b == NULL)
            return util_err_set(err, LLMGW_EINVAL, "%s", why);
        *out = b;
        return 0;
    }
#else
    if (d.kind == KERN_DEV_CUDA)
        return util_err_set(err, LLMGW_EINVAL, "device 'cuda:%d': llmgw was built without CUDA "
                            "(nvcc was not found at configure time); use cpu or auto", d.index);
#endif
    kern_backend *b = d.kind == KERN_DEV_SHADOW ? kern_shadow_new(n_threads)
                                                : kern_cpu_backend_new(n_threads);
    if (b == NULL)
        return util_err_set(err, LLMGW_ENOMEM, "device cpu: cannot start %d threads", n_threads);
    *out = b;
    return 0;
}

