/* tests/fuzz/fuzz_policy.c: router_policy_parse on arbitrary YAML, then routing with the input's
 * own bytes as the prompt. A failure must name the file with a line:column and leave no policy;
 * a success must hold together (tiers found by name, fallbacks and the default/reference tiers
 * in range, every decision a valid tier). The directory the policy resolves against holds a
 * valid weights file "w.weights", so score rules are reachable. */
#include "router/classifier.h"
#include "router/policy.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CHECK(c)                                                                                 \
    do {                                                                                         \
        if (!(c))                                                                                \
            __builtin_trap();                                                                    \
    } while (0)

static char g_dir[64];
static char g_weights[128];

static void cleanup(void)
{
    unlink(g_weights);
    rmdir(g_dir);
}

static void setup(void)
{
    snprintf(g_dir, sizeof g_dir, "/tmp/llmgw-fuzz-policy-XXXXXX");
    CHECK(mkdtemp(g_dir) != NULL);
    snprintf(g_weights, sizeof g_weights, "%s/w.weights", g_dir);
    /* A classifier over a 2-wide embedding with no kNN part (no second file). */
    static const double mean[2] = {0, 0}, std[2] = {1, 1}, weight[2] = {0.1, 0.2};
    router_model m = {.dim = 2, .ridge_mean = mean, .ridge_std = std, .ridge_weight = weight,
                      .combine_mean = {0, 0, 0}, .combine_std = {1, 1, 1}};
    for (int i = 0; i < ROUTER_QUANTILES; i++)
        m.quantiles[i] = -1 + 0.02 * i;
    router_classifier *c = NULL;
    util_err err = {0};
    CHECK(router_classifier_new(&c, &m, &err) == 0);
    CHECK(router_classifier_save(c, g_weights, NULL, NULL, &err) == 0);
    router_classifier_free(c);
    atexit(cleanup);
}

static const char *header_of(void *ctx, const char *name)
{
    (void)name;
    return ctx;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char *const backends[] = {"small", "large", "remote"};
    if (g_dir[0] == '\0')
        setup();
    /* A copy of exactly `size` bytes, so ASan sees any read past the text. */
    char *text = malloc(size ? size : 1);
    memcpy(text, data, size);
    router_policy *p = NULL;
    util_err err = {0};
    int rc = router_policy_parse(&p, text, size, "fuzz.yaml", g_dir, backends, 3, &err);
    if (rc != 0) {
        CHECK(rc == LLMGW_EINVAL || rc == LLMGW_EIO);   /* EIO: a weights file that is not there */
        CHECK(err.code == rc);
        CHECK(strncmp(err.msg, "fuzz.yaml:", 10) == 0);
        CHECK(p == NULL);
        free(text);
        return 0;
    }
    size_t n = router_policy_tier_count(p);
    CHECK(n >= 1);
    for (size_t i = 0; i < n; i++) {
        const router_tier *t = router_policy_tier(p, (int)i);
        CHECK(router_policy_find_tier(p, t->name) == (int)i);
        CHECK(t->backend != NULL);
        CHECK(t->price_in >= 0 && t->price_out >= 0 && t->context >= 0 && t->max_concurrent >= 0);
        for (size_t j = 0; j < t->n_fallback; j++)
            CHECK(t->fallback[j] >= 0 && (size_t)t->fallback[j] < n && t->fallback[j] != (int)i);
        CHECK(router_tier_cost(t, 1000, 1000) >= 0);
    }
    CHECK((size_t)router_policy_default_tier(p) < n);
    CHECK((size_t)router_policy_reference_tier(p) < n);
    CHECK(!router_policy_uses_score(p) || router_policy_classifier(p) != NULL);

    router_policy *held = router_policy_ref(p);
    const double scores[] = {-1, 0, 0.5, 1};
    for (int s = 0; s < 8; s++) {
        router_request q = {.model = "auto", .group = "dev", .header = header_of,
                            .header_ctx = (void *)"large", .input_tokens = (long)size * (s + 1),
                            .text = text, .text_len = size, .score = scores[s % 4],
                            .unfamiliar = s >= 4};
        router_decision d;
        router_policy_route(p, &q, &d);
        CHECK(d.needs_score ? scores[s % 4] < 0 : (d.tier >= 0 && (size_t)d.tier < n));
        CHECK(!d.unfamiliar || (q.unfamiliar && d.rule != NULL));
        CHECK(d.cache >= -1 && d.cache <= 1);
        q.model = NULL;
        q.group = NULL;
        q.header = NULL;
        q.text = NULL;
        router_policy_route(p, &q, &d);
    }
    (void)router_policy_routes_model(p, "auto");
    router_policy_unref(held);
    router_policy_unref(p);
    free(text);
    return 0;
}
