/* kernels/cpu/ops_avx2.c: AVX2 + FMA + F16C twins of the vector helpers in ops.c (RMSNorm,
 * SwiGLU, adds, and the attention inner loops over f16 K/V rows). exp() is a polynomial: e^x =
 * 2^n * e^r with n = round(x / ln 2) and |r| <= ln2 / 2, Taylor to r^6 (relative error < 2e-7),
 * inputs clamped to [-87, 88] so 2^n stays a normal float. */
#include "kernels/cpu/internal.h"

#include <immintrin.h>

static inline float hsum(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline __m256 exp256(__m256 x)
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

static float sumsq(const float *x, int64_t n)
{
    __m256 a0 = _mm256_setzero_ps(), a1 = a0;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256 v0 = _mm256_loadu_ps(x + i), v1 = _mm256_loadu_ps(x + i + 8);
        a0 = _mm256_fmadd_ps(v0, v0, a0);
        a1 = _mm256_fmadd_ps(v1, v1, a1);
    }
    float s = hsum(_mm256_add_ps(a0, a1));
    for (; i < n; i++)
        s += x[i] * x[i];
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
    const __m256 one = _mm256_set1_ps(1.0f), neg = _mm256_set1_ps(-0.0f);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 gv = _mm256_loadu_ps(g + i);
        __m256 e = exp256(_mm256_xor_ps(gv, neg));
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
        __m256 silu = _mm256_div_ps(gg, _mm256_add_ps(one, exp256(_mm256_xor_ps(gg, neg))));
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
        __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(s + j), mv));
        _mm256_storeu_ps(s + j, e);
        sum = _mm256_add_ps(sum, e);
    }
    float t = hsum(sum);
    if (j < n) {
        float buf[8] = {0};
        for (int i = j; i < n; i++)
            buf[i - j] = s[i] - max;
        __m256 e = exp256(_mm256_loadu_ps(buf));
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

void kern__vops_install_avx2(kern_vops *v)
{
    v->sumsq = sumsq;
    v->scale_mul = scale_mul;
    v->swiglu = swiglu;
    v->add = add;
    v->qk = qk;
    v->softmax_exp = softmax_exp;
    v->pv = pv;
}
