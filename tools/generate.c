/* tools/generate.c: llmgw-generate — one prompt through an engine instance, the text streamed
 * to stdout as it is generated.
 *
 *   llmgw-generate -m MODEL.gguf -p PROMPT [-n 64] [-t THREADS] [--temp 0] [--seed N]
 *                  [--chat] [--ids]
 * --chat wraps the prompt as one user turn in the model's chat template; --ids prints the
 * prompt and generated token ids (for comparisons with llama.cpp). */
#include "common/arena.h"
#include "kernels/device.h"
#include "engine/serve/engine.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct out {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done, ids;
    int32_t *gen;
    int n_gen;
    eng_finish finish;
    int prompt_tokens, completion_tokens;
} out;

static void on_event(void *arg, const eng_event *ev)
{
    out *o = arg;
    if (ev->kind == ENG_EV_TOKEN) {
        fwrite(ev->text, 1, ev->len, stdout);
        fflush(stdout);
        o->gen = realloc(o->gen, (size_t)(o->n_gen + 1) * sizeof *o->gen);
        o->gen[o->n_gen++] = ev->pick->token;
        return;
    }
    pthread_mutex_lock(&o->mu);
    o->done = true;
    o->finish = ev->finish;
    o->prompt_tokens = ev->prompt_tokens;
    o->completion_tokens = ev->completion_tokens;
    pthread_cond_signal(&o->cv);
    pthread_mutex_unlock(&o->mu);
}

int main(int argc, char **argv)
{
    const char *model = NULL, *prompt = NULL;
    int n = 64, threads = 0;
    float temp = 0;
    uint64_t seed = 42;
    bool chat = false, ids = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-m") && v) { model = v; i++; }
        else if (!strcmp(a, "-p") && v) { prompt = v; i++; }
        else if (!strcmp(a, "-n") && v) { n = atoi(v); i++; }
        else if (!strcmp(a, "-t") && v) { threads = atoi(v); i++; }
        else if (!strcmp(a, "--temp") && v) { temp = (float)atof(v); i++; }
        else if (!strcmp(a, "--seed") && v) { seed = strtoull(v, NULL, 10); i++; }
        else if (!strcmp(a, "--chat")) chat = true;
        else if (!strcmp(a, "--ids")) ids = true;
        else { model = NULL; break; }
    }
    if (model == NULL || prompt == NULL) {
        fprintf(stderr, "usage: llmgw-generate -m MODEL.gguf -p PROMPT [-n 64] [-t THREADS] "
                        "[--temp 0] [--seed N] [--chat] [--ids]\n");
        return 2;
    }
    util_err err;
    eng_model *m = NULL;
    eng_kvpool *pool = NULL;
    eng_engine *e = NULL;
    kern_backend *be = NULL;
    int rc = 1;
    if (eng_model_load(&m, model, NULL, &err) != 0 ||
        kern_backend_open("cpu", threads, &be, &err) != 0 ||
        eng_kvpool_new(&pool, be, 256 * 1024, 512, &err) != 0) {
        fprintf(stderr, "llmgw-generate: %s\n", err.msg);
        goto out;
    }
    eng_engine_cfg cfg = {.name = "generate", .max_seqs = 1};
    if (eng_engine_new(&e, m, pool, be, &cfg, &err) != 0) {
        fprintf(stderr, "llmgw-generate: %s\n", err.msg);
        goto out;
    }
    char *text = NULL;
    size_t len = strlen(prompt), cap = 0, n_ids = 0;
    int32_t *toks = NULL;
    if (chat) {
        eng_chat_msg msg = {.role = "user", .content = prompt, .content_len = len};
        eng_chat_render(m->chat, &msg, 1, m->default_system, true, &text, &len);
    }
    eng_tokenize(m->tok, text ? text : prompt, len, eng_tokenizer_add_bos(m->tok), true, &toks,
                 &n_ids, &cap);
    free(text);
    out o = {.ids = ids};
    pthread_mutex_init(&o.mu, NULL);
    pthread_cond_init(&o.cv, NULL);
    eng_request req = {.prompt = toks, .n_prompt = n_ids, .seed = seed, .max_tokens = n,
                       .sampling = {.temperature = temp, .top_p = 1, .top_logprobs = -1},
                       .on_event = on_event, .arg = &o};
    uint64_t id;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    if (eng_engine_submit(e, &req, &id, &err) != 0) {
        fprintf(stderr, "llmgw-generate: %s\n", err.msg);
        free(toks);
        goto out;
    }
    pthread_mutex_lock(&o.mu);
    while (!o.done)
        pthread_cond_wait(&o.cv, &o.mu);
    pthread_mutex_unlock(&o.mu);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    printf("\n");
    if (ids) {
        printf("prompt_ids:");
        for (size_t i = 0; i < n_ids; i++)
            printf(" %d", toks[i]);
        printf("\ngenerated_ids:");
        for (int i = 0; i < o.n_gen; i++)
            printf(" %d", o.gen[i]);
        printf("\n");
    }
    fprintf(stderr, "llmgw-generate: %d prompt + %d generated tokens in %.3f s (finish: %s)\n",
            o.prompt_tokens, o.completion_tokens, s,
            o.finish == ENG_FINISH_LENGTH ? "length" : o.finish == ENG_FINISH_STOP ? "stop"
                                                                                   : "other");
    free(toks);
    free(o.gen);
    rc = 0;
out:
    eng_engine_free(e);
    eng_kvpool_free(pool);   /* a buffer of be */
    kern_backend_free(be);
    eng_model_free(m);
    return rc;
}
