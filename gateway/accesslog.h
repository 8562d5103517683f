/* gateway/accesslog.h: the access log: one JSON line per request, appended to a file (or
 * stderr). Lines collect in memory and leave in one write() when 32 KiB have gathered or 100 ms
 * after the first unwritten line, and at close: one syscall per request would cost more than the
 * rest of a proxied request's bookkeeping. A line is never split across writes. Loop thread. */
#ifndef LLMGW_GATEWAY_ACCESSLOG_H
#define LLMGW_GATEWAY_ACCESSLOG_H

#include "common/err.h"

struct event_base;
struct evbuffer;

typedef struct gw_alog gw_alog;

/* path "-" is stderr. */
int  gw_alog_open(gw_alog **out, struct event_base *base, const char *path, util_err *err);
/* Takes the contents of line (one or more whole lines). */
void gw_alog_add(gw_alog *a, struct evbuffer *line);
/* Writes what is pending now. */
void gw_alog_flush(gw_alog *a);
void gw_alog_close(gw_alog *a);   /* flushes; NULL is a no-op */

#endif
