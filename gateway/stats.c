/* gateway/stats.c: the stats object from the metrics registry (gateway/stats.h). */
#include "gateway/stats.h"

#include "common/arena.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct sample {
    double t, spent, saved, requests;
} sample;

struct gw_stats {
    sample ring[GW_STATS_HISTORY];
    int first, n;
};

gw_stats *gw_stats_new(void)
{
    return util_xcalloc(1, sizeof(gw_stats));
}

void gw_stats_free(gw_stats *s)
{
    free(s);
}

/* The value of key in a rendered label set (`a="x",b="y"`) into buf; false when absent. */
static bool label(const char *labels, const char *key, char *buf, size_t cap)
{
    size_t kl = strlen(key);
    for (const char *p = labels; p != NULL && *p != '\0';) {
        const char *q = strchr(p, '"');
        if (q == NULL || q[1] == '\0')
            return false;
        const char *end = strchr(q + 1, '"');
        if (end == NULL)
            return false;
        if ((size_t)(q - p) == kl + 1 && !strncmp(p, key, kl) && p[kl] == '=') {
            snprintf(buf, cap, "%.*s", (int)(end - q - 1), q + 1);
            return true;
        }
        p = end[1] == ',' ? end + 2 : NULL;
    }
    return false;
}

/* ---- sums over a family's series, filtered by their labels ---------------------------------- */

/* Which series of a family to add up: every one, or those of tier `tier`, those whose `key` is
 * `want` (with status_min: whose `key`, a status, is at least that), and with api_only those
 * of the API's endpoints (api_endpoint). */
typedef struct sum_q {
    const char *tier, *key, *want;
    int status_min;
    bool api_only;
    double sum;
} sum_q;

/* Requests to the API (chat, completions, embeddings, models, route...), not the operator's own
 * (health, metrics, stats and the dashboard page, which poll). */
static bool api_endpoint(const char *labels)
{
    static const char *const ops[] = {"healthz", "readyz", "metrics", "stats", "dashboard"};
    char v[64];
    if (!label(labels, "endpoint", v, sizeof v))
        return true;
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++)
        if (!strcmp(v, ops[i]))
            return false;
    return true;
}

static void sum_each(void *ctx, const gw_metric_sample *s)
{
    sum_q *q = ctx;
    char v[128];
    if (q->api_only && !api_endpoint(s->labels))
        return;
    if (q->tier != NULL && (!label(s->labels, "tier", v, sizeof v) || strcmp(v, q->tier) != 0))
        return;
    if (q->key != NULL &&
        (!label(s->labels, q->key, v, sizeof v) ||
         (q->status_min > 0 ? atoi(v) < q->status_min : strcmp(v, q->want) != 0)))
        return;
    q->sum += s->value;
}

static double sum(gw_metrics *m, const char *name, sum_q q)
{
    gw_metrics_each(m, name, sum_each, &q);
    return q.sum;
}

/* ---- the object ------------------------------------------------------------------------------ */

typedef struct saved_q {
    cJSON *by;
    double total;
} saved_q;

static void saved_each(void *ctx, const gw_metric_sample *s)
{
    saved_q *q = ctx;
    char by[64];
    if (!label(s->labels, "by", by, sizeof by))
        snprintf(by, sizeof by, "other");
    cJSON *it = cJSON_GetObjectItemCaseSensitive(q->by, by);
    if (it != NULL)
        cJSON_SetNumberValue(it, it->valuedouble + s->value);
    else
        cJSON_AddNumberToObject(q->by, by, s->value);
    q->total += s->value;
}

typedef struct lat_q {
    const char *tier;
    cJSON *into;
} lat_q;

static void latency_each(void *ctx, const gw_metric_sample *s)
{
    lat_q *q = ctx;
    char v[128];
    if (!label(s->labels, "tier", v, sizeof v) || strcmp(v, q->tier) != 0 || s->count == 0)
        return;
    static const struct { const char *name; double q; } qs[] = {
        {"p50", 0.5}, {"p95", 0.95}, {"p99", 0.99}};
    cJSON *l = cJSON_AddObjectToObject(q->into, "latency_seconds");
    for (size_t i = 0; i < sizeof qs / sizeof qs[0]; i++)
        cJSON_AddNumberToObject(l, qs[i].name, gw_stats_quantile(qs[i].q, s->bounds, s->buckets,
                                                                 s->n_buckets, s->count));
    cJSON_AddNumberToObject(l, "mean", s->value / (double)s->count);
}

static double totals_spent(gw_metrics *m)
{
    return sum(m, "llmgw_cost_usd_total", (sum_q){0});
}

static double api_requests(gw_metrics *m)
{
    return sum(m, "llmgw_requests_total", (sum_q){.api_only = true});
}

void gw_stats_sample(gw_stats *s, gw_metrics *m, double now)
{
    sample x = {.t = now, .spent = totals_spent(m),
                .saved = sum(m, "llmgw_saved_usd_total", (sum_q){0}),
                .requests = api_requests(m)};
    if (s->n < GW_STATS_HISTORY) {
        s->ring[(s->first + s->n++) % GW_STATS_HISTORY] = x;
    } else {
        s->ring[s->first] = x;
        s->first = (s->first + 1) % GW_STATS_HISTORY;
    }
}

cJSON *gw_stats_json(const gw_stats *s, gw_metrics *m, const char *const *names, size_t n_tiers,
                     double now, double started)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "object", "llmgw.stats");
    cJSON_AddNumberToObject(o, "now", now);
    cJSON_AddNumberToObject(o, "started_at", started);

    saved_q sq = {.by = cJSON_CreateObject()};
    gw_metrics_each(m, "llmgw_saved_usd_total", saved_each, &sq);
    cJSON *t = cJSON_AddObjectToObject(o, "totals");
    cJSON_AddNumberToObject(t, "requests", api_requests(m));
    cJSON_AddNumberToObject(t, "errors", sum(m, "llmgw_requests_total",
                                             (sum_q){.key = "status", .status_min = 500,
                                                     .api_only = true}));
    cJSON_AddNumberToObject(t, "in_flight", sum(m, "llmgw_in_flight_requests", (sum_q){0}));
    cJSON_AddNumberToObject(t, "fallbacks", sum(m, "llmgw_fallbacks_total", (sum_q){0}));
    cJSON_AddNumberToObject(t, "upstream_errors",
                            sum(m, "llmgw_upstream_errors_total", (sum_q){0}));
    cJSON_AddNumberToObject(t, "spent_usd", totals_spent(m));
    cJSON_AddNumberToObject(t, "saved_usd", sq.total);
    cJSON_AddNumberToObject(t, "tokens_prompt",
                            sum(m, "llmgw_tokens_total", (sum_q){.key = "kind", .want = "prompt"}));
    cJSON_AddNumberToObject(t, "tokens_completion",
                            sum(m, "llmgw_tokens_total",
                                (sum_q){.key = "kind", .want = "completion"}));
    cJSON_AddItemToObject(o, "saved_usd", sq.by);

    double lookups = sum(m, "llmgw_cache_lookups_total", (sum_q){0});
    double hits = sum(m, "llmgw_cache_hits_total", (sum_q){0});
    cJSON *c = cJSON_AddObjectToObject(o, "cache");
    cJSON_AddNumberToObject(c, "lookups", lookups);
    cJSON_AddNumberToObject(c, "hits", hits);
    if (lookups > 0)
        cJSON_AddNumberToObject(c, "hit_rate", hits / lookups);
    else
        cJSON_AddNullToObject(c, "hit_rate");
    cJSON_AddNumberToObject(c, "entries", sum(m, "llmgw_cache_entries", (sum_q){0}));
    cJSON_AddNumberToObject(c, "bytes", sum(m, "llmgw_cache_bytes", (sum_q){0}));

    cJSON *tiers = cJSON_AddArrayToObject(o, "tiers");
    for (size_t i = 0; i < n_tiers; i++) {
        const char *n = names[i];
        cJSON *x = cJSON_CreateObject();
        cJSON_AddStringToObject(x, "name", n);
        cJSON_AddNumberToObject(x, "requests",
                                sum(m, "llmgw_requests_total", (sum_q){.tier = n}));
        cJSON_AddNumberToObject(x, "errors",
                                sum(m, "llmgw_requests_total",
                                    (sum_q){.tier = n, .key = "status", .status_min = 500}));
        cJSON_AddNumberToObject(x, "spent_usd",
                                sum(m, "llmgw_cost_usd_total", (sum_q){.tier = n}));
        cJSON_AddNumberToObject(x, "tokens_prompt",
                                sum(m, "llmgw_tokens_total",
                                    (sum_q){.tier = n, .key = "kind", .want = "prompt"}));
        cJSON_AddNumberToObject(x, "tokens_completion",
                                sum(m, "llmgw_tokens_total",
                                    (sum_q){.tier = n, .key = "kind", .want = "completion"}));
        cJSON_AddNumberToObject(x, "fallbacks_from",
                                sum(m, "llmgw_fallbacks_total", (sum_q){.key = "from", .want = n}));
        lat_q lq = {.tier = n, .into = x};
        gw_metrics_each(m, "llmgw_tier_request_duration_seconds", latency_each, &lq);
        if (cJSON_GetObjectItemCaseSensitive(x, "latency_seconds") == NULL)
            cJSON_AddNullToObject(x, "latency_seconds");
        cJSON_AddItemToArray(tiers, x);
    }

    double kv_total = sum(m, "llmgw_kv_pages", (sum_q){.key = "state", .want = "total"});
    if (kv_total > 0) {
        cJSON *e = cJSON_AddObjectToObject(o, "engine");
        cJSON_AddNumberToObject(e, "kv_pages_total", kv_total);
        cJSON_AddNumberToObject(e, "kv_pages_used",
                                sum(m, "llmgw_kv_pages", (sum_q){.key = "state", .want = "used"}));
        cJSON_AddNumberToObject(e, "draft_tokens",
                                sum(m, "llmgw_engine_draft_tokens_total", (sum_q){0}));
        cJSON_AddNumberToObject(e, "draft_accepted",
                                sum(m, "llmgw_engine_draft_accepted_total", (sum_q){0}));
    } else {
        cJSON_AddNullToObject(o, "engine");
    }

    cJSON *h = cJSON_AddArrayToObject(o, "history");
    for (int i = 0; i < s->n; i++) {
        const sample *x = &s->ring[(s->first + i) % GW_STATS_HISTORY];
        cJSON *p = cJSON_CreateObject();
        cJSON_AddNumberToObject(p, "t", x->t);
        cJSON_AddNumberToObject(p, "spent_usd", x->spent);
        cJSON_AddNumberToObject(p, "saved_usd", x->saved);
        cJSON_AddNumberToObject(p, "requests", x->requests);
        cJSON_AddItemToArray(h, p);
    }
    return o;
}

double gw_stats_quantile(double q, const double *bounds, const unsigned long long *buckets,
                         int n_buckets, unsigned long long count)
{
    if (count == 0)
        return -1;
    double rank = q * (double)count;
    double lo = 0, below = 0;
    for (int i = 0; i < n_buckets; i++) {
        if ((double)buckets[i] >= rank) {
            double in = (double)buckets[i] - below;
            return in > 0 ? lo + (bounds[i] - lo) * (rank - below) / in : bounds[i];
        }
        lo = bounds[i];
        below = (double)buckets[i];
    }
    return n_buckets > 0 ? bounds[n_buckets - 1] : -1;
}
