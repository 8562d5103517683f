/* gateway/internal.h: the daemon's shared state, visible to gateway/ files only.
 * Everything here lives on the one I/O thread. */
#ifndef LLMGW_GATEWAY_INTERNAL_H
#define LLMGW_GATEWAY_INTERNAL_H

#include "common/arena.h"
#include "gateway/auth.h"
#include "gateway/config.h"
#include "gateway/metrics.h"
#include "gateway/request.h"
#include "gateway/sse.h"
#include "gateway/upstream.h"
#include "router/policy.h"

#include <cjson/cJSON.h>
#include <openssl/ssl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

struct event_base;
struct evdns_base;
struct evhttp;
struct evhttp_request;
struct evhttp_bound_socket;
struct bufferevent;
struct event;
struct evbuffer;

typedef struct gw_server gw_server;
typedef struct gw_req gw_req;
typedef struct gw_engines gw_engines;
typedef struct gw_cache gw_cache;
struct gw_sink;
struct gw_choice;
struct gw_cache_req;
struct embed_job;
struct router_alias;

/* One client connection, from accept until libevent frees its bufferevent. */
typedef struct gw_conn {
    gw_server *srv;
    int fd;                      /* -1 until the hook has run */
    struct bufferevent *bev;     /* the bufferevent evhttp owns (socket or TLS) */
    struct event *deadline;      /* request_timeout: head and body must arrive before it */
    struct event *hook;          /* finds the evhttp_connection once evhttp made it */
    struct event *close_watch;   /* EV_CLOSED on the socket while a request waits */
    gw_req *active;              /* the request being answered, if any */
    uint64_t accepted_ns;
    unsigned n_done;             /* requests answered on it */
    struct gw_conn *older, *newer;  /* every connection, in accept order (gw_server.conns) */
} gw_conn;

typedef struct gw_listener {
    struct evhttp *http;
    struct evhttp_bound_socket *bound;
    SSL_CTX *ssl;                /* NULL for plain HTTP */
    gw_server *srv;
    int port;                    /* the bound port (useful when the config said 0) */
} gw_listener;

struct gw_server {
    struct event_base *base;
    struct evdns_base *dns;
    gw_config *cfg;
    gw_auth *auth;
    gw_metrics *metrics;
    gw_listener *listeners;      /* [cfg->n_listen] */
    gw_upstream **upstreams;     /* [cfg->n_tiers]; NULL for engine tiers */
    gw_engines *engines;         /* the engine tiers (engine_tier.c) */
    gw_cache *cache;             /* encoder + semantic cache (cache.c); NULL when neither */
    struct gw_router *router;    /* the routing policy (route.c); NULL without one */
    int *tier_inflight;          /* [cfg->n_tiers] calls running per tier (max_concurrent) */
    struct router_alias *models; /* model name (tier name or alias) -> tier index */
    gw_conn **conn_by_fd;        /* [conn_cap], indexed by socket fd */
    int conn_cap;
    int n_conns;
    gw_conn *oldest, *newest;    /* the connections in accept order (eviction scans this) */
    struct event *accept_retry;  /* when paused at max_connections: look for a victim again */
    int in_flight;
    bool accept_paused;
    bool draining;
    struct event *sig_term, *sig_int, *drain_timer;
    FILE *access_log;
    const char *dev_tls_dir;
    uint64_t started_ns;
};

/* A request from parse to the last byte of its answer; owns everything it points to. */
struct gw_req {
    gw_server *srv;
    gw_conn *conn;
    struct evhttp_request *ereq;  /* NULL once the client is gone */
    util_arena arena;
    gw_request body;
    const char *endpoint;         /* "chat", "completions", "embeddings", "models" ... */
    const char *path;             /* upstream path, e.g. "/chat/completions" */
    char id[72];
    const char *group;
    int tier;                     /* index into cfg->tiers, -1 before routing */
    int first_tier;
    char *upstream_body;          /* JSON sent upstream (the model rewritten) */
    size_t upstream_len;
    gw_upstream_call *call;
    int attempts;                 /* calls made, over every tier */
    int tier_attempts;            /* calls made on the current tier */
    bool fell_back;
    bool replying;                /* headers sent to the client (chunked reply started) */
    bool client_gone;
    bool upstream_stream;         /* the upstream answers text/event-stream */
    int status;                   /* status sent to the client */
    int upstream_status;
    uint64_t t_start, t_first_byte;
    size_t bytes_out;
    gw_sse_parser sse;            /* watches streamed events for usage */
    long prompt_tokens, completion_tokens;
    struct evbuffer *held;        /* a non-stream upstream body, sent whole at the end */
    struct evbuffer *sse_out;     /* the stream's outgoing events (reused: evhttp drains it) */
    /* engine tiers */
    struct gw_choice *eng_choices;  /* [eng_n]: one engine sequence per choice (n) */
    int eng_n;
    int eng_pending;              /* choices not finished yet */
    uint64_t eng_created;
    struct evbuffer *eng_out;     /* a stream's chunk scratch, reused for every token */
    /* cache.c */
    struct gw_cache_req *cache;   /* the cache's view of a chat request */
    struct embed_job *embed;      /* /v1/embeddings on the in-process encoder */
    /* route.c */
    router_policy *policy;        /* the policy this request started with (a reference) */
    router_decision dec;
    int ptier;                    /* the policy tier, -1 when not routed by a policy */
    int first_ptier;
    int fb_pos;                   /* next entry of the policy tier's fallback chain */
    int slot_tier;                /* the tier whose in-flight count this request holds, or -1 */
    bool needs_score;             /* a score rule waits for the classifier */
    bool dry_run;                 /* POST /v1/llmgw/route */
    bool cache_hit;
    double score;                 /* the classifier's score, -1 when not computed */
    long hit_prompt_tokens, hit_completion_tokens;  /* usage of a replayed answer */
    char reason[96];              /* x-llmgw-route-reason */
};

/* api.c */
void gw_api_handle(struct evhttp_request *ereq, void *arg);   /* evhttp generic callback */
void gw_req_free(gw_req *r);
void gw_req_client_gone(gw_req *r);                            /* from the connection closecb */
void gw_reply_error(gw_req *r, int status, const char *type, const char *param,
                    const char *code, const char *fmt, ...) __attribute__((format(printf, 6, 7)));
void gw_metrics_declare_all(gw_metrics *m);
/* Replies for handlers outside api.c; each ends the request (finish) except begin/data. */
void gw_reply_json(gw_req *r, int status, cJSON *o);            /* takes o */
void gw_reply_raw(gw_req *r, int status, const char *content_type, struct evbuffer *body);
void gw_reply_model_not_found(gw_req *r, const char *model);   /* 404 model_not_found */
/* Sends a routed request (r->tier set) to its tier: the engine or the upstream. */
void gw_dispatch(gw_req *r);
void gw_stream_begin(gw_req *r, int status, const char *content_type);
void gw_stream_data(gw_req *r, const char *data, size_t len);  /* one SSE event */
void gw_stream_buffer(gw_req *r, struct evbuffer *b);  /* b's contents as one event; empties b */
void gw_stream_end(gw_req *r);
/* An OpenAI error body as the stream's last event (the answer broke after it began), then the
 * end of the stream. The message is escaped, whatever it holds. */
void gw_stream_error(gw_req *r, const char *type, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* http.c */
int  gw_server_start(gw_server *s, util_err *err);
void gw_server_stop(gw_server *s);
gw_conn *gw_conn_of(gw_server *s, struct evhttp_request *ereq);
void gw_conn_request_done(gw_conn *c);                         /* re-arms the deadline */
void gw_conn_watch_close(gw_conn *c);         /* a request is pending: notice the client leave */
void gw_conn_stream_timeouts(gw_conn *c, bool streaming);      /* no read timeout mid-stream */
void gw_server_maybe_exit(gw_server *s);                       /* when draining and idle */

#endif
