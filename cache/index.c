/* cache/index.c: FAISS through its C API. */
#include "cache/index.h"

#include "common/arena.h"

#include <faiss/c_api/AutoTune_c.h>
#include <faiss/c_api/Index_c.h>
#include <faiss/c_api/error_c.h>
#include <faiss/c_api/impl/AuxIndexStructures_c.h>
#include <faiss/c_api/index_factory_c.h>
#include <omp.h>
#include <stdlib.h>

struct cache_index {
    FaissIndex *index;
    int dim;
};

static int faiss_fail(util_err *err, const char *what)
{
    const char *m = faiss_get_last_error();
    return util_err_set(err, LLMGW_EINVAL, "faiss %s: %s", what, m ? m : "unknown error");
}

int cache_index_new(cache_index **out, int dim, const char *factory, util_err *err)
{
    if (dim <= 0 || dim > 65536)
        return util_err_set(err, LLMGW_EINVAL, "faiss index: bad dimension %d", dim);
    cache_index *ix = util_xcalloc(1, sizeof *ix);
    ix->dim = dim;
    if (faiss_index_factory(&ix->index, dim, factory ? factory : "IDMap2,Flat",
                            METRIC_INNER_PRODUCT) != 0) {
        free(ix);
        return faiss_fail(err, factory);
    }
    *out = ix;
    return 0;
}

void cache_index_free(cache_index *ix)
{
    if (ix == NULL)
        return;
    faiss_Index_free(ix->index);
    free(ix);
}

int cache_index_add(cache_index *ix, int64_t id, const float *vec, util_err *err)
{
    idx_t fid = id;
    if (faiss_Index_add_with_ids(ix->index, 1, vec, &fid) != 0)
        return faiss_fail(err, "add");
    return 0;
}

int cache_index_search(cache_index *ix, const float *vec, int k, int64_t *ids, float *scores,
                       int *n_out, util_err *err)
{
    idx_t *labels = util_xmalloc((size_t)k * sizeof *labels);
    int rc = 0;
    *n_out = 0;
    /* One query gains nothing from FAISS's OpenMP team (it splits work by query), and waking the
     * team costs milliseconds on a busy machine: this thread searches alone. The setting is the
     * calling thread's, so adds and training elsewhere keep their threads. */
    int threads = omp_get_max_threads();
    if (threads > 1)
        omp_set_num_threads(1);
    int frc = faiss_Index_search(ix->index, 1, vec, k, scores, labels);
    if (threads > 1)
        omp_set_num_threads(threads);
    if (frc != 0) {
        rc = faiss_fail(err, "search");
    } else {
        for (int i = 0; i < k && labels[i] >= 0; i++) {
            ids[i] = labels[i];
            (*n_out)++;
        }
    }
    free(labels);
    return rc;
}

int cache_index_remove(cache_index *ix, int64_t id, util_err *err)
{
    FaissIDSelectorBatch *sel = NULL;
    idx_t fid = id;
    size_t removed = 0;
    if (faiss_IDSelectorBatch_new(&sel, 1, &fid) != 0)
        return faiss_fail(err, "selector");
    int rc = faiss_Index_remove_ids(ix->index, (FaissIDSelector *)sel, &removed);
    faiss_IDSelector_free((FaissIDSelector *)sel);
    if (rc != 0)
        return faiss_fail(err, "remove");
    return removed == 1 ? 0 : util_err_set(err, LLMGW_ENOTFOUND, "faiss remove: no id %lld",
                                           (long long)id);
}

int64_t cache_index_size(const cache_index *ix)
{
    return faiss_Index_ntotal(ix->index);
}

int cache_index_add_n(cache_index *ix, size_t n, const int64_t *ids, const float *vecs,
                      util_err *err)
{
    if (n == 0)
        return 0;
    /* idx_t is int64_t in the C API, so the caller's ids go through as they are. */
    if (faiss_Index_add_with_ids(ix->index, (idx_t)n, vecs, (const idx_t *)ids) != 0)
        return faiss_fail(err, "add");
    return 0;
}

int cache_index_remove_n(cache_index *ix, size_t n, const int64_t *ids, size_t *removed,
                         util_err *err)
{
    FaissIDSelectorBatch *sel = NULL;
    size_t nrem = 0;
    if (removed != NULL)
        *removed = 0;
    if (n == 0)
        return 0;
    if (faiss_IDSelectorBatch_new(&sel, n, (const idx_t *)ids) != 0)
        return faiss_fail(err, "selector");
    int rc = faiss_Index_remove_ids(ix->index, (FaissIDSelector *)sel, &nrem);
    faiss_IDSelector_free((FaissIDSelector *)sel);
    if (rc != 0)
        return faiss_fail(err, "remove");
    if (removed != NULL)
        *removed = nrem;
    return 0;
}

int cache_index_is_trained(const cache_index *ix)
{
    return faiss_Index_is_trained(ix->index) != 0;
}

int cache_index_train(cache_index *ix, size_t n, const float *vecs, util_err *err)
{
    if (faiss_Index_train(ix->index, (idx_t)n, vecs) != 0)
        return faiss_fail(err, "train");
    return 0;
}

int cache_index_set_param(cache_index *ix, const char *name, double value, util_err *err)
{
    FaissParameterSpace *ps = NULL;
    if (faiss_ParameterSpace_new(&ps) != 0)
        return faiss_fail(err, "parameter space");
    int rc = faiss_ParameterSpace_set_index_parameter(ps, ix->index, name, value);
    faiss_ParameterSpace_free(ps);
    return rc != 0 ? faiss_fail(err, name) : 0;
}

int cache_index_reset(cache_index *ix, util_err *err)
{
    if (faiss_Index_reset(ix->index) != 0)
        return faiss_fail(err, "reset");
    return 0;
}
