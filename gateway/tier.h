/* gateway/tier.h: what answers a routed request. Two kinds implement it: engine tiers (models
 * run in-process, engine_tier.c) and upstream tiers (an OpenAI-compatible server, upstream_tier.c).
 * The pipeline starts a request on a tier; the tier answers it through the reply layer
 * (gateway/reply.h), or — only when r->fallback_ok and before it sent any byte — reports a
 * failure through hooks.tier_failed so the pipeline can try the next tier of the chain.
 * A tier keeps its per-request state in r->tier_state (with r->tier_impl). Loop thread only. */
#ifndef LLMGW_GATEWAY_TIER_H
#define LLMGW_GATEWAY_TIER_H

#include "gateway/internal.h"

typedef struct gw_tier_ops {
    const char *kind;                              /* "engine", "upstream" */
    void (*start)(gw_tier *t, gw_req *r);
    void (*detach)(gw_tier *t, gw_req *r);          /* stop working for r; no callback after */
    void (*release)(gw_tier *t, gw_req *r);         /* detach, then free r's tier state */
    void (*metrics)(gw_tier *t, gw_metrics *m);     /* gauges, before /metrics renders */
    void (*free)(gw_tier *t);
} gw_tier_ops;

struct gw_tier {
    const gw_tier_ops *ops;
    const gw_tier_cfg *cfg;
    int index;                                     /* in cfg->tiers */
    void *impl;
};

/* Starts r (r->tier set) on its tier. */
void gw_tier_start(gw_req *r);
/* The client left: the tier stops working for r. */
void gw_tier_detach(gw_req *r);
/* r is freed: its tier state too. NULL-safe in every way. */
void gw_tier_release(gw_req *r);
void gw_tier_free(gw_tier *t);  /* NULL is a no-op */

/* A failure report with a formatted message. */
void gw_tier_fail(gw_req *r, int status, const char *type, const char *code, const char *kind,
                  const char *fmt, ...) __attribute__((format(printf, 6, 7)));

/* The upstream tier for config tier `index` (upstream_tier.c). */
int  gw_upstream_tier_new(gw_tier **out, gw_server *s, int index, util_err *err);
void gw_upstream_tier_declare_metrics(gw_metrics *m);

#endif
