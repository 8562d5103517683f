/* gateway/metrics.h: counters, gauges and histograms rendered in the Prometheus text format
 * (version 0.0.4). Series are keyed by family name + a pre-rendered label string such as
 * `endpoint="chat",status="200"`. Loop thread only. Families must be declared before use;
 * using an undeclared family is our bug (asserted). */
#ifndef LLMGW_GATEWAY_METRICS_H
#define LLMGW_GATEWAY_METRICS_H

struct evbuffer;

typedef enum gw_metric_type {
    GW_METRIC_COUNTER,
    GW_METRIC_GAUGE,
    GW_METRIC_HISTOGRAM,  /* seconds, fixed latency buckets from 0.5 ms to 60 s */
} gw_metric_type;

typedef struct gw_metrics gw_metrics;

gw_metrics *gw_metrics_new(void);
void gw_metrics_free(gw_metrics *m);  /* NULL is a no-op */
void gw_metrics_declare(gw_metrics *m, const char *name, gw_metric_type type, const char *help);
void gw_metrics_add(gw_metrics *m, const char *name, const char *labels, double v);
void gw_metrics_set(gw_metrics *m, const char *name, const char *labels, double v);
void gw_metrics_observe(gw_metrics *m, const char *name, const char *labels, double seconds);
/* Current value of a counter or gauge series (0 when absent); for tests. */
double gw_metrics_get(gw_metrics *m, const char *name, const char *labels);
void gw_metrics_render(gw_metrics *m, struct evbuffer *out);

/* One series as gw_metrics_each hands it over (valid during the call only). */
typedef struct gw_metric_sample {
    const char *labels;                 /* rendered, e.g. `tier="small",kind="prompt"`; "" */
    double value;                       /* counter, gauge; histogram: the sum */
    unsigned long long count;           /* histogram: observations */
    const double *bounds;               /* histogram: bucket upper bounds (seconds) */
    const unsigned long long *buckets;  /* histogram: cumulative counts per bound */
    int n_buckets;
} gw_metric_sample;

/* Calls fn for every series of family name, in the render order (none when undeclared). */
void gw_metrics_each(gw_metrics *m, const char *name,
                     void (*fn)(void *ctx, const gw_metric_sample *s), void *ctx);

#endif
