/* tests/unit/cache/test_index.c: the FAISS wrapper (cache_index_*): inner product on
 * L2-normalised vectors with caller-chosen ids, removal, and error reporting. */
#include "cache/index.h"

#include "tests/unit/unit.h"

#define DIM 16

/* A deterministic pseudo-random unit vector per seed. */
static void unit_vec(float *v, unsigned seed)
{
    uint32_t x = seed * 2654435761u + 12345u;
    double norm = 0;
    for (int i = 0; i < DIM; i++) {
        x = x * 1664525u + 1013904223u;
        v[i] = (float)((double)(x >> 8) / (double)(1u << 24) - 0.5);
        norm += (double)v[i] * v[i];
    }
    norm = sqrt(norm);
    for (int i = 0; i < DIM; i++)
        v[i] = (float)(v[i] / norm);
}

typedef struct fixture {
    cache_index *ix;
    float vecs[3][DIM];
} fixture;

static const int64_t k_ids[3] = {10, 20, 3000000000LL};

static int setup(void **state)
{
    static fixture f;
    util_err err = {0};
    memset(&f, 0, sizeof f);
    if (cache_index_new(&f.ix, DIM, NULL, &err) != 0)
        return -1;
    for (int i = 0; i < 3; i++) {
        unit_vec(f.vecs[i], (unsigned)i + 1);
        if (cache_index_add(f.ix, k_ids[i], f.vecs[i], &err) != 0)
            return -1;
    }
    *state = &f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    cache_index_free(f->ix);
    return 0;
}

static void size_counts_adds(void **state)
{
    fixture *f = *state;
    assert_int_equal(cache_index_size(f->ix), 3);
}

static void nearest_is_the_same_vector(void **state)
{
    fixture *f = *state;
    util_err err = {0};
    for (int i = 0; i < 3; i++) {
        int64_t ids[1] = {-1};
        float scores[1] = {0};
        int n = -1;
        assert_int_equal(cache_index_search(f->ix, f->vecs[i], 1, ids, scores, &n, &err), 0);
        assert_int_equal(n, 1);
        assert_int_equal(ids[0], k_ids[i]);
        assert_float_equal(scores[0], 1.0f, 1e-5);
    }
}

static void results_are_best_first(void **state)
{
    fixture *f = *state;
    util_err err = {0};
    int64_t ids[5];
    float scores[5];
    int n = -1;
    /* k larger than the index: only the stored vectors come back. */
    assert_int_equal(cache_index_search(f->ix, f->vecs[1], 5, ids, scores, &n, &err), 0);
    assert_int_equal(n, 3);
    assert_int_equal(ids[0], k_ids[1]);
    assert_true(scores[0] >= scores[1]);
    assert_true(scores[1] >= scores[2]);
    assert_true(scores[1] < 0.999f);
}

static void remove_then_search_misses(void **state)
{
    fixture *f = *state;
    util_err err = {0};
    int64_t ids[3];
    float scores[3];
    int n = -1;
    assert_int_equal(cache_index_remove(f->ix, k_ids[1], &err), 0);
    assert_int_equal(cache_index_size(f->ix), 2);
    assert_int_equal(cache_index_search(f->ix, f->vecs[1], 3, ids, scores, &n, &err), 0);
    assert_int_equal(n, 2);
    for (int i = 0; i < n; i++)
        assert_int_not_equal(ids[i], k_ids[1]);
    assert_true(scores[0] < 0.999f);
    /* The others are still found. */
    assert_int_equal(cache_index_search(f->ix, f->vecs[2], 1, ids, scores, &n, &err), 0);
    assert_int_equal(ids[0], k_ids[2]);
}

static void remove_unknown_id(void **state)
{
    fixture *f = *state;
    util_err err = {0};
    assert_int_equal(cache_index_remove(f->ix, 999, &err), LLMGW_ENOTFOUND);
    assert_int_equal(err.code, LLMGW_ENOTFOUND);
    assert_non_null(strstr(err.msg, "999"));
    assert_int_equal(cache_index_size(f->ix), 3);
}

static void empty_index_finds_nothing(void **state)
{
    (void)state;
    cache_index *ix = NULL;
    util_err err = {0};
    float v[DIM];
    int64_t ids[4];
    float scores[4];
    int n = -1;
    unit_vec(v, 42);
    assert_int_equal(cache_index_new(&ix, DIM, "IDMap2,Flat", &err), 0);
    assert_int_equal(cache_index_size(ix), 0);
    assert_int_equal(cache_index_search(ix, v, 4, ids, scores, &n, &err), 0);
    assert_int_equal(n, 0);
    cache_index_free(ix);
    cache_index_free(NULL);
}

static void bad_factory_string(void **state)
{
    (void)state;
    cache_index *ix = NULL;
    util_err err = {0};
    int rc = cache_index_new(&ix, DIM, "NoSuchIndex,Flat", &err);
    assert_int_equal(rc, LLMGW_EINVAL);
    assert_int_equal(err.code, LLMGW_EINVAL);
    assert_null(ix);
    assert_non_null(strstr(err.msg, "faiss"));
    assert_non_null(strstr(err.msg, "NoSuchIndex,Flat"));
    assert_true(strlen(err.msg) > strlen("faiss NoSuchIndex,Flat: "));
}

static void bad_dimension(void **state)
{
    (void)state;
    cache_index *ix = NULL;
    util_err err = {0};
    assert_int_equal(cache_index_new(&ix, 0, NULL, &err), LLMGW_EINVAL);
    assert_non_null(strstr(err.msg, "dimension"));
    assert_int_equal(cache_index_new(&ix, -3, NULL, &err), LLMGW_EINVAL);
    assert_int_equal(cache_index_new(&ix, 65537, NULL, &err), LLMGW_EINVAL);
    assert_null(ix);
}

static void batch_add_remove_and_reset(void **state)
{
    (void)state;
    cache_index *ix = NULL;
    util_err err = {0};
    float v[4][DIM];
    int64_t ids[4] = {5, 6, 7, 8}, got[4];
    float scores[4];
    size_t removed = 99;
    int n = -1;
    for (int i = 0; i < 4; i++)
        unit_vec(v[i], 100 + (unsigned)i);
    assert_int_equal(cache_index_new(&ix, DIM, NULL, &err), 0);
    assert_int_equal(cache_index_add_n(ix, 0, ids, v[0], &err), 0);
    assert_int_equal(cache_index_add_n(ix, 4, ids, v[0], &err), 0);
    assert_int_equal(cache_index_size(ix), 4);
    assert_int_equal(cache_index_search(ix, v[2], 1, got, scores, &n, &err), 0);
    assert_int_equal(got[0], 7);
    int64_t gone[3] = {6, 8, 1234};
    assert_int_equal(cache_index_remove_n(ix, 3, gone, &removed, &err), 0);
    assert_int_equal(removed, 2);
    assert_int_equal(cache_index_size(ix), 2);
    assert_int_equal(cache_index_search(ix, v[1], 4, got, scores, &n, &err), 0);
    assert_int_equal(n, 2);
    assert_true(got[0] != 6 && got[1] != 6);
    assert_int_equal(cache_index_reset(ix, &err), 0);
    assert_int_equal(cache_index_size(ix), 0);
    assert_true(cache_index_is_trained(ix));
    /* Flat has no search parameters. */
    assert_int_equal(cache_index_set_param(ix, "nprobe", 4, &err), LLMGW_EINVAL);
    assert_contains(err.msg, "nprobe");
    cache_index_free(ix);
}

static void hnsw_cannot_remove(void **state)
{
    (void)state;
    cache_index *ix = NULL;
    util_err err = {0};
    float v[DIM];
    int64_t id = 3;
    unit_vec(v, 9);
    assert_int_equal(cache_index_new(&ix, DIM, "IDMap2,HNSW16", &err), 0);
    assert_int_equal(cache_index_set_param(ix, "efSearch", 32, &err), 0);
    assert_int_equal(cache_index_add_n(ix, 1, &id, v, &err), 0);
    assert_int_equal(cache_index_remove_n(ix, 1, &id, NULL, &err), LLMGW_EINVAL);
    assert_int_equal(cache_index_size(ix), 1); /* unchanged */
    cache_index_free(ix);
}

static void ivf_trains_then_adds(void **state)
{
    (void)state;
    enum { N = 2 * 39 };
    cache_index *ix = NULL;
    util_err err = {0};
    static float v[N][DIM];
    int64_t ids[N], got[1];
    float scores[1];
    int n = -1;
    for (int i = 0; i < N; i++) {
        unit_vec(v[i], 200 + (unsigned)i);
        ids[i] = 1000 + i;
    }
    assert_int_equal(cache_index_new(&ix, DIM, "IDMap2,IVF2,Flat", &err), 0);
    assert_false(cache_index_is_trained(ix));
    assert_int_not_equal(cache_index_add_n(ix, N, ids, v[0], &err), 0); /* untrained */
    assert_int_equal(cache_index_train(ix, N, v[0], &err), 0);
    assert_true(cache_index_is_trained(ix));
    assert_int_equal(cache_index_set_param(ix, "nprobe", 2, &err), 0);
    assert_int_equal(cache_index_add_n(ix, N, ids, v[0], &err), 0);
    for (int i = 0; i < N; i++) {
        assert_int_equal(cache_index_search(ix, v[i], 1, got, scores, &n, &err), 0);
        assert_int_equal(got[0], ids[i]);
    }
    cache_index_free(ix);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(size_counts_adds, setup, teardown),
        cmocka_unit_test_setup_teardown(nearest_is_the_same_vector, setup, teardown),
        cmocka_unit_test_setup_teardown(results_are_best_first, setup, teardown),
        cmocka_unit_test_setup_teardown(remove_then_search_misses, setup, teardown),
        cmocka_unit_test_setup_teardown(remove_unknown_id, setup, teardown),
        cmocka_unit_test(empty_index_finds_nothing),
        cmocka_unit_test(bad_factory_string),
        cmocka_unit_test(bad_dimension),
        cmocka_unit_test(batch_add_remove_and_reset),
        cmocka_unit_test(hnsw_cannot_remove),
        cmocka_unit_test(ivf_trains_then_adds),
    };
    return cmocka_run_group_tests_name("cache/index", tests, NULL, NULL);
}
