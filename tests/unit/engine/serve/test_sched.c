/* tests/unit/engine/serve/test_sched.c: an engine instance on the real SmolLM2 file — sequences
 * decoded together give the same tokens as decoded alone, preemption under a small pool keeps
 * results identical, stop strings and max_tokens end generation, cancel and over-long prompts,
 * shared-prefix pages reused (and evicted) without changing a token, logit_bias (copied, checked)
 * steering greedy decoding, text that is valid UTF-8 in every event even when tokens end
 * inside a character, and structured output (a JSON schema's grammar) under speculation.
 * The model comes from $LLMGW_MODELS (default <repo>/models), fetched by scripts/setup. */
#include "tests/unit/unit.h"

#include "engine/serve/engine.h"
#include "engine/text/grammar.h"
#include "tests/unit/engine/utf8_valid.h"

#include <cjson/cJSON.h>

#include <fnmatch.h>
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

#define MAX_GEN 64

typedef struct result {
    pthread_mutex_t *mu;
    pthread_cond_t *cv;
    int32_t tokens[MAX_GEN];
    int n;
    char text[4096];
    size_t text_len;
    bool done;
    eng_finish finish;
    int completion_tokens, prompt_tokens;
    int n_events;
    bool bad_utf8;               /* some TOKEN event's text was not valid UTF-8 */
    bool escalated;              /* DONE's cascade report */
    int small_tokens, kept, large_tokens;
} result;

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cv = PTHREAD_COND_INITIALIZER;
static eng_model *g_model;
static eng_model *g_target;      /* the F16 stand-in (scripts/make-standin): g_model drafts */
static kern_backend *g_be;

static void on_event(void *arg, const eng_event *ev)
{
    result *r = arg;
    pthread_mutex_lock(&g_mu);
    if (ev->kind == ENG_EV_TOKEN) {
        if (r->n < MAX_GEN)
            r->tokens[r->n++] = ev->pick->token;
        r->n_events++;
        if (!utf8_valid(ev->text, ev->len))
            r->bad_utf8 = true;
        if (r->text_len + ev->len < sizeof r->text) {
            memcpy(r->text + r->text_len, ev->text, ev->len);
            r->text_len += ev->len;
        }
    } else {
        r->done = true;
        r->finish = ev->finish;
        r->completion_tokens = ev->completion_tokens;
        r->prompt_tokens = ev->prompt_tokens;
        r->escalated = ev->escalated;
        r->small_tokens = ev->small_tokens;
        r->kept = ev->kept;
        r->large_tokens = ev->large_tokens;
        pthread_cond_broadcast(&g_cv);
    }
    pthread_mutex_unlock(&g_mu);
}

static void wait_all(result *r, int n)
{
    pthread_mutex_lock(&g_mu);
    for (int i = 0; i < n; i++)
        while (!r[i].done)
            pthread_cond_wait(&g_cv, &g_mu);
    pthread_mutex_unlock(&g_mu);
}

/* e's counters once it is idle. They are published between steps and a result arrives in the
 * middle of one, so right after wait_all they may still lack that step's work (a warm-up's last
 * draft round, counted against the next request: seen as 17 drafter tokens under ASan). */
static void stats_idle(eng_engine *e, eng_engine_stats *st)
{
    for (;;) {
        eng_engine_stats_get(e, st);
        if (st->running == 0 && st->waiting == 0)
            return;
        usleep(1000);
    }
}

static int setup(void **state)
{
    (void)state;
    char path[4096];
    const char *dir = getenv("LLMGW_MODELS");
    snprintf(path, sizeof path, "%s/SmolLM2-135M-Instruct.Q4_1.gguf",
             dir ? dir : LLMGW_SOURCE_DIR "/models");
    util_err err;
    if (eng_model_load(&g_model, path, NULL, &err) != 0) {
        fprintf(stderr, "cannot load the model (run scripts/fetch-models): %s\n", err.msg);
        return -1;
    }
    snprintf(path, sizeof path, "%s/SmolLM2-135M-Instruct.F16.gguf",
             dir ? dir : LLMGW_SOURCE_DIR "/models");
    if (eng_model_load(&g_target, path, NULL, &err) != 0) {
        fprintf(stderr, "cannot load the stand-in (run scripts/make-standin): %s\n", err.msg);
        return -1;
    }
    g_be = kern_cpu_backend_new(2);
    return g_be ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    kern_backend_free(g_be);
    eng_model_free(g_target);
    eng_model_free(g_model);
    return 0;
}

static eng_engine *engine_px(eng_kvpool **pool, size_t pages, size_t page_bytes, int n_ctx,
                             int prefix_pages)
{
    util_err err;
    eng_engine *e;
    assert_int_equal(eng_kvpool_new(pool, g_be, page_bytes, pages, &err), 0);
    eng_engine_cfg cfg = {.name = "test", .max_batch_tokens = 64, .max_seqs = 8, .n_ctx = n_ctx,
                          .prefix_pages = prefix_pages};
    assert_int_equal(eng_engine_new(&e, g_model, *pool, g_be, &cfg, &err), 0);
    return e;
}

static eng_engine *engine(eng_kvpool **pool, size_t pages, size_t page_bytes, int n_ctx)
{
    return engine_px(pool, pages, page_bytes, n_ctx, 0);
}

static eng_engine *engine_cfg(eng_kvpool **pool, size_t pages, size_t page_bytes,
                              const eng_model *m, const eng_engine_cfg *cfg)
{
    util_err err;
    eng_engine *e;
    assert_int_equal(eng_kvpool_new(pool, g_be, page_bytes, pages, &err), 0);
    assert_int_equal(eng_engine_new(&e, m, *pool, g_be, cfg, &err), 0);
    return e;
}

/* Submits text (special tokens parsed) with the given temperature and seed. */
static void submit_sampled(eng_engine *e, const char *text, int max_tokens, float temperature,
                           uint64_t seed, result *r)
{
    int32_t *ids = NULL;
    size_t n = 0, cap = 0;
    assert_int_equal(eng_tokenize(g_model->tok, text, strlen(text), false, true, &ids, &n, &cap),
                     0);
    memset(r, 0, sizeof *r);
    eng_request req = {.prompt = ids, .n_prompt = n, .max_tokens = max_tokens,
                       .sampling = {.temperature = temperature, .top_p = 1, .top_logprobs = -1},
                       .on_event = on_event, .arg = r, .seed = seed};
    uint64_t id;
    util_err err;
    assert_int_equal(eng_engine_submit(e, &req, &id, &err), 0);
    free(ids);
}

/* Submits text (special tokens parsed) for greedy decoding, with an optional stop string and
 * logit_bias. */
static void submit_bias(eng_engine *e, const char *text, int max_tokens, const char *stop,
                        const eng_logit_bias *bias, int n_bias, result *r)
{
    int32_t *ids = NULL;
    size_t n = 0, cap = 0;
    assert_int_equal(eng_tokenize(g_model->tok, text, strlen(text), false, true, &ids, &n, &cap),
                     0);
    memset(r, 0, sizeof *r);
    eng_request req = {.prompt = ids, .n_prompt = n, .max_tokens = max_tokens,
                       .sampling = {.temperature = 0, .top_p = 1, .top_logprobs = -1,
                                    .logit_bias = bias, .n_logit_bias = n_bias},
                       .on_event = on_event, .arg = r, .seed = 1};
    if (stop != NULL) {
        req.stop[0] = stop;
        req.n_stop = 1;
    }
    uint64_t id;
    util_err err;
    assert_int_equal(eng_engine_submit(e, &req, &id, &err), 0);
    free(ids);
}

static void submit(eng_engine *e, const char *text, int max_tokens, const char *stop,
                   result *r)
{
    submit_bias(e, text, max_tokens, stop, NULL, 0, r);
}

/* b came out exactly as a: the same tokens, text, finish reason and token count. */
static void assert_same_output(const result *a, const result *b)
{
    assert_int_equal(a->n, b->n);
    assert_memory_equal(a->tokens, b->tokens, (size_t)a->n * sizeof(int32_t));
    assert_int_equal(a->text_len, b->text_len);
    assert_memory_equal(a->text, b->text, a->text_len);
    assert_int_equal(a->finish, b->finish);
    assert_int_equal(a->completion_tokens, b->completion_tokens);
}

/* The first n of texts submitted to e all at once; each answer came out as want[i]. */
static void together_as(eng_engine *e, const char *const *texts, size_t n, int max_tokens,
                        const result *want)
{
    static result got[16];
    assert_true(n <= sizeof got / sizeof *got);
    for (size_t i = 0; i < n; i++)
        submit(e, texts[i], max_tokens, NULL, &got[i]);
    wait_all(got, (int)n);
    for (size_t i = 0; i < n; i++)
        assert_same_output(&want[i], &got[i]);
}

static const char *prompts[] = {
    "The capital of France is",
    "def fibonacci(n):\n    ",
    "Once upon a time, in a small village by the sea,",
    "<|im_start|>user\nName three colors.<|im_end|>\n<|im_start|>assistant\n",
};
#define N_PROMPTS (sizeof prompts / sizeof prompts[0])

static void together_equals_alone(void **state)
{
    (void)state;
    eng_kvpool *pool;
    eng_engine *e = engine(&pool, 256, 256 * 1024, 1024);
    result alone[N_PROMPTS], together[N_PROMPTS];
    for (size_t i = 0; i < N_PROMPTS; i++) {
        submit(e, prompts[i], 24, NULL, &alone[i]);
        wait_all(&alone[i], 1);
    }
    for (size_t i = 0; i < N_PROMPTS; i++)
        submit(e, prompts[i], 24, NULL, &together[i]);
    wait_all(together, N_PROMPTS);
    for (size_t i = 0; i < N_PROMPTS; i++)
        assert_same_output(&alone[i], &together[i]);
    eng_engine_free(e);
    eng_kvpool_free(pool);
}

static const char *spec_prompts[] = {
    "The capital of France is",
    "def fibonacci(n):\n    ",
    "1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 4, 1, 2,",
    "<|im_start|>user\nRepeat exactly: the cat sat on the mat, the cat sat on the mat."
    "<|im_end|>\n<|im_start|>assistant\n",
};
enum { N_SPEC = sizeof spec_prompts / sizeof *spec_prompts };

/* Spec cuts the counting answer (spec_prompts[2]; count: plain's whole answer) where plain
 * does: max_tokens from `from` to 9 by `by`, with a stop string (3 characters from the middle
 * of the answer) on every run or on odd max_tokens only. */
static void expect_same_cuts(eng_engine *plain, eng_engine *spec, const result *count, int from,
                             int by, bool stop_always)
{
    assert_true(count->text_len > 12);
    char stop[8];
    memcpy(stop, count->text + 8, 3);
    stop[3] = '\0';
    for (int max = from; max <= 9; max += by) {
        const char *st = stop_always || max % 2 ? stop : NULL;
        result a, b;
        submit(plain, spec_prompts[2], max, st, &a);
        wait_all(&a, 1);
        submit(spec, spec_prompts[2], max, st, &b);
        wait_all(&b, 1);
        assert_same_output(&a, &b);
    }
}

/* Prompt-lookup speculation changes nothing a client sees: the same tokens, texts and finish
 * reasons as plain decoding, alone or batched, with a stop string or max_tokens landing inside
 * an accepted draft; it does accept drafts on text that repeats itself; and every page comes
 * back after the rollbacks. */
static void speculation_is_invisible(void **state)
{
    (void)state;
    enum { NP = N_SPEC };
    eng_kvpool *pool_a, *pool_b;
    eng_engine *plain = engine_px(&pool_a, 256, 256 * 1024, 1024, -1);
    eng_engine *spec = NULL;
    eng_engine_cfg cfg = {.name = "spec", .max_batch_tokens = 64, .max_seqs = 8, .n_ctx = 1024,
                          .prefix_pages = -1, .ngram_draft = 5, .draft_always = true};
    util_err err;
    assert_int_equal(eng_kvpool_new(&pool_b, g_be, 256 * 1024, 256, &err), 0);
    assert_int_equal(eng_engine_new(&spec, g_model, pool_b, g_be, &cfg, &err), 0);
    static result want[NP], got[NP], got_alone[NP];
    for (size_t i = 0; i < NP; i++) {
        submit(plain, spec_prompts[i], 40, NULL, &want[i]);
        wait_all(&want[i], 1);
        submit(spec, spec_prompts[i], 40, NULL, &got_alone[i]);
        wait_all(&got_alone[i], 1);
    }
    for (size_t i = 0; i < NP; i++)
        submit(spec, spec_prompts[i], 40, NULL, &got[i]);
    wait_all(got, NP);
    for (size_t i = 0; i < NP; i++) {
        assert_same_output(&want[i], &got_alone[i]);
        assert_same_output(&want[i], &got[i]);
    }
    eng_engine_stats st;
    eng_engine_stats_get(spec, &st);
    assert_true(st.draft_tokens[ENG_DRAFT_NGRAM] > 0);
    assert_true(st.draft_accepted[ENG_DRAFT_NGRAM] > 0 &&
                st.draft_accepted[ENG_DRAFT_NGRAM] <= st.draft_tokens[ENG_DRAFT_NGRAM]);
    /* A stop string from the middle of the counting answer, and max_tokens that end inside
     * a draft: the same cut as plain decoding. */
    expect_same_cuts(plain, spec, &want[2], 3, 3, true);
    eng_engine_free(spec);
    eng_engine_free(plain);
    /* No prefix table: every page is back in the pool once the sequences are done. */
    assert_int_equal(eng_kvpool_n_free(pool_b), eng_kvpool_n_pages(pool_b));
    eng_kvpool_free(pool_a);
    eng_kvpool_free(pool_b);
}


/* Draft-model speculation (the Q4_1 file drafting for the F16 stand-in) changes nothing a
 * client sees under greedy decoding: the same tokens, texts and finish reasons as the target
 * alone, one at a time, batched, the same prompt twice at once (n > 1), under preemption, with
 * shared-prefix pages, past the batch size where speculation switches off, and with a stop
 * string or max_tokens landing inside a draft. Drafts are both accepted and rejected (the two
 * files disagree now and then), and every page, the drafter's too, comes back. Both ways the
 * drafter can hold K/V: in the model's pages (the pair holds the same weights, so that is the
 * default: the drafter then computes nothing but the tokens it drafts from) and in its own. */
static void draft_model_invisible_with(bool own_kv)
{
    eng_kvpool *pool_a, *pool_b;
    eng_engine_cfg plain_cfg = {.name = "plain", .max_batch_tokens = 64, .max_seqs = 8,
                                .n_ctx = 1024, .prefix_pages = -1};
    eng_engine *plain = engine_cfg(&pool_a, 256, 256 * 1024, g_target, &plain_cfg);
    eng_engine_cfg cfg = {.name = "spec", .max_batch_tokens = 64, .max_seqs = 8, .n_ctx = 1024,
                          .prefix_pages = -1, .drafter = g_model, .draft_max = 4,
                          .draft_p_min = -1, .draft_max_batch = 8, .draft_always = true,
                          .draft_own_kv = own_kv};
    eng_engine *spec = engine_cfg(&pool_b, 256, 256 * 1024, g_target, &cfg);
    static result want[N_SPEC], got[2 * N_SPEC], got_alone[N_SPEC];
    for (size_t i = 0; i < N_SPEC; i++) {
        submit(plain, spec_prompts[i], 32, NULL, &want[i]);
        wait_all(&want[i], 1);
        submit(spec, spec_prompts[i], 32, NULL, &got_alone[i]);
        wait_all(&got_alone[i], 1);
        assert_same_output(&want[i], &got_alone[i]);
    }
    for (size_t i = 0; i < 2 * N_SPEC; i++)
        submit(spec, spec_prompts[i % N_SPEC], 32, NULL, &got[i]);
    wait_all(got, 2 * N_SPEC);
    for (size_t i = 0; i < 2 * N_SPEC; i++)
        assert_same_output(&want[i % N_SPEC], &got[i]);
    eng_engine_stats st;
    eng_engine_stats_get(spec, &st);
    printf("drafted %llu, accepted %llu in %llu rounds, drafter tokens %llu\n",
           (unsigned long long)st.draft_tokens[ENG_DRAFT_MODEL],
           (unsigned long long)st.draft_accepted[ENG_DRAFT_MODEL],
           (unsigned long long)st.draft_rounds[ENG_DRAFT_MODEL],
           (unsigned long long)st.drafter_tokens);
    assert_true(st.draft_tokens[ENG_DRAFT_MODEL] > 0);
    assert_true(st.draft_accepted[ENG_DRAFT_MODEL] > 0);
    assert_true(st.draft_accepted[ENG_DRAFT_MODEL] < st.draft_tokens[ENG_DRAFT_MODEL]);
    /* The same weights at Q4_1: most drafts are the model's own tokens (measured 231 of 249
     * both ways; with the model's K/V the drafter runs the backend's draft copies, with its
     * own the exact weights), which a broken draft copy would not be. */
    assert_true(st.draft_accepted[ENG_DRAFT_MODEL] * 5 >= st.draft_tokens[ENG_DRAFT_MODEL] * 4);
    assert_int_equal(st.draft_tokens[ENG_DRAFT_NGRAM], 0);
    assert_int_equal(st.spec_off_steps, 0);
    if (own_kv)   /* it read every prompt */
        assert_true(st.drafter_tokens > st.draft_tokens[ENG_DRAFT_MODEL]);
    else          /* one token in for each drafted, nothing more */
        assert_int_equal(st.drafter_tokens, st.draft_tokens[ENG_DRAFT_MODEL]);
    /* A stop string from the middle of the counting answer, and max_tokens ending inside a
     * draft. */
    expect_same_cuts(plain, spec, &want[2], 2, 1, false);
    eng_engine_free(spec);
    assert_int_equal(eng_kvpool_n_free(pool_b), eng_kvpool_n_pages(pool_b));
    eng_kvpool_free(pool_b);

    /* Past draft_max_batch: steps without drafts, the same output. */
    cfg.draft_max_batch = 2;
    spec = engine_cfg(&pool_b, 256, 256 * 1024, g_target, &cfg);
    together_as(spec, spec_prompts, N_SPEC, 32, want);
    eng_engine_stats_get(spec, &st);
    assert_true(st.spec_off_steps > 0);
    eng_engine_free(spec);
    eng_kvpool_free(pool_b);

    /* A pool too small for everyone (16 pages of 8 tokens, target and drafter pages both):
     * sequences are preempted and recomputed, drafts go without pages, same output. */
    cfg.draft_max_batch = 8;
    spec = engine_cfg(&pool_b, 16, g_target->kv_bytes_per_token * 8, g_target, &cfg);
    for (size_t i = 0; i < N_SPEC; i++)
        submit(spec, spec_prompts[i], 24, NULL, &got[i]);
    wait_all(got, N_SPEC);
    for (size_t i = 0; i < N_SPEC; i++) {
        result a;
        submit(plain, spec_prompts[i], 24, NULL, &a);
        wait_all(&a, 1);
        assert_same_output(&a, &got[i]);
    }
    eng_engine_stats_get(spec, &st);
    assert_true(st.preemptions > 0);
    eng_engine_free(spec);
    assert_int_equal(eng_kvpool_n_free(pool_b), eng_kvpool_n_pages(pool_b));
    eng_kvpool_free(pool_b);

    /* Shared-prefix pages (8-token pages, a 40+ token prompt twice): same output. */
    cfg.prefix_pages = 0;
    spec = engine_cfg(&pool_b, 256, g_target->kv_bytes_per_token * 8, g_target, &cfg);
    const char *longp = "<|im_start|>system\nYou are a careful assistant who answers in one "
                        "short sentence.<|im_end|>\n<|im_start|>user\nWhat is the capital of "
                        "France?<|im_end|>\n<|im_start|>assistant\n";
    result a, b[2];
    submit(plain, longp, 24, NULL, &a);
    wait_all(&a, 1);
    submit(spec, longp, 24, NULL, &b[0]);
    wait_all(&b[0], 1);
    submit(spec, longp, 24, NULL, &b[1]);
    wait_all(&b[1], 1);
    assert_same_output(&a, &b[0]);
    assert_same_output(&a, &b[1]);
    eng_engine_stats_get(spec, &st);
    assert_true(st.prefix_hit_tokens > 0);
    eng_engine_free(spec);
    eng_kvpool_free(pool_b);
    eng_engine_free(plain);
    eng_kvpool_free(pool_a);
}

static void draft_model_is_invisible(void **state)
{
    (void)state;
    assert_true(eng_model_same_weights(g_target, g_model));
    assert_true(eng_model_same_weights(g_model, g_target));
    draft_model_invisible_with(false);
    draft_model_invisible_with(true);
}

/* A q8 K/V cache (int8, rotated) works as the f16 one does around it: draft-model speculation
 * (rejected drafts rolled back by truncating block tables) gives the q8 engine's own greedy
 * output token for token, also under preemption in a small pool; shared-prefix pages are hit
 * and change nothing; a page holds about twice the tokens; every page comes back. */
static void q8_cache_rolls_back_and_shares(void **state)
{
    (void)state;
    eng_kvpool *pool_a, *pool_b;
    eng_engine_cfg plain_cfg = {.name = "plain-q8", .max_batch_tokens = 64, .max_seqs = 8,
                                .n_ctx = 1024, .prefix_pages = -1, .kv_type = KERN_KV_Q8,
                                .kv_rotate = true};
    eng_engine *plain = engine_cfg(&pool_a, 256, 256 * 1024, g_target, &plain_cfg);
    eng_engine_cfg cfg = plain_cfg;
    cfg.name = "spec-q8";
    cfg.drafter = g_model;
    cfg.draft_max = 4;
    cfg.draft_p_min = -1;
    cfg.draft_always = true;
    eng_engine *spec = engine_cfg(&pool_b, 256, 256 * 1024, g_target, &cfg);
    static result want[N_SPEC];
    for (size_t i = 0; i < N_SPEC; i++) {
        submit(plain, spec_prompts[i], 24, NULL, &want[i]);
        wait_all(&want[i], 1);
    }
    together_as(spec, spec_prompts, N_SPEC, 24, want);
    eng_engine_stats st;
    eng_engine_stats_get(spec, &st);
    assert_true(st.draft_accepted[ENG_DRAFT_MODEL] > 0);
    assert_true(st.draft_accepted[ENG_DRAFT_MODEL] < st.draft_tokens[ENG_DRAFT_MODEL]);
    eng_engine_free(spec);
    assert_int_equal(eng_kvpool_n_free(pool_b), eng_kvpool_n_pages(pool_b));
    eng_kvpool_free(pool_b);

    /* 8 f16 tokens a page: a q8 page takes about 15; 12 pages for 4 sequences and their
     * drafter's pages (8 where the drafter writes into the model's): preemption, same
     * output. */
    eng_kv_layout f16l, q8l;
    util_err err;
    size_t page = g_target->kv_bytes_per_token * 8;
    assert_int_equal(eng_model_kv_layout(g_target, KERN_KV_F16, 0, false, page, &f16l, &err), 0);
    assert_int_equal(eng_model_kv_layout(g_target, KERN_KV_Q8, 0, true, page, &q8l, &err), 0);
    assert_true(q8l.rotate);
    assert_int_equal(f16l.page_tokens, 8);
    assert_true(q8l.page_tokens >= 15);
    for (int own = 0; own < 2; own++) {
        cfg.draft_own_kv = own;
        spec = engine_cfg(&pool_b, own ? 12 : 8, page, g_target, &cfg);
        together_as(spec, spec_prompts, N_SPEC, 24, want);
        eng_engine_stats_get(spec, &st);
        assert_true(st.preemptions > 0);
        eng_engine_free(spec);
        assert_int_equal(eng_kvpool_n_free(pool_b), eng_kvpool_n_pages(pool_b));
        eng_kvpool_free(pool_b);
    }
    cfg.draft_own_kv = false;

    /* Shared-prefix pages: the same 40+ token prompt twice, the second from the table. */
    cfg.prefix_pages = 0;
    spec = engine_cfg(&pool_b, 256, page, g_target, &cfg);
    const char *longp = "<|im_start|>system\nYou are a careful assistant who answers in one "
                        "short sentence.<|im_end|>\n<|im_start|>user\nWhat is the capital of "
                        "France?<|im_end|>\n<|im_start|>assistant\n";
    result a, b[2];
    submit(plain, longp, 24, NULL, &a);
    wait_all(&a, 1);
    for (int i = 0; i < 2; i++) {
        submit(spec, longp, 24, NULL, &b[i]);
        wait_all(&b[i], 1);
        assert_same_output(&a, &b[i]);
    }
    eng_engine_stats_get(spec, &st);
    assert_true(st.prefix_hit_tokens >= (uint64_t)q8l.page_tokens);
    eng_engine_free(spec);
    eng_kvpool_free(pool_b);
    eng_engine_free(plain);
    eng_kvpool_free(pool_a);
}

/* Under sampling, speculation keeps the target's distribution: the second token (the first one
 * a draft decides: the first comes from the prompt's own forward) over many seeds, with and
 * without a drafter, passes a two-sample chi-square test at false-alarm rate 0.001 (rare
 * tokens pooled so every expected count is at least 5). The seeds are fixed, so the test is
 * deterministic. */
static void draft_model_sampling_keeps_distribution(void **state)
{
    (void)state;
    enum { N = 160, BATCH = 16 };
    eng_kvpool *pool_a, *pool_b;
    eng_engine_cfg plain_cfg = {.name = "plain", .max_batch_tokens = 128, .max_seqs = BATCH,
                                .n_ctx = 256, .prefix_pages = -1};
    eng_engine *plain = engine_cfg(&pool_a, 256, 256 * 1024, g_target, &plain_cfg);
    eng_engine_cfg cfg = plain_cfg;
    cfg.name = "spec";
    cfg.drafter = g_model;
    cfg.draft_max = 2;
    cfg.draft_p_min = -1;
    cfg.draft_max_batch = BATCH;
    cfg.draft_always = true;
    eng_engine *spec = engine_cfg(&pool_b, 256, 256 * 1024, g_target, &cfg);
    const char *prompt = "My favourite animal is the";
    static result ra[N], rb[N];
    for (int i = 0; i < N; i += BATCH) {
        /* One engine at a time: they share g_be, whose pool takes runs from one thread. */
        for (int j = i; j < i + BATCH; j++)
            submit_sampled(plain, prompt, 3, 1.0f, 1000 + (uint64_t)j, &ra[j]);
        wait_all(ra + i, BATCH);
        for (int j = i; j < i + BATCH; j++)
            submit_sampled(spec, prompt, 3, 1.0f, 5000 + (uint64_t)j, &rb[j]);
        wait_all(rb + i, BATCH);
    }
    eng_engine_stats st;
    eng_engine_stats_get(spec, &st);
    assert_true(st.draft_tokens[ENG_DRAFT_MODEL] > 0);
    assert_true(st.draft_accepted[ENG_DRAFT_MODEL] > 0);
    assert_true(st.draft_accepted[ENG_DRAFT_MODEL] < st.draft_tokens[ENG_DRAFT_MODEL]);
    /* Categories: second tokens seen at least 10 times in the two samples together; the rest
     * pooled. */
    enum { MAXC = 2 * N };
    static int32_t tok[MAXC];
    static int ca[MAXC], cb[MAXC];
    int nc = 0;
    for (int side = 0; side < 2; side++)
        for (int i = 0; i < N; i++) {
            const result *r = side ? &rb[i] : &ra[i];
            assert_true(r->n >= 2);
            int c = 0;
            while (c < nc && tok[c] != r->tokens[1])
                c++;
            if (c == nc) {
                tok[nc] = r->tokens[1];
                ca[nc] = cb[nc] = 0;
                nc++;
            }
            (side ? cb : ca)[c]++;
        }
    int pa = 0, pb = 0, k = 0;
    double chi2 = 0;
    for (int c = 0; c < nc; c++) {
        if (ca[c] + cb[c] < 10) {
            pa += ca[c];
            pb += cb[c];
            continue;
        }
        double e = (ca[c] + cb[c]) / 2.0;  /* equal sample sizes */
        chi2 += (ca[c] - e) * (ca[c] - e) / e + (cb[c] - e) * (cb[c] - e) / e;
        k++;
    }
    if (pa + pb >= 10) {
        double e = (pa + pb) / 2.0;
        chi2 += (pa - e) * (pa - e) / e + (pb - e) * (pb - e) / e;
        k++;
    }
    printf("second token: %d categories, chi-square %.2f\n", k, chi2);
    assert_true(k >= 4);
    /* df = k - 1; critical values at 0.001 */
    static const double crit[] = {0, 10.83, 13.82, 16.27, 18.47, 20.52, 22.46, 24.32, 26.12,
                                  27.88, 29.59, 31.26, 32.91, 34.53, 36.12, 37.70, 39.25,
                                  40.79, 42.31, 43.82, 45.31};
    int df = k - 1 < 20 ? k - 1 : 20;
    assert_true(chi2 < crit[df]);
    eng_engine_free(spec);
    eng_engine_free(plain);
    eng_kvpool_free(pool_a);
    eng_kvpool_free(pool_b);
}

/* Submits the token ids for greedy decoding, with a cascade (rule NONE: none). */
static void submit_ids(eng_engine *e, const int32_t *ids, size_t n, int max_tokens,
                       const eng_cascade *cas, result *r)
{
    memset(r, 0, sizeof *r);
    eng_request req = {.prompt = ids, .n_prompt = n, .max_tokens = max_tokens,
                       .sampling = {.temperature = 0, .top_p = 1, .top_logprobs = -1},
                       .on_event = on_event, .arg = r, .seed = 1};
    if (cas != NULL)
        req.cascade = *cas;
    uint64_t id;
    util_err err;
    assert_int_equal(eng_engine_submit(e, &req, &id, &err), 0);
}

/* Escalated cascade answers c[i] (of prompt ids[i % n_prompts]) are the drafter's answers up to
 * c->kept tokens, then the model's own greedy continuation of the prompt and those tokens
 * (checked on the model alone, all at once). */
static void expect_kept_then_model(eng_engine *large, int32_t *const *ids, const size_t *n_ids,
                                   size_t n_prompts, int max_tokens, const result *small,
                                   const result *c, size_t n)
{
    static result cont[16];
    static int32_t p[16][512];
    assert_true(n <= 16);
    for (size_t i = 0; i < n; i++) {
        size_t k = i % n_prompts, np = n_ids[k];
        cont[i].done = true;
        if (!c[i].escalated)
            continue;
        assert_true(c[i].kept <= c[i].n && c[i].kept <= small[k].n);
        assert_memory_equal(c[i].tokens, small[k].tokens, (size_t)c[i].kept * sizeof(int32_t));
        if (c[i].kept == c[i].n)
            continue;
        assert_true(np + (size_t)c[i].kept <= 512);
        memcpy(p[i], ids[k], np * sizeof(int32_t));
        memcpy(p[i] + np, c[i].tokens, (size_t)c[i].kept * sizeof(int32_t));
        submit_ids(large, p[i], np + (size_t)c[i].kept, max_tokens - c[i].kept, NULL, &cont[i]);
    }
    wait_all(cont, (int)n);
    for (size_t i = 0; i < n; i++) {
        if (!c[i].escalated || c[i].kept == c[i].n)
            continue;
        assert_int_equal(cont[i].n, c[i].n - c[i].kept);
        assert_memory_equal(cont[i].tokens, c[i].tokens + c[i].kept,
                            (size_t)cont[i].n * sizeof(int32_t));
        assert_int_equal(cont[i].finish, c[i].finish);
    }
}

/* The small-first cascade (eng_cascade): an answer that does not escalate is the drafter's
 * alone, token for token; one that does is the drafter's up to the tokens the model kept, then
 * the model's own greedy continuation; a client never sees a token the model then replaces
 * (events carry only kept or model tokens: the comparisons cover every event). Chow's rule at
 * both extremes and with a window longer than the hold (tokens committed before the model
 * comes in); diff with a margin that never defers (checks, no escalation) and one that does;
 * batched, with a pool small enough to preempt; every page back at the end. */
static void cascade_keeps_or_continues(void **state)
{
    (void)state;
    enum { MAX = 16 };
    eng_kvpool *pool_s, *pool_l, *pool_c;
    eng_engine_cfg cfg = {.name = "small", .max_batch_tokens = 64, .max_seqs = 8, .n_ctx = 512,
                          .prefix_pages = -1};
    eng_engine *small = engine_cfg(&pool_s, 128, 256 * 1024, g_model, &cfg);
    cfg.name = "large";
    eng_engine *large = engine_cfg(&pool_l, 128, 256 * 1024, g_target, &cfg);
    cfg.name = "cascade";
    cfg.drafter = g_model;
    cfg.draft_max = 4;
    cfg.draft_p_min = -1;
    cfg.draft_always = true;
    cfg.prefix_pages = 0;
    eng_engine *casc = engine_cfg(&pool_c, 256, g_target->kv_bytes_per_token * 8, g_target,
                                  &cfg);
    int32_t *ids[N_SPEC];
    size_t n_ids[N_SPEC];
    static result want_small[N_SPEC];
    for (size_t i = 0; i < N_SPEC; i++) {
        size_t cap = 0;
        ids[i] = NULL;
        n_ids[i] = 0;
        assert_int_equal(eng_tokenize(g_model->tok, spec_prompts[i], strlen(spec_prompts[i]),
                                      false, true, &ids[i], &n_ids[i], &cap), 0);
        submit_ids(small, ids[i], n_ids[i], MAX, NULL, &want_small[i]);
        wait_all(&want_small[i], 1);
    }
    static const struct {
        eng_cascade cas;
        int escalate;     /* 1: every answer escalates, 0: none, -1: either */
    } cases[] = {
        {{.rule = ENG_DEFER_CHOW, .threshold = 1e-6f, .window = 4, .hold = 8}, 0},
        {{.rule = ENG_DEFER_CHOW, .threshold = 1.0f, .window = 4, .hold = 8}, 1},
        {{.rule = ENG_DEFER_CHOW, .threshold = 1.0f, .window = 6, .hold = 2}, 1},
        {{.rule = ENG_DEFER_CHOW, .threshold = 0.6f, .window = 2, .hold = 3}, -1},
        {{.rule = ENG_DEFER_DIFF, .threshold = 1.0f, .window = 3, .margin = 1.0f, .hold = 3}, 0},
        {{.rule = ENG_DEFER_DIFF, .threshold = 1.0f, .window = 3, .margin = 0.0f, .hold = 4}, -1},
    };
    int escalated = 0, not_escalated = 0;
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        static result got[2 * N_SPEC];
        size_t n = c == 3 ? 2 * N_SPEC : N_SPEC;  /* all at once; once each prompt twice */
        for (size_t i = 0; i < n; i++)
            submit_ids(casc, ids[i % N_SPEC], n_ids[i % N_SPEC], MAX, &cases[c].cas, &got[i]);
        wait_all(got, (int)n);
        for (size_t i = 0; i < n; i++) {
            const result *g = &got[i], *w = &want_small[i % N_SPEC];
            assert_false(g->bad_utf8);
            assert_true(g->small_tokens >= g->kept);
            if (cases[c].escalate >= 0)
                assert_int_equal(g->escalated, cases[c].escalate);
            if (!g->escalated) {
                not_escalated++;
                assert_same_output(w, g);
                assert_int_equal(g->kept, g->completion_tokens);
            } else {
                escalated++;
                assert_true(g->large_tokens > 0);
            }
            if (cases[c].cas.rule == ENG_DEFER_CHOW && !g->escalated)
                assert_int_equal(g->large_tokens, 0);   /* the model computed nothing */
        }
        expect_kept_then_model(large, ids, n_ids, N_SPEC, MAX, want_small, got, n);
        if (c == 2)   /* window 6, hold 2: four committed tokens before the model came in */
            for (size_t i = 0; i < n; i++)
                assert_true(got[i].kept >= 4 || got[i].completion_tokens < 6);
    }
    printf("cascade: %d answers escalated, %d not\n", escalated, not_escalated);
    eng_engine_stats st;
    eng_engine_stats_get(casc, &st);
    assert_true(st.cascades[ENG_DEFER_CHOW] > 0 && st.cascades[ENG_DEFER_DIFF] > 0);
    assert_true(st.escalations[ENG_DEFER_CHOW] > 0);
    assert_true(st.cascade_checks > 0);
    assert_true(st.cascade_small_tokens >= st.cascade_kept_tokens);
    eng_engine_free(casc);
    assert_int_equal(eng_kvpool_n_free(pool_c), eng_kvpool_n_pages(pool_c));
    eng_kvpool_free(pool_c);

    /* A pool too small for everyone: preempted in either phase, the same answers. */
    casc = engine_cfg(&pool_c, 12, g_target->kv_bytes_per_token * 8, g_target, &cfg);
    static result got[N_SPEC];
    for (size_t i = 0; i < N_SPEC; i++)
        submit_ids(casc, ids[i], n_ids[i], MAX, &cases[3].cas, &got[i]);
    wait_all(got, N_SPEC);
    expect_kept_then_model(large, ids, n_ids, N_SPEC, MAX, want_small, got, N_SPEC);
    for (size_t i = 0; i < N_SPEC; i++)
        if (!got[i].escalated)
            assert_same_output(&want_small[i], &got[i]);
    eng_engine_stats_get(casc, &st);
    printf("cascade under a small pool: %llu preemptions\n", (unsigned long long)st.preemptions);
    assert_true(st.preemptions > 0);
    eng_engine_free(casc);
    assert_int_equal(eng_kvpool_n_free(pool_c), eng_kvpool_n_pages(pool_c));
    eng_kvpool_free(pool_c);

    /* Sampled: it runs to the end, valid text, every page back (the acceptance rule is the
     * speculation's, tested for its distribution above). */
    casc = engine_cfg(&pool_c, 64, 256 * 1024, g_target, &cfg);
    for (size_t i = 0; i < N_SPEC; i++) {
        memset(&got[i], 0, sizeof got[i]);
        eng_request req = {.prompt = ids[i], .n_prompt = n_ids[i], .max_tokens = MAX,
                           .sampling = {.temperature = 0.8f, .top_p = 1, .top_logprobs = -1},
                           .on_event = on_event, .arg = &got[i], .seed = 7 + i,
                           .cascade = cases[3].cas};
        uint64_t id;
        util_err err;
        assert_int_equal(eng_engine_submit(casc, &req, &id, &err), 0);
    }
    wait_all(got, N_SPEC);
    for (size_t i = 0; i < N_SPEC; i++) {
        assert_false(got[i].bad_utf8);
        assert_true(got[i].kept <= got[i].completion_tokens);
    }
    eng_engine_free(casc);
    assert_int_equal(eng_kvpool_n_free(pool_c), eng_kvpool_n_pages(pool_c));
    eng_kvpool_free(pool_c);

    /* Refused: a cascade on an engine without a drafter, and settings out of range. */
    util_err err;
    uint64_t id;
    eng_request req = {.prompt = ids[0], .n_prompt = n_ids[0], .max_tokens = 4,
                       .sampling = {.temperature = 0, .top_p = 1, .top_logprobs = -1},
                       .on_event = on_event, .arg = &got[0],
                       .cascade = {.rule = ENG_DEFER_CHOW, .threshold = 0.5f}};
    assert_int_equal(eng_engine_submit(small, &req, &id, &err), LLMGW_EINVAL);
    assert_non_null(strstr(err.msg, "drafter"));
    casc = engine_cfg(&pool_c, 16, 256 * 1024, g_target, &cfg);
    static const eng_cascade bad[] = {
        {.rule = ENG_DEFER_CHOW, .threshold = 0},
        {.rule = ENG_DEFER_CHOW, .threshold = 1.5f},
        {.rule = ENG_DEFER_CHOW, .threshold = 0.5f, .window = ENG_CASCADE_MAX_WINDOW + 1},
        {.rule = ENG_DEFER_CHOW, .threshold = 0.5f, .hold = ENG_MAX_DRAFT + 1},
        {.rule = ENG_DEFER_DIFF, .threshold = 0.5f, .margin = -0.1f},
        {.rule = ENG_DEFER_DIFF, .threshold = 0.5f, .hold = 0},
        {.rule = (eng_defer)7, .threshold = 0.5f},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        req.cascade = bad[i];
        assert_int_equal(eng_engine_submit(casc, &req, &id, &err), LLMGW_EINVAL);
    }
    eng_engine_free(casc);
    eng_kvpool_free(pool_c);
    for (size_t i = 0; i < N_SPEC; i++)
        free(ids[i]);
    eng_engine_free(large);
    eng_engine_free(small);
    eng_kvpool_free(pool_l);
    eng_kvpool_free(pool_s);
}

/* Two engines on m, each with its own pool of `pages` 256 KiB pages, no prefix sharing: plain,
 * and spec, where drafter drafts up to 4 tokens (never stopping early; with K/V of its own
 * with own_kv) and the scheduler measures whether that pays (draft_always false). */
static void plain_and_measured(eng_kvpool **pool_a, eng_kvpool **pool_b, size_t pages,
                               int max_batch, int n_ctx, const eng_model *m,
                               const eng_model *drafter, bool own_kv, eng_engine **plain,
                               eng_engine **spec)
{
    eng_engine_cfg cfg = {.name = "plain", .max_batch_tokens = max_batch, .max_seqs = 4,
                          .n_ctx = n_ctx, .prefix_pages = -1};
    *plain = engine_cfg(pool_a, pages, 256 * 1024, m, &cfg);
    cfg.name = "spec";
    cfg.drafter = drafter;
    cfg.draft_max = 4;
    cfg.draft_p_min = -1;
    cfg.draft_own_kv = own_kv;
    *spec = engine_cfg(pool_b, pages, 256 * 1024, m, &cfg);
}

/* Left to measure (draft_always false), the scheduler stops drafting when it does not pay: a
 * drafter that costs more per token than the model it drafts for (the F16 file drafting for
 * the Q4_1 one) can only slow decoding down, whatever it accepts, so after the warm-up model
 * drafts come back only on the occasional exploring step. The output is plain decoding's. */
static void drafting_that_cannot_pay_is_switched_off(void **state)
{
    (void)state;
    enum { TOKENS = 160 };
    eng_kvpool *pool_a, *pool_b;
    eng_engine *plain, *spec;
    plain_and_measured(&pool_a, &pool_b, 64, 128, 512, g_model, g_target, false, &plain, &spec);
    const char *prompt = "<|im_start|>user\nWrite a long story about a lighthouse keeper."
                         "<|im_end|>\n<|im_start|>assistant\n";
    result want, got;
    submit(plain, prompt, TOKENS, NULL, &want);
    wait_all(&want, 1);
    submit(spec, prompt, TOKENS, NULL, &got);
    wait_all(&got, 1);
    eng_engine_stats st;
    eng_engine_stats_get(spec, &st);
    printf("decode steps %llu: %llu with model drafts, %llu without\n",
           (unsigned long long)st.steps, (unsigned long long)st.draft_rounds[ENG_DRAFT_MODEL],
           (unsigned long long)st.spec_off_steps);
    assert_true(st.draft_rounds[ENG_DRAFT_MODEL] >= ENG_SPEC_WARM);   /* it did measure */
    assert_true(st.spec_off_steps > 3 * st.draft_rounds[ENG_DRAFT_MODEL]);
    assert_same_output(&want, &got);
    eng_engine_free(spec);
    eng_engine_free(plain);
    assert_int_equal(eng_kvpool_n_free(pool_b), 64);
    eng_kvpool_free(pool_a);
    eng_kvpool_free(pool_b);
}

/* A drafter with K/V of its own reads a prompt only where that pays: once the scheduler has
 * measured what its catching up costs a token, a long prompt whose answer may be three tokens
 * long goes without the drafter (reading it would cost more than drafting could save on three
 * tokens, whichever mode is faster), and the answer is still plain decoding's. */
static void catching_up_that_cannot_pay_is_skipped(void **state)
{
    (void)state;
    eng_kvpool *pool_a, *pool_b;
    eng_engine *plain, *spec;
    plain_and_measured(&pool_a, &pool_b, 128, 512, 1024, g_target, g_model, true, &plain, &spec);
    /* Two warm-ups: the modes measured, and a prompt caught up with once drafting is timed. */
    for (int i = 0; i < 2; i++) {
        result w;
        submit(spec, i == 0 ? "<|im_start|>user\nCount from one to forty.<|im_end|>\n"
                              "<|im_start|>assistant\n"
                            : "<|im_start|>user\nName the planets of the solar system, one a "
                              "line, with a sentence about each.<|im_end|>\n<|im_start|>assistant\n",
               64, NULL, &w);
        wait_all(&w, 1);
    }
    char prompt[4096] = "<|im_start|>user\nHere is a list:";
    for (int i = 0; i < 60; i++)
        snprintf(prompt + strlen(prompt), sizeof prompt - strlen(prompt), " item %d,", i);
    strcat(prompt, " which item comes first?<|im_end|>\n<|im_start|>assistant\n");
    eng_engine_stats st0, st1;
    stats_idle(spec, &st0);
    result want, got;
    submit(plain, prompt, 3, NULL, &want);
    wait_all(&want, 1);
    submit(spec, prompt, 3, NULL, &got);
    wait_all(&got, 1);
    stats_idle(spec, &st1);
    printf("prompt %d tokens: the drafter computed %llu, %llu steps without it\n",
           want.prompt_tokens, (unsigned long long)(st1.drafter_tokens - st0.drafter_tokens),
           (unsigned long long)(st1.spec_off_steps - st0.spec_off_steps));
    assert_true(want.prompt_tokens > 200);
    assert_true(st1.drafter_tokens - st0.drafter_tokens < 16);
    assert_true(st1.spec_off_steps > st0.spec_off_steps);
    assert_same_output(&want, &got);
    eng_engine_free(spec);
    eng_engine_free(plain);
    assert_int_equal(eng_kvpool_n_free(pool_b), 128);
    eng_kvpool_free(pool_a);
    eng_kvpool_free(pool_b);
}

/* A drafter with another vocabulary is refused at load, with the token where they differ: here
 * the Q4_1 file with one token's text changed. */
static void drafter_with_another_vocabulary_is_refused(void **state)
{
    (void)state;
    char src[4096], dst[] = "/tmp/llmgw-vocab-XXXXXX";
    const char *dir = getenv("LLMGW_MODELS");
    snprintf(src, sizeof src, "%s/SmolLM2-135M-Instruct.Q4_1.gguf",
             dir ? dir : LLMGW_SOURCE_DIR "/models");
    FILE *f = fopen(src, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n);
    assert_non_null(buf);
    assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    /* A GGUF string: u64 length, then the bytes. "Ġcapital" is 9 bytes. */
    static const char needle[] = "\x09\0\0\0\0\0\0\0\xc4\xa0" "capital";
    char *hit = memmem(buf, (size_t)n, needle, sizeof needle - 1);
    assert_non_null(hit);
    hit[sizeof needle - 2] = 'L';
    int fd = mkstemp(dst);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, buf, (size_t)n), n);
    close(fd);
    free(buf);
    eng_model *other;
    util_err err;
    assert_int_equal(eng_model_load(&other, dst, NULL, &err), 0);
    eng_kvpool *pool;
    assert_int_equal(eng_kvpool_new(&pool, g_be, 256 * 1024, 16, &err), 0);
    eng_engine_cfg cfg = {.name = "spec", .n_ctx = 256, .drafter = other};
    eng_engine *e = NULL;
    assert_int_equal(eng_engine_new(&e, g_target, pool, g_be, &cfg, &err), LLMGW_EINVAL);
    assert_null(e);
    assert_non_null(strstr(err.msg, "does not share the vocabulary"));
    printf("%s\n", err.msg);
    cfg.drafter = g_model;   /* the real one is accepted */
    assert_int_equal(eng_engine_new(&e, g_target, pool, g_be, &cfg, &err), 0);
    eng_engine_free(e);
    eng_kvpool_free(pool);
    eng_model_free(other);
    unlink(dst);
}

static void preemption_keeps_results(void **state)
{
    (void)state;
    /* 4 sequences of 25-35 tokens and 10 pages of 8 tokens: each fits alone, they cannot all
     * hold their pages at once, so the scheduler must preempt and recompute. */
    eng_kvpool *big, *small;
    eng_engine *ref = engine(&big, 256, 256 * 1024, 1024);
    size_t page = g_model->kv_bytes_per_token * 8;   /* 8 tokens per page */
    eng_engine *e = engine(&small, 10, page, 1024);
    result want[N_PROMPTS], got[N_PROMPTS];
    for (size_t i = 0; i < N_PROMPTS; i++) {
        submit(ref, prompts[i], 20, NULL, &want[i]);
        wait_all(&want[i], 1);
    }
    for (size_t i = 0; i < N_PROMPTS; i++)
        submit(e, prompts[i], 20, NULL, &got[i]);
    wait_all(got, N_PROMPTS);
    eng_engine_stats st;
    eng_engine_stats_get(e, &st);
    fprintf(stderr, "preemptions: %llu\n", (unsigned long long)st.preemptions);
    assert_true(st.preemptions > 0);
    for (size_t i = 0; i < N_PROMPTS; i++) {
        assert_int_equal(got[i].finish, want[i].finish);
        assert_int_equal(got[i].n, want[i].n);
        assert_memory_equal(want[i].tokens, got[i].tokens, (size_t)want[i].n * sizeof(int32_t));
    }
    eng_engine_free(e);
    assert_int_equal(eng_kvpool_n_free(small), 10);   /* every page came back */
    eng_engine_free(ref);
    eng_kvpool_free(small);
    eng_kvpool_free(big);
}

static void stop_string_ends_the_text_before_it(void **state)
{
    (void)state;
    eng_kvpool *pool;
    eng_engine *e = engine(&pool, 64, 256 * 1024, 1024);
    result free_run, stopped;
    submit(e, prompts[2], 40, NULL, &free_run);
    wait_all(&free_run, 1);
    assert_true(free_run.text_len > 20);
    /* Stop at a word in the middle of what the model says anyway (greedy is deterministic). */
    char stop[8];
    size_t at = free_run.text_len / 2;
    memcpy(stop, free_run.text + at, 5);
    stop[5] = '\0';
    submit(e, prompts[2], 40, stop, &stopped);
    wait_all(&stopped, 1);
    assert_int_equal(stopped.finish, ENG_FINISH_STOP);
    char *first = memmem(free_run.text, free_run.text_len, stop, 5);
    assert_non_null(first);
    assert_int_equal(stopped.text_len, (size_t)(first - free_run.text));
    assert_memory_equal(stopped.text, free_run.text, stopped.text_len);
    eng_engine_free(e);
    eng_kvpool_free(pool);
}

static void long_prompt_and_cancel(void **state)
{
    (void)state;
    eng_kvpool *pool;
    eng_engine *e = engine(&pool, 64, 256 * 1024, 64);
    int32_t ids[100];
    for (int i = 0; i < 100; i++)
        ids[i] = 100 + i;
    result r;
    memset(&r, 0, sizeof r);
    eng_request req = {.prompt = ids, .n_prompt = 100, .on_event = on_event, .arg = &r,
                       .sampling = {.temperature = 0, .top_p = 1, .top_logprobs = -1}};
    uint64_t id;
    util_err err;
    assert_int_equal(eng_engine_submit(e, &req, &id, &err), LLMGW_ERANGE);
    assert_contains(err.msg, "maximum context length is 64");
    req.n_prompt = 10;
    req.max_tokens = 0;  /* until the context is full: 54 tokens */
    assert_int_equal(eng_engine_submit(e, &req, &id, &err), 0);
    eng_engine_cancel(e, id);
    wait_all(&r, 1);
    assert_true(r.finish == ENG_FINISH_CANCELLED || r.finish == ENG_FINISH_LENGTH);
    assert_int_equal(eng_kvpool_n_free(pool), 64);
    eng_engine_free(e);
    eng_kvpool_free(pool);
}

/* A system prompt (three pages of 16 tokens and a part) and three questions after it, the
 * third the first again. */
static const char sys[] =
    "<|im_start|>system\nYou are a helpful, careful assistant. Answer in one short sentence, "
    "cite no sources, and never invent facts you are unsure about. If a question is unclear, "
    "say so and ask for the missing detail instead of guessing.<|im_end|>\n<|im_start|>user\n";
static const char *const questions[] = {"Name a primary color.", "What is 2 + 2?",
                                        "Name a primary color."};

/* A shared system prompt: the second and later prompts take its full pages from the prefix
 * table instead of recomputing them, and still decode exactly what a fresh engine decodes. */
static void shared_prefix_pages(void **state)
{
    (void)state;
    char text[3][1024];
    size_t page = g_model->kv_bytes_per_token * 16;  /* 16 tokens per page */
    eng_kvpool *pa, *pb;
    eng_engine *shared = engine_px(&pa, 64, page, 1024, 0);
    eng_engine *fresh = engine_px(&pb, 64, page, 1024, -1);
    result got[3], want[3];
    uint64_t hits_before = 0;
    for (int i = 0; i < 3; i++) {
        snprintf(text[i], sizeof text[i], "%s%s<|im_end|>\n<|im_start|>assistant\n", sys,
                 questions[i]);
        submit(shared, text[i], 16, NULL, &got[i]);
        wait_all(&got[i], 1);
        submit(fresh, text[i], 16, NULL, &want[i]);
        wait_all(&want[i], 1);
        eng_engine_stats st;
        eng_engine_stats_get(shared, &st);
        fprintf(stderr, "prompt %d: prefix hit tokens %llu, table pages %zu\n", i,
                (unsigned long long)(st.prefix_hit_tokens - hits_before), st.prefix_pages);
        if (i == 0)
            assert_int_equal(st.prefix_hit_tokens, 0);
        else
            assert_true(st.prefix_hit_tokens - hits_before >= 3 * 16);  /* the system prompt */
        hits_before = st.prefix_hit_tokens;
        assert_int_equal(got[i].n, want[i].n);
        assert_memory_equal(got[i].tokens, want[i].tokens, (size_t)want[i].n * sizeof(int32_t));
    }
    eng_engine_stats st;
    eng_engine_stats_get(fresh, &st);
    assert_int_equal(st.prefix_hit_tokens, 0);
    eng_engine_free(shared);
    eng_engine_free(fresh);
    assert_int_equal(eng_kvpool_n_free(pa), 64);  /* the table gave its pages back */
    eng_kvpool_free(pa);
    eng_kvpool_free(pb);
}

/* A drafter's own pages are shared too, in a table of its own: a second prompt with the same
 * system prompt has the drafter read only what follows it (catching up costs that much less),
 * the answers stay the model's own, and every page comes back. */
static void drafter_shares_prefix_pages(void **state)
{
    (void)state;
    size_t page = g_target->kv_bytes_per_token * 16;  /* 16 tokens per page, for both models */
    assert_int_equal(g_model->kv_bytes_per_token, g_target->kv_bytes_per_token);
    eng_kvpool *pa, *pb;
    eng_engine_cfg cfg = {.name = "spec", .max_batch_tokens = 256, .max_seqs = 4, .n_ctx = 1024,
                          .prefix_pages = 0, .drafter = g_model, .draft_max = 4,
                          .draft_p_min = -1, .draft_always = true, .draft_own_kv = true};
    eng_engine *spec = engine_cfg(&pa, 96, page, g_target, &cfg);
    eng_engine_cfg plain_cfg = {.name = "plain", .max_batch_tokens = 256, .max_seqs = 4,
                                .n_ctx = 1024, .prefix_pages = -1};
    eng_engine *plain = engine_cfg(&pb, 96, page, g_target, &plain_cfg);
    uint64_t hits = 0, drafted = 0;
    for (int i = 0; i < 3; i++) {
        char text[1024];
        snprintf(text, sizeof text, "%s%s<|im_end|>\n<|im_start|>assistant\n", sys,
                 questions[i]);
        result got, want;
        submit(spec, text, 16, NULL, &got);
        wait_all(&got, 1);
        submit(plain, text, 16, NULL, &want);
        wait_all(&want, 1);
        assert_same_output(&want, &got);
        eng_engine_stats st;
        eng_engine_stats_get(spec, &st);
        fprintf(stderr, "prompt %d (%d tokens): drafter prefix hits %llu, drafter tokens %llu\n",
                i, want.prompt_tokens, (unsigned long long)(st.drafter_prefix_hit_tokens - hits),
                (unsigned long long)(st.drafter_tokens - drafted));
        if (i == 0)
            assert_int_equal(st.drafter_prefix_hit_tokens, 0);
        else {
            assert_true(st.drafter_prefix_hit_tokens - hits >= 3 * 16);   /* the system prompt */
            assert_true(st.drafter_tokens - drafted < (uint64_t)want.prompt_tokens);
        }
        hits = st.drafter_prefix_hit_tokens;
        drafted = st.drafter_tokens;
    }
    eng_engine_free(spec);
    eng_engine_free(plain);
    assert_int_equal(eng_kvpool_n_free(pa), 96);  /* both tables gave their pages back */
    eng_kvpool_free(pa);
    eng_kvpool_free(pb);
}

/* A pool too small to keep every prefix: the table evicts (least recently used) and results
 * stay those of an engine without sharing. */
static void prefix_table_evicts_under_pressure(void **state)
{
    (void)state;
    size_t page = g_model->kv_bytes_per_token * 8;
    eng_kvpool *pa, *pb;
    eng_engine *shared = engine_px(&pa, 12, page, 1024, 6);
    eng_engine *fresh = engine_px(&pb, 64, page, 1024, -1);
    for (int round = 0; round < 2; round++) {
        for (size_t i = 0; i < N_PROMPTS; i++) {
            result got, want;
            submit(shared, prompts[i], 12, NULL, &got);
            wait_all(&got, 1);
            submit(fresh, prompts[i], 12, NULL, &want);
            wait_all(&want, 1);
            assert_int_equal(got.finish, want.finish);
            assert_int_equal(got.n, want.n);
            assert_memory_equal(got.tokens, want.tokens, (size_t)want.n * sizeof(int32_t));
        }
    }
    eng_engine_free(shared);
    eng_engine_free(fresh);
    assert_int_equal(eng_kvpool_n_free(pa), 12);
    eng_kvpool_free(pa);
    eng_kvpool_free(pb);
}

/* The id of the token whose piece is exactly len bytes s, or -1. */
static int32_t token_of(const char *s, size_t len)
{
    const eng_tokenizer *tok = g_model->tok;
    for (int32_t id = 0; id < eng_tokenizer_n_vocab(tok); id++) {
        char piece[64];
        int n = eng_token_piece(tok, id, false, piece, sizeof piece);
        if (n == (int)len && memcmp(piece, s, len) == 0)
            return id;
    }
    return -1;
}

/* SmolLM2 answers this (greedy) with 4-byte emoji of about three tokens each. */
static const char chat_emoji[] =
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    "<|im_end|>\n<|im_start|>user\nWrite one happy emoji.<|im_end|>\n<|im_start|>assistant\n";

/* +100 on a token the model would not say makes greedy decoding say it every time; the bias
 * array is copied (the caller frees it at once). */
static void logit_bias_forces_a_token(void **state)
{
    (void)state;
    eng_kvpool *pool;
    eng_engine *e = engine(&pool, 64, 256 * 1024, 1024);
    int32_t zebra = token_of(" zebra", 6);
    assert_true(zebra >= 0);
    result plain, forced;
    submit(e, prompts[0], 3, NULL, &plain);
    wait_all(&plain, 1);
    assert_int_not_equal(plain.tokens[0], zebra);
    eng_logit_bias *b = malloc(sizeof *b);
    *b = (eng_logit_bias){.token = zebra, .bias = 100};
    submit_bias(e, prompts[0], 3, NULL, b, 1, &forced);
    b->token = plain.tokens[0];  /* borrowed for the call only: later changes do nothing */
    free(b);
    wait_all(&forced, 1);
    assert_int_equal(forced.n, 3);
    for (int i = 0; i < 3; i++)
        assert_int_equal(forced.tokens[i], zebra);
    assert_int_equal(forced.text_len, 18);
    assert_memory_equal(forced.text, " zebra zebra zebra", 18);
    /* -100 on the model's own first choice: it says something else. */
    eng_logit_bias ban = {.token = plain.tokens[0], .bias = -100};
    submit_bias(e, prompts[0], 1, NULL, &ban, 1, &forced);
    wait_all(&forced, 1);
    assert_int_not_equal(forced.tokens[0], plain.tokens[0]);
    eng_engine_free(e);
    eng_kvpool_free(pool);
}

static void logit_bias_is_checked(void **state)
{
    (void)state;
    eng_kvpool *pool;
    eng_engine *e = engine(&pool, 64, 256 * 1024, 1024);
    int32_t ids[] = {100, 200, 300};
    result r;
    memset(&r, 0, sizeof r);
    int n_vocab = g_model->hp.n_vocab;
    eng_logit_bias b[2] = {{.token = 5, .bias = 1}, {.token = n_vocab, .bias = 1}};
    eng_request req = {.prompt = ids, .n_prompt = 3, .max_tokens = 2, .on_event = on_event,
                       .arg = &r, .sampling = {.temperature = 0, .top_p = 1, .top_logprobs = -1,
                                               .logit_bias = b, .n_logit_bias = 2}};
    uint64_t id;
    util_err err;
    char want[128];
    assert_int_equal(eng_engine_submit(e, &req, &id, &err), LLMGW_EINVAL);
    snprintf(want, sizeof want,
             "logit_bias: token id %d is outside the vocabulary (%d tokens)", n_vocab, n_vocab);
    assert_string_equal(err.msg, want);
    b[1].token = -1;
    assert_int_equal(eng_engine_submit(e, &req, &id, &err), LLMGW_EINVAL);
    assert_contains(err.msg, "token id -1 is outside the vocabulary");
    b[1] = (eng_logit_bias){.token = 7, .bias = 100.5f};
    assert_int_equal(eng_engine_submit(e, &req, &id, &err), LLMGW_EINVAL);
    assert_contains(err.msg, "outside [-100, 100]");
    b[1].bias = NAN;
    assert_int_equal(eng_engine_submit(e, &req, &id, &err), LLMGW_EINVAL);
    eng_engine_free(e);                 /* no callback ran for the refused ones */
    assert_false(r.done);
    assert_int_equal(r.n_events, 0);
    eng_kvpool_free(pool);
}

/* A first token that is the first byte of a 4-byte character yields no text (held_append of
 * zero bytes into an empty buffer): the answer is empty and valid, and every longer answer is
 * valid UTF-8 in each event, the forced lone lead bytes each becoming one U+FFFD once the next
 * token shows it can never complete, and the last one dropped. */
static void zero_byte_first_token(void **state)
{
    (void)state;
    eng_kvpool *pool;
    eng_engine *e = engine(&pool, 64, 256 * 1024, 1024);
    int32_t f0 = token_of("\xf0", 1);
    assert_true(f0 >= 0);
    eng_logit_bias b = {.token = f0, .bias = 100};
    for (int n = 1; n <= 6; n++) {
        result r;
        submit_bias(e, chat_emoji, n, NULL, &b, 1, &r);
        wait_all(&r, 1);
        assert_int_equal(r.finish, ENG_FINISH_LENGTH);
        assert_int_equal(r.n, n);
        assert_int_equal(r.tokens[0], f0);
        assert_false(r.bad_utf8);
        assert_int_equal(r.text_len, 3 * (size_t)(n - 1));
        for (int i = 0; i < n - 1; i++)
            assert_memory_equal(r.text + 3 * i, "\xef\xbf\xbd", 3);
    }
    /* A stop string that starts inside a character (the gateway sends none: it takes valid
     * UTF-8 only) still releases whole characters: matched, it cuts before the character. */
    result r;
    submit_bias(e, chat_emoji, 6, "\xbd!", &b, 1, &r);  /* a tail that could grow into it */
    wait_all(&r, 1);
    assert_false(r.bad_utf8);
    assert_int_equal(r.text_len, 15);
    submit_bias(e, chat_emoji, 6, "\xbf\xbd", &b, 1, &r);
    wait_all(&r, 1);
    assert_int_equal(r.finish, ENG_FINISH_STOP);
    assert_int_equal(r.text_len, 0);
    assert_false(r.bad_utf8);
    eng_engine_free(e);
    eng_kvpool_free(pool);
}

/* What the model itself says, cut after 1..N tokens (some cuts inside an emoji, the first
 * after a token of no whole character): every answer is valid UTF-8 in every event and a
 * prefix of the longer ones. */
static void cut_answers_are_valid_prefixes(void **state)
{
    (void)state;
    enum { N = 10 };
    eng_kvpool *pool;
    eng_engine *e = engine(&pool, 64, 256 * 1024, 1024);
    static result r[N + 1];
    for (int n = 1; n <= N; n++) {
        submit(e, chat_emoji, n, NULL, &r[n]);
        wait_all(&r[n], 1);
        assert_int_equal(r[n].n, n);
        assert_false(r[n].bad_utf8);
        assert_true(utf8_valid(r[n].text, r[n].text_len));
    }
    assert_int_equal(r[1].text_len, 0);  /* the first token is part of an emoji */
    size_t pieces = 0;
    int cut_inside = 0;
    for (int n = 1; n <= N; n++) {
        char piece[64];
        int k = eng_token_piece(g_model->tok, r[N].tokens[n - 1], false, piece, sizeof piece);
        assert_true(k >= 0 && k <= (int)sizeof piece);
        pieces += (size_t)k;
        cut_inside += r[n].text_len < pieces;  /* an incomplete tail was dropped */
        if (n < N) {
            assert_true(r[n].text_len <= r[n + 1].text_len);
            assert_memory_equal(r[n].text, r[n + 1].text, r[n].text_len);
        }
    }
    assert_true(cut_inside >= 2);
    eng_engine_free(e);
    eng_kvpool_free(pool);
}

/* Structured output: every answer that ends on its own is JSON with what the schema requires,
 * greedy and sampled, and speculation under the grammar (prompt lookup proposing from the
 * prompt's own JSON, and the draft model from its copy of the grammar state) changes no greedy
 * token: drafts the grammar forbids are rejected. */
static void grammar_constrains_every_answer(void **state)
{
    (void)state;
    static const char schema[] =
        "{\"type\":\"object\",\"additionalProperties\":false,\"required\":[\"name\",\"age\","
        "\"pets\"],\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":20},"
        "\"age\":{\"type\":\"integer\"},\"pets\":{\"type\":\"array\",\"maxItems\":3,"
        "\"items\":{\"enum\":[\"cat\",\"dog\",\"fish\"]}}}}";
    static const char prompt[] =
        "<|im_start|>user\nExample: {\"name\": \"Bob\", \"age\": 30, \"pets\": [\"dog\"]}. "
        "Describe another person the same way.<|im_end|>\n<|im_start|>assistant\n";
    util_err err;
    eng_gvocab *voc;
    eng_grammar *gram;
    assert_int_equal(eng_gvocab_new(&voc, g_model->tok, &err), 0);
    assert_int_equal(eng_grammar_compile(&gram, voc, schema, strlen(schema), &err), 0);
    int32_t *ids = NULL;
    size_t n = 0, cap = 0;
    assert_int_equal(eng_tokenize(g_model->tok, prompt, strlen(prompt), false, true, &ids, &n,
                                  &cap), 0);
    eng_kvpool *pool_a, *pool_b;
    eng_engine_cfg plain_cfg = {.name = "plain", .max_batch_tokens = 64, .max_seqs = 8,
                                .n_ctx = 512, .prefix_pages = -1};
    eng_engine *plain = engine_cfg(&pool_a, 128, 256 * 1024, g_model, &plain_cfg);
    eng_engine_cfg spec_cfg = plain_cfg;
    spec_cfg.name = "spec";
    spec_cfg.ngram_draft = 4;
    spec_cfg.drafter = g_model;
    spec_cfg.draft_max = 4;
    spec_cfg.draft_p_min = -1;
    spec_cfg.draft_always = true;
    eng_engine *spec = engine_cfg(&pool_b, 128, 256 * 1024, g_model, &spec_cfg);
    enum { SEEDS = 4 };
    static result r[2 * (SEEDS + 1)];
    for (int k = 0; k < 2; k++) {
        eng_engine *e = k ? spec : plain;
        for (int i = 0; i <= SEEDS; i++) {
            result *out = &r[k * (SEEDS + 1) + i];
            memset(out, 0, sizeof *out);
            eng_request req = {.prompt = ids, .n_prompt = n, .max_tokens = 64,
                               .sampling = {.temperature = i == 0 ? 0.0f : 1.0f, .top_p = 1,
                                            .top_logprobs = -1},
                               .grammar = gram, .on_event = on_event, .arg = out,
                               .seed = 100 + (uint64_t)i, .ignore_eos = i == 1};
            uint64_t id;
            assert_int_equal(eng_engine_submit(e, &req, &id, &err), 0);
        }
        wait_all(&r[k * (SEEDS + 1)], SEEDS + 1);
    }
    eng_grammar_unref(gram);   /* the engines hold their own references while they run */
    assert_same_output(&r[0], &r[SEEDS + 1]);
    int whole = 0;
    for (int i = 0; i < 2 * (SEEDS + 1); i++) {
        assert_int_not_equal(r[i].finish, ENG_FINISH_ERROR);
        if (r[i].finish != ENG_FINISH_STOP)
            continue;
        cJSON *doc = cJSON_ParseWithLength(r[i].text, r[i].text_len);
        if (doc == NULL)
            fail_msg("answer %d is not JSON: %.*s", i, (int)r[i].text_len, r[i].text);
        assert_true(cJSON_IsString(cJSON_GetObjectItemCaseSensitive(doc, "name")));
        assert_true(cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(doc, "age")));
        assert_true(cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(doc, "pets")));
        assert_int_equal(cJSON_GetArraySize(doc), 3);
        cJSON_Delete(doc);
        whole++;
    }
    printf("greedy: %.*s\n%d of %d answers whole (the rest cut by max_tokens)\n",
           (int)r[0].text_len, r[0].text, whole, 2 * (SEEDS + 1));
    assert_true(whole >= SEEDS);
    eng_engine_stats st;
    eng_engine_stats_get(spec, &st);
    assert_true(st.draft_tokens[ENG_DRAFT_NGRAM] + st.draft_tokens[ENG_DRAFT_MODEL] > 0);
    eng_engine_free(spec);
    eng_engine_free(plain);
    eng_kvpool_free(pool_b);
    eng_kvpool_free(pool_a);
    eng_gvocab_free(voc);
    free(ids);
}

/* Whether name matches one of the comma-separated globs of list (if_none when list is NULL). */
static bool listed(const char *list, const char *name, bool if_none)
{
    if (list == NULL)
        return if_none;
    char buf[512];
    snprintf(buf, sizeof buf, "%s", list);
    for (char *save = NULL, *g = strtok_r(buf, ",", &save); g != NULL;
         g = strtok_r(NULL, ",", &save))
        if (fnmatch(g, name, 0) == 0)
            return true;
    return false;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(together_equals_alone),
        cmocka_unit_test(speculation_is_invisible),
        cmocka_unit_test(draft_model_is_invisible),
        cmocka_unit_test(q8_cache_rolls_back_and_shares),
        cmocka_unit_test(draft_model_sampling_keeps_distribution),
        cmocka_unit_test(drafting_that_cannot_pay_is_switched_off),
        cmocka_unit_test(catching_up_that_cannot_pay_is_skipped),
        cmocka_unit_test(drafter_shares_prefix_pages),
        cmocka_unit_test(drafter_with_another_vocabulary_is_refused),
        cmocka_unit_test(cascade_keeps_or_continues),
        cmocka_unit_test(preemption_keeps_results),
        cmocka_unit_test(stop_string_ends_the_text_before_it),
        cmocka_unit_test(long_prompt_and_cancel),
        cmocka_unit_test(shared_prefix_pages),
        cmocka_unit_test(prefix_table_evicts_under_pressure),
        cmocka_unit_test(logit_bias_forces_a_token),
        cmocka_unit_test(logit_bias_is_checked),
        cmocka_unit_test(zero_byte_first_token),
        cmocka_unit_test(cut_answers_are_valid_prefixes),
        cmocka_unit_test(grammar_constrains_every_answer),
    };
    /* Tests by name, comma-separated globs: only these, or all but these (so ctest can run
     * the long cases as tests of their own: tests/unit/CMakeLists.txt). */
    static struct CMUnitTest run[sizeof tests / sizeof *tests];
    size_t n = 0;
    for (size_t i = 0; i < sizeof tests / sizeof *tests; i++)
        if (listed(getenv("LLMGW_TEST_FILTER"), tests[i].name, true) &&
            !listed(getenv("LLMGW_TEST_SKIP"), tests[i].name, false))
            run[n++] = tests[i];
    return _cmocka_run_group_tests("engine/sched", run, n, setup, teardown);
}
