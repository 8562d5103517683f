/* tools/cache_verifier.c: llmgw-cache-verifier — trains, calibrates and evaluates the semantic
 * cache's verifier (cache/verifier.h) on labelled question pairs.
 *
 *   llmgw-cache-verifier [DATA] --features FILE [-m MODEL_DIR] [--threads N] [--verify N]
 *   llmgw-cache-verifier [DATA] --features FILE [-m MODEL_DIR] train -o WEIGHTS
 *                        [--hidden H] [--epochs E] [--seed S] [--compare WEIGHTS]
 *   llmgw-cache-verifier [DATA] --features FILE [-m MODEL_DIR] eval -w WEIGHTS
 *                        [--split test|calib|train|all] [--rate R] [--record F | --expect F]
 *
 * DATA names the labelled sets (each optional; every set that is named is used):
 *   --qqp FILE        question1,question2,is_duplicate CSV (../shared/data/cache/qqp_dev.csv)
 *   --paws FILE       PAWS TSV: id, sentence1, sentence2, label (../shared/data/cache/paws_dev.tsv)
 *   --followups FILE  MeanCache's contextual_queries.json: each main query against its follow-up
 *                     is a pair that must NOT hit (a follow-up asks something else)
 *   --rules DIR       tests/golden/cache/rule_{paraphrases,lookalikes,others}.csv (their own
 *                     split column; made by tests/golden/cache/make_rule_pairs.py)
 *   --pairs FILE      any question1,question2,is_duplicate CSV, all of it counted as test rows
 *
 * Splits are by question, so a question is never in two splits: a hash of the lower-cased first
 * question (PAWS: sentence1; follow-ups: the main query) puts 60 % of the groups in train, 20 % in
 * calib, 20 % in test. Training sees train only; the operating points are set on calib only; every
 * figure printed by eval is on the split it names (test by default).
 *
 * Features (CACHE_VERIFIER_FEATURES per pair) are computed with the in-process encoder and kept
 * in a features cache (--features FILE: a pair's hash and the features that need the encoder;
 * those read from the texts alone are recomputed on load), so training and evaluation can run
 * without the encoder; pairs missing from it are encoded when -m is given (and the cache is rewritten).
 * --verify N re-encodes N pairs from the cache and fails when their features moved.
 *
 * train: a tanh MLP fitted by Adam on the train split, every set weighted equally; then, for each
 * false-hit rate in 0.1 % … 5 %, the lowest probability whose false hits on the calib split stay
 * within that rate on EVERY calib set with negatives (so the budget holds for the hardest kind of
 * look-alike, not just on average). --compare fails when the new weights' operating points differ
 * from a shipped file's.
 *
 * eval: precision, recall, false hits and AUC per set at the operating point for --rate (default
 * 0.01), next to the pooled cosine at the shipped threshold 0.985 with the guard, for comparison.
 * --record writes the table; --expect fails when any number moved by more than 0.01. */
#include "cache/guard.h"
#include "cache/verifier.h"
#include "common/err.h"
#include "engine/encoder/bert_forward.h"
#include "tools/csv.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NF CACHE_VERIFIER_FEATURES

enum { SPLIT_TRAIN, SPLIT_CALIB, SPLIT_TEST };
static const char *const split_names[] = {"train", "calib", "test"};

#define MAX_SETS 8

typedef struct pair {
    char *a, *b;
    int dup;
    int split;
    int set;
    uint64_t key;       /* hash of a \t b: the features cache's key */
    uint64_t group;     /* group_of(a): cross-validation folds */
    bool have;          /* features known */
    float f[NF];
    float prob;
} pair;

typedef struct pairs {
    pair *v;
    size_t n, cap;
    const char *set_names[MAX_SETS];
    int n_sets;
} pairs;

__attribute__((format(printf, 1, 2), noreturn)) static void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "llmgw-cache-verifier: ");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(2);
}

static uint64_t fnv(const char *s, size_t n, uint64_t h)
{
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

/* A question's group: a hash of its lower-cased, trimmed text. */
static uint64_t group_of(const char *s)
{
    while (*s == ' ')
        s++;
    size_t n = strlen(s);
    while (n > 0 && (s[n - 1] == ' ' || s[n - 1] == '\n' || s[n - 1] == '\r'))
        n--;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        h = (h ^ (c >= 'A' && c <= 'Z' ? c + 32u : c)) * 1099511628211ull;
    }
    return h;
}

/* The group's split: 60 % train, 20 % calib, 20 % test. */
static int split_of(const char *s)
{
    int x = (int)((group_of(s) >> 17) % 10);
    return x < 6 ? SPLIT_TRAIN : x < 8 ? SPLIT_CALIB : SPLIT_TEST;
}

static int add_set(pairs *p, const char *name)
{
    if (p->n_sets == MAX_SETS)
        die("too many sets");
    p->set_names[p->n_sets] = name;
    return p->n_sets++;
}

static void add(pairs *p, char *a, char *b, int dup, int split, int set)
{
    if (p->n == p->cap) {
        p->cap = p->cap ? 2 * p->cap : 4096;
        p->v = realloc(p->v, p->cap * sizeof *p->v);
        if (p->v == NULL)
            die("out of memory");
    }
    pair *x = &p->v[p->n++];
    memset(x, 0, sizeof *x);
    x->a = a;
    x->b = b;
    x->dup = dup;
    x->split = split;
    x->set = set;
    x->group = group_of(a);
    x->key = fnv(b, strlen(b), fnv("\t", 1, fnv(a, strlen(a), 1469598103934665603ull)));
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        die("%s: %s", path, strerror(errno));
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = malloc((size_t)size + 1);
    if (text == NULL || fread(text, 1, (size_t)size, f) != (size_t)size)
        die("%s: read error", path);
    text[size] = '\0';
    fclose(f);
    return text;
}

/* A CSV whose first three columns are question1,question2,is_duplicate; with_split: the fourth
 * is the split's name (the rule-made files). forced >= 0: every row gets that split. */
static void read_csv(pairs *p, const char *path, const char *set_name, bool with_split,
                     int forced)
{
    int set = add_set(p, set_name);
    char *text = slurp(path);
    const char *s = strchr(text, '\n');
    if (s != NULL)
        s++;
    while (s != NULL && *s != '\0') {
        char *f[4] = {NULL, NULL, NULL, NULL};
        int nf = with_split ? 4 : 3;
        size_t len;
        long line = 0;
        for (int k = 0; k < nf; k++) {
            f[k] = tool_csv_field(&s, &len, &line);
            if (f[k] == NULL)
                die("%s: a quoted field never closes", path);
            if (*s == ',')
                s++;
        }
        int split = forced;
        if (with_split)
            split = !strcmp(f[3], "train") ? SPLIT_TRAIN : !strcmp(f[3], "calib") ? SPLIT_CALIB
                  : !strcmp(f[3], "test") ? SPLIT_TEST : -1;
        else if (forced < 0)
            split = split_of(f[0]);
        if ((f[2][0] == '0' || f[2][0] == '1') && split >= 0 && f[0][0] && f[1][0]) {
            add(p, f[0], f[1], f[2][0] == '1', split, set);
        } else {
            free(f[0]);
            free(f[1]);
        }
        free(f[2]);
        free(f[3]);
        s = strchr(s, '\n');
        if (s != NULL)
            s++;
    }
    free(text);
}

static void read_paws(pairs *p, const char *path)
{
    int set = add_set(p, "paws");
    char *text = slurp(path);
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line != NULL;
         line = strtok_r(NULL, "\n", &save)) {
        char *col[4];
        int n = 0;
        char *c = line;
        while (n < 4) {
            col[n++] = c;
            c = strchr(c, '\t');
            if (c == NULL)
                break;
            *c++ = '\0';
        }
        if (n < 4 || (col[3][0] != '0' && col[3][0] != '1') || !strcmp(col[0], "id"))
            continue;
        add(p, strdup(col[1]), strdup(col[2]), col[3][0] == '1', split_of(col[1]), set);
    }
    free(text);
}

static void read_followups(pairs *p, const char *path)
{
    int set = add_set(p, "followups");
    char *text = slurp(path);
    cJSON *root = cJSON_Parse(text);
    free(text);
    if (!cJSON_IsArray(root))
        die("%s: not a JSON array", path);
    const cJSON *it;
    cJSON_ArrayForEach(it, root) {
        const cJSON *m = cJSON_GetObjectItemCaseSensitive(it, "Main Query");
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(it, "Follow-Up Query");
        if (cJSON_IsString(m) && cJSON_IsString(f))
            add(p, strdup(m->valuestring), strdup(f->valuestring), 0, split_of(m->valuestring),
                set);
    }
    cJSON_Delete(root);
}

/* ---- the features cache ----------------------------------------------------------------------- */

/* Only the features that need the encoder are kept (the texts give the rest on load): after the
 * magic, u32 the build's feature count, u32 how many are kept, u64 the pair count; then per pair
 * its key and the kept features in feature order. */
#define CACHE_MAGIC "llmgw-verifier-features 2\n"

static uint32_t kept_features(void)
{
    uint32_t n = 0;
    for (int j = 0; j < NF; j++)
        n += !cache_verifier_feature_from_text(j);
    return n;
}

static bool read_kept(FILE *f, float *x)
{
    for (int j = 0; j < NF; j++)
        if (!cache_verifier_feature_from_text(j) && fread(&x[j], 4, 1, f) != 1)
            return false;
    return true;
}

static void write_kept(FILE *f, const float *x)
{
    for (int j = 0; j < NF; j++)
        if (!cache_verifier_feature_from_text(j))
            fwrite(&x[j], 4, 1, f);
}

typedef struct fentry {
    uint64_t key;
    float f[NF];
} fentry;

static int cmp_fentry(const void *a, const void *b)
{
    uint64_t x = ((const fentry *)a)->key, y = ((const fentry *)b)->key;
    return x < y ? -1 : x > y;
}

/* Fills the features of every pair the cache knows; returns how many were missing. */
static size_t cache_fill(pairs *p, const char *path)
{
    size_t missing = 0;
    FILE *f = fopen(path, "rb");
    fentry *e = NULL;
    size_t n = 0;
    if (f != NULL) {
        char magic[sizeof CACHE_MAGIC];
        uint32_t nf = 0, kept = 0;
        uint64_t cnt = 0;
        if (fread(magic, 1, sizeof CACHE_MAGIC - 1, f) != sizeof CACHE_MAGIC - 1 ||
            memcmp(magic, CACHE_MAGIC, sizeof CACHE_MAGIC - 1) != 0 ||
            fread(&nf, 4, 1, f) != 1 || fread(&kept, 4, 1, f) != 1 ||
            fread(&cnt, 8, 1, f) != 1 || nf != NF || kept != kept_features() ||
            cnt > (1u << 26))
            die("%s: not a features cache for this build's features", path);
        n = (size_t)cnt;
        e = calloc(n ? n : 1, sizeof *e);
        for (size_t i = 0; i < n; i++)
            if (fread(&e[i].key, 8, 1, f) != 1 || !read_kept(f, e[i].f))
                die("%s: truncated", path);
        fclose(f);
    }
    for (size_t i = 0; i < p->n; i++) {
        fentry k = {.key = p->v[i].key};
        fentry *hit = n ? bsearch(&k, e, n, sizeof *e, cmp_fentry) : NULL;
        if (hit != NULL) {
            memcpy(p->v[i].f, hit->f, sizeof hit->f);
            p->v[i].have = true;
        } else {
            missing++;
        }
    }
    free(e);
    return missing;
}

static void cache_write(const pairs *p, const char *path)
{
    fentry *e = malloc((p->n ? p->n : 1) * sizeof *e);
    size_t n = 0;
    for (size_t i = 0; i < p->n; i++)
        if (p->v[i].have) {
            e[n].key = p->v[i].key;
            memcpy(e[n].f, p->v[i].f, sizeof e[n].f);
            n++;
        }
    qsort(e, n, sizeof *e, cmp_fentry);
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        if (m == 0 || e[m - 1].key != e[i].key)
            e[m++] = e[i];
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (f == NULL)
        die("%s: %s", tmp, strerror(errno));
    uint32_t nf = NF, kept = kept_features();
    uint64_t cnt = m;
    fwrite(CACHE_MAGIC, 1, sizeof CACHE_MAGIC - 1, f);
    fwrite(&nf, 4, 1, f);
    fwrite(&kept, 4, 1, f);
    fwrite(&cnt, 8, 1, f);
    for (size_t i = 0; i < m; i++) {
        fwrite(&e[i].key, 8, 1, f);
        write_kept(f, e[i].f);
    }
    if (ferror(f) | (fclose(f) != 0) || rename(tmp, path) != 0)
        die("%s: write error", path);
    free(e);
    fprintf(stderr, "features cache %s: %zu pairs\n", path, m);
}

/* Encodes the pairs (all of them, or only those without features) and computes their features.
 * Always with the f32 encoder, so that the committed cache and --verify reproduce on every host
 * (AUTO is BF16 where the CPU has AVX512-BF16: a count feature near its threshold flipped by
 * 0.125 between the two on a Sapphire Rapids host). */
static void compute(pair **todo, size_t n, const char *model_dir, int threads)
{
    eng_bert *m;
    eng_bert_ctx *ctx;
    util_err err = {0};
    if (eng_bert_load(&m, model_dir, NULL, ENG_BERT_F32, &err) != 0 ||
        eng_bert_ctx_new(&ctx, m, threads, &err) != 0)
        die("%s", err.msg);
    int dim = eng_bert_dim(m);
    enum { BATCH = 32 };
    const char *texts[BATCH];
    size_t lens[BATCH];
    float *out = malloc((size_t)BATCH * (size_t)dim * sizeof *out);
    for (size_t i = 0; i < n; i += BATCH / 2) {
        size_t k = n - i < BATCH / 2 ? n - i : BATCH / 2;
        for (size_t j = 0; j < k; j++) {
            texts[2 * j] = todo[i + j]->a;
            texts[2 * j + 1] = todo[i + j]->b;
            lens[2 * j] = strlen(todo[i + j]->a);
            lens[2 * j + 1] = strlen(todo[i + j]->b);
        }
        if (eng_bert_encode(ctx, texts, lens, (int)(2 * k), out, NULL, &err) != 0)
            die("%s", err.msg);
        for (size_t j = 0; j < k; j++) {
            cache_verifier_side s[2];
            uint8_t *blob[2];
            for (int w = 0; w < 2; w++) {
                int nt;
                const float *tok = eng_bert_token_vectors(ctx, (int)(2 * j) + w, &nt);
                size_t bl = 0;
                blob[w] = cache_tokens_pack(tok, nt, dim, &bl);
                s[w] = (cache_verifier_side){.text = texts[2 * j + w], .len = lens[2 * j + w],
                                             .vec = out + (2 * j + w) * (size_t)dim,
                                             .tok = blob[w], .tok_len = bl};
            }
            if (cache_verifier_features(&s[0], &s[1], dim, todo[i + j]->f) != 0)
                die("features failed on \"%s\"", todo[i + j]->a);
            todo[i + j]->have = true;
            free(blob[0]);
            free(blob[1]);
        }
        if ((i / (BATCH / 2)) % 32 == 0)
            fprintf(stderr, "\r%zu/%zu pairs encoded", i + k, n);
    }
    fprintf(stderr, "\r%zu/%zu pairs encoded\n", n, n);
    free(out);
    eng_bert_ctx_free(ctx);
    eng_bert_free(m);
}

/* ---- training ------------------------------------------------------------------------------- */

static uint64_t rng_state = 88172645463325252ull;

static double rng_unit(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) / 9007199254740992.0;
}

static double rng_normal(void)
{
    double u = rng_unit(), v = rng_unit();
    return sqrt(-2 * log(u + 1e-300)) * cos(6.283185307179586 * v);
}

static void train(cache_verifier *v, pairs *p, int epochs, uint64_t seed)
{
    rng_state = seed * 2654435761ull + 88172645463325252ull;
    size_t n = 0;
    pair **tr = malloc(p->n * sizeof *tr);
    size_t per_set[MAX_SETS] = {0};
    for (size_t i = 0; i < p->n; i++)
        if (p->v[i].split == SPLIT_TRAIN && p->v[i].have) {
            tr[n++] = &p->v[i];
            per_set[p->v[i].set]++;
        }
    if (n == 0)
        die("no training rows");
    int used_sets = 0;
    for (int s = 0; s < p->n_sets; s++)
        used_sets += per_set[s] > 0;
    /* standardisation on the train rows */
    for (int j = 0; j < NF; j++) {
        double s = 0, s2 = 0;
        for (size_t i = 0; i < n; i++) {
            s += tr[i]->f[j];
            s2 += (double)tr[i]->f[j] * tr[i]->f[j];
        }
        double mu = s / n, var = s2 / n - mu * mu;
        v->mean[j] = (float)mu;
        v->std[j] = (float)(var > 1e-12 ? sqrt(var) : 1.0);
    }
    int H = v->hidden;
    size_t nw = (size_t)NF * H + H + H + 1;
    double *w = calloc(nw, sizeof *w), *g = calloc(nw, sizeof *g), *m1 = calloc(nw, sizeof *m1),
           *m2 = calloc(nw, sizeof *m2);
    double *W1 = w, *B1 = w + (size_t)NF * H, *W2 = B1 + H, *B2 = W2 + H;
    double *G1 = g, *GB1 = g + (size_t)NF * H, *G2 = GB1 + H, *GB2 = G2 + H;
    for (size_t i = 0; i < (size_t)NF * H; i++)
        W1[i] = rng_normal() / sqrt((double)NF);
    for (int h = 0; h < H; h++)
        W2[h] = rng_normal() / sqrt((double)H);
    /* every set carries the same total weight */
    double set_w[MAX_SETS];
    for (int s = 0; s < p->n_sets; s++)
        set_w[s] = per_set[s] ? (double)n / (double)(used_sets * per_set[s]) : 0;
    const char *env = getenv("LLMGW_VERIFIER_SET_WEIGHTS");  /* experiments: "qqp=3,paws=2" */
    for (int s = 0; env != NULL && s < p->n_sets; s++) {
        const char *at = strstr(env, p->set_names[s]);
        if (at != NULL && at[strlen(p->set_names[s])] == '=')
            set_w[s] *= atof(at + strlen(p->set_names[s]) + 1);
    }
    const double lr = 3e-3, l2 = 1e-4, b1c = 0.9, b2c = 0.999;
    const size_t batch = 256;
    long step = 0;
    double z[NF], hid[CACHE_VERIFIER_MAX_HIDDEN];
    for (int ep = 0; ep < epochs; ep++) {
        for (size_t i = n - 1; i > 0; i--) {  /* shuffle */
            size_t j = (size_t)(rng_unit() * (double)(i + 1));
            pair *t = tr[i];
            tr[i] = tr[j];
            tr[j] = t;
        }
        double loss = 0;
        for (size_t b0 = 0; b0 < n; b0 += batch) {
            size_t be = b0 + batch < n ? b0 + batch : n;
            memset(g, 0, nw * sizeof *g);
            double wsum = 0;
            for (size_t r = b0; r < be; r++) {
                const pair *x = tr[r];
                double sw = set_w[x->set];
                wsum += sw;
                for (int j = 0; j < NF; j++)
                    z[j] = (x->f[j] - v->mean[j]) / v->std[j];
                double o = *B2;
                for (int h = 0; h < H; h++) {
                    double s = B1[h];
                    for (int j = 0; j < NF; j++)
                        s += z[j] * W1[(size_t)j * H + h];
                    hid[h] = tanh(s);
                    o += hid[h] * W2[h];
                }
                double pr = 1 / (1 + exp(-o));
                loss -= sw * (x->dup ? log(pr + 1e-12) : log(1 - pr + 1e-12));
                double d = sw * (pr - x->dup);
                *GB2 += d;
                for (int h = 0; h < H; h++) {
                    G2[h] += d * hid[h];
                    double dh = d * W2[h] * (1 - hid[h] * hid[h]);
                    GB1[h] += dh;
                    for (int j = 0; j < NF; j++)
                        G1[(size_t)j * H + h] += dh * z[j];
                }
            }
            step++;
            for (size_t i = 0; i < nw; i++) {
                double gi = g[i] / wsum + (i < (size_t)NF * H || (i >= (size_t)NF * H + H &&
                                                                   i < nw - 1) ? l2 * w[i] : 0);
                m1[i] = b1c * m1[i] + (1 - b1c) * gi;
                m2[i] = b2c * m2[i] + (1 - b2c) * gi * gi;
                double mh = m1[i] / (1 - pow(b1c, (double)step));
                double vh = m2[i] / (1 - pow(b2c, (double)step));
                w[i] -= lr * mh / (sqrt(vh) + 1e-8);
            }
        }
        if (ep % 10 == 0 || ep == epochs - 1)
            fprintf(stderr, "epoch %d: weighted log loss %.4f\n", ep, loss / (double)n);
    }
    for (size_t i = 0; i < (size_t)NF * H; i++)
        v->w1[i] = (float)W1[i];
    for (int h = 0; h < H; h++) {
        v->b1[h] = (float)B1[h];
        v->w2[h] = (float)W2[h];
    }
    v->b2 = (float)*B2;
    free(w);
    free(g);
    free(m1);
    free(m2);
    free(tr);
}

static int cmp_float_desc(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return x > y ? -1 : x < y;
}

static const double RATES[] = {0.001, 0.002, 0.005, 0.01, 0.02, 0.05};
#define MIN_CALIB_NEGATIVES 50

/* Whether set s takes part in calibration (on: a comma-separated list of set names; NULL: all). */
static bool calibrates(const pairs *p, int s, const char *on)
{
    if (on == NULL)
        return true;
    size_t k = strlen(p->set_names[s]);
    for (const char *at = on; (at = strstr(at, p->set_names[s])) != NULL; at += k)
        if ((at == on || at[-1] == ',') && (at[k] == ',' || at[k] == '\0'))
            return true;
    return false;
}

/* The lowest probability at which at most `rate` of set s's calib negatives are served (neg: room
 * for every pair), or -1 when the set has too few calib negatives to say. */
static double set_threshold(const pairs *p, int s, double rate, float *neg)
{
    size_t k = 0;
    for (size_t i = 0; i < p->n; i++)
        if (p->v[i].set == s && p->v[i].split == SPLIT_CALIB && !p->v[i].dup && p->v[i].have)
            neg[k++] = p->v[i].prob;
    if (k < MIN_CALIB_NEGATIVES)
        return -1;
    qsort(neg, k, sizeof *neg, cmp_float_desc);
    size_t allowed = (size_t)floor(rate * (double)k);
    /* at most `allowed` negatives may reach the threshold */
    return allowed < k ? nextafterf(neg[allowed], 2.0f) : 0;
}

/* The operating points, from the calib split of the sets named in `on`. */
static void calibrate(cache_verifier *v, pairs *p, const char *on, FILE *log)
{
    v->n_points = 0;
    float *neg = malloc(p->n * sizeof *neg);
    for (size_t r = 0; r < sizeof RATES / sizeof RATES[0]; r++) {
        double thr = 0;
        const char *by = "-";
        for (int s = 0; s < p->n_sets; s++) {
            double t = calibrates(p, s, on) ? set_threshold(p, s, RATES[r], neg) : -1;
            if (t > thr) {
                thr = t;
                by = p->set_names[s];
            }
        }
        if (thr > 1)
            thr = 1;
        v->points[v->n_points++] = (cache_verifier_point){RATES[r], thr};
        if (log != NULL)
            fprintf(log, "# point %.3f: threshold %.6f (set by %s)\n", RATES[r], thr, by);
    }
    free(neg);
}

/* ---- evaluation ----------------------------------------------------------------------------- */

typedef struct row {
    const char *set;
    long n, pos, neg, tp, fp;
    double recall, fh_rate, precision, auc;
    long base_tp, base_fp;
} row;

static int cmp_prob_asc(const void *a, const void *b)
{
    const pair *x = *(pair *const *)a, *y = *(pair *const *)b;
    return x->prob < y->prob ? -1 : x->prob > y->prob;
}

static double auc_of(pair **v, size_t n)
{
    qsort(v, n, sizeof *v, cmp_prob_asc);
    double rank_sum = 0;
    long pos = 0;
    for (size_t i = 0; i < n;) {
        size_t j = i;
        while (j < n && v[j]->prob == v[i]->prob)
            j++;
        double r = (double)(i + j + 1) / 2;  /* 1-based mean rank of ties */
        for (size_t k = i; k < j; k++)
            if (v[k]->dup) {
                rank_sum += r;
                pos++;
            }
        i = j;
    }
    long neg = (long)n - pos;
    if (pos == 0 || neg == 0)
        return NAN;
    return (rank_sum - (double)pos * (pos + 1) / 2) / ((double)pos * neg);
}

static int eval_rows(pairs *p, int split, double thr, row *out)
{
    int k = 0;
    pair **sel = malloc(p->n * sizeof *sel);
    for (int s = 0; s < p->n_sets; s++) {
        row r = {.set = p->set_names[s]};
        size_t m = 0;
        for (size_t i = 0; i < p->n; i++) {
            pair *x = &p->v[i];
            if (x->set != s || !x->have || (split >= 0 && x->split != split))
                continue;
            sel[m++] = x;
            r.n++;
            r.pos += x->dup;
            r.neg += !x->dup;
            bool hit = x->prob >= thr;
            r.tp += hit && x->dup;
            r.fp += hit && !x->dup;
            /* the shipped cosine (0.985) with the guard, for comparison */
            bool base = x->f[0] >= 0.985f && cache_guard_check(x->a, strlen(x->a), x->b,
                                                               strlen(x->b)) == CACHE_GUARD_OK;
            r.base_tp += base && x->dup;
            r.base_fp += base && !x->dup;
        }
        if (r.n == 0)
            continue;
        r.recall = r.pos ? (double)r.tp / r.pos : NAN;
        r.fh_rate = r.neg ? (double)r.fp / r.neg : NAN;
        r.precision = r.tp + r.fp ? (double)r.tp / (r.tp + r.fp) : NAN;
        r.auc = auc_of(sel, m);
        out[k++] = r;
    }
    free(sel);
    return k;
}

static void print_rows(FILE *f, const row *r, int n, const char *split, double rate, double thr)
{
    fprintf(f, "# split %s, operating point for a false-hit budget of %.3g: probability >= %.6f\n",
            split, rate, thr);
    fprintf(f, "# set n positives negatives recall false_hits false_hit_rate precision auc"
               " | cosine>=0.985+guard: recall false_hit_rate\n");
    for (int i = 0; i < n; i++)
        fprintf(f, "%s %ld %ld %ld %.4f %ld %.4f %.4f %.4f | %.4f %.4f\n", r[i].set, r[i].n,
                r[i].pos, r[i].neg, r[i].recall, r[i].fp, r[i].fh_rate, r[i].precision, r[i].auc,
                r[i].pos ? (double)r[i].base_tp / r[i].pos : NAN,
                r[i].neg ? (double)r[i].base_fp / r[i].neg : NAN);
}

/* Compares the table with a recorded one: each set's recall, false-hit rate, precision and AUC
 * within 0.01. */
static int expect_rows(const char *path, const row *r, int n)
{
    FILE *f = fopen(path, "r");
    if (f == NULL)
        die("%s: %s", path, strerror(errno));
    char line[1024];
    int bad = 0, seen = 0;
    while (fgets(line, sizeof line, f) != NULL) {
        if (line[0] == '#')
            continue;
        char set[64];
        long nn, pos, neg, fp;
        double rec, fhr, prec, auc;
        if (sscanf(line, "%63s %ld %ld %ld %lf %ld %lf %lf %lf", set, &nn, &pos, &neg, &rec, &fp,
                   &fhr, &prec, &auc) != 9)
            continue;
        int i = 0;
        while (i < n && strcmp(r[i].set, set) != 0)
            i++;
        if (i == n) {
            fprintf(stderr, "FAIL: set %s is recorded but was not evaluated\n", set);
            bad++;
            continue;
        }
        seen++;
        const double got[4] = {r[i].recall, r[i].fh_rate, r[i].precision, r[i].auc};
        const double want[4] = {rec, fhr, prec, auc};
        static const char *const what[4] = {"recall", "false-hit rate", "precision", "AUC"};
        for (int k = 0; k < 4; k++) {
            bool both_nan = isnan(got[k]) && isnan(want[k]);
            if (!both_nan && !(fabs(got[k] - want[k]) <= 0.01)) {
                fprintf(stderr, "FAIL: %s %s is %.4f, recorded %.4f\n", set, what[k], got[k],
                        want[k]);
                bad++;
            }
        }
    }
    fclose(f);
    if (seen == 0) {
        fprintf(stderr, "FAIL: %s records no sets\n", path);
        bad++;
    }
    return bad;
}

/* vCache's question, asked of our data: would a threshold per kind of traffic (each set
 * calibrated on its own calib negatives, as a per-namespace adaptation would) serve more than the
 * one global operating point at the same budget? Printed as "what each set would get". */
static void per_set(pairs *p, double rate, double global)
{
    printf("# per-set adaptation: each set's own threshold for %.3g false hits on its calib "
           "negatives, on its test rows\n", rate);
    printf("# set own_threshold recall false_hit_rate | global %.4f: recall false_hit_rate\n",
           global);
    float *neg = malloc(p->n * sizeof *neg);
    for (int s = 0; s < p->n_sets; s++) {
        double t = set_threshold(p, s, rate, neg);
        if (t < 0)
            continue;
        long pos = 0, negs = 0, tp = 0, fp = 0, gtp = 0, gfp = 0;
        for (size_t i = 0; i < p->n; i++) {
            const pair *x = &p->v[i];
            if (x->set != s || x->split != SPLIT_TEST || !x->have)
                continue;
            pos += x->dup;
            negs += !x->dup;
            tp += x->dup && x->prob >= t;
            fp += !x->dup && x->prob >= t;
            gtp += x->dup && x->prob >= global;
            gfp += !x->dup && x->prob >= global;
        }
        printf("%s %.4f %.4f %.4f | %.4f %.4f\n", p->set_names[s], t,
               pos ? (double)tp / pos : NAN, negs ? (double)fp / negs : NAN,
               pos ? (double)gtp / pos : NAN, negs ? (double)gfp / negs : NAN);
    }
    free(neg);
}

/* Grouped K-fold cross-validation: fold f is the test rows, fold f+1 the calib rows, the rest
 * train (whole questions per fold, every set, the rule files' own split column ignored). Per set:
 * each fold's recall and false-hit rate at the point for `rate`, then their mean and worst. */
static void cross_validate(pairs *p, int folds, int hidden, int epochs, uint64_t seed,
                           const char *on, double rate)
{
    int *saved = malloc(p->n * sizeof *saved);
    double rec[MAX_SETS][32], fhr[MAX_SETS][32], prec[MAX_SETS][32];
    bool seen[MAX_SETS] = {0};
    for (size_t i = 0; i < p->n; i++)
        saved[i] = p->v[i].split;
    printf("# grouped %d-fold cross-validation (fold f: test; fold f+1: calib; the rest: train), "
           "operating point for %.3g\n# fold set recall false_hit_rate precision\n", folds, rate);
    for (int f = 0; f < folds; f++) {
        for (size_t i = 0; i < p->n; i++) {
            int k = (int)((p->v[i].group >> 23) % (uint64_t)folds);
            p->v[i].split = k == f ? SPLIT_TEST : k == (f + 1) % folds ? SPLIT_CALIB : SPLIT_TRAIN;
        }
        cache_verifier *v;
        util_err err = {0};
        if (cache_verifier_new(&v, hidden, &err) != 0)
            die("%s", err.msg);
        train(v, p, epochs, seed);
        for (size_t i = 0; i < p->n; i++)
            p->v[i].prob = (float)cache_verifier_prob(v, p->v[i].f);
        calibrate(v, p, on, NULL);
        double thr = cache_verifier_threshold(v, rate, NULL);
        row r[MAX_SETS];
        int n = eval_rows(p, SPLIT_TEST, thr, r);
        for (int k = 0; k < n; k++) {
            int s = 0;
            while (strcmp(p->set_names[s], r[k].set) != 0)
                s++;
            seen[s] = true;
            rec[s][f] = r[k].recall;
            fhr[s][f] = r[k].fh_rate;
            prec[s][f] = r[k].precision;
            printf("%d %s %.4f %.4f %.4f\n", f, r[k].set, r[k].recall, r[k].fh_rate,
                   r[k].precision);
        }
        cache_verifier_free(v);
    }
    printf("# set | recall: mean worst | false_hit_rate: mean worst | precision: mean worst\n");
    for (int s = 0; s < p->n_sets; s++) {
        if (!seen[s])
            continue;
        double m[3] = {0}, w[3] = {INFINITY, -INFINITY, INFINITY};
        int cnt[3] = {0};
        for (int f = 0; f < folds; f++) {
            const double x[3] = {rec[s][f], fhr[s][f], prec[s][f]};
            for (int j = 0; j < 3; j++) {
                if (isnan(x[j]))
                    continue;
                m[j] += x[j];
                cnt[j]++;
                w[j] = j == 1 ? fmax(w[j], x[j]) : fmin(w[j], x[j]);
            }
        }
        printf("%s |", p->set_names[s]);
        for (int j = 0; j < 3; j++)
            if (cnt[j] > 0)
                printf(" %.4f %.4f |", m[j] / cnt[j], w[j]);
            else
                printf(" - - |");
        putchar('\n');
    }
    for (size_t i = 0; i < p->n; i++)
        p->v[i].split = saved[i];
    free(saved);
}

/* ---- main ----------------------------------------------------------------------------------- */

static void usage(void)
{
    fprintf(stderr,
            "usage: llmgw-cache-verifier [--qqp F] [--paws F] [--followups F] [--rules DIR]\n"
            "         [--pairs F] --features FILE [-m MODEL_DIR] [--threads N] [--verify N]\n"
            "         [train -o WEIGHTS [--hidden H] [--epochs E] [--seed S] [--compare W]\n"
            "                [--calibrate-on SET,SET,...]]\n"
            "         [cv [--folds K] [--rate R] (and train's options)]\n"
            "         [eval -w WEIGHTS [--split test|calib|train|all] [--rate R]\n"
            "               [--record F | --expect F] [--dump CSV]]\n");
    exit(2);
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"qqp", required_argument, 0, 'q'},      {"paws", required_argument, 0, 'p'},
        {"followups", required_argument, 0, 'f'}, {"rules", required_argument, 0, 'r'},
        {"pairs", required_argument, 0, 'P'},    {"features", required_argument, 0, 'F'},
        {"model", required_argument, 0, 'm'},    {"threads", required_argument, 0, 't'},
        {"verify", required_argument, 0, 'V'},   {"out", required_argument, 0, 'o'},
        {"hidden", required_argument, 0, 'H'},   {"epochs", required_argument, 0, 'e'},
        {"seed", required_argument, 0, 's'},     {"compare", required_argument, 0, 'c'},
        {"weights", required_argument, 0, 'w'},  {"split", required_argument, 0, 'S'},
        {"rate", required_argument, 0, 'R'},     {"record", required_argument, 0, 'x'},
        {"expect", required_argument, 0, 'X'},   {"dump", required_argument, 0, 'D'},
        {"calibrate-on", required_argument, 0, 'C'}, {"folds", required_argument, 0, 'k'},
        {0, 0, 0, 0},
    };
    pairs p = {0};
    const char *features = NULL, *model = NULL, *out = NULL, *compare = NULL, *weights = NULL;
    const char *record = NULL, *expect = NULL, *split_name = "test", *dump = NULL;
    const char *calibrate_on = NULL;
    int folds = 5;
    int threads = 0, verify = 0, hidden = 32, epochs = 40;
    uint64_t seed = 1;
    double rate = 0.01;
    const char *mode = NULL;
    int c;
    char path[4096];
    while ((c = getopt_long(argc, argv, "m:o:w:", opts, NULL)) != -1) {
        switch (c) {
        case 'q': read_csv(&p, optarg, "qqp", false, -1); break;
        case 'p': read_paws(&p, optarg); break;
        case 'f': read_followups(&p, optarg); break;
        case 'r':
            snprintf(path, sizeof path, "%s/rule_paraphrases.csv", optarg);
            read_csv(&p, path, "rule_paraphrases", true, -1);
            snprintf(path, sizeof path, "%s/rule_lookalikes.csv", optarg);
            read_csv(&p, path, "rule_lookalikes", true, -1);
            snprintf(path, sizeof path, "%s/rule_others.csv", optarg);
            read_csv(&p, path, "rule_others", true, -1);
            break;
        case 'P': read_csv(&p, optarg, "pairs", false, SPLIT_TEST); break;
        case 'F': features = optarg; break;
        case 'm': model = optarg; break;
        case 't': threads = atoi(optarg); break;
        case 'V': verify = atoi(optarg); break;
        case 'o': out = optarg; break;
        case 'H': hidden = atoi(optarg); break;
        case 'e': epochs = atoi(optarg); break;
        case 's': seed = strtoull(optarg, NULL, 10); break;
        case 'c': compare = optarg; break;
        case 'w': weights = optarg; break;
        case 'S': split_name = optarg; break;
        case 'R': rate = atof(optarg); break;
        case 'x': record = optarg; break;
        case 'X': expect = optarg; break;
        case 'D': dump = optarg; break;
        case 'C': calibrate_on = optarg; break;
        case 'k': folds = atoi(optarg); break;
        default: usage();
        }
    }
    if (optind < argc)                 /* getopt moved the mode word behind the options */
        mode = argv[optind++];
    if (optind < argc || p.n == 0 || features == NULL)
        usage();
    size_t missing = cache_fill(&p, features);
    for (size_t i = 0; i < p.n; i++)  /* the text's features are always today's */
        if (p.v[i].have)
            cache_verifier_text_features(p.v[i].a, strlen(p.v[i].a), p.v[i].b, strlen(p.v[i].b),
                                         p.v[i].f);
    fprintf(stderr, "%zu pairs in %d sets, %zu without cached features\n", p.n, p.n_sets, missing);
    if (missing > 0) {
        if (model == NULL)
            die("%s lacks some pairs' features: give -m MODEL_DIR to compute them", features);
        pair **todo = malloc(missing * sizeof *todo);
        size_t k = 0;
        for (size_t i = 0; i < p.n; i++)
            if (!p.v[i].have)
                todo[k++] = &p.v[i];
        compute(todo, k, model, threads);
        free(todo);
        cache_write(&p, features);
    }
    int rc = 0;
    if (verify > 0) {
        if (model == NULL)
            die("--verify needs -m MODEL_DIR");
        size_t k = (size_t)verify < p.n ? (size_t)verify : p.n;
        pair **todo = malloc(k * sizeof *todo);
        float (*old)[NF] = malloc(k * sizeof *old);
        for (size_t i = 0; i < k; i++) {
            todo[i] = &p.v[(i * 7919) % p.n];
            memcpy(old[i], todo[i]->f, sizeof old[i]);
        }
        compute(todo, k, model, threads);
        double worst = 0;
        for (size_t i = 0; i < k; i++)
            for (int j = 0; j < NF; j++) {
                /* the BF16 and f32 encoders differ a little: counts and flags must agree, the
                 * similarities within 0.02 */
                double d = fabs((double)old[i][j] - todo[i]->f[j]);
                if (d > worst)
                    worst = d;
            }
        printf("--verify %zu pairs: largest feature change %.4f\n", k, worst);
        if (worst > 0.05) {
            fprintf(stderr, "FAIL: cached features differ from fresh ones by %.4f\n", worst);
            rc = 1;
        }
        free(todo);
        free(old);
    }
    util_err err = {0};
    if (mode == NULL) {
        /* features only (and --verify) */
    } else if (!strcmp(mode, "train")) {
        if (out == NULL)
            usage();
        cache_verifier *v;
        if (cache_verifier_new(&v, hidden, &err) != 0)
            die("%s", err.msg);
        train(v, &p, epochs, seed);
        for (size_t i = 0; i < p.n; i++)
            p.v[i].prob = (float)cache_verifier_prob(v, p.v[i].f);
        char *comment = NULL;
        size_t clen = 0;
        FILE *cf = open_memstream(&comment, &clen);
        fprintf(cf, "# llmgw-cache-verifier train: %d tanh units, %d epochs of Adam, seed %llu; "
                    "every set weighted equally\n# command:", hidden, epochs,
                (unsigned long long)seed);
        for (int i = 1; i < argc; i++)
            fprintf(cf, " %s", argv[i]);
        fputc('\n', cf);
        for (int s = 0; s < p.n_sets; s++) {
            long cnt[3] = {0};
            for (size_t i = 0; i < p.n; i++)
                if (p.v[i].set == s)
                    cnt[p.v[i].split]++;
            fprintf(cf, "# set %s: train %ld, calib %ld, test %ld pairs\n", p.set_names[s],
                    cnt[0], cnt[1], cnt[2]);
        }
        fprintf(cf, "# operating points: calibrated on the calib split, every set with >= %d "
                    "negatives kept within the rate (sets: %s)\n", MIN_CALIB_NEGATIVES,
                calibrate_on != NULL ? calibrate_on : "all");
        calibrate(v, &p, calibrate_on, cf);
        fclose(cf);
        if (cache_verifier_save(v, out, comment, &err) != 0)
            die("%s", err.msg);
        fputs(comment, stdout);
        free(comment);
        double thr = cache_verifier_threshold(v, rate, NULL);
        row r[MAX_SETS];
        int n = eval_rows(&p, SPLIT_TEST, thr, r);
        print_rows(stdout, r, n, "test", rate, thr);
        if (compare != NULL) {
            cache_verifier *o;
            if (cache_verifier_load(&o, compare, &err) != 0)
                die("%s", err.msg);
            for (int i = 0; i < v->n_points && i < o->n_points; i++)
                if (fabs(v->points[i].threshold - o->points[i].threshold) > 0.02) {
                    fprintf(stderr, "FAIL: retrained point %.3f is %.4f, %s has %.4f\n",
                            v->points[i].false_hit_rate, v->points[i].threshold, compare,
                            o->points[i].threshold);
                    rc = 1;
                }
            if (v->n_points != o->n_points) {
                fprintf(stderr, "FAIL: %d operating points, %s has %d\n", v->n_points, compare,
                        o->n_points);
                rc = 1;
            }
            cache_verifier_free(o);
        }
        cache_verifier_free(v);
    } else if (!strcmp(mode, "cv")) {
        if (folds < 3 || folds > 32)
            usage();
        cross_validate(&p, folds, hidden, epochs, seed, calibrate_on, rate);
    } else if (!strcmp(mode, "eval")) {
        if (weights == NULL)
            usage();
        cache_verifier *v;
        if (cache_verifier_load(&v, weights, &err) != 0)
            die("%s", err.msg);
        int split = !strcmp(split_name, "all") ? -1 : !strcmp(split_name, "train") ? SPLIT_TRAIN
                  : !strcmp(split_name, "calib") ? SPLIT_CALIB : SPLIT_TEST;
        for (size_t i = 0; i < p.n; i++)
            p.v[i].prob = (float)cache_verifier_prob(v, p.v[i].f);
        double used;
        double thr = cache_verifier_threshold(v, rate, &used);
        row r[MAX_SETS];
        int n = eval_rows(&p, split, thr, r);
        print_rows(stdout, r, n, split < 0 ? "all" : split_names[split], used, thr);
        if (split == SPLIT_TEST)
            per_set(&p, used, thr);
        if (dump != NULL) {  /* every pair: set, split, label, probability, features */
            FILE *f = fopen(dump, "w");
            if (f == NULL)
                die("%s: %s", dump, strerror(errno));
            fprintf(f, "set,split,is_duplicate,probability");
            for (int j = 0; j < NF; j++)
                fprintf(f, ",%s", cache_verifier_feature_name(j));
            fputc('\n', f);
            for (size_t i = 0; i < p.n; i++) {
                fprintf(f, "%s,%s,%d,%.6f", p.set_names[p.v[i].set], split_names[p.v[i].split],
                        p.v[i].dup, p.v[i].prob);
                for (int j = 0; j < NF; j++)
                    fprintf(f, ",%.6g", p.v[i].f[j]);
                fputc('\n', f);
            }
            fclose(f);
        }
        if (record != NULL) {
            FILE *f = fopen(record, "w");
            if (f == NULL)
                die("%s: %s", record, strerror(errno));
            fprintf(f, "# llmgw-cache-verifier eval -w %s --split %s --rate %g\n", weights,
                    split_name, rate);
            print_rows(f, r, n, split < 0 ? "all" : split_names[split], used, thr);
            fclose(f);
        }
        if (expect != NULL && expect_rows(expect, r, n) != 0)
            rc = 1;
        cache_verifier_free(v);
    } else {
        usage();
    }
    for (size_t i = 0; i < p.n; i++) {
        free(p.v[i].a);
        free(p.v[i].b);
    }
    free(p.v);
    return rc;
}
