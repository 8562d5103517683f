/* tests/unit/kernels/test_quant.c: the weight types of kernels/cpu/quant.h. GGUF block layouts
 * against hand-built blocks decoded by the documented formulas; every SIMD twin (dot, activation
 * quantization, to_f32, the matrix-vector and tile kernels) against its scalar reference on random
 * data of several lengths; from_f32 → to_f32 within each type's quantization error; f16 and bf16
 * conversions at their edges (subnormals, infinities, NaN, ties). Run under LLMGW_KERNELS=ref too
 * (ctest kernels/quant_ref), where the "best" variant is the reference itself. */
#include "kernels/cpu/internal.h"

#include "kernels/cpu/features.h"
#include "tests/unit/unit.h"

#include <stdlib.h>

static const uint32_t types[] = {KERN_TYPE_F32, KERN_TYPE_F16, KERN_TYPE_BF16, KERN_TYPE_Q4_0,
                                 KERN_TYPE_Q4_1, KERN_TYPE_Q8_0, KERN_TYPE_Q4_K, KERN_TYPE_Q6_K};
enum { N_TYPES = sizeof types / sizeof types[0] };

/* Every variant this CPU can run, each a full op table built the way quant.c builds its best
 * one (reference, then AVX2 installed over it, then AVX-512 over that), so the AVX2 twins are
 * tested even where AVX-512 hides them. */
typedef struct variant {
    const char *name;
    kern_wops ops[N_TYPES];
} variant;

static variant variants[3];
static int n_variants;
/* LLMGW_KERNELS=exact's table: the best variant with kern__quant_make_exact applied. */
static variant exact_variant;

static int setup_variants(void **state)
{
    (void)state;
    const kern_cpu_features *f = kern_cpu_features_get();
    variant *v = &variants[0];
    v->name = "ref";
    for (int i = 0; i < N_TYPES; i++)
        v->ops[i] = *kern__wops_get_ref(types[i]);
    n_variants = 1;
#if defined(__x86_64__)
    if (f->avx2 && f->fma && f->f16c) {
        variants[1] = variants[0];
        variants[1].name = "avx2";
        kern__quant_install_avx2(variants[1].ops, N_TYPES);
        n_variants = 2;
        if (f->avx512f && f->avx512bw && f->avx512vl && f->avx512vnni) {
            variants[2] = variants[1];
            variants[2].name = "avx512";
            kern__quant_install_avx512(variants[2].ops, N_TYPES);
            n_variants = 3;
        }
    }
#else
    (void)f;
#endif
    exact_variant = variants[n_variants - 1];
    exact_variant.name = "exact";
    kern__quant_make_exact(exact_variant.ops, N_TYPES);
    return 0;
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

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

static float f32_of_bits(uint32_t b)
{
    float f;
    memcpy(&f, &b, sizeof f);
    return f;
}

static uint32_t bits_of_f32(float f)
{
    uint32_t b;
    memcpy(&b, &f, sizeof b);
    return b;
}

static size_t row_bytes(const kern_wtype *t, int64_t n)
{
    return (size_t)(n / kern_type_get(t->type)->block_elems) * kern_type_get(t->type)->block_bytes;
}

/* ---- f16 / bf16 ------------------------------------------------------------------------------ */

static void f16_decode_edges(void **state)
{
    (void)state;
    assert_true(kern_f16_to_f32(0x0000) == 0.0f && !signbit(kern_f16_to_f32(0x0000)));
    assert_true(kern_f16_to_f32(0x8000) == 0.0f && signbit(kern_f16_to_f32(0x8000)));
    assert_double_near(kern_f16_to_f32(0x0001), ldexp(1, -24), 0);          /* min subnormal */
    assert_double_near(kern_f16_to_f32(0x03ff), 1023 * ldexp(1, -24), 0);   /* max subnormal */
    assert_double_near(kern_f16_to_f32(0x0400), ldexp(1, -14), 0);          /* min normal */
    assert_double_near(kern_f16_to_f32(0x3c00), 1.0, 0);
    assert_double_near(kern_f16_to_f32(0xc000), -2.0, 0);
    assert_double_near(kern_f16_to_f32(0x7bff), 65504.0, 0);
    assert_true(isinf(kern_f16_to_f32(0x7c00)) && kern_f16_to_f32(0x7c00) > 0);
    assert_true(isinf(kern_f16_to_f32(0xfc00)) && kern_f16_to_f32(0xfc00) < 0);
    assert_true(isnan(kern_f16_to_f32(0x7e00)));
    assert_true(isnan(kern_f16_to_f32(0x7c01)));
}

static void f16_encode_rounding(void **state)
{
    (void)state;
    assert_int_equal(kern_f32_to_f16(65504.0f), 0x7bff);
    assert_int_equal(kern_f32_to_f16(65519.99f), 0x7bff);
    assert_int_equal(kern_f32_to_f16(65520.0f), 0x7c00);     /* the tie rounds to even: inf */
    assert_int_equal(kern_f32_to_f16(1e10f), 0x7c00);
    assert_int_equal(kern_f32_to_f16(-1e10f), 0xfc00);
    assert_int_equal(kern_f32_to_f16(INFINITY), 0x7c00);
    assert_int_equal(kern_f32_to_f16((float)ldexp(1, -14)), 0x0400);
    assert_int_equal(kern_f32_to_f16((float)ldexp(1, -24)), 0x0001);
    assert_int_equal(kern_f32_to_f16((float)ldexp(1, -25)), 0x0000);     /* tie to even: 0 */
    assert_int_equal(kern_f32_to_f16((float)ldexp(1.5, -25)), 0x0001);
    assert_int_equal(kern_f32_to_f16((float)ldexp(3, -25)), 0x0002);     /* 1.5 units: to 2 */
    assert_int_equal(kern_f32_to_f16((float)ldexp(5, -25)), 0x0002);     /* 2.5 units: to 2 */
    assert_int_equal(kern_f32_to_f16((float)ldexp(1, -26)), 0x0000);
    assert_int_equal(kern_f32_to_f16(-(float)ldexp(1, -24)), 0x8001);
    assert_int_equal(kern_f32_to_f16((float)(1023.5 * ldexp(1, -24))), 0x0400); /* to normal */
    assert_int_equal(kern_f32_to_f16(1.0f + (float)ldexp(1, -11)), 0x3c00);   /* tie, even */
    assert_int_equal(kern_f32_to_f16(1.0f + (float)ldexp(3, -11)), 0x3c02);   /* tie, even */
    assert_int_equal(kern_f32_to_f16(1.0f + (float)ldexp(1, -11) + (float)ldexp(1, -20)), 0x3c01);
    assert_int_equal(kern_f32_to_f16(f32_of_bits(1)), 0x0000);       /* f32 subnormal */
    assert_int_equal(kern_f32_to_f16(-0.0f), 0x8000);
    uint16_t nan = kern_f32_to_f16(NAN);
    assert_true((nan & 0x7c00) == 0x7c00 && (nan & 0x3ff) != 0);
    uint16_t snan = kern_f32_to_f16(f32_of_bits(0x7f800001));    /* payload only in low bits */
    assert_true((snan & 0x7c00) == 0x7c00 && (snan & 0x3ff) != 0);
}

/* Every finite f16 survives f16 → f32 → f16; every NaN stays a NaN. */
static void f16_roundtrip_all(void **state)
{
    (void)state;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = kern_f16_to_f32((uint16_t)h);
        uint16_t back = kern_f32_to_f16(f);
        if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0)
            assert_true(isnan(f) && (back & 0x7c00) == 0x7c00 && (back & 0x3ff) != 0);
        else
            assert_int_equal(back, h);
    }
}

/* The bulk (F16C when present) conversions agree with the scalar ones on random bit patterns,
 * half of them in the f16 subnormal range. */
static void f16_bulk_matches_scalar(void **state)
{
    (void)state;
    enum { N = 4099 };
    float *x = malloc(N * sizeof *x), *y = malloc(N * sizeof *y);
    uint16_t *h = malloc(N * sizeof *h);
    for (int i = 0; i < N; i++) {
        uint32_t b = (uint32_t)rnd();
        if (i % 2)
            b = (b & 0x80000000u) | (0x33000000u + (b & 0x07ffffffu));   /* 2^-25 .. 2^-14 */
        x[i] = f32_of_bits(b);
        if (isnan(x[i]))
            x[i] = 1.0f;
    }
    kern__f32_to_f16_row(x, h, N);
    for (int i = 0; i < N; i++)
        if (h[i] != kern_f32_to_f16(x[i])) {
            print_error("x=%a (%08x): bulk %04x scalar %04x\n", x[i], bits_of_f32(x[i]), h[i],
                        kern_f32_to_f16(x[i]));
            fail();
        }
    kern__f16_to_f32_row(h, y, N);
    for (int i = 0; i < N; i++)
        assert_int_equal(bits_of_f32(y[i]), bits_of_f32(kern_f16_to_f32(h[i])));
    free(x);
    free(y);
    free(h);
}

static void bf16_edges(void **state)
{
    (void)state;
    assert_int_equal(kern_f32_to_bf16(1.0f), 0x3f80);
    assert_double_near(kern_bf16_to_f32(0x3f80), 1.0, 0);
    assert_double_near(kern_bf16_to_f32(0xc040), -3.0, 0);
    assert_int_equal(kern_f32_to_bf16(f32_of_bits(0x3f808000)), 0x3f80);   /* tie: even */
    assert_int_equal(kern_f32_to_bf16(f32_of_bits(0x3f818000)), 0x3f82);   /* tie: even */
    assert_int_equal(kern_f32_to_bf16(f32_of_bits(0x3f808001)), 0x3f81);
    assert_int_equal(kern_f32_to_bf16(f32_of_bits(0x7f7fffff)), 0x7f80);   /* max → inf */
    assert_int_equal(kern_f32_to_bf16(INFINITY), 0x7f80);
    assert_int_equal(kern_f32_to_bf16(-INFINITY), 0xff80);
    assert_int_equal(kern_f32_to_bf16(f32_of_bits(0x00010000)), 0x0001);   /* subnormal kept */
    uint16_t nan = kern_f32_to_bf16(f32_of_bits(0x7f800001));   /* would round to inf: stays NaN */
    assert_true((nan & 0x7f80) == 0x7f80 && (nan & 0x7f) != 0);
    assert_true(isnan(kern_bf16_to_f32(0x7fc0)));
}

/* ---- GGUF layouts, against hand-built blocks ------------------------------------------------- */

static void check_to_f32(uint32_t type, const void *blk, const float *expect, int n)
{
    float got[256];
    int ti = 0;
    while (types[ti] != type)
        ti++;
    for (int v = 0; v < n_variants; v++) {
        const kern_wtype *t = &variants[v].ops[ti].pub;
        t->to_f32(blk, got, n);
        for (int i = 0; i < n; i++)
            if (got[i] != expect[i]) {
                print_error("%s (%s) element %d: %g, expected %g\n", kern_type_name(t->type), variants[v].name,
                            i, got[i], expect[i]);
                fail();
            }
    }
}

static void layout_q4_0_q4_1_q8_0(void **state)
{
    (void)state;
    float e[32];
    kern_blk_q4_0 b0 = {.d = 0x3800};   /* 0.5 */
    kern_blk_q4_1 b1 = {.d = 0x3400, .m = 0xbc00};   /* 0.25, -1 */
    for (int j = 0; j < 16; j++)
        b0.qs[j] = b1.qs[j] = (uint8_t)(j | ((15 - j) << 4));
    for (int j = 0; j < 32; j++)   /* element j: low nibble of byte j, then high of byte j-16 */
        e[j] = (float)((j < 16 ? j : 15 - (j - 16)) - 8) * 0.5f;
    check_to_f32(KERN_TYPE_Q4_0, &b0, e, 32);
    for (int j = 0; j < 32; j++)
        e[j] = (float)(j < 16 ? j : 15 - (j - 16)) * 0.25f - 1.0f;
    check_to_f32(KERN_TYPE_Q4_1, &b1, e, 32);
    kern_blk_q8_0 b8 = {.d = 0x4000};   /* 2 */
    for (int j = 0; j < 32; j++) {
        b8.qs[j] = (int8_t)(j * 8 - 128);   /* -128 .. 120 */
        e[j] = 2.0f * (float)(j * 8 - 128);
    }
    check_to_f32(KERN_TYPE_Q8_0, &b8, e, 32);
}

/* Scales bytes chosen by hand so that every sub-block's 6-bit scale and min use their high bits;
 * sc and m below are worked out from the documented packing (get_scale_min_k4 in ggml). */
static void layout_q4_k(void **state)
{
    (void)state;
    static const uint8_t scales[12] = {0x41, 0x82, 0xC3, 0x3F, 0x40, 0x87,
                                       0xFF, 0x01, 0x21, 0x43, 0x65, 0x87};
    static const int sc[8] = {1, 2, 3, 63, 17, 35, 53, 7};
    static const int m[8] = {0, 7, 63, 1, 18, 36, 54, 8};
    kern_blk_q4_k b = {.d = 0x3c00, .dmin = 0x3800};   /* 1, 0.5 */
    memcpy(b.scales, scales, 12);
    for (int i = 0; i < 128; i++)
        b.qs[i] = (uint8_t)((i * 7) & 0xff);
    float e[256];
    /* qs[32c + l]: low nibble is element 64c + l, high nibble element 64c + 32 + l. */
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) {
            int lo = b.qs[32 * c + l] & 15, hi = b.qs[32 * c + l] >> 4;
            e[64 * c + l] = (float)(sc[2 * c] * lo) - 0.5f * (float)m[2 * c];
            e[64 * c + 32 + l] = (float)(sc[2 * c + 1] * hi) - 0.5f * (float)m[2 * c + 1];
        }
    check_to_f32(KERN_TYPE_Q4_K, &b, e, 256);
}

static void layout_q6_k(void **state)
{
    (void)state;
    kern_blk_q6_k b = {.d = 0x3800};   /* 0.5 */
    for (int i = 0; i < 128; i++)
        b.ql[i] = (uint8_t)(i * 13 + 5);
    for (int i = 0; i < 64; i++)
        b.qh[i] = (uint8_t)(i * 37 + 11);
    for (int g = 0; g < 16; g++)
        b.scales[g] = (int8_t)(g * 9 - 70);
    float e[256];
    /* Per half of 128: for l < 32, four elements l, l+32, l+64, l+96 from ql[l], ql[l+32] (low
     * then high nibbles) and the 2-bit pairs of qh[l]; scale index (l/16) + 0, 2, 4, 6. */
    for (int h = 0; h < 2; h++) {
        const uint8_t *ql = b.ql + 64 * h, *qh = b.qh + 32 * h;
        const int8_t *s = b.scales + 8 * h;
        float *y = e + 128 * h;
        for (int l = 0; l < 32; l++) {
            int is = l / 16;
            int q1 = ((ql[l] & 15) | (((qh[l] >> 0) & 3) << 4)) - 32;
            int q2 = ((ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4)) - 32;
            int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
            int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
            y[l] = 0.5f * (float)(s[is] * q1);
            y[l + 32] = 0.5f * (float)(s[is + 2] * q2);
            y[l + 64] = 0.5f * (float)(s[is + 4] * q3);
            y[l + 96] = 0.5f * (float)(s[is + 6] * q4);
        }
    }
    check_to_f32(KERN_TYPE_Q6_K, &b, e, 256);
}

/* ---- random weights and activations ---------------------------------------------------------- */

/* Random raw blocks (every bit pattern of the quantized fields) with finite, moderate f16 scales;
 * or, for float types, random values. */
static void random_row(uint32_t type, void *w, int64_t n)
{
    const kern_wtype *t = kern_wtype_get_ref(type);
    size_t bytes = row_bytes(t, n);
    uint8_t *p = w;
    for (size_t i = 0; i < bytes; i++)
        p[i] = (uint8_t)rnd();
    int64_t nb = n / kern_type_get(t->type)->block_elems;
    for (int64_t b = 0; b < nb; b++) {
        uint8_t *blk = p + (size_t)b * kern_type_get(t->type)->block_bytes;
        uint16_t s1 = kern_f32_to_f16(frand() * 0.05f), s2 = kern_f32_to_f16(frand() * 0.05f);
        switch (type) {
        case KERN_TYPE_Q4_0:
        case KERN_TYPE_Q8_0:
            memcpy(blk, &s1, 2);
            break;
        case KERN_TYPE_Q4_1:
        case KERN_TYPE_Q4_K:
            memcpy(blk, &s1, 2);
            memcpy(blk + 2, &s2, 2);
            break;
        case KERN_TYPE_Q6_K:
            memcpy(blk + 208, &s1, 2);
            break;
        default:
            break;
        }
    }
    if (type == KERN_TYPE_F32 || type == KERN_TYPE_F16 || type == KERN_TYPE_BF16) {
        float *x = malloc((size_t)n * sizeof *x);
        for (int64_t i = 0; i < n; i++)
            x[i] = frand();
        t->from_f32(x, w, n);
        free(x);
    }
}

static void random_x(float *x, int64_t n, int zero_block)
{
    for (int64_t i = 0; i < n; i++)
        x[i] = frand() * (i % 7 == 0 ? 4.0f : 1.0f);
    if (zero_block && n >= 64)
        memset(x + 32, 0, 32 * sizeof *x);   /* a block of zeros: scale 0 */
}

/* sum |w_i * x_i| over the dequantized weights: the scale of a dot's rounding error. */
static double magnitude(uint32_t type, const void *w, const float *x, int64_t n)
{
    float *wf = malloc((size_t)n * sizeof *wf);
    kern_wtype_get_ref(type)->to_f32(w, wf, n);
    double m = 0;
    for (int64_t i = 0; i < n; i++)
        m += fabs((double)wf[i] * x[i]);
    free(wf);
    return m;
}

static const int64_t lengths_32[] = {32, 64, 96, 256, 576, 1536, 4096};
static const int64_t lengths_256[] = {256, 512, 1536, 4096};

/* ---- SIMD twins vs reference ----------------------------------------------------------------- */

static void quantize_act_matches_ref(void **state)
{
    (void)state;
    for (int vi = 1; vi < n_variants; vi++)
    for (int ti = 0; ti < N_TYPES; ti++) {
        const kern_wtype *r = kern_wtype_get_ref(types[ti]), *b = &variants[vi].ops[ti].pub;
        for (int li = 0; li < 4; li++) {
            int64_t n = lengths_256[li];
            float *x = malloc((size_t)n * sizeof *x);
            random_x(x, n, 1);
            size_t ab = r->act_row_bytes(n);
            assert_int_equal(ab, b->act_row_bytes(n));
            uint8_t *a1 = calloc(1, ab), *a2 = calloc(1, ab);
            r->quantize_act(x, a1, n);
            b->quantize_act(x, a2, n);
            if (memcmp(a1, a2, ab) != 0) {
                print_error("%s (%s) n=%lld: activation bytes differ\n", kern_type_name(r->type),
                            variants[vi].name, (long long)n);
                fail();
            }
            free(a1);
            free(a2);
            free(x);
        }
    }
}

static void dot_matches_ref(void **state)
{
    (void)state;
    for (int vi = 1; vi < n_variants; vi++)
    for (int ti = 0; ti < N_TYPES; ti++) {
        const kern_wtype *r = kern_wtype_get_ref(types[ti]), *b = &variants[vi].ops[ti].pub;
        const int64_t *lens = kern_type_get(r->type)->block_elems == 256 ? lengths_256 : lengths_32;
        int nl = kern_type_get(r->type)->block_elems == 256 ? 4 : 7;
        for (int li = 0; li < nl; li++)
            for (int rep = 0; rep < 20; rep++) {
                int64_t n = lens[li] + (kern_type_get(r->type)->block_elems == 1 ? rep : 0);   /* float tails too */
                float *x = malloc((size_t)n * sizeof *x);
                void *w = malloc(row_bytes(r, n));
                random_x(x, n, rep == 0);
                random_row(types[ti], w, n);
                void *act = malloc(r->act_row_bytes(n));
                r->quantize_act(x, act, n);
                float yr = 0, yb = 0;
                r->dot(n, w, act, &yr);
                b->dot(n, w, act, &yb);
                double tol = 1e-5 * magnitude(types[ti], w, x, n) + 1e-6;
                if (!(fabs((double)yr - yb) <= tol)) {
                    print_error("%s n=%lld rep %d: ref %.9g %s %.9g (tol %g)\n", kern_type_name(r->type),
                                (long long)n, rep, yr, variants[vi].name, yb, tol);
                    fail();
                }
                free(x);
                free(w);
                free(act);
            }
    }
}

/* The reference dot of the quantized activation is the f32 dot of the dequantized row, up to
 * the activation's quantization error (half a step of each block's scale per element). */
static void ref_dot_matches_dequantized(void **state)
{
    (void)state;
    for (int ti = 0; ti < N_TYPES; ti++) {
        const kern_wtype *r = kern_wtype_get_ref(types[ti]);
        int64_t n = 1536;
        float *x = malloc(n * sizeof *x), *wf = malloc(n * sizeof *wf);
        void *w = malloc(row_bytes(r, n)), *act = malloc(r->act_row_bytes(n));
        random_x(x, n, 1);
        random_row(types[ti], w, n);
        r->to_f32(w, wf, n);
        r->quantize_act(x, act, n);
        float y;
        r->dot(n, w, act, &y);
        double exact = 0, bound = 1e-5 * magnitude(types[ti], w, x, n);
        int blk = r->act == KERN_ACT_Q8_K ? 256 : 32;
        for (int64_t i = 0; i < n; i += blk) {
            float amax = 0;
            for (int j = 0; j < blk; j++)
                amax = fmaxf(amax, fabsf(x[i + j]));
            for (int j = 0; j < blk; j++) {
                exact += (double)wf[i + j] * x[i + j];
                if (r->act != KERN_ACT_F32)
                    bound += fabs(wf[i + j]) * amax / 127.0 * 0.5;
                /* f16 / bf16 rounding of activations and of q8 scales (as llama.cpp). */
                double wx = fabs((double)wf[i + j] * x[i + j]);
                bound += types[ti] == 30 ? wx / 256 : types[ti] == 0 ? 0 : wx / 2048;
            }
        }
        if (!(fabs(exact - y) <= bound)) {
            print_error("%s: dot %.9g, dequantized %.9g (bound %g)\n", kern_type_name(r->type), y, exact, bound);
            fail();
        }
        free(x);
        free(wf);
        free(w);
        free(act);
    }
}

static void to_f32_matches_ref(void **state)
{
    (void)state;
    for (int vi = 1; vi < n_variants; vi++)
    for (int ti = 0; ti < N_TYPES; ti++) {
        const kern_wtype *r = kern_wtype_get_ref(types[ti]), *b = &variants[vi].ops[ti].pub;
        int64_t n = 1536;
        void *w = malloc(row_bytes(r, n));
        float *y1 = malloc(n * sizeof *y1), *y2 = malloc(n * sizeof *y2);
        random_row(types[ti], w, n);
        r->to_f32(w, y1, n);
        b->to_f32(w, y2, n);
        for (int64_t i = 0; i < n; i++)
            if (bits_of_f32(y1[i]) != bits_of_f32(y2[i])) {
                print_error("%s element %lld: ref %g best %g\n", kern_type_name(r->type), (long long)i, y1[i], y2[i]);
                fail();
            }
        free(w);
        free(y1);
        free(y2);
    }
}

/* The internal matrix-vector and tile kernels (what the matmul calls) against the reference dot,
 * with row counts that are not multiples of the tile and token counts around the tile's. */
static void mv_and_tile_match_ref(void **state)
{
    (void)state;
    for (int vi = 0; vi < n_variants; vi++)
    for (int ti = 0; ti < N_TYPES; ti++)
    for (int odd = 0; odd < 2; odd++) {   /* an odd block count too: kernels step by 2 or 4 */
        const kern_wops *o = &variants[vi].ops[ti];
        const kern_wtype *r = kern_wtype_get_ref(types[ti]);
        int64_t n = kern_type_get(r->type)->block_elems == 256 ? 512 + 256 * odd
                    : kern_type_get(r->type)->block_elems == 1 ? 576 + 13 * odd   /* float types: a tail under 8 */
                                          : 576 + 32 * odd;
        size_t rb = row_bytes(r, n);
        int rows = o->tile != NULL && o->tile_rows > 1 ? o->tile_rows : 16;
        enum { T = 11 };
        uint8_t *w = malloc(rb * (size_t)rows);
        float *x = malloc((size_t)(T * n) * sizeof *x);
        for (int i = 0; i < rows; i++)
            random_row(types[ti], w + (size_t)i * rb, n);
        random_x(x, T * n, 1);
        size_t ab = r->act_row_bytes(n);
        uint8_t *act = malloc(ab * T);
        for (int t = 0; t < T; t++)
            r->quantize_act(x + t * n, act + (size_t)t * ab, n);
        float ref[T][64];
        for (int t = 0; t < T; t++)
            for (int i = 0; i < rows; i++)
                r->dot(n, w + (size_t)i * rb, act + (size_t)t * ab, &ref[t][i]);
        if (o->mv != NULL) {
            for (int nr = 1; nr <= rows; nr += 3) {
                float y[64];
                o->mv(n, w, rb, nr, act, y);
                for (int i = 0; i < nr; i++) {
                    double tol = 1e-5 * magnitude(types[ti], w + (size_t)i * rb, x, n) + 1e-6;
                    if (!(fabs((double)y[i] - ref[0][i]) <= tol)) {
                        print_error("%s (%s) mv nr=%d row %d: %.9g vs %.9g\n", kern_type_name(r->type),
                                    variants[vi].name, nr, i, y[i], ref[0][i]);
                        fail();
                    }
                }
            }
        }
        if (o->tile != NULL) {
            size_t tab = o->tile_act_bytes(n);
            uint8_t *tact = malloc(tab * T);
            for (int t = 0; t < T; t++) {
                if (o->tile_quantize != NULL)
                    o->tile_quantize(x + t * n, tact + (size_t)t * tab, n);
                else   /* f32 rows in place */
                    memcpy(tact + (size_t)t * tab, x + t * n, (size_t)n * sizeof(float));
            }
            void *scratch = aligned_alloc(64, (o->tile_scratch(n) + 63) / 64 * 64);
            /* q8 blocks of 32 (or f32 rows) like the reference: then within rounding. */
            bool same_act = r->act == KERN_ACT_Q8_32 || r->act == KERN_ACT_F32;
            for (int nr = 1; nr <= rows; nr += 5)
                for (int nt = 1; nt <= T; nt++) {
                    float y[T][72];
                    o->tile(n, w, rb, nr, tact, tab, nt, &y[0][0], 72, scratch);
                    for (int t = 0; t < nt; t++)
                        for (int i = 0; i < nr; i++) {
                            /* A tile may quantize activations its own way (Q4_K: blocks of
                             * 32): then only within the activation quantization error. */
                            double mag = magnitude(types[ti], w + (size_t)i * rb, x + t * n, n);
                            double tol = (same_act ? 1e-5 : 0.02) * mag + 1e-5;
                            if (!(fabs((double)y[t][i] - ref[t][i]) <= tol)) {
                                print_error("%s (%s) tile nr=%d nt=%d (%d,%d): %.9g vs %.9g\n",
                                            kern_type_name(r->type), variants[vi].name, nr, nt, t, i, y[t][i],
                                            ref[t][i]);
                                fail();
                            }
                        }
                }
            free(scratch);
            free(tact);
        }
        free(w);
        free(x);
        free(act);
    }
}

/* from_f32 then to_f32: RMS error relative to the data's RMS, per type. */
static void roundtrip_within_quantization_error(void **state)
{
    (void)state;
    static const struct { uint32_t type; double max_rel; } lim[] = {
        {KERN_TYPE_F32, 0},       {KERN_TYPE_F16, 1e-3},  {KERN_TYPE_BF16, 8e-3},
        {KERN_TYPE_Q8_0, 1e-2},   {KERN_TYPE_Q4_0, 0.15}, {KERN_TYPE_Q4_1, 0.12},
        {KERN_TYPE_Q4_K, 0.15},   {KERN_TYPE_Q6_K, 0.04},
    };
    int64_t n = 4096;
    float *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y);
    for (int64_t i = 0; i < n; i++)   /* roughly Gaussian, like trained weights */
        x[i] = (frand() + frand() + frand()) * 0.02f;
    for (int vi = 0; vi < n_variants; vi++)
    for (size_t k = 0; k < sizeof lim / sizeof lim[0]; k++) {
        int ti = 0;
        while (types[ti] != lim[k].type)
            ti++;
        const kern_wtype *t = &variants[vi].ops[ti].pub;
        void *w = calloc(1, row_bytes(t, n));
        assert_non_null(t->from_f32);
        t->from_f32(x, w, n);
        t->to_f32(w, y, n);
        double e2 = 0, x2 = 0;
        for (int64_t i = 0; i < n; i++) {
            e2 += ((double)y[i] - x[i]) * ((double)y[i] - x[i]);
            x2 += (double)x[i] * x[i];
        }
        double rel = sqrt(e2 / x2);
        if (!(rel <= lim[k].max_rel)) {
            print_error("%s (%s): relative RMS error %g > %g\n", kern_type_name(t->type), variants[vi].name, rel,
                        lim[k].max_rel);
            fail();
        }
        free(w);
    }
    free(x);
    free(y);
}

static void table_and_variant(void **state)
{
    (void)state;
    assert_null(kern_wtype_get(4));
    assert_null(kern_wtype_get(15));
    assert_null(kern_wtype_get_ref(1000));
    for (int ti = 0; ti < N_TYPES; ti++) {
        const kern_wtype *t = kern_wtype_get(types[ti]);
        assert_non_null(t);
        assert_int_equal(t->type, types[ti]);
        assert_int_equal(kern_wtype_get_ref(types[ti])->type, t->type);
        assert_non_null(kern_type_get(types[ti]));   /* every op table has its type's traits */
    }
    const char *v = kern_wtype_variant();
    const char *force = getenv("LLMGW_KERNELS");
    if (force != NULL && strcmp(force, "ref") == 0) {
        assert_string_equal(v, "ref");
        for (int ti = 0; ti < N_TYPES; ti++)
            assert_ptr_equal(kern_wtype_get(types[ti])->dot, kern_wtype_get_ref(types[ti])->dot);
    } else {
        const kern_cpu_features *f = kern_cpu_features_get();
        if (f->avx512f && f->avx512bw && f->avx512vl && f->avx512vnni) {
            assert_string_equal(v, "avx512");
            assert_int_equal(n_variants, 3);
        }
        else if (f->avx2 && f->fma && f->f16c)
            assert_string_equal(v, "avx2");
    }
    /* The best table is the last variant built here (LLMGW_KERNELS=exact: with
     * kern__quant_make_exact applied; =invariant: without tiles and mv kernels). */
    bool exact = force != NULL && strcmp(force, "exact") == 0;
    bool inv = force != NULL && strcmp(force, "invariant") == 0;
    const variant *best = exact ? &exact_variant : &variants[n_variants - 1];
    for (int ti = 0; ti < N_TYPES; ti++) {
        assert_ptr_equal(kern_wtype_get(types[ti])->dot, best->ops[ti].pub.dot);
        bool keeps = !inv || best->ops[ti].tile_invariant;   /* invariant keeps those tiles */
        assert_ptr_equal(kern__wops_get(types[ti])->tile, keeps ? best->ops[ti].tile : NULL);
        assert_ptr_equal(kern__wops_get(types[ti])->mv, inv ? NULL : best->ops[ti].mv);
        /* the multi-token dots sum as the dot: invariant keeps them */
        assert_ptr_equal(kern__wops_get(types[ti])->dotn, best->ops[ti].dotn);
    }
}

/* A multi-token dot (kern_dotn_fn) gives every token the same bits as its variant's dot (the
 * one-token path), for 1..KERN_DOTN_MAX tokens, with and without a tail of blocks. */
static void dotn_matches_dot_bitwise(void **state)
{
    (void)state;
    int checked = 0;
    for (int v = 0; v < n_variants; v++)
        for (int ti = 0; ti < N_TYPES; ti++) {
            const kern_wops *o = &variants[v].ops[ti];
            if (o->dotn == NULL)
                continue;
            const kern_wtype *t = &o->pub;
            for (int li = 0; li < 7; li++)
                for (int nt = 1; nt <= KERN_DOTN_MAX; nt++) {
                    int64_t n = lengths_32[li];
                    size_t as = t->act_row_bytes(n);
                    float *x = malloc((size_t)n * sizeof *x);
                    void *w = malloc(row_bytes(t, n));
                    uint8_t *act = malloc(as * (size_t)nt);
                    random_row(t->type, w, n);
                    for (int k = 0; k < nt; k++) {
                        random_x(x, n, k == 0);
                        t->quantize_act(x, act + (size_t)k * as, n);
                    }
                    float y[2 * KERN_DOTN_MAX];
                    o->dotn(n, w, act, as, nt, y, 2);   /* ldy 2: the stride is honoured */
                    for (int k = 0; k < nt; k++) {
                        float one = 0;
                        t->dot(n, w, act + (size_t)k * as, &one);
                        if (memcmp(&one, &y[2 * k], sizeof one) != 0) {
                            print_error("%s (%s) n=%lld, token %d of %d: dotn %.9g, dot %.9g\n",
                                        kern_type_name(t->type), variants[v].name, (long long)n, k,
                                        nt, y[2 * k], one);
                            fail();
                        }
                    }
                    checked++;
                    free(x);
                    free(w);
                    free(act);
                }
        }
    if (n_variants > 1)
        assert_true(checked > 0);   /* the AVX2 table has Q4_0 and Q4_1 ones */
}

/* LLMGW_KERNELS=exact: Q4_1 goes through a dot that sums as the reference (llama.cpp's order),
 * bit for bit, and has no tile or mv kernel (which sum in other orders). */
static void exact_dots_match_ref_bitwise(void **state)
{
    (void)state;
    int ti = 0;
    while (types[ti] != KERN_TYPE_Q4_1)
        ti++;
    const kern_wtype *r = kern_wtype_get_ref(KERN_TYPE_Q4_1), *b = &exact_variant.ops[ti].pub;
    assert_null(exact_variant.ops[ti].tile);
    assert_null(exact_variant.ops[ti].mv);
    assert_null(exact_variant.ops[ti].dotn);
    for (int li = 0; li < 7; li++)
        for (int rep = 0; rep < 20; rep++) {
            int64_t n = lengths_32[li];
            float *x = malloc((size_t)n * sizeof *x);
            void *w = malloc(row_bytes(r, n));
            random_x(x, n, rep == 0);
            random_row(KERN_TYPE_Q4_1, w, n);
            void *act = malloc(r->act_row_bytes(n));
            b->quantize_act(x, act, n);
            float yr = 0, yb = 0;
            r->dot(n, w, act, &yr);
            b->dot(n, w, act, &yb);
            if (yr != yb) {
                print_error("Q4_1 n=%lld rep %d: ref %.9g exact %.9g\n", (long long)n, rep, yr, yb);
                fail();
            }
            free(x);
            free(w);
            free(act);
        }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(f16_decode_edges),
        cmocka_unit_test(dotn_matches_dot_bitwise),
        cmocka_unit_test(f16_encode_rounding),
        cmocka_unit_test(f16_roundtrip_all),
        cmocka_unit_test(f16_bulk_matches_scalar),
        cmocka_unit_test(bf16_edges),
        cmocka_unit_test(layout_q4_0_q4_1_q8_0),
        cmocka_unit_test(layout_q4_k),
        cmocka_unit_test(layout_q6_k),
        cmocka_unit_test(quantize_act_matches_ref),
        cmocka_unit_test(dot_matches_ref),
        cmocka_unit_test(ref_dot_matches_dequantized),
        cmocka_unit_test(to_f32_matches_ref),
        cmocka_unit_test(mv_and_tile_match_ref),
        cmocka_unit_test(roundtrip_within_quantization_error),
        cmocka_unit_test(table_and_variant),
        cmocka_unit_test(exact_dots_match_ref_bitwise),
    };
    return cmocka_run_group_tests(tests, setup_variants, NULL);
}
