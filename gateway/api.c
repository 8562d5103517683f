/* gateway/api.c: the top of the request path: the OpenAI-compatible endpoints and a
 * request's life on the loop thread. A request arrives from http.c (hooks.request): limits,
 * request id, auth, parse and validate, then the pipeline (gateway/pipeline.h) for generation
 * or a direct answer for the others; when its answer is over (hooks.reply_done) it is
 * accounted for (metrics, access log) and freed. */
#include "gateway/api.h"

#include "gateway/accesslog.h"

#include "common/log.h"
#include "common/time.h"
#include "gateway/cache.h"
#include "gateway/engine_tier.h"
#include "gateway/http.h"
#include "gateway/pipeline.h"
#include "gateway/reply.h"
#include "gateway/route.h"
#include "gateway/tier.h"
#include "router/alias.h"

#include <cjson/cJSON.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <openssl/rand.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static struct evhttp_request *ereq_of(gw_req *r)
{
    return r->io_ctx;
}

void gw_api_declare_metrics(gw_metrics *m)
{
    gw_cache_declare_metrics(m);
    gw_router_declare_metrics(m);
    gw_pipeline_declare_metrics(m);
    gw_upstream_tier_declare_metrics(m);
    gw_engines_declare_metrics(m);
    gw_metrics_declare(m, "llmgw_requests_total", GW_METRIC_COUNTER,
                       "Requests answered, by endpoint, status and tier.");
    gw_metrics_declare(m, "llmgw_request_duration_seconds", GW_METRIC_HISTOGRAM,
                       "Time from request dispatch to the last byte, by endpoint.");
    gw_metrics_declare(m, "llmgw_in_flight_requests", GW_METRIC_GAUGE,
                       "Requests being answered now.");
    gw_metrics_declare(m, "llmgw_connections", GW_METRIC_GAUGE, "Open client connections.");
    gw_metrics_declare(m, "llmgw_connections_accepted_total", GW_METRIC_COUNTER,
                       "Client connections accepted.");
    gw_metrics_declare(m, "llmgw_connections_shed_total", GW_METRIC_COUNTER,
                       "Idle connections closed to make room at max_connections, by reason.");
    gw_metrics_declare(m, "llmgw_slow_clients_closed_total", GW_METRIC_COUNTER,
                       "Connections closed for not sending a whole request in time.");
    gw_metrics_declare(m, "llmgw_client_disconnects_total", GW_METRIC_COUNTER,
                       "Requests whose client went away before the answer was complete.");
    gw_metrics_declare(m, "llmgw_auth_failures_total", GW_METRIC_COUNTER,
                       "Requests refused for a missing or unknown API key.");
    gw_metrics_declare(m, "llmgw_rate_limited_total", GW_METRIC_COUNTER,
                       "Requests refused by a key's rate limit, by key group.");
    gw_metrics_declare(m, "llmgw_tokens_total", GW_METRIC_COUNTER,
                       "Tokens reported by upstream usage, by tier and kind.");
}

static double secs(uint64_t ns)
{
    return (double)ns * 1e-9;
}

/* Appends s as a JSON string. Our strings (ids, names, groups) are printable ASCII already;
 * anything else is escaped as \u00XX so the line stays valid JSON whatever a config holds. */
static void json_str(struct evbuffer *b, const char *s)
{
    evbuffer_add(b, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p < 0x20 || *p == '"' || *p == '\\' || *p >= 0x7f)
            evbuffer_add_printf(b, "\\u%04x", *p);
        else
            evbuffer_add(b, p, 1);
    }
    evbuffer_add(b, "\"", 1);
}

/* One JSON line per request; never the prompt or the answer. Written with one write(). */
static void access_log(gw_req *r, uint64_t now)
{
    gw_alog *log = r->srv->access_log;
    if (log == NULL)
        return;
    char ts[40];
    uint64_t wall = util_wall_ms();
    time_t sec = (time_t)(wall / 1000);
    struct tm tm;
    gmtime_r(&sec, &tm);
    size_t n = strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(ts + n, sizeof ts - n, ".%03uZ", (unsigned)(wall % 1000));
    struct evbuffer *b = evbuffer_new();
    evbuffer_add_printf(b, "{\"ts\":\"%s\",\"id\":", ts);
    json_str(b, r->id);
    evbuffer_add_printf(b, ",\"endpoint\":\"%s\",\"status\":%d", r->endpoint, r->status);
    if (r->tier >= 0) {
        evbuffer_add(b, ",\"tier\":", 8);
        json_str(b, r->srv->cfg->tiers[r->tier].name);
    }
    if (r->group) {
        evbuffer_add(b, ",\"group\":", 9);
        json_str(b, r->group);
    }
    if (r->body.json)
        evbuffer_add_printf(b, ",\"stream\":%s", r->body.stream ? "true" : "false");
    evbuffer_add_printf(b, ",\"duration_us\":%llu",
                        (unsigned long long)((now - r->t_start) / 1000));
    if (r->t_first_byte)
        evbuffer_add_printf(b, ",\"ttfb_us\":%llu",
                            (unsigned long long)((r->t_first_byte - r->t_start) / 1000));
    evbuffer_add_printf(b, ",\"bytes\":%zu", r->bytes_out);
    if (r->attempts)
        evbuffer_add_printf(b, ",\"attempts\":%d,\"upstream_status\":%d", r->attempts,
                            r->upstream_status);
    if (r->fell_back) {
        evbuffer_add(b, ",\"fallback_from\":", 17);
        json_str(b, r->srv->cfg->tiers[r->first_tier].name);
    }
    if (r->prompt_tokens || r->completion_tokens)
        evbuffer_add_printf(b, ",\"prompt_tokens\":%ld,\"completion_tokens\":%ld",
                            r->prompt_tokens, r->completion_tokens);
    if (r->client_gone)
        evbuffer_add(b, ",\"client_gone\":true", 19);
    const char *cache = gw_cache_state_name(r);
    if (cache != NULL)
        evbuffer_add_printf(b, ",\"cache\":\"%s\"", cache);
    const char *reason = gw_route_reason(r);
    if (reason != NULL) {
        evbuffer_add(b, ",\"route\":", 9);
        json_str(b, reason);
    }
    evbuffer_add(b, "}\n", 2);
    gw_alog_add(log, b);
    evbuffer_free(b);
}

/* hooks.reply_done: the end of every request: metrics, access log, connection bookkeeping,
 * memory. */
static void finish(gw_req *r)
{
    gw_server *s = r->srv;
    uint64_t now = util_now_ns();
    const char *tier = r->tier >= 0 ? s->cfg->tiers[r->tier].name : "";
    char labels[256];
    snprintf(labels, sizeof labels, "endpoint=\"%s\",status=\"%d\",tier=\"%s\"", r->endpoint,
             r->status, tier);
    gw_metrics_add(s->metrics, "llmgw_requests_total", labels, 1);
    snprintf(labels, sizeof labels, "endpoint=\"%s\"", r->endpoint);
    gw_metrics_observe(s->metrics, "llmgw_request_duration_seconds", labels,
                       secs(now - r->t_start));
    if (r->tier >= 0 && (r->prompt_tokens || r->completion_tokens)) {
        snprintf(labels, sizeof labels, "tier=\"%s\",kind=\"prompt\"", tier);
        gw_metrics_add(s->metrics, "llmgw_tokens_total", labels, (double)r->prompt_tokens);
        snprintf(labels, sizeof labels, "tier=\"%s\",kind=\"completion\"", tier);
        gw_metrics_add(s->metrics, "llmgw_tokens_total", labels, (double)r->completion_tokens);
    }
    access_log(r, now);
    if (r->conn != NULL && r->conn->active == r)
        gw_conn_request_done(r->conn);
    s->in_flight--;
    gw_metrics_set(s->metrics, "llmgw_in_flight_requests", NULL, s->in_flight);
    gw_pipeline_release(r);
    gw_reply_release(r);
    gw_request_deinit(&r->body);
    util_arena_deinit(&r->arena);
    free(r);
    gw_server_maybe_exit(s);
}

/* hooks.client_gone: the client left before its answer was complete. */
static void client_gone(gw_req *r)
{
    r->io_ctx = NULL;
    r->conn = NULL;
    gw_pipeline_abort(r);
    if (!r->replying)
        r->status = 499;  /* nginx's "client closed request" */
    gw_metrics_add(r->srv->metrics, "llmgw_client_disconnects_total", NULL, 1);
    gw_reply_abandon(r);
}

/* ---- endpoints -------------------------------------------------------------------------- */

static cJSON *model_object(const char *id, double created)
{
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", id);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", created);
    cJSON_AddStringToObject(m, "owned_by", "llmgw");
    return m;
}

static void handle_models(gw_req *r, const char *one)
{
    const gw_config *c = r->srv->cfg;
    double created = (double)(util_wall_ms() / 1000);
    if (one != NULL) {
        if (router_alias_find(r->srv->models, one) < 0) {
            gw_reply_model_not_found(r, one);
            return;
        }
        gw_reply_json(r, 200, model_object(one, created));
        return;
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "object", "list");
    cJSON *data = cJSON_AddArrayToObject(o, "data");
    for (size_t i = 0; i < c->n_tiers; i++) {
        cJSON_AddItemToArray(data, model_object(c->tiers[i].name, created));
        for (size_t a = 0; a < c->tiers[i].n_aliases; a++)
            cJSON_AddItemToArray(data, model_object(c->tiers[i].aliases[a], created));
    }
    gw_reply_json(r, 200, o);
}

static void handle_metrics(gw_req *r)
{
    gw_server *s = r->srv;
    gw_cache_metrics(s->cache, s->metrics);
    for (size_t i = 0; i < s->cfg->n_tiers; i++)
        if (s->tiers[i] != NULL)
            s->tiers[i]->ops->metrics(s->tiers[i], s->metrics);
    struct evbuffer *b = evbuffer_new();
    gw_metrics_render(s->metrics, b);
    gw_reply_body(r, 200, "text/plain; version=0.0.4; charset=utf-8", b);
    evbuffer_free(b);
}

static void handle_generate(gw_req *r, gw_endpoint ep, bool dry_run)
{
    struct evbuffer *in = evhttp_request_get_input_buffer(ereq_of(r));
    size_t len = evbuffer_get_length(in);
    if (len > r->srv->cfg->limits.max_body_bytes) {
        gw_reply_error(r, 413, "invalid_request_error", NULL, "request_too_large",
                       "The request body is %zu bytes; this gateway accepts at most %zu.", len,
                       r->srv->cfg->limits.max_body_bytes);
        return;
    }
    gw_req_error e;
    const char *body = (const char *)evbuffer_pullup(in, -1);
    if (gw_request_parse(&r->body, ep, body ? body : "", len, &r->arena, &e) != 0) {
        gw_reply_error(r, e.status, e.type, e.param, e.code, "%s", e.message);
        return;
    }
    gw_pipeline_start(r, dry_run);
}

static bool header_too_large(gw_req *r)
{
    size_t total = strlen(evhttp_request_get_uri(ereq_of(r)));
    for (struct evkeyval *kv = evhttp_request_get_input_headers(ereq_of(r))->tqh_first; kv != NULL;
         kv = kv->next.tqe_next)
        total += strlen(kv->key) + strlen(kv->value) + 4;
    return total > r->srv->cfg->limits.max_header_bytes;
}

/* RFC 9112 6.3: Content-Length values that disagree, or Content-Length beside
 * Transfer-Encoding, leave the body's end in doubt. Behind another proxy that reads the other
 * one, that is request smuggling, so such a request is refused and its connection closed. */
static const char *framing_conflict(gw_req *r)
{
    const char *cl = NULL;
    bool te = false;
    for (struct evkeyval *kv = evhttp_request_get_input_headers(ereq_of(r))->tqh_first; kv != NULL;
         kv = kv->next.tqe_next) {
        if (!strcasecmp(kv->key, "Transfer-Encoding"))
            te = true;
        if (strcasecmp(kv->key, "Content-Length") != 0)
            continue;
        if (cl != NULL && strcmp(cl, kv->value) != 0)
            return "The request has two Content-Length headers with different values.";
        cl = kv->value;
    }
    if (cl != NULL && te)
        return "The request has both Content-Length and Transfer-Encoding headers.";
    return NULL;
}

static void set_request_id(gw_req *r)
{
    const char *given = evhttp_find_header(evhttp_request_get_input_headers(ereq_of(r)),
                                           "x-request-id");
    if (given != NULL) {
        size_t n = strlen(given);
        bool ok = n > 0 && n < sizeof r->id;
        for (size_t i = 0; ok && i < n; i++)
            ok = given[i] > 0x20 && given[i] < 0x7f;
        if (ok) {
            memcpy(r->id, given, n + 1);
            return;
        }
    }
    unsigned char rnd[12];
    if (RAND_bytes(rnd, sizeof rnd) != 1)
        memset(rnd, 0, sizeof rnd);
    int n = snprintf(r->id, sizeof r->id, "req_");
    for (size_t i = 0; i < sizeof rnd; i++)
        n += snprintf(r->id + n, sizeof r->id - (size_t)n, "%02x", rnd[i]);
}

static bool authorize(gw_req *r)
{
    gw_auth_result a;
    const char *h = evhttp_find_header(evhttp_request_get_input_headers(ereq_of(r)),
                                       "Authorization");
    gw_auth_check(r->srv->auth, h, util_now_ns(), &a);
    r->group = a.group;
    switch (a.status) {
    case GW_AUTH_OK:
        return true;
    case GW_AUTH_MISSING:
        gw_metrics_add(r->srv->metrics, "llmgw_auth_failures_total", NULL, 1);
        gw_reply_header(r, "WWW-Authenticate", "Bearer");
        gw_reply_error(r, 401, "invalid_request_error", NULL, "missing_api_key",
                       "You didn't provide an API key. You need to provide your API key in an "
                       "Authorization header using Bearer auth (i.e. Authorization: Bearer "
                       "YOUR_KEY).");
        return false;
    case GW_AUTH_INVALID:
        gw_metrics_add(r->srv->metrics, "llmgw_auth_failures_total", NULL, 1);
        gw_reply_error(r, 401, "invalid_request_error", NULL, "invalid_api_key",
                       "Incorrect API key provided.");
        return false;
    case GW_AUTH_LIMITED: {
        char labels[200], retry[24];
        snprintf(labels, sizeof labels, "group=\"%s\"", a.group);
        gw_metrics_add(r->srv->metrics, "llmgw_rate_limited_total", labels, 1);
        unsigned long s = (unsigned long)((a.retry_after_ns + 999999999u) / 1000000000u);
        snprintf(retry, sizeof retry, "%lu", s ? s : 1);
        gw_reply_header(r, "Retry-After", retry);
        gw_reply_error(r, 429, "requests", NULL, "rate_limit_exceeded",
                       "Rate limit reached for this API key (group '%s'). Retry after %s s.",
                       a.group, retry);
        return false;
    }
    }
    return false;
}

static const char *method_name(enum evhttp_cmd_type m)
{
    switch (m) {
    case EVHTTP_REQ_GET: return "GET";
    case EVHTTP_REQ_POST: return "POST";
    case EVHTTP_REQ_HEAD: return "HEAD";
    case EVHTTP_REQ_PUT: return "PUT";
    case EVHTTP_REQ_DELETE: return "DELETE";
    case EVHTTP_REQ_OPTIONS: return "OPTIONS";
    case EVHTTP_REQ_PATCH: return "PATCH";
    default: return "OTHER";
    }
}

static void route(gw_req *r, const char *path, enum evhttp_cmd_type m)
{
    static const struct {
        const char *path;
        gw_endpoint ep;
        const char *name;
        const char *upstream;
    } gen[] = {
        {"/v1/chat/completions", GW_EP_CHAT, "chat", "/chat/completions"},
        {"/v1/completions", GW_EP_COMPLETIONS, "completions", "/completions"},
        {"/v1/embeddings", GW_EP_EMBEDDINGS, "embeddings", "/embeddings"},
    };
    if (!strcmp(path, "/healthz") || !strcmp(path, "/readyz")) {
        bool ready = path[1] == 'h' || (!r->srv->draining && r->srv->cfg->n_tiers > 0);
        r->endpoint = path[1] == 'h' ? "healthz" : "readyz";
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "status", ready ? "ok" : "unavailable");
        if (path[1] == 'r')
            gw_router_status(r->srv->router, o);
        gw_reply_json(r, ready ? 200 : 503, o);
        return;
    }
    if (!strcmp(path, "/metrics") && m == EVHTTP_REQ_GET) {
        r->endpoint = "metrics";
        handle_metrics(r);
        return;
    }
    for (size_t i = 0; i < sizeof gen / sizeof gen[0]; i++) {
        if (strcmp(path, gen[i].path) != 0)
            continue;
        r->endpoint = gen[i].name;
        r->path = gen[i].upstream;
        if (m != EVHTTP_REQ_POST) {
            gw_reply_header(r, "Allow", "POST");
            gw_reply_error(r, 405, "invalid_request_error", NULL, "method_not_allowed",
                           "Invalid method for URL (%s %s): use POST.", method_name(m), path);
        } else if (authorize(r)) {
            handle_generate(r, gen[i].ep, false);
        }
        return;
    }
    if (!strcmp(path, "/v1/llmgw/route")) {
        r->endpoint = "route";
        if (m != EVHTTP_REQ_POST) {
            gw_reply_header(r, "Allow", "POST");
            gw_reply_error(r, 405, "invalid_request_error", NULL, "method_not_allowed",
                           "Invalid method for URL (%s %s): use POST.", method_name(m), path);
        } else if (authorize(r)) {
            handle_generate(r, GW_EP_CHAT, true);
        }
        return;
    }
    if (!strcmp(path, "/v1/models") || !strncmp(path, "/v1/models/", 11)) {
        r->endpoint = "models";
        if (m != EVHTTP_REQ_GET)
            gw_reply_error(r, 405, "invalid_request_error", NULL, "method_not_allowed",
                           "Invalid method for URL (%s %s): use GET.", method_name(m), path);
        else if (authorize(r))
            handle_models(r, path[10] == '/' ? path + 11 : NULL);
        return;
    }
    r->endpoint = "unknown";
    gw_reply_error(r, 404, "invalid_request_error", NULL, "unknown_url",
                   "Invalid URL (%s %s).", method_name(m), path);
}

static void handle(gw_server *s, struct evhttp_request *ereq)
{
    gw_req *r = util_xcalloc(1, sizeof *r);
    r->srv = s;
    r->io = &gw_http_transport;
    r->io_ctx = ereq;
    r->tier = r->first_tier = -1;
    r->t_start = util_now_ns();
    r->endpoint = "unknown";
    util_arena_init(&r->arena, 4096);
    r->conn = gw_conn_of(s, ereq);
    if (r->conn != NULL) {
        event_del(r->conn->deadline);
        r->conn->active = r;
    }
    s->in_flight++;
    gw_metrics_set(s->metrics, "llmgw_in_flight_requests", NULL, s->in_flight);
    set_request_id(r);
    if (header_too_large(r)) {
        gw_reply_error(r, 431, "invalid_request_error", NULL, "headers_too_large",
                       "The request headers are larger than %zu bytes.",
                       s->cfg->limits.max_header_bytes);
        return;
    }
    const char *conflict = framing_conflict(r);
    if (conflict != NULL) {
        gw_reply_header(r, "Connection", "close");
        gw_reply_error(r, 400, "invalid_request_error", NULL, "invalid_framing", "%s",
                       conflict);
        return;
    }
    const struct evhttp_uri *uri = evhttp_request_get_evhttp_uri(ereq);
    const char *path = uri ? evhttp_uri_get_path(uri) : NULL;
    char clean[256];
    snprintf(clean, sizeof clean, "%s", path && *path ? path : "/");
    size_t n = strlen(clean);
    while (n > 1 && clean[n - 1] == '/')
        clean[--n] = '\0';
    gw_conn *c = r->conn;  /* r may be finished (and freed) by route() */
    route(r, clean, evhttp_request_get_command(ereq));
    if (c != NULL && c->active != NULL)
        gw_conn_watch_close(c);
}

void gw_api_init(gw_server *s)
{
    s->hooks.request = handle;
    s->hooks.client_gone = client_gone;
    s->hooks.reply_done = finish;
    gw_pipeline_init(s);
}
