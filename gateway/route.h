/* gateway/route.h: the routing policy on the request path.
 *
 * gw_router holds the current policy (router/policy.h) behind one pointer. The policy file is
 * watched with inotify (its directory, so editors that write a new file and rename it are seen)
 * and reloaded on SIGHUP; a reload is debounced, parsed and validated in full and swapped
 * atomically; a request keeps a reference to the policy it started with. A broken edit is logged
 * and reported on /readyz and /metrics, and the old policy keeps serving.
 *
 * The pipeline of a chat/completions request: route (rules that need no score), cache exact
 * lookup, embedding (+ semantic search) on the encoder thread when the cache or a score rule
 * needs it, route again with the classifier's score, cache decision, dispatch to the tier (with
 * the policy's fallback chain and max_concurrent). Loop thread only. */
#ifndef LLMGW_GATEWAY_ROUTE_H
#define LLMGW_GATEWAY_ROUTE_H

#include "common/err.h"

#include <stdbool.h>

typedef struct gw_server gw_server;
typedef struct gw_req gw_req;
typedef struct gw_router gw_router;
typedef struct gw_metrics gw_metrics;
typedef struct cJSON cJSON;
struct evkeyvalq;

/* Loads the config's policy (none: *out = NULL, requests keep the config's model names). */
int  gw_router_new(gw_router **out, gw_server *s, util_err *err);
void gw_router_free(gw_router *g);  /* NULL is a no-op */
/* Reloads now (SIGHUP does this); 0 on success, else the old policy stays. */
int  gw_router_reload(gw_router *g);
void gw_router_declare_metrics(gw_metrics *m);
/* {"path", "loaded_at", "generation", "error"} for /readyz. */
void gw_router_status(const gw_router *g, cJSON *into);

/* `llmgw --check-policy FILE [-c CONFIG]`: 0 valid, 2 invalid (message on stderr). */
int  gw_check_policy(const char *policy_path, const char *config_path);

/* A parsed chat/completions request: routes, looks up the cache, dispatches (or replies). */
void gw_route_start(gw_req *r);
/* From cache.c: the embedding (and the semantic candidate) arrived; the exact hit went stale. */
void gw_route_embedded(gw_req *r);
void gw_route_exact_missed(gw_req *r);

/* For a dry run: the decision as the reply (cache_state: what the cache would do). */
void gw_route_dry_reply(gw_req *r, const char *cache_state, double similarity);
/* Before a call goes to r->tier: max_concurrent and the fallback chain; false = answered 503. */
bool gw_route_admit(gw_req *r);

/* Decision headers (x-llmgw-route-reason, costs) on the reply. */
void gw_route_headers(gw_req *r, struct evkeyvalq *h);
/* At the end of a request: cost metrics, concurrency slot. */
void gw_route_finish(gw_req *r);
/* The next tier of the policy's fallback chain for a failed call, or -1 (config fallback then). */
int  gw_route_next_fallback(gw_req *r);

#endif
