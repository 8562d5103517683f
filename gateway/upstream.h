/* gateway/upstream.h: the client side of an `upstream` tier — an OpenAI-compatible server
 * reached over HTTP or HTTPS with a bounded pool of keep-alive connections (libevent evhttp).
 * Responses stream back through callbacks as they arrive, so SSE passes through chunk by chunk.
 * Loop thread only. */
#ifndef LLMGW_GATEWAY_UPSTREAM_H
#define LLMGW_GATEWAY_UPSTREAM_H

#include "common/err.h"
#include "gateway/config.h"

#include <stddef.h>

struct event_base;
struct evdns_base;
struct evbuffer;
struct evkeyvalq;

typedef enum gw_upstream_error {
    GW_UP_OK = 0,
    GW_UP_CONNECT = 1,    /* connection refused, unreachable, connect timeout, TLS handshake */
    GW_UP_TIMEOUT = 2,    /* no byte for timeout_ms once connected */
    GW_UP_BROKEN = 3,     /* reset or malformed response */
    GW_UP_QUEUE = 4,      /* every connection busy and the wait queue full */
    GW_UP_CLOSED = 5,     /* connected, then closed by the server before any response byte */
} gw_upstream_error;

const char *gw_upstream_error_name(gw_upstream_error e);

typedef struct gw_upstream_cbs {
    /* The response status and headers arrived. */
    void (*on_headers)(void *arg, int status, const struct evkeyvalq *headers);
    /* Body bytes arrived; the callee drains `chunk` (or leaves it: it is drained after). */
    void (*on_body)(void *arg, struct evbuffer *chunk);
    /* Exactly once, last: GW_UP_OK after a complete response, else the failure. */
    void (*on_done)(void *arg, gw_upstream_error err);
} gw_upstream_cbs;

typedef struct gw_upstream gw_upstream;
typedef struct gw_upstream_call gw_upstream_call;

/* Parses t->base_url and prepares TLS; keeps a pointer to t (the config outlives it). */
int  gw_upstream_new(gw_upstream **out, struct event_base *base, struct evdns_base *dns,
                     const gw_tier_cfg *t, util_err *err);
void gw_upstream_free(gw_upstream *u);  /* cancels every call without callbacks; NULL ok */

/* Starts POST/GET base_url + path. body is copied. Returns 0 (callbacks will run, on_done
 * exactly once, never from inside this call) or a negative code (no callbacks). */
int  gw_upstream_call_start(gw_upstream *u, const char *method, const char *path,
                            const char *body, size_t len, const char *request_id,
                            const gw_upstream_cbs *cbs, void *arg, gw_upstream_call **out);
/* Cancels a call that has not finished: no callback runs after this. */
void gw_upstream_call_cancel(gw_upstream_call *c);

/* Connections open, calls waiting for one; for /metrics. */
void gw_upstream_stats(const gw_upstream *u, int *open, int *busy, int *queued);

#endif
