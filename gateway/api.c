/* gateway/api.c: the OpenAI-compatible endpoints and a request's life on the loop thread:
 * limits and auth, parse and validate, pick the tier by model name, forward upstream with
 * retries and fallback, pass the answer back (SSE chunk by chunk), then account for it. */
#include "gateway/internal.h"

#include "common/log.h"
#include "common/time.h"
#include "gateway/cache.h"
#include "gateway/engine_tier.h"
#include "gateway/json.h"
#include "gateway/route.h"
#include "router/alias.h"

#include <cjson/cJSON.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <openssl/rand.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define MAX_HELD_BODY (64u << 20)   /* a non-stream upstream answer larger than this is an error */

static void start_upstream(gw_req *r);

void gw_metrics_declare_all(gw_metrics *m)
{
    gw_cache_declare_metrics(m);
    gw_router_declare_metrics(m);
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
    gw_metrics_declare(m, "llmgw_tier_requests_total", GW_METRIC_COUNTER,
                       "Upstream calls, by tier and upstream status (0: no answer).");
    gw_metrics_declare(m, "llmgw_upstream_errors_total", GW_METRIC_COUNTER,
                       "Upstream failures, by tier and kind.");
    gw_metrics_declare(m, "llmgw_upstream_ttfb_seconds", GW_METRIC_HISTOGRAM,
                       "Time from sending a call upstream to its response headers, by tier.");
    gw_metrics_declare(m, "llmgw_fallbacks_total", GW_METRIC_COUNTER,
                       "Requests moved to a fallback tier, by from and to tier.");
    gw_metrics_declare(m, "llmgw_tokens_total", GW_METRIC_COUNTER,
                       "Tokens reported by upstream usage, by tier and kind.");
    gw_metrics_declare(m, "llmgw_upstream_connections", GW_METRIC_GAUGE,
                       "Upstream connections by tier and state (open, busy, queued calls).");
    gw_metrics_declare(m, "llmgw_kv_pages", GW_METRIC_GAUGE,
                       "KV pool pages shared by the engine tiers (total, used).");
    gw_metrics_declare(m, "llmgw_engine_sequences", GW_METRIC_GAUGE,
                       "Engine sequences by tier and state (waiting = queue depth, running).");
    gw_metrics_declare(m, "llmgw_engine_tokens_total", GW_METRIC_COUNTER,
                       "Tokens processed by engine tiers, by phase (prefill, decode).");
    gw_metrics_declare(m, "llmgw_engine_steps_total", GW_METRIC_COUNTER,
                       "Batched forward steps run by each engine tier.");
    gw_metrics_declare(m, "llmgw_engine_prefix_hit_tokens_total", GW_METRIC_COUNTER,
                       "Prompt tokens whose K/V came from shared prefix pages, by tier.");
    gw_metrics_declare(m, "llmgw_engine_prefix_pages", GW_METRIC_GAUGE,
                       "KV pages the tier's shared-prefix table holds.");
    gw_metrics_declare(m, "llmgw_engine_preemptions_total", GW_METRIC_COUNTER,
                       "Sequences preempted because the KV pool was full.");
}

static const char *tier_name(const gw_req *r)
{
    return r->tier >= 0 ? r->srv->cfg->tiers[r->tier].name : "";
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
    FILE *f = r->srv->access_log;
    if (f == NULL)
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
        json_str(b, tier_name(r));
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
    if (r->reason[0]) {
        evbuffer_add(b, ",\"route\":", 9);
        json_str(b, r->reason);
    }
    evbuffer_add(b, "}\n", 2);
    size_t len = evbuffer_get_length(b);
    fwrite(evbuffer_pullup(b, -1), 1, len, f);
    fflush(f);
    evbuffer_free(b);
}

/* The end of every request: metrics, access log, connection bookkeeping, memory. */
static void finish(gw_req *r)
{
    gw_server *s = r->srv;
    uint64_t now = util_now_ns();
    char labels[256];
    snprintf(labels, sizeof labels, "endpoint=\"%s\",status=\"%d\",tier=\"%s\"", r->endpoint,
             r->status, tier_name(r));
    gw_metrics_add(s->metrics, "llmgw_requests_total", labels, 1);
    snprintf(labels, sizeof labels, "endpoint=\"%s\"", r->endpoint);
    gw_metrics_observe(s->metrics, "llmgw_request_duration_seconds", labels,
                       secs(now - r->t_start));
    if (r->tier >= 0 && (r->prompt_tokens || r->completion_tokens)) {
        snprintf(labels, sizeof labels, "tier=\"%s\",kind=\"prompt\"", tier_name(r));
        gw_metrics_add(s->metrics, "llmgw_tokens_total", labels, (double)r->prompt_tokens);
        snprintf(labels, sizeof labels, "tier=\"%s\",kind=\"completion\"", tier_name(r));
        gw_metrics_add(s->metrics, "llmgw_tokens_total", labels, (double)r->completion_tokens);
    }
    gw_cache_finish(r);
    gw_route_finish(r);
    access_log(r, now);
    if (r->conn != NULL && r->conn->active == r)
        gw_conn_request_done(r->conn);
    s->in_flight--;
    gw_metrics_set(s->metrics, "llmgw_in_flight_requests", NULL, s->in_flight);
    gw_req_free(r);
    gw_server_maybe_exit(s);
}

void gw_req_free(gw_req *r)
{
    if (r == NULL)
        return;
    if (r->call != NULL)
        gw_upstream_call_cancel(r->call);
    gw_engine_release(r);
    gw_cache_detach(r);
    if (r->slot_tier >= 0)
        r->srv->tier_inflight[r->slot_tier]--;
    router_policy_unref(r->policy);
    gw_request_deinit(&r->body);
    gw_sse_parser_deinit(&r->sse);
    if (r->held)
        evbuffer_free(r->held);
    if (r->sse_out)
        evbuffer_free(r->sse_out);
    free(r->upstream_body);
    util_arena_deinit(&r->arena);
    free(r);
}

void gw_req_client_gone(gw_req *r)
{
    if (r->ereq != NULL && evhttp_request_get_connection(r->ereq) == NULL)
        evhttp_request_free(r->ereq);  /* libevent detached it: it is ours to free */
    r->ereq = NULL;
    r->client_gone = true;
    r->conn = NULL;
    if (r->call != NULL) {
        gw_upstream_call_cancel(r->call);
        r->call = NULL;
    }
    gw_engine_detach(r);
    if (!r->replying)
        r->status = 499;  /* nginx's "client closed request" */
    gw_metrics_add(r->srv->metrics, "llmgw_client_disconnects_total", NULL, 1);
    finish(r);
}

static void common_headers(gw_req *r, const char *content_type)
{
    struct evkeyvalq *h = evhttp_request_get_output_headers(r->ereq);
    if (content_type != NULL)
        evhttp_add_header(h, "Content-Type", content_type);
    evhttp_add_header(h, "x-request-id", r->id);
    if (r->tier >= 0)
        evhttp_add_header(h, "x-llmgw-tier", tier_name(r));
    gw_cache_headers(r, h);
    gw_route_headers(r, h);
    if (r->srv->draining)
        evhttp_add_header(h, "Connection", "close");
}

/* Sends a whole reply and finishes the request. `body` is drained. */
static void send_reply(gw_req *r, int status, const char *content_type, struct evbuffer *body)
{
    r->status = status;
    if (r->cache != NULL && content_type != NULL && !strcmp(content_type, "application/json"))
        gw_cache_capture_json(r, status, (const char *)evbuffer_pullup(body, -1),
                              evbuffer_get_length(body));
    if (r->ereq != NULL) {
        common_headers(r, content_type);
        r->bytes_out += evbuffer_get_length(body);
        evhttp_send_reply(r->ereq, status, NULL, body);
        r->ereq = NULL;
    }
    finish(r);
}

static void send_json(gw_req *r, int status, cJSON *o)
{
    char *text = cJSON_PrintUnformatted(o);
    struct evbuffer *b = evbuffer_new();
    evbuffer_add(b, text, strlen(text));
    evbuffer_add(b, "\n", 1);
    free(text);
    cJSON_Delete(o);
    send_reply(r, status, "application/json", b);
    evbuffer_free(b);
}

void gw_reply_json(gw_req *r, int status, cJSON *o)
{
    send_json(r, status, o);
}

void gw_reply_model_not_found(gw_req *r, const char *model)
{
    gw_reply_error(r, 404, "invalid_request_error", "model", "model_not_found",
                   "The model '%.200s' does not exist or you do not have access to it.", model);
}

void gw_reply_raw(gw_req *r, int status, const char *content_type, struct evbuffer *body)
{
    send_reply(r, status, content_type, body);
}

void gw_stream_begin(gw_req *r, int status, const char *content_type)
{
    r->replying = true;
    r->status = status;
    if (r->t_first_byte == 0)
        r->t_first_byte = util_now_ns();
    common_headers(r, content_type);
    struct evkeyvalq *h = evhttp_request_get_output_headers(r->ereq);
    evhttp_add_header(h, "Cache-Control", "no-cache");
    evhttp_add_header(h, "X-Accel-Buffering", "no");
    evhttp_send_reply_start(r->ereq, status, NULL);
    if (r->conn != NULL)
        gw_conn_stream_timeouts(r->conn, true);
}

void gw_stream_data(gw_req *r, const char *data, size_t len)
{
    if (r->cache != NULL)
        gw_cache_capture_sse(r, data, len);
    /* One buffer per request for every event: evhttp moves its contents out. */
    if (r->sse_out == NULL)
        r->sse_out = evbuffer_new();
    gw_sse_write(r->sse_out, data, len);
    r->bytes_out += evbuffer_get_length(r->sse_out);
    evhttp_send_reply_chunk(r->ereq, r->sse_out);
    evbuffer_drain(r->sse_out, evbuffer_get_length(r->sse_out));  /* a gone peer leaves it */
}

void gw_stream_buffer(gw_req *r, struct evbuffer *b)
{
    size_t n = evbuffer_get_length(b);
    gw_stream_data(r, (const char *)evbuffer_pullup(b, -1), n);
    evbuffer_drain(b, n);
}

void gw_stream_end(gw_req *r)
{
    if (r->conn != NULL)
        gw_conn_stream_timeouts(r->conn, false);
    evhttp_send_reply_end(r->ereq);
    r->ereq = NULL;
    finish(r);
}

static cJSON *error_object(const char *msg, const char *type, const char *param,
                           const char *code)
{
    cJSON *o = cJSON_CreateObject();
    cJSON *e = cJSON_AddObjectToObject(o, "error");
    cJSON_AddStringToObject(e, "message", msg);
    cJSON_AddStringToObject(e, "type", type);
    if (param != NULL && *param)
        cJSON_AddStringToObject(e, "param", param);
    else
        cJSON_AddNullToObject(e, "param");
    if (code != NULL)
        cJSON_AddStringToObject(e, "code", code);
    else
        cJSON_AddNullToObject(e, "code");
    return o;
}

/* The one funnel for client-visible errors: the OpenAI error body with the given status. */
void gw_reply_error(gw_req *r, int status, const char *type, const char *param,
                    const char *code, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    send_json(r, status, error_object(msg, type, param, code));
}

void gw_stream_error(gw_req *r, const char *type, const char *code, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    /* The message may hold anything (an engine's error text): cJSON escapes it. */
    cJSON *o = error_object(msg, type, NULL, code);
    char *text = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    gw_stream_data(r, text, strlen(text));
    free(text);
    gw_stream_end(r);
}

/* ---- upstream callbacks ---------------------------------------------------------------- */

/* A policy-routed request falls back along its policy tier's chain; others along the config
 * tier's one fallback. */
static bool can_fall_back(const gw_req *r)
{
    if (r->policy != NULL && r->ptier >= 0) {
        const router_tier *t = router_policy_tier(r->policy, r->first_ptier >= 0 ? r->first_ptier
                                                                                 : r->ptier);
        return (size_t)r->fb_pos < t->n_fallback;
    }
    return !r->fell_back && r->srv->cfg->tiers[r->tier].fallback != NULL;
}

static void up_headers(void *arg, int status, const struct evkeyvalq *headers)
{
    gw_req *r = arg;
    uint64_t now = util_now_ns();
    char labels[200];
    r->upstream_status = status;
    snprintf(labels, sizeof labels, "tier=\"%s\"", tier_name(r));
    gw_metrics_observe(r->srv->metrics, "llmgw_upstream_ttfb_seconds", labels,
                       secs(now - r->t_first_byte));
    const char *ct = evhttp_find_header(headers, "Content-Type");
    r->upstream_stream = ct != NULL && strncasecmp(ct, "text/event-stream", 17) == 0;
    if (status >= 500 && can_fall_back(r)) {
        r->held = NULL;      /* the body is dropped: the fallback answers instead */
        return;
    }
    r->held = evbuffer_new();
    if (!r->upstream_stream || status != 200)
        return;
    /* A stream: headers now, then each chunk as it arrives. */
    r->t_first_byte = now;
    gw_stream_begin(r, status, "text/event-stream");
    gw_sse_parser_init(&r->sse, 4u << 20);
}

/* Reads usage.prompt_tokens / completion_tokens from an OpenAI response body without parsing
 * all of it: the last `"usage"` key's object is parsed alone. */
static void usage_scan(gw_req *r, const char *body, size_t len)
{
    static const char key[] = "\"usage\"";
    const char *found = NULL;
    for (const char *p = body; p != NULL && (size_t)(p - body) < len;) {
        p = memmem(p, len - (size_t)(p - body), key, sizeof key - 1);
        if (p != NULL)
            found = p++;
    }
    if (found == NULL)
        return;
    const char *v = found + sizeof key - 1, *end = body + len;
    while (v < end && (*v == ' ' || *v == ':' || *v == '\n' || *v == '\t' || *v == '\r'))
        v++;
    if (v >= end || *v != '{')
        return;
    cJSON *u = cJSON_ParseWithLengthOpts(v, (size_t)(end - v), NULL, 0);
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(u, "prompt_tokens");
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(u, "completion_tokens");
    if (cJSON_IsNumber(p))
        r->prompt_tokens = (long)p->valuedouble;
    if (cJSON_IsNumber(c))
        r->completion_tokens = (long)c->valuedouble;
    cJSON_Delete(u);
}

static int sse_event(void *arg, const char *event, const char *data, size_t len)
{
    gw_req *r = arg;
    (void)event;
    /* Only the usage object is parsed; the rest passes through untouched (the cache reads a
     * copy when it keeps this answer). */
    usage_scan(r, data, len);
    if (r->cache != NULL)
        gw_cache_capture_sse(r, data, len);
    return 0;
}

static void up_body(void *arg, struct evbuffer *chunk)
{
    gw_req *r = arg;
    if (r->held == NULL)
        return;
    if (!r->replying) {
        if (evbuffer_get_length(r->held) + evbuffer_get_length(chunk) > MAX_HELD_BODY) {
            evbuffer_drain(chunk, evbuffer_get_length(chunk));
            return;
        }
        evbuffer_add_buffer(r->held, chunk);
        return;
    }
    struct evbuffer_iovec v[16];
    int n = evbuffer_peek(chunk, -1, NULL, v, 16);
    for (int i = 0; i < n && i < 16; i++)
        if (gw_sse_parser_feed(&r->sse, v[i].iov_base, v[i].iov_len, sse_event, r) != 0)
            break;
    r->bytes_out += evbuffer_get_length(chunk);
    evhttp_send_reply_chunk(r->ereq, chunk);
}

static void count_upstream(gw_req *r, gw_upstream_error err)
{
    char labels[200];
    snprintf(labels, sizeof labels, "tier=\"%s\",status=\"%d\"", tier_name(r),
             err == GW_UP_OK ? r->upstream_status : 0);
    gw_metrics_add(r->srv->metrics, "llmgw_tier_requests_total", labels, 1);
    if (err != GW_UP_OK || r->upstream_status >= 500) {
        snprintf(labels, sizeof labels, "tier=\"%s\",kind=\"%s\"", tier_name(r),
                 err != GW_UP_OK ? gw_upstream_error_name(err) : "status_5xx");
        gw_metrics_add(r->srv->metrics, "llmgw_upstream_errors_total", labels, 1);
    }
}

/* Sets up the body for tier `t`: the model field becomes the tier's upstream model name. */
static void prepare_body(gw_req *r)
{
    const gw_tier_cfg *t = &r->srv->cfg->tiers[r->tier];
    free(r->upstream_body);
    r->upstream_body = NULL;
    if (r->body.json == NULL)
        return;
    /* What goes upstream is printed from the validated tree, never the client's bytes: the
     * upstream then reads exactly the request that the cache key, the rules and the router
     * judged (one parse; duplicate keys were refused by gw_request_parse). */
    struct evbuffer *b = evbuffer_new();
    gw_json_print(r->body.json, t->model, b);
    r->upstream_len = evbuffer_get_length(b);
    r->upstream_body = util_xmalloc(r->upstream_len + 1);
    evbuffer_remove(b, r->upstream_body, r->upstream_len);
    r->upstream_body[r->upstream_len] = '\0';
    evbuffer_free(b);
}

static void up_done(void *arg, gw_upstream_error err)
{
    gw_req *r = arg;
    r->call = NULL;
    count_upstream(r, err);
    if (r->replying) {
        if (err != GW_UP_OK) {
            /* The stream broke after it began: tell the client in-band, then end it. */
            gw_stream_error(r, "upstream_error", "upstream_stream_broken",
                            "upstream tier '%s' failed mid-stream (%s)", tier_name(r),
                            gw_upstream_error_name(err));
            return;
        }
        gw_stream_end(r);
        return;
    }
    bool failed = err != GW_UP_OK || r->held == NULL;  /* held == NULL: a 5xx we dropped */
    if (!failed) {
        if (r->upstream_status == 200 && !r->upstream_stream)
            usage_scan(r, (const char *)evbuffer_pullup(r->held, -1),
                       evbuffer_get_length(r->held));
        r->t_first_byte = util_now_ns();
        send_reply(r, r->upstream_status,
                   r->upstream_stream ? "text/event-stream" : "application/json", r->held);
        return;
    }
    const gw_tier_cfg *t = &r->srv->cfg->tiers[r->tier];
    if ((err == GW_UP_CONNECT || err == GW_UP_CLOSED) && r->tier_attempts <= t->retries) {
        start_upstream(r);
        return;
    }
    int next = -1;
    if (can_fall_back(r))
        next = r->policy != NULL && r->ptier >= 0
                   ? gw_route_next_fallback(r)
                   : (int)(gw_config_tier(r->srv->cfg, t->fallback) - r->srv->cfg->tiers);
    if (next >= 0) {
        char labels[200];
        const gw_tier_cfg *fb = &r->srv->cfg->tiers[next];
        snprintf(labels, sizeof labels, "from=\"%s\",to=\"%s\"", t->name, fb->name);
        gw_metrics_add(r->srv->metrics, "llmgw_fallbacks_total", labels, 1);
        UTIL_LOG_INFO("api", "%s: tier '%s' failed before the first byte (%s); falling back to "
                      "'%s'", r->id, t->name, err != GW_UP_OK ? gw_upstream_error_name(err)
                                                               : "status 5xx", fb->name);
        r->fell_back = true;
        if (r->slot_tier >= 0) {  /* the in-flight slot moves with the request */
            r->srv->tier_inflight[r->slot_tier]--;
            r->srv->tier_inflight[next]++;
            r->slot_tier = next;
        }
        r->tier = next;
        r->tier_attempts = 0;
        if (fb->kind == GW_TIER_ENGINE) {
            gw_engine_start(r);
            return;
        }
        prepare_body(r);
        start_upstream(r);
        return;
    }
    if (err == GW_UP_TIMEOUT)
        gw_reply_error(r, 504, "upstream_error", NULL, "upstream_timeout",
                       "The upstream for tier '%s' did not answer in time.", t->name);
    else if (err == GW_UP_CLOSED)
        gw_reply_error(r, 502, "upstream_error", NULL, "upstream_closed",
                       "The upstream for tier '%s' closed the connection before sending a "
                       "response.", t->name);
    else if (err == GW_UP_QUEUE)
        gw_reply_error(r, 503, "upstream_error", NULL, "upstream_overloaded",
                       "Tier '%s' has too many requests waiting; retry later.", t->name);
    else
        gw_reply_error(r, 502, "upstream_error", NULL, "upstream_unavailable",
                       "The upstream for tier '%s' is unavailable (%s).", t->name,
                       gw_upstream_error_name(err));
}

static void start_upstream(gw_req *r)
{
    static const gw_upstream_cbs cbs = {up_headers, up_body, up_done};
    if (r->held != NULL) {
        evbuffer_free(r->held);
        r->held = NULL;
    }
    r->attempts++;
    r->tier_attempts++;
    r->t_first_byte = util_now_ns();  /* reused as the send time until the first byte */
    int rc = gw_upstream_call_start(r->srv->upstreams[r->tier], r->body.json ? "POST" : "GET",
                                    r->path, r->upstream_body, r->upstream_len, r->id, &cbs, r,
                                    &r->call);
    if (rc != 0)
        gw_reply_error(r, 503, "upstream_error", NULL, "upstream_unavailable",
                       "Cannot start a call to tier '%s'.", tier_name(r));
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
        send_json(r, 200, model_object(one, created));
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
    send_json(r, 200, o);
}

static void handle_metrics(gw_req *r)
{
    gw_server *s = r->srv;
    char labels[200];
    if (s->engines != NULL)
        gw_engines_metrics(s->engines, s->metrics);
    gw_cache_metrics(s->cache, s->metrics);
    for (size_t i = 0; i < s->cfg->n_tiers; i++) {
        int open, busy, queued;
        if (s->upstreams[i] == NULL)
            continue;
        gw_upstream_stats(s->upstreams[i], &open, &busy, &queued);
        const char *name = s->cfg->tiers[i].name;
        snprintf(labels, sizeof labels, "tier=\"%s\",state=\"open\"", name);
        gw_metrics_set(s->metrics, "llmgw_upstream_connections", labels, open);
        snprintf(labels, sizeof labels, "tier=\"%s\",state=\"busy\"", name);
        gw_metrics_set(s->metrics, "llmgw_upstream_connections", labels, busy);
        snprintf(labels, sizeof labels, "tier=\"%s\",state=\"queued\"", name);
        gw_metrics_set(s->metrics, "llmgw_upstream_connections", labels, queued);
    }
    struct evbuffer *b = evbuffer_new();
    gw_metrics_render(s->metrics, b);
    send_reply(r, 200, "text/plain; version=0.0.4; charset=utf-8", b);
    evbuffer_free(b);
}

static void handle_generate(gw_req *r, gw_endpoint ep)
{
    struct evbuffer *in = evhttp_request_get_input_buffer(r->ereq);
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
    if (ep == GW_EP_EMBEDDINGS && gw_cache_serves_embeddings(r->srv->cache, r->body.model)) {
        gw_embeddings_start(r);
        return;
    }
    if (ep != GW_EP_EMBEDDINGS) {
        gw_route_start(r);  /* routes, looks up the cache, then gw_dispatch (or a reply) */
        return;
    }
    r->tier = router_alias_find(r->srv->models, r->body.model);
    if (r->tier < 0) {
        gw_reply_model_not_found(r, r->body.model);
        return;
    }
    r->first_tier = r->tier;
    gw_dispatch(r);
}

void gw_dispatch(gw_req *r)
{
    if (r->dry_run) {
        gw_route_dry_reply(r, "bypass", -1);
        return;
    }
    if (!gw_route_admit(r))
        return;
    if (r->srv->cfg->tiers[r->tier].kind == GW_TIER_ENGINE) {
        gw_engine_start(r);
        return;
    }
    prepare_body(r);
    start_upstream(r);
}

static bool header_too_large(gw_req *r)
{
    size_t total = strlen(evhttp_request_get_uri(r->ereq));
    for (struct evkeyval *kv = evhttp_request_get_input_headers(r->ereq)->tqh_first; kv != NULL;
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
    for (struct evkeyval *kv = evhttp_request_get_input_headers(r->ereq)->tqh_first; kv != NULL;
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
    const char *given = evhttp_find_header(evhttp_request_get_input_headers(r->ereq),
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
    const char *h = evhttp_find_header(evhttp_request_get_input_headers(r->ereq),
                                       "Authorization");
    gw_auth_check(r->srv->auth, h, util_now_ns(), &a);
    r->group = a.group;
    switch (a.status) {
    case GW_AUTH_OK:
        return true;
    case GW_AUTH_MISSING:
        gw_metrics_add(r->srv->metrics, "llmgw_auth_failures_total", NULL, 1);
        evhttp_add_header(evhttp_request_get_output_headers(r->ereq), "WWW-Authenticate",
                          "Bearer");
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
        evhttp_add_header(evhttp_request_get_output_headers(r->ereq), "Retry-After", retry);
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
        send_json(r, ready ? 200 : 503, o);
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
            evhttp_add_header(evhttp_request_get_output_headers(r->ereq), "Allow", "POST");
            gw_reply_error(r, 405, "invalid_request_error", NULL, "method_not_allowed",
                           "Invalid method for URL (%s %s): use POST.", method_name(m), path);
        } else if (authorize(r)) {
            handle_generate(r, gen[i].ep);
        }
        return;
    }
    if (!strcmp(path, "/v1/llmgw/route")) {
        r->endpoint = "route";
        if (m != EVHTTP_REQ_POST) {
            evhttp_add_header(evhttp_request_get_output_headers(r->ereq), "Allow", "POST");
            gw_reply_error(r, 405, "invalid_request_error", NULL, "method_not_allowed",
                           "Invalid method for URL (%s %s): use POST.", method_name(m), path);
        } else if (authorize(r)) {
            r->dry_run = true;
            handle_generate(r, GW_EP_CHAT);
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

void gw_api_handle(struct evhttp_request *ereq, void *arg)
{
    gw_server *s = arg;
    gw_req *r = util_xcalloc(1, sizeof *r);
    r->srv = s;
    r->ereq = ereq;
    r->tier = -1;
    r->ptier = r->first_ptier = r->slot_tier = -1;
    r->score = -1;
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
        evhttp_add_header(evhttp_request_get_output_headers(ereq), "Connection", "close");
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
