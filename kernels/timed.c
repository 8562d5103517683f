/* kernels/timed.c: the timing kern_backend (kernels/timed.h). */
#include "kernels/timed.h"

#include "common/time.h"
#include "kernels/types.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { MAX_STAGES = 64 };

typedef struct timed {
    kern_backend be;          /* first: the wrapper is handed out as &be */
    kern_backend *inner;
    void *probe;              /* off the host: 4 bytes of the device's, copied out to wait */
    kern_stage st[MAX_STAGES];
    int n;
} timed;

/* The stage called name; past MAX_STAGES - 1 names, one "(other)" for the rest. */
static kern_stage *stage(timed *t, const char *name)
{
    for (int i = 0; i < t->n; i++)
        if (strcmp(t->st[i].name, name) == 0)
            return &t->st[i];
    kern_stage *s = &t->st[t->n < MAX_STAGES - 1 ? t->n : MAX_STAGES - 1];
    if (t->n < MAX_STAGES - 1) {
        snprintf(s->name, sizeof s->name, "%s", name);
        t->n++;
    } else if (t->n == MAX_STAGES - 1) {
        snprintf(s->name, sizeof s->name, "(other)");
        t->n++;
    }
    return s;
}

static void account(timed *t, const char *name, uint64_t t0)
{
    if (t->probe != NULL) {   /* a device computes after the call returns: wait for it */
        uint32_t v;
        t->inner->buffer_copy_out(t->inner->ctx, t->probe, 0, &v, sizeof v);
    }
    kern_stage *s = stage(t, name);
    s->calls++;
    s->ns += util_now_ns() - t0;
}

#define INNER(t) ((t)->inner)
#define CALL(t, name, op, ...)                                                                   \
    do {                                                                                       \
        uint64_t t0_ = util_now_ns();                                                          \
        INNER(t)->op(INNER(t)->ctx, __VA_ARGS__);                                              \
        account(t, name, t0_);                                                                 \
    } while (0)

static int t_n_threads(void *ctx)
{
    timed *t = ctx;
    return t->inner->n_threads(t->inner->ctx);
}

static int t_reserve(void *ctx, int max_tok, int64_t max_cols, int max_ctx)
{
    timed *t = ctx;
    return t->inner->reserve(t->inner->ctx, max_tok, max_cols, max_ctx);
}

static void t_destroy(void *ctx)
{
    timed *t = ctx;
    if (t->probe != NULL)
        t->inner->buffer_free(t->inner->ctx, t->probe, 4);
    t->inner->destroy(t->inner->ctx);
    free(t);
}

static void t_matmul(void *ctx, const kern_tensor *w, const float *x, int n_tok, float *y,
                     int64_t ldy)
{
    timed *t = ctx;
    char name[48];
    snprintf(name, sizeof name, "matmul %lldx%lld %s%s", (long long)w->rows, (long long)w->cols,
             kern_type_name(w->type), w->layout == KERN_LAYOUT_X8 ? " x8" : "");
    CALL(t, name, matmul, w, x, n_tok, y, ldy);
}

static bool t_repack(void *ctx, const kern_tensor *w, kern_tensor *out)
{
    timed *t = ctx;
    return t->inner->repack(t->inner->ctx, w, out);
}

static void t_repack_free(void *ctx, kern_tensor *w)
{
    timed *t = ctx;
    t->inner->repack_free(t->inner->ctx, w);
}

static void t_get_rows(void *ctx, const kern_tensor *w, const int32_t *ids, int n, float *y)
{
    CALL((timed *)ctx, "get_rows", get_rows, w, ids, n, y);
}

static void t_rmsnorm(void *ctx, float *y, const float *x, const float *w, int64_t n, int n_tok,
                      float eps)
{
    CALL((timed *)ctx, "rmsnorm", rmsnorm, y, x, w, n, n_tok, eps);
}

static void t_rope(void *ctx, float *x, const int32_t *pos, int n_tok, int n_head, int head_dim,
                   float theta_base, float freq_scale, const float *freq_factors, bool neox)
{
    CALL((timed *)ctx, "rope", rope, x, pos, n_tok, n_head, head_dim, theta_base, freq_scale,
         freq_factors, neox);
}

static void t_swiglu(void *ctx, float *y, const float *gate, const float *up, size_t n)
{
    CALL((timed *)ctx, "swiglu", swiglu, y, gate, up, n);
}

static void t_add(void *ctx, float *y, const float *x, size_t n)
{
    CALL((timed *)ctx, "add", add, y, x, n);
}

static void t_add_row(void *ctx, float *y, const float *b, int64_t n, int n_tok)
{
    CALL((timed *)ctx, "add_row", add_row, y, b, n, n_tok);
}

static void t_kv_store(void *ctx, const kern_kv *kv, const kern_seq *seqs, int n_seq,
                       const float *k, const float *v, const int32_t *pos)
{
    CALL((timed *)ctx, "kv_store", kv_store, kv, seqs, n_seq, k, v, pos);
}

static void t_attention(void *ctx, const kern_attn *a)
{
    CALL((timed *)ctx, "attention", attention, a);
}

static const char *t_kernels(void *ctx)
{
    return ((timed *)ctx)->inner->kernels(((timed *)ctx)->inner->ctx);
}

static bool t_supports_type(void *ctx, uint32_t type)
{
    return ((timed *)ctx)->inner->supports_type(((timed *)ctx)->inner->ctx, type);
}

static void *t_buffer_alloc(void *ctx, size_t bytes)
{
    return ((timed *)ctx)->inner->buffer_alloc(((timed *)ctx)->inner->ctx, bytes);
}

static void t_buffer_free(void *ctx, void *buf, size_t bytes)
{
    ((timed *)ctx)->inner->buffer_free(((timed *)ctx)->inner->ctx, buf, bytes);
}

static void t_buffer_copy_in(void *ctx, void *buf, size_t off, const void *src, size_t n)
{
    CALL((timed *)ctx, "copy_in", buffer_copy_in, buf, off, src, n);
}

static void t_buffer_copy_out(void *ctx, const void *buf, size_t off, void *dst, size_t n)
{
    CALL((timed *)ctx, "copy_out", buffer_copy_out, buf, off, dst, n);
}

static void t_copy(void *ctx, void *dst, const void *src, size_t n)
{
    CALL((timed *)ctx, "copy", copy, dst, src, n);
}

static kern_dense *t_dense_new(void *ctx, const float *w, const float *bias, int n, int k,
                               int precision)
{
    return INNER((timed *)ctx)->dense_new(INNER((timed *)ctx)->ctx, w, bias, n, k, precision);
}

static void t_dense_free(void *ctx, kern_dense *d)
{
    INNER((timed *)ctx)->dense_free(INNER((timed *)ctx)->ctx, d);
}

static void t_dense(void *ctx, const kern_dense *d, const float *x, int n_tok, float *y,
                    bool accumulate, bool gelu)
{
    char name[48];
    const char *inputs = d->bf16 ? " BF16" : d->tf32 ? " TF32" : "";
    snprintf(name, sizeof name, "dense %dx%d%s", d->n, d->k, inputs);
    CALL((timed *)ctx, name, dense, d, x, n_tok, y, accumulate, gelu);
}

static const char *t_dense_kernels(void *ctx, const kern_dense *probe)
{
    return INNER((timed *)ctx)->dense_kernels(INNER((timed *)ctx)->ctx, probe);
}

static void t_layernorm(void *ctx, float *x, const float *w, const float *b, int64_t n,
                        int n_tok, float eps)
{
    CALL((timed *)ctx, "layernorm", layernorm, x, w, b, n, n_tok, eps);
}

static void t_gelu(void *ctx, float *x, size_t n)
{
    CALL((timed *)ctx, "gelu", gelu, x, n);
}

static void t_encoder_attention(void *ctx, const float *qkv, float *out, const int32_t *start,
                                int n_seq, int n_head, int head_dim)
{
    CALL((timed *)ctx, "encoder_attention", encoder_attention, qkv, out, start, n_seq, n_head,
         head_dim);
}

static void t_set_spin(void *ctx, uint64_t ns)
{
    INNER((timed *)ctx)->set_spin(INNER((timed *)ctx)->ctx, ns);
}

kern_backend *kern_timed_new(kern_backend *inner)
{
    if (inner == NULL)
        return NULL;
    timed *t = calloc(1, sizeof *t);
    if (t == NULL ||
        (!inner->host_memory && (t->probe = inner->buffer_alloc(inner->ctx, 4)) == NULL)) {
        free(t);
        inner->destroy(inner->ctx);
        return NULL;
    }
    t->inner = inner;
    t->be = (kern_backend){
        .name = inner->name,
        .ctx = t,
        .n_threads = t_n_threads,
        .kernels = t_kernels,
        .supports_type = t_supports_type,
        .copy = t_copy,
        .host_memory = inner->host_memory,
        .reserve = t_reserve,
        .destroy = t_destroy,
        .buffer_alloc = t_buffer_alloc,
        .buffer_free = t_buffer_free,
        .buffer_copy_in = t_buffer_copy_in,
        .buffer_copy_out = t_buffer_copy_out,
        .repack = inner->repack != NULL ? t_repack : NULL,
        .repack_free = inner->repack != NULL ? t_repack_free : NULL,
        .matmul = t_matmul,
        .get_rows = t_get_rows,
        .rmsnorm = t_rmsnorm,
        .rope = t_rope,
        .swiglu = t_swiglu,
        .add = t_add,
        .add_row = t_add_row,
        .kv_store = t_kv_store,
        .attention = t_attention,
        .dense_new = t_dense_new,
        .dense_free = t_dense_free,
        .dense = t_dense,
        .dense_kernels = t_dense_kernels,
        .layernorm = t_layernorm,
        .gelu = t_gelu,
        .encoder_attention = t_encoder_attention,
        .set_spin = t_set_spin,
    };
    return &t->be;
}

static int by_time(const void *a, const void *b)
{
    const kern_stage *x = a, *y = b;
    return x->ns < y->ns ? 1 : x->ns > y->ns ? -1 : strcmp(x->name, y->name);
}

int kern_timed_stages(const kern_backend *be, kern_stage *out, int max)
{
    const timed *t = be->ctx;
    int n = t->n < max ? t->n : max;
    kern_stage all[MAX_STAGES];
    memcpy(all, t->st, (size_t)t->n * sizeof all[0]);
    qsort(all, (size_t)t->n, sizeof all[0], by_time);
    memcpy(out, all, (size_t)n * sizeof all[0]);
    return n;
}

void kern_timed_reset(kern_backend *be)
{
    timed *t = be->ctx;
    memset(t->st, 0, sizeof t->st);
    t->n = 0;
}
