// kernels/cuda/rmsnorm.cu: y = x / rms(x) * w per row (llama.cpp's form: mean of squares in
// f32, scale 1 / sqrtf(mean + eps)); one block per row, y may equal x.
#include "kernels/cuda/internal.cuh"

namespace {

__global__ void rmsnorm_kernel(float *y, const float *x, const float *w, int64_t n, float eps)
{
    __shared__ float red[32];
    const float *xr = x + (size_t)blockIdx.x * (size_t)n;
    float *yr = y + (size_t)blockIdx.x * (size_t)n;
    float s = 0.0f;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
        s += xr[i] * xr[i];
    s = kern_cuda_block_sum(s, red);
    float scale = 1.0f / sqrtf(s / (float)n + eps);
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
        yr[i] = xr[i] * scale * w[i];
}

}  // namespace

void kern_cuda_rmsnorm(void *ctx, float *y, const float *x, const float *w, int64_t n, int n_tok,
                       float eps)
{
    kern_cuda *c = (kern_cuda *)ctx;
    kern_cuda_enter(c);
    if (n_tok <= 0)
        return;
    rmsnorm_kernel<<<n_tok, KERN_CUDA_ROW_THREADS, 0, c->stream>>>(y, x, w, n, eps);
    KERN_CUDA_LAUNCHED();
}
