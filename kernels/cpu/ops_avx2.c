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

static void qk(const float *q, const uint16_t *k, size_t stride, int n, int d, float scale,
               float *s)
{
    if (d % 8 != 0) {
        for (int j = 0; j < n; j++, k += stride) {
            float acc = 0;
            for (int e = 0; e < d; e++)
                acc += q[e] * f16(k[e]);
            s[j] = acc * scale;
        }
        return;
    }
    int j = 0;
    /* Two keys at a time: two independent FMA chains. */
    for (; j + 2 <= n; j += 2, k += 2 * stride) {
        __m256 a0 = _mm256_setzero_ps(), a1 = a0;
        for (int e = 0; e < d; e += 8) {
            __m256 qv = _mm256_loadu_ps(q + e);
            a0 = _mm256_fmadd_ps(qv, ld_f16(k + e), a0);
            a1 = _mm256_fmadd_ps(qv, ld_f16(k + stride + e), a1);
        }
        s[j] = hsum(a0) * scale;
        s[j + 1] = hsum(a1) * scale;
    }
    for (; j < n; j++, k += stride) {
        __m256 a0 = _mm256_setzero_ps();
        for (int e = 0; e < d; e += 8)
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + e), ld_f16(k + e), a0);
        s[j] = hsum(a0) * scale;
    }
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

static void pv(float *out, const float *p, const uint16_t *v, size_t stride, int n, int d)
{
    if (d % 8 != 0 || d > 256) {
        for (int j = 0; j < n; j++, v += stride)
            for (int e = 0; e < d; e++)
                out[e] += p[j] * f16(v[e]);
        return;
    }
    /* The output row lives in registers for d <= 64 (the common head size); otherwise in
     * memory, 8 floats at a time. */
    if (d == 64) {
        __m256 o0 = _mm256_loadu_ps(out), o1 = _mm256_loadu_ps(out + 8),
               o2 = _mm256_loadu_ps(out + 16), o3 = _mm256_loadu_ps(out + 24),
               o4 = _mm256_loadu_ps(out + 32), o5 = _mm256_loadu_ps(out + 40),
               o6 = _mm256_loadu_ps(out + 48), o7 = _mm256_loadu_ps(out + 56);
        for (int j = 0; j < n; j++, v += stride) {
            __m256 pj = _mm256_set1_ps(p[j]);
            o0 = _mm256_fmadd_ps(pj, ld_f16(v), o0);
            o1 = _mm256_fmadd_ps(pj, ld_f16(v + 8), o1);
            o2 = _mm256_fmadd_ps(pj, ld_f16(v + 16), o2);
            o3 = _mm256_fmadd_ps(pj, ld_f16(v + 24), o3);
            o4 = _mm256_fmadd_ps(pj, ld_f16(v + 32), o4);
            o5 = _mm256_fmadd_ps(pj, ld_f16(v + 40), o5);
            o6 = _mm256_fmadd_ps(pj, ld_f16(v + 48), o6);
            o7 = _mm256_fmadd_ps(pj, ld_f16(v + 56), o7);
        }
        _mm256_storeu_ps(out, o0);
        _mm256_storeu_ps(out + 8, o1);
        _mm256_storeu_ps(out + 16, o2);
        _mm256_storeu_ps(out + 24, o3);
        _mm256_storeu_ps(out + 32, o4);
        _mm256_storeu_ps(out + 40, o5);
        _mm256_storeu_ps(out + 48, o6);
        _mm256_storeu_ps(out + 56, o7);
        return;
    }
    for (int j = 0; j < n; j++, v += stride) {
        __m256 pj = _mm256_set1_ps(p[j]);
        for (int e = 0; e < d; e += 8)
            _mm256_storeu_ps(out + e, _mm256_fmadd_ps(pj, ld_f16(v + e), _mm256_loadu_ps(out + e)));
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
