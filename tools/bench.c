/* tools/bench.c: llmgw-bench — prefill and decode speed of a model on this machine, measured
 * like llama.cpp's llama-bench: pp = one batch of -p prompt tokens, tg = -n tokens generated one
 * at a time; each repeated -r times, reported as mean ± sd tokens/s.
 *
 *   llmgw-bench -m MODEL.gguf [-p 128] [-n 64] [-t 2] [-r 3] [-d 0,512,...] [--kv f16,q8]
 *               [--all-logits] [--stages] [--csv] [--device cpu|cuda|cuda:N|shadow]
 *               [-b 1,8,32] [--draft]
 *
 * -d: the runs happen at these context depths (the sequence's first d positions prefilled
 * first, untimed, as llama-bench's -d). --kv: with these K/V cache types, one after the other
 * in the same run (names as engine/decoder/model.h's eng_kv_parse: f16, q8, q8/16, q8n...; with two, a
 * table of their tg ratios follows).
 * --all-logits: pp computes logits for every prompt token (as verifying drafts does), not only
 * the last. --stages: where a decode token's time goes, per kernel call kind (kernels/timed.h;
 * matmuls by weight shape), in ms a token; with -b, also a decode step's of the last batch size
 * (its last tg run). Without --csv, the machine's roofline (kernels/roofline.h) comes first and tg is
 * also given as a share of the memory roofline: read bandwidth / the bytes of every matrix a
 * decode step reads (the output matrix included).
 * --device: where the model runs (kernels/device.h; default cpu). Off the host the roofline is
 * the device's measured copy bandwidth (bytes read and written by a large device-to-device copy
 * a second), and tg's share of it is weight bytes x tokens/s / that bandwidth.
 * --draft: the weights as a draft model's forwards read them (engine/decoder/model.h eng_work_new:
 * the backend's repacked copies, the output matrix narrowed): how fast the model drafts.
 * -b: also prefill and decode at these batch sizes: pp = B sequences of -p tokens in one
 * forward, tg = -n steps of one token for each of B sequences; tokens/s over all sequences.
 * On a CUDA device with LLMGW_CUDA_GRAPHS=1 the steps of up to 64 tokens that no cuBLAS product
 * takes run as CUDA graphs (kernels/cuda/cuda.h); the run ends with how many did.
 */
#include "common/arena.h"
#include "common/time.h"
#include "engine/serve/kvpool.h"
#include "engine/decoder/model.h"
#include "kernels/device.h"
#ifdef LLMGW_HAVE_CUDA
#include "kernels/cuda/cuda.h"
#endif
#include "kernels/roofline.h"
#include "kernels/timed.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The pages of one sequence of up to n_tok tokens, its first depth positions prefilled (in
 * chunks of up to chunk tokens), so that runs at that depth attend to them. */
typedef struct ctx_seq {
    int32_t *ids;
    uint8_t **pages;
    int n_pages;
} ctx_seq;

static void seq_open(ctx_seq *c, const eng_model *m, const kern_backend *be, eng_work *w,
                     eng_kvpool *pool, const eng_kv_layout *kvl, int depth, int n_tok,
                     int chunk, float *logits)
{
    c->n_pages = (n_tok + kvl->page_tokens - 1) / kvl->page_tokens;
    c->ids = util_xmalloc((size_t)c->n_pages * sizeof *c->ids);
    c->pages = util_xmalloc((size_t)c->n_pages * sizeof *c->pages);
    if (eng_kvpool_alloc_n(pool, c->ids, (size_t)c->n_pages) != 0) {
        fprintf(stderr, "llmgw-bench: KV pool too small\n");
        exit(1);
    }
    for (int i = 0; i < c->n_pages; i++)
        c->pages[i] = eng_kvpool_page(pool, c->ids[i]);
    int32_t *toks = util_xmalloc((size_t)chunk * sizeof *toks);
    int32_t *pos = util_xmalloc((size_t)chunk * sizeof *pos);
    for (int t0 = 0; t0 < depth; t0 += chunk) {
        int nt = depth - t0 < chunk ? depth - t0 : chunk;
        for (int i = 0; i < nt; i++) {
            toks[i] = (int32_t)(((t0 + i) * 104729 + 7) % m->hp.n_vocab);
            pos[i] = t0 + i;
        }
        eng_batch_seq s = {.tok0 = 0, .n_tok = nt, .pages = c->pages, .logits_row = 0};
        eng_batch b = {.n_tok = nt, .tokens = toks, .pos = pos, .n_seq = 1, .seqs = &s};
        eng_model_forward(m, be, w, &b, kvl, logits);
    }
    free(toks);
    free(pos);
}

static void seq_close(ctx_seq *c, eng_kvpool *pool)
{
    for (int i = 0; i < c->n_pages; i++)
        eng_kvpool_release(pool, c->ids[i]);
    free(c->ids);
    free(c->pages);
}

/* Tokens/s of n_tok tokens at positions depth.. of c: one batch (pp), or one at a time (tg). */
static double run(const eng_model *m, const kern_backend *be, eng_work *w, const ctx_seq *c,
                  const eng_kv_layout *kvl, int depth, int n_tok, bool batch, bool all_logits,
                  float *logits)
{
    int32_t *toks = util_xmalloc((size_t)n_tok * sizeof *toks);
    int32_t *pos = util_xmalloc((size_t)n_tok * sizeof *pos);
    for (int i = 0; i < n_tok; i++) {
        toks[i] = (int32_t)((i * 7919 + 13) % m->hp.n_vocab);  /* arbitrary ids, as llama-bench */
        pos[i] = depth + i;
    }
    uint64_t t0 = util_now_ns();
    if (batch) {
        eng_batch_seq s = {.tok0 = 0, .n_tok = n_tok, .pages = c->pages, .logits_row = 0,
                           .n_logits = all_logits ? n_tok : 1};
        eng_batch b = {.n_tok = n_tok, .tokens = toks, .pos = pos, .n_seq = 1, .seqs = &s};
        eng_model_forward(m, be, w, &b, kvl, logits);
    } else {
        for (int i = 0; i < n_tok; i++) {
            eng_batch_seq s = {.tok0 = 0, .n_tok = 1, .pages = c->pages, .logits_row = 0};
            eng_batch b = {.n_tok = 1, .tokens = toks + i, .pos = pos + i, .n_seq = 1,
                           .seqs = &s};
            eng_model_forward(m, be, w, &b, kvl, logits);
        }
    }
    double s = (double)(util_now_ns() - t0) * 1e-9;
    free(toks);
    free(pos);
    return (double)n_tok / s;
}

/* Tokens/s of B sequences at once (seqs[0..B)), each n_tok tokens at positions depth..: one
 * forward of all of them (pp), or n_tok forwards of one token each (tg). */
static double run_batch(const eng_model *m, const kern_backend *be, eng_work *w,
                        const ctx_seq *seqs, int B, const eng_kv_layout *kvl, int depth,
                        int n_tok, bool prefill, float *logits)
{
    int per = prefill ? n_tok : 1, T = B * per;
    int32_t *toks = util_xmalloc((size_t)T * sizeof *toks);
    int32_t *pos = util_xmalloc((size_t)T * sizeof *pos);
    eng_batch_seq *bs = util_xcalloc((size_t)B, sizeof *bs);
    uint64_t t0 = util_now_ns();
    for (int step = 0; step < (prefill ? 1 : n_tok); step++) {
        for (int s = 0; s < B; s++) {
            for (int i = 0; i < per; i++) {
                int k = s * per + i, at = prefill ? i : step;
                toks[k] = (int32_t)(((at + 31 * s) * 7919 + 13) % m->hp.n_vocab);
                pos[k] = depth + at;
            }
            bs[s] = (eng_batch_seq){.tok0 = s * per, .n_tok = per, .pages = seqs[s].pages,
                                    .logits_row = s};
        }
        eng_batch b = {.n_tok = T, .tokens = toks, .pos = pos, .n_seq = B, .seqs = bs};
        eng_model_forward(m, be, w, &b, kvl, logits);
    }
    double sec = (double)(util_now_ns() - t0) * 1e-9;
    free(toks);
    free(pos);
    free(bs);
    return (double)B * (double)n_tok / sec;
}

/* A device's copy bandwidth in GB/s (bytes read and written), by copying 512 MiB device to
 * device ten times; 0 when the memory is not there. */
static double device_copy_gbs(const kern_backend *be)
{
    size_t n = (size_t)512 << 20;
    void *a = be->buffer_alloc(be->ctx, n), *b = be->buffer_alloc(be->ctx, n);
    double gbs = 0;
    if (a != NULL && b != NULL) {
        char one;
        be->copy(be->ctx, b, a, n);   /* warm up */
        be->buffer_copy_out(be->ctx, b, 0, &one, 1);
        uint64_t t0 = util_now_ns();
        for (int i = 0; i < 10; i++)
            be->copy(be->ctx, i % 2 ? a : b, i % 2 ? b : a, n);
        be->buffer_copy_out(be->ctx, b, 0, &one, 1);
        gbs = 2.0 * 10 * (double)n / (double)(util_now_ns() - t0);
    }
    if (a != NULL)
        be->buffer_free(be->ctx, a, n);
    if (b != NULL)
        be->buffer_free(be->ctx, b, n);
    return gbs;
}

/* Where a decode step's time goes (the tg runs of batch B, B tokens a step): per stage ms a
 * step and share, then what the kernels do not account for (sampling is not part of
 * llmgw-bench; this is the forward's own bookkeeping). steps: how many the stages timed; tg:
 * tokens/s. */
static void print_stages(const kern_backend *be, int B, double steps, double tg)
{
    kern_stage st[64];
    int n = kern_timed_stages(be, st, 64);
    double per_step = 1000.0 * B / tg, sum = 0;
    if (B == 1)
        printf("\n| tg stage | calls a token | ms a token | share |\n");
    else
        printf("\n| tg stage, batch %d | calls a step | ms a step | share |\n", B);
    printf("| --- | ---: | ---: | ---: |\n");
    for (int i = 0; i < n; i++) {
        double ms = (double)st[i].ns * 1e-6 / steps;
        sum += ms;
        printf("| %s | %.0f | %.3f | %.1f%% |\n", st[i].name, (double)st[i].calls / steps, ms,
               100 * ms / per_step);
    }
    printf("| outside the kernels | | %.3f | %.1f%% |\n| all (B / tg t/s) | | %.3f | 100%% |\n",
           per_step - sum, 100 * (per_step - sum) / per_step, per_step);
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

/* Comma-separated non-negative integers into v (at most max); their count, or -1. */
static int int_list(const char *arg, int *v, int max)
{
    int n = 0;
    for (const char *p = arg; *p != '\0' && n < max;) {
        char *end;
        long x = strtol(p, &end, 10);
        if (end == p || x < 0 || x > 1 << 20)
            return -1;
        v[n++] = (int)x;
        p = *end == ',' ? end + 1 : end;
        if (*end != ',' && *end != '\0')
            return -1;
    }
    return n;
}

int main(int argc, char **argv)
{
    const char *model = NULL, *kv_arg = "f16", *device = "cpu";
    int p = 128, n = 64, threads = 2, reps = 3, batches[8] = {0}, n_batch = 0;
    int depths[8] = {0}, n_depth = 1;
    bool csv = false, all_logits = false, stages = false, draft = false, bad = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-m") && v) { model = v; i++; }
        else if (!strcmp(a, "-p") && v) { p = atoi(v); i++; }
        else if (!strcmp(a, "-n") && v) { n = atoi(v); i++; }
        else if (!strcmp(a, "-t") && v) { threads = atoi(v); i++; }
        else if (!strcmp(a, "-r") && v) { reps = atoi(v); i++; }
        else if (!strcmp(a, "-d") && v) { n_depth = int_list(v, depths, 8); bad |= n_depth < 1; i++; }
        else if (!strcmp(a, "--kv") && v) { kv_arg = v; i++; }
        else if (!strcmp(a, "--csv")) csv = true;
        else if (!strcmp(a, "--all-logits")) all_logits = true;
        else if (!strcmp(a, "--stages")) stages = true;
        else if (!strcmp(a, "--draft")) draft = true;
        else if (!strcmp(a, "--device") && v) { device = v; i++; }
        else if (!strcmp(a, "-b") && v) { n_batch = int_list(v, batches, 8); bad |= n_batch < 1; i++; }
        else { model = NULL; break; }
    }
    int kv_types[2], kv_groups[2], n_kv = 0;
    bool kv_rot[2];
    char kv_buf[64], kv_names[2][16];
    snprintf(kv_buf, sizeof kv_buf, "%s", kv_arg);
    for (char *save = NULL, *t = strtok_r(kv_buf, ",", &save); t != NULL && !bad;
         t = strtok_r(NULL, ",", &save)) {
        bad |= n_kv == 2 || eng_kv_parse(t, &kv_types[n_kv], &kv_groups[n_kv], &kv_rot[n_kv]);
        if (!bad)
            snprintf(kv_names[n_kv++], sizeof kv_names[0], "%s", t);
    }
    if (model == NULL || p < 1 || n < 1 || reps < 1 || bad || n_kv == 0) {
        fprintf(stderr, "usage: llmgw-bench -m MODEL.gguf [-p 128] [-n 64] [-t 2] [-r 3] "
                        "[-d 0[,512,...]] [--kv f16[,q8]] [--all-logits] "
                        "[--stages] [--csv] [--device cpu|cuda|cuda:N|shadow] "
                        "[-b 1,8,32] [--draft]\n");
        return 2;
    }
    util_err err;
    eng_model *m = NULL;
    eng_kvpool *pool = NULL;
    if (eng_model_load(&m, model, NULL, &err) != 0) {
        fprintf(stderr, "llmgw-bench: %s\n", err.msg);
        return 1;
    }
    int max = p > n ? p : n, max_depth = 0, max_b = 1;
    if (max < 16)
        max = 16;   /* the warm-up below runs 16 tokens */
    for (int i = 0; i < n_depth; i++)
        max_depth = depths[i] > max_depth ? depths[i] : max_depth;
    for (int i = 0; i < n_batch; i++)
        max_b = batches[i] > max_b ? batches[i] : max_b;
    size_t page = 256 * 1024;
    eng_kv_layout f16l;   /* the most pages a type needs: f16's */
    kern_backend *be = NULL;
    if (kern_backend_open(device, threads, &be, &err) != 0) {
        fprintf(stderr, "llmgw-bench: %s\n", err.msg);
        return 1;
    }
    if (stages)
        be = kern_timed_new(be);
    int seq_pages = 0;
    if (be == NULL || eng_model_kv_layout(m, KERN_KV_F16, 0, false, page, &f16l, &err) != 0 ||
        (seq_pages = (max_depth + max) / f16l.page_tokens + 2,
         eng_kvpool_new(&pool, be, page, (size_t)(seq_pages * (max_b + 1)), &err)) != 0) {
        fprintf(stderr, "llmgw-bench: %s\n", be != NULL ? err.msg : "cannot start the backend");
        return 1;
    }
    int max_rows = all_logits ? max : 1;
    max_rows = max_b > max_rows ? max_b : max_rows;
    int max_tok = n_batch > 0 && max_b * p > max ? max_b * p : max;
    eng_work *w = be ? eng_work_new(m, be, max_tok, max_rows, max_depth + max, draft) : NULL;
    if (w == NULL) {
        fprintf(stderr, "llmgw-bench: cannot set up the backend\n");
        return 1;
    }
    float *logits = util_xmalloc((size_t)m->hp.n_vocab * (size_t)max_rows * sizeof *logits);
    const char *tests[2] = {"pp", "tg"};
    int counts[2] = {p, n};
    kern_roofline roof = {0};
    if (!csv && !be->host_memory) {
        roof.read_gbs = device_copy_gbs(be);
        printf("device %s (%s): copy bandwidth %.0f GB/s (read + written)\n\n", device,
               be->kernels(be->ctx), roof.read_gbs);
    } else if (!csv) {
        if (kern_roofline_measure(&roof, threads) == 0)
            kern_roofline_print(stdout, &roof, 1);
        printf("| model | threads | kv | test | t/s |\n| --- | ---: | --- | --- | ---: |\n");
    }
    const char *base = strrchr(model, '/') ? strrchr(model, '/') + 1 : model;
    double tg[2][8] = {{0}};
    eng_kv_layout kvls[2];
    for (int ki = 0; ki < n_kv; ki++) {
        eng_kv_layout *kvl = &kvls[ki];
        if (eng_model_kv_layout(m, kv_types[ki], kv_groups[ki], kv_rot[ki], page, kvl,
                                &err) != 0) {
            fprintf(stderr, "llmgw-bench: %s\n", err.msg);
            return 1;
        }
        const char *kvname = kv_names[ki];
        ctx_seq warm;   /* page in the weights */
        seq_open(&warm, m, be, w, pool, kvl, 16, 16, max, logits);
        seq_close(&warm, pool);
        for (int di = 0; di < n_depth; di++) {
            int depth = depths[di];
            ctx_seq c;
            seq_open(&c, m, be, w, pool, kvl, depth, depth + max, max, logits);
            for (int k = 0; k < 2; k++) {
                double sum = 0, sum2 = 0;
                if (stages)
                    kern_timed_reset(be);
                for (int r = 0; r < reps; r++) {
                    double v = run(m, be, w, &c, kvl, depth, counts[k], k == 0, all_logits,
                                   logits);
                    sum += v;
                    sum2 += v * v;
                }
                double mean = sum / reps;
                double sd = reps > 1 ? sqrt(fmax(0, (sum2 - sum * mean) / (reps - 1))) : 0;
                char test[48];
                if (depth > 0)
                    snprintf(test, sizeof test, "%s%d @ d%d", tests[k], counts[k], depth);
                else
                    snprintf(test, sizeof test, "%s%d", tests[k], counts[k]);
                if (csv)
                    printf("%s,%d,%s,%s,%.2f,%.2f\n", base, threads, kvname, test, mean, sd);
                else
                    printf("| %s | %d | %s | %s | %.2f ± %.2f |\n", base, threads, kvname, test,
                           mean, sd);
                if (k == 1) {
                    tg[ki][di] = mean;
                    if (stages)
                        print_stages(be, 1, (double)reps * n, mean);
                }
            }
            seq_close(&c, pool);
        }
    }
    if (n_batch > 0) {   /* at batch sizes, the first K/V type, depth 0 */
        ctx_seq *seqs = util_xcalloc((size_t)max_b, sizeof *seqs);
        for (int s = 0; s < max_b; s++)
            seq_open(&seqs[s], m, be, w, pool, &kvls[0], 0, max, max, logits);
        if (!csv)
            printf("\n| model | kv | batch | pp%d t/s | tg%d t/s |\n| --- | --- | ---: | ---: | ---: |\n",
                   p, n);
        int last_b = 0;
        double last_tg = 0;
        for (int bi = 0; bi < n_batch; bi++) {
            int B = batches[bi] > 0 ? batches[bi] : 1;
            double pp = 0, tgb = 0;
            for (int r = 0; r < reps; r++) {
                pp += run_batch(m, be, w, seqs, B, &kvls[0], 0, p, true, logits) / reps;
                if (stages)   /* the stages of the last tg run */
                    kern_timed_reset(be);
                tgb += run_batch(m, be, w, seqs, B, &kvls[0], 0, n, false, logits) / reps;
            }
            last_b = B;
            last_tg = tgb;
            if (csv)
                printf("%s,%d,%s,pp%d x%d,%.2f,0\n%s,%d,%s,tg%d x%d,%.2f,0\n", base, threads,
                       kv_names[0], p, B, pp, base, threads, kv_names[0], n, B, tgb);
            else
                printf("| %s | %s | %d | %.1f | %.1f |\n", base, kv_names[0], B, pp, tgb);
        }
        if (stages && !csv && last_b > 1)
            print_stages(be, last_b, n, last_tg);
        for (int s = 0; s < max_b; s++)
            seq_close(&seqs[s], pool);
        free(seqs);
    }
    if (!csv && n_kv == 2) {
        printf("\n| depth | tg %s t/s | tg %s t/s | ratio |\n| ---: | ---: | ---: | ---: |\n",
               kv_names[0], kv_names[1]);
        for (int di = 0; di < n_depth; di++)
            printf("| %d | %.2f | %.2f | %.2fx |\n", depths[di], tg[0][di], tg[1][di],
                   tg[1][di] / tg[0][di]);
    }
    if (!csv && roof.read_gbs > 0) {
        /* Bytes a decode token reads: the weights, and the K/V of the context it attends to. */
        for (int ki = 0; ki < n_kv; ki++)
            for (int di = 0; di < n_depth; di++) {
                double bytes = (double)decode_bytes(m) +
                               (depths[di] + n / 2.0) * (double)kvls[ki].bytes_per_token;
                double most = roof.read_gbs * 1e9 / bytes;
                printf("%stg%d @ d%d, %s KV: %.0f%% of the memory roofline (%.1f GB/s / %.1f MB a "
                       "token = %.1f t/s)\n", ki + di == 0 ? "\n" : "", n, depths[di],
                       kv_names[ki], 100 * tg[ki][di] / most, roof.read_gbs,
                       bytes / 1e6, most);
                /* Where that many bytes stay in the CPU's caches (a large L3), reading them
                 * again is faster than memory: the roofline that applies then. No CPU's caches
                 * hold 2 GiB (above it, a faster reading is noise, not a cache). */
                double warm = be->host_memory && bytes <= (double)(2u << 30)
                                  ? kern_read_gbs(threads, (size_t)bytes) : 0;
                if (warm > 1.2 * roof.read_gbs)
                    printf("  (%.0f MB fit this CPU's caches: read again and again they come at "
                           "%.1f GB/s, so at most %.1f t/s; tg is %.0f%% of that)\n", bytes / 1e6,
                           warm, warm * 1e9 / bytes, 100 * tg[ki][di] / (warm * 1e9 / bytes));
            }
    }
#ifdef LLMGW_HAVE_CUDA
    kern_cuda_graph_stats gs = kern_cuda_graphs(be);
    if (!csv && gs.steps + gs.dropped > 0)
        printf("\ncuda graphs: %llu steps ran as graphs (%llu built, %llu updated in place), %llu "
               "recordings dropped\n", gs.steps, gs.built, gs.updated, gs.dropped);
#endif
    free(logits);
    eng_work_free(w);
    eng_kvpool_free(pool);   /* a buffer of be */
    kern_backend_free(be);
    eng_model_free(m);
    return 0;
}
