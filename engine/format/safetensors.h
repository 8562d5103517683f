/* engine/format/safetensors.h: a .safetensors file, memory-mapped read-only and validated in full
 * before anything uses it: the 8-byte little-endian header length, the JSON header (an object
 * of tensors plus an optional "__metadata__" object of strings), and for every tensor its dtype,
 * its shape (whose element count times the dtype size must equal its byte span) and its
 * data_offsets (inside the file, the tensors covering the data section exactly, in order, with
 * neither gaps nor overlaps, as the format requires). A truncated, corrupt or hostile file is an
 * LLMGW_EINVAL whose message names the file and the problem, never a crash.
 * After open everything is immutable: any number of threads may read it. */
#ifndef LLMGW_ENGINE_SAFETENSORS_H
#define LLMGW_ENGINE_SAFETENSORS_H

#include "common/err.h"

#include <stddef.h>
#include <stdint.h>

typedef enum eng_st_dtype {
    ENG_ST_DTYPE_F64, ENG_ST_DTYPE_F32, ENG_ST_DTYPE_F16, ENG_ST_DTYPE_BF16,
    ENG_ST_DTYPE_I64, ENG_ST_DTYPE_I32, ENG_ST_DTYPE_I16, ENG_ST_DTYPE_I8,
    ENG_ST_DTYPE_U64, ENG_ST_DTYPE_U32, ENG_ST_DTYPE_U16, ENG_ST_DTYPE_U8, ENG_ST_DTYPE_BOOL,
    ENG_ST_DTYPE_COUNT,
} eng_st_dtype;

#define ENG_ST_MAX_DIMS 8

typedef struct eng_st_tensor {
    const char *name;                /* NUL-terminated, owned by the file object */
    eng_st_dtype dtype;
    int n_dims;                      /* 0 (a scalar) .. ENG_ST_MAX_DIMS */
    uint64_t shape[ENG_ST_MAX_DIMS]; /* shape[n_dims - 1] is the contiguous one; unused: 1 */
    uint64_t n_elems;
    const void *data;                /* into the mapping; NOT necessarily aligned */
    size_t bytes;
} eng_st_tensor;

typedef struct eng_safetensors eng_safetensors;

/* Maps and validates `path`. */
int  eng_safetensors_open(eng_safetensors **out, const char *path, util_err *err);
/* Validates size bytes at data (borrowed: they must outlive the object); `name` is for messages. */
int  eng_safetensors_open_mem(eng_safetensors **out, const void *data, size_t size,
                              const char *name, util_err *err);
void eng_safetensors_free(eng_safetensors *st);  /* NULL is a no-op */

size_t eng_safetensors_count(const eng_safetensors *st);
const eng_st_tensor *eng_safetensors_at(const eng_safetensors *st, size_t i); /* by name order */
/* The tensor called name, or NULL. */
const eng_st_tensor *eng_safetensors_find(const eng_safetensors *st, const char *name);
const char *eng_safetensors_path(const eng_safetensors *st);

const char *eng_st_dtype_name(eng_st_dtype t);
size_t eng_st_dtype_size(eng_st_dtype t);

#endif
