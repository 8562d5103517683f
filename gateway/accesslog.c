/* gateway/accesslog.c: buffered access-log lines (see accesslog.h). */
#include "gateway/accesslog.h"

#include "common/arena.h"

#include <errno.h>
#include <stdbool.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define FLUSH_BYTES (32u << 10)
#define FLUSH_MS 100

struct gw_alog {
    int fd;
    bool own_fd;
    struct evbuffer *pending;
    struct event *timer;
    bool armed;
    bool warned;
};

static void on_timer(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    gw_alog *a = arg;
    a->armed = false;
    gw_alog_flush(a);
}

int gw_alog_open(gw_alog **out, struct event_base *base, const char *path, util_err *err)
{
    int fd = 2;
    bool own = false;
    if (strcmp(path, "-") != 0) {
        fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        if (fd < 0)
            return util_err_set(err, LLMGW_EIO, "%s: %s", path, strerror(errno));
        own = true;
    }
    gw_alog *a = util_xcalloc(1, sizeof *a);
    a->fd = fd;
    a->own_fd = own;
    a->pending = evbuffer_new();
    a->timer = evtimer_new(base, on_timer, a);
    *out = a;
    return 0;
}

void gw_alog_flush(gw_alog *a)
{
    size_t len = evbuffer_get_length(a->pending);
    while (len > 0) {
        /* One contiguous write: with O_APPEND, replicas sharing the file never interleave. */
        const char *p = (const char *)evbuffer_pullup(a->pending, -1);
        ssize_t n = write(a->fd, p, len);
        if (n > 0) {
            evbuffer_drain(a->pending, (size_t)n);
            len -= (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (!a->warned) {
            a->warned = true;
            static const char msg[] = "llmgw: access log write failed; lines are dropped\n";
            ssize_t w = write(2, msg, sizeof msg - 1);
            (void)w;
        }
        evbuffer_drain(a->pending, len);
        len = 0;
    }
}

void gw_alog_add(gw_alog *a, struct evbuffer *line)
{
    evbuffer_add_buffer(a->pending, line);
    if (evbuffer_get_length(a->pending) >= FLUSH_BYTES) {
        gw_alog_flush(a);
        return;
    }
    if (!a->armed) {
        struct timeval tv = {0, FLUSH_MS * 1000};
        evtimer_add(a->timer, &tv);
        a->armed = true;
    }
}

void gw_alog_close(gw_alog *a)
{
    if (a == NULL)
        return;
    gw_alog_flush(a);
    event_free(a->timer);
    evbuffer_free(a->pending);
    if (a->own_fd)
        close(a->fd);
    free(a);
}
