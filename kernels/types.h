/* kernels/types.h: the one table of the tensor types llmgw knows (ggml's numbering, as GGUF
 * files store them): name, block layout and whether the type is quantized, plus the scalar
 * conversions every backend and tool shares. A row of n elements of type t takes
 * n / block_elems * block_bytes bytes. Which types a backend computes with is the backend's
 * supports_type (kernels/backend.h); this table only describes them (row conversions:
 * kernels/convert.h). */
#ifndef LLMGW_KERNELS_TYPES_H
#define LLMGW_KERNELS_TYPES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum kern_type {
    KERN_TYPE_F32 = 0,
    KERN_TYPE_F16 = 1,
    KERN_TYPE_Q4_0 = 2,   /* 32 weights: f16 scale + 16 bytes of nibbles */
    KERN_TYPE_Q4_1 = 3,   /* Q4_0 plus an f16 min */
    KERN_TYPE_Q8_0 = 8,   /* 32 weights: f16 scale + 32 int8 */
    KERN_TYPE_Q4_K = 12,  /* 256-weight super-blocks of 144 bytes */
    KERN_TYPE_Q6_K = 14,  /* 256-weight super-blocks of 210 bytes */
    KERN_TYPE_BF16 = 30,
} kern_type;

typedef struct kern_type_traits {
    uint32_t id;
    const char *name;       /* as GGUF tools print it: "F16", "Q4_1", ... */
    uint32_t block_elems;   /* elements per block (1 for float types) */
    uint32_t block_bytes;   /* bytes per block */
    bool quantized;
} kern_type_traits;

/* The traits of a type id, or NULL for a type llmgw does not know. */
const kern_type_traits *kern_type_get(uint32_t id);
/* Its name, or "?" for an unknown id. */
const char *kern_type_name(uint32_t id);
/* Bytes of a row of n elements; 0 when n is not a whole number of blocks or the type is unknown. */
size_t kern_type_row_bytes(uint32_t id, uint64_t n);

/* f16 / bf16 conversions (IEEE half, round to nearest even; NaN stays NaN). */
float    kern_f16_to_f32(uint16_t h);
uint16_t kern_f32_to_f16(float f);
float    kern_bf16_to_f32(uint16_t h);
uint16_t kern_f32_to_bf16(float f);

#endif
