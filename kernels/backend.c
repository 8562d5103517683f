/* kernels/backend.c: choosing a backend by device name, and freeing one. The CPU backend is
 * always built; kernels/cuda/ has no kern_backend yet (only the device count), so a CUDA device
 * is refused with that reason and "auto" resolves to the CPU. */
#include "kernels/backend.h"

#ifdef LLMGW_HAVE_CUDA
#include "kernels/cuda/device.h"
#endif

#include <stdlib.h>
#include <string.h>

int kern_device_parse(const char *name, kern_device *out)
{
    *out = (kern_device){.kind = KERN_DEV_AUTO, .index = 0};
    if (name == NULL || strcmp(name, "auto") == 0)
        return 0;
    if (strcmp(name, "cpu") == 0) {
        out->kind = KERN_DEV_CPU;
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
    if (d.kind == KERN_DEV_CUDA) {
#ifdef LLMGW_HAVE_CUDA
        int n = kern_cuda_device_count();
        if (d.index >= n)
            return util_err_set(err, LLMGW_EINVAL, "device 'cuda:%d': this machine has %d CUDA "
                                "device%s", d.index, n, n == 1 ? "" : "s");
        return util_err_set(err, LLMGW_EINVAL, "device 'cuda:%d': this build's CUDA code has "
                            "no backend for models yet (use cpu or auto)", d.index);
#else
        return util_err_set(err, LLMGW_EINVAL, "device 'cuda:%d': llmgw was built without CUDA "
                            "(nvcc was not found at configure time); use cpu or auto", d.index);
#endif
    }
    kern_backend *b = kern_cpu_backend_new(n_threads);
    if (b == NULL)
        return util_err_set(err, LLMGW_ENOMEM, "device cpu: cannot start %d threads", n_threads);
    *out = b;
    return 0;
}

void kern_backend_free(kern_backend *b)
{
    if (b != NULL)
        b->destroy(b->ctx);
}
