/* kernels/cpu/quant_avx2.c: AVX2 + FMA + F16C twins of the references in quant.c (this file
 * alone is compiled with -mavx2 -mfma -mf16c; quant.c calls in only when cpuid says so).
 *
 * The quantized dots multiply unsigned weight bytes by signed activation bytes with
 * _mm256_maddubs_epi16 (pairs summed into int16; no pair can saturate: 4-bit weights are at most
 * 15, 6-bit ones 63, and Q8_0 goes through the abs/sign trick), widen with _mm256_madd_epi16, and
 * scale each block in f32. Activation quantization matches the reference bit for bit. */
#include "kernels/cpu/internal.h"

#include <immintrin.h>
#include <string.h>

/* ---- helpers --------------------------------------------------------------------------------- */

/* How far ahead (bytes) the matrix-vector dots prefetch their weights: the rows of a matrix
 * follow one another, so 4 KiB ahead of this block is the same stream some rows later (as
 * MV_PF in mv_avx512.c; the hardware prefetchers alone leave part of a core's read bandwidth
 * unused). A prefetch changes no sum. */
#define DOT_PF(p) _mm_prefetch((const char *)(p) + 4096, _MM_HINT_T0)

static inline float hsum_ps(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline int hsum_epi32(__m256i v)
{
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}

static inline float hmax_ps(__m256 v)
{
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

static inline uint16_t rd16(const void *p)
{
    uint16_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline float f16(uint16_t h)
{
    return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h)));
}

/* 32 nibbles → 32 bytes: element j < 16 is the low nibble of byte j, j >= 16 the high nibble of
 * byte j - 16 (GGUF order). */
static inline __m256i nibbles32(const uint8_t *qs)
{
    __m128i raw = _mm_loadu_si128((const __m128i *)qs);
    __m256i both = _mm256_set_m128i(_mm_srli_epi16(raw, 4), raw);
    return _mm256_and_si256(both, _mm256_set1_epi8(0x0f));
}

/* Unsigned u8 x signed s8, 32 pairs, summed into 8 int32. */
static inline __m256i dot_us8(__m256i u, __m256i s)
{
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

/* ---- activation quantization ----------------------------------------------------------------- */

/* Rounds x * id to nearest even (the MXCSR default, as nearbyintf in the reference). */
static inline __m256i q8_of(const float *x, __m256 id)
{
    return _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x), id));
}

/* Four int32x8 → 32 int8 in element order. */
static inline __m256i pack_i8(__m256i a, __m256i b, __m256i c, __m256i d)
{
    __m256i ab = _mm256_packs_epi32(a, b), cd = _mm256_packs_epi32(c, d);
    __m256i v = _mm256_packs_epi16(ab, cd);
    return _mm256_permutevar8x32_epi32(v, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* f32 → f16 → f32 (round to nearest even, as F16C and the reference). */
static inline float f16r(float f)
{
    return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtps_ph(_mm_set_ss(f), _MM_FROUND_TO_NEAREST_INT)));
}

static float absmax(const float *x, int n)
{
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 m = _mm256_setzero_ps();
    for (int j = 0; j < n; j += 8)
        m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + j)));
    return hmax_ps(m);
}

static size_t act_bytes_q8_32(int64_t n)
{
    return (size_t)(n / 32) * sizeof(kern_q8_32);
}

/* One block as the reference's quantize_q8_block: returns the f32 scale and the sum of q. */
static inline float q8_block(const float *x, kern_q8_32 *b, int *sum)
{
    float amax = absmax(x, 32), d = amax / 127.0f;
    __m256 id = _mm256_set1_ps(amax != 0 ? 127.0f / amax : 0.0f);
    __m256i q0 = q8_of(x, id), q1 = q8_of(x + 8, id), q2 = q8_of(x + 16, id),
            q3 = q8_of(x + 24, id);
    _mm256_storeu_si256((__m256i *)b->qs, pack_i8(q0, q1, q2, q3));
    *sum = hsum_epi32(_mm256_add_epi32(_mm256_add_epi32(q0, q1), _mm256_add_epi32(q2, q3)));
    b->d = f16r(d);   /* as the reference: f16 scales */
    return d;
}

static void quantize_q8_32(const float *x, void *act, int64_t n)
{
    kern_q8_32 *b = act;
    for (int64_t i = 0; i < n / 32; i++, x += 32) {
        int sum;
        q8_block(x, &b[i], &sum);
        b[i].s = b[i].d * (float)sum;
    }
}

/* q8_1 for Q4_1: s = f16(d * sum) with the f32 d (kern__quantize_q8_1_ref). */
static void quantize_q8_1(const float *x, void *act, int64_t n)
{
    kern_q8_32 *b = act;
    for (int64_t i = 0; i < n / 32; i++, x += 32) {
        int sum;
        float d = q8_block(x, &b[i], &sum);
        b[i].s = f16r(d * (float)sum);
    }
}

static void quantize_q8_k(const float *x, void *act, int64_t n)
{
    kern_q8_k *b = act;
    for (int64_t i = 0; i < n / 256; i++, x += 256) {
        float d = absmax(x, 256) / 127.0f, idf = d != 0 ? 1.0f / d : 0.0f;
        __m256 id = _mm256_set1_ps(idf);
        for (int j = 0; j < 256; j += 32) {
            __m256i q0 = q8_of(x + j, id), q1 = q8_of(x + j + 8, id),
                    q2 = q8_of(x + j + 16, id), q3 = q8_of(x + j + 24, id);
            _mm256_storeu_si256((__m256i *)(b[i].qs + j), pack_i8(q0, q1, q2, q3));
            b[i].bsums[j / 16] = (int16_t)hsum_epi32(_mm256_add_epi32(q0, q1));
            b[i].bsums[j / 16 + 1] = (int16_t)hsum_epi32(_mm256_add_epi32(q2, q3));
        }
        b[i].d = d;
    }
}

/* ---- F32 / F16 / BF16 ------------------------------------------------------------------------ */

static inline __m256 ld_f16(const uint16_t *p)
{
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

static inline __m256 ld_bf16(const uint16_t *p)
{
    __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

#define DOT_FLOAT(name, wtype, load, scalar)                                                    \
    static void name(int64_t n, const void *w, const void *a, float *out)                     \
    {                                                                                          \
        const wtype *x = w;                                                                    \
        const float *y = a;                                                                    \
        __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;                            \
        int64_t i = 0;                                                                         \
        for (; i + 32 <= n; i += 32) {                                                         \
            s0 = _mm256_fmadd_ps(load(x + i), _mm256_loadu_ps(y + i), s0);                     \
            s1 = _mm256_fmadd_ps(load(x + i + 8), _mm256_loadu_ps(y + i + 8), s1);             \
            s2 = _mm256_fmadd_ps(load(x + i + 16), _mm256_loadu_ps(y + i + 16), s2);           \
            s3 = _mm256_fmadd_ps(load(x + i + 24), _mm256_loadu_ps(y + i + 24), s3);           \
        }                                                                                      \
        for (; i + 8 <= n; i += 8)                                                             \
            s0 = _mm256_fmadd_ps(load(x + i), _mm256_loadu_ps(y + i), s0);                     \
        float s = hsum_ps(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));        \
        for (; i < n; i++)                                                                     \
            s += scalar(x[i]) * y[i];                                                          \
        *out = s;                                                                              \
    }

static inline float id_f32(float v) { return v; }
static inline float bf16(uint16_t h)
{
    return kern_bf16_to_f32(h);
}

DOT_FLOAT(dot_f32, float, _mm256_loadu_ps, id_f32)

void kern__f16_to_f32_row_avx2(const uint16_t *x, float *y, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, ld_f16(x + i));
    for (; i < n; i++)
        y[i] = f16(x[i]);
}

void kern__f32_to_f16_row_avx2(const float *x, uint16_t *y, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(y + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++)
        y[i] = kern_f32_to_f16(x[i]);
}

static void to_f32_f16(const void *w, float *out, int64_t n)
{
    kern__f16_to_f32_row_avx2(w, out, n);
}

static void from_f32_f16(const float *x, void *w, int64_t n)
{
    kern__f32_to_f16_row_avx2(x, w, n);
}

/* ---- Q4_0 / Q4_1 / Q8_0 ---------------------------------------------------------------------- */

/* [d*dx, d*s] (Q4_0, whose -8 offset is applied through s) or [d*dx, m*s] (Q4_1), from the f16
 * pair at w (d, d) or (d, m) and the activation block's (d, s). */
static inline __m128 block_scales(uint32_t f16pair, const kern_q8_32 *y)
{
    __m128 wd = _mm_cvtph_ps(_mm_cvtsi32_si128((int)f16pair));
    return _mm_mul_ps(wd, _mm_castpd_ps(_mm_load_sd((const double *)&y->d)));
}

/* The Q4_0 and Q4_1 dots, for T tokens at once: per token two chains of blocks (acc0 even
 * blocks, acc1 odd ones, the tail block into acc0) and the scale products summed apart (off:
 * Q4_0's -8 offset, Q4_1's min terms), each block's nibbles unpacked once for all T. T = 1 is
 * the dot (pub.dot), T = 2 and 3 the multi-token dot (kern_dotn_fn): one body, so a token gets
 * the same bits in both. LLMGW_KERNELS=exact installs dot_q4_1_exact below instead. */
static inline uint32_t dm_q4_0(const kern_blk_q4_0 *x)
{
    uint32_t d = rd16(&x->d);
    return d | d << 16;
}

static inline uint32_t dm_q4_1(const kern_blk_q4_1 *x)
{
    uint32_t dm;
    memcpy(&dm, &x->d, 4);
    return dm;
}

#define Q4_DOTN(name, blk, T, final)                                                            \
    static void name##_n##T(int64_t n, const void *w, const void *a, size_t as, float *out,    \
                            int64_t ldy)                                                       \
    {                                                                                          \
        const blk *x = w;                                                                      \
        const kern_q8_32 *y[T];                                                                \
        __m256 acc0[T], acc1[T];                                                               \
        __m128 off[T];                                                                         \
        _Pragma("GCC unroll 3") for (int t = 0; t < T; t++)                                    \
        {                                                                                      \
            y[t] = (const kern_q8_32 *)((const uint8_t *)a + (size_t)t * as);                  \
            acc0[t] = acc1[t] = _mm256_setzero_ps();                                           \
            off[t] = _mm_setzero_ps();                                                         \
        }                                                                                      \
        int64_t nb = n / 32, i = 0;                                                            \
        for (; i + 2 <= nb; i += 2) {                                                          \
            DOT_PF(&x[i]);                                                                     \
            uint32_t dm0 = dm_##name(&x[i]), dm1 = dm_##name(&x[i + 1]);                       \
            __m256i q0 = nibbles32(x[i].qs), q1 = nibbles32(x[i + 1].qs);                      \
            _Pragma("GCC unroll 3") for (int t = 0; t < T; t++)                                \
            {                                                                                  \
                __m128 s0 = block_scales(dm0, &y[t][i]), s1 = block_scales(dm1, &y[t][i + 1]); \
                __m256i p0 = dot_us8(q0, _mm256_loadu_si256((const __m256i *)y[t][i].qs));     \
                __m256i p1 = dot_us8(q1, _mm256_loadu_si256((const __m256i *)y[t][i + 1].qs)); \
                acc0[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p0), _mm256_broadcastss_ps(s0),   \
                                          acc0[t]);                                            \
                acc1[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p1), _mm256_broadcastss_ps(s1),   \
                                          acc1[t]);                                            \
                off[t] = _mm_add_ps(off[t], _mm_add_ps(s0, s1));                               \
            }                                                                                  \
        }                                                                                      \
        for (; i < nb; i++) {                                                                  \
            uint32_t dm0 = dm_##name(&x[i]);                                                   \
            __m256i q0 = nibbles32(x[i].qs);                                                   \
            _Pragma("GCC unroll 3") for (int t = 0; t < T; t++)                                \
            {                                                                                  \
                __m128 s0 = block_scales(dm0, &y[t][i]);                                       \
                __m256i p0 = dot_us8(q0, _mm256_loadu_si256((const __m256i *)y[t][i].qs));     \
                acc0[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p0), _mm256_broadcastss_ps(s0),   \
                                          acc0[t]);                                            \
                off[t] = _mm_add_ps(off[t], s0);                                               \
            }                                                                                  \
        }                                                                                      \
        _Pragma("GCC unroll 3") for (int t = 0; t < T; t++)                                    \
            out[(size_t)t * (size_t)ldy] = final(acc0[t], acc1[t], off[t]);                    \
    }

/* sum (q - 8) * x = sum q * x - 8 * sum x: lane 1 of off holds sum d * s. */
static inline float final_q4_0(__m256 acc0, __m256 acc1, __m128 off)
{
    return hsum_ps(_mm256_add_ps(acc0, acc1)) - 8.0f * _mm_cvtss_f32(_mm_movehdup_ps(off));
}

static inline float final_q4_1(__m256 acc0, __m256 acc1, __m128 off)
{
    return hsum_ps(_mm256_add_ps(acc0, acc1)) + _mm_cvtss_f32(_mm_movehdup_ps(off));
}

#define Q4_DOTN_ALL(name, blk)                                                                  \
    Q4_DOTN(name, blk, 1, final_##name)                                                        \
    Q4_DOTN(name, blk, 2, final_##name)                                                        \
    Q4_DOTN(name, blk, 3, final_##name)                                                        \
    static void dot_##name(int64_t n, const void *w, const void *a, float *out)                \
    {                                                                                          \
        name##_n1(n, w, a, 0, out, 0);                                                         \
    }                                                                                          \
    static void dotn_##name(int64_t n, const void *w, const void *a, size_t as, int nt,        \
                            float *out, int64_t ldy)                                           \
    {                                                                                          \
        if (nt == 3)                                                                           \
            name##_n3(n, w, a, as, out, ldy);                                                  \
        else if (nt == 2)                                                                      \
            name##_n2(n, w, a, as, out, ldy);                                                  \
        else                                                                                   \
            dot_##name(n, w, a, out);                                                          \
    }

Q4_DOTN_ALL(q4_0, kern_blk_q4_0)
Q4_DOTN_ALL(q4_1, kern_blk_q4_1)
_Static_assert(KERN_DOTN_MAX == 3, "dotn_q4_0/q4_1 take up to 3 tokens");

/* Exactly dot_q4_1_ref (llama.cpp's order): 8 lanes of 4-element int sums per block, one FMA
 * chain per lane with d_w * d_a, the min terms in a scalar FMA chain, added after the lanes'
 * sum. hsum_ps adds lanes l + 4, then the pairs, as the reference. */
static void dot_q4_1_exact(int64_t n, const void *w, const void *a, float *out)
{
    const kern_blk_q4_1 *x = w;
    const kern_q8_32 *y = a;
    __m256 acc = _mm256_setzero_ps();
    float summs = 0;
    for (int64_t i = 0; i < n / 32; i++) {
        DOT_PF(&x[i]);
        float d = f16(x[i].d) * y[i].d;
        summs = _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(f16(x[i].m)), _mm_set_ss(y[i].s),
                                           _mm_set_ss(summs)));
        __m256i p = dot_us8(nibbles32(x[i].qs), _mm256_loadu_si256((const __m256i *)y[i].qs));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(p), acc);
    }
    *out = hsum_ps(acc) + summs;
}

static inline __m256 q8_0_block(const kern_blk_q8_0 *x, const kern_q8_32 *y, __m256 acc)
{
    __m256i q = _mm256_loadu_si256((const __m256i *)x->qs);
    __m256i v = _mm256_loadu_si256((const __m256i *)y->qs);
    __m256i p = dot_us8(_mm256_sign_epi8(q, q), _mm256_sign_epi8(v, q));
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(f16(rd16(&x->d)) * y->d), acc);
}

static void dot_q8_0(int64_t n, const void *w, const void *a, float *out)
{
    const kern_blk_q8_0 *x = w;
    const kern_q8_32 *y = a;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0;
    int64_t nb = n / 32, i = 0;
    for (; i + 2 <= nb; i += 2) {
        DOT_PF(&x[i]);
        DOT_PF(&x[i + 1]);
        acc0 = q8_0_block(&x[i], &y[i], acc0);
        acc1 = q8_0_block(&x[i + 1], &y[i + 1], acc1);
    }
    for (; i < nb; i++)
        acc0 = q8_0_block(&x[i], &y[i], acc0);
    *out = hsum_ps(_mm256_add_ps(acc0, acc1));
}

static void to_f32_q8_0(const void *w, float *out, int64_t n)
{
    const kern_blk_q8_0 *x = w;
    for (int64_t i = 0; i < n / 32; i++, out += 32) {
        __m256 d = _mm256_set1_ps(f16(rd16(&x[i].d)));
        for (int j = 0; j < 32; j += 8) {
            __m128i q = _mm_loadl_epi64((const __m128i *)(x[i].qs + j));
            _mm256_storeu_ps(out + j, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), d));
        }
    }
}

/* ---- Q4_K ------------------------------------------------------------------------------------ */

/* The 8 six-bit scales and mins of a Q4_K block (layout in internal.h). */
static inline void q4_k_unpack_scales(const uint8_t *s, uint8_t sc[8], uint8_t m[8])
{
    for (int j = 0; j < 4; j++) {
        sc[j] = s[j] & 63;
        m[j] = s[j + 4] & 63;
        sc[j + 4] = (uint8_t)((s[j + 8] & 0xf) | ((s[j] >> 6) << 4));
        m[j + 4] = (uint8_t)((s[j + 8] >> 4) | ((s[j + 4] >> 6) << 4));
    }
}

static void dot_q4_k(int64_t n, const void *w, const void *a, float *out)
{
    const kern_blk_q4_k *x = w;
    const kern_q8_k *y = a;
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    __m256 acc = _mm256_setzero_ps();
    float mins = 0;
    for (int64_t i = 0; i < n / 256; i++) {
        DOT_PF(&x[i]);
        DOT_PF((const char *)&x[i] + 64);
        DOT_PF((const char *)&x[i] + 128);
        uint8_t sc[8], m[8];
        q4_k_unpack_scales(x[i].scales, sc, m);
        int msum = 0;
        for (int j = 0; j < 8; j++)
            msum += m[j] * (y[i].bsums[2 * j] + y[i].bsums[2 * j + 1]);
        __m256i isum = _mm256_setzero_si256();
        for (int c = 0; c < 4; c++) {
            __m256i q = _mm256_loadu_si256((const __m256i *)(x[i].qs + 32 * c));
            __m256i lo = _mm256_and_si256(q, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
            __m256i plo = _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)(y[i].qs + 64 * c)));
            __m256i phi = _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(y[i].qs + 64 * c + 32)));
            plo = _mm256_madd_epi16(plo, _mm256_set1_epi16(sc[2 * c]));
            phi = _mm256_madd_epi16(phi, _mm256_set1_epi16(sc[2 * c + 1]));
            isum = _mm256_add_epi32(isum, _mm256_add_epi32(plo, phi));
        }
        float dx = y[i].d;
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(dx * f16(x[i].d)), acc);
        mins += dx * f16(x[i].dmin) * (float)msum;
    }
    *out = hsum_ps(acc) - mins;
}

/* ---- Q6_K ------------------------------------------------------------------------------------ */

static void dot_q6_k(int64_t n, const void *w, const void *a, float *out)
{
    const kern_blk_q6_k *x = w;
    const kern_q8_k *y = a;
    const __m256i m4 = _mm256_set1_epi8(0x0f), m30 = _mm256_set1_epi8(0x30);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / 256; i++) {
        for (int l = 0; l < (int)sizeof x[i]; l += 64)   /* 210 bytes: 4 lines */
            DOT_PF((const char *)&x[i] + l);
        __m128i sc8 = _mm_loadu_si128((const __m128i *)x[i].scales);
        /* sum over groups of sc * (q - 32) * x = sum sc * q * x - 32 * sum sc * bsum. */
        __m256i sc16 = _mm256_cvtepi8_epi16(sc8);
        __m256i off = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)y[i].bsums), sc16);
        __m256i isum = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(off, 5));
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = x[i].ql + 64 * h;
            const int8_t *q8 = y[i].qs + 128 * h;
            __m256i qh = _mm256_loadu_si256((const __m256i *)(x[i].qh + 32 * h));
            __m256i l0 = _mm256_loadu_si256((const __m256i *)ql);
            __m256i l1 = _mm256_loadu_si256((const __m256i *)(ql + 32));
            __m256i q[4];
            q[0] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30));
            q[1] = _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30));
            q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_and_si256(qh, m30));
            q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                   _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30));
            for (int k = 0; k < 4; k++) {
                int g = 8 * h + 2 * k;   /* scale of elements 0-15 of this 32; g + 1 for 16-31 */
                __m256i scv = _mm256_set_m128i(_mm_set1_epi16(x[i].scales[g + 1]),
                                               _mm_set1_epi16(x[i].scales[g]));
                __m256i p = _mm256_maddubs_epi16(q[k], _mm256_loadu_si256((const __m256i *)(q8 + 32 * k)));
                isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p, scv));
            }
        }
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(y[i].d * f16(x[i].d)), acc);
    }
    *out = hsum_ps(acc);
}

/* ---- tile (several tokens) ------------------------------------------------------------------ */

/* The AVX2 form of the tile in quant_avx512.c, for 4-bit weights: 8 rows per tile, repacked into
 * groups of [8 rows][4 elements] of unsigned nibbles with per-row scale a and offset c, then
 * VPMADDUBSW of a group (u8) by 4 activation bytes broadcast (s8). The 8 groups' int16 pair sums
 * add up without saturating (at most 8 x 2 x 15 x 127 = 30480) before one VPMADDWD widens them.
 * (Q8_0's bytes would saturate: it keeps the matrix-vector path on AVX2.) */
enum { TR2 = 8 };

typedef struct packed8 {
    uint8_t w[8][TR2 * 4];
    float a[TR2];
    float c[TR2];
} packed8;

static size_t tile8_scratch(int64_t n)
{
    return (size_t)(n / 32) * sizeof(packed8);
}

#define ROW8(p, i, off) _mm_loadu_si128((const __m128i *)((p)[i] + (off)))

/* 16 bytes at `off` of 8 rows → out[g] lane r = row r's dword g (rows i and 4 + i share z[i]). */
static inline void transpose8x4(const uint8_t *const p[8], size_t off, __m256i out[4])
{
    __m256i z0 = _mm256_set_m128i(ROW8(p, 4, off), ROW8(p, 0, off));
    __m256i z1 = _mm256_set_m128i(ROW8(p, 5, off), ROW8(p, 1, off));
    __m256i z2 = _mm256_set_m128i(ROW8(p, 6, off), ROW8(p, 2, off));
    __m256i z3 = _mm256_set_m128i(ROW8(p, 7, off), ROW8(p, 3, off));
    __m256i t0 = _mm256_unpacklo_epi32(z0, z1), t1 = _mm256_unpackhi_epi32(z0, z1);
    __m256i t2 = _mm256_unpacklo_epi32(z2, z3), t3 = _mm256_unpackhi_epi32(z2, z3);
    out[0] = _mm256_unpacklo_epi64(t0, t2);
    out[1] = _mm256_unpackhi_epi64(t0, t2);
    out[2] = _mm256_unpacklo_epi64(t1, t3);
    out[3] = _mm256_unpackhi_epi64(t1, t3);
}

static inline __m256 f16_lo8(__m256i v)   /* low halves of 8 dwords, f16 → f32 */
{
    __m256i lo = _mm256_and_si256(v, _mm256_set1_epi32(0xffff));
    __m128i h = _mm_packus_epi32(_mm256_castsi256_si128(lo), _mm256_extracti128_si256(lo, 1));
    return _mm256_cvtph_ps(h);
}

static inline void put_nibbles8(packed8 *p, int g, __m256i d)
{
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    _mm256_store_si256((__m256i *)p->w[g], _mm256_and_si256(d, m4));
    _mm256_store_si256((__m256i *)p->w[g + 4], _mm256_and_si256(_mm256_srli_epi32(d, 4), m4));
}

static void rows8(const uint8_t *w, size_t ws, int nr, const uint8_t *p[8])
{
    for (int i = 0; i < TR2; i++)   /* past nr: repeat the last row; its lanes are not stored */
        p[i] = w + (size_t)(i < nr ? i : nr - 1) * ws;
}

/* Q4_0 (bb 18, nibbles at 2, c = -8d) and Q4_1 (bb 20, nibbles at 4, c = m). */
static void pack8_q4(const uint8_t *w, size_t ws, int nr, int64_t nb, packed8 *p, int q4_1)
{
    const uint8_t *r[8];
    rows8(w, ws, nr, r);
    size_t bb = q4_1 ? 20 : 18, qoff = q4_1 ? 4 : 2;
    for (int64_t b = 0; b < nb; b++, p++) {
        __m256i h[4], q[4];
        transpose8x4(r, (size_t)b * bb, h);
        __m256 d = f16_lo8(h[0]);
        _mm256_store_ps(p->a, d);
        _mm256_store_ps(p->c, q4_1 ? f16_lo8(_mm256_srli_epi32(h[0], 16))
                                   : _mm256_mul_ps(d, _mm256_set1_ps(-8.0f)));
        transpose8x4(r, (size_t)b * bb + qoff, q);
        for (int g = 0; g < 4; g++)
            put_nibbles8(p, g, q[g]);
    }
}

static inline __m256i byte8(__m256i v, int j)
{
    return _mm256_and_si256(_mm256_srli_epi32(v, 8 * j), _mm256_set1_epi32(0xff));
}

static void pack8_q4_k(const uint8_t *w, size_t ws, int nr, int64_t nb, packed8 *p)
{
    const uint8_t *r[8];
    rows8(w, ws, nr, r);
    const __m256i m63 = _mm256_set1_epi32(63), m15 = _mm256_set1_epi32(15);
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    for (int64_t sb = 0; sb < nb / 8; sb++, p += 8) {
        __m256i s[4];
        transpose8x4(r, (size_t)sb * 144, s);
        __m256 d = f16_lo8(s[0]);
        __m256 ndmin = _mm256_sub_ps(_mm256_setzero_ps(), f16_lo8(_mm256_srli_epi32(s[0], 16)));
        for (int j = 0; j < 4; j++) {
            __m256i b0 = byte8(s[1], j), b1 = byte8(s[2], j), b2 = byte8(s[3], j);
            __m256i sc_hi = _mm256_or_si256(_mm256_and_si256(b2, m15),
                                            _mm256_slli_epi32(_mm256_srli_epi32(b0, 6), 4));
            __m256i m_hi = _mm256_or_si256(_mm256_srli_epi32(b2, 4),
                                           _mm256_slli_epi32(_mm256_srli_epi32(b1, 6), 4));
            _mm256_store_ps(p[j].a, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_and_si256(b0, m63))));
            _mm256_store_ps(p[j].c, _mm256_mul_ps(ndmin, _mm256_cvtepi32_ps(_mm256_and_si256(b1, m63))));
            _mm256_store_ps(p[j + 4].a, _mm256_mul_ps(d, _mm256_cvtepi32_ps(sc_hi)));
            _mm256_store_ps(p[j + 4].c, _mm256_mul_ps(ndmin, _mm256_cvtepi32_ps(m_hi)));
        }
        for (int c = 0; c < 4; c++) {
            __m256i q[8];
            transpose8x4(r, (size_t)sb * 144 + 16 + 32 * (size_t)c, q);
            transpose8x4(r, (size_t)sb * 144 + 32 + 32 * (size_t)c, q + 4);
            for (int g = 0; g < 8; g++) {
                _mm256_store_si256((__m256i *)p[2 * c].w[g], _mm256_and_si256(q[g], m4));
                _mm256_store_si256((__m256i *)p[2 * c + 1].w[g],
                                   _mm256_and_si256(_mm256_srli_epi32(q[g], 4), m4));
            }
        }
    }
}

static inline __m256i bcast4_256(const int8_t *p)
{
    int32_t v;
    memcpy(&v, p, sizeof v);
    return _mm256_set1_epi32(v);
}

static inline __attribute__((always_inline)) void
tile8_tokens(const packed8 *pk, int64_t nb, const uint8_t *act, size_t as, int T, float *y,
             int64_t ldy, int nr)
{
    __m256 acc[4];
#pragma GCC unroll 4
    for (int t = 0; t < T; t++)
        acc[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const packed8 *p = &pk[b];
        __m256i w[8];
#pragma GCC unroll 8
        for (int g = 0; g < 8; g++)
            w[g] = _mm256_load_si256((const __m256i *)p->w[g]);
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            const kern_q8_32 *x = (const kern_q8_32 *)(act + (size_t)t * as) + b;
            __m256i s = _mm256_maddubs_epi16(w[0], bcast4_256(x->qs));
#pragma GCC unroll 8
            for (int g = 1; g < 8; g++)
                s = _mm256_add_epi16(s, _mm256_maddubs_epi16(w[g], bcast4_256(x->qs + 4 * g)));
            __m256 f = _mm256_cvtepi32_ps(_mm256_madd_epi16(s, _mm256_set1_epi16(1)));
            __m256 ad = _mm256_mul_ps(_mm256_load_ps(p->a), _mm256_set1_ps(x->d));
            acc[t] = _mm256_fmadd_ps(f, ad, acc[t]);
            acc[t] = _mm256_fmadd_ps(_mm256_load_ps(p->c), _mm256_set1_ps(x->s), acc[t]);
        }
    }
#pragma GCC unroll 4
    for (int t = 0; t < T; t++) {
        float *yt = y + (size_t)t * (size_t)ldy;
        if (nr == TR2) {
            _mm256_storeu_ps(yt, acc[t]);
        } else {
            _Alignas(32) float tmp[TR2];
            _mm256_store_ps(tmp, acc[t]);
            memcpy(yt, tmp, (size_t)nr * sizeof(float));
        }
    }
}

static void tile8_4(const packed8 *pk, int64_t nb, const uint8_t *act, size_t as, float *y,
                    int64_t ldy, int nr)
{
    tile8_tokens(pk, nb, act, as, 4, y, ldy, nr);
}

static void tile8_1(const packed8 *pk, int64_t nb, const uint8_t *act, size_t as, float *y,
                    int64_t ldy, int nr)
{
    tile8_tokens(pk, nb, act, as, 1, y, ldy, nr);
}

static void tile8_all(const packed8 *pk, int64_t nb, int nr, const uint8_t *act, size_t as,
                      int nt, float *y, int64_t ldy)
{
    int t = 0;
    for (; t + 4 <= nt; t += 4)
        tile8_4(pk, nb, act + (size_t)t * as, as, y + (size_t)t * (size_t)ldy, ldy, nr);
    for (; t < nt; t++)
        tile8_1(pk, nb, act + (size_t)t * as, as, y + (size_t)t * (size_t)ldy, ldy, nr);
}

static void tile_q4_0(int64_t n, const void *w, size_t ws, int nr, const void *act, size_t as,
                      int nt, float *y, int64_t ldy, void *scratch)
{
    pack8_q4(w, ws, nr, n / 32, scratch, 0);
    tile8_all(scratch, n / 32, nr, act, as, nt, y, ldy);
}

static void tile_q4_1(int64_t n, const void *w, size_t ws, int nr, const void *act, size_t as,
                      int nt, float *y, int64_t ldy, void *scratch)
{
    pack8_q4(w, ws, nr, n / 32, scratch, 1);
    tile8_all(scratch, n / 32, nr, act, as, nt, y, ldy);
}

static void tile_q4_k(int64_t n, const void *w, size_t ws, int nr, const void *act, size_t as,
                      int nt, float *y, int64_t ldy, void *scratch)
{
    pack8_q4_k(w, ws, nr, n / 32, scratch);
    tile8_all(scratch, n / 32, nr, act, as, nt, y, ldy);
}

static void set_tile(kern_wops *o, kern_tile_fn tile, void (*quantize)(const float *, void *,
                                                                       int64_t))
{
    o->tile = tile;
    o->tile_rows = TR2;
    o->tile_min_tok = 2;
    o->tile_act_bytes = act_bytes_q8_32;
    o->tile_quantize = quantize;   /* q8 blocks of 32: q8_0, or q8_1 for Q4_1 */
    o->tile_scratch = tile8_scratch;
}

/* ---- F16 / BF16: dot and tile (several tokens) ----------------------------------------------- */

/* The one-token dot converts each weight vector for its token, and the conversion (VCVTPH2PS)
 * costs more than the FMA on some cores (two cycles a vector on Zen 1 and 2), so a batch of T
 * tokens (prefill, verifying drafts) through the dot took about T one-token steps. The tile
 * converts a weight vector once for up to FT_TOK tokens (a draft of six and the token before
 * it) while their activations fit L1, for up to FT_TOK_L2 past that.
 *
 * Both sum a (row, token) in one order: four accumulators over 32-element steps (accumulator j
 * takes elements 32i + 8j .. 32i + 8j + 7), the 8-element steps left into the first, then
 * (a0 + a1) + (a2 + a3) across lanes, then the last elements one by one; the part after the
 * 32-element steps is one compiled function (name_finish) for both, or, when no elements are
 * left, the same steps written once (F16_SUM). So a token's results are the same bits alone
 * (dot) or in any batch (tile): the tile is batch-invariant (tile_invariant),
 * LLMGW_KERNELS=invariant keeps it, and greedy output does not depend on the load. Four
 * accumulators a token leave room for three tokens in the sixteen registers, two (F16_PAIRS,
 * two passes) for seven. llmgw-bench on SmolLM2-135M F16, 2 threads, Zen 3, 6 alternating
 * rounds: 7 tokens with all logits 23.6 ms (median) against 25.2 in groups of 2 + 2 + 3; one
 * thread on a 576-column matrix in cache (bench_kernels), 33 GMAC/s against 28. */
enum { FT_ROWS = 16, FT_TOK = 7, FT_TOK_L2 = 3, FT_L1 = 24 << 10 };

static size_t act_bytes_f32_rows(int64_t n)
{
    return (size_t)n * sizeof(float);
}

static size_t no_scratch(int64_t n)
{
    (void)n;
    return 0;
}

/* f32 → f16 → f32 per element (as kern__quantize_f16_round, with F16C's round to nearest even). */
static void round_f16_act(const float *x, void *act, int64_t n)
{
    float *y = act;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_loadu_ps(x + i),
                                                                _MM_FROUND_TO_NEAREST_INT)));
    for (; i < n; i++)
        y[i] = f16r(x[i]);
}

/* T tokens against one row (T x 4 accumulators in registers; the activations as memory operands). */
#define F16_ROW(name, load, T)                                                                  \
    static void name##_row##T(int64_t n, const uint16_t *w, const float *act, size_t as,       \
                              float *y, int64_t ldy)                                           \
    {                                                                                          \
        const float *x[T];                                                                     \
        __m256 acc[T][4];                                                                      \
        _Pragma("GCC unroll 3") for (int t = 0; t < T; t++)                                    \
        {                                                                                      \
            x[t] = act + (size_t)t * as;                                                       \
            _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++)                                \
                acc[t][j] = _mm256_setzero_ps();                                               \
        }                                                                                      \
        int64_t i = 0;                                                                         \
        for (; i + 32 <= n; i += 32) {                                                         \
            /* 4 KiB ahead: the rows follow one another (see MV_PF in mv_avx512.c) */          \
            _mm_prefetch((const char *)(w + i) + 4096, _MM_HINT_T0);                           \
            _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++)                                \
            {                                                                                  \
                __m256 v = load(w + i + 8 * j);                                                \
                _Pragma("GCC unroll 3") for (int t = 0; t < T; t++)                            \
                    acc[t][j] = _mm256_fmadd_ps(v, _mm256_loadu_ps(x[t] + i + 8 * j),          \
                                                acc[t][j]);                                    \
            }                                                                                  \
        }                                                                                      \
        _Pragma("GCC unroll 3") for (int t = 0; t < T; t++)                                    \
            y[(size_t)t * (size_t)ldy] = F16_SUM(name, acc[t][0], acc[t][1], acc[t][2],        \
                                                 acc[t][3], w, x[t], i, n);                    \
    }

/* T = 4 .. 7 tokens against one row, in two passes over it (the second from L1): accumulators
 * 0 and 1 of every token, then 2 and 3, each taking its elements in the dot's order (32i + 8j
 * .., i rising), so the sums are the dot's bits; 2T accumulators and the weight vector fill the
 * sixteen registers at T = 7, and each weight is converted once for all T tokens (a draft's
 * verification: up to seven). */
#define F16_PAIRS(name, load, T)                                                                \
    static void name##_row##T(int64_t n, const uint16_t *w, const float *act, size_t as,       \
                              float *y, int64_t ldy)                                           \
    {                                                                                          \
        const int64_t n32 = n & ~(int64_t)31;                                                  \
        __m256 part[T][4];                                                                     \
        _Pragma("GCC unroll 2") for (int p = 0; p < 2; p++)                                    \
        {                                                                                      \
            __m256 a0[T], a1[T];                                                               \
            _Pragma("GCC unroll 7") for (int t = 0; t < T; t++)                                \
                a0[t] = a1[t] = _mm256_setzero_ps();                                           \
            for (int64_t i = 16 * p; i < n32; i += 32) {                                       \
                if (p == 0)                                                                    \
                    _mm_prefetch((const char *)(w + i) + 4096, _MM_HINT_T0);                   \
                __m256 v = load(w + i);                                                        \
                _Pragma("GCC unroll 7") for (int t = 0; t < T; t++)                            \
                    a0[t] = _mm256_fmadd_ps(v, _mm256_loadu_ps(act + (size_t)t * as + i), a0[t]); \
                v = load(w + i + 8);                                                           \
                _Pragma("GCC unroll 7") for (int t = 0; t < T; t++)                            \
                    a1[t] = _mm256_fmadd_ps(v, _mm256_loadu_ps(act + (size_t)t * as + i + 8),  \
                                            a1[t]);                                            \
            }                                                                                  \
            _Pragma("GCC unroll 7") for (int t = 0; t < T; t++)                                \
            {                                                                                  \
                part[t][2 * p] = a0[t];                                                        \
                part[t][2 * p + 1] = a1[t];                                                    \
            }                                                                                  \
        }                                                                                      \
        _Pragma("GCC unroll 7") for (int t = 0; t < T; t++)                                    \
            y[(size_t)t * (size_t)ldy] = F16_SUM(name, part[t][0], part[t][1], part[t][2],     \
                                                 part[t][3], w, act + (size_t)t * as, n32, n); \
    }

/* A (row, token)'s sum from its four accumulators after the 32-element steps (up to i): across
 * lanes here when no elements are left, in name_finish's steps (the same bits), else there. */
#define F16_SUM(name, s0, s1, s2, s3, w, x, i, n)                                               \
    ((i) == (n) ? hsum_ps(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)))          \
                : name##_finish(s0, s1, s2, s3, w, x, i, n))

#define F16_KERNELS(name, load, scalar)                                                         \
    static __attribute__((noinline)) float name##_finish(__m256 s0, __m256 s1, __m256 s2,      \
                                                         __m256 s3, const uint16_t *w,         \
                                                         const float *x, int64_t i, int64_t n) \
    {                                                                                          \
        for (; i + 8 <= n; i += 8)                                                             \
            s0 = _mm256_fmadd_ps(load(w + i), _mm256_loadu_ps(x + i), s0);                     \
        float s = hsum_ps(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));        \
        for (; i < n; i++)                                                                     \
            s += scalar(w[i]) * x[i];                                                          \
        return s;                                                                              \
    }                                                                                          \
    F16_ROW(name, load, 1)                                                                     \
    F16_ROW(name, load, 2)                                                                     \
    F16_ROW(name, load, 3)                                                                     \
    F16_PAIRS(name, load, 4)                                                                   \
    F16_PAIRS(name, load, 5)                                                                   \
    F16_PAIRS(name, load, 6)                                                                   \
    F16_PAIRS(name, load, 7)                                                                   \
    static void dot_##name(int64_t n, const void *w, const void *a, float *out)                \
    {                                                                                          \
        name##_row1(n, w, a, 0, out, 0);                                                       \
    }                                                                                          \
    static void name##_group(int64_t n, const uint16_t *wr, const float *xt, size_t xs, int T, \
                             float *yr, int64_t ldy)                                           \
    {                                                                                          \
        if (T == 7)                                                                            \
            name##_row7(n, wr, xt, xs, yr, ldy);                                               \
        else if (T == 6)                                                                       \
            name##_row6(n, wr, xt, xs, yr, ldy);                                               \
        else if (T == 5)                                                                       \
            name##_row5(n, wr, xt, xs, yr, ldy);                                               \
        else if (T == 4)                                                                       \
            name##_row4(n, wr, xt, xs, yr, ldy);                                               \
        else if (T == 3)                                                                       \
            name##_row3(n, wr, xt, xs, yr, ldy);                                               \
        else if (T == 2)                                                                       \
            name##_row2(n, wr, xt, xs, yr, ldy);                                               \
        else                                                                                   \
            name##_row1(n, wr, xt, xs, yr, ldy);                                               \
    }                                                                                          \
    /* Tokens in groups of at most FT_TOK, as even as they go (4 are 2 + 2, not 3 + 1). Where  \
     * all the tokens' activations fit L1 (verifying a draft), a row meets every group in turn \
     * while it is in L1 and the stream of weights goes on beside them; past that, each group  \
     * passes over the block of rows (from L2), as many tokens a group as fit L1 (at least     \
     * FT_TOK_L2): a 7-token verification of SmolLM2's FFN down-projection (1536 columns) in   \
     * 3 + 4, two passes over its weights instead of three (2 + 2 + 3); llmgw-bench pp7 with   \
     * all logits took 22.2-23.5 ms against 16.7-18.5 for pp6 before (Zen 3). */               \
    static void tile_##name(int64_t n, const void *w, size_t ws, int nr, const void *act,      \
                            size_t as, int nt, float *y, int64_t ldy, void *scratch)           \
    {                                                                                          \
        (void)scratch;                                                                         \
        size_t xs = as / sizeof(float);                                                        \
        size_t act_row = (size_t)n * sizeof(float);                                            \
        bool in_l1 = (size_t)nt * act_row <= FT_L1;                                            \
        int fit = (int)(FT_L1 / act_row), cap = in_l1 ? FT_TOK : fit < FT_TOK_L2 ? FT_TOK_L2   \
                                                               : fit > FT_TOK ? FT_TOK : fit;  \
        int groups = (nt + cap - 1) / cap;                                                     \
        const float *x = act;                                                                  \
        if (in_l1) {                                                                           \
            for (int r = 0; r < nr; r++)                                                       \
                for (int g = 0, t = 0; g < groups; g++) {                                      \
                    int T = (nt - t) / (groups - g);                                           \
                    name##_group(n, (const uint16_t *)((const uint8_t *)w + (size_t)r * ws),   \
                                 x + (size_t)t * xs, xs, T, y + (size_t)t * (size_t)ldy + r,   \
                                 ldy);                                                         \
                    t += T;                                                                    \
                }                                                                              \
            return;                                                                            \
        }                                                                                      \
        for (int g = 0, t = 0; g < groups; g++) {                                              \
            int T = (nt - t) / (groups - g);                                                   \
            for (int r = 0; r < nr; r++)                                                       \
                name##_group(n, (const uint16_t *)((const uint8_t *)w + (size_t)r * ws),       \
                             x + (size_t)t * xs, xs, T, y + (size_t)t * (size_t)ldy + r, ldy); \
            t += T;                                                                            \
        }                                                                                      \
    }

F16_KERNELS(f16, ld_f16, f16)
F16_KERNELS(bf16, ld_bf16, bf16)

static void set_tile_f(kern_wops *o, kern_tile_fn tile)
{
    o->tile = tile;
    o->tile_rows = FT_ROWS;
    o->tile_min_tok = 2;
    o->tile_invariant = true;
    o->tile_act_bytes = act_bytes_f32_rows;
    o->tile_quantize = o->pub.quantize_act;
    o->tile_scratch = no_scratch;
}

/* Two or three tokens (a drafter catching up after an accepted draft, a short verification)
 * through the multi-token dot, four and more through the tile: llmgw-bench on SmolLM2-135M
 * Q4_1, 2 threads, Zen 3, alternating runs: pp2 275 vs 222 t/s, pp3 343 vs 297 (dotn vs tile),
 * pp4 about even, pp6 and pp8 the tile ahead. */
static void set_dotn(kern_wops *o, kern_dotn_fn dotn)
{
    o->dotn = dotn;
    o->tile_min_tok = 4;
}

/* ---- Q4_1 in KERN_LAYOUT_X8 ---------------------------------------------------------------- */

/* Eight rows at once, each lane a row: per block, four vectors of nibbles (two halves each)
 * against four activation bytes broadcast, their eight products of pairs summed in int16 (at
 * most 8 x 2 x 15 x 128 < 2^15), widened once, then scaled; the min terms in their own sum.
 * Against the row-at-a-time dot (unpacking, widening and a lane sum a row) about a quarter of
 * the instructions: Zen 3, 2 threads, a 1536 x 576 matrix from memory 25 us against 30 (22
 * GB/s, what two cores read), 49152 x 576 782 against 907. Each token's steps are the same in
 * any batch; the group's weights come from memory for the first and from L1 for the rest. */
static void x8_q4_1(int64_t n, const void *w, int nr, const void *act, size_t as, int nt,
                    float *y, int64_t ldy)
{
    const kern_blk_q4_1x8 *x = w;
    int64_t nb = n / 32;
    const __m256i m4 = _mm256_set1_epi8(15), ones = _mm256_set1_epi16(1);
    for (int g = 0; 8 * g < nr; g++, x += nb) {
        for (int t = 0; t < nt; t++) {
            const kern_q8_32 *a = (const kern_q8_32 *)((const uint8_t *)act + (size_t)t * as);
            __m256 acc = _mm256_setzero_ps(), accm = _mm256_setzero_ps();
            for (int64_t b = 0; b < nb; b++) {
                if (t == 0) {
                    DOT_PF(&x[b]);
                    DOT_PF((const uint8_t *)&x[b] + 64);
                    DOT_PF((const uint8_t *)&x[b] + 128);
                }
                const int8_t *q = a[b].qs;
                __m256i s16 = _mm256_setzero_si256();
                _Pragma("GCC unroll 4") for (int v = 0; v < 4; v++)
                {
                    __m256i p = _mm256_loadu_si256((const __m256i *)(x[b].qs + 32 * v));
                    int32_t lo, hi;
                    memcpy(&lo, q + 4 * v, 4);
                    memcpy(&hi, q + 16 + 4 * v, 4);
                    s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(_mm256_and_si256(p, m4),
                                                                     _mm256_set1_epi32(lo)));
                    s16 = _mm256_add_epi16(
                        s16, _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(p, 4), m4),
                                                  _mm256_set1_epi32(hi)));
                }
                __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)x[b].d));
                __m256 mw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)x[b].m));
                acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(s16, ones)),
                                      _mm256_mul_ps(dw, _mm256_set1_ps(a[b].d)), acc);
                accm = _mm256_fmadd_ps(mw, _mm256_set1_ps(a[b].s), accm);
            }
            float *yt = y + (size_t)t * (size_t)ldy + 8 * g;
            __m256 r = _mm256_add_ps(acc, accm);
            if (nr - 8 * g >= 8) {
                _mm256_storeu_ps(yt, r);
            } else {
                float tmp[8];
                _mm256_storeu_ps(tmp, r);
                memcpy(yt, tmp, (size_t)(nr - 8 * g) * sizeof *yt);
            }
        }
    }
}

/* ---- install --------------------------------------------------------------------------------- */

void kern__quant_install_avx2(kern_wops *ops, int n)
{
    for (int i = 0; i < n; i++) {
        kern_wtype *t = &ops[i].pub;
        switch (t->type) {
        case KERN_TYPE_F32:
            t->dot = dot_f32;
            break;
        case KERN_TYPE_F16:
            t->dot = dot_f16;
            t->to_f32 = to_f32_f16;
            t->from_f32 = from_f32_f16;
            t->quantize_act = round_f16_act;
            set_tile_f(&ops[i], tile_f16);
            break;
        case KERN_TYPE_BF16:
            t->dot = dot_bf16;
            set_tile_f(&ops[i], tile_bf16);
            break;
        case KERN_TYPE_Q4_0:
            t->dot = dot_q4_0;
            t->quantize_act = quantize_q8_32;
            set_tile(&ops[i], tile_q4_0, quantize_q8_32);
            set_dotn(&ops[i], dotn_q4_0);
            break;
        case KERN_TYPE_Q4_1:
            t->dot = dot_q4_1;
            t->quantize_act = quantize_q8_1;
            set_tile(&ops[i], tile_q4_1, quantize_q8_1);
            set_dotn(&ops[i], dotn_q4_1);
            ops[i].x8 = x8_q4_1;
            break;
        case KERN_TYPE_Q8_0:
            t->dot = dot_q8_0;
            t->quantize_act = quantize_q8_32;
            t->to_f32 = to_f32_q8_0;
            break;
        case KERN_TYPE_Q4_K:
            t->dot = dot_q4_k;
            t->quantize_act = quantize_q8_k;
            set_tile(&ops[i], tile_q4_k, quantize_q8_32);
            break;
        case KERN_TYPE_Q6_K:
            t->dot = dot_q6_k;
            t->quantize_act = quantize_q8_k;
            break;
        default:
            break;
        }
    }
}

/* LLMGW_KERNELS=exact: Q4_1 through the llama.cpp-order dot (quant.c drops its tile and mv). */
void kern__quant_install_exact_avx2(kern_wops *ops, int n)
{
    for (int i = 0; i < n; i++)
        if (ops[i].pub.type == KERN_TYPE_Q4_1) {
            ops[i].pub.dot = dot_q4_1_exact;
            ops[i].dotn = NULL;
        }
}
