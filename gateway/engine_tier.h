/* gateway/engine_tier.h: `engine` tiers: models served in-process by engine/ instances that
 * share one KV pool, each behind gateway/tier.h. A request's messages are rendered with the
 * model's chat template and tokenized on a prep thread, which submits them; tokens come back
 * from the instance's scheduler thread through the mailbox (nothing here blocks the loop) and
 * go out as OpenAI JSON or SSE. Loop thread only, except the engine callback and the prep
 * thread, which only post. */
#ifndef LLMGW_GATEWAY_ENGINE_TIER_H
#define LLMGW_GATEWAY_ENGINE_TIER_H

#include "common/err.h"
#include "gateway/request.h"

typedef struct gw_server gw_server;
typedef struct gw_engines gw_engines;
typedef struct gw_tier gw_tier;
typedef struct gw_metrics gw_metrics;

/* Loads every engine tier's model and starts its instance (this takes a while: at startup).
 * *out stays NULL when the config has no engine tier. */
int  gw_engines_new(gw_engines **out, gw_server *s, util_err *err);
/* Cancels everything; every request must be gone. NULL is a no-op. */
void gw_engines_free(gw_engines *g);
/* The tier (tier.h) for config tier `index`, an engine tier gw_engines_new loaded. */
int  gw_engine_tier_new(gw_tier **out, gw_engines *g, int index);
void gw_engines_declare_metrics(gw_metrics *m);

/* What an engine tier cannot serve in request b, as a short phrase ("tools", "image_url"), or NULL
 * when it can serve it all. The router sends such a request down its chain to a tier that can
 * (gateway/route.h); one that reaches an engine tier anyway is refused (400 naming the part). */
const char *gw_engine_tier_lacks(const gw_request *b);

#endif
