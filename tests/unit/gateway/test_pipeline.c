/* tests/unit/gateway/test_pipeline.c: the stage machine alone (gateway/pipeline.c with the
 * real route.c and reply.c). The tiers are fakes behind tier.h, and the cache is a scripted
 * stand-in for cache.h defined in this file (the linker then leaves cache.c out): each lookup
 * step answers hit, miss or "pending", and a pending step resumes when the test delivers
 * hooks.cache_done, as the encoder thread or Redis would. */
#include "gateway/pipeline.h"

#include "gateway/cache.h"
#include "gateway/route.h"

#include "tests/unit/unit.h"
#include "tests/unit/gateway/fake.h"

#include <unistd.h>

/* ---- the scripted cache ------------------------------------------------------------------ */

static struct {
    gw_cache_step exact, semantic;  /* what each step answers */
    gw_cache_step outcome;          /* after a pending step: what it found */
    bool encoder;                   /* gw_cache_embed can start */
    bool prepared, looked_up, embedded, served, accounted, forgot, disabled;
    int exact_calls, semantic_calls, releases;
    bool may_store;
    int rule_cache;
    double threshold;
    gw_req *waiting;                /* the request a pending step holds */
} g_cache;

static gw_cache *const k_cache = (gw_cache *)&g_cache;

void gw_cache_prepare(gw_req *r, int rule_cache, bool may_store)
{
    g_cache.prepared = true;
    g_cache.looked_up = rule_cache != 0;
    g_cache.rule_cache = rule_cache;
    g_cache.may_store = may_store;
    r->cache = (struct gw_cache_req *)&g_cache;
}

static gw_cache_step step(gw_req *r, gw_cache_step s)
{
    if (s == GW_CACHE_PENDING)
        g_cache.waiting = r;
    g_cache.outcome = s == GW_CACHE_HIT ? GW_CACHE_HIT : g_cache.outcome;
    return s;
}

gw_cache_step gw_cache_exact(gw_req *r)
{
    g_cache.exact_calls++;
    return step(r, g_cache.exact);
}

bool gw_cache_wants_embedding(const gw_req *r)
{
    (void)r;
    return g_cache.looked_up && !g_cache.embedded;
}

bool gw_cache_embed(gw_req *r)
{
    if (!g_cache.encoder)
        return false;
    g_cache.embedded = true;
    g_cache.waiting = r;
    return true;
}

const float *gw_cache_vec(const gw_req *r)
{
    (void)r;
    return NULL;
}

void gw_cache_disable(gw_req *r)
{
    (void)r;
    g_cache.disabled = true;
    g_cache.looked_up = false;
}

gw_cache_step gw_cache_semantic(gw_req *r, double threshold, double max_false_hit_rate)
{
    (void)max_false_hit_rate;
    g_cache.semantic_calls++;
    g_cache.threshold = threshold;
    return step(r, g_cache.semantic);
}

gw_cache_step gw_cache_outcome(const gw_req *r)
{
    (void)r;
    return g_cache.outcome;
}

bool gw_cache_looked_up(const gw_req *r)
{
    (void)r;
    return g_cache.looked_up;
}

void gw_cache_hit_info(const gw_req *r, const char **kind, double *similarity, long *prompt,
                       long *completion)
{
    (void)r;
    *kind = "semantic";
    *similarity = 0.97;
    *prompt = 7;
    *completion = 3;
}

void gw_cache_forget_hit(gw_req *r)
{
    (void)r;
    g_cache.forgot = true;
}

void gw_cache_account(gw_req *r)
{
    (void)r;
    g_cache.accounted = true;
}

void gw_cache_serve(gw_req *r)
{
    g_cache.served = true;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "from", "cache");
    gw_reply_json(r, 200, o);
}

void gw_cache_release(gw_req *r)
{
    if (r->cache != NULL)
        g_cache.releases++;
    r->cache = NULL;
    if (g_cache.waiting == r)
        g_cache.waiting = NULL;
}

bool gw_cache_serves_embeddings(const gw_cache *c, const char *model)
{
    return c != NULL && !strcmp(model, "encoder");
}

void gw_embeddings_start(gw_req *r)
{
    gw_reply_json(r, 200, cJSON_CreateString("embedded"));
}

/* ---- the server ---------------------------------------------------------------------------- */

static char g_policy[64];

static const char k_policy[] =
    "version: 1\n"
    "models: [auto]\n"
    "default_tier: cheap\n"
    "tiers:\n"
    "  cheap: {backend: a, max_concurrent: 1, fallback: [big]}\n"
    "  big: {backend: c, max_concurrent: 1}\n"
    "rules:\n"
    "  - {name: strict, match: {keywords: [strict]}, tier: cheap, cache: {threshold: 0.99}}\n"
    "  - {name: nocache, match: {keywords: [secret]}, tier: big, cache: {enabled: false}}\n";

static int setup(void **state)
{
    static fake_srv f;
    memset(&g_cache, 0, sizeof g_cache);
    fake_write_file(g_policy, sizeof g_policy, "pipeline", k_policy);
    char cfg[1024];
    snprintf(cfg, sizeof cfg,
             "policy: %s\n"
             "tiers:\n"
             "  - {name: a, base_url: 'http://127.0.0.1:9', fallback: b}\n"
             "  - {name: b, base_url: 'http://127.0.0.1:9'}\n"
             "  - {name: c, base_url: 'http://127.0.0.1:9'}\n", g_policy);
    fake_srv_init(&f, cfg);
    f.release = gw_pipeline_release;
    gw_router_declare_metrics(f.s.metrics);
    gw_pipeline_declare_metrics(f.s.metrics);
    gw_pipeline_init(&f.s);
    util_err err = {0};
    assert_int_equal(gw_router_new(&f.s.router, &f.s, &err), 0);
    f.s.cache = k_cache;
    *state = &f;
    return 0;
}

static int teardown(void **state)
{
    fake_srv *f = *state;
    gw_router_free(f->s.router);
    fake_srv_deinit(f);
    unlink(g_policy);
    return 0;
}

static gw_req *chat(fake_srv *f, rec *x, const char *model, const char *text)
{
    gw_req *r = fake_req(f, x, "req_p");
    char body[512];
    snprintf(body, sizeof body, "{\"model\":\"%s\",\"messages\":[{\"role\":\"user\","
             "\"content\":\"%s\"}]}", model, text);
    fake_parse(r, GW_EP_CHAT, body);
    return r;
}

static const char *json_str(const rec *x, const char *a, const char *b)
{
    static char out[256];
    cJSON *o = cJSON_Parse(x->body);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, a);
    if (b != NULL)
        v = cJSON_GetObjectItemCaseSensitive(v, b);
    snprintf(out, sizeof out, "%s", cJSON_IsString(v) ? v->valuestring : "(none)");
    cJSON_Delete(o);
    return out;
}

/* ---- tests --------------------------------------------------------------------------------- */

static void unknown_model_is_404(void **state)
{
    fake_srv *f = *state;
    rec x = {0};
    gw_pipeline_start(chat(f, &x, "nope", "hi"), false);
    assert_int_equal(f->done, 1);
    assert_int_equal(x.status, 404);
    assert_string_equal(json_str(&x, "error", "code"), "model_not_found");
    assert_false(g_cache.prepared);
}

static void miss_dispatches_to_routed_tier(void **state)
{
    fake_srv *f = *state;
    rec x = {0};
    gw_pipeline_start(chat(f, &x, "auto", "hello"), false);
    assert_int_equal(f->done, 1);
    assert_int_equal(x.status, 200);
    assert_string_equal(json_str(&x, "tier", NULL), "a");
    assert_int_equal(f->fakes[0]->started, 1);
    assert_int_equal(f->fakes[0]->released, 1);
    assert_true(f->fakes[0]->saw_fallback_ok);    /* big (c) is left on the chain */
    assert_int_equal(g_cache.exact_calls, 1);
    assert_int_equal(g_cache.semantic_calls, 1);
    assert_true(g_cache.accounted);
    assert_true(g_cache.may_store);
    assert_int_equal(g_cache.releases, 1);
}

static void exact_hit_is_served_not_dispatched(void **state)
{
    fake_srv *f = *state;
    rec x = {0};
    g_cache.exact = GW_CACHE_HIT;
    gw_pipeline_start(chat(f, &x, "auto", "hello"), false);
    assert_int_equal(f->done, 1);
    assert_true(g_cache.served);
    assert_string_equal(json_str(&x, "from", NULL), "cache");
    assert_int_equal(g_cache.semantic_calls, 0);
    assert_int_equal(f->fakes[0]->started, 0);
}

/* exact: pending (Redis re-check) → stale (miss) → embed on the encoder → semantic: pending →
 * hit: the machine waits twice and resumes each time where it should. */
static void waits_and_resumes(void **state)
{
    fake_srv *f = *state;
    rec x = {0};
    g_cache.exact = GW_CACHE_PENDING;
    g_cache.encoder = true;
    gw_req *r = chat(f, &x, "auto", "strict please");
    gw_pipeline_start(r, false);
    assert_string_equal(gw_pipeline_stage(r), "wait_lookup");
    g_cache.outcome = GW_CACHE_MISS;
    f->s.hooks.cache_done(r);
    assert_string_equal(gw_pipeline_stage(r), "wait_embed");
    assert_true(g_cache.embedded);
    g_cache.semantic = GW_CACHE_PENDING;
    f->s.hooks.cache_done(r);
    assert_string_equal(gw_pipeline_stage(r), "wait_lookup");
    assert_double_near(g_cache.threshold, 0.99, 0);   /* the rule's own threshold */
    assert_int_equal(f->done, 0);
    g_cache.outcome = GW_CACHE_HIT;
    f->s.hooks.cache_done(r);
    assert_int_equal(f->done, 1);
    assert_true(g_cache.served);
    assert_int_equal(f->fakes[0]->started, 0);
    char v[64];
    assert_string_equal(rec_find(&x, "x-llmgw-route-reason", v, sizeof v), "rule=strict");
}

static void dry_run_answers_the_decision(void **state)
{
    fake_srv *f = *state;
    rec x = {0};
    gw_pipeline_start(chat(f, &x, "auto", "hello"), true);
    assert_int_equal(f->done, 1);
    assert_int_equal(x.status, 200);
    assert_string_equal(json_str(&x, "object", NULL), "llmgw.route");
    assert_string_equal(json_str(&x, "tier", NULL), "cheap");
    assert_string_equal(json_str(&x, "backend", NULL), "a");
    assert_string_equal(json_str(&x, "cache", "result"), "miss");
    assert_int_equal(f->fakes[0]->started, 0);
    assert_false(g_cache.accounted);      /* a dry run counts nothing */
    assert_false(g_cache.may_store);
}

static void dry_run_reports_a_hit_without_serving(void **state)
{
    fake_srv *f = *state;
    rec x = {0};
    g_cache.semantic = GW_CACHE_HIT;
    gw_pipeline_start(chat(f, &x, "auto", "hello"), true);
    assert_string_equal(json_str(&x, "cache", "result"), "semantic");
    assert_false(g_cache.served);
    assert_true(g_cache.forgot);
}

static void rule_turns_cache_off(void **state)
{
    fake_srv *f = *state;
    rec x = {0};
    gw_pipeline_start(chat(f, &x, "auto", "my secret"), true);
    assert_string_equal(json_str(&x, "tier", NULL), "big");
    assert_string_equal(json_str(&x, "cache", "result"), "bypass");
    assert_int_equal(g_cache.rule_cache, 0);
}

static void fallback_on_failure_before_first_byte(void **state)
{
    fake_srv *f = *state;
    rec x = {0};
    f->fakes[0]->mode = FAKE_FAIL;
    gw_req *r = chat(f, &x, "auto", "hello");
    gw_pipeline_start(r, false);
    assert_int_equal(f->done, 1);
    assert_int_equal(x.status, 200);
    assert_string_equal(json_str(&x, "tier", NULL), "c");
    assert_int_equal(f->fakes[0]->released, 1);    /* the failed tier's state went first */
    assert_int_equal(f->fakes[2]->started, 1);
    assert_false(f->fakes[2]->saw_fallback_ok);    /* the chain is spent */
    assert_double_near(fake_metric(f, "llmgw_fallbacks_total{from=\"a\",to=\"c\"} "), 1, 0);
    char v[64];
    assert_string_equal(rec_find(&x, "x-llmgw-tier", v, sizeof v), "c");
}

static void chain_spent_answers_the_failure(void **state)
{
    fake_srv *f = *state;
    rec x = {0};
    f->fakes[0]->mode = FAKE_FAIL;
    f->fakes[2]->mode = FAKE_FAIL;
    gw_pipeline_start(chat(f, &x, "auto", "hello"), false);
    assert_int_equal(f->done, 1);
    assert_int_equal(x.status, 502);
    assert_string_equal(json_str(&x, "error", "message"), "Tier 'c' is down (no fallback).");
}

/* Implicit policy (model named directly): the config fallback a → b is the chain. */
static void implicit_chain_falls_back(void **state)
{
    fake_srv *f = *state;
    rec x = {0};
    f->fakes[0]->mode = FAKE_FAIL;
    gw_pipeline_start(chat(f, &x, "a", "hello"), false);
    assert_string_equal(json_str(&x, "tier", NULL), "b");
    assert_int_equal(f->fakes[1]->started, 1);
}

static void over_capacity_goes_down_then_503(void **state)
{
    fake_srv *f = *state;
    rec x1 = {0}, x2 = {0}, x3 = {0}, x4 = {0};
    f->fakes[0]->mode = FAKE_HOLD;
    f->fakes[2]->mode = FAKE_HOLD;
    gw_req *r1 = chat(f, &x1, "auto", "one");
    gw_pipeline_start(r1, false);
    assert_string_equal(gw_pipeline_stage(r1), "done");
    assert_int_equal(f->fakes[0]->started, 1);
    gw_req *r2 = chat(f, &x2, "auto", "two");
    gw_pipeline_start(r2, false);
    assert_int_equal(f->fakes[2]->started, 1);     /* cheap is full: big */
    assert_ptr_equal(f->fakes[2]->held, r2);
    gw_pipeline_start(chat(f, &x3, "auto", "three"), false);
    assert_int_equal(x3.status, 503);             /* both full */
    assert_string_equal(json_str(&x3, "error", "code"), "tier_over_capacity");
    char v[16];
    assert_string_equal(rec_find(&x3, "Retry-After", v, sizeof v), "1");
    fake_answer(r1);
    fake_answer(r2);
    assert_int_equal(f->done, 3);
    f->fakes[0]->mode = FAKE_ANSWER;
    gw_pipeline_start(chat(f, &x4, "auto", "four"), false);
    assert_int_equal(x4.status, 200);             /* the slots came back */
    assert_string_equal(json_str(&x4, "tier", NULL), "a");
}

static void client_gone_while_waiting(void **state)
{
    fake_srv *f = *state;
    rec x = {0};
    g_cache.encoder = true;
    gw_req *r = chat(f, &x, "auto", "hello");
    gw_pipeline_start(r, false);
    assert_string_equal(gw_pipeline_stage(r), "wait_embed");
    r->io_ctx = NULL;
    gw_pipeline_abort(r);
    r->status = 499;
    gw_reply_abandon(r);
    assert_int_equal(f->done, 1);
    assert_int_equal(f->last_status, 499);
    assert_null(g_cache.waiting);                 /* the cache forgot the request */
    assert_int_equal(f->fakes[0]->started, 0);
}

static void client_gone_while_tier_answers(void **state)
{
    fake_srv *f = *state;
    rec x = {0};
    f->fakes[0]->mode = FAKE_HOLD;
    gw_req *r = chat(f, &x, "auto", "hello");
    gw_pipeline_start(r, false);
    r->io_ctx = NULL;
    gw_pipeline_abort(r);
    assert_int_equal(f->fakes[0]->detached, 1);
    gw_reply_abandon(r);
    assert_int_equal(f->fakes[0]->released, 1);
}

static void embeddings_skip_cache_stages(void **state)
{
    fake_srv *f = *state;
    rec x = {0}, y = {0};
    gw_req *r = fake_req(f, &x, "req_e");
    fake_parse(r, GW_EP_EMBEDDINGS, "{\"model\":\"encoder\",\"input\":\"hi\"}");
    gw_pipeline_start(r, false);
    assert_contains(x.body, "embedded");
    gw_req *u = fake_req(f, &y, "req_u");
    fake_parse(u, GW_EP_EMBEDDINGS, "{\"model\":\"b\",\"input\":\"hi\"}");
    gw_pipeline_start(u, false);
    assert_int_equal(f->fakes[1]->started, 1);
    assert_false(g_cache.prepared);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(unknown_model_is_404, setup, teardown),
        cmocka_unit_test_setup_teardown(miss_dispatches_to_routed_tier, setup, teardown),
        cmocka_unit_test_setup_teardown(exact_hit_is_served_not_dispatched, setup, teardown),
        cmocka_unit_test_setup_teardown(waits_and_resumes, setup, teardown),
        cmocka_unit_test_setup_teardown(dry_run_answers_the_decision, setup, teardown),
        cmocka_unit_test_setup_teardown(dry_run_reports_a_hit_without_serving, setup, teardown),
        cmocka_unit_test_setup_teardown(rule_turns_cache_off, setup, teardown),
        cmocka_unit_test_setup_teardown(fallback_on_failure_before_first_byte, setup, teardown),
        cmocka_unit_test_setup_teardown(chain_spent_answers_the_failure, setup, teardown),
        cmocka_unit_test_setup_teardown(implicit_chain_falls_back, setup, teardown),
        cmocka_unit_test_setup_teardown(over_capacity_goes_down_then_503, setup, teardown),
        cmocka_unit_test_setup_teardown(client_gone_while_waiting, setup, teardown),
        cmocka_unit_test_setup_teardown(client_gone_while_tier_answers, setup, teardown),
        cmocka_unit_test_setup_teardown(embeddings_skip_cache_stages, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
