/* gateway/http.c: listeners (HTTP and HTTPS on libevent evhttp), connection accounting,
 * slow-client deadlines, max connections and graceful shutdown.
 *
 * evhttp (2.1) tells us nothing when it accepts a connection, only when it reads a request.
 * To count connections and keep a per-connection deadline we need to know both ends of each
 * connection's life. bev_cb (our bufferevent factory) sees the start; right after it, a
 * top-priority event (it runs before any I/O of this loop turn) finds the new
 * evhttp_connection through the bufferevent's callback argument and installs our close
 * callback, which sees the end. */
#include "gateway/http.h"

#include "common/log.h"
#include "common/time.h"
#include "gateway/tls.h"

#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <event2/listener.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static struct timeval ms_tv(int ms)
{
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    return tv;
}

static void set_accepting(gw_server *s, bool on)
{
    if (s->accept_paused == !on || s->draining)
        return;
    s->accept_paused = !on;
    for (size_t i = 0; i < s->cfg->n_listen; i++) {
        if (s->listeners[i].bound == NULL)
            continue;
        struct evconnlistener *l = evhttp_bound_socket_get_listener(s->listeners[i].bound);
        if (on)
            evconnlistener_enable(l);
        else
            evconnlistener_disable(l);
    }
    if (!on)
        UTIL_LOG_WARN("http", "max_connections (%d) reached: not accepting until one closes",
                      s->cfg->limits.max_connections);
}

/* ---- connection slots ------------------------------------------------------------------ *
 * At max_connections a new connection makes room by closing an idle one, in this order: one
 * that has sent no complete request for header_timeout_ms (an idle or slow socket, most likely
 * hostile), then the oldest idle keep-alive connection (its client reconnects when it needs to,
 * as nginx drains reusable connections), then the oldest that has sent nothing yet (its client
 * is slower than the newcomer). Connections answering a request are never closed for room;
 * when every slot answers one, the listener pauses until a slot frees. */

static void conn_link(gw_server *s, gw_conn *c)
{
    c->older = s->newest;
    c->newer = NULL;
    if (s->newest != NULL)
        s->newest->newer = c;
    else
        s->oldest = c;
    s->newest = c;
}

static void conn_unlink(gw_server *s, gw_conn *c)
{
    if (c->older != NULL)
        c->older->newer = c->newer;
    else if (s->oldest == c)
        s->oldest = c->newer;
    if (c->newer != NULL)
        c->newer->older = c->older;
    else if (s->newest == c)
        s->newest = c->older;
    c->older = c->newer = NULL;
}

/* The connection to close for room, or NULL when every one is answering a request (or is too
 * new to have been set up). Sets *stale_at to when the youngest never-used one turns stale. */
static gw_conn *conn_victim(gw_server *s, uint64_t now)
{
    uint64_t stale = (uint64_t)s->cfg->limits.header_timeout_ms * 1000000u;
    gw_conn *keepalive = NULL, *fresh = NULL;
    for (gw_conn *c = s->oldest; c != NULL; c = c->newer) {
        if (c->active != NULL || c->fd < 0)
            continue;
        if (c->n_done == 0 && now - c->accepted_ns >= stale)
            return c;
        if (c->n_done > 0 && keepalive == NULL)
            keepalive = c;
        if (c->n_done == 0 && fresh == NULL)
            fresh = c;
    }
    return keepalive != NULL ? keepalive : fresh;
}

static bool conn_evict(gw_server *s)
{
    gw_conn *v = conn_victim(s, util_now_ns());
    if (v == NULL)
        return false;
    void *cbarg = NULL;
    bufferevent_getcb(v->bev, NULL, NULL, NULL, &cbarg);
    UTIL_LOG_DEBUG("http", "max_connections: closing an idle connection (%u answered)",
                   v->n_done);
    gw_metrics_add(s->metrics, "llmgw_connections_shed_total",
                   v->n_done ? "reason=\"idle_keepalive\"" : "reason=\"no_request\"", 1);
    evhttp_connection_free(cbarg);   /* runs conn_close_cb now: n_conns drops */
    return true;
}

/* The listener is paused at max_connections: try again to make room (a connection may have
 * finished its request or grown stale since). */
static void accept_retry_cb(evutil_socket_t fd, short what, void *arg);

static void arm_accept_retry(gw_server *s)
{
    if (s->accept_retry == NULL)
        s->accept_retry = evtimer_new(s->base, accept_retry_cb, s);
    struct timeval tv = ms_tv(s->cfg->limits.header_timeout_ms / 4 + 1);
    evtimer_add(s->accept_retry, &tv);
}

/* At max_connections keep accepting while some connection could make room (conn_victim);
 * else pause until one can. */
static void pause_if_full(gw_server *s)
{
    if (s->n_conns >= s->cfg->limits.max_connections && conn_victim(s, util_now_ns()) == NULL) {
        set_accepting(s, false);
        arm_accept_retry(s);
    }
}

static void accept_retry_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    gw_server *s = arg;
    if (!s->accept_paused)
        return;
    if (s->n_conns < s->cfg->limits.max_connections || conn_victim(s, util_now_ns()) != NULL)
        set_accepting(s, true);
    else
        arm_accept_retry(s);
}

/* The end of a connection: evhttp calls this just before it frees the connection. */
static void conn_close_cb(struct evhttp_connection *evcon, void *arg)
{
    (void)evcon;
    gw_conn *c = arg;
    gw_server *s = c->srv;
    if (c->active != NULL) {
        gw_req *r = c->active;
        c->active = NULL;
        struct evhttp_request *ereq = r->io_ctx;
        if (ereq != NULL && evhttp_request_get_connection(ereq) == NULL)
            evhttp_request_free(ereq);  /* libevent detached it: it is ours to free */
        r->io_ctx = NULL;
        s->hooks.client_gone(r);
    }
    if (c->fd >= 0 && c->fd < s->conn_cap && s->conn_by_fd[c->fd] == c)
        s->conn_by_fd[c->fd] = NULL;
    conn_unlink(s, c);
    event_free(c->deadline);
    event_free(c->hook);
    if (c->close_watch)
        event_free(c->close_watch);
    free(c);
    s->n_conns--;
    gw_metrics_set(s->metrics, "llmgw_connections", NULL, s->n_conns);
    if (s->n_conns < s->cfg->limits.max_connections)
        set_accepting(s, true);
    gw_server_maybe_exit(s);
}

/* The client closed its end while its request was still being answered. evhttp reads nothing
 * while a request is in progress, so without this a client that gives up on a slow answer
 * would go unnoticed until the answer is written. Freeing the connection runs conn_close_cb,
 * which cancels the work. */
static void close_watch_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    gw_conn *c = arg;
    if (c->active == NULL)
        return;
    void *cbarg = NULL;
    bufferevent_getcb(c->bev, NULL, NULL, NULL, &cbarg);
    UTIL_LOG_DEBUG("http", "client closed the connection of a pending request");
    evhttp_connection_free(cbarg);
}

void gw_conn_watch_close(gw_conn *c)
{
    if (c->close_watch != NULL && c->active != NULL)
        event_add(c->close_watch, NULL);
}

static void stream_timeouts(gw_conn *c, bool streaming)
{
    /* evhttp keeps reading a connection while it writes a reply (to see a close), so its read
     * timeout would cut a stream whose tokens are slow to come. Writes keep their timeout. */
    struct timeval tv = ms_tv(c->srv->cfg->limits.read_timeout_ms);
    bufferevent_set_timeouts(c->bev, streaming ? NULL : &tv, &tv);
}

/* Runs right after evhttp has wrapped c->bev in a connection (see the top of this file). */
static void conn_hook_cb(evutil_socket_t fd_unused, short what, void *arg)
{
    (void)fd_unused;
    (void)what;
    gw_conn *c = arg;
    gw_server *s = c->srv;
    void *cbarg = NULL;
    bufferevent_getcb(c->bev, NULL, NULL, NULL, &cbarg);
    struct evhttp_connection *evcon = cbarg;
    evhttp_connection_set_closecb(evcon, conn_close_cb, c);
    c->fd = bufferevent_getfd(c->bev);
    if (c->fd >= s->conn_cap) {
        int cap = s->conn_cap ? s->conn_cap : 1024;
        while (cap <= c->fd)
            cap *= 2;
        gw_conn **g = util_xcalloc((size_t)cap, sizeof *g);
        if (s->conn_by_fd != NULL)
            memcpy(g, s->conn_by_fd, (size_t)s->conn_cap * sizeof *g);
        free(s->conn_by_fd);
        s->conn_by_fd = g;
        s->conn_cap = cap;
    }
    if (c->fd >= 0) {
        s->conn_by_fd[c->fd] = c;
        c->close_watch = event_new(s->base, c->fd, EV_CLOSED, close_watch_cb, c);
    }
}

static void deadline_cb(evutil_socket_t fd_unused, short what, void *arg)
{
    (void)fd_unused;
    (void)what;
    gw_conn *c = arg;
    if (c->active != NULL)
        return;
    evutil_socket_t fd = bufferevent_getfd(c->bev);
    UTIL_LOG_INFO("http", "closing a connection that sent no complete request within %d ms",
                  c->srv->cfg->limits.request_timeout_ms);
    gw_metrics_add(c->srv->metrics, "llmgw_slow_clients_closed_total", NULL, 1);
    /* libevent sees EOF on its next read and frees the connection itself. */
    if (fd >= 0)
        shutdown(fd, SHUT_RDWR);
}

static struct bufferevent *bev_cb(struct event_base *base, void *arg)
{
    gw_listener *l = arg;
    gw_server *s = l->srv;
    struct bufferevent *under;
    if (l->ssl != NULL) {
        SSL *ssl = SSL_new(l->ssl);
        if (ssl == NULL)
            return NULL;
        under = bufferevent_openssl_socket_new(base, -1, ssl, BUFFEREVENT_SSL_ACCEPTING,
                                               BEV_OPT_CLOSE_ON_FREE);
        if (under == NULL) {
            SSL_free(ssl);
            return NULL;
        }
        bufferevent_openssl_set_allow_dirty_shutdown(under, 1);
    } else {
        under = bufferevent_socket_new(base, -1, BEV_OPT_CLOSE_ON_FREE);
        if (under == NULL)
            return NULL;
    }
    /* At the limit, make room first (see "connection slots" above). */
    while (s->n_conns >= s->cfg->limits.max_connections && conn_evict(s)) {
    }
    gw_conn *c = util_xcalloc(1, sizeof *c);
    c->srv = s;
    c->fd = -1;
    c->bev = under;
    c->accepted_ns = util_now_ns();
    conn_link(s, c);
    c->deadline = evtimer_new(base, deadline_cb, c);
    struct timeval tv = ms_tv(s->cfg->limits.request_timeout_ms);
    evtimer_add(c->deadline, &tv);
    /* If evhttp fails to set the connection up (allocation failure) it frees the bufferevent
     * before the hook runs; libevent offers no way to see that case. */
    c->hook = event_new(base, -1, 0, conn_hook_cb, c);
    event_priority_set(c->hook, 0);
    event_active(c->hook, EV_TIMEOUT, 1);
    s->n_conns++;
    gw_metrics_set(s->metrics, "llmgw_connections", NULL, s->n_conns);
    gw_metrics_add(s->metrics, "llmgw_connections_accepted_total", l->ssl ? "tls=\"true\""
                                                                           : "tls=\"false\"", 1);
    pause_if_full(s);
    return c->bev;
}

/* The gw_conn of a request's connection (NULL only if its hook has not run, which the
 * priority of the hook rules out). */
gw_conn *gw_conn_of(gw_server *s, struct evhttp_request *ereq)
{
    struct evhttp_connection *evcon = evhttp_request_get_connection(ereq);
    struct bufferevent *bev = evcon ? evhttp_connection_get_bufferevent(evcon) : NULL;
    evutil_socket_t fd = bev ? bufferevent_getfd(bev) : -1;
    if (fd < 0 || fd >= s->conn_cap)
        return NULL;
    gw_conn *c = s->conn_by_fd[fd];
    return c != NULL && c->bev == bev ? c : NULL;
}

void gw_conn_request_start(gw_conn *c, gw_req *r)
{
    gw_server *s = c->srv;
    event_del(c->deadline);
    c->active = r;
    /* The slot stops being room for a newcomer: with none left, stop accepting now (else the
     * listener, still open because this one was idle, would take one connection too many). */
    if (!s->accept_paused)
        pause_if_full(s);
}

void gw_conn_request_done(gw_conn *c)
{
    c->active = NULL;
    c->n_done++;
    if (c->close_watch != NULL)
        event_del(c->close_watch);
    struct timeval tv = ms_tv(c->srv->cfg->limits.request_timeout_ms);
    evtimer_add(c->deadline, &tv);
}

void gw_server_maybe_exit(gw_server *s)
{
    if (!s->draining || s->in_flight > 0)
        return;
    /* Give the last bytes (TLS close_notify included) a moment to leave. */
    struct timeval tv = {0, 200 * 1000};
    event_base_loopexit(s->base, &tv);
}

static void drain_timeout_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    gw_server *s = arg;
    UTIL_LOG_WARN("http", "shutdown grace period over with %d request(s) in flight: exiting",
                  s->in_flight);
    event_base_loopexit(s->base, NULL);
}

static void signal_cb(evutil_socket_t sig, short what, void *arg)
{
    (void)what;
    gw_server *s = arg;
    if (s->draining) {
        UTIL_LOG_WARN("http", "second signal: exiting now");
        event_base_loopexit(s->base, NULL);
        return;
    }
    UTIL_LOG_INFO("http", "%s: no new connections; draining %d request(s)",
                  sig == SIGTERM ? "SIGTERM" : "SIGINT", s->in_flight);
    for (size_t i = 0; i < s->cfg->n_listen; i++) {
        if (s->listeners[i].bound != NULL) {
            evhttp_del_accept_socket(s->listeners[i].http, s->listeners[i].bound);
            s->listeners[i].bound = NULL;
        }
    }
    s->draining = true;
    s->drain_timer = evtimer_new(s->base, drain_timeout_cb, s);
    struct timeval tv = ms_tv(s->cfg->limits.shutdown_grace_ms);
    evtimer_add(s->drain_timer, &tv);
    gw_server_maybe_exit(s);
}

static void on_request(struct evhttp_request *ereq, void *arg)
{
    gw_server *s = arg;
    s->hooks.request(s, ereq);
}

static int listener_start(gw_server *s, gw_listener *l, const gw_listen_cfg *lc, util_err *err)
{
    int rc;
    l->srv = s;
    if (lc->tls) {
        char cert[4096], key[4096];
        if (lc->cert != NULL) {
            snprintf(cert, sizeof cert, "%s", lc->cert);
            snprintf(key, sizeof key, "%s", lc->key);
        } else if (s->dev_tls_dir != NULL) {
            if ((rc = gw_tls_dev_cert(s->dev_tls_dir, err)) != 0)
                return rc;
            snprintf(cert, sizeof cert, "%s/cert.pem", s->dev_tls_dir);
            snprintf(key, sizeof key, "%s/key.pem", s->dev_tls_dir);
        } else {
            return util_err_set(err, LLMGW_EINVAL, "%s: the TLS listener on %s:%d needs 'cert' "
                                "and 'key', or start llmgw with --dev-tls DIR", s->cfg->path,
                                lc->host, lc->port);
        }
        if ((rc = gw_tls_server_ctx(&l->ssl, cert, key, err)) != 0)
            return rc;
    }
    l->http = evhttp_new(s->base);
    if (l->http == NULL)
        return util_err_set(err, LLMGW_ENOMEM, "evhttp_new failed");
    const gw_limits_cfg *lim = &s->cfg->limits;
    /* libevent answers past these hard caps itself (HTML, connection closed); below them our
     * handler checks the configured limits and answers 413/431 in the OpenAI error shape. */
    size_t hdr_cap = lim->max_header_bytes * 2 > 65536 ? lim->max_header_bytes * 2 : 65536;
    evhttp_set_max_headers_size(l->http, (ev_ssize_t)hdr_cap);
    evhttp_set_max_body_size(l->http, (ev_ssize_t)(lim->max_body_bytes * 2 + 65536));
    struct timeval tv = ms_tv(lim->read_timeout_ms);
    evhttp_set_timeout_tv(l->http, &tv);
    evhttp_set_allowed_methods(l->http, EVHTTP_REQ_GET | EVHTTP_REQ_POST | EVHTTP_REQ_HEAD |
                                            EVHTTP_REQ_PUT | EVHTTP_REQ_DELETE |
                                            EVHTTP_REQ_OPTIONS | EVHTTP_REQ_PATCH);
    evhttp_set_gencb(l->http, on_request, s);
    evhttp_set_bevcb(l->http, bev_cb, l);
    l->bound = evhttp_bind_socket_with_handle(l->http, lc->host, (ev_uint16_t)lc->port);
    if (l->bound == NULL)
        return util_err_set(err, LLMGW_EIO, "cannot listen on %s:%d: %s", lc->host, lc->port,
                            strerror(errno));
    evutil_socket_t fd = evhttp_bound_socket_get_fd(l->bound);
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    l->port = lc->port;
    if (getsockname(fd, (struct sockaddr *)&ss, &sl) == 0)
        l->port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                                 : ((struct sockaddr_in *)&ss)->sin_port);
    UTIL_LOG_INFO("http", "listening on %s://%s:%d", lc->tls ? "https" : "http", lc->host,
                  l->port);
    return 0;
}

int gw_server_start(gw_server *s, util_err *err)
{
    int rc;
    signal(SIGPIPE, SIG_IGN);
    s->listeners = util_xcalloc(s->cfg->n_listen, sizeof *s->listeners);
    for (size_t i = 0; i < s->cfg->n_listen; i++)
        if ((rc = listener_start(s, &s->listeners[i], &s->cfg->listen[i], err)) != 0)
            return rc;
    s->sig_term = evsignal_new(s->base, SIGTERM, signal_cb, s);
    s->sig_int = evsignal_new(s->base, SIGINT, signal_cb, s);
    evsignal_add(s->sig_term, NULL);
    evsignal_add(s->sig_int, NULL);
    return 0;
}

void gw_server_stop(gw_server *s)
{
    if (s->listeners != NULL) {
        for (size_t i = 0; i < s->cfg->n_listen; i++) {
            if (s->listeners[i].http)
                evhttp_free(s->listeners[i].http);
            if (s->listeners[i].ssl)
                SSL_CTX_free(s->listeners[i].ssl);
        }
        free(s->listeners);
        s->listeners = NULL;
    }
    if (s->sig_term)
        event_free(s->sig_term);
    if (s->sig_int)
        event_free(s->sig_int);
    if (s->drain_timer)
        event_free(s->drain_timer);
    if (s->accept_retry)
        event_free(s->accept_retry);
    s->sig_term = s->sig_int = s->drain_timer = s->accept_retry = NULL;
}

/* ---- the transport ------------------------------------------------------------------------ */

static const char *t_header(gw_req *r, const char *name)
{
    return evhttp_find_header(evhttp_request_get_input_headers(r->io_ctx), name);
}

static void t_add_header(gw_req *r, const char *name, const char *value)
{
    evhttp_add_header(evhttp_request_get_output_headers(r->io_ctx), name, value);
}

static void t_send(gw_req *r, int status, struct evbuffer *body)
{
    evhttp_send_reply(r->io_ctx, status, NULL, body);
}

static void t_start(gw_req *r, int status)
{
    evhttp_send_reply_start(r->io_ctx, status, NULL);
    if (r->conn != NULL)
        stream_timeouts(r->conn, true);
}

static void t_chunk(gw_req *r, struct evbuffer *data)
{
    evhttp_send_reply_chunk(r->io_ctx, data);
}

static void t_end(gw_req *r)
{
    if (r->conn != NULL)
        stream_timeouts(r->conn, false);
    evhttp_send_reply_end(r->io_ctx);
}

const gw_transport gw_http_transport = {t_header, t_add_header, t_send, t_start, t_chunk, t_end};
