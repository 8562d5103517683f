// kernels/cuda/device.cu: device discovery. Without a GPU or driver the count is simply 0.
#include "kernels/cuda/device.h"

#include <cuda_runtime.h>

extern "C" int kern_cuda_device_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();  // clear the sticky error
        return 0;
    }
    return n;
}
