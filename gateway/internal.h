/* gateway/internal.h: the daemon's shared state, visible to gateway/ files only. Types only:
 * every function lives behind its module's own header. Everything here lives on the one I/O
 * thread.
 *
 * Calls go one way, down: api → pipeline → (route, cache, tiers) → reply → the transport.
 * The few things a lower module must tell a higher one travel through gw_hooks, which main.c
 * fills in: http.c hands over a request and a client's leaving, reply.c the end of an answer,
 * a tier a failure before its first byte, the cache the end of its asynchronous work. */
#ifndef LLMGW_GATEWAY_INTERNAL_H
#define LLMGW_GATEWAY_INTERNAL_H

#include "common/arena.h"
#include "gateway/auth.h"
#include "gateway/config.h"
#include "gateway/metrics.h"
#include "gateway/request.h"

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
typedef struct gw_cache gw_cache;
typedef struct gw_router gw_router;
typedef struct gw_engines gw_engines;
typedef struct gw_tier gw_tier;
typedef struct router_alias router_alias;

/* One client connection, from accept until libevent frees its bufferevent (http.c). */
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

/* Why a tier could not answer, reported before it sent any byte (gw_hooks.tier_failed). */
typedef struct gw_tier_failure {
    int status;                  /* the HTTP status the client gets if nothing else answers */
    const char *type;            /* OpenAI error type, e.g. "upstream_error" */
    const char *code;            /* e.g. "upstream_timeout" */
    const char *kind;            /* short cause for logs and metrics, e.g. "timeout" */
    char message[256];
} gw_tier_failure;

/* The calls that go up (see the top of this file). */
typedef struct gw_hooks {
    void (*request)(gw_server *s, struct evhttp_request *ereq);   /* http.c: a request arrived */
    void (*client_gone)(gw_req *r);           /* http.c: the client left mid-answer */
    void (*reply_done)(gw_req *r);            /* reply.c: the answer is over; r is freed */
    void (*tier_failed)(gw_req *r, const gw_tier_failure *f);    /* a tier, before any byte */
    void (*cache_done)(gw_req *r);            /* cache.c: the lookup r waited for is over */
} gw_hooks;

struct gw_server {
    struct event_base *base;
    struct evdns_base *dns;
    gw_config *cfg;
    gw_hooks hooks;
    gw_auth *auth;
    gw_metrics *metrics;
    gw_listener *listeners;      /* [cfg->n_listen] */
    gw_tier **tiers;             /* [cfg->n_tiers]: every tier behind gateway/tier.h */
    gw_engines *engines;         /* the engine tiers' shared pool and threads (engine_tier.c) */
    gw_cache *cache;             /* encoder + semantic cache (cache.c); NULL when neither */
    gw_router *router;           /* the routing policies (route.c) */
    router_alias *models;        /* model name (tier name or alias) -> tier index */
    gw_conn **conn_by_fd;        /* [conn_cap], indexed by socket fd */
    int conn_cap;
    int n_conns;
    gw_conn *oldest, *newest;    /* the connections in accept order (eviction scans this) */
    struct event *accept_retry;  /* when paused at max_connections: look for a victim again */
    int in_flight;
    gw_req *spare_reqs;          /* finished requests kept for reuse (api.c), their arenas reset */
    int n_spare_reqs;
    bool accept_paused;
    bool draining;
    struct event *sig_term, *sig_int, *drain_timer;
    struct gw_alog *access_log;  /* accesslog.h; NULL when off */
    const char *dev_tls_dir;
    uint64_t started_ns;
    struct gw_stats *stats;      /* the stats history (stats.h), sampled by stats_timer */
    struct gw_rstore *responses; /* stored Responses (response_store.h); made on first use */
    struct event *stats_timer;
};

/* How a request's answer leaves (http.c's evhttp transport; a unit test's recorder). io_ctx
 * is the transport's handle of the request; NULL once the client is gone. */
typedef struct gw_transport {
    const char *(*header)(gw_req *r, const char *name);          /* a request header, or NULL */
    void (*add_header)(gw_req *r, const char *name, const char *value);  /* to the answer */
    void (*send)(gw_req *r, int status, struct evbuffer *body);  /* a whole answer; drains body */
    void (*start)(gw_req *r, int status);                        /* a chunked answer begins */
    void (*chunk)(gw_req *r, struct evbuffer *data);             /* drains data */
    void (*end)(gw_req *r);
} gw_transport;

#define GW_MAX_FILTERS 4

/* What an SSE event that llmgw writes itself says (an engine tier's chunk), so an output filter
 * needs no JSON parse per token. Filters get NULL for events they must read themselves (a
 * forwarded upstream stream, a replay, an error). */
typedef struct gw_stream_info {
    const char *model, *fingerprint;
    int index;                    /* the choice */
    const char *text;             /* the delta's content; NULL: none */
    size_t len;
    const char *finish;           /* finish_reason; NULL: none yet */
    bool usage;                   /* a usage chunk: */
    long prompt_tokens, completion_tokens;
} gw_stream_info;

/* An output filter sees an answer on its way out (reply.c). Every entry is optional. */
typedef struct gw_filter {
    void (*headers)(gw_req *r, void *ctx);              /* may add headers (gw_reply_header) */
    void (*body)(gw_req *r, void *ctx, int status, const char *data, size_t len);  /* whole */
    void (*event)(gw_req *r, void *ctx, const char *data, size_t len,
                  const gw_stream_info *info);          /* one SSE event; info may be NULL */
    void (*end)(gw_req *r, void *ctx);                  /* the answer is over, however */
} gw_filter;

/* A request from parse to the last byte of its answer; owns everything it points to. The
 * public part is what several modules read; each module keeps its own state behind its own
 * opaque pointer. */
struct gw_req {
    gw_server *srv;
    gw_conn *conn;
    const gw_transport *io;
    void *io_ctx;                 /* NULL once the client is gone */
    util_arena arena;             /* request-lifetime memory: freed all at once */
    gw_request body;
    const char *endpoint;         /* "chat", "completions", "embeddings", "models" ... */
    const char *path;             /* upstream path, e.g. "/chat/completions" */
    char id[72];
    const char *group;
    uint64_t t_start, t_first_byte;
    /* what the pipeline decided (pipeline.c writes) */
    int tier;                     /* the config tier answering, -1 before routing */
    int first_tier;               /* the one routing picked */
    bool fell_back;               /* a tier failed and another answers */
    bool fallback_ok;             /* a tier may report a failure instead of answering it */
    const struct router_cascade *cascade;  /* small-first, for a tier that drafts; NULL: off
                                              (borrowed from the request's policy) */
    /* what the tier reports (the tier writes) */
    int attempts;                 /* calls made, over every tier */
    int upstream_status;
    long prompt_tokens, completion_tokens;
    struct {                      /* what a cascade did, over every choice */
        bool ran, escalated;      /* escalated: some choice did */
        int small_tier;           /* the config tier whose model answered first */
        long small_tokens;        /* tokens it generated */
        long kept;                /* of the completion, its tokens */
        long large_tokens;        /* positions the routed tier's model computed */
    } cascade_did;
    /* the answer (reply.c writes) */
    int status;                   /* status sent to the client */
    bool replying;                /* headers sent (a chunked answer began) */
    bool client_gone;
    size_t bytes_out;
    struct evbuffer *sse_out;     /* a stream's outgoing events (reused) */
    struct gw_sse_parser *sse_in; /* events of a forwarded stream, for the filters */
    struct { const gw_filter *f; void *ctx; } filters[GW_MAX_FILTERS];
    int n_filters;
    /* each module's own state, opaque outside it */
    struct gw_pipe *pipe;         /* pipeline.c */
    struct gw_route_req *route;   /* route.c */
    struct gw_cache_req *cache;   /* cache.c */
    struct embed_job *embed;      /* cache.c: /v1/embeddings on the encoder */
    struct gw_resp_req *resp;     /* responses.c: a /v1/responses request's translation */
    gw_tier *tier_impl;           /* the tier holding tier_state */
    void *tier_state;             /* that tier's */
    gw_req *spare_next;           /* api.c: in gw_server.spare_reqs once finished */
};

#endif
