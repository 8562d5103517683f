// kernels/cuda/mmv.cu: a weight matrix times up to KERN_CUDA_MMV_MAX activation rows (decode
// and small batches), for every weight type: one warp per weight row, each lane decoding whole
// 32-weight chunks in registers (kernels/cuda/quant.cuh) and dotting them with every token's
// matching activations, so each weight byte is read once per call whatever the token count.
#include "kernels/cuda/quant.cuh"

namespace {

constexpr int kWarps = 4;   // weight rows per block

template <int T, int NT>
__global__ void mmv_kernel(const uint8_t *w, size_t row_bytes, int64_t rows, int64_t cols,
                           const float *x, int n_tok, float *y, int64_t ldy, bool vec)
{
    int64_t r = (int64_t)blockIdx.x * kWarps + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (r >= rows)
        return;
    const uint8_t *row = w + (size_t)r * row_bytes;
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; t++)
        acc[t] = 0.0f;
    int64_t chunks = cols / 32;
    for (int64_t c = lane; c < chunks; c += 32) {
        float v[32];
        kern_cuda_chunk<T>(row, c, v);
#pragma unroll
        for (int t = 0; t < NT; t++) {
            if (t >= n_tok)
                break;
            const float4 *xp = (const float4 *)(x + (size_t)t * (size_t)cols + c * 32);
            float s = 0.0f;
            if (vec) {
#pragma unroll
                for (int j = 0; j < 8; j++) {
                    float4 f = xp[j];
                    s += v[4 * j] * kern_cuda_act<T>(f.x) + v[4 * j + 1] * kern_cuda_act<T>(f.y) +
                         v[4 * j + 2] * kern_cuda_act<T>(f.z) +
                         v[4 * j + 3] * kern_cuda_act<T>(f.w);
                }
            } else {
                const float *xs = x + (size_t)t * (size_t)cols + c * 32;
#pragma unroll
                for (int j = 0; j < 32; j++)
                    s += v[j] * kern_cuda_act<T>(xs[j]);
            }
            acc[t] += s;
        }
    }
    for (int64_t e = chunks * 32 + lane; e < cols; e += 32) {   // float types' tail
        float wv = kern_cuda_elem<T>(row, e);
#pragma unroll
        for (int t = 0; t < NT; t++)
            if (t < n_tok)
                acc[t] += wv * kern_cuda_act<T>(x[(size_t)t * (size_t)cols + e]);
    }
#pragma unroll
    for (int t = 0; t < NT; t++) {
        if (t >= n_tok)
            break;
        float s = kern_cuda_warp_sum(acc[t]);
        if (lane == 0)
            y[(size_t)t * (size_t)ldy + r] = s;
    }
}

template <int T> struct mmv_run {
    static void run(kern_cuda *c, const kern_tensor *w, const float *x, int n_tok, float *y,
                    int64_t ldy)
    {
        dim3 grid(kern_cuda_blocks((size_t)w->rows, kWarps)), block(32 * kWarps);
        const uint8_t *wd = (const uint8_t *)w->data;
        bool vec = (w->cols & 3) == 0 && ((uintptr_t)x & 15) == 0;   // float4 loads of x
        kern_cuda_mmv_tokens(n_tok, [&](auto nt) {
            mmv_kernel<T, decltype(nt)::value><<<grid, block, 0, c->stream>>>(
                wd, w->row_bytes, w->rows, w->cols, x, n_tok, y, ldy, vec);
        });
        KERN_CUDA_LAUNCHED();
    }
};

}  // namespace

void kern_cuda_mmv(kern_cuda *c, const kern_tensor *w, const float *x, int n_tok, float *y,
                   int64_t ldy)
{
    KERN_CUDA_DISPATCH(w->type, mmv_run, c, w, x, n_tok, y, ldy);
}
