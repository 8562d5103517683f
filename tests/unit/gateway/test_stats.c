/* tests/unit/gateway/test_stats.c: the stats object (GET /v1/llmgw/stats) from a registry filled
 * by hand: totals and per-tier sums filtered by label, errors as statuses of 500 and up, savings
 * by reason, the cache hit rate (null before any lookup), per-tier latency percentiles equal to
 * Prometheus' histogram_quantile on the same buckets, the engine block only with a KV pool, and
 * the history ring (its order, and the oldest sample dropped past GW_STATS_HISTORY). */
#include "gateway/stats.h"

#include <stdlib.h>

#include "tests/unit/unit.h"

static gw_metrics *registry(void)
{
    gw_metrics *m = gw_metrics_new();
    static const struct { const char *name; gw_metric_type t; } fam[] = {
        {"llmgw_requests_total", GW_METRIC_COUNTER},
        {"llmgw_in_flight_requests", GW_METRIC_GAUGE},
        {"llmgw_fallbacks_total", GW_METRIC_COUNTER},
        {"llmgw_upstream_errors_total", GW_METRIC_COUNTER},
        {"llmgw_cost_usd_total", GW_METRIC_COUNTER},
        {"llmgw_saved_usd_total", GW_METRIC_COUNTER},
        {"llmgw_tokens_total", GW_METRIC_COUNTER},
        {"llmgw_cache_lookups_total", GW_METRIC_COUNTER},
        {"llmgw_cache_hits_total", GW_METRIC_COUNTER},
        {"llmgw_cache_entries", GW_METRIC_GAUGE},
        {"llmgw_cache_bytes", GW_METRIC_GAUGE},
        {"llmgw_tier_request_duration_seconds", GW_METRIC_HISTOGRAM},
        {"llmgw_kv_pages", GW_METRIC_GAUGE},
        {"llmgw_engine_draft_tokens_total", GW_METRIC_COUNTER},
        {"llmgw_engine_draft_accepted_total", GW_METRIC_COUNTER},
    };
    for (size_t i = 0; i < sizeof fam / sizeof fam[0]; i++)
        gw_metrics_declare(m, fam[i].name, fam[i].t, "test");
    return m;
}

static double num(const cJSON *o, const char *path)
{
    char buf[128];
    snprintf(buf, sizeof buf, "%s", path);
    const cJSON *it = o;
    for (char *save = NULL, *k = strtok_r(buf, ".", &save); k != NULL;
         k = strtok_r(NULL, ".", &save))
        it = cJSON_GetObjectItemCaseSensitive(it, k);
    assert_non_null(it);
    assert_true(cJSON_IsNumber(it));
    return it->valuedouble;
}

static const cJSON *tier(const cJSON *o, const char *name)
{
    const cJSON *t;
    cJSON_ArrayForEach(t, cJSON_GetObjectItemCaseSensitive(o, "tiers"))
        if (!strcmp(cJSON_GetObjectItemCaseSensitive(t, "name")->valuestring, name))
            return t;
    fail_msg("no tier %s", name);
    return NULL;
}

static void totals_tiers_and_savings(void **state)
{
    (void)state;
    gw_metrics *m = registry();
    gw_metrics_add(m, "llmgw_requests_total", "endpoint=\"chat\",status=\"200\",tier=\"small\"", 7);
    gw_metrics_add(m, "llmgw_requests_total", "endpoint=\"chat\",status=\"502\",tier=\"big\"", 2);
    gw_metrics_add(m, "llmgw_requests_total", "endpoint=\"chat\",status=\"200\",tier=\"big\"", 3);
    gw_metrics_add(m, "llmgw_requests_total", "endpoint=\"chat\",status=\"400\",tier=\"\"", 1);
    gw_metrics_add(m, "llmgw_requests_total", "endpoint=\"metrics\",status=\"200\",tier=\"\"", 5);
    gw_metrics_set(m, "llmgw_in_flight_requests", NULL, 2);
    gw_metrics_add(m, "llmgw_fallbacks_total", "from=\"big\",to=\"small\"", 1);
    gw_metrics_add(m, "llmgw_cost_usd_total", "tier=\"small\"", 0.25);
    gw_metrics_add(m, "llmgw_cost_usd_total", "tier=\"big\"", 1.5);
    gw_metrics_add(m, "llmgw_saved_usd_total", "by=\"cache\"", 0.5);
    gw_metrics_add(m, "llmgw_saved_usd_total", "by=\"routing\"", 2);
    gw_metrics_add(m, "llmgw_tokens_total", "tier=\"small\",kind=\"prompt\"", 100);
    gw_metrics_add(m, "llmgw_tokens_total", "tier=\"small\",kind=\"completion\"", 40);
    gw_metrics_add(m, "llmgw_tokens_total", "tier=\"big\",kind=\"completion\"", 9);
    const char *names[] = {"small", "big", "idle"};
    gw_stats *s = gw_stats_new();
    cJSON *o = gw_stats_json(s, m, names, 3, 1000.5, 900);
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(o, "object")->valuestring, "llmgw.stats");
    assert_double_near(num(o, "now"), 1000.5, 0);
    assert_double_near(num(o, "totals.requests"), 13, 0);   /* not the 5 of /metrics */
    assert_double_near(num(o, "totals.errors"), 2, 0);
    assert_double_near(num(o, "totals.in_flight"), 2, 0);
    assert_double_near(num(o, "totals.fallbacks"), 1, 0);
    assert_double_near(num(o, "totals.spent_usd"), 1.75, 1e-12);
    assert_double_near(num(o, "totals.saved_usd"), 2.5, 1e-12);
    assert_double_near(num(o, "totals.tokens_prompt"), 100, 0);
    assert_double_near(num(o, "totals.tokens_completion"), 49, 0);
    assert_double_near(num(o, "saved_usd.cache"), 0.5, 0);
    assert_double_near(num(o, "saved_usd.routing"), 2, 0);
    assert_true(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(
        cJSON_GetObjectItemCaseSensitive(o, "cache"), "hit_rate")));
    assert_true(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(o, "engine")));
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(o, "tiers")), 3);
    const cJSON *big = tier(o, "big"), *small = tier(o, "small"), *idle = tier(o, "idle");
    assert_double_near(num(big, "requests"), 5, 0);
    assert_double_near(num(big, "errors"), 2, 0);
    assert_double_near(num(big, "spent_usd"), 1.5, 0);
    assert_double_near(num(big, "tokens_completion"), 9, 0);
    assert_double_near(num(big, "fallbacks_from"), 1, 0);
    assert_double_near(num(small, "requests"), 7, 0);
    assert_double_near(num(small, "errors"), 0, 0);
    assert_double_near(num(small, "tokens_prompt"), 100, 0);
    assert_double_near(num(idle, "requests"), 0, 0);
    assert_true(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(idle, "latency_seconds")));
    char *text = cJSON_PrintUnformatted(o);
    assert_non_null(text);   /* valid JSON out */
    free(text);
    cJSON_Delete(o);
    gw_stats_free(s);
    gw_stats_free(NULL);
    gw_metrics_free(m);
}

static void latency_cache_engine(void **state)
{
    (void)state;
    gw_metrics *m = registry();
    /* 100 answers of 1 ms .. 100 ms on tier a */
    for (int i = 1; i <= 100; i++)
        gw_metrics_observe(m, "llmgw_tier_request_duration_seconds", "tier=\"a\"", i / 1000.0);
    gw_metrics_add(m, "llmgw_cache_lookups_total", "kind=\"chat\"", 8);
    gw_metrics_add(m, "llmgw_cache_hits_total", "kind=\"chat\"", 2);
    gw_metrics_set(m, "llmgw_kv_pages", "state=\"total\"", 1024);
    gw_metrics_set(m, "llmgw_kv_pages", "state=\"used\"", 100);
    const char *names[] = {"a"};
    gw_stats *s = gw_stats_new();
    cJSON *o = gw_stats_json(s, m, names, 1, 10, 0);
    assert_double_near(num(o, "cache.hit_rate"), 0.25, 1e-12);
    assert_double_near(num(o, "engine.kv_pages_total"), 1024, 0);
    assert_double_near(num(o, "engine.kv_pages_used"), 100, 0);
    const cJSON *a = tier(o, "a");
    /* histogram_quantile on buckets ..0.05 (50 values), 0.1 (100): p50 = 0.05 (the rank lands
     * on the bucket's top), p95 and p99 interpolate inside (0.05, 0.1] */
    assert_double_near(num(a, "latency_seconds.p50"), 0.05, 1e-12);
    assert_double_near(num(a, "latency_seconds.p95"), 0.05 + 0.05 * 45 / 50, 1e-12);
    assert_double_near(num(a, "latency_seconds.p99"), 0.05 + 0.05 * 49 / 50, 1e-12);
    assert_double_near(num(a, "latency_seconds.mean"), 0.0505, 1e-9);
    cJSON_Delete(o);
    gw_stats_free(s);
    gw_metrics_free(m);
}

static void quantile_edges(void **state)
{
    (void)state;
    const double b[] = {1, 2, 4};
    const unsigned long long c[] = {0, 10, 10};
    assert_double_near(gw_stats_quantile(0.5, b, c, 3, 0), -1, 0);     /* no data */
    assert_double_near(gw_stats_quantile(0.5, b, c, 3, 10), 1.5, 1e-12);
    assert_double_near(gw_stats_quantile(0.5, b, c, 3, 20), 2, 1e-12);
    assert_double_near(gw_stats_quantile(0.9, b, c, 3, 20), 4, 0);      /* beyond the last bound */
}

static void history_ring(void **state)
{
    (void)state;
    gw_metrics *m = registry();
    gw_stats *s = gw_stats_new();
    for (int i = 0; i < GW_STATS_HISTORY + 5; i++) {
        gw_metrics_add(m, "llmgw_cost_usd_total", "tier=\"x\"", 1);
        gw_stats_sample(s, m, 100.0 + i);
    }
    const char *names[] = {"x"};
    cJSON *o = gw_stats_json(s, m, names, 1, 1000, 0);
    const cJSON *h = cJSON_GetObjectItemCaseSensitive(o, "history");
    assert_int_equal(cJSON_GetArraySize(h), GW_STATS_HISTORY);
    assert_double_near(num(cJSON_GetArrayItem(h, 0), "t"), 105, 0);   /* the 5 oldest dropped */
    assert_double_near(num(cJSON_GetArrayItem(h, 0), "spent_usd"), 6, 0);
    assert_double_near(num(cJSON_GetArrayItem(h, GW_STATS_HISTORY - 1), "t"),
                       100.0 + GW_STATS_HISTORY + 4, 0);
    cJSON_Delete(o);
    gw_stats_free(s);
    gw_metrics_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(totals_tiers_and_savings),
        cmocka_unit_test(latency_cache_engine),
        cmocka_unit_test(quantile_edges),
        cmocka_unit_test(history_ring),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
