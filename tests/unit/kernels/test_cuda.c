/* tests/unit/kernels/test_cuda.c: the CUDA kern_backend against the CPU backend (itself tested
 * against naive formulas in test_backend.c) on the same random data: matmul for every weight
 * type through each of its paths (the matrix-vector kernels up to 8 tokens, for quantized
 * weights the small-batch kernel up to 64, cuBLAS beyond) at odd shapes and SmolLM2's
 * 576/1536, with an ldy wider than the rows, quantized weights up to 64 tokens in int8 (against
 * activations rounded as those paths round them; NaN and infinity kept) and in floats
 * (LLMGW_CUDA_QUANT=f32, and weights placed where the int8 loads cannot go);
 * get_rows; RMSNorm; RoPE (llama and neox pairs, Llama-3.1 factors); SwiGLU and the adds; K/V
 * stores and paged attention through a shuffled block table for f16 and every int8 layout (per
 * head, per 32 channels, rotated), prefill, a later prefill chunk and decode (through both
 * kernels: tiled, and per query with LLMGW_CUDA_ATTN=query);
 * the encoder's dense (f32 and TF32, residual, GELU), LayerNorm, GELU and attention over uneven
 * sequences; buffers and placement;
 * steps recorded as CUDA graphs against the same steps run as called. Where the machine has no
 * CUDA device (or the build no CUDA backend) it exits 77, which ctest reports as skipped, not
 * passed. */
#include "kernels/backend.h"
#include "kernels/device.h"
#include "kernels/convert.h"
#ifdef LLMGW_HAVE_CUDA
#include "kernels/cuda/cuda.h"
#endif

#include "tests/unit/unit.h"

#include <stdlib.h>

/* g_gpu_f32: LLMGW_CUDA_QUANT=f32, dequantization tiles of 1 MiB (LLMGW_CUDA_DEQUANT_MIB) and
 * attention by the per-query kernel only (LLMGW_CUDA_ATTN=query) */
static kern_backend *g_cpu, *g_gpu, *g_gpu_f32;

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rnd(void)
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static float *randv(size_t n, float scale)
{
    float *x = malloc((n > 0 ? n : 1) * sizeof *x);
    for (size_t i = 0; i < n; i++)
        x[i] = ((float)((double)(rnd() >> 11) / (double)(1ull << 52)) - 1.0f) * scale;
    return x;
}

/* A device copy of host bytes. */
static void *put(const void *host, size_t n)
{
    void *d = g_gpu->buffer_alloc(g_gpu->ctx, n);
    assert_non_null(d);
    g_gpu->buffer_copy_in(g_gpu->ctx, d, 0, host, n);
    return d;
}

static void get(const void *dev, void *host, size_t n)
{
    g_gpu->buffer_copy_out(g_gpu->ctx, dev, 0, host, n);
}

static void drop(void *dev, size_t n)
{
    g_gpu->buffer_free(g_gpu->ctx, dev, n);
}

/* rows x cols of wf in type (row_bytes each), in a malloc'd buffer with extra zero bytes after. */
static uint8_t *to_type(uint32_t type, const float *wf, int64_t rows, int64_t cols, size_t extra)
{
    size_t rb = kern_type_row_bytes(type, (uint64_t)cols);
    assert_true(rb > 0);
    uint8_t *w = calloc((size_t)rows * rb + extra, 1);
    assert_non_null(w);
    for (int64_t r = 0; r < rows; r++)
        assert_int_equal(kern_type_from_f32(type, wf + r * cols, w + (size_t)r * rb, cols), 0);
    return w;
}

/* Every got[i] within abs + rel * |want[i]| of want[i]. */
static void near(const char *what, const float *got, const float *want, size_t n, double abs_tol,
                 double rel)
{
    for (size_t i = 0; i < n; i++)
        if (!(fabs((double)got[i] - want[i]) <= abs_tol + rel * fabs((double)want[i]))) {
            print_error("%s [%zu] = %.7g, the CPU gives %.7g\n", what, i, got[i], want[i]);
            fail();
        }
}

/* ---- matmul and get_rows --------------------------------------------------------------------- */

static const uint32_t types[] = {KERN_TYPE_F32, KERN_TYPE_F16, KERN_TYPE_BF16, KERN_TYPE_Q4_0,
                                 KERN_TYPE_Q4_1, KERN_TYPE_Q8_0, KERN_TYPE_Q4_K, KERN_TYPE_Q6_K};

/* x rounded as the int8 products take it: blocks of 32, d = max|x| / 127, round(x / d) d. */
static void round_q8(float *x, size_t n)
{
    for (size_t b = 0; b < n; b += 32) {
        float amax = 0.0f;
        for (size_t i = b; i < b + 32; i++)
            amax = fmaxf(amax, fabsf(x[i]));
        float d = amax / 127.0f;
        for (size_t i = b; i < b + 32; i++)
            x[i] = amax == 0.0f ? 0.0f : roundf(x[i] / d) * d;
    }
}

/* y = W x on backend b against the product in double of the weights' own values with x, or
 * with x rounded as the int8 products take it (rounded); the weights placed misalign bytes
 * past an allocation's start. */
static void check_matmul_on(kern_backend *b, bool rounded, size_t misalign, uint32_t type,
                            int64_t rows, int64_t cols, int n_tok)
{
    size_t rb = kern_type_row_bytes(type, (uint64_t)cols);
    float *wf = randv((size_t)rows * (size_t)cols, 1.0f);
    uint8_t *w = to_type(type, wf, rows, cols, misalign);
    /* the weights' own values, for the reference */
    for (int64_t r = 0; r < rows; r++)
        assert_int_equal(kern_type_to_f32(type, w + (size_t)r * rb, wf + r * cols, cols), 0);
    memmove(w + misalign, w, (size_t)rows * rb);   /* the host's blocks need their alignment */
    float *x = randv((size_t)n_tok * (size_t)cols, 1.0f);
    if (n_tok > 1)   /* a block of zeros: scale 0 */
        memset(x + cols, 0, 32 * sizeof *x);
    int64_t ldy = rows + 5;
    size_t yn = (size_t)n_tok * (size_t)ldy;
    float *y = malloc(yn * sizeof *y);
    for (size_t i = 0; i < yn; i++)
        y[i] = 12345.0f;   /* the gaps between rows stay untouched */
    uint8_t *dw = put(w, misalign + (size_t)rows * rb);
    kern_tensor tw = {.type = type, .rows = rows, .cols = cols, .row_bytes = rb,
                      .data = dw + misalign};
    float *dx = put(x, (size_t)n_tok * (size_t)cols * sizeof *x), *dy = put(y, yn * sizeof *y);
    b->matmul(b->ctx, &tw, dx, n_tok, dy, ldy);
    get(dy, y, yn * sizeof *y);
    if (rounded)
        round_q8(x, (size_t)n_tok * (size_t)cols);
    /* Within the rounding of the sums, against activations as the path takes them: F32
     * weights, and quantized ones in int8 (rounded: up to 64 tokens) or in f32 (up to 8), in
     * f32 sums; F16 and BF16 weights take activations rounded to their type at every batch
     * size (as the CPU does: 2^-11, 2^-8 relative); quantized weights otherwise go through
     * cuBLAS on f16 activations. */
    double tol = type == KERN_TYPE_F32 ? 1e-5 : type == KERN_TYPE_F16 ? 1e-3
               : type == KERN_TYPE_BF16 ? 8e-3 : rounded || n_tok <= 8 ? 1e-5 : 1e-3;
    for (int t = 0; t < n_tok; t++)
        for (int64_t r = 0; r < ldy; r++) {
            float got = y[(size_t)t * (size_t)ldy + (size_t)r];
            if (r >= rows) {
                assert_true(got == 12345.0f);
                continue;
            }
            double want = 0, mag = 0;
            for (int64_t c = 0; c < cols; c++) {
                double p = (double)wf[r * cols + c] * x[(size_t)t * (size_t)cols + (size_t)c];
                want += p;
                mag += fabs(p);
            }
            if (!(fabs(got - want) <= tol * mag + 1e-5)) {
                print_error("matmul %s %lldx%lld, %d tokens%s: y[%d][%lld] = %.7g, want %.7g\n",
                            kern_type_name(type), (long long)rows, (long long)cols, n_tok,
                            rounded ? " (int8 activations)" : "", t, (long long)r, got, want);
                fail();
            }
        }
    drop(dw, misalign + (size_t)rows * rb);
    drop(dx, (size_t)n_tok * (size_t)cols * sizeof *x);
    drop(dy, yn * sizeof *y);
    free(wf);
    free(w);
    free(x);
    free(y);
}

static bool quantized(uint32_t type)
{
    return kern_type_get(type)->block_elems > 1;
}

/* On the default backend: quantized weights up to 64 tokens (the matrix-vector kernels up to 8,
 * the small-batch one beyond) multiply int8-rounded activations. */
static void check_matmul(uint32_t type, int64_t rows, int64_t cols, int n_tok)
{
    check_matmul_on(g_gpu, quantized(type) && n_tok <= 64, 0, type, rows, cols, n_tok);
}

static void matmul_every_type_both_paths(void **state)
{
    (void)state;
    /* 9 and 17: the small-batch kernel's two token counts, partly filled; 33 and 64: two
     * blocks of 32 tokens; 65: cuBLAS */
    static const int toks[] = {1, 2, 3, 8, 9, 17, 33, 64, 65};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        uint32_t t = types[i];
        const kern_type_traits *tr = kern_type_get(t);
        for (size_t j = 0; j < sizeof toks / sizeof toks[0]; j++) {
            check_matmul(t, 67, tr->block_elems == 256 ? 512 : 576, toks[j]);
            check_matmul(t, 96, 1536, toks[j]);
            if (tr->block_elems == 1)   /* float rows need not be whole chunks of 32 */
                check_matmul(t, 13, 45, toks[j]);
        }
    }
    /* rows enough for the small-batch kernel's blocks of 8 warps; 2 chunks, fewer than a step */
    check_matmul(KERN_TYPE_Q4_0, 16389, 64, 17);
}

/* Quantized weights in floats instead (f32 up to 8 tokens, cuBLAS beyond): on a backend opened
 * with LLMGW_CUDA_QUANT=f32, and on the default one for weights at an odd address (the int8
 * kernels' loads need 2, 4 or 16-byte alignment): both take the activations unrounded. */
static void matmul_quantized_f32_path(void **state)
{
    (void)state;
    static const int toks[] = {1, 3, 8, 9, 33};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        uint32_t t = types[i];
        if (!quantized(t))
            continue;
        int64_t cols = kern_type_get(t)->block_elems == 256 ? 512 : 576;
        for (size_t j = 0; j < sizeof toks / sizeof toks[0]; j++) {
            check_matmul_on(g_gpu_f32, false, 0, t, 67, cols, toks[j]);
            check_matmul_on(g_gpu, false, 1, t, 67, cols, toks[j]);
        }
    }
    /* cuBLAS a tile of rows at a time: 8192 rows of 64 columns fill 1 MiB, so three tiles */
    check_matmul_on(g_gpu_f32, false, 0, KERN_TYPE_Q4_0, 16389, 64, 17);
}

/* An activation that is NaN or infinite makes its token's int8 products NaN (the rounding's
 * scale would hide it), not the other tokens': through the matrix-vector kernel (3 tokens) and
 * the small-batch one (12). */
static void matmul_int8_nonfinite(void **state)
{
    (void)state;
    const int64_t rows = 8, cols = 256;
    size_t rb = kern_type_row_bytes(KERN_TYPE_Q4_K, (uint64_t)cols);
    float *wf = randv((size_t)rows * (size_t)cols, 1.0f);
    uint8_t *w = to_type(KERN_TYPE_Q4_K, wf, rows, cols, 0);
    kern_tensor tw = {.type = KERN_TYPE_Q4_K, .rows = rows, .cols = cols, .row_bytes = rb,
                      .data = put(w, (size_t)rows * rb)};
    static const int toks[] = {3, 12};
    for (size_t i = 0; i < sizeof toks / sizeof toks[0]; i++) {
        int n_tok = toks[i];
        float *x = randv((size_t)n_tok * (size_t)cols, 1.0f), y[12 * 8];
        x[40] = NAN;
        x[2 * cols + 200] = INFINITY;
        float *dx = put(x, sizeof(float) * (size_t)n_tok * (size_t)cols), *dy = put(y, sizeof y);
        g_gpu->matmul(g_gpu->ctx, &tw, dx, n_tok, dy, rows);
        get(dy, y, sizeof y);
        for (int t = 0; t < n_tok; t++)
            for (int r = 0; r < rows; r++)
                assert_true(t == 0 || t == 2 ? isnan(y[t * rows + r]) : isfinite(y[t * rows + r]));
        drop(dx, sizeof(float) * (size_t)n_tok * (size_t)cols);
        drop(dy, sizeof y);
        free(x);
    }
    drop((void *)tw.data, (size_t)rows * rb);
    free(wf);
    free(w);
}

/* Products of the same rows in a row share their int8 rounding (kern_cuda.q8_held): each
 * gives what it gives alone, bit for bit; after another call writes the rows (add), or a
 * product writes into them, the next product sees the new values. At 3 tokens (mmvq) and 12
 * (mmq). */
static void matmul_rounding_held(void **state)
{
    (void)state;
    const int64_t rows = 64, cols = 256;
    size_t rb = kern_type_row_bytes(KERN_TYPE_Q4_K, (uint64_t)cols);
    kern_tensor tw[2];
    uint8_t *wq[2];
    float *wf[2];
    for (int i = 0; i < 2; i++) {
        wf[i] = randv((size_t)rows * (size_t)cols, 1.0f);
        wq[i] = to_type(KERN_TYPE_Q4_K, wf[i], rows, cols, 0);
        tw[i] = (kern_tensor){.type = KERN_TYPE_Q4_K, .rows = rows, .cols = cols,
                              .row_bytes = rb, .data = put(wq[i], (size_t)rows * rb)};
    }
    static const int toks[] = {3, 12};
    for (size_t ti = 0; ti < sizeof toks / sizeof toks[0]; ti++) {
        int T = toks[ti];
        size_t xn = (size_t)T * (size_t)cols, yn = (size_t)T * (size_t)rows;
        float *x = randv(xn, 1.0f), *x2 = randv(xn, 1.0f);
        float *dx = put(x, xn * 4), *dd = put(x2, xn * 4), *dy = put(x, xn * 4);
        float *alone[2], *got = malloc(yn * 4), *changed = malloc(yn * 4);
        for (int i = 0; i < 2; i++) {   /* each product alone: another call before it */
            alone[i] = malloc(yn * 4);
            g_gpu->add(g_gpu->ctx, dy, dy, 0);
            g_gpu->matmul(g_gpu->ctx, &tw[i], dx, T, dy, rows);
            get(dy, alone[i], yn * 4);
        }
        g_gpu->matmul(g_gpu->ctx, &tw[0], dx, T, dy, rows);   /* in a row: the second holds */
        g_gpu->matmul(g_gpu->ctx, &tw[1], dx, T, dy + yn, rows);
        get(dy + yn, got, yn * 4);
        assert_memory_equal(got, alone[1], yn * 4);
        g_gpu->add(g_gpu->ctx, dx, dd, xn);   /* x changed by another call */
        g_gpu->matmul(g_gpu->ctx, &tw[1], dx, T, dy, rows);
        get(dy, changed, yn * 4);
        assert_memory_not_equal(changed, alone[1], yn * 4);
        g_gpu->add(g_gpu->ctx, dd, dx, 0);   /* x + x2, rounded alone */
        g_gpu->matmul(g_gpu->ctx, &tw[1], dx, T, dy, rows);
        get(dy, got, yn * 4);
        assert_memory_equal(got, changed, yn * 4);
        /* a product writing into x's rows: the next one rounds them anew */
        g_gpu->matmul(g_gpu->ctx, &tw[0], dx, T, dx, cols);   /* x's first rows columns */
        g_gpu->matmul(g_gpu->ctx, &tw[1], dx, T, dy, rows);
        get(dy, got, yn * 4);
        float *xr = malloc(xn * 4);
        get(dx, xr, xn * 4);
        float *dx2 = put(xr, xn * 4);
        g_gpu->matmul(g_gpu->ctx, &tw[1], dx2, T, dy, rows);
        get(dy, changed, yn * 4);
        assert_memory_equal(got, changed, yn * 4);
        drop(dx2, xn * 4);
        drop(dx, xn * 4);
        drop(dd, xn * 4);
        drop(dy, xn * 4);
        for (int i = 0; i < 2; i++)
            free(alone[i]);
        free(xr);
        free(x);
        free(x2);
        free(got);
        free(changed);
    }
    for (int i = 0; i < 2; i++) {
        drop((void *)tw[i].data, (size_t)rows * rb);
        free(wf[i]);
        free(wq[i]);
    }
}

static void get_rows_every_type(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        uint32_t type = types[i];
        int64_t rows = 50, cols = kern_type_get(type)->block_elems == 256 ? 768 : 576;
        size_t rb = kern_type_row_bytes(type, (uint64_t)cols);
        float *wf = randv((size_t)rows * (size_t)cols, 2.0f);
        uint8_t *w = to_type(type, wf, rows, cols, 0);
        int32_t ids[] = {3, 0, 49, 3, 17};
        int n = 5;
        kern_tensor cw = {.type = type, .rows = rows, .cols = cols, .row_bytes = rb, .data = w};
        kern_tensor gw = cw;
        gw.data = put(w, (size_t)rows * rb);
        float *want = malloc((size_t)n * (size_t)cols * sizeof *want);
        float *got = malloc((size_t)n * (size_t)cols * sizeof *got);
        g_cpu->get_rows(g_cpu->ctx, &cw, ids, n, want);
        float *dy = g_gpu->buffer_alloc(g_gpu->ctx, (size_t)n * (size_t)cols * sizeof *got);
        g_gpu->get_rows(g_gpu->ctx, &gw, ids, n, dy);
        get(dy, got, (size_t)n * (size_t)cols * sizeof *got);
        near(kern_type_name(type), got, want, (size_t)n * (size_t)cols, 1e-6, 1e-6);
        drop(dy, (size_t)n * (size_t)cols * sizeof *got);
        drop((void *)gw.data, (size_t)rows * rb);
        free(wf);
        free(w);
        free(want);
        free(got);
    }
}

/* ---- the decoder's other ops ----------------------------------------------------------------- */

static void norms_rope_elementwise(void **state)
{
    (void)state;
    const int T = 7;
    const int64_t E = 576;
    size_t n = (size_t)T * (size_t)E, bytes = n * sizeof(float);
    float *x = randv(n, 3.0f), *w = randv((size_t)E, 1.0f), *u = randv(n, 2.0f);
    float *want = malloc(bytes), *got = malloc(bytes);
    float *dx = put(x, bytes), *dw = put(w, (size_t)E * 4), *du = put(u, bytes);
    float *dy = g_gpu->buffer_alloc(g_gpu->ctx, bytes);

    g_cpu->rmsnorm(g_cpu->ctx, want, x, w, E, T, 1e-5f);
    g_gpu->rmsnorm(g_gpu->ctx, dy, dx, dw, E, T, 1e-5f);
    get(dy, got, bytes);
    near("rmsnorm", got, want, n, 1e-5, 1e-5);

    g_cpu->swiglu(g_cpu->ctx, want, x, u, n);
    g_gpu->swiglu(g_gpu->ctx, dy, dx, du, n);
    get(dy, got, bytes);
    near("swiglu", got, want, n, 1e-5, 1e-5);

    memcpy(want, x, bytes);
    g_cpu->add(g_cpu->ctx, want, u, n);
    g_cpu->add_row(g_cpu->ctx, want, w, E, T);
    g_gpu->copy(g_gpu->ctx, dy, dx, bytes);
    g_gpu->add(g_gpu->ctx, dy, du, n);
    g_gpu->add_row(g_gpu->ctx, dy, dw, E, T);
    get(dy, got, bytes);
    near("add, add_row", got, want, n, 1e-6, 1e-6);

    /* RoPE: 9 heads of 64 at positions up to 1000, both pair layouts, with and without
     * Llama-3.1-style factors. */
    int32_t pos[7] = {0, 1, 2, 17, 300, 999, 5};
    float ff[32];
    for (int i = 0; i < 32; i++)
        ff[i] = i < 8 ? 1.0f : i < 24 ? 1.0f + (float)(i - 8) / 2.0f : 8.0f;
    float *dff = put(ff, sizeof ff);
    for (int v = 0; v < 4; v++) {
        bool neox = v & 1, factors = v & 2;
        memcpy(want, x, bytes);
        g_cpu->rope(g_cpu->ctx, want, pos, T, 9, 64, 10000.0f, 1.0f, factors ? ff : NULL, neox);
        g_gpu->copy(g_gpu->ctx, dy, dx, bytes);
        g_gpu->rope(g_gpu->ctx, dy, pos, T, 9, 64, 10000.0f, 1.0f, factors ? dff : NULL, neox);
        get(dy, got, bytes);
        near(neox ? "rope neox" : "rope", got, want, n, 3e-3, 1e-4);
    }

    /* The encoder's LayerNorm and GELU. */
    float *b = randv((size_t)E, 0.5f), *db = put(b, (size_t)E * 4);
    memcpy(want, x, bytes);
    g_cpu->layernorm(g_cpu->ctx, want, w, b, E, T, 1e-12f);
    g_gpu->copy(g_gpu->ctx, dy, dx, bytes);
    g_gpu->layernorm(g_gpu->ctx, dy, dw, db, E, T, 1e-12f);
    get(dy, got, bytes);
    near("layernorm", got, want, n, 1e-5, 1e-5);
    memcpy(want, x, bytes);
    g_cpu->gelu(g_cpu->ctx, want, n);
    g_gpu->copy(g_gpu->ctx, dy, dx, bytes);
    g_gpu->gelu(g_gpu->ctx, dy, n);
    get(dy, got, bytes);
    near("gelu", got, want, n, 1e-6, 1e-5);

    drop(dx, bytes);
    drop(du, bytes);
    drop(dy, bytes);
    drop(dw, (size_t)E * 4);
    drop(db, (size_t)E * 4);
    drop(dff, sizeof ff);
    free(x);
    free(w);
    free(u);
    free(b);
    free(want);
    free(got);
}

/* ---- K/V stores and paged attention ---------------------------------------------------------- */

/* A pool of pages in backend be and a shuffled block table into it. */
static uint8_t *pool_new(kern_backend *be, size_t bytes)
{
    uint8_t *p = be->buffer_alloc(be->ctx, bytes);
    assert_non_null(p);
    return p;
}

/* The attention of n_seq sequences in one call on backend be: rows and outputs back to back. */
static void attend(kern_backend *be, const kern_kv *kv, const kern_seq *seqs, int n_seq,
                   const float *q, float *out, const int32_t *pos, int rows, int n_head)
{
    kern_attn a = {.q = q, .out = out, .pos = pos, .n_tok = rows, .seqs = seqs, .n_seq = n_seq,
                   .n_head = n_head, .scale = 1.0f / sqrtf((float)kv->head_dim), .kv = *kv,
                   .n_batch = rows};
    be->attention(be->ctx, &a);
}

/* Two sequences A and B of len positions each (their own K and V, their pages shuffled in one
 * pool) stored by the CPU and the GPU backend; attention of A's rows in four shapes, one call
 * each, then of A and B in one call of four sequences of every shape, against the CPU. */
static void check_attention(int type, int k_group, bool rotate, int n_head, int n_kv, int d,
                            int pt, int len)
{
    int kg = k_group > 0 ? k_group : d;
    size_t k_region = (size_t)pt * (size_t)n_kv * kern_kv_row_bytes(type, d, kg);
    size_t v_region = (size_t)pt * (size_t)n_kv * kern_kv_row_bytes(type, d, d);
    size_t page_bytes = 2 * (k_region + v_region);   /* two layers: the second is used */
    int n_pages = (len + pt - 1) / pt, pool_pages = 2 * n_pages + 2;
    int *perm = malloc((size_t)pool_pages * sizeof *perm);
    for (int i = 0; i < pool_pages; i++)
        perm[i] = i;
    for (int i = pool_pages - 1; i > 0; i--) {
        int j = (int)(rnd() % (uint64_t)(i + 1)), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    kern_backend *bes[2] = {g_cpu, g_gpu};
    uint8_t *pools[2], **tables[2][2];   /* [backend][sequence] */
    for (int b = 0; b < 2; b++) {
        pools[b] = pool_new(bes[b], page_bytes * (size_t)pool_pages);
        for (int sq = 0; sq < 2; sq++) {
            tables[b][sq] = malloc((size_t)n_pages * sizeof *tables[b][sq]);
            for (int i = 0; i < n_pages; i++)
                tables[b][sq][i] = pools[b] + (size_t)perm[sq * n_pages + i] * page_bytes;
        }
    }
    kern_kv kv = {.k_off = k_region + v_region, .v_off = 2 * k_region + v_region,
                  .page_tokens = pt, .n_kv_head = n_kv, .head_dim = d, .type = type,
                  .k_group = kg, .rotate = rotate};
    /* K and V rows: A's 0 .. len - 1, then B's */
    size_t row = (size_t)n_kv * (size_t)d, kvn = 2 * (size_t)len * row;
    float *k = randv(kvn, 1.0f), *v = randv(kvn, 1.0f);
    k[(size_t)(len - 1) * row] = 9.0f;   /* an outlier channel */
    int32_t *pos = malloc(2 * (size_t)len * sizeof *pos);
    for (int i = 0; i < 2 * len; i++)
        pos[i] = i % len;
    float *dk = put(k, kvn * 4), *dv = put(v, kvn * 4);
    /* stored in two calls: A's first half (a prefill chunk) with all of B, then A's rest */
    int half = len / 2;
    for (int b = 0; b < 2; b++) {
        kern_seq first[2] = {{tables[b][0], 0, half}, {tables[b][1], len, len}};
        kern_seq rest = {tables[b][0], half, len - half};
        const float *bk = b == 0 ? k : dk, *bv = b == 0 ? v : dv;
        bes[b]->kv_store(bes[b]->ctx, &kv, first, 2, bk, bv, pos);
        bes[b]->kv_store(bes[b]->ctx, &kv, &rest, 1, bk, bv, pos);
    }
    /* A's every position (prefill), its second half (a later prefill chunk), its last alone
     * (decode), 20 tokens from position 120 (a short chunk across the decode kernel's split of
     * the positions at 128, where its first rows see nothing of the second split). At head_dim
     * 64 and 128 the tiled kernel takes them all: in tiles of 16 rows for sequences of 64 rows
     * or more, else by heads, the positions split 128 at a time past 128 */
    static const char *const kind[] = {"prefill", "prefill chunk", "decode", "short chunk",
                                       "batch"};
    static const int batch[4] = {1, 2, 3, 0};   /* its shapes: A's, B's, A's, B's */
    size_t qrow = (size_t)n_head * (size_t)d;
    for (int qc = 0; qc < 5; qc++) {
        if (qc == 3 && len < 140)
            continue;
        kern_seq sqs[4];
        int32_t qpos[1024];
        int n_seq = 0, nt = 0;
        for (int c = 0; c < (qc == 4 ? 4 : 1); c++) {
            int kc = qc == 4 ? batch[c] : qc, sq = qc == 4 && c % 2 == 1;
            if (kc == 3 && len < 140)
                continue;
            int n = kc == 0 ? len : kc == 1 ? len - half : kc == 2 ? 1 : 20;
            int p0 = kc == 0 ? 0 : kc == 1 ? half : kc == 2 ? len - 1 : 120;
            sqs[n_seq++] = (kern_seq){tables[0][sq], nt, n};
            for (int i = 0; i < n; i++)
                qpos[nt + i] = p0 + i;
            nt += n;
        }
        size_t qn = (size_t)nt * qrow;
        float *q = randv(qn, 1.0f), *want = malloc(qn * 4), *got = malloc(qn * 4);
        float *dq = put(q, qn * 4), *dout = g_gpu->buffer_alloc(g_gpu->ctx, qn * 4);
        attend(g_cpu, &kv, sqs, n_seq, q, want, qpos, nt, n_head);
        if (qc == 4)   /* the CPU's batch: bit for bit its one-sequence calls */
            for (int c = 0; c < n_seq; c++) {
                float *one = malloc((size_t)sqs[c].n_tok * qrow * 4);
                kern_seq alone = sqs[c];
                attend(g_cpu, &kv, &alone, 1, q, want, qpos, nt, n_head);
                memcpy(one, want + (size_t)alone.tok0 * qrow, (size_t)alone.n_tok * qrow * 4);
                attend(g_cpu, &kv, sqs, n_seq, q, want, qpos, nt, n_head);
                assert_memory_equal(one, want + (size_t)alone.tok0 * qrow,
                                    (size_t)alone.n_tok * qrow * 4);
                free(one);
            }
        for (int c = 0; c < n_seq; c++)
            sqs[c].pages = sqs[c].pages == tables[0][0] ? tables[1][0] : tables[1][1];
        attend(g_gpu, &kv, sqs, n_seq, dq, dout, qpos, nt, n_head);
        get(dout, got, qn * 4);
        char what[96];
        snprintf(what, sizeof what, "attention %s/%d%s heads %d/%d d %d len %d %s",
                 type == KERN_KV_Q8 ? "q8" : "f16", kg, rotate ? " rotated" : "", n_head, n_kv,
                 d, len, kind[qc]);
        near(what, got, want, qn, type == KERN_KV_Q8 ? 2e-3 : 1e-4, 1e-3);
        /* the same on the per-query kernel (LLMGW_CUDA_ATTN=query) */
        attend(g_gpu_f32, &kv, sqs, n_seq, dq, dout, qpos, nt, n_head);
        get(dout, got, qn * 4);
        strcat(what, " (per query)");
        near(what, got, want, qn, type == KERN_KV_Q8 ? 2e-3 : 1e-4, 1e-3);
        free(want);
        drop(dq, qn * 4);
        drop(dout, qn * 4);
        free(q);
        free(got);
    }
    /* A's last token, then B's, then A's again: calls staging as many bytes (one row, as many
     * pages), only the tables differ; each must read its own (the backend reuses a call's
     * staged sequences only when the bytes are the same). */
    float *q1 = randv(qrow, 1.0f), *dq1 = put(q1, qrow * 4);
    float *want1 = malloc(qrow * 4), *got1 = malloc(qrow * 4);
    float *dout1 = g_gpu->buffer_alloc(g_gpu->ctx, qrow * 4);
    for (int c = 0; c < 3; c++) {
        int32_t p1 = len - 1;
        kern_seq one = {tables[0][c % 2], 0, 1};
        attend(g_cpu, &kv, &one, 1, q1, want1, &p1, 1, n_head);
        one.pages = tables[1][c % 2];
        attend(g_gpu, &kv, &one, 1, dq1, dout1, &p1, 1, n_head);
        get(dout1, got1, qrow * 4);
        near("attention, one row of A, B, A", got1, want1, qrow,
             type == KERN_KV_Q8 ? 2e-3 : 1e-4, 1e-3);
    }
#ifdef LLMGW_HAVE_CUDA
    /* A's last token inside a recording that is then dropped (20000 RoPEs overflow the
     * staging ring after attention staged): the plain call after it must stage anew, not take
     * the bytes the dropped recording staged but never copied. */
    util_err err;
    kern_backend *gb = NULL;
    setenv("LLMGW_CUDA_GRAPHS", "1", 1);
    assert_int_equal(kern_backend_open("cuda:0", 0, &gb, &err), 0);
    unsetenv("LLMGW_CUDA_GRAPHS");
    float *scratch = gb->buffer_alloc(gb->ctx, 64 * 4);
    int32_t p1 = len - 1, p5 = 5;
    kern_seq a1 = {tables[1][0], 0, 1};
    attend(g_cpu, &kv, &(kern_seq){tables[0][0], 0, 1}, 1, q1, want1, &p1, 1, n_head);
    assert_true(gb->step_record(gb->ctx, gb, 1));
    attend(gb, &kv, &a1, 1, dq1, dout1, &p1, 1, n_head);
    for (int i = 0; i < 20000; i++)
        gb->rope(gb->ctx, scratch, &p5, 1, 1, 64, 10000.0f, 1.0f, NULL, false);
    assert_false(gb->step_run(gb->ctx));
    attend(gb, &kv, &a1, 1, dq1, dout1, &p1, 1, n_head);
    gb->buffer_copy_out(gb->ctx, dout1, 0, got1, qrow * 4);
    near("attention after a dropped recording", got1, want1, qrow,
         type == KERN_KV_Q8 ? 2e-3 : 1e-4, 1e-3);
    gb->buffer_free(gb->ctx, scratch, 64 * 4);
    kern_backend_free(gb);
#endif
    drop(dq1, qrow * 4);
    drop(dout1, qrow * 4);
    free(q1);
    free(want1);
    free(got1);
    drop(dk, kvn * 4);
    drop(dv, kvn * 4);
    for (int b = 0; b < 2; b++) {
        bes[b]->buffer_free(bes[b]->ctx, pools[b], page_bytes * (size_t)pool_pages);
        free(tables[b][0]);
        free(tables[b][1]);
    }
    free(perm);
    free(pos);
    free(k);
    free(v);
}

static void attention_paged_every_kv_layout(void **state)
{
    (void)state;
    /* SmolLM2's heads (9 of 64 over 3 KV heads), pages of 16 not dividing the length */
    check_attention(KERN_KV_F16, 0, false, 9, 3, 64, 16, 77);
    check_attention(KERN_KV_F16, 0, false, 8, 8, 128, 16, 300);
    check_attention(KERN_KV_Q8, 0, false, 9, 3, 64, 16, 77);
    check_attention(KERN_KV_Q8, 32, false, 9, 3, 64, 16, 77);
    check_attention(KERN_KV_Q8, 0, true, 9, 3, 64, 16, 77);
    check_attention(KERN_KV_Q8, 32, true, 32, 8, 128, 32, 200);
    check_attention(KERN_KV_Q8, 32, false, 9, 3, 64, 16, 300);   /* decode in 3 splits */
    check_attention(KERN_KV_Q8, 0, true, 4, 2, 32, 16, 77);      /* head_dim 32: per query */
}

/* ---- the encoder ----------------------------------------------------------------------------- */

static void encoder_ops(void **state)
{
    (void)state;
    const int n = 384 * 3, k = 384, T = 40;
    float *w = randv((size_t)n * k, 0.05f), *bias = randv((size_t)n, 0.1f);
    float *x = randv((size_t)T * k, 1.0f), *res = randv((size_t)T * n, 1.0f);
    size_t yb = (size_t)T * (size_t)n * 4;
    float *want = malloc(yb), *got = malloc(yb);
    float *dx = put(x, (size_t)T * k * 4), *dy = g_gpu->buffer_alloc(g_gpu->ctx, yb);
    for (int prec = 0; prec < 2; prec++) {
        kern_dense *cd = g_cpu->dense_new(g_cpu->ctx, w, bias, n, k, KERN_DENSE_F32);
        kern_dense *gd = g_gpu->dense_new(g_gpu->ctx, w, bias, n, k, prec);
        assert_non_null(gd);
        assert_non_null(g_gpu->dense_kernels(g_gpu->ctx, gd));
        assert_false(gd->bf16);   /* AUTO: the tensor cores' TF32, said as such */
        assert_int_equal(gd->tf32, prec != KERN_DENSE_F32);
        for (int mode = 0; mode < 3; mode++) {   /* plain, residual, GELU */
            bool acc = mode == 1, gelu = mode == 2;
            memcpy(want, res, yb);
            g_gpu->buffer_copy_in(g_gpu->ctx, dy, 0, res, yb);
            g_cpu->dense(g_cpu->ctx, cd, x, T, want, acc, gelu);
            g_gpu->dense(g_gpu->ctx, gd, dx, T, dy, acc, gelu);
            get(dy, got, yb);
            near(prec == KERN_DENSE_F32 ? "dense f32" : "dense tf32", got, want,
                 (size_t)T * (size_t)n, prec == KERN_DENSE_F32 ? 1e-4 : 5e-3, 1e-3);
        }
        g_cpu->dense_free(g_cpu->ctx, cd);
        g_gpu->dense_free(g_gpu->ctx, gd);
    }
    g_gpu->dense_free(g_gpu->ctx, NULL);
    /* attention within sequences of 5, 0, 12 and 23 tokens (12 heads of 32) */
    int32_t start[] = {0, 5, 5, 17, 40};
    const int H = 384;
    size_t qb = (size_t)T * 3 * H * 4, ob = (size_t)T * H * 4;
    float *qkv = randv((size_t)T * 3 * H, 1.0f), *dq = put(qkv, qb);
    float *ow = malloc(ob), *og = malloc(ob), *dout = g_gpu->buffer_alloc(g_gpu->ctx, ob);
    g_cpu->encoder_attention(g_cpu->ctx, qkv, ow, start, 4, 12, 32);
    g_gpu->encoder_attention(g_gpu->ctx, dq, dout, start, 4, 12, 32);
    get(dout, og, ob);
    near("encoder attention", og, ow, (size_t)T * H, 1e-5, 1e-4);
    drop(dq, qb);
    drop(dout, ob);
    drop(dx, (size_t)T * k * 4);
    drop(dy, yb);
    free(qkv);
    free(ow);
    free(og);
    free(w);
    free(bias);
    free(x);
    free(res);
    free(want);
    free(got);
}

static void buffers_and_placement(void **state)
{
    (void)state;
    assert_string_equal(g_gpu->name, "cuda:0");
    assert_false(g_gpu->host_memory);
    assert_true(g_gpu->supports_type(g_gpu->ctx, KERN_TYPE_Q4_K));
    assert_false(g_gpu->supports_type(g_gpu->ctx, 13));
    char in[64] = "device bytes, copied in, across and out", out[64] = {0};
    uint8_t *a = g_gpu->buffer_alloc(g_gpu->ctx, 1 << 20), *b = put(in, sizeof in);
    g_gpu->buffer_copy_in(g_gpu->ctx, a, 1000, in, sizeof in);
    g_gpu->copy(g_gpu->ctx, b, a + 1000, sizeof in);
    get(b, out, sizeof out);
    assert_string_equal(out, in);
    drop(a, 1 << 20);
    drop(b, sizeof in);
    /* more than any device holds: refused, and the backend goes on working */
    assert_null(g_gpu->buffer_alloc(g_gpu->ctx, (size_t)1 << 50));
    b = put(in, sizeof in);
    memset(out, 0, sizeof out);
    get(b, out, sizeof out);
    assert_string_equal(out, in);
    drop(b, sizeof in);
    const void *p = kern_backend_place(g_gpu, in, sizeof in);
    assert_non_null(p);
    assert_ptr_not_equal(p, in);
    memset(out, 0, sizeof out);
    get(p, out, sizeof out);
    assert_string_equal(out, in);
    kern_backend_unplace(g_gpu, p, in, sizeof in);
    assert_ptr_equal(kern_backend_place(g_cpu, in, sizeof in), in);   /* the CPU reads in place */
}

/* ---- a step as a CUDA graph (kernel_backend.step_record, kernels/cuda/graph.cu) ----------- */

#ifdef LLMGW_HAVE_CUDA
/* A small step on b: y = W x, RoPE'd at pos (staged), z += y. */
static void small_step(kern_backend *b, const kern_tensor *w, const float *x, float *y, float *z,
                       const int32_t *pos, int n_tok)
{
    b->matmul(b->ctx, w, x, n_tok, y, w->rows);
    b->rope(b->ctx, y, pos, n_tok, (int)(w->rows / 64), 64, 10000.0f, 1.0f, NULL, false);
    b->add(b->ctx, z, y, (size_t)n_tok * (size_t)w->rows);
}
#endif

/* Steps recorded on a backend opened with LLMGW_CUDA_GRAPHS=1 and replayed give the unrecorded
 * steps' results bit for bit (each replay runs once: z accumulates), at 1, 3 and 8 tokens (the
 * matrix-vector kernels) and 20 and 64 (mmq); a larger step, or a backend without graphs, is
 * not recorded; a recording that cannot stage without waiting for the stream is dropped with
 * nothing run, and the next one has room; one that reaches a cuBLAS product (f16 weights at 20
 * tokens) is dropped with nothing run, and its key and size are not recorded again. */
static void steps_as_graphs(void **state)
{
    (void)state;
#ifdef LLMGW_HAVE_CUDA
    util_err err;
    kern_backend *gb = NULL;
    setenv("LLMGW_CUDA_GRAPHS", "1", 1);
    int rc = kern_backend_open("cuda:0", 0, &gb, &err);
    unsetenv("LLMGW_CUDA_GRAPHS");
    assert_int_equal(rc, 0);
    assert_false(g_gpu->step_record(g_gpu->ctx, g_gpu, 1));   /* off unless asked for */
    assert_false(gb->step_record(gb->ctx, gb, KERN_CUDA_GRAPH_MAX_TOK + 1));
    const int64_t rows = 256, cols = 576;
    size_t rb = kern_type_row_bytes(KERN_TYPE_Q4_1, (uint64_t)cols);
    const int M = KERN_CUDA_GRAPH_MAX_TOK;
    float *wf = randv((size_t)rows * (size_t)cols, 1.0f), *x = randv(M * (size_t)cols, 1.0f);
    uint8_t *wq = to_type(KERN_TYPE_Q4_1, wf, rows, cols, 0);
    size_t xb = M * (size_t)cols * 4, yb = M * (size_t)rows * 4;
    kern_tensor w = {.type = KERN_TYPE_Q4_1, .rows = rows, .cols = cols, .row_bytes = rb,
                     .data = gb->buffer_alloc(gb->ctx, (size_t)rows * rb)};
    float *dx = gb->buffer_alloc(gb->ctx, xb), *dy = gb->buffer_alloc(gb->ctx, yb),
          *dz = gb->buffer_alloc(gb->ctx, yb);
    gb->buffer_copy_in(gb->ctx, (void *)w.data, 0, wq, (size_t)rows * rb);
    gb->buffer_copy_in(gb->ctx, dx, 0, x, xb);
    float *zeros = calloc(M * (size_t)rows, 4), *plain = malloc(yb), *graphed = malloc(yb);
    const int sizes[] = {1, 3, 8, 20, M};
    for (int si = 0; si < 5; si++) {
        int T = sizes[si];
        int32_t pos[KERN_CUDA_GRAPH_MAX_TOK];
        for (int rec = 0; rec < 2; rec++) {
            gb->buffer_copy_in(gb->ctx, dz, 0, zeros, yb);
            for (int step = 0; step < 3; step++) {   /* three steps at other positions */
                for (int t = 0; t < T; t++)
                    pos[t] = 17 * step + t;
                if (rec)
                    assert_true(gb->step_record(gb->ctx, &w, T));
                small_step(gb, &w, dx, dy, dz, pos, T);
                if (rec)
                    assert_true(gb->step_run(gb->ctx));
            }
            gb->buffer_copy_out(gb->ctx, dz, 0, rec ? graphed : plain, yb);
        }
        assert_memory_equal(plain, graphed, (size_t)T * (size_t)rows * 4);
    }
    kern_cuda_graph_stats st = kern_cuda_graphs(gb);
    assert_true(st.steps == 15 && st.built == 5 && st.updated == 10 && st.dropped == 0);
    /* A step staging more than the ring left for it (20000 RoPEs of one head, 256 bytes of
     * the ring each, more than its 4 MiB): dropped with nothing run; the next recording finds the
     * ring grown, records it, and it gives what the same calls give unrecorded. */
    gb->buffer_copy_out(gb->ctx, dz, 0, plain, yb);
    gb->buffer_copy_in(gb->ctx, dy, 0, plain, 64 * 4);
    gb->buffer_copy_in(gb->ctx, dz, 0, plain, 64 * 4);
    int32_t pos[1] = {5};
    for (int rec = 0; rec < 3; rec++) {
        float *r = rec == 0 ? dz : dy;   /* unrecorded into z, recorded into y */
        if (rec > 0)
            assert_true(gb->step_record(gb->ctx, &w, 1));
        for (int i = 0; i < 20000; i++)
            gb->rope(gb->ctx, r, pos, 1, 1, 64, 10000.0f, 1.0f, NULL, false);
        if (rec > 0)
            assert_int_equal(gb->step_run(gb->ctx), rec == 2);
        if (rec == 1) {   /* dropped: y as it was */
            gb->buffer_copy_out(gb->ctx, dy, 0, graphed, 64 * 4);
            assert_memory_equal(plain, graphed, 64 * 4);
        }
    }
    gb->buffer_copy_out(gb->ctx, dz, 0, plain, 64 * 4);
    gb->buffer_copy_out(gb->ctx, dy, 0, graphed, 64 * 4);
    assert_memory_equal(plain, graphed, 64 * 4);
    assert_int_equal(kern_cuda_graphs(gb).dropped, 1);
    assert_int_equal(kern_cuda_graphs(gb).steps, 16);
    /* f16 weights at 20 tokens (cuBLAS): dropped, z as it was; then run unrecorded, as the
     * engine does; the next step of that key and size is not recorded, one of 8 tokens is. */
    uint16_t *wh = malloc((size_t)rows * (size_t)cols * 2);
    for (size_t i = 0; i < (size_t)rows * (size_t)cols; i++)
        wh[i] = kern_f32_to_f16(wf[i]);
    kern_tensor w16 = {.type = KERN_TYPE_F16, .rows = rows, .cols = cols,
                       .row_bytes = (size_t)cols * 2,
                       .data = gb->buffer_alloc(gb->ctx, (size_t)rows * (size_t)cols * 2)};
    gb->buffer_copy_in(gb->ctx, (void *)w16.data, 0, wh, (size_t)rows * (size_t)cols * 2);
    int32_t pos20[20];
    for (int t = 0; t < 20; t++)
        pos20[t] = t;
    gb->buffer_copy_in(gb->ctx, dz, 0, zeros, yb);
    assert_true(gb->step_record(gb->ctx, &w16, 20));
    small_step(gb, &w16, dx, dy, dz, pos20, 20);
    assert_false(gb->step_run(gb->ctx));
    gb->buffer_copy_out(gb->ctx, dz, 0, graphed, yb);
    assert_memory_equal(zeros, graphed, yb);
    small_step(gb, &w16, dx, dy, dz, pos20, 20);   /* z = 0 + y */
    gb->buffer_copy_out(gb->ctx, dz, 0, graphed, yb);
    gb->buffer_copy_out(gb->ctx, dy, 0, plain, yb);
    assert_memory_equal(plain, graphed, 20 * (size_t)rows * 4);
    for (size_t i = 0; i < 20 * (size_t)rows; i++)   /* and y was computed: not all zeros */
        if (plain[i] != 0.0f)
            break;
        else if (i + 1 == 20 * (size_t)rows)
            fail();
    assert_false(gb->step_record(gb->ctx, &w16, 20));
    assert_true(gb->step_record(gb->ctx, &w16, 8));
    small_step(gb, &w16, dx, dy, dz, pos20, 8);
    assert_true(gb->step_run(gb->ctx));
    assert_int_equal(kern_cuda_graphs(gb).dropped, 2);
    gb->buffer_free(gb->ctx, (void *)w16.data, (size_t)rows * (size_t)cols * 2);
    free(wh);
    assert_int_equal(kern_cuda_graphs(g_cpu).steps, 0);   /* not a CUDA backend: zeros */
    gb->buffer_free(gb->ctx, (void *)w.data, (size_t)rows * rb);
    gb->buffer_free(gb->ctx, dx, xb);
    gb->buffer_free(gb->ctx, dy, yb);
    gb->buffer_free(gb->ctx, dz, yb);
    kern_backend_free(gb);
    free(wf);
    free(x);
    free(wq);
    free(zeros);
    free(plain);
    free(graphed);
#else
    skip();
#endif
}

int main(void)
{
    int n_dev = kern_cuda_devices();
    if (n_dev == 0) {
        printf("skipped: no CUDA device (or no CUDA backend in this build)\n");
        return 77;
    }
    util_err err;
    if (kern_backend_open("cuda:0", 0, &g_gpu, &err) != 0) {
        fprintf(stderr, "cuda:0: %s\n", err.msg);
        return 1;
    }
    setenv("LLMGW_CUDA_QUANT", "f32", 1);
    setenv("LLMGW_CUDA_DEQUANT_MIB", "1", 1);
    setenv("LLMGW_CUDA_ATTN", "query", 1);
    int rc_f32 = kern_backend_open("cuda:0", 0, &g_gpu_f32, &err);
    unsetenv("LLMGW_CUDA_QUANT");
    unsetenv("LLMGW_CUDA_DEQUANT_MIB");
    unsetenv("LLMGW_CUDA_ATTN");
    if (rc_f32 != 0) {
        fprintf(stderr, "cuda:0 (LLMGW_CUDA_QUANT=f32): %s\n", err.msg);
        return 1;
    }
    g_cpu = kern_cpu_backend_new(2);
    if (g_cpu == NULL || g_gpu->reserve(g_gpu->ctx, 64, 1536, 512) != 0 ||
        g_cpu->reserve(g_cpu->ctx, 300, 1536, 512) != 0)
        return 1;
    printf("device: %s\n", g_gpu->kernels(g_gpu->ctx));
    if (strstr(g_gpu->kernels(g_gpu->ctx), "quantized products int8") == NULL ||
        strstr(g_gpu_f32->kernels(g_gpu_f32->ctx), "quantized products f32") == NULL ||
        strstr(g_gpu_f32->kernels(g_gpu_f32->ctx), "dequant tiles 1 MiB") == NULL ||
        strstr(g_gpu->kernels(g_gpu->ctx), "attention tiled") == NULL ||
        strstr(g_gpu_f32->kernels(g_gpu_f32->ctx), "attention per query") == NULL) {
        fprintf(stderr, "the backends do not say which quantized matrix-vector path they take\n");
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(buffers_and_placement),
        cmocka_unit_test(steps_as_graphs),
        cmocka_unit_test(matmul_every_type_both_paths),
        cmocka_unit_test(matmul_quantized_f32_path),
        cmocka_unit_test(matmul_int8_nonfinite),
        cmocka_unit_test(matmul_rounding_held),
        cmocka_unit_test(get_rows_every_type),
        cmocka_unit_test(norms_rope_elementwise),
        cmocka_unit_test(attention_paged_every_kv_layout),
        cmocka_unit_test(encoder_ops),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    kern_backend_free(g_gpu_f32);
    kern_backend_free(g_gpu);
    kern_backend_free(g_cpu);
    return rc;
}
