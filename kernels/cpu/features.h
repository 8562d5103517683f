/* kernels/cpu/features.h: what the CPU can do, read once from cpuid; SIMD kernels are picked
 * from this at startup. LLMGW_KERNELS=ref in the environment reports no SIMD at all, so every
 * caller falls back to the scalar reference. */
#ifndef LLMGW_KERNELS_CPU_FEATURES_H
#define LLMGW_KERNELS_CPU_FEATURES_H

#include <stdbool.h>

typedef struct kern_cpu_features {
    bool avx2;
    bool fma;
    bool f16c;
    bool avx512f;
    bool avx512bw;
    bool avx512vl;
    bool avx512vnni;
    bool amx_bf16;   /* AMX tiles with BF16 products (the OS must still grant them) */
} kern_cpu_features;

const kern_cpu_features *kern_cpu_features_get(void);

#endif
