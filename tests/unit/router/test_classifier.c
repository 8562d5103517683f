/* tests/unit/router/test_classifier.c: the complexity classifier (router_classifier_*):
 * structural features, the kNN and tree parts against brute force, the weights files (round
 * trip and load errors) and scoring. */
#include "router/classifier.h"

#include "common/err.h"

#include "tests/unit/unit.h"

#include <math.h>
#include <stdlib.h>
#include <unistd.h>

#define F ROUTER_STRUCT_FEATURES

static void features_of(const char *s, float out[F])
{
    router_struct_features(s, strlen(s), out);
}

static void features_empty(void **state)
{
    (void)state;
    float f[F];
    features_of("", f);
    for (int i = 0; i < F; i++)
        assert_true(f[i] == 0.0f);
    router_struct_features(NULL, 5, f);  /* NULL text is empty whatever len says */
    for (int i = 0; i < F; i++)
        assert_true(f[i] == 0.0f);
}

static void features_multiple_choice(void **state)
{
    (void)state;
    float f[F];
    const char *mc = "Which of the following is not a prime? Calculate 3 + 4.\n"
                     "A. 2\nB. 3\nC. 9 kg\nD. all of the above\nAnswer:";
    features_of(mc, f);
    assert_float_equal(f[0], log1p((double)strlen(mc)), 1e-5);
    assert_float_equal(f[2], log1p(4), 1e-6);         /* four options */
    assert_float_equal(f[6], 0.75, 1e-6);             /* three of them numeric */
    assert_float_equal(f[7], log1p(2), 1e-6);         /* 3 and 4 in the stem */
    assert_float_equal(f[8], log1p(1), 1e-6);         /* '+' */
    assert_float_equal(f[10], log1p(1), 1e-6);        /* "not" */
    assert_float_equal(f[11], log1p(1), 1e-6);        /* "Calculate" */
    assert_float_equal(f[12], 1, 0);                  /* which of the following */
    assert_float_equal(f[13], 1, 0);                  /* "not" in a question */
    assert_float_equal(f[14], 0, 0);
    assert_float_equal(f[16], 1, 0);                  /* one '?' */
    assert_float_equal(f[17], log1p(6), 1e-6);        /* six lines */
    assert_float_equal(f[18], 0, 0);
    assert_float_equal(f[23], 1, 0);                  /* all of the above */
    /* Paired judgements, Statement 1, Roman numerals, a person. */
    features_of("Statement 1 | I did it. Statement 2 | You did.\n"
                "A. True, True\nB. False, False\nC. I and II\nD. Wrong, Not wrong\nAnswer:", f);
    assert_float_equal(f[14], 1, 0);
    assert_float_equal(f[15], 1, 0);
    assert_float_equal(f[18], 0, 0);                  /* "I and II" has no comma */
    assert_float_equal(f[22], 1, 0);
    features_of("Scenario.\nA. Wrong, Wrong\nB. Wrong, Not wrong\nAnswer:", f);
    assert_float_equal(f[18], 1, 0);
    /* No options at all: a plain chat prompt. */
    features_of("hi there, how are you?", f);
    assert_float_equal(f[2], 0, 0);
    assert_float_equal(f[6], 0, 0);
    assert_float_equal(f[1], log1p(5), 1e-6);
    assert_float_equal(f[22], 1, 0);
}

/* ---- a random model ------------------------------------------------------------------------ */

enum { DIM = 8, NK = 40, K = 5, TREES = 3 };

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static double uniform(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double)(rng >> 11) / 9007199254740992.0;
}

static void unit_vector(float *v, int dim)
{
    double ss = 0;
    for (int i = 0; i < dim; i++) {
        v[i] = (float)(uniform() * 2 - 1);
        ss += (double)v[i] * v[i];
    }
    for (int i = 0; i < dim; i++)
        v[i] = (float)(v[i] / sqrt(ss));
}

typedef struct model_store {
    int8_t q[NK * DIM];
    float scale[NK], target[NK], vec[NK][DIM];
    double mean[DIM], std[DIM], weight[DIM];
    router_tree trees[TREES];
} model_store;

static router_model random_model(model_store *s)
{
    for (int i = 0; i < NK; i++) {
        unit_vector(s->vec[i], DIM);
        double ss = 0;
        for (int j = 0; j < DIM; j++) {
            s->q[i * DIM + j] = (int8_t)lrint(s->vec[i][j] * 127);
            ss += (double)s->q[i * DIM + j] * s->q[i * DIM + j];
        }
        s->scale[i] = (float)(1 / sqrt(ss));
        s->target[i] = (float)(i % 3 - 1);
    }
    for (int j = 0; j < DIM; j++) {
        s->mean[j] = uniform() * 0.1;
        s->std[j] = 0.5 + uniform();
        s->weight[j] = uniform() - 0.5;
    }
    for (int t = 0; t < TREES; t++) {
        for (int i = 0; i < ROUTER_TREE_NODES; i++) {
            s->trees[t].feature[i] = i == 2 ? -1 : (t + i) % F;
            s->trees[t].threshold[i] = uniform();
        }
        for (int l = 0; l < ROUTER_TREE_LEAVES; l++)
            s->trees[t].leaf[l] = uniform() - 0.5;
    }
    router_model m = {.dim = DIM, .k = K, .n_knn = NK, .knn_q = s->q, .knn_scale = s->scale,
                      .knn_target = s->target, .ridge_mean = s->mean, .ridge_std = s->std,
                      .ridge_weight = s->weight, .ridge_bias = 0.25, .n_trees = TREES,
                      .tree_base = 0.1, .trees = s->trees, .combine_mean = {0, 0.2, 0.1},
                      .combine_std = {0.5, 1, 0.7}, .familiar_min = 0.3};
    for (int i = 0; i < ROUTER_QUANTILES; i++)
        m.quantiles[i] = -3 + 6.0 * i / (ROUTER_QUANTILES - 1);
    return m;
}

static int cmp_desc(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x > y ? -1 : x < y;
}

/* The kNN part equals brute force over the dequantised vectors (to int8 precision). */
static void knn_matches_brute_force(void **state)
{
    (void)state;
    static model_store s;
    router_model m = random_model(&s);
    for (int trial = 0; trial < 50; trial++) {
        float e[DIM];
        unit_vector(e, DIM);
        double pred, fam;
        router_knn_query(m.knn_q, m.knn_scale, m.knn_target, NK, DIM, K, e, -1, &pred, &fam);
        double sims[NK], sorted[NK];
        for (int i = 0; i < NK; i++) {
            double d = 0;
            for (int j = 0; j < DIM; j++)
                d += (double)e[j] * s.q[i * DIM + j] * s.scale[i];
            sims[i] = sorted[i] = d;
        }
        qsort(sorted, NK, sizeof *sorted, cmp_desc);
        double want_fam = 0;
        for (int i = 0; i < K; i++)
            want_fam += sorted[i] / K;
        assert_double_near(fam, want_fam, 0.02);
        /* Where the k-th and (k+1)-th are well apart, the neighbours are the same. */
        if (sorted[K - 1] - sorted[K] > 0.05) {
            double want = 0;
            for (int i = 0; i < NK; i++)
                want += sims[i] >= sorted[K - 1] ? s.target[i] / (double)K : 0;
            assert_double_near(pred, want, 1e-9);
        }
    }
    /* skip leaves one vector out: querying a stored vector with it skipped never finds it. */
    double pred, fam, fam_self;
    router_knn_query(m.knn_q, m.knn_scale, m.knn_target, NK, DIM, 1, s.vec[7], -1, &pred,
                     &fam_self);
    assert_double_near(fam_self, 1.0, 0.02);
    router_knn_query(m.knn_q, m.knn_scale, m.knn_target, NK, DIM, 1, s.vec[7], 7, &pred, &fam);
    assert_true(fam < fam_self - 1e-3);
}

static void trees_route_by_threshold(void **state)
{
    (void)state;
    router_tree t = {.feature = {0, 1, -1, -1, -1, -1, -1}, .threshold = {0.5, 2, 0, 0, 0, 0, 0},
                     .leaf = {1, 2, 3, 4, 5, 6, 7, 8}};
    float x[F] = {0};
    /* x0 < 0.5 and x1 < 2: left, left, then node 3 (no split) goes left: leaf 0 */
    assert_double_near(router_trees_predict(&t, 1, 0.5, x), 1.5, 0);
    x[1] = 2;  /* node 1 goes right to node 4: leaf 2 */
    assert_double_near(router_trees_predict(&t, 1, 0, x), 3, 0);
    x[0] = 0.5;  /* node 0 right to node 2 (no split): left to node 5: leaf 4 */
    assert_double_near(router_trees_predict(&t, 1, 0, x), 5, 0);
    router_tree two[2] = {t, t};
    assert_double_near(router_trees_predict(two, 2, 0, x), 10, 0);
}

static char g_dir[64];

static void path_in(char *out, size_t size, const char *name)
{
    snprintf(out, size, "%s/%s", g_dir, name);
}

static void read_all(const char *path, char *buf, size_t cap, size_t *n)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    *n = fread(buf, 1, cap - 1, f);
    buf[*n] = '\0';
    fclose(f);
}

/* Save, load, save again: the same bytes, the same scores; scores are percentiles. */
static void round_trip(void **state)
{
    (void)state;
    static model_store s;
    router_model m = random_model(&s);
    router_classifier *a = NULL, *b = NULL;
    util_err err = {0};
    assert_int_equal(router_classifier_new(&a, &m, &err), 0);
    assert_int_equal(router_classifier_dim(a), DIM);
    char p1[256], p2[256];
    path_in(p1, sizeof p1, "a.weights");
    path_in(p2, sizeof p2, "b.weights");
    assert_int_equal(router_classifier_save(a, p1, "a.knn", "a test\nsecond line", &err), 0);
    if (router_classifier_load(&b, p1, &err) != 0)
        print_error("%s\n", err.msg);
    assert_non_null(b);
    assert_int_equal(router_classifier_save(b, p2, "a.knn", "a test\nsecond line", &err), 0);
    static char t1[65536], t2[65536];
    size_t n1, n2;
    read_all(p1, t1, sizeof t1, &n1);
    read_all(p2, t2, sizeof t2, &n2);
    assert_int_equal(n1, n2);
    assert_memory_equal(t1, t2, n1);
    assert_non_null(strstr(t1, "# second line\n"));
    double last = -1;
    for (int trial = 0; trial < 40; trial++) {
        float e[DIM];
        unit_vector(e, DIM);
        const char *text = trial % 2 ? "A. 1\nB. 2\nwhat?" : "plain words";
        router_assessment x, y;
        router_classifier_assess(a, e, text, strlen(text), &x);
        router_classifier_assess(b, e, text, strlen(text), &y);
        assert_double_near(x.score, y.score, 1e-7);
        assert_double_near(x.familiarity, y.familiarity, 1e-7);
        assert_true(x.familiar == y.familiar);
        assert_true(x.score >= 0 && x.score <= 1);
        assert_double_near(router_classifier_score(a, e, text, strlen(text)), x.score, 0);
        /* The score is the percentile of the summed standardised parts. */
        double z = 0;
        for (int j = 0; j < 3; j++)
            z += (x.part[j] - m.combine_mean[j]) / m.combine_std[j];
        double want = z <= -3 ? 0 : z >= 3 ? 1 : (z + 3) / 6;
        assert_double_near(x.score, want, 1e-9);
        last = x.score;
    }
    (void)last;
    router_classifier_free(a);
    router_classifier_free(b);
    router_classifier_free(NULL);
    unlink(p1);
    unlink(p2);
}

/* ---- load errors ------------------------------------------------------------------------ */

static char g_valid[65536];

static void expect_error(const char *text, const char *message)
{
    router_classifier *c = NULL;
    util_err err = {0};
    int rc = router_classifier_parse(&c, text, strlen(text), "w.txt", g_dir, &err);
    if (rc == 0)
        print_error("parsed, expected \"%s\"\n", message);
    assert_int_not_equal(rc, 0);
    assert_null(c);
    assert_contains(err.msg, message);
}

/* The valid text with the first occurrence of `from` replaced by `to`. */
static void expect_edit_error(const char *from, const char *to, const char *message)
{
    static char out[70000];
    char *at = strstr(g_valid, from);
    assert_non_null(at);
    snprintf(out, sizeof out, "%.*s%s%s", (int)(at - g_valid), g_valid, to, at + strlen(from));
    expect_error(out, message);
}

static void load_errors(void **state)
{
    (void)state;
    static model_store s;
    router_model m = random_model(&s);
    router_classifier *c = NULL;
    util_err err = {0};
    char p[256];
    path_in(p, sizeof p, "v.weights");
    assert_int_equal(router_classifier_new(&c, &m, &err), 0);
    assert_int_equal(router_classifier_save(c, p, "v.knn", NULL, &err), 0);
    router_classifier_free(c);
    size_t n;
    read_all(p, g_valid, sizeof g_valid, &n);
    /* The valid text parses; NULL dir cannot resolve its kNN file. */
    assert_int_equal(router_classifier_parse(&c, g_valid, n, "w.txt", g_dir, &err), 0);
    router_classifier_free(c);
    c = NULL;
    assert_int_not_equal(router_classifier_parse(&c, g_valid, n, "w.txt", NULL, &err), 0);
    assert_contains(err.msg, "w.txt:2: knn: \"v.knn\" is not a file name beside the weights");
    expect_error("", "w.txt: empty");
    expect_error("# only a comment\n", "w.txt: empty");
    expect_edit_error("llmgw-router", "llmgw-routers", "w.txt:1: not a router weights file");
    expect_edit_error("version=2", "version=1", "w.txt:1: version 1, this build reads 2");
    expect_edit_error("dim=8", "dim=0", "want dim=");
    expect_edit_error("features=24", "features=8", "features=8 structural features");
    expect_edit_error("features=24", "features=24 x", "unexpected \"x\" in the header");
    expect_edit_error("knn 5 v.knn", "knn 5 nope.knn", "nope.knn: No such file");
    expect_edit_error("knn 5 v.knn", "knn 5 ../v.knn", "is not a file name beside the weights");
    expect_edit_error("knn 5 v.knn", "knn 41 v.knn", "k 41 needs between k");
    expect_edit_error("knn 5 v.knn", "knn 2.5 v.knn", "knn: want k in 0..256");
    expect_edit_error("dim=8", "dim=9", "v.knn: version 1 dim 8, want version 1 dim 9");
    expect_edit_error("ridge_std ", "ridge_std 0 ", "ridge_std: more than 8 numbers");
    expect_edit_error("ridge_std ", "ridge_std -1 ", "more than 8 numbers");
    expect_edit_error("ridge_bias 0.25", "ridge_bias nan", "value 1 \"nan\" is not a finite");
    expect_edit_error("trees 3", "trees 4", "want the \"tree\" record here");
    expect_edit_error("trees 3", "trees 2", "want the \"combine\" record here");
    expect_edit_error("tree 0", "tree 24", "tree: feature 24 is not -1..23");
    expect_edit_error("tree 0", "tree -2", "tree: feature -2 is not -1..23");
    expect_edit_error("combine 0 0.5", "combine 0 0", "combine spread 1 is not positive");
    expect_edit_error("quantiles -3", "quantiles 5", "quantiles are not ascending (at 1)");
    expect_edit_error("familiar_min 0.3", "familiar_min 0.3\nextra 1", "unexpected content");
    /* A std of zero, in the middle of its record. */
    char *at = strstr(g_valid, "ridge_std ");
    assert_non_null(at);
    char *num = at + strlen("ridge_std ");
    char *sp = strchr(num, ' ');
    static char out[70000];
    snprintf(out, sizeof out, "%.*s0%s", (int)(num - g_valid), g_valid, sp);
    expect_error(out, "ridge std 1 is not positive");
    /* A NUL byte, a truncated kNN file. */
    char nul[] = "llmgw-router\0 version=2";
    router_classifier *d = NULL;
    assert_int_equal(router_classifier_parse(&d, nul, sizeof nul - 1, "w.txt", g_dir, &err),
                     LLMGW_EINVAL);
    assert_contains(err.msg, "NUL byte");
    char kp[256];
    path_in(kp, sizeof kp, "v.knn");
    assert_int_equal(truncate(kp, 100), 0);
    expect_error(g_valid, "bytes of records for 40 vectors");
    unlink(kp);
    unlink(p);
}

static int setup(void **state)
{
    (void)state;
    snprintf(g_dir, sizeof g_dir, "/tmp/llmgw-classifier-XXXXXX");
    return mkdtemp(g_dir) == NULL ? -1 : 0;
}

static int teardown(void **state)
{
    (void)state;
    const char *names[] = {"a.knn", "v.knn", "a.weights", "b.weights", "v.weights"};
    char p[256];
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        path_in(p, sizeof p, names[i]);
        unlink(p);
    }
    return rmdir(g_dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(features_empty),
        cmocka_unit_test(features_multiple_choice),
        cmocka_unit_test(knn_matches_brute_force),
        cmocka_unit_test(trees_route_by_threshold),
        cmocka_unit_test(round_trip),
        cmocka_unit_test(load_errors),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
