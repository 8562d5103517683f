/* tests/unit/engine/serve/test_kvpool.c: the KV page pool — its memory from the backend, allocation
 * until full, reference counts, all-or-nothing multi-page allocation, distinct non-overlapping
 * pages, many threads at once. */
#include "tests/unit/unit.h"

#include "engine/serve/kvpool.h"

#include <pthread.h>

static kern_backend *g_be;

/* A backend that records its buffer calls around the CPU backend's (or refuses memory). */
static struct {
    int allocs, frees;
    size_t bytes, freed_bytes;
    void *buf;
    bool refuse;
} g_mem;

static void *spy_alloc(void *ctx, size_t bytes)
{
    g_mem.allocs++;
    g_mem.bytes = bytes;
    g_mem.buf = g_mem.refuse ? NULL : g_be->buffer_alloc(ctx, bytes);
    return g_mem.buf;
}

static void spy_free(void *ctx, void *buf, size_t bytes)
{
    g_mem.frees++;
    g_mem.freed_bytes = bytes;
    assert_ptr_equal(buf, g_mem.buf);
    g_be->buffer_free(ctx, buf, bytes);
}

static int setup(void **state)
{
    (void)state;
    g_be = kern_cpu_backend_new(1);
    return g_be == NULL;
}

static int teardown(void **state)
{
    (void)state;
    kern_backend_free(g_be);
    return 0;
}

static void memory_comes_from_the_backend(void **state)
{
    (void)state;
    kern_backend spy = *g_be;
    spy.buffer_alloc = spy_alloc;
    spy.buffer_free = spy_free;
    memset(&g_mem, 0, sizeof g_mem);
    eng_kvpool *p;
    util_err err;
    assert_int_equal(eng_kvpool_new(&p, &spy, 4096, 16, &err), 0);
    assert_int_equal(g_mem.allocs, 1);
    assert_int_equal(g_mem.bytes, 16 * 4096);
    uint8_t *base = g_mem.buf;
    int32_t id = eng_kvpool_alloc(p);
    assert_true(eng_kvpool_page(p, id) >= base && eng_kvpool_page(p, id) < base + 16 * 4096);
    eng_kvpool_release(p, id);
    eng_kvpool_free(p);
    assert_int_equal(g_mem.frees, 1);
    assert_int_equal(g_mem.freed_bytes, 16 * 4096);
    /* no memory on the device: an error that says so, nothing leaked */
    g_mem.refuse = true;
    p = NULL;
    assert_int_equal(eng_kvpool_new(&p, &spy, 4096, 16, &err), LLMGW_ENOMEM);
    assert_null(p);
    assert_contains(err.msg, "cannot allocate");
    assert_int_equal(g_mem.frees, 1);
}

static void alloc_until_full(void **state)
{
    (void)state;
    eng_kvpool *p;
    util_err err;
    assert_int_equal(eng_kvpool_new(&p, g_be, 5000, 8, &err), 0);
    assert_int_equal(eng_kvpool_page_bytes(p), 8192);  /* rounded up to 4 KiB */
    int32_t ids[8];
    uint8_t fill[8192], back[8192];
    for (int i = 0; i < 8; i++) {
        ids[i] = eng_kvpool_alloc(p);
        assert_true(ids[i] >= 0);
        memset(fill, i + 1, sizeof fill);   /* pages never overlap */
        g_be->buffer_copy_in(g_be->ctx, eng_kvpool_page(p, ids[i]), 0, fill, sizeof fill);
    }
    assert_int_equal(eng_kvpool_alloc(p), -1);
    for (int i = 0; i < 8; i++) {
        g_be->buffer_copy_out(g_be->ctx, eng_kvpool_page(p, ids[i]), 4096, back, 4096);
        assert_int_equal(back[0], i + 1);
        assert_int_equal(back[4095], i + 1);
    }
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
    assert_int_equal(eng_kvpool_new(&p, g_be, 0, 8, &err), LLMGW_EINVAL);
    assert_int_equal(eng_kvpool_new(&p, g_be, 4096, 0, &err), LLMGW_EINVAL);
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
    assert_int_equal(eng_kvpool_new(&p, g_be, 4096, 16, &err), 0);
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
        cmocka_unit_test(memory_comes_from_the_backend),
        cmocka_unit_test(alloc_until_full),
        cmocka_unit_test(bad_sizes_are_errors),
        cmocka_unit_test(threads_share_the_pool),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
