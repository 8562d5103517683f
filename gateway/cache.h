/* gateway/cache.h: the semantic cache and the in-process encoder as the gateway uses them.
 *
 * gw_cache owns the encoder (engine/encoder.h), the local store (cache/store.h) and, when
 * configured, the Redis sharing (cache/share.h). For a cacheable chat request (gateway/
 * cache_key.h) gw_cache_lookup tries the exact key, then embeds the last user turn on the
 * encoder's worker thread and searches the request's namespace there; the answer comes back to
 * the loop through a queue. A hit found in FAISS is re-checked against Redis before it is served
 * (gone → miss). A hit is replayed as JSON or as SSE chunks; a miss goes on to its tier and
 * the complete answer is captured and stored (and published) when the request finishes.
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
struct evkeyvalq;

/* Loads the encoder (when configured) and starts the cache (when enabled). *out stays NULL
 * when the config has neither. */
int  gw_cache_new(gw_cache **out, gw_server *s, util_err *err);
void gw_cache_free(gw_cache *c);  /* NULL is a no-op */
void gw_cache_declare_metrics(gw_metrics *m);
void gw_cache_metrics(gw_cache *c, gw_metrics *m);  /* gauges, before /metrics renders */

/* The cache's part of a request's pipeline (gateway/route.c drives it). Chat requests only;
 * the other functions are no-ops on a request gw_cache_prepare skipped.
 * prepare: key and Cache-Control; rule_cache is the route's setting (-1 default, 0 off, 1 on). */
void gw_cache_prepare(gw_req *r, int rule_cache);
/* The exact entry: true when it takes r (a hit is served, or re-checked first). */
bool gw_cache_try_exact(gw_req *r);
bool gw_cache_wants_embedding(const gw_req *r);
/* Embeds the last user message on the encoder thread (and searches r's namespace when it may be
 * served from the cache); gw_route_embedded(r) runs on the loop when done. false: the encoder is
 * absent or saturated (r goes on without the cache). */
bool gw_cache_embed(gw_req *r);
const float *gw_cache_vec(const gw_req *r);   /* after gw_cache_embed, or NULL */
void gw_cache_disable(gw_req *r);             /* the route's rule turns the cache off */
/* Serves the best semantic candidate at or above threshold (< 0: the cache's own) that the
 * guard lets through; otherwise a miss: gw_dispatch(r). */
void gw_cache_decide(gw_req *r, double threshold);

/* What the client is sent, for the capture of a miss's answer. */
void gw_cache_capture_json(gw_req *r, int status, const char *body, size_t len);
void gw_cache_capture_sse(gw_req *r, const char *data, size_t len);
/* In finish(): stores a complete captured answer. */
void gw_cache_finish(gw_req *r);
/* In gw_req_free(): forgets r in work still queued. */
void gw_cache_detach(gw_req *r);
void gw_cache_headers(gw_req *r, struct evkeyvalq *headers);
/* "exact", "semantic", "miss", "bypass", or NULL when the cache took no part (access log). */
const char *gw_cache_state_name(const gw_req *r);

/* /v1/embeddings for the encoder's model name. */
bool gw_cache_serves_embeddings(const gw_cache *c, const char *model);
void gw_embeddings_start(gw_req *r);

#endif
