// kernels/cuda/mmvq.cu: quantized weights (Q4_0, Q4_1, Q8_0, Q4_K, Q6_K) times up to
// KERN_CUDA_MMV_MAX activation rows in integer arithmetic, as llama.cpp's CUDA backend and our
// CPU backend multiply them: each activation row is first rounded to int8 in blocks of 32 (a
// scale d = max|x| / 127 and the rounded block's sum s = d * sum(q) per block); then one warp
// per weight row, each lane taking whole 32-weight chunks, multiplies the chunk's small integers
// with the activations' int8 four at a time (__dp4a) and applies the scales once a chunk. The
// f32 path (mmv.cu) spends a byte load, a shift, a mask, a conversion and two FMAs on every
// weight (Q4_K: 8.1 instructions a weight in the compiled sm_90a loop), more than an H100
// issues per byte its memory delivers at 4.5 bits a weight; this one 2.7 (Q4_K; 1.5 to 4.7 for
// the others). LLMGW_CUDA_MMV=f32 keeps the f32 path (to measure one against the other).
#include "kernels/cuda/internal.cuh"

#include <float.h>

namespace {

constexpr int kWarps = 4;   // weight rows per block

// 32 consecutive weights as eight words of four 8-bit integers (weight 4i + b in byte b of
// q[i]), and what turns their dot product with an activation block into its float sum:
// a * d_x * sum(q q_x) + b * s_x, where d_x and s_x are the activation block's scale and sum.
// Q6_K instead has two scales, sc0 and sc1, for the chunk's two halves of 16 and offsets its
// 6-bit values by 32: a * d_x * sum over halves h of sc_h (sum(q q_x) - 32 sum(q_x)).
struct qchunk {
    int q[8];
    float a, b;
    int sc0, sc1;
};

// 4 bytes at an address that is only 2-aligned, as a word.
__device__ __forceinline__ int ld32_a2(const uint8_t *p)
{
    const unsigned short *h = (const unsigned short *)p;
    return (int)((unsigned)h[0] | ((unsigned)h[1] << 16));
}

template <int T>
__device__ __forceinline__ void load_chunk(const uint8_t *row, int64_t c, qchunk &k);
// The alignment load_chunk<T>'s loads need of a row: 2 bytes (18, 34 and 210-byte blocks read
// in halves) but for Q4_1 (4) and Q4_K (16).
template <int T> constexpr size_t kAlign = 2;
template <> constexpr size_t kAlign<KERN_TYPE_Q4_1> = 4;
template <> constexpr size_t kAlign<KERN_TYPE_Q4_K> = 16;

// Q4_0: f16 d, 16 bytes of nibbles (weight j < 16 low nibble of byte j, j + 16 high); (q - 8) d.
template <>
__device__ __forceinline__ void load_chunk<KERN_TYPE_Q4_0>(const uint8_t *row, int64_t c,
                                                           qchunk &k)
{
    const uint8_t *b = row + c * 18;
    float d = kern_cuda_ld_f16(b);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        int u = ld32_a2(b + 2 + 4 * i);
        k.q[i] = u & 0x0f0f0f0f;
        k.q[i + 4] = (u >> 4) & 0x0f0f0f0f;
    }
    k.a = d;
    k.b = -8.0f * d;
}

// Q4_1: f16 d, f16 m, nibbles as Q4_0; q d + m.
template <>
__device__ __forceinline__ void load_chunk<KERN_TYPE_Q4_1>(const uint8_t *row, int64_t c,
                                                           qchunk &k)
{
    const uint8_t *b = row + c * 20;
    const int *qs = (const int *)(b + 4);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        int u = qs[i];
        k.q[i] = u & 0x0f0f0f0f;
        k.q[i + 4] = (u >> 4) & 0x0f0f0f0f;
    }
    k.a = kern_cuda_ld_f16(b);
    k.b = kern_cuda_ld_f16(b + 2);
}

// Q8_0: f16 d, 32 int8; q d.
template <>
__device__ __forceinline__ void load_chunk<KERN_TYPE_Q8_0>(const uint8_t *row, int64_t c,
                                                           qchunk &k)
{
    const uint8_t *b = row + c * 34;
#pragma unroll
    for (int i = 0; i < 8; i++)
        k.q[i] = ld32_a2(b + 2 + 4 * i);
    k.a = kern_cuda_ld_f16(b);
    k.b = 0.0f;
}

// Q4_K: chunk j of a 144-byte super-block, nibbles from qs[32 (j / 2) ..] (low half for even
// j), 6-bit scale sc_j and min m_j; d sc_j q - dmin m_j (quant.cuh spells the layout out).
template <>
__device__ __forceinline__ void load_chunk<KERN_TYPE_Q4_K>(const uint8_t *row, int64_t c,
                                                           qchunk &k)
{
    const uint8_t *b = row + (c / 8) * 144;
    int j = (int)(c % 8);
    // The super-block's first 16 bytes at once: d and dmin, then scales bytes 0-3, 4-7, 8-11.
    int4 hd = *(const int4 *)b;
    const int4 *qs = (const int4 *)(b + 16 + 32 * (j / 2));
    unsigned lo = (unsigned)hd.y, mid = (unsigned)hd.z, hi = (unsigned)hd.w;
    int sc, m;
    if (j < 4) {   // s[j] & 63, s[j + 4] & 63
        sc = (int)((lo >> (8 * j)) & 63);
        m = (int)((mid >> (8 * j)) & 63);
    } else {       // s[j + 4]'s low and high nibbles, the top bits of s[j - 4] and s[j] above
        int e = 8 * (j - 4);
        sc = (int)(((hi >> e) & 15) | (((lo >> (e + 6)) & 3) << 4));
        m = (int)(((hi >> (e + 4)) & 15) | (((mid >> (e + 6)) & 3) << 4));
    }
    int shift = (j & 1) * 4;
    int4 u0 = qs[0], u1 = qs[1];
    int u[8] = {u0.x, u0.y, u0.z, u0.w, u1.x, u1.y, u1.z, u1.w};
#pragma unroll
    for (int i = 0; i < 8; i++)
        k.q[i] = (u[i] >> shift) & 0x0f0f0f0f;
    k.a = __half2float(__ushort_as_half((unsigned short)(hd.x & 0xffff))) * (float)sc;
    k.b = -__half2float(__ushort_as_half((unsigned short)((unsigned)hd.x >> 16))) * (float)m;
}

// Q6_K: chunk j = 4h + k of a 210-byte super-block: low 4 bits from ql[64h + 32 (k & 1) + l]
// (low nibble for k < 2), top 2 bits from bits 2k, 2k+1 of qh[32h + l]; d scales[2j + half]
// (q - 32).
template <>
__device__ __forceinline__ void load_chunk<KERN_TYPE_Q6_K>(const uint8_t *row, int64_t c,
                                                           qchunk &k)
{
    const uint8_t *b = row + (c / 8) * 210;
    int j = (int)(c % 8), h = j / 4, kk = j % 4;
    const uint8_t *ql = b + 64 * h + 32 * (kk & 1), *qh = b + 128 + 32 * h;
    int lo_shift = kk < 2 ? 0 : 4, hi_shift = 2 * kk;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        int lo = (ld32_a2(ql + 4 * i) >> lo_shift) & 0x0f0f0f0f;
        int hi = (ld32_a2(qh + 4 * i) >> hi_shift) & 0x03030303;
        k.q[i] = lo | (hi << 4);
    }
    const int8_t *sc = (const int8_t *)(b + 192);
    k.a = kern_cuda_ld_f16(b + 208);
    k.sc0 = sc[2 * j];
    k.sc1 = sc[2 * j + 1];
}

// The chunk's float sum against one activation block: its 32 int8 (16-byte aligned) and (d, s).
template <int T>
__device__ __forceinline__ float chunk_dot(const qchunk &k, const int4 *xq, float2 ds)
{
    int4 x0 = xq[0], x1 = xq[1];
    int x[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
    if constexpr (T == KERN_TYPE_Q6_K) {
        int s0 = 0, s1 = 0, n0 = 0, n1 = 0;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            s0 = __dp4a(k.q[i], x[i], s0);
            n0 = __dp4a(0x01010101, x[i], n0);
            s1 = __dp4a(k.q[i + 4], x[i + 4], s1);
            n1 = __dp4a(0x01010101, x[i + 4], n1);
        }
        return k.a * ds.x * (float)(k.sc0 * (s0 - 32 * n0) + k.sc1 * (s1 - 32 * n1));
    } else {
        int s = 0;
#pragma unroll
        for (int i = 0; i < 8; i++)
            s = __dp4a(k.q[i], x[i], s);
        return k.a * ds.x * (float)s + k.b * ds.y;
    }
}

// Blocks of 32 activations to int8: one warp a block, a lane a value. A block holding a NaN or
// an infinity gets a NaN scale (so the products say so, as the f32 path's would) and zeros.
__global__ void quantize_q8_kernel(const float *x, int8_t *q, float2 *ds, size_t n_blocks)
{
    size_t blk = (size_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (blk >= n_blocks)   // whole warps: a warp is one block
        return;
    int lane = threadIdx.x & 31;
    float v = x[blk * 32 + lane];
    bool bad = !(fabsf(v) <= FLT_MAX);
    float amax = kern_cuda_warp_max(bad ? 0.0f : fabsf(v));
    bool any_bad = kern_cuda_warp_max(bad ? 1.0f : 0.0f) > 0.0f;
    float d = amax / 127.0f;
    int qi = any_bad || amax == 0.0f ? 0 : (int)roundf(v / d);
    q[blk * 32 + lane] = (int8_t)qi;
    float sum = kern_cuda_warp_sum((float)qi);   // exact: at most 32 * 127
    if (lane == 0)
        ds[blk] = any_bad ? float2{NAN, NAN} : float2{d, d * sum};
}

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
        qchunk k;
        load_chunk<T>(row, c, k);
#pragma unroll
        for (int t = 0; t < NT; t++) {
            if (t >= n_tok)
                break;
            const int4 *xp = (const int4 *)(xq + (size_t)t * (size_t)cols + (size_t)c * 32);
            acc[t] += chunk_dot<T>(k, xp, xds[(size_t)t * (size_t)chunks + (size_t)c]);
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

// Rounds x's n_tok rows to int8 and launches the kernel for weight type T; false, with nothing
// done, for weights placed where its loads cannot go.
template <int T>
bool mmvq_run(kern_cuda *c, const kern_tensor *w, const float *x, int n_tok, float *y,
              int64_t ldy)
{
    if (((uintptr_t)w->data | w->row_bytes) % kAlign<T> != 0 || w->cols % 32 != 0)
        return false;
    size_t n = (size_t)n_tok * (size_t)w->cols, n_blocks = n / 32;
    int8_t *xq = (int8_t *)kern_cuda_scratch(c, &c->xh, &c->xh_cap,
                                             n + n_blocks * sizeof(float2));
    float2 *xds = (float2 *)(xq + n);   // n is a multiple of 32: 8-aligned
    quantize_q8_kernel<<<kern_cuda_blocks(n, KERN_CUDA_ROW_THREADS), KERN_CUDA_ROW_THREADS, 0,
                         c->stream>>>(x, xq, xds, n_blocks);
    KERN_CUDA_LAUNCHED();
    dim3 grid(kern_cuda_blocks((size_t)w->rows, kWarps)), block(32 * kWarps);
    const uint8_t *wd = (const uint8_t *)w->data;
    kern_cuda_mmv_tokens(n_tok, [&](auto nt) {
        mmvq_kernel<T, decltype(nt)::value><<<grid, block, 0, c->stream>>>(
            wd, w->row_bytes, w->rows, w->cols, xq, xds, n_tok, y, ldy);
    });
    KERN_CUDA_LAUNCHED();
    return true;
}

}  // namespace

bool kern_cuda_mmvq(kern_cuda *c, const kern_tensor *w, const float *x, int n_tok, float *y,
                    int64_t ldy)
{
    switch (w->type) {
    case KERN_TYPE_Q4_0: return mmvq_run<KERN_TYPE_Q4_0>(c, w, x, n_tok, y, ldy);
    case KERN_TYPE_Q4_1: return mmvq_run<KERN_TYPE_Q4_1>(c, w, x, n_tok, y, ldy);
    case KERN_TYPE_Q8_0: return mmvq_run<KERN_TYPE_Q8_0>(c, w, x, n_tok, y, ldy);
    case KERN_TYPE_Q4_K: return mmvq_run<KERN_TYPE_Q4_K>(c, w, x, n_tok, y, ldy);
    case KERN_TYPE_Q6_K: return mmvq_run<KERN_TYPE_Q6_K>(c, w, x, n_tok, y, ldy);
    default: return false;   // float weights: mmv.cu
    }
}
