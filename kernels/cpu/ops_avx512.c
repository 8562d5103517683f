/* kernels/cpu/ops_avx512.c: AVX-512 twins of the int8 K/V attention helpers (kern_vops qk_q8
 * and pv_q8; their scalar references are in ops.c, the AVX2 twins in ops_avx2.c, which these
 * fall back to for shapes they do not take). 16 lanes: a 64-element head is 4 registers. */
#include "kernels/cpu/internal.h"

#include <immintrin.h>

static void (*qk_q8_avx2)(const float *const *q, int nq, const uint8_t *k, size_t stride, int n,
                          int d, int group, float scale, float *const *s, int off);
static void (*pv_q8_avx2)(float *const *out, int nq, const float *const *p, int off,
                          const uint8_t *v, size_t stride, int n, int d);

static inline float f16(uint16_t h)
{
    return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h)));
}

static inline __m512 ld_i8(const int8_t *p)   /* 16 int8 values as f32 */
{
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
}

/* Scores of up to 4 query rows against 4 keys with one scale each (after their d values):
 * each key's values converted once for all rows, its scale applied to the score. */
static inline __attribute__((always_inline)) void
qk4_q8(const float *const *q, int m, const uint8_t *const kp[4], int d, float scale,
       float *const *s, int col, int cols)
{
    __m512 acc[4][4];
#pragma GCC unroll 4
    for (int i = 0; i < m; i++)
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++)
            acc[i][c] = _mm512_setzero_ps();
    for (int e = 0; e < d; e += 16) {
        __m512 kv[4];
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++)
            kv[c] = ld_i8((const int8_t *)kp[c] + e);
#pragma GCC unroll 4
        for (int i = 0; i < m; i++) {
            __m512 qv = _mm512_loadu_ps(q[i] + e);
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++)
                acc[i][c] = _mm512_fmadd_ps(qv, kv[c], acc[i][c]);
        }
    }
    float ks[4];
    for (int c = 0; c < 4; c++)
        ks[c] = f16(*(const uint16_t *)(kp[c] + d)) * scale;
    for (int i = 0; i < m; i++)
        for (int c = 0; c < cols; c++)
            s[i][col + c] = _mm512_reduce_add_ps(acc[i][c]) * ks[c];
}

static void qk_q8(const float *const *q, int nq, const uint8_t *k, size_t stride, int n, int d,
                  int group, float scale, float *const *s, int off)
{
    if (group != d || d % 16 != 0) {
        qk_q8_avx2(q, nq, k, stride, n, d, group, scale, s, off);
        return;
    }
    for (int i = 0; i < nq; i += 4) {
        int m = nq - i < 4 ? nq - i : 4;
        for (int j = 0; j < n; j += 4) {
            int cols = n - j < 4 ? n - j : 4;
            /* the last 1-3 keys: the last one repeated, its scores dropped */
            const uint8_t *kp[4];
            for (int c = 0; c < 4; c++)
                kp[c] = k + (size_t)(j + (c < cols ? c : cols - 1)) * stride;
            if (m == 4)
                qk4_q8(q + i, 4, kp, d, scale, s + i, off + j, cols);
            else if (m == 3)
                qk4_q8(q + i, 3, kp, d, scale, s + i, off + j, cols);
            else if (m == 2)
                qk4_q8(q + i, 2, kp, d, scale, s + i, off + j, cols);
            else
                qk4_q8(q + i, 1, kp, d, scale, s + i, off + j, cols);
        }
    }
}

/* Up to 3 output rows, 64 of their elements at a time in registers: each value vector converted
 * once for all rows, each probability multiplied by its row's scale. */
static inline __attribute__((always_inline)) void
pv64_q8(float *const *out, int m, const float *const *p, int off, const uint8_t *v,
        size_t stride, int n, int d, int e0)
{
    __m512 o[3][4];
#pragma GCC unroll 3
    for (int i = 0; i < m; i++)
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++)
            o[i][c] = _mm512_loadu_ps(out[i] + e0 + 16 * c);
    for (int j = 0; j < n; j++, v += stride) {
        float sc = f16(*(const uint16_t *)(v + d));
        __m512 pj[3];
#pragma GCC unroll 3
        for (int i = 0; i < m; i++)
            pj[i] = _mm512_set1_ps(p[i][off + j] * sc);
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) {
            __m512 vv = ld_i8((const int8_t *)v + e0 + 16 * c);
#pragma GCC unroll 3
            for (int i = 0; i < m; i++)
                o[i][c] = _mm512_fmadd_ps(pj[i], vv, o[i][c]);
        }
    }
#pragma GCC unroll 3
    for (int i = 0; i < m; i++)
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++)
            _mm512_storeu_ps(out[i] + e0 + 16 * c, o[i][c]);
}

static void pv_q8(float *const *out, int nq, const float *const *p, int off, const uint8_t *v,
                  size_t stride, int n, int d)
{
    if (d % 64 != 0) {
        pv_q8_avx2(out, nq, p, off, v, stride, n, d);
        return;
    }
    for (int i = 0; i < nq; i += 3) {
        int m = nq - i < 3 ? nq - i : 3;
        for (int e0 = 0; e0 < d; e0 += 64) {
            if (m == 3)
                pv64_q8(out + i, 3, p + i, off, v, stride, n, d, e0);
            else if (m == 2)
                pv64_q8(out + i, 2, p + i, off, v, stride, n, d, e0);
            else
                pv64_q8(out + i, 1, p + i, off, v, stride, n, d, e0);
        }
    }
}

void kern__vops_install_avx512(kern_vops *v)
{
    qk_q8_avx2 = v->qk_q8;
    pv_q8_avx2 = v->pv_q8;
    v->qk_q8 = qk_q8;
    v->pv_q8 = pv_q8;
}
