/* tests/unit/kernels/test_backend.c: the CPU kern_backend against naive f32 formulas: matmul for
 * every weight type and 1, 3 and 64 tokens (within the activation quantization error, identical
 * for every thread count), get_rows, RMSNorm, RoPE (llama and neox pairs, with and without
 * Llama-3.1 per-frequency factors), SwiGLU and the adds,
 * and paged attention through a shuffled block table (pages in random order, page size not
 * dividing the length, unwritten slots poisoned with NaN) against contiguous attention, with
 * grouped-query heads and causal masking, for every K/V cache: f16, and int8 (KERN_KV_Q8, one K
 * scale per head or per 32 channels, plain or Hadamard-rotated) against attention over the
 * values the reference quantizer gives back (each within half a quantization step); the helpers
 * behind it (this CPU's best twins: AVX2, AVX-512) against their references; draft models'
 * repacked copies (Q4_1 rows interleaved by eight) against the rows as they lie. ctest
 * kernels/backend_ref runs it on the references. */
#include "kernels/backend.h"
#include "kernels/device.h"
#include "kernels/cpu/features.h"
#include "kernels/cpu/internal.h"

#include "tests/unit/unit.h"

#include <stdlib.h>

static const uint32_t types[] = {KERN_TYPE_F32, KERN_TYPE_F16, KERN_TYPE_BF16, KERN_TYPE_Q4_0,
                                 KERN_TYPE_Q4_1, KERN_TYPE_Q8_0, KERN_TYPE_Q4_K, KERN_TYPE_Q6_K};
enum { N_TYPES = sizeof types / sizeof types[0] };

static uint64_t rng_state = 0x2545f4914f6cdd1dull;

static uint64_t rnd(void)
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static float frand(void)   /* uniform in [-1, 1) */
{
    return (float)((double)(rnd() >> 11) / (double)(1ull << 52) - 1.0);
}

static float *randv(size_t n, float scale)
{
    float *x = malloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++)
        x[i] = frand() * scale;
    return x;
}

static kern_backend *backend(int threads, int max_tok, int64_t max_cols, int max_ctx)
{
    kern_backend *b = kern_cpu_backend_new(threads);
    assert_non_null(b);
    assert_int_equal(b->n_threads(b->ctx), threads);
    assert_int_equal(b->reserve(b->ctx, max_tok, max_cols, max_ctx), 0);
    return b;
}

/* ---- matmul ---------------------------------------------------------------------------------- */

typedef struct mm_case {
    uint32_t type;
    int64_t rows, cols;
    int n_tok;
} mm_case;

static void check_matmul(const mm_case *mc, kern_backend *const *bes, int n_be)
{
    const kern_wtype *t = kern_wtype_get_ref(mc->type);
    int64_t rows = mc->rows, cols = mc->cols, ldy = rows + 3;
    int nt = mc->n_tok;
    size_t rb = kern_type_row_bytes(t->type, (uint64_t)cols);
    float *wf = randv((size_t)(rows * cols), 0.05f);
    uint8_t *w = malloc(rb * (size_t)rows);
    for (int64_t r = 0; r < rows; r++)
        t->from_f32(wf + r * cols, w + (size_t)r * rb, cols);
    for (int64_t r = 0; r < rows; r++)   /* what the weights really are, after quantization */
        t->to_f32(w + (size_t)r * rb, wf + r * cols, cols);
    float *x = randv((size_t)(nt * cols), 1.0f);
    kern_tensor wt = {.type = mc->type, .rows = rows, .cols = cols, .row_bytes = rb, .data = w};
    int blk = t->act == KERN_ACT_Q8_K ? 256 : 32;
    float *ys[4];
    for (int bi = 0; bi < n_be; bi++) {
        float *y = malloc((size_t)(nt * ldy) * sizeof *y);
        for (int64_t i = 0; i < nt * ldy; i++)
            y[i] = -12345.0f;
        bes[bi]->matmul(bes[bi]->ctx, &wt, x, nt, y, ldy);
        ys[bi] = y;
    }
    for (int tk = 0; tk < nt; tk++)
        for (int64_t r = 0; r < rows; r++) {
            const float *xr = x + (size_t)tk * (size_t)cols, *wr = wf + r * cols;
            double exact = 0, mag = 0, qerr = 0;
            for (int64_t j0 = 0; j0 < cols; j0 += blk) {
                float amax = 0;
                for (int j = 0; j < blk && j0 + j < cols; j++)
                    amax = fmaxf(amax, fabsf(xr[j0 + j]));
                for (int j = 0; j < blk && j0 + j < cols; j++) {
                    exact += (double)wr[j0 + j] * xr[j0 + j];
                    mag += fabs((double)wr[j0 + j] * xr[j0 + j]);
                    qerr += fabs(wr[j0 + j]) * amax / 254.0;
                }
            }
            /* Activations are rounded as llama.cpp rounds them: to f16 for F16 weights, bf16
             * for BF16, and q8 blocks carry an f16 scale (relative error 2^-11 each). */
            double aerr = t->type == 30 ? mag / 256 : t->type == 0 ? 0 : mag / 2048;
            double tol = (t->act == KERN_ACT_F32 ? 0 : qerr) + aerr + 2e-5 * mag + 1e-6;
            for (int bi = 0; bi < n_be; bi++) {
                float got = ys[bi][(size_t)tk * (size_t)ldy + (size_t)r];
                if (!(fabs(got - exact) <= tol)) {
                    print_error("%s %lldx%lld n_tok %d backend %d: y[%d][%lld] = %.9g, "
                                "expected %.9g (tol %g)\n", kern_type_name(t->type), (long long)rows,
                                (long long)cols, nt, bi, tk, (long long)r, got, exact, tol);
                    fail();
                }
                /* The split over threads does not change any result. */
                if (bi > 0 && memcmp(&got, &ys[0][(size_t)tk * (size_t)ldy + (size_t)r], 4) != 0) {
                    print_error("%s: thread counts disagree at [%d][%lld]\n", kern_type_name(t->type), tk,
                                (long long)r);
                    fail();
                }
            }
        }
    for (int bi = 0; bi < n_be; bi++) {
        for (int tk = 0; tk < nt; tk++)   /* the padding between y rows is untouched */
            for (int64_t r = rows; r < ldy; r++)
                assert_true(ys[bi][(size_t)tk * (size_t)ldy + (size_t)r] == -12345.0f);
        free(ys[bi]);
    }
    free(wf);
    free(w);
    free(x);
}

static void matmul_every_type(void **state)
{
    (void)state;
    kern_backend *bes[3] = {backend(1, 64, 1536, 16), backend(2, 64, 1536, 16),
                            backend(3, 64, 1536, 16)};
    static const int toks[] = {1, 3, 64};
    for (int ti = 0; ti < N_TYPES; ti++)
        for (int k = 0; k < 3; k++) {
            mm_case a = {types[ti], 37, 512, toks[k]};
            check_matmul(&a, bes, 3);
            mm_case b = {types[ti], 100, 1536, toks[k]};
            check_matmul(&b, bes, 3);
        }
    for (int ti = 0; ti < 3; ti++) {   /* float types take any column count */
        mm_case c = {types[ti], 19, 100, 3};
        check_matmul(&c, bes, 3);
        mm_case d = {types[ti], 5, 7, 1};
        check_matmul(&d, bes, 3);
    }
    for (int i = 0; i < 3; i++)
        kern_backend_free(bes[i]);
}

/* Shapes of the target model (576 hidden, 1536 FFN), the batch sizes between decode and prefill. */
/* ---- repack (draft models' copies) --------------------------------------------------------- */

/* matmul through w's repacked copy against matmul through ref (the same weights, rows as they
 * lie): equal within summation-order rounding; a token's results the same bits alone and in
 * a batch of nt, and for 1 and 2 threads; y's padding untouched. */
static void check_repacked(kern_backend *const *bes, const kern_tensor *copy,
                           const kern_tensor *ref, const float *wf, int nt)
{
    int64_t rows = ref->rows, cols = ref->cols, ldy = rows + 5;
    float *x = randv((size_t)(nt * cols), 1.0f);
    float *want = malloc((size_t)(nt * ldy) * sizeof *want);
    float *got[2], *alone = malloc((size_t)rows * sizeof *alone);
    bes[0]->matmul(bes[0]->ctx, ref, x, nt, want, ldy);
    for (int bi = 0; bi < 2; bi++) {
        got[bi] = malloc((size_t)(nt * ldy) * sizeof *got[bi]);
        for (int64_t i = 0; i < nt * ldy; i++)
            got[bi][i] = -12345.0f;
        bes[bi]->matmul(bes[bi]->ctx, copy, x, nt, got[bi], ldy);
    }
    for (int tk = 0; tk < nt; tk++) {
        bes[0]->matmul(bes[0]->ctx, copy, x + (size_t)tk * (size_t)cols, 1, alone, rows);
        for (int64_t r = 0; r < rows; r++) {
            double mag = 0;
            for (int64_t j = 0; j < cols; j++)
                mag += fabs((double)wf[r * cols + j] * x[(size_t)tk * (size_t)cols + (size_t)j]);
            size_t at = (size_t)tk * (size_t)ldy + (size_t)r;
            if (!(fabs((double)got[0][at] - want[at]) <= 1e-5 * mag + 1e-6)) {
                print_error("repacked %lldx%lld n_tok %d: y[%d][%lld] = %.9g, rows as they lie "
                            "%.9g\n", (long long)rows, (long long)cols, nt, tk, (long long)r,
                            got[0][at], want[at]);
                fail();
            }
            assert_memory_equal(&got[1][at], &got[0][at], sizeof(float));
            assert_memory_equal(&alone[r], &got[0][at], sizeof(float));
        }
        for (int64_t r = rows; r < ldy; r++)
            for (int bi = 0; bi < 2; bi++)
                assert_true(got[bi][(size_t)tk * (size_t)ldy + (size_t)r] == -12345.0f);
    }
    free(x);
    free(want);
    free(alone);
    free(got[0]);
    free(got[1]);
}

static void repack_for_drafting(void **state)
{
    (void)state;
    kern_backend *bes[2] = {backend(1, 32, 1536, 16), backend(2, 32, 1536, 16)};
    uint8_t blk[2 * 34] = {0};
    kern_tensor none;
    if (kern__exact()) {   /* LLMGW_KERNELS=exact: llama.cpp's results only, no other layouts */
        kern_tensor t = {.type = KERN_TYPE_Q4_1, .rows = 1, .cols = 32, .row_bytes = 20,
                         .data = blk};
        assert_false(bes[0]->repack(bes[0]->ctx, &t, &none));
        kern_backend_free(bes[0]);
        kern_backend_free(bes[1]);
        return;
    }
    const kern_wtype *q41 = kern_wtype_get_ref(KERN_TYPE_Q4_1);
    static const int64_t shapes[][2] = {{8, 32}, {37, 64}, {203, 576}, {64, 1536}};
    static const int toks[] = {1, 3, 7, 20};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        int64_t rows = shapes[si][0], cols = shapes[si][1];
        float *wf = randv((size_t)(rows * cols), 0.05f);
        size_t rb = kern_type_row_bytes(KERN_TYPE_Q4_1, (uint64_t)cols);
        uint8_t *w = malloc(rb * (size_t)rows);
        for (int64_t r = 0; r < rows; r++) {
            q41->from_f32(wf + r * cols, w + (size_t)r * rb, cols);
            q41->to_f32(w + (size_t)r * rb, wf + r * cols, cols);
        }
        kern_tensor t = {.type = KERN_TYPE_Q4_1, .rows = rows, .cols = cols, .row_bytes = rb,
                         .data = w};
        kern_tensor c, again;
        assert_true(bes[0]->repack(bes[0]->ctx, &t, &c));
        assert_int_equal(c.layout, KERN_LAYOUT_X8);
        assert_int_equal(c.type, KERN_TYPE_Q4_1);
        assert_int_equal(c.rows, rows);
        assert_int_equal(c.row_bytes, rb);
        assert_false(bes[0]->repack(bes[0]->ctx, &c, &again));   /* X8 stays as it is */
        for (size_t ti = 0; ti < sizeof toks / sizeof toks[0]; ti++)
            check_repacked(bes, &c, &t, wf, toks[ti]);
        bes[0]->repack_free(bes[0]->ctx, &c);
        assert_null(c.data);
        free(wf);
        free(w);
    }
    /* Types without a draft layout are refused (used as they are). */
    kern_tensor q8 = {.type = KERN_TYPE_Q8_0, .rows = 2, .cols = 32, .row_bytes = 34, .data = blk};
    kern_tensor f16 = {.type = KERN_TYPE_F16, .rows = 2, .cols = 32, .row_bytes = 64, .data = blk};
    assert_false(bes[0]->repack(bes[0]->ctx, &q8, &none));
    assert_false(bes[0]->repack(bes[0]->ctx, &f16, &none));
    kern_backend_free(bes[0]);
    kern_backend_free(bes[1]);
}

static void matmul_model_shapes(void **state)
{
    (void)state;
    kern_backend *bes[2] = {backend(1, 130, 1536, 16), backend(2, 130, 1536, 16)};
    static const int toks[] = {2, 5, 16, 130};
    static const uint32_t tt[] = {KERN_TYPE_Q4_1, KERN_TYPE_Q8_0, KERN_TYPE_Q4_0};
    for (int ti = 0; ti < 3; ti++)
        for (int k = 0; k < 4; k++) {
            mm_case a = {tt[ti], 576, 576, toks[k]};
            check_matmul(&a, bes, 2);
            mm_case b = {tt[ti], 192, 1536, toks[k]};
            check_matmul(&b, bes, 2);
        }
    for (int i = 0; i < 2; i++)
        kern_backend_free(bes[i]);
}

static void get_rows_every_type(void **state)
{
    (void)state;
    kern_backend *b = backend(2, 8, 512, 16);
    for (int ti = 0; ti < N_TYPES; ti++) {
        const kern_wtype *t = kern_wtype_get_ref(types[ti]);
        int64_t rows = 20, cols = 512;
        size_t rb = kern_type_row_bytes(t->type, (uint64_t)cols);
        float *wf = randv((size_t)(rows * cols), 1.0f);
        uint8_t *w = malloc(rb * (size_t)rows);
        for (int64_t r = 0; r < rows; r++)
            t->from_f32(wf + r * cols, w + (size_t)r * rb, cols);
        kern_tensor wt = {.type = types[ti], .rows = rows, .cols = cols, .row_bytes = rb, .data = w};
        int32_t ids[5] = {7, 0, 19, 7, 3};
        float *y = malloc(5 * (size_t)cols * sizeof *y), *e = malloc((size_t)cols * sizeof *e);
        b->get_rows(b->ctx, &wt, ids, 5, y);
        for (int i = 0; i < 5; i++) {
            t->to_f32(w + (size_t)ids[i] * rb, e, cols);
            assert_memory_equal(y + (size_t)i * (size_t)cols, e, (size_t)cols * sizeof *e);
        }
        free(wf);
        free(w);
        free(y);
        free(e);
    }
    kern_backend_free(b);
}

/* ---- element-wise ops ------------------------------------------------------------------------ */

static void rmsnorm_in_place(void **state)
{
    (void)state;
    kern_backend *b = backend(2, 128, 576, 16);
    static const int toks[] = {1, 3, 100};
    for (int k = 0; k < 3; k++) {
        int nt = toks[k];
        int64_t n = 576;
        float *x = randv((size_t)(nt * n), 3.0f), *w = randv((size_t)n, 1.0f);
        float *x0 = malloc((size_t)(nt * n) * sizeof *x0);
        memcpy(x0, x, (size_t)(nt * n) * sizeof *x0);
        b->rmsnorm(b->ctx, x, x, w, n, nt, 1e-5f);
        for (int t = 0; t < nt; t++) {
            double ss = 0;
            for (int64_t i = 0; i < n; i++)
                ss += (double)x0[t * n + i] * x0[t * n + i];
            double inv = 1.0 / sqrt(ss / (double)n + 1e-5);
            for (int64_t i = 0; i < n; i++)
                assert_double_near(x[t * n + i], x0[t * n + i] * inv * w[i],
                                   1e-5 * fabs(x0[t * n + i] * inv * w[i]) + 1e-6);
        }
        free(x);
        free(w);
        free(x0);
    }
    kern_backend_free(b);
}

static void naive_rope(float *x, const int32_t *pos, int nt, int nh, int d, float base,
                       float fscale, const float *ff, bool neox)
{
    for (int t = 0; t < nt; t++)
        for (int h = 0; h < nh; h++) {
            float *v = x + ((size_t)t * (size_t)nh + (size_t)h) * (size_t)d;
            /* llama.cpp's angles: theta = pos, times powf(base, -2/d) per pair, in f32, divided
             * by the pair's frequency factor, times freq_scale */
            float ts = powf(base, -2.0f / (float)d), thf = (float)pos[t];
            for (int i = 0; i < d / 2; i++, thf *= ts) {
                double th = (double)(fscale * (ff != NULL ? thf / ff[i] : thf));
                int a = neox ? i : 2 * i, bb = neox ? i + d / 2 : 2 * i + 1;
                double x0 = v[a], x1 = v[bb];
                v[a] = (float)(x0 * cos(th) - x1 * sin(th));
                v[bb] = (float)(x0 * sin(th) + x1 * cos(th));
            }
        }
}

static void rope_normal_and_neox(void **state)
{
    (void)state;
    kern_backend *b = backend(2, 16, 576, 16);
    int32_t pos_a[4] = {0, 1, 17, 5000}, pos_b[4] = {3, 2, 1, 8191};
    for (int neox = 0; neox < 2; neox++)
        for (int round = 0; round < 3; round++) {   /* new positions must not reuse cos/sin */
            const int32_t *pos = round == 1 ? pos_b : pos_a;
            int nt = 4, nh = 3, d = 64;
            size_t n = (size_t)nt * (size_t)nh * (size_t)d;
            float *x = randv(n, 1.0f), *e = malloc(n * sizeof *e);
            memcpy(e, x, n * sizeof *e);
            b->rope(b->ctx, x, pos, nt, nh, d, 100000.0f, 0.5f, NULL, neox);
            naive_rope(e, pos, nt, nh, d, 100000.0f, 0.5f, NULL, neox);
            for (size_t i = 0; i < n; i++)
                assert_double_near(x[i], e[i], 2e-5);
            free(x);
            free(e);
        }
    /* A prefill-sized batch (split over threads), and a backend without reserve() (no cos/sin
     * cache): same results. */
    kern_backend *bare = kern_cpu_backend_new(2);
    assert_non_null(bare);
    kern_backend *big = backend(2, 128, 576, 16);
    for (int k = 0; k < 2; k++) {
        kern_backend *bb = k ? bare : big;
        int nt = 128, nh = 9, d = 64;
        int32_t pos[128];
        for (int t = 0; t < nt; t++)
            pos[t] = 1000 + 3 * t;
        size_t n = (size_t)nt * (size_t)nh * (size_t)d;
        float *x = randv(n, 1.0f), *e = malloc(n * sizeof *e);
        memcpy(e, x, n * sizeof *e);
        bb->rope(bb->ctx, x, pos, nt, nh, d, 10000.0f, 1.0f, NULL, k == 1);
        naive_rope(e, pos, nt, nh, d, 10000.0f, 1.0f, NULL, k == 1);
        for (size_t i = 0; i < n; i++)
            assert_double_near(x[i], e[i], 2e-5);
        free(x);
        free(e);
    }
    kern_backend_free(bare);
    kern_backend_free(big);
    /* The two pairings really differ: rotating (0, 1) is not rotating (0, d/2). */
    float x1[8] = {1, 2, 3, 4, 5, 6, 7, 8}, x2[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    int32_t p = 3;
    b->rope(b->ctx, x1, &p, 1, 1, 8, 10000.0f, 1.0f, NULL, false);
    b->rope(b->ctx, x2, &p, 1, 1, 8, 10000.0f, 1.0f, NULL, true);
    assert_true(fabsf(x1[1] - x2[1]) > 1e-3f);
    kern_backend_free(b);
}

/* Llama-3.1-style factors for d/2 pairs: 1 for the high frequencies, 8 for the low ones, a
 * smooth ramp between (the shape of llama3 rope scaling). */
static void llama3_factors(float *ff, int half)
{
    for (int i = 0; i < half; i++) {
        float r = (float)(i - half / 2) / (float)(half / 4);
        ff[i] = r <= 0.0f ? 1.0f : r >= 1.0f ? 8.0f : 1.0f / ((1.0f - r) + r / 8.0f);
    }
}

/* RoPE with per-frequency factors (Llama-3.1's rope_freqs) against the reference formula, with
 * and without the cos/sin cache, threaded or not, for both pairings; all-1 factors give the same
 * bits as no factors; new factor values in the same buffer are not served from the cache. */
static void rope_freq_factors(void **state)
{
    (void)state;
    kern_backend *small = backend(2, 4, 576, 16), *big = backend(2, 128, 576, 16);
    kern_backend *bare = kern_cpu_backend_new(2);
    assert_non_null(bare);
    kern_backend *bes[3] = {small, big, bare};
    int32_t pos_a[4] = {0, 1, 17, 5000};
    float ff[32], ones[32];
    llama3_factors(ff, 32);
    for (int i = 0; i < 32; i++)
        ones[i] = 1.0f;
    assert_true(ff[0] == 1.0f && ff[31] == 8.0f && ff[20] > 1.0f && ff[20] < 8.0f);
    for (int k = 0; k < 3; k++)
        for (int neox = 0; neox < 2; neox++) {
            kern_backend *b = bes[k];
            int nt = k == 1 ? 128 : 4, nh = k == 1 ? 9 : 3, d = 64;
            int32_t pos[128];
            for (int t = 0; t < nt; t++)
                pos[t] = nt == 4 ? pos_a[t] : 1000 + 3 * t;
            size_t n = (size_t)nt * (size_t)nh * (size_t)d;
            float *x = randv(n, 1.0f), *e = malloc(n * sizeof *e), *y = malloc(n * sizeof *y);
            float *z = malloc(n * sizeof *z);
            memcpy(e, x, n * sizeof *e);
            memcpy(y, x, n * sizeof *y);
            memcpy(z, x, n * sizeof *z);
            /* no factors first: the cache then holds angles that the factors must replace */
            b->rope(b->ctx, y, pos, nt, nh, d, 500000.0f, 1.0f, NULL, neox);
            b->rope(b->ctx, x, pos, nt, nh, d, 500000.0f, 1.0f, ff, neox);
            naive_rope(e, pos, nt, nh, d, 500000.0f, 1.0f, ff, neox);
            for (size_t i = 0; i < n; i++)
                assert_double_near(x[i], e[i], 2e-5);
            /* the factors matter (the low-frequency pairs of a late position) */
            double most = 0;
            for (size_t i = 0; i < n; i++)
                most = fmax(most, fabs((double)x[i] - (double)y[i]));
            assert_true(most > 1e-2);
            /* all-1 factors: bit for bit the rotation without factors */
            b->rope(b->ctx, z, pos, nt, nh, d, 500000.0f, 1.0f, ones, neox);
            assert_memory_equal(z, y, n * sizeof *z);
            /* other values in the same buffer: the cached angles must not be reused */
            float ff2[32];
            memcpy(ff2, ff, sizeof ff2);
            memcpy(x, z, n * sizeof *x);
            memcpy(e, z, n * sizeof *e);
            b->rope(b->ctx, x, pos, nt, nh, d, 500000.0f, 0.5f, ff2, neox);
            ff2[31] = 2.0f;
            ff2[0] = 1.5f;
            memcpy(y, z, n * sizeof *y);
            b->rope(b->ctx, y, pos, nt, nh, d, 500000.0f, 0.5f, ff2, neox);
            naive_rope(e, pos, nt, nh, d, 500000.0f, 0.5f, ff2, neox);
            for (size_t i = 0; i < n; i++)
                assert_double_near(y[i], e[i], 2e-5);
            free(x);
            free(e);
            free(y);
            free(z);
        }
    /* Heads wider than the backend's per-token buffer (the one-pair-at-a-time path). */
    {
        int d = 2048, half = d / 2;
        int32_t pos[2] = {7, 3000};
        float *f = malloc((size_t)half * sizeof *f), *o = malloc((size_t)half * sizeof *o);
        llama3_factors(f, half);
        for (int i = 0; i < half; i++)
            o[i] = 1.0f;
        size_t n = 2 * (size_t)d;
        float *x = randv(n, 1.0f), *e = malloc(n * sizeof *e), *y = malloc(n * sizeof *y);
        float *z = malloc(n * sizeof *z);
        memcpy(e, x, n * sizeof *e);
        memcpy(y, x, n * sizeof *y);
        memcpy(z, x, n * sizeof *z);
        bare->rope(bare->ctx, x, pos, 2, 1, d, 10000.0f, 1.0f, f, false);
        naive_rope(e, pos, 2, 1, d, 10000.0f, 1.0f, f, false);
        for (size_t i = 0; i < n; i++)
            assert_double_near(x[i], e[i], 2e-5);
        bare->rope(bare->ctx, y, pos, 2, 1, d, 10000.0f, 1.0f, NULL, false);
        bare->rope(bare->ctx, z, pos, 2, 1, d, 10000.0f, 1.0f, o, false);
        assert_memory_equal(z, y, n * sizeof *z);
        free(f);
        free(o);
        free(x);
        free(e);
        free(y);
        free(z);
    }
    for (int k = 0; k < 3; k++)
        kern_backend_free(bes[k]);
}

static void swiglu_add_add_row(void **state)
{
    (void)state;
    kern_backend *b = backend(2, 128, 1536, 16);
    static const size_t sizes[] = {1, 7, 1000, 100003};
    for (int k = 0; k < 4; k++) {
        size_t n = sizes[k];
        float *g = randv(n, 12.0f), *u = randv(n, 2.0f), *g0 = malloc(n * sizeof *g0);
        memcpy(g0, g, n * sizeof *g0);
        if (n > 2)
            g[1] = g0[1] = -100.0f;   /* exp overflow territory: silu → -0 */
        b->swiglu(b->ctx, g, g, u, n);   /* in place, as the model calls it */
        for (size_t i = 0; i < n; i++) {
            double e = g0[i] / (1.0 + exp(-(double)g0[i])) * u[i];
            assert_double_near(g[i], e, 1e-6 * fabs(e) + 1e-7);
        }
        float *y = randv(n, 1.0f), *y0 = malloc(n * sizeof *y0);
        memcpy(y0, y, n * sizeof *y0);
        b->add(b->ctx, y, u, n);
        for (size_t i = 0; i < n; i++)
            assert_true(y[i] == y0[i] + u[i]);
        free(g);
        free(u);
        free(g0);
        free(y);
        free(y0);
    }
    int nt = 70;
    int64_t n = 1000;
    float *y = randv((size_t)(nt * n), 1.0f), *bias = randv((size_t)n, 1.0f);
    float *y0 = malloc((size_t)(nt * n) * sizeof *y0);
    memcpy(y0, y, (size_t)(nt * n) * sizeof *y0);
    b->add_row(b->ctx, y, bias, n, nt);
    for (int t = 0; t < nt; t++)
        for (int64_t i = 0; i < n; i++)
            assert_true(y[t * n + i] == y0[t * n + i] + bias[i]);
    free(y);
    free(y0);
    free(bias);
    kern_backend_free(b);
}

/* ---- paged attention ------------------------------------------------------------------------- */

typedef struct att_case {
    int n_head, n_kv, d, page_tokens, len;
} att_case;

/* K or V rows as the cache holds them, back in f32: f16-rounded, or quantized by the
 * reference quantizer and multiplied out. */
static void cache_values(const float *x, float *y, size_t n_rows, int d, int type, int group,
                         bool rotate)
{
    int8_t q[256];
    uint16_t sc[256];
    float xrot[256];
    for (size_t r = 0; r < n_rows; r++) {
        const float *xr = x + r * (size_t)d;
        float *yr = y + r * (size_t)d;
        if (rotate) {   /* stored as H x: quantized in that basis, read back through H again */
            memcpy(xrot, xr, (size_t)d * sizeof *xrot);
            kern__vops_get_ref()->hadamard(xrot, d);
            xr = xrot;
        }
        if (type != KERN_KV_Q8) {
            for (int e = 0; e < d; e++)
                yr[e] = kern_f16_to_f32(kern_f32_to_f16(xr[e]));
            continue;
        }
        kern__kv_q8_row(xr, q, sc, d, group);
        for (int e = 0; e < d; e++) {
            float s = kern_f16_to_f32(sc[e / group]);
            yr[e] = (float)q[e] * s;
            assert_true(fabsf(yr[e] - xr[e]) <= 0.5f * s * 1.0001f);  /* half a step */
        }
        if (rotate)
            kern__vops_get_ref()->hadamard(yr, d);
    }
}

static void check_attention(const att_case *ac, int threads, int type, int k_group,
                            bool rotate)
{
    int nh = ac->n_head, nkv = ac->n_kv, d = ac->d, pt = ac->page_tokens, len = ac->len;
    int layers = 2, layer = 1;
    int kg = k_group > 0 && d % k_group == 0 ? k_group : d;
    size_t row = (size_t)nkv * (size_t)d;                  /* values per token per K or V */
    size_t k_region = (size_t)pt * (size_t)nkv * kern_kv_row_bytes(type, d, kg);
    size_t v_region = (size_t)pt * (size_t)nkv * kern_kv_row_bytes(type, d, d);
    size_t page_bytes = (size_t)layers * (k_region + v_region);
    int n_pages = (len + pt - 1) / pt, pool_pages = n_pages + 3;
    uint8_t *pool = malloc(page_bytes * (size_t)pool_pages);
    for (size_t i = 0; i < page_bytes * (size_t)pool_pages / 2; i++)
        ((uint16_t *)pool)[i] = 0x7e00;                     /* NaN: any stray read shows */
    int *perm = malloc((size_t)pool_pages * sizeof *perm);
    for (int i = 0; i < pool_pages; i++)
        perm[i] = i;
    for (int i = pool_pages - 1; i > 0; i--) {
        int k = (int)(rnd() % (uint64_t)(i + 1)), tmp = perm[i];
        perm[i] = perm[k];
        perm[k] = tmp;
    }
    uint8_t **pages = malloc((size_t)(n_pages > 0 ? n_pages : 1) * sizeof *pages);
    for (int i = 0; i < n_pages; i++)
        pages[i] = pool + (size_t)perm[i] * page_bytes;
    kern_kv kv = {.k_off = (size_t)layer * (k_region + v_region),
                  .v_off = (size_t)layer * (k_region + v_region) + k_region, .page_tokens = pt,
                  .n_kv_head = nkv, .head_dim = d, .type = type, .k_group = kg,
                  .rotate = type == KERN_KV_Q8 && rotate && (d & (d - 1)) == 0};

    kern_backend *b = backend(threads, len, 1536, len);
    float *k = randv((size_t)len * row, 1.0f), *v = randv((size_t)len * row, 1.0f);
    if (len > 0)
        k[(size_t)(len - 1) * row] = 9.0f;                  /* an outlier channel value */
    float *kc = malloc((size_t)len * row * sizeof *kc), *vc = malloc((size_t)len * row * sizeof *vc);
    rotate = rotate && type == KERN_KV_Q8 && (d & (d - 1)) == 0;
    cache_values(k, kc, (size_t)len * (size_t)nkv, d, type, kg, rotate);
    cache_values(v, vc, (size_t)len * (size_t)nkv, d, type, d, rotate);
    /* Store in two calls, positions in a scrambled order. */
    int32_t *order = malloc((size_t)len * sizeof *order);
    for (int i = 0; i < len; i++)
        order[i] = i;
    for (int i = len - 1; i > 0; i--) {
        int j = (int)(rnd() % (uint64_t)(i + 1)), tmp = order[i];
        order[i] = order[j];
        order[j] = tmp;
    }
    float *ks = malloc((size_t)len * row * sizeof *ks), *vs = malloc((size_t)len * row * sizeof *vs);
    for (int i = 0; i < len; i++) {
        memcpy(ks + (size_t)i * row, k + (size_t)order[i] * row, row * sizeof *ks);
        memcpy(vs + (size_t)i * row, v + (size_t)order[i] * row, row * sizeof *vs);
    }
    int half = len / 2;
    kern_seq first = {.pages = pages, .tok0 = 0, .n_tok = half};
    kern_seq second = {.pages = pages, .tok0 = half, .n_tok = len - half};
    b->kv_store(b->ctx, &kv, &first, 1, ks, vs, order);
    b->kv_store(b->ctx, &kv, &second, 1, ks, vs, order);

    /* Queries: every position (prefill, causal), the last one alone (decode), a middle chunk. */
    for (int qc = 0; qc < 3; qc++) {
        int nt = qc == 0 ? len : qc == 1 ? 1 : (len < 5 ? len : 5);
        int32_t *pos = malloc((size_t)nt * sizeof *pos);
        for (int i = 0; i < nt; i++)
            pos[i] = qc == 0 ? i : qc == 1 ? len - 1 : len / 2 - nt / 2 + i;
        float *q = randv((size_t)nt * (size_t)nh * (size_t)d, 1.0f);
        float *out = malloc((size_t)nt * (size_t)nh * (size_t)d * sizeof *out);
        kern_seq sq = {.pages = pages, .tok0 = 0, .n_tok = nt};
        kern_attn a = {.q = q, .out = out, .pos = pos, .n_tok = nt, .seqs = &sq, .n_seq = 1,
                       .n_head = nh, .scale = 1.0f / sqrtf((float)d), .kv = kv};
        b->attention(b->ctx, &a);
        int group = nh / nkv;
        const char *mode = getenv("LLMGW_KERNELS");
        bool exact = mode != NULL && strcmp(mode, "exact") == 0 && type == KERN_KV_F16;
        double *s = malloc((size_t)len * sizeof *s);
        for (int t = 0; t < nt; t++)
            for (int h = 0; h < nh; h++) {
                int hk = h / group;
                /* LLMGW_KERNELS=exact has llama.cpp's semantics: q rounded to f16, the
                 * probabilities normalized and rounded to f16 (a value near an f16 rounding
                 * boundary may round the other way here: the tolerance allows one f16 step of
                 * each); the other modes keep q and the probabilities in f32. */
                float qh[256];
                const float *qt = q + ((size_t)t * (size_t)nh + (size_t)h) * (size_t)d;
                if (exact)
                    kern__f16_round_row(qt, qh, d);
                else
                    memcpy(qh, qt, (size_t)d * sizeof *qh);
                double max = -INFINITY, sum = 0;
                for (int j = 0; j <= pos[t]; j++) {
                    double acc = 0;
                    for (int e = 0; e < d; e++)
                        acc += qh[e] * (double)kc[(size_t)j * row + (size_t)hk * (size_t)d + (size_t)e];
                    s[j] = acc / sqrt((double)d);
                    max = s[j] > max ? s[j] : max;
                }
                for (int j = 0; j <= pos[t]; j++)
                    sum += (s[j] = exp(s[j] - max));
                for (int j = 0; j <= pos[t]; j++)
                    s[j] = exact ? kern_f16_to_f32(kern_f32_to_f16((float)(s[j] / sum)))
                                 : s[j] / sum;
                for (int e = 0; e < d; e++) {
                    double o = 0, slack = 0;
                    for (int j = 0; j <= pos[t]; j++) {
                        double vj = vc[(size_t)j * row + (size_t)hk * (size_t)d + (size_t)e];
                        o += s[j] * vj;
                        slack += exact ? fabs(s[j] * vj) * 0x1p-10 : 0;
                    }
                    float got = out[((size_t)t * (size_t)nh + (size_t)h) * (size_t)d + (size_t)e];
                    if (!(fabs(got - o) <= 2e-5 + slack)) {
                        print_error("kv %s/%d heads %d/%d d %d pages of %d len %d threads %d: "
                                    "query %d (pos %d) head %d [%d] = %.7g, expected %.7g\n",
                                    type == KERN_KV_Q8 ? "q8" : "f16", kg, nh, nkv, d, pt, len,
                                    threads, t, pos[t], h, e, got, o);
                        fail();
                    }
                }
            }
        free(s);
        free(pos);
        free(q);
        free(out);
    }
    kern_backend_free(b);
    free(order);
    free(ks);
    free(vs);
    free(k);
    free(v);
    free(kc);
    free(vc);
    free(pages);
    free(perm);
    free(pool);
}

static void attention_paged_gqa_causal(void **state)
{
    (void)state;
    static const att_case cases[] = {
        {9, 3, 64, 7, 50},     /* the target model's heads; 7-token pages */
        {4, 4, 32, 16, 33},    /* no grouping */
        {18, 2, 64, 5, 23},    /* groups of 9: more than one chunk of query heads */
        {2, 1, 36, 3, 10},     /* head size not a multiple of 8 */
        {9, 3, 64, 256, 300},  /* one big page and a bit */
        {8, 1, 128, 16, 1},    /* a single token */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int th = 1; th <= 3; th++) {
            check_attention(&cases[i], th, KERN_KV_F16, 0, false);
            check_attention(&cases[i], th, KERN_KV_Q8, 0, false);   /* one K scale per head */
            check_attention(&cases[i], th, KERN_KV_Q8, 32, false);  /* per 32 channels */
            check_attention(&cases[i], th, KERN_KV_Q8, 0, true);    /* rotated (d 2^n) */
            check_attention(&cases[i], th, KERN_KV_Q8, 32, true);
        }
}

/* A step's sequences in one kv_store and one attention call (as the engine makes them): three
 * sequences with their own K, V and pages in one pool (a prefill of 40 rows, a decode row, a
 * chunk of 6), their rows interleaved in neither order nor table; each sequence's outputs are
 * bit for bit those of a call of its own, and its K/V rows those stored one sequence a call.
 * A sequence of no rows is skipped. On 1 and 3 threads, f16 and rotated Q8 K/V. */
static void attention_many_sequences(void **state)
{
    (void)state;
    enum { NS = 4, LEN = 45, PT = 8, NH = 9, NKV = 3, D = 64 };
    const int n_tok[NS] = {40, 1, 0, 6}, p0[NS] = {0, LEN - 1, 0, 20};
    int n_pages = (LEN + PT - 1) / PT;
    for (int kvt = 0; kvt < 2; kvt++)
        for (int th = 1; th <= 3; th += 2) {
            int type = kvt == 0 ? KERN_KV_F16 : KERN_KV_Q8;
            size_t k_row = kern_kv_row_bytes(type, D, D), region = (size_t)PT * NKV * k_row;
            kern_kv kv = {.k_off = 0, .v_off = region, .page_tokens = PT, .n_kv_head = NKV,
                          .head_dim = D, .type = type, .rotate = kvt == 1};
            size_t pool_bytes = (size_t)NS * (size_t)n_pages * 2 * region;
            uint8_t *pool[2] = {calloc(1, pool_bytes), calloc(1, pool_bytes)};
            uint8_t *tables[2][NS][8];
            for (int b = 0; b < 2; b++)
                for (int q = 0; q < NS; q++)
                    for (int i = 0; i < n_pages; i++)   /* the sequences' pages interleaved */
                        tables[b][q][i] = pool[b] + ((size_t)i * NS + (size_t)(NS - 1 - q)) *
                                                        2 * region;
            /* Every sequence's positions 0 .. LEN - 1 stored: rows of all four in one call
             * (pool 0), or one call a sequence (pool 1). */
            size_t row = (size_t)NKV * D;
            float *k = randv((size_t)NS * LEN * row, 1.0f);
            float *v = randv((size_t)NS * LEN * row, 1.0f);
            int32_t pos[NS * LEN];
            kern_seq all[NS];
            for (int q = 0; q < NS; q++) {
                for (int i = 0; i < LEN; i++)
                    pos[q * LEN + i] = i;
                all[q] = (kern_seq){tables[0][q], q * LEN, LEN};
            }
            kern_backend *b = backend(th, NS * LEN, 1536, LEN);
            b->kv_store(b->ctx, &kv, all, NS, k, v, pos);
            for (int q = 0; q < NS; q++) {
                kern_seq one = {tables[1][q], q * LEN, LEN};
                b->kv_store(b->ctx, &kv, &one, 1, k, v, pos);
            }
            for (int q = 0; q < NS; q++)
                for (int i = 0; i < n_pages; i++)
                    assert_memory_equal(tables[0][q][i], tables[1][q][i], 2 * region);
            /* The attention of the step's rows, then of each sequence alone. */
            int rows = 0;
            int32_t qpos[64];
            kern_seq step[NS];
            for (int q = 0; q < NS; q++) {
                step[q] = (kern_seq){tables[0][q], rows, n_tok[q]};
                for (int i = 0; i < n_tok[q]; i++)
                    qpos[rows + i] = p0[q] + i;
                rows += n_tok[q];
            }
            size_t qn = (size_t)rows * NH * D;
            float *qv = randv(qn, 1.0f), *batched = malloc(qn * 4), *alone = malloc(qn * 4);
            kern_attn a = {.q = qv, .out = batched, .pos = qpos, .n_tok = rows, .seqs = step,
                           .n_seq = NS, .n_head = NH, .scale = 0.125f, .kv = kv};
            b->attention(b->ctx, &a);
            for (int q = 0; q < NS; q++) {
                a.out = alone;
                a.seqs = &step[q];
                a.n_seq = 1;
                b->attention(b->ctx, &a);
            }
            assert_memory_equal(batched, alone, qn * 4);
            kern_backend_free(b);
            free(qv);
            free(batched);
            free(alone);
            free(k);
            free(v);
            free(pool[0]);
            free(pool[1]);
        }
}

/* The rotation of a rotated Q8 cache: orthonormal (norms kept) and its own inverse, and row 1
 * of H / sqrt(d) is what the Walsh-Hadamard butterflies make of the unit vector e_1. */
static void hadamard_orthonormal(void **state)
{
    (void)state;
    for (int d = 1; d <= 256; d *= 2) {
        const kern_vops *best = kern__vops_get(), *ref = kern__vops_get_ref();
        float *x = randv((size_t)d, 1.0f), y[256], yb[256], e1[256] = {0};
        double n0 = 0, n1 = 0;
        memcpy(y, x, (size_t)d * sizeof *y);
        memcpy(yb, x, (size_t)d * sizeof *yb);
        ref->hadamard(y, d);
        best->hadamard(yb, d);
        assert_memory_equal(y, yb, (size_t)d * sizeof *y);   /* the twins agree bit for bit */
        for (int i = 0; i < d; i++) {
            n0 += (double)x[i] * x[i];
            n1 += (double)y[i] * y[i];
        }
        assert_double_near(n0, n1, 1e-5 * n0);
        ref->hadamard(y, d);
        for (int i = 0; i < d; i++)
            assert_double_near(y[i], x[i], 1e-5);
        if (d >= 2) {
            e1[1] = 1;
            best->hadamard(e1, d);
            for (int i = 0; i < d; i++)   /* H[i][1] = (-1)^(i & 1) */
                assert_double_near(e1[i], ((i & 1) ? -1.0 : 1.0) / sqrt((double)d), 1e-6);
        }
        free(x);
    }
}

/* The default attention helpers (any summation order) against their references, at shapes
 * around their register blocking: 1-7 rows, key counts not multiples of 4, head sizes 32..128
 * and ones that are not multiples of 8. */
static void fast_attention_helpers_match_ref(void **state)
{
    (void)state;
    const kern_vops *b = kern__vops_get(), *r = kern__vops_get_ref();
    static const int dims[] = {32, 64, 128, 40, 36};
    for (int di = 0; di < 5; di++)
        for (int nq = 1; nq <= 7; nq++)
            for (int n = 1; n <= 11; n += 5) {
                int d = dims[di];
                size_t stride = (size_t)d + 8;
                uint16_t *kv = malloc((size_t)n * stride * sizeof *kv);
                for (size_t i = 0; i < (size_t)n * stride; i++)
                    kv[i] = kern_f32_to_f16(frand());
                float *qb = randv((size_t)nq * (size_t)d, 1.0f);
                float *sb = calloc((size_t)nq * 16, sizeof *sb), *sr = calloc((size_t)nq * 16, sizeof *sr);
                float *ob = randv((size_t)nq * (size_t)d, 1.0f), *orf = malloc((size_t)nq * (size_t)d * sizeof *orf);
                memcpy(orf, ob, (size_t)nq * (size_t)d * sizeof *orf);
                const float *q[8];
                float *s1[8], *s2[8], *o1[8], *o2[8];
                for (int i = 0; i < nq; i++) {
                    q[i] = qb + (size_t)i * (size_t)d;
                    s1[i] = sb + 16 * i;
                    s2[i] = sr + 16 * i;
                    o1[i] = ob + (size_t)i * (size_t)d;
                    o2[i] = orf + (size_t)i * (size_t)d;
                }
                b->qk(q, nq, kv, stride, n, d, 0.125f, s1, 2);
                r->qk(q, nq, kv, stride, n, d, 0.125f, s2, 2);
                for (int i = 0; i < nq; i++)
                    for (int j = 0; j < n; j++)
                        assert_double_near(s1[i][2 + j], s2[i][2 + j], 1e-5 * d);
                b->pv(o1, nq, (const float *const *)s2, 2, kv, stride, n, d);
                r->pv(o2, nq, (const float *const *)s2, 2, kv, stride, n, d);
                for (size_t i = 0; i < (size_t)nq * (size_t)d; i++)
                    assert_double_near(ob[i], orf[i], 1e-5 * n);
                /* The same rows as KERN_KV_Q8 (d int8 values, then the scales). */
                for (int g = 8; g <= d; g *= 2) {
                    if (d % g != 0)
                        continue;
                    size_t qs = (size_t)d + 2 * (size_t)(d / g) + 6;
                    uint8_t *k8 = malloc((size_t)n * qs);
                    for (int j = 0; j < n; j++) {
                        float x[128];
                        for (int e = 0; e < d; e++)
                            x[e] = frand();
                        kern__kv_q8_row(x, (int8_t *)(k8 + (size_t)j * qs),
                                        (uint16_t *)(k8 + (size_t)j * qs + d), d, g);
                    }
                    b->qk_q8(q, nq, k8, qs, n, d, g, 0.125f, s1, 2);
                    r->qk_q8(q, nq, k8, qs, n, d, g, 0.125f, s2, 2);
                    for (int i = 0; i < nq; i++)
                        for (int j = 0; j < n; j++)
                            assert_double_near(s1[i][2 + j], s2[i][2 + j], 1e-5 * d);
                    if (g == d) {   /* V rows: one scale */
                        memcpy(o1[0], o2[0], (size_t)nq * (size_t)d * sizeof *ob);
                        b->pv_q8(o1, nq, (const float *const *)s2, 2, k8, qs, n, d);
                        r->pv_q8(o2, nq, (const float *const *)s2, 2, k8, qs, n, d);
                        for (size_t i = 0; i < (size_t)nq * (size_t)d; i++)
                            assert_double_near(ob[i], orf[i], 1e-5 * n);
                    }
                    free(k8);
                }
                float e1[16], e2[16];
                memcpy(e1, s2[0], sizeof e1);
                memcpy(e2, s2[0], sizeof e2);
                float m = 0.5f;
                assert_double_near(b->softmax_exp(e1 + 2, n, m), r->softmax_exp(e2 + 2, n, m), 1e-5 * n);
                for (int j = 0; j < n; j++)
                    assert_double_near(e1[2 + j], e2[2 + j], 1e-6);
                free(kv);
                free(qb);
                free(sb);
                free(sr);
                free(ob);
                free(orf);
            }
}

/* The vector helpers behind the ops (best variant) against their references, at shapes around
 * their blocking: 1-7 query rows, key counts around the 16- and 64-element steps of the two
 * summation orders, head sizes 32..128 and ones that are not multiples of 16. The SIMD twins
 * sum in the references' order, so they agree bit for bit. */
static void vector_helpers_match_ref(void **state)
{
    (void)state;
    const kern_vops *b = kern__vops_get(), *r = kern__vops_get_ref();
    static const int dims[] = {32, 64, 128, 40, 36};
    float *acc = malloc(KERN_PV_ACC_FLOATS * sizeof *acc);
    for (int order = 0; order < 2; order++)
    for (int di = 0; di < 5; di++)
        for (int nq = 1; nq <= 7; nq++)
            for (int n = 1; n <= 150; n += 37) {
                int d = dims[di];
                size_t stride = (size_t)d + 8;
                uint16_t *kv = malloc((size_t)n * stride * sizeof *kv);
                const uint16_t **rows = malloc((size_t)n * sizeof *rows);
                for (size_t i = 0; i < (size_t)n * stride; i++)
                    kv[i] = kern_f32_to_f16(frand());
                for (int j = 0; j < n; j++)
                    rows[j] = kv + (size_t)j * stride;
                float *qb = randv((size_t)nq * (size_t)d, 1.0f);
                kern__f16_round_row(qb, qb, (int64_t)nq * d);
                float *sb = calloc((size_t)nq * (size_t)n, sizeof *sb);
                float *sr = calloc((size_t)nq * (size_t)n, sizeof *sr);
                float *ob = calloc((size_t)nq * (size_t)d, sizeof *ob);
                float *orf = calloc((size_t)nq * (size_t)d, sizeof *orf);
                const float *q[8];
                float *s1[8], *s2[8], *o1[8], *o2[8];
                for (int i = 0; i < nq; i++) {
                    q[i] = qb + (size_t)i * (size_t)d;
                    s1[i] = sb + (size_t)i * (size_t)n;
                    s2[i] = sr + (size_t)i * (size_t)n;
                    o1[i] = ob + (size_t)i * (size_t)d;
                    o2[i] = orf + (size_t)i * (size_t)d;
                }
                b->qk_exact(q, nq, rows, n, d, 0.125f, s1, order);
                r->qk_exact(q, nq, rows, n, d, 0.125f, s2, order);
                for (int i = 0; i < nq; i++)
                    for (int j = 0; j < n; j++)
                        assert_true(s1[i][j] == s2[i][j]);
                float m = 0.5f;
                double e1 = b->softmax_exact(s1[0], n, m), e2 = r->softmax_exact(s2[0], n, m);
                assert_true(e1 == e2);
                for (int j = 0; j < n; j++)
                    assert_true(s1[0][j] == s2[0][j]);
                b->probs_f16(s1[0], n, (float)(1.0 / e1));
                r->probs_f16(s2[0], n, (float)(1.0 / e2));
                for (int j = 0; j < n; j++)
                    assert_true(s1[0][j] == s2[0][j]);
                for (int i = 0; i < nq; i += 3) {
                    int m3 = nq - i < 3 ? nq - i : 3;
                    b->pv_exact(o1 + i, m3, (const float *const *)s2 + i, rows, n, d, order, acc);
                    r->pv_exact(o2 + i, m3, (const float *const *)s2 + i, rows, n, d, order, acc);
                }
                for (size_t i = 0; i < (size_t)nq * (size_t)d; i++)
                    assert_true(ob[i] == orf[i]);
                free(kv);
                free(rows);
                free(qb);
                free(sb);
                free(sr);
                free(ob);
                free(orf);
            }
    free(acc);
    /* exp over its whole range, saturation included */
    for (int i = -2000; i <= 2000; i++) {
        float xs[8], y8[8];
        for (int k = 0; k < 8; k++)
            xs[k] = (float)i * 0.0625f + (float)k * 0.00390625f;
        float y1v[8], g1[8], u1[8];
        for (int k = 0; k < 8; k++) {
            g1[k] = xs[k];
            u1[k] = 1.0f;
        }
        b->swiglu(y1v, g1, u1, 8);
        r->swiglu(y8, g1, u1, 8);
        for (int k = 0; k < 8; k++)
            assert_true(y1v[k] == y8[k] || (y1v[k] != y1v[k] && y8[k] != y8[k]));
    }
    float x[37], y1[37], y2[37], w[37];
    for (int i = 0; i < 37; i++) {
        x[i] = frand() * 3;
        w[i] = frand();
    }
    assert_double_near(b->sumsq(x, 37), r->sumsq(x, 37), 1e-9);
    b->scale_mul(y1, x, w, 0.7f, 37);
    r->scale_mul(y2, x, w, 0.7f, 37);
    for (int i = 0; i < 37; i++)
        assert_double_near(y1[i], y2[i], 1e-6);
}

/* A token's results do not depend on what else is in the batch: attention always (each query
 * row is computed the same way whether it decodes alone or sits in a prefill unit), matmul under
 * LLMGW_KERNELS=invariant or ref and for F16 weights in every mode (bit for bit: its tile sums
 * as its dot, with a tail of columns and without, one row against up to seven tokens or groups
 * of three over blocks of rows), and otherwise within rounding (the other several-token tiles
 * sum in another order than the one-token kernels). */
static void batch_invariance(void **state)
{
    (void)state;
    const char *mode = getenv("LLMGW_KERNELS");
    bool strict = mode != NULL && (strcmp(mode, "invariant") == 0 || strcmp(mode, "ref") == 0);
    kern_backend *b = backend(2, 12, 1536, 64);
    static const uint32_t tt[] = {KERN_TYPE_Q4_1, KERN_TYPE_Q8_0, KERN_TYPE_Q6_K, KERN_TYPE_F16,
                                  KERN_TYPE_F16, KERN_TYPE_F16};
    for (int ti = 0; ti < 6; ti++) {
        const kern_wtype *t = kern_wtype_get_ref(tt[ti]);
        /* F16: with a tail (517), SmolLM2's 576 and its FFN's 1536 */
        int64_t rows = 40, cols = ti == 3 ? 517 : ti == 4 ? 576 : ti == 5 ? 1536 : 512;
        size_t rb = kern_type_row_bytes(t->type, (uint64_t)cols);
        /* The F16 tile takes a row at a time against all tokens while their activations fit
         * L1 (two passes over it from 4 tokens on), and groups of as many as fit L1 (at least
         * three) over blocks of rows past that: at 576 columns 3, 5 and 7 tokens see the first,
         * 12 the second; at 1536 every count the second, 7 tokens in groups of 3 + 4 (one of
         * them in two passes). */
        float *wf = randv((size_t)(rows * cols), 0.05f), *x = randv((size_t)(12 * cols), 1.0f);
        uint8_t *w = malloc(rb * (size_t)rows);
        for (int64_t r = 0; r < rows; r++)
            t->from_f32(wf + r * cols, w + (size_t)r * rb, cols);
        kern_tensor wt = {.type = tt[ti], .rows = rows, .cols = cols, .row_bytes = rb, .data = w};
        float yb[12 * 40], ys[12 * 40], y7[7 * 40], y5[5 * 40], y3[3 * 40];
        b->matmul(b->ctx, &wt, x, 12, yb, rows);
        b->matmul(b->ctx, &wt, x, 7, y7, rows);
        b->matmul(b->ctx, &wt, x, 5, y5, rows);
        b->matmul(b->ctx, &wt, x, 3, y3, rows);
        for (int k = 0; k < 12; k++)
            b->matmul(b->ctx, &wt, x + k * cols, 1, ys + k * rows, rows);
        for (int r = 0; r < rows; r++)   /* dequantized weights, for the magnitudes below */
            t->to_f32(w + (size_t)r * rb, wf + r * cols, cols);
        /* Q4_1: three tokens (a short draft's verification) go through the multi-token dot,
         * which sums as the dot, or token by token (AVX-512, exact, ref): the same bits in every
         * mode. */
        if (tt[ti] == KERN_TYPE_Q4_1 || strict)
            assert_memory_equal(y3, ys, sizeof y3);
        for (int i = 0; i < 12 * 40; i++) {
            if (strict || tt[ti] == KERN_TYPE_F16) {
                assert_memory_equal(&yb[i], &ys[i], sizeof yb[i]);
                if (i < 7 * 40)
                    assert_memory_equal(&y7[i], &ys[i], sizeof y7[i]);
                if (i < 5 * 40)
                    assert_memory_equal(&y5[i], &ys[i], sizeof y5[i]);
                continue;
            }
            /* Within rounding; for K-quants the tiles quantize activations in blocks of 32 instead
             * of 256, so within that quantization error. */
            double mag = 0;
            for (int64_t e = 0; e < cols; e++)
                mag += fabs((double)wf[(i % 40) * cols + e] * x[(i / 40) * cols + e]);
            double tol = (t->act == KERN_ACT_Q8_K ? 1e-2 : 1e-5) * mag + 1e-6;
            assert_double_near(yb[i], ys[i], tol);
            if (i < 5 * 40)
                assert_double_near(y5[i], ys[i], tol);
        }
        free(wf);
        free(x);
        free(w);
    }
    kern_backend_free(b);

    /* Attention: 37 positions at once, then the last one alone, through 5-token pages. */
    int nh = 9, nkv = 3, d = 64, pt = 5, len = 37;
    size_t row = (size_t)nkv * (size_t)d, region = (size_t)pt * row * 2;
    int n_pages = (len + pt - 1) / pt;
    uint8_t *pool = calloc((size_t)n_pages, 2 * region);
    uint8_t **pages = malloc((size_t)n_pages * sizeof *pages);
    for (int i = 0; i < n_pages; i++)
        pages[n_pages - 1 - i] = pool + (size_t)i * 2 * region;
    kern_kv kv = {.k_off = 0, .v_off = region, .page_tokens = pt, .n_kv_head = nkv,
                  .head_dim = d};
    kern_seq whole = {.pages = pages, .tok0 = 0, .n_tok = len}, last = {.pages = pages, .n_tok = 1};
    kern_backend *a2 = backend(2, len, 1536, len);
    float *k = randv((size_t)len * row, 1.0f), *v = randv((size_t)len * row, 1.0f);
    int32_t pos[37];
    for (int i = 0; i < len; i++)
        pos[i] = i;
    a2->kv_store(a2->ctx, &kv, &whole, 1, k, v, pos);
    size_t qn = (size_t)nh * (size_t)d;
    float *q = randv((size_t)len * qn, 1.0f), *o_all = malloc((size_t)len * qn * sizeof *o_all);
    float *o_one = malloc(qn * sizeof *o_one);
    kern_attn all = {.q = q, .out = o_all, .pos = pos, .n_tok = len, .seqs = &whole, .n_seq = 1,
                     .n_head = nh, .scale = 0.125f, .kv = kv};
    a2->attention(a2->ctx, &all);
    /* The same batch size: llama.cpp's summation order depends on it (kern_attn.n_batch);
     * LLMGW_KERNELS=invariant fixes one order whatever the batch. */
    bool inv = getenv("LLMGW_KERNELS") != NULL && strcmp(getenv("LLMGW_KERNELS"), "invariant") == 0;
    kern_attn one = {.q = q + (size_t)(len - 1) * qn, .out = o_one, .pos = pos + len - 1,
                     .n_tok = 1, .seqs = &last, .n_seq = 1, .n_head = nh, .scale = 0.125f,
                     .kv = kv,
                     .n_batch = inv ? 1 : len};
    a2->attention(a2->ctx, &one);
    assert_memory_equal(o_one, o_all + (size_t)(len - 1) * qn, qn * sizeof *o_one);
    kern_backend_free(a2);
    free(pool);
    free(pages);
    free(k);
    free(v);
    free(q);
    free(o_all);
    free(o_one);
}

/* The largest difference between a and b relative to b's largest magnitude. */
static float max_rel(const float *a, const float *b, size_t n)
{
    float worst = 0, scale = 1e-30f;
    for (size_t i = 0; i < n; i++) {
        float d = fabsf(a[i] - b[i]);
        worst = d > worst ? d : worst;
        scale = fabsf(b[i]) > scale ? fabsf(b[i]) : scale;
    }
    return worst / scale;
}

/* The encoder's entries against their scalar references (kernels/cpu/encoder_ref.c): dense on
 * every path (packed f32 at or under packed_max: bit for bit; sgemm, BF16 and widths that are no
 * multiple of 16: within tolerance), with and without the residual and GELU; a row's result
 * does not depend on its batch; layernorm, gelu and attention over sequences of uneven lengths. */
static void encoder_ops_match_ref(void **state)
{
    (void)state;
    kern_backend *b = kern_cpu_backend_new(2);
    assert_non_null(b);
    static const struct { int n, k, T; } shapes[] = {
        {384, 384, 1}, {1152, 384, 15}, {1536, 384, 40}, {384, 1536, 7}, {40, 24, 5}, {33, 17, 3},
        {48, 64, 33}, {32, 48, 6},  /* AMX: an odd block per thread, 32 + 1 tokens; K % 32 */
    };
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        for (int prec = KERN_DENSE_F32; prec <= KERN_DENSE_BF16; prec++) {
            const int n = shapes[si].n, k = shapes[si].k, T = shapes[si].T;
            float *w = randv((size_t)n * k, 0.1f), *bias = randv((size_t)n, 0.5f);
            float *x = randv((size_t)T * k, 1.0f), *y0 = randv((size_t)T * n, 1.0f);
            float *y = malloc((size_t)T * n * sizeof *y), *r = malloc((size_t)T * n * sizeof *r);
            kern_dense *d = b->dense_new(b->ctx, w, bias, n, k, prec);
            assert_non_null(d);
            assert_int_equal(d->n, n);
            if (prec == KERN_DENSE_F32)
                assert_false(d->bf16);
            if (prec == KERN_DENSE_BF16 && n % 16 == 0 && k % 2 == 0 &&
                kern_cpu_features_get()->avx512f && __builtin_cpu_supports("avx512bf16"))
                assert_true(d->bf16);
            const char *what = b->dense_kernels(b->ctx, d);
            if (si == 0 && prec == KERN_DENSE_BF16)
                printf("[ INFO     ] bf16 products: %s\n", !d->bf16 ? "none here"
                       : kern__amx_usable() ? "AMX tiles" : "AVX512-BF16");
            bool ref = strcmp(b->kernels(b->ctx), "ref") == 0;
            /* the packed kernel runs T tokens when it won the race at every batch, or up to a
             * batch at least T ("packed up to N tokens, sgemm above") */
            const char *upto = strstr(what, "packed up to ");
            bool packed = strstr(what, "packed at every batch") != NULL ||
                          (upto != NULL && T <= atoi(upto + strlen("packed up to ")));
            bool exact = !d->bf16 && n % 16 == 0 && (ref || packed);
            for (int mode = 0; mode < 4; mode++) {
                bool acc = mode & 1, gelu = mode & 2;
                memcpy(y, y0, (size_t)T * n * sizeof *y);
                memcpy(r, y0, (size_t)T * n * sizeof *r);
                b->dense(b->ctx, d, x, T, y, acc, gelu);
                kern__enc_dense_ref(w, bias, n, k, x, T, r, acc, gelu);
                if (exact && !gelu) {
                    assert_memory_equal(y, r, (size_t)T * n * sizeof *y);
                } else {
                    /* BF16 inputs carry 8 bits: ~k^0.5 * 2^-9 relative to the row's scale */
                    float tol = d->bf16 ? 3e-2f : 2e-4f, e = max_rel(y, r, (size_t)T * n);
                    if (e > tol)
                        fail_msg("dense %dx%d T=%d %s mode %d: rel error %g > %g", n, k, T,
                                 d->bf16 ? "bf16" : "f32", mode, e, tol);
                }
            }
            /* batch invariance: the last row alone equals the last row in the batch */
            b->dense(b->ctx, d, x, T, y, false, true);
            float *one = malloc((size_t)n * sizeof *one);
            b->dense(b->ctx, d, x + (size_t)(T - 1) * k, 1, one, false, true);
            if (exact || d->bf16)
                assert_memory_equal(one, y + (size_t)(T - 1) * n, (size_t)n * sizeof *one);
            b->dense_free(b->ctx, d);
            free(one);
            free(w);
            free(bias);
            free(x);
            free(y0);
            free(y);
            free(r);
        }
    b->dense_free(b->ctx, NULL);
    /* layernorm and gelu */
    const int n = 384, T = 9;
    float *x = randv((size_t)T * n, 3.0f), *g = randv(n, 1.0f), *bb = randv(n, 1.0f);
    float *y = malloc((size_t)T * n * sizeof *y);
    memcpy(y, x, (size_t)T * n * sizeof *y);
    b->layernorm(b->ctx, y, g, bb, n, T, 1e-12f);
    kern__enc_layernorm_ref(x, g, bb, n, T, 1e-12f);
    assert_true(max_rel(y, x, (size_t)T * n) < 1e-4f);
    for (size_t i = 0; i < (size_t)T * n; i++)
        x[i] = y[i] = (float)((int)(i % 201) - 100) * 0.06f;   /* -6 .. 6 */
    b->gelu(b->ctx, y, (size_t)T * n - 5);                     /* a tail that is no multiple */
    kern__enc_gelu_ref(x, (size_t)T * n - 5);
    for (size_t i = 0; i < (size_t)T * n; i++)
        assert_true(fabsf(y[i] - x[i]) < 2e-6f + 2e-6f * fabsf(x[i]));
    /* attention: three sequences of 1, 7 and 13 tokens, 4 heads of 32 */
    const int nh = 4, hd = 32, H = nh * hd;
    int32_t start[4] = {0, 1, 8, 21};
    float *qkv = randv((size_t)21 * 3 * H, 2.0f);
    float *o = malloc((size_t)21 * H * sizeof *o), *ro = malloc((size_t)21 * H * sizeof *ro);
    b->encoder_attention(b->ctx, qkv, o, start, 3, nh, hd);
    kern__enc_attention_ref(qkv, ro, start, 3, nh, hd);
    assert_true(max_rel(o, ro, (size_t)21 * H) < 1e-4f);
    for (int e = 0; e < H; e++)   /* a one-token sequence attends to itself only: out = v */
        assert_true(fabsf(o[e] - qkv[2 * H + e]) < 1e-6f);
    free(x);
    free(g);
    free(bb);
    free(y);
    free(qkv);
    free(o);
    free(ro);
    kern_backend_free(b);
}

/* Devices by name; what this build can open; NULL-safe freeing; the type and memory entries. */
static void devices_and_doors(void **state)
{
    (void)state;
    kern_device d;
    assert_int_equal(kern_device_parse("cpu", &d), 0);
    assert_int_equal(d.kind, KERN_DEV_CPU);
    assert_int_equal(kern_device_parse("cuda:3", &d), 0);
    assert_int_equal(d.kind, KERN_DEV_CUDA);
    assert_int_equal(d.index, 3);
    assert_int_equal(kern_device_parse("cuda", &d), 0);
    assert_int_equal(d.index, 0);
    assert_int_equal(kern_device_parse(NULL, &d), 0);
    assert_int_equal(d.kind, KERN_DEV_AUTO);
    assert_int_equal(kern_device_parse("auto", &d), 0);
    static const char *const bad[] = {"gpu", "CPU", "cuda:", "cuda:x", "cuda:1x", "cuda:-1",
                                      "cuda0", "cuda:999", ""};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_int_equal(kern_device_parse(bad[i], &d), -1);

    util_err err;
    kern_backend *b = NULL;
    assert_int_equal(kern_backend_open("gpu", 1, &b, &err), LLMGW_EINVAL);
    assert_null(b);
    assert_contains(err.msg, "expected cpu, cuda, cuda:N or auto");
    /* A CUDA device opens only where this build has the CUDA backend and the machine the
     * device (tests/unit/kernels/test_cuda.c tests it there); otherwise it is refused with the
     * reason, never a CPU backend in its place, and "auto" is the CPU. */
    int n_cuda = kern_cuda_devices();
    int rc = kern_backend_open("cuda:0", 1, &b, &err);
    if (n_cuda == 0) {
        assert_int_equal(rc, LLMGW_EINVAL);
        assert_null(b);
        assert_contains(err.msg, "cuda:0");
    } else {
        assert_int_equal(rc, 0);
        assert_string_equal(b->name, "cuda:0");
        kern_backend_free(b);
    }
    assert_int_equal(kern_backend_open("cuda:7", 1, &b, &err), n_cuda > 7 ? 0 : LLMGW_EINVAL);
    kern_backend_free(b);
    assert_int_equal(kern_backend_open("auto", 1, &b, &err), 0);
    assert_string_equal(b->name, n_cuda > 0 ? "cuda:0" : "cpu");
    kern_backend_free(b);
    assert_int_equal(kern_backend_open("cpu", 1, &b, &err), 0);
    assert_string_equal(b->name, "cpu");
    assert_true(b->host_memory);
    assert_true(b->supports_type(b->ctx, KERN_TYPE_Q4_K));
    assert_true(b->supports_type(b->ctx, KERN_TYPE_BF16));
    assert_false(b->supports_type(b->ctx, 13));   /* Q5_K: no kernel */
    assert_false(b->supports_type(b->ctx, 1000));
    const char *k = b->kernels(b->ctx);
    assert_true(!strcmp(k, "ref") || !strcmp(k, "avx2") || !strcmp(k, "avx512"));
    /* a buffer: written and read back through the backend, at an offset */
    uint8_t *buf = b->buffer_alloc(b->ctx, 1 << 20);
    assert_non_null(buf);
    char in[] = "page bytes", out[sizeof in];
    b->buffer_copy_in(b->ctx, buf, (1 << 20) - sizeof in, in, sizeof in);
    b->buffer_copy_out(b->ctx, buf, (1 << 20) - sizeof in, out, sizeof out);
    assert_string_equal(out, in);
    b->buffer_free(b->ctx, buf, 1 << 20);
    assert_null(b->buffer_alloc(b->ctx, 0));
    kern_backend_free(b);
    kern_backend_free(NULL);   /* a no-op */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(devices_and_doors),
        cmocka_unit_test(encoder_ops_match_ref),
        cmocka_unit_test(matmul_every_type),
        cmocka_unit_test(matmul_model_shapes),
        cmocka_unit_test(repack_for_drafting),
        cmocka_unit_test(get_rows_every_type),
        cmocka_unit_test(rmsnorm_in_place),
        cmocka_unit_test(rope_normal_and_neox),
        cmocka_unit_test(rope_freq_factors),
        cmocka_unit_test(swiglu_add_add_row),
        cmocka_unit_test(attention_paged_gqa_causal),
        cmocka_unit_test(attention_many_sequences),
        cmocka_unit_test(fast_attention_helpers_match_ref),
        cmocka_unit_test(hadamard_orthonormal),
        cmocka_unit_test(vector_helpers_match_ref),
        cmocka_unit_test(batch_invariance),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
