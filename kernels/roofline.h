/* kernels/roofline.h: what this machine can do at most, measured, so that a benchmark's figures
 * read as fractions of it: the FMA peak (f32, and the BF16 dot products where the CPU has them: AVX512-BF16, AMX tiles)
 * and the streaming read bandwidth, per thread count, with the CPU's model and the instruction
 * sets the kernels choose from. Benchmarks only: a measurement takes about a second. */
#ifndef LLMGW_KERNELS_ROOFLINE_H
#define LLMGW_KERNELS_ROOFLINE_H

#include <stddef.h>
#include <stdio.h>

typedef struct kern_roofline {
    int threads;
    double f32_gflops;    /* f32 FMA peak, all threads: 2 flops per lane per FMA */
    const char *f32_isa;  /* the vectors it used: "avx512" (zmm), "avx2" (ymm), "sse2" (no FMA) */
    double bf16_gflops;   /* VDPBF16PS peak (AVX512_BF16), 0 where the CPU has none */
    double amx_gflops;    /* TDPBF16PS peak (AMX BF16 tiles), 0 where the CPU or OS has none */
    double read_gbs;      /* streaming read of 512 MiB, all threads */
} kern_roofline;

/* The CPU model ("model name" of /proc/cpuinfo, else "unknown") into buf. */
void kern_cpu_model(char *buf, size_t n);
/* The x86 feature names that matter to the kernels (avx2 fma f16c avx512f avx512bw avx512vl
 * avx512vnni avx512_bf16 amx_tile amx_bf16 amx_int8), those present, space-separated. */
void kern_cpu_flags(char *buf, size_t n);
/* Measures with `threads` threads (>= 1). 0, or -1 when threads or memory could not be had. */
int kern_roofline_measure(kern_roofline *r, int threads);
/* GB/s reading a buffer of `bytes` over and over with `threads` threads (warmed once, best of
 * three): what a decode step that reads that many bytes of weights can reach where they stay
 * in the caches (a large L3) rather than in memory. 0 on failure. */
double kern_read_gbs(int threads, size_t bytes);
/* Markdown: the model and flags, then a row per entry of r (n of them). */
void kern_roofline_print(FILE *f, const kern_roofline *r, int n);

#endif
