// kernels/cuda/get_rows.cu: embedding lookup, y[i] = W[ids[i]] as f32, for every weight type
// (one block per id, one thread per 32-weight chunk).
#include "kernels/cuda/quant.cuh"

namespace {

template <int T>
__global__ void get_rows_kernel(const uint8_t *w, size_t row_bytes, int64_t cols,
                                const int32_t *ids, float *y)
{
    const uint8_t *row = w + (size_t)ids[blockIdx.x] * row_bytes;
    float *out = y + (size_t)blockIdx.x * (size_t)cols;
    int64_t chunks = cols / 32;
    for (int64_t c = threadIdx.x; c < chunks; c += blockDim.x) {
        float v[32];
        kern_cuda_chunk<T>(row, c, v);
#pragma unroll
        for (int j = 0; j < 32; j++)
            out[c * 32 + j] = v[j];
    }
    for (int64_t e = chunks * 32 + threadIdx.x; e < cols; e += blockDim.x)
        out[e] = kern_cuda_elem<T>(row, e);
}

template <int T> struct get_rows_run {
    static void run(kern_cuda *c, const kern_tensor *w, const int32_t *ids, int n, float *y)
    {
        get_rows_kernel<T><<<n, 128, 0, c->stream>>>((const uint8_t *)w->data, w->row_bytes,
                                                     w->cols, ids, y);
        KERN_CUDA_LAUNCHED();
    }
};

}  // namespace

void kern_cuda_get_rows(void *ctx, const kern_tensor *w, const int32_t *ids, int n, float *y)
{
    kern_cuda *c = (kern_cuda *)ctx;
    kern_cuda_enter(c);
    if (n <= 0)
        return;
    const int32_t *d_ids = (const int32_t *)kern_cuda_stage(c, ids, (size_t)n * sizeof *ids);
    KERN_CUDA_DISPATCH(w->type, get_rows_run, c, w, d_ids, n, y);
}
