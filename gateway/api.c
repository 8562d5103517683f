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
#include "gateway/dashboard.h"
#include "gateway/engine_tier.h"
#include "gateway/http.h"
#include "gateway/pipeline.h"
#include "gateway/reply.h"
#include "gateway/response_store.h"
#include "gateway/responses.h"
#include "gateway/route.h"
#include "gateway/stats.h"
#include "gateway/tier.h"
#include "router/alias.h"

#include <cjson/cJSON.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <openssl/rand.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#define MAX_SPARE_REQS 256

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
    gw_metrics_declare(m, "llmgw_tier_request_duration_seconds", GW_METRIC_HISTOGRAM,
                       "Time from request arrival to the last byte of the answer, by the tier "
                       "that answered.");
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

/* ---- text without printf ------------------------------------------------------------------ *
 * The request path formats a few dozen small strings per request. With libquadmath in the
 * process (OpenBLAS -> libgfortran loads it for FAISS), glibc's printf takes its slow
 * positional path for every call, so these are written by hand. */

typedef struct text {
    char s[256];
    size_t n;
} text;

static void t_str(text *t, const char *s)
{
    size_t k = strlen(s);
    if (k > sizeof t->s - 1 - t->n)
        k = sizeof t->s - 1 - t->n;
    memcpy(t->s + t->n, s, k);
    t->n += k;
    t->s[t->n] = '\0';
}

static size_t u64_digits(char *out, uint64_t v)
{
    char tmp[24];
    size_t n = 0;
    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v != 0);
    for (size_t i = 0; i < n; i++)
        out[i] = tmp[n - 1 - i];
    return n;
}

static void t_u64(text *t, uint64_t v)
{
    char d[24];
    size_t n = u64_digits(d, v);
    d[n] = '\0';
    t_str(t, d);
}

static void b_u64(struct evbuffer *b, uint64_t v)
{
    char d[24];
    evbuffer_add(b, d, u64_digits(d, v));
}

static void b_i64(struct evbuffer *b, int64_t v)
{
    if (v < 0) {
        evbuffer_add(b, "-", 1);
        v = -v;
    }
    b_u64(b, (uint64_t)v);
}

static void b_lit(struct evbuffer *b, const char *s)
{
    evbuffer_add(b, s, strlen(s));
}

/* Appends s as a JSON string. Our strings (ids, names, groups) are printable ASCII already;
 * anything else is escaped as \u00XX so the line stays valid JSON whatever a config holds. */
static void json_str(struct evbuffer *b, const char *s)
{
    static const char hex[] = "0123456789abcdef";
    evbuffer_add(b, "\"", 1);
    const unsigned char *run = (const unsigned char *)s;
    for (const unsigned char *p = run; *p; p++) {
        if (*p >= 0x20 && *p != '"' && *p != '\\' && *p < 0x7f)
            continue;
        evbuffer_add(b, run, (size_t)(p - run));
        char esc[6] = {'\\', 'u', '0', '0', hex[*p >> 4], hex[*p & 15]};
        evbuffer_add(b, esc, 6);
        run = p + 1;
    }
    evbuffer_add(b, run, strlen((const char *)run));
    evbuffer_add(b, "\"", 1);
}

/* "2026-12-03T13:19:46.401Z": the date part is made once a second. */
static void timestamp(struct evbuffer *b)
{
    static int64_t last_sec = -1;
    static char day[24];
    uint64_t wall = util_wall_ms();
    int64_t sec = (int64_t)(wall / 1000);
    if (sec != last_sec) {
        time_t t = (time_t)sec;
        struct tm tm;
        gmtime_r(&t, &tm);
        strftime(day, sizeof day, "%Y-%m-%dT%H:%M:%S", &tm);
        last_sec = sec;
    }
    unsigned ms = (unsigned)(wall % 1000);
    char frac[6] = {'.', (char)('0' + ms / 100), (char)('0' + ms / 10 % 10),
                    (char)('0' + ms % 10), 'Z', '"'};
    b_lit(b, day);
    evbuffer_add(b, frac, 6);
}

/* One JSON line per request; never the prompt or the answer. */
static void access_log(gw_req *r, uint64_t now)
{
    gw_alog *log = r->srv->access_log;
    if (log == NULL)
        return;
    struct evbuffer *b = evbuffer_new();
    b_lit(b, "{\"ts\":\"");
    timestamp(b);
    b_lit(b, ",\"id\":");
    json_str(b, r->id);
    b_lit(b, ",\"endpoint\":\"");
    b_lit(b, r->endpoint);
    b_lit(b, "\",\"status\":");
    b_i64(b, r->status);
    if (r->tier >= 0) {
        b_lit(b, ",\"tier\":");
        json_str(b, r->srv->cfg->tiers[r->tier].name);
    }
    if (r->group) {
        b_lit(b, ",\"group\":");
        json_str(b, r->group);
    }
    if (r->body.json)
        b_lit(b, r->body.stream ? ",\"stream\":true" : ",\"stream\":false");
    b_lit(b, ",\"duration_us\":");
    b_u64(b, (now - r->t_start) / 1000);
    if (r->t_first_byte) {
        b_lit(b, ",\"ttfb_us\":");
        b_u64(b, (r->t_first_byte - r->t_start) / 1000);
    }
    b_lit(b, ",\"bytes\":");
    b_u64(b, r->bytes_out);
    if (r->attempts) {
        b_lit(b, ",\"attempts\":");
        b_i64(b, r->attempts);
        b_lit(b, ",\"upstream_status\":");
        b_i64(b, r->upstream_status);
    }
    if (r->fell_back) {
        b_lit(b, ",\"fallback_from\":");
        json_str(b, r->srv->cfg->tiers[r->first_tier].name);
    }
    if (r->prompt_tokens || r->completion_tokens) {
        b_lit(b, ",\"prompt_tokens\":");
        b_i64(b, r->prompt_tokens);
        b_lit(b, ",\"completion_tokens\":");
        b_i64(b, r->completion_tokens);
    }
    if (r->client_gone)
        b_lit(b, ",\"client_gone\":true");
    const char *cache = gw_cache_state_name(r);
    if (cache != NULL) {
        b_lit(b, ",\"cache\":\"");
        b_lit(b, cache);
        b_lit(b, "\"");
    }
    const char *reason = gw_route_reason(r);
    if (reason != NULL) {
        b_lit(b, ",\"route\":");
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
    text l = {.n = 0};
    t_str(&l, "endpoint=\"");
    t_str(&l, r->endpoint);
    t_str(&l, "\",status=\"");
    t_u64(&l, (uint64_t)(r->status > 0 ? r->status : 0));
    t_str(&l, "\",tier=\"");
    t_str(&l, tier);
    t_str(&l, "\"");
    gw_metrics_add(s->metrics, "llmgw_requests_total", l.s, 1);
    l = (text){.n = 0};
    t_str(&l, "endpoint=\"");
    t_str(&l, r->endpoint);
    t_str(&l, "\"");
    gw_metrics_observe(s->metrics, "llmgw_request_duration_seconds", l.s,
                       secs(now - r->t_start));
    if (r->tier >= 0) {
        l = (text){.n = 0};
        t_str(&l, "tier=\"");
        t_str(&l, tier);
        t_str(&l, "\"");
        gw_metrics_observe(s->metrics, "llmgw_tier_request_duration_seconds", l.s,
                           secs(now - r->t_start));
    }
    if (r->tier >= 0 && (r->prompt_tokens || r->completion_tokens)) {
        l = (text){.n = 0};
        t_str(&l, "tier=\"");
        t_str(&l, tier);
        size_t at = l.n;
        t_str(&l, "\",kind=\"prompt\"");
        gw_metrics_add(s->metrics, "llmgw_tokens_total", l.s, (double)r->prompt_tokens);
        l.n = at;
        t_str(&l, "\",kind=\"completion\"");
        gw_metrics_add(s->metrics, "llmgw_tokens_total", l.s, (double)r->completion_tokens);
    }
    access_log(r, now);
    if (r->conn != NULL && r->conn->active == r)
        gw_conn_request_done(r->conn);
    s->in_flight--;
    gw_metrics_set(s->metrics, "llmgw_in_flight_requests", NULL, s->in_flight);
    gw_pipeline_release(r);
    gw_responses_release(r);
    gw_reply_release(r);
    gw_request_deinit(&r->body);
    /* Kept for the next request: its struct and its arena's first block (allocating those
     * per request made malloc consolidate its free lists every time). */
    if (s->n_spare_reqs < MAX_SPARE_REQS && !s->draining) {
        util_arena_reset(&r->arena);
        r->spare_next = s->spare_reqs;
        s->spare_reqs = r;
        s->n_spare_reqs++;
    } else {
        util_arena_deinit(&r->arena);
        free(r);
    }
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

/* The gauges the registry holds only as of the last ask: the cache's and every tier's. */
static void refresh_gauges(gw_server *s)
{
    gw_cache_metrics(s->cache, s->metrics);
    for (size_t i = 0; i < s->cfg->n_tiers; i++)
        if (s->tiers[i] != NULL)
            s->tiers[i]->ops->metrics(s->tiers[i], s->metrics);
}

static void handle_metrics(gw_req *r)
{
    gw_server *s = r->srv;
    refresh_gauges(s);
    struct evbuffer *b = evbuffer_new();
    gw_metrics_render(s->metrics, b);
    gw_reply_body(r, 200, "text/plain; version=0.0.4; charset=utf-8", b);
    evbuffer_free(b);
}

/* GET /v1/llmgw/stats (gateway/stats.h), for keys of auth.admin_groups (any key when none is
 * listed; open when authentication is off, like the rest of the API). */
static void handle_stats(gw_req *r)
{
    gw_server *s = r->srv;
    const gw_config *c = s->cfg;
    if (c->n_admin_groups > 0 && !gw_auth_disabled(s->auth)) {
        bool admin = false;
        for (size_t i = 0; i < c->n_admin_groups && !admin && r->group != NULL; i++)
            admin = !strcmp(c->admin_groups[i], r->group);
        if (!admin) {
            gw_reply_error(r, 403, "invalid_request_error", NULL, "forbidden",
                           "API keys of group '%s' may not read the gateway's stats: only "
                           "the groups in auth.admin_groups may.", r->group);
            return;
        }
    }
    refresh_gauges(s);
    const char **names = util_arena_alloc(&r->arena, (c->n_tiers + 1) * sizeof *names);
    for (size_t i = 0; i < c->n_tiers; i++)
        names[i] = c->tiers[i].name;
    double now = (double)util_wall_ms() * 1e-3;
    double started = now - (double)(util_now_ns() - s->started_ns) * 1e-9;
    cJSON *o = gw_stats_json(s->stats, s->metrics, names, c->n_tiers, now, started);
    cJSON *fl = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(o, "totals"),
                                                 "in_flight");
    if (fl != NULL && fl->valuedouble >= 1)   /* not this request itself */
        cJSON_SetNumberValue(fl, fl->valuedouble - 1);
    cJSON *policy = cJSON_CreateObject();
    gw_router_status(s->router, policy);
    cJSON *p = cJSON_DetachItemFromObjectCaseSensitive(policy, "policy");
    cJSON_AddItemToObject(o, "policy", p != NULL ? p : cJSON_CreateNull());
    cJSON_Delete(policy);
    gw_reply_json(r, 200, o);
}

/* GET /dashboard: the page (gateway/dashboard.html, embedded), which reads /v1/llmgw/stats
 * with a key the operator types in; it holds no data itself, so it needs none. */
static void handle_dashboard(gw_req *r)
{
    struct evbuffer *b = evbuffer_new();
    evbuffer_add(b, gw_dashboard_html, gw_dashboard_html_len);
    gw_reply_header(r, "Content-Security-Policy",
                    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
                    "connect-src 'self'; img-src 'self' data:; base-uri 'none'; "
                    "form-action 'none'; frame-ancestors 'none'");
    gw_reply_header(r, "X-Content-Type-Options", "nosniff");
    gw_reply_header(r, "Cache-Control", "no-store");
    gw_reply_body(r, 200, "text/html; charset=utf-8", b);
    evbuffer_free(b);
}

/* The request body, or NULL after answering r (413). */
static const char *request_body(gw_req *r, size_t *len)
{
    struct evbuffer *in = evhttp_request_get_input_buffer(ereq_of(r));
    *len = evbuffer_get_length(in);
    if (*len > r->srv->cfg->limits.max_body_bytes) {
        gw_reply_error(r, 413, "invalid_request_error", NULL, "request_too_large",
                       "The request body is %zu bytes; this gateway accepts at most %zu.", *len,
                       r->srv->cfg->limits.max_body_bytes);
        return NULL;
    }
    const char *body = (const char *)evbuffer_pullup(in, -1);
    return body ? body : "";
}

static void handle_generate(gw_req *r, gw_endpoint ep, bool dry_run)
{
    size_t len;
    const char *body = request_body(r, &len);
    if (body == NULL)
        return;
    /* The Responses API is translated into a chat request (its answer back: responses.h). */
    if (!strcmp(r->endpoint, "responses") && !gw_responses_begin(r, body, len, &body, &len))
        return;
    gw_req_error e;
    if (gw_request_parse(&r->body, ep, body, len, &r->arena, &e) != 0) {
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
    /* 96 bits from a splitmix64 stream seeded once from the OS: ids are unique and not
     * guessable from each other without a CSPRNG call (and its lock) per request. */
    static uint64_t state;
    static bool seeded;
    if (!seeded) {
        if (RAND_bytes((unsigned char *)&state, sizeof state) != 1)
            state = util_now_ns() ^ ((uint64_t)getpid() << 32);
        seeded = true;
    }
    uint64_t w[2];
    for (int k = 0; k < 2; k++) {
        uint64_t z = (state += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        w[k] = z ^ (z >> 31);
    }
    static const char hex[] = "0123456789abcdef";
    memcpy(r->id, "req_", 4);
    for (int i = 0; i < 24; i++) {
        uint64_t v = i < 16 ? w[0] >> (60 - 4 * i) : w[1] >> (60 - 4 * (i - 16));
        r->id[4 + i] = hex[v & 15];
    }
    r->id[28] = '\0';
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
        {"/v1/responses", GW_EP_CHAT, "responses", "/chat/completions"},
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
    if (!strcmp(path, "/dashboard") || !strcmp(path, "/v1/llmgw/stats")) {
        bool page = path[1] == 'd';
        r->endpoint = page ? "dashboard" : "stats";
        if (m != EVHTTP_REQ_GET) {
            gw_reply_header(r, "Allow", "GET");
            gw_reply_error(r, 405, "invalid_request_error", NULL, "method_not_allowed",
                           "Invalid method for URL (%s %s): use GET.", method_name(m), path);
        } else if (page) {
            handle_dashboard(r);
        } else if (authorize(r)) {
            handle_stats(r);
        }
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
    if (!strncmp(path, "/v1/responses/", 14) && path[14] != '\0') {
        r->endpoint = "responses";
        if (m != EVHTTP_REQ_GET && m != EVHTTP_REQ_DELETE) {
            gw_reply_header(r, "Allow", "GET, DELETE");
            gw_reply_error(r, 405, "invalid_request_error", NULL, "method_not_allowed",
                           "Invalid method for URL (%s %s): use GET or DELETE.", method_name(m),
                           path);
        } else if (authorize(r)) {
            if (m == EVHTTP_REQ_GET)
                gw_responses_get(r, path + 14);
            else
                gw_responses_delete(r, path + 14);
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

static gw_req *req_new(gw_server *s)
{
    gw_req *r = s->spare_reqs;
    if (r == NULL) {
        r = util_xcalloc(1, sizeof *r);
        util_arena_init(&r->arena, 4096);
        return r;
    }
    s->spare_reqs = r->spare_next;
    s->n_spare_reqs--;
    util_arena arena = r->arena;
    memset(r, 0, sizeof *r);
    r->arena = arena;
    return r;
}

void gw_api_deinit(gw_server *s)
{
    if (s->stats_timer != NULL)
        event_free(s->stats_timer);
    s->stats_timer = NULL;
    gw_stats_free(s->stats);
    s->stats = NULL;
    gw_rstore_free(s->responses);
    s->responses = NULL;
    while (s->spare_reqs != NULL) {
        gw_req *r = s->spare_reqs;
        s->spare_reqs = r->spare_next;
        util_arena_deinit(&r->arena);
        free(r);
    }
    s->n_spare_reqs = 0;
}

static void handle(gw_server *s, struct evhttp_request *ereq)
{
    gw_req *r = req_new(s);
    r->srv = s;
    r->io = &gw_http_transport;
    r->io_ctx = ereq;
    r->tier = r->first_tier = -1;
    r->t_start = util_now_ns();
    r->endpoint = "unknown";
    r->conn = gw_conn_of(s, ereq);
    if (r->conn != NULL)
        gw_conn_request_start(r->conn, r);
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

static void stats_tick(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    gw_server *s = arg;   /* the history holds counters only: no gauge to refresh */
    gw_stats_sample(s->stats, s->metrics, (double)util_wall_ms() * 1e-3);
}

void gw_api_init(gw_server *s)
{
    s->hooks.request = handle;
    s->hooks.client_gone = client_gone;
    s->hooks.reply_done = finish;
    gw_pipeline_init(s);
    s->stats = gw_stats_new();
    if (s->base != NULL) {
        s->stats_timer = event_new(s->base, -1, EV_PERSIST, stats_tick, s);
        struct timeval tv = {GW_STATS_SAMPLE_SECONDS, 0};
        event_add(s->stats_timer, &tv);
    }
}
