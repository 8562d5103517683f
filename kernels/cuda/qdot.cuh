// kernels/cuda/qdot.cuh: quantized weights against activations rounded to int8, 32 weights at
// a time, as llama.cpp's CUDA backend and our CPU backend multiply them: a chunk of 32 weights
// is decoded to small integers in registers (never to memory) and dotted with an activation
// block's int8 four at a time (__dp4a), the scales applied once a chunk. Shared by the
// matrix-vector kernel (mmvq.cu, up to KERN_CUDA_MMV_MAX tokens) and the small-batch one
// (mmq.cu); the activations are rounded by quantize_q8.cu.
#ifndef LLMGW_KERNELS_CUDA_QDOT_CUH
#define LLMGW_KERNELS_CUDA_QDOT_CUH

#include "kernels/cuda/internal.cuh"

// 32 consecutive weights as eight words of four 8-bit integers (weight 4i + b in byte b of
// q[i]), and what turns their dot product with an activation block into its float sum:
// a * d_x * sum(q q_x) + b * s_x, where d_x and s_x are the activation block's scale and sum.
// Q6_K instead has two scales, sc0 and sc1, for the chunk's two halves of 16 and offsets its
// 6-bit values by 32: a * d_x * sum over halves h of sc_h (sum(q q_x) - 32 sum(q_x)).
struct kern_cuda_qchunk {
    int q[8];
    float a, b;
    int sc0, sc1;
};

// 4 bytes at an address that is only 2-aligned, as a word.
__device__ __forceinline__ int kern_cuda_ld32_a2(const uint8_t *p)
{
    const unsigned short *h = (const unsigned short *)p;
    return (int)((unsigned)h[0] | ((unsigned)h[1] << 16));
}

// A chunk's bytes as loaded (kern_cuda_qfetch), before they are decoded (kern_cuda_qdecode):
// the loads can be issued a step before the decoding waits for them. Each type uses the first
// few words (at most 18, Q6_K's).
struct kern_cuda_qraw {
    int v[18];
};

// Chunk c (weights 32c .. 32c + 31) of a row of type T: its loads into r, and their decoding.
template <int T>
__device__ __forceinline__ void kern_cuda_qfetch(const uint8_t *row, int64_t c, kern_cuda_qraw &r);
template <int T>
__device__ __forceinline__ void kern_cuda_qdecode(const kern_cuda_qraw &r, int64_t c,
                                                  kern_cuda_qchunk &k);
// The alignment kern_cuda_qfetch<T>'s loads need of a row: 2 bytes (18, 34 and 210-byte
// blocks read in halves) but for Q4_1 (4) and Q4_K (16).
template <int T> constexpr size_t kern_cuda_qalign = 2;
template <> constexpr size_t kern_cuda_qalign<KERN_TYPE_Q4_1> = 4;
template <> constexpr size_t kern_cuda_qalign<KERN_TYPE_Q4_K> = 16;

__device__ __forceinline__ float kern_cuda_f16_bits(int h)
{
    return __half2float(__ushort_as_half((unsigned short)(h & 0xffff)));
}

// Words 1-4 of r as 32 nibbles (weight j < 16 the low nibble of byte j, j + 16 the high): Q4_0's
// and Q4_1's.
__device__ __forceinline__ void kern_cuda_qnibbles(const kern_cuda_qraw &r, kern_cuda_qchunk &k)
{
#pragma unroll
    for (int i = 0; i < 4; i++) {
        k.q[i] = r.v[1 + i] & 0x0f0f0f0f;
        k.q[i + 4] = (r.v[1 + i] >> 4) & 0x0f0f0f0f;
    }
}

// Q4_0: f16 d, 16 bytes of nibbles (weight j < 16 low nibble of byte j, j + 16 high); (q - 8) d.
template <>
__device__ __forceinline__ void kern_cuda_qfetch<KERN_TYPE_Q4_0>(const uint8_t *row, int64_t c,
                                                                 kern_cuda_qraw &r)
{
    const uint8_t *b = row + c * 18;
    r.v[0] = *(const unsigned short *)b;
#pragma unroll
    for (int i = 0; i < 4; i++)
        r.v[1 + i] = kern_cuda_ld32_a2(b + 2 + 4 * i);
}
template <>
__device__ __forceinline__ void kern_cuda_qdecode<KERN_TYPE_Q4_0>(const kern_cuda_qraw &r,
                                                                  int64_t, kern_cuda_qchunk &k)
{
    kern_cuda_qnibbles(r, k);
    k.a = kern_cuda_f16_bits(r.v[0]);
    k.b = -8.0f * k.a;
}

// Q4_1: f16 d, f16 m, nibbles as Q4_0; q d + m.
template <>
__device__ __forceinline__ void kern_cuda_qfetch<KERN_TYPE_Q4_1>(const uint8_t *row, int64_t c,
                                                                 kern_cuda_qraw &r)
{
    const int *b = (const int *)(row + c * 20);
#pragma unroll
    for (int i = 0; i < 5; i++)
        r.v[i] = b[i];
}
template <>
__device__ __forceinline__ void kern_cuda_qdecode<KERN_TYPE_Q4_1>(const kern_cuda_qraw &r,
                                                                  int64_t, kern_cuda_qchunk &k)
{
    kern_cuda_qnibbles(r, k);
    k.a = kern_cuda_f16_bits(r.v[0]);
    k.b = kern_cuda_f16_bits((int)((unsigned)r.v[0] >> 16));
}

// Q8_0: f16 d, 32 int8; q d.
template <>
__device__ __forceinline__ void kern_cuda_qfetch<KERN_TYPE_Q8_0>(const uint8_t *row, int64_t c,
                                                                 kern_cuda_qraw &r)
{
    const uint8_t *b = row + c * 34;
    r.v[0] = *(const unsigned short *)b;
#pragma unroll
    for (int i = 0; i < 8; i++)
        r.v[1 + i] = kern_cuda_ld32_a2(b + 2 + 4 * i);
}
template <>
__device__ __forceinline__ void kern_cuda_qdecode<KERN_TYPE_Q8_0>(const kern_cuda_qraw &r,
                                                                  int64_t, kern_cuda_qchunk &k)
{
#pragma unroll
    for (int i = 0; i < 8; i++)
        k.q[i] = r.v[1 + i];
    k.a = kern_cuda_f16_bits(r.v[0]);
    k.b = 0.0f;
}

// Q4_K: chunk j of a 144-byte super-block, nibbles from qs[32 (j / 2) ..] (low half for even
// j), 6-bit scale sc_j and min m_j; d sc_j q - dmin m_j (quant.cuh spells the layout out).
// Loaded as the super-block's first 16 bytes (d and dmin, then scales bytes 0-3, 4-7, 8-11)
// and the 32 bytes of nibbles.
template <>
__device__ __forceinline__ void kern_cuda_qfetch<KERN_TYPE_Q4_K>(const uint8_t *row, int64_t c,
                                                                 kern_cuda_qraw &r)
{
    const uint8_t *b = row + (c / 8) * 144;
    const int4 *p[3] = {(const int4 *)b, (const int4 *)(b + 16 + 32 * ((c % 8) / 2)),
                        (const int4 *)(b + 32 + 32 * ((c % 8) / 2))};
#pragma unroll
    for (int i = 0; i < 3; i++) {
        int4 u = *p[i];
        r.v[4 * i] = u.x;
        r.v[4 * i + 1] = u.y;
        r.v[4 * i + 2] = u.z;
        r.v[4 * i + 3] = u.w;
    }
}
template <>
__device__ __forceinline__ void kern_cuda_qdecode<KERN_TYPE_Q4_K>(const kern_cuda_qraw &r,
                                                                  int64_t c, kern_cuda_qchunk &k)
{
    int j = (int)(c % 8);
    unsigned lo = (unsigned)r.v[1], mid = (unsigned)r.v[2], hi = (unsigned)r.v[3];
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
#pragma unroll
    for (int i = 0; i < 8; i++)
        k.q[i] = (r.v[4 + i] >> shift) & 0x0f0f0f0f;
    k.a = kern_cuda_f16_bits(r.v[0]) * (float)sc;
    k.b = -kern_cuda_f16_bits((int)((unsigned)r.v[0] >> 16)) * (float)m;
}

// Q6_K: chunk j = 4h + k of a 210-byte super-block: low 4 bits from ql[64h + 32 (k & 1) + l]
// (low nibble for k < 2), top 2 bits from bits 2k, 2k+1 of qh[32h + l]; d scales[2j + half]
// (q - 32).
template <>
__device__ __forceinline__ void kern_cuda_qfetch<KERN_TYPE_Q6_K>(const uint8_t *row, int64_t c,
                                                                 kern_cuda_qraw &r)
{
    const uint8_t *b = row + (c / 8) * 210;
    int j = (int)(c % 8), h = j / 4, kk = j % 4;
    const uint8_t *ql = b + 64 * h + 32 * (kk & 1), *qh = b + 128 + 32 * h;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        r.v[i] = kern_cuda_ld32_a2(ql + 4 * i);
        r.v[8 + i] = kern_cuda_ld32_a2(qh + 4 * i);
    }
    r.v[16] = *(const unsigned short *)(b + 192 + 2 * j);   // the chunk's two int8 scales
    r.v[17] = *(const unsigned short *)(b + 208);
}
template <>
__device__ __forceinline__ void kern_cuda_qdecode<KERN_TYPE_Q6_K>(const kern_cuda_qraw &r,
                                                                  int64_t c, kern_cuda_qchunk &k)
{
    int kk = (int)(c % 4);
    int lo_shift = kk < 2 ? 0 : 4, hi_shift = 2 * kk;
#pragma unroll
    for (int i = 0; i < 8; i++)
        k.q[i] = ((r.v[i] >> lo_shift) & 0x0f0f0f0f) |
                 (((r.v[8 + i] >> hi_shift) & 0x03030303) << 4);
    k.a = kern_cuda_f16_bits(r.v[17]);
    k.sc0 = (int)(int8_t)(r.v[16] & 0xff);
    k.sc1 = (int)(int8_t)((r.v[16] >> 8) & 0xff);
}

// Chunk c of a row of type T into k, loaded and decoded at once.
template <int T>
__device__ __forceinline__ void kern_cuda_qload(const uint8_t *row, int64_t c,
                                                kern_cuda_qchunk &k)
{
    kern_cuda_qraw r;
    kern_cuda_qfetch<T>(row, c, r);
    kern_cuda_qdecode<T>(r, c, k);
}

// acc plus the chunk's float sum against one activation block: its 32 int8 (16-byte aligned)
// and (d, s). (Added in FMAs: 3 float instructions and a conversion a chunk and token.)
template <int T>
__device__ __forceinline__ float kern_cuda_qdot(const kern_cuda_qchunk &k, const int4 *xq,
                                                float2 ds, float acc)
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
        return fmaf(k.a * ds.x, (float)(k.sc0 * (s0 - 32 * n0) + k.sc1 * (s1 - 32 * n1)), acc);
    } else {
        int s = 0;
#pragma unroll
        for (int i = 0; i < 8; i++)
            s = __dp4a(k.q[i], x[i], s);
        return fmaf(k.b, ds.y, fmaf(k.a * ds.x, (float)s, acc));
    }
}

// x's n_tok rows of cols floats (cols a multiple of 32) rounded to int8 in blocks of 32, into
// the activation scratch (quantize_q8.cu): *xq [n_tok][cols], and *xds [n_tok][cols / 32], each
// block's scale d = max|x| / 127 and its rounded sum d * sum(q). A block holding a NaN or an
// infinity gets NaN for both (its products say so, as the f32 path's would) and zeros.
void kern_cuda_quantize_q8(kern_cuda *c, const float *x, int n_tok, int64_t cols,
                           const int8_t **xq, const float2 **xds);

// The int8 kernels' way in: when they take w (a quantized type, its rows whole chunks of 32
// placed where kern_cuda_qfetch<T>'s loads can go), rounds x's n_tok rows to int8 and calls
// run(std::integral_constant<int, T>(), xq, xds) for w's type T, then returns true. False, with
// nothing done, otherwise (float weights, misplaced rows: the f32 paths take those).
template <int T, typename F>
bool kern_cuda_qrun_as(kern_cuda *c, const kern_tensor *w, const float *x, int n_tok, F &run)
{
    if (((uintptr_t)w->data | w->row_bytes) % kern_cuda_qalign<T> != 0 || w->cols % 32 != 0)
        return false;
    const int8_t *xq;
    const float2 *xds;
    kern_cuda_quantize_q8(c, x, n_tok, w->cols, &xq, &xds);
    run(std::integral_constant<int, T>(), xq, xds);
    return true;
}
template <typename F>
bool kern_cuda_qrun(kern_cuda *c, const kern_tensor *w, const float *x, int n_tok, F &&run)
{
    switch (w->type) {
    case KERN_TYPE_Q4_0: return kern_cuda_qrun_as<KERN_TYPE_Q4_0>(c, w, x, n_tok, run);
    case KERN_TYPE_Q4_1: return kern_cuda_qrun_as<KERN_TYPE_Q4_1>(c, w, x, n_tok, run);
    case KERN_TYPE_Q8_0: return kern_cuda_qrun_as<KERN_TYPE_Q8_0>(c, w, x, n_tok, run);
    case KERN_TYPE_Q4_K: return kern_cuda_qrun_as<KERN_TYPE_Q4_K>(c, w, x, n_tok, run);
    case KERN_TYPE_Q6_K: return kern_cuda_qrun_as<KERN_TYPE_Q6_K>(c, w, x, n_tok, run);
    default: return false;
    }
}

#endif
