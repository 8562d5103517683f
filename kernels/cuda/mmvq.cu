// kernels/cuda/mmvq.cu: quantized weights (Q4_0, Q4_1, Q8_0, Q4_K, Q6_K) times up to
// KERN_CUDA_MMV_MAX activation rows in integer arithmetic, as llama.cpp's CUDA backend and our
// CPU backend multiply them: each activation row is first rounded to int8 in blocks of 32 (a
// scale d = max|x| / 127 and the rounded block's sum s = d * sum(q) per block: quantize_q8.cu);
// then one warp per weight row, each lane taking whole 32-weight chunks, multiplies the chunk's
// small integers with the activations' int8 four at a time (__dp4a) and applies the scales once
// a chunk (kernels/cuda/qdot.cuh). The f32 path (mmv.cu) spends a byte load, a shift, a mask, a
// conversion and two FMAs on every weight (Q4_K: 8.1 instructions a weight in the compiled
// sm_90a loop), more than an H100 issues per byte its memory delivers at 4.5 bits a weight; this
// one 2.1 at one token (Q4_K; Q4_0 1.5, Q4_1 1.2, Q8_0 1.8, Q6_K 4.75). LLMGW_CUDA_QUANT=f32
// keeps the f32 path (to measure one against the other).
#include "kernels/cuda/qdot.cuh"

namespace {

constexpr int kWarps = 4;   // weight rows per block

template <int T, int NT>
__global__ void mmvq_kernel(const uint8_t *w, size_t row_bytes, int64_t rows, int64_t cols,
                            const int8_t *xq, const float2 *xds, int n_tok, float *y,
                            int64_t ldy)
{
    int64_t r = (int64_t)blockIdx.x * kWarps + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (r >= rows)
        return;
    const uint8_t *row = w + (size_t)r * row_bytes;
    int64_t chunks = cols / 32;
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; t++)
        acc[t] = 0.0f;
    for (int64_t c = lane; c < chunks; c += 32) {
        kern_cuda_qchunk k;
        kern_cuda_qload<T>(row, c, k);
#pragma unroll
        for (int t = 0; t < NT; t++) {
            if (t >= n_tok)
                break;
            const int4 *xp = (const int4 *)(xq + (size_t)t * (size_t)cols + (size_t)c * 32);
            acc[t] = kern_cuda_qdot<T>(k, xp, xds[(size_t)t * (size_t)chunks + (size_t)c], acc[t]);
        }
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

}  // namespace

bool kern_cuda_mmvq(kern_cuda *c, const kern_tensor *w, const float *x, int n_tok, float *y,
                    int64_t ldy)
{
    return kern_cuda_qrun(c, w, x, n_tok, [&](auto type, const int8_t *xq, const float2 *xds) {
        constexpr int T = decltype(type)::value;
        dim3 grid(kern_cuda_blocks((size_t)w->rows, kWarps)), block(32 * kWarps);
        const uint8_t *wd = (const uint8_t *)w->data;
        kern_cuda_mmv_tokens(n_tok, [&](auto nt) {
            mmvq_kernel<T, decltype(nt)::value><<<grid, block, 0, c->stream>>>(
                wd, w->row_bytes, w->rows, w->cols, xq, xds, n_tok, y, ldy);
        });
        KERN_CUDA_LAUNCHED();
    });
}
