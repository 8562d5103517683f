/* cache/index.h: a thin FAISS (C API) wrapper for the semantic cache: inner product on
 * L2-normalised vectors, ids chosen by the caller. The index type is a FAISS factory string
 * ("IDMap2,Flat" by default). Not thread-safe: one owner thread.
 * Every int return is 0 or an LLMGW_E* code with the FAISS message in err. */
#ifndef LLMGW_CACHE_INDEX_H
#define LLMGW_CACHE_INDEX_H

#include "common/err.h"

#include <stddef.h>
#include <stdint.h>

typedef struct cache_index cache_index;

int  cache_index_new(cache_index **out, int dim, const char *factory, util_err *err);
void cache_index_free(cache_index *ix);  /* NULL is a no-op */
int  cache_index_add(cache_index *ix, int64_t id, const float *vec, util_err *err);
/* Up to k nearest by inner product, best first; *n_out says how many were found. */
int  cache_index_search(cache_index *ix, const float *vec, int k, int64_t *ids, float *scores,
                        int *n_out, util_err *err);
int  cache_index_remove(cache_index *ix, int64_t id, util_err *err);
int64_t cache_index_size(const cache_index *ix);

#endif
