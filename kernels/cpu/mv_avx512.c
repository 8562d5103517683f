/* kernels/cpu/mv_avx512.c: AVX-512 (F, BW, VL, VNNI) matrix-vector kernels for one token
 * (decode) against Q4_0, Q4_1 and Q8_0 rows: four blocks per step, the blocks' f16 scales lined
 * up with one word permute and converted together, four rows per call sharing one reduction. The
 * activation is rearranged once per call to match the weights' byte order. Installed by
 * quant_avx512.c; compiled alone with the AVX-512 flags. */
#include "kernels/cpu/internal.h"

#include <immintrin.h>
#include <string.h>

/* One token against Q4_0 / Q4_1 rows, four blocks per step. Two 64-byte loads cover four blocks;
 * VPERMT2W lines up their 64 nibble bytes, VPERMW their f16 scales (Q4_0: [d d] per block; Q4_1:
 * [d m]), which one multiply by the activation's [d s] pairs turns into the blocks' scale (even
 * lanes) and offset term (odd lanes, summed at the end: Q4_1's m*s, Q4_0's d*s times -8). The
 * activation is rearranged once per call to match: xl = the four blocks' elements 0..15, xh =
 * their 16..31, so lanes 4k..4k+3 of the VPDPBUSD result belong to block k. */
enum { MV_MAX_GROUPS = 128 };   /* 512 blocks (16384 columns); wider rows take the dot loop */

/* How far ahead (bytes) the kernels prefetch the weight stream. The hardware prefetchers alone
 * left a decode step at ~70 % of one core's read bandwidth (2 threads: 139 tg64 t/s on
 * SmolLM2-135M Q4_1, Sapphire Rapids VM); 2-8 KiB ahead: 300 t/s. A row of 576 columns is
 * 360 bytes (Q4_1), so this reaches about ten rows ahead. */
#define MV_PF 4096

typedef struct mv_act {
    int8_t xl[MV_MAX_GROUPS][64], xh[MV_MAX_GROUPS][64];
    float xs[MV_MAX_GROUPS][8];   /* [d s] of the four blocks */
} mv_act;

static void mv_act_prepare(const kern_q8_32 *x, int64_t nb, mv_act *a)
{
    int64_t groups = (nb + 3) / 4;
    memset(a->xl[groups - 1], 0, 64);
    memset(a->xh[groups - 1], 0, 64);
    memset(a->xs[groups - 1], 0, 32);
    for (int64_t b = 0; b < nb; b++) {
        int64_t j = b / 4, k = b % 4;
        memcpy(a->xl[j] + 16 * k, x[b].qs, 16);
        memcpy(a->xh[j] + 16 * k, x[b].qs + 16, 16);
        a->xs[j][2 * k] = x[b].d;
        a->xs[j][2 * k + 1] = x[b].s;
    }
}

typedef struct q4_layout {
    size_t bb;            /* block bytes */
    size_t second;        /* offset of the second load: it must cover the fourth block's nibbles */
    uint16_t qidx[32];    /* VPERMT2W: the 4 x 16 nibble bytes out of the two loads */
    uint16_t sidx[32];    /* VPERMW: 8 f16 scale words out of the first load (first 8 used) */
} q4_layout;

/* Four rows at a time (independent chains, one reduction for all four). A last group of fewer
 * than four blocks is read with a byte mask, so missing blocks read as zero nibbles and zero
 * scales; the activation arrays are zero there too. */
static void mv_rows4_q4(const uint8_t *const rows[4], int64_t nb, const mv_act *a,
                        const q4_layout *L, __m512i qidx, __m512i sidx, float y[4])
{
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    const __m512i spread = _mm512_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2, 4, 4, 4, 4, 6, 6, 6, 6);
    int64_t full = nb / 4, groups = (nb + 3) / 4;
    size_t gbytes = 4 * L->bb;
    __mmask64 last = _cvtu64_mask64(nb % 4 ? (1ull << ((nb % 4) * L->bb)) - 1 : ~0ull);
    __m512 acc[4];
    __m256 off[4];
    for (int r = 0; r < 4; r++) {
        acc[r] = _mm512_setzero_ps();
        off[r] = _mm256_setzero_ps();
    }
    /* Row after row (the four rows are consecutive in memory: one stream for the prefetcher),
     * two accumulators per row to hide the FMA latency. */
    for (int r = 0; r < 4; r++) {
        __m512 acc1 = _mm512_setzero_ps();
        for (int64_t j = 0; j < groups; j++) {
            const uint8_t *g = rows[r] + (size_t)j * gbytes;
            _mm_prefetch((const char *)g + MV_PF, _MM_HINT_T0);
            _mm_prefetch((const char *)g + MV_PF + 64, _MM_HINT_T0);
            __m512i lo, hi;
            if (j < full) {
                lo = _mm512_loadu_si512(g);
                hi = _mm512_loadu_si512(g + L->second);
            } else {
                lo = _mm512_maskz_loadu_epi8(last, g);
                hi = _mm512_setzero_si512();
            }
            __m512i q = _mm512_permutex2var_epi16(lo, qidx, hi);
            __m256 sc = _mm256_cvtph_ps(_mm512_castsi512_si128(_mm512_permutexvar_epi16(sidx, lo)));
            __m256 p = _mm256_mul_ps(sc, _mm256_load_ps(a->xs[j]));
            off[r] = _mm256_add_ps(off[r], p);
            __m512 s = _mm512_permutexvar_ps(spread, _mm512_castps256_ps512(p));
            __m512i ql = _mm512_and_si512(q, m4), qh = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
            __m512i i = _mm512_dpbusd_epi32(_mm512_setzero_si512(), ql, _mm512_load_si512(a->xl[j]));
            i = _mm512_dpbusd_epi32(i, qh, _mm512_load_si512(a->xh[j]));
            __m512 f = _mm512_cvtepi32_ps(i);
            if (j & 1)
                acc1 = _mm512_fmadd_ps(f, s, acc1);
            else
                acc[r] = _mm512_fmadd_ps(f, s, acc[r]);
        }
        acc[r] = _mm512_add_ps(acc[r], acc1);
    }
    /* Odd lanes of off hold the offset terms: Q4_1's m*s, Q4_0's d*s (times -8). */
    float f = L->bb == 18 ? -8.0f : 1.0f;
    const __m256 oddf = _mm256_setr_ps(0, f, 0, f, 0, f, 0, f);
    __m256 v[4];
    for (int r = 0; r < 4; r++)
        v[r] = _mm256_fmadd_ps(off[r], oddf, _mm256_add_ps(_mm512_castps512_ps256(acc[r]),
                                                           _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc[r]), 1))));
    __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));
    _mm_storeu_ps(y, _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1)));
}

static q4_layout layouts[2];   /* Q4_0, Q4_1: filled once by kern__mv_init_avx512 */

/* Q4_0: blocks of 18 (d, 16 nibble bytes), second load at +8; Q4_1: blocks of 20 (d, m, 16
 * bytes), second load at +16. Nibbles of block k start at k*bb + 2 (or 4), always at an even
 * byte; the fourth block's come from the second load. */
void kern__mv_init_avx512(void)
{
    for (int v = 0; v < 2; v++) {
        q4_layout *l = &layouts[v];
        l->bb = v ? 20 : 18;
        l->second = v ? 16 : 8;
        size_t qoff = v ? 4 : 2;
        for (int i = 0; i < 32; i++) {
            size_t k = (size_t)i / 8, byte = k * l->bb + qoff + 2 * ((size_t)i % 8);
            l->qidx[i] = (uint16_t)(k < 3 ? byte / 2 : 32 + (byte - l->second) / 2);
        }
        memset(l->sidx, 0, sizeof l->sidx);
        for (int k = 0; k < 4; k++) {
            size_t w = (size_t)k * l->bb / 2;   /* the word of d */
            l->sidx[2 * k] = (uint16_t)w;
            l->sidx[2 * k + 1] = (uint16_t)(v ? w + 1 : w);
        }
    }
}

static void mv_q4(int64_t n, const void *w, size_t ws, int nr, const void *act, float *y,
                  int q4_1, uint32_t type)
{
    int64_t nb = n / 32, groups = (nb + 3) / 4;
    if (groups > MV_MAX_GROUPS) {
        const kern_wtype *t = kern_wtype_get(type);
        for (int r = 0; r < nr; r++)
            t->dot(n, (const uint8_t *)w + (size_t)r * ws, act, &y[r]);
        return;
    }
    const q4_layout *L = &layouts[q4_1];
    __m512i qidx = _mm512_loadu_si512(L->qidx), sidx = _mm512_loadu_si512(L->sidx);
    _Alignas(64) mv_act a;
    mv_act_prepare(act, nb, &a);
    for (int r = 0; r < nr; r += 4) {
        const uint8_t *rows[4];
        for (int k = 0; k < 4; k++)   /* past nr: repeat the last row, results dropped */
            rows[k] = (const uint8_t *)w + (size_t)(r + k < nr ? r + k : nr - 1) * ws;
        float out[4];
        mv_rows4_q4(rows, nb, &a, L, qidx, sidx, out);
        for (int k = 0; k < 4 && r + k < nr; k++)
            y[r + k] = out[k];
    }
}

void kern__mv_q4_0_avx512(int64_t n, const void *w, size_t ws, int nr, const void *act, float *y)
{
    mv_q4(n, w, ws, nr, act, y, 0, KERN_TYPE_Q4_0);
}

void kern__mv_q4_1_avx512(int64_t n, const void *w, size_t ws, int nr, const void *act, float *y)
{
    mv_q4(n, w, ws, nr, act, y, 1, KERN_TYPE_Q4_1);
}

/* Q8_0 the same way: per four blocks, VPERMT2W picks the scales [d d] out of two 64-byte loads
 * (even lanes: d * dx; odd lanes: d * s for the offset below), and the blocks' 32 signed bytes,
 * made unsigned by +128 (flip the sign bit), go two blocks per VPDPBUSD against the activation
 * bytes laid out block after block (xl: blocks 0-1, xh: blocks 2-3 of the group); the +128 comes
 * back out as -128 * sum d * s. */
static void mv_act_prepare_q8(const kern_q8_32 *x, int64_t nb, mv_act *a)
{
    int64_t groups = (nb + 3) / 4;
    memset(a->xl[groups - 1], 0, 64);
    memset(a->xh[groups - 1], 0, 64);
    memset(a->xs[groups - 1], 0, 32);
    for (int64_t b = 0; b < nb; b++) {
        int64_t j = b / 4, k = b % 4;
        memcpy((k < 2 ? a->xl[j] : a->xh[j]) + 32 * (k % 2), x[b].qs, 32);
        a->xs[j][2 * k] = x[b].d;
        a->xs[j][2 * k + 1] = x[b].s;
    }
}

static inline __m256i q8_qs(const uint8_t *g, int k, int valid_blocks)
{
    const uint8_t *p = g + 34 * k + 2;
    if (k < valid_blocks)
        return _mm256_loadu_si256((const __m256i *)p);
    return _mm256_setzero_si256();
}

static void mv_rows4_q8(const uint8_t *const rows[4], int64_t nb, const mv_act *a, float y[4])
{
    const __m512i bias = _mm512_set1_epi8((char)0x80);
    const __m512i sidx = _mm512_setr_epi32(0, 17 | 17 << 16, 34 | 34 << 16, 51 | 51 << 16,
                                           0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
    const __m512i s01 = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 2, 2, 2, 2, 2, 2, 2, 2);
    const __m512i s23 = _mm512_setr_epi32(4, 4, 4, 4, 4, 4, 4, 4, 6, 6, 6, 6, 6, 6, 6, 6);
    int64_t full = nb / 4, groups = (nb + 3) / 4;
    size_t valid = (size_t)(nb % 4) * 34;
    __mmask64 ka = _cvtu64_mask64(valid >= 64 ? ~0ull : (1ull << valid) - 1);
    __mmask64 kb = _cvtu64_mask64(valid > 64 ? (1ull << (valid - 64)) - 1 : 0);
    __m512 acc[4];
    __m256 off[4];
    for (int r = 0; r < 4; r++) {
        __m512 a0 = _mm512_setzero_ps(), a1 = a0;
        off[r] = _mm256_setzero_ps();
        for (int64_t j = 0; j < groups; j++) {
            const uint8_t *g = rows[r] + (size_t)j * 136;
            _mm_prefetch((const char *)g + MV_PF, _MM_HINT_T0);
            _mm_prefetch((const char *)g + MV_PF + 64, _MM_HINT_T0);
            _mm_prefetch((const char *)g + MV_PF + 128, _MM_HINT_T0);
            int vb = j < full ? 4 : (int)(nb % 4);
            __m512i lo, hi;
            if (j < full) {
                lo = _mm512_loadu_si512(g);
                hi = _mm512_loadu_si512(g + 64);
            } else {
                lo = _mm512_maskz_loadu_epi8(ka, g);
                hi = _mm512_maskz_loadu_epi8(kb, g + 64);
            }
            __m256 sc = _mm256_cvtph_ps(_mm512_castsi512_si128(_mm512_permutex2var_epi16(lo, sidx, hi)));
            __m256 p = _mm256_mul_ps(sc, _mm256_load_ps(a->xs[j]));
            off[r] = _mm256_add_ps(off[r], p);
            __m512 pz = _mm512_castps256_ps512(p);
            __m512i q01 = _mm512_inserti64x4(_mm512_castsi256_si512(q8_qs(g, 0, vb)), q8_qs(g, 1, vb), 1);
            __m512i q23 = _mm512_inserti64x4(_mm512_castsi256_si512(q8_qs(g, 2, vb)), q8_qs(g, 3, vb), 1);
            __m512i i01 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_xor_si512(q01, bias),
                                              _mm512_load_si512(a->xl[j]));
            __m512i i23 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_xor_si512(q23, bias),
                                              _mm512_load_si512(a->xh[j]));
            a0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i01), _mm512_permutexvar_ps(s01, pz), a0);
            a1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i23), _mm512_permutexvar_ps(s23, pz), a1);
        }
        acc[r] = _mm512_add_ps(a0, a1);
    }
    const __m256 oddf = _mm256_setr_ps(0, -128.0f, 0, -128.0f, 0, -128.0f, 0, -128.0f);
    __m256 v[4];
    for (int r = 0; r < 4; r++)
        v[r] = _mm256_fmadd_ps(off[r], oddf, _mm256_add_ps(_mm512_castps512_ps256(acc[r]),
                               _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc[r]), 1))));
    __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));
    _mm_storeu_ps(y, _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1)));
}

void kern__mv_q8_0_avx512(int64_t n, const void *w, size_t ws, int nr, const void *act, float *y)
{
    int64_t nb = n / 32, groups = (nb + 3) / 4;
    if (groups > MV_MAX_GROUPS) {
        const kern_wtype *t = kern_wtype_get(KERN_TYPE_Q8_0);
        for (int r = 0; r < nr; r++)
            t->dot(n, (const uint8_t *)w + (size_t)r * ws, act, &y[r]);
        return;
    }
    _Alignas(64) mv_act a;
    mv_act_prepare_q8(act, nb, &a);
    for (int r = 0; r < nr; r += 4) {
        const uint8_t *rows[4];
        for (int k = 0; k < 4; k++)
            rows[k] = (const uint8_t *)w + (size_t)(r + k < nr ? r + k : nr - 1) * ws;
        float out[4];
        mv_rows4_q8(rows, nb, &a, out);
        for (int k = 0; k < 4 && r + k < nr; k++)
            y[r + k] = out[k];
    }
}

