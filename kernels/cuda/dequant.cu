// kernels/cuda/dequant.cu: f16 copies for cuBLAS — a weight matrix decoded to f16 for one
// batched product (into the backend's scratch, for that call only: the weights themselves stay
// in their own type) and activation rows converted to f16 or bf16.
#include "kernels/cuda/quant.cuh"

namespace {

// One thread per 32-weight chunk (and the tail weights of a float row one by one).
template <int T>
__global__ void dequant_kernel(const uint8_t *w, size_t row_bytes, int64_t rows, int64_t cols,
                               __half *dst)
{
    int64_t chunks = (cols + 31) / 32;
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows * chunks)
        return;
    int64_t r = i / chunks, c = i % chunks;
    const uint8_t *row = w + (size_t)r * row_bytes;
    __half *out = dst + (size_t)r * (size_t)cols + c * 32;
    if ((c + 1) * 32 <= cols) {
        float v[32];
        kern_cuda_chunk<T>(row, c, v);
#pragma unroll
        for (int j = 0; j < 32; j++)
            out[j] = __float2half_rn(v[j]);
    } else {
        for (int64_t e = c * 32; e < cols; e++)
            dst[(size_t)r * (size_t)cols + e] = __float2half_rn(kern_cuda_elem<T>(row, e));
    }
}

template <int T> struct dequant_run {
    static void run(kern_cuda *c, const kern_tensor *w, __half *dst)
    {
        size_t n = (size_t)w->rows * (size_t)((w->cols + 31) / 32);
        dequant_kernel<T><<<kern_cuda_blocks(n, 256), 256, 0, c->stream>>>(
            (const uint8_t *)w->data, w->row_bytes, w->rows, w->cols, dst);
        KERN_CUDA_LAUNCHED();
    }
};

__global__ void f32_to_f16_kernel(const float *x, __half *y, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        y[i] = __float2half_rn(x[i]);
}

__global__ void f32_to_bf16_kernel(const float *x, __nv_bfloat16 *y, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        y[i] = __float2bfloat16_rn(x[i]);
}

}  // namespace

void kern_cuda_f32_to_bf16(kern_cuda *c, const float *x, __nv_bfloat16 *y, size_t n)
{
    if (n == 0)
        return;
    f32_to_bf16_kernel<<<kern_cuda_blocks(n, 256), 256, 0, c->stream>>>(x, y, n);
    KERN_CUDA_LAUNCHED();
}

void kern_cuda_dequant_f16(kern_cuda *c, const kern_tensor *w, __half *dst)
{
    KERN_CUDA_DISPATCH(w->type, dequant_run, c, w, dst);
}

void kern_cuda_f32_to_f16(kern_cuda *c, const float *x, __half *y, size_t n)
{
    if (n == 0)
        return;
    f32_to_f16_kernel<<<kern_cuda_blocks(n, 256), 256, 0, c->stream>>>(x, y, n);
    KERN_CUDA_LAUNCHED();
}
