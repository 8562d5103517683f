/* gateway/stats.h: the numbers an operator asks for first, as one JSON object (GET
 * /v1/llmgw/stats, which GET /dashboard polls): spend and savings, requests and cache hit
 * rate, per-tier requests, errors, spend, latency percentiles and tokens, the engines' KV pool,
 * errors and fallbacks; and a history of spend and savings (a sample every
 * GW_STATS_SAMPLE_SECONDS over the last hour). Everything is read from the metrics registry
 * (gateway/metrics.h), the one place these numbers are counted, so the page, the endpoint and
 * /metrics never disagree. Requests and errors count the API's endpoints, not the operator's
 * (health, metrics, stats, the dashboard). Loop thread only. */
#ifndef LLMGW_GATEWAY_STATS_H
#define LLMGW_GATEWAY_STATS_H

#include "gateway/metrics.h"

#include <cjson/cJSON.h>
#include <stddef.h>

enum { GW_STATS_SAMPLE_SECONDS = 10, GW_STATS_HISTORY = 360 };

typedef struct gw_stats gw_stats;

gw_stats *gw_stats_new(void);
void gw_stats_free(gw_stats *s);   /* NULL is a no-op */
/* Keeps the running totals (spent, saved, requests) at time now (unix seconds), dropping the
 * oldest sample beyond GW_STATS_HISTORY. */
void gw_stats_sample(gw_stats *s, gw_metrics *m, double now);
/* The stats object at time now: totals, saved_usd by reason, cache, tiers (in the order of
 * names[0..n_tiers), with what the registry holds for each), engine (NULL when no engine
 * tier), history. The caller adds what the registry does not hold (the policy). */
cJSON *gw_stats_json(const gw_stats *s, gw_metrics *m, const char *const *names, size_t n_tiers,
                     double now, double started);
/* The q-quantile (0 < q < 1) of a histogram with cumulative counts buckets[i] of values <=
 * bounds[i] and count values in all, interpolated linearly within its bucket as Prometheus'
 * histogram_quantile does (above the last bound: that bound); -1 when count is 0. */
double gw_stats_quantile(double q, const double *bounds, const unsigned long long *buckets,
                         int n_buckets, unsigned long long count);

#endif
