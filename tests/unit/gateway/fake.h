/* tests/unit/gateway/fake.h: the request path's plumbing for unit tests, in one place: a
 * transport that records what a client would be sent, a fake tier behind gateway/tier.h
 * (fine in unit tests; integration tests keep real processes), and a gw_server with the
 * hooks a daemon would have (api.c's part played here). Header-only: each test is one file. */
#ifndef LLMGW_TESTS_UNIT_GATEWAY_FAKE_H
#define LLMGW_TESTS_UNIT_GATEWAY_FAKE_H

#include "common/arena.h"
#include "gateway/config.h"
#include "gateway/internal.h"
#include "gateway/metrics.h"
#include "gateway/reply.h"
#include "gateway/tier.h"
#include "router/alias.h"

#include <cjson/cJSON.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

/* ---- the recording transport -------------------------------------------------------------- */

typedef struct rec {
    const char *in_headers[8][2];  /* request headers offered: {name, value} */
    char headers[4096];            /* "name: value\n" per header added */
    int status;
    bool sent, started, ended;     /* a whole answer; a chunked one began; it ended */
    int n_chunks;
    char body[65536];              /* the whole answer, or the chunks joined */
    size_t len;
} rec;

static inline const char *rec_header(gw_req *r, const char *name)
{
    rec *x = r->io_ctx;
    for (int i = 0; i < 8 && x->in_headers[i][0] != NULL; i++)
        if (!strcasecmp(x->in_headers[i][0], name))
            return x->in_headers[i][1];
    return NULL;
}

static inline void rec_add_header(gw_req *r, const char *name, const char *value)
{
    rec *x = r->io_ctx;
    size_t n = strlen(x->headers);
    snprintf(x->headers + n, sizeof x->headers - n, "%s: %s\n", name, value);
}

static inline void rec_take(rec *x, struct evbuffer *b)
{
    size_t n = evbuffer_get_length(b);
    if (x->len + n >= sizeof x->body)
        n = sizeof x->body - 1 - x->len;
    evbuffer_remove(b, x->body + x->len, n);
    x->len += n;
    x->body[x->len] = '\0';
    evbuffer_drain(b, evbuffer_get_length(b));
}

static inline void rec_send(gw_req *r, int status, struct evbuffer *body)
{
    rec *x = r->io_ctx;
    x->status = status;
    x->sent = true;
    rec_take(x, body);
}

static inline void rec_start(gw_req *r, int status)
{
    rec *x = r->io_ctx;
    x->status = status;
    x->started = true;
}

static inline void rec_chunk(gw_req *r, struct evbuffer *data)
{
    rec *x = r->io_ctx;
    x->n_chunks++;
    rec_take(x, data);
}

static inline void rec_end(gw_req *r)
{
    rec *x = r->io_ctx;
    x->ended = true;
}

static const gw_transport rec_transport = {rec_header, rec_add_header, rec_send, rec_start,
                                           rec_chunk, rec_end};

/* The value of header `name` the answer got, or NULL (the first one). */
static inline const char *rec_find(const rec *x, const char *name, char *out, size_t cap)
{
    char key[128];
    snprintf(key, sizeof key, "%s: ", name);
    const char *p = strstr(x->headers, key);
    if (p == NULL)
        return NULL;
    p += strlen(key);
    size_t n = strcspn(p, "\n");
    snprintf(out, cap, "%.*s", (int)n, p);
    return out;
}

/* ---- the fake tier ------------------------------------------------------------------------ */

typedef enum fake_mode {
    FAKE_ANSWER = 0,    /* a whole 200 JSON answer at once */
    FAKE_FAIL = 1,      /* a failure before any byte (answered here when no fallback is left) */
    FAKE_HOLD = 2,      /* keeps the request until fake_answer */
} fake_mode;

typedef struct fake_tier {
    gw_tier base;
    fake_mode mode;
    int started, detached, released;
    bool saw_fallback_ok;          /* r->fallback_ok at the last start */
    gw_req *held;
} fake_tier;

static inline void fake_answer(gw_req *r)
{
    fake_tier *t = r->tier_impl->impl;
    t->held = NULL;
    r->prompt_tokens = 10;
    r->completion_tokens = 5;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "object", "chat.completion");
    cJSON_AddStringToObject(o, "tier", t->base.cfg->name);
    gw_reply_json(r, 200, o);
}

static inline void fake_start(gw_tier *base, gw_req *r)
{
    fake_tier *t = base->impl;
    t->started++;
    t->saw_fallback_ok = r->fallback_ok;
    r->tier_state = t;   /* anything non-NULL: released must see it */
    r->attempts++;
    if (t->mode == FAKE_ANSWER) {
        fake_answer(r);
    } else if (t->mode == FAKE_FAIL) {
        if (r->fallback_ok)
            gw_tier_fail(r, 502, "upstream_error", "upstream_unavailable", "connect",
                         "Tier '%s' is down.", base->cfg->name);
        else
            gw_reply_error(r, 502, "upstream_error", NULL, "upstream_unavailable",
                           "Tier '%s' is down (no fallback).", base->cfg->name);
    } else {
        t->held = r;
    }
}

static inline void fake_detach(gw_tier *base, gw_req *r)
{
    fake_tier *t = base->impl;
    (void)r;
    t->detached++;
    t->held = NULL;
}

static inline void fake_release(gw_tier *base, gw_req *r)
{
    fake_tier *t = base->impl;
    if (r->tier_state != NULL)
        t->released++;
    r->tier_state = NULL;
}

static inline void fake_metrics(gw_tier *base, gw_metrics *m)
{
    (void)base;
    (void)m;
}

static inline void fake_free(gw_tier *base)
{
    free(base->impl);
}

static const gw_tier_ops fake_ops = {"fake", fake_start, fake_detach, fake_release,
                                     fake_metrics, fake_free};

/* ---- a server without sockets -------------------------------------------------------------- */

typedef struct fake_srv {
    gw_server s;
    int done;                      /* answers over (reply_done) */
    int last_status;
    fake_tier **fakes;             /* [n_tiers] */
    void (*release)(gw_req *r);    /* the tested module's part of freeing a request, or NULL */
} fake_srv;

static fake_srv *the_fake;

/* hooks.reply_done, as api.c's finish() would: count, free what the module under test keeps,
 * then the request. */
static inline void fake_reply_done(gw_req *r)
{
    the_fake->done++;
    the_fake->last_status = r->status;
    if (the_fake->release != NULL)
        the_fake->release(r);
    gw_reply_release(r);
    gw_request_deinit(&r->body);
    util_arena_deinit(&r->arena);
    free(r);
}

/* Writes text to /tmp/llmgw-test-<tag>-<pid>.yaml (a policy file); its path into path. */
static inline void fake_write_file(char *path, size_t cap, const char *tag, const char *text)
{
    snprintf(path, cap, "/tmp/llmgw-test-%s-%d.yaml", tag, (int)getpid());
    FILE *f = fopen(path, "w");
    if (f == NULL || fputs(text, f) < 0 || fclose(f) != 0)
        abort();
}

static inline void fake_srv_init(fake_srv *f, const char *config_yaml)
{
    memset(f, 0, sizeof *f);
    the_fake = f;
    util_err err = {0};
    char text[4096];
    snprintf(text, sizeof text, "listen:\n  - address: 127.0.0.1:0\n%s", config_yaml);
    if (gw_config_parse(&f->s.cfg, text, strlen(text), "test.yaml", "/tmp", &err) != 0) {
        fprintf(stderr, "config: %s\n", err.msg);
        abort();
    }
    f->s.base = event_base_new();
    f->s.metrics = gw_metrics_new();
    f->s.hooks.reply_done = fake_reply_done;
    size_t n = f->s.cfg->n_tiers;
    f->s.models = router_alias_new();
    for (size_t i = 0; i < n; i++) {
        router_alias_add(f->s.models, f->s.cfg->tiers[i].name, (int)i);
        for (size_t a = 0; a < f->s.cfg->tiers[i].n_aliases; a++)
            router_alias_add(f->s.models, f->s.cfg->tiers[i].aliases[a], (int)i);
    }
    f->s.tiers = util_xcalloc(n, sizeof *f->s.tiers);
    f->fakes = util_xcalloc(n, sizeof *f->fakes);
    for (size_t i = 0; i < n; i++) {
        fake_tier *t = util_xcalloc(1, sizeof *t);
        t->base = (gw_tier){.ops = &fake_ops, .cfg = &f->s.cfg->tiers[i], .index = (int)i,
                            .impl = t};
        f->fakes[i] = t;
        f->s.tiers[i] = &t->base;
    }
}

static inline void fake_srv_deinit(fake_srv *f)
{
    for (size_t i = 0; i < f->s.cfg->n_tiers; i++)
        gw_tier_free(f->s.tiers[i]);
    free(f->s.tiers);
    free(f->fakes);
    router_alias_free(f->s.models);
    gw_metrics_free(f->s.metrics);
    event_base_free(f->s.base);
    gw_config_free(f->s.cfg);
    the_fake = NULL;
}

/* A request as api.c makes one, answering into x. */
static inline gw_req *fake_req(fake_srv *f, rec *x, const char *id)
{
    gw_req *r = util_xcalloc(1, sizeof *r);
    r->srv = &f->s;
    r->io = &rec_transport;
    r->io_ctx = x;
    r->tier = r->first_tier = -1;
    r->endpoint = "chat";
    snprintf(r->id, sizeof r->id, "%s", id);
    util_arena_init(&r->arena, 4096);
    return r;
}

/* Parses body into r (a chat request unless ep says otherwise). */
static inline void fake_parse(gw_req *r, gw_endpoint ep, const char *body)
{
    gw_req_error e;
    if (gw_request_parse(&r->body, ep, body, strlen(body), &r->arena, &e) != 0) {
        fprintf(stderr, "parse: %s\n", e.message);
        abort();
    }
}

/* The counter's value in /metrics text, or -1 when it is not there. */
static inline double fake_metric(fake_srv *f, const char *series)
{
    struct evbuffer *b = evbuffer_new();
    gw_metrics_render(f->s.metrics, b);
    evbuffer_add(b, "", 1);
    const char *text = (const char *)evbuffer_pullup(b, -1);
    const char *p = strstr(text, series);
    double v = -1;
    while (p != NULL && p > text && p[-1] != '\n')
        p = strstr(p + 1, series);
    if (p != NULL)
        v = strtod(p + strlen(series), NULL);
    evbuffer_free(b);
    return v;
}

#endif
