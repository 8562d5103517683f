/* tests/unit/router/test_policy.c: the routing policy (router_policy_*): parsing and every class
 * of validation error with its file:line:column, rule matching, reference counting, costs. The
 * group setup writes classifier weights files into a temporary directory. */
#include "router/policy.h"

#include "router/classifier.h"

#include "tests/unit/unit.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <strings.h>
#include <unistd.h>

static char g_dir[64];          /* temporary: w.weights (valid), bad.weights (not) */
static const char *const g_backends[] = {"small", "large", "remote"};

static int write_file(const char *dir, const char *name, const char *text)
{
    char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (f == NULL)
        return -1;
    fputs(text, f);
    return fclose(f);
}

static int group_setup(void **state)
{
    (void)state;
    /* A small model over a 4-wide embedding: two kNN vectors, a ridge part, no trees, written
     * by router_classifier_save as w.weights and w.knn. */
    static const int8_t q[8] = {127, 0, 0, 0, 0, 127, 0, 0};
    static const float scale[2] = {1.0f / 127, 1.0f / 127}, target[2] = {1, 0};
    static const double mean[4] = {0}, std[4] = {1, 1, 1, 1}, weight[4] = {0.1, 0, 0, 0};
    router_model m = {.dim = 4, .k = 1, .n_knn = 2, .knn_q = q, .knn_scale = scale,
                      .knn_target = target, .ridge_mean = mean, .ridge_std = std,
                      .ridge_weight = weight, .combine_mean = {0.5, 0, 0},
                      .combine_std = {0.5, 0.1, 1}, .familiar_min = 0.5};
    for (int i = 0; i < ROUTER_QUANTILES; i++)
        m.quantiles[i] = -2 + 4.0 * i / (ROUTER_QUANTILES - 1);
    router_classifier *c = NULL;
    util_err err = {0};
    char path[256];
    snprintf(g_dir, sizeof g_dir, "/tmp/llmgw-policy-XXXXXX");
    if (mkdtemp(g_dir) == NULL || router_classifier_new(&c, &m, &err) != 0)
        return -1;
    snprintf(path, sizeof path, "%s/w.weights", g_dir);
    int rc = router_classifier_save(c, path, "w.knn", "test weights", &err);
    router_classifier_free(c);
    if (rc != 0)
        return -1;
    return write_file(g_dir, "bad.weights", "not a weights file\n");
}

static int group_teardown(void **state)
{
    (void)state;
    const char *names[] = {"w.weights", "w.knn", "bad.weights", "p.yaml"};
    char path[256];
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        snprintf(path, sizeof path, "%s/%s", g_dir, names[i]);
        unlink(path);
    }
    rmdir(g_dir);
    return 0;
}

/* Parses text as "t.yaml" from g_dir against g_backends. */
static int parse(router_policy **p, const char *text, util_err *err)
{
    *p = NULL;
    return router_policy_parse(p, text, strlen(text), "t.yaml", g_dir, g_backends, 3, err);
}

static router_policy *parse_ok(const char *text)
{
    router_policy *p = NULL;
    util_err err = {0};
    int rc = parse(&p, text, &err);
    if (rc != 0)
        print_error("parse failed: %s\n", err.msg);
    assert_int_equal(rc, 0);
    assert_non_null(p);
    return p;
}

/* The example of policies/README.md, with the test's weights. */
static const char k_example[] =
    "version: 1\n"
    "models: [auto, gpt-4o-mini, gpt-4o]\n"
    "default_tier: small\n"
    "reference_tier: large\n"
    "classifier: {weights: w.weights}\n"
    "tiers:\n"
    "  small:\n"
    "    backend: small\n"
    "    price: {input_per_1m: 0.15, output_per_1m: 0.60}\n"
    "    context: 8192\n"
    "    max_concurrent: 64\n"
    "    fallback: [large]\n"
    "  large:\n"
    "    price: {input_per_1m: 2.50, output_per_1m: 10.00}\n"
    "    context: 8192\n"
    "    max_concurrent: 16\n"
    "  offsite:\n"
    "    backend: remote\n"
    "    fallback: [small, large]\n"
    "rules:\n"
    "  - name: pinned-large\n"
    "    match: {model: [gpt-4o]}\n"
    "    tier: large\n"
    "  - name: vip-group\n"
    "    match: {group: [vip]}\n"
    "    tier: large\n"
    "  - name: header-override\n"
    "    match: {header: {x-llmgw-tier: '^large$'}}\n"
    "    tier: large\n"
    "  - name: long-prompts\n"
    "    match: {min_input_tokens: 3000}\n"
    "    tier: large\n"
    "  - name: code\n"
    "    match: {regex: ['```', '\\bdef\\s+\\w+\\(']}\n"
    "    tier: large\n"
    "  - name: debugging\n"
    "    match: {keywords: [stack trace, segfault]}\n"
    "    tier: large\n"
    "  - name: hard\n"
    "    match: {model: [auto], score: {min: 0.62}}\n"
    "    tier: large\n"
    "    cache: {threshold: 0.99}\n"
    "  - name: no-cache-for-secrets\n"
    "    match: {keywords: [password]}\n"
    "    tier: small\n"
    "    cache: {enabled: false}\n"
    "  - name: offsite-mid\n"
    "    match: {group: [batch], min_input_tokens: 10, max_input_tokens: 20}\n"
    "    tier: offsite\n"
    "cascade: {enabled: false}\n";

static void valid_policy(void **state)
{
    (void)state;
    router_policy *p = parse_ok(k_example);
    assert_int_equal(router_policy_tier_count(p), 3);
    int small = router_policy_find_tier(p, "small"), large = router_policy_find_tier(p, "large"),
        offsite = router_policy_find_tier(p, "offsite");
    assert_int_equal(small, 0);
    assert_int_equal(large, 1);
    assert_int_equal(offsite, 2);
    assert_int_equal(router_policy_find_tier(p, "medium"), -1);
    assert_int_equal(router_policy_find_tier(p, NULL), -1);
    assert_int_equal(router_policy_default_tier(p), small);
    assert_int_equal(router_policy_reference_tier(p), large);

    const router_tier *t = router_policy_tier(p, small);
    assert_string_equal(t->name, "small");
    assert_string_equal(t->backend, "small");
    assert_double_near(t->price_in, 0.15, 1e-12);
    assert_double_near(t->price_out, 0.60, 1e-12);
    assert_int_equal(t->context, 8192);
    assert_int_equal(t->max_concurrent, 64);
    assert_int_equal(t->n_fallback, 1);
    assert_int_equal(t->fallback[0], large);

    t = router_policy_tier(p, large);
    assert_string_equal(t->backend, "large");   /* default: the tier's name */
    assert_double_near(t->price_in, 2.5, 1e-12);
    assert_double_near(t->price_out, 10.0, 1e-12);
    assert_int_equal(t->max_concurrent, 16);
    assert_int_equal(t->n_fallback, 0);

    t = router_policy_tier(p, offsite);
    assert_string_equal(t->backend, "remote");
    assert_double_near(t->price_in, 0, 0);
    assert_int_equal(t->context, 0);
    assert_int_equal(t->max_concurrent, 0);
    assert_int_equal(t->n_fallback, 2);
    assert_int_equal(t->fallback[0], small);
    assert_int_equal(t->fallback[1], large);

    assert_null(router_policy_tier(p, 3));
    assert_null(router_policy_tier(p, -1));
    assert_non_null(router_policy_classifier(p));
    assert_int_equal(router_classifier_dim(router_policy_classifier(p)), 4);
    assert_true(router_policy_uses_score(p));
    router_policy_unref(p);
}

static void minimal_policy(void **state)
{
    (void)state;
    /* No reference_tier: the dearest tier by output price. No rules: the default tier. */
    router_policy *p = parse_ok("tiers:\n"
                                "  large: {price: {input_per_1m: 3, output_per_1m: 15}}\n"
                                "  small: {price: {output_per_1m: 1}}\n"
                                "default_tier: small\n");
    assert_int_equal(router_policy_default_tier(p), 1);
    assert_int_equal(router_policy_reference_tier(p), 0);
    assert_null(router_policy_classifier(p));
    assert_false(router_policy_uses_score(p));
    assert_false(router_policy_routes_model(p, "auto"));
    router_decision d;
    router_request q = {.model = "auto", .score = -1};
    router_policy_route(p, &q, &d);
    assert_int_equal(d.tier, 1);
    assert_null(d.rule);
    assert_false(d.needs_score);
    router_policy_unref(p);

    /* backends NULL: no check against the daemon config. */
    util_err err = {0};
    const char *text = "tiers: {x: {backend: anything}}\ndefault_tier: x\n";
    assert_int_equal(router_policy_parse(&p, text, strlen(text), "t.yaml", NULL, NULL, 0, &err), 0);
    assert_string_equal(router_policy_tier(p, 0)->backend, "anything");
    router_policy_unref(p);
}

/* ---- validation errors: one row per class ------------------------------------------------------ */

typedef struct error_case {
    const char *what;
    const char *yaml;
    int code;
    const char *where;          /* the message's prefix: "t.yaml:line:column: " */
    const char *says;           /* a substring of the rest */
} error_case;

#define BASE "default_tier: small\ntiers:\n  small: {fallback: [large]}\n  large: {}\n"
#define WITH_CLS "classifier: {weights: w.weights}\n"

static const error_case k_errors[] = {
    {"empty file", "", LLMGW_EINVAL, "t.yaml:1:1: ", "the policy is empty"},
    {"comments only", "# nothing\n", LLMGW_EINVAL, "t.yaml:1:1: ", "the policy is empty"},
    {"invalid YAML", "tiers: [a\n", LLMGW_EINVAL, "t.yaml:2:1: ", "invalid YAML"},
    {"two documents", BASE "---\nmore: 1\n", LLMGW_EINVAL, "t.yaml:6:1: ", "one YAML document"},
    {"not a mapping", "- a\n- b\n", LLMGW_EINVAL, "t.yaml:1:1: ",
     "the policy must be a mapping"},
    {"unknown top-level key", BASE "tierz: {}\n", LLMGW_EINVAL, "t.yaml:5:1: ",
     "unknown key 'tierz'"},
    {"unknown tier key", "default_tier: a\ntiers:\n  a: {prices: {}}\n", LLMGW_EINVAL,
     "t.yaml:3:7: ", "unknown key 'prices' in tier 'a'"},
    {"unknown price key", "default_tier: a\ntiers:\n  a: {price: {input: 1}}\n", LLMGW_EINVAL,
     "t.yaml:3:15: ", "unknown key 'input' in price"},
    {"unknown rule key", BASE "rules:\n  - {name: r, tier: small, when: {}}\n", LLMGW_EINVAL,
     "t.yaml:6:28: ", "unknown key 'when' in a rule"},
    {"unknown match key", BASE "rules:\n  - {name: r, tier: small, match: {modle: [a]}}\n",
     LLMGW_EINVAL, "t.yaml:6:36: ", "unknown key 'modle' in match"},
    {"unknown cache key", BASE "rules:\n  - {name: r, tier: small, cache: {ttl: 1}}\n",
     LLMGW_EINVAL, "t.yaml:6:36: ", "unknown key 'ttl' in cache"},
    {"unknown score key", BASE WITH_CLS "rules:\n  - {name: r, tier: small, match: {score: {low: 0.1}}}\n",
     LLMGW_EINVAL, "t.yaml:7:44: ", "unknown key 'low' in score"},
    {"unknown classifier key", BASE "classifier: {weights: w.weights, kind: lr}\n", LLMGW_EINVAL,
     "t.yaml:5:34: ", "unknown key 'kind' in classifier"},
    {"unknown cascade key", BASE "cascade: {enabled: false, draft: small}\n", LLMGW_EINVAL,
     "t.yaml:5:27: ", "unknown key 'draft' in cascade"},
    {"cascade rule", BASE "cascade: {rule: entropy}\n", LLMGW_EINVAL, "t.yaml:5:17: ",
     "'rule' must be chow or diff"},
    {"cascade threshold zero", BASE "cascade: {threshold: 0}\n", LLMGW_EINVAL, "t.yaml:5:22: ",
     "'threshold' must be above 0"},
    {"cascade window range", BASE "cascade: {window: 65}\n", LLMGW_EINVAL, "t.yaml:5:19: ",
     "'window' must be between 1 and 64"},
    {"cascade hold range", BASE "cascade: {hold: 17}\n", LLMGW_EINVAL, "t.yaml:5:17: ",
     "'hold' must be between 0 and 16"},
    {"diff without held tokens", BASE "cascade: {rule: diff, hold: 0}\n", LLMGW_EINVAL,
     "t.yaml:5:10: ", "'hold' must be 1 or more"},
    {"rule cascade key", BASE "rules:\n  - {name: r, tier: large, cascade: {on: true}}\n",
     LLMGW_EINVAL, "t.yaml:6:38: ", "unknown key 'on' in cascade"},
    {"tiers not a mapping", "default_tier: a\ntiers: [a]\n", LLMGW_EINVAL, "t.yaml:2:8: ",
     "'tiers' must be a mapping"},
    {"no tiers", "default_tier: a\ntiers: {}\n", LLMGW_EINVAL, "t.yaml:2:8: ",
     "at least one tier"},
    {"price not a number", "default_tier: a\ntiers:\n  a: {price: {input_per_1m: cheap}}\n",
     LLMGW_EINVAL, "t.yaml:3:29: ", "'input_per_1m' must be a number, got 'cheap'"},
    {"negative price", "default_tier: a\ntiers:\n  a: {price: {output_per_1m: -1}}\n",
     LLMGW_EINVAL, "t.yaml:3:30: ", "'output_per_1m' must be between 0 and"},
    {"context not an integer", "default_tier: a\ntiers:\n  a: {context: 8k}\n", LLMGW_EINVAL,
     "t.yaml:3:16: ", "'context' must be an integer, got '8k'"},
    {"max_concurrent out of range", "default_tier: a\ntiers:\n  a: {max_concurrent: -2}\n",
     LLMGW_EINVAL, "t.yaml:3:23: ", "'max_concurrent' must be between 0 and 1000000"},
    {"version", "version: 2\n" BASE, LLMGW_EINVAL, "t.yaml:1:10: ", "'version' must be 1"},
    {"rules not a list", BASE "rules: {a: 1}\n", LLMGW_EINVAL, "t.yaml:5:8: ",
     "'rules' must be a list"},
    {"keywords not strings", BASE "rules:\n  - {name: r, tier: small, match: {keywords: {a: b}}}\n",
     LLMGW_EINVAL, "t.yaml:6:46: ", "'keywords' must be a string or a list of strings"},
    {"empty model list", BASE "rules:\n  - {name: r, tier: small, match: {model: []}}\n",
     LLMGW_EINVAL, "t.yaml:6:43: ", "'model' must not be an empty list"},
    {"group item not a string", BASE "rules:\n  - {name: r, tier: small, match: {group: [[a]]}}\n",
     LLMGW_EINVAL, "t.yaml:6:44: ", "items of 'group' must be non-empty strings"},
    {"cache enabled not a bool", BASE "rules:\n  - {name: r, tier: small, cache: {enabled: maybe}}\n",
     LLMGW_EINVAL, "t.yaml:6:45: ", "'enabled' must be true or false"},
    {"cache threshold range", BASE "rules:\n  - {name: r, tier: small, cache: {threshold: 1.5}}\n",
     LLMGW_EINVAL, "t.yaml:6:47: ", "'threshold' must be between 0 and 1, got 1.5"},
    {"negative token bound", BASE "rules:\n  - {name: r, tier: small, match: {min_input_tokens: -1}}\n",
     LLMGW_EINVAL, "t.yaml:6:54: ", "'min_input_tokens' must be between 0"},
    {"token bounds crossed",
     BASE "rules:\n  - {name: r, tier: small, match: {min_input_tokens: 10, max_input_tokens: 5}}\n",
     LLMGW_EINVAL, "t.yaml:6:76: ", "'max_input_tokens' (5) is below 'min_input_tokens' (10)"},
    {"key not a string", BASE "? [a]\n: b\n", LLMGW_EINVAL, "t.yaml:5:3: ",
     "keys must be strings"},
    {"missing default_tier", "tiers: {small: {}}\n", LLMGW_EINVAL, "t.yaml:1:1: ",
     "'default_tier' is missing"},
    {"missing tiers", "default_tier: a\n", LLMGW_EINVAL, "t.yaml:1:1: ", "'tiers' is missing"},
    {"undefined default tier", "default_tier: medium\ntiers: {small: {}}\n", LLMGW_EINVAL,
     "t.yaml:1:15: ", "default_tier 'medium' is not a tier of this policy"},
    {"undefined reference tier", BASE "reference_tier: huge\n", LLMGW_EINVAL, "t.yaml:5:17: ",
     "reference_tier 'huge' is not a tier of this policy"},
    {"undefined rule tier", BASE "rules:\n  - {name: r, tier: nope}\n", LLMGW_EINVAL,
     "t.yaml:6:21: ", "tier 'nope' is not a tier of this policy"},
    {"undefined fallback tier", "default_tier: a\ntiers:\n  a: {fallback: [b, c]}\n  b: {}\n",
     LLMGW_EINVAL, "t.yaml:3:21: ", "fallback 'c' is not a tier of this policy"},
    {"fallback to itself", "default_tier: a\ntiers:\n  a: {fallback: [a]}\n", LLMGW_EINVAL,
     "t.yaml:3:18: ", "tier 'a' falls back to itself"},
    {"fallback cycle",
     "default_tier: small\ntiers:\n  small: {fallback: [large]}\n  large: {fallback: [remote]}\n"
     "  remote: {fallback: small}\n",
     LLMGW_EINVAL, "t.yaml:3:22: ", "fallback 'large' of tier 'small' leads back to 'small' (a cycle)"},
    {"fallback listed twice", "default_tier: a\ntiers:\n  a: {fallback: [b, b]}\n  b: {}\n",
     LLMGW_EINVAL, "t.yaml:3:21: ", "fallback 'b' is listed twice"},
    {"backend unknown", "default_tier: a\ntiers:\n  a: {backend: medium}\n", LLMGW_EINVAL,
     "t.yaml:3:16: ", "backend 'medium' of tier 'a' is not a tier of the daemon config"},
    {"tier name as backend unknown", "default_tier: medium\ntiers:\n  medium: {}\n",
     LLMGW_EINVAL, "t.yaml:3:3: ", "backend 'medium' of tier 'medium' is not a tier"},
    {"duplicate tier", "default_tier: small\ntiers:\n  small: {}\n  small: {context: 1}\n",
     LLMGW_EINVAL, "t.yaml:4:3: ", "tier 'small' is defined twice"},
    {"duplicate rule", BASE "rules:\n  - {name: r, tier: small}\n  - {name: r, tier: large}\n",
     LLMGW_EINVAL, "t.yaml:7:12: ", "rule name 'r' is used twice"},
    {"rule without name", BASE "rules:\n  - {tier: small}\n", LLMGW_EINVAL, "t.yaml:6:5: ",
     "a rule needs a 'name'"},
    {"rule without tier", BASE "rules:\n  - name: r\n    match: {model: a}\n", LLMGW_EINVAL,
     "t.yaml:6:5: ", "rule 'r' needs a 'tier'"},
    {"bad regex", BASE "rules:\n  - {name: r, tier: small, match: {regex: [ok, '(unclosed']}}\n",
     LLMGW_EINVAL, "t.yaml:6:48: ",
     "bad regex '(unclosed': missing closing parenthesis at offset 9"},
    {"bad header regex", BASE "rules:\n  - {name: r, tier: small, match: {header: {x-t: '[z-a]'}}}\n",
     LLMGW_EINVAL, "t.yaml:6:50: ", "bad regex '[z-a]': range out of order"},
    {"score without classifier", BASE "rules:\n  - {name: r, tier: small, match: {score: {min: 0.5}}}\n",
     LLMGW_EINVAL, "t.yaml:6:43: ", "rule 'r': a score condition needs the policy's 'classifier'"},
    {"score out of range", BASE WITH_CLS "rules:\n  - {name: r, tier: small, match: {score: {min: 1.5}}}\n",
     LLMGW_EINVAL, "t.yaml:7:49: ", "'min' must be between 0 and 1, got 1.5"},
    {"score range crossed",
     BASE WITH_CLS "rules:\n  - {name: r, tier: small, match: {score: {min: 0.7, max: 0.3}}}\n",
     LLMGW_EINVAL, "t.yaml:7:59: ", "score 'max' (0.3) is below 'min' (0.7)"},
    {"empty score", BASE WITH_CLS "rules:\n  - {name: r, tier: small, match: {score: {}}}\n",
     LLMGW_EINVAL, "t.yaml:7:43: ", "'score' needs 'min' or 'max'"},
    {"classifier unreadable", BASE "classifier: {weights: nope.weights}\n", LLMGW_EIO,
     "t.yaml:5:23: ", "nope.weights: No such file or directory"},
    {"classifier invalid", BASE "classifier: {weights: bad.weights}\n", LLMGW_EINVAL,
     "t.yaml:5:23: ", "classifier: "},
    {"classifier without weights", BASE "classifier: {}\n", LLMGW_EINVAL, "t.yaml:5:13: ",
     "'classifier' needs 'weights: FILE'"},
    {"repeated top-level key", BASE "default_tier: large\n", LLMGW_EINVAL, "t.yaml:5:1: ",
     "'default_tier' is given twice"},
    {"repeated nested key",
     "default_tier: a\ntiers:\n  a: {price: {input_per_1m: 1, input_per_1m: 2}}\n",
     LLMGW_EINVAL, "t.yaml:3:32: ", "'input_per_1m' is given twice"},
    {"repeated match key", BASE "rules:\n  - {name: r, tier: small, match: {model: a, model: b}}\n",
     LLMGW_EINVAL, "t.yaml:6:46: ", "'model' is given twice"},
};

static void validation_errors(void **state)
{
    (void)state;
    int failed = 0;
    for (size_t i = 0; i < sizeof k_errors / sizeof *k_errors; i++) {
        const error_case *c = &k_errors[i];
        router_policy *p = (router_policy *)1;
        util_err err = {0};
        int rc = parse(&p, c->yaml, &err);
        if (rc != c->code || strncmp(err.msg, c->where, strlen(c->where)) != 0 ||
            strstr(err.msg + strlen(c->where), c->says) == NULL) {
            print_error("case '%s': rc %d (want %d), message \"%s\" (want \"%s...%s\")\n",
                        c->what, rc, c->code, err.msg, c->where, c->says);
            failed++;
        }
        if (err.code != rc || p != NULL) {
            print_error("case '%s': err.code %d, policy %p\n", c->what, err.code, (void *)p);
            failed++;
        }
    }
    assert_int_equal(failed, 0);
}

static void load_from_file(void **state)
{
    (void)state;
    /* The classifier path resolves against the policy file's directory, not the cwd. */
    assert_int_equal(write_file(g_dir, "p.yaml", BASE WITH_CLS), 0);
    char path[256];
    snprintf(path, sizeof path, "%s/p.yaml", g_dir);
    router_policy *p = NULL;
    util_err err = {0};
    int rc = router_policy_load(&p, path, g_backends, 3, &err);
    if (rc != 0)
        print_error("%s\n", err.msg);
    assert_int_equal(rc, 0);
    assert_non_null(router_policy_classifier(p));
    router_policy_unref(p);

    /* Errors name the path as given. */
    assert_int_equal(write_file(g_dir, "p.yaml", BASE "rules: 3\n"), 0);
    p = NULL;
    assert_int_equal(router_policy_load(&p, path, g_backends, 3, &err), LLMGW_EINVAL);
    char want[300];
    snprintf(want, sizeof want, "%s:5:8: ", path);
    assert_prefix(err.msg, want);
    assert_null(p);

    snprintf(path, sizeof path, "%s/missing.yaml", g_dir);
    assert_int_equal(router_policy_load(&p, path, g_backends, 3, &err), LLMGW_EIO);
    assert_contains(err.msg, "missing.yaml");
}

/* policies/default.yaml with the test's weights standing in for router.weights: it validates
 * against the shipped daemon config's tiers and routes as its comments say. */
static void shipped_default_policy(void **state)
{
    (void)state;
#ifndef LLMGW_SOURCE_DIR
    skip();
#else
    FILE *f = fopen(LLMGW_SOURCE_DIR "/policies/default.yaml", "rb");
    assert_non_null(f);
    static char text[16384];
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = '\0';
    char src[256], dst[256];
    snprintf(src, sizeof src, "%s/w.weights", g_dir);
    snprintf(dst, sizeof dst, "%s/router.weights", g_dir);
    assert_int_equal(link(src, dst), 0);
    router_policy *p = NULL;
    util_err err = {0};
    int rc = router_policy_parse(&p, text, n, "default.yaml", g_dir, g_backends, 3, &err);
    unlink(dst);
    if (rc != 0)
        print_error("%s\n", err.msg);
    assert_int_equal(rc, 0);
    int small = router_policy_find_tier(p, "small"), large = router_policy_find_tier(p, "large");
    assert_int_equal(router_policy_default_tier(p), small);
    assert_int_equal(router_policy_reference_tier(p), large);
    assert_string_equal(router_policy_tier(p, small)->backend, "small");
    assert_string_equal(router_policy_tier(p, large)->backend, "large");
    assert_int_equal(router_policy_tier(p, small)->n_fallback, 1);
    assert_int_equal(router_policy_tier(p, small)->fallback[0], large);
    assert_true(router_policy_uses_score(p));
    assert_true(router_policy_routes_model(p, "auto"));
    assert_false(router_policy_routes_model(p, "text-embedding-3-small"));

    router_request q = {.model = "gpt-4o", .group = "dev", .text = "hi", .text_len = 2,
                        .score = -1};
    router_decision d;
    router_policy_route(p, &q, &d);
    assert_int_equal(d.tier, large);
    q.model = "auto";
    q.text = "my password is";
    q.text_len = strlen(q.text);
    router_policy_route(p, &q, &d);
    assert_int_equal(d.tier, small);
    assert_int_equal(d.cache, 0);
    q.text = "what is 2+2";
    q.text_len = strlen(q.text);
    router_policy_route(p, &q, &d);
    assert_true(d.needs_score);
    q.score = 0.9;
    router_policy_route(p, &q, &d);
    assert_int_equal(d.tier, large);
    assert_string_equal(d.rule, "hard");
    assert_double_near(d.cache_max_false_hit_rate, 0.002, 0);  /* stricter reuse */
    q.score = 0.1;
    router_policy_route(p, &q, &d);
    assert_int_equal(d.tier, small);
    assert_null(d.rule);
    router_policy_unref(p);

    /* The daemon config's tiers are small, large and remote: no others. */
    static const char *const two[] = {"small", "remote"};
    assert_int_equal(router_policy_parse(&p, text, n, "default.yaml", g_dir, two, 2, &err),
                     LLMGW_EINVAL);
    assert_contains(err.msg, "backend 'large'");
#endif
}

/* route_unfamiliar_to: the first score rule whose other conditions hold sends an unfamiliar
 * prompt to that tier whatever the score; familiar prompts route by score as before. */
static void route_unfamiliar(void **state)
{
    (void)state;
    static const char *const backends[] = {"small", "large", "remote"};
    const char *text =
        "version: 1\n"
        "default_tier: small\n"
        "classifier: {weights: w.weights}\n"
        "route_unfamiliar_to: remote\n"
        "tiers:\n"
        "  small: {backend: small}\n"
        "  large: {backend: large}\n"
        "  remote: {backend: remote}\n"
        "rules:\n"
        "  - {name: pinned, tier: large, match: {model: [big]}}\n"
        "  - name: hard\n"
        "    tier: large\n"
        "    match: {model: [auto], score: {min: 0.5}}\n"
        "    cache: {max_false_hit_rate: 0.002}\n";
    router_policy *p = NULL;
    util_err err = {0};
    int rc = router_policy_parse(&p, text, strlen(text), "u.yaml", g_dir, backends, 3, &err);
    if (rc != 0)
        print_error("%s\n", err.msg);
    assert_int_equal(rc, 0);
    int small = router_policy_find_tier(p, "small"), large = router_policy_find_tier(p, "large");
    int remote = router_policy_find_tier(p, "remote");
    router_request q = {.model = "auto", .text = "x", .text_len = 1, .score = 0.9};
    router_decision d;
    router_policy_route(p, &q, &d);
    assert_int_equal(d.tier, large);
    assert_false(d.unfamiliar);
    q.unfamiliar = true;
    router_policy_route(p, &q, &d);
    assert_int_equal(d.tier, remote);
    assert_true(d.unfamiliar);
    assert_string_equal(d.rule, "hard");
    assert_double_near(d.cache_max_false_hit_rate, 0.002, 0);  /* the rule's cache settings */
    q.score = 0.1;  /* whatever the score */
    router_policy_route(p, &q, &d);
    assert_int_equal(d.tier, remote);
    q.model = "big";  /* a rule before the score rule still wins */
    router_policy_route(p, &q, &d);
    assert_int_equal(d.tier, large);
    assert_false(d.unfamiliar);
    q.model = "other";  /* the score rule does not hold: the default, familiar or not */
    router_policy_route(p, &q, &d);
    assert_int_equal(d.tier, small);
    router_policy_unref(p);

    /* The classifier itself: a prompt like a training one is familiar, an orthogonal one not. */
    router_classifier *c = NULL;
    char path[256];
    snprintf(path, sizeof path, "%s/w.weights", g_dir);
    assert_int_equal(router_classifier_load(&c, path, &err), 0);
    const float near[4] = {0.8f, 0.6f, 0, 0}, far[4] = {0, 0, 0.6f, 0.8f};
    router_assessment a;
    router_classifier_assess(c, near, "x", 1, &a);
    assert_true(a.familiar);
    assert_double_near(a.familiarity, 0.8, 0.02);
    assert_double_near(a.part[0], 1.0, 1e-9);  /* the nearest vector's target */
    router_classifier_assess(c, far, "x", 1, &a);
    assert_false(a.familiar);
    router_classifier_assess(c, NULL, "x", 1, &a);  /* no embedding: cannot judge */
    assert_false(a.familiar);
    router_classifier_free(c);

    /* route_unfamiliar_to needs a classifier and a known tier. */
    const char *bad[] = {
        "version: 1\ndefault_tier: small\nroute_unfamiliar_to: small\n"
        "tiers: {small: {backend: small}}\n",
        "version: 1\ndefault_tier: small\nclassifier: {weights: w.weights}\n"
        "route_unfamiliar_to: nope\ntiers: {small: {backend: small}}\n"};
    const char *want[] = {"'route_unfamiliar_to' needs the policy's 'classifier'", "nope"};
    for (int i = 0; i < 2; i++) {
        p = NULL;
        assert_int_equal(router_policy_parse(&p, bad[i], strlen(bad[i]), "u.yaml", g_dir,
                                             backends, 3, &err), LLMGW_EINVAL);
        assert_null(p);
        assert_non_null(strstr(err.msg, want[i]));
    }
}

/* ---- routing --------------------------------------------------------------------------------- */

typedef struct headers {
    const char *names[4], *values[4];
} headers;

static const char *header_of(void *ctx, const char *name)
{
    const headers *h = ctx;
    for (int i = 0; i < 4 && h->names[i] != NULL; i++)
        if (strcasecmp(h->names[i], name) == 0)
            return h->values[i];
    return NULL;
}

static router_decision route(const router_policy *p, router_request q)
{
    router_decision d;
    memset(&d, 0x5a, sizeof d);
    router_policy_route(p, &q, &d);
    return d;
}

static router_request text_req(const char *text)
{
    return (router_request){.model = "gpt-4o-mini", .group = "dev", .text = text,
                            .text_len = text ? strlen(text) : 0, .score = 0.1};
}

static void route_conditions(void **state)
{
    (void)state;
    router_policy *p = parse_ok(k_example);
    int small = 0, large = 1, offsite = 2;
    router_decision d;

    /* Nothing matches: the default tier, cache settings untouched. */
    d = route(p, text_req("hello there"));
    assert_int_equal(d.tier, small);
    assert_null(d.rule);
    assert_false(d.needs_score);
    assert_int_equal(d.cache, -1);
    assert_true(d.cache_threshold < 0);

    /* model */
    router_request q = text_req("hello");
    q.model = "gpt-4o";
    d = route(p, q);
    assert_int_equal(d.tier, large);
    assert_string_equal(d.rule, "pinned-large");
    q.model = "GPT-4o";   /* exact names only */
    assert_null(route(p, q).rule);
    q.model = NULL;
    assert_null(route(p, q).rule);

    /* group */
    q = text_req("hello");
    q.group = "vip";
    assert_string_equal(route(p, q).rule, "vip-group");
    q.group = NULL;
    assert_null(route(p, q).rule);

    /* header, through the callback (regex against the value; a missing header fails) */
    headers h = {{"X-LLMGW-Tier"}, {"large"}};
    q = text_req("hello");
    q.header = header_of;
    q.header_ctx = &h;
    assert_string_equal(route(p, q).rule, "header-override");
    h.values[0] = "larger";   /* anchored pattern */
    assert_null(route(p, q).rule);
    h.names[0] = "x-other";
    assert_null(route(p, q).rule);
    q.header = NULL;
    assert_null(route(p, q).rule);

    /* token bounds, inclusive */
    q = text_req("hello");
    q.input_tokens = 2999;
    assert_null(route(p, q).rule);
    q.input_tokens = 3000;
    assert_string_equal(route(p, q).rule, "long-prompts");
    q.group = "batch";
    q.input_tokens = 9;
    assert_null(route(p, q).rule);
    q.input_tokens = 10;
    d = route(p, q);
    assert_int_equal(d.tier, offsite);
    assert_string_equal(d.rule, "offsite-mid");
    q.input_tokens = 20;
    assert_string_equal(route(p, q).rule, "offsite-mid");
    q.input_tokens = 21;
    assert_null(route(p, q).rule);

    /* regex and keywords (case-insensitive, Unicode-aware) on the last user message */
    assert_string_equal(route(p, text_req("look:\n```c\nint x;\n```")).rule, "code");
    assert_string_equal(route(p, text_req("def  parse(x): pass")).rule, "code");
    assert_null(route(p, text_req("undef parse(x)")).rule);   /* \b */
    assert_string_equal(route(p, text_req("got a SegFault today")).rule, "debugging");
    assert_string_equal(route(p, text_req("here is the Stack Trace:")).rule, "debugging");
    assert_string_equal(route(p, text_req("ÉCHEC: STACK TRACE")).rule, "debugging");
    assert_null(route(p, text_req("stack  trace")).rule);
    assert_null(route(p, text_req(NULL)).rule);
    /* text_len bounds the text: the keyword past it does not count */
    q = text_req("hello segfault");
    q.text_len = 6;
    assert_null(route(p, q).rule);
    /* invalid UTF-8 in the prompt is no error */
    assert_string_equal(route(p, text_req("\xff\xfe segfault \xc3")).rule, "debugging");

    /* cache settings of the matching rule */
    d = route(p, text_req("my PASSWORD is"));
    assert_int_equal(d.tier, small);
    assert_string_equal(d.rule, "no-cache-for-secrets");
    assert_int_equal(d.cache, 0);
    assert_true(d.cache_threshold < 0);
    router_policy_unref(p);
}

static void route_score(void **state)
{
    (void)state;
    router_policy *p = parse_ok(k_example);
    router_request q = text_req("explain monads");
    q.model = "auto";
    q.score = -1;
    router_decision d = route(p, q);
    assert_true(d.needs_score);
    assert_null(d.rule);

    /* Rules before the score rule still decide without a score. */
    q.group = "vip";
    d = route(p, q);
    assert_false(d.needs_score);
    assert_string_equal(d.rule, "vip-group");
    q.group = "dev";

    /* A score rule whose other conditions fail needs no score: later rules go on. */
    q.model = "gpt-4o-mini";
    q.text = "password?";
    q.text_len = strlen(q.text);
    d = route(p, q);
    assert_false(d.needs_score);
    assert_string_equal(d.rule, "no-cache-for-secrets");
    q.text = "explain monads";
    q.text_len = strlen(q.text);
    q.model = "auto";

    q.score = 0.62;   /* min is inclusive */
    d = route(p, q);
    assert_false(d.needs_score);
    assert_string_equal(d.rule, "hard");
    assert_int_equal(d.tier, 1);
    assert_int_equal(d.cache, -1);
    assert_double_near(d.cache_threshold, 0.99, 1e-12);
    q.score = 0.61;
    d = route(p, q);
    assert_null(d.rule);
    assert_int_equal(d.tier, 0);
    q.score = NAN;
    assert_null(route(p, q).rule);
    router_policy_unref(p);

    /* max and ranges: the first rule whose range holds wins. */
    p = parse_ok(BASE WITH_CLS
                 "rules:\n"
                 "  - {name: low, tier: small, match: {score: {max: 0.3}}}\n"
                 "  - {name: mid, tier: large, match: {score: {min: 0.3, max: 0.6}}}\n"
                 "  - {name: any, tier: small, match: {score: {min: 0}}}\n");
    q = text_req("x");
    q.score = 0.3;
    assert_string_equal(route(p, q).rule, "low");
    q.score = 0.31;
    assert_string_equal(route(p, q).rule, "mid");
    q.score = 0.6;
    assert_string_equal(route(p, q).rule, "mid");
    q.score = 1.0;
    assert_string_equal(route(p, q).rule, "any");
    router_policy_unref(p);
}

static void route_first_match_and_all_conditions(void **state)
{
    (void)state;
    router_policy *p = parse_ok(BASE
                                "rules:\n"
                                "  - name: both\n"
                                "    match: {model: [a, b], group: g, keywords: [kw]}\n"
                                "    tier: large\n"
                                "    cache: {enabled: true, threshold: 0.5, max_false_hit_rate: 0.002}\n"
                                "  - {name: model-a, tier: small, match: {model: a}}\n"
                                "  - {name: model-a-again, tier: large, match: {model: a}}\n"
                                "  - {name: catch-all, tier: large}\n");
    router_request q = {.model = "b", .group = "g", .text = "a KW here", .text_len = 9,
                        .score = -1};
    router_decision d = route(p, q);
    assert_string_equal(d.rule, "both");
    assert_int_equal(d.cache, 1);
    assert_double_near(d.cache_threshold, 0.5, 0);
    assert_double_near(d.cache_max_false_hit_rate, 0.002, 0);
    q.model = "a";
    q.group = "h";      /* one condition fails: the rule does not match */
    d = route(p, q);
    assert_string_equal(d.rule, "model-a");   /* first match wins */
    assert_int_equal(d.tier, 0);
    assert_int_equal(d.cache, -1);
    q.model = "b";
    q.group = "g";
    q.text = "no keyword";   /* keywords are a condition of their own */
    q.text_len = strlen(q.text);
    assert_string_equal(route(p, q).rule, "catch-all");
    q.model = "c";
    d = route(p, q);
    assert_string_equal(d.rule, "catch-all");   /* a rule without match matches all */
    assert_int_equal(d.tier, 1);
    assert_false(router_policy_uses_score(p));
    router_policy_unref(p);
}

static void route_regex_limits(void **state)
{
    (void)state;
    /* Catastrophic backtracking stops at the match limit and counts as a miss. */
    router_policy *p = parse_ok(BASE "rules:\n  - {name: slow, tier: large, match: {regex: '^(a+)+$'}}\n");
    char text[64];
    memset(text, 'a', 40);
    text[40] = 'b';
    text[41] = '\0';
    assert_null(route(p, text_req(text)).rule);
    text[40] = '\0';
    assert_string_equal(route(p, text_req(text)).rule, "slow");
    router_policy_unref(p);
}

typedef struct worker_arg {
    const router_policy *p;
    int bad;
} worker_arg;

static void *worker(void *arg)
{
    worker_arg *w = arg;
    for (int i = 0; i < 2000; i++) {
        router_decision d = route(w->p, text_req(i % 2 ? "a segfault" : "def f(x)"));
        if (d.rule == NULL || strcmp(d.rule, i % 2 ? "debugging" : "code") != 0)
            w->bad++;
        d = route(w->p, text_req("plain"));
        if (d.rule != NULL)
            w->bad++;
    }
    return NULL;
}

static void route_from_threads(void **state)
{
    (void)state;
    router_policy *p = parse_ok(k_example);
    pthread_t t[4];
    worker_arg a[4];
    for (int i = 0; i < 4; i++) {
        a[i] = (worker_arg){.p = router_policy_ref(p)};
        assert_int_equal(pthread_create(&t[i], NULL, worker, &a[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        assert_int_equal(pthread_join(t[i], NULL), 0);
        assert_int_equal(a[i].bad, 0);
        router_policy_unref((router_policy *)a[i].p);
    }
    router_policy_unref(p);
}

/* ---- the rest -------------------------------------------------------------------------------- */

static void refcounting(void **state)
{
    (void)state;
    router_policy *p = parse_ok(k_example);
    assert_ptr_equal(router_policy_ref(p), p);
    assert_ptr_equal(router_policy_ref(p), p);
    router_policy_unref(p);
    router_policy_unref(p);
    /* Still alive: one reference left (ASan reports a use after free otherwise). */
    assert_int_equal(router_policy_tier_count(p), 3);
    router_policy_unref(p);
    router_policy_unref(NULL);
}

static void routes_model(void **state)
{
    (void)state;
    router_policy *p = parse_ok(k_example);
    assert_true(router_policy_routes_model(p, "auto"));
    assert_true(router_policy_routes_model(p, "gpt-4o-mini"));
    assert_true(router_policy_routes_model(p, "gpt-4o"));
    assert_false(router_policy_routes_model(p, "text-embedding-3-small"));
    assert_false(router_policy_routes_model(p, "Auto"));
    assert_false(router_policy_routes_model(p, NULL));
    router_policy_unref(p);
    /* Names in a rule's match.model count too. */
    p = parse_ok(BASE "models: auto\nrules:\n  - {name: r, tier: large, match: {model: [pinned]}}\n");
    assert_true(router_policy_routes_model(p, "auto"));
    assert_true(router_policy_routes_model(p, "pinned"));
    assert_false(router_policy_routes_model(p, "small"));
    router_policy_unref(p);
}

/* The policy's cascade is the default; a rule's keys go over it, the rest inherited. */
static void route_cascade(void **state)
{
    (void)state;
    router_policy *p = parse_ok(BASE "cascade: {enabled: true, rule: chow, threshold: 0.4}\n"
                                "rules:\n"
                                "  - {name: hard, match: {keywords: [prove]}, tier: large,\n"
                                "     cascade: {rule: diff, margin: 0.2, hold: 4}}\n"
                                "  - {name: off, match: {keywords: [secret]}, tier: large,\n"
                                "     cascade: {enabled: false}}\n");
    router_decision d = route(p, text_req("hello"));
    assert_non_null(d.cascade);
    assert_int_equal(d.cascade->rule, ROUTER_DEFER_CHOW);
    assert_double_near(d.cascade->threshold, 0.4, 1e-12);
    assert_int_equal(d.cascade->window, 4);
    assert_int_equal(d.cascade->hold, 8);
    d = route(p, text_req("prove it"));
    assert_non_null(d.cascade);
    assert_int_equal(d.cascade->rule, ROUTER_DEFER_DIFF);
    assert_double_near(d.cascade->threshold, 0.4, 1e-12);   /* the policy's */
    assert_double_near(d.cascade->margin, 0.2, 1e-12);
    assert_int_equal(d.cascade->hold, 4);
    d = route(p, text_req("a secret"));
    assert_null(d.cascade);
    router_policy_unref(p);
    /* Off by default; a rule may turn it on. */
    p = parse_ok(BASE "rules:\n  - {name: r, match: {keywords: [x]}, tier: large,\n"
                 "     cascade: {enabled: true}}\n");
    assert_null(route(p, text_req("hello")).cascade);
    d = route(p, text_req("x"));
    assert_non_null(d.cascade);
    assert_double_near(d.cascade->threshold, 0.5, 1e-12);
    router_policy_unref(p);
}

static void tier_cost(void **state)
{
    (void)state;
    router_tier t = {.name = "small", .price_in = 0.15, .price_out = 0.60};
    assert_double_near(router_tier_cost(&t, 1000, 500), 0.00045, 1e-15);
    assert_double_near(router_tier_cost(&t, 0, 0), 0, 0);
    assert_double_near(router_tier_cost(&t, 1000000, 0), 0.15, 1e-15);
    assert_double_near(router_tier_cost(&t, 0, 1000000), 0.60, 1e-15);
    assert_double_near(router_tier_cost(&t, -5, 1000000), 0.60, 1e-15);   /* clamped */
    router_tier large = {.price_in = 2.5, .price_out = 10};
    assert_double_near(router_tier_cost(&large, 1000, 500), 0.0075, 1e-15);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(valid_policy),
        cmocka_unit_test(minimal_policy),
        cmocka_unit_test(validation_errors),
        cmocka_unit_test(load_from_file),
        cmocka_unit_test(shipped_default_policy),
        cmocka_unit_test(route_conditions),
        cmocka_unit_test(route_score),
        cmocka_unit_test(route_first_match_and_all_conditions),
        cmocka_unit_test(route_regex_limits),
        cmocka_unit_test(route_from_threads),
        cmocka_unit_test(refcounting),
        cmocka_unit_test(routes_model),
        cmocka_unit_test(route_cascade),
        cmocka_unit_test(tier_cost),
        cmocka_unit_test(route_unfamiliar),
    };
    return cmocka_run_group_tests_name("router/policy", tests, group_setup, group_teardown);
}
