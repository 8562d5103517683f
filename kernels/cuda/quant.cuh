// kernels/cuda/quant.cuh: decoding 32 consecutive weights of a row of any supported type into
// registers (the block layouts of kernels/types.h, as kernels/cpu/internal.h spells them out),
// shared by the matrix-vector product, the dequantizer and get_rows. Nothing is ever decoded
// into memory except by dequant.cu.
#ifndef LLMGW_KERNELS_CUDA_QUANT_CUH
#define LLMGW_KERNELS_CUDA_QUANT_CUH

#include "kernels/cuda/internal.cuh"

// Weights 32c .. 32c + 31 of a row of type T into v.
template <int T>
__device__ __forceinline__ void kern_cuda_chunk(const uint8_t *row, int64_t c, float v[32]);

template <>
__device__ __forceinline__ void kern_cuda_chunk<KERN_TYPE_F32>(const uint8_t *row, int64_t c,
                                                               float v[32])
{
    const uint8_t *b = row + c * 128;
    if (((uintptr_t)b & 15) == 0) {   // rows of cols % 4 != 0 floats are not 16-byte aligned
        const float4 *p = (const float4 *)b;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            float4 f = p[j];
            v[4 * j] = f.x;
            v[4 * j + 1] = f.y;
            v[4 * j + 2] = f.z;
            v[4 * j + 3] = f.w;
        }
    } else {
#pragma unroll
        for (int j = 0; j < 32; j++)
            v[j] = ((const float *)b)[j];
    }
}

template <>
__device__ __forceinline__ void kern_cuda_chunk<KERN_TYPE_F16>(const uint8_t *row, int64_t c,
                                                               float v[32])
{
    const uint8_t *b = row + c * 64;
    if (((uintptr_t)b & 3) == 0) {   // rows of an odd number of halves are not 4-byte aligned
        const __half2 *p = (const __half2 *)b;
#pragma unroll
        for (int j = 0; j < 16; j++) {
            float2 f = __half22float2(p[j]);
            v[2 * j] = f.x;
            v[2 * j + 1] = f.y;
        }
    } else {
#pragma unroll
        for (int j = 0; j < 32; j++)
            v[j] = __half2float(((const __half *)b)[j]);
    }
}

template <>
__device__ __forceinline__ void kern_cuda_chunk<KERN_TYPE_BF16>(const uint8_t *row, int64_t c,
                                                                float v[32])
{
    const __nv_bfloat16 *p = (const __nv_bfloat16 *)(row + c * 64);
#pragma unroll
    for (int j = 0; j < 32; j++)
        v[j] = __bfloat162float(p[j]);
}

// Q4_0: f16 d, 16 bytes of nibbles; weight j < 16 is the low nibble of byte j, weight j + 16
// its high nibble; value (q - 8) d.
template <>
__device__ __forceinline__ void kern_cuda_chunk<KERN_TYPE_Q4_0>(const uint8_t *row, int64_t c,
                                                                float v[32])
{
    const uint8_t *b = row + c * 18;
    float d = kern_cuda_ld_f16(b);
#pragma unroll
    for (int j = 0; j < 16; j++) {
        int q = b[2 + j];
        v[j] = (float)((q & 15) - 8) * d;
        v[j + 16] = (float)((q >> 4) - 8) * d;
    }
}

// Q4_1: f16 d, f16 m, nibbles as Q4_0; value q d + m.
template <>
__device__ __forceinline__ void kern_cuda_chunk<KERN_TYPE_Q4_1>(const uint8_t *row, int64_t c,
                                                                float v[32])
{
    const uint8_t *b = row + c * 20;
    float d = kern_cuda_ld_f16(b), m = kern_cuda_ld_f16(b + 2);
#pragma unroll
    for (int j = 0; j < 16; j++) {
        int q = b[4 + j];
        v[j] = (float)(q & 15) * d + m;
        v[j + 16] = (float)(q >> 4) * d + m;
    }
}

// Q8_0: f16 d, 32 int8; value q d.
template <>
__device__ __forceinline__ void kern_cuda_chunk<KERN_TYPE_Q8_0>(const uint8_t *row, int64_t c,
                                                                float v[32])
{
    const uint8_t *b = row + c * 34;
    float d = kern_cuda_ld_f16(b);
    const int8_t *q = (const int8_t *)(b + 2);
#pragma unroll
    for (int j = 0; j < 32; j++)
        v[j] = (float)q[j] * d;
}

// Q4_K: 256-weight super-blocks (f16 d, f16 dmin, 12 bytes of 6-bit scales and mins, 128 bytes
// of nibbles); chunk j of a super-block has scale sc_j and min m_j, its nibbles are the low
// (j even) or high (j odd) halves of qs[32 (j / 2) .. + 32]; value d sc_j q - dmin m_j.
template <>
__device__ __forceinline__ void kern_cuda_chunk<KERN_TYPE_Q4_K>(const uint8_t *row, int64_t c,
                                                                float v[32])
{
    const uint8_t *b = row + (c / 8) * 144;
    int j = (int)(c % 8);
    float d = kern_cuda_ld_f16(b), dmin = kern_cuda_ld_f16(b + 2);
    const uint8_t *s = b + 4, *qs = b + 16 + 32 * (j / 2);
    int sc, m;
    if (j < 4) {
        sc = s[j] & 63;
        m = s[j + 4] & 63;
    } else {
        sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
        m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
    float ds = d * (float)sc, dm = dmin * (float)m;
    int shift = (j & 1) * 4;
#pragma unroll
    for (int l = 0; l < 32; l++)
        v[l] = ds * (float)((qs[l] >> shift) & 15) - dm;
}

// Q6_K: 256 weights in two halves of 128 (ql[128], qh[64], int8 scales[16], f16 d): weight
// 128h + 32k + l takes its low 4 bits from ql[64h + l + 32 (k & 1)] (low nibble for k < 2),
// its top 2 bits from bits 2k, 2k+1 of qh[32h + l]; value d scales[e / 16] (q - 32).
template <>
__device__ __forceinline__ void kern_cuda_chunk<KERN_TYPE_Q6_K>(const uint8_t *row, int64_t c,
                                                                float v[32])
{
    const uint8_t *b = row + (c / 8) * 210;
    int e0 = (int)(c % 8) * 32, h = e0 / 128, k = (e0 % 128) / 32;
    const uint8_t *ql = b + 64 * h + 32 * (k & 1), *qh = b + 128 + 32 * h;
    const int8_t *sc = (const int8_t *)(b + 192);
    float d = kern_cuda_ld_f16(b + 208);
    float d0 = d * (float)sc[e0 / 16], d1 = d * (float)sc[e0 / 16 + 1];
    int lo_shift = k < 2 ? 0 : 4, hi_shift = 2 * k;
#pragma unroll
    for (int l = 0; l < 32; l++) {
        int q = ((ql[l] >> lo_shift) & 15) | (((qh[l] >> hi_shift) & 3) << 4);
        v[l] = (l < 16 ? d0 : d1) * (float)(q - 32);
    }
}

// Weight e of a row of a float type (rows of F32, F16 and BF16 need not be whole chunks: the
// last cols % 32 weights are read one by one). Quantized rows are whole blocks: never called.
template <int T>
__device__ __forceinline__ float kern_cuda_elem(const uint8_t *row, int64_t e)
{
    if (T == KERN_TYPE_F32)
        return ((const float *)row)[e];
    if (T == KERN_TYPE_F16)
        return __half2float(((const __half *)row)[e]);
    if (T == KERN_TYPE_BF16)
        return __bfloat162float(((const __nv_bfloat16 *)row)[e]);
    return 0.0f;
}

// An activation as the CPU's products with weights of type T take it: F16 and BF16 weights
// multiply activations rounded to their own type (kern__quantize_f16_round / _bf16_round), so
// a row's result does not depend on the path (matrix-vector or cuBLAS) its batch takes.
template <int T>
__device__ __forceinline__ float kern_cuda_act(float x)
{
    if (T == KERN_TYPE_F16)
        return __half2float(__float2half_rn(x));
    if (T == KERN_TYPE_BF16)
        return __bfloat162float(__float2bfloat16_rn(x));
    return x;
}

// Calls F<T>::run(args...) for a weight type, or aborts on one the backend does not take
// (supports_type said no, so a caller never gets here with it).
#define KERN_CUDA_DISPATCH(type, F, ...)                                                         \
    do {                                                                                         \
        switch (type) {                                                                          \
        case KERN_TYPE_F32: F<KERN_TYPE_F32>::run(__VA_ARGS__); break;                          \
        case KERN_TYPE_F16: F<KERN_TYPE_F16>::run(__VA_ARGS__); break;                          \
        case KERN_TYPE_BF16: F<KERN_TYPE_BF16>::run(__VA_ARGS__); break;                        \
        case KERN_TYPE_Q4_0: F<KERN_TYPE_Q4_0>::run(__VA_ARGS__); break;                        \
        case KERN_TYPE_Q4_1: F<KERN_TYPE_Q4_1>::run(__VA_ARGS__); break;                        \
        case KERN_TYPE_Q8_0: F<KERN_TYPE_Q8_0>::run(__VA_ARGS__); break;                        \
        case KERN_TYPE_Q4_K: F<KERN_TYPE_Q4_K>::run(__VA_ARGS__); break;                        \
        case KERN_TYPE_Q6_K: F<KERN_TYPE_Q6_K>::run(__VA_ARGS__); break;                        \
        default: kern_cuda_fatal("weight type", kern_type_name(type), __FILE__, __LINE__);      \
        }                                                                                        \
    } while (0)

#endif
