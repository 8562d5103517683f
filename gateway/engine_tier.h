/* gateway/engine_tier.h: `engine` tiers: models served in-process by engine/ instances that
 * share one KV pool. A request's messages are rendered with the model's chat template,
 * tokenized and submitted; tokens come back from the instance's scheduler thread through a
 * queue that wakes the loop (nothing here blocks the loop), and go out as OpenAI JSON or SSE.
 * Loop thread only, except the engine callback, which only enqueues. */
#ifndef LLMGW_GATEWAY_ENGINE_TIER_H
#define LLMGW_GATEWAY_ENGINE_TIER_H

#include "common/err.h"

typedef struct gw_server gw_server;
typedef struct gw_req gw_req;
typedef struct gw_engines gw_engines;
typedef struct gw_metrics gw_metrics;

/* Loads every engine tier's model and starts its instance (this takes a while: at startup). */
int  gw_engines_new(gw_engines **out, gw_server *s, util_err *err);
void gw_engines_free(gw_engines *g);  /* cancels everything; NULL is a no-op */

/* Answers r (its tier is an engine tier) from start to finish. */
void gw_engine_start(gw_req *r);
/* The client went away: stop generating (every choice). */
void gw_engine_detach(gw_req *r);
/* Detaches and frees r's engine state (gw_req_free). */
void gw_engine_release(gw_req *r);
/* Pool occupancy, queue depth and token counters into /metrics. */
void gw_engines_metrics(gw_engines *g, gw_metrics *m);

#endif
