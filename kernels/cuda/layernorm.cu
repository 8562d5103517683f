// kernels/cuda/layernorm.cu: x = (x - mean) / sqrt(var + eps) w + b per row, in place (BERT);
// one block per row, mean first, then the variance about it.
#include "kernels/cuda/internal.cuh"

namespace {

__global__ void layernorm_kernel(float *x, const float *w, const float *b, int64_t n, float eps)
{
    __shared__ float red[32];
    float *xr = x + (size_t)blockIdx.x * (size_t)n;
    float s = 0.0f;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
        s += xr[i];
    float mean = kern_cuda_block_sum(s, red) / (float)n;
    float v = 0.0f;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
        v += (xr[i] - mean) * (xr[i] - mean);
    float inv = 1.0f / sqrtf(kern_cuda_block_sum(v, red) / (float)n + eps);
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
        xr[i] = (xr[i] - mean) * inv * w[i] + b[i];
}

}  // namespace

void kern_cuda_layernorm(void *ctx, float *x, const float *w, const float *b, int64_t n,
                         int n_tok, float eps)
{
    kern_cuda *c = (kern_cuda *)ctx;
    kern_cuda_enter(c);
    if (n_tok <= 0)
        return;
    layernorm_kernel<<<n_tok, KERN_CUDA_ROW_THREADS, 0, c->stream>>>(x, w, b, n, eps);
    KERN_CUDA_LAUNCHED();
}
