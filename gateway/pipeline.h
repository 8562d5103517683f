/* gateway/pipeline.h: the one place that orders a generation request's stages:
 *
 *   route → exact lookup → embed (+ semantic search) → score → semantic candidate →
 *   cache decision → dispatch to a tier (with the fallback chain) → the reply layer finishes
 *
 * as an explicit stage machine (pipeline.c). A stage either finishes at once or starts work
 * elsewhere (the encoder thread, Redis) and the machine resumes when hooks.cache_done reports
 * it. A dry run (POST /v1/llmgw/route) runs the same stages and answers the decision instead
 * of serving a hit or dispatching. A tier's failure before its first byte comes back through
 * hooks.tier_failed and moves the request down its fallback chain. Loop thread only. */
#ifndef LLMGW_GATEWAY_PIPELINE_H
#define LLMGW_GATEWAY_PIPELINE_H

#include <stdbool.h>

typedef struct gw_server gw_server;
typedef struct gw_req gw_req;
typedef struct gw_metrics gw_metrics;

/* Fills the hooks the pipeline answers (cache_done, tier_failed). */
void gw_pipeline_init(gw_server *s);
void gw_pipeline_declare_metrics(gw_metrics *m);
/* A parsed chat, completions or embeddings request, authorized: runs it to its answer. */
void gw_pipeline_start(gw_req *r, bool dry_run);
/* The client left: work for r stops (the reply layer then finishes it). */
void gw_pipeline_abort(gw_req *r);
/* r is freed: every stage's state. */
void gw_pipeline_release(gw_req *r);
/* The stage r is in, for tests and logs ("route", "exact", ... "dispatched"). */
const char *gw_pipeline_stage(const gw_req *r);

#endif
