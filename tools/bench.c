/* tools/bench.c: llmgw-bench — prefill and decode speed of a model on this machine, measured
 * like llama.cpp's llama-bench: pp = one batch of -p prompt tokens, tg = -n tokens generated one
 * at a time; each repeated -r times, reported as mean ± sd tokens/s.
 *
 *   llmgw-bench -m MODEL.gguf [-p 128] [-n 64] [-t 2] [-r 3] [--all-logits] [--stages] [--csv]
 *
 * --all-logits: pp computes logits for every prompt token (as verifying drafts does), not only
 * the last. --stages: where a decode token's time goes, per kernel call kind (kernels/timed.h;
 * matmuls by weight shape), in ms a token. Without --csv, the machine's roofline (kernels/roofline.h) comes first and tg is
 * also given as a share of the memory roofline: read bandwidth / the bytes of every matrix a
 * decode step reads (the output matrix included).
 */
#include "common/arena.h"
#include "common/time.h"
#include "engine/kvpool.h"
#include "engine/model.h"
#include "kernels/roofline.h"
#include "kernels/timed.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static double run(const eng_model *m, const kern_backend *be, eng_work *w, eng_kvpool *pool,
                  int page_tokens, int n_tok, bool batch, bool all_logits, float *logits)
{
    int n_pages = (n_tok + page_tokens - 1) / page_tokens;
    int32_t *ids = util_xmalloc((size_t)n_pages * sizeof *ids);
    uint8_t **pages = util_xmalloc((size_t)n_pages * sizeof *pages);
    if (eng_kvpool_alloc_n(pool, ids, (size_t)n_pages) != 0) {
        fprintf(stderr, "llmgw-bench: KV pool too small\n");
        exit(1);
    }
    for (int i = 0; i < n_pages; i++)
        pages[i] = eng_kvpool_page(pool, ids[i]);
    int32_t *toks = util_xmalloc((size_t)n_tok * sizeof *toks);
    int32_t *pos = util_xmalloc((size_t)n_tok * sizeof *pos);
    for (int i = 0; i < n_tok; i++) {
        toks[i] = (int32_t)((i * 7919 + 13) % m->hp.n_vocab);  /* arbitrary ids, as llama-bench */
        pos[i] = i;
    }
    uint64_t t0 = util_now_ns();
    if (batch) {
        eng_batch_seq s = {.tok0 = 0, .n_tok = n_tok, .pages = pages, .logits_row = 0,
                           .n_logits = all_logits ? n_tok : 1};
        eng_batch b = {.n_tok = n_tok, .tokens = toks, .pos = pos, .n_seq = 1, .seqs = &s};
        eng_model_forward(m, be, w, &b, page_tokens, logits);
    } else {
        for (int i = 0; i < n_tok; i++) {
            eng_batch_seq s = {.tok0 = 0, .n_tok = 1, .pages = pages, .logits_row = 0};
            eng_batch b = {.n_tok = 1, .tokens = toks + i, .pos = pos + i, .n_seq = 1,
                           .seqs = &s};
            eng_model_forward(m, be, w, &b, page_tokens, logits);
        }
    }
    double s = (double)(util_now_ns() - t0) * 1e-9;
    for (int i = 0; i < n_pages; i++)
        eng_kvpool_release(pool, ids[i]);
    free(ids);
    free(pages);
    free(toks);
    free(pos);
    return (double)n_tok / s;
}

/* Where a decode token's time goes (the tg runs): per stage ms a token and share, then what the
 * kernels do not account for (sampling is not part of llmgw-bench; this is the forward's own
 * bookkeeping). */
static void print_stages(const kern_backend *be, double tokens, double tg)
{
    kern_stage st[64];
    int n = kern_timed_stages(be, st, 64);
    double per_tok = 1000.0 / tg, sum = 0;
    printf("\n| tg stage | calls a token | ms a token | share |\n| --- | ---: | ---: | ---: |\n");
    for (int i = 0; i < n; i++) {
        double ms = (double)st[i].ns * 1e-6 / tokens;
        sum += ms;
        printf("| %s | %.0f | %.3f | %.1f%% |\n", st[i].name, (double)st[i].calls / tokens, ms,
               100 * ms / per_tok);
    }
    printf("| outside the kernels | | %.3f | %.1f%% |\n| all (1 / tg t/s) | | %.3f | 100%% |\n",
           per_tok - sum, 100 * (per_tok - sum) / per_tok, per_tok);
}

static size_t matrix_bytes(const kern_tensor *t)
{
    return (size_t)t->rows * t->row_bytes;
}

/* Weight bytes one decode step reads: every layer's matrices and the output matrix (one row of
 * the embedding besides, left out). */
static size_t decode_bytes(const eng_model *m)
{
    size_t b = matrix_bytes(&m->output);
    for (int l = 0; l < m->hp.n_layer; l++) {
        const eng_layer *y = &m->layers[l];
        b += matrix_bytes(&y->wq) + matrix_bytes(&y->wk) + matrix_bytes(&y->wv) +
             matrix_bytes(&y->wo) + matrix_bytes(&y->w_gate) + matrix_bytes(&y->w_up) +
             matrix_bytes(&y->w_down);
    }
    return b;
}

int main(int argc, char **argv)
{
    const char *model = NULL;
    int p = 128, n = 64, threads = 2, reps = 3;
    bool csv = false, all_logits = false, stages = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-m") && v) { model = v; i++; }
        else if (!strcmp(a, "-p") && v) { p = atoi(v); i++; }
        else if (!strcmp(a, "-n") && v) { n = atoi(v); i++; }
        else if (!strcmp(a, "-t") && v) { threads = atoi(v); i++; }
        else if (!strcmp(a, "-r") && v) { reps = atoi(v); i++; }
        else if (!strcmp(a, "--csv")) csv = true;
        else if (!strcmp(a, "--all-logits")) all_logits = true;
        else if (!strcmp(a, "--stages")) stages = true;
        else { model = NULL; break; }
    }
    if (model == NULL || p < 1 || n < 1 || reps < 1) {
        fprintf(stderr, "usage: llmgw-bench -m MODEL.gguf [-p 128] [-n 64] [-t 2] [-r 3] "
                        "[--all-logits] [--stages] [--csv]\n");
        return 2;
    }
    util_err err;
    eng_model *m = NULL;
    eng_kvpool *pool = NULL;
    if (eng_model_load(&m, model, NULL, &err) != 0 ||
        eng_kvpool_new(&pool, 256 * 1024, 256, &err) != 0) {
        fprintf(stderr, "llmgw-bench: %s\n", err.msg);
        return 1;
    }
    kern_backend *be = kern_cpu_backend_new(threads);
    if (stages)
        be = kern_timed_new(be);
    int max = p > n ? p : n;
    if (max < 16)
        max = 16;   /* the warm-up below runs 16 tokens */
    eng_work *w = be ? eng_work_new(m, be, max, all_logits ? max : 1, max) : NULL;
    if (w == NULL) {
        fprintf(stderr, "llmgw-bench: cannot set up the backend\n");
        return 1;
    }
    int page_tokens = eng_model_page_tokens(m, eng_kvpool_page_bytes(pool));
    float *logits = util_xmalloc((size_t)m->hp.n_vocab * (size_t)(all_logits ? max : 1) *
                                 sizeof *logits);
    run(m, be, w, pool, page_tokens, 16, true, false, logits);  /* warm-up: page in the weights */
    const char *tests[2] = {"pp", "tg"};
    int counts[2] = {p, n};
    kern_roofline roof = {0};
    if (!csv) {
        if (kern_roofline_measure(&roof, threads) == 0)
            kern_roofline_print(stdout, &roof, 1);
        printf("| model | threads | test | t/s |\n| --- | ---: | --- | ---: |\n");
    }
    double tg = 0;
    for (int k = 0; k < 2; k++) {
        double sum = 0, sum2 = 0;
        if (stages)
            kern_timed_reset(be);
        for (int r = 0; r < reps; r++) {
            double v = run(m, be, w, pool, page_tokens, counts[k], k == 0, all_logits, logits);
            sum += v;
            sum2 += v * v;
        }
        double mean = sum / reps, sd = reps > 1 ? sqrt(fmax(0, (sum2 - sum * mean) / (reps - 1))) : 0;
        const char *base = strrchr(model, '/') ? strrchr(model, '/') + 1 : model;
        if (csv)
            printf("%s,%d,%s%d,%.2f,%.2f\n", base, threads, tests[k], counts[k], mean, sd);
        else
            printf("| %s | %d | %s%d | %.2f ± %.2f |\n", base, threads, tests[k], counts[k],
                   mean, sd);
        if (k == 1)
            tg = mean;
    }
    if (stages)
        print_stages(be, (double)reps * n, tg);
    if (!csv && roof.read_gbs > 0) {
        double bytes = (double)decode_bytes(m), most = roof.read_gbs * 1e9 / bytes;
        printf("\ntg%d: %.0f%% of the memory roofline (%.1f GB/s / %.1f MB a token = %.1f t/s)\n", n,
               100 * tg / most, roof.read_gbs, bytes / 1e6, most);
    }
    free(logits);
    eng_work_free(w);
    be->destroy(be->ctx);
    eng_kvpool_free(pool);
    eng_model_free(m);
    return 0;
}
