/* gateway/upstream_tier.c: the `upstream` tier: a request forwarded to an OpenAI-compatible
 * server (gateway/upstream.h), retried on connection failures, its answer passed back (a
 * stream event by event as it arrives), usage read for accounting. A failure before the first
 * byte (no connection, timeout, a 5xx) is reported to the pipeline when it may fall back;
 * otherwise it is answered here. */
#include "gateway/tier.h"

#include "common/log.h"
#include "common/time.h"
#include "gateway/json.h"
#include "gateway/reply.h"
#include "gateway/upstream.h"

#include <cjson/cJSON.h>
#include <event2/buffer.h>
#include <event2/http.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define MAX_HELD_BODY (64u << 20)   /* a non-stream upstream answer larger than this is an error */

typedef struct up_tier {
    gw_tier base;
    gw_server *srv;
    gw_upstream *up;
    char label[160];               /* tier="name", for metrics */
} up_tier;

/* Per request (r->tier_state). */
typedef struct up_req {
    up_tier *t;
    gw_req *r;
    char *body;                    /* JSON sent upstream (the model rewritten) */
    size_t len;
    gw_upstream_call *call;
    int attempts;                  /* calls made on this tier */
    bool stream;                   /* the upstream answers text/event-stream */
    bool drop;                     /* a 5xx body the fallback replaces */
    struct evbuffer *held;         /* a non-stream body, sent whole at the end */
    uint64_t t_sent;
} up_req;

void gw_upstream_tier_declare_metrics(gw_metrics *m)
{
    gw_metrics_declare(m, "llmgw_tier_requests_total", GW_METRIC_COUNTER,
                       "Upstream calls, by tier and upstream status (0: no answer).");
    gw_metrics_declare(m, "llmgw_upstream_errors_total", GW_METRIC_COUNTER,
                       "Upstream failures, by tier and kind.");
    gw_metrics_declare(m, "llmgw_upstream_ttfb_seconds", GW_METRIC_HISTOGRAM,
                       "Time from sending a call upstream to its response headers, by tier.");
    gw_metrics_declare(m, "llmgw_upstream_connections", GW_METRIC_GAUGE,
                       "Upstream connections by tier and state (open, busy, queued calls).");
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

static void up_headers(void *arg, int status, const struct evkeyvalq *headers)
{
    up_req *q = arg;
    gw_req *r = q->r;
    r->upstream_status = status;
    gw_metrics_observe(r->srv->metrics, "llmgw_upstream_ttfb_seconds", q->t->label,
                       (double)(util_now_ns() - q->t_sent) * 1e-9);
    const char *ct = evhttp_find_header(headers, "Content-Type");
    q->stream = ct != NULL && strncasecmp(ct, "text/event-stream", 17) == 0;
    if (status >= 500 && r->fallback_ok) {
        q->drop = true;      /* the body is dropped: the fallback answers instead */
        return;
    }
    q->held = evbuffer_new();
    if (!q->stream || status != 200)
        return;
    gw_stream_begin(r, status, "text/event-stream");  /* headers now, then each chunk */
}

static void event_usage(gw_req *r, const char *data, size_t len)
{
    usage_scan(r, data, len);
}

static void up_body(void *arg, struct evbuffer *chunk)
{
    up_req *q = arg;
    gw_req *r = q->r;
    if (q->drop || q->held == NULL)
        return;
    if (!r->replying) {
        if (evbuffer_get_length(q->held) + evbuffer_get_length(chunk) > MAX_HELD_BODY) {
            evbuffer_drain(chunk, evbuffer_get_length(chunk));
            return;
        }
        evbuffer_add_buffer(q->held, chunk);
        return;
    }
    gw_stream_forward(r, chunk, event_usage);
}

/* labels + `,status="NNN"` without printf (see api.c on why). */
static void status_label(char *out, size_t cap, const char *labels, int status)
{
    size_t n = strlen(labels);
    if (n + 16 > cap)
        n = cap - 16;
    memcpy(out, labels, n);
    memcpy(out + n, ",status=\"", 9);
    n += 9;
    unsigned v = status > 0 && status < 1000 ? (unsigned)status : 0;
    if (v >= 100)
        out[n++] = (char)('0' + v / 100);
    if (v >= 10)
        out[n++] = (char)('0' + v / 10 % 10);
    out[n++] = (char)('0' + v % 10);
    out[n++] = '"';
    out[n] = '\0';
}

static void count_call(up_req *q, gw_upstream_error err)
{
    gw_req *r = q->r;
    char labels[200];
    status_label(labels, sizeof labels, q->t->label, err == GW_UP_OK ? r->upstream_status : 0);
    gw_metrics_add(r->srv->metrics, "llmgw_tier_requests_total", labels, 1);
    if (err != GW_UP_OK || r->upstream_status >= 500) {
        snprintf(labels, sizeof labels, "%s,kind=\"%s\"", q->t->label,
                 err != GW_UP_OK ? gw_upstream_error_name(err) : "status_5xx");
        gw_metrics_add(r->srv->metrics, "llmgw_upstream_errors_total", labels, 1);
    }
}

static void call(up_req *q);

/* Fails r: to the pipeline when it may fall back, else as the answer. Nothing of q is used
 * after this (the pipeline may release it). */
static void fail(up_req *q, gw_upstream_error err)
{
    gw_req *r = q->r;
    const char *name = q->t->base.cfg->name;
    int status;
    const char *code;
    char msg[256];
    if (err == GW_UP_OK) {
        status = 502, code = "upstream_unavailable";
        snprintf(msg, sizeof msg, "The upstream for tier '%s' answered %d.", name,
                 r->upstream_status);
    } else if (err == GW_UP_TIMEOUT) {
        status = 504, code = "upstream_timeout";
        snprintf(msg, sizeof msg, "The upstream for tier '%s' did not answer in time.", name);
    } else if (err == GW_UP_CLOSED) {
        status = 502, code = "upstream_closed";
        snprintf(msg, sizeof msg, "The upstream for tier '%s' closed the connection before "
                 "sending a response.", name);
    } else if (err == GW_UP_QUEUE) {
        status = 503, code = "upstream_overloaded";
        snprintf(msg, sizeof msg, "Tier '%s' has too many requests waiting; retry later.", name);
    } else {
        status = 502, code = "upstream_unavailable";
        snprintf(msg, sizeof msg, "The upstream for tier '%s' is unavailable (%s).", name,
                 gw_upstream_error_name(err));
    }
    if (r->fallback_ok) {
        gw_tier_fail(r, status, "upstream_error", code,
                     err != GW_UP_OK ? gw_upstream_error_name(err) : "status 5xx", "%s", msg);
        return;
    }
    gw_reply_error(r, status, "upstream_error", NULL, code, "%s", msg);
}

static void up_done(void *arg, gw_upstream_error err)
{
    up_req *q = arg;
    gw_req *r = q->r;
    q->call = NULL;
    count_call(q, err);
    if (r->replying) {
        if (err != GW_UP_OK) {
            /* The stream broke after it began: tell the client in-band, then end it. */
            gw_stream_error(r, "upstream_error", "upstream_stream_broken",
                            "upstream tier '%s' failed mid-stream (%s)", q->t->base.cfg->name,
                            gw_upstream_error_name(err));
            return;
        }
        gw_stream_end(r);
        return;
    }
    if (err == GW_UP_OK && !q->drop && q->held != NULL) {
        if (r->upstream_status == 200 && !q->stream)
            usage_scan(r, (const char *)evbuffer_pullup(q->held, -1),
                       evbuffer_get_length(q->held));
        gw_reply_body(r, r->upstream_status,
                      q->stream ? "text/event-stream" : "application/json", q->held);
        return;
    }
    if ((err == GW_UP_CONNECT || err == GW_UP_CLOSED) && q->attempts <= q->t->base.cfg->retries) {
        call(q);
        return;
    }
    fail(q, err);
}

static void call(up_req *q)
{
    static const gw_upstream_cbs cbs = {up_headers, up_body, up_done};
    gw_req *r = q->r;
    if (q->held != NULL) {
        evbuffer_free(q->held);
        q->held = NULL;
    }
    q->drop = false;
    r->attempts++;
    q->attempts++;
    q->t_sent = util_now_ns();
    int rc = gw_upstream_call_start(q->t->up, r->body.json ? "POST" : "GET", r->path, q->body,
                                    q->len, r->id, &cbs, q, &q->call);
    if (rc != 0)
        gw_reply_error(r, 503, "upstream_error", NULL, "upstream_unavailable",
                       "Cannot start a call to tier '%s'.", q->t->base.cfg->name);
}

static void start(gw_tier *base, gw_req *r)
{
    up_tier *t = (up_tier *)base;
    up_req *q = util_arena_alloc(&r->arena, sizeof *q);   /* freed with r */
    memset(q, 0, sizeof *q);
    q->t = t;
    q->r = r;
    r->tier_state = q;
    if (r->body.json != NULL) {
        /* What goes upstream is printed from the validated tree, never the client's bytes: the
         * upstream then reads exactly the request that the cache key, the rules and the router
         * judged (one parse; duplicate keys were refused by gw_request_parse). */
        struct evbuffer *b = evbuffer_new();
        gw_json_print(r->body.json, base->cfg->model, b);
        q->len = evbuffer_get_length(b);
        q->body = util_arena_alloc(&r->arena, q->len + 1);
        evbuffer_remove(b, q->body, q->len);
        q->body[q->len] = '\0';
        evbuffer_free(b);
    }
    call(q);
}

static void detach(gw_tier *t, gw_req *r)
{
    (void)t;
    up_req *q = r->tier_state;
    if (q != NULL && q->call != NULL) {
        gw_upstream_call_cancel(q->call);
        q->call = NULL;
    }
}

static void release(gw_tier *t, gw_req *r)
{
    detach(t, r);
    up_req *q = r->tier_state;
    if (q == NULL)
        return;
    if (q->held != NULL)
        evbuffer_free(q->held);
    q->held = NULL;
    r->tier_state = NULL;   /* q and its body live in r's arena */
}

static void metrics(gw_tier *base, gw_metrics *m)
{
    up_tier *t = (up_tier *)base;
    int open, busy, queued;
    char labels[200];
    gw_upstream_stats(t->up, &open, &busy, &queued);
    snprintf(labels, sizeof labels, "%s,state=\"open\"", t->label);
    gw_metrics_set(m, "llmgw_upstream_connections", labels, open);
    snprintf(labels, sizeof labels, "%s,state=\"busy\"", t->label);
    gw_metrics_set(m, "llmgw_upstream_connections", labels, busy);
    snprintf(labels, sizeof labels, "%s,state=\"queued\"", t->label);
    gw_metrics_set(m, "llmgw_upstream_connections", labels, queued);
}

static void tier_free(gw_tier *base)
{
    up_tier *t = (up_tier *)base;
    gw_upstream_free(t->up);
    free(t);
}

static const gw_tier_ops ops = {"upstream", start, detach, release, metrics, tier_free};

int gw_upstream_tier_new(gw_tier **out, gw_server *s, int index, util_err *err)
{
    const gw_tier_cfg *c = &s->cfg->tiers[index];
    up_tier *t = util_xcalloc(1, sizeof *t);
    t->base = (gw_tier){.ops = &ops, .cfg = c, .index = index, .impl = t};
    t->srv = s;
    snprintf(t->label, sizeof t->label, "tier=\"%s\"", c->name);
    int rc = gw_upstream_new(&t->up, s->base, s->dns, c, err);
    if (rc != 0) {
        free(t);
        return rc;
    }
    *out = &t->base;
    return 0;
}
