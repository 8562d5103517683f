/* gateway/route.h: routing decisions on the request path, in one tier vocabulary.
 *
 * gw_router holds the policy file's policy (router/policy.h) behind one pointer, and the
 * implicit policy the config's tiers make (router_policy_implicit: each tier with its
 * `fallback` as its chain). A request for a model name the policy file routes is routed by it;
 * any other model name (a tier name or alias) by the implicit policy. Either way a request then
 * carries one policy tier and one fallback cursor over that tier's chain; r->tier is the config
 * tier serving it.
 *
 * The policy file is watched with inotify (its directory, so editors that write a new file
 * and rename it are seen) and reloaded on SIGHUP; a reload is debounced, parsed and validated
 * in full and swapped atomically; a request keeps a reference to the policy it started with.
 * A broken edit is logged and reported on /readyz and /metrics, and the old policy keeps
 * serving.
 *
 * Nothing here answers a request or calls another stage: the pipeline asks and acts. The
 * route registers one output filter for its headers (x-llmgw-route-reason, costs) and, at the
 * end, its cost metrics and concurrency slot. Loop thread only. */
#ifndef LLMGW_GATEWAY_ROUTE_H
#define LLMGW_GATEWAY_ROUTE_H

#include "common/err.h"

#include <stdbool.h>

typedef struct gw_server gw_server;
typedef struct gw_req gw_req;
typedef struct gw_router gw_router;
typedef struct gw_metrics gw_metrics;
typedef struct cJSON cJSON;

/* Makes the implicit policy and loads the config's policy file, if it names one. */
int  gw_router_new(gw_router **out, gw_server *s, util_err *err);
void gw_router_free(gw_router *g);  /* NULL is a no-op */
/* Reloads the file now (SIGHUP does this); 0 on success, else the old policy stays. */
int  gw_router_reload(gw_router *g);
void gw_router_declare_metrics(gw_metrics *m);
/* {"path", "loaded_at", "generation", "error"} for /readyz (nothing without a file). */
void gw_router_status(const gw_router *g, cJSON *into);

/* `llmgw --check-policy FILE [-c CONFIG]`: 0 valid, 2 invalid (message on stderr). */
int  gw_check_policy(const char *policy_path, const char *config_path);

typedef enum gw_route_result {
    GW_ROUTE_OK = 0,             /* r->tier is set */
    GW_ROUTE_NEEDS_SCORE = 1,    /* a rule needs the classifier: gw_route_score, then OK */
    GW_ROUTE_UNKNOWN_MODEL = 2,  /* no policy routes the model name, and no tier has it */
} gw_route_result;

/* Routes r with the rules that need no score. */
gw_route_result gw_route_begin(gw_req *r);
bool gw_route_needs_score(const gw_req *r);
/* Scores r with the policy's classifier (vec: the last user message's embedding; NULL: none,
 * the score is 0) and routes it again. */
void gw_route_score(gw_req *r, const float *vec);
/* The matching rule's cache setting: -1 the cache's default, 0 off, 1 on. */
int  gw_route_cache_rule(const gw_req *r);
/* The rule's semantic threshold, < 0 for the cache's own. */
double gw_route_cache_threshold(const gw_req *r);
/* The rule's verifier error budget, < 0 for the cache's own. */
double gw_route_cache_max_false_hit_rate(const gw_req *r);

/* max_concurrent: a tier at its limit hands r down its fallback chain (r->tier changes).
 * false: every tier of the chain is full. Takes the tier's slot otherwise. */
bool gw_route_admit(gw_req *r);
/* The fallback cursor: whether a tier other than r->tier is left on the chain, and moving to
 * it (r->tier changes, the slot moves; -1 when none is left). */
bool gw_route_has_fallback(gw_req *r);
int  gw_route_fallback(gw_req *r);
/* The policy tier the decision picked (for messages). */
const char *gw_route_first_name(const gw_req *r);

/* r is answered from the cache, with the stored answer's usage (costs: saved by the cache). */
void gw_route_cache_hit(gw_req *r, long prompt_tokens, long completion_tokens);
/* Appends to the reason (x-llmgw-route-reason). */
void gw_route_note(gw_req *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
const char *gw_route_reason(const gw_req *r);   /* NULL before routing */
/* The decision as fields of a dry run's answer (tier, backend, rule, kind, reason, score...). */
void gw_route_describe(const gw_req *r, cJSON *o);
/* r is freed. */
void gw_route_release(gw_req *r);

#endif
