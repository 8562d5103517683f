/* tests/unit/cache/test_store.c: the local semantic-cache store (cache_store_*): exact and id
 * lookups, namespace isolation, search order and thresholds, TTL, the LRU budget, duplicate ids
 * and exact replacement, removal, HNSW tombstones and rebuilds, IVF training, reference counts
 * and several threads at once. It includes store.c to look at the namespaces' indexes and to
 * test the hash map and the expiry heap directly. */
#include "cache/store.c"

#include "tests/unit/unit.h"

#include <pthread.h>

#define DIM 16
#define NOW 1000000

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

/* a*u + b*w, normalised. */
static void blend(float *out, const float *u, float a, const float *w, float b)
{
    double norm = 0;
    for (int i = 0; i < DIM; i++) {
        out[i] = a * u[i] + b * w[i];
        norm += (double)out[i] * out[i];
    }
    norm = sqrt(norm);
    for (int i = 0; i < DIM; i++)
        out[i] = (float)(out[i] / norm);
}

static float dot(const float *a, const float *b)
{
    float s = 0;
    for (int i = 0; i < DIM; i++)
        s += a[i] * b[i];
    return s;
}

static cache_store *new_store(const char *factory, size_t max_bytes)
{
    cache_store *s = NULL;
    util_err err = {0};
    cache_store_cfg cfg = {.dim = DIM, .index = factory, .max_bytes = max_bytes};
    assert_int_equal(cache_store_new(&s, &cfg, &err), 0);
    assert_non_null(s);
    return s;
}

/* Puts an entry with id, ns, exact and (when vec is set) a vector; the response names the id. */
static void put(cache_store *s, uint64_t id, uint64_t ns, uint64_t exact, const float *vec,
                int64_t expires_ms)
{
    char resp[64];
    util_err err = {0};
    snprintf(resp, sizeof resp, "{\"id\":%llu}", (unsigned long long)id);
    cache_entry e = {.id = id, .ns = ns, .exact = exact, .created_ms = NOW,
                     .expires_ms = expires_ms, .question = "q", .vec = (float *)vec,
                     .dim = vec ? DIM : 0, .response = resp, .response_len = strlen(resp)};
    int rc = cache_store_put(s, &e, NOW, &err);
    if (rc != 0)
        print_error("put %llu: %s\n", (unsigned long long)id, err.msg);
    assert_int_equal(rc, 0);
}

static uint64_t search1(cache_store *s, uint64_t ns, const float *q, float min_sim, float *sim)
{
    const cache_entry *out[1];
    float sims[1];
    util_err err = {0};
    int n = cache_store_search(s, ns, q, min_sim, 1, NOW, out, sims, &err);
    assert_true(n == 0 || n == 1);
    if (n == 0)
        return 0;
    uint64_t id = out[0]->id;
    if (sim != NULL)
        *sim = sims[0];
    cache_entry_release(out[0]);
    return id;
}

static bool present(cache_store *s, uint64_t id)
{
    const cache_entry *e = cache_store_get(s, id, NOW);
    cache_entry_release(e);
    return e != NULL;
}

static nspace *space(cache_store *s, uint64_t ns)
{
    return map_get(&s->spaces, ns, 0);
}

/* ---- the internals ---- */

static void map_matches_a_reference(void **state)
{
    (void)state;
    enum { N = 5000 };
    static uint64_t keys[N];
    static bool in[N];
    map m = {0};
    uint32_t x = 7;
    for (int i = 0; i < N; i++)
        keys[i] = (uint64_t)i * 0x10001u % 977u * 1000003u + (uint64_t)i; /* clustered keys */
    for (int round = 0; round < 40000; round++) {
        x = x * 1664525u + 1013904223u;
        int i = (int)(x >> 8) % N;
        if (in[i]) {
            assert_ptr_equal(map_del(&m, keys[i], 3), &keys[i]);
            in[i] = false;
        } else {
            map_put(&m, keys[i], 3, &keys[i]);
            in[i] = true;
        }
        if (round % 997 == 0) {
            size_t count = 0;
            for (int j = 0; j < N; j++) {
                assert_ptr_equal(map_get(&m, keys[j], 3), in[j] ? &keys[j] : NULL);
                assert_null(map_get(&m, keys[j], 4));
                count += in[j];
            }
            assert_int_equal(m.n, count);
        }
    }
    map_deinit(&m);
}

static void expire_follows_the_heap(void **state)
{
    (void)state;
    cache_store *s = new_store(NULL, 0);
    uint32_t x = 99;
    for (uint64_t id = 1; id <= 300; id++) {
        x = x * 1664525u + 1013904223u;
        put(s, id, 1, 0, NULL, NOW + 1 + (x >> 8) % 1000);
    }
    for (uint64_t id = 1; id <= 300; id += 3)
        assert_int_equal(cache_store_remove(s, id), 0); /* holes in the heap */
    size_t total = 0;
    for (int64_t t = NOW; t <= NOW + 1001; t += 50) {
        total += cache_store_expire(s, t);
        for (size_t i = 0; i < s->heap_n; i++) {
            assert_true(s->heap[i]->e.expires_ms > t);
            assert_int_equal(s->heap[i]->heap_at, i);
            if (i > 0)
                assert_true(s->heap[(i - 1) / 2]->e.expires_ms <= s->heap[i]->e.expires_ms);
        }
    }
    assert_int_equal(total, 200);
    cache_store_stats st;
    cache_store_get_stats(s, &st);
    assert_int_equal(st.entries, 0);
    assert_int_equal(st.bytes, 0);
    assert_int_equal(st.expirations, 200);
    assert_int_equal(st.namespaces, 0);
    cache_store_free(s);
}

/* ---- lookups ---- */

static void put_get_exact(void **state)
{
    (void)state;
    cache_store *s = new_store(NULL, 0);
    util_err err = {0};
    float v[DIM];
    char question[] = "what is the capital of France?";
    char resp[] = "{\"answer\":\"Paris\"}";
    uint8_t tok[] = {1, 0, DIM, 0, 0, 0, 128, 63, 1, 2, 3, 4, 5, 6, 7, 8};  /* opaque here */
    unit_vec(v, 1);
    cache_entry e = {.id = 42, .ns = 7, .exact = 0xabc, .created_ms = NOW, .expires_ms = NOW + 60000,
                     .question = question, .vec = v, .dim = DIM, .tok = tok, .tok_len = sizeof tok,
                     .response = resp, .response_len = strlen(resp)};
    assert_int_equal(cache_store_put(s, &e, NOW, &err), 0);
    /* The store keeps copies. */
    question[0] = 'X';
    resp[2] = 'X';
    v[0] = 9;
    tok[8] = 99;

    const cache_entry *got = cache_store_get(s, 42, NOW);
    assert_non_null(got);
    assert_int_equal(got->id, 42);
    assert_int_equal(got->ns, 7);
    assert_int_equal(got->exact, 0xabc);
    assert_int_equal(got->created_ms, NOW);
    assert_int_equal(got->expires_ms, NOW + 60000);
    assert_string_equal(got->question, "what is the capital of France?");
    assert_int_equal(got->tok_len, sizeof tok);
    assert_int_equal(got->tok[8], 1);
    assert_int_equal(got->tok[15], 8);
    assert_int_equal(got->response_len, strlen(resp));
    assert_memory_equal(got->response, "{\"answer\":\"Paris\"}", got->response_len);
    assert_int_equal(got->response[got->response_len], '\0');
    assert_int_equal(got->dim, DIM);
    assert_true(got->vec[0] != 9);
    const cache_entry *ex = cache_store_get_exact(s, 7, 0xabc, NOW);
    assert_ptr_equal(ex, got);
    cache_entry_release(ex);
    cache_entry_release(got);

    assert_null(cache_store_get_exact(s, 8, 0xabc, NOW)); /* another namespace */
    assert_null(cache_store_get_exact(s, 7, 0xabd, NOW));
    assert_null(cache_store_get_exact(s, 7, 0, NOW));
    assert_null(cache_store_get(s, 43, NOW));

    /* No vector, no question: exact lookups only. */
    cache_entry e2 = {.id = 5, .ns = 7, .exact = 1, .expires_ms = NOW + 1, .response = "r",
                      .response_len = 1};
    assert_int_equal(cache_store_put(s, &e2, NOW, &err), 0);
    got = cache_store_get_exact(s, 7, 1, NOW);
    assert_non_null(got);
    assert_null(got->vec);
    assert_string_equal(got->question, "");
    cache_entry_release(got);

    cache_store_stats st;
    cache_store_get_stats(s, &st);
    assert_int_equal(st.entries, 2);
    assert_int_equal(st.namespaces, 1);
    assert_int_equal(st.insertions, 2);
    assert_true(st.bytes > 2 * sizeof(item));
    cache_store_free(s);
    cache_entry_release(NULL);
    cache_store_free(NULL);
}

static void bad_input(void **state)
{
    (void)state;
    cache_store *s = NULL;
    util_err err = {0};
    cache_store_cfg cfg = {.dim = DIM, .index = "NoSuchIndex"};
    assert_int_equal(cache_store_new(&s, &cfg, &err), LLMGW_EINVAL);
    assert_contains(err.msg, "NoSuchIndex");
    assert_null(s);
    cfg = (cache_store_cfg){.dim = 0};
    assert_int_equal(cache_store_new(&s, &cfg, &err), LLMGW_EINVAL);
    cfg = (cache_store_cfg){.dim = DIM, .rebuild_ratio = 1.5};
    assert_int_equal(cache_store_new(&s, &cfg, &err), LLMGW_EINVAL);

    s = new_store(NULL, 0);
    float v[8] = {1};
    cache_entry e = {.id = 1, .ns = 1, .expires_ms = NOW + 10, .vec = v, .dim = 8,
                     .response = "r", .response_len = 1};
    assert_int_equal(cache_store_put(s, &e, NOW, &err), LLMGW_EINVAL);
    assert_contains(err.msg, "16");
    e = (cache_entry){.id = (1ull << 63) + 1, .ns = 1, .expires_ms = NOW + 10};
    assert_int_equal(cache_store_put(s, &e, NOW, &err), LLMGW_EINVAL);
    float q[DIM];
    unit_vec(q, 1);
    const cache_entry *out[1];
    float sims[1];
    assert_int_equal(cache_store_search(s, 1, NULL, 0, 1, NOW, out, sims, &err), LLMGW_EINVAL);
    assert_int_equal(cache_store_search(s, 1, q, 0, 0, NOW, out, sims, &err), 0);
    assert_int_equal(cache_store_search(s, 1, q, 0, 1, NOW, out, sims, &err), 0); /* empty */
    cache_store_free(s);
}

static void namespaces_are_isolated(void **state)
{
    (void)state;
    cache_store *s = new_store(NULL, 0);
    float v[DIM], w[DIM];
    unit_vec(v, 1);
    unit_vec(w, 2);
    put(s, 1, 100, 0, v, NOW + 1000);
    put(s, 2, 200, 0, w, NOW + 1000);
    float sim = 0;
    /* ns 200 holds only w: the identical vector in ns 100 is never an answer there. */
    assert_int_equal(search1(s, 200, v, -1, &sim), 2);
    assert_true(sim < 0.99f);
    assert_int_equal(search1(s, 200, v, 0.99f, NULL), 0);
    assert_int_equal(search1(s, 100, v, 0.99f, &sim), 1);
    assert_float_equal(sim, 1.0f, 1e-4);
    assert_int_equal(search1(s, 300, v, -1, NULL), 0);
    /* The same exact hash in two namespaces is two entries. */
    put(s, 3, 100, 55, NULL, NOW + 1000);
    put(s, 4, 200, 55, NULL, NOW + 1000);
    const cache_entry *a = cache_store_get_exact(s, 100, 55, NOW);
    const cache_entry *b = cache_store_get_exact(s, 200, 55, NOW);
    assert_int_equal(a->id, 3);
    assert_int_equal(b->id, 4);
    cache_entry_release(a);
    cache_entry_release(b);
    cache_store_stats st;
    cache_store_get_stats(s, &st);
    assert_int_equal(st.namespaces, 2);
    cache_store_free(s);
}

static void search_is_best_first_above_min_sim(void **state)
{
    (void)state;
    cache_store *s = new_store(NULL, 0);
    util_err err = {0};
    float q[DIM], noise[DIM], v[6][DIM];
    unit_vec(q, 10);
    unit_vec(noise, 11);
    /* Entries ever further from q: similarities fall with the noise weight. */
    for (int i = 0; i < 6; i++)
        blend(v[i], q, 1.0f, noise, 0.3f * (float)i);
    for (int i = 0; i < 6; i++)
        put(s, (uint64_t)(100 + i), 1, 0, v[5 - i], NOW + 1000); /* stored in reverse order */
    const cache_entry *out[8];
    float sims[8];
    int n = cache_store_search(s, 1, q, -1, 8, NOW, out, sims, &err);
    assert_int_equal(n, 6);
    for (int i = 0; i < n; i++) {
        assert_int_equal(out[i]->id, 105 - i);
        assert_float_equal(sims[i], dot(q, v[i]), 1e-4);
        if (i > 0)
            assert_true(sims[i] <= sims[i - 1]);
        cache_entry_release(out[i]);
    }
    /* k cuts, and min_sim cuts. */
    n = cache_store_search(s, 1, q, -1, 2, NOW, out, sims, &err);
    assert_int_equal(n, 2);
    assert_int_equal(out[0]->id, 105);
    assert_int_equal(out[1]->id, 104);
    cache_entry_release(out[0]);
    cache_entry_release(out[1]);
    float min_sim = (dot(q, v[2]) + dot(q, v[3])) / 2;
    n = cache_store_search(s, 1, q, min_sim, 8, NOW, out, sims, &err);
    assert_int_equal(n, 3);
    for (int i = 0; i < n; i++) {
        assert_true(sims[i] >= min_sim);
        cache_entry_release(out[i]);
    }
    cache_store_free(s);
}

/* ---- lifetime ---- */

static void ttl_hides_and_expire_removes(void **state)
{
    (void)state;
    cache_store *s = new_store(NULL, 0);
    util_err err = {0};
    float v[DIM], w[DIM];
    unit_vec(v, 1);
    unit_vec(w, 2);
    put(s, 1, 1, 11, v, NOW + 100);
    put(s, 2, 1, 22, w, NOW + 200);
    /* Already expired: not stored, and not an error. */
    cache_entry dead = {.id = 3, .ns = 1, .expires_ms = NOW, .response = "", .response_len = 0};
    assert_int_equal(cache_store_put(s, &dead, NOW, &err), 0);
    assert_false(present(s, 3));

    const cache_entry *out[2];
    float sims[2];
    int64_t t = NOW + 100; /* entry 1 is dead from this instant on */
    assert_null(cache_store_get(s, 1, t));
    assert_null(cache_store_get_exact(s, 1, 11, t));
    const cache_entry *e = cache_store_get(s, 1, t - 1);
    assert_non_null(e);
    cache_entry_release(e);
    int n = cache_store_search(s, 1, v, -1, 2, t, out, sims, &err);
    assert_int_equal(n, 1);
    assert_int_equal(out[0]->id, 2);
    cache_entry_release(out[0]);

    assert_int_equal(cache_store_expire(s, t - 1), 0);
    assert_int_equal(cache_store_expire(s, t), 1);
    assert_int_equal(cache_store_expire(s, t), 0);
    assert_false(present(s, 1));
    assert_int_equal(cache_store_expire(s, NOW + 500), 1);
    cache_store_stats st;
    cache_store_get_stats(s, &st);
    assert_int_equal(st.expirations, 2);
    assert_int_equal(st.entries, 0);
    assert_int_equal(st.bytes, 0);
    assert_int_equal(st.namespaces, 0);
    assert_int_equal(cache_store_search(s, 1, v, -1, 2, NOW, out, sims, &err), 0);
    cache_store_free(s);
}

static void lru_evicts_least_recently_used(void **state)
{
    (void)state;
    float v[DIM];
    unit_vec(v, 3);
    cache_entry probe = {.question = "q", .vec = v, .dim = DIM, .response_len = 12};
    cache_store *s = new_store(NULL, 0);
    size_t one = entry_bytes(s, &probe); /* every entry put() makes has this size or less */
    cache_store_free(s);

    s = new_store(NULL, 3 * one + one / 2); /* room for three */
    float vs[6][DIM];
    for (int i = 0; i < 6; i++)
        unit_vec(vs[i], 20 + (unsigned)i);
    put(s, 1, 1, 101, vs[1], NOW + 1000);
    put(s, 2, 1, 102, vs[2], NOW + 1000);
    put(s, 3, 1, 103, vs[3], NOW + 1000);
    /* Serving 1 (touch) and 2 (exact hit) makes 3 the least recently used. */
    cache_store_touch(s, 1);
    cache_entry_release(cache_store_get_exact(s, 1, 102, NOW));
    cache_store_touch(s, 999); /* gone: a no-op */
    /* get() and search() mark nothing used. */
    cache_entry_release(cache_store_get(s, 3, NOW));
    assert_int_equal(search1(s, 1, vs[3], 0.99f, NULL), 3);
    put(s, 4, 1, 104, vs[4], NOW + 1000);
    assert_false(present(s, 3));
    assert_true(present(s, 1));
    assert_true(present(s, 2));
    assert_true(present(s, 4));
    assert_int_equal(search1(s, 1, vs[3], 0.99f, NULL), 0); /* its vector went too */
    put(s, 5, 1, 105, vs[5], NOW + 1000);
    assert_false(present(s, 1));
    cache_store_stats st;
    cache_store_get_stats(s, &st);
    assert_int_equal(st.evictions, 2);
    assert_int_equal(st.entries, 3);
    assert_true(st.bytes <= 3 * one + one / 2);
    cache_store_free(s);
}

static void oversize_is_refused(void **state)
{
    (void)state;
    cache_store *s = new_store(NULL, 4096);
    util_err err = {0};
    static char big[8192];
    memset(big, 'x', sizeof big);
    put(s, 1, 1, 1, NULL, NOW + 1000);
    cache_entry e = {.id = 2, .ns = 1, .expires_ms = NOW + 1000, .response = big,
                     .response_len = sizeof big};
    assert_int_equal(cache_store_put(s, &e, NOW, &err), LLMGW_ERANGE);
    assert_int_equal(err.code, LLMGW_ERANGE);
    assert_contains(err.msg, "4096");
    assert_true(present(s, 1)); /* nothing was evicted for it */
    assert_false(present(s, 2));
    cache_store_free(s);
}

static void duplicate_id_is_a_noop(void **state)
{
    (void)state;
    cache_store *s = new_store(NULL, 0);
    float v[DIM], w[DIM];
    unit_vec(v, 1);
    unit_vec(w, 2);
    put(s, 7, 1, 70, v, NOW + 1000);
    put(s, 7, 2, 71, w, NOW + 5000); /* a replica announcing it again, or a clash */
    const cache_entry *e = cache_store_get(s, 7, NOW);
    assert_int_equal(e->ns, 1);
    assert_int_equal(e->exact, 70);
    cache_entry_release(e);
    assert_null(cache_store_get_exact(s, 2, 71, NOW));
    assert_int_equal(search1(s, 2, w, -1, NULL), 0);
    cache_store_stats st;
    cache_store_get_stats(s, &st);
    assert_int_equal(st.entries, 1);
    assert_int_equal(st.insertions, 1);
    cache_store_free(s);
}

static void same_exact_replaces(void **state)
{
    (void)state;
    cache_store *s = new_store(NULL, 0);
    float v[DIM], w[DIM];
    unit_vec(v, 1);
    unit_vec(w, 2);
    put(s, 1, 1, 99, v, NOW + 1000);
    put(s, 2, 1, 99, w, NOW + 1000);
    assert_false(present(s, 1));
    const cache_entry *e = cache_store_get_exact(s, 1, 99, NOW);
    assert_int_equal(e->id, 2);
    cache_entry_release(e);
    assert_int_equal(search1(s, 1, v, -1, NULL), 2);
    /* exact = 0 is "none": never replaces. */
    put(s, 3, 1, 0, v, NOW + 1000);
    put(s, 4, 1, 0, v, NOW + 1000);
    assert_true(present(s, 3));
    assert_true(present(s, 4));
    cache_store_stats st;
    cache_store_get_stats(s, &st);
    assert_int_equal(st.entries, 3);
    cache_store_free(s);
}

static void remove_then_search(void **state)
{
    (void)state;
    cache_store *s = new_store(NULL, 0);
    float v[10][DIM];
    for (int i = 0; i < 10; i++) {
        unit_vec(v[i], 50 + (unsigned)i);
        put(s, (uint64_t)(i + 1), 1, 0, v[i], NOW + 1000);
    }
    assert_int_equal(search1(s, 1, v[3], 0.99f, NULL), 4);
    assert_int_equal(cache_store_remove(s, 4), 0);
    assert_int_equal(cache_store_remove(s, 4), LLMGW_ENOTFOUND);
    assert_int_equal(search1(s, 1, v[3], 0.99f, NULL), 0);
    assert_int_equal(cache_index_size(space(s, 1)->ix), 9); /* removed, not a tombstone */
    assert_int_equal(space(s, 1)->tombs.n, 0);

    /* A large index (here: any) tombstones and purges in batches. */
    s->remove_now_max = 0;
    assert_int_equal(cache_store_remove(s, 5), 0);
    assert_int_equal(space(s, 1)->tombs.n, 1);
    assert_int_equal(cache_index_size(space(s, 1)->ix), 9);
    assert_int_equal(search1(s, 1, v[4], 0.99f, NULL), 0);
    assert_int_equal(cache_store_remove(s, 6), 0);
    assert_int_equal(cache_store_remove(s, 7), 0); /* 3 of 9 > 0.25: purged */
    assert_int_equal(space(s, 1)->tombs.n, 0);
    assert_int_equal(cache_index_size(space(s, 1)->ix), 6);
    cache_store_stats st;
    cache_store_get_stats(s, &st);
    assert_int_equal(st.rebuilds, 1);
    assert_int_equal(st.removals, 4);
    for (int i = 0; i < 10; i++)
        assert_int_equal(search1(s, 1, v[i], 0.99f, NULL), i >= 3 && i <= 6 ? 0 : i + 1);
    /* A removed id can come back. */
    put(s, 5, 1, 0, v[4], NOW + 1000);
    assert_int_equal(search1(s, 1, v[4], 0.99f, NULL), 5);

    /* The last vector gone: the namespace drops its index but keeps its other entries. */
    put(s, 50, 2, 1, NULL, NOW + 1000);
    put(s, 51, 2, 0, v[0], NOW + 1000);
    assert_int_equal(search1(s, 2, v[0], 0.99f, NULL), 51);
    assert_non_null(space(s, 2)->ix);
    assert_int_equal(cache_store_remove(s, 51), 0);
    assert_null(space(s, 2)->ix);
    assert_int_equal(search1(s, 2, v[0], -1, NULL), 0);
    assert_int_equal(cache_store_remove(s, 50), 0);
    assert_null(space(s, 2));
    cache_store_free(s);
}

static void hnsw_tombstones_and_rebuilds(void **state)
{
    (void)state;
    enum { N = 80 };
    cache_store *s = new_store("IDMap2,HNSW32", 0);
    static float v[N][DIM];
    for (int i = 0; i < N; i++) {
        unit_vec(v[i], 300 + (unsigned)i);
        put(s, (uint64_t)(i + 1), 1, 0, v[i], NOW + 1000);
    }
    for (int i = 0; i < N; i++)
        assert_int_equal(search1(s, 1, v[i], 0.99f, NULL), i + 1);
    nspace *n = space(s, 1);
    /* Removes become tombstones: the vectors stay in the index and searches skip them. */
    for (int i = 0; i < 10; i++)
        assert_int_equal(cache_store_remove(s, (uint64_t)(2 * i + 1)), 0);
    assert_int_equal(n->tombs.n, 10);
    assert_int_equal(cache_index_size(n->ix), N);
    cache_store_stats st;
    cache_store_get_stats(s, &st);
    assert_int_equal(st.rebuilds, 0);
    for (int i = 0; i < N; i++) {
        uint64_t want = (i % 2 == 0 && i < 20) ? 0 : (uint64_t)(i + 1);
        assert_int_equal(search1(s, 1, v[i], 0.99f, NULL), want);
    }
    /* k results although the best matches are tombstones. */
    const cache_entry *out[5];
    float sims[5];
    util_err err = {0};
    assert_int_equal(cache_store_search(s, 1, v[0], -1, 5, NOW, out, sims, &err), 5);
    for (int i = 0; i < 5; i++) {
        assert_true(out[i]->id % 2 == 0 || out[i]->id > 20);
        cache_entry_release(out[i]);
    }
    /* Past a quarter of the index: rebuilt from the live entries. */
    for (int i = 10; i < 21; i++)
        assert_int_equal(cache_store_remove(s, (uint64_t)(2 * i + 1)), 0);
    cache_store_get_stats(s, &st);
    assert_int_equal(st.rebuilds, 1);
    assert_int_equal(n->tombs.n, 0);
    assert_int_equal(cache_index_size(n->ix), N - 21);
    for (int i = 0; i < N; i++) {
        uint64_t want = (i % 2 == 0 && i < 42) ? 0 : (uint64_t)(i + 1);
        assert_int_equal(search1(s, 1, v[i], 0.99f, NULL), want);
    }
    /* A tombstoned id put again (with another vector) is found by its new vector only. */
    assert_int_equal(cache_store_remove(s, 2), 0);
    assert_int_equal(n->tombs.n, 1);
    put(s, 2, 1, 0, v[0], NOW + 1000);
    assert_int_equal(search1(s, 1, v[0], 0.99f, NULL), 2);
    assert_int_equal(search1(s, 1, v[1], 0.99f, NULL), 0);
    cache_store_free(s);
}

static void ivf_before_and_after_training(void **state)
{
    (void)state;
    enum { N = 200 };
    cache_store *s = new_store("IDMap2,IVF4,Flat", 0); /* trains at 4 x 39 = 156 vectors */
    assert_int_equal(s->train_min, 156);
    static float v[N][DIM];
    for (int i = 0; i < N; i++)
        unit_vec(v[i], 700 + (unsigned)i);
    for (int i = 0; i < 100; i++)
        put(s, (uint64_t)(i + 1), 1, 0, v[i], NOW + 1000);
    for (int i = 0; i < 100; i++)
        assert_int_equal(search1(s, 1, v[i], 0.99f, NULL), i + 1);
    nspace *n = space(s, 1);
    assert_false(n->trained); /* searched flat */
    assert_true(cache_index_is_trained(n->ix));
    assert_int_equal(cache_store_remove(s, 1), 0);
    assert_int_equal(search1(s, 1, v[0], 0.99f, NULL), 0);
    for (int i = 100; i < N; i++)
        put(s, (uint64_t)(i + 1), 1, 0, v[i], NOW + 1000);
    assert_int_equal(search1(s, 1, v[150], 0.99f, NULL), 151);
    assert_true(n->trained);
    assert_int_equal(cache_index_size(n->ix), N - 1);
    cache_store_stats st;
    cache_store_get_stats(s, &st);
    assert_int_equal(st.rebuilds, 1);
    for (int i = 1; i < N; i++)
        assert_int_equal(search1(s, 1, v[i], 0.99f, NULL), i + 1);
    /* IVF deletes for real. */
    assert_int_equal(cache_store_remove(s, 100), 0);
    assert_int_equal(cache_index_size(n->ix), N - 2);
    assert_int_equal(search1(s, 1, v[99], 0.99f, NULL), 0);
    cache_store_free(s);
}

/* ---- references and threads ---- */

static void reference_outlives_removal(void **state)
{
    (void)state;
    cache_store *s = new_store(NULL, 0);
    float v[DIM];
    unit_vec(v, 1);
    put(s, 1, 1, 1, v, NOW + 1000);
    const cache_entry *a = cache_store_get(s, 1, NOW);
    const cache_entry *b = cache_store_get_exact(s, 1, 1, NOW);
    item *it = (item *)a;
    assert_int_equal(atomic_load(&it->refs), 3);
    assert_int_equal(cache_store_remove(s, 1), 0);
    assert_int_equal(atomic_load(&it->refs), 2);
    /* Still readable (ASan would flag a freed entry). */
    assert_string_equal(a->question, "q");
    assert_float_equal(a->vec[DIM - 1], v[DIM - 1], 0);
    cache_entry_release(b);
    assert_int_equal(a->id, 1);
    cache_entry_release(a); /* freed here (LeakSanitizer would flag it otherwise) */

    /* The store freed before its readers let go. */
    put(s, 2, 1, 2, v, NOW + 1000);
    a = cache_store_get(s, 2, NOW);
    cache_store_free(s);
    assert_int_equal(a->id, 2);
    cache_entry_release(a);
}

typedef struct race {
    cache_store *s;
    atomic_bool stop, bad; /* cmocka's asserts belong to the main thread */
    atomic_long searches, hits;
} race;

static void *searcher(void *arg)
{
    race *r = arg;
    float q[DIM];
    const cache_entry *out[4];
    float sims[4];
    util_err err = {0};
    unsigned seed = 0;
    while (!atomic_load(&r->stop)) {
        /* The vector of puts with id % 300 == k lives in namespace k % 3 (300 is a multiple
         * of 3): search there, so hits are real matches, not chance. */
        unsigned k = seed++ % 300;
        unit_vec(q, 1000 + k);
        int n = cache_store_search(r->s, k % 3, q, 0.5f, 4, NOW, out, sims, &err);
        if (n < 0)
            atomic_store(&r->bad, true);
        for (int i = 0; i < n; i++) {
            /* Read the whole entry: it must stay valid until released. */
            if (out[i]->ns != k % 3 || sims[i] < 0.5f || strlen(out[i]->question) != 1 ||
                out[i]->response[out[i]->response_len] != '\0')
                atomic_store(&r->bad, true);
            cache_entry_release(out[i]);
        }
        atomic_fetch_add(&r->searches, 1);
        atomic_fetch_add(&r->hits, n);
    }
    return NULL;
}

static void threads_search_while_one_writes(void **state)
{
    (void)state;
    const char *factories[2] = {"IDMap2,Flat", "IDMap2,HNSW16"};
    for (int f = 0; f < 2; f++) {
        float v[DIM];
        unit_vec(v, 0);
        cache_entry probe = {.question = "q", .vec = v, .dim = DIM, .response_len = 12};
        cache_store *s = new_store(factories[f], 0);
        size_t one = entry_bytes(s, &probe);
        cache_store_free(s);
        race r = {.s = new_store(factories[f], 150 * one)}; /* evicts as it goes */
        pthread_t t[2];
        for (int i = 0; i < 2; i++)
            assert_int_equal(pthread_create(&t[i], NULL, searcher, &r), 0);
        /* At least 3000 puts, and on until the searchers have had 1000 turns against a store
         * that holds entries (searches of the still empty store, before the first put, do not
         * count: they made hits > 0 fail by chance). */
        long before = -1;
        for (uint64_t id = 1;
             id <= 3000 || (atomic_load(&r.searches) - before < 1000 && id < 1000000); id++) {
            unit_vec(v, 1000 + (unsigned)(id % 300));
            put(r.s, id, id % 3, id % 50, v, NOW + 1000);
            if (before < 0)
                before = atomic_load(&r.searches);
            if (id % 7 == 0)
                (void)cache_store_remove(r.s, id - 5);
            if (id % 11 == 0)
                cache_store_touch(r.s, id - 3);
            if (id % 500 == 0)
                (void)cache_store_expire(r.s, NOW);
        }
        atomic_store(&r.stop, true);
        for (int i = 0; i < 2; i++)
            pthread_join(t[i], NULL);
        cache_store_stats st;
        cache_store_get_stats(r.s, &st);
        assert_true(st.entries <= 150);
        assert_true(st.evictions > 0);
        assert_false(atomic_load(&r.bad));
        assert_true(atomic_load(&r.searches) - before >= 1000);
        assert_true(atomic_load(&r.hits) > 0);
        cache_store_free(r.s);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(map_matches_a_reference),
        cmocka_unit_test(expire_follows_the_heap),
        cmocka_unit_test(put_get_exact),
        cmocka_unit_test(bad_input),
        cmocka_unit_test(namespaces_are_isolated),
        cmocka_unit_test(search_is_best_first_above_min_sim),
        cmocka_unit_test(ttl_hides_and_expire_removes),
        cmocka_unit_test(lru_evicts_least_recently_used),
        cmocka_unit_test(oversize_is_refused),
        cmocka_unit_test(duplicate_id_is_a_noop),
        cmocka_unit_test(same_exact_replaces),
        cmocka_unit_test(remove_then_search),
        cmocka_unit_test(hnsw_tombstones_and_rebuilds),
        cmocka_unit_test(ivf_before_and_after_training),
        cmocka_unit_test(reference_outlives_removal),
        cmocka_unit_test(threads_search_while_one_writes),
    };
    return cmocka_run_group_tests_name("cache/store", tests, NULL, NULL);
}
