/* kernels/cpu/backend.c: the CPU kern_backend: construction, reserve() and the matmul; the other
 * ops live in ops.c and attention.c.
 *
 * matmul quantizes x once per call into reserved scratch (in parallel for large batches), then
 * splits the weight rows over the pool. One token (decode) streams each thread's rows through
 * the type's matrix-vector kernel. Several tokens take a block of rows at a time against every
 * token, so each weight row comes from memory once per call: through the type's tile kernel when
 * it has one (it repacks the block into scratch and runs a register-blocked product), otherwise
 * through the matrix-vector kernel, token after token, while the block sits in L1. */
#include "kernels/cpu/internal.h"

#include "common/err.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* Rows per unit of work when several tokens go through the matrix-vector kernel: small enough to
 * stay in L1 while every token passes over them. */
#define MV_BLOCK_ROWS 16

static const uint32_t all_types[] = {KERN_TYPE_F32, KERN_TYPE_F16, KERN_TYPE_BF16,
                                     KERN_TYPE_Q4_0, KERN_TYPE_Q4_1, KERN_TYPE_Q8_0,
                                     KERN_TYPE_Q4_K, KERN_TYPE_Q6_K};

static void *xalloc(size_t n)
{
    return aligned_alloc(64, (n + 63) / 64 * 64);
}

/* ---- matmul ---------------------------------------------------------------------------------- */

typedef struct mm_job {
    kern_cpu *c;
    const kern_wops *ops;
    const kern_tensor *w;
    const float *x;
    void (*quantize)(const float *x, void *act, int64_t n);
    const uint8_t *act;
    size_t a_stride;
    int n_tok;
    float *y;
    int64_t ldy;
    long unit_rows, units;
} mm_job;

static void mv_rows(const kern_wops *o, int64_t n, const uint8_t *w, size_t rb, int nr,
                    const void *act, float *y)
{
    if (o->mv != NULL) {
        o->mv(n, w, rb, nr, act, y);
        return;
    }
    for (int r = 0; r < nr; r++)
        o->pub.dot(n, w + (size_t)r * rb, act, &y[r]);
}

static void quantize_run(void *arg, int ith, int nth)
{
    mm_job *j = arg;
    long lo, hi;
    util_pool_split(j->n_tok, ith, nth, &lo, &hi);
    for (long t = lo; t < hi; t++)
        j->quantize(j->x + t * j->w->cols, (uint8_t *)j->act + (size_t)t * j->a_stride,
                    j->w->cols);
}

/* One token: each thread takes a contiguous share of the rows and streams it. */
static void mm_decode_run(void *arg, int ith, int nth)
{
    mm_job *j = arg;
    long lo, hi;
    util_pool_split(j->units, ith, nth, &lo, &hi);
    long r0 = lo * j->unit_rows, r1 = hi * j->unit_rows;
    if (r1 > j->w->rows)
        r1 = j->w->rows;
    if (r0 < r1)
        mv_rows(j->ops, j->w->cols, (const uint8_t *)j->w->data + (size_t)r0 * j->w->row_bytes,
                j->w->row_bytes, (int)(r1 - r0), j->act, j->y + r0);
}

/* The next row block thread ith computes: from the front of its own contiguous share, then,
 * when that is done, from the fronts of the others' (a thread the VM slowed is helped). -1
 * when none is left. Each thread streams one run of weights that way, which the hardware
 * prefetchers follow; blocks claimed in turn from one counter interleaved the threads, and
 * each thread's stream broke every block. Zen 3, 2 threads: 7 tokens against a 1536 x 576
 * F16 matrix from memory (a standalone harness alternating the two, medians of 60) 134 us
 * against 172, 576 x 1536 180 against 188; the 7-token matmuls of SmolLM2-135M F16 forwards
 * (llmgw-bench -p 7 --all-logits, the two alternating forward by forward in one process, 40
 * forwards, 3 runs) 8-11 % less time. */
static long claim_block(kern_share *sh, int ith, int nth)
{
    for (int k = 0; k < nth; k++) {
        kern_share *s = &sh[(ith + k) % nth];
        if (atomic_load_explicit(&s->next, memory_order_relaxed) >= s->end)
            continue;
        long u = atomic_fetch_add_explicit(&s->next, 1, memory_order_relaxed);
        if (u < s->end)
            return u;
    }
    return -1;
}

/* Several tokens (or a KERN_LAYOUT_X8 copy, for any count): blocks of rows, claimed by
 * claim_block. */
static void mm_batch_run(void *arg, int ith, int nth)
{
    mm_job *j = arg;
    const kern_tensor *w = j->w;
    void *scratch = j->c->scratch + (size_t)ith * j->c->scratch_stride;
    for (;;) {
        long u = claim_block(j->c->share, ith, nth);
        if (u < 0)
            break;
        long r0 = u * j->unit_rows;
        int nr = (int)(w->rows - r0 < j->unit_rows ? w->rows - r0 : j->unit_rows);
        const uint8_t *wr = (const uint8_t *)w->data + (size_t)r0 * w->row_bytes;
        if (w->layout == KERN_LAYOUT_X8) {   /* whole groups of eight: unit_rows is 16 */
            j->ops->x8(w->cols, wr, nr, j->act, j->a_stride, j->n_tok, j->y + r0, j->ldy);
            continue;
        }
        if (j->ops->tile != NULL && j->n_tok >= j->ops->tile_min_tok) {
            j->ops->tile(w->cols, wr, w->row_bytes, nr, j->act, j->a_stride, j->n_tok, j->y + r0,
                         j->ldy, scratch);
            continue;
        }
        if (j->ops->dotn != NULL) {
            for (int r = 0; r < nr; r++)
                for (int t = 0; t < j->n_tok; t += KERN_DOTN_MAX) {
                    int nt = j->n_tok - t < KERN_DOTN_MAX ? j->n_tok - t : KERN_DOTN_MAX;
                    j->ops->dotn(w->cols, wr + (size_t)r * w->row_bytes,
                                 j->act + (size_t)t * j->a_stride, j->a_stride, nt,
                                 j->y + (size_t)t * (size_t)j->ldy + r0 + r, j->ldy);
                }
            continue;
        }
        for (int t = 0; t < j->n_tok; t++)
            mv_rows(j->ops, w->cols, wr, w->row_bytes, nr, j->act + (size_t)t * j->a_stride,
                    j->y + (size_t)t * (size_t)j->ldy + r0);
    }
}

static void cpu_matmul(void *ctx, const kern_tensor *w, const float *x, int n_tok, float *y,
                       int64_t ldy)
{
    kern_cpu *c = ctx;
    const kern_wops *o = kern__wops_get(w->type);
    if (n_tok <= 0 || w->rows <= 0)
        return;
    if (n_tok > c->max_tok || w->cols > c->max_cols) {
        fprintf(stderr, "kern matmul: %d tokens x %lld columns beyond reserve(%d, %lld)\n",
                n_tok, (long long)w->cols, c->max_tok, (long long)c->max_cols);
        abort();
    }
    mm_job j = {.c = c, .ops = o, .w = w, .x = x, .n_tok = n_tok, .y = y, .ldy = ldy};
    bool x8 = w->layout == KERN_LAYOUT_X8;   /* a draft copy: its own kernel, any token count */
    bool tile = !x8 && o->tile != NULL && n_tok >= o->tile_min_tok;
    if (tile) {
        j.quantize = o->tile_quantize;
        j.a_stride = o->tile_act_bytes(w->cols);
    } else if (x8 || o->pub.type != KERN_TYPE_F32) {  /* F16/BF16 round their f32 activations */
        j.quantize = o->pub.quantize_act;
        j.a_stride = o->pub.act_row_bytes(w->cols);
    }
    if (j.quantize != NULL) {
        j.act = c->act;
        if (c->nth > 1 && n_tok >= 8)
            util_pool_run(c->pool, quantize_run, &j);
        else
            quantize_run(&j, 0, 1);
    } else {
        j.act = (const uint8_t *)x;          /* f32 activations are used in place */
        j.a_stride = (size_t)w->cols * sizeof(float);
    }
    if (n_tok == 1 && !tile && !x8) {
        j.unit_rows = 4;
        j.units = (long)((w->rows + j.unit_rows - 1) / j.unit_rows);
        if (c->nth > 1 && j.units > 1)
            util_pool_run(c->pool, mm_decode_run, &j);
        else
            mm_decode_run(&j, 0, 1);
        return;
    }
    /* X8: two whole groups of eight a block */
    j.unit_rows = x8 ? 16 : tile ? o->tile_rows : MV_BLOCK_ROWS;
    j.units = (long)((w->rows + j.unit_rows - 1) / j.unit_rows);
    /* Each thread's contiguous share of the blocks (claim_block) */
    int nth = c->nth > 1 && j.units > 1 ? c->nth : 1;
    for (int i = 0; i < nth; i++) {
        long lo, hi;
        util_pool_split(j.units, i, nth, &lo, &hi);
        atomic_store_explicit(&c->share[i].next, lo, memory_order_relaxed);
        c->share[i].end = hi;
    }
    if (nth > 1)
        util_pool_run(c->pool, mm_batch_run, &j);
    else
        mm_batch_run(&j, 0, 1);
}

/* ---- repack (backend.h) ---------------------------------------------------------------------- */

/* Q4_1 into KERN_LAYOUT_X8 (other types have no draft layout here). Not under
 * LLMGW_KERNELS=exact (llama.cpp's results). Narrowing a Q8_0 output matrix to Q4_1 as well
 * was measured and left out: SmolLM2-135M's drafter step 0.25 ms (6 %) shorter, but its greedy
 * drafts accepted 86 % of the time instead of 96 % (bench/speculative, MMLU prompts). */
static bool cpu_repack(void *ctx, const kern_tensor *w, kern_tensor *out)
{
    (void)ctx;
    const kern_wops *o = kern__wops_get(KERN_TYPE_Q4_1);
    if (kern__exact() || w->layout != KERN_LAYOUT_ROWS || w->type != KERN_TYPE_Q4_1 ||
        o == NULL || o->x8 == NULL || w->rows <= 0)
        return false;
    size_t rb = kern_type_row_bytes(KERN_TYPE_Q4_1, (uint64_t)w->cols);
    void *data = xalloc((size_t)((w->rows + 7) / 8 * 8) * rb);
    if (data == NULL)
        return false;
    kern__repack_q4_1x8(w->data, w->row_bytes, w->rows, w->cols, data);
    *out = (kern_tensor){.type = KERN_TYPE_Q4_1, .rows = w->rows, .cols = w->cols,
                         .row_bytes = rb, .data = data, .layout = KERN_LAYOUT_X8};
    return true;
}

static void cpu_repack_free(void *ctx, kern_tensor *t)
{
    (void)ctx;
    if (t != NULL && t->layout == KERN_LAYOUT_X8) {
        free((void *)t->data);
        t->data = NULL;
    }
}

/* ---- construction ---------------------------------------------------------------------------- */

static int cpu_n_threads(void *ctx)
{
    return ((kern_cpu *)ctx)->nth;
}

static int cpu_reserve(void *ctx, int max_tok, int64_t max_cols, int max_ctx)
{
    kern_cpu *c = ctx;
    if (max_tok < 1)
        max_tok = 1;
    if (max_cols < 256)
        max_cols = 256;
    if (max_ctx < 1)
        max_ctx = 1;
    if (max_tok <= c->max_tok && max_cols <= c->max_cols && max_ctx <= c->max_ctx)
        return 0;
    max_tok = max_tok > c->max_tok ? max_tok : c->max_tok;
    max_cols = max_cols > c->max_cols ? max_cols : c->max_cols;
    max_ctx = max_ctx > c->max_ctx ? max_ctx : c->max_ctx;
    int64_t cols = (max_cols + 255) / 256 * 256;
    size_t act_row = 0, scratch = kern__attention_scratch(max_ctx, cols);
    for (size_t i = 0; i < sizeof all_types / sizeof all_types[0]; i++) {
        const kern_wops *o = kern__wops_get(all_types[i]);
        if (o->pub.type != KERN_TYPE_F32 && o->pub.act_row_bytes(cols) > act_row)
            act_row = o->pub.act_row_bytes(cols);
        if (o->tile != NULL) {
            if (o->tile_quantize != NULL && o->tile_act_bytes(cols) > act_row)
                act_row = o->tile_act_bytes(cols);
            if (o->tile_scratch(cols) > scratch)
                scratch = o->tile_scratch(cols);
        }
    }
    scratch = (scratch + 63) / 64 * 64;
    uint8_t *act = xalloc(act_row * (size_t)max_tok);
    uint8_t *scr = xalloc(scratch * (size_t)c->nth);
    float *cs = xalloc((size_t)max_tok * (size_t)cols * sizeof(float));
    int32_t *pos = xalloc((size_t)max_tok * sizeof(int32_t));
    float *ff = xalloc((size_t)(cols / 2) * sizeof(float));
    if (act == NULL || scr == NULL || cs == NULL || pos == NULL || ff == NULL) {
        free(act);
        free(scr);
        free(cs);
        free(pos);
        free(ff);
        return LLMGW_ENOMEM;
    }
    free(c->act);
    free(c->scratch);
    free(c->rope_cs);
    free(c->rope_pos);
    free(c->rope_ff);
    c->act = act;
    c->act_bytes = act_row * (size_t)max_tok;
    c->scratch = scr;
    c->scratch_stride = scratch;
    c->rope_cs = cs;
    c->rope_pos = pos;
    c->rope_ff = ff;
    c->rope_n = 0;
    c->max_tok = max_tok;
    c->max_cols = cols;
    c->max_ctx = max_ctx;
    return 0;
}

static const char *cpu_kernels(void *ctx)
{
    (void)ctx;
    return kern_wtype_variant();
}

static bool cpu_supports_type(void *ctx, uint32_t type)
{
    (void)ctx;
    return kern_wtype_get(type) != NULL;
}

/* Buffers are anonymous mappings: reserved, not committed, until written. */
static void *cpu_buffer_alloc(void *ctx, size_t bytes)
{
    (void)ctx;
    if (bytes == 0)
        return NULL;
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS |
                   MAP_NORESERVE, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

static void cpu_buffer_free(void *ctx, void *buf, size_t bytes)
{
    (void)ctx;
    if (buf != NULL)
        munmap(buf, bytes);
}

static void cpu_buffer_copy_in(void *ctx, void *buf, size_t off, const void *src, size_t n)
{
    (void)ctx;
    memcpy((uint8_t *)buf + off, src, n);
}

static void cpu_buffer_copy_out(void *ctx, const void *buf, size_t off, void *dst, size_t n)
{
    (void)ctx;
    memcpy(dst, (const uint8_t *)buf + off, n);
}

static void cpu_copy(void *ctx, void *dst, const void *src, size_t n)
{
    (void)ctx;
    memmove(dst, src, n);
}

static void cpu_destroy(void *ctx)
{
    kern_cpu *c = ctx;
    if (c == NULL)
        return;
    util_pool_free(c->pool);
    free(c->share);
    free(c->act);
    free(c->scratch);
    free(c->rope_cs);
    free(c->rope_pos);
    free(c->rope_ff);
    free(c->enc_xb);
    free(c->enc_scores);
    free(c);
}

kern_backend *kern_cpu_backend_new(int n_threads)
{
    if (n_threads <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = n > 0 ? (int)n : 1;
    }
    kern_cpu *c = calloc(1, sizeof *c);
    if (c == NULL)
        return NULL;
    if (util_pool_new(&c->pool, n_threads) != 0) {
        free(c);
        return NULL;
    }
    c->nth = n_threads;
    c->share = aligned_alloc(64, (size_t)n_threads * sizeof *c->share);
    if (c->share == NULL) {
        util_pool_free(c->pool);
        free(c);
        return NULL;
    }
    c->v = kern__vops_get();
    c->be = (kern_backend){
        .name = "cpu",
        .ctx = c,
        .n_threads = cpu_n_threads,
        .kernels = cpu_kernels,
        .supports_type = cpu_supports_type,
        .reserve = cpu_reserve,
        .destroy = cpu_destroy,
        .buffer_alloc = cpu_buffer_alloc,
        .buffer_free = cpu_buffer_free,
        .buffer_copy_in = cpu_buffer_copy_in,
        .buffer_copy_out = cpu_buffer_copy_out,
        .copy = cpu_copy,
        .host_memory = true,
        .repack = cpu_repack,
        .repack_free = cpu_repack_free,
        .matmul = cpu_matmul,
        .get_rows = kern__op_get_rows,
        .rmsnorm = kern__op_rmsnorm,
        .rope = kern__op_rope,
        .swiglu = kern__op_swiglu,
        .add = kern__op_add,
        .add_row = kern__op_add_row,
        .kv_store = kern__op_kv_store,
        .attention = kern__op_attention,
        .dense_new = kern__enc_dense_new,
        .dense_free = kern__enc_dense_free,
        .dense = kern__enc_dense,
        .dense_kernels = kern__enc_dense_kernels,
        .layernorm = kern__enc_layernorm,
        .gelu = kern__enc_gelu,
        .encoder_attention = kern__enc_attention,
        .set_spin = kern__enc_set_spin,
    };
    c->enc_ref = strcmp(kern_wtype_variant(), "ref") == 0;
    return &c->be;
}
