/* kernels/cpu/features.c: cpuid through the compiler's builtins (x86); other CPUs report none. */
#include "kernels/cpu/features.h"

#include <stdlib.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#include <string.h>

const kern_cpu_features *kern_cpu_features_get(void)
{
    static kern_cpu_features f;
    static int done;
    if (done)
        return &f;
    const char *force = getenv("LLMGW_KERNELS");
    if (force == NULL || strcmp(force, "ref") != 0) {
#if defined(__x86_64__) || defined(__i386__)
        __builtin_cpu_init();
        f.avx2 = __builtin_cpu_supports("avx2");
        f.fma = __builtin_cpu_supports("fma");
        f.avx512f = __builtin_cpu_supports("avx512f");
        f.avx512bw = __builtin_cpu_supports("avx512bw");
        f.avx512vl = __builtin_cpu_supports("avx512vl");
        f.avx512vnni = __builtin_cpu_supports("avx512vnni");
        /* f16c has no builtin name in gcc 12; every AVX2 CPU shipped so far has it. */
        f.f16c = f.avx2;
        /* no builtin name for AMX in gcc 12 either: leaf 7, EDX bits 22 (bf16) and 24 (tile) */
        unsigned a, b, c, d;
        if (__get_cpuid_count(7, 0, &a, &b, &c, &d))
            f.amx_bf16 = f.avx512f && (d & (1u << 22)) && (d & (1u << 24));
#endif
    }
    done = 1;
    return &f;
}
