/* gateway/route.c: the routing policy on the request path (see route.h). */
#include "gateway/route.h"

#include "common/log.h"
#include "common/time.h"
#include "gateway/cache.h"
#include "gateway/internal.h"
#include "router/alias.h"
#include "router/classifier.h"
#include "router/policy.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
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
    router_policy *cur;
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
    if (router_policy_uses_score(p) && g->srv->cache == NULL)
        UTIL_LOG_WARN("route", "%s: score rules need the encoder (config 'encoder'); without it "
                      "every score is 0", g->path);
    return 0;
}

int gw_router_reload(gw_router *g)
{
    util_err err = {0};
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
    if (s->cfg->policy_path == NULL)
        return 0;
    gw_router *g = util_xcalloc(1, sizeof *g);
    g->srv = s;
    g->ino = -1;
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
    g->n_backends = s->cfg->n_tiers;
    g->backends = util_xcalloc(g->n_backends ? g->n_backends : 1, sizeof *g->backends);
    for (size_t i = 0; i < s->cfg->n_tiers; i++)
        g->backends[i] = s->cfg->tiers[i].name;
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
    gw_metrics_declare(m, "llmgw_cost_usd_total", GW_METRIC_COUNTER,
                       "What the answered requests cost at the policy's prices, by tier.");
    gw_metrics_declare(m, "llmgw_saved_usd_total", GW_METRIC_COUNTER,
                       "Saved against the policy's reference tier, by routing and by the cache.");
    gw_metrics_declare(m, "llmgw_tier_over_capacity_total", GW_METRIC_COUNTER,
                       "Requests a tier at max_concurrent passed down its fallback chain.");
}

void gw_router_status(const gw_router *g, cJSON *into)
{
    if (g == NULL)
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

/* ---- the request pipeline ----------------------------------------------------------------- */

static const char *header_of(void *ctx, const char *name)
{
    gw_req *r = ctx;
    return r->ereq ? evhttp_find_header(evhttp_request_get_input_headers(r->ereq), name) : NULL;
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
    router_request q = {
        .model = r->body.model,
        .group = r->group,
        .header = header_of,
        .header_ctx = r,
        .input_tokens = estimate_tokens(&r->body),
        .score = score,
    };
    last_user_text(r, &q.text, &q.text_len);
    router_policy_route(r->policy, &q, &r->dec);
}

/* A request with an image, audio or file part never goes to a tier that reads only text (an
 * engine tier) when a tier that can read it is on the way: the policy tier's fallback chain, or
 * the config tier's fallbacks. With none, the engine tier refuses it (400 naming the part). */
static void avoid_text_only_tier(gw_req *r)
{
    const gw_config *c = r->srv->cfg;
    if (r->body.media == NULL || c->tiers[r->tier].kind != GW_TIER_ENGINE)
        return;
    int to = -1, to_ptier = -1;
    if (r->policy != NULL && r->ptier >= 0) {
        const router_tier *t = router_policy_tier(r->policy, r->ptier);
        for (size_t i = 0; i < t->n_fallback && to < 0; i++) {
            const router_tier *f = router_policy_tier(r->policy, t->fallback[i]);
            const gw_tier_cfg *b = gw_config_tier(c, f->backend);
            if (b->kind != GW_TIER_ENGINE) {
                to = (int)(b - c->tiers);
                to_ptier = t->fallback[i];
            }
        }
    } else {
        const gw_tier_cfg *b = &c->tiers[r->tier];
        for (size_t hops = 0; hops < c->n_tiers && b->fallback != NULL && to < 0; hops++) {
            b = gw_config_tier(c, b->fallback);
            if (b == NULL)
                break;
            if (b->kind != GW_TIER_ENGINE)
                to = (int)(b - c->tiers);
        }
    }
    if (to < 0)
        return;
    size_t n = strlen(r->reason);
    snprintf(r->reason + n, sizeof r->reason - n, " (%s part: not for text-only '%s')",
             r->body.media->media_type, c->tiers[r->tier].name);
    r->tier = r->first_tier = to;
    if (to_ptier >= 0)
        r->ptier = to_ptier;
}

/* The decision is final: the policy tier and the config tier that serves it. */
static void apply(gw_req *r)
{
    const router_tier *t = router_policy_tier(r->policy, r->dec.tier);
    const gw_tier_cfg *b = gw_config_tier(r->srv->cfg, t->backend);
    r->ptier = r->dec.tier;
    r->tier = (int)(b - r->srv->cfg->tiers);
    r->first_tier = r->tier;
    r->needs_score = false;
    if (r->dec.rule == NULL && r->score >= 0)
        snprintf(r->reason, sizeof r->reason, "default score=%.3f", r->score);
    else if (r->dec.rule == NULL)
        snprintf(r->reason, sizeof r->reason, "default");
    else if (r->score >= 0)
        snprintf(r->reason, sizeof r->reason, "rule=%s score=%.3f", r->dec.rule, r->score);
    else
        snprintf(r->reason, sizeof r->reason, "rule=%s", r->dec.rule);
    avoid_text_only_tier(r);
    char labels[200];
    snprintf(labels, sizeof labels, "tier=\"%s\",rule=\"%s\"",
             router_policy_tier(r->policy, r->ptier)->name, r->dec.rule ? r->dec.rule : "default");
    gw_metrics_add(r->srv->metrics, "llmgw_route_decisions_total", labels, 1);
}

static void score_and_route(gw_req *r)
{
    const router_classifier *clf = router_policy_classifier(r->policy);
    const float *v = gw_cache_vec(r);
    const char *text;
    size_t len;
    last_user_text(r, &text, &len);
    r->score = clf != NULL && v != NULL ? router_classifier_score(clf, v, text, len) : 0.0;
    route_once(r, r->score);
    if (r->dec.needs_score)  /* cannot happen with a score; be safe: the default tier */
        r->dec = (router_decision){.tier = router_policy_default_tier(r->policy), .cache = -1,
                                   .cache_threshold = -1};
    apply(r);
    if (v == NULL)
        snprintf(r->reason + strlen(r->reason), sizeof r->reason - strlen(r->reason),
                 " (no embedding)");
}

static void after_exact(gw_req *r)
{
    bool want = gw_cache_wants_embedding(r);
    if ((r->needs_score || want) && gw_cache_embed(r))
        return;  /* continues in gw_route_embedded */
    if (r->needs_score) {
        score_and_route(r);
        if (r->dec.cache == 0)
            gw_cache_disable(r);
    }
    gw_cache_decide(r, -1);
}

void gw_route_start(gw_req *r)
{
    gw_server *s = r->srv;
    r->ptier = -1;
    r->score = -1;
    if (s->router != NULL && s->router->cur != NULL &&
        router_policy_routes_model(s->router->cur, r->body.model)) {
        r->policy = router_policy_ref(s->router->cur);
        route_once(r, -1);
        if (r->dec.needs_score)
            r->needs_score = true;
        else
            apply(r);
    } else {
        r->tier = router_alias_find(s->models, r->body.model);
        if (r->tier < 0) {
            gw_reply_model_not_found(r, r->body.model);
            return;
        }
        r->first_tier = r->tier;
        snprintf(r->reason, sizeof r->reason, "model");
        avoid_text_only_tier(r);
    }
    gw_cache_prepare(r, r->policy != NULL && !r->needs_score ? r->dec.cache : -1);
    if (!r->needs_score && gw_cache_try_exact(r))
        return;
    after_exact(r);
}

void gw_route_exact_missed(gw_req *r)
{
    after_exact(r);
}

void gw_route_embedded(gw_req *r)
{
    if (r->needs_score) {
        score_and_route(r);
        if (r->dec.cache == 0)
            gw_cache_disable(r);
        else if (gw_cache_try_exact(r))
            return;
    }
    gw_cache_decide(r, r->policy != NULL ? r->dec.cache_threshold : -1);
}

int gw_route_next_fallback(gw_req *r)
{
    if (r->policy == NULL || r->ptier < 0)
        return -1;
    const router_tier *first = router_policy_tier(r->policy, r->first_ptier >= 0 ? r->first_ptier
                                                                                  : r->ptier);
    while ((size_t)r->fb_pos < first->n_fallback) {
        int pt = first->fallback[r->fb_pos++];
        const router_tier *t = router_policy_tier(r->policy, pt);
        const gw_tier_cfg *b = gw_config_tier(r->srv->cfg, t->backend);
        int idx = (int)(b - r->srv->cfg->tiers);
        if (idx == r->tier)
            continue;
        r->ptier = pt;
        return idx;
    }
    return -2;  /* the chain is exhausted: no config fallback either */
}

/* max_concurrent: a tier at its limit hands the request down its fallback chain. Returns false
 * (and answers 503) when every tier of the chain is full. */
bool gw_route_admit(gw_req *r)
{
    if (r->policy == NULL || r->ptier < 0)
        return true;
    if (r->first_ptier < 0)
        r->first_ptier = r->ptier;
    for (;;) {
        const router_tier *t = router_policy_tier(r->policy, r->ptier);
        if (t->max_concurrent <= 0 || r->srv->tier_inflight[r->tier] < t->max_concurrent)
            break;
        char labels[100];
        snprintf(labels, sizeof labels, "tier=\"%s\"", t->name);
        gw_metrics_add(r->srv->metrics, "llmgw_tier_over_capacity_total", labels, 1);
        int next = gw_route_next_fallback(r);
        if (next < 0) {
            evhttp_add_header(evhttp_request_get_output_headers(r->ereq), "Retry-After", "1");
            gw_reply_error(r, 503, "server_error", NULL, "tier_over_capacity",
                           "Tier '%s' and its fallbacks are at their concurrency limit; retry "
                           "later.", router_policy_tier(r->policy, r->first_ptier)->name);
            return false;
        }
        r->tier = next;
        snprintf(r->reason + strlen(r->reason), sizeof r->reason - strlen(r->reason),
                 " (fallback: %s full)", t->name);
    }
    r->slot_tier = r->tier;
    r->srv->tier_inflight[r->tier]++;
    return true;
}

/* ---- costs ---------------------------------------------------------------------------------- */

static void costs(const gw_req *r, double *cost, double *saved)
{
    const router_tier *ref = router_policy_tier(r->policy,
                                                router_policy_reference_tier(r->policy));
    if (r->cache_hit) {
        *cost = 0;
        *saved = router_tier_cost(ref, r->hit_prompt_tokens, r->hit_completion_tokens);
        return;
    }
    const router_tier *t = router_policy_tier(r->policy, r->ptier);
    *cost = router_tier_cost(t, r->prompt_tokens, r->completion_tokens);
    *saved = router_tier_cost(ref, r->prompt_tokens, r->completion_tokens) - *cost;
}

void gw_route_headers(gw_req *r, struct evkeyvalq *h)
{
    if (r->reason[0])
        evhttp_add_header(h, "x-llmgw-route-reason", r->reason);
    /* Costs are known before the first byte only for whole (non-stream) answers. */
    if (r->policy == NULL || r->ptier < 0 || r->body.stream || r->status != 200)
        return;
    double cost, saved;
    costs(r, &cost, &saved);
    char v[48];
    snprintf(v, sizeof v, "%.8f", cost);
    evhttp_add_header(h, "x-llmgw-cost-usd", v);
    snprintf(v, sizeof v, "%.8f", saved);
    evhttp_add_header(h, "x-llmgw-saved-usd", v);
}

void gw_route_finish(gw_req *r)
{
    if (r->slot_tier >= 0) {
        r->srv->tier_inflight[r->slot_tier]--;
        r->slot_tier = -1;
    }
    if (r->policy == NULL || r->ptier < 0 || r->status != 200 || r->dry_run)
        return;
    double cost, saved;
    costs(r, &cost, &saved);
    char labels[100];
    const router_tier *t = router_policy_tier(r->policy, r->ptier);
    snprintf(labels, sizeof labels, "tier=\"%s\"", t->name);
    if (cost > 0)
        gw_metrics_add(r->srv->metrics, "llmgw_cost_usd_total", labels, cost);
    if (saved != 0)
        gw_metrics_add(r->srv->metrics, "llmgw_saved_usd_total",
                       r->cache_hit ? "by=\"cache\"" : "by=\"routing\"", saved);
}

/* ---- POST /v1/llmgw/route ------------------------------------------------------------------- */

/* Called instead of running the request (gw_dispatch) or replaying a hit, for a dry run. */
void gw_route_dry_reply(gw_req *r, const char *cache_state, double similarity)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "object", "llmgw.route");
    cJSON_AddStringToObject(o, "model", r->body.model);
    const gw_tier_cfg *b = r->tier >= 0 ? &r->srv->cfg->tiers[r->tier] : NULL;
    if (r->policy != NULL && r->ptier >= 0) {
        const router_tier *t = router_policy_tier(r->policy, r->ptier);
        cJSON_AddStringToObject(o, "tier", t->name);
        cJSON_AddStringToObject(o, "backend", t->backend);
        if (r->dec.rule)
            cJSON_AddStringToObject(o, "rule", r->dec.rule);
        else
            cJSON_AddNullToObject(o, "rule");
        long in = estimate_tokens(&r->body);
        cJSON_AddNumberToObject(o, "input_tokens_estimate", (double)in);
        cJSON_AddNumberToObject(o, "input_cost_usd_estimate", router_tier_cost(t, in, 0));
    } else if (b != NULL) {
        cJSON_AddStringToObject(o, "tier", b->name);
        cJSON_AddStringToObject(o, "backend", b->name);
        cJSON_AddNullToObject(o, "rule");
    }
    if (b != NULL)
        cJSON_AddStringToObject(o, "kind", b->kind == GW_TIER_ENGINE ? "engine" : "upstream");
    cJSON_AddStringToObject(o, "reason", r->reason);
    if (r->score >= 0)
        cJSON_AddNumberToObject(o, "score", r->score);
    else
        cJSON_AddNullToObject(o, "score");
    cJSON *c = cJSON_AddObjectToObject(o, "cache");
    cJSON_AddStringToObject(c, "result", cache_state);
    if (similarity >= 0)
        cJSON_AddNumberToObject(c, "similarity", similarity);
    gw_reply_json(r, 200, o);
}
