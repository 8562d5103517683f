/* tests/unit/gateway/test_route.c: routing decisions alone (gateway/route.c with the real
 * router/policy.c): one tier vocabulary whether a policy file routes the model or the config's
 * implicit policy does, the fallback cursor over a chain (the tier answering now is skipped,
 * each tier tried once), max_concurrent handing requests down the chain and the slot moving
 * with a fallback, and the decision's headers as an output filter. */
#include "gateway/route.h"

#include "router/policy.h"

#include "tests/unit/unit.h"
#include "tests/unit/gateway/fake.h"

#include <unistd.h>

static char g_policy[64];

static const char k_policy[] =
    "version: 1\n"
    "models: [auto]\n"
    "default_tier: cheap\n"
    "reference_tier: big\n"
    "tiers:\n"
    "  cheap: {backend: a, price: {input_per_1m: 1, output_per_1m: 2}, max_concurrent: 1,\n"
    "          fallback: [alt, cheap2, big]}\n"
    "  cheap2: {backend: a}\n"
    "  alt: {backend: b, max_concurrent: 1}\n"
    "  big: {backend: c, price: {input_per_1m: 10, output_per_1m: 20}}\n"
    "rules:\n"
    "  - {name: pinned, match: {header: {x-tier: '^big$'}}, tier: big, cache: {enabled: false}}\n";

static int setup(void **state)
{
    static fake_srv f;
    fake_write_file(g_policy, sizeof g_policy, "route", k_policy);
    char cfg[1024];
    snprintf(cfg, sizeof cfg,
             "policy: %s\n"
             "tiers:\n"
             "  - {name: a, base_url: 'http://127.0.0.1:9', fallback: b, aliases: [a-alias]}\n"
             "  - {name: b, base_url: 'http://127.0.0.1:9', fallback: c}\n"
             "  - {name: c, base_url: 'http://127.0.0.1:9'}\n", g_policy);
    fake_srv_init(&f, cfg);
    f.release = gw_route_release;
    gw_router_declare_metrics(f.s.metrics);
    util_err err = {0};
    assert_int_equal(gw_router_new(&f.s.router, &f.s, &err), 0);
    *state = &f;
    return 0;
}

static int teardown(void **state)
{
    fake_srv *f = *state;
    gw_router_free(f->s.router);
    fake_srv_deinit(f);
    unlink(g_policy);
    return 0;
}

static gw_req *chat(fake_srv *f, rec *x, const char *model)
{
    gw_req *r = fake_req(f, x, "req_r");
    char body[256];
    snprintf(body, sizeof body, "{\"model\":\"%s\",\"messages\":[{\"role\":\"user\","
             "\"content\":\"hi\"}]}", model);
    fake_parse(r, GW_EP_CHAT, body);
    return r;
}

/* No policy routes the name: the config tier it names, its config fallback as the chain. */
static void implicit_policy_by_name_and_alias(void **state)
{
    fake_srv *f = *state;
    rec x = {0};
    gw_req *r = chat(f, &x, "a-alias");
    assert_int_equal(gw_route_begin(r), GW_ROUTE_OK);
    assert_int_equal(r->tier, 0);
    assert_string_equal(gw_route_reason(r), "model");
    assert_int_equal(gw_route_cache_rule(r), -1);
    assert_true(gw_route_has_fallback(r));
    assert_int_equal(gw_route_fallback(r), 1);     /* a's fallback: b */
    assert_false(gw_route_has_fallback(r));        /* one hop: b's own fallback is not a's */
    assert_int_equal(gw_route_fallback(r), -1);
    assert_int_equal(r->tier, 1);
    gw_reply_json(r, 200, cJSON_CreateObject());
    char v[64];
    assert_string_equal(rec_find(&x, "x-llmgw-route-reason", v, sizeof v), "model");
    assert_null(rec_find(&x, "x-llmgw-cost-usd", v, sizeof v));   /* no prices: no costs */
    assert_int_equal(f->done, 1);
}

static void unknown_model(void **state)
{
    fake_srv *f = *state;
    rec x = {0};
    gw_req *r = chat(f, &x, "nope");
    assert_int_equal(gw_route_begin(r), GW_ROUTE_UNKNOWN_MODEL);
    assert_null(gw_route_reason(r));
    gw_reply_abandon(r);
}

/* The chain cheap → [alt, cheap2, big]: cheap2 has the same backend as cheap, so it is skipped
 * while a answers; each other tier comes once, in order, then the cursor is exhausted. */
static void fallback_cursor_walks_chain_once(void **state)
{
    fake_srv *f = *state;
    rec x = {0};
    gw_req *r = chat(f, &x, "auto");
    assert_int_equal(gw_route_begin(r), GW_ROUTE_OK);
    assert_int_equal(r->tier, 0);
    assert_string_equal(gw_route_reason(r), "default");
    assert_int_equal(gw_route_fallback(r), 1);     /* alt → b */
    assert_int_equal(gw_route_fallback(r), 0);     /* cheap2 → a: b answers now, a differs */
    assert_true(gw_route_has_fallback(r));
    assert_int_equal(gw_route_fallback(r), 2);     /* big → c */
    assert_false(gw_route_has_fallback(r));
    assert_int_equal(gw_route_fallback(r), -1);
    assert_string_equal(gw_route_first_name(r), "cheap");
    gw_reply_abandon(r);
}

static void rule_reads_headers_and_cache_setting(void **state)
{
    fake_srv *f = *state;
    rec x = {.in_headers = {{"X-Tier", "big"}}};
    gw_req *r = chat(f, &x, "auto");
    assert_int_equal(gw_route_begin(r), GW_ROUTE_OK);
    assert_int_equal(r->tier, 2);
    assert_string_equal(gw_route_reason(r), "rule=pinned");
    assert_int_equal(gw_route_cache_rule(r), 0);
    assert_false(gw_route_has_fallback(r));
    r->prompt_tokens = 1000000;
    r->completion_tokens = 0;
    gw_reply_json(r, 200, cJSON_CreateObject());
    char v[64];
    assert_string_equal(rec_find(&x, "x-llmgw-cost-usd", v, sizeof v), "10.00000000");
    assert_string_equal(rec_find(&x, "x-llmgw-saved-usd", v, sizeof v), "0.00000000");
    assert_double_near(fake_metric(f, "llmgw_cost_usd_total{tier=\"big\"} "), 10, 1e-9);
}

/* max_concurrent 1 on cheap and on alt: the first holds a, the second goes down to b, the
 * third finds both full and the rest of the chain (cheap2 is a again, big is c). */
static void admit_hands_down_the_chain(void **state)
{
    fake_srv *f = *state;
    rec x1 = {0}, x2 = {0}, x3 = {0}, x4 = {0};
    gw_req *r1 = chat(f, &x1, "auto"), *r2 = chat(f, &x2, "auto"), *r3 = chat(f, &x3, "auto");
    gw_route_begin(r1);
    gw_route_begin(r2);
    gw_route_begin(r3);
    assert_true(gw_route_admit(r1));
    assert_int_equal(r1->tier, 0);
    assert_true(gw_route_admit(r2));
    assert_int_equal(r2->tier, 1);
    assert_contains(gw_route_reason(r2), "(fallback: cheap full)");
    assert_true(gw_route_admit(r3));   /* cheap2 has no limit of its own: backend a again */
    assert_int_equal(r3->tier, 0);
    assert_double_near(fake_metric(f, "llmgw_tier_over_capacity_total{tier=\"cheap\"} "), 2, 0);
    assert_double_near(fake_metric(f, "llmgw_tier_over_capacity_total{tier=\"alt\"} "), 1, 0);
    /* r1 ends: its slot on a goes back; r2's slot moves with its fallback from b to a. */
    gw_reply_abandon(r1);
    assert_int_equal(gw_route_fallback(r2), 0);
    gw_reply_abandon(r2);
    gw_reply_abandon(r3);
    gw_req *r4 = chat(f, &x4, "auto");
    gw_route_begin(r4);
    assert_true(gw_route_admit(r4));
    assert_int_equal(r4->tier, 0);     /* every slot came back */
    gw_reply_abandon(r4);
}

static void describe_for_dry_run(void **state)
{
    fake_srv *f = *state;
    rec x = {0};
    gw_req *r = chat(f, &x, "auto");
    gw_route_begin(r);
    cJSON *o = cJSON_CreateObject();
    gw_route_describe(r, o);
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(o, "tier")->valuestring, "cheap");
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(o, "backend")->valuestring, "a");
    assert_true(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(o, "rule")));
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(o, "kind")->valuestring, "upstream");
    assert_true(cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(o, "input_tokens_estimate")));
    assert_true(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(o, "score")));
    cJSON_Delete(o);
    gw_reply_abandon(r);
}

static void implicit_policy_shape(void **state)
{
    (void)state;
    const char *names[] = {"x", "y", "z"};
    int fb[] = {2, -1, 2};   /* z's fallback to itself is no fallback */
    router_policy *p = router_policy_implicit(names, fb, 3);
    assert_true(router_policy_is_implicit(p));
    assert_int_equal(router_policy_tier_count(p), 3);
    assert_int_equal(router_policy_tier(p, 0)->n_fallback, 1);
    assert_int_equal(router_policy_tier(p, 0)->fallback[0], 2);
    assert_int_equal(router_policy_tier(p, 1)->n_fallback, 0);
    assert_int_equal(router_policy_tier(p, 2)->n_fallback, 0);
    assert_string_equal(router_policy_tier(p, 1)->backend, "y");
    assert_false(router_policy_routes_model(p, "x"));
    router_policy_unref(p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(implicit_policy_by_name_and_alias, setup, teardown),
        cmocka_unit_test_setup_teardown(unknown_model, setup, teardown),
        cmocka_unit_test_setup_teardown(fallback_cursor_walks_chain_once, setup, teardown),
        cmocka_unit_test_setup_teardown(rule_reads_headers_and_cache_setting, setup, teardown),
        cmocka_unit_test_setup_teardown(admit_hands_down_the_chain, setup, teardown),
        cmocka_unit_test_setup_teardown(describe_for_dry_run, setup, teardown),
        cmocka_unit_test(implicit_policy_shape),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
