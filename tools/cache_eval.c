/* tools/cache_eval.c: llmgw-cache-eval — how well the semantic cache's threshold separates
 * paraphrases from look-alikes, on a CSV of question pairs (question1,question2,is_duplicate:
 * ../shared/data/cache/qqp_dev.csv). Every pair is embedded with the in-process encoder; a pair
 * "hits" when its cosine similarity reaches the threshold (and, with the guard, when the negation
 * guard lets it through). A hit on a duplicate is a true positive; a hit on a non-duplicate is a
 * wrong answer served.
 *
 *   llmgw-cache-eval -m MODEL_DIR -f qqp_dev.csv [--rows A:B] [--threshold T | --config F]
 *                    [--target-precision P] [--min-precision P] [--min-recall R]
 *                    [--dump FILE] [--no-guard]
 *
 * Prints precision / recall by threshold with and without the guard. --target-precision picks
 * the lowest threshold whose precision (with the guard) reaches P on these rows (calibration);
 * --min-precision / --min-recall exit 1 when precision / recall at the given threshold fall
 * below them (a regression test).
 * --dump writes "similarity,is_duplicate,guard verdict" per pair. */
#include "cache/guard.h"
#include "common/err.h"
#include "engine/encoder/bert_forward.h"
#include "gateway/config.h"
#include "tools/csv.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct pair {
    char *a, *b;
    int dup;
    float sim;
    bool mismatch;
    cache_guard_verdict verdict;
} pair;

/* Reads the whole file and splits it into records (a quoted field may span lines). */
static pair *read_pairs(const char *path, long from, long to, size_t *n_out)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        fprintf(stderr, "llmgw-cache-eval: %s: %s\n", path, strerror(errno));
        exit(2);
    }
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = malloc((size_t)size + 1);
    if (text == NULL || fread(text, 1, (size_t)size, f) != (size_t)size) {
        fprintf(stderr, "llmgw-cache-eval: %s: read error\n", path);
        exit(2);
    }
    text[size] = '\0';
    fclose(f);
    size_t cap = 1024, n = 0;
    pair *v = malloc(cap * sizeof *v);
    const char *p = strchr(text, '\n');  /* skip the header */
    if (p != NULL)
        p++;
    long row = 0;
    while (p != NULL && *p != '\0') {
        char *f[3] = {NULL, NULL, NULL};
        size_t flen;
        long line = 0;
        for (int k = 0; k < 3 && p != NULL; k++) {
            f[k] = tool_csv_field(&p, &flen, &line);
            if (f[k] == NULL) {
                fprintf(stderr, "llmgw-cache-eval: %s: a quoted field never closes\n", path);
                exit(2);
            }
            if (*p == ',')
                p++;
        }
        char *a = f[0], *b = f[1], *d = f[2];
        bool keep = row >= from && row < to && (d[0] == '0' || d[0] == '1');
        row++;
        if (keep) {
            if (n == cap)
                v = realloc(v, (cap *= 2) * sizeof *v);
            v[n++] = (pair){.a = a, .b = b, .dup = d[0] == '1'};
        } else {
            free(a);
            free(b);
        }
        free(d);
        p = strchr(p, '\n');  /* past anything left on the line */
        if (p != NULL)
            p++;
    }
    free(text);
    *n_out = n;
    return v;
}

static void embed_all(eng_bert_ctx *ctx, pair *v, size_t n, int dim)
{
    enum { BATCH = 32 };
    const char *texts[BATCH];
    size_t lens[BATCH];
    float *out = malloc((size_t)BATCH * (size_t)dim * sizeof *out);
    util_err err = {0};
    for (size_t i = 0; i < n; i += BATCH / 2) {
        size_t m = n - i < BATCH / 2 ? n - i : BATCH / 2;
        for (size_t j = 0; j < m; j++) {
            texts[2 * j] = v[i + j].a;
            texts[2 * j + 1] = v[i + j].b;
            lens[2 * j] = strlen(v[i + j].a);
            lens[2 * j + 1] = strlen(v[i + j].b);
        }
        if (eng_bert_encode(ctx, texts, lens, (int)(2 * m), out, NULL, &err) != 0) {
            fprintf(stderr, "llmgw-cache-eval: %s\n", err.msg);
            exit(2);
        }
        for (size_t j = 0; j < m; j++) {
            const float *x = out + 2 * j * (size_t)dim, *y = x + dim;
            double dot = 0;
            for (int d = 0; d < dim; d++)
                dot += (double)x[d] * y[d];
            v[i + j].sim = (float)dot;
        }
        if ((i / (BATCH / 2)) % 64 == 0)
            fprintf(stderr, "\r%zu/%zu pairs", i + m, n);
    }
    fprintf(stderr, "\r%zu/%zu pairs\n", n, n);
    free(out);
}

typedef struct score {
    long tp, fp, fn;
    double precision, recall;
} score;

static score evaluate(const pair *v, size_t n, double t, bool guard)
{
    score s = {0};
    for (size_t i = 0; i < n; i++) {
        bool hit = v[i].sim >= t && !(guard && v[i].mismatch);
        if (hit && v[i].dup)
            s.tp++;
        else if (hit)
            s.fp++;
        else if (v[i].dup)
            s.fn++;
    }
    s.precision = s.tp + s.fp ? (double)s.tp / (double)(s.tp + s.fp) : 1.0;
    s.recall = s.tp + s.fn ? (double)s.tp / (double)(s.tp + s.fn) : 0.0;
    return s;
}

int main(int argc, char **argv)
{
    const char *model = NULL, *file = NULL, *config = NULL, *dump = NULL;
    long from = 0, to = -1;
    double threshold = -1, target = -1, min_precision = -1, min_recall = -1;
    bool guard = true;
    static const struct option opts[] = {
        {"model", required_argument, NULL, 'm'},  {"file", required_argument, NULL, 'f'},
        {"rows", required_argument, NULL, 'r'},   {"threshold", required_argument, NULL, 't'},
        {"config", required_argument, NULL, 'c'}, {"target-precision", required_argument, NULL, 'p'},
        {"min-precision", required_argument, NULL, 'P'}, {"dump", required_argument, NULL, 'd'},
        {"no-guard", no_argument, NULL, 'G'},     {"min-recall", required_argument, NULL, 'R'},
        {NULL, 0, NULL, 0},
    };
    int c;
    while ((c = getopt_long(argc, argv, "m:f:r:t:c:p:P:R:d:G", opts, NULL)) != -1) {
        switch (c) {
        case 'm': model = optarg; break;
        case 'f': file = optarg; break;
        case 'r':
            if (sscanf(optarg, "%ld:%ld", &from, &to) != 2 || from < 0 || to <= from) {
                fprintf(stderr, "llmgw-cache-eval: --rows wants A:B with 0 <= A < B\n");
                return 2;
            }
            break;
        case 't': threshold = atof(optarg); break;
        case 'c': config = optarg; break;
        case 'p': target = atof(optarg); break;
        case 'P': min_precision = atof(optarg); break;
        case 'R': min_recall = atof(optarg); break;
        case 'd': dump = optarg; break;
        case 'G': guard = false; break;
        default:
            fprintf(stderr, "usage: llmgw-cache-eval -m MODEL_DIR -f PAIRS.csv [--rows A:B] "
                            "[--threshold T | --config FILE] [--target-precision P] "
                            "[--min-precision P] [--min-recall R] [--dump FILE] [--no-guard]\n");
            return 2;
        }
    }
    util_err err = {0};
    if (config != NULL) {
        gw_config *cfg;
        if (gw_config_load(&cfg, config, &err) != 0) {
            fprintf(stderr, "llmgw-cache-eval: %s\n", err.msg);
            return 2;
        }
        threshold = cfg->cache.threshold;
        guard = cfg->cache.guard;
        gw_config_free(cfg);
    }
    if (model == NULL || file == NULL) {
        fprintf(stderr, "llmgw-cache-eval: -m MODEL_DIR and -f PAIRS.csv are required\n");
        return 2;
    }
    if (to < 0)
        to = 1L << 40;
    size_t n;
    pair *v = read_pairs(file, from, to, &n);
    if (n == 0) {
        fprintf(stderr, "llmgw-cache-eval: no pairs in %s rows %ld:%ld\n", file, from, to);
        return 2;
    }
    eng_bert *m;
    eng_bert_ctx *ctx;
    if (eng_bert_load(&m, model, NULL, ENG_BERT_AUTO, &err) != 0 ||
        eng_bert_ctx_new(&ctx, m, 0, &err) != 0) {
        fprintf(stderr, "llmgw-cache-eval: %s\n", err.msg);
        return 2;
    }
    embed_all(ctx, v, n, eng_bert_dim(m));
    long dups = 0, guarded = 0;
    for (size_t i = 0; i < n; i++) {
        v[i].verdict = cache_guard_check(v[i].a, strlen(v[i].a), v[i].b, strlen(v[i].b));
        v[i].mismatch = v[i].verdict != CACHE_GUARD_OK;
        dups += v[i].dup;
        guarded += v[i].mismatch;
    }
    printf("%zu pairs (rows %ld..%ld), %ld duplicates; the guard flags %ld pairs\n", n, from,
           from + (long)n - 1, dups, guarded);
    printf("| threshold | precision | recall | false hits | precision (guard) | recall (guard) "
           "| false hits (guard) |\n|---:|---:|---:|---:|---:|---:|---:|\n");
    for (double t = 0.80; t < 0.995; t += 0.01) {
        score a = evaluate(v, n, t, false), b = evaluate(v, n, t, true);
        printf("| %.2f | %.4f | %.4f | %ld | %.4f | %.4f | %ld |\n", t, a.precision, a.recall,
               a.fp, b.precision, b.recall, b.fp);
    }
    int rc = 0;
    if (target > 0) {
        double best = -1;
        for (int k = 700; k <= 1000; k++) {  /* 0.001 steps */
            score s = evaluate(v, n, k / 1000.0, true);
            if (s.precision >= target) {
                best = k / 1000.0;
                break;
            }
        }
        if (best < 0) {
            printf("no threshold reaches precision %.3f\n", target);
        } else {
            score s = evaluate(v, n, best, true), u = evaluate(v, n, best, false);
            printf("calibrated: threshold %.3f gives precision %.4f recall %.4f with the guard "
                   "(%.4f / %.4f without)\n", best, s.precision, s.recall, u.precision, u.recall);
        }
    }
    if (threshold > 0) {
        score s = evaluate(v, n, threshold, guard), u = evaluate(v, n, threshold, !guard);
        printf("at threshold %.3f%s: precision %.4f recall %.4f (tp %ld fp %ld fn %ld); "
               "%s the guard: precision %.4f recall %.4f\n", threshold,
               guard ? " with the guard" : "", s.precision, s.recall, s.tp, s.fp, s.fn,
               guard ? "without" : "with", u.precision, u.recall);
        if (min_precision > 0 && s.precision < min_precision) {
            printf("FAIL: precision %.4f < %.4f\n", s.precision, min_precision);
            rc = 1;
        }
        if (min_recall > 0 && s.recall < min_recall) {
            printf("FAIL: recall %.4f < %.4f\n", s.recall, min_recall);
            rc = 1;
        }
    }
    if (dump != NULL) {
        FILE *f = fopen(dump, "w");
        if (f != NULL) {
            fprintf(f, "similarity,is_duplicate,guard\n");
            for (size_t i = 0; i < n; i++)
                fprintf(f, "%.6f,%d,%s\n", v[i].sim, v[i].dup, cache_guard_name(v[i].verdict));
            fclose(f);
        }
    }
    for (size_t i = 0; i < n; i++) {
        free(v[i].a);
        free(v[i].b);
    }
    free(v);
    eng_bert_ctx_free(ctx);
    eng_bert_free(m);
    return rc;
}
