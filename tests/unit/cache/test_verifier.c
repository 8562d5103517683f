/* tests/unit/cache/test_verifier.c: the cache verifier (cache/verifier.h): the token blob, the
 * features on hand-made token vectors, the MLP, operating points and the weights file. */
#include "cache/verifier.h"

#include "tests/unit/unit.h"

#include <stdlib.h>
#include <unistd.h>

#define DIM 8

/* n one-hot-ish rows (plus [CLS] and [SEP] around them): row i points along axis ids[i]. */
static uint8_t *blob_of(const int *ids, int n, size_t *len)
{
    float tok[(16 + 2) * DIM] = {0};
    tok[0] = 0.3f;                        /* [CLS] */
    for (int i = 0; i < n; i++) {
        tok[(size_t)(i + 1) * DIM + (size_t)ids[i]] = 2.0f;
        tok[(size_t)(i + 1) * DIM + (size_t)((ids[i] + 1) % DIM)] = 0.1f;
    }
    tok[(size_t)(n + 1) * DIM + 7] = -0.5f;  /* [SEP] */
    return cache_tokens_pack(tok, n + 2, DIM, len);
}

static void test_pack_and_check(void **state)
{
    (void)state;
    int ids[3] = {0, 1, 2};
    size_t len = 0;
    uint8_t *b = blob_of(ids, 3, &len);
    assert_non_null(b);
    assert_int_equal(len, 4 + 3 * 4 + 3 * DIM);   /* [CLS] and [SEP] dropped */
    assert_int_equal(cache_tokens_check(b, len, DIM), 3);
    assert_int_equal(cache_tokens_check(b, len, DIM + 1), -1);   /* another width */
    assert_int_equal(cache_tokens_check(b, len - 1, DIM), -1);   /* truncated */
    assert_int_equal(cache_tokens_check(b, 3, DIM), -1);
    assert_int_equal(cache_tokens_check(NULL, 0, DIM), -1);
    uint8_t save = b[4 + 3];
    b[4 + 3] = 0xff;                                              /* a NaN inverse norm */
    b[4 + 2] = 0xff;
    assert_int_equal(cache_tokens_check(b, len, DIM), -1);
    b[4 + 3] = save;
    free(b);
    /* a text of one token keeps it */
    float one[DIM] = {1, 0, 0, 0, 0, 0, 0, 0};
    b = cache_tokens_pack(one, 1, DIM, &len);
    assert_int_equal(cache_tokens_check(b, len, DIM), 1);
    free(b);
    assert_null(cache_tokens_pack(one, 0, DIM, &len));
    assert_null(cache_tokens_pack(one, 1, 0, &len));
}

static int feature_index(const char *name)
{
    for (int i = 0; i < CACHE_VERIFIER_FEATURES; i++)
        if (!strcmp(cache_verifier_feature_name(i), name))
            return i;
    fail_msg("no feature %s", name);
    return -1;
}

static void features(const char *ta, const int *ia, int na, const char *tb, const int *ib, int nb,
                     float *f)
{
    float va[DIM] = {0}, vb[DIM] = {0};
    va[0] = vb[0] = 1;  /* the pooled vectors: identical unless a test says otherwise */
    size_t la, lb;
    uint8_t *a = blob_of(ia, na, &la), *b = blob_of(ib, nb, &lb);
    cache_verifier_side sa = {ta, strlen(ta), va, a, la}, sb = {tb, strlen(tb), vb, b, lb};
    assert_int_equal(cache_verifier_features(&sa, &sb, DIM, f), 0);
    free(a);
    free(b);
}

static void test_features(void **state)
{
    (void)state;
    float f[CACHE_VERIFIER_FEATURES];
    int abc[3] = {1, 2, 3}, cba[3] = {3, 2, 1}, abd[3] = {1, 2, 6};
    features("alice paid bob", abc, 3, "alice paid bob", abc, 3, f);
    assert_double_near(f[feature_index("cosine")], 1.0, 1e-6);
    assert_double_near(f[feature_index("a_best_mean")], 1.0, 1e-3);
    assert_double_near(f[feature_index("crossed_alignments")], 0.0, 0);
    assert_double_near(f[feature_index("mutual_matches")], 1.0, 0);
    assert_double_near(f[feature_index("word_jaccard")], 1.0, 0);
    assert_double_near(f[feature_index("same_words_reordered")], 0.0, 0);
    assert_double_near(f[feature_index("swap")], 0.0, 0);
    /* the same words, who-pays-whom reversed: every aligned pair crosses */
    features("alice paid bob", abc, 3, "bob paid alice", cba, 3, f);
    assert_double_near(f[feature_index("crossed_alignments")], 1.0, 0);
    assert_double_near(f[feature_index("a_best_mean")], 1.0, 1e-3);
    assert_double_near(f[feature_index("same_words_reordered")], 1.0, 0);
    assert_double_near(f[feature_index("swap")], 1.0, 0);
    assert_double_near(f[feature_index("word_jaccard")], 1.0, 0);
    assert_true(f[feature_index("bigram_jaccard")] < 0.01);
    /* one token with no partner */
    features("alice paid bob", abc, 3, "alice paid carol", abd, 3, f);
    assert_true(f[feature_index("a_best_min")] < 0.1);
    assert_double_near(f[feature_index("a_unmatched")], 1.0 / 3, 1e-6);
    assert_double_near(f[feature_index("word_jaccard")], 2.0 / 4, 1e-6);
    /* negation, numbers, length */
    features("is it safe", abc, 3, "is it not safe", abc, 3, f);
    assert_double_near(f[feature_index("negation_mismatch")], 1.0, 0);
    assert_double_near(f[feature_index("negation_diff")], 1.0, 0);
    features("flights in 2014", abc, 3, "flights in 2015", abc, 2, f);
    assert_double_near(f[feature_index("identifier_mismatch")], 1.0, 0);
    assert_double_near(f[feature_index("length_ratio")], 2.0 / 3, 1e-6);
    /* contractions and case do not change the words */
    features("What's THE time", abc, 3, "whats the time", abc, 3, f);
    assert_double_near(f[feature_index("word_jaccard")], 1.0, 0);
    features("What is the tallest mountain on Earth?", abc, 3,
             "what\xe2\x80\x99s the tallest mountain on earth", abc, 3, f);
    assert_double_near(f[feature_index("same_words")], 1.0, 0);
    features("Which mountain on Earth is the tallest?", abc, 3,
             "What is the tallest mountain on Earth?", abc, 3, f);
    assert_double_near(f[feature_index("same_words")], 0.0, 0);
    assert_double_near(f[feature_index("content_jaccard")], 1.0, 0);  /* mountain earth tallest */
    features("Why don't cats swim", abc, 3, "Why do cats not swim", abc, 3, f);
    assert_double_near(f[feature_index("word_jaccard")], 1.0, 0);
    features("best laptops for students", abc, 3, "best laptop for a student", abc, 3, f);
    assert_double_near(f[feature_index("content_jaccard")], 1.0, 0);  /* plural "s" dropped */
    assert_double_near(f[feature_index("a_content_only")], 0.0, 0);
    features("best laptops for students", abc, 3, "best tablets for students", abc, 3, f);
    assert_double_near(f[feature_index("a_content_only")], 0.5, 1e-6);
    /* a malformed blob is an error, not a guess */
    float v[DIM] = {1};
    uint8_t junk[8] = {1, 0, DIM, 0, 0, 0, 0, 0};
    cache_verifier_side a = {"x", 1, v, junk, sizeof junk}, b = a;
    assert_int_equal(cache_verifier_features(&a, &b, DIM, f), LLMGW_EINVAL);
}

static void test_threshold_points(void **state)
{
    (void)state;
    cache_verifier *v;
    util_err err = {0};
    assert_int_equal(cache_verifier_new(&v, 4, &err), 0);
    v->points[0] = (cache_verifier_point){0.001, 0.99};
    v->points[1] = (cache_verifier_point){0.01, 0.9};
    v->points[2] = (cache_verifier_point){0.05, 0.7};
    v->n_points = 3;
    double used;
    assert_double_near(cache_verifier_threshold(v, 0.01, &used), 0.9, 0);
    assert_double_near(used, 0.01, 0);
    assert_double_near(cache_verifier_threshold(v, 0.02, &used), 0.9, 0);
    assert_double_near(cache_verifier_threshold(v, 0.5, &used), 0.7, 0);
    v->points[2].false_hit_rate = 0.05f;  /* as a weights file reads it: 0.0500000007 */
    assert_double_near(cache_verifier_threshold(v, 0.05, &used), 0.7, 0);
    assert_double_near(cache_verifier_threshold(v, 0.0001, &used), 0.99, 0);  /* strictest */
    assert_double_near(used, 0.001, 0);
    cache_verifier_free(v);
    cache_verifier_free(NULL);
}

static void test_save_load(void **state)
{
    (void)state;
    cache_verifier *v, *w;
    util_err err = {0};
    assert_int_equal(cache_verifier_new(&v, 5, &err), 0);
    srand(3);
    for (int i = 0; i < CACHE_VERIFIER_FEATURES; i++) {
        v->mean[i] = (float)i / 10;
        v->std[i] = 1 + (float)i / 7;
    }
    for (int i = 0; i < CACHE_VERIFIER_FEATURES * 5; i++)
        v->w1[i] = (float)rand() / RAND_MAX - 0.5f;
    for (int h = 0; h < 5; h++) {
        v->b1[h] = (float)h / 5;
        v->w2[h] = 1 - (float)h / 3;
    }
    v->b2 = -0.25f;
    v->points[0] = (cache_verifier_point){0.005, 0.97};
    v->points[1] = (cache_verifier_point){0.01, 0.93};
    v->n_points = 2;
    char path[] = "/tmp/llmgw-verifier-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    assert_int_equal(cache_verifier_save(v, path, "# made by a test\n", &err), 0);
    assert_int_equal(cache_verifier_load(&w, path, &err), 0);
    float f[CACHE_VERIFIER_FEATURES];
    for (int k = 0; k < 20; k++) {
        for (int i = 0; i < CACHE_VERIFIER_FEATURES; i++)
            f[i] = (float)rand() / RAND_MAX;
        double p = cache_verifier_prob(v, f);
        assert_true(p > 0 && p < 1);
        assert_double_near(cache_verifier_prob(w, f), p, 1e-6);
    }
    assert_int_equal(w->n_points, 2);
    assert_double_near(cache_verifier_threshold(w, 0.01, NULL), 0.93, 1e-6);
    assert_contains(w->comment, "made by a test");
    cache_verifier_free(w);

    /* every damaged file is refused with a message that says where */
    static const struct {
        const char *from, *to, *says;
    } damage[] = {
        {"llmgw-cache-verifier version=1", "llmgw-cache-verifier version=2", "not a verifier"},
        {"features=26", "features=25", "features"},
        {"a_best_mean", "a_best_avg", "features are not"},
        {"b2 -0.25", "b2 nan", "out of range"},
        {"b2 -0.25", "b2 -0.25 7", "wrong count"},
        {"point 0.005 0.97", "point 0.02 0.97", "out of order"},
        {"point 0.005 0.97", "point 0.005 1.5", "out of range"},
        {"b2 -0.25", "bias -0.25", "unknown row"},
        {"b2 -0.25\n", "", "rows missing"},
    };
    FILE *in = fopen(path, "r");
    char text[1 << 15];
    size_t n = fread(text, 1, sizeof text - 1, in);
    fclose(in);
    text[n] = '\0';
    for (size_t d = 0; d < sizeof damage / sizeof damage[0]; d++) {
        char *at = strstr(text, damage[d].from);
        assert_non_null(at);
        FILE *out = fopen(path, "w");
        fwrite(text, 1, (size_t)(at - text), out);
        fputs(damage[d].to, out);
        fputs(at + strlen(damage[d].from), out);
        fclose(out);
        w = NULL;
        assert_int_equal(cache_verifier_load(&w, path, &err), LLMGW_EINVAL);
        assert_null(w);
        assert_contains(err.msg, damage[d].says);
    }
    unlink(path);
    assert_int_equal(cache_verifier_load(&w, path, &err), LLMGW_EIO);
    cache_verifier_free(v);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pack_and_check),
        cmocka_unit_test(test_features),
        cmocka_unit_test(test_threshold_points),
        cmocka_unit_test(test_save_load),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
