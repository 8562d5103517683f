/* kernels/cpu/ops.c: the element-wise ops of the CPU backend (embedding lookup, RMSNorm, RoPE,
 * SwiGLU, residual adds, K/V stores) and the scalar references of the vector helpers they and
 * attention.c use (the AVX2 twins are in ops_avx2.c). Small calls, as in decoding one token, run on
 * the calling thread: handing 576 floats to another core costs more than adding them. Large
 * ones (prefill) are split by rows over the pool. */
#include "kernels/cpu/internal.h"

#include "kernels/cpu/features.h"

#include <math.h>
#include <pthread.h>
#include <string.h>

/* Below this many elements an op stays on the calling thread. */
#define PAR_MIN_ELEMS 32768

/* ---- vector helpers: references -------------------------------------------------------------- */

static float sumsq_ref(const float *x, int64_t n)
{
    double s = 0;
    for (int64_t i = 0; i < n; i++)
        s += (double)x[i] * x[i];
    return (float)s;
}

static void scale_mul_ref(float *y, const float *x, const float *w, float s, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        y[i] = x[i] * s * w[i];
}

static void swiglu_ref(float *y, const float *g, const float *u, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        y[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

static void add_ref(float *y, const float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        y[i] += x[i];
}

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

static const kern_vops vops_ref = {
    .sumsq = sumsq_ref,
    .scale_mul = scale_mul_ref,
    .swiglu = swiglu_ref,
    .add = add_ref,
    .qk = qk_ref,
    .softmax_exp = softmax_exp_ref,
    .pv = pv_ref,
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
    float ms = v->sumsq(x, j->n) / (float)j->n;
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

/* cos/sin of pos * freq_scale * base^(-2i/dim) for i < dim/2, computed in double. */
static void rope_angles(float *cs, int32_t pos, int dim, float base, float scale)
{
    for (int i = 0; i < dim / 2; i++) {
        double a = (double)pos * scale * pow(base, -2.0 * i / dim);
        cs[2 * i] = (float)cos(a);
        cs[2 * i + 1] = (float)sin(a);
    }
}

static void rope_rotate(float *x, const float *cs, int dim, bool neox)
{
    int half = dim / 2;
    for (int i = 0; i < half; i++) {
        int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
        float c = cs[2 * i], s = cs[2 * i + 1], x0 = x[a], x1 = x[b];
        x[a] = x0 * c - x1 * s;
        x[b] = x0 * s + x1 * c;
    }
}

typedef struct rope_job {
    float *x;
    const int32_t *pos;
    int n_head, dim;
    float base, scale;
    bool neox;
    const float *cs;        /* [n_tok][dim] cached cos/sin, or NULL: compute per token */
    int n_tok;
} rope_job;

static void rope_tokens(const rope_job *j, int t0, int t1)
{
    float buf[1024];
    for (int t = t0; t < t1; t++) {
        const float *cs = j->cs != NULL ? j->cs + (size_t)t * (size_t)j->dim : buf;
        if (j->cs == NULL && j->dim <= 1024) {
            rope_angles(buf, j->pos[t], j->dim, j->base, j->scale);
        } else if (j->cs == NULL) {
            /* Heads beyond 1024 (no model has them): one pair at a time. */
            for (int h = 0; h < j->n_head; h++) {
                float *xh = j->x + ((size_t)t * (size_t)j->n_head + (size_t)h) * (size_t)j->dim;
                for (int i = 0; i < j->dim / 2; i++) {
                    float pair[2];
                    rope_angles(pair, j->pos[t], 2, j->base,
                                j->scale * (float)pow(j->base, -2.0 * i / j->dim));
                    int a = j->neox ? i : 2 * i, b = j->neox ? i + j->dim / 2 : 2 * i + 1;
                    float x0 = xh[a], x1 = xh[b];
                    xh[a] = x0 * pair[0] - x1 * pair[1];
                    xh[b] = x0 * pair[1] + x1 * pair[0];
                }
            }
            continue;
        }
        for (int h = 0; h < j->n_head; h++)
            rope_rotate(j->x + ((size_t)t * (size_t)j->n_head + (size_t)h) * (size_t)j->dim, cs,
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
                   float theta_base, float freq_scale, bool neox)
{
    kern_cpu *c = ctx;
    bool cached = c->rope_cs != NULL && n_tok <= c->max_tok && head_dim <= c->max_cols;
    if (cached && !(c->rope_n == n_tok && c->rope_dim == head_dim && c->rope_base == theta_base &&
                    c->rope_scale == freq_scale &&
                    memcmp(c->rope_pos, pos, (size_t)n_tok * sizeof *pos) == 0)) {
        for (int t = 0; t < n_tok; t++)
            rope_angles(c->rope_cs + (size_t)t * (size_t)head_dim, pos[t], head_dim, theta_base,
                        freq_scale);
        memcpy(c->rope_pos, pos, (size_t)n_tok * sizeof *pos);
        c->rope_n = n_tok;
        c->rope_dim = head_dim;
        c->rope_base = theta_base;
        c->rope_scale = freq_scale;
    }
    rope_job j = {.x = x, .pos = pos, .n_head = n_head, .dim = head_dim, .base = theta_base,
                  .scale = freq_scale, .neox = neox, .cs = cached ? c->rope_cs : NULL,
                  .n_tok = n_tok};
    if (c->nth > 1 && n_tok > 1 && (int64_t)n_tok * n_head * head_dim >= PAR_MIN_ELEMS)
        util_pool_run(c->pool, rope_run, &j);
    else
        rope_tokens(&j, 0, n_tok);
}

void kern__op_kv_store(void *ctx, const kern_kv *kv, const float *k, const float *v,
                       const int32_t *pos, int n_tok)
{
    (void)ctx;
    size_t row = (size_t)kv->n_kv_head * (size_t)kv->head_dim;
    for (int t = 0; t < n_tok; t++) {
        uint8_t *page = kv->pages[pos[t] / kv->page_tokens];
        size_t slot = (size_t)(pos[t] % kv->page_tokens) * row * 2;
        kern__f32_to_f16_row(k + (size_t)t * row, (uint16_t *)(page + kv->k_off + slot),
                             (int64_t)row);
        kern__f32_to_f16_row(v + (size_t)t * row, (uint16_t *)(page + kv->v_off + slot),
                             (int64_t)row);
    }
}
