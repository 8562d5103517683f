// kernels/cuda/gelu.cu: x = x / 2 (1 + erf(x / sqrt 2)) in place (BERT's exact GELU).
#include "kernels/cuda/internal.cuh"

namespace {

__global__ void gelu_kernel(float *x, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        x[i] = 0.5f * x[i] * (1.0f + erff(x[i] * 0.70710678118654752f));
}

}  // namespace

void kern_cuda_gelu(void *ctx, float *x, size_t n)
{
    kern_cuda *c = (kern_cuda *)ctx;
    kern_cuda_enter(c);
    if (n == 0)
        return;
    gelu_kernel<<<kern_cuda_blocks(n, 256), 256, 0, c->stream>>>(x, n);
    KERN_CUDA_LAUNCHED();
}
