/* gateway/pipeline.c: a request's stages, in order (see pipeline.h). */
#include "gateway/pipeline.h"

#include "common/arena.h"
#include "common/log.h"
#include "gateway/cache.h"
#include "gateway/internal.h"
#include "gateway/reply.h"
#include "gateway/route.h"
#include "gateway/tier.h"

#include <cjson/cJSON.h>
#include <stdio.h>

typedef enum stage {
    ST_ROUTE = 0,      /* rules that need no score; an unknown model is answered 404 */
    ST_EXACT,          /* the cache key and the exact entry */
    ST_EMBED,          /* the embedding (+ semantic search) when the cache or a rule needs it */
    ST_SCORE,          /* the classifier's score and the final route; the deferred exact lookup */
    ST_SEMANTIC,       /* the best semantic candidate */
    ST_DECIDE,         /* hit: serve it; miss: dispatch (a dry run answers the decision) */
    ST_DISPATCH,       /* max_concurrent, then the tier */
    ST_WAIT_LOOKUP,    /* a cache lookup goes on elsewhere (Redis re-check) */
    ST_WAIT_EMBED,     /* the encoder thread embeds */
    ST_DONE,           /* answered, or in a tier's hands */
} stage;

static const char *const stage_names[] = {"route", "exact", "embed", "score", "semantic",
                                          "decide", "dispatch", "wait_lookup", "wait_embed",
                                          "done"};

/* Per request (r->pipe), in r's arena. */
struct gw_pipe {
    stage at;
    stage on_miss;     /* ST_WAIT_LOOKUP: where a miss goes (a hit goes to ST_DECIDE) */
    bool dry;
};

static stage lookup(gw_req *r, gw_cache_step step, stage on_miss)
{
    if (step == GW_CACHE_HIT)
        return ST_DECIDE;
    if (step == GW_CACHE_PENDING) {
        r->pipe->on_miss = on_miss;
        return ST_WAIT_LOOKUP;
    }
    return on_miss;
}

/* The dry run's answer: the decision, and what the cache would do. */
static void dry_reply(gw_req *r, const char *cache_state, double similarity)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "object", "llmgw.route");
    cJSON_AddStringToObject(o, "model", r->body.model);
    gw_route_describe(r, o);
    cJSON *c = cJSON_AddObjectToObject(o, "cache");
    cJSON_AddStringToObject(c, "result", cache_state);
    if (similarity >= 0)
        cJSON_AddNumberToObject(c, "similarity", similarity);
    gw_reply_json(r, 200, o);
}

static stage decide(gw_req *r)
{
    struct gw_pipe *p = r->pipe;
    if (gw_cache_outcome(r) == GW_CACHE_HIT) {
        const char *kind;
        double sim;
        long pt, ct;
        gw_cache_hit_info(r, &kind, &sim, &pt, &ct);
        if (p->dry) {
            gw_cache_forget_hit(r);
            dry_reply(r, kind, sim);
            return ST_DONE;
        }
        gw_cache_account(r);
        gw_route_cache_hit(r, pt, ct);
        gw_cache_serve(r);
        return ST_DONE;
    }
    if (p->dry) {
        dry_reply(r, gw_cache_looked_up(r) ? "miss" : "bypass", -1);
        return ST_DONE;
    }
    gw_cache_account(r);
    return ST_DISPATCH;
}

static void dispatch(gw_req *r)
{
    if (!gw_route_admit(r)) {
        gw_reply_header(r, "Retry-After", "1");
        gw_reply_error(r, 503, "server_error", NULL, "tier_over_capacity",
                       "Tier '%s' and its fallbacks are at their concurrency limit; retry "
                       "later.", gw_route_first_name(r));
        return;
    }
    r->fallback_ok = gw_route_has_fallback(r);
    gw_tier_start(r);
}

/* Runs stages until one waits or the request is answered (then r may be freed). */
static void run(gw_req *r)
{
    struct gw_pipe *p = r->pipe;
    for (;;) {
        switch (p->at) {
        case ST_ROUTE: {
            if (r->body.ep == GW_EP_EMBEDDINGS &&
                gw_cache_serves_embeddings(r->srv->cache, r->body.model)) {
                p->at = ST_DONE;
                gw_embeddings_start(r);  /* the in-process encoder answers */
                return;
            }
            gw_route_result res = gw_route_begin(r);
            if (res == GW_ROUTE_UNKNOWN_MODEL) {
                p->at = ST_DONE;
                gw_reply_model_not_found(r, r->body.model);
                return;
            }
            /* Embeddings (and completions) have no cache stages. */
            p->at = r->body.ep == GW_EP_CHAT ? ST_EXACT : ST_DISPATCH;
            break;
        }
        case ST_EXACT:
            gw_cache_prepare(r, gw_route_cache_rule(r), !p->dry);
            /* A score rule may still turn the cache off: look up after scoring. */
            p->at = gw_route_needs_score(r) ? ST_EMBED : lookup(r, gw_cache_exact(r), ST_EMBED);
            break;
        case ST_EMBED:
            if ((gw_route_needs_score(r) || gw_cache_wants_embedding(r)) && gw_cache_embed(r)) {
                p->at = ST_WAIT_EMBED;
                return;
            }
            p->at = ST_SCORE;
            break;
        case ST_SCORE:
            p->at = ST_SEMANTIC;
            if (!gw_route_needs_score(r))
                break;
            gw_route_score(r, gw_cache_vec(r));
            if (gw_route_cache_rule(r) == 0)
                gw_cache_disable(r);
            else
                p->at = lookup(r, gw_cache_exact(r), ST_SEMANTIC);
            break;
        case ST_SEMANTIC:
            p->at = lookup(r, gw_cache_semantic(r, gw_route_cache_threshold(r),
                                                gw_route_cache_max_false_hit_rate(r)),
                           ST_DECIDE);
            break;
        case ST_DECIDE: {
            stage next = decide(r);
            if (next == ST_DONE)
                return;  /* answered: r is gone */
            p->at = next;
            break;
        }
        case ST_DISPATCH:
            if (p->dry) {
                p->at = ST_DONE;
                dry_reply(r, "bypass", -1);
                return;
            }
            p->at = ST_DONE;
            dispatch(r);
            return;
        case ST_WAIT_LOOKUP:
        case ST_WAIT_EMBED:
        case ST_DONE:
            return;
        }
    }
}

/* hooks.cache_done: the lookup or the embedding r waited for is over. */
static void resume(gw_req *r)
{
    struct gw_pipe *p = r->pipe;
    if (p->at == ST_WAIT_EMBED)
        p->at = ST_SCORE;
    else if (p->at == ST_WAIT_LOOKUP)
        p->at = gw_cache_outcome(r) == GW_CACHE_HIT ? ST_DECIDE : p->on_miss;
    else
        return;  /* nothing waits: ignore */
    run(r);
}

/* hooks.tier_failed: before its first byte, r's tier failed; the next tier of the chain
 * answers, or the failure does. */
static void tier_failed(gw_req *r, const gw_tier_failure *f)
{
    const gw_config *c = r->srv->cfg;
    int from = r->tier;
    int next = gw_route_fallback(r);
    if (next < 0) {
        gw_reply_error(r, f->status, f->type, NULL, f->code, "%s", f->message);
        return;
    }
    char labels[200];
    snprintf(labels, sizeof labels, "from=\"%s\",to=\"%s\"", c->tiers[from].name,
             c->tiers[next].name);
    gw_metrics_add(r->srv->metrics, "llmgw_fallbacks_total", labels, 1);
    UTIL_LOG_INFO("pipeline", "%s: tier '%s' failed before the first byte (%s); falling back "
                  "to '%s'", r->id, c->tiers[from].name, f->kind, c->tiers[next].name);
    r->fell_back = true;
    r->fallback_ok = gw_route_has_fallback(r);
    gw_tier_start(r);
}

void gw_pipeline_init(gw_server *s)
{
    s->hooks.cache_done = resume;
    s->hooks.tier_failed = tier_failed;
}

void gw_pipeline_declare_metrics(gw_metrics *m)
{
    gw_metrics_declare(m, "llmgw_fallbacks_total", GW_METRIC_COUNTER,
                       "Requests moved to a fallback tier, by from and to tier.");
}

void gw_pipeline_start(gw_req *r, bool dry_run)
{
    struct gw_pipe *p = util_arena_alloc(&r->arena, sizeof *p);
    *p = (struct gw_pipe){.at = ST_ROUTE, .on_miss = ST_DONE, .dry = dry_run};
    r->pipe = p;
    run(r);
}

void gw_pipeline_abort(gw_req *r)
{
    gw_tier_detach(r);
}

void gw_pipeline_release(gw_req *r)
{
    gw_tier_release(r);
    gw_cache_release(r);
    gw_route_release(r);
    r->pipe = NULL;
}

const char *gw_pipeline_stage(const gw_req *r)
{
    return r->pipe != NULL ? stage_names[r->pipe->at] : "none";
}
