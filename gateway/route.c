/* gateway/route.c: the routing policy on the request path (see route.h). */
#include "gateway/route.h"

#include "common/log.h"
#include "common/time.h"
#include "gateway/engine_tier.h"
#include "gateway/reply.h"
#include "router/alias.h"
#include "router/classifier.h"
#include "router/policy.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <event2/event.h>
#include <stdarg.h>
#include <limits.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/inotify.h>
#include <unistd.h>

#define DEBOUNCE_MS 200

struct gw_router {
    gw_server *srv;
    char *path;                /* the policy file */
    char *dir, *base;          /* its directory (watched) and file name */
    router_policy *cur;        /* the policy file's; NULL without one */
    router_policy *implicit;   /* the config's tiers as a policy (router_policy_implicit) */
    int *inflight;             /* [n_tiers] requests each config tier answers now */
    const char **backends;     /* the config's tier names */
    size_t n_backends;
    uint64_t generation;
    int64_t loaded_ms;
    char error[512];           /* the last failed reload, "" when the current file is good */
    int ino;
    struct event *ev_ino, *ev_debounce, *ev_hup;
};

/* ---- loading and reloading ---------------------------------------------------------------- */

static int load(gw_router *g, util_err *err)
{
    router_policy *p = NULL;
    int rc = router_policy_load(&p, g->path, g->backends, g->n_backends, err);
    gw_metrics *m = g->srv->metrics;
    if (rc != 0) {
        snprintf(g->error, sizeof g->error, "%s", err->msg);
        if (m != NULL) {
            gw_metrics_add(m, "llmgw_policy_reloads_total", "result=\"error\"", 1);
            gw_metrics_set(m, "llmgw_policy_valid", NULL, 0);
        }
        return rc;
    }
    router_policy *old = g->cur;
    g->cur = p;                 /* requests in flight keep their own reference to `old` */
    router_policy_unref(old);
    g->generation++;
    g->loaded_ms = (int64_t)util_wall_ms();
    g->error[0] = '\0';
    if (m != NULL) {
        gw_metrics_add(m, "llmgw_policy_reloads_total", "result=\"ok\"", 1);
        gw_metrics_set(m, "llmgw_policy_valid", NULL, 1);
        gw_metrics_set(m, "llmgw_policy_generation", NULL, (double)g->generation);
    }
    if (router_policy_uses_score(p) && g->srv->cfg->encoder.model_dir == NULL)
        UTIL_LOG_WARN("route", "%s: score rules need the encoder (config 'encoder'); without it "
                      "every score is 0", g->path);
    return 0;
}

int gw_router_reload(gw_router *g)
{
    util_err err = {0};
    if (g->path == NULL)
        return 0;  /* the implicit policy never changes */
    if (load(g, &err) != 0) {
        UTIL_LOG_ERROR("route", "policy reload failed, the previous policy keeps serving: %s",
                       err.msg);
        return err.code ? err.code : LLMGW_EINVAL;
    }
    UTIL_LOG_INFO("route", "policy %s loaded (generation %llu, %zu tiers)", g->path,
                  (unsigned long long)g->generation, router_policy_tier_count(g->cur));
    return 0;
}

static void on_debounce(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    gw_router_reload(arg);
}

/* inotify: any change to the file's name in its directory (written in place, renamed over,
 * recreated) arms the debounce timer; a burst of events reloads once. */
static void on_inotify(evutil_socket_t fd, short what, void *arg)
{
    gw_router *g = arg;
    (void)what;
    char buf[4096] __attribute__((aligned(__alignof__(struct inotify_event))));
    bool ours = false;
    for (;;) {
        ssize_t n = read(fd, buf, sizeof buf);
        if (n <= 0)
            break;
        for (char *p = buf; p < buf + n;) {
            const struct inotify_event *ev = (const struct inotify_event *)p;
            if (ev->len > 0 && !strcmp(ev->name, g->base))
                ours = true;
            p += sizeof *ev + ev->len;
        }
    }
    if (ours) {
        struct timeval tv = {0, DEBOUNCE_MS * 1000};
        event_add(g->ev_debounce, &tv);
    }
}

static void on_hup(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    UTIL_LOG_INFO("route", "SIGHUP: reloading the policy");
    gw_router_reload(arg);
}

int gw_router_new(gw_router **out, gw_server *s, util_err *err)
{
    *out = NULL;
    gw_router *g = util_xcalloc(1, sizeof *g);
    g->srv = s;
    g->ino = -1;
    size_t n = s->cfg->n_tiers;
    g->inflight = util_xcalloc(n ? n : 1, sizeof *g->inflight);
    g->n_backends = n;
    g->backends = util_xcalloc(n ? n : 1, sizeof *g->backends);
    int *fb = util_xcalloc(n ? n : 1, sizeof *fb);
    for (size_t i = 0; i < n; i++) {
        const gw_tier_cfg *t = &s->cfg->tiers[i];
        g->backends[i] = t->name;
        const gw_tier_cfg *f = t->fallback != NULL ? gw_config_tier(s->cfg, t->fallback) : NULL;
        fb[i] = f != NULL ? (int)(f - s->cfg->tiers) : -1;
    }
    g->implicit = router_policy_implicit(g->backends, fb, n);
    free(fb);
    if (s->cfg->policy_path == NULL) {
        *out = g;
        return 0;
    }
    g->path = util_xstrdup(s->cfg->policy_path);
    g->dir = util_xstrdup(g->path);
    char *slash = strrchr(g->dir, '/');
    if (slash != NULL) {
        *slash = '\0';
        g->base = util_xstrdup(slash + 1);
    } else {
        g->base = util_xstrdup(g->path);
        strcpy(g->dir, ".");
    }
    int rc = load(g, err);
    if (rc != 0) {
        gw_router_free(g);
        return rc;
    }
    g->ev_debounce = evtimer_new(s->base, on_debounce, g);
    g->ev_hup = evsignal_new(s->base, SIGHUP, on_hup, g);
    evsignal_add(g->ev_hup, NULL);
    g->ino = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    if (g->ino < 0 || inotify_add_watch(g->ino, g->dir, IN_CLOSE_WRITE | IN_MOVED_TO | IN_CREATE |
                                        IN_DELETE | IN_MOVED_FROM) < 0) {
        UTIL_LOG_WARN("route", "cannot watch %s (%s): reload with SIGHUP", g->dir,
                      strerror(errno));
    } else {
        g->ev_ino = event_new(s->base, g->ino, EV_READ | EV_PERSIST, on_inotify, g);
        event_add(g->ev_ino, NULL);
    }
    UTIL_LOG_INFO("route", "policy %s: %zu tiers; watching it for changes", g->path,
                  router_policy_tier_count(g->cur));
    *out = g;
    return 0;
}

void gw_router_free(gw_router *g)
{
    if (g == NULL)
        return;
    if (g->ev_ino)
        event_free(g->ev_ino);
    if (g->ev_debounce)
        event_free(g->ev_debounce);
    if (g->ev_hup)
        event_free(g->ev_hup);
    if (g->ino >= 0)
        close(g->ino);
    router_policy_unref(g->cur);
    router_policy_unref(g->implicit);
    free(g->inflight);
    free(g->backends);
    free(g->path);
    free(g->dir);
    free(g->base);
    free(g);
}

void gw_router_declare_metrics(gw_metrics *m)
{
    gw_metrics_declare(m, "llmgw_policy_reloads_total", GW_METRIC_COUNTER,
                       "Policy loads by result (ok, error: the previous policy kept serving).");
    gw_metrics_declare(m, "llmgw_policy_valid", GW_METRIC_GAUGE,
                       "1 when the policy file on disk is the one serving (its last load worked).");
    gw_metrics_declare(m, "llmgw_policy_generation", GW_METRIC_GAUGE,
                       "How many times a policy was loaded.");
    gw_metrics_declare(m, "llmgw_route_decisions_total", GW_METRIC_COUNTER,
                       "Routed requests by tier and rule (\"default\": no rule matched).");
    gw_metrics_declare(m, "llmgw_route_capability_moves_total", GW_METRIC_COUNTER,
                       "Requests routed past a tier that cannot serve them (tools, image parts, "
                       "...) to one on its chain that can, by the tier passed over.");
    gw_metrics_declare(m, "llmgw_route_scored_total", GW_METRIC_COUNTER,
                       "Requests the classifier scored, by whether it had seen their like "
                       "(familiar=\"true\"/\"false\").");
    gw_metrics_declare(m, "llmgw_cost_usd_total", GW_METRIC_COUNTER,
                       "What the answered requests cost at the policy's prices, by tier.");
    gw_metrics_declare(m, "llmgw_saved_usd_total", GW_METRIC_COUNTER,
                       "Saved against the policy's reference tier, by routing and by the cache.");
    gw_metrics_declare(m, "llmgw_tier_over_capacity_total", GW_METRIC_COUNTER,
                       "Requests a tier at max_concurrent passed down its fallback chain.");
    gw_metrics_declare(m, "llmgw_cascade_requests_total", GW_METRIC_COUNTER,
                       "Cascade requests by routed tier, deferral rule and outcome (small: the "
                       "drafting tier's answer; escalated: the routed tier came in).");
    gw_metrics_declare(m, "llmgw_cascade_small_tokens_total", GW_METRIC_COUNTER,
                       "Tokens the drafting tier generated for cascade requests, by routed tier.");
    gw_metrics_declare(m, "llmgw_cascade_kept_tokens_total", GW_METRIC_COUNTER,
                       "Of them, tokens kept in the answers (the rest the routed tier replaced).");
}

void gw_router_status(const gw_router *g, cJSON *into)
{
    if (g == NULL || g->path == NULL)
        return;
    cJSON *o = cJSON_AddObjectToObject(into, "policy");
    cJSON_AddStringToObject(o, "path", g->path);
    cJSON_AddNumberToObject(o, "generation", (double)g->generation);
    cJSON_AddNumberToObject(o, "loaded_at", (double)(g->loaded_ms / 1000));
    if (g->error[0])
        cJSON_AddStringToObject(o, "error", g->error);
    else
        cJSON_AddNullToObject(o, "error");
}

int gw_check_policy(const char *policy_path, const char *config_path)
{
    util_err err = {0};
    gw_config *c = NULL;
    const char **names = NULL;
    size_t n = 0;
    if (config_path != NULL) {
        if (gw_config_load(&c, config_path, &err) != 0) {
            fprintf(stderr, "%s\n", err.msg);
            return 2;
        }
        n = c->n_tiers;
        names = util_xcalloc(n ? n : 1, sizeof *names);
        for (size_t i = 0; i < n; i++)
            names[i] = c->tiers[i].name;
    }
    router_policy *p = NULL;
    int rc = router_policy_load(&p, policy_path, names, n, &err);
    if (rc != 0)
        fprintf(stderr, "%s\n", err.msg);
    else
        printf("%s: ok (%zu tiers%s)\n", policy_path, router_policy_tier_count(p),
               router_policy_classifier(p) ? ", classifier loaded" : "");
    router_policy_unref(p);
    free(names);
    gw_config_free(c);
    return rc == 0 ? 0 : 2;
}

/* ---- a request's route ------------------------------------------------------------------- */

/* Per request (r->route), in r's arena. */
struct gw_route_req {
    router_policy *policy;        /* the policy this request started with (a reference) */
    router_decision dec;
    int ptier;                    /* the policy tier answering */
    int first_ptier;              /* the one the decision picked: its chain is the fallback */
    int fb_pos;                   /* the fallback cursor: next entry of that chain */
    int slot_tier;                /* the config tier whose in-flight count r holds, or -1 */
    bool needs_score;
    bool hit;                     /* answered from the cache */
    long hit_prompt, hit_completion;  /* the replayed answer's usage */
    double score;                 /* the classifier's, -1 when not computed */
    bool unfamiliar;              /* the classifier has seen nothing like the prompt */
    char reason[128];             /* x-llmgw-route-reason */
};

static const char *header_of(void *ctx, const char *name)
{
    return gw_request_header(ctx, name);
}

/* The prompt's tokens, estimated without a tokenizer: about 4 bytes a token, 4 per message. */
static long estimate_tokens(const gw_request *b)
{
    size_t bytes = 0;
    for (size_t i = 0; i < b->n_messages; i++)
        bytes += b->messages[i].text_len + 16;
    if (b->prompt != NULL)
        bytes += strlen(b->prompt);
    return (long)((bytes + 3) / 4);
}

static void last_user_text(const gw_req *r, const char **text, size_t *len)
{
    const gw_message *u = gw_request_last_user(&r->body);
    if (u != NULL) {
        *text = u->text;
        *len = u->text_len;
    } else if (r->body.prompt != NULL) {
        *text = r->body.prompt;
        *len = strlen(r->body.prompt);
    } else {
        *text = "";
        *len = 0;
    }
}

static void route_once(gw_req *r, double score)
{
    struct gw_route_req *q = r->route;
    router_request rq = {
        .model = r->body.model,
        .group = r->group,
        .header = header_of,
        .header_ctx = r,
        .input_tokens = estimate_tokens(&r->body),
        .score = score,
        .unfamiliar = q->unfamiliar,
    };
    last_user_text(r, &rq.text, &rq.text_len);
    router_policy_route(q->policy, &rq, &q->dec);
}

static int backend_of(const gw_req *r, int ptier)
{
    const router_tier *t = router_policy_tier(r->route->policy, ptier);
    return (int)(gw_config_tier(r->srv->cfg, t->backend) - r->srv->cfg->tiers);
}

void gw_route_note(gw_req *r, const char *fmt, ...)
{
    struct gw_route_req *q = r->route;
    size_t n = strlen(q->reason);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(q->reason + n, sizeof q->reason - n, fmt, ap);
    va_end(ap);
}

/* What config tier `idx` cannot serve in r (a phrase), or NULL. */
static const char *lacks(const gw_req *r, int idx)
{
    if (r->srv->cfg->tiers[idx].kind != GW_TIER_ENGINE)
        return NULL;
    return gw_engine_tier_lacks(&r->body);
}

/* Capability-aware routing: a request never goes to a tier that cannot serve it (an engine
 * tier and an image part, say: gw_engine_tier_lacks) when one on its fallback chain can. With
 * none, the tier refuses it (400 naming what it lacks). */
static void avoid_incapable_tier(gw_req *r)
{
    struct gw_route_req *q = r->route;
    const gw_config *c = r->srv->cfg;
    const char *why = lacks(r, r->tier);
    if (why == NULL)
        return;
    const router_tier *t = router_policy_tier(q->policy, q->ptier);
    for (size_t i = 0; i < t->n_fallback; i++) {
        int to = backend_of(r, t->fallback[i]);
        if (lacks(r, to) != NULL)
            continue;
        gw_route_note(r, " (%s: not on '%s')", why, c->tiers[r->tier].name);
        char labels[96];
        snprintf(labels, sizeof labels, "from=\"%s\"", c->tiers[r->tier].name);
        gw_metrics_add(r->srv->metrics, "llmgw_route_capability_moves_total", labels, 1);
        q->ptier = q->first_ptier = t->fallback[i];
        r->tier = r->first_tier = to;
        return;
    }
}

/* The decision is final: the policy tier and the config tier that serves it. */
static void apply(gw_req *r)
{
    struct gw_route_req *q = r->route;
    q->ptier = q->first_ptier = q->dec.tier;
    r->tier = r->first_tier = backend_of(r, q->ptier);
    r->cascade = q->dec.cascade;
    q->needs_score = false;
    if (router_policy_is_implicit(q->policy))
        memcpy(q->reason, "model", 6);
    else if (q->dec.rule == NULL && q->score >= 0)
        snprintf(q->reason, sizeof q->reason, "default score=%.3f", q->score);
    else if (q->dec.rule == NULL)
        snprintf(q->reason, sizeof q->reason, "default");
    else if (q->score >= 0)
        snprintf(q->reason, sizeof q->reason, "rule=%s score=%.3f%s", q->dec.rule, q->score,
                 q->dec.unfamiliar ? " unfamiliar" : "");
    else
        snprintf(q->reason, sizeof q->reason, "rule=%s", q->dec.rule);
    avoid_incapable_tier(r);
    if (router_policy_is_implicit(q->policy))
        return;
    char labels[200];
    snprintf(labels, sizeof labels, "tier=\"%s\",rule=\"%s\"",
             router_policy_tier(q->policy, q->ptier)->name, q->dec.rule ? q->dec.rule : "default");
    gw_metrics_add(r->srv->metrics, "llmgw_route_decisions_total", labels, 1);
}

/* The policy tier a config tier serves (the first whose backend it is), or NULL. */
static const router_tier *policy_tier_of(const gw_req *r, int config_tier)
{
    const router_policy *p = r->route->policy;
    const char *name = r->srv->cfg->tiers[config_tier].name;
    for (size_t i = 0; i < router_policy_tier_count(p); i++)
        if (!strcmp(router_policy_tier(p, (int)i)->backend, name))
            return router_policy_tier(p, (int)i);
    return NULL;
}

/* What r cost, on its tier and (a cascade) on the tier whose model answered first: each
 * charged for what it computed. The small model: the prompt in, its tokens out; the large one,
 * when it came in: the tokens it produced out, the other positions it computed in. A small
 * tier the policy does not price is charged at the routed tier's prices. */
static void costs(const gw_req *r, double *cost, double *small_cost, double *saved)
{
    const struct gw_route_req *q = r->route;
    const router_tier *ref = router_policy_tier(q->policy,
                                                router_policy_reference_tier(q->policy));
    *small_cost = 0;
    if (q->hit) {
        *cost = 0;
        *saved = router_tier_cost(ref, q->hit_prompt, q->hit_completion);
        return;
    }
    const router_tier *t = router_policy_tier(q->policy, q->ptier);
    if (r->cascade_did.ran) {
        const router_tier *st = policy_tier_of(r, r->cascade_did.small_tier);
        *small_cost = router_tier_cost(st != NULL ? st : t, r->prompt_tokens,
                                       r->cascade_did.small_tokens);
        long out = r->completion_tokens - r->cascade_did.kept;
        long in = r->cascade_did.large_tokens - out;
        *cost = router_tier_cost(t, in > 0 ? in : 0, out > 0 ? out : 0);
    } else {
        *cost = router_tier_cost(t, r->prompt_tokens, r->completion_tokens);
    }
    *saved = router_tier_cost(ref, r->prompt_tokens, r->completion_tokens) - *cost - *small_cost;
}

/* Output filter: the decision's headers. */
static void route_headers(gw_req *r, void *ctx)
{
    struct gw_route_req *q = ctx;
    if (q->reason[0])
        gw_reply_header(r, "x-llmgw-route-reason", q->reason);
    /* Costs are known before the first byte only for whole (non-stream) answers. */
    if (r->body.stream || r->status != 200)
        return;
    char v[48];
    if (r->cascade_did.ran) {
        gw_reply_header(r, "x-llmgw-cascade", r->cascade_did.escalated ? "escalated" : "small");
        snprintf(v, sizeof v, "%ld", r->cascade_did.kept);
        gw_reply_header(r, "x-llmgw-cascade-kept-tokens", v);
        snprintf(v, sizeof v, "%ld", r->cascade_did.small_tokens);
        gw_reply_header(r, "x-llmgw-cascade-small-tokens", v);
        snprintf(v, sizeof v, "%ld", r->cascade_did.large_tokens);
        gw_reply_header(r, "x-llmgw-cascade-large-tokens", v);
    }
    if (router_policy_is_implicit(q->policy))
        return;
    double cost, small_cost, saved;
    costs(r, &cost, &small_cost, &saved);
    cost += small_cost;
    snprintf(v, sizeof v, "%.8f", cost);
    gw_reply_header(r, "x-llmgw-cost-usd", v);
    snprintf(v, sizeof v, "%.8f", saved);
    gw_reply_header(r, "x-llmgw-saved-usd", v);
}

/* Output filter: at the end, the slot goes back and the costs are counted. */
static void route_end(gw_req *r, void *ctx)
{
    struct gw_route_req *q = ctx;
    gw_router *g = r->srv->router;
    if (q->slot_tier >= 0) {
        g->inflight[q->slot_tier]--;
        q->slot_tier = -1;
    }
    if (router_policy_is_implicit(q->policy) || r->status != 200)
        return;
    double cost, small_cost, saved;
    costs(r, &cost, &small_cost, &saved);
    char labels[200];
    const char *tname = router_policy_tier(q->policy, q->ptier)->name;
    snprintf(labels, sizeof labels, "tier=\"%s\"", tname);
    if (cost > 0)
        gw_metrics_add(r->srv->metrics, "llmgw_cost_usd_total", labels, cost);
    if (r->cascade_did.ran && r->cascade != NULL) {
        const router_tier *st = policy_tier_of(r, r->cascade_did.small_tier);
        snprintf(labels, sizeof labels, "tier=\"%s\"", st != NULL ? st->name : tname);
        if (small_cost > 0)
            gw_metrics_add(r->srv->metrics, "llmgw_cost_usd_total", labels, small_cost);
        snprintf(labels, sizeof labels, "tier=\"%s\",rule=\"%s\",outcome=\"%s\"", tname,
                 r->cascade->rule == ROUTER_DEFER_DIFF ? "diff" : "chow",
                 r->cascade_did.escalated ? "escalated" : "small");
        gw_metrics_add(r->srv->metrics, "llmgw_cascade_requests_total", labels, 1);
        snprintf(labels, sizeof labels, "tier=\"%s\"", tname);
        gw_metrics_add(r->srv->metrics, "llmgw_cascade_small_tokens_total", labels,
                       (double)r->cascade_did.small_tokens);
        gw_metrics_add(r->srv->metrics, "llmgw_cascade_kept_tokens_total", labels,
                       (double)r->cascade_did.kept);
    }
    if (saved != 0)
        gw_metrics_add(r->srv->metrics, "llmgw_saved_usd_total",
                       q->hit ? "by=\"cache\"" : "by=\"routing\"", saved);
}

static const gw_filter route_filter = {.headers = route_headers, .end = route_end};

gw_route_result gw_route_begin(gw_req *r)
{
    gw_router *g = r->srv->router;
    struct gw_route_req *q = util_arena_alloc(&r->arena, sizeof *q);
    *q = (struct gw_route_req){.ptier = -1, .first_ptier = -1, .slot_tier = -1, .score = -1};
    if (g->cur != NULL && router_policy_routes_model(g->cur, r->body.model)) {
        q->policy = router_policy_ref(g->cur);
        r->route = q;
        gw_reply_filter(r, &route_filter, q);
        route_once(r, -1);
        if (q->dec.needs_score) {
            q->needs_score = true;
            return GW_ROUTE_NEEDS_SCORE;
        }
        apply(r);
        return GW_ROUTE_OK;
    }
    int tier = router_alias_find(r->srv->models, r->body.model);
    if (tier < 0)
        return GW_ROUTE_UNKNOWN_MODEL;
    q->policy = router_policy_ref(g->implicit);
    r->route = q;
    gw_reply_filter(r, &route_filter, q);
    q->dec = (router_decision){.tier = tier, .cache = -1, .cache_threshold = -1,
                               .cache_max_false_hit_rate = -1};
    apply(r);
    return GW_ROUTE_OK;
}

bool gw_route_needs_score(const gw_req *r)
{
    return r->route != NULL && r->route->needs_score;
}

void gw_route_score(gw_req *r, const float *vec)
{
    struct gw_route_req *q = r->route;
    const router_classifier *clf = router_policy_classifier(q->policy);
    const char *text;
    size_t len;
    last_user_text(r, &text, &len);
    router_assessment a = {.score = 0.0, .familiar = false};
    if (clf != NULL)
        router_classifier_assess(clf, vec, text, len, &a);
    q->score = a.score;
    q->unfamiliar = !a.familiar;
    gw_metrics_add(r->srv->metrics, "llmgw_route_scored_total",
                   a.familiar ? "familiar=\"true\"" : "familiar=\"false\"", 1);
    route_once(r, q->score);
    if (q->dec.needs_score)  /* cannot happen with a score; be safe: the default tier */
        q->dec = (router_decision){.tier = router_policy_default_tier(q->policy), .cache = -1,
                                   .cache_threshold = -1, .cache_max_false_hit_rate = -1};
    apply(r);
    if (vec == NULL)
        gw_route_note(r, " (no embedding)");
}

int gw_route_cache_rule(const gw_req *r)
{
    return r->route != NULL && !r->route->needs_score ? r->route->dec.cache : -1;
}

double gw_route_cache_threshold(const gw_req *r)
{
    return r->route != NULL ? r->route->dec.cache_threshold : -1;
}

double gw_route_cache_max_false_hit_rate(const gw_req *r)
{
    return r->route != NULL ? r->route->dec.cache_max_false_hit_rate : -1;
}

/* The next config tier on the chain, skipping the one answering now; cursor advances only
 * when `take`. */
static int next_on_chain(gw_req *r, bool take)
{
    struct gw_route_req *q = r->route;
    if (q == NULL || q->first_ptier < 0)
        return -1;
    const router_tier *first = router_policy_tier(q->policy, q->first_ptier);
    for (size_t pos = (size_t)q->fb_pos; pos < first->n_fallback; pos++) {
        int pt = first->fallback[pos];
        int idx = backend_of(r, pt);
        if (idx == r->tier || lacks(r, idx) != NULL)
            continue;
        if (take) {
            q->fb_pos = (int)pos + 1;
            q->ptier = pt;
        }
        return idx;
    }
    if (take)
        q->fb_pos = (int)first->n_fallback;
    return -1;
}

bool gw_route_has_fallback(gw_req *r)
{
    return next_on_chain(r, false) >= 0;
}

int gw_route_fallback(gw_req *r)
{
    struct gw_route_req *q = r->route;
    int next = next_on_chain(r, true);
    if (next < 0)
        return -1;
    if (q->slot_tier >= 0) {  /* the in-flight slot moves with the request */
        r->srv->router->inflight[q->slot_tier]--;
        r->srv->router->inflight[next]++;
        q->slot_tier = next;
    }
    r->tier = next;
    return next;
}

bool gw_route_admit(gw_req *r)
{
    struct gw_route_req *q = r->route;
    gw_router *g = r->srv->router;
    for (;;) {
        const router_tier *t = router_policy_tier(q->policy, q->ptier);
        if (t->max_concurrent <= 0 || g->inflight[r->tier] < t->max_concurrent)
            break;
        char labels[100];
        snprintf(labels, sizeof labels, "tier=\"%s\"", t->name);
        gw_metrics_add(r->srv->metrics, "llmgw_tier_over_capacity_total", labels, 1);
        int next = next_on_chain(r, true);
        if (next < 0)
            return false;
        r->tier = next;
        gw_route_note(r, " (fallback: %s full)", t->name);
    }
    q->slot_tier = r->tier;
    g->inflight[r->tier]++;
    return true;
}

const char *gw_route_first_name(const gw_req *r)
{
    const struct gw_route_req *q = r->route;
    return router_policy_tier(q->policy, q->first_ptier)->name;
}

void gw_route_cache_hit(gw_req *r, long prompt_tokens, long completion_tokens)
{
    struct gw_route_req *q = r->route;
    q->hit = true;
    q->hit_prompt = prompt_tokens;
    q->hit_completion = completion_tokens;
}

const char *gw_route_reason(const gw_req *r)
{
    return r->route != NULL && r->route->reason[0] ? r->route->reason : NULL;
}

void gw_route_describe(const gw_req *r, cJSON *o)
{
    const struct gw_route_req *q = r->route;
    const router_tier *t = router_policy_tier(q->policy, q->ptier);
    const gw_tier_cfg *b = &r->srv->cfg->tiers[r->tier];
    cJSON_AddStringToObject(o, "tier", t->name);
    cJSON_AddStringToObject(o, "backend", t->backend);
    if (q->dec.rule)
        cJSON_AddStringToObject(o, "rule", q->dec.rule);
    else
        cJSON_AddNullToObject(o, "rule");
    if (!router_policy_is_implicit(q->policy)) {
        long in = estimate_tokens(&r->body);
        cJSON_AddNumberToObject(o, "input_tokens_estimate", (double)in);
        cJSON_AddNumberToObject(o, "input_cost_usd_estimate", router_tier_cost(t, in, 0));
    }
    cJSON_AddStringToObject(o, "kind", b->kind == GW_TIER_ENGINE ? "engine" : "upstream");
    cJSON_AddStringToObject(o, "reason", q->reason);
    if (q->score >= 0) {
        cJSON_AddNumberToObject(o, "score", q->score);
        cJSON_AddBoolToObject(o, "familiar", !q->unfamiliar);
    } else {
        cJSON_AddNullToObject(o, "score");
    }
}

void gw_route_release(gw_req *r)
{
    struct gw_route_req *q = r->route;
    if (q == NULL)
        return;
    if (q->slot_tier >= 0) {
        r->srv->router->inflight[q->slot_tier]--;
        q->slot_tier = -1;
    }
    router_policy_unref(q->policy);
    r->route = NULL;  /* q lives in r's arena */
}
