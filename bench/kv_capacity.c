/* bench/kv_capacity.c: how many sequences a KV memory budget holds, in one run on this machine
 * (bench/kv_capacity builds and runs it).
 *
 * One mixed workload, two engine tiers (the Q4_1 file and the F16 stand-in, both SmolLM2-135M's
 * shape, each engine with its own backend), run against the same memory in three setups:
 *   (a) shared f16: one pool of --pool-mb for both tiers, f16 K/V;
 *   (b) static f16: the same memory split in two pools of half, one per tier, f16 K/V;
 *   (c) shared q8:  one pool of --pool-mb for both tiers, kv_dtype q8 (int8, rotated);
 * and, computed rather than run, what a contiguous allocator that reserves --n-ctx tokens per
 * sequence (the pre-paging way) fits in the same memory.
 * The workload: a burst of --requests prompts on the first tier, then (when it is done) the same
 * on the second; prompt lengths 32, 64, 128 and 256 tokens in turn (slices of a real text, the
 * KJV of scripts/fetch-ppl-text), --max-tokens each (greedy, ignore_eos, so every setup
 * generates the same number of tokens). Reported per setup: the peak of sequences decoding at
 * once (past their prompts, so their whole K/V in the pool; both tiers together, polled every
 * millisecond), preemptions (sequences that lost their
 * pages to make room and were recomputed), generated tokens per second, and the wall time.
 *
 *   bench_kv_capacity --models DIR --text FILE [--pool-mb 32] [--page-kb 256] [--n-ctx 1024]
 *                     [--requests 40] [--max-tokens 128] [--threads 2]
 */
#include "common/arena.h"
#include "common/time.h"
#include "engine/serve/engine.h"
#include "engine/serve/kvpool.h"
#include "engine/decoder/model.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct counter {
    pthread_mutex_t mu;
    int done;
    long tokens;
} counter;

static void on_event(void *arg, const eng_event *ev)
{
    counter *c = arg;
    pthread_mutex_lock(&c->mu);
    if (ev->kind == ENG_EV_TOKEN)
        c->tokens++;
    else
        c->done++;
    pthread_mutex_unlock(&c->mu);
}

typedef struct setup {
    const char *name;
    bool split;
    int kv_type;
} setup;

typedef struct outcome {
    int peak;
    uint64_t preemptions;
    long tokens;
    double seconds;
} outcome;

static int decoding(eng_engine *const e[2])
{
    int n = 0;
    for (int i = 0; i < 2; i++) {
        eng_engine_stats st;
        eng_engine_stats_get(e[i], &st);
        n += st.decoding;
    }
    return n;
}

static void run_setup(const setup *s, eng_model *const m[2], kern_backend *const be[2],
                      size_t pool_bytes, size_t page_bytes, int n_ctx, const int32_t *text,
                      size_t n_text, int requests, int max_tokens, outcome *out)
{
    util_err err;
    eng_kvpool *pool[2] = {NULL, NULL};
    size_t pages = pool_bytes / page_bytes;
    if (eng_kvpool_new(&pool[0], be[0], page_bytes, s->split ? pages / 2 : pages, &err) != 0 ||
        (s->split && eng_kvpool_new(&pool[1], be[1], page_bytes, pages / 2, &err) != 0)) {
        fprintf(stderr, "bench_kv_capacity: %s\n", err.msg);
        exit(1);
    }
    eng_engine *e[2];
    for (int t = 0; t < 2; t++) {
        eng_engine_cfg cfg = {.name = t == 0 ? "small" : "large", .max_seqs = 64,
                              .n_ctx = n_ctx, .prefix_pages = -1, .kv_type = s->kv_type,
                              .kv_rotate = true};
        if (eng_engine_new(&e[t], m[t], pool[s->split ? t : 0], be[t], &cfg, &err) != 0) {
            fprintf(stderr, "bench_kv_capacity: %s\n", err.msg);
            exit(1);
        }
    }
    static const int lens[] = {32, 64, 128, 256};
    counter c = {.mu = PTHREAD_MUTEX_INITIALIZER};
    uint64_t t0 = util_now_ns();
    out->peak = 0;
    for (int t = 0; t < 2; t++) {
        for (int r = 0; r < requests; r++) {
            size_t len = (size_t)lens[r % 4];
            size_t at = ((size_t)r * 7919 + (size_t)t * 104729) % (n_text - len);
            eng_request req = {.prompt = text + at, .n_prompt = len, .max_tokens = max_tokens,
                               .ignore_eos = true, .on_event = on_event, .arg = &c};
            uint64_t id;
            if (eng_engine_submit(e[t], &req, &id, &err) != 0) {
                fprintf(stderr, "bench_kv_capacity: %s\n", err.msg);
                exit(1);
            }
        }
        for (;;) {   /* the burst runs; the next starts when it is done */
            int now = decoding(e);
            out->peak = now > out->peak ? now : out->peak;
            pthread_mutex_lock(&c.mu);
            int done = c.done;
            pthread_mutex_unlock(&c.mu);
            if (done == (t + 1) * requests)
                break;
            usleep(1000);
        }
    }
    out->seconds = (double)(util_now_ns() - t0) * 1e-9;
    out->tokens = c.tokens;
    out->preemptions = 0;
    for (int t = 0; t < 2; t++) {
        eng_engine_stats st;
        eng_engine_stats_get(e[t], &st);
        out->preemptions += st.preemptions;
        eng_engine_free(e[t]);
    }
    eng_kvpool_free(pool[0]);
    eng_kvpool_free(pool[1]);
}

int main(int argc, char **argv)
{
    const char *dir = NULL, *text_path = NULL;
    int pool_mb = 32, page_kb = 256, n_ctx = 1024, requests = 40, max_tokens = 128, threads = 2;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--models") && v) { dir = v; i++; }
        else if (!strcmp(a, "--text") && v) { text_path = v; i++; }
        else if (!strcmp(a, "--pool-mb") && v) { pool_mb = atoi(v); i++; }
        else if (!strcmp(a, "--page-kb") && v) { page_kb = atoi(v); i++; }
        else if (!strcmp(a, "--n-ctx") && v) { n_ctx = atoi(v); i++; }
        else if (!strcmp(a, "--requests") && v) { requests = atoi(v); i++; }
        else if (!strcmp(a, "--max-tokens") && v) { max_tokens = atoi(v); i++; }
        else if (!strcmp(a, "--threads") && v) { threads = atoi(v); i++; }
        else { dir = NULL; break; }
    }
    if (dir == NULL || text_path == NULL || pool_mb < 1 || page_kb < 4 || n_ctx < 288 ||
        requests < 1 || max_tokens < 1 || n_ctx < 256 + max_tokens) {
        fprintf(stderr, "usage: bench_kv_capacity --models DIR --text FILE [--pool-mb 32] "
                        "[--page-kb 256] [--n-ctx 1024 (>= 256 + max-tokens)] [--requests 40] "
                        "[--max-tokens 128] [--threads 2]\n");
        return 2;
    }
    util_err err;
    eng_model *m[2];
    static const char *const files[2] = {"SmolLM2-135M-Instruct.Q4_1.gguf",
                                         "SmolLM2-135M-Instruct.F16.gguf"};
    for (int t = 0; t < 2; t++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, files[t]);
        if (eng_model_load(&m[t], path, NULL, &err) != 0) {
            fprintf(stderr, "bench_kv_capacity: %s\n", err.msg);
            return 1;
        }
    }
    FILE *f = fopen(text_path, "rb");
    if (f == NULL) {
        fprintf(stderr, "bench_kv_capacity: cannot open %s\n", text_path);
        return 1;
    }
    static char buf[1 << 16];   /* the first 64 KiB are plenty of prompt text */
    size_t len = fread(buf, 1, sizeof buf, f);
    fclose(f);
    int32_t *text = NULL;
    size_t n_text = 0, cap = 0;
    if (eng_tokenize(m[0]->tok, buf, len, false, false, &text, &n_text, &cap) != 0 ||
        n_text < 2048) {
        fprintf(stderr, "bench_kv_capacity: %s is too short\n", text_path);
        return 1;
    }
    kern_backend *be[2] = {kern_cpu_backend_new(threads), kern_cpu_backend_new(threads)};
    if (be[0] == NULL || be[1] == NULL) {
        fprintf(stderr, "bench_kv_capacity: cannot start the backends\n");
        return 1;
    }
    size_t pool_bytes = (size_t)pool_mb << 20, page_bytes = (size_t)page_kb << 10;
    eng_kv_layout f16l, q8l;
    eng_model_kv_layout(m[1], KERN_KV_F16, 0, false, page_bytes, &f16l, &err);
    eng_model_kv_layout(m[1], KERN_KV_Q8, 0, true, page_bytes, &q8l, &err);
    printf("KV memory %d MiB in pages of %d KiB; %s: f16 %zu bytes a token (%d a page), q8 %zu "
           "(%d a page); burst of %d requests on one tier then the other, prompts of 32-256 "
           "tokens, %d generated each\n\n", pool_mb, page_kb, files[1], f16l.bytes_per_token,
           f16l.page_tokens, q8l.bytes_per_token, q8l.page_tokens, requests, max_tokens);
    static const setup setups[3] = {{"(a) shared pool, f16", false, KERN_KV_F16},
                                    {"(b) static split (half a tier), f16", true, KERN_KV_F16},
                                    {"(c) shared pool, q8", false, KERN_KV_Q8}};
    outcome o[3];
    for (int i = 0; i < 3; i++) {
        run_setup(&setups[i], m, be, pool_bytes, page_bytes, n_ctx, text, n_text, requests,
                  max_tokens, &o[i]);
        fprintf(stderr, "%s: peak %d, %llu preemptions, %.1f s\n", setups[i].name, o[i].peak,
                (unsigned long long)o[i].preemptions, o[i].seconds);
    }
    /* Contiguous: every sequence reserves n_ctx tokens, wherever it ends. */
    long contig = (long)(pool_bytes / ((size_t)n_ctx * f16l.bytes_per_token));
    long contig_q8 = (long)(pool_bytes / ((size_t)n_ctx * q8l.bytes_per_token));
    printf("| setup | peak sequences decoding at once | preemptions | generated t/s | wall s |\n"
           "| --- | ---: | ---: | ---: | ---: |\n");
    printf("| contiguous max-length (%d tokens each), f16 (computed) | %ld | | | |\n", n_ctx,
           contig);
    printf("| contiguous max-length (%d tokens each), q8 (computed) | %ld | | | |\n", n_ctx,
           contig_q8);
    for (int i = 0; i < 3; i++)
        printf("| %s | %d | %llu | %.1f | %.1f |\n", setups[i].name, o[i].peak,
               (unsigned long long)o[i].preemptions, (double)o[i].tokens / o[i].seconds,
               o[i].seconds);
    printf("\n(c) holds %.2fx the sequences of (a), %.2fx of (b), %.1fx of contiguous f16\n",
           (double)o[2].peak / o[0].peak, (double)o[2].peak / o[1].peak,
           contig > 0 ? (double)o[2].peak / (double)contig : 0.0);
    for (int t = 0; t < 2; t++) {
        kern_backend_free(be[t]);
        eng_model_free(m[t]);
    }
    free(text);
    return 0;
}
