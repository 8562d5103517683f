/* tests/unit/engine/test_kvpool.c: the KV page pool — allocation until full, reference counts,
 * all-or-nothing multi-page allocation, distinct non-overlapping pages, many threads at once. */
#include "../unit.h"

#include "engine/kvpool.h"

#include <pthread.h>

static void alloc_until_full(void **state)
{
    (void)state;
    eng_kvpool *p;
    util_err err;
    assert_int_equal(eng_kvpool_new(&p, 5000, 8, &err), 0);
    assert_int_equal(eng_kvpool_page_bytes(p), 8192);  /* rounded up to 4 KiB */
    int32_t ids[8];
    for (int i = 0; i < 8; i++) {
        ids[i] = eng_kvpool_alloc(p);
        assert_true(ids[i] >= 0);
        memset(eng_kvpool_page(p, ids[i]), i + 1, 8192);  /* pages never overlap */
    }
    assert_int_equal(eng_kvpool_alloc(p), -1);
    for (int i = 0; i < 8; i++)
        assert_int_equal(eng_kvpool_page(p, ids[i])[8191], i + 1);
    eng_kvpool_ref(p, ids[3]);
    eng_kvpool_release(p, ids[3]);
    assert_int_equal(eng_kvpool_n_free(p), 0);        /* still one reference */
    eng_kvpool_release(p, ids[3]);
    assert_int_equal(eng_kvpool_n_free(p), 1);
    int32_t two[2];
    assert_int_equal(eng_kvpool_alloc_n(p, two, 2), LLMGW_EBUSY);
    assert_int_equal(eng_kvpool_n_free(p), 1);        /* nothing taken */
    eng_kvpool_free(p);
}

static void bad_sizes_are_errors(void **state)
{
    (void)state;
    eng_kvpool *p = NULL;
    util_err err;
    assert_int_equal(eng_kvpool_new(&p, 0, 8, &err), LLMGW_EINVAL);
    assert_int_equal(eng_kvpool_new(&p, 4096, 0, &err), LLMGW_EINVAL);
    assert_contains(err.msg, "kv pool");
}

static void *churn(void *arg)
{
    eng_kvpool *p = arg;
    for (int i = 0; i < 20000; i++) {
        int32_t ids[3];
        if (eng_kvpool_alloc_n(p, ids, 3) == 0)
            for (int k = 0; k < 3; k++)
                eng_kvpool_release(p, ids[k]);
    }
    return NULL;
}

static void threads_share_the_pool(void **state)
{
    (void)state;
    eng_kvpool *p;
    util_err err;
    assert_int_equal(eng_kvpool_new(&p, 4096, 16, &err), 0);
    pthread_t t[4];
    for (int i = 0; i < 4; i++)
        pthread_create(&t[i], NULL, churn, p);
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
    assert_int_equal(eng_kvpool_n_free(p), 16);
    eng_kvpool_free(p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(alloc_until_full),
        cmocka_unit_test(bad_sizes_are_errors),
        cmocka_unit_test(threads_share_the_pool),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
