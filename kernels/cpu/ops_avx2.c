/* kernels/cpu/ops_avx2.c: AVX2 + FMA + F16C twins of the vector helpers in ops.c (RMSNorm,
 * SwiGLU, adds, and the attention inner loops over f16 K/V rows). exp() is a polynomial: e^x =
 * 2^n * e^r with n = round(x / ln 2) and |r| <= ln2 / 2, Taylor to r^6 (relative error < 2e-7),
 * inputs clamped to [-87, 88] so 2^n stays a normal float. */
#include "kernels/cpu/internal.h"

#include <immintrin.h>
#include <math.h>
#include <stdbool.h>

/* kern__expf (ops.c) 8 lanes at a time: the same operations, so the same bits. 2^n is applied
 * as 2^(n/2) * 2^(n - n/2), both normal for |n| <= 192. */
static inline __m256 pow2i(__m256i k)
{
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(k, _mm256_set1_epi32(127)), 23));
}

static inline __m256 exp256(__m256 x)
{
    const __m256 r = _mm256_set1_ps(0x1.8p23f);
    __m256 z = _mm256_fmadd_ps(x, _mm256_set1_ps(0x1.715476p+0f), r);
    __m256 n = _mm256_sub_ps(z, r);
    __m256 b = _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.7f7d1cp-20f),
                                _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.62e4p-1f), x));
    __m256 u = _mm256_mul_ps(b, b);
    __m256 j = _mm256_fmadd_ps(
        _mm256_fmadd_ps(_mm256_fmadd_ps(_mm256_set1_ps(0x1.0e4020p-7f), b,
                                        _mm256_set1_ps(0x1.573e2ep-5f)),
                        u,
                        _mm256_fmadd_ps(_mm256_set1_ps(0x1.555e66p-3f), b,
                                        _mm256_set1_ps(0x1.fffdb6p-2f))),
        u, _mm256_fmadd_ps(_mm256_set1_ps(0x1.ffffecp-1f), b, _mm256_set1_ps(1.0f)));
    __m256 big = _mm256_cmp_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.0f), n), _mm256_set1_ps(192.0f),
                               _CMP_GT_OQ);
    __m256 nc = _mm256_blendv_ps(n, _mm256_setzero_ps(), big);   /* keep the shifts sane */
    __m256i ni = _mm256_cvttps_epi32(nc);
    /* n / 2 rounded toward zero, as C's integer division in the reference */
    __m256i n1 = _mm256_srai_epi32(_mm256_add_epi32(ni, _mm256_srli_epi32(ni, 31)), 1);
    __m256i n2 = _mm256_sub_epi32(ni, n1);
    __m256 res = _mm256_mul_ps(_mm256_mul_ps(j, pow2i(n1)), pow2i(n2));
    __m256 alt = _mm256_blendv_ps(_mm256_set1_ps(INFINITY), _mm256_setzero_ps(),
                                  _mm256_cmp_ps(n, _mm256_setzero_ps(), _CMP_LE_OQ));
    return _mm256_blendv_ps(res, alt, big);
}

/* The reference's sum (f32 squares added in double), 4 double lanes at a time: the double
 * sum of 24-bit products differs from the sequential one only in its last bits, which the
 * caller's rounding to f32 almost always removes. */
static double sumsq(const float *x, int64_t n)
{
    __m256d a0 = _mm256_setzero_pd(), a1 = a0;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        __m256 sq = _mm256_mul_ps(v, v);
        a0 = _mm256_add_pd(a0, _mm256_cvtps_pd(_mm256_castps256_ps128(sq)));
        a1 = _mm256_add_pd(a1, _mm256_cvtps_pd(_mm256_extractf128_ps(sq, 1)));
    }
    __m256d a = _mm256_add_pd(a0, a1);
    __m128d h = _mm_add_pd(_mm256_castpd256_pd128(a), _mm256_extractf128_pd(a, 1));
    double s = _mm_cvtsd_f64(_mm_add_sd(h, _mm_unpackhi_pd(h, h)));
    for (; i < n; i++)
        s += (double)(x[i] * x[i]);
    return s;
}

static void scale_mul(float *y, const float *x, const float *w, float s, int64_t n)
{
    __m256 sv = _mm256_set1_ps(s);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), sv),
                                              _mm256_loadu_ps(w + i)));
    for (; i < n; i++)
        y[i] = x[i] * s * w[i];
}

static void swiglu(float *y, const float *g, const float *u, int64_t n)
{
    const __m256 one = _mm256_set1_ps(1.0f);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 gv = _mm256_loadu_ps(g + i);
        __m256 e = exp256(_mm256_sub_ps(_mm256_setzero_ps(), gv));
        __m256 silu = _mm256_div_ps(gv, _mm256_add_ps(one, e));
        _mm256_storeu_ps(y + i, _mm256_mul_ps(silu, _mm256_loadu_ps(u + i)));
    }
    if (i < n) {   /* the tail through the same vector code, so every element agrees */
        float gv[8] = {0}, uv[8] = {0}, yv[8];
        for (int64_t k = i; k < n; k++) {
            gv[k - i] = g[k];
            uv[k - i] = u[k];
        }
        __m256 gg = _mm256_loadu_ps(gv);
        __m256 silu = _mm256_div_ps(gg, _mm256_add_ps(one, exp256(_mm256_sub_ps(_mm256_setzero_ps(), gg))));
        _mm256_storeu_ps(yv, _mm256_mul_ps(silu, _mm256_loadu_ps(uv)));
        for (int64_t k = i; k < n; k++)
            y[k] = yv[k - i];
    }
}

static void add(float *y, const float *x, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_add_ps(_mm256_loadu_ps(y + i), _mm256_loadu_ps(x + i)));
    for (; i < n; i++)
        y[i] += x[i];
}

static inline __m256 ld_f16(const uint16_t *p)
{
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

/* The tree over 16 lanes (lo = lanes 0-7, hi = 8-15) of llama.cpp's 512-bit reductions:
 * l + (l + 8), then + 4, + 2, + 1. */
static inline float tree16(__m256 lo, __m256 hi)
{
    __m256 t = _mm256_add_ps(lo, hi);
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* One score in the GEMM order (d % 16 == 0): lanes l and l + 8 of 16 chains. */
static inline float qk_gemm(const float *q, const uint16_t *k, int d)
{
    __m256 lo = _mm256_setzero_ps(), hi = lo;
    for (int e = 0; e < d; e += 16) {
        lo = _mm256_fmadd_ps(_mm256_loadu_ps(q + e), ld_f16(k + e), lo);
        hi = _mm256_fmadd_ps(_mm256_loadu_ps(q + e + 8), ld_f16(k + e + 8), hi);
    }
    return tree16(lo, hi);
}

/* One score in the DOT order (d % 64 == 0): 4 accumulators of 16 lanes over 64-element steps,
 * reduced (a0 + a2) + (a1 + a3), then the tree. */
static inline float qk_dot(const float *q, const uint16_t *k, int d)
{
    __m256 a[4][2];
    for (int c = 0; c < 4; c++)
        a[c][0] = a[c][1] = _mm256_setzero_ps();
    for (int e = 0; e < d; e += 64)
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) {
            a[c][0] = _mm256_fmadd_ps(_mm256_loadu_ps(q + e + 16 * c), ld_f16(k + e + 16 * c), a[c][0]);
            a[c][1] = _mm256_fmadd_ps(_mm256_loadu_ps(q + e + 16 * c + 8), ld_f16(k + e + 16 * c + 8),
                                      a[c][1]);
        }
    __m256 lo = _mm256_add_ps(_mm256_add_ps(a[0][0], a[2][0]), _mm256_add_ps(a[1][0], a[3][0]));
    __m256 hi = _mm256_add_ps(_mm256_add_ps(a[0][1], a[2][1]), _mm256_add_ps(a[1][1], a[3][1]));
    return tree16(lo, hi);
}

static void qk_exact(const float *const *q, int nq, const uint16_t *const *k, int n, int d,
               float scale, float *const *s, int order)
{
    bool gemm = order == KERN_ORDER_GEMM && d % 16 == 0;
    if (!gemm && d % 64 != 0) {
        kern__vops_get_ref()->qk_exact(q, nq, k, n, d, scale, s, order);
        return;
    }
    for (int j = 0; j < n; j++)
        for (int i = 0; i < nq; i++)
            s[i][j] = (gemm ? qk_gemm(q[i], k[j], d) : qk_dot(q[i], k[j], d)) * scale;
}

/* Exps 16 at a time, each 16 summed as the tree, the sums added in double (the tail padded with
 * zeros, which change nothing). */
static double softmax_exact(float *s, int n, float max)
{
    __m256 mv = _mm256_set1_ps(max);
    double sum = 0;
    int j = 0;
    for (; j + 16 <= n; j += 16) {
        __m256 lo = exp256(_mm256_sub_ps(_mm256_loadu_ps(s + j), mv));
        __m256 hi = exp256(_mm256_sub_ps(_mm256_loadu_ps(s + j + 8), mv));
        _mm256_storeu_ps(s + j, lo);
        _mm256_storeu_ps(s + j + 8, hi);
        sum += (double)tree16(lo, hi);
    }
    if (j < n) {
        float buf[16];
        for (int i = 0; i < 16; i++)
            buf[i] = j + i < n ? s[j + i] - max : -INFINITY;
        __m256 lo = exp256(_mm256_loadu_ps(buf)), hi = exp256(_mm256_loadu_ps(buf + 8));
        _mm256_storeu_ps(buf, lo);
        _mm256_storeu_ps(buf + 8, hi);
        for (int i = j; i < n; i++)
            s[i] = buf[i - j];
        sum += (double)tree16(lo, hi);
    }
    return sum;
}

static void probs_f16(float *s, int n, float inv)
{
    __m256 iv = _mm256_set1_ps(inv);
    int j = 0;
    for (; j + 8 <= n; j += 8)
        _mm256_storeu_ps(s + j, _mm256_cvtph_ps(_mm256_cvtps_ph(
                                    _mm256_mul_ps(_mm256_loadu_ps(s + j), iv), _MM_FROUND_TO_NEAREST_INT)));
    for (; j < n; j++)
        s[j] = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtps_ph(_mm_set_ss(s[j] * inv), _MM_FROUND_TO_NEAREST_INT)));
}

/* Chain c (positions c, c + step, ...) of up to 3 rows, 32 elements from e0: into acc[i][c]. */
static inline __attribute__((always_inline)) void
pv_chain(int m, const float *const *p, const uint16_t *const *v, int n, int e0, int c, int step,
         float *acc)
{
    __m256 o[3][4];
#pragma GCC unroll 3
    for (int i = 0; i < m; i++)
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++)
            o[i][k] = _mm256_setzero_ps();
    for (int j = c; j < n; j += step) {
        __m256 pj[3];
#pragma GCC unroll 3
        for (int i = 0; i < m; i++)
            pj[i] = _mm256_broadcast_ss(p[i] + j);
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++) {
            __m256 vv = ld_f16(v[j] + e0 + 8 * k);
#pragma GCC unroll 3
            for (int i = 0; i < m; i++)
                o[i][k] = _mm256_fmadd_ps(pj[i], vv, o[i][k]);
        }
    }
#pragma GCC unroll 3
    for (int i = 0; i < m; i++)
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++)
            _mm256_storeu_ps(acc + ((size_t)i * 64 + (size_t)c) * 32 + 8 * k, o[i][k]);
}

static void pv_exact(float *const *out, int nq, const float *const *p, const uint16_t *const *v,
               int n, int d, int order, float *acc)
{
    if (d % 32 != 0 || nq > 3) {
        kern__vops_get_ref()->pv_exact(out, nq, p, v, n, d, order, acc);
        return;
    }
    int step = order == KERN_ORDER_GEMM ? 16 : 64;
    for (int e0 = 0; e0 < d; e0 += 32) {
        for (int c = 0; c < step; c++) {
            if (nq == 3)
                pv_chain(3, p, v, n, e0, c, step, acc);
            else if (nq == 2)
                pv_chain(2, p, v, n, e0, c, step, acc);
            else
                pv_chain(1, p, v, n, e0, c, step, acc);
        }
        for (int i = 0; i < nq; i++) {
            float *a = acc + (size_t)i * 64 * 32;
            for (int k = 0; k < 4; k++) {
                __m256 r[16];
                for (int l = 0; l < 16; l++) {
                    const float *x = a + (size_t)l * 32 + 8 * k;
                    r[l] = step == 16 ? _mm256_loadu_ps(x)
                                      : _mm256_add_ps(_mm256_add_ps(_mm256_loadu_ps(x),
                                                                    _mm256_loadu_ps(x + 32 * 32)),
                                                      _mm256_add_ps(_mm256_loadu_ps(x + 16 * 32),
                                                                    _mm256_loadu_ps(x + 48 * 32)));
                }
                for (int w = 8; w >= 1; w /= 2)
                    for (int l = 0; l < w; l++)
                        r[l] = _mm256_add_ps(r[l], r[l + w]);
                _mm256_storeu_ps(out[i] + e0 + 8 * k, r[0]);
            }
        }
    }
}

/* ---- the default (fast) attention helpers: any summation order (LLMGW_KERNELS=exact uses the
 * ones above) ---------------------------------------------------------------------------------- */

static inline float hsum(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline __m256 exp256_fast(__m256 x)
{
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);   /* ln2 high part */
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428606765330187e-06f), r);       /* ln2 low part */
    __m256 p = _mm256_set1_ps(1.0f / 720);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

static inline float f16(uint16_t h)
{
    return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h)));
}

/* Scores of up to 3 query rows against 4 keys: each f16 key vector is converted once for all
 * rows, and the 12 accumulators are reduced 4 keys at a time with horizontal adds. */
static inline __attribute__((always_inline)) void
qk4p(const float *const *q, int m, const uint16_t *const kp[4], int d, float scale,
     float *const *s, int col)
{
    __m256 acc[3][4];
#pragma GCC unroll 4
    for (int i = 0; i < m; i++)
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++)
            acc[i][c] = _mm256_setzero_ps();
    for (int e = 0; e < d; e += 8) {
        __m256 kv[4];
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++)
            kv[c] = ld_f16(kp[c] + e);
#pragma GCC unroll 4
        for (int i = 0; i < m; i++) {
            __m256 qv = _mm256_loadu_ps(q[i] + e);
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++)
                acc[i][c] = _mm256_fmadd_ps(qv, kv[c], acc[i][c]);
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < m; i++) {
        __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(acc[i][0], acc[i][1]),
                                  _mm256_hadd_ps(acc[i][2], acc[i][3]));
        __m128 r = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
        _mm_storeu_ps(s[i] + col, _mm_mul_ps(r, _mm_set1_ps(scale)));
    }
}

static inline __attribute__((always_inline)) void
qk4(const float *const *q, int m, const uint16_t *k, size_t stride, int d, float scale,
    float *const *s, int col)
{
    const uint16_t *kp[4] = {k, k + stride, k + 2 * stride, k + 3 * stride};
    qk4p(q, m, kp, d, scale, s, col);
}

static inline __attribute__((always_inline)) void
qk4_tail(const float *const *q, int m, const uint16_t *k, size_t stride, int left, int d,
         float scale, float *const *s)
{
    const uint16_t *kp[4];
    for (int c = 0; c < 4; c++)
        kp[c] = k + (size_t)(c < left ? c : left - 1) * stride;
    qk4p(q, m, kp, d, scale, s, 0);
}

static void qk_m(const float *const *q, int m, const uint16_t *k, size_t stride, int n, int d,
                 float scale, float *const *s, int off)
{
    int j = 0;
    for (; j + 4 <= n; j += 4, k += 4 * stride) {
        if (m == 2)
            qk4(q, 2, k, stride, d, scale, s, off + j);
        else
            qk4(q, 1, k, stride, d, scale, s, off + j);
    }
    if (j < n) {
        /* The last 1-3 keys through the same 4-key code (the last key repeated, its extra
         * scores dropped), so a key's score never depends on where the block ends. */
        float buf[2][4];
        float *sb[2] = {buf[0], buf[1]};
        int left = n - j;
        if (m == 2)
            qk4_tail(q, 2, k, stride, left, d, scale, sb);
        else
            qk4_tail(q, 1, k, stride, left, d, scale, sb);
        for (int i = 0; i < m; i++)
            for (int c = 0; c < left; c++)
                s[i][off + j + c] = buf[i][c];
    }
}

static void qk(const float *const *q, int nq, const uint16_t *k, size_t stride, int n, int d,
               float scale, float *const *s, int off)
{
    if (d % 8 != 0) {
        for (int j = 0; j < n; j++, k += stride)
            for (int i = 0; i < nq; i++) {
                float acc = 0;
                for (int e = 0; e < d; e++)
                    acc += q[i][e] * f16(k[e]);
                s[i][off + j] = acc * scale;
            }
        return;
    }
    for (int i = 0; i < nq; i += 2)
        qk_m(q + i, nq - i < 2 ? nq - i : 2, k, stride, n, d, scale, s + i, off);
}

static float softmax_exp(float *s, int n, float max)
{
    __m256 mv = _mm256_set1_ps(max), sum = _mm256_setzero_ps();
    int j = 0;
    for (; j + 8 <= n; j += 8) {
        __m256 e = exp256_fast(_mm256_sub_ps(_mm256_loadu_ps(s + j), mv));
        _mm256_storeu_ps(s + j, e);
        sum = _mm256_add_ps(sum, e);
    }
    float t = hsum(sum);
    if (j < n) {
        float buf[8] = {0};
        for (int i = j; i < n; i++)
            buf[i - j] = s[i] - max;
        __m256 e = exp256_fast(_mm256_loadu_ps(buf));
        _mm256_storeu_ps(buf, e);
        for (int i = j; i < n; i++) {
            s[i] = buf[i - j];
            t += s[i];
        }
    }
    return t;
}

/* Up to 3 output rows, 32 of their elements at a time in registers: each f16 value vector is
 * converted once for all rows. */
static inline __attribute__((always_inline)) void
pv32(float *const *out, int m, const float *const *p, int off, const uint16_t *v, size_t stride,
     int n, int e0)
{
    __m256 o[3][4];
#pragma GCC unroll 4
    for (int i = 0; i < m; i++)
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++)
            o[i][c] = _mm256_loadu_ps(out[i] + e0 + 8 * c);
    for (int j = 0; j < n; j++, v += stride) {
        __m256 pj[3];
#pragma GCC unroll 4
        for (int i = 0; i < m; i++)
            pj[i] = _mm256_broadcast_ss(p[i] + off + j);
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) {
            __m256 vv = ld_f16(v + e0 + 8 * c);
#pragma GCC unroll 4
            for (int i = 0; i < m; i++)
                o[i][c] = _mm256_fmadd_ps(pj[i], vv, o[i][c]);
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < m; i++)
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++)
            _mm256_storeu_ps(out[i] + e0 + 8 * c, o[i][c]);
}

static void pv(float *const *out, int nq, const float *const *p, int off, const uint16_t *v,
               size_t stride, int n, int d)
{
    if (d % 32 != 0) {
        for (int j = 0; j < n; j++, v += stride)
            for (int i = 0; i < nq; i++) {
                float pj = p[i][off + j];
                int e = 0;
                for (; d % 8 == 0 && e < d; e += 8)
                    _mm256_storeu_ps(out[i] + e, _mm256_fmadd_ps(_mm256_set1_ps(pj), ld_f16(v + e),
                                                                 _mm256_loadu_ps(out[i] + e)));
                for (; e < d; e++)
                    out[i][e] += pj * f16(v[e]);
            }
        return;
    }
    for (int i = 0; i < nq; i += 3) {
        int m = nq - i < 3 ? nq - i : 3;
        for (int e0 = 0; e0 < d; e0 += 32) {
            if (m == 3)
                pv32(out + i, 3, p + i, off, v, stride, n, e0);
            else if (m == 2)
                pv32(out + i, 2, p + i, off, v, stride, n, e0);
            else
                pv32(out + i, 1, p + i, off, v, stride, n, e0);
        }
    }
}

/* KERN_KV_Q8: 8 int8 values as f32. */
static inline __m256 ld_i8(const int8_t *p)
{
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}

/* As qk4p, for int8 keys: each key's 8 values converted (and, with several groups a head,
 * multiplied by their group's scale) once for all rows; with one scale a head, the scale
 * multiplies the four scores instead. */
static inline __attribute__((always_inline)) void
qk4p_q8(const float *const *q, int m, const uint8_t *const kp[4], int d, int group, float scale,
        float *const *s, int col)
{
    __m256 acc[3][4];
#pragma GCC unroll 4
    for (int i = 0; i < m; i++)
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++)
            acc[i][c] = _mm256_setzero_ps();
    if (group == d) {
        for (int e = 0; e < d; e += 8) {
            __m256 kv[4];
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++)
                kv[c] = ld_i8((const int8_t *)kp[c] + e);
#pragma GCC unroll 4
            for (int i = 0; i < m; i++) {
                __m256 qv = _mm256_loadu_ps(q[i] + e);
#pragma GCC unroll 4
                for (int c = 0; c < 4; c++)
                    acc[i][c] = _mm256_fmadd_ps(qv, kv[c], acc[i][c]);
            }
        }
        __m128 ks = _mm_setr_ps(f16(*(const uint16_t *)(kp[0] + d)),
                                f16(*(const uint16_t *)(kp[1] + d)),
                                f16(*(const uint16_t *)(kp[2] + d)),
                                f16(*(const uint16_t *)(kp[3] + d)));
        ks = _mm_mul_ps(ks, _mm_set1_ps(scale));
#pragma GCC unroll 4
        for (int i = 0; i < m; i++) {
            __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(acc[i][0], acc[i][1]),
                                      _mm256_hadd_ps(acc[i][2], acc[i][3]));
            __m128 r = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
            _mm_storeu_ps(s[i] + col, _mm_mul_ps(r, ks));
        }
        return;
    }
    for (int g0 = 0; g0 < d; g0 += group) {
        __m256 sc[4];
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++)
            sc[c] = _mm256_set1_ps(f16(((const uint16_t *)(kp[c] + d))[g0 / group]));
        for (int e = g0; e < g0 + group; e += 8) {
            __m256 kv[4];
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++)
                kv[c] = _mm256_mul_ps(ld_i8((const int8_t *)kp[c] + e), sc[c]);
#pragma GCC unroll 4
            for (int i = 0; i < m; i++) {
                __m256 qv = _mm256_loadu_ps(q[i] + e);
#pragma GCC unroll 4
                for (int c = 0; c < 4; c++)
                    acc[i][c] = _mm256_fmadd_ps(qv, kv[c], acc[i][c]);
            }
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < m; i++) {
        __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(acc[i][0], acc[i][1]),
                                  _mm256_hadd_ps(acc[i][2], acc[i][3]));
        __m128 r = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
        _mm_storeu_ps(s[i] + col, _mm_mul_ps(r, _mm_set1_ps(scale)));
    }
}

static void qk_q8_m(const float *const *q, int m, const uint8_t *k, size_t stride, int n, int d,
                    int group, float scale, float *const *s, int off)
{
    int j = 0;
    for (; j + 4 <= n; j += 4, k += 4 * stride) {
        const uint8_t *kp[4] = {k, k + stride, k + 2 * stride, k + 3 * stride};
        if (m == 2)
            qk4p_q8(q, 2, kp, d, group, scale, s, off + j);
        else
            qk4p_q8(q, 1, kp, d, group, scale, s, off + j);
    }
    if (j < n) {   /* the last 1-3 keys as in qk_m: the last key repeated */
        float buf[2][4];
        float *sb[2] = {buf[0], buf[1]};
        int left = n - j;
        const uint8_t *kp[4];
        for (int c = 0; c < 4; c++)
            kp[c] = k + (size_t)(c < left ? c : left - 1) * stride;
        if (m == 2)
            qk4p_q8(q, 2, kp, d, group, scale, sb, 0);
        else
            qk4p_q8(q, 1, kp, d, group, scale, sb, 0);
        for (int i = 0; i < m; i++)
            for (int c = 0; c < left; c++)
                s[i][off + j + c] = buf[i][c];
    }
}

static void qk_q8(const float *const *q, int nq, const uint8_t *k, size_t stride, int n, int d,
                  int group, float scale, float *const *s, int off)
{
    if (group % 8 != 0 || d % group != 0) {
        kern__vops_get_ref()->qk_q8(q, nq, k, stride, n, d, group, scale, s, off);
        return;
    }
    for (int i = 0; i < nq; i += 2)
        qk_q8_m(q + i, nq - i < 2 ? nq - i : 2, k, stride, n, d, group, scale, s + i, off);
}

/* As pv32, for int8 values: each probability times its row's scale, each value vector
 * converted once for all rows. */
static inline __attribute__((always_inline)) void
pv32_q8(float *const *out, int m, const float *const *p, int off, const uint8_t *v,
        size_t stride, int n, int d, int e0)
{
    __m256 o[3][4];
#pragma GCC unroll 4
    for (int i = 0; i < m; i++)
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++)
            o[i][c] = _mm256_loadu_ps(out[i] + e0 + 8 * c);
    for (int j = 0; j < n; j++, v += stride) {
        float sc = f16(*(const uint16_t *)(v + d));
        __m256 pj[3];
#pragma GCC unroll 4
        for (int i = 0; i < m; i++)
            pj[i] = _mm256_set1_ps(p[i][off + j] * sc);
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) {
            __m256 vv = ld_i8((const int8_t *)v + e0 + 8 * c);
#pragma GCC unroll 4
            for (int i = 0; i < m; i++)
                o[i][c] = _mm256_fmadd_ps(pj[i], vv, o[i][c]);
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < m; i++)
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++)
            _mm256_storeu_ps(out[i] + e0 + 8 * c, o[i][c]);
}

static void pv_q8(float *const *out, int nq, const float *const *p, int off, const uint8_t *v,
                  size_t stride, int n, int d)
{
    if (d % 32 != 0) {
        kern__vops_get_ref()->pv_q8(out, nq, p, off, v, stride, n, d);
        return;
    }
    for (int i = 0; i < nq; i += 3) {
        int m = nq - i < 3 ? nq - i : 3;
        for (int e0 = 0; e0 < d; e0 += 32) {
            if (m == 3)
                pv32_q8(out + i, 3, p + i, off, v, stride, n, d, e0);
            else if (m == 2)
                pv32_q8(out + i, 2, p + i, off, v, stride, n, d, e0);
            else
                pv32_q8(out + i, 1, p + i, off, v, stride, n, d, e0);
        }
    }
}

/* The Walsh-Hadamard butterflies as hadamard_ref does them: pairs 1, 2 and 4 apart inside a
 * vector (x +- its permuted self: t + v on the lower lane of a pair, t - v on the upper, as one
 * exact fma with +-1), 8 and more apart between vectors. */
static void hadamard(float *x, int d)
{
    if (d % 8 != 0) {
        kern__vops_get_ref()->hadamard(x, d);
        return;
    }
    const __m256 s1 = _mm256_setr_ps(1, -1, 1, -1, 1, -1, 1, -1);
    const __m256 s2 = _mm256_setr_ps(1, 1, -1, -1, 1, 1, -1, -1);
    const __m256 s4 = _mm256_setr_ps(1, 1, 1, 1, -1, -1, -1, -1);
    for (int i = 0; i < d; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        v = _mm256_fmadd_ps(v, s1, _mm256_permute_ps(v, 0xb1));
        v = _mm256_fmadd_ps(v, s2, _mm256_permute_ps(v, 0x4e));
        v = _mm256_fmadd_ps(v, s4, _mm256_permute2f128_ps(v, v, 1));
        _mm256_storeu_ps(x + i, v);
    }
    for (int len = 8; len < d; len <<= 1)
        for (int i = 0; i < d; i += 2 * len)
            for (int j = i; j < i + len; j += 8) {
                __m256 a = _mm256_loadu_ps(x + j), b = _mm256_loadu_ps(x + j + len);
                _mm256_storeu_ps(x + j, _mm256_add_ps(a, b));
                _mm256_storeu_ps(x + j + len, _mm256_sub_ps(a, b));
            }
    __m256 sc = _mm256_set1_ps(1.0f / sqrtf((float)d));
    for (int i = 0; i < d; i += 8)
        _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), sc));
}

void kern__vops_install_avx2(kern_vops *v)
{
    v->sumsq = sumsq;
    v->scale_mul = scale_mul;
    v->swiglu = swiglu;
    v->add = add;
    v->qk = qk;
    v->softmax_exp = softmax_exp;
    v->pv = pv;
    v->qk_q8 = qk_q8;
    v->pv_q8 = pv_q8;
    v->hadamard = hadamard;
    v->qk_exact = qk_exact;
    v->softmax_exact = softmax_exact;
    v->probs_f16 = probs_f16;
    v->pv_exact = pv_exact;
}
