/* common/mmap.h: a whole file mapped read-only, for the model readers (GGUF, safetensors) and
 * the router's kNN vectors.
 * Errors name the file: "PATH: No such file or directory", "PATH: not a regular file",
 * "PATH: file is truncated (N bytes)" when it is shorter than the reader's minimum. */
#ifndef LLMGW_COMMON_MMAP_H
#define LLMGW_COMMON_MMAP_H

#include "common/err.h"

#include <stddef.h>

typedef struct util_map {
    const void *base;   /* NULL when nothing is mapped */
    size_t size;
} util_map;

/* Maps `path` (at least min_size bytes); 0 or LLMGW_EIO / LLMGW_EINVAL with err set. */
int  util_map_file(util_map *m, const char *path, size_t min_size, util_err *err);
void util_map_release(util_map *m);  /* nothing mapped: a no-op */

#endif
