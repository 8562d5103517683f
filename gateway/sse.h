/* gateway/sse.h: Server-Sent Events framing (the text/event-stream format of the HTML spec).
 * The writer frames one event per call; the parser takes bytes in arbitrary splits (as they
 * arrive from an upstream) and calls back once per complete event. Loop thread only. */
#ifndef LLMGW_GATEWAY_SSE_H
#define LLMGW_GATEWAY_SSE_H

#include <stdbool.h>
#include <stddef.h>

struct evbuffer;

/* Appends "data: <line>\n" for each line of data (split at \n, \r\n or \r) and a blank line. */
void gw_sse_write(struct evbuffer *out, const char *data, size_t len);

/* The data payload ("[DONE]") closing an OpenAI stream. */
#define GW_SSE_DONE "[DONE]"

/* Called per event; `event` is the event type ("" = message), `data` is the data lines joined
 * by \n and NUL-terminated. A non-zero return stops the feed and is returned by it. */
typedef int (*gw_sse_event_cb)(void *arg, const char *event, const char *data, size_t len);

typedef struct gw_sse_parser {
    char *line;          /* the line being assembled [line_cap] */
    size_t line_len, line_cap;
    char *data;          /* the event's data so far [data_cap] */
    size_t data_len, data_cap;
    char event[64];
    size_t max_bytes;    /* a line or event larger than this is an error */
    bool skip_lf;        /* the last byte was \r: a following \n ends nothing */
    bool has_data;
} gw_sse_parser;

void gw_sse_parser_init(gw_sse_parser *p, size_t max_bytes);
void gw_sse_parser_deinit(gw_sse_parser *p);
/* Returns 0, LLMGW_ERANGE when a line or event passes max_bytes, or the callback's value. */
int  gw_sse_parser_feed(gw_sse_parser *p, const char *bytes, size_t n, gw_sse_event_cb cb,
                        void *arg);

#endif
