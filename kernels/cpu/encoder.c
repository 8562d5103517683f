/* kernels/cpu/encoder.c: the sentence encoder's operations on the CPU (kern_backend's dense,
 * layernorm, gelu and encoder_attention; the scalar references are in encoder_ref.c).
 *
 * dense: a Linear layer y = x W^T + bias over all tokens of a batch at once (one [T][k]
 * matrix, no padding), split over the pool by output columns. It runs one of three kernels:
 * BF16 weights (kern_dense.bf16, where the CPU has AVX512-BF16) the AVX512-BF16 one for any
 * batch; f32 weights a packed one (AVX-512, or AVX2+FMA where the CPU has no AVX-512) up to the
 * backend's packed_max tokens, else one single-threaded OpenBLAS sgemm per part (so OpenBLAS
 * never starts threads of its own). packed_max is measured once per backend (dense_kernels):
 * the packed kernel and sgemm race on a slice of a model's own weights at a few batch sizes.
 * The packed kernels sum each output as one FMA chain over the inputs in order, bias added
 * after (AVX-512 and AVX2 alike, and the reference dense too, so all three give the same
 * bits): a text encodes bit for bit the same alone or in any batch the packed kernel computes
 * (f32 batches past packed_max: to ~1e-6). */
#include "kernels/cpu/internal.h"

#include "common/time.h"

#include <cblas.h>
#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { PACKED_NONE, PACKED_AVX512, PACKED_AVX2 };

/* A dense layer on the CPU: the caller's f32 weights (sgemm reads them) and bias, and a packed
 * copy for the small-batch kernels. */
typedef struct cpu_dense {
    kern_dense pub;
    const float *w;      /* [n][k], the caller's */
    float *bias;         /* [n] */
    float *wp;           /* [n / 16][k][16], or NULL */
    uint16_t *wb;        /* BF16 [n / 16][k / 2][16][2] (pub.bf16), or NULL */
    bool amx;            /* wb's products run on AMX tiles (else AVX512-BF16) */
    char why[88];        /* why this precision, when a race chose it */
} cpu_dense;

/* ---- math helpers (plain loops the compiler vectorizes) ----
 * kernels/CMakeLists.txt builds this file with -fno-trapping-math -fno-math-errno (no
 * reassociation: results stay those of the written order), which lets the compiler vectorize
 * the branch-free loops below; x86-64 builds get AVX2 and AVX-512 clones picked at load. */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define SIMD_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define SIMD_CLONES
#endif

/* e^x for x <= 0, relative error about 2e-7 (below -87: about 1e-38, not 0). Branch-free so
 * that the loops calling it vectorize. */
static inline float fast_exp(float x)
{
    x = x < -87.0f ? -87.0f : x;
    /* round to nearest without a libm call, so the loop vectorizes */
    float n = (x * 1.44269504f + 12582912.0f) - 12582912.0f;
    float r = x - n * 0.693145752f - n * 1.42860677e-6f;
    float p = 1.0f + r * (1.0f + r * (0.5f + r * (0.166666672f + r * (0.0416666418f +
              r * (0.00833336171f + r * 0.00138889f)))));
    int32_t bits = ((int32_t)n + 127) << 23;
    float s;
    memcpy(&s, &bits, 4);
    return p * s;
}

/* GELU with erf (Abramowitz-Stegun 7.1.26, |error| < 1.5e-7 in erf). */
SIMD_CLONES static void gelu_row(float *x, int n)
{
    for (int i = 0; i < n; i++) {
        float v = x[i], z = fabsf(v) * 0.707106781f;
        float t = 1.0f / (1.0f + 0.3275911f * z);
        float poly = t * (0.254829592f + t * (-0.284496736f + t * (1.421413741f +
                     t * (-1.453152027f + t * 1.061405429f))));
        float erf_abs = 1.0f - poly * fast_exp(-z * z);
        float erf = copysignf(erf_abs, v);
        x[i] = 0.5f * v * (1.0f + erf);
    }
}

/* Mean and variance as 16 running sums (lane l takes x[l], x[l + 16], ...) added up in order
 * at the end: without reassociation one running sum is a chain of dependent scalar adds, which
 * made layer norm an eighth of a batch's encoding; 16 lanes vectorize and give the same bits in
 * every clone. */
SIMD_CLONES static void layer_norm_row(float *x, const float *w, const float *b, int n, float eps)
{
    float acc[16] = {0}, mean = 0, var = 0;
    int m = n / 16 * 16;
    for (int i = 0; i < m; i += 16)
        for (int l = 0; l < 16; l++)
            acc[l] += x[i + l];
    for (int l = 0; l < 16; l++)
        mean += acc[l];
    for (int i = m; i < n; i++)
        mean += x[i];
    mean /= (float)n;
    for (int l = 0; l < 16; l++)
        acc[l] = 0;
    for (int i = 0; i < m; i += 16)
        for (int l = 0; l < 16; l++)
            acc[l] += (x[i + l] - mean) * (x[i + l] - mean);
    for (int l = 0; l < 16; l++)
        var += acc[l];
    for (int i = m; i < n; i++)
        var += (x[i] - mean) * (x[i] - mean);
    float inv = 1.0f / sqrtf(var / (float)n + eps);
    for (int i = 0; i < n; i++)
        x[i] = (x[i] - mean) * inv * w[i] + b[i];
}

/* ---- parallel steps ---- */

enum { EPI_NONE, EPI_GELU };

/* y[T][N] = x[T][K] W[N][K]^T + bias (+ y when accumulate: the residual already in y). */
typedef struct gemm_job {
    const float *x, *w, *wp, *bias;  /* wp: w packed [N / 16][K][16], or NULL (then sgemm) */
    const uint16_t *xb, *wb;  /* BF16 x and w packed [N / 16][K / 2][16][2], or NULL */
    float *y;
    int T, N, K;
    int accumulate, epilogue;
    int packed;  /* PACKED_*: which kernel reads wp */
    bool amx;    /* wb's products on AMX tiles (xb's rows padded to a multiple of 32) */
} gemm_job;

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define HAVE_SMALL_KERNEL 1
#include <unistd.h>
/* This CPU's L2 size per core (1 MiB where the system does not say). */
static size_t l2_bytes(void)
{
    static size_t l2;
    if (l2 == 0) {
        long v = sysconf(_SC_LEVEL2_CACHE_SIZE);
        l2 = v > (64 << 10) ? (size_t)v : (size_t)1 << 20;
    }
    return l2;
}
#define TB 16  /* tokens per pass: 16 accumulators + the weights fit AVX-512's 32 registers */

/* call(k) with tb (1..16) as the constant k, so a block's loops over its tokens unroll. */
#define SWITCH_TB(tb, call)                                                                    \
    switch (tb) {                                                                              \
    case 16: call(16); break; case 15: call(15); break; case 14: call(14); break;             \
    case 13: call(13); break; case 12: call(12); break; case 11: call(11); break;             \
    case 10: call(10); break; case 9: call(9); break; case 8: call(8); break;                 \
    case 7: call(7); break; case 6: call(6); break; case 5: call(5); break;                   \
    case 4: call(4); break; case 3: call(3); break; case 2: call(2); break;                    \
    default: call(1); break;                                                                   \
    }
/* How far ahead (bytes) the kernels prefetch their weight stream. The hardware prefetcher
 * alone leaves them waiting on L3/memory: a 15-token question encodes in 2.4 ms without,
 * ~1.8 ms with 1-4 KB (2 threads, this machine's EPYC). */
#define PF_DIST 2048

/* y[t][0..16) = a[t] + bias (+ y[t][0..16) when acc) for the block's tb tokens. */
__attribute__((target("avx512f"), always_inline)) static inline void
store_block(const __m512 *a, int tb, const float *bias, float *y, int ldy, int acc)
{
    __m512 b = _mm512_loadu_ps(bias);
#pragma GCC unroll 16
    for (int t = 0; t < tb; t++) {
        float *out = y + (size_t)t * (size_t)ldy;
        __m512 v = _mm512_add_ps(a[t], b);
        if (acc)
            v = _mm512_add_ps(v, _mm512_loadu_ps(out));
        _mm512_storeu_ps(out, v);
    }
}

/* tb (<= TB, a constant once inlined) tokens x one 16-column block: y[t][0..16) = x[t] . the
 * block's columns, read from the packed weights in order; bias and the residual added. */
__attribute__((target("avx512f"), always_inline)) static inline void
block16(const float *x, int K, const float *wp, const float *bias, float *y, int ldy, int acc,
        int tb)
{
    /* The token loops must be unrolled whole for a[] to live in registers: at -O2 GCC leaves
     * some trip counts rolled, and then every FMA goes through the stack (3x slower). */
    __m512 a[TB];
#pragma GCC unroll 16
    for (int t = 0; t < TB; t++)
        a[t] = _mm512_setzero_ps();
    for (int k = 0; k < K; k++) {
        _mm_prefetch((const char *)(wp + (size_t)k * 16) + PF_DIST, _MM_HINT_T0);
        __m512 w = _mm512_loadu_ps(wp + (size_t)k * 16);
#pragma GCC unroll 16
        for (int t = 0; t < tb; t++)
            a[t] = _mm512_fmadd_ps(_mm512_set1_ps(x[(size_t)t * (size_t)K + (size_t)k]), w, a[t]);
    }
    store_block(a, tb, bias, y, ldy, acc);
}

/* The same for BF16: x holds tb tokens' inputs as BF16 pairs [tb][K / 2], wp a block's
 * weights as pairs [K / 2][16][2]; VDPBF16PS adds both products of a pair to an f32 sum. */
__attribute__((target("avx512f,avx512bf16"), always_inline)) static inline void
block16_bf16(const uint32_t *x, int K2, const uint16_t *wp, const float *bias, float *y, int ldy,
             int acc, int tb)
{
    __m512 a[TB];
#pragma GCC unroll 16
    for (int t = 0; t < TB; t++)
        a[t] = _mm512_setzero_ps();
    for (int k = 0; k < K2; k++) {
        _mm_prefetch((const char *)(wp + (size_t)k * 32) + PF_DIST, _MM_HINT_T0);
        __m512bh w = (__m512bh)_mm512_loadu_si512(wp + (size_t)k * 32);
#pragma GCC unroll 16
        for (int t = 0; t < tb; t++)
            a[t] = _mm512_dpbf16_ps(
                a[t], (__m512bh)_mm512_set1_epi32((int)x[(size_t)t * (size_t)K2 + (size_t)k]), w);
    }
    store_block(a, tb, bias, y, ldy, acc);
}

/* Columns [n0, n1) of the BF16 product: every 16-column block against TB tokens at a time.
 * K2 is a constant in the calls for MiniLM's two widths, so a token's row is a fixed offset
 * from one pointer (with a variable K2 the compiler needs a register per row, has too few,
 * and spills). */
__attribute__((target("avx512f,avx512bf16"), always_inline)) static inline void
bf16_blocks(const gemm_job *j, int n0, int n1, const int K2)
{
    /* Token groups outside: a group's inputs stay in L1/L2 while the part's weights (at most
     * 1536 x 192 x 2 bytes for MiniLM on 2 threads) pass, and those stay in L2 for the next
     * group. (Blocks outside re-read every input row from L3 for each block: batches of 32
     * questions encoded at ~720 sentences/s on 2 threads instead of ~950.) */
    for (int t0 = 0; t0 < j->T; t0 += TB) {
        int tb = j->T - t0 < TB ? j->T - t0 : TB;
        const uint32_t *x = (const uint32_t *)(j->xb + (size_t)t0 * (size_t)K2 * 2);
        for (int n = n0; n < n1; n += 16) {
            const uint16_t *wp = j->wb + (size_t)(n / 16) * (size_t)K2 * 32;
            float *y = j->y + (size_t)t0 * (size_t)j->N + n;
            const float *b = j->bias + n;
#define CALL(k) block16_bf16(x, K2, wp, b, y, j->N, j->accumulate, k)
            SWITCH_TB(tb, CALL)
#undef CALL
        }
    }
}

__attribute__((target("avx512f,avx512bf16"))) static void bf16_gemm(const gemm_job *j, int n0,
                                                                   int n1)
{
    switch (j->K) {
    case 384: bf16_blocks(j, n0, n1, 192); break;    /* MiniLM's hidden size */
    case 1536: bf16_blocks(j, n0, n1, 768); break;   /* and its feed-forward size */
    default: bf16_blocks(j, n0, n1, j->K / 2); break;
    }
}

/* x[n] (n a multiple of 16) → BF16, rounding to nearest even. */
__attribute__((target("avx512f,avx512bf16"))) static void to_bf16(const float *x, uint16_t *out,
                                                                 size_t n)
{
    for (size_t i = 0; i < n; i += 16)
        _mm256_storeu_si256((__m256i *)(out + i),
                            (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(x + i)));
}

/* Columns [n0, n1) (multiples of 16) of y = x W^T + bias (+ y), from the packed weights
 * (nothing is repacked per call, unlike sgemm): TB tokens at a time against each 16-column block. */
/* Columns [n0, n1) of y = x W^T + bias (+ y), from the packed weights (nothing is repacked per
 * call, unlike sgemm): TB tokens at a time against each 16-column block. K is a constant in the
 * calls for MiniLM's two widths, so a token's row is a fixed offset from one pointer (with a
 * variable K each row takes a register, there are too few, and the FMAs wait on spills). */
__attribute__((target("avx512f"), always_inline)) static inline void
f32_blocks(const gemm_job *j, int n0, int n1, const int K)
{
    /* Tokens in chunks whose inputs fit about half of L2 (all of a batch-1 call's); within a
     * chunk, block by block of columns: a block's weights (K x 16 floats) stay in L1/L2 while
     * the chunk's token groups pass, and the chunk's inputs stay in L2 for the next block. */
    int chunk = (int)(l2_bytes() / 2 / ((size_t)K * sizeof(float))) / TB * TB;
    if (chunk < TB)
        chunk = TB;
    for (int c0 = 0; c0 < j->T; c0 += chunk) {
        int c1 = j->T - c0 < chunk ? j->T : c0 + chunk;
        for (int n = n0; n < n1; n += 16) {
            const float *wp = j->wp + (size_t)(n / 16) * (size_t)K * 16;
            for (int t0 = c0; t0 < c1; t0 += TB) {
                int tb = c1 - t0 < TB ? c1 - t0 : TB;
                const float *x = j->x + (size_t)t0 * (size_t)K;
                float *y = j->y + (size_t)t0 * (size_t)j->N + n;
                const float *b = j->bias + n;
#define CALL(k) block16(x, K, wp, b, y, j->N, j->accumulate, k)
                SWITCH_TB(tb, CALL)
#undef CALL
            }
        }
    }
}

__attribute__((target("avx512f"))) static void small_gemm(const gemm_job *j, int n0, int n1)
{
    switch (j->K) {
    case 384: f32_blocks(j, n0, n1, 384); break;     /* MiniLM's hidden size */
    case 1536: f32_blocks(j, n0, n1, 1536); break;   /* and its feed-forward size */
    default: f32_blocks(j, n0, n1, j->K); break;
    }
}

/* The AVX2+FMA twin of block16 for CPUs without AVX-512: tb (<= 6) tokens x one 16-column
 * block as two 8-float halves, 12 accumulators + 2 weight vectors + 1 broadcast of AVX2's 16
 * registers. Each output is the same FMA chain over k as in block16, so the two give equal bits. */
#define TB2 6
__attribute__((target("avx2,fma"), always_inline)) static inline void
block16_avx2(const float *x, int K, const float *wp, const float *bias, float *y, int ldy,
             int acc, int tb)
{
    __m256 lo[TB2], hi[TB2];
#pragma GCC unroll 6
    for (int t = 0; t < TB2; t++)
        lo[t] = hi[t] = _mm256_setzero_ps();
    for (int k = 0; k < K; k++) {
        _mm_prefetch((const char *)(wp + (size_t)k * 16) + PF_DIST, _MM_HINT_T0);
        __m256 w0 = _mm256_loadu_ps(wp + (size_t)k * 16), w1 = _mm256_loadu_ps(wp + (size_t)k * 16 + 8);
#pragma GCC unroll 6
        for (int t = 0; t < tb; t++) {
            __m256 v = _mm256_broadcast_ss(x + (size_t)t * (size_t)K + (size_t)k);
            lo[t] = _mm256_fmadd_ps(v, w0, lo[t]);
            hi[t] = _mm256_fmadd_ps(v, w1, hi[t]);
        }
    }
    __m256 b0 = _mm256_loadu_ps(bias), b1 = _mm256_loadu_ps(bias + 8);
#pragma GCC unroll 6
    for (int t = 0; t < tb; t++) {
        float *out = y + (size_t)t * (size_t)ldy;
        __m256 v0 = _mm256_add_ps(lo[t], b0), v1 = _mm256_add_ps(hi[t], b1);
        if (acc) {
            v0 = _mm256_add_ps(v0, _mm256_loadu_ps(out));
            v1 = _mm256_add_ps(v1, _mm256_loadu_ps(out + 8));
        }
        _mm256_storeu_ps(out, v0);
        _mm256_storeu_ps(out + 8, v1);
    }
}

/* Columns [n0, n1) with block16_avx2. AVX2 machines have small L2 caches (512 KB on Zen 1) and
 * an f32 part's weights do not fit them (1536 x 384 x 4 / 2 bytes for MiniLM on 2 threads), so
 * the tokens go in chunks whose inputs fit about half of L2; within a chunk each 16-column
 * block's weights (K x 64 bytes) stay in L1/L2 while the chunk's token groups pass. */
__attribute__((target("avx2,fma"))) static void avx2_gemm(const gemm_job *j, int n0, int n1)
{
    int chunk = (int)((192u << 10) / ((unsigned)j->K * sizeof(float))) / TB2 * TB2;
    if (chunk < TB2)
        chunk = TB2;
    for (int c0 = 0; c0 < j->T; c0 += chunk) {
        int c1 = j->T - c0 < chunk ? j->T : c0 + chunk;
        for (int n = n0; n < n1; n += 16) {
            const float *wp = j->wp + (size_t)(n / 16) * (size_t)j->K * 16;
            for (int t0 = c0; t0 < c1; t0 += TB2) {
                int tb = c1 - t0 < TB2 ? c1 - t0 : TB2;
                const float *x = j->x + (size_t)t0 * (size_t)j->K;
                float *y = j->y + (size_t)t0 * (size_t)j->N + n;
                const float *b = j->bias + n;
                switch (tb) {
#define CASE(k) case k: block16_avx2(x, j->K, wp, b, y, j->N, j->accumulate, k); break;
                CASE(6) CASE(5) CASE(4) CASE(3) CASE(2)
#undef CASE
                default: block16_avx2(x, j->K, wp, b, y, j->N, j->accumulate, 1); break;
                }
            }
        }
    }
}
#endif

static void gemm_part(void *arg, int ith, int nth)
{
    const gemm_job *j = arg;
    long lo, hi;
    /* Split the output columns in blocks of 16 (whole SIMD rows for the sgemm kernels). */
    util_pool_split((j->N + 15) / 16, ith, nth, &lo, &hi);
    int n0 = (int)lo * 16, n1 = (int)hi * 16 < j->N ? (int)hi * 16 : j->N;
    if (n0 >= n1)
        return;
#ifdef HAVE_SMALL_KERNEL
    if (j->wb != NULL && j->amx) {
        kern__amx_bf16_gemm(j->xb, j->T, j->K, j->wb, j->bias, j->y, j->N, n0, n1,
                            j->accumulate, j->epilogue == EPI_GELU ? gelu_row : NULL);
        return;
    }
    if (j->wb != NULL) {
        bf16_gemm(j, n0, n1);
        if (j->epilogue == EPI_GELU)
            for (int t = 0; t < j->T; t++)
                gelu_row(j->y + (size_t)t * j->N + n0, n1 - n0);
        return;
    }
    if (j->wp != NULL) {
        if (j->packed == PACKED_AVX512)
            small_gemm(j, n0, n1);
        else
            avx2_gemm(j, n0, n1);
        if (j->epilogue == EPI_GELU)
            for (int t = 0; t < j->T; t++)
                gelu_row(j->y + (size_t)t * j->N + n0, n1 - n0);
        return;
    }
#endif
    for (int t = 0; t < j->T; t++) {
        float *y = j->y + (size_t)t * j->N;
        if (j->accumulate)
            for (int c = n0; c < n1; c++)
                y[c] += j->bias[c];
        else
            memcpy(y + n0, j->bias + n0, (size_t)(n1 - n0) * sizeof *y);
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, j->T, n1 - n0, j->K, 1.0f, j->x, j->K,
                j->w + (size_t)n0 * j->K, j->K, 1.0f, j->y + n0, j->N);
    if (j->epilogue == EPI_GELU)
        for (int t = 0; t < j->T; t++)
            gelu_row(j->y + (size_t)t * j->N + n0, n1 - n0);
}


/* ---- the entries ---- */

static cpu_dense *dense_of(const kern_dense *d)
{
    return (cpu_dense *)d;   /* pub is the first member */
}

/* w [n][k] -> [n / 16][k][16]: what the small-batch kernels read in order. */
static float *pack16(const float *w, int n, int k)
{
    float *p = aligned_alloc(64, ((size_t)n * (size_t)k * sizeof *p + 63) / 64 * 64);
    if (p == NULL)
        return NULL;
    for (int nb = 0; nb < n / 16; nb++)
        for (int kk = 0; kk < k; kk++)
            for (int j = 0; j < 16; j++)
                p[((size_t)nb * (size_t)k + (size_t)kk) * 16 + (size_t)j] =
                    w[(size_t)(nb * 16 + j) * (size_t)k + (size_t)kk];
    return p;
}

/* w [n][k] -> BF16 [n / 16][k / 2][16][2]: for each 16-column block and pair of inputs, the
 * 16 columns' two weights side by side (what VDPBF16PS multiplies pairwise). */
static uint16_t *pack16_bf16(const float *w, int n, int k)
{
    uint16_t *p = aligned_alloc(64, ((size_t)n * (size_t)k * 2 + 63) / 64 * 64);
    if (p == NULL)
        return NULL;
    size_t o = 0;
    for (int nb = 0; nb < n / 16; nb++)
        for (int kk = 0; kk < k; kk += 2)
            for (int j = 0; j < 16; j++)
                for (int e = 0; e < 2; e++)
                    p[o++] = kern_f32_to_bf16(w[(size_t)(nb * 16 + j) * (size_t)k + (size_t)(kk + e)]);
    return p;
}

static bool cpu_has_bf16(void)
{
#ifdef HAVE_SMALL_KERNEL
    return strcmp(kern_wtype_variant(), "ref") != 0 && __builtin_cpu_supports("avx512f") &&
           __builtin_cpu_supports("avx512bf16");
#else
    return false;
#endif
}

/* The f32 kernel cpuid names (the packed/sgemm crossover is raced later, per context). */
static int packed_kind(void)
{
#ifdef HAVE_SMALL_KERNEL
    if (getenv("LLMGW_BERT_SGEMM") != NULL)
        return PACKED_NONE;
    if (__builtin_cpu_supports("avx512f"))
        return PACKED_AVX512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return PACKED_AVX2;
#endif
    return PACKED_NONE;
}

static double time_gemm(gemm_job *j);

/* Seconds a token of a T-token product with d's kernel on one thread (x: [T][k] inputs, xb
 * room for their BF16 copy padded to 32 rows, y [T][n]). */
static double per_token(const cpu_dense *d, const float *x, uint16_t *xb, float *y, int T, int n)
{
    gemm_job j = {.x = x, .w = d->w, .bias = d->bias, .y = y, .T = T, .N = n, .K = d->pub.k,
                  .packed = packed_kind(), .amx = d->amx};
    if (d->wb != NULL) {
#ifdef HAVE_SMALL_KERNEL
        to_bf16(x, xb, (size_t)T * (size_t)d->pub.k);
#endif
        j.xb = xb;
        j.wb = d->wb;
    } else {
        j.wp = d->wp;
    }
    return time_gemm(&j) / T;
}

/* KERN_DENSE_AUTO on a CPU with BF16 products: whichever of the BF16 kernel and the packed f32
 * one is faster on this machine, raced once per backend on the first layer it packs (16 and
 * 256 tokens of its first 384 columns, ~30 ms; the verdict holds for the model's other layers,
 * so a model computes in one precision). BF16 halves the bytes and, with AMX tiles, multiplies
 * the products' speed many times; without AMX a VDPBF16PS may run no faster than an f32 FMA
 * (Sapphire Rapids), and then f32 is both faster and exact. */
static bool auto_bf16(kern_cpu *c, cpu_dense *d)
{
    if (c->enc_auto != 0) {
        memcpy(d->why, c->enc_auto_why, sizeof d->why);
        return c->enc_auto == 2;
    }
    const int k = d->pub.k, n = d->pub.n < 384 ? d->pub.n : 384, T = 256;
    cpu_dense f = *d, b = *d;
    f.wp = pack16(d->w, n, k);
    b.wb = pack16_bf16(d->w, n, k);
    float *x = malloc((size_t)T * (size_t)k * sizeof *x), *y = malloc((size_t)T * n * sizeof *y);
    uint16_t *xb = aligned_alloc(64, (size_t)T * (size_t)k * 2);
    bool bf16 = true;  /* without memory to race in: the precision cpuid offers */
    if (f.wp != NULL && b.wb != NULL && x != NULL && y != NULL && xb != NULL) {
        for (size_t i = 0; i < (size_t)T * (size_t)k; i++)
            x[i] = (float)((int)(i % 17) - 8) * 0.01f;
        f.wb = NULL;
        b.wp = NULL;
        double f16 = per_token(&f, x, xb, y, 16, n), f256 = per_token(&f, x, xb, y, T, n);
        double b16 = per_token(&b, x, xb, y, 16, n), b256 = per_token(&b, x, xb, y, T, n);
        bf16 = b16 + b256 <= f16 + f256;
        snprintf(c->enc_auto_why, sizeof c->enc_auto_why, "auto: bf16 at %.2fx f32's speed "
                 "at 16 tokens, %.2fx at %d", f16 / b16, f256 / b256, T);
        memcpy(d->why, c->enc_auto_why, sizeof d->why);
    }
    free(f.wp);
    free(b.wb);
    free(x);
    free(y);
    free(xb);
    c->enc_auto = bf16 ? 2 : 1;
    return bf16;
}

kern_dense *kern__enc_dense_new(void *ctx, const float *w, const float *bias, int n, int k,
                                int precision)
{
    kern_cpu *c = ctx;
    if (n <= 0 || k <= 0)
        return NULL;
    cpu_dense *d = calloc(1, sizeof *d);
    if (d == NULL)
        return NULL;
    d->pub = (kern_dense){.n = n, .k = k};
    d->w = w;
    d->bias = malloc((size_t)n * sizeof *d->bias);
    bool ok = d->bias != NULL;
    if (ok)
        memcpy(d->bias, bias, (size_t)n * sizeof *d->bias);
    if (ok && n % 16 == 0) {
        bool can_bf16 = k % 2 == 0 && cpu_has_bf16();
        d->amx = can_bf16 && k % 32 == 0 && kern__amx_usable();
        if (precision == KERN_DENSE_BF16)
            d->pub.bf16 = can_bf16;
        else if (precision == KERN_DENSE_AUTO)
            d->pub.bf16 = can_bf16 && auto_bf16(c, d);
        if (d->pub.bf16)
            ok = (d->wb = pack16_bf16(w, n, k)) != NULL;
        else
            ok = (d->wp = pack16(w, n, k)) != NULL;
        if (!d->pub.bf16)
            d->amx = false;
    }
    if (!ok) {
        kern__enc_dense_free(ctx, &d->pub);
        return NULL;
    }
    /* Our pool splits the work; OpenBLAS must not start threads of its own on top (this is
     * process-wide, and right for every OpenBLAS user that runs inside a pool of its own). */
    openblas_set_num_threads(1);
    return &d->pub;
}

void kern__enc_dense_free(void *ctx, kern_dense *pub)
{
    (void)ctx;
    if (pub == NULL)
        return;
    cpu_dense *d = dense_of(pub);
    free(d->bias);
    free(d->wp);
    free(d->wb);
    free(d);
}

/* Room for the BF16 copy of a product's input; the only allocation of the encoder entries,
 * growing to the largest batch seen. */
static uint16_t *xb_room(kern_cpu *c, size_t n)
{
    if (n > c->enc_xb_cap) {
        free(c->enc_xb);
        c->enc_xb = aligned_alloc(64, (n * 2 + 63) / 64 * 64);
        c->enc_xb_cap = c->enc_xb != NULL ? n : 0;
    }
    return c->enc_xb;
}

void kern__enc_dense(void *ctx, const kern_dense *pub, const float *x, int n_tok, float *y,
                     bool accumulate, bool gelu)
{
    kern_cpu *c = ctx;
    const cpu_dense *d = dense_of(pub);
    if (n_tok <= 0)
        return;
    if (c->enc_ref) {
        kern__enc_dense_ref(d->w, d->bias, pub->n, pub->k, x, n_tok, y, accumulate, gelu);
        return;
    }
    if (c->enc_kernels[0] == '\0')
        kern__enc_dense_kernels(ctx, pub);
    int packed = c->enc_packed;
    gemm_job j = {.x = x, .w = d->w, .bias = d->bias, .y = y, .T = n_tok, .N = pub->n,
                  .K = pub->k, .accumulate = accumulate, .epilogue = gelu ? EPI_GELU : EPI_NONE,
                  .packed = packed};
    if (d->wp != NULL && packed != PACKED_NONE && n_tok <= c->enc_packed_max)
        j.wp = d->wp;
#ifdef HAVE_SMALL_KERNEL
    if (d->wb != NULL) {
        /* AMX tiles read 16 or 32 rows at a time: the rows past n_tok are zeros */
        size_t rows = d->amx ? ((size_t)n_tok + 31) / 32 * 32 : (size_t)n_tok;
        uint16_t *xb = xb_room(c, rows * (size_t)pub->k);
        if (xb != NULL) {   /* else f32 sgemm on the caller's weights */
            to_bf16(x, xb, (size_t)n_tok * (size_t)pub->k);
            memset(xb + (size_t)n_tok * (size_t)pub->k, 0,
                   (rows - (size_t)n_tok) * (size_t)pub->k * 2);
            j.xb = xb;
            j.wb = d->wb;
            j.amx = d->amx;
        }
    }
#endif
    util_pool_run(c->pool, gemm_part, &j);
}

/* Seconds for the best of 3 runs (after one to warm up) of a T-token product on one thread. */
static double time_gemm(gemm_job *j)
{
    double best = 1e30;
    for (int r = 0; r < 4; r++) {
        uint64_t t0 = util_now_ns();
        gemm_part(j, 0, 1);
        double s = (double)(util_now_ns() - t0) * 1e-9;
        if (r > 0 && s < best)
            best = s;
    }
    return best;
}

/* Which f32 kernel this CPU runs, and up to how many tokens it beats sgemm (which repacks the
 * weights on every call but blocks large products for the caches better). cpuid names the
 * packed kernel; a race on the first 384 columns of the probe layer at 16, 64 and 256 tokens
 * (~20 ms) sets packed_max: the largest of those sizes the packed kernel wins, every size when
 * it wins at 256. LLMGW_BERT_SGEMM=1 keeps sgemm for every batch and LLMGW_BERT_PACKED=1 the
 * packed kernel (to compare the two). */
const char *kern__enc_dense_kernels(void *ctx, const kern_dense *probe)
{
    kern_cpu *c = ctx;
    if (c->enc_kernels[0] != '\0')
        return c->enc_kernels;
    c->enc_packed = PACKED_NONE;
    c->enc_packed_max = 0;
    if (c->enc_ref) {
        snprintf(c->enc_kernels, sizeof c->enc_kernels, "f32 scalar reference (LLMGW_KERNELS=ref)");
        return c->enc_kernels;
    }
    c->enc_packed = packed_kind();
    const cpu_dense *d = probe != NULL ? dense_of(probe) : NULL;
    const char *name = c->enc_packed == PACKED_AVX512 ? "avx512" : "avx2";
    if (d != NULL && probe->bf16) {
        snprintf(c->enc_kernels, sizeof c->enc_kernels, "bf16 %s at every batch%s%s%s",
                 d->amx ? "amx tiles" : "avx512 packed", d->why[0] ? " (" : "", d->why,
                 d->why[0] ? ")" : "");
        return c->enc_kernels;
    }
    if (c->enc_packed == PACKED_NONE || d == NULL || d->wp == NULL) {
        c->enc_packed = PACKED_NONE;
        snprintf(c->enc_kernels, sizeof c->enc_kernels, "f32 sgemm at every batch");
        return c->enc_kernels;
    }
    const char *force = getenv("LLMGW_BERT_PACKED");
    if (force != NULL && strcmp(force, "1") == 0) {
        c->enc_packed_max = INT_MAX;
        snprintf(c->enc_kernels, sizeof c->enc_kernels, "f32 %s packed at every batch (forced)",
                 name);
        return c->enc_kernels;
    }
    static const int sizes[] = {16, 64, 256};
    const int K = probe->k, N = probe->n < 384 ? probe->n : 384, T = 256;
    float *x = malloc((size_t)T * (size_t)K * sizeof *x), *y = malloc((size_t)T * N * sizeof *y);
    if (x == NULL || y == NULL) {
        free(x);
        free(y);
        c->enc_packed_max = 64;  /* no memory to race in: the crossover measured on Zen 4 */
        snprintf(c->enc_kernels, sizeof c->enc_kernels, "f32 %s packed up to 64 tokens", name);
        return c->enc_kernels;
    }
    for (size_t i = 0; i < (size_t)T * (size_t)K; i++)
        x[i] = (float)((int)(i % 17) - 8) * 0.01f;
    double packed_s[3] = {0}, sgemm_s[3] = {0};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        gemm_job j = {.x = x, .w = d->w, .bias = d->bias, .y = y, .T = sizes[i], .N = N, .K = K,
                      .packed = c->enc_packed};
        sgemm_s[i] = time_gemm(&j);
        j.wp = d->wp;
        packed_s[i] = time_gemm(&j);
        if (packed_s[i] <= sgemm_s[i])
            c->enc_packed_max = i + 1 < sizeof sizes / sizeof sizes[0] ? sizes[i] : INT_MAX;
    }
    free(x);
    free(y);
    if (c->enc_packed_max == INT_MAX)
        snprintf(c->enc_kernels, sizeof c->enc_kernels, "f32 %s packed at every batch (%.2fx "
                 "sgemm's speed at 256 tokens)", name, sgemm_s[2] / packed_s[2]);
    else if (c->enc_packed_max > 0)
        snprintf(c->enc_kernels, sizeof c->enc_kernels, "f32 %s packed up to %d tokens, sgemm "
                 "above", name, c->enc_packed_max);
    else
        snprintf(c->enc_kernels, sizeof c->enc_kernels, "f32 sgemm at every batch (%s packed "
                 "slower)", name);
    if (d->why[0] != '\0') {
        size_t l = strlen(c->enc_kernels);
        snprintf(c->enc_kernels + l, sizeof c->enc_kernels - l, "; %s", d->why);
    }
    return c->enc_kernels;
}

typedef struct ln_job {
    float *x;
    const float *w, *b;
    int64_t n;
    int T;
    float eps;
} ln_job;

static void ln_part(void *arg, int ith, int nth)
{
    const ln_job *j = arg;
    long lo, hi;
    util_pool_split(j->T, ith, nth, &lo, &hi);
    for (long t = lo; t < hi; t++)
        layer_norm_row(j->x + (size_t)t * (size_t)j->n, j->w, j->b, (int)j->n, j->eps);
}

void kern__enc_layernorm(void *ctx, float *x, const float *w, const float *b, int64_t n,
                         int n_tok, float eps)
{
    kern_cpu *c = ctx;
    if (c->enc_ref) {
        kern__enc_layernorm_ref(x, w, b, n, n_tok, eps);
        return;
    }
    ln_job j = {x, w, b, n, n_tok, eps};
    util_pool_run(c->pool, ln_part, &j);
}

typedef struct gelu_job {
    float *x;
    size_t n;
} gelu_job;

static void gelu_part(void *arg, int ith, int nth)
{
    const gelu_job *j = arg;
    long lo, hi;
    util_pool_split((long)((j->n + 63) / 64), ith, nth, &lo, &hi);
    size_t a = (size_t)lo * 64, b = (size_t)hi * 64 < j->n ? (size_t)hi * 64 : j->n;
    if (a < b)
        gelu_row(j->x + a, (int)(b - a));
}

void kern__enc_gelu(void *ctx, float *x, size_t n)
{
    kern_cpu *c = ctx;
    if (c->enc_ref) {
        kern__enc_gelu_ref(x, n);
        return;
    }
    gelu_job j = {x, n};
    util_pool_run(c->pool, gelu_part, &j);
}

typedef struct att_job {
    const float *qkv;
    float *out;
    const int32_t *start;
    int n_seq, n_head, head_dim, max_len;
    float *scores;   /* [nth][stride]: a sequence's scores [L][L] and its keys transposed [D][L] */
    size_t stride;
} att_job;

/* 8 floats as one value (GCC/clang vector extensions): one ymm register in the AVX-512 and AVX2
 * clones alike (a 16-float type was two ymm in the AVX2 clone, which GCC shuffled through the
 * stack); v8u reads and writes them at any float's alignment. */
typedef float v8 __attribute__((vector_size(32)));
typedef float v8u __attribute__((vector_size(32), aligned(4), may_alias));
#define LD8(p) (*(const v8u *)(p))

/* Softmax attention of one head of one sequence of L tokens starting at row s0, four queries at
 * a time (four independent sums hide the adds' latency): the keys transposed and padded with
 * zeros to Lp, a multiple of 16; the four queries' scores 8 keys at a time; their outputs 8
 * dimensions at a time (the last group repeats its last query where L is no multiple of 4, and
 * drops the copies). Each score and output is one chain over d or t in order, and a softmax's
 * sum runs in 16 lanes added as a tree, whatever the vector width. OpenBLAS' sgemm on matrices
 * this small (15 x 15 x 32) spent more time packing than multiplying (and on a CPU it does not
 * recognise it picks SSE3 kernels). */
#define AG 4
SIMD_CLONES static void attend(const att_job *j, int s0, int L, int h, float *S)
{
    const int H = j->n_head * j->head_dim, D = j->head_dim, ld = 3 * H, Lp = (L + 15) / 16 * 16;
    const float *q = j->qkv + (size_t)s0 * ld + h * D, *k = q + H, *v = q + 2 * H;
    float *o = j->out + (size_t)s0 * H + h * D;
    float *r = S, *kt = S + (size_t)AG * Lp;   /* r [AG][Lp], kt [D][Lp] */
    const float scale = 1.0f / sqrtf((float)D);
    for (int d = 0; d < D; d++) {
        for (int t = 0; t < L; t++)
            kt[(size_t)d * Lp + t] = k[(size_t)t * ld + d];
        for (int t = L; t < Lp; t++)
            kt[(size_t)d * Lp + t] = 0;
    }
    for (int i0 = 0; i0 < L; i0 += AG) {
        const float *q0 = q + (size_t)i0 * ld, *q1 = q + (size_t)(i0 + 1 < L ? i0 + 1 : L - 1) * ld,
                    *q2 = q + (size_t)(i0 + 2 < L ? i0 + 2 : L - 1) * ld,
                    *q3 = q + (size_t)(i0 + 3 < L ? i0 + 3 : L - 1) * ld;
        float *r0 = r, *r1 = r + Lp, *r2 = r + 2 * Lp, *r3 = r + 3 * Lp;
        for (int t0 = 0; t0 < Lp; t0 += 8) {    /* scores, 8 keys at a time */
            v8 a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
            for (int d = 0; d < D; d++) {
                v8 kd = LD8(kt + (size_t)d * Lp + t0);
                a0 += q0[d] * kd;
                a1 += q1[d] * kd;
                a2 += q2[d] * kd;
                a3 += q3[d] * kd;
            }
            *(v8u *)(r0 + t0) = a0 * scale;
            *(v8u *)(r1 + t0) = a1 * scale;
            *(v8u *)(r2 + t0) = a2 * scale;
            *(v8u *)(r3 + t0) = a3 * scale;
        }
        for (int g = 0; g < AG; g++) {          /* softmax */
            float *rg = r + (size_t)g * Lp, mx = rg[0];
            for (int t = 1; t < L; t++)
                mx = rg[t] > mx ? rg[t] : mx;
            for (int t = 0; t < L; t++)
                rg[t] = fast_exp(rg[t] - mx);
            for (int t = L; t < Lp; t++)
                rg[t] = 0.0f;
            v8 lo = LD8(rg), hi = LD8(rg + 8);  /* 16 lanes: lo 0-7, hi 8-15 */
            for (int t0 = 16; t0 < Lp; t0 += 16) {
                lo += LD8(rg + t0);
                hi += LD8(rg + t0 + 8);
            }
            lo += hi;                           /* then halves: a tree, not a chain of 16 */
            for (int w = 4; w > 0; w /= 2)
                for (int l = 0; l < w; l++)
                    lo[l] += lo[l + w];
            float inv = 1.0f / lo[0];
            for (int t0 = 0; t0 < Lp; t0 += 8)
                *(v8u *)(rg + t0) = LD8(rg + t0) * inv;
        }
        int n_out = L - i0 < AG ? L - i0 : AG, d0 = 0;
        for (; d0 + 8 <= D; d0 += 8) {            /* outputs, 8 dimensions at a time */
            v8 a[AG], a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
            for (int t = 0; t < L; t++) {
                v8 vt = LD8(v + (size_t)t * ld + d0);
                a0 += r0[t] * vt;
                a1 += r1[t] * vt;
                a2 += r2[t] * vt;
                a3 += r3[t] * vt;
            }
            a[0] = a0, a[1] = a1, a[2] = a2, a[3] = a3;
            for (int g = 0; g < n_out; g++)
                *(v8u *)(o + (size_t)(i0 + g) * H + d0) = a[g];
        }
        for (int g = 0; g < n_out; g++)
            for (int d = d0; d < D; d++) {
                float acc = 0;
                for (int t = 0; t < L; t++)
                    acc += r[g * Lp + t] * v[(size_t)t * ld + d];
                o[(size_t)(i0 + g) * H + d] = acc;
            }
    }
}

static void att_part(void *arg, int ith, int nth)
{
    const att_job *j = arg;
    float *S = j->scores + (size_t)ith * j->stride;
    long lo, hi;
    util_pool_split((long)j->n_seq * j->n_head, ith, nth, &lo, &hi);
    for (long p = lo; p < hi; p++) {
        int s = (int)(p / j->n_head), h = (int)(p % j->n_head);
        attend(j, j->start[s], j->start[s + 1] - j->start[s], h, S);
    }
}

void kern__enc_attention(void *ctx, const float *qkv, float *out, const int32_t *start,
                         int n_seq, int n_head, int head_dim)
{
    kern_cpu *c = ctx;
    if (c->enc_ref) {
        kern__enc_attention_ref(qkv, out, start, n_seq, n_head, head_dim);
        return;
    }
    int max_len = 1;
    for (int s = 0; s < n_seq; s++)
        max_len = start[s + 1] - start[s] > max_len ? start[s + 1] - start[s] : max_len;
    size_t lp = ((size_t)max_len + 15) / 16 * 16, stride = lp * (AG + (size_t)head_dim);
    size_t need = (size_t)c->nth * stride;
    if (need > c->enc_scores_cap) {
        free(c->enc_scores);
        c->enc_scores = malloc(need * sizeof *c->enc_scores);
        c->enc_scores_cap = c->enc_scores != NULL ? need : 0;
        if (c->enc_scores == NULL) {   /* no memory: the reference needs none */
            kern__enc_attention_ref(qkv, out, start, n_seq, n_head, head_dim);
            return;
        }
    }
    att_job j = {qkv, out, start, n_seq, n_head, head_dim, max_len, c->enc_scores, stride};
    util_pool_run(c->pool, att_part, &j);
}

void kern__enc_set_spin(void *ctx, uint64_t ns)
{
    util_pool_set_linger(((kern_cpu *)ctx)->pool, ns);
}
