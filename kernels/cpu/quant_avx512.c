/* kernels/cpu/quant_avx512.c: AVX-512 (F, BW, VL, VNNI) tiles for several tokens (prefill),
 * installed over the AVX2 kernels together with the matrix-vector ones of mv_avx512.c (these
 * files alone are compiled with those flags; quant.c calls in only when cpuid has them).
 *
 * Quantized tile: a block of 16 weight rows is repacked into scratch as unsigned bytes,
 * 32-element block by block, each block as 8 groups of [16 rows][4 consecutive elements], with
 * per-row float scale a and offset c so that weight = a * u + c (Q4_0: u = q, c = -8d; Q4_1:
 * c = m; Q8_0: u = q + 128, c = -128d; Q4_K: a = d*sc, c = -dmin*m per sub-block of 32). Then
 * one VPDPBUSD multiplies a group of the 16 rows by 4 activation bytes broadcast from memory:
 * 16 rows x 4 elements per instruction, lanes = rows, so the block's int32 sums come out one lane
 * per row and are scaled with one multiply and one or two FMAs per token. Up to 8 tokens run
 * side by side, reusing the 8 group registers. The repacking is paid once per block of rows and
 * amortized over every token of the call. Q6_K (a scale per 16, offset -32) and the float types
 * have their own variants below. */
#include "kernels/cpu/internal.h"

#include <immintrin.h>
#include <string.h>

/* ---- packing --------------------------------------------------------------------------------- */

enum { TR = 16 };   /* rows per tile: one zmm lane each */

typedef struct packed_blk {
    uint8_t w[8][TR * 4];   /* group g: row r's elements 4g..4g+3 at [g][4r] */
    float a[TR];
    float c[TR];
} packed_blk;

static size_t tile_scratch_32(int64_t n)
{
    return (size_t)(n / 32) * sizeof(packed_blk);
}

static inline __mmask16 row_mask(int nr)
{
    return nr >= TR ? (__mmask16)0xffff : (__mmask16)((1u << nr) - 1);
}

/* The 16 rows of a tile. A tile of nr < 16 rows repeats its last row: the extra lanes compute
 * garbage that the masked store at the end never writes. */
typedef struct rows16 {
    const uint8_t *p[TR];
} rows16;

static inline void rows_init(rows16 *r, const uint8_t *w, size_t ws, int nr)
{
    for (int i = 0; i < TR; i++)
        r->p[i] = w + (size_t)(i < nr ? i : nr - 1) * ws;
}

static inline __m512 f16_lo(__m512i v)    /* the low halves of 16 dwords, as f16 → f32 */
{
    return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(v));
}

#define ROW16(r, i, off) _mm_loadu_si128((const __m128i *)((r)->p[i] + (off)))
#define LANES(r, i, off)                                                                         \
    _mm512_inserti32x4(_mm512_inserti32x4(_mm512_inserti32x4(                                    \
        _mm512_castsi128_si512(ROW16(r, i, off)), ROW16(r, 4 + (i), off), 1),                    \
        ROW16(r, 8 + (i), off), 2), ROW16(r, 12 + (i), off), 3)

/* The 16 bytes at byte `off` of each row, transposed into 4 vectors: out[g] lane i = row i's
 * dword g. Rows i, 4 + i, 8 + i, 12 + i go into the four 128-bit lanes of z[i]; two rounds of
 * in-lane unpacks then leave lane l of out[g] holding rows 4l..4l+3 in order. */
static inline void load_transpose_16x4(const rows16 *r, size_t off, __m512i out[4])
{
    __m512i z0 = LANES(r, 0, off), z1 = LANES(r, 1, off), z2 = LANES(r, 2, off),
            z3 = LANES(r, 3, off);
    __m512i t0 = _mm512_unpacklo_epi32(z0, z1), t1 = _mm512_unpackhi_epi32(z0, z1);
    __m512i t2 = _mm512_unpacklo_epi32(z2, z3), t3 = _mm512_unpackhi_epi32(z2, z3);
    out[0] = _mm512_unpacklo_epi64(t0, t2);
    out[1] = _mm512_unpackhi_epi64(t0, t2);
    out[2] = _mm512_unpacklo_epi64(t1, t3);
    out[3] = _mm512_unpackhi_epi64(t1, t3);
}

/* Dwords of nibbles → group g (low nibbles, elements 4g..) and g + 4 (high nibbles, 16 + 4g..). */
static inline void put_nibble_groups(packed_blk *p, int g, __m512i d)
{
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    _mm512_store_si512((__m512i *)p->w[g], _mm512_and_si512(d, m4));
    _mm512_store_si512((__m512i *)p->w[g + 4], _mm512_and_si512(_mm512_srli_epi32(d, 4), m4));
}

static void pack_q4_0(const uint8_t *w, size_t ws, int nr, int64_t nb, packed_blk *p)
{
    rows16 r;
    rows_init(&r, w, ws, nr);
    for (int64_t b = 0; b < nb; b++, p++) {
        __m512i h[4];   /* only h[0] is used: its low halves are the 16 rows' d */
        load_transpose_16x4(&r, (size_t)b * 18, h);
        __m512 d = f16_lo(h[0]);
        _mm512_store_ps(p->a, d);
        _mm512_store_ps(p->c, _mm512_mul_ps(d, _mm512_set1_ps(-8.0f)));
        __m512i q[4];
        load_transpose_16x4(&r, (size_t)b * 18 + 2, q);
        for (int g = 0; g < 4; g++)
            put_nibble_groups(p, g, q[g]);
    }
}

static inline void put_q4_1(packed_blk *p, __m512i dm, const __m512i q[4])
{
    _mm512_store_ps(p->a, f16_lo(dm));
    _mm512_store_ps(p->c, f16_lo(_mm512_srli_epi32(dm, 16)));
    for (int g = 0; g < 4; g++)
        put_nibble_groups(p, g, q[g]);
}

/* Two blocks (40 bytes) per step from three 16-byte transposes, at +0 (dm, q0 q1 q2), +16 (q3,
 * dm', q0' q1') and +24 (q0'..q3'), none reaching past the second block. */
static void pack_q4_1(const uint8_t *w, size_t ws, int nr, int64_t nb, packed_blk *p)
{
    rows16 r;
    rows_init(&r, w, ws, nr);
    int64_t b = 0;
    for (; b + 2 <= nb; b += 2, p += 2) {
        __m512i t0[4], t1[4], t2[4];
        load_transpose_16x4(&r, (size_t)b * 20, t0);
        load_transpose_16x4(&r, (size_t)b * 20 + 16, t1);
        load_transpose_16x4(&r, (size_t)b * 20 + 24, t2);
        __m512i q[4] = {t0[1], t0[2], t0[3], t1[0]};
        put_q4_1(p, t0[0], q);
        put_q4_1(p + 1, t1[1], t2);
    }
    if (b < nb) {
        __m512i h[4], q[4];
        load_transpose_16x4(&r, (size_t)b * 20, h);
        load_transpose_16x4(&r, (size_t)b * 20 + 4, q);
        put_q4_1(p, h[0], q);
    }
}

static void pack_q8_0(const uint8_t *w, size_t ws, int nr, int64_t nb, packed_blk *p)
{
    rows16 r;
    rows_init(&r, w, ws, nr);
    const __m512i bias = _mm512_set1_epi8((char)0x80);
    for (int64_t b = 0; b < nb; b++, p++) {
        __m512i h[4];   /* only h[0] is used: its low halves are the 16 rows' d */
        load_transpose_16x4(&r, (size_t)b * 34, h);
        __m512 d = f16_lo(h[0]);
        _mm512_store_ps(p->a, d);
        _mm512_store_ps(p->c, _mm512_mul_ps(d, _mm512_set1_ps(-128.0f)));
        __m512i q[8];
        load_transpose_16x4(&r, (size_t)b * 34 + 2, q);
        load_transpose_16x4(&r, (size_t)b * 34 + 18, q + 4);
        for (int g = 0; g < 8; g++)   /* q + 128 as unsigned: flip the sign bit */
            _mm512_store_si512((__m512i *)p->w[g], _mm512_xor_si512(q[g], bias));
    }
}

/* Byte j of each dword. */
static inline __m512i byte_of(__m512i v, int j)
{
    return _mm512_and_si512(_mm512_srli_epi32(v, 8 * j), _mm512_set1_epi32(0xff));
}

/* A Q4_K super-block becomes 8 packed blocks: sub-block j of 32 with a = d * sc_j and
 * c = -dmin * m_j (the 6-bit scale layout is spelled out in internal.h). */
static void pack_q4_k(const uint8_t *w, size_t ws, int nr, int64_t nb, packed_blk *p)
{
    const __m512i m63 = _mm512_set1_epi32(63), m15 = _mm512_set1_epi32(15);
    rows16 r;
    rows_init(&r, w, ws, nr);
    for (int64_t sb = 0; sb < nb / 8; sb++, p += 8) {
        __m512i s[4];   /* s[0]: d and dmin; s[1..3]: the 12 scale bytes */
        load_transpose_16x4(&r, (size_t)sb * 144, s);
        __m512 d = f16_lo(s[0]);
        __m512 ndmin = _mm512_sub_ps(_mm512_setzero_ps(), f16_lo(_mm512_srli_epi32(s[0], 16)));
        for (int j = 0; j < 4; j++) {
            __m512i b0 = byte_of(s[1], j), b1 = byte_of(s[2], j), b2 = byte_of(s[3], j);
            __m512i sc_lo = _mm512_and_si512(b0, m63), m_lo = _mm512_and_si512(b1, m63);
            __m512i sc_hi = _mm512_or_si512(_mm512_and_si512(b2, m15),
                                            _mm512_slli_epi32(_mm512_srli_epi32(b0, 6), 4));
            __m512i m_hi = _mm512_or_si512(_mm512_srli_epi32(b2, 4),
                                           _mm512_slli_epi32(_mm512_srli_epi32(b1, 6), 4));
            _mm512_store_ps(p[j].a, _mm512_mul_ps(d, _mm512_cvtepi32_ps(sc_lo)));
            _mm512_store_ps(p[j].c, _mm512_mul_ps(ndmin, _mm512_cvtepi32_ps(m_lo)));
            _mm512_store_ps(p[j + 4].a, _mm512_mul_ps(d, _mm512_cvtepi32_ps(sc_hi)));
            _mm512_store_ps(p[j + 4].c, _mm512_mul_ps(ndmin, _mm512_cvtepi32_ps(m_hi)));
        }
        /* Chunk c of 32 bytes: low nibbles are sub-block 2c, high nibbles sub-block 2c + 1. */
        const __m512i m4 = _mm512_set1_epi8(0x0f);
        for (int c = 0; c < 4; c++) {
            __m512i q[8];
            load_transpose_16x4(&r, (size_t)sb * 144 + 16 + 32 * (size_t)c, q);
            load_transpose_16x4(&r, (size_t)sb * 144 + 32 + 32 * (size_t)c, q + 4);
            for (int g = 0; g < 8; g++) {
                _mm512_store_si512((__m512i *)p[2 * c].w[g], _mm512_and_si512(q[g], m4));
                _mm512_store_si512((__m512i *)p[2 * c + 1].w[g],
                                   _mm512_and_si512(_mm512_srli_epi32(q[g], 4), m4));
            }
        }
    }
}

/* ---- tile product ---------------------------------------------------------------------------- */

static inline __m512i bcast4(const int8_t *p)
{
    int32_t v;
    memcpy(&v, p, sizeof v);
    return _mm512_set1_epi32(v);
}

/* T tokens (1..8) against a packed row tile: y[t * ldy + r] for the rows in `k`. */
static inline __attribute__((always_inline)) void
tile_tokens(const packed_blk *pk, int64_t nb, const uint8_t *act, size_t as, int T, float *y,
            int64_t ldy, __mmask16 k, int has_c)
{
    __m512 acc[8];
#pragma GCC unroll 8
    for (int t = 0; t < T; t++)
        acc[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const packed_blk *p = &pk[b];
        __m512i w[8];
#pragma GCC unroll 8
        for (int g = 0; g < 8; g++)
            w[g] = _mm512_load_si512((const __m512i *)p->w[g]);
        __m512 a = _mm512_load_ps(p->a), c = _mm512_load_ps(p->c);
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) {
            const kern_q8_32 *x = (const kern_q8_32 *)(act + (size_t)t * as) + b;
            __m512i s0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[0], bcast4(x->qs));
            __m512i s1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[1], bcast4(x->qs + 4));
            s0 = _mm512_dpbusd_epi32(s0, w[2], bcast4(x->qs + 8));
            s1 = _mm512_dpbusd_epi32(s1, w[3], bcast4(x->qs + 12));
            s0 = _mm512_dpbusd_epi32(s0, w[4], bcast4(x->qs + 16));
            s1 = _mm512_dpbusd_epi32(s1, w[5], bcast4(x->qs + 20));
            s0 = _mm512_dpbusd_epi32(s0, w[6], bcast4(x->qs + 24));
            s1 = _mm512_dpbusd_epi32(s1, w[7], bcast4(x->qs + 28));
            __m512 f = _mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1));
            acc[t] = _mm512_fmadd_ps(f, _mm512_mul_ps(a, _mm512_set1_ps(x->d)), acc[t]);
            if (has_c)
                acc[t] = _mm512_fmadd_ps(c, _mm512_set1_ps(x->s), acc[t]);
        }
    }
#pragma GCC unroll 8
    for (int t = 0; t < T; t++)
        _mm512_mask_storeu_ps(y + (size_t)t * (size_t)ldy, k, acc[t]);
}

#define TILE_T(T)                                                                                \
    static void tile_##T(const packed_blk *pk, int64_t nb, const uint8_t *act, size_t as,        \
                         float *y, int64_t ldy, __mmask16 k)                                     \
    {                                                                                            \
        tile_tokens(pk, nb, act, as, T, y, ldy, k, 1);                                           \
    }
TILE_T(8)
TILE_T(4)
TILE_T(2)
TILE_T(1)

static void tile_all(const packed_blk *pk, int64_t nb, int nr, const uint8_t *act, size_t as,
                     int nt, float *y, int64_t ldy)
{
    __mmask16 k = row_mask(nr);
    int t = 0;
    for (; t + 8 <= nt; t += 8)
        tile_8(pk, nb, act + (size_t)t * as, as, y + (size_t)t * (size_t)ldy, ldy, k);
    if (nt - t >= 4) {
        tile_4(pk, nb, act + (size_t)t * as, as, y + (size_t)t * (size_t)ldy, ldy, k);
        t += 4;
    }
    if (nt - t >= 2) {
        tile_2(pk, nb, act + (size_t)t * as, as, y + (size_t)t * (size_t)ldy, ldy, k);
        t += 2;
    }
    if (nt - t >= 1)
        tile_1(pk, nb, act + (size_t)t * as, as, y + (size_t)t * (size_t)ldy, ldy, k);
}

#define TILE_FN(name, pack)                                                                      \
    static void name(int64_t n, const void *w, size_t ws, int nr, const void *act, size_t as,   \
                     int nt, float *y, int64_t ldy, void *scratch)                               \
    {                                                                                            \
        pack(w, ws, nr, n / 32, scratch);                                                        \
        tile_all(scratch, n / 32, nr, act, as, nt, y, ldy);                                      \
    }
TILE_FN(tile_q4_0, pack_q4_0)
TILE_FN(tile_q4_1, pack_q4_1)
TILE_FN(tile_q8_0, pack_q8_0)
TILE_FN(tile_q4_k, pack_q4_k)

/* ---- Q6_K tile ------------------------------------------------------------------------------- */

/* Q6_K has a scale per 16 elements and an offset of -32: its tile keeps the weights signed,
 * w = q - 32 (VPDPBUSD's s8 side), and takes the activation as unsigned bytes xq + 128. The +128
 * comes back out exactly by starting each 16-element half's int32 sum at -128 * sum(w) instead of
 * 0. Each 32-element packed block has two scales, a0 = d * sc[2j] and a1 = d * sc[2j + 1]. */
typedef struct packed_q6 {
    int8_t w[8][TR * 4];
    int32_t k0[TR], k1[TR];   /* -128 * sum of w over groups 0-3 and 4-7 */
    float a0[TR], a1[TR];
} packed_q6;

static size_t tile_scratch_q6(int64_t n)
{
    return (size_t)(n / 32) * sizeof(packed_q6);
}

/* The activation for the Q6_K tile: q8 blocks of 32 with the bytes made unsigned (+128). */
static void (*q8_quantize)(const float *x, void *act, int64_t n);

static void quantize_q8_32_biased(const float *x, void *act, int64_t n)
{
    q8_quantize(x, act, n);
    kern_q8_32 *b = act;
    for (int64_t i = 0; i < n / 32; i++) {
        __m256i q = _mm256_loadu_si256((const __m256i *)b[i].qs);
        _mm256_storeu_si256((__m256i *)b[i].qs, _mm256_xor_si256(q, _mm256_set1_epi8((char)0x80)));
    }
}

/* Signed byte j of each dword, as int32. */
static inline __m512i sbyte_of(__m512i v, int j)
{
    return _mm512_srai_epi32(_mm512_slli_epi32(v, 24 - 8 * j), 24);
}

static void pack_q6_k(const uint8_t *w, size_t ws, int nr, int64_t nb, packed_q6 *p)
{
    rows16 r;
    rows_init(&r, w, ws, nr);
    const __m512i m4 = _mm512_set1_epi8(0x0f), m3 = _mm512_set1_epi8(0x03);
    const __m512i b32 = _mm512_set1_epi8(32), ones = _mm512_set1_epi8(1);
    for (int64_t sb = 0; sb < nb / 8; sb++, p += 8) {
        size_t base = (size_t)sb * 210;
        __m512i sc[4], tail[4];
        load_transpose_16x4(&r, base + 192, sc);     /* the 16 int8 scales */
        load_transpose_16x4(&r, base + 194, tail);   /* d: the high half of dword 3 */
        __m512 d = f16_lo(_mm512_srli_epi32(tail[3], 16));
        for (int h = 0; h < 2; h++) {
            __m512i ql[2][8], qh[8];
            load_transpose_16x4(&r, base + 64 * (size_t)h, ql[0]);
            load_transpose_16x4(&r, base + 64 * (size_t)h + 16, ql[0] + 4);
            load_transpose_16x4(&r, base + 64 * (size_t)h + 32, ql[1]);
            load_transpose_16x4(&r, base + 64 * (size_t)h + 48, ql[1] + 4);
            load_transpose_16x4(&r, base + 128 + 32 * (size_t)h, qh);
            load_transpose_16x4(&r, base + 128 + 32 * (size_t)h + 16, qh + 4);
            for (int k = 0; k < 4; k++) {
                /* Elements 128h + 32k + l: low 4 bits from ql[64h + 32(k & 1) + l] (high nibble
                 * for k >= 2), top 2 bits from bits 2k of qh[32h + l]. */
                packed_q6 *o = &p[4 * h + k];
                __m512i s0 = _mm512_setzero_si512(), s1 = s0;
                for (int g = 0; g < 8; g++) {
                    __m512i lo = ql[k & 1][g];
                    lo = _mm512_and_si512(k >= 2 ? _mm512_srli_epi32(lo, 4) : lo, m4);
                    __m512i hi = _mm512_and_si512(_mm512_srli_epi32(qh[g], 2 * k), m3);
                    __m512i q = _mm512_sub_epi8(_mm512_or_si512(lo, _mm512_slli_epi32(hi, 4)), b32);
                    _mm512_store_si512((__m512i *)o->w[g], q);
                    if (g < 4)
                        s0 = _mm512_dpbusd_epi32(s0, ones, q);
                    else
                        s1 = _mm512_dpbusd_epi32(s1, ones, q);
                }
                _mm512_store_si512((__m512i *)o->k0, _mm512_slli_epi32(_mm512_sub_epi32(_mm512_setzero_si512(), s0), 7));
                _mm512_store_si512((__m512i *)o->k1, _mm512_slli_epi32(_mm512_sub_epi32(_mm512_setzero_si512(), s1), 7));
                int g0 = 8 * h + 2 * k;   /* scale index of the first 16 elements */
                _mm512_store_ps(o->a0, _mm512_mul_ps(d, _mm512_cvtepi32_ps(sbyte_of(sc[g0 / 4], g0 % 4))));
                _mm512_store_ps(o->a1, _mm512_mul_ps(d, _mm512_cvtepi32_ps(sbyte_of(sc[(g0 + 1) / 4], (g0 + 1) % 4))));
            }
        }
    }
}

static inline __attribute__((always_inline)) void
tile_q6_tokens(const packed_q6 *pk, int64_t nb, const uint8_t *act, size_t as, int T, float *y,
               int64_t ldy, __mmask16 k)
{
    __m512 acc[8];
#pragma GCC unroll 8
    for (int t = 0; t < T; t++)
        acc[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const packed_q6 *p = &pk[b];
        __m512i w[8];
#pragma GCC unroll 8
        for (int g = 0; g < 8; g++)
            w[g] = _mm512_load_si512((const __m512i *)p->w[g]);
        __m512i k0 = _mm512_load_si512((const __m512i *)p->k0);
        __m512i k1 = _mm512_load_si512((const __m512i *)p->k1);
#pragma GCC unroll 8
        for (int t = 0; t < T; t++) {
            const kern_q8_32 *x = (const kern_q8_32 *)(act + (size_t)t * as) + b;
            __m512i s0 = k0, s1 = k1;
#pragma GCC unroll 4
            for (int g = 0; g < 4; g++) {
                s0 = _mm512_dpbusd_epi32(s0, bcast4(x->qs + 4 * g), w[g]);
                s1 = _mm512_dpbusd_epi32(s1, bcast4(x->qs + 16 + 4 * g), w[g + 4]);
            }
            __m512 dx = _mm512_set1_ps(x->d);
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s0),
                                     _mm512_mul_ps(_mm512_load_ps(p->a0), dx), acc[t]);
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s1),
                                     _mm512_mul_ps(_mm512_load_ps(p->a1), dx), acc[t]);
        }
    }
#pragma GCC unroll 8
    for (int t = 0; t < T; t++)
        _mm512_mask_storeu_ps(y + (size_t)t * (size_t)ldy, k, acc[t]);
}

static void tile_q6_k(int64_t n, const void *w, size_t ws, int nr, const void *act, size_t as,
                      int nt, float *y, int64_t ldy, void *scratch)
{
    const packed_q6 *pk = scratch;
    int64_t nb = n / 32;
    pack_q6_k(w, ws, nr, nb, scratch);
    __mmask16 k = row_mask(nr);
    const uint8_t *a = act;
    int t = 0;
    for (; t + 8 <= nt; t += 8)
        tile_q6_tokens(pk, nb, a + (size_t)t * as, as, 8, y + (size_t)t * (size_t)ldy, ldy, k);
    for (; t < nt; t++)
        tile_q6_tokens(pk, nb, a + (size_t)t * as, as, 1, y + (size_t)t * (size_t)ldy, ldy, k);
}

/* ---- float tile (F32, F16, BF16) -------------------------------------------------------------- */

/* The 16 rows are converted to f32 and transposed into a panel [column][16 rows], so one FMA
 * multiplies a column of the 16 rows by one activation element broadcast from memory; 8 tokens
 * share each panel load. Activations are the f32 rows themselves. */
static size_t tile_scratch_f(int64_t n)
{
    return (size_t)((n + 15) / 16 * 16) * TR * sizeof(float);
}

static inline void transpose16(__m512 r[16])
{
    __m512 t[16], u[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        u[i] = _mm512_shuffle_ps(t[i], t[i + 2], 0x44);
        u[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], 0xee);
        u[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        u[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0xee);
    }
    /* u[4b + c] lanes: columns c, c + 4, c + 8, c + 12 of rows 4b..4b+3. */
    for (int c = 0; c < 4; c++) {
        __m512 v0 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0x88);
        __m512 v1 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0xdd);
        __m512 v2 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0x88);
        __m512 v3 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0xdd);
        r[c] = _mm512_shuffle_f32x4(v0, v2, 0x88);
        r[c + 8] = _mm512_shuffle_f32x4(v0, v2, 0xdd);
        r[c + 4] = _mm512_shuffle_f32x4(v1, v3, 0x88);
        r[c + 12] = _mm512_shuffle_f32x4(v1, v3, 0xdd);
    }
}

static inline __m512 load16(uint32_t type, const uint8_t *row, int64_t e)
{
    if (type == KERN_TYPE_F32)
        return _mm512_loadu_ps((const float *)row + e);
    __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)row + e));
    if (type == KERN_TYPE_F16)
        return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

static float elem(uint32_t type, const uint8_t *row, int64_t e)
{
    if (type == KERN_TYPE_F32)
        return ((const float *)row)[e];
    uint16_t h = ((const uint16_t *)row)[e];
    return type == KERN_TYPE_F16 ? kern_f16_to_f32(h) : kern_bf16_to_f32(h);
}

static void pack_f(uint32_t type, const uint8_t *w, size_t ws, int nr, int64_t n, float *p)
{
    rows16 r;
    rows_init(&r, w, ws, nr);
    int64_t e = 0;
    for (; e + 16 <= n; e += 16, p += 16 * TR) {
        __m512 v[16];
        for (int i = 0; i < 16; i++)
            v[i] = load16(type, r.p[i], e);
        transpose16(v);
        for (int c = 0; c < 16; c++)
            _mm512_store_ps(p + 16 * c, v[c]);
    }
    for (; e < n; e++, p += TR)
        for (int i = 0; i < TR; i++)
            p[i] = elem(type, r.p[i], e);
}

static inline __attribute__((always_inline)) void
tile_f_tokens(const float *pk, int64_t n, const uint8_t *act, size_t as, int T, float *y,
              int64_t ldy, __mmask16 k)
{
    __m512 acc[8];
#pragma GCC unroll 8
    for (int t = 0; t < T; t++)
        acc[t] = _mm512_setzero_ps();
    for (int64_t e = 0; e < n; e++) {
        __m512 wv = _mm512_load_ps(pk + (size_t)e * TR);
#pragma GCC unroll 8
        for (int t = 0; t < T; t++)
            acc[t] = _mm512_fmadd_ps(wv, _mm512_set1_ps(((const float *)(act + (size_t)t * as))[e]),
                                     acc[t]);
    }
#pragma GCC unroll 8
    for (int t = 0; t < T; t++)
        _mm512_mask_storeu_ps(y + (size_t)t * (size_t)ldy, k, acc[t]);
}

static void tile_f_all(uint32_t type, int64_t n, const void *w, size_t ws, int nr,
                       const void *act, size_t as, int nt, float *y, int64_t ldy, void *scratch)
{
    pack_f(type, w, ws, nr, n, scratch);
    __mmask16 k = row_mask(nr);
    const uint8_t *a = act;
    int t = 0;
    for (; t + 8 <= nt; t += 8)
        tile_f_tokens(scratch, n, a + (size_t)t * as, as, 8, y + (size_t)t * (size_t)ldy, ldy, k);
    for (; t + 2 <= nt; t += 2)
        tile_f_tokens(scratch, n, a + (size_t)t * as, as, 2, y + (size_t)t * (size_t)ldy, ldy, k);
    for (; t < nt; t++)
        tile_f_tokens(scratch, n, a + (size_t)t * as, as, 1, y + (size_t)t * (size_t)ldy, ldy, k);
}

static void tile_f32(int64_t n, const void *w, size_t ws, int nr, const void *act, size_t as,
                     int nt, float *y, int64_t ldy, void *scratch)
{
    tile_f_all(KERN_TYPE_F32, n, w, ws, nr, act, as, nt, y, ldy, scratch);
}

static void tile_f16(int64_t n, const void *w, size_t ws, int nr, const void *act, size_t as,
                     int nt, float *y, int64_t ldy, void *scratch)
{
    tile_f_all(KERN_TYPE_F16, n, w, ws, nr, act, as, nt, y, ldy, scratch);
}

static void tile_bf16(int64_t n, const void *w, size_t ws, int nr, const void *act, size_t as,
                      int nt, float *y, int64_t ldy, void *scratch)
{
    tile_f_all(KERN_TYPE_BF16, n, w, ws, nr, act, as, nt, y, ldy, scratch);
}

static size_t act_bytes_f(int64_t n)
{
    return (size_t)n * sizeof(float);
}

/* ---- install --------------------------------------------------------------------------------- */

void kern__quant_install_avx512(kern_wops *ops, int n)
{
    kern__mv_init_avx512();
    const kern_wops *q8 = NULL;
    for (int i = 0; i < n; i++)
        if (ops[i].pub.type == KERN_TYPE_Q8_0)
            q8 = &ops[i];
    for (int i = 0; i < n; i++) {
        kern_wops *o = &ops[i];
        kern_tile_fn tile = NULL;
        switch (o->pub.type) {
        case KERN_TYPE_Q4_0:
            tile = tile_q4_0;
            o->mv = kern__mv_q4_0_avx512;
            o->dotn = NULL;   /* a few tokens go through the mv, token by token */
            break;
        case KERN_TYPE_Q4_1:
            /* (LLMGW_KERNELS=exact drops both: they sum in another order than llama.cpp) */
            tile = tile_q4_1;
            o->mv = kern__mv_q4_1_avx512;
            o->dotn = NULL;
            break;
        case KERN_TYPE_Q8_0:
            tile = tile_q8_0;
            o->mv = kern__mv_q8_0_avx512;
            break;
        case KERN_TYPE_Q4_K:
            tile = tile_q4_k;
            break;
        case KERN_TYPE_F16:
        case KERN_TYPE_BF16:
            /* These keep the AVX2 tiles, which sum each (row, token) in the dot's order: the
             * float tile below sums in another, which made a token's F16 results depend on its
             * batch (tile_invariant, quant_avx2.c; found on a Sapphire Rapids host). */
            if (o->tile_invariant)
                break;
            /* fall through */
        case KERN_TYPE_F32:
            o->tile = o->pub.type == KERN_TYPE_F32 ? tile_f32
                      : o->pub.type == KERN_TYPE_F16 ? tile_f16 : tile_bf16;
            o->tile_rows = TR;
            o->tile_min_tok = 2;
            o->tile_act_bytes = act_bytes_f;
            /* F32 rows are used in place; F16/BF16 rows get the same rounding as the
             * one-token path (see kern__quantize_f16_round). */
            o->tile_quantize = o->pub.type == KERN_TYPE_F32 ? NULL : o->pub.quantize_act;
            o->tile_scratch = tile_scratch_f;
            break;
        case KERN_TYPE_Q6_K:
            if (q8 != NULL) {
                q8_quantize = q8->pub.quantize_act;
                o->tile = tile_q6_k;
                o->tile_rows = TR;
                o->tile_min_tok = 2;
                o->tile_act_bytes = q8->pub.act_row_bytes;
                o->tile_quantize = quantize_q8_32_biased;
                o->tile_scratch = tile_scratch_q6;
            }
            break;
        default:
            break;
        }
        if (tile != NULL && q8 != NULL) {
            o->tile = tile;
            o->tile_rows = TR;
            /* Q4_0 / Q4_1: two or three tokens (a short draft's verification, a drafter
             * catching up) go through the mv token by token, the same bits as one token's
             * (verifying a draft must give what plain decoding gives); the tile sums in
             * another order. */
            o->tile_min_tok = o->pub.type == KERN_TYPE_Q4_0 || o->pub.type == KERN_TYPE_Q4_1
                                  ? KERN_DOTN_MAX + 1
                                  : 2;
            o->tile_act_bytes = q8->pub.act_row_bytes;     /* q8 blocks of 32 for all four */
            /* q8 blocks of 32 (q8_1 for Q4_1: its own activation quantizer) */
            o->tile_quantize = o->pub.type == KERN_TYPE_Q4_1 ? o->pub.quantize_act
                                                             : q8->pub.quantize_act;
            o->tile_scratch = tile_scratch_32;
        }
    }
}
