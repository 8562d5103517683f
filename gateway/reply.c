/* gateway/reply.c: every answer on its way out (see reply.h). */
#include "gateway/reply.h"

#include "common/time.h"
#include "common/arena.h"
#include "gateway/sse.h"

#include <cjson/cJSON.h>
#include <event2/buffer.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#define MAX_FORWARD_EVENT (4u << 20)   /* a forwarded SSE line or event larger is not parsed */

void gw_reply_filter(gw_req *r, const gw_filter *f, void *ctx)
{
    if (r->n_filters >= GW_MAX_FILTERS)
        abort();  /* a programming error: the set of filters is fixed */
    r->filters[r->n_filters].f = f;
    r->filters[r->n_filters].ctx = ctx;
    r->n_filters++;
}

void gw_reply_header(gw_req *r, const char *name, const char *value)
{
    if (r->io_ctx != NULL)
        r->io->add_header(r, name, value);
}

const char *gw_request_header(gw_req *r, const char *name)
{
    return r->io_ctx != NULL ? r->io->header(r, name) : NULL;
}

/* The end of every answer: the filters, then the request's owner. */
static void over(gw_req *r)
{
    for (int i = 0; i < r->n_filters; i++)
        if (r->filters[i].f->end != NULL)
            r->filters[i].f->end(r, r->filters[i].ctx);
    r->n_filters = 0;
    r->srv->hooks.reply_done(r);
}

static void head(gw_req *r, const char *content_type)
{
    if (content_type != NULL)
        gw_reply_header(r, "Content-Type", content_type);
    gw_reply_header(r, "x-request-id", r->id);
    if (r->tier >= 0)
        gw_reply_header(r, "x-llmgw-tier", r->srv->cfg->tiers[r->tier].name);
    for (int i = 0; i < r->n_filters; i++)
        if (r->filters[i].f->headers != NULL)
            r->filters[i].f->headers(r, r->filters[i].ctx);
    if (r->srv->draining)
        gw_reply_header(r, "Connection", "close");
}

void gw_reply_body(gw_req *r, int status, const char *content_type, struct evbuffer *body)
{
    r->status = status;
    if (r->t_first_byte == 0)
        r->t_first_byte = util_now_ns();
    if (content_type != NULL && !strcmp(content_type, "application/json")) {
        const char *data = NULL;
        size_t len = evbuffer_get_length(body);
        for (int i = 0; i < r->n_filters; i++) {
            if (r->filters[i].f->body == NULL)
                continue;
            if (data == NULL)
                data = (const char *)evbuffer_pullup(body, -1);
            r->filters[i].f->body(r, r->filters[i].ctx, status, data ? data : "", len);
        }
    }
    if (r->io_ctx != NULL) {
        head(r, content_type);
        r->bytes_out += evbuffer_get_length(body);
        r->io->send(r, status, body);
        r->io_ctx = NULL;
    }
    over(r);
}

void gw_reply_json(gw_req *r, int status, cJSON *o)
{
    char *text = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    struct evbuffer *b = evbuffer_new();
    evbuffer_add(b, text, strlen(text));
    evbuffer_add(b, "\n", 1);
    free(text);
    gw_reply_body(r, status, "application/json", b);
    evbuffer_free(b);
}

/* {"error":{"message","type","param","code"}} with every string escaped. */
static void error_body(struct evbuffer *b, const char *msg, const char *type, const char *param,
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
    char *text = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    evbuffer_add(b, text, strlen(text));
    free(text);
}

/* The error body for a formatted message, in a new buffer. */
static struct evbuffer *error_buffer(const char *type, const char *param, const char *code,
                                     const char *fmt, va_list ap)
    __attribute__((format(printf, 4, 0)));

static struct evbuffer *error_buffer(const char *type, const char *param, const char *code,
                                     const char *fmt, va_list ap)
{
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    struct evbuffer *b = evbuffer_new();
    error_body(b, msg, type, param, code);
    return b;
}

void gw_reply_error(gw_req *r, int status, const char *type, const char *param,
                    const char *code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    struct evbuffer *b = error_buffer(type, param, code, fmt, ap);
    va_end(ap);
    evbuffer_add(b, "\n", 1);
    gw_reply_body(r, status, "application/json", b);
    evbuffer_free(b);
}

void gw_reply_model_not_found(gw_req *r, const char *model)
{
    gw_reply_error(r, 404, "invalid_request_error", "model", "model_not_found",
                   "The model '%.200s' does not exist or you do not have access to it.", model);
}

void gw_stream_begin(gw_req *r, int status, const char *content_type)
{
    r->replying = true;
    r->status = status;
    if (r->t_first_byte == 0)
        r->t_first_byte = util_now_ns();
    if (r->io_ctx == NULL)
        return;
    head(r, content_type);
    gw_reply_header(r, "Cache-Control", "no-cache");
    gw_reply_header(r, "X-Accel-Buffering", "no");
    r->io->start(r, status);
}

static void see_event(gw_req *r, const char *data, size_t len, const gw_stream_info *info)
{
    for (int i = 0; i < r->n_filters; i++)
        if (r->filters[i].f->event != NULL)
            r->filters[i].f->event(r, r->filters[i].ctx, data, len, info);
}

static void send_event(gw_req *r, const char *data, size_t len, const gw_stream_info *info)
{
    see_event(r, data, len, info);
    if (r->io_ctx == NULL)
        return;
    /* One buffer per request for every event: the transport moves its contents out. */
    if (r->sse_out == NULL)
        r->sse_out = evbuffer_new();
    gw_sse_write(r->sse_out, data, len);
    r->bytes_out += evbuffer_get_length(r->sse_out);
    r->io->chunk(r, r->sse_out);
    evbuffer_drain(r->sse_out, evbuffer_get_length(r->sse_out));  /* a gone peer leaves it */
}

void gw_stream_event(gw_req *r, const char *data, size_t len)
{
    send_event(r, data, len, NULL);
}

void gw_stream_buffer_info(gw_req *r, struct evbuffer *b, const gw_stream_info *info)
{
    size_t n = evbuffer_get_length(b);
    send_event(r, (const char *)evbuffer_pullup(b, -1), n, info);
    evbuffer_drain(b, n);
}

void gw_stream_buffer(gw_req *r, struct evbuffer *b)
{
    gw_stream_buffer_info(r, b, NULL);
}

typedef struct forward_ctx {
    gw_req *r;
    void (*cb)(gw_req *r, const char *data, size_t len);
} forward_ctx;

static int forwarded_event(void *arg, const char *event, const char *data, size_t len)
{
    forward_ctx *f = arg;
    (void)event;
    if (f->cb != NULL)
        f->cb(f->r, data, len);
    see_event(f->r, data, len, NULL);
    return 0;
}

void gw_stream_forward(gw_req *r, struct evbuffer *bytes,
                       void (*cb)(gw_req *r, const char *data, size_t len))
{
    if (r->sse_in == NULL) {
        r->sse_in = util_arena_alloc(&r->arena, sizeof *r->sse_in);
        gw_sse_parser_init(r->sse_in, MAX_FORWARD_EVENT);
    }
    forward_ctx f = {r, cb};
    struct evbuffer_iovec v[16];
    int n = evbuffer_peek(bytes, -1, NULL, v, 16);
    for (int i = 0; i < n && i < 16; i++)
        if (gw_sse_parser_feed(r->sse_in, v[i].iov_base, v[i].iov_len, forwarded_event, &f) != 0)
            break;
    size_t len = evbuffer_get_length(bytes);
    if (r->io_ctx == NULL) {
        evbuffer_drain(bytes, len);
        return;
    }
    r->bytes_out += len;
    r->io->chunk(r, bytes);
}

void gw_stream_end(gw_req *r)
{
    if (r->io_ctx != NULL) {
        r->io->end(r);
        r->io_ctx = NULL;
    }
    over(r);
}

void gw_stream_error(gw_req *r, const char *type, const char *code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    struct evbuffer *b = error_buffer(type, NULL, code, fmt, ap);
    va_end(ap);
    gw_stream_buffer(r, b);
    evbuffer_free(b);
    gw_stream_end(r);
}

void gw_reply_abandon(gw_req *r)
{
    r->io_ctx = NULL;
    r->client_gone = true;
    over(r);
}

void gw_reply_release(gw_req *r)
{
    if (r->sse_in != NULL)
        gw_sse_parser_deinit(r->sse_in);
    r->sse_in = NULL;
    if (r->sse_out != NULL)
        evbuffer_free(r->sse_out);
    r->sse_out = NULL;
}
