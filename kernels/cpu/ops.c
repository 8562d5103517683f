/* kernels/cpu/ops.c: the element-wise ops of the CPU backend (embedding lookup, RMSNorm, RoPE,
 * SwiGLU, residual adds, K/V stores) and the scalar references of the vector helpers they and
 * attention.c use (the AVX2 twins are in ops_avx2.c). Small calls, as in decoding one token, run on
 * the calling thread: handing 576 floats to another core costs more than adding them. Large
 * ones (prefill) are split by rows over the pool. */
#include "kernels/cpu/internal.h"

#include "kernels/cpu/features.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Below this many elements an op stays on the calling thread. */
#define PAR_MIN_ELEMS 32768

/* ---- vector helpers: references -------------------------------------------------------------- */

/* As llama.cpp's RMSNorm: each square rounded to f32, the sum kept in double. */
static double sumsq_ref(const float *x, int64_t n)
{
    double s = 0;
    for (int64_t i = 0; i < n; i++)
        s += (double)(x[i] * x[i]);
    return s;
}

static void scale_mul_ref(float *y, const float *x, const float *w, float s, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        y[i] = x[i] * s * w[i];
}

/* exp as llama.cpp's ggml_v_expf (the SIMD exp of its softmax and SiLU): n = round(x / ln2)
 * by the 1.5 * 2^23 trick, b = x - n ln2 in two FMAs, a degree-5 polynomial j(b) in FMAs, then
 * j * 2^n (here as two exact-or-once-rounded multiplications by powers of two, which is what
 * VSCALEFPS gives); |n| > 192 saturates to 0 or inf. */
float kern__expf(float x)
{
    const float r = 0x1.8p23f;
    float z = fmaf(x, 0x1.715476p+0f, r);
    float n = z - r;
    float b = fmaf(-n, 0x1.7f7d1cp-20f, fmaf(-n, 0x1.62e4p-1f, x));
    if (fabsf(n) > 192.0f)
        return n <= 0.0f ? 0.0f : INFINITY;
    float u = b * b;
    float j = fmaf(fmaf(fmaf(0x1.0e4020p-7f, b, 0x1.573e2ep-5f), u,
                        fmaf(0x1.555e66p-3f, b, 0x1.fffdb6p-2f)),
                   u, fmaf(0x1.ffffecp-1f, b, 1.0f));
    int ni = (int)n, n1 = ni / 2, n2 = ni - n1;
    return j * ldexpf(1.0f, n1) * ldexpf(1.0f, n2);
}

/* llama.cpp's ggml_v_silu times up: (g / (1 + exp(0 - g))) * u. */
static void swiglu_ref(float *y, const float *g, const float *u, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        y[i] = g[i] / (1.0f + kern__expf(0.0f - g[i])) * u[i];
}

static void add_ref(float *y, const float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        y[i] += x[i];
}

/* Partial sums of a dot product in llama.cpp's orders (internal.h): element i goes to
 * accumulator i % step (fma), except past the last full step of 64 in the DOT order, where
 * the products are added in double after the reduction. */
typedef struct chains {
    float a[64];
    float tail[64];
    int step, n_full, n_tail;
} chains;

static void chains_init(chains *c, int n, int order)
{
    memset(c, 0, sizeof *c);
    c->step = order == KERN_ORDER_GEMM ? 16 : 64;
    c->n_full = order == KERN_ORDER_GEMM ? n : n / 64 * 64;
}

static void chains_add(chains *c, int i, float x, float y)
{
    if (i < c->n_full)
        c->a[i % c->step] = fmaf(x, y, c->a[i % c->step]);
    else
        c->tail[c->n_tail++] = x * y;
}

static float tree16(float *c)
{
    for (int w = 8; w >= 1; w /= 2)
        for (int l = 0; l < w; l++)
            c[l] = c[l] + c[l + w];
    return c[0];
}

static float chains_sum(chains *c)
{
    float r[16];
    for (int l = 0; l < 16; l++)
        r[l] = c->step == 16 ? c->a[l] : (c->a[l] + c->a[32 + l]) + (c->a[16 + l] + c->a[48 + l]);
    double s = tree16(r);
    for (int t = 0; t < c->n_tail; t++)
        s += (double)c->tail[t];
    return (float)s;
}

/* The GEMM order needs whole 16-element steps (llama.cpp's batched kernel refuses others and
 * takes the one-token path). */
static int qk_order(int order, int d)
{
    return order == KERN_ORDER_GEMM && d % 16 == 0 ? KERN_ORDER_GEMM : KERN_ORDER_DOT;
}

static void qk_exact_ref(const float *const *q, int nq, const uint16_t *const *k, int n,
                         int d, float scale, float *const *s, int order)
{
    order = qk_order(order, d);
    for (int j = 0; j < n; j++)
        for (int i = 0; i < nq; i++) {
            chains c;
            chains_init(&c, d, order);
            for (int e = 0; e < d; e++)
                chains_add(&c, e, q[i][e], kern_f16_to_f32(k[j][e]));
            s[i][j] = chains_sum(&c) * scale;
        }
}

static double softmax_exact_ref(float *s, int n, float max)
{
    double sum = 0;
    for (int j0 = 0; j0 < n; j0 += 16) {
        float c[16];
        for (int l = 0; l < 16; l++)
            c[l] = j0 + l < n ? (s[j0 + l] = kern__expf(s[j0 + l] - max)) : 0.0f;
        sum += (double)tree16(c);
    }
    return sum;
}

static void probs_f16_ref(float *s, int n, float inv)
{
    for (int j = 0; j < n; j++)
        s[j] = kern_f16_to_f32(kern_f32_to_f16(s[j] * inv));
}

/* Over positions llama.cpp's n is padded (to 256) with zero probabilities: no tail. */
static void pv_exact_ref(float *const *out, int nq, const float *const *p,
                         const uint16_t *const *v, int n, int d, int order, float *acc)
{
    (void)acc;
    int padded = order == KERN_ORDER_GEMM ? (n + 15) / 16 * 16 : (n + 63) / 64 * 64;
    for (int i = 0; i < nq; i++)
        for (int e = 0; e < d; e++) {
            chains c;
            chains_init(&c, padded, order);
            for (int j = 0; j < n; j++)
                chains_add(&c, j, p[i][j], kern_f16_to_f32(v[j][e]));
            out[i][e] = chains_sum(&c);
        }
}

/* The default (fast) attention's references: plain sums (LLMGW_KERNELS=exact uses the above). */
static void qk_ref(const float *const *q, int nq, const uint16_t *k, size_t stride, int n, int d,
                   float scale, float *const *s, int off)
{
    for (int j = 0; j < n; j++, k += stride)
        for (int i = 0; i < nq; i++) {
            float acc = 0;
            for (int e = 0; e < d; e++)
                acc += q[i][e] * kern_f16_to_f32(k[e]);
            s[i][off + j] = acc * scale;
        }
}

static float softmax_exp_ref(float *s, int n, float max)
{
    float sum = 0;
    for (int j = 0; j < n; j++) {
        s[j] = expf(s[j] - max);
        sum += s[j];
    }
    return sum;
}

static void pv_ref(float *const *out, int nq, const float *const *p, int off, const uint16_t *v,
                   size_t stride, int n, int d)
{
    for (int j = 0; j < n; j++, v += stride)
        for (int i = 0; i < nq; i++)
            for (int e = 0; e < d; e++)
                out[i][e] += p[i][off + j] * kern_f16_to_f32(v[e]);
}

static void qk_q8_ref(const float *const *q, int nq, const uint8_t *k, size_t stride, int n,
                      int d, int group, float scale, float *const *s, int off)
{
    for (int j = 0; j < n; j++, k += stride) {
        const int8_t *kq = (const int8_t *)k;
        const uint16_t *sc = (const uint16_t *)(k + d);
        for (int i = 0; i < nq; i++) {
            float acc = 0;
            for (int g = 0; g < d / group; g++) {
                float part = 0;
                for (int e = g * group; e < (g + 1) * group; e++)
                    part += q[i][e] * (float)kq[e];
                acc += part * kern_f16_to_f32(sc[g]);
            }
            s[i][off + j] = acc * scale;
        }
    }
}

static void pv_q8_ref(float *const *out, int nq, const float *const *p, int off,
                      const uint8_t *v, size_t stride, int n, int d)
{
    for (int j = 0; j < n; j++, v += stride) {
        const int8_t *vq = (const int8_t *)v;
        float sc = kern_f16_to_f32(*(const uint16_t *)(v + d));
        for (int i = 0; i < nq; i++) {
            float w = p[i][off + j] * sc;
            for (int e = 0; e < d; e++)
                out[i][e] += w * (float)vq[e];
        }
    }
}

static void hadamard_ref(float *x, int d)
{
    for (int len = 1; len < d; len <<= 1)
        for (int i = 0; i < d; i += 2 * len)
            for (int j = i; j < i + len; j++) {
                float a = x[j], b = x[j + len];
                x[j] = a + b;
                x[j + len] = a - b;
            }
    float s = 1.0f / sqrtf((float)d);
    for (int i = 0; i < d; i++)
        x[i] *= s;
}

void kern__kv_q8_row(const float *x, int8_t *q, uint16_t *sc, int d, int group)
{
    for (int g = 0; g < d / group; g++) {
        const float *xg = x + (size_t)g * (size_t)group;
        float amax = 0;
        for (int e = 0; e < group; e++)
            amax = fabsf(xg[e]) > amax ? fabsf(xg[e]) : amax;
        /* The scale as stored: f16, rounded up so that no value needs more than 127 steps. */
        uint16_t h = kern_f32_to_f16(amax / 127.0f);
        if (kern_f16_to_f32(h) < amax / 127.0f)
            h++;
        float s = kern_f16_to_f32(h), inv = s > 0 ? 1.0f / s : 0.0f;
        for (int e = 0; e < group; e++) {
            float r = roundf(xg[e] * inv);
            q[g * group + e] = (int8_t)(r > 127 ? 127 : r < -127 ? -127 : r);
        }
        sc[g] = h;
    }
}


static const kern_vops vops_ref = {
    .sumsq = sumsq_ref,
    .scale_mul = scale_mul_ref,
    .swiglu = swiglu_ref,
    .add = add_ref,
    .qk = qk_ref,
    .softmax_exp = softmax_exp_ref,
    .pv = pv_ref,
    .qk_q8 = qk_q8_ref,
    .pv_q8 = pv_q8_ref,
    .hadamard = hadamard_ref,
    .qk_exact = qk_exact_ref,
    .softmax_exact = softmax_exact_ref,
    .probs_f16 = probs_f16_ref,
    .pv_exact = pv_exact_ref,
};

static kern_vops vops_best;
static pthread_once_t vops_once = PTHREAD_ONCE_INIT;

static void vops_pick(void)
{
    vops_best = vops_ref;
#if defined(LLMGW_KERNELS_X86)
    const kern_cpu_features *f = kern_cpu_features_get();
    if (f->avx2 && f->fma && f->f16c)
        kern__vops_install_avx2(&vops_best);
    if (f->avx2 && f->fma && f->f16c && f->avx512f && f->avx512bw)
        kern__vops_install_avx512(&vops_best);
#endif
}

const kern_vops *kern__vops_get(void)
{
    pthread_once(&vops_once, vops_pick);
    return &vops_best;
}

const kern_vops *kern__vops_get_ref(void)
{
    return &vops_ref;
}

/* ---- row-parallel driver --------------------------------------------------------------------- */

typedef struct row_job {
    kern_cpu *c;
    void (*row)(struct row_job *j, long r);
    long rows;
    float *y;
    const float *x, *w, *u;
    int64_t n;
    float eps;
} row_job;

static void rows_run(void *arg, int ith, int nth)
{
    row_job *j = arg;
    long lo, hi;
    util_pool_split(j->rows, ith, nth, &lo, &hi);
    for (long r = lo; r < hi; r++)
        j->row(j, r);
}

static void for_rows(row_job *j)
{
    if (j->c->nth > 1 && j->rows > 1 && j->rows * j->n >= PAR_MIN_ELEMS)
        util_pool_run(j->c->pool, rows_run, j);
    else
        for (long r = 0; r < j->rows; r++)
            j->row(j, r);
}

/* ---- ops ------------------------------------------------------------------------------------- */

void kern__op_get_rows(void *ctx, const kern_tensor *w, const int32_t *ids, int n, float *y)
{
    (void)ctx;
    const kern_wtype *t = kern_wtype_get(w->type);
    for (int i = 0; i < n; i++)
        t->to_f32((const uint8_t *)w->data + (size_t)ids[i] * w->row_bytes, y + (size_t)i * w->cols,
                  w->cols);
}

static void rmsnorm_row(row_job *j, long r)
{
    const kern_vops *v = j->c->v;
    const float *x = j->x + r * j->n;
    /* llama.cpp: mean = (float)(sum / n) and scale = 1 / sqrtf(mean + eps), in f32 */
    float ms = (float)(v->sumsq(x, j->n) / (double)j->n);
    v->scale_mul(j->y + r * j->n, x, j->w, 1.0f / sqrtf(ms + j->eps), j->n);
}

void kern__op_rmsnorm(void *ctx, float *y, const float *x, const float *w, int64_t n, int n_tok,
                      float eps)
{
    row_job j = {.c = ctx, .row = rmsnorm_row, .rows = n_tok, .y = y, .x = x, .w = w, .n = n,
                 .eps = eps};
    for_rows(&j);
}

static void swiglu_row(row_job *j, long r)
{
    j->c->v->swiglu(j->y + r * j->n, j->x + r * j->n, j->u + r * j->n, j->n);
}

static void add_row_job(row_job *j, long r)
{
    j->c->v->add(j->y + r * j->n, j->x + r * j->n, j->n);
}

/* Flat element-wise ops are cut into pseudo-rows of CHUNK elements for the pool. */
#define CHUNK 8192

static void flat(kern_cpu *c, void (*row)(row_job *, long), float *y, const float *x,
                 const float *u, size_t n)
{
    size_t full = n / CHUNK;
    row_job j = {.c = c, .row = row, .rows = (long)full, .y = y, .x = x, .u = u, .n = CHUNK};
    for_rows(&j);
    size_t done = full * CHUNK;
    if (done < n) {
        row_job t = {.c = c, .y = y + done, .x = x + done, .u = u ? u + done : NULL,
                     .n = (int64_t)(n - done)};
        row(&t, 0);
    }
}

void kern__op_swiglu(void *ctx, float *y, const float *gate, const float *up, size_t n)
{
    flat(ctx, swiglu_row, y, gate, up, n);
}

void kern__op_add(void *ctx, float *y, const float *x, size_t n)
{
    flat(ctx, add_row_job, y, x, NULL, n);
}

static void bias_row(row_job *j, long r)
{
    j->c->v->add(j->y + r * j->n, j->x, j->n);
}

void kern__op_add_row(void *ctx, float *y, const float *b, int64_t n, int n_tok)
{
    row_job j = {.c = ctx, .row = bias_row, .rows = n_tok, .y = y, .x = b, .n = n};
    for_rows(&j);
}

/* The angle of one pair as llama.cpp forms it: the running theta divided by the pair's
 * frequency factor (when there are factors; dividing by 1 would change nothing), then scaled. */
static inline float rope_angle(float theta, float scale, const float *ff, int i)
{
    return scale * (ff != NULL ? theta / ff[i] : theta);
}

/* cos/sin as llama.cpp's RoPE cache: theta_scale = powf(base, -2/dim), theta starts at pos and
 * is multiplied by theta_scale from one pair to the next, in f32; angle
 * freq_scale * (theta / ff[i]), cosf / sinf. */
static void rope_angles(float *cs, int32_t pos, int dim, float base, float scale, const float *ff)
{
    float theta_scale = powf(base, -2.0f / (float)dim), theta = (float)pos;
    for (int i = 0; i < dim / 2; i++) {
        float a = rope_angle(theta, scale, ff, i);
        cs[2 * i] = cosf(a);
        cs[2 * i + 1] = sinf(a);
        theta *= theta_scale;
    }
}

/* The rotation with llama.cpp's roundings (its compiler fuses one product of each output:
 * x0 * c - x1 * s and x0 * s + x1 * c, each with x0's product fused), verified bit for bit on
 * its RoPE output. */
static inline __attribute__((always_inline)) void rope_rotate_body(float *x, const float *cs,
                                                                   int dim, bool neox)
{
    int half = dim / 2;
    for (int i = 0; i < half; i++) {
        int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
        float c = cs[2 * i], s = cs[2 * i + 1], x0 = x[a], x1 = x[b];
        x[a] = fmaf(x0, c, -(x1 * s));
        x[b] = fmaf(x0, s, x1 * c);
    }
}

static void rope_rotate_plain(float *x, const float *cs, int dim, bool neox)
{
    rope_rotate_body(x, cs, dim, neox);
}

#if defined(LLMGW_KERNELS_X86)
/* The same with fmaf as one instruction (the plain build calls libm's for every element, which
 * made prefill measurably slower); fmaf rounds once either way, so the bits are the same. */
__attribute__((target("fma"))) static void rope_rotate_fma(float *x, const float *cs, int dim,
                                                            bool neox)
{
    rope_rotate_body(x, cs, dim, neox);
}
#endif

typedef void (*rope_rotate_fn)(float *x, const float *cs, int dim, bool neox);

static rope_rotate_fn rope_rotate_pick(void)
{
#if defined(LLMGW_KERNELS_X86)
    if (kern_cpu_features_get()->fma)
        return rope_rotate_fma;
#endif
    return rope_rotate_plain;
}

typedef struct rope_job {
    float *x;
    const int32_t *pos;
    int n_head, dim;
    float base, scale;
    const float *ff;        /* [dim / 2] frequency factors, or NULL */
    bool neox;
    const float *cs;        /* [n_tok][dim] cached cos/sin, or NULL: compute per token */
    int n_tok;
    rope_rotate_fn rotate;
} rope_job;

static void rope_tokens(const rope_job *j, int t0, int t1)
{
    float buf[1024];
    for (int t = t0; t < t1; t++) {
        const float *cs = j->cs != NULL ? j->cs + (size_t)t * (size_t)j->dim : buf;
        if (j->cs == NULL && j->dim <= 1024) {
            rope_angles(buf, j->pos[t], j->dim, j->base, j->scale, j->ff);
        } else if (j->cs == NULL) {
            /* Heads beyond 1024 (no model has them): one pair at a time, same angles. */
            float theta_scale = powf(j->base, -2.0f / (float)j->dim);
            for (int h = 0; h < j->n_head; h++) {
                float *xh = j->x + ((size_t)t * (size_t)j->n_head + (size_t)h) * (size_t)j->dim;
                float theta = (float)j->pos[t];
                for (int i = 0; i < j->dim / 2; i++, theta *= theta_scale) {
                    float ang = rope_angle(theta, j->scale, j->ff, i);
                    float c = cosf(ang), sn = sinf(ang);
                    int a = j->neox ? i : 2 * i, b = j->neox ? i + j->dim / 2 : 2 * i + 1;
                    float x0 = xh[a], x1 = xh[b];
                    xh[a] = fmaf(x0, c, -(x1 * sn));
                    xh[b] = fmaf(x0, sn, x1 * c);
                }
            }
            continue;
        }
        for (int h = 0; h < j->n_head; h++)
            j->rotate(j->x + ((size_t)t * (size_t)j->n_head + (size_t)h) * (size_t)j->dim, cs,
                        j->dim, j->neox);
    }
}

static void rope_run(void *arg, int ith, int nth)
{
    const rope_job *j = arg;
    long lo, hi;
    util_pool_split(j->n_tok, ith, nth, &lo, &hi);
    rope_tokens(j, (int)lo, (int)hi);
}

void kern__op_rope(void *ctx, float *x, const int32_t *pos, int n_tok, int n_head, int head_dim,
                   float theta_base, float freq_scale, const float *freq_factors, bool neox)
{
    kern_cpu *c = ctx;
    bool cached = c->rope_cs != NULL && n_tok <= c->max_tok && head_dim <= c->max_cols;
    size_t ff_bytes = (size_t)(head_dim / 2) * sizeof *freq_factors;
    /* The cached angles hold for the same positions, shape, base, scale and factor values (the
     * factors are compared by value: the same buffer may hold others by the next call). */
    if (cached && !(c->rope_n == n_tok && c->rope_dim == head_dim && c->rope_base == theta_base &&
                    c->rope_scale == freq_scale && c->rope_has_ff == (freq_factors != NULL) &&
                    (freq_factors == NULL || memcmp(c->rope_ff, freq_factors, ff_bytes) == 0) &&
                    memcmp(c->rope_pos, pos, (size_t)n_tok * sizeof *pos) == 0)) {
        for (int t = 0; t < n_tok; t++)
            rope_angles(c->rope_cs + (size_t)t * (size_t)head_dim, pos[t], head_dim, theta_base,
                        freq_scale, freq_factors);
        memcpy(c->rope_pos, pos, (size_t)n_tok * sizeof *pos);
        if (freq_factors != NULL)
            memcpy(c->rope_ff, freq_factors, ff_bytes);
        c->rope_has_ff = freq_factors != NULL;
        c->rope_n = n_tok;
        c->rope_dim = head_dim;
        c->rope_base = theta_base;
        c->rope_scale = freq_scale;
    }
    rope_job j = {.x = x, .pos = pos, .n_head = n_head, .dim = head_dim, .base = theta_base,
                  .scale = freq_scale, .ff = freq_factors, .neox = neox,
                  .cs = cached ? c->rope_cs : NULL,
                  .n_tok = n_tok, .rotate = rope_rotate_pick()};
    if (c->nth > 1 && n_tok > 1 && (int64_t)n_tok * n_head * head_dim >= PAR_MIN_ELEMS)
        util_pool_run(c->pool, rope_run, &j);
    else
        rope_tokens(&j, 0, n_tok);
}

void kern__kv_check_rotate(const kern_kv *kv)
{
    int d = kv->head_dim;
    if (kv->type == KERN_KV_Q8 && kv->rotate && (d > KERN_KV_MAX_DIM || (d & (d - 1)) != 0)) {
        fprintf(stderr, "kern kv: a rotated cache needs a head size that is a power of two up "
                "to %d, not %d\n", KERN_KV_MAX_DIM, d);
        abort();
    }
}

void kern__op_kv_store(void *ctx, const kern_kv *kv, const kern_seq *seqs, int n_seq,
                       const float *k, const float *v, const int32_t *pos)
{
    (void)ctx;
    kern__kv_check_rotate(kv);
    int d = kv->head_dim, kg = kv->k_group > 0 ? kv->k_group : d;
    size_t row = (size_t)kv->n_kv_head * (size_t)d;
    size_t k_row = kern_kv_row_bytes(kv->type, d, kg), v_row = kern_kv_row_bytes(kv->type, d, d);
    for (int s = 0; s < n_seq; s++)
        for (int t = seqs[s].tok0; t < seqs[s].tok0 + seqs[s].n_tok; t++) {
            uint8_t *page = seqs[s].pages[pos[t] / kv->page_tokens];
            size_t slot = (size_t)(pos[t] % kv->page_tokens) * (size_t)kv->n_kv_head;
            uint8_t *kd = page + kv->k_off + slot * k_row, *vd = page + kv->v_off + slot * v_row;
            const float *kt = k + (size_t)t * row, *vt = v + (size_t)t * row;
            if (kv->type != KERN_KV_Q8) {
                kern__f32_to_f16_row(kt, (uint16_t *)kd, (int64_t)row);
                kern__f32_to_f16_row(vt, (uint16_t *)vd, (int64_t)row);
                continue;
            }
            for (int h = 0; h < kv->n_kv_head; h++, kd += k_row, vd += v_row) {
                const float *kh = kt + (size_t)h * (size_t)d, *vh = vt + (size_t)h * (size_t)d;
                float kr[KERN_KV_MAX_DIM], vr[KERN_KV_MAX_DIM];
                if (kv->rotate) {
                    memcpy(kr, kh, (size_t)d * sizeof *kr);
                    memcpy(vr, vh, (size_t)d * sizeof *vr);
                    kern__vops_get()->hadamard(kr, d);
                    kern__vops_get()->hadamard(vr, d);
                    kh = kr;
                    vh = vr;
                }
                kern__kv_q8_row(kh, (int8_t *)kd, (uint16_t *)(kd + d), d, kg);
                kern__kv_q8_row(vh, (int8_t *)vd, (uint16_t *)(vd + d), d, d);
            }
        }
}
