/* bench/structured.c: what constrained decoding (engine/text/grammar.h) costs on SmolLM2, in one
 * run on this machine. For each grammar (json_object; a schema with strings of bounded length,
 * enums, a date, an array; a required tool call) an engine instance answers the same chat
 * prompts greedily, constrained, and then unconstrained for exactly as many tokens (ignore_eos,
 * max_tokens = the constrained answer's length): the reference. Printed per grammar: decode
 * tokens/s both ways and their ratio, and the mask alone: each constrained answer's tokens
 * replayed through eng_grammar_allowed (mean and worst microseconds a token), as a share of the
 * unconstrained decode step.
 *
 *   bench/structured [--models DIR] [--threads N] [--prompts N] [--max-tokens N] */
#include "engine/serve/engine.h"
#include "engine/text/grammar.h"
#include "engine/text/tools.h"
#include "kernels/device.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_TOK 512

typedef struct run {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int32_t tokens[MAX_TOK];
    int n;
    bool done;
} run;

static void on_event(void *arg, const eng_event *ev)
{
    run *r = arg;
    pthread_mutex_lock(&r->mu);
    if (ev->kind == ENG_EV_TOKEN && r->n < MAX_TOK)
        r->tokens[r->n++] = ev->pick->token;
    if (ev->kind == ENG_EV_DONE) {
        r->done = true;
        pthread_cond_signal(&r->cv);
    }
    pthread_mutex_unlock(&r->mu);
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* One greedy answer; returns its wall time, its tokens in r. */
static double answer(eng_engine *e, const int32_t *ids, size_t n, eng_grammar *g, int max_tokens,
                     bool ignore_eos, run *r)
{
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    r->n = 0;
    r->done = false;
    eng_request req = {.prompt = ids, .n_prompt = n, .max_tokens = max_tokens,
                       .sampling = {.temperature = 0, .top_p = 1, .top_logprobs = -1},
                       .grammar = g, .ignore_eos = ignore_eos, .on_event = on_event, .arg = r};
    uint64_t id;
    util_err err = {0};
    double t0 = now_s();
    if (eng_engine_submit(e, &req, &id, &err) != 0) {
        fprintf(stderr, "submit: %s\n", err.msg);
        exit(1);
    }
    pthread_mutex_lock(&r->mu);
    while (!r->done)
        pthread_cond_wait(&r->cv, &r->mu);
    pthread_mutex_unlock(&r->mu);
    double t = now_s() - t0;
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    return t;
}

static const char *const person =
    "{\"type\":\"object\",\"additionalProperties\":false,\"required\":[\"name\",\"age\","
    "\"city\",\"pets\",\"mood\",\"born\"],\"properties\":{\"name\":{\"type\":\"string\","
    "\"maxLength\":40},\"age\":{\"type\":\"integer\"},\"city\":{\"type\":\"string\"},"
    "\"pets\":{\"type\":\"array\",\"maxItems\":3,\"items\":{\"type\":\"string\"}},"
    "\"mood\":{\"enum\":[\"happy\",\"sad\",\"calm\"]},\"born\":{\"type\":\"string\","
    "\"format\":\"date\"}}}";

static const char *const questions[] = {
    "Describe a fictional person as JSON.",
    "Give me a JSON object describing your favourite city.",
    "What is the weather like in Paris? Answer in JSON.",
    "List three fruits and their colours as JSON.",
    "Invent a character for a story and describe them in JSON.",
    "Describe a cat as a JSON object.",
    "What would a JSON record of a library book look like?",
    "Summarise the plot of a heist movie as JSON.",
};

int main(int argc, char **argv)
{
    const char *models = "models";
    int threads = 2, n_prompts = 6, max_tokens = 160;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--models")) models = argv[i + 1];
        else if (!strcmp(argv[i], "--threads")) threads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--prompts")) n_prompts = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--max-tokens")) max_tokens = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "usage: bench_structured [--models DIR] [--threads N] "
                            "[--prompts N] [--max-tokens N]\n");
            return 2;
        }
    }
    if (n_prompts > (int)(sizeof questions / sizeof *questions))
        n_prompts = (int)(sizeof questions / sizeof *questions);
    if (max_tokens > MAX_TOK)
        max_tokens = MAX_TOK;
    char path[4096];
    snprintf(path, sizeof path, "%s/SmolLM2-135M-Instruct.Q4_1.gguf", models);
    util_err err = {0};
    eng_model *m;
    kern_backend *be;
    eng_kvpool *pool;
    eng_engine *e;
    eng_gvocab *voc;
    eng_engine_cfg cfg = {.name = "bench", .max_seqs = 4, .n_ctx = 2048, .prefix_pages = -1};
    if (eng_model_load(&m, path, NULL, &err) != 0 ||
        kern_backend_open("cpu", threads, &be, &err) != 0 ||
        eng_kvpool_new(&pool, be, 256 * 1024, 128, &err) != 0 ||
        eng_engine_new(&e, m, pool, be, &cfg, &err) != 0 || eng_gvocab_new(&voc, m->tok, &err)) {
        fprintf(stderr, "bench_structured: %s\n", err.msg);
        return 1;
    }
    eng_grammar *grammars[3];
    static const char weather[] =
        "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"},\"unit\":{\"enum\":"
        "[\"celsius\",\"fahrenheit\"]}},\"required\":[\"city\",\"unit\"]}";
    eng_tool_spec tools[] = {{"get_weather", weather, sizeof weather - 1}, {"get_time", NULL, 0}};
    if (eng_grammar_compile(&grammars[0], voc, NULL, 0, &err) != 0 ||
        eng_grammar_compile(&grammars[1], voc, person, strlen(person), &err) != 0 ||
        eng_grammar_compile_tools(&grammars[2], voc, tools, 2, eng_tools_format(m->chat), true,
                                  &err) != 0) {
        fprintf(stderr, "bench_structured: %s\n", err.msg);
        return 1;
    }
    static const char *const names[] = {"json_object", "schema (person)", "tool call (required)"};
    uint32_t *allow = malloc((size_t)(m->hp.n_vocab + 31) / 32 * sizeof *allow);
    printf("SmolLM2-135M-Instruct Q4_1, %d threads, greedy, %d prompts, max_tokens %d\n\n",
           threads, n_prompts, max_tokens);
    printf("| grammar | tokens | plain t/s | constrained t/s | ratio | mask us/token (mean) | "
           "mask us (worst) | mask / plain step |\n| --- | ---: | ---: | ---: | ---: | ---: | "
           "---: | ---: |\n");
    static run r;
    for (int k = 0; k < 3; k++) {
        double t_con = 0, t_plain = 0, mask_sum = 0, mask_worst = 0;
        long toks = 0, masks = 0;
        for (int p = 0; p < n_prompts; p++) {
            eng_chat_msg msg = {"user", questions[p], strlen(questions[p])};
            char *text;
            size_t len;
            eng_chat_render(m->chat, &msg, 1, m->default_system, true, &text, &len);
            int32_t *ids = NULL;
            size_t n = 0, cap = 0;
            eng_tokenize(m->tok, text, len, eng_tokenizer_add_bos(m->tok), true, &ids, &n, &cap);
            free(text);
            answer(e, ids, n, NULL, 4, false, &r);   /* warm the caches */
            t_con += answer(e, ids, n, grammars[k], max_tokens, false, &r);
            int got = r.n;
            toks += got;
            /* The mask alone, along the constrained answer. */
            eng_gstate st;
            eng_gstate_init(grammars[k], &st);
            static int32_t seen[MAX_TOK];
            memcpy(seen, r.tokens, (size_t)got * sizeof *seen);
            for (int i = 0; i < got; i++) {
                double t0 = now_s();
                eng_grammar_allowed(grammars[k], &st, allow);
                double us = (now_s() - t0) * 1e6;
                mask_sum += us;
                mask_worst = us > mask_worst ? us : mask_worst;
                masks++;
                eng_grammar_advance(grammars[k], &st, seen[i]);
            }
            t_plain += answer(e, ids, n, NULL, got, true, &r);
            free(ids);
        }
        double plain_tps = (double)toks / t_plain, con_tps = (double)toks / t_con;
        double mask_us = mask_sum / (double)(masks ? masks : 1);
        printf("| %s | %ld | %.1f | %.1f | %.3f | %.1f | %.0f | %.2f%% |\n", names[k], toks,
               plain_tps, con_tps, con_tps / plain_tps, mask_us, mask_worst,
               100.0 * mask_us * 1e-6 * plain_tps);
    }
    printf("\n(t/s include each answer's prefill; mask / plain step = mean mask time over the "
           "unconstrained time a token)\n");
    for (int k = 0; k < 3; k++)
        eng_grammar_unref(grammars[k]);
    free(allow);
    eng_engine_free(e);
    eng_kvpool_free(pool);
    eng_gvocab_free(voc);
    kern_backend_free(be);
    eng_model_free(m);
    return 0;
}
