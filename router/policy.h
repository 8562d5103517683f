/* router/policy.h: the routing policy: a YAML file (policies/default.yaml, documented in
 * policies/README.md) parsed and validated in full into an immutable, reference-counted struct.
 * The gateway holds the current policy behind one pointer; a reload builds a new one and swaps
 * it, and a request keeps a reference to the policy it started with.
 *
 * Validation: unknown keys, wrong types, undefined tiers (also in fallback chains and against
 * the backends the daemon config defines), bad regular expressions (PCRE2), duplicate tier or
 * rule names, score ranges without a classifier... each an error "file:line:column: what" with
 * LLMGW_EINVAL; unreadable files LLMGW_EIO. Thread-safe once loaded (PCRE2 match data is per
 * call). */
#ifndef LLMGW_ROUTER_POLICY_H
#define LLMGW_ROUTER_POLICY_H

#include "common/err.h"

#include <stdbool.h>
#include <stddef.h>

typedef struct router_policy router_policy;
typedef struct router_classifier router_classifier;

typedef struct router_tier {
    const char *name;
    const char *backend;        /* the daemon config's tier that serves it (default: name) */
    double price_in;            /* USD per 1M input tokens */
    double price_out;           /* USD per 1M output tokens */
    long context;               /* tokens; 0 = unknown (no check) */
    int max_concurrent;         /* requests at once; 0 = unlimited */
    const int *fallback;        /* tier indices, in order: tried when this tier is down or full */
    size_t n_fallback;
} router_tier;

/* A small-first cascade (policies/README.md): the routed tier's drafter answers first and the
 * tier comes in only when the deferral rule says so. Global, and per rule (a rule's keys
 * override the global ones). */
typedef enum router_defer {
    ROUTER_DEFER_CHOW = 1,      /* mean max-probability over `window` tokens below threshold */
    ROUTER_DEFER_DIFF = 2,      /* that condition makes the large model check; it escalates
                                   where the small's max-probability < the large's - margin */
} router_defer;

typedef struct router_cascade {
    bool enabled;
    router_defer rule;
    double threshold;           /* (0, 1] */
    int window;                 /* 1..64 */
    double margin;              /* diff: [0, 1] */
    int hold;                   /* tokens held back unverified, 0..16 */
} router_cascade;

/* What the rules look at. Strings are borrowed for the call. */
typedef struct router_request {
    const char *model;          /* the request's model field */
    const char *group;          /* the API key's group */
    /* Header lookup (case-insensitive name); NULL = the request has no headers to offer. */
    const char *(*header)(void *ctx, const char *name);
    void *header_ctx;
    long input_tokens;          /* an estimate of the prompt's tokens */
    const char *text;           /* the last user message (regex and keyword rules) */
    size_t text_len;
    double score;               /* the classifier's score, or < 0 when not computed */
    bool unfamiliar;            /* with a score: the classifier has seen nothing like the prompt */
} router_request;

typedef struct router_decision {
    int tier;                   /* index into the policy's tiers */
    const char *rule;           /* the rule that matched; NULL = the default tier */
    bool needs_score;           /* a score rule had to be evaluated but q->score < 0: compute the
                                   score and route again (tier is then not set) */
    int cache;                  /* the matching rule's cache setting: -1 default, 0 off, 1 on */
    double cache_threshold;     /* the rule's cache threshold, < 0 = the cache's default */
    double cache_max_false_hit_rate; /* the rule's verifier error budget, < 0 = the cache's */
    bool unfamiliar;            /* a score rule sent an unfamiliar prompt to route_unfamiliar_to */
    const router_cascade *cascade; /* the matching rule's cascade, else the policy's; NULL when
                                      off (borrowed from the policy) */
} router_decision;

/* backends: names the daemon config defines (a policy tier's backend must be one); NULL = do not
 * check. Relative paths (classifier weights) resolve against the policy file's directory. */
int  router_policy_load(router_policy **out, const char *path, const char *const *backends,
                        size_t n_backends, util_err *err);
int  router_policy_parse(router_policy **out, const char *text, size_t len, const char *name,
                         const char *dir, const char *const *backends, size_t n_backends,
                         util_err *err);
/* The policy a daemon config implies when it names no policy file: one tier per config tier
 * (names[i], served by the config tier of that name), fallback[i] its one fallback (an index, or
 * -1), no rules, no prices, default and reference tier 0. The names are borrowed: they must
 * outlive the policy. */
router_policy *router_policy_implicit(const char *const *names, const int *fallback, size_t n);
bool router_policy_is_implicit(const router_policy *p);
router_policy *router_policy_ref(router_policy *p);   /* returns p */
void router_policy_unref(router_policy *p);           /* NULL is a no-op; frees at zero */

/* Evaluates the rules in order; the first whose conditions all hold names the tier, else the
 * default tier. A rule's lists match when any item matches; its conditions must all hold. When
 * the policy has route_unfamiliar_to, the first rule that looks at the score and whose other
 * conditions hold sends an unfamiliar prompt (q->unfamiliar) to that tier whatever its score:
 * the classifier cannot judge it. */
void router_policy_route(const router_policy *p, const router_request *q, router_decision *d);

size_t router_policy_tier_count(const router_policy *p);
const router_tier *router_policy_tier(const router_policy *p, int i);
int  router_policy_find_tier(const router_policy *p, const char *name);  /* index or -1 */
int  router_policy_default_tier(const router_policy *p);
int  router_policy_reference_tier(const router_policy *p);  /* savings are against it */
/* The classifier the policy names (loaded with it), or NULL. */
const router_classifier *router_policy_classifier(const router_policy *p);
/* True when some rule looks at the classifier score. */
bool router_policy_uses_score(const router_policy *p);
/* Whether requests to this model name are routed by the policy at all (some rule or the
 * policy's `models` list names it); other model names keep the config's tier/alias lookup. */
bool router_policy_routes_model(const router_policy *p, const char *model);

/* USD for a call on tier t. */
double router_tier_cost(const router_tier *t, long input_tokens, long output_tokens);

#endif
