/* gateway/reply.h: the bottom of the request path: every byte a client is sent leaves through
 * here. A whole answer (JSON or any body), an OpenAI error body, a stream of SSE events
 * (written by us or passed through from an upstream), an error sent mid-stream as the stream's
 * last event. Output filters (gw_filter, internal.h) see each answer on its way out: the cache
 * captures answers as one. When an answer is over — sent, broken or abandoned because the
 * client left — the filters' end runs and then hooks.reply_done, which frees the request.
 * The bytes go to the request's transport (r->io): evhttp in the daemon.
 * Loop thread only. */
#ifndef LLMGW_GATEWAY_REPLY_H
#define LLMGW_GATEWAY_REPLY_H

#include "gateway/internal.h"

#include <stdbool.h>
#include <stddef.h>

typedef struct cJSON cJSON;

/* Adds f (its ctx) to r's filters, run in the order added. At most GW_MAX_FILTERS. */
void gw_reply_filter(gw_req *r, const gw_filter *f, void *ctx);

/* A header for the answer (before it starts). */
void gw_reply_header(gw_req *r, const char *name, const char *value);
/* A request header, or NULL (none, or the client is gone). */
const char *gw_request_header(gw_req *r, const char *name);

/* Whole answers; each ends the request. */
void gw_reply_json(gw_req *r, int status, cJSON *o);    /* takes o */
void gw_reply_body(gw_req *r, int status, const char *content_type, struct evbuffer *body);
/* The one funnel for errors before an answer starts: the OpenAI error body. */
void gw_reply_error(gw_req *r, int status, const char *type, const char *param,
                    const char *code, const char *fmt, ...) __attribute__((format(printf, 6, 7)));
void gw_reply_model_not_found(gw_req *r, const char *model);   /* 404 model_not_found */

/* A stream: begin, events, end. */
void gw_stream_begin(gw_req *r, int status, const char *content_type);
void gw_stream_event(gw_req *r, const char *data, size_t len);  /* one SSE event */
void gw_stream_buffer(gw_req *r, struct evbuffer *b);  /* b's contents as one event; empties b */
/* The same for an event llmgw wrote itself, with what it says for the filters. */
void gw_stream_buffer_info(gw_req *r, struct evbuffer *b, const gw_stream_info *info);
/* Bytes that already are SSE (an upstream's stream), sent as they are; the filters see each
 * complete event, and so does cb (when not NULL). */
void gw_stream_forward(gw_req *r, struct evbuffer *bytes,
                       void (*cb)(gw_req *r, const char *data, size_t len));
void gw_stream_end(gw_req *r);
/* An OpenAI error body as the stream's last event (the answer broke after it began), then the
 * end of the stream. The message is escaped, whatever it holds. */
void gw_stream_error(gw_req *r, const char *type, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* The client left: the filters' end runs and the request is freed (reply_done). */
void gw_reply_abandon(gw_req *r);
/* Frees what the reply layer kept for r (when r is freed). */
void gw_reply_release(gw_req *r);

#endif
