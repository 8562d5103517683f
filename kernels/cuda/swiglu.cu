// kernels/cuda/swiglu.cu: y = silu(gate) * up, elementwise; y may equal gate.
#include "kernels/cuda/internal.cuh"

namespace {

__global__ void swiglu_kernel(float *y, const float *gate, const float *up, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float g = gate[i];
        y[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

}  // namespace

void kern_cuda_swiglu(void *ctx, float *y, const float *gate, const float *up, size_t n)
{
    kern_cuda *c = (kern_cuda *)ctx;
    kern_cuda_enter(c);
    if (n == 0)
        return;
    swiglu_kernel<<<kern_cuda_blocks(n, 256), 256, 0, c->stream>>>(y, gate, up, n);
    KERN_CUDA_LAUNCHED();
}
