/* engine/format/gguf.h: a GGUF (v2, v3) model file, memory-mapped read-only and validated in full
 * before anything uses it: header, every metadata value (all 13 value types, arrays included),
 * the tensor table (names, dims, types, offsets, alignment, sizes within the file). A truncated,
 * corrupt or hostile file is an LLMGW_EINVAL whose message names the file and the problem,
 * never a crash. Strings point into the mapping and are NOT NUL-terminated (use .len).
 * After open, everything is immutable: any number of threads may read it. */
#ifndef LLMGW_ENGINE_GGUF_H
#define LLMGW_ENGINE_GGUF_H

#include "common/err.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum eng_gguf_vtype {
    ENG_GGUF_UINT8 = 0, ENG_GGUF_INT8 = 1, ENG_GGUF_UINT16 = 2, ENG_GGUF_INT16 = 3,
    ENG_GGUF_UINT32 = 4, ENG_GGUF_INT32 = 5, ENG_GGUF_FLOAT32 = 6, ENG_GGUF_BOOL = 7,
    ENG_GGUF_STRING = 8, ENG_GGUF_ARRAY = 9, ENG_GGUF_UINT64 = 10, ENG_GGUF_INT64 = 11,
    ENG_GGUF_FLOAT64 = 12,
} eng_gguf_vtype;

typedef struct eng_gguf_str {
    const char *ptr;   /* into the mapping, not NUL-terminated */
    uint64_t len;
} eng_gguf_str;

typedef struct eng_gguf_kv {
    eng_gguf_str key;
    eng_gguf_vtype type;
    union {
        uint64_t u64;     /* every unsigned integer type, widened */
        int64_t i64;      /* every signed integer type, widened */
        double f64;       /* FLOAT32 and FLOAT64, widened */
        bool b;
        eng_gguf_str str;
    } v;
    /* ARRAY only: */
    eng_gguf_vtype arr_type;    /* never ARRAY (nested arrays are rejected) */
    uint64_t arr_len;
    const void *arr_data;       /* raw little-endian elements in the file (non-string types) */
    const eng_gguf_str *arr_str;/* [arr_len] for string arrays (an index built at open) */
} eng_gguf_kv;

#define ENG_GGUF_MAX_DIMS 4

typedef struct eng_gguf_tensor {
    eng_gguf_str name;
    uint32_t n_dims;
    uint64_t ne[ENG_GGUF_MAX_DIMS]; /* ne[0] is the row length (contiguous); unused dims are 1 */
    uint32_t type;                  /* kern_type (kernels/types.h) */
    uint64_t offset;                /* from the start of the data section */
    const void *data;               /* into the mapping, aligned to the file's alignment */
    size_t bytes;
} eng_gguf_tensor;

typedef struct eng_gguf eng_gguf;

/* Maps and validates `path`. */
int  eng_gguf_open(eng_gguf **out, const char *path, util_err *err);
/* Validates a caller-owned buffer (tests, fuzzing); `name` is used in messages. The buffer
 * must outlive the eng_gguf. */
int  eng_gguf_open_mem(eng_gguf **out, const void *data, size_t size, const char *name,
                       util_err *err);
void eng_gguf_close(eng_gguf *g);  /* NULL is a no-op */
const char *eng_gguf_path(const eng_gguf *g);
size_t eng_gguf_alignment(const eng_gguf *g);

size_t eng_gguf_n_kv(const eng_gguf *g);
const eng_gguf_kv *eng_gguf_kv_at(const eng_gguf *g, size_t i);
const eng_gguf_kv *eng_gguf_find(const eng_gguf *g, const char *key);  /* NULL if absent */

/* Typed getters: 0, LLMGW_ENOTFOUND (absent) or LLMGW_EINVAL (wrong type or out of range),
 * with a message naming the file and key. Integers accept any integer type that fits. */
int eng_gguf_get_u32(const eng_gguf *g, const char *key, uint32_t *out, util_err *err);
int eng_gguf_get_f32(const eng_gguf *g, const char *key, float *out, util_err *err);
int eng_gguf_get_bool(const eng_gguf *g, const char *key, bool *out, util_err *err);
int eng_gguf_get_str(const eng_gguf *g, const char *key, eng_gguf_str *out, util_err *err);
/* An array of `type` (e.g. STRING for the vocab); 0 and *out set, or an error. */
int eng_gguf_get_arr(const eng_gguf *g, const char *key, eng_gguf_vtype type,
                     const eng_gguf_kv **out, util_err *err);

size_t eng_gguf_n_tensors(const eng_gguf *g);
const eng_gguf_tensor *eng_gguf_tensor_at(const eng_gguf *g, size_t i);
const eng_gguf_tensor *eng_gguf_tensor_find(const eng_gguf *g, const char *name);

/* True when s equals the NUL-terminated c. */
bool eng_gguf_str_eq(eng_gguf_str s, const char *c);

#endif
