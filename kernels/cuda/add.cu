// kernels/cuda/add.cu: residual adds, y += x, and bias rows, y[t] += b.
#include "kernels/cuda/internal.cuh"

namespace {

__global__ void add_kernel(float *y, const float *x, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        y[i] += x[i];
}

__global__ void add_row_kernel(float *y, const float *b, int64_t n, size_t total)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < total)
        y[i] += b[i % (size_t)n];
}

}  // namespace

void kern_cuda_add(void *ctx, float *y, const float *x, size_t n)
{
    kern_cuda *c = (kern_cuda *)ctx;
    kern_cuda_enter(c);
    if (n == 0)
        return;
    add_kernel<<<kern_cuda_blocks(n, 256), 256, 0, c->stream>>>(y, x, n);
    KERN_CUDA_LAUNCHED();
}

void kern_cuda_add_row(void *ctx, float *y, const float *b, int64_t n, int n_tok)
{
    kern_cuda *c = (kern_cuda *)ctx;
    kern_cuda_enter(c);
    size_t total = (size_t)n * (size_t)(n_tok > 0 ? n_tok : 0);
    if (total == 0)
        return;
    add_row_kernel<<<kern_cuda_blocks(total, 256), 256, 0, c->stream>>>(y, b, n, total);
    KERN_CUDA_LAUNCHED();
}
