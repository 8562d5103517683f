/* gateway/upstream.c: a pool of evhttp client connections per upstream tier.
 *
 * A call goes to an idle connection, a new one (up to max_connections) or a FIFO wait queue.
 * A connection is reused only after a complete response; any failure or cancel discards it
 * (libevent cannot reconnect a TLS bufferevent). Connection objects are freed from a deferred
 * event, never inside one of their own callbacks. */
#include "gateway/upstream.h"

#include "common/arena.h"
#include "common/log.h"
#include "gateway/tls.h"

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <openssl/x509v3.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#define MAX_WAITING 4096

typedef struct pconn {
    struct pconn *next;
    gw_upstream *u;
    struct evhttp_connection *evcon;
    gw_upstream_call *call;  /* the call in flight, NULL when idle */
    bool dead;
} pconn;

struct gw_upstream_call {
    gw_upstream *u;
    pconn *pc;
    struct evhttp_request *req;   /* libevent's, while in flight */
    gw_upstream_cbs cbs;
    void *arg;
    enum evhttp_cmd_type method;
    char *path;                   /* prefix + path */
    char *body;
    size_t len;
    char request_id[64];
    struct event *timer;          /* deferred start, then the connect deadline */
    gw_upstream_call *next_waiting;
    gw_upstream_error err;
    bool got_headers, queued, fresh_conn;
};

typedef struct zombie {
    struct zombie *next;
    struct evhttp_connection *evcon;
} zombie;

struct gw_upstream {
    struct event_base *base;
    struct event *reaper;         /* frees discarded connections outside their callbacks */
    zombie *zombies;
    struct evdns_base *dns;
    const gw_tier_cfg *t;
    char *host;
    int port;
    bool https;
    char *prefix;                 /* "/v1" from the base URL, may be "" */
    char *auth_header;            /* "Bearer <api_key>", or NULL */
    char host_header[300];
    SSL_CTX *ssl;
    pconn *conns;
    int n_open, n_busy;
    gw_upstream_call *wait_head, *wait_tail;
    int n_waiting;
};

static void dispatch(gw_upstream *u);
static void reap_cb(evutil_socket_t fd, short what, void *arg);

const char *gw_upstream_error_name(gw_upstream_error e)
{
    switch (e) {
    case GW_UP_OK: return "ok";
    case GW_UP_CONNECT: return "connect";
    case GW_UP_TIMEOUT: return "timeout";
    case GW_UP_BROKEN: return "broken";
    case GW_UP_QUEUE: return "queue_full";
    case GW_UP_CLOSED: return "closed_before_response";
    }
    return "unknown";
}

static int parse_url(gw_upstream *u, const char *url, util_err *err)
{
    struct evhttp_uri *uri = evhttp_uri_parse(url);
    if (uri == NULL || evhttp_uri_get_host(uri) == NULL)
        goto bad;
    u->https = !strcmp(evhttp_uri_get_scheme(uri), "https");
    const char *host = evhttp_uri_get_host(uri);
    /* evhttp keeps IPv6 literals bracketed; sockets want them bare. */
    size_t hl = strlen(host);
    u->host = host[0] == '[' && hl > 2 ? util_xstrndup(host + 1, hl - 2)
                                       : util_xstrdup(host);
    u->port = evhttp_uri_get_port(uri);
    if (u->port < 0)
        u->port = u->https ? 443 : 80;
    const char *path = evhttp_uri_get_path(uri);
    u->prefix = util_xstrdup(path ? path : "");
    if (u->t->api_key != NULL) {
        size_t n = strlen(u->t->api_key) + 8;
        u->auth_header = util_xmalloc(n);
        snprintf(u->auth_header, n, "Bearer %s", u->t->api_key);
    }
    if ((u->https && u->port == 443) || (!u->https && u->port == 80))
        snprintf(u->host_header, sizeof u->host_header, "%s", host);
    else
        snprintf(u->host_header, sizeof u->host_header, "%s:%d", host, u->port);
    evhttp_uri_free(uri);
    return 0;
bad:
    if (uri)
        evhttp_uri_free(uri);
    return util_err_set(err, LLMGW_EINVAL, "tier '%s': cannot parse base_url '%s'", u->t->name,
                        url);
}

int gw_upstream_new(gw_upstream **out, struct event_base *base, struct evdns_base *dns,
                    const gw_tier_cfg *t, util_err *err)
{
    gw_upstream *u = util_xcalloc(1, sizeof *u);
    u->base = base;
    u->reaper = event_new(base, -1, 0, reap_cb, u);
    u->dns = dns;
    u->t = t;
    int rc = parse_url(u, t->base_url, err);
    if (rc == 0 && u->https)
        rc = gw_tls_client_ctx(&u->ssl, t->tls_verify, t->ca_file, err);
    if (rc != 0) {
        gw_upstream_free(u);
        return rc;
    }
    if (u->https && !t->tls_verify)
        UTIL_LOG_WARN("upstream", "tier '%s': TLS certificate verification is off", t->name);
    *out = u;
    return 0;
}

static void reap_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    gw_upstream *u = arg;
    while (u->zombies != NULL) {
        zombie *z = u->zombies;
        u->zombies = z->next;
        evhttp_connection_free(z->evcon);
        free(z);
    }
}

/* Takes pc out of the pool; its evhttp connection is freed by the reaper event (we may be
 * inside one of its callbacks now), or by gw_upstream_free if the loop has stopped. */
static void pconn_discard(pconn *pc)
{
    gw_upstream *u = pc->u;
    if (pc->dead)
        return;
    pc->dead = true;
    for (pconn **l = &u->conns; *l != NULL; l = &(*l)->next) {
        if (*l == pc) {
            *l = pc->next;
            break;
        }
    }
    u->n_open--;
    if (pc->call != NULL)
        u->n_busy--;
    evhttp_connection_set_closecb(pc->evcon, NULL, NULL);
    zombie *z = util_xcalloc(1, sizeof *z);
    z->evcon = pc->evcon;
    z->next = u->zombies;
    u->zombies = z;
    event_active(u->reaper, EV_TIMEOUT, 1);
    free(pc);
}

static void pconn_closed_cb(struct evhttp_connection *evcon, void *arg)
{
    (void)evcon;
    pconn *pc = arg;
    if (pc->call == NULL)      /* an idle keep-alive connection the server closed */
        pconn_discard(pc);
}

static void call_free(gw_upstream_call *c)
{
    if (c->timer)
        event_free(c->timer);
    free(c->path);
    free(c->body);
    free(c);
}

/* Ends a call: hands its connection back (or discards it), then tells the user, last. */
static void call_finish(gw_upstream_call *c, gw_upstream_error err, bool reuse)
{
    gw_upstream *u = c->u;
    pconn *pc = c->pc;
    c->req = NULL;
    if (c->timer)
        event_del(c->timer);
    if (pc != NULL) {
        if (reuse && !pc->dead) {
            pc->call = NULL;
            u->n_busy--;
        } else {
            pconn_discard(pc);
        }
        c->pc = NULL;
    }
    gw_upstream_cbs cbs = c->cbs;
    void *arg = c->arg;
    call_free(c);
    dispatch(u);
    if (cbs.on_done)
        cbs.on_done(arg, err);
}

static int header_cb(struct evhttp_request *req, void *arg)
{
    gw_upstream_call *c = arg;
    c->got_headers = true;
    if (c->timer)
        event_del(c->timer);
    if (c->cbs.on_headers)
        c->cbs.on_headers(c->arg, evhttp_request_get_response_code(req),
                          evhttp_request_get_input_headers(req));
    return 0;
}

static void chunk_cb(struct evhttp_request *req, void *arg)
{
    gw_upstream_call *c = arg;
    struct evbuffer *in = evhttp_request_get_input_buffer(req);
    if (c->cbs.on_body)
        c->cbs.on_body(c->arg, in);
    evbuffer_drain(in, evbuffer_get_length(in));
}

static void error_cb(enum evhttp_request_error e, void *arg)
{
    gw_upstream_call *c = arg;
    switch (e) {
    case EVREQ_HTTP_REQUEST_CANCEL: return;
    case EVREQ_HTTP_TIMEOUT: c->err = GW_UP_TIMEOUT; break;
    /* EOF while waiting for the response: the server took the connection (and maybe the
     * request) and closed it without a word. Not a connect failure: say what happened. */
    case EVREQ_HTTP_EOF: c->err = c->got_headers ? GW_UP_BROKEN : GW_UP_CLOSED; break;
    default: c->err = c->got_headers ? GW_UP_BROKEN : GW_UP_CONNECT; break;
    }
}

static void done_cb(struct evhttp_request *req, void *arg)
{
    gw_upstream_call *c = arg;
    if (req == NULL) {                                   /* error_cb ran just before */
        call_finish(c, c->err ? c->err : GW_UP_BROKEN, false);
        return;
    }
    if (evhttp_request_get_response_code(req) == 0) {    /* the connect itself failed */
        call_finish(c, GW_UP_CONNECT, false);
        return;
    }
    /* Whatever the body held and the chunk callback has not seen yet. */
    struct evbuffer *in = evhttp_request_get_input_buffer(req);
    if (evbuffer_get_length(in) > 0 && c->cbs.on_body)
        c->cbs.on_body(c->arg, in);
    const char *conn = evhttp_find_header(evhttp_request_get_input_headers(req), "Connection");
    bool reuse = conn == NULL || strcasecmp(conn, "close") != 0;
    call_finish(c, GW_UP_OK, reuse);
}

/* The connect deadline: a socket not connected by now is a connect failure. */
static void connect_deadline_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    gw_upstream_call *c = arg;
    if (c->pc == NULL || c->got_headers)
        return;
    struct bufferevent *bev = evhttp_connection_get_bufferevent(c->pc->evcon);
    evutil_socket_t s = bev ? bufferevent_getfd(bev) : -1;
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (s >= 0 && getpeername(s, (struct sockaddr *)&ss, &sl) == 0)
        return;  /* connected; from here on the read timeout applies */
    struct evhttp_request *req = c->req;
    c->req = NULL;
    if (req != NULL)
        evhttp_cancel_request(req);
    call_finish(c, GW_UP_CONNECT, false);
}

static pconn *pconn_open(gw_upstream *u)
{
    struct bufferevent *bev = NULL;
    if (u->https) {
        SSL *ssl = SSL_new(u->ssl);
        if (ssl == NULL)
            return NULL;
        SSL_set_tlsext_host_name(ssl, u->host);
        if (u->t->tls_verify) {
            X509_VERIFY_PARAM *vp = SSL_get0_param(ssl);
            if (X509_VERIFY_PARAM_set1_ip_asc(vp, u->host) != 1)
                SSL_set1_host(ssl, u->host);
        }
        bev = bufferevent_openssl_socket_new(u->base, -1, ssl, BUFFEREVENT_SSL_CONNECTING,
                                             BEV_OPT_CLOSE_ON_FREE | BEV_OPT_DEFER_CALLBACKS);
        if (bev == NULL) {
            SSL_free(ssl);
            return NULL;
        }
        bufferevent_openssl_set_allow_dirty_shutdown(bev, 1);
    }
    struct evhttp_connection *evcon =
        evhttp_connection_base_bufferevent_new(u->base, u->dns, bev, u->host,
                                               (unsigned short)u->port);
    if (evcon == NULL) {
        if (bev)
            bufferevent_free(bev);
        return NULL;
    }
    struct timeval tv = {u->t->timeout_ms / 1000, (u->t->timeout_ms % 1000) * 1000};
    evhttp_connection_set_timeout_tv(evcon, &tv);
    evhttp_connection_set_retries(evcon, 0);
    evhttp_connection_set_max_headers_size(evcon, 64 * 1024);
    pconn *pc = util_xcalloc(1, sizeof *pc);
    pc->u = u;
    pc->evcon = evcon;
    evhttp_connection_set_closecb(evcon, pconn_closed_cb, pc);
    pc->next = u->conns;
    u->conns = pc;
    u->n_open++;
    return pc;
}

static void call_send(gw_upstream_call *c, pconn *pc)
{
    gw_upstream *u = c->u;
    c->pc = pc;
    pc->call = c;
    u->n_busy++;
    struct evhttp_request *req = evhttp_request_new(done_cb, c);
    evhttp_request_set_header_cb(req, header_cb);
    evhttp_request_set_chunked_cb(req, chunk_cb);
    evhttp_request_set_error_cb(req, error_cb);
    struct evkeyvalq *h = evhttp_request_get_output_headers(req);
    evhttp_add_header(h, "Host", u->host_header);
    evhttp_add_header(h, "Accept", "application/json, text/event-stream");
    evhttp_add_header(h, "User-Agent", "llmgw");
    if (c->request_id[0])
        evhttp_add_header(h, "X-Request-Id", c->request_id);
    if (u->auth_header != NULL)
        evhttp_add_header(h, "Authorization", u->auth_header);
    if (c->method == EVHTTP_REQ_POST) {
        evhttp_add_header(h, "Content-Type", "application/json");
        evbuffer_add(evhttp_request_get_output_buffer(req), c->body, c->len);
    }
    c->req = req;
    if (evhttp_make_request(pc->evcon, req, c->method, c->path) != 0) {
        /* evhttp_make_request frees req on failure. */
        c->req = NULL;
        call_finish(c, GW_UP_CONNECT, false);
        return;
    }
    if (c->fresh_conn) {
        struct timeval tv = {u->t->connect_timeout_ms / 1000,
                             (u->t->connect_timeout_ms % 1000) * 1000};
        event_assign(c->timer, u->base, -1, 0, connect_deadline_cb, c);
        event_add(c->timer, &tv);
    }
}

static pconn *idle_conn(gw_upstream *u)
{
    for (pconn *pc = u->conns; pc != NULL; pc = pc->next)
        if (pc->call == NULL && !pc->dead)
            return pc;
    return NULL;
}

static void dispatch(gw_upstream *u)
{
    while (u->wait_head != NULL) {
        pconn *pc = idle_conn(u);
        bool fresh = false;
        if (pc == NULL && u->n_open < u->t->max_connections) {
            pc = pconn_open(u);
            fresh = true;
        }
        if (pc == NULL)
            return;
        gw_upstream_call *c = u->wait_head;
        u->wait_head = c->next_waiting;
        if (u->wait_head == NULL)
            u->wait_tail = NULL;
        u->n_waiting--;
        c->queued = false;
        c->fresh_conn = fresh;
        call_send(c, pc);
    }
}

static void start_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    gw_upstream_call *c = arg;
    gw_upstream *u = c->u;
    if (u->n_waiting >= MAX_WAITING) {
        call_finish(c, GW_UP_QUEUE, false);
        return;
    }
    c->queued = true;
    if (u->wait_tail)
        u->wait_tail->next_waiting = c;
    else
        u->wait_head = c;
    u->wait_tail = c;
    u->n_waiting++;
    dispatch(u);
}

int gw_upstream_call_start(gw_upstream *u, const char *method, const char *path,
                           const char *body, size_t len, const char *request_id,
                           const gw_upstream_cbs *cbs, void *arg, gw_upstream_call **out)
{
    gw_upstream_call *c = util_xcalloc(1, sizeof *c);
    c->u = u;
    c->cbs = *cbs;
    c->arg = arg;
    c->method = strcmp(method, "GET") == 0 ? EVHTTP_REQ_GET : EVHTTP_REQ_POST;
    size_t a = strlen(u->prefix), b = strlen(path);
    c->path = util_xmalloc(a + b + 1);
    memcpy(c->path, u->prefix, a);
    memcpy(c->path + a, path, b + 1);
    if (len > 0) {
        c->body = util_xmalloc(len);
        memcpy(c->body, body, len);
        c->len = len;
    }
    if (request_id != NULL)
        snprintf(c->request_id, sizeof c->request_id, "%s", request_id);
    /* Start from an event made active now (it runs in this loop turn, after the current
     * callback) so callbacks never run inside this call, without a trip through the timers. */
    c->timer = event_new(u->base, -1, 0, start_cb, c);
    if (c->timer == NULL) {
        call_free(c);
        return LLMGW_ENOMEM;
    }
    event_active(c->timer, EV_TIMEOUT, 1);
    *out = c;
    return 0;
}

void gw_upstream_call_cancel(gw_upstream_call *c)
{
    if (c == NULL)
        return;
    gw_upstream *u = c->u;
    c->cbs = (gw_upstream_cbs){0};
    if (c->queued) {
        gw_upstream_call **l = &u->wait_head;
        gw_upstream_call *prev = NULL;
        for (; *l != NULL && *l != c; l = &(*l)->next_waiting)
            prev = *l;
        if (*l == c) {
            *l = c->next_waiting;
            if (u->wait_tail == c)
                u->wait_tail = prev;
            u->n_waiting--;
        }
        call_free(c);
        return;
    }
    if (c->req != NULL) {
        struct evhttp_request *req = c->req;
        c->req = NULL;
        evhttp_cancel_request(req);
        call_finish(c, GW_UP_OK, false);  /* callbacks are cleared: this only cleans up */
        return;
    }
    call_free(c);  /* not started yet: the start event is still pending */
}

void gw_upstream_stats(const gw_upstream *u, int *open, int *busy, int *queued)
{
    *open = u->n_open;
    *busy = u->n_busy;
    *queued = u->n_waiting;
}

void gw_upstream_free(gw_upstream *u)
{
    if (u == NULL)
        return;
    while (u->wait_head != NULL)
        gw_upstream_call_cancel(u->wait_head);
    while (u->conns != NULL) {
        pconn *pc = u->conns;
        if (pc->call != NULL)
            gw_upstream_call_cancel(pc->call);
        else
            pconn_discard(pc);
    }
    reap_cb(-1, 0, u);
    event_free(u->reaper);
    if (u->ssl)
        SSL_CTX_free(u->ssl);
    free(u->host);
    free(u->prefix);
    free(u->auth_header);
    free(u);
}
