/* tests/unit/engine/encoder/test_encoder.c: the embedding worker (engine/encoder/encoder.h) with
 * the real all-MiniLM-L6-v2 ($LLMGW_MODELS, default <repo>/models; the tests fail without it):
 * texts submitted within the window form batches, done() runs once per text on the worker thread
 * with the same vector a direct eng_bert_encode gives, a full queue (or a wait past max_wait_us)
 * says LLMGW_EBUSY, stop drains what is queued, the adaptive window lets a lone text go at
 * once, and `nice` lowers the worker and its kernel threads (only them). */
#include "engine/encoder/bert_forward.h"
#include "engine/encoder/encoder.h"

#include "tests/unit/unit.h"

#include <dirent.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

static eng_bert *g_bert;

#define N_TEXTS 20
static const char *const TEXTS[N_TEXTS] = {
    "How do I learn C?", "What is the capital of France?", "Café naïve Ångström",
    "这是一个中文句子。", "", "Hello world!", "Why is the sky blue?", "best pizza in town",
    "How to cook rice", "emoji 😀 test", "a", "The quick brown fox", "Is it raining?",
    "What is a semantic cache?", "[MASK] token", "Numbers 1 2 3", "UPPER lower MiXeD",
    "tabs\tand\nnewlines", "punctuation!!!???", "last one",
};

typedef struct result {
    atomic_int calls;
    int status, dim, n_tokens;
    float vec[384];
    double token_cos;  /* the tokens' pooled mean against vec */
    int nice;          /* the calling thread's nice value */
    pthread_t thread;
} result;

static result g_res[N_TEXTS];
static atomic_int g_done;

static void on_done(void *user, int status, const eng_encoded *x)
{
    result *r = user;
    r->status = status;
    r->dim = x != NULL ? x->dim : 0;
    r->n_tokens = x != NULL ? x->n_tokens : 0;
    r->thread = pthread_self();
    if (x != NULL && x->dim == 384) {
        memcpy(r->vec, x->vec, sizeof r->vec);
        /* the pooled vector is the tokens' mean, normalised */
        double mean[384] = {0}, norm = 0, dot = 0;
        for (int t = 0; t < x->n_tokens; t++)
            for (int d = 0; d < 384; d++)
                mean[d] += x->tokens[(size_t)t * 384 + d];
        for (int d = 0; d < 384; d++)
            norm += mean[d] * mean[d];
        for (int d = 0; d < 384; d++)
            dot += mean[d] / sqrt(norm) * x->vec[d];
        r->token_cos = dot;
    }
    r->nice = getpriority(PRIO_PROCESS, 0);   /* Linux: this thread's */
    atomic_fetch_add(&r->calls, 1);
    atomic_fetch_add(&g_done, 1);
}

static void reset(void)
{
    memset(g_res, 0, sizeof g_res);
    atomic_store(&g_done, 0);
}

static void wait_done(int n)
{
    for (int i = 0; i < 20000 && atomic_load(&g_done) < n; i++) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    assert_int_equal(atomic_load(&g_done), n);
}

static int setup(void **state)
{
    (void)state;
    char dir[4096];
    const char *env = getenv("LLMGW_MODELS");
    snprintf(dir, sizeof dir, "%s/all-MiniLM-L6-v2", env ? env : LLMGW_SOURCE_DIR "/models");
    util_err err = {0};
    if (eng_bert_load(&g_bert, dir, NULL, ENG_BERT_AUTO, &err) != 0) {
        fprintf(stderr, "test_encoder: FAILED to load the model (scripts/fetch-models fetches "
                        "it; $LLMGW_MODELS overrides the folder): %s\n", err.msg);
        return -1;
    }
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    eng_bert_free(g_bert);
    return 0;
}

static void batches_form(void **state)
{
    (void)state;
    reset();
    eng_encoder *e = NULL;
    util_err err = {0};
    eng_encoder_cfg cfg = {.threads = 2, .window_us = 200000, .max_batch = 8};
    assert_int_equal(eng_encoder_start(&e, g_bert, &cfg, &err), 0);
    for (int i = 0; i < N_TEXTS; i++)
        assert_int_equal(eng_encoder_submit(e, TEXTS[i], strlen(TEXTS[i]), on_done, &g_res[i]),
                         0);
    wait_done(N_TEXTS);
    eng_encoder_stats st;
    eng_encoder_get_stats(e, &st);
    printf("[ INFO     ] %d texts in %llu batches, %llu tokens\n", N_TEXTS,
           (unsigned long long)st.batches, (unsigned long long)st.tokens);
    assert_int_equal(st.texts, N_TEXTS);
    assert_int_equal(st.batches, 3);  /* 8 + 8 + 4: the window outlasts the submits */
    assert_int_equal(st.queue_depth, 0);
    eng_encoder_stop(e);

    /* Every done() ran once, on the worker, with what a direct encode gives. */
    eng_bert_ctx *c = NULL;
    assert_int_equal(eng_bert_ctx_new(&c, g_bert, 1, &err), 0);
    uint64_t tokens = 0;
    for (int i = 0; i < N_TEXTS; i++) {
        float want[384];
        int ntok;
        size_t len = strlen(TEXTS[i]);
        assert_int_equal(eng_bert_encode(c, &TEXTS[i], &len, 1, want, &ntok, &err), 0);
        assert_int_equal(atomic_load(&g_res[i].calls), 1);
        assert_int_equal(g_res[i].status, 0);
        assert_int_equal(g_res[i].dim, 384);
        assert_int_equal(g_res[i].n_tokens, ntok);
        assert_true(g_res[i].token_cos > 0.99999);
        assert_false(pthread_equal(g_res[i].thread, pthread_self()));
        for (int d = 0; d < 384; d++)
            assert_double_near(g_res[i].vec[d], want[d], 1e-5);
        tokens += (uint64_t)ntok;
    }
    assert_int_equal(st.tokens, tokens);
    eng_bert_ctx_free(c);
}

static void window_closes_a_small_batch(void **state)
{
    (void)state;
    reset();
    eng_encoder *e = NULL;
    util_err err = {0};
    eng_encoder_cfg cfg = {.threads = 1, .window_us = 1000};
    assert_int_equal(eng_encoder_start(&e, g_bert, &cfg, &err), 0);
    assert_int_equal(eng_encoder_submit(e, "alone", 5, on_done, &g_res[0]), 0);
    wait_done(1);  /* well before any stop: the window, not a full batch, released it */
    assert_int_equal(g_res[0].status, 0);
    assert_int_equal(g_res[0].n_tokens, 3);
    eng_encoder_stop(e);
}

static void busy_when_full_and_stop_drains(void **state)
{
    (void)state;
    reset();
    eng_encoder *e = NULL;
    util_err err = {0};
    /* A 5 s window and batches larger than the queue: nothing leaves until stop. */
    eng_encoder_cfg cfg = {.threads = 1, .window_us = 5000000, .max_batch = 64,
                           .max_queue = 6};
    assert_int_equal(eng_encoder_start(&e, g_bert, &cfg, &err), 0);
    for (int i = 0; i < 6; i++)
        assert_int_equal(eng_encoder_submit(e, TEXTS[i], strlen(TEXTS[i]), on_done, &g_res[i]),
                         0);
    assert_int_equal(eng_encoder_submit(e, "x", 1, on_done, &g_res[6]), LLMGW_EBUSY);
    eng_encoder_stats st;
    eng_encoder_get_stats(e, &st);
    assert_int_equal(st.queue_depth, 6);
    assert_int_equal(atomic_load(&g_done), 0);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    eng_encoder_stop(e);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    assert_true(t1.tv_sec - t0.tv_sec < 4);  /* stop did not sit out the window */
    assert_int_equal(atomic_load(&g_done), 6);
    for (int i = 0; i < 6; i++) {
        assert_int_equal(atomic_load(&g_res[i].calls), 1);
        assert_int_equal(g_res[i].status, 0);
    }
    assert_int_equal(atomic_load(&g_res[6].calls), 0);  /* refused: done() never runs */
}

/* max_wait_us: once a text's cost is measured, a text that would wait longer than the limit
 * is refused (done() never runs); under a generous limit the same texts queue as usual. */
static void busy_when_the_wait_would_be_too_long(void **state)
{
    (void)state;
    for (int generous = 0; generous < 2; generous++) {
        reset();
        eng_encoder *e = NULL;
        util_err err = {0};
        eng_encoder_cfg cfg = {.threads = 1, .window_us = 1000, .max_batch = 8,
                               .max_wait_us = generous ? 10000000 : 1};
        assert_int_equal(eng_encoder_start(&e, g_bert, &cfg, &err), 0);
        /* Nothing measured yet: the first text is taken whatever the limit. */
        assert_int_equal(eng_encoder_submit(e, TEXTS[0], strlen(TEXTS[0]), on_done, &g_res[0]),
                         0);
        wait_done(1);
        /* A text costs far more than 1 us, far less than 10 s. */
        for (int i = 1; i < 5; i++)
            assert_int_equal(eng_encoder_submit(e, TEXTS[i], strlen(TEXTS[i]), on_done,
                                                &g_res[i]), generous ? 0 : LLMGW_EBUSY);
        eng_encoder_stop(e);
        assert_int_equal(atomic_load(&g_done), generous ? 5 : 1);
        for (int i = 1; i < 5; i++)
            assert_int_equal(atomic_load(&g_res[i].calls), generous ? 1 : 0);
    }
}

/* Adaptive: a lone text leaves at once even with a 5 s window; texts that come close together
 * (each within a window of the one before) still wait for company, here until max_batch. */
static void adaptive_window(void **state)
{
    (void)state;
    reset();
    eng_encoder *e = NULL;
    util_err err = {0};
    eng_encoder_cfg cfg = {.threads = 2, .window_us = 5000000, .adaptive = true, .max_batch = 3,
                           .spin_us = 20000};
    assert_int_equal(eng_encoder_start(&e, g_bert, &cfg, &err), 0);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    assert_int_equal(eng_encoder_submit(e, TEXTS[0], strlen(TEXTS[0]), on_done, &g_res[0]), 0);
    wait_done(1);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    assert_true(t1.tv_sec - t0.tv_sec < 4);  /* it did not sit out the window */
    for (int i = 1; i < 4; i++)
        assert_int_equal(eng_encoder_submit(e, TEXTS[i], strlen(TEXTS[i]), on_done, &g_res[i]),
                         0);
    wait_done(4);
    clock_gettime(CLOCK_MONOTONIC, &t0);
    assert_true(t0.tv_sec - t1.tv_sec < 4);  /* released by the full batch, not the window */
    eng_encoder_stats st;
    eng_encoder_get_stats(e, &st);
    assert_int_equal(st.texts, 4);
    assert_int_equal(st.batches, 2);  /* the lone text, then the three together */
    eng_encoder_stop(e);
    for (int i = 0; i < 4; i++)
        assert_int_equal(g_res[i].status, 0);
}

/* Several threads submitting at once. */
typedef struct submitter {
    eng_encoder *e;
    int first;
} submitter;

static void *submit_some(void *arg)
{
    submitter *s = arg;
    for (int i = s->first; i < N_TEXTS; i += 4)
        while (eng_encoder_submit(s->e, TEXTS[i], strlen(TEXTS[i]), on_done, &g_res[i]) != 0) {
            struct timespec ts = {0, 100000};
            nanosleep(&ts, NULL);
        }
    return NULL;
}

static void concurrent_submitters(void **state)
{
    (void)state;
    reset();
    eng_encoder *e = NULL;
    util_err err = {0};
    eng_encoder_cfg cfg = {.threads = 2, .window_us = 300, .max_batch = 4, .max_queue = 5};
    assert_int_equal(eng_encoder_start(&e, g_bert, &cfg, &err), 0);
    pthread_t th[4];
    submitter s[4];
    for (int i = 0; i < 4; i++) {
        s[i] = (submitter){e, i};
        assert_int_equal(pthread_create(&th[i], NULL, submit_some, &s[i]), 0);
    }
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    eng_encoder_stop(e);
    assert_int_equal(atomic_load(&g_done), N_TEXTS);
    for (int i = 0; i < N_TEXTS; i++)
        assert_int_equal(atomic_load(&g_res[i].calls), 1);
}

/* How many of this process's threads named `name` run at nice value `nice` (/proc/self/task:
 * comm, and field 19 of stat, after the parenthesised name). */
static int threads_at(const char *name, int nice)
{
    DIR *d = opendir("/proc/self/task");
    assert_non_null(d);
    int n = 0;
    for (struct dirent *t; (t = readdir(d)) != NULL;) {
        if (t->d_name[0] == '.')
            continue;
        char path[300], comm[64] = "", stat[1024] = "";
        snprintf(path, sizeof path, "/proc/self/task/%s/comm", t->d_name);
        FILE *f = fopen(path, "r");
        if (f == NULL)
            continue;
        if (fgets(comm, sizeof comm, f) == NULL)
            comm[0] = '\0';
        fclose(f);
        comm[strcspn(comm, "\n")] = '\0';
        snprintf(path, sizeof path, "/proc/self/task/%s/stat", t->d_name);
        f = fopen(path, "r");
        if (f == NULL)
            continue;
        if (fgets(stat, sizeof stat, f) == NULL)
            stat[0] = '\0';
        fclose(f);
        const char *p = strrchr(stat, ')');
        int field = 2, v = 0;
        for (; p != NULL && *p != '\0' && field < 19; p++)
            if (*p == ' ')
                field++;
        if (p != NULL && sscanf(p, "%d", &v) == 1 && strcmp(comm, name) == 0 && v == nice)
            n++;
    }
    closedir(d);
    return n;
}

static void nice_lowers_its_threads(void **state)
{
    (void)state;
    reset();
    eng_encoder *e = NULL;
    util_err err = {0};
    int mine = getpriority(PRIO_PROCESS, 0);
    eng_encoder_cfg cfg = {.threads = 2, .nice = mine + 7 > 19 ? 19 : mine + 7};
    assert_int_equal(eng_encoder_start(&e, g_bert, &cfg, &err), 0);
    assert_int_equal(eng_encoder_submit(e, TEXTS[0], strlen(TEXTS[0]), on_done, &g_res[0]), 0);
    wait_done(1);
    assert_int_equal(g_res[0].status, 0);
    assert_int_equal(g_res[0].nice, cfg.nice);            /* done() runs on the worker */
    assert_int_equal(threads_at("encoder", cfg.nice), 1);
    assert_int_equal(threads_at("kern-1", cfg.nice), 1);  /* its kernel thread inherited it */
    assert_int_equal(getpriority(PRIO_PROCESS, 0), mine); /* the caller kept its own */
    eng_encoder_stop(e);
}

static void bad_config(void **state)
{
    (void)state;
    eng_encoder *e = NULL;
    util_err err = {0};
    eng_encoder_cfg cfg = {.max_batch = -1};
    assert_int_equal(eng_encoder_start(&e, g_bert, &cfg, &err), LLMGW_EINVAL);
    assert_null(e);
    assert_contains(err.msg, "max_batch -1");
    cfg = (eng_encoder_cfg){.spin_us = -5};
    assert_int_equal(eng_encoder_start(&e, g_bert, &cfg, &err), LLMGW_EINVAL);
    assert_contains(err.msg, "spin_us -5");
    cfg = (eng_encoder_cfg){.max_wait_us = -1};
    assert_int_equal(eng_encoder_start(&e, g_bert, &cfg, &err), LLMGW_EINVAL);
    assert_contains(err.msg, "max_wait_us -1");
    cfg = (eng_encoder_cfg){.nice = 20};
    assert_int_equal(eng_encoder_start(&e, g_bert, &cfg, &err), LLMGW_EINVAL);
    assert_contains(err.msg, "nice 20");
    eng_encoder_stop(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(batches_form),
        cmocka_unit_test(window_closes_a_small_batch),
        cmocka_unit_test(busy_when_full_and_stop_drains),
        cmocka_unit_test(busy_when_the_wait_would_be_too_long),
        cmocka_unit_test(adaptive_window),
        cmocka_unit_test(concurrent_submitters),
        cmocka_unit_test(nice_lowers_its_threads),
        cmocka_unit_test(bad_config),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
