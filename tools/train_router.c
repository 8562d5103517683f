/* tools/train_router.c: llmgw-train-router — trains the router's complexity classifier
 * (router/classifier.h) on labelled routing CSVs and writes its weights file.
 *
 *   llmgw-train-router [--holdout s1,s2,...] [--emb-cache FILE] [-m MODEL_DIR] [--threads N]
 *                      [--l2 L] [--cv K] [--emb-only] [--verify-cache N] [-o WEIGHTS]
 *                      [--compare FILE] [--holdout-auc] [--mlp H [--epochs E]] CSV|DIR...
 *
 * Each CSV reads `prompt,<weak model>,<strong model>` with True/False cells (whether that model
 * answered correctly: ../shared/data/router/mmlu/). The label is 1 ("needs the strong tier")
 * when the weak model was wrong. A directory means its *.csv files in name order. A file's
 * subject is its name without ".csv" and without a leading "mmlu_"; --holdout leaves those
 * subjects out of training (llmgw-eval-router scores them).
 *
 * Embeddings come from --emb-cache (see the cache format below); prompts missing from it are
 * encoded with all-MiniLM-L6-v2 (-m) and appended, so a committed cache spares every later run
 * the encoder. Every embedding, fresh or cached, goes through the cache's int8 quantisation, so a
 * run that encodes and a run that reads the cache train on the same numbers.
 *
 * The model is L2-regularised logistic regression on [embedding ; lexical features], every
 * feature standardised with the training rows' mean and standard deviation, fitted by Newton's
 * method from zero until the largest step is below 1e-10 (deterministic: no seed, fixed order).
 * --cv K prints the K-fold cross-validated log loss and AUC for a grid of L2 strengths, folds by
 * subject (held-out subjects never take part). --compare FILE exits 1 unless the trained weights
 * equal FILE's within 1e-6 (the shipped weights' regression test). --verify-cache N encodes N
 * rows spread over the data afresh (-m) and exits 1 unless each has cosine similarity >= 0.999
 * with its cached, quantised embedding. --holdout-auc prints the held-out rows' AUC (reports only).
 *
 * Experimental, for comparison only: --mlp H swaps the model of --cv and --holdout-auc for a
 * one-hidden-layer ReLU MLP (H units, minibatch Adam, --epochs E, --l2 as weight decay, fixed
 * seed). It did not clearly beat logistic regression (5-fold CV AUC 0.669 vs 0.662, log loss
 * 0.617 vs 0.615; held-out AUC 0.731 vs 0.730), so the weights format stores LR only.
 *
 * The data half of this file (CSV reading, the embedding cache) is shared with
 * tools/eval_router.c, which includes it with ROUTER_TOOL_DATA_ONLY defined. */
#include "common/err.h"
#include "engine/bert.h"
#include "router/classifier.h"
#include "tools/csv.h"

#include <xxhash.h>

#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* ---- labelled rows ---------------------------------------------------------------------- */

typedef struct rt_row {
    char *prompt;
    size_t len;
    bool weak_ok, strong_ok;
    int subject;  /* index into rt_data.subjects */
    uint64_t hash; /* XXH64 of the prompt bytes, seed 0: the embedding cache's key */
    float *emb;    /* dim floats, L2-normalised (owned by rt_data.emb) */
} rt_row;

typedef struct rt_data {
    rt_row *rows;
    size_t n, cap;
    char **subjects;
    int n_subjects;
    float *emb;  /* [n][dim] */
    int dim;
} rt_data;

static void *xrealloc(void *p, size_t n)
{
    p = realloc(p, n ? n : 1);
    if (p == NULL) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    return p;
}

static char *xstrdup(const char *s)
{
    size_t n = strlen(s) + 1;
    return memcpy(xrealloc(NULL, n), s, n);
}

static int parse_bool(const char *s, bool *out)
{
    if (strcmp(s, "True") == 0 || strcmp(s, "true") == 0 || strcmp(s, "1") == 0)
        *out = true;
    else if (strcmp(s, "False") == 0 || strcmp(s, "false") == 0 || strcmp(s, "0") == 0)
        *out = false;
    else
        return -1;
    return 0;
}

/* "dir/mmlu_college_physics.csv" -> "college_physics". */
static char *subject_of(const char *path)
{
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    if (strncmp(base, "mmlu_", 5) == 0)
        base += 5;
    char *s = xstrdup(base);
    size_t n = strlen(s);
    if (n > 4 && strcmp(s + n - 4, ".csv") == 0)
        s[n - 4] = '\0';
    return s;
}

/* Appends one CSV's rows; exits 2 with file:line on a malformed file. */
static void read_csv(rt_data *d, const char *path, const char *tool)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        fprintf(stderr, "%s: %s: %s\n", tool, path, strerror(errno));
        exit(2);
    }
    char *text = NULL;
    size_t n = 0, cap = 0, got;
    do {
        if (n + 65536 + 1 > cap)
            text = xrealloc(text, cap = 2 * cap + 65536 + 1);
        got = fread(text + n, 1, cap - n - 1, f);
        n += got;
    } while (got > 0);
    bool bad = ferror(f);
    fclose(f);
    if (bad) {
        fprintf(stderr, "%s: %s: read error\n", tool, path);
        exit(2);
    }
    text[n] = '\0';
    if (strlen(text) != n) {
        fprintf(stderr, "%s: %s: a NUL byte in a CSV file\n", tool, path);
        exit(2);
    }
    d->subjects = xrealloc(d->subjects, (size_t)(d->n_subjects + 1) * sizeof *d->subjects);
    int subject = d->n_subjects++;
    d->subjects[subject] = subject_of(path);
    const char *p = text;
    long line = 1;
    for (bool header = true; *p != '\0'; header = false) {
        long at = line;
        char *cell[3] = {NULL, NULL, NULL};
        size_t lens[3];
        int k = 0;
        for (;;) {
            char *v = tool_csv_field(&p, &lens[k < 3 ? k : 2], &line);
            if (v == NULL) {
                fprintf(stderr, "%s: %s:%ld: a quoted field never closes\n", tool, path, at);
                exit(2);
            }
            if (k < 3)
                cell[k] = v;
            else
                free(v);
            k++;
            if (*p != ',')
                break;
            p++;
        }
        if (*p == '\r')
            p++;
        if (*p == '\n') {
            p++;
            line++;
        }
        bool empty = k == 1 && lens[0] == 0;
        bool weak, strong;
        if (!empty && k != 3) {
            fprintf(stderr, "%s: %s:%ld: %d fields, want 3 (prompt,weak,strong)\n", tool, path,
                    at, k);
            exit(2);
        }
        if (!empty && !header &&
            (parse_bool(cell[1], &weak) != 0 || parse_bool(cell[2], &strong) != 0)) {
            fprintf(stderr, "%s: %s:%ld: the model columns want True or False\n", tool, path,
                    at);
            exit(2);
        }
        if (!empty && !header) {
            if (d->n == d->cap)
                d->rows = xrealloc(d->rows, (d->cap = 2 * d->cap + 1024) * sizeof *d->rows);
            d->rows[d->n++] = (rt_row){.prompt = cell[0], .len = lens[0], .weak_ok = weak,
                                       .strong_ok = strong, .subject = subject,
                                       .hash = XXH64(cell[0], lens[0], 0)};
            cell[0] = NULL;
        }
        for (int i = 0; i < 3; i++)
            free(cell[i]);
    }
    free(text);
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* A file, or a directory's *.csv files in name order. */
static void read_path(rt_data *d, const char *path, const char *tool)
{
    struct stat st;
    if (stat(path, &st) != 0) {
        fprintf(stderr, "%s: %s: %s\n", tool, path, strerror(errno));
        exit(2);
    }
    if (!S_ISDIR(st.st_mode)) {
        read_csv(d, path, tool);
        return;
    }
    DIR *dir = opendir(path);
    if (dir == NULL) {
        fprintf(stderr, "%s: %s: %s\n", tool, path, strerror(errno));
        exit(2);
    }
    char **names = NULL;
    size_t n = 0;
    struct dirent *e;
    while ((e = readdir(dir)) != NULL) {
        size_t len = strlen(e->d_name);
        if (len > 4 && strcmp(e->d_name + len - 4, ".csv") == 0) {
            names = xrealloc(names, (n + 1) * sizeof *names);
            names[n] = xrealloc(NULL, strlen(path) + len + 2);
            sprintf(names[n++], "%s/%s", path, e->d_name);
        }
    }
    closedir(dir);
    qsort(names, n, sizeof *names, cmp_str);
    for (size_t i = 0; i < n; i++) {
        read_csv(d, names[i], tool);
        free(names[i]);
    }
    free(names);
}

/* Is subject s named in the comma-separated list? */
static bool in_list(const char *list, const char *s)
{
    size_t n = strlen(s);
    for (const char *p = list; p != NULL && *p != '\0';) {
        const char *q = strchr(p, ',');
        size_t len = q ? (size_t)(q - p) : strlen(p);
        if (len == n && strncmp(p, s, n) == 0)
            return true;
        if (len == n + 5 && strncmp(p, "mmlu_", 5) == 0 && strncmp(p + 5, s, n) == 0)
            return true;
        p = q ? q + 1 : NULL;
    }
    return false;
}

/* Every name in the list must be a subject we read (a typo would silently train on it). */
static void check_list(const rt_data *d, const char *list, const char *tool)
{
    char *copy = xstrdup(list);
    for (char *save = NULL, *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        bool found = false;
        for (int i = 0; i < d->n_subjects && !found; i++)
            found = in_list(t, d->subjects[i]);
        if (!found) {
            fprintf(stderr, "%s: no CSV for subject \"%s\"\n", tool, t);
            exit(2);
        }
    }
    free(copy);
}

static void data_free(rt_data *d)
{
    for (size_t i = 0; i < d->n; i++)
        free(d->rows[i].prompt);
    for (int i = 0; i < d->n_subjects; i++)
        free(d->subjects[i]);
    free(d->rows);
    free(d->subjects);
    free(d->emb);
}

/* ---- the embedding cache ------------------------------------------------------------------
 * A binary file: the 8 bytes "LLMGWEMB", u32 version (1), u32 dim, then records of
 *   u64 key (XXH64 of the prompt's bytes, seed 0), f32 scale, int8 q[dim]
 * all little-endian. A component is q * scale (scale = max |x| / 127), and the vector is
 * L2-normalised again after that. On MiniLM embeddings the round trip keeps cosine similarity
 * above 0.9999 (the quantisation step is under 0.0025 per component); tests check >= 0.999. New
 * records are appended; a later record for the same key wins. */

#define EMB_MAGIC "LLMGWEMB"
#define EMB_VERSION 1u

typedef struct emb_cache {
    uint64_t *keys; /* [cap] open addressing; 0 = empty (a real key of 0 is stored as 1) */
    float *vecs;    /* [cap][dim] */
    size_t cap, n;
    int dim;
} emb_cache;

static uint64_t key_of(uint64_t h)
{
    return h ? h : 1;
}

static size_t emb_slot(const emb_cache *c, uint64_t key)
{
    size_t i = (size_t)(key ^ (key >> 29)) & (c->cap - 1);
    while (c->keys[i] != 0 && c->keys[i] != key)
        i = (i + 1) & (c->cap - 1);
    return i;
}

static void emb_put(emb_cache *c, uint64_t hash, const float *v)
{
    if (2 * (c->n + 1) > c->cap) {
        emb_cache g = {.cap = c->cap ? 2 * c->cap : 4096, .dim = c->dim};
        g.keys = calloc(g.cap, sizeof *g.keys);
        g.vecs = xrealloc(NULL, g.cap * (size_t)g.dim * sizeof *g.vecs);
        if (g.keys == NULL)
            exit(2);
        for (size_t i = 0; i < c->cap; i++)
            if (c->keys[i] != 0)
                emb_put(&g, c->keys[i], c->vecs + i * (size_t)c->dim);
        free(c->keys);
        free(c->vecs);
        *c = g;
    }
    uint64_t key = key_of(hash);
    size_t i = emb_slot(c, key);
    if (c->keys[i] == 0)
        c->n++;
    c->keys[i] = key;
    if (c->dim > 0)
        memcpy(c->vecs + i * (size_t)c->dim, v, (size_t)c->dim * sizeof *v);
}

static const float *emb_get(const emb_cache *c, uint64_t hash)
{
    if (c->cap == 0)
        return NULL;
    size_t i = emb_slot(c, key_of(hash));
    return c->keys[i] ? c->vecs + i * (size_t)c->dim : NULL;
}

/* Quantises v (dim floats) into rec (8 + 4 + dim bytes) and writes the dequantised,
 * re-normalised vector back into v. */
static void emb_quantise(float *v, int dim, uint64_t hash, unsigned char *rec)
{
    float mx = 0;
    for (int i = 0; i < dim; i++)
        mx = fabsf(v[i]) > mx ? fabsf(v[i]) : mx;
    float scale = mx > 0 ? mx / 127.0f : 1.0f;
    for (int i = 0; i < 8; i++)
        rec[i] = (unsigned char)(hash >> (8 * i));
    uint32_t bits;
    memcpy(&bits, &scale, 4);
    for (int i = 0; i < 4; i++)
        rec[8 + i] = (unsigned char)(bits >> (8 * i));
    for (int i = 0; i < dim; i++) {
        long q = lrintf(v[i] / scale);
        q = q > 127 ? 127 : q < -127 ? -127 : q;
        rec[12 + i] = (unsigned char)(int8_t)q;
    }
}

/* The vector a record stands for: q * scale, L2-normalised. */
static void emb_dequantise(const unsigned char *rec, int dim, uint64_t *hash, float *v)
{
    uint64_t h = 0;
    for (int i = 0; i < 8; i++)
        h |= (uint64_t)rec[i] << (8 * i);
    uint32_t bits = 0;
    for (int i = 0; i < 4; i++)
        bits |= (uint32_t)rec[8 + i] << (8 * i);
    float scale;
    memcpy(&scale, &bits, 4);
    double ss = 0;
    for (int i = 0; i < dim; i++) {
        v[i] = (float)(int8_t)rec[12 + i] * scale;
        ss += (double)v[i] * v[i];
    }
    float inv = ss > 0 ? (float)(1.0 / sqrt(ss)) : 0.0f;
    for (int i = 0; i < dim; i++)
        v[i] *= inv;
    *hash = h;
}

/* Loads path into c (a missing file is an empty cache when may_be_missing). Exits 2 on a bad
 * file. */
static void emb_cache_load(emb_cache *c, const char *path, int dim, bool may_be_missing,
                           const char *tool)
{
    memset(c, 0, sizeof *c);
    c->dim = dim;
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        if (errno == ENOENT && may_be_missing)
            return;
        fprintf(stderr, "%s: %s: %s\n", tool, path, strerror(errno));
        exit(2);
    }
    unsigned char head[16];
    size_t got = fread(head, 1, sizeof head, f);
    uint32_t version = 0, fdim = 0;
    for (int i = 0; i < 4 && got == 16; i++) {
        version |= (uint32_t)head[8 + i] << (8 * i);
        fdim |= (uint32_t)head[12 + i] << (8 * i);
    }
    if (got != 16 || memcmp(head, EMB_MAGIC, 8) != 0) {
        fprintf(stderr, "%s: %s: not an llmgw embedding cache (bad magic)\n", tool, path);
        exit(2);
    }
    if (version != EMB_VERSION || fdim != (uint32_t)dim) {
        fprintf(stderr, "%s: %s: version %u dim %u, want version %u dim %d\n", tool, path,
                version, fdim, EMB_VERSION, dim);
        exit(2);
    }
    size_t rec_size = 12 + (size_t)dim;
    unsigned char *rec = xrealloc(NULL, rec_size);
    float *v = xrealloc(NULL, (size_t)dim * sizeof *v);
    long index = 0;
    while ((got = fread(rec, 1, rec_size, f)) == rec_size) {
        uint64_t h;
        emb_dequantise(rec, dim, &h, v);
        emb_put(c, h, v);
        index++;
    }
    if (got != 0) {
        fprintf(stderr, "%s: %s: record %ld is truncated (%zu of %zu bytes)\n", tool, path,
                index, got, rec_size);
        exit(2);
    }
    fclose(f);
    free(rec);
    free(v);
}

static void emb_cache_free(emb_cache *c)
{
    free(c->keys);
    free(c->vecs);
}

static int cmp_len(const void *a, const void *b, void *unused);

/* Fills d->emb: from the cache, then the encoder for what is missing (appended to cache_path
 * when given). Exits 2 on errors. */
static void embed_rows(rt_data *d, const char *cache_path, const char *model_dir, int threads,
                       const char *tool)
{
    const int dim = 384; /* all-MiniLM-L6-v2; the encoder's own dim is checked below */
    emb_cache c;
    if (cache_path != NULL)
        emb_cache_load(&c, cache_path, dim, true, tool);
    else
        c = (emb_cache){.dim = dim};
    /* The rows whose prompt is not cached yet, each prompt once, shortest first (batches of
     * similar lengths pad less). */
    size_t *todo = xrealloc(NULL, d->n * sizeof *todo), n_todo = 0;
    emb_cache seen = {.dim = 0};
    for (size_t i = 0; i < d->n; i++) {
        if (emb_get(&c, d->rows[i].hash) != NULL || emb_get(&seen, d->rows[i].hash) != NULL)
            continue;
        emb_put(&seen, d->rows[i].hash, NULL);
        todo[n_todo++] = i;
    }
    emb_cache_free(&seen);
    if (n_todo > 0) {
        if (model_dir == NULL) {
            fprintf(stderr, "%s: %zu prompts are not in the embedding cache; -m MODEL_DIR "
                            "encodes them\n", tool, n_todo);
            exit(2);
        }
        util_err err = {0};
        eng_bert *m = NULL;
        eng_bert_ctx *ctx = NULL;
        if (eng_bert_load(&m, model_dir, ENG_BERT_AUTO, &err) != 0 ||
            eng_bert_ctx_new(&ctx, m, threads, &err) != 0) {
            fprintf(stderr, "%s: %s\n", tool, err.msg);
            exit(2);
        }
        if (eng_bert_dim(m) != dim) {
            fprintf(stderr, "%s: %s: dim %d, want %d\n", tool, model_dir, eng_bert_dim(m), dim);
            exit(2);
        }
        FILE *out = NULL;
        if (cache_path != NULL) {
            struct stat st;
            bool fresh = stat(cache_path, &st) != 0 || st.st_size == 0;
            out = fopen(cache_path, "ab");
            if (out == NULL) {
                fprintf(stderr, "%s: %s: %s\n", tool, cache_path, strerror(errno));
                exit(2);
            }
            if (fresh) {
                unsigned char head[16];
                memcpy(head, EMB_MAGIC, 8);
                for (int i = 0; i < 4; i++) {
                    head[8 + i] = (unsigned char)(EMB_VERSION >> (8 * i));
                    head[12 + i] = (unsigned char)((uint32_t)dim >> (8 * i));
                }
                fwrite(head, 1, sizeof head, out);
            }
        }
        qsort_r(todo, n_todo, sizeof *todo, cmp_len, d);
        enum { BATCH = 16 };
        const char *texts[BATCH];
        size_t lens[BATCH];
        float *vecs = xrealloc(NULL, (size_t)BATCH * dim * sizeof *vecs);
        unsigned char *rec = xrealloc(NULL, 12 + (size_t)dim);
        for (size_t i = 0; i < n_todo; i += BATCH) {
            int m_ = n_todo - i < BATCH ? (int)(n_todo - i) : BATCH;
            for (int j = 0; j < m_; j++) {
                texts[j] = d->rows[todo[i + j]].prompt;
                lens[j] = d->rows[todo[i + j]].len;
            }
            if (eng_bert_encode(ctx, texts, lens, m_, vecs, NULL, &err) != 0) {
                fprintf(stderr, "%s: %s\n", tool, err.msg);
                exit(2);
            }
            for (int j = 0; j < m_; j++) {
                float *v = vecs + (size_t)j * dim;
                uint64_t h = d->rows[todo[i + j]].hash;
                emb_quantise(v, dim, h, rec);
                emb_dequantise(rec, dim, &h, v);
                emb_put(&c, h, v);
                if (out != NULL && fwrite(rec, 1, 12 + (size_t)dim, out) != 12 + (size_t)dim) {
                    fprintf(stderr, "%s: %s: write error\n", tool, cache_path);
                    exit(2);
                }
            }
            if (out != NULL)
                fflush(out);
            if ((i / BATCH) % 16 == 0 || i + BATCH >= n_todo)
                fprintf(stderr, "\r%s: encoded %zu/%zu prompts", tool, i + (size_t)m_, n_todo);
        }
        fprintf(stderr, "\n");
        if (out != NULL && fclose(out) != 0) {
            fprintf(stderr, "%s: %s: %s\n", tool, cache_path, strerror(errno));
            exit(2);
        }
        free(vecs);
        free(rec);
        eng_bert_ctx_free(ctx);
        eng_bert_free(m);
    }
    free(todo);
    d->dim = dim;
    d->emb = xrealloc(NULL, d->n * (size_t)dim * sizeof *d->emb);
    for (size_t i = 0; i < d->n; i++) {
        d->rows[i].emb = d->emb + i * (size_t)dim;
        memcpy(d->rows[i].emb, emb_get(&c, d->rows[i].hash), (size_t)dim * sizeof(float));
    }
    emb_cache_free(&c);
}

static int cmp_len(const void *a, const void *b, void *arg)
{
    const rt_data *d = arg;
    size_t x = *(const size_t *)a, y = *(const size_t *)b;
    size_t lx = d->rows[x].len, ly = d->rows[y].len;
    return lx < ly ? -1 : lx > ly ? 1 : x < y ? -1 : x > y;
}

#ifndef ROUTER_TOOL_DATA_ONLY

/* Encodes `count` rows spread evenly over d afresh and compares them with their cached (int8)
 * embeddings: returns the smallest cosine similarity. */
static double verify_cache(const rt_data *d, const char *model_dir, int threads, int count,
                           const char *tool)
{
    util_err err = {0};
    eng_bert *m = NULL;
    eng_bert_ctx *ctx = NULL;
    if (eng_bert_load(&m, model_dir, ENG_BERT_AUTO, &err) != 0 ||
        eng_bert_ctx_new(&ctx, m, threads, &err) != 0) {
        fprintf(stderr, "%s: %s\n", tool, err.msg);
        exit(2);
    }
    float *v = xrealloc(NULL, (size_t)d->dim * sizeof *v);
    double worst = 1;
    for (int j = 0; j < count && d->n > 0; j++) {
        const rt_row *r = &d->rows[(size_t)j * d->n / (size_t)count];
        const char *text = r->prompt;
        if (eng_bert_encode(ctx, &text, &r->len, 1, v, NULL, &err) != 0) {
            fprintf(stderr, "%s: %s\n", tool, err.msg);
            exit(2);
        }
        double dot = 0, na = 0, nb = 0;
        for (int k = 0; k < d->dim; k++) {
            dot += (double)v[k] * r->emb[k];
            na += (double)v[k] * v[k];
            nb += (double)r->emb[k] * r->emb[k];
        }
        double cos = dot / sqrt(na * nb);
        worst = cos < worst ? cos : worst;
    }
    free(v);
    eng_bert_ctx_free(ctx);
    eng_bert_free(m);
    return worst;
}

/* ---- training ------------------------------------------------------------------------------ */

/* The design matrix of the chosen rows: [n][p] standardised features (p = dim + lex), with the
 * standardisation taken from those rows. */
typedef struct design {
    double *x;     /* [n][p] */
    double *y;     /* [n] 1 = the weak model was wrong */
    double *mean;  /* [p] */
    double *std;   /* [p] */
    size_t n;
    int p;
} design;

static void lex_of(const rt_row *r, double *out)
{
    float lex[ROUTER_LEX_FEATURES];
    router_lexical_features(r->prompt, r->len, lex);
    for (int k = 0; k < ROUTER_LEX_FEATURES; k++)
        out[k] = lex[k];
}

static void design_build(design *m, const rt_data *d, const size_t *idx, size_t n)
{
    int p = d->dim + ROUTER_LEX_FEATURES;
    m->n = n;
    m->p = p;
    m->x = xrealloc(NULL, n * (size_t)p * sizeof *m->x);
    m->y = xrealloc(NULL, n * sizeof *m->y);
    m->mean = calloc((size_t)p, sizeof *m->mean);
    m->std = calloc((size_t)p, sizeof *m->std);
    for (size_t i = 0; i < n; i++) {
        const rt_row *r = &d->rows[idx[i]];
        double *x = m->x + i * (size_t)p;
        for (int k = 0; k < d->dim; k++)
            x[k] = r->emb[k];
        lex_of(r, x + d->dim);
        m->y[i] = r->weak_ok ? 0.0 : 1.0;
        for (int k = 0; k < p; k++)
            m->mean[k] += x[k];
    }
    for (int k = 0; k < p; k++)
        m->mean[k] /= (double)n;
    for (size_t i = 0; i < n; i++)
        for (int k = 0; k < p; k++) {
            double v = m->x[i * (size_t)p + k] - m->mean[k];
            m->std[k] += v * v;
        }
    for (int k = 0; k < p; k++) {
        m->std[k] = sqrt(m->std[k] / (double)n);
        if (!(m->std[k] > 1e-12))
            m->std[k] = 1.0;  /* a constant feature: any scale gives it weight 0 */
    }
    for (size_t i = 0; i < n; i++)
        for (int k = 0; k < p; k++)
            m->x[i * (size_t)p + k] = (m->x[i * (size_t)p + k] - m->mean[k]) / m->std[k];
}

static void design_free(design *m)
{
    free(m->x);
    free(m->y);
    free(m->mean);
    free(m->std);
}

static double sigmoid(double z)
{
    return z >= 0 ? 1.0 / (1.0 + exp(-z)) : exp(z) / (1.0 + exp(z));
}

/* In-place Cholesky solve of a (q x q, symmetric positive definite; lower triangle used) a x = b;
 * b becomes x. Returns -1 when a is not positive definite. */
static int cholesky_solve(double *a, double *b, int q)
{
    for (int j = 0; j < q; j++) {
        double s = a[(size_t)j * q + j];
        for (int k = 0; k < j; k++)
            s -= a[(size_t)j * q + k] * a[(size_t)j * q + k];
        if (!(s > 0))
            return -1;
        double l = sqrt(s);
        a[(size_t)j * q + j] = l;
        for (int i = j + 1; i < q; i++) {
            double t = a[(size_t)i * q + j];
            for (int k = 0; k < j; k++)
                t -= a[(size_t)i * q + k] * a[(size_t)j * q + k];
            a[(size_t)i * q + j] = t / l;
        }
    }
    for (int i = 0; i < q; i++) {
        double t = b[i];
        for (int k = 0; k < i; k++)
            t -= a[(size_t)i * q + k] * b[k];
        b[i] = t / a[(size_t)i * q + i];
    }
    for (int i = q - 1; i >= 0; i--) {
        double t = b[i];
        for (int k = i + 1; k < q; k++)
            t -= a[(size_t)k * q + i] * b[k];
        b[i] = t / a[(size_t)i * q + i];
    }
    return 0;
}

/* Minimises mean log loss + l2/2 |w|^2 (the bias unpenalised) by Newton's method from zero;
 * w gets p weights then the bias. Stops when the largest step is under 1e-10, or after 50 steps.
 * Returns the number of steps. */
static int fit_lr(const design *m, double l2, double *w)
{
    int p = m->p, q = p + 1;
    size_t n = m->n;
    double *h = xrealloc(NULL, (size_t)q * q * sizeof *h);
    double *g = xrealloc(NULL, (size_t)q * sizeof *g);
    memset(w, 0, (size_t)q * sizeof *w);
    int it;
    for (it = 1; it <= 50; it++) {
        memset(h, 0, (size_t)q * q * sizeof *h);
        memset(g, 0, (size_t)q * sizeof *g);
        for (size_t i = 0; i < n; i++) {
            const double *x = m->x + i * (size_t)p;
            double z = w[p];
            for (int k = 0; k < p; k++)
                z += w[k] * x[k];
            double pr = sigmoid(z), r = pr - m->y[i], s = pr * (1 - pr);
            for (int a = 0; a < p; a++) {
                g[a] += r * x[a];
                double sa = s * x[a];
                double *row = h + (size_t)a * q;
                for (int b = 0; b <= a; b++)
                    row[b] += sa * x[b];
                row[p] += sa;  /* upper part of the bias column, mirrored below */
            }
            g[p] += r;
            h[(size_t)p * q + p] += s;
        }
        for (int a = 0; a < p; a++)
            h[(size_t)p * q + a] = h[(size_t)a * q + p];
        for (int a = 0; a < q; a++) {
            for (int b = 0; b <= a; b++)
                h[(size_t)a * q + b] /= (double)n;
            g[a] /= (double)n;
        }
        for (int a = 0; a < p; a++) {
            g[a] += l2 * w[a];
            h[(size_t)a * q + a] += l2;
        }
        h[(size_t)p * q + p] += 1e-12;
        if (cholesky_solve(h, g, q) != 0) {
            fprintf(stderr, "llmgw-train-router: the Hessian is singular (try a larger --l2)\n");
            exit(2);
        }
        double step = 0;
        for (int a = 0; a < q; a++) {
            w[a] -= g[a];
            step = fabs(g[a]) > step ? fabs(g[a]) : step;
        }
        if (step < 1e-10)
            break;
    }
    free(h);
    free(g);
    return it > 50 ? 50 : it;
}

/* ---- experimental: a one-hidden-layer MLP (cross-validation and held-out AUC only; the weights
 * format stores logistic regression) ---------------------------------------------------------- */

typedef struct mlp {
    int p, h;
    double *w1; /* [h][p] */
    double *b1; /* [h] */
    double *w2; /* [h] */
    double b2;
} mlp;

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static double rng_uniform(uint64_t *s)
{
    return (double)(rng_next(s) >> 11) / 9007199254740992.0;
}

static double mlp_forward(const mlp *m, const double *x, double *hid)
{
    double z = m->b2;
    for (int j = 0; j < m->h; j++) {
        const double *w = m->w1 + (size_t)j * m->p;
        double a = m->b1[j];
        for (int k = 0; k < m->p; k++)
            a += w[k] * x[k];
        hid[j] = a > 0 ? a : 0;
        z += m->w2[j] * hid[j];
    }
    return z;
}

/* Minibatch Adam (batch 128, lr 1e-3) on mean log loss + wd/2 |weights|^2, fixed seed. */
static void fit_mlp(const design *d, int hidden, int epochs, double wd, mlp *m)
{
    int p = d->p, h = hidden;
    size_t nw = (size_t)h * p + 2 * (size_t)h + 1;
    double *theta = calloc(nw, sizeof *theta), *grad = calloc(nw, sizeof *grad);
    double *m1 = calloc(nw, sizeof *m1), *m2 = calloc(nw, sizeof *m2);
    double *hid = xrealloc(NULL, (size_t)h * sizeof *hid);
    size_t *order = xrealloc(NULL, d->n * sizeof *order);
    uint64_t seed = 0x9e3779b97f4a7c15ull;
    *m = (mlp){.p = p, .h = h, .w1 = theta, .b1 = theta + (size_t)h * p,
               .w2 = theta + (size_t)h * p + h};
    double a1 = sqrt(6.0 / (p + h)), a2 = sqrt(6.0 / (h + 1));
    for (size_t i = 0; i < (size_t)h * p; i++)
        m->w1[i] = (2 * rng_uniform(&seed) - 1) * a1;
    for (int j = 0; j < h; j++)
        m->w2[j] = (2 * rng_uniform(&seed) - 1) * a2;
    for (size_t i = 0; i < d->n; i++)
        order[i] = i;
    long t = 0;
    for (int e = 0; e < epochs; e++) {
        for (size_t i = d->n; i > 1; i--) {
            size_t j = (size_t)(rng_next(&seed) % i), tmp = order[i - 1];
            order[i - 1] = order[j];
            order[j] = tmp;
        }
        for (size_t b = 0; b < d->n; b += 128) {
            size_t nb = d->n - b < 128 ? d->n - b : 128;
            memset(grad, 0, nw * sizeof *grad);
            double gb2 = 0;
            for (size_t r = 0; r < nb; r++) {
                const double *x = d->x + order[b + r] * (size_t)p;
                double z = mlp_forward(m, x, hid);
                double g = (sigmoid(z) - d->y[order[b + r]]) / (double)nb;
                gb2 += g;
                for (int j = 0; j < h; j++) {
                    grad[(size_t)h * p + h + j] += g * hid[j];
                    if (hid[j] > 0) {
                        double gj = g * m->w2[j];
                        grad[(size_t)h * p + j] += gj;
                        double *gw = grad + (size_t)j * p;
                        for (int k = 0; k < p; k++)
                            gw[k] += gj * x[k];
                    }
                }
            }
            grad[nw - 1] = gb2;
            t++;
            double c1 = 1 - pow(0.9, (double)t), c2 = 1 - pow(0.999, (double)t);
            for (size_t i = 0; i < nw; i++) {
                double g = grad[i] + (i < (size_t)h * p || (i >= (size_t)h * p + h && i < nw - 1)
                                          ? wd * theta[i] : 0);
                m1[i] = 0.9 * m1[i] + 0.1 * g;
                m2[i] = 0.999 * m2[i] + 0.001 * g * g;
                theta[i] -= 1e-3 * (m1[i] / c1) / (sqrt(m2[i] / c2) + 1e-8);
            }
        }
    }
    m->b2 = theta[nw - 1];
    free(grad);
    free(m1);
    free(m2);
    free(hid);
    free(order);
}

static void predict_mlp(const design *dm, const mlp *m, const rt_data *d, const size_t *idx,
                        size_t n, double *out)
{
    int p = dm->p;
    double *x = xrealloc(NULL, (size_t)p * sizeof *x);
    double *hid = xrealloc(NULL, (size_t)m->h * sizeof *hid);
    for (size_t i = 0; i < n; i++) {
        const rt_row *r = &d->rows[idx[i]];
        for (int k = 0; k < d->dim; k++)
            x[k] = r->emb[k];
        lex_of(r, x + d->dim);
        for (int k = 0; k < p; k++)
            x[k] = (x[k] - dm->mean[k]) / dm->std[k];
        out[i] = sigmoid(mlp_forward(m, x, hid));
    }
    free(x);
    free(hid);
}

/* Scores of rows idx[0..n) under weights w fitted on design m (m's standardisation). */
static void predict(const design *m, const rt_data *d, const size_t *idx, size_t n,
                    const double *w, double *out)
{
    int p = m->p;
    double *x = xrealloc(NULL, (size_t)p * sizeof *x);
    for (size_t i = 0; i < n; i++) {
        const rt_row *r = &d->rows[idx[i]];
        for (int k = 0; k < d->dim; k++)
            x[k] = r->emb[k];
        lex_of(r, x + d->dim);
        double z = w[p];
        for (int k = 0; k < p; k++)
            z += w[k] * (x[k] - m->mean[k]) / m->std[k];
        out[i] = sigmoid(z);
    }
    free(x);
}

typedef struct scored {
    double s;
    int y;
} scored;

static int cmp_scored(const void *a, const void *b)
{
    double x = ((const scored *)a)->s, y = ((const scored *)b)->s;
    return x < y ? -1 : x > y;
}

/* Area under the ROC curve (ties count half). */
static double auc(const double *s, const double *y, size_t n)
{
    scored *v = xrealloc(NULL, n * sizeof *v);
    double pos = 0;
    for (size_t i = 0; i < n; i++) {
        v[i] = (scored){s[i], y[i] > 0.5};
        pos += v[i].y;
    }
    qsort(v, n, sizeof *v, cmp_scored);
    double rank_sum = 0;
    for (size_t i = 0; i < n;) {
        size_t j = i;
        while (j < n && v[j].s == v[i].s)
            j++;
        double mid = (double)(i + j + 1) / 2.0;  /* 1-based average rank */
        for (size_t k = i; k < j; k++)
            if (v[k].y)
                rank_sum += mid;
        i = j;
    }
    free(v);
    double neg = (double)n - pos;
    return pos > 0 && neg > 0 ? (rank_sum - pos * (pos + 1) / 2) / (pos * neg) : 0.5;
}

/* K-fold cross-validation over the training subjects (subject i of the sorted training subjects
 * goes to fold i mod K): pooled log loss and AUC for each L2 strength of the grid. */
static void cross_validate(const rt_data *d, const bool *train_subject, int folds, int hidden,
                           int epochs)
{
    static const double lr_grid[] = {1e-2, 3e-2, 1e-1, 3e-1, 1, 3, 10, 30};
    static const double mlp_grid[] = {1e-3, 1e-2, 3e-2, 1e-1, 3e-1};
    const double *grid = hidden > 0 ? mlp_grid : lr_grid;
    size_t n_grid = hidden > 0 ? sizeof mlp_grid / sizeof *mlp_grid
                               : sizeof lr_grid / sizeof *lr_grid;
    int *fold_of = xrealloc(NULL, (size_t)d->n_subjects * sizeof *fold_of);
    int k = 0;
    for (int s = 0; s < d->n_subjects; s++)
        fold_of[s] = train_subject[s] ? k++ % folds : -1;
    size_t *tr = xrealloc(NULL, d->n * sizeof *tr), *te = xrealloc(NULL, d->n * sizeof *te);
    double *score = xrealloc(NULL, d->n * sizeof *score);
    double *label = xrealloc(NULL, d->n * sizeof *label);
    if (hidden > 0)
        printf("MLP, %d hidden ReLU units, %d epochs (l2 = weight decay)\n", hidden, epochs);
    printf("| l2 | log loss | AUC |\n|---:|---:|---:|\n");
    for (size_t g = 0; g < n_grid; g++) {
        size_t n_all = 0;
        double loss = 0;
        for (int f = 0; f < folds; f++) {
            size_t n_tr = 0, n_te = 0;
            for (size_t i = 0; i < d->n; i++) {
                int fo = fold_of[d->rows[i].subject];
                if (fo < 0)
                    continue;
                if (fo == f)
                    te[n_te++] = i;
                else
                    tr[n_tr++] = i;
            }
            design m;
            design_build(&m, d, tr, n_tr);
            double *w = xrealloc(NULL, (size_t)(m.p + 1) * sizeof *w);
            if (hidden > 0) {
                mlp net;
                fit_mlp(&m, hidden, epochs, grid[g], &net);
                predict_mlp(&m, &net, d, te, n_te, score + n_all);
                free(net.w1);
            } else {
                fit_lr(&m, grid[g], w);
                predict(&m, d, te, n_te, w, score + n_all);
            }
            for (size_t i = 0; i < n_te; i++) {
                double y = d->rows[te[i]].weak_ok ? 0 : 1, pr = score[n_all + i];
                label[n_all + i] = y;
                pr = pr < 1e-12 ? 1e-12 : pr > 1 - 1e-12 ? 1 - 1e-12 : pr;
                loss -= y * log(pr) + (1 - y) * log(1 - pr);
            }
            n_all += n_te;
            free(w);
            design_free(&m);
        }
        printf("| %g | %.4f | %.4f |\n", grid[g], loss / (double)n_all, auc(score, label, n_all));
        fflush(stdout);
    }
    free(fold_of);
    free(tr);
    free(te);
    free(score);
    free(label);
}

/* Are the two files the same tokens, numbers equal within 1e-6 (relative above 1)? */
static bool same_weights(const char *a_path, const char *b_path, const char *tool)
{
    FILE *fa = fopen(a_path, "rb"), *fb = fopen(b_path, "rb");
    if (fa == NULL || fb == NULL) {
        fprintf(stderr, "%s: %s: %s\n", tool, fa ? b_path : a_path, strerror(errno));
        exit(2);
    }
    char ta[128], tb[128];
    long k = 0;
    bool same = true;
    for (;; k++) {
        int ra = fscanf(fa, "%127s", ta), rb = fscanf(fb, "%127s", tb);
        if (ra != 1 || rb != 1) {
            if (ra != rb) {
                fprintf(stderr, "%s: %s has %s tokens than %s\n", tool, a_path,
                        ra == 1 ? "more" : "fewer", b_path);
                same = false;
            }
            break;
        }
        char *ea, *eb;
        double va = strtod(ta, &ea), vb = strtod(tb, &eb);
        bool numbers = *ea == '\0' && *eb == '\0' && ea != ta && eb != tb;
        double scale = fabs(va) > 1 ? fabs(va) : 1;
        if (numbers ? !(fabs(va - vb) <= 1e-6 * scale) : strcmp(ta, tb) != 0) {
            fprintf(stderr, "%s: token %ld differs: %s in %s, %s in %s\n", tool, k, ta, a_path,
                    tb, b_path);
            same = false;
            break;
        }
    }
    fclose(fa);
    fclose(fb);
    return same;
}

static void usage(void)
{
    fprintf(stderr,
            "usage: llmgw-train-router [--holdout s1,s2,...] [--emb-cache FILE] [-m MODEL_DIR]\n"
            "         [--threads N] [--l2 L] [--cv K] [--emb-only] [--verify-cache N]\n"
            "         [-o WEIGHTS]"
            " [--compare WEIGHTS] CSV|DIR...\n");
}

int main(int argc, char **argv)
{
    const char *tool = "llmgw-train-router", *holdout = NULL, *cache = NULL, *model = NULL;
    const char *out = NULL, *compare = NULL;
    int threads = 0, folds = 0, verify = 0, hidden = 0, epochs = 20;
    bool holdout_auc = false;
    double l2 = 1e-2;
    bool emb_only = false;
    static const struct option opts[] = {
        {"holdout", required_argument, NULL, 'H'}, {"emb-cache", required_argument, NULL, 'e'},
        {"model", required_argument, NULL, 'm'},   {"threads", required_argument, NULL, 't'},
        {"emb-only", no_argument, NULL, 'E'},      {"l2", required_argument, NULL, 'l'},
        {"cv", required_argument, NULL, 'c'},      {"output", required_argument, NULL, 'o'},
        {"compare", required_argument, NULL, 'C'}, {"help", no_argument, NULL, 'h'},
        {"verify-cache", required_argument, NULL, 'V'}, {"mlp", required_argument, NULL, 'M'},
        {"epochs", required_argument, NULL, 'N'}, {"holdout-auc", no_argument, NULL, 'A'},
        {NULL, 0, NULL, 0},
    };
    int ch;
    while ((ch = getopt_long(argc, argv, "H:e:m:t:El:c:o:C:V:M:N:Ah", opts, NULL)) != -1) {
        switch (ch) {
        case 'H': holdout = optarg; break;
        case 'e': cache = optarg; break;
        case 'm': model = optarg; break;
        case 't': threads = atoi(optarg); break;
        case 'E': emb_only = true; break;
        case 'l': l2 = atof(optarg); break;
        case 'c': folds = atoi(optarg); break;
        case 'o': out = optarg; break;
        case 'C': compare = optarg; break;
        case 'V': verify = atoi(optarg); break;
        case 'M': hidden = atoi(optarg); break;
        case 'N': epochs = atoi(optarg); break;
        case 'A': holdout_auc = true; break;
        case 'h': usage(); return 0;
        default: usage(); return 2;
        }
    }
    if (optind == argc || !(l2 > 0) || folds < 0 || folds == 1 ||
        verify < 0 || (verify > 0 && model == NULL) ||
        (!emb_only && folds == 0 && out == NULL && verify == 0 && !holdout_auc)) {
        usage();
        return 2;
    }
    rt_data d = {0};
    for (int i = optind; i < argc; i++)
        read_path(&d, argv[i], tool);
    if (holdout != NULL)
        check_list(&d, holdout, tool);
    embed_rows(&d, cache, model, threads, tool);
    if (verify > 0) {
        double worst = verify_cache(&d, model, threads, verify, tool);
        printf("%s: %d fresh encodes, smallest cosine similarity with the cache %.6f\n", tool,
               verify, worst);
        if (!(worst >= 0.999)) {
            printf("%s: FAIL: below 0.999\n", tool);
            data_free(&d);
            return 1;
        }
    }
    if (emb_only || (folds == 0 && out == NULL && !holdout_auc)) {
        data_free(&d);
        return 0;
    }
    bool *train_subject = xrealloc(NULL, (size_t)d.n_subjects * sizeof *train_subject);
    for (int s = 0; s < d.n_subjects; s++)
        train_subject[s] = !in_list(holdout, d.subjects[s]);
    size_t *idx = xrealloc(NULL, d.n * sizeof *idx), n = 0;
    for (size_t i = 0; i < d.n; i++)
        if (train_subject[d.rows[i].subject])
            idx[n++] = i;
    if (n == 0) {
        fprintf(stderr, "%s: no training rows left after --holdout\n", tool);
        return 2;
    }
    if (folds > 0)
        cross_validate(&d, train_subject, folds, hidden, epochs);
    if (holdout_auc) {
        /* The held-out rows' AUC under a model fitted on the training rows (for reports only:
         * nothing is tuned on it). */
        size_t *ho = xrealloc(NULL, d.n * sizeof *ho), n_ho = 0;
        for (size_t i = 0; i < d.n; i++)
            if (!train_subject[d.rows[i].subject])
                ho[n_ho++] = i;
        design m;
        design_build(&m, &d, idx, n);
        double *sc = xrealloc(NULL, (n_ho + 1) * sizeof *sc);
        double *y = xrealloc(NULL, (n_ho + 1) * sizeof *y);
        if (hidden > 0) {
            mlp net;
            fit_mlp(&m, hidden, epochs, l2, &net);
            predict_mlp(&m, &net, &d, ho, n_ho, sc);
            free(net.w1);
        } else {
            double *w = xrealloc(NULL, (size_t)(m.p + 1) * sizeof *w);
            fit_lr(&m, l2, w);
            predict(&m, &d, ho, n_ho, w, sc);
            free(w);
        }
        for (size_t i = 0; i < n_ho; i++)
            y[i] = d.rows[ho[i]].weak_ok ? 0 : 1;
        printf("held-out AUC %.4f (%zu rows)\n", auc(sc, y, n_ho), n_ho);
        free(sc);
        free(y);
        free(ho);
        design_free(&m);
    }
    int rc = 0;
    if (out != NULL) {
        design m;
        design_build(&m, &d, idx, n);
        double *w = xrealloc(NULL, (size_t)(m.p + 1) * sizeof *w);
        int steps = fit_lr(&m, l2, w);
        double *sc = xrealloc(NULL, n * sizeof *sc);
        predict(&m, &d, idx, n, w, sc);
        double positives = 0;
        for (size_t i = 0; i < n; i++)
            positives += m.y[i];
        fprintf(stderr, "%s: %zu training rows (%.1f%% weak-wrong), %d Newton steps, "
                        "training AUC %.4f\n", tool, n, 100 * positives / (double)n, steps,
                auc(sc, m.y, n));
        free(sc);
        /* The comment records what made the file (no paths: the test retrains elsewhere). */
        char comment[1024];
        snprintf(comment, sizeof comment,
                 "llmgw-train-router: logistic regression, l2=%g, %zu training rows, "
                 "Newton steps %d\nheld-out subjects: %s", l2, n, steps,
                 holdout ? holdout : "(none)");
        router_classifier *c = NULL;
        util_err err = {0};
        if (router_classifier_new_lr(&c, d.dim, m.mean, m.std, w, w[m.p], &err) != 0 ||
            router_classifier_save(c, out, comment, &err) != 0) {
            fprintf(stderr, "%s: %s\n", tool, err.msg);
            return 2;
        }
        router_classifier_free(c);
        free(w);
        design_free(&m);
        if (compare != NULL) {
            if (same_weights(out, compare, tool)) {
                fprintf(stderr, "%s: %s matches %s\n", tool, out, compare);
            } else {
                fprintf(stderr, "%s: FAIL: %s differs from %s\n", tool, out, compare);
                rc = 1;
            }
        }
    }
    free(idx);
    free(train_subject);
    data_free(&d);
    return rc;
}

#endif
