/* engine/dtype.h: the weight types of GGUF files (ggml's numbering) and their block layouts.
 * A tensor row of n elements of type t takes n / block_elems(t) * block_bytes(t) bytes. */
#ifndef LLMGW_ENGINE_DTYPE_H
#define LLMGW_ENGINE_DTYPE_H

#include <stddef.h>
#include <stdint.h>

typedef enum eng_dtype {
    ENG_DTYPE_F32 = 0,
    ENG_DTYPE_F16 = 1,
    ENG_DTYPE_Q4_0 = 2,
    ENG_DTYPE_Q4_1 = 3,
    ENG_DTYPE_Q8_0 = 8,
    ENG_DTYPE_Q4_K = 12,
    ENG_DTYPE_Q6_K = 14,
    ENG_DTYPE_BF16 = 30,
} eng_dtype;

typedef struct eng_dtype_info {
    const char *name;
    uint32_t block_elems;   /* elements per block */
    uint32_t block_bytes;   /* bytes per block */
} eng_dtype_info;

/* The layout of a GGUF type id, or NULL for types llmgw does not load. */
const eng_dtype_info *eng_dtype_get(uint32_t type_id);
/* Bytes of a row of n elements; 0 when n is not a whole number of blocks or the type is unknown. */
size_t eng_dtype_row_bytes(uint32_t type_id, uint64_t n);

#endif
