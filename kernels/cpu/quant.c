/* kernels/cpu/quant.c: the scalar references of every weight type (the definition of correct),
 * f16 rows, and the choice of SIMD twins (quant_avx2.c, quant_avx512.c) at first use.
 * The references favour plainness over speed; LLMGW_KERNELS=ref runs the whole engine on them. */
#include "kernels/cpu/internal.h"

#include "kernels/cpu/features.h"

#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* ---- f16 / bf16 ------------------------------------------------------------------------------ */

void kern__f32_to_f16_row(const float *x, uint16_t *y, int64_t n)
{
#if defined(LLMGW_KERNELS_X86)
    if (kern_cpu_features_get()->f16c) {
        kern__f32_to_f16_row_avx2(x, y, n);
        return;
    }
#endif
    for (int64_t i = 0; i < n; i++)
        y[i] = kern_f32_to_f16(x[i]);
}

void kern__f16_to_f32_row(const uint16_t *x, float *y, int64_t n)
{
#if defined(LLMGW_KERNELS_X86)
    if (kern_cpu_features_get()->f16c) {
        kern__f16_to_f32_row_avx2(x, y, n);
        return;
    }
#endif
    for (int64_t i = 0; i < n; i++)
        y[i] = kern_f16_to_f32(x[i]);
}

void kern__f16_round_row(const float *x, float *y, int64_t n)
{
    uint16_t tmp[64];
    for (int64_t i = 0; i < n; i += 64) {
        int64_t m = n - i < 64 ? n - i : 64;
        kern__f32_to_f16_row(x + i, tmp, m);
        kern__f16_to_f32_row(tmp, y + i, m);
    }
}

/* ---- activation formats ---------------------------------------------------------------------- */

static size_t act_bytes_f32(int64_t n) { return (size_t)n * sizeof(float); }
static size_t act_bytes_q8_32(int64_t n) { return (size_t)(n / 32) * sizeof(kern_q8_32); }
static size_t act_bytes_q8_k(int64_t n) { return (size_t)(n / 256) * sizeof(kern_q8_k); }

static void quantize_f32_ref(const float *x, void *act, int64_t n)
{
    memcpy(act, x, (size_t)n * sizeof(float));
}

/* F16 and BF16 weights meet activations rounded to their own type, as in llama.cpp (its
 * vec_dot_type for them); the rounded values stay f32 so the dot kernels are unchanged. */
void kern__quantize_f16_round(const float *x, void *act, int64_t n)
{
    float *y = act;
    for (int64_t i = 0; i < n; i++)
        y[i] = kern_f16_to_f32(kern_f32_to_f16(x[i]));
}

void kern__quantize_bf16_round(const float *x, void *act, int64_t n)
{
    float *y = act;
    for (int64_t i = 0; i < n; i++)
        y[i] = kern_bf16_to_f32(kern_f32_to_bf16(x[i]));
}

/* As llama.cpp's x86 activation quantizers (quantize_row_q8_0 / _q8_1): d = max|x| / 127,
 * q = round-to-nearest-even(x * (127 / max|x|)) (not x * (1/d): the two differ at rounding
 * boundaries), d kept in f16. The SIMD twins compute exactly this. q8_1 (Q4_1's activations)
 * differs only in s, see below. */
static float quantize_q8_block(const float *x, kern_q8_32 *b, int *sum)
{
    float amax = 0;
    for (int j = 0; j < 32; j++)
        amax = fmaxf(amax, fabsf(x[j]));
    float d = amax / 127.0f, id = amax != 0 ? 127.0f / amax : 0.0f;
    *sum = 0;
    for (int j = 0; j < 32; j++) {
        int q = (int)nearbyintf(x[j] * id);
        b->qs[j] = (int8_t)q;
        *sum += q;
    }
    b->d = kern_f16_to_f32(kern_f32_to_f16(d));
    return d;
}

/* q8_0: s = d * sum exact for the f16 scale (the Q4_0 kernels use it for the -8 offset, which
 * llama.cpp applies exactly, in integers). */
static void quantize_q8_32_ref(const float *x, void *act, int64_t n)
{
    kern_q8_32 *b = act;
    for (int64_t i = 0; i < n / 32; i++, x += 32) {
        int sum;
        quantize_q8_block(x, &b[i], &sum);
        b[i].s = b[i].d * (float)sum;
    }
}

/* q8_1 (block_q8_1 of llama.cpp): s is the f32 (not the f16) scale times the sum, itself
 * rounded to f16; Q4_1's min term m * s uses it. */
void kern__quantize_q8_1_ref(const float *x, void *act, int64_t n)
{
    kern_q8_32 *b = act;
    for (int64_t i = 0; i < n / 32; i++, x += 32) {
        int sum;
        float d = quantize_q8_block(x, &b[i], &sum);
        b[i].s = kern_f16_to_f32(kern_f32_to_f16(d * (float)sum));
    }
}

static void quantize_q8_k_ref(const float *x, void *act, int64_t n)
{
    kern_q8_k *b = act;
    for (int64_t i = 0; i < n / 256; i++, x += 256) {
        float amax = 0;
        for (int j = 0; j < 256; j++)
            amax = fmaxf(amax, fabsf(x[j]));
        float d = amax / 127.0f, id = d != 0 ? 1.0f / d : 0.0f;
        for (int j = 0; j < 256; j++)
            b[i].qs[j] = (int8_t)nearbyintf(x[j] * id);
        for (int g = 0; g < 16; g++) {
            int s = 0;
            for (int j = 0; j < 16; j++)
                s += b[i].qs[16 * g + j];
            b[i].bsums[g] = (int16_t)s;
        }
        b[i].d = d;
    }
}

/* ---- F32 / F16 / BF16 ------------------------------------------------------------------------ */

static void dot_f32_ref(int64_t n, const void *w, const void *a, float *out)
{
    const float *x = w, *y = a;
    double s = 0;
    for (int64_t i = 0; i < n; i++)
        s += (double)x[i] * y[i];
    *out = (float)s;
}

static void dot_f16_ref(int64_t n, const void *w, const void *a, float *out)
{
    const uint16_t *x = w;
    const float *y = a;
    double s = 0;
    for (int64_t i = 0; i < n; i++)
        s += (double)kern_f16_to_f32(x[i]) * y[i];
    *out = (float)s;
}

static void dot_bf16_ref(int64_t n, const void *w, const void *a, float *out)
{
    const uint16_t *x = w;
    const float *y = a;
    double s = 0;
    for (int64_t i = 0; i < n; i++)
        s += (double)kern_bf16_to_f32(x[i]) * y[i];
    *out = (float)s;
}

static void to_f32_f32(const void *w, float *out, int64_t n) { memcpy(out, w, (size_t)n * 4); }
static void from_f32_f32(const float *x, void *w, int64_t n) { memcpy(w, x, (size_t)n * 4); }

static void to_f32_f16_ref(const void *w, float *out, int64_t n)
{
    const uint16_t *x = w;
    for (int64_t i = 0; i < n; i++)
        out[i] = kern_f16_to_f32(x[i]);
}

static void from_f32_f16_ref(const float *x, void *w, int64_t n)
{
    uint16_t *y = w;
    for (int64_t i = 0; i < n; i++)
        y[i] = kern_f32_to_f16(x[i]);
}

static void to_f32_bf16_ref(const void *w, float *out, int64_t n)
{
    const uint16_t *x = w;
    for (int64_t i = 0; i < n; i++)
        out[i] = kern_bf16_to_f32(x[i]);
}

static void from_f32_bf16_ref(const float *x, void *w, int64_t n)
{
    uint16_t *y = w;
    for (int64_t i = 0; i < n; i++)
        y[i] = kern_f32_to_bf16(x[i]);
}

/* ---- Q4_0 / Q4_1 / Q8_0 ---------------------------------------------------------------------- */

static inline int nib(const uint8_t *qs, int j)
{
    return j < 16 ? qs[j] & 0xf : qs[j - 16] >> 4;
}

static void dot_q4_0_ref(int64_t n, const void *w, const void *a, float *out)
{
    const kern_blk_q4_0 *x = w;
    const kern_q8_32 *y = a;
    float s = 0;
    for (int64_t i = 0; i < n / 32; i++) {
        int sum = 0;
        for (int j = 0; j < 32; j++)
            sum += (nib(x[i].qs, j) - 8) * y[i].qs[j];
        s += kern_f16_to_f32(x[i].d) * y[i].d * (float)sum;
    }
    *out = s;
}

static void to_f32_q4_0_ref(const void *w, float *out, int64_t n)
{
    const kern_blk_q4_0 *x = w;
    for (int64_t i = 0; i < n / 32; i++) {
        float d = kern_f16_to_f32(x[i].d);
        for (int j = 0; j < 32; j++)
            out[32 * i + j] = (float)(nib(x[i].qs, j) - 8) * d;
    }
}

static void put_nib(uint8_t *qs, int j, int q)
{
    if (j < 16)
        qs[j] = (uint8_t)((qs[j] & 0xf0) | q);
    else
        qs[j - 16] = (uint8_t)((qs[j - 16] & 0x0f) | (q << 4));
}

/* The value of largest magnitude maps to -8, so the full range -8..7 is used. */
static void from_f32_q4_0_ref(const float *x, void *w, int64_t n)
{
    kern_blk_q4_0 *y = w;
    for (int64_t i = 0; i < n / 32; i++, x += 32) {
        float amax = 0, vmax = 0;
        for (int j = 0; j < 32; j++)
            if (fabsf(x[j]) > amax) {
                amax = fabsf(x[j]);
                vmax = x[j];
            }
        float d = vmax / -8.0f, id = d != 0 ? 1.0f / d : 0.0f;
        y[i].d = kern_f32_to_f16(d);
        for (int j = 0; j < 32; j++) {
            int q = (int)nearbyintf(x[j] * id) + 8;
            put_nib(y[i].qs, j, q < 0 ? 0 : q > 15 ? 15 : q);
        }
    }
}

/* llama.cpp's x86 Q4_1 dot (ggml_vec_dot_q4_1_q8_1), operation for operation: lane l < 8 sums
 * elements 4l..4l+3 of each block in integers and accumulates d_w * d_a times it with an FMA;
 * the min terms m * s accumulate in their own FMA chain; the lanes are added as (l, l + 4),
 * then (0, 2) and (1, 3), then the two, and the min terms last. */
static void dot_q4_1_ref(int64_t n, const void *w, const void *a, float *out)
{
    const kern_blk_q4_1 *x = w;
    const kern_q8_32 *y = a;
    float acc[8] = {0}, summs = 0;
    for (int64_t i = 0; i < n / 32; i++) {
        float d = kern_f16_to_f32(x[i].d) * y[i].d;
        summs = fmaf(kern_f16_to_f32(x[i].m), y[i].s, summs);
        for (int l = 0; l < 8; l++) {
            int sum = 0;
            for (int j = 4 * l; j < 4 * l + 4; j++)
                sum += nib(x[i].qs, j) * y[i].qs[j];
            acc[l] = fmaf(d, (float)sum, acc[l]);
        }
    }
    float t[4];
    for (int l = 0; l < 4; l++)
        t[l] = acc[l + 4] + acc[l];
    *out = ((t[0] + t[2]) + (t[1] + t[3])) + summs;
}

void kern__repack_q4_1x8(const void *w, size_t ws, int64_t rows, int64_t n, void *out)
{
    int64_t nb = n / 32;
    for (int64_t g = 0; g < (rows + 7) / 8; g++) {
        kern_blk_q4_1x8 *o = (kern_blk_q4_1x8 *)out + (size_t)g * (size_t)nb;
        memset(o, 0, (size_t)nb * sizeof *o);
        for (int j = 0; j < 8 && 8 * g + j < rows; j++) {
            const kern_blk_q4_1 *x = (const kern_blk_q4_1 *)((const uint8_t *)w +
                                                           (size_t)(8 * g + j) * ws);
            for (int64_t b = 0; b < nb; b++) {
                o[b].d[j] = x[b].d;
                o[b].m[j] = x[b].m;
                for (int v = 0; v < 4; v++)
                    memcpy(&o[b].qs[32 * v + 4 * j], &x[b].qs[4 * v], 4);
            }
        }
    }
}

/* Row j of a KERN_LAYOUT_X8 block, element e (the layout above). */
static int x8_elem(const kern_blk_q4_1x8 *b, int j, int e)
{
    int k = e % 16;
    uint8_t q = b->qs[32 * (k / 4) + 4 * j + k % 4];
    return e < 16 ? q & 15 : q >> 4;
}

static void x8_q4_1_ref(int64_t n, const void *w, int nr, const void *act, size_t as, int nt,
                        float *y, int64_t ldy)
{
    const kern_blk_q4_1x8 *x = w;
    int64_t nb = n / 32;
    for (int t = 0; t < nt; t++) {
        const kern_q8_32 *a = (const kern_q8_32 *)((const uint8_t *)act + (size_t)t * as);
        for (int r = 0; r < nr; r++) {
            const kern_blk_q4_1x8 *g = x + (size_t)(r / 8) * (size_t)nb;
            float s = 0;
            for (int64_t b = 0; b < nb; b++) {
                int sum = 0;
                for (int e = 0; e < 32; e++)
                    sum += x8_elem(&g[b], r % 8, e) * a[b].qs[e];
                s += kern_f16_to_f32(g[b].d[r % 8]) * a[b].d * (float)sum +
                     kern_f16_to_f32(g[b].m[r % 8]) * a[b].s;
            }
            y[(size_t)t * (size_t)ldy + r] = s;
        }
    }
}

static void to_f32_q4_1_ref(const void *w, float *out, int64_t n)
{
    const kern_blk_q4_1 *x = w;
    for (int64_t i = 0; i < n / 32; i++) {
        float d = kern_f16_to_f32(x[i].d), m = kern_f16_to_f32(x[i].m);
        for (int j = 0; j < 32; j++)
            out[32 * i + j] = (float)nib(x[i].qs, j) * d + m;
    }
}

static void from_f32_q4_1_ref(const float *x, void *w, int64_t n)
{
    kern_blk_q4_1 *y = w;
    for (int64_t i = 0; i < n / 32; i++, x += 32) {
        float lo = x[0], hi = x[0];
        for (int j = 1; j < 32; j++) {
            lo = fminf(lo, x[j]);
            hi = fmaxf(hi, x[j]);
        }
        float d = (hi - lo) / 15.0f, id = d != 0 ? 1.0f / d : 0.0f;
        y[i].d = kern_f32_to_f16(d);
        y[i].m = kern_f32_to_f16(lo);
        for (int j = 0; j < 32; j++) {
            int q = (int)nearbyintf((x[j] - lo) * id);
            put_nib(y[i].qs, j, q < 0 ? 0 : q > 15 ? 15 : q);
        }
    }
}

static void dot_q8_0_ref(int64_t n, const void *w, const void *a, float *out)
{
    const kern_blk_q8_0 *x = w;
    const kern_q8_32 *y = a;
    float s = 0;
    for (int64_t i = 0; i < n / 32; i++) {
        int sum = 0;
        for (int j = 0; j < 32; j++)
            sum += x[i].qs[j] * y[i].qs[j];
        s += kern_f16_to_f32(x[i].d) * y[i].d * (float)sum;
    }
    *out = s;
}

static void to_f32_q8_0_ref(const void *w, float *out, int64_t n)
{
    const kern_blk_q8_0 *x = w;
    for (int64_t i = 0; i < n / 32; i++) {
        float d = kern_f16_to_f32(x[i].d);
        for (int j = 0; j < 32; j++)
            out[32 * i + j] = (float)x[i].qs[j] * d;
    }
}

static void from_f32_q8_0_ref(const float *x, void *w, int64_t n)
{
    kern_blk_q8_0 *y = w;
    for (int64_t i = 0; i < n / 32; i++, x += 32) {
        float amax = 0;
        for (int j = 0; j < 32; j++)
            amax = fmaxf(amax, fabsf(x[j]));
        float d = amax / 127.0f, id = d != 0 ? 1.0f / d : 0.0f;
        y[i].d = kern_f32_to_f16(d);
        for (int j = 0; j < 32; j++)
            y[i].qs[j] = (int8_t)nearbyintf(x[j] * id);
    }
}

/* ---- Q4_K ------------------------------------------------------------------------------------ */

static void q4_k_scale_min(const uint8_t *s, int j, int *sc, int *m)
{
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0xf) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

static int q4_k_elem(const kern_blk_q4_k *b, int e)
{
    int c = e / 64, l = e % 64;
    return l < 32 ? b->qs[32 * c + l] & 0xf : b->qs[32 * c + l - 32] >> 4;
}

static void dot_q4_k_ref(int64_t n, const void *w, const void *a, float *out)
{
    const kern_blk_q4_k *x = w;
    const kern_q8_k *y = a;
    float s = 0;
    for (int64_t i = 0; i < n / 256; i++) {
        int sum_q = 0, sum_m = 0;
        for (int j = 0; j < 8; j++) {
            int sc, m, dot = 0, xs = 0;
            q4_k_scale_min(x[i].scales, j, &sc, &m);
            for (int l = 0; l < 32; l++) {
                dot += q4_k_elem(&x[i], 32 * j + l) * y[i].qs[32 * j + l];
                xs += y[i].qs[32 * j + l];
            }
            sum_q += sc * dot;
            sum_m += m * xs;
        }
        s += y[i].d * (kern_f16_to_f32(x[i].d) * (float)sum_q -
                       kern_f16_to_f32(x[i].dmin) * (float)sum_m);
    }
    *out = s;
}

static void to_f32_q4_k_ref(const void *w, float *out, int64_t n)
{
    const kern_blk_q4_k *x = w;
    for (int64_t i = 0; i < n / 256; i++) {
        float d = kern_f16_to_f32(x[i].d), dmin = kern_f16_to_f32(x[i].dmin);
        for (int j = 0; j < 8; j++) {
            int sc, m;
            q4_k_scale_min(x[i].scales, j, &sc, &m);
            for (int l = 0; l < 32; l++)
                out[256 * i + 32 * j + l] =
                    d * (float)sc * (float)q4_k_elem(&x[i], 32 * j + l) - dmin * (float)m;
        }
    }
}

/* A simple quantizer (for tests and tools): per sub-block, min clamped to <= 0 and a scale that
 * spans the range; then the 8 scales and 8 mins are themselves quantized to 6 bits. */
static void from_f32_q4_k_ref(const float *x, void *w, int64_t n)
{
    kern_blk_q4_k *y = w;
    for (int64_t i = 0; i < n / 256; i++, x += 256) {
        float scale[8], mn[8], smax = 0, mmax = 0;
        for (int j = 0; j < 8; j++) {
            float lo = 0, hi = x[32 * j];
            for (int l = 0; l < 32; l++) {
                lo = fminf(lo, x[32 * j + l]);
                hi = fmaxf(hi, x[32 * j + l]);
            }
            scale[j] = (hi - lo) / 15.0f;
            mn[j] = -lo;
            smax = fmaxf(smax, scale[j]);
            mmax = fmaxf(mmax, mn[j]);
        }
        float d = smax / 63.0f, dmin = mmax / 63.0f;
        y[i].d = kern_f32_to_f16(d);
        y[i].dmin = kern_f32_to_f16(dmin);
        d = kern_f16_to_f32(y[i].d);
        dmin = kern_f16_to_f32(y[i].dmin);
        int sc[8], m[8];
        for (int j = 0; j < 8; j++) {
            sc[j] = d != 0 ? (int)nearbyintf(scale[j] / d) : 0;
            m[j] = dmin != 0 ? (int)nearbyintf(mn[j] / dmin) : 0;
            sc[j] = sc[j] > 63 ? 63 : sc[j];
            m[j] = m[j] > 63 ? 63 : m[j];
        }
        for (int j = 0; j < 4; j++) {
            y[i].scales[j] = (uint8_t)((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
            y[i].scales[j + 4] = (uint8_t)((m[j] & 63) | ((m[j + 4] >> 4) << 6));
            y[i].scales[j + 8] = (uint8_t)((sc[j + 4] & 15) | ((m[j + 4] & 15) << 4));
        }
        memset(y[i].qs, 0, sizeof y[i].qs);
        for (int j = 0; j < 8; j++) {
            float ds = d * (float)sc[j], off = dmin * (float)m[j];
            for (int l = 0; l < 32; l++) {
                int q = ds != 0 ? (int)nearbyintf((x[32 * j + l] + off) / ds) : 0;
                q = q < 0 ? 0 : q > 15 ? 15 : q;
                int e = 32 * j + l, c = e / 64, k = e % 64;
                if (k < 32)
                    y[i].qs[32 * c + k] |= (uint8_t)q;
                else
                    y[i].qs[32 * c + k - 32] |= (uint8_t)(q << 4);
            }
        }
    }
}

/* ---- Q6_K ------------------------------------------------------------------------------------ */

static int q6_k_elem(const kern_blk_q6_k *b, int e)
{
    int h = e / 128, k = (e % 128) / 32, l = e % 32;
    int lo = b->ql[64 * h + l + 32 * (k & 1)];
    lo = k < 2 ? lo & 0xf : lo >> 4;
    int hi = (b->qh[32 * h + l] >> (2 * k)) & 3;
    return lo | (hi << 4);
}

static void dot_q6_k_ref(int64_t n, const void *w, const void *a, float *out)
{
    const kern_blk_q6_k *x = w;
    const kern_q8_k *y = a;
    float s = 0;
    for (int64_t i = 0; i < n / 256; i++) {
        int sum = 0;
        for (int g = 0; g < 16; g++) {
            int dot = 0;
            for (int l = 0; l < 16; l++)
                dot += (q6_k_elem(&x[i], 16 * g + l) - 32) * y[i].qs[16 * g + l];
            sum += x[i].scales[g] * dot;
        }
        s += y[i].d * kern_f16_to_f32(x[i].d) * (float)sum;
    }
    *out = s;
}

static void to_f32_q6_k_ref(const void *w, float *out, int64_t n)
{
    const kern_blk_q6_k *x = w;
    for (int64_t i = 0; i < n / 256; i++) {
        float d = kern_f16_to_f32(x[i].d);
        for (int e = 0; e < 256; e++)
            out[256 * i + e] = d * (float)x[i].scales[e / 16] * (float)(q6_k_elem(&x[i], e) - 32);
    }
}

static void from_f32_q6_k_ref(const float *x, void *w, int64_t n)
{
    kern_blk_q6_k *y = w;
    for (int64_t i = 0; i < n / 256; i++, x += 256) {
        float scale[16], smax = 0;
        for (int g = 0; g < 16; g++) {
            float amax = 0;
            for (int l = 0; l < 16; l++)
                amax = fmaxf(amax, fabsf(x[16 * g + l]));
            scale[g] = amax / 31.0f;
            smax = fmaxf(smax, scale[g]);
        }
        float d = smax / 127.0f;
        y[i].d = kern_f32_to_f16(d);
        d = kern_f16_to_f32(y[i].d);
        memset(y[i].ql, 0, sizeof y[i].ql);
        memset(y[i].qh, 0, sizeof y[i].qh);
        for (int g = 0; g < 16; g++) {
            int sc = d != 0 ? (int)nearbyintf(scale[g] / d) : 0;
            sc = sc > 127 ? 127 : sc;
            y[i].scales[g] = (int8_t)sc;
            float ds = d * (float)sc;
            for (int l = 0; l < 16; l++) {
                int e = 16 * g + l;
                int q = ds != 0 ? (int)nearbyintf(x[e] / ds) : 0;
                q = (q < -32 ? -32 : q > 31 ? 31 : q) + 32;
                int h = e / 128, k = (e % 128) / 32, j = e % 32;
                y[i].ql[64 * h + j + 32 * (k & 1)] |= (uint8_t)(k < 2 ? q & 0xf : (q & 0xf) << 4);
                y[i].qh[32 * h + j] |= (uint8_t)((q >> 4) << (2 * k));
            }
        }
    }
}

/* ---- tables and selection -------------------------------------------------------------------- */

#define WT(id, ak, ab, q, d, t, f) {.pub = {id, ak, ab, q, d, t, f}}

static const kern_wops ref_ops[] = {
    WT(KERN_TYPE_F32, KERN_ACT_F32, act_bytes_f32, quantize_f32_ref, dot_f32_ref,
       to_f32_f32, from_f32_f32),
    WT(KERN_TYPE_F16, KERN_ACT_F32, act_bytes_f32, kern__quantize_f16_round, dot_f16_ref,
       to_f32_f16_ref, from_f32_f16_ref),
    WT(KERN_TYPE_BF16, KERN_ACT_F32, act_bytes_f32, kern__quantize_bf16_round, dot_bf16_ref,
       to_f32_bf16_ref, from_f32_bf16_ref),
    WT(KERN_TYPE_Q4_0, KERN_ACT_Q8_32, act_bytes_q8_32, quantize_q8_32_ref,
       dot_q4_0_ref, to_f32_q4_0_ref, from_f32_q4_0_ref),
    {.pub = {KERN_TYPE_Q4_1, KERN_ACT_Q8_32, act_bytes_q8_32, kern__quantize_q8_1_ref,
             dot_q4_1_ref, to_f32_q4_1_ref, from_f32_q4_1_ref},
     .x8 = x8_q4_1_ref},
    WT(KERN_TYPE_Q8_0, KERN_ACT_Q8_32, act_bytes_q8_32, quantize_q8_32_ref,
       dot_q8_0_ref, to_f32_q8_0_ref, from_f32_q8_0_ref),
    WT(KERN_TYPE_Q4_K, KERN_ACT_Q8_K, act_bytes_q8_k, quantize_q8_k_ref,
       dot_q4_k_ref, to_f32_q4_k_ref, from_f32_q4_k_ref),
    WT(KERN_TYPE_Q6_K, KERN_ACT_Q8_K, act_bytes_q8_k, quantize_q8_k_ref,
       dot_q6_k_ref, to_f32_q6_k_ref, from_f32_q6_k_ref),
};

enum { N_TYPES = sizeof ref_ops / sizeof ref_ops[0] };

static kern_wops best_ops[N_TYPES];
static const char *best_variant = "ref";
static bool best_invariant, best_exact;
static pthread_once_t best_once = PTHREAD_ONCE_INIT;

/* Kernel modes, from LLMGW_KERNELS (read once):
 *   unset   the fastest kernels (tiles for prefill, matrix-vector kernels for decode);
 *   ref     the scalar references everywhere (features.c reports no SIMD);
 *   invariant  keeps the SIMD dots but drops the matrix-vector and tile kernels, so a token's
 *           matmul results are the same bits whatever else is in the batch (the tiles sum in
 *           another order than the one-token path); prefill is then several times slower. The
 *           tiles that are batch-invariant themselves (tile_invariant: F16, BF16) stay;
 *   exact   llama.cpp's results: Q4_1 (whose tile and matrix-vector kernels sum in other orders)
 *           goes through the dot that sums in llama.cpp's order for every batch size; the other
 *           types keep their fastest kernels (the F16 / BF16 tiles sum as their dots). Prefill
 *           of a Q4_1 model is then ~5x slower. */
static void pick_best(void)
{
    memcpy(best_ops, ref_ops, sizeof best_ops);
    const char *mode = getenv("LLMGW_KERNELS");
    best_invariant = mode != NULL && strcmp(mode, "invariant") == 0;
    best_exact = mode != NULL && strcmp(mode, "exact") == 0;
#if defined(LLMGW_KERNELS_X86)
    const kern_cpu_features *f = kern_cpu_features_get();
    if (f->avx2 && f->fma && f->f16c) {
        kern__quant_install_avx2(best_ops, N_TYPES);
        best_variant = "avx2";
        if (f->avx512f && f->avx512bw && f->avx512vl && f->avx512vnni) {
            kern__quant_install_avx512(best_ops, N_TYPES);
            best_variant = "avx512";
        }
    }
#endif
    if (best_invariant)
        for (int i = 0; i < N_TYPES; i++) {
            best_ops[i].mv = NULL;
            if (!best_ops[i].tile_invariant)
                best_ops[i].tile = NULL;
        }
    if (best_exact)
        kern__quant_make_exact(best_ops, N_TYPES);
}

void kern__quant_make_exact(kern_wops *ops, int n)
{
    for (int i = 0; i < n; i++)
        if (ops[i].pub.type == KERN_TYPE_Q4_1) {
            ops[i].pub.dot = kern__wops_get_ref(KERN_TYPE_Q4_1)->pub.dot;   /* llama.cpp's order */
            ops[i].mv = NULL;
            ops[i].tile = NULL;
        }
#if defined(LLMGW_KERNELS_X86)
    const kern_cpu_features *f = kern_cpu_features_get();
    if (f->avx2 && f->fma && f->f16c)
        kern__quant_install_exact_avx2(ops, n);
#endif
}

bool kern__exact(void)
{
    pthread_once(&best_once, pick_best);
    return best_exact;
}

static int index_of(uint32_t type)
{
    for (int i = 0; i < N_TYPES; i++)
        if (ref_ops[i].pub.type == type)
            return i;
    return -1;
}

const kern_wops *kern__wops_get(uint32_t type)
{
    pthread_once(&best_once, pick_best);
    int i = index_of(type);
    return i < 0 ? NULL : &best_ops[i];
}

const kern_wops *kern__wops_get_ref(uint32_t type)
{
    int i = index_of(type);
    return i < 0 ? NULL : &ref_ops[i];
}

const kern_wtype *kern_wtype_get(uint32_t type)
{
    const kern_wops *o = kern__wops_get(type);
    return o ? &o->pub : NULL;
}

const kern_wtype *kern_wtype_get_ref(uint32_t type)
{
    const kern_wops *o = kern__wops_get_ref(type);
    return o ? &o->pub : NULL;
}

const char *kern_wtype_variant(void)
{
    pthread_once(&best_once, pick_best);
    return best_variant;
}
