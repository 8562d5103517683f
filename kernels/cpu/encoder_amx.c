/* kernels/cpu/encoder_amx.c: the encoder's BF16 dense product on Intel AMX (the tile unit of
 * Sapphire Rapids and later): y = x W^T + bias (+ y) (then an epilogue per row), x in BF16
 * [T][K] with its rows padded with zeros to a multiple of 16, W the BF16 packing encoder.c
 * keeps for VDPBF16PS ([N / 16][K / 2][16][2], which is also the pair-interleaved layout a
 * TDPBF16PS B tile reads: a tile of 32 inputs x 16 columns is 16 rows of 64 contiguous bytes).
 *
 * Tiles: 0-3 accumulate a 32-token x 32-column block (2 x 2 tiles of 16 x 16 f32), 4-5 hold
 * two 16-token input tiles, 6-7 two weight tiles; each step over 32 inputs loads 4 tiles and
 * runs 4 TDPBF16PS. An output's sum runs over K in steps of 32 whatever its row or column
 * in a tile, so a token's result does not depend on its batch.
 *
 * Linux hands a process the tile registers only after it asks (arch_prctl
 * ARCH_REQ_XCOMP_PERM); without that the first tile instruction is SIGILL. kern__amx_usable
 * asks once. Each call loads the tile configuration in its thread and releases the tiles at
 * the end (so a thread switch does not carry 8 KiB of tile state). */
#include "kernels/cpu/features.h"
#include "kernels/cpu/internal.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && defined(__linux__) && (defined(__GNUC__) || defined(__clang__)) && \
    (!defined(__GNUC__) || defined(__clang__) || __GNUC__ >= 11)
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#define HAVE_AMX 1
#endif

#ifdef HAVE_AMX
enum { ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18 };

static bool amx_ok;
static pthread_once_t amx_once = PTHREAD_ONCE_INIT;

static void amx_probe(void)
{
    const char *off = getenv("LLMGW_BERT_AMX");
    if (off != NULL && strcmp(off, "0") == 0)
        return;
    if (!kern_cpu_features_get()->amx_bf16)
        return;
    /* The OS must save the tile state (XCR0 bits 17 and 18) and grant it to us. */
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & (3u << 17)) != (3u << 17))
        return;
    amx_ok = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
}

bool kern__amx_usable(void)
{
    pthread_once(&amx_once, amx_probe);
    return amx_ok;
}

/* The 64-byte tile configuration: palette 1, eight tiles of 16 rows x 64 bytes. */
typedef struct __attribute__((packed)) amx_cfg {
    uint8_t palette, start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_cfg;

__attribute__((target("amx-tile"))) void kern__amx_tiles_16x64(void)
{
    amx_cfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int i = 0; i < 8; i++) {
        cfg.colsb[i] = 64;
        cfg.rows[i] = 16;
    }
    /* ldtilecfg by hand: gcc 12's _tile_loadconfig does not tell the compiler it reads cfg, and
     * the stores that fill it can be dropped as dead (then ldtilecfg faults) */
    __asm__ volatile("ldtilecfg %0" : : "m"(cfg));
}

/* y rows [0, tb) of one 16 x 16 f32 tile c (row stride 16 floats): + bias (+ y), then epi. */
__attribute__((target("avx512f"))) static void tile_out(const float *c, int tb, const float *bias,
                                                       float *y, int ldy, bool acc,
                                                       void (*epi)(float *, int))
{
    __m512 b = _mm512_loadu_ps(bias);
    for (int t = 0; t < tb; t++) {
        float *out = y + (size_t)t * (size_t)ldy;
        __m512 v = _mm512_add_ps(_mm512_loadu_ps(c + t * 16), b);
        if (acc)
            v = _mm512_add_ps(v, _mm512_loadu_ps(out));
        _mm512_storeu_ps(out, v);
        if (epi != NULL)
            epi(out, 16);
    }
}

/* One block of up to 32 tokens (two input tiles when ta = 2) x 16 or 32 columns (nb = 1 or
 * 2 weight tiles). ta and nb are constants once inlined, so the tile numbers are too. */
__attribute__((target("amx-tile,amx-bf16,avx512f"), always_inline)) static inline void
amx_block(const uint16_t *x, int K, const uint16_t *w0, const float *bias, float *y, int ldy,
          int tb, bool acc, void (*epi)(float *, int), float *c, const int ta, const int nb)
{
    const size_t xs = (size_t)K * 2, wstep = 16 * 32;   /* bytes a row of x; w per 32 inputs */
    const uint16_t *w1 = w0 + (size_t)K * 16;           /* the next 16-column block */
    const uint16_t *x1 = x + (size_t)16 * (size_t)K;
    _tile_zero(0);
    if (nb == 2)
        _tile_zero(1);
    if (ta == 2)
        _tile_zero(2);
    if (ta == 2 && nb == 2)
        _tile_zero(3);
    for (int k = 0; k < K; k += 32) {
        size_t wo = (size_t)(k / 32) * wstep;
        _tile_loadd(4, x + k, xs);
        _tile_loadd(6, w0 + wo, 64);
        if (nb == 2)
            _tile_loadd(7, w1 + wo, 64);
        if (ta == 2)
            _tile_loadd(5, x1 + k, xs);
        _tile_dpbf16ps(0, 4, 6);
        if (nb == 2)
            _tile_dpbf16ps(1, 4, 7);
        if (ta == 2)
            _tile_dpbf16ps(2, 5, 6);
        if (ta == 2 && nb == 2)
            _tile_dpbf16ps(3, 5, 7);
    }
    /* c: four 16 x 16 tiles, [tile][16][16] */
    _tile_stored(0, c, 64);
    if (nb == 2)
        _tile_stored(1, c + 256, 64);
    if (ta == 2)
        _tile_stored(2, c + 512, 64);
    if (ta == 2 && nb == 2)
        _tile_stored(3, c + 768, 64);
    int tb0 = tb < 16 ? tb : 16;
    tile_out(c, tb0, bias, y, ldy, acc, epi);
    if (nb == 2)
        tile_out(c + 256, tb0, bias + 16, y + 16, ldy, acc, epi);
    if (ta == 2) {
        float *y1 = y + (size_t)16 * (size_t)ldy;
        tile_out(c + 512, tb - 16, bias, y1, ldy, acc, epi);
        if (nb == 2)
            tile_out(c + 768, tb - 16, bias + 16, y1 + 16, ldy, acc, epi);
    }
}

__attribute__((target("amx-tile,amx-bf16,avx512f"))) void
kern__amx_bf16_gemm(const uint16_t *xb, int T, int K, const uint16_t *wb, const float *bias,
                    float *y, int N, int n0, int n1, bool acc, void (*epi)(float *, int))
{
    kern__amx_tiles_16x64();
    float c[4 * 256] __attribute__((aligned(64)));
    /* Token groups outside: a group's inputs (32 x K BF16) stay in L1/L2 while the part's
     * weights pass, and those stay in L2 for the next group. */
    for (int t0 = 0; t0 < T; t0 += 32) {
        int tb = T - t0 < 32 ? T - t0 : 32;
        const uint16_t *x = xb + (size_t)t0 * (size_t)K;
        float *yt = y + (size_t)t0 * (size_t)N;
        int n = n0;
        for (; n + 32 <= n1; n += 32) {
            const uint16_t *w = wb + (size_t)(n / 16) * (size_t)K * 16;
            if (tb > 16)
                amx_block(x, K, w, bias + n, yt + n, N, tb, acc, epi, c, 2, 2);
            else
                amx_block(x, K, w, bias + n, yt + n, N, tb, acc, epi, c, 1, 2);
        }
        if (n < n1) {
            const uint16_t *w = wb + (size_t)(n / 16) * (size_t)K * 16;
            if (tb > 16)
                amx_block(x, K, w, bias + n, yt + n, N, tb, acc, epi, c, 2, 1);
            else
                amx_block(x, K, w, bias + n, yt + n, N, tb, acc, epi, c, 1, 1);
        }
    }
    _tile_release();
}
#else
bool kern__amx_usable(void) { return false; }

void kern__amx_tiles_16x64(void)
{
    abort();   /* never called: kern__amx_usable said no */
}

void kern__amx_bf16_gemm(const uint16_t *xb, int T, int K, const uint16_t *wb, const float *bias,
                         float *y, int N, int n0, int n1, bool acc, void (*epi)(float *, int))
{
    (void)xb, (void)T, (void)K, (void)wb, (void)bias, (void)y, (void)N, (void)n0, (void)n1;
    (void)acc, (void)epi;
    abort();   /* never called: kern__amx_usable said no */
}
#endif
