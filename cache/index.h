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

/* n vectors ([n][dim] floats) with their ids in one call (FAISS parallelises large batches). */
int  cache_index_add_n(cache_index *ix, size_t n, const int64_t *ids, const float *vecs,
                       util_err *err);
/* Removes every listed id present; *removed (optional) says how many were. Not implemented by
 * some index types (HNSW): LLMGW_EINVAL with FAISS's message, and the index is unchanged. */
int  cache_index_remove_n(cache_index *ix, size_t n, const int64_t *ids, size_t *removed,
                          util_err *err);
/* Whether the index can take vectors yet (IVF and PQ types must be trained first). */
int  cache_index_is_trained(const cache_index *ix);
/* Trains on n vectors ([n][dim] floats); they are not added. */
int  cache_index_train(cache_index *ix, size_t n, const float *vecs, util_err *err);
/* Sets a search parameter by FAISS ParameterSpace name ("nprobe" for IVF, "efSearch" for HNSW),
 * through IDMap wrappers; LLMGW_EINVAL when the index has no such parameter. */
int  cache_index_set_param(cache_index *ix, const char *name, double value, util_err *err);
/* Drops every vector (the index stays trained). */
int  cache_index_reset(cache_index *ix, util_err *err);

#endif
