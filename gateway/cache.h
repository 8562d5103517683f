/* gateway/cache.h: the semantic cache and the in-process encoder as the gateway uses them.
 *
 * gw_cache owns the encoder (engine/encoder/encoder.h), the local store (cache/store.h) and, when
 * configured, the Redis sharing (cache/share.h). For a cacheable chat request (gateway/
 * cache_key.h) gw_cache_lookup tries the exact key, then embeds the last user turn on the
 * encoder's worker thread and searches the request's namespace there; the answer comes back to
 * the loop through the mailbox. A hit found in FAISS is re-checked against Redis before it is
 * served (gone → miss). A hit is replayed as JSON or as SSE chunks; a miss goes on to its tier
 * and its complete answer is captured by an output filter (gateway/reply.h) and stored (and
 * published) when the answer ends.
 * Loop thread only, except what runs on the encoder thread inside cache.c. */
#ifndef LLMGW_GATEWAY_CACHE_H
#define LLMGW_GATEWAY_CACHE_H

#include "common/err.h"

#include <stdbool.h>
#include <stddef.h>

typedef struct gw_server gw_server;
typedef struct gw_req gw_req;
typedef struct gw_cache gw_cache;
typedef struct gw_metrics gw_metrics;

/* Loads the encoder (when configured) and starts the cache (when enabled). *out stays NULL
 * when the config has neither. */
int  gw_cache_new(gw_cache **out, gw_server *s, util_err *err);
void gw_cache_free(gw_cache *c);  /* NULL is a no-op */
void gw_cache_declare_metrics(gw_metrics *m);
void gw_cache_metrics(gw_cache *c, gw_metrics *m);  /* gauges, before /metrics renders */

/* The cache's part of a request's pipeline (gateway/pipeline.c drives it). Chat requests
 * only; the other functions are no-ops on a request gw_cache_prepare skipped. A step that
 * returns GW_CACHE_PENDING goes on elsewhere (the encoder thread, Redis) and ends with
 * hooks.cache_done(r); gw_cache_outcome(r) then says what it found.
 * prepare: key and Cache-Control, and the capture of the answer (an output filter) when
 * may_store; rule_cache is the route's setting (-1 default, 0 off, 1 on). */
typedef enum gw_cache_step {
    GW_CACHE_MISS = 0,
    GW_CACHE_HIT = 1,        /* a stored answer is held for r: gw_cache_serve replays it */
    GW_CACHE_PENDING = 2,
} gw_cache_step;

void gw_cache_prepare(gw_req *r, int rule_cache, bool may_store);
/* The exact entry (once per request). A found entry is re-checked against Redis first. */
gw_cache_step gw_cache_exact(gw_req *r);
bool gw_cache_wants_embedding(const gw_req *r);
/* Embeds the last user message on the encoder thread (and searches r's namespace there when
 * it may be served from the cache). true: pending (cache_done follows); false: the encoder is
 * absent or saturated (r goes on without the cache). */
bool gw_cache_embed(gw_req *r);
const float *gw_cache_vec(const gw_req *r);   /* after gw_cache_embed, or NULL */
void gw_cache_disable(gw_req *r);             /* the route's rule turns the cache off */
/* The semantic candidate to serve among those at or above the cosine threshold (< 0: the
 * cache's own): with a verifier, the one it is surest of at or above the operating point for
 * max_false_hit_rate (< 0: the cache's own); without, the most similar the guard lets through. */
gw_cache_step gw_cache_semantic(gw_req *r, double threshold, double max_false_hit_rate);
gw_cache_step gw_cache_outcome(const gw_req *r);
bool gw_cache_looked_up(const gw_req *r);     /* r was a lookup (cacheable, allowed) */
/* The held hit: "exact"/"semantic", its similarity and its stored usage. */
void gw_cache_hit_info(const gw_req *r, const char **kind, double *similarity, long *prompt,
                       long *completion);
/* Forgets a held hit (r is a dry run, answered without it). */
void gw_cache_forget_hit(gw_req *r);
/* The decision's metrics (lookups, hits, misses, bypass, guard refusals, duration): once,
 * for a request that is really answered. */
void gw_cache_account(gw_req *r);
/* Replays the held hit as r's answer (JSON or SSE chunks); ends r. */
void gw_cache_serve(gw_req *r);
/* In gw_req_free(): forgets r in work still queued, frees its state. */
void gw_cache_release(gw_req *r);
/* "exact", "semantic", "miss", "bypass", or NULL when the cache took no part (access log). */
const char *gw_cache_state_name(const gw_req *r);

/* /v1/embeddings for the encoder's model name. */
bool gw_cache_serves_embeddings(const gw_cache *c, const char *model);
void gw_embeddings_start(gw_req *r);

#endif
