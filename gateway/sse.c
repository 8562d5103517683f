/* gateway/sse.c: SSE writer and incremental parser. */
#include "gateway/sse.h"

#include "common/arena.h"
#include "common/err.h"

#include <event2/buffer.h>
#include <stdlib.h>
#include <string.h>

void gw_sse_write(struct evbuffer *out, const char *data, size_t len)
{
    size_t start = 0;
    for (size_t i = 0; i <= len; i++) {
        if (i == len || data[i] == '\n' || data[i] == '\r') {
            evbuffer_add(out, "data: ", 6);
            evbuffer_add(out, data + start, i - start);
            evbuffer_add(out, "\n", 1);
            if (i < len && data[i] == '\r' && i + 1 < len && data[i + 1] == '\n')
                i++;
            start = i + 1;
        }
    }
    evbuffer_add(out, "\n", 1);
}

void gw_sse_parser_init(gw_sse_parser *p, size_t max_bytes)
{
    memset(p, 0, sizeof *p);
    p->max_bytes = max_bytes;
}

void gw_sse_parser_deinit(gw_sse_parser *p)
{
    free(p->line);
    free(p->data);
    memset(p, 0, sizeof *p);
}

static int append(char **buf, size_t *len, size_t *cap, const char *s, size_t n, size_t max)
{
    if (*len + n > max)  /* max counts the bytes, not our NUL */
        return LLMGW_ERANGE;
    if (*len + n + 1 > *cap) {
        size_t c = *cap ? *cap : 256;
        while (c < *len + n + 1)
            c *= 2;
        char *g = realloc(*buf, c);
        if (g == NULL)
            return LLMGW_ENOMEM;
        *buf = g;
        *cap = c;
    }
    memcpy(*buf + *len, s, n);
    *len += n;
    (*buf)[*len] = '\0';
    return 0;
}

/* Handles one complete line (without its terminator). An empty line dispatches the event. */
static int process_line(gw_sse_parser *p, gw_sse_event_cb cb, void *arg)
{
    const char *line = p->line ? p->line : "";
    size_t len = p->line_len;
    if (len == 0) {
        int rc = 0;
        if (p->has_data)
            rc = cb(arg, p->event, p->data ? p->data : "", p->data_len);
        p->data_len = 0;
        if (p->data)
            p->data[0] = '\0';
        p->event[0] = '\0';
        p->has_data = false;
        return rc;
    }
    if (line[0] == ':')
        return 0;  /* a comment (keep-alive) */
    const char *colon = memchr(line, ':', len);
    size_t name_len = colon ? (size_t)(colon - line) : len;
    const char *value = colon ? colon + 1 : line + len;
    if (colon && *value == ' ')
        value++;
    size_t value_len = (size_t)(line + len - value);
    if (name_len == 4 && !memcmp(line, "data", 4)) {
        int rc;
        if (p->has_data && (rc = append(&p->data, &p->data_len, &p->data_cap, "\n", 1,
                                        p->max_bytes)) != 0)
            return rc;
        p->has_data = true;
        return append(&p->data, &p->data_len, &p->data_cap, value, value_len, p->max_bytes);
    }
    if (name_len == 5 && !memcmp(line, "event", 5)) {
        size_t n = value_len < sizeof p->event - 1 ? value_len : sizeof p->event - 1;
        memcpy(p->event, value, n);
        p->event[n] = '\0';
    }
    return 0;  /* id, retry and unknown fields carry nothing we use */
}

int gw_sse_parser_feed(gw_sse_parser *p, const char *bytes, size_t n, gw_sse_event_cb cb,
                       void *arg)
{
    size_t i = 0;
    while (i < n) {
        if (p->skip_lf) {
            p->skip_lf = false;
            if (bytes[i] == '\n') {
                i++;
                continue;
            }
        }
        const char *nl = bytes + i;
        const char *stop = bytes + n;
        while (nl < stop && *nl != '\n' && *nl != '\r')
            nl++;
        int rc = append(&p->line, &p->line_len, &p->line_cap, bytes + i, (size_t)(nl - bytes - i),
                        p->max_bytes);
        if (rc != 0)
            return rc;
        if (nl == stop)
            return 0;
        p->skip_lf = *nl == '\r';
        i = (size_t)(nl - bytes) + 1;
        rc = process_line(p, cb, arg);
        p->line_len = 0;
        if (rc != 0)
            return rc;
    }
    return 0;
}
