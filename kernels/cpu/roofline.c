/* kernels/cpu/roofline.c: the machine's peaks (kernels/roofline.h). The FMA loops are inline
 * assembly on independent registers (ten chains: more than an FMA's latency times its
 * throughput on any x86 core so far), so the compiler can neither fold nor spill them; each
 * function carries its own target attribute and runs only after cpuid says the CPU has it. */
#include "kernels/roofline.h"
#include "kernels/cpu/internal.h"

#include "common/threadpool.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void kern_cpu_model(char *buf, size_t n)
{
    snprintf(buf, n, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (f == NULL)
        return;
    char line[512];
    while (fgets(line, sizeof line, f) != NULL) {
        if (strncmp(line, "model name", 10) != 0)
            continue;
        const char *v = strchr(line, ':');
        if (v == NULL)
            break;
        v++;
        while (*v == ' ' || *v == '\t')
            v++;
        snprintf(buf, n, "%.*s", (int)strcspn(v, "\n"), v);
        break;
    }
    fclose(f);
}

typedef struct cpu_bits {
    bool avx2, fma, f16c, avx512f, avx512bw, avx512vl, avx512vnni, avx512bf16, amx_tile,
        amx_bf16, amx_int8, os_zmm;
} cpu_bits;

static cpu_bits bits(void)
{
    cpu_bits b = {0};
#if defined(__x86_64__)
    unsigned a, bx, c, d;
    if (!__get_cpuid(1, &a, &bx, &c, &d))
        return b;
    bool osxsave = c & (1u << 27);
    b.fma = c & (1u << 12);
    b.f16c = c & (1u << 29);
    unsigned long long xcr0 = 0;
    if (osxsave) {
        unsigned lo, hi;
        __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
        xcr0 = ((unsigned long long)hi << 32) | lo;
    }
    bool os_ymm = (xcr0 & 6) == 6;
    b.os_zmm = os_ymm && (xcr0 & 0xe0) == 0xe0;
    if (!os_ymm)
        b.fma = b.f16c = false;
    if (__get_cpuid_count(7, 0, &a, &bx, &c, &d)) {
        b.avx2 = os_ymm && (bx & (1u << 5));
        b.avx512f = b.os_zmm && (bx & (1u << 16));
        b.avx512bw = b.os_zmm && (bx & (1u << 30));
        b.avx512vl = b.os_zmm && (bx & (1u << 31));
        b.avx512vnni = b.os_zmm && (c & (1u << 11));
        b.amx_bf16 = d & (1u << 22);
        b.amx_tile = d & (1u << 24);
        b.amx_int8 = d & (1u << 25);
    }
    if (__get_cpuid_count(7, 1, &a, &bx, &c, &d))
        b.avx512bf16 = b.avx512f && (a & (1u << 5));
#endif
    return b;
}

void kern_cpu_flags(char *buf, size_t n)
{
    cpu_bits b = bits();
    const struct { bool on; const char *name; } all[] = {
        {b.avx2, "avx2"},         {b.fma, "fma"},           {b.f16c, "f16c"},
        {b.avx512f, "avx512f"},   {b.avx512bw, "avx512bw"}, {b.avx512vl, "avx512vl"},
        {b.avx512vnni, "avx512vnni"}, {b.avx512bf16, "avx512_bf16"}, {b.amx_tile, "amx_tile"},
        {b.amx_bf16, "amx_bf16"}, {b.amx_int8, "amx_int8"},
    };
    size_t used = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (all[i].on && used < n) {
            int w = snprintf(buf + used, n - used, "%s%s", used ? " " : "", all[i].name);
            used += w > 0 ? (size_t)w : 0;
        }
    if (used == 0)
        snprintf(buf, n, "(none of the SIMD sets the kernels use)");
}

/* ---- FMA peaks -------------------------------------------------------------------------------- */

enum { PEAK_ITERS = 20 * 1000 * 1000 };   /* ten vector operations each */

#if defined(__x86_64__)
#define CHAIN10(op, cons)                                                                        \
    __asm__ volatile(op : "+" cons(a0) : cons(m), cons(c));                                    \
    __asm__ volatile(op : "+" cons(a1) : cons(m), cons(c));                                    \
    __asm__ volatile(op : "+" cons(a2) : cons(m), cons(c));                                    \
    __asm__ volatile(op : "+" cons(a3) : cons(m), cons(c));                                    \
    __asm__ volatile(op : "+" cons(a4) : cons(m), cons(c));                                    \
    __asm__ volatile(op : "+" cons(a5) : cons(m), cons(c));                                    \
    __asm__ volatile(op : "+" cons(a6) : cons(m), cons(c));                                    \
    __asm__ volatile(op : "+" cons(a7) : cons(m), cons(c));                                    \
    __asm__ volatile(op : "+" cons(a8) : cons(m), cons(c));                                    \
    __asm__ volatile(op : "+" cons(a9) : cons(m), cons(c))

/* Each returns the flops it did. */
__attribute__((target("avx2,fma"))) static double peak_ymm(long iters)
{
    __m256 m = _mm256_set1_ps(0.999f), c = _mm256_set1_ps(1e-3f);
    __m256 a0 = _mm256_set1_ps(1), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0,
           a8 = a0, a9 = a0;
    for (long i = 0; i < iters; i++) {
        CHAIN10("vfmadd213ps %2, %1, %0", "x");
    }
    return 10.0 * (double)iters * 16;
}

__attribute__((target("avx512f"))) static double peak_zmm(long iters)
{
    __m512 m = _mm512_set1_ps(0.999f), c = _mm512_set1_ps(1e-3f);
    __m512 a0 = _mm512_set1_ps(1), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0,
           a8 = a0, a9 = a0;
    for (long i = 0; i < iters; i++) {
        CHAIN10("vfmadd213ps %2, %1, %0", "v");
    }
    return 10.0 * (double)iters * 32;
}

/* VDPBF16PS: per f32 lane, two bf16 products added to the accumulator (4 flops). */
__attribute__((target("avx512f,avx512bf16"))) static double peak_bf16(long iters)
{
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0,
           a7 = a0, a8 = a0, a9 = a0;
    __m512i m = _mm512_set1_epi16(0x3f80), c = _mm512_set1_epi16(0x3a83);   /* bf16 1, 1e-3 */
    for (long i = 0; i < iters; i++) {
        CHAIN10("vdpbf16ps %2, %1, %0", "v");
    }
    return 10.0 * (double)iters * 64;
}

/* TDPBF16PS on four independent 16 x 16 f32 accumulator tiles (each a 16 x 32 by 32 x 16
 * BF16 product: 16,384 flops). The thread loads its tile configuration and releases it. */
__attribute__((target("amx-tile,amx-bf16"))) static double peak_amx(long iters)
{
    static const uint16_t one[16 * 32] __attribute__((aligned(64))) = {0};
    kern__amx_tiles_16x64();
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    _tile_loadd(4, one, 64);
    _tile_loadd(5, one, 64);
    _tile_loadd(6, one, 64);
    _tile_loadd(7, one, 64);
    iters /= 16;   /* a TDPBF16PS is ~256 FMAs' work: keep the run near the others' length */
    for (long i = 0; i < iters; i++) {
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    _tile_release();
    return 4.0 * (double)iters * 16384;
}
#endif

typedef struct peak_job {
    double (*fn)(long iters);
    long iters;
    double flops[256];    /* per thread, of the last run */
} peak_job;

static void peak_run(void *arg, int ith, int nth)
{
    (void)nth;
    peak_job *j = arg;
    double f = j->fn(j->iters);
    if (ith < 256)
        j->flops[ith] = f;
}

/* Best of five runs of every thread at once: the flops of all threads over the wall time (a
 * VM's cores come and go; the best run is the machine's). */
static double peak(util_pool *p, int threads, double (*fn)(long iters))
{
    peak_job j = {.fn = fn, .iters = PEAK_ITERS / 10};
    util_pool_run(p, peak_run, &j);   /* wake the cores up */
    j.iters = PEAK_ITERS;
    double best = 1e30;
    for (int r = 0; r < 5; r++) {
        double t = now();
        util_pool_run(p, peak_run, &j);
        t = now() - t;
        best = t < best ? t : best;
    }
    double flops = 0;
    for (int i = 0; i < threads && i < 256; i++)
        flops += j.flops[i];
    return flops / best * 1e-9;
}

/* ---- read bandwidth --------------------------------------------------------------------------- */

typedef struct bw_job {
    const uint64_t *buf;
    size_t n;
    uint64_t sink[256];
} bw_job;

static void bw_read(void *arg, int ith, int nth)
{
    bw_job *j = arg;
    long lo, hi;
    util_pool_split((long)(j->n / 8), ith, nth, &lo, &hi);
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (long i = lo * 8; i < hi * 8; i += 8) {   /* one cache line per iteration */
#if defined(__GNUC__)
        __builtin_prefetch(j->buf + i + 512);      /* 4 KiB ahead, as the decode kernels do */
#endif
        s0 += j->buf[i];
        s1 += j->buf[i + 2];
        s2 += j->buf[i + 4];
        s3 += j->buf[i + 6];
    }
    if (ith < 256)
        j->sink[ith] = s0 + s1 + s2 + s3;
}

static double bandwidth(util_pool *p, size_t bytes)
{
    bytes = (bytes + 63) / 64 * 64;
    uint64_t *buf = aligned_alloc(64, bytes);
    if (buf == NULL)
        return 0;
    memset(buf, 1, bytes);
    bw_job j = {.buf = buf, .n = bytes / 8};
    util_pool_run(p, bw_read, &j);   /* where it fits, into the caches */
    double best = 1e30;
    for (int r = 0; r < 3; r++) {
        double t = now();
        util_pool_run(p, bw_read, &j);
        t = now() - t;
        best = t < best ? t : best;
    }
    free(buf);
    return (double)bytes / best * 1e-9;
}

int kern_roofline_measure(kern_roofline *r, int threads)
{
    memset(r, 0, sizeof *r);
    util_pool *p;
    if (threads < 1 || util_pool_new(&p, threads) != 0)
        return -1;
    r->threads = threads;
    r->f32_isa = "sse2";
#if defined(__x86_64__)
    cpu_bits b = bits();
    if (b.avx512f) {
        r->f32_gflops = peak(p, threads, peak_zmm);
        r->f32_isa = "avx512";
    } else if (b.avx2 && b.fma) {
        r->f32_gflops = peak(p, threads, peak_ymm);
        r->f32_isa = "avx2";
    }
    if (b.avx512bf16)
        r->bf16_gflops = peak(p, threads, peak_bf16);
    if (kern__amx_usable())
        r->amx_gflops = peak(p, threads, peak_amx);
#endif
    r->read_gbs = bandwidth(p, (size_t)512 << 20);
    util_pool_free(p);
    return r->read_gbs > 0 ? 0 : -1;
}

double kern_read_gbs(int threads, size_t bytes)
{
    util_pool *p;
    if (threads < 1 || bytes < 64 || util_pool_new(&p, threads) != 0)
        return 0;
    double gbs = bandwidth(p, bytes);
    util_pool_free(p);
    return gbs;
}

void kern_roofline_print(FILE *f, const kern_roofline *r, int n)
{
    char model[128], flags[256];
    kern_cpu_model(model, sizeof model);
    kern_cpu_flags(flags, sizeof flags);
    fprintf(f, "roofline: %s; %s\n\n", model, flags);
    fprintf(f, "| threads | f32 FMA peak GFLOP/s | BF16 dot peak GFLOP/s | AMX BF16 peak GFLOP/s "
               "| read GB/s |\n| ---: | ---: | ---: | ---: | ---: |\n");
    for (int i = 0; i < n; i++) {
        char bf[32] = "-", amx[32] = "-", f32[48] = "-";
        if (r[i].bf16_gflops > 0)
            snprintf(bf, sizeof bf, "%.1f", r[i].bf16_gflops);
        if (r[i].amx_gflops > 0)
            snprintf(amx, sizeof amx, "%.1f", r[i].amx_gflops);
        if (r[i].f32_gflops > 0)
            snprintf(f32, sizeof f32, "%.1f (%s)", r[i].f32_gflops, r[i].f32_isa);
        fprintf(f, "| %d | %s | %s | %s | %.1f |\n", r[i].threads, f32, bf, amx, r[i].read_gbs);
    }
    fprintf(f, "\n");
}
