/* kernels/cpu/quant.h: weight types on the CPU. Each type has a dot product of one weight row
 * with one activation row, a scalar reference (`_ref`, the definition of correct) and SIMD
 * twins (AVX2, AVX-512 where the CPU has it) picked once from cpuid (kernels/cpu/features.h);
 * LLMGW_KERNELS=ref forces the references (=invariant and =exact: see quant.c). Activations
 * are quantized the way the type needs (as llama.cpp does): Q4_0/Q8_0 against q8 blocks of 32,
 * Q4_1 against q8 blocks with their sum, K-quants against q8 blocks of 256 with 16-element
 * sums; F32/F16/BF16 against f32. */
#ifndef LLMGW_KERNELS_CPU_QUANT_H
#define LLMGW_KERNELS_CPU_QUANT_H

#include "kernels/types.h"

#include <stddef.h>
#include <stdint.h>

typedef struct kern_q8_32 {
    float d;            /* scale: x ~= d * qs */
    float s;            /* d * sum(qs): Q4_1's min term needs it */
    int8_t qs[32];
} kern_q8_32;

typedef struct kern_q8_k {
    float d;
    int16_t bsums[16];  /* sums of each 16 qs */
    int8_t qs[256];
} kern_q8_k;

typedef enum kern_act_kind {
    KERN_ACT_F32 = 0,
    KERN_ACT_Q8_32 = 1,
    KERN_ACT_Q8_K = 2,
} kern_act_kind;

typedef struct kern_wtype {
    uint32_t type;                 /* ggml id; name and block layout: kern_type_get (kernels/types.h) */
    kern_act_kind act;
    /* Bytes of one activation row of n elements in this type's activation format. */
    size_t (*act_row_bytes)(int64_t n);
    /* f32 row → activation format (a copy for KERN_ACT_F32). */
    void (*quantize_act)(const float *x, void *act, int64_t n);
    /* *out = w_row . act_row over n elements. */
    void (*dot)(int64_t n, const void *w_row, const void *act_row, float *out);
    /* A weight row → f32. */
    void (*to_f32)(const void *w_row, float *out, int64_t n);
    /* f32 → this type (used by tools and tests to make weights); NULL if not supported. */
    void (*from_f32)(const float *x, void *w_row, int64_t n);
} kern_wtype;

/* The best implementation this CPU supports, or NULL for an unsupported type. */
const kern_wtype *kern_wtype_get(uint32_t type);
/* The scalar reference of the same type. */
const kern_wtype *kern_wtype_get_ref(uint32_t type);
/* Which variant kern_wtype_get picked: "ref", "avx2", "avx512". */
const char *kern_wtype_variant(void);

#endif
