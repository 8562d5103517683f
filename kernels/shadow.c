/* kernels/shadow.c: the CPU backend behind device-memory checks (kernels/shadow.h). Each entry
 * finds the buffers its pointer arguments lie in (aborting when one lies in none), opens just
 * those for the inner CPU backend's call and closes them again. */
#include "kernels/shadow.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* One address space for every shadow backend, as a device's memory is one for all its streams:
 * a buffer one instance made (a model's placed weights) is read by the others (its encoding
 * contexts), which may run at once; a buffer is open while any call uses it. */
typedef struct region {
    uint8_t *p;
    size_t n;       /* rounded up to whole pages */
    int opened;     /* calls using it now */
} region;

static struct {
    pthread_mutex_t mu;
    region *bufs;
    int n, cap;
} g_mem = {.mu = PTHREAD_MUTEX_INITIALIZER};

typedef struct shadow {
    kern_backend be;
    kern_backend *in;
    uint8_t *open[16];   /* the buffers (by start) the current call opened */
    int n_open;
} shadow;

static size_t page_round(size_t n)
{
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    return (n + pg - 1) / pg * pg;
}

static region *find(const uint8_t *p, size_t n)
{
    for (int i = 0; i < g_mem.n; i++)
        if (p >= g_mem.bufs[i].p && p + n <= g_mem.bufs[i].p + g_mem.bufs[i].n)
            return &g_mem.bufs[i];
    return NULL;
}

/* The buffer holding [p, p + n), opened for this call; aborts when there is none. */
static void need(shadow *s, const char *entry, const char *arg, const void *p, size_t n)
{
    pthread_mutex_lock(&g_mem.mu);
    region *r = find(p, n);
    if (r == NULL) {
        fprintf(stderr, "shadow: %s: %s (%p, %zu bytes) is not in a backend buffer (host "
                "memory, or a weight never placed)\n", entry, arg, p, n);
        abort();
    }
    for (int k = 0; k < s->n_open; k++)
        if (s->open[k] == r->p) {
            pthread_mutex_unlock(&g_mem.mu);
            return;
        }
    if (s->n_open == (int)(sizeof s->open / sizeof s->open[0]))
        abort();
    s->open[s->n_open++] = r->p;
    if (r->opened++ == 0 && mprotect(r->p, r->n, PROT_READ | PROT_WRITE) != 0)
        abort();
    pthread_mutex_unlock(&g_mem.mu);
}

static void done(shadow *s)
{
    pthread_mutex_lock(&g_mem.mu);
    for (int k = 0; k < s->n_open; k++) {
        region *r = find(s->open[k], 1);
        if (r != NULL && --r->opened == 0 && mprotect(r->p, r->n, PROT_NONE) != 0)
            abort();
    }
    s->n_open = 0;
    pthread_mutex_unlock(&g_mem.mu);
}

#define IN(s) ((s)->in)
#define F (sizeof(float))

static int sh_n_threads(void *ctx) { shadow *s = ctx; return IN(s)->n_threads(IN(s)->ctx); }
static const char *sh_kernels(void *ctx) { shadow *s = ctx; return IN(s)->kernels(IN(s)->ctx); }

static bool sh_supports_type(void *ctx, uint32_t type)
{
    shadow *s = ctx;
    return IN(s)->supports_type(IN(s)->ctx, type);
}

static int sh_reserve(void *ctx, int max_tok, int64_t max_cols, int max_ctx)
{
    shadow *s = ctx;
    return IN(s)->reserve(IN(s)->ctx, max_tok, max_cols, max_ctx);
}

static void sh_destroy(void *ctx)
{
    shadow *s = ctx;
    kern_backend_free(s->in);
    free(s);
}

static void *sh_buffer_alloc(void *ctx, size_t bytes)
{
    (void)ctx;
    if (bytes == 0)
        return NULL;
    size_t n = page_round(bytes);
    void *p = mmap(NULL, n, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    pthread_mutex_lock(&g_mem.mu);
    if (g_mem.n == g_mem.cap) {
        int cap = g_mem.cap ? 2 * g_mem.cap : 256;
        region *nb = realloc(g_mem.bufs, (size_t)cap * sizeof *nb);
        if (nb == NULL) {
            pthread_mutex_unlock(&g_mem.mu);
            munmap(p, n);
            return NULL;
        }
        g_mem.bufs = nb;
        g_mem.cap = cap;
    }
    g_mem.bufs[g_mem.n++] = (region){p, n, 0};
    pthread_mutex_unlock(&g_mem.mu);
    return p;
}

static void sh_buffer_free(void *ctx, void *buf, size_t bytes)
{
    (void)ctx;
    (void)bytes;
    if (buf == NULL)
        return;
    pthread_mutex_lock(&g_mem.mu);
    for (int i = 0; i < g_mem.n; i++)
        if (g_mem.bufs[i].p == buf) {
            munmap(buf, g_mem.bufs[i].n);
            g_mem.bufs[i] = g_mem.bufs[--g_mem.n];
            if (g_mem.n == 0) {   /* nothing left: no allocation outlives the last buffer */
                free(g_mem.bufs);
                g_mem.bufs = NULL;
                g_mem.cap = 0;
            }
            pthread_mutex_unlock(&g_mem.mu);
            return;
        }
    fprintf(stderr, "shadow: buffer_free of %p, which is no buffer's start\n", buf);
    abort();
}

static void sh_copy_in(void *ctx, void *buf, size_t off, const void *src, size_t n)
{
    shadow *s = ctx;
    need(s, "copy_in", "buf", (uint8_t *)buf + off, n);
    memcpy((uint8_t *)buf + off, src, n);
    done(s);
}

static void sh_copy_out(void *ctx, const void *buf, size_t off, void *dst, size_t n)
{
    shadow *s = ctx;
    need(s, "copy_out", "buf", (const uint8_t *)buf + off, n);
    memcpy(dst, (const uint8_t *)buf + off, n);
    done(s);
}

static void sh_copy(void *ctx, void *dst, const void *src, size_t n)
{
    shadow *s = ctx;
    need(s, "copy", "dst", dst, n);
    need(s, "copy", "src", src, n);
    memmove(dst, src, n);
    done(s);
}

static size_t tensor_bytes(const kern_tensor *w)
{
    return (size_t)w->rows * w->row_bytes;
}

static void sh_matmul(void *ctx, const kern_tensor *w, const float *x, int n_tok, float *y,
                      int64_t ldy)
{
    shadow *s = ctx;
    if (n_tok <= 0)
        return;
    need(s, "matmul", "w", w->data, tensor_bytes(w));
    need(s, "matmul", "x", x, (size_t)n_tok * (size_t)w->cols * F);
    need(s, "matmul", "y", y, ((size_t)(n_tok - 1) * (size_t)ldy + (size_t)w->rows) * F);
    IN(s)->matmul(IN(s)->ctx, w, x, n_tok, y, ldy);
    done(s);
}

static void sh_get_rows(void *ctx, const kern_tensor *w, const int32_t *ids, int n, float *y)
{
    shadow *s = ctx;
    if (n <= 0)
        return;
    need(s, "get_rows", "w", w->data, tensor_bytes(w));
    need(s, "get_rows", "y", y, (size_t)n * (size_t)w->cols * F);
    IN(s)->get_rows(IN(s)->ctx, w, ids, n, y);
    done(s);
}

static void sh_rmsnorm(void *ctx, float *y, const float *x, const float *w, int64_t n, int n_tok,
                       float eps)
{
    shadow *s = ctx;
    need(s, "rmsnorm", "y", y, (size_t)n * (size_t)n_tok * F);
    need(s, "rmsnorm", "x", x, (size_t)n * (size_t)n_tok * F);
    need(s, "rmsnorm", "w", w, (size_t)n * F);
    IN(s)->rmsnorm(IN(s)->ctx, y, x, w, n, n_tok, eps);
    done(s);
}

static void sh_rope(void *ctx, float *x, const int32_t *pos, int n_tok, int n_head, int head_dim,
                    float theta_base, float freq_scale, const float *freq_factors, bool neox)
{
    shadow *s = ctx;
    need(s, "rope", "x", x, (size_t)n_tok * (size_t)n_head * (size_t)head_dim * F);
    if (freq_factors != NULL)
        need(s, "rope", "freq_factors", freq_factors, (size_t)(head_dim / 2) * F);
    IN(s)->rope(IN(s)->ctx, x, pos, n_tok, n_head, head_dim, theta_base, freq_scale,
                freq_factors, neox);
    done(s);
}

static void sh_swiglu(void *ctx, float *y, const float *gate, const float *up, size_t n)
{
    shadow *s = ctx;
    need(s, "swiglu", "y", y, n * F);
    need(s, "swiglu", "gate", gate, n * F);
    need(s, "swiglu", "up", up, n * F);
    IN(s)->swiglu(IN(s)->ctx, y, gate, up, n);
    done(s);
}

static void sh_add(void *ctx, float *y, const float *x, size_t n)
{
    shadow *s = ctx;
    need(s, "add", "y", y, n * F);
    need(s, "add", "x", x, n * F);
    IN(s)->add(IN(s)->ctx, y, x, n);
    done(s);
}

static void sh_add_row(void *ctx, float *y, const float *b, int64_t n, int n_tok)
{
    shadow *s = ctx;
    need(s, "add_row", "y", y, (size_t)n * (size_t)n_tok * F);
    need(s, "add_row", "b", b, (size_t)n * F);
    IN(s)->add_row(IN(s)->ctx, y, b, n, n_tok);
    done(s);
}

/* The pages of the sequences' block tables that their rows' positions use. */
static void need_pages(shadow *s, const char *entry, const kern_kv *kv, const kern_seq *seqs,
                       int n_seq, const int32_t *pos)
{
    for (int q = 0; q < n_seq; q++)
        for (int t = seqs[q].tok0; t < seqs[q].tok0 + seqs[q].n_tok; t++)
            for (int p = 0; p <= pos[t] / kv->page_tokens; p++)
                need(s, entry, "seqs[].pages[]", seqs[q].pages[p], 1);
}

/* Rows 0 .. (the sequences' last row) of arrays of row bytes each. */
static size_t seq_rows(const kern_seq *seqs, int n_seq)
{
    int rows = 0;
    for (int q = 0; q < n_seq; q++)
        if (seqs[q].n_tok > 0 && seqs[q].tok0 + seqs[q].n_tok > rows)
            rows = seqs[q].tok0 + seqs[q].n_tok;
    return (size_t)rows;
}

static void sh_kv_store(void *ctx, const kern_kv *kv, const kern_seq *seqs, int n_seq,
                        const float *k, const float *v, const int32_t *pos)
{
    shadow *s = ctx;
    size_t bytes = seq_rows(seqs, n_seq) * (size_t)kv->n_kv_head * (size_t)kv->head_dim * F;
    need(s, "kv_store", "k", k, bytes);
    need(s, "kv_store", "v", v, bytes);
    need_pages(s, "kv_store", kv, seqs, n_seq, pos);
    IN(s)->kv_store(IN(s)->ctx, kv, seqs, n_seq, k, v, pos);
    done(s);
}

static void sh_attention(void *ctx, const kern_attn *a)
{
    shadow *s = ctx;
    size_t n = (size_t)a->n_tok * (size_t)a->n_head * (size_t)a->kv.head_dim * F;
    need(s, "attention", "q", a->q, n);
    need(s, "attention", "out", a->out, n);
    need_pages(s, "attention", &a->kv, a->seqs, a->n_seq, a->pos);
    IN(s)->attention(IN(s)->ctx, a);
    done(s);
}

/* dense_new takes host weights (the backend keeps its own copies): nothing to check. */
static kern_dense *sh_dense_new(void *ctx, const float *w, const float *bias, int n, int k,
                                int precision)
{
    shadow *s = ctx;
    return IN(s)->dense_new(IN(s)->ctx, w, bias, n, k, precision);
}

static void sh_dense_free(void *ctx, kern_dense *d)
{
    shadow *s = ctx;
    IN(s)->dense_free(IN(s)->ctx, d);
}

static void sh_dense(void *ctx, const kern_dense *d, const float *x, int n_tok, float *y,
                     bool accumulate, bool gelu)
{
    shadow *s = ctx;
    need(s, "dense", "x", x, (size_t)n_tok * (size_t)d->k * F);
    need(s, "dense", "y", y, (size_t)n_tok * (size_t)d->n * F);
    IN(s)->dense(IN(s)->ctx, d, x, n_tok, y, accumulate, gelu);
    done(s);
}

static const char *sh_dense_kernels(void *ctx, const kern_dense *probe)
{
    shadow *s = ctx;
    return IN(s)->dense_kernels(IN(s)->ctx, probe);
}

static void sh_layernorm(void *ctx, float *x, const float *w, const float *b, int64_t n,
                         int n_tok, float eps)
{
    shadow *s = ctx;
    need(s, "layernorm", "x", x, (size_t)n * (size_t)n_tok * F);
    need(s, "layernorm", "w", w, (size_t)n * F);
    need(s, "layernorm", "b", b, (size_t)n * F);
    IN(s)->layernorm(IN(s)->ctx, x, w, b, n, n_tok, eps);
    done(s);
}

static void sh_gelu(void *ctx, float *x, size_t n)
{
    shadow *s = ctx;
    need(s, "gelu", "x", x, n * F);
    IN(s)->gelu(IN(s)->ctx, x, n);
    done(s);
}

static void sh_encoder_attention(void *ctx, const float *qkv, float *out, const int32_t *start,
                                 int n_seq, int n_head, int head_dim)
{
    shadow *s = ctx;
    size_t T = n_seq > 0 ? (size_t)(start[n_seq] - start[0]) : 0;
    size_t W = (size_t)n_head * (size_t)head_dim;
    if (T > 0) {
        need(s, "encoder_attention", "qkv", qkv + (size_t)start[0] * 3 * W, T * 3 * W * F);
        need(s, "encoder_attention", "out", out + (size_t)start[0] * W, T * W * F);
    }
    IN(s)->encoder_attention(IN(s)->ctx, qkv, out, start, n_seq, n_head, head_dim);
    done(s);
}

static void sh_set_spin(void *ctx, uint64_t ns)
{
    shadow *s = ctx;
    IN(s)->set_spin(IN(s)->ctx, ns);
}

kern_backend *kern_shadow_new(int n_threads)
{
    shadow *s = calloc(1, sizeof *s);
    if (s == NULL)
        return NULL;
    if ((s->in = kern_cpu_backend_new(n_threads)) == NULL) {
        free(s);
        return NULL;
    }
    s->be = (kern_backend){
        .name = "shadow",
        .ctx = s,
        .n_threads = sh_n_threads,
        .kernels = sh_kernels,
        .supports_type = sh_supports_type,
        .reserve = sh_reserve,
        .destroy = sh_destroy,
        .buffer_alloc = sh_buffer_alloc,
        .buffer_free = sh_buffer_free,
        .buffer_copy_in = sh_copy_in,
        .buffer_copy_out = sh_copy_out,
        .copy = sh_copy,
        .host_memory = false,
        .matmul = sh_matmul,
        .get_rows = sh_get_rows,
        .rmsnorm = sh_rmsnorm,
        .rope = sh_rope,
        .swiglu = sh_swiglu,
        .add = sh_add,
        .add_row = sh_add_row,
        .kv_store = sh_kv_store,
        .attention = sh_attention,
        .dense_new = sh_dense_new,
        .dense_free = sh_dense_free,
        .dense = sh_dense,
        .dense_kernels = sh_dense_kernels,
        .layernorm = sh_layernorm,
        .gelu = sh_gelu,
        .encoder_attention = sh_encoder_attention,
        .set_spin = sh_set_spin,
    };
    return &s->be;
}
