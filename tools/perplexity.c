/* tools/perplexity.c: llmgw-perplexity — a model's perplexity over a text file with each K/V
 * cache type, and how far each type's next-token distributions are from the first type's.
 *
 *   llmgw-perplexity -m MODEL.gguf -f TEXT [-c 512] [--chunks N] [--kv f16,q8,q8n/16] [-t 2]
 *
 * Measured as llama.cpp's llama-perplexity measures it, so the two print comparable figures on
 * the same file: the whole text is tokenized once (BOS first when the model adds one); it is cut
 * into chunks of -c tokens (the tail that fills no chunk is dropped), each chunk's first token
 * replaced by BOS when the model adds one, and each chunk evaluated alone from an empty cache;
 * of each chunk only the second half is scored: the log-probability of token j + 1 from the
 * logits at position j, for j from c/2 to c - 2. PPL = exp(mean negative log-likelihood),
 * ± its standard error (the sample standard deviation of the NLLs / sqrt(count), through exp).
 *
 * Every chunk runs once per K/V type (--kv: names as engine/decoder/model.h's eng_kv_parse: f16; q8 =
 * int8, one K scale per head, rows Hadamard-rotated; q8/G = one K scale per G channels; q8n,
 * q8n/G = not rotated), and at every scored position the types after the first are
 * compared with it: KL(p_first || p_type) of the full softmax distributions, and whether the
 * top token is the same. A table of PPL, ΔPPL, mean and 99th-percentile KL and same-top share
 * closes the run.
 */
#include "common/arena.h"
#include "common/time.h"
#include "engine/serve/kvpool.h"
#include "engine/decoder/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { MAX_KV = 6 };

typedef struct kv_run {
    char name[16];
    int type, k_group;
    bool rotate;
    eng_kv_layout kvl;
    double nll, nll2;       /* sums over scored positions */
    double kl, same;        /* against the first type */
    double *kls;            /* every position's KL, for the percentile */
    double seconds;
} kv_run;

static int parse_kv(const char *arg, kv_run *runs)
{
    char buf[128];
    int n = 0;
    snprintf(buf, sizeof buf, "%s", arg);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t != NULL;
         t = strtok_r(NULL, ",", &save)) {
        if (n == MAX_KV || eng_kv_parse(t, &runs[n].type, &runs[n].k_group, &runs[n].rotate))
            return -1;
        snprintf(runs[n].name, sizeof runs[n].name, "%s", t);
        n++;
    }
    return n;
}

static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return NULL;
    if (fseek(f, 0, SEEK_END) != 0 || ftell(f) < 0 || ftell(f) > 1L << 30) {
        fclose(f);
        return NULL;
    }
    size_t n = (size_t)ftell(f);
    rewind(f);
    char *buf = util_xmalloc(n + 1);
    if (fread(buf, 1, n, f) != n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    *len = n;
    return buf;
}

/* log-softmax of n logits into out; returns the argmax. */
static int log_softmax(const float *l, int n, double *out)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        best = l[i] > l[best] ? i : best;
    double max = l[best], sum = 0;
    for (int i = 0; i < n; i++)
        sum += exp((double)l[i] - max);
    double lse = max + log(sum);
    for (int i = 0; i < n; i++)
        out[i] = (double)l[i] - lse;
    return best;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    const char *model = NULL, *text = NULL, *kv_arg = "f16,q8";
    int n_ctx = 512, max_chunks = 0, threads = 2;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-m") && v) { model = v; i++; }
        else if (!strcmp(a, "-f") && v) { text = v; i++; }
        else if (!strcmp(a, "-c") && v) { n_ctx = atoi(v); i++; }
        else if (!strcmp(a, "--chunks") && v) { max_chunks = atoi(v); i++; }
        else if (!strcmp(a, "--kv") && v) { kv_arg = v; i++; }
        else if (!strcmp(a, "-t") && v) { threads = atoi(v); i++; }
        else { model = NULL; break; }
    }
    kv_run runs[MAX_KV] = {0};
    int n_kv = model != NULL ? parse_kv(kv_arg, runs) : -1;
    if (model == NULL || text == NULL || n_ctx < 16 || n_kv < 1 || threads < 0) {
        fprintf(stderr, "usage: llmgw-perplexity -m MODEL.gguf -f TEXT [-c 512] [--chunks N] "
                        "[--kv f16,q8,q8n/16] [-t 2]\n");
        return 2;
    }
    util_err err;
    eng_model *m = NULL;
    if (eng_model_load(&m, model, NULL, &err) != 0) {
        fprintf(stderr, "llmgw-perplexity: %s\n", err.msg);
        return 1;
    }
    size_t len;
    char *buf = slurp(text, &len);
    if (buf == NULL) {
        fprintf(stderr, "llmgw-perplexity: cannot read %s\n", text);
        return 1;
    }
    int32_t *ids = NULL;
    size_t n_ids = 0, cap = 0;
    bool bos = eng_tokenizer_add_bos(m->tok) && eng_tokenizer_bos(m->tok) >= 0;
    if (eng_tokenize(m->tok, buf, len, bos, false, &ids, &n_ids, &cap) != 0) {
        fprintf(stderr, "llmgw-perplexity: cannot tokenize %s\n", text);
        return 1;
    }
    free(buf);
    int n_chunks = (int)(n_ids / (size_t)n_ctx);
    if (max_chunks > 0 && max_chunks < n_chunks)
        n_chunks = max_chunks;
    if (n_chunks < 1) {
        fprintf(stderr, "llmgw-perplexity: %zu tokens make no chunk of %d\n", n_ids, n_ctx);
        return 1;
    }
    if (n_ctx > m->hp.n_ctx_train) {
        fprintf(stderr, "llmgw-perplexity: -c %d is beyond the model's context %d\n", n_ctx,
                m->hp.n_ctx_train);
        return 1;
    }
    int V = m->hp.n_vocab, first = n_ctx / 2, scored = n_ctx - 1 - first;
    size_t page = 16 * m->kv_bytes_per_token;   /* 16 f16 tokens a page */
    int max_pages = 1;
    for (int k = 0; k < n_kv; k++) {
        if (eng_model_kv_layout(m, runs[k].type, runs[k].k_group, runs[k].rotate, page,
                                &runs[k].kvl, &err)) {
            fprintf(stderr, "llmgw-perplexity: %s\n", err.msg);
            return 1;
        }
        int np = (n_ctx + runs[k].kvl.page_tokens - 1) / runs[k].kvl.page_tokens;
        max_pages = np > max_pages ? np : max_pages;
        runs[k].kls = util_xmalloc((size_t)n_chunks * (size_t)scored * sizeof(double));
    }
    eng_kvpool *pool = NULL;
    kern_backend *be = kern_cpu_backend_new(threads);
    eng_work *w = be != NULL ? eng_work_new(m, be, n_ctx, n_ctx, n_ctx, false) : NULL;
    if (w == NULL || eng_kvpool_new(&pool, be, page, (size_t)max_pages, &err) != 0) {
        fprintf(stderr, "llmgw-perplexity: cannot set up the backend or the KV pool\n");
        return 1;
    }
    printf("llmgw-perplexity: %s, %s: %zu tokens, %d chunks of %d (scoring %d tokens each)%s\n",
           model, text, n_ids, n_chunks, n_ctx, scored, bos ? ", BOS first" : "");
    float *logits[MAX_KV];
    for (int k = 0; k < n_kv; k++)
        logits[k] = util_xmalloc((size_t)n_ctx * (size_t)V * sizeof(float));
    double *lp0 = util_xmalloc((size_t)V * sizeof *lp0), *lpk = util_xmalloc((size_t)V * sizeof *lpk);
    int32_t *toks = util_xmalloc((size_t)n_ctx * sizeof *toks);
    int32_t *pos = util_xmalloc((size_t)n_ctx * sizeof *pos);
    int32_t *page_ids = util_xmalloc((size_t)max_pages * sizeof *page_ids);
    uint8_t **pages = util_xmalloc((size_t)max_pages * sizeof *pages);
    for (int i = 0; i < n_ctx; i++)
        pos[i] = i;
    long n_scored = 0;
    for (int c = 0; c < n_chunks; c++) {
        memcpy(toks, ids + (size_t)c * (size_t)n_ctx, (size_t)n_ctx * sizeof *toks);
        if (bos)
            toks[0] = eng_tokenizer_bos(m->tok);
        for (int k = 0; k < n_kv; k++) {
            const eng_kv_layout *kvl = &runs[k].kvl;
            int np = (n_ctx + kvl->page_tokens - 1) / kvl->page_tokens;
            if (eng_kvpool_alloc_n(pool, page_ids, (size_t)np) != 0) {
                fprintf(stderr, "llmgw-perplexity: KV pool too small\n");
                return 1;
            }
            for (int i = 0; i < np; i++)
                pages[i] = eng_kvpool_page(pool, page_ids[i]);
            eng_batch_seq s = {.tok0 = 0, .n_tok = n_ctx, .pages = pages, .logits_row = 0,
                               .n_logits = n_ctx};
            eng_batch b = {.n_tok = n_ctx, .tokens = toks, .pos = pos, .n_seq = 1, .seqs = &s};
            uint64_t t0 = util_now_ns();
            eng_model_forward(m, be, w, &b, kvl, logits[k]);
            runs[k].seconds += (double)(util_now_ns() - t0) * 1e-9;
            for (int i = 0; i < np; i++)
                eng_kvpool_release(pool, page_ids[i]);
        }
        for (int j = first; j < n_ctx - 1; j++, n_scored++) {
            int32_t next = ids[(size_t)c * (size_t)n_ctx + (size_t)j + 1];
            int top0 = log_softmax(logits[0] + (size_t)j * (size_t)V, V, lp0);
            runs[0].nll -= lp0[next];
            runs[0].nll2 += lp0[next] * lp0[next];
            for (int k = 1; k < n_kv; k++) {
                int topk = log_softmax(logits[k] + (size_t)j * (size_t)V, V, lpk);
                double kl = 0;
                for (int v = 0; v < V; v++)
                    kl += exp(lp0[v]) * (lp0[v] - lpk[v]);
                runs[k].nll -= lpk[next];
                runs[k].nll2 += lpk[next] * lpk[next];
                runs[k].kl += kl;
                runs[k].kls[n_scored] = kl;
                runs[k].same += topk == top0;
            }
        }
        fprintf(stderr, "[%d/%d]", c + 1, n_chunks);
        for (int k = 0; k < n_kv; k++)
            fprintf(stderr, " %s %.4f", runs[k].name, exp(runs[k].nll / (double)n_scored));
        fprintf(stderr, "\n");
    }
    printf("\n| kv | PPL | ΔPPL vs %s | mean KL vs %s | KL p99 | same top token | eval t/s |\n"
           "| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n", runs[0].name, runs[0].name);
    double ppl0 = exp(runs[0].nll / (double)n_scored);
    for (int k = 0; k < n_kv; k++) {
        kv_run *r = &runs[k];
        double mean = r->nll / (double)n_scored;
        double var = r->nll2 / (double)n_scored - mean * mean;
        double se = sqrt(var > 0 ? var / (double)(n_scored - 1) : 0);
        double ppl = exp(mean);
        double tps = (double)n_chunks * n_ctx / r->seconds;
        if (k == 0) {
            printf("| %s | %.4f ± %.4f | | | | | %.0f |\n", r->name, ppl, ppl * se, tps);
            continue;
        }
        qsort(r->kls, (size_t)n_scored, sizeof *r->kls, cmp_double);
        printf("| %s | %.4f ± %.4f | %+.3f%% | %.6f | %.6f | %.2f%% | %.0f |\n", r->name, ppl,
               ppl * se, 100 * (ppl / ppl0 - 1), r->kl / (double)n_scored,
               r->kls[(long)(0.99 * (double)(n_scored - 1))], 100 * r->same / (double)n_scored,
               tps);
    }
    for (int k = 0; k < n_kv; k++) {
        free(logits[k]);
        free(runs[k].kls);
    }
    free(lp0);
    free(lpk);
    free(toks);
    free(pos);
    free(page_ids);
    free(pages);
    free(ids);
    eng_work_free(w);
    eng_kvpool_free(pool);   /* a buffer of be */
    kern_backend_free(be);
    eng_model_free(m);
    return 0;
}
