/* router/policy.c: the routing policy. YAML (libyaml document API) → an immutable, reference-
 * counted router_policy, validated in full; every error names file:line:column of the offending
 * node (1-based, as editors count). Regexes and keywords compile once with PCRE2 at load;
 * router_policy_route() allocates its own match data, so any number of threads may route with one
 * policy. Strings and arrays live in the policy's arena; compiled patterns in `codes`. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "router/policy.h"

#include "common/arena.h"
#include "common/yaml.h"
#include "router/alias.h"
#include "router/classifier.h"

#include <errno.h>
#include <limits.h>
#include <pcre2.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

/* A pattern must not backtrack without bound on a hostile prompt: past these limits a match
 * counts as a miss. */
#define MATCH_LIMIT 1000000u
#define DEPTH_LIMIT 10000u
#define HEAP_LIMIT_KIB 16384u
#define MAX_FILE_BYTES (16u << 20)

/* Options of every pattern: UTF with invalid input tolerated (a prompt may hold any bytes). */
#define RE_OPTS (PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF | PCRE2_NEVER_BACKSLASH_C)
#define KEYWORD_OPTS (PCRE2_LITERAL | PCRE2_CASELESS | PCRE2_UTF | PCRE2_MATCH_INVALID_UTF)

typedef struct header_cond {
    const char *name;
    pcre2_code **re;            /* [n_re]: any one matching the header's value suffices */
    size_t n_re;
} header_cond;

typedef struct rule {
    const char *name;
    int tier;
    const char **models;        /* [n_models] */
    size_t n_models;
    const char **groups;        /* [n_groups] */
    size_t n_groups;
    header_cond *headers;       /* [n_headers]: every one must hold */
    size_t n_headers;
    long min_tokens, max_tokens; /* -1 = no bound */
    pcre2_code **regex;         /* [n_regex] */
    size_t n_regex;
    pcre2_code **keywords;      /* [n_keywords]: literal, caseless */
    size_t n_keywords;
    bool has_score;
    double score_min, score_max; /* inclusive */
    int cache;                  /* -1 default, 0 off, 1 on */
    double cache_threshold;     /* < 0 = the cache's default */
    double cache_max_false_hit_rate; /* < 0 = the cache's default */
    router_cascade cascade;     /* the policy's, with the rule's own keys over it */
} rule;

struct router_policy {
    atomic_int refs;
    util_arena arena;
    router_tier *tiers;         /* [n_tiers], in file order */
    size_t n_tiers;
    rule *rules;                /* [n_rules], in file order */
    size_t n_rules;
    int default_tier, reference_tier;
    int unfamiliar_tier;         /* route_unfamiliar_to, or -1 */
    router_classifier *classifier;
    router_alias *models;       /* model names the policy routes (value unused) */
    bool uses_score;
    router_cascade cascade;
    bool implicit;              /* made by router_policy_implicit: no file, no prices */
    pcre2_code **codes;         /* [n_codes] every compiled pattern, freed with the policy */
    size_t n_codes, cap_codes;
    pcre2_match_context *mctx;  /* the limits above; read-only once loaded */
};

/* ---- YAML helpers ---------------------------------------------------------------------------- */

typedef struct parse_ctx {
    util_yaml y;                /* the document, file name and error for messages */
    yaml_document_t *doc;
    const char *name;           /* file name for messages */
    const char *dir;            /* for relative paths; NULL = the working directory */
    const char *const *backends;
    size_t n_backends;
    util_err *err;
    router_policy *pol;
    const yaml_node_t ***fallback_items; /* [n_tiers][tier's n_fallback]: for cycle errors */
} parse_ctx;

#define fail_code(p, code, n, ...) util_yaml_fail(&(p)->y, (code), (n), __VA_ARGS__)
#define fail_at(p, n, ...) fail_code((p), LLMGW_EINVAL, (n), __VA_ARGS__)
#define scalar(n) util_yaml_scalar(n)

static void *alloc0(parse_ctx *p, size_t n, size_t size)
{
    if (n != 0 && size > SIZE_MAX / n)
        abort();
    size_t bytes = n != 0 && size != 0 ? n * size : 1;
    void *m = util_arena_alloc(&p->pol->arena, bytes);
    memset(m, 0, bytes);
    return m;
}

static int expect(parse_ctx *p, const yaml_node_t *n, yaml_node_type_t type, const char *what)
{
    return util_yaml_expect(&p->y, n, type, what);
}

#define FOR_PAIRS(p, map, k, kn, v) UTIL_YAML_FOR_PAIRS((p)->doc, map, k, kn, v)

static int get_long(parse_ctx *p, const yaml_node_t *n, const char *key, long lo, long hi,
                    long *out)
{
    return util_yaml_long(&p->y, n, key, lo, hi, out);
}

static int get_double(parse_ctx *p, const yaml_node_t *n, const char *key, double lo, double hi,
                      double *out)
{
    return util_yaml_double(&p->y, n, key, lo, hi, out);
}

static int get_bool(parse_ctx *p, const yaml_node_t *n, const char *key, bool *out)
{
    return util_yaml_bool(&p->y, n, key, out);
}

/* A non-empty string, copied into the policy. */
static int get_name(parse_ctx *p, const yaml_node_t *n, const char *key, const char **out)
{
    const char *s = scalar(n);
    if (s == NULL || *s == '\0')
        return fail_at(p, n, "'%s' must be a non-empty string", key);
    *out = util_arena_strdup(&p->pol->arena, s);
    return 0;
}

/* A string or a non-empty list of non-empty strings: their nodes (arena) and count. */
static int str_items(parse_ctx *p, const yaml_node_t *n, const char *key,
                     const yaml_node_t ***items, size_t *count)
{
    if (n->type == YAML_SCALAR_NODE) {
        if (n->data.scalar.length == 0)
            return fail_at(p, n, "'%s' must not be empty", key);
        *items = alloc0(p, 1, sizeof **items);
        (*items)[0] = n;
        *count = 1;
        return 0;
    }
    if (n->type != YAML_SEQUENCE_NODE)
        return fail_at(p, n, "'%s' must be a string or a list of strings", key);
    size_t c = (size_t)(n->data.sequence.items.top - n->data.sequence.items.start);
    if (c == 0)
        return fail_at(p, n, "'%s' must not be an empty list", key);
    *items = alloc0(p, c, sizeof **items);
    for (size_t i = 0; i < c; i++) {
        const yaml_node_t *it = yaml_document_get_node(p->doc, n->data.sequence.items.start[i]);
        if (scalar(it) == NULL || it->data.scalar.length == 0)
            return fail_at(p, it, "items of '%s' must be non-empty strings", key);
        (*items)[i] = it;
    }
    *count = c;
    return 0;
}

static int get_strs(parse_ctx *p, const yaml_node_t *n, const char *key, const char ***out,
                    size_t *count)
{
    const yaml_node_t **items;
    int rc = str_items(p, n, key, &items, count);
    if (rc != 0)
        return rc;
    *out = alloc0(p, *count, sizeof **out);
    for (size_t i = 0; i < *count; i++)
        (*out)[i] = util_arena_strdup(&p->pol->arena, scalar(items[i]));
    return 0;
}

/* Compiles the scalar n (its full length: a YAML escape may hold a NUL) and keeps the code for
 * freeing; what names it in the error. */
static int compile(parse_ctx *p, const yaml_node_t *n, uint32_t opts, const char *what,
                   pcre2_code **out)
{
    router_policy *pol = p->pol;
    int ec;
    PCRE2_SIZE off;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)n->data.scalar.value, n->data.scalar.length, opts,
                                   &ec, &off, NULL);
    if (re == NULL) {
        PCRE2_UCHAR msg[128];
        if (pcre2_get_error_message(ec, msg, sizeof msg) < 0)
            snprintf((char *)msg, sizeof msg, "error %d", ec);
        return fail_at(p, n, "bad %s '%.40s': %s at offset %zu", what, scalar(n), (char *)msg,
                       (size_t)off);
    }
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);  /* optional: the interpreter runs without it */
    if (pol->n_codes == pol->cap_codes) {
        size_t cap = pol->cap_codes ? pol->cap_codes * 2 : 16;
        pcre2_code **grown = realloc(pol->codes, cap * sizeof *grown);
        if (grown == NULL)
            abort();    /* like util_xmalloc: small, bounded by the file */
        pol->codes = grown;
        pol->cap_codes = cap;
    }
    pol->codes[pol->n_codes++] = re;
    *out = re;
    return 0;
}

/* A string or list of patterns, each compiled with opts. */
static int get_patterns(parse_ctx *p, const yaml_node_t *n, const char *key, uint32_t opts,
                        const char *what, pcre2_code ***out, size_t *count)
{
    const yaml_node_t **items;
    int rc = str_items(p, n, key, &items, count);
    if (rc != 0)
        return rc;
    *out = alloc0(p, *count, sizeof **out);
    for (size_t i = 0; i < *count; i++)
        if ((rc = compile(p, items[i], opts, what, &(*out)[i])) != 0)
            return rc;
    return 0;
}

/* ---- tiers ----------------------------------------------------------------------------------- */

static int find_tier(const router_policy *pol, const char *name)
{
    for (size_t i = 0; i < pol->n_tiers; i++)
        if (!strcmp(pol->tiers[i].name, name))
            return (int)i;
    return -1;
}

static int tier_ref(parse_ctx *p, const yaml_node_t *n, const char *key, int *out)
{
    const char *s = scalar(n);
    if (s == NULL || *s == '\0')
        return fail_at(p, n, "'%s' must be a tier name", key);
    if ((*out = find_tier(p->pol, s)) < 0)
        return fail_at(p, n, "%s '%.60s' is not a tier of this policy", key, s);
    return 0;
}

static int parse_price(parse_ctx *p, const yaml_node_t *n, router_tier *t)
{
    int rc = expect(p, n, YAML_MAPPING_NODE, "'price'");
    if (rc != 0)
        return rc;
    FOR_PAIRS(p, n, k, kn, v) {
        if (!strcmp(k, "input_per_1m"))
            rc = get_double(p, v, k, 0, 1e6, &t->price_in);
        else if (!strcmp(k, "output_per_1m"))
            rc = get_double(p, v, k, 0, 1e6, &t->price_out);
        else
            rc = fail_at(p, kn, "unknown key '%s' in price (input_per_1m, output_per_1m)", k);
        if (rc != 0)
            return rc;
    }
    return 0;
}

static int parse_fallback(parse_ctx *p, int i, const yaml_node_t *n)
{
    router_tier *t = &p->pol->tiers[i];
    const yaml_node_t **items;
    size_t count;
    int rc = str_items(p, n, "fallback", &items, &count);
    if (rc != 0)
        return rc;
    int *fb = alloc0(p, count, sizeof *fb);
    for (size_t j = 0; j < count; j++) {
        if ((rc = tier_ref(p, items[j], "fallback", &fb[j])) != 0)
            return rc;
        if (fb[j] == i)
            return fail_at(p, items[j], "tier '%s' falls back to itself", t->name);
        for (size_t k = 0; k < j; k++)
            if (fb[k] == fb[j])
                return fail_at(p, items[j], "fallback '%s' is listed twice", scalar(items[j]));
    }
    t->fallback = fb;
    t->n_fallback = count;
    p->fallback_items[i] = items;
    return 0;
}

static int parse_tier(parse_ctx *p, int i, const yaml_node_t *kn, const yaml_node_t *n)
{
    router_tier *t = &p->pol->tiers[i];
    const yaml_node_t *backend_node = kn;
    long v;
    int rc = expect(p, n, YAML_MAPPING_NODE, "a tier");
    if (rc != 0)
        return rc;
    FOR_PAIRS(p, n, k, tkn, tv) {
        if (!strcmp(k, "backend")) {
            backend_node = tv;
            rc = get_name(p, tv, k, &t->backend);
        } else if (!strcmp(k, "price")) {
            rc = parse_price(p, tv, t);
        } else if (!strcmp(k, "context")) {
            if ((rc = get_long(p, tv, k, 0, 1L << 30, &v)) == 0)
                t->context = v;
        } else if (!strcmp(k, "max_concurrent")) {
            if ((rc = get_long(p, tv, k, 0, 1000000, &v)) == 0)
                t->max_concurrent = (int)v;
        } else if (!strcmp(k, "fallback")) {
            rc = parse_fallback(p, i, tv);
        } else {
            rc = fail_at(p, tkn, "unknown key '%s' in tier '%s' (backend, price, context, "
                                 "max_concurrent, fallback)", k, t->name);
        }
        if (rc != 0)
            return rc;
    }
    if (t->backend == NULL)
        t->backend = t->name;
    if (p->backends != NULL) {
        for (size_t b = 0; b < p->n_backends; b++)
            if (!strcmp(p->backends[b], t->backend))
                return 0;
        return fail_at(p, backend_node, "backend '%.60s' of tier '%s' is not a tier of the "
                       "daemon config", t->backend, t->name);
    }
    return 0;
}

/* Whether `to` is reachable from `from` along fallbacks (seen: [n_tiers] scratch). */
static bool reaches(const router_policy *pol, int from, int to, bool *seen)
{
    if (from == to)
        return true;
    if (seen[from])
        return false;
    seen[from] = true;
    const router_tier *t = &pol->tiers[from];
    for (size_t j = 0; j < t->n_fallback; j++)
        if (reaches(pol, t->fallback[j], to, seen))
            return true;
    return false;
}

static int parse_tiers(parse_ctx *p, const yaml_node_t *n)
{
    router_policy *pol = p->pol;
    int rc;
    if (n->type == YAML_MAPPING_NODE)   /* a clearer word than unique_keys' for a repeated tier */
        for (yaml_node_pair_t *a = n->data.mapping.pairs.start; a < n->data.mapping.pairs.top;
             a++)
            for (yaml_node_pair_t *b = n->data.mapping.pairs.start; b < a; b++) {
                const yaml_node_t *ka = yaml_document_get_node(p->doc, a->key);
                const yaml_node_t *kb = yaml_document_get_node(p->doc, b->key);
                if (scalar(ka) && scalar(kb) && !strcmp(scalar(ka), scalar(kb)))
                    return fail_at(p, ka, "tier '%.60s' is defined twice", scalar(ka));
            }
    if ((rc = expect(p, n, YAML_MAPPING_NODE, "'tiers'")) != 0)
        return rc;
    size_t count = (size_t)(n->data.mapping.pairs.top - n->data.mapping.pairs.start);
    if (count == 0)
        return fail_at(p, n, "'tiers' must define at least one tier");
    pol->tiers = alloc0(p, count, sizeof *pol->tiers);
    p->fallback_items = alloc0(p, count, sizeof *p->fallback_items);
    FOR_PAIRS(p, n, k, kn, v) {   /* names first: a fallback may name a later tier */
        (void)v;
        if (*k == '\0')
            return fail_at(p, kn, "a tier name must not be empty");
        pol->tiers[pol->n_tiers++].name = util_arena_strdup(&pol->arena, k);
    }
    int i = 0;
    FOR_PAIRS(p, n, k, kn, v) {
        (void)k;
        if ((rc = parse_tier(p, i++, kn, v)) != 0)
            return rc;
    }
    bool *seen = alloc0(p, count, sizeof *seen);
    for (size_t t = 0; t < count; t++)
        for (size_t j = 0; j < pol->tiers[t].n_fallback; j++) {
            memset(seen, 0, count * sizeof *seen);
            if (reaches(pol, pol->tiers[t].fallback[j], (int)t, seen))
                return fail_at(p, p->fallback_items[t][j], "fallback '%s' of tier '%s' leads "
                               "back to '%s' (a cycle)", pol->tiers[pol->tiers[t].fallback[j]].name,
                               pol->tiers[t].name, pol->tiers[t].name);
        }
    return 0;
}

/* ---- rules ----------------------------------------------------------------------------------- */

static int parse_headers(parse_ctx *p, rule *r, const yaml_node_t *n)
{
    int rc = expect(p, n, YAML_MAPPING_NODE, "'header'");
    if (rc != 0)
        return rc;
    size_t count = (size_t)(n->data.mapping.pairs.top - n->data.mapping.pairs.start);
    if (count == 0)
        return fail_at(p, n, "'header' must name at least one header");
    r->headers = alloc0(p, count, sizeof *r->headers);
    FOR_PAIRS(p, n, k, kn, v) {
        header_cond *h = &r->headers[r->n_headers++];
        if (*k == '\0')
            return fail_at(p, kn, "a header name must not be empty");
        h->name = util_arena_strdup(&p->pol->arena, k);
        if ((rc = get_patterns(p, v, k, RE_OPTS, "regex", &h->re, &h->n_re)) != 0)
            return rc;
    }
    return 0;
}

static int parse_score(parse_ctx *p, rule *r, const yaml_node_t *n)
{
    const yaml_node_t *max_node = n;
    bool any = false;
    int rc = expect(p, n, YAML_MAPPING_NODE, "'score'");
    if (rc != 0)
        return rc;
    r->score_min = 0;
    r->score_max = 1;
    FOR_PAIRS(p, n, k, kn, v) {
        if (!strcmp(k, "min")) {
            rc = get_double(p, v, k, 0, 1, &r->score_min);
        } else if (!strcmp(k, "max")) {
            max_node = v;
            rc = get_double(p, v, k, 0, 1, &r->score_max);
        } else {
            rc = fail_at(p, kn, "unknown key '%s' in score (min, max)", k);
        }
        if (rc != 0)
            return rc;
        any = true;
    }
    if (!any)
        return fail_at(p, n, "'score' needs 'min' or 'max'");
    if (r->score_min > r->score_max)
        return fail_at(p, max_node, "score 'max' (%g) is below 'min' (%g)", r->score_max,
                       r->score_min);
    if (p->pol->classifier == NULL)
        return fail_at(p, n, "rule '%s': a score condition needs the policy's 'classifier'",
                       r->name);
    r->has_score = true;
    p->pol->uses_score = true;
    return 0;
}

static int parse_match(parse_ctx *p, rule *r, const yaml_node_t *n)
{
    const yaml_node_t *max_node = NULL;
    int rc = expect(p, n, YAML_MAPPING_NODE, "'match'");
    if (rc != 0)
        return rc;
    FOR_PAIRS(p, n, k, kn, v) {
        if (!strcmp(k, "model")) {
            if ((rc = get_strs(p, v, k, &r->models, &r->n_models)) == 0)
                for (size_t i = 0; i < r->n_models; i++)
                    router_alias_add(p->pol->models, r->models[i], 0);  /* repeats are fine */
        } else if (!strcmp(k, "group")) {
            rc = get_strs(p, v, k, &r->groups, &r->n_groups);
        } else if (!strcmp(k, "header")) {
            rc = parse_headers(p, r, v);
        } else if (!strcmp(k, "min_input_tokens")) {
            rc = get_long(p, v, k, 0, LONG_MAX, &r->min_tokens);
        } else if (!strcmp(k, "max_input_tokens")) {
            max_node = v;
            rc = get_long(p, v, k, 0, LONG_MAX, &r->max_tokens);
        } else if (!strcmp(k, "regex")) {
            rc = get_patterns(p, v, k, RE_OPTS, "regex", &r->regex, &r->n_regex);
        } else if (!strcmp(k, "keywords")) {
            rc = get_patterns(p, v, k, KEYWORD_OPTS, "keyword", &r->keywords, &r->n_keywords);
        } else if (!strcmp(k, "score")) {
            rc = parse_score(p, r, v);
        } else {
            rc = fail_at(p, kn, "unknown key '%s' in match (model, group, header, "
                                "min_input_tokens, max_input_tokens, regex, keywords, score)", k);
        }
        if (rc != 0)
            return rc;
    }
    if (max_node != NULL && r->min_tokens > r->max_tokens)
        return fail_at(p, max_node, "'max_input_tokens' (%ld) is below 'min_input_tokens' (%ld)",
                       r->max_tokens, r->min_tokens);
    return 0;
}

static int parse_cache(parse_ctx *p, rule *r, const yaml_node_t *n)
{
    bool on;
    int rc = expect(p, n, YAML_MAPPING_NODE, "'cache'");
    if (rc != 0)
        return rc;
    FOR_PAIRS(p, n, k, kn, v) {
        if (!strcmp(k, "enabled")) {
            if ((rc = get_bool(p, v, k, &on)) == 0)
                r->cache = on;
        } else if (!strcmp(k, "threshold")) {
            rc = get_double(p, v, k, 0, 1, &r->cache_threshold);
        } else if (!strcmp(k, "max_false_hit_rate")) {
            rc = get_double(p, v, k, 0, 0.5, &r->cache_max_false_hit_rate);
        } else {
            rc = fail_at(p, kn, "unknown key '%s' in cache (enabled, threshold, "
                         "max_false_hit_rate)", k);
        }
        if (rc != 0)
            return rc;
    }
    return 0;
}

/* A cascade mapping over c (the defaults, or the policy's for a rule). */
static int parse_cascade(parse_ctx *p, router_cascade *c, const yaml_node_t *n)
{
    int rc = expect(p, n, YAML_MAPPING_NODE, "'cascade'");
    if (rc != 0)
        return rc;
    long l;
    FOR_PAIRS(p, n, k, kn, v) {
        if (!strcmp(k, "enabled")) {
            rc = get_bool(p, v, k, &c->enabled);
        } else if (!strcmp(k, "rule")) {
            const char *s = scalar(v);
            if (s != NULL && !strcmp(s, "chow"))
                c->rule = ROUTER_DEFER_CHOW;
            else if (s != NULL && !strcmp(s, "diff"))
                c->rule = ROUTER_DEFER_DIFF;
            else
                rc = fail_at(p, v, "'rule' must be chow or diff");
        } else if (!strcmp(k, "threshold")) {
            if ((rc = get_double(p, v, k, 0, 1, &c->threshold)) == 0 && c->threshold <= 0)
                rc = fail_at(p, v, "'threshold' must be above 0");
        } else if (!strcmp(k, "window")) {
            if ((rc = get_long(p, v, k, 1, 64, &l)) == 0)
                c->window = (int)l;
        } else if (!strcmp(k, "margin")) {
            rc = get_double(p, v, k, 0, 1, &c->margin);
        } else if (!strcmp(k, "hold")) {
            if ((rc = get_long(p, v, k, 0, 16, &l)) == 0)
                c->hold = (int)l;
        } else {
            rc = fail_at(p, kn, "unknown key '%s' in cascade (enabled, rule, threshold, window, "
                         "margin, hold)", k);
        }
        if (rc != 0)
            return rc;
    }
    if (c->rule == ROUTER_DEFER_DIFF && c->hold < 1)
        return fail_at(p, n, "cascade: the diff rule checks held tokens: 'hold' must be 1 or "
                             "more");
    return 0;
}

static int parse_rule(parse_ctx *p, rule *r, const yaml_node_t *n)
{
    const yaml_node_t *name = NULL, *match = NULL, *tier = NULL, *cache = NULL,
                      *cascade = NULL;
    int rc = expect(p, n, YAML_MAPPING_NODE, "a rule");
    if (rc != 0)
        return rc;
    r->min_tokens = r->max_tokens = -1;
    r->cache = -1;
    r->cache_threshold = -1;
    r->cache_max_false_hit_rate = -1;
    r->cascade = p->pol->cascade;
    FOR_PAIRS(p, n, k, kn, v) {
        if (!strcmp(k, "name"))
            name = v;
        else if (!strcmp(k, "match"))
            match = v;
        else if (!strcmp(k, "tier"))
            tier = v;
        else if (!strcmp(k, "cache"))
            cache = v;
        else if (!strcmp(k, "cascade"))
            cascade = v;
        else
            return fail_at(p, kn, "unknown key '%s' in a rule (name, match, tier, cache, "
                                  "cascade)", k);
    }
    if (name == NULL)
        return fail_at(p, n, "a rule needs a 'name'");
    if ((rc = get_name(p, name, "name", &r->name)) != 0)
        return rc;
    for (const rule *o = p->pol->rules; o < r; o++)
        if (!strcmp(o->name, r->name))
            return fail_at(p, name, "rule name '%.60s' is used twice", r->name);
    if (tier == NULL)
        return fail_at(p, n, "rule '%s' needs a 'tier'", r->name);
    if ((rc = tier_ref(p, tier, "tier", &r->tier)) != 0)
        return rc;
    if (match != NULL && (rc = parse_match(p, r, match)) != 0)
        return rc;
    if (cache != NULL && (rc = parse_cache(p, r, cache)) != 0)
        return rc;
    if (cascade != NULL && (rc = parse_cascade(p, &r->cascade, cascade)) != 0)
        return rc;
    return 0;
}

static int parse_rules(parse_ctx *p, const yaml_node_t *n)
{
    router_policy *pol = p->pol;
    int rc = expect(p, n, YAML_SEQUENCE_NODE, "'rules'");
    if (rc != 0)
        return rc;
    size_t count = (size_t)(n->data.sequence.items.top - n->data.sequence.items.start);
    pol->rules = alloc0(p, count, sizeof *pol->rules);
    for (size_t i = 0; i < count; i++) {
        const yaml_node_t *it = yaml_document_get_node(p->doc, n->data.sequence.items.start[i]);
        if ((rc = parse_rule(p, &pol->rules[i], it)) != 0)
            return rc;
        pol->n_rules++;
    }
    return 0;
}

/* ---- the root -------------------------------------------------------------------------------- */

static int parse_classifier(parse_ctx *p, const yaml_node_t *n)
{
    const yaml_node_t *weights = NULL;
    int rc = expect(p, n, YAML_MAPPING_NODE, "'classifier'");
    if (rc != 0)
        return rc;
    FOR_PAIRS(p, n, k, kn, v) {
        if (strcmp(k, "weights") != 0)
            return fail_at(p, kn, "unknown key '%s' in classifier (weights)", k);
        weights = v;
    }
    if (weights == NULL)
        return fail_at(p, n, "'classifier' needs 'weights: FILE'");
    const char *s = scalar(weights);
    if (s == NULL || *s == '\0')
        return fail_at(p, weights, "'weights' must be a non-empty path");
    char *path;
    if (s[0] == '/' || p->dir == NULL || p->dir[0] == '\0') {
        path = util_xstrdup(s);
    } else {
        size_t len = strlen(p->dir) + strlen(s) + 2;
        path = util_xmalloc(len);
        snprintf(path, len, "%s/%s", p->dir, s);
    }
    util_err sub = {0};
    rc = router_classifier_load(&p->pol->classifier, path, &sub);
    free(path);
    if (rc != 0) {
        p->pol->classifier = NULL;
        return fail_code(p, rc, weights, "classifier: %s", sub.msg);
    }
    return 0;
}

static int parse_root(parse_ctx *p, const yaml_node_t *root)
{
    router_policy *pol = p->pol;
    const yaml_node_t *version = NULL, *models = NULL, *def = NULL, *ref = NULL, *cls = NULL,
                      *tiers = NULL, *rules = NULL, *cascade = NULL, *unfamiliar = NULL;
    int rc = expect(p, root, YAML_MAPPING_NODE, "the policy");
    if (rc != 0)
        return rc;
    FOR_PAIRS(p, root, k, kn, v) {
        if (!strcmp(k, "version"))
            version = v;
        else if (!strcmp(k, "models"))
            models = v;
        else if (!strcmp(k, "default_tier"))
            def = v;
        else if (!strcmp(k, "reference_tier"))
            ref = v;
        else if (!strcmp(k, "classifier"))
            cls = v;
        else if (!strcmp(k, "tiers"))
            tiers = v;
        else if (!strcmp(k, "rules"))
            rules = v;
        else if (!strcmp(k, "cascade"))
            cascade = v;
        else if (!strcmp(k, "route_unfamiliar_to"))
            unfamiliar = v;
        else
            return fail_at(p, kn, "unknown key '%s' (version, models, default_tier, "
                                  "reference_tier, classifier, route_unfamiliar_to, tiers, rules, "
                                  "cascade)", k);
    }
    if (version != NULL && (scalar(version) == NULL || strcmp(scalar(version), "1") != 0))
        return fail_at(p, version, "'version' must be 1");
    if (tiers == NULL)
        return fail_at(p, root, "'tiers' is missing");
    if ((rc = parse_tiers(p, tiers)) != 0)
        return rc;
    if (def == NULL)
        return fail_at(p, root, "'default_tier' is missing");
    if ((rc = tier_ref(p, def, "default_tier", &pol->default_tier)) != 0)
        return rc;
    pol->unfamiliar_tier = -1;
    if (unfamiliar != NULL) {
        if (cls == NULL)
            return fail_at(p, unfamiliar, "'route_unfamiliar_to' needs the policy's 'classifier'");
        if ((rc = tier_ref(p, unfamiliar, "route_unfamiliar_to", &pol->unfamiliar_tier)) != 0)
            return rc;
    }
    if (ref != NULL) {
        if ((rc = tier_ref(p, ref, "reference_tier", &pol->reference_tier)) != 0)
            return rc;
    } else {   /* what routing saves against: the dearest tier (by output price) */
        pol->reference_tier = 0;
        for (size_t i = 1; i < pol->n_tiers; i++)
            if (pol->tiers[i].price_out > pol->tiers[pol->reference_tier].price_out)
                pol->reference_tier = (int)i;
    }
    if (models != NULL) {
        const char **names;
        size_t count;
        if ((rc = get_strs(p, models, "models", &names, &count)) != 0)
            return rc;
        for (size_t i = 0; i < count; i++)
            router_alias_add(pol->models, names[i], 0);
    }
    if (cls != NULL && (rc = parse_classifier(p, cls)) != 0)
        return rc;
    /* The policy's cascade first: the rules' start from it. */
    pol->cascade = (router_cascade){.enabled = false, .rule = ROUTER_DEFER_CHOW,
                                    .threshold = 0.5, .window = 4, .margin = 0.1, .hold = 8};
    if (cascade != NULL && (rc = parse_cascade(p, &pol->cascade, cascade)) != 0)
        return rc;
    if (rules != NULL && (rc = parse_rules(p, rules)) != 0)
        return rc;
    return 0;
}

/* ---- life cycle -------------------------------------------------------------------------------- */

static void policy_free(router_policy *pol)
{
    if (pol == NULL)
        return;
    for (size_t i = 0; i < pol->n_codes; i++)
        pcre2_code_free(pol->codes[i]);
    free(pol->codes);
    pcre2_match_context_free(pol->mctx);
    router_classifier_free(pol->classifier);
    router_alias_free(pol->models);
    util_arena_deinit(&pol->arena);
    free(pol);
}

static router_policy *policy_new(void)
{
    router_policy *pol = util_xcalloc(1, sizeof *pol);
    atomic_init(&pol->refs, 1);
    util_arena_init(&pol->arena, 4096);
    pol->unfamiliar_tier = -1;
    pol->models = router_alias_new();
    pol->mctx = pcre2_match_context_create(NULL);
    if (pol->mctx == NULL)
        abort();
    pcre2_set_match_limit(pol->mctx, MATCH_LIMIT);
    pcre2_set_depth_limit(pol->mctx, DEPTH_LIMIT);
    pcre2_set_heap_limit(pol->mctx, HEAP_LIMIT_KIB);
    return pol;
}

#define yaml_error util_yaml_load_error

int router_policy_parse(router_policy **out, const char *text, size_t len, const char *name,
                        const char *dir, const char *const *backends, size_t n_backends,
                        util_err *err)
{
    yaml_parser_t parser;
    yaml_document_t doc;
    router_policy *pol = NULL;
    int rc;
    if (name == NULL)
        name = "policy";
    yaml_parser_initialize(&parser);
    yaml_parser_set_input_string(&parser, (const unsigned char *)text, len);
    if (!yaml_parser_load(&parser, &doc)) {
        rc = yaml_error(&parser, name, err);
        yaml_parser_delete(&parser);
        return rc;
    }
    const yaml_node_t *root = yaml_document_get_root_node(&doc);
    parse_ctx p = {.y = {.doc = &doc, .name = name, .err = err}, .doc = &doc, .name = name,
                   .dir = dir, .backends = backends,
                   .n_backends = n_backends, .err = err};
    if (root == NULL) {
        rc = util_err_set(err, LLMGW_EINVAL, "%s:1:1: the policy is empty", name);
    } else {
        pol = p.pol = policy_new();
        rc = parse_root(&p, root);
    }
    yaml_document_delete(&doc);
    if (rc == 0) {   /* a second document would be silently ignored: refuse it */
        if (!yaml_parser_load(&parser, &doc)) {
            rc = yaml_error(&parser, name, err);
        } else {
            const yaml_node_t *next = yaml_document_get_root_node(&doc);
            if (next != NULL)
                rc = util_err_set(err, LLMGW_EINVAL, "%s:%zu:%zu: a policy is one YAML document",
                                  name, next->start_mark.line + 1, next->start_mark.column + 1);
            yaml_document_delete(&doc);
        }
    }
    yaml_parser_delete(&parser);
    if (rc != 0) {
        policy_free(pol);
        return rc;
    }
    *out = pol;
    return 0;
}

router_policy *router_policy_implicit(const char *const *names, const int *fallback, size_t n)
{
    router_policy *pol = policy_new();
    pol->implicit = true;
    pol->n_tiers = n;
    pol->tiers = util_arena_alloc(&pol->arena, (n ? n : 1) * sizeof *pol->tiers);
    for (size_t i = 0; i < n; i++) {
        router_tier *t = &pol->tiers[i];
        *t = (router_tier){.name = names[i], .backend = names[i]};
        if (fallback[i] >= 0 && (size_t)fallback[i] < n && (size_t)fallback[i] != i) {
            int *chain = util_arena_alloc(&pol->arena, sizeof *chain);
            chain[0] = fallback[i];
            t->fallback = chain;
            t->n_fallback = 1;
        }
    }
    return pol;
}

bool router_policy_is_implicit(const router_policy *p)
{
    return p->implicit;
}

int router_policy_load(router_policy **out, const char *path, const char *const *backends,
                       size_t n_backends, util_err *err)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return util_err_set(err, LLMGW_EIO, "%s: %s", path, strerror(errno));
    char *text = NULL;
    size_t len = 0, cap = 0;
    int rc = 0;
    for (;;) {
        if (cap - len < 4096) {
            if (cap >= MAX_FILE_BYTES) {
                rc = util_err_set(err, LLMGW_ERANGE, "%s: larger than 16 MiB", path);
                break;
            }
            cap = cap ? cap * 2 : 8192;
            char *grown = realloc(text, cap);
            if (grown == NULL) {
                rc = util_err_set(err, LLMGW_ENOMEM, "%s: out of memory", path);
                break;
            }
            text = grown;
        }
        size_t n = fread(text + len, 1, cap - len, f);
        len += n;
        if (n == 0) {
            if (ferror(f))
                rc = util_err_set(err, LLMGW_EIO, "%s: read error", path);
            break;
        }
    }
    fclose(f);
    if (rc == 0) {
        const char *slash = strrchr(path, '/');
        char *dir = slash == NULL ? util_xstrdup(".") :
                    slash == path ? util_xstrdup("/") : util_xstrndup(path, (size_t)(slash - path));
        rc = router_policy_parse(out, text, len, path, dir, backends, n_backends, err);
        free(dir);
    }
    free(text);
    return rc;
}

router_policy *router_policy_ref(router_policy *p)
{
    atomic_fetch_add_explicit(&p->refs, 1, memory_order_relaxed);
    return p;
}

void router_policy_unref(router_policy *p)
{
    if (p != NULL && atomic_fetch_sub_explicit(&p->refs, 1, memory_order_acq_rel) == 1)
        policy_free(p);
}

/* ---- routing --------------------------------------------------------------------------------- */

/* Whether any pattern matches s; md is created on first use and reused for the call. */
static bool any_match(const router_policy *p, pcre2_code *const *re, size_t n, const char *s,
                      size_t len, pcre2_match_data **md)
{
    if (s == NULL || n == 0)
        return false;
    if (*md == NULL && (*md = pcre2_match_data_create(1, NULL)) == NULL)
        return false;
    for (size_t i = 0; i < n; i++)
        if (pcre2_match(re[i], (PCRE2_SPTR)s, len, 0, 0, *md, p->mctx) >= 0)
            return true;   /* 0 = matched with the one-pair ovector too small: still a match */
    return false;
}

static bool any_str(const char *const *v, size_t n, const char *s)
{
    if (s == NULL)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!strcmp(v[i], s))
            return true;
    return false;
}

/* Every condition but the score, cheapest first. */
static bool rule_holds(const router_policy *p, const rule *r, const router_request *q,
                       pcre2_match_data **md)
{
    if (r->n_models != 0 && !any_str(r->models, r->n_models, q->model))
        return false;
    if (r->n_groups != 0 && !any_str(r->groups, r->n_groups, q->group))
        return false;
    if (r->min_tokens >= 0 && q->input_tokens < r->min_tokens)
        return false;
    if (r->max_tokens >= 0 && q->input_tokens > r->max_tokens)
        return false;
    for (size_t i = 0; i < r->n_headers; i++) {
        const char *v = q->header ? q->header(q->header_ctx, r->headers[i].name) : NULL;
        if (v == NULL || !any_match(p, r->headers[i].re, r->headers[i].n_re, v, strlen(v), md))
            return false;
    }
    if (r->n_keywords != 0 && !any_match(p, r->keywords, r->n_keywords, q->text, q->text_len, md))
        return false;
    if (r->n_regex != 0 && !any_match(p, r->regex, r->n_regex, q->text, q->text_len, md))
        return false;
    return true;
}

void router_policy_route(const router_policy *p, const router_request *q, router_decision *d)
{
    pcre2_match_data *md = NULL;
    *d = (router_decision){.tier = p->default_tier, .rule = NULL, .needs_score = false,
                           .cache = -1, .cache_threshold = -1,
                           .cache_max_false_hit_rate = -1,
                           .cascade = p->cascade.enabled ? &p->cascade : NULL};
    for (size_t i = 0; i < p->n_rules; i++) {
        const rule *r = &p->rules[i];
        if (!rule_holds(p, r, q, &md))
            continue;
        if (r->has_score) {
            if (q->score < 0) {
                d->needs_score = true;
                break;
            }
            d->unfamiliar = q->unfamiliar && p->unfamiliar_tier >= 0;
            if (!d->unfamiliar && !(q->score >= r->score_min && q->score <= r->score_max))
                continue;
        }
        /* An unfamiliar prompt takes route_unfamiliar_to, with the rule's cache settings. */
        d->tier = d->unfamiliar ? p->unfamiliar_tier : r->tier;
        d->rule = r->name;
        d->cache = r->cache;
        d->cache_threshold = r->cache_threshold;
        d->cache_max_false_hit_rate = r->cache_max_false_hit_rate;
        d->cascade = r->cascade.enabled ? &r->cascade : NULL;
        break;
    }
    pcre2_match_data_free(md);
}

/* ---- accessors ------------------------------------------------------------------------------- */

size_t router_policy_tier_count(const router_policy *p)
{
    return p->n_tiers;
}

const router_tier *router_policy_tier(const router_policy *p, int i)
{
    return i >= 0 && (size_t)i < p->n_tiers ? &p->tiers[i] : NULL;
}

int router_policy_find_tier(const router_policy *p, const char *name)
{
    return name != NULL ? find_tier(p, name) : -1;
}

int router_policy_default_tier(const router_policy *p)
{
    return p->default_tier;
}

int router_policy_reference_tier(const router_policy *p)
{
    return p->reference_tier;
}

const router_classifier *router_policy_classifier(const router_policy *p)
{
    return p->classifier;
}

bool router_policy_uses_score(const router_policy *p)
{
    return p->uses_score;
}

bool router_policy_routes_model(const router_policy *p, const char *model)
{
    return model != NULL && router_alias_find(p->models, model) >= 0;
}

double router_tier_cost(const router_tier *t, long input_tokens, long output_tokens)
{
    double in = input_tokens > 0 ? (double)input_tokens : 0;
    double out = output_tokens > 0 ? (double)output_tokens : 0;
    return (in * t->price_in + out * t->price_out) / 1e6;
}
