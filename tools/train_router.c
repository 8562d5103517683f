/* tools/train_router.c: llmgw-train-router — trains the router's complexity classifier
 * (router/classifier.h, fitted by tools/router_fit.c) on labelled routing CSVs and writes its
 * weights file and, beside it, its kNN vectors file (WEIGHTS with the extension ".knn").
 *
 *   llmgw-train-router [--holdout s1,s2,...] [--emb-cache FILE] [-m MODEL_DIR] [--threads N]
 *                      [--emb-only] [--verify-cache N] [-o WEIGHTS] [--compare WEIGHTS]
 *                      [--k K] [--ridge-alpha A] [--trees N] [--min-leaf N] [--learn-rate R]
 *                      [--familiar-pct P] CSV|DIR...
 *
 * Each CSV reads `prompt,<weak model>,<strong model>` with True/False cells (whether that model
 * answered correctly: ../shared/data/router/mmlu/). The target is the gain, strong right minus
 * weak right (-1, 0 or 1): what sending the prompt to the strong tier buys. A directory means its
 * *.csv files in name order. A file's subject is its name without ".csv" and without a leading
 * "mmlu_"; --holdout leaves those subjects out of training.
 *
 * Embeddings come from --emb-cache (see the cache format below); prompts missing from it are
 * encoded with all-MiniLM-L6-v2 (-m) and appended, so a committed cache spares every later run
 * the encoder. Every embedding, fresh or cached, goes through the cache's int8 quantisation, so a
 * run that encodes and a run that reads the cache train on the same numbers.
 *
 * The recipe options (--k ...) default to what llmgw-eval-router --cv-subjects chose
 * (RFIT_DEFAULTS in tools/router_fit.h). --compare WEIGHTS exits 1 unless the trained files equal
 * WEIGHTS (numbers within 1e-6) and its kNN file (bytes): the shipped weights' regression test.
 * --verify-cache N encodes N rows spread over the data afresh (-m) and exits 1 unless each has
 * cosine similarity >= 0.999 with its cached, quantised embedding.
 *
 * The data half of this file (CSV reading, the embedding cache, the model's inputs) is shared
 * with tools/eval_router.c, which includes it with ROUTER_TOOL_DATA_ONLY defined. */
#include "common/err.h"
#include "engine/encoder/bert_forward.h"
#include "router/classifier.h"
#include "tools/router_fit.h"
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
        if (eng_bert_load(&m, model_dir, NULL, ENG_BERT_AUTO, &err) != 0 ||
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

/* ---- the model's inputs -------------------------------------------------------------------- */

/* Every row's structural features [n][ROUTER_STRUCT_FEATURES] and gain (strong right - weak
 * right: the target of every part of the model). */
static void rows_inputs(const rt_data *d, float **x, double **y)
{
    *x = xrealloc(NULL, d->n * ROUTER_STRUCT_FEATURES * sizeof **x);
    *y = xrealloc(NULL, d->n * sizeof **y);
    for (size_t i = 0; i < d->n; i++) {
        router_struct_features(d->rows[i].prompt, d->rows[i].len,
                               *x + i * ROUTER_STRUCT_FEATURES);
        (*y)[i] = (double)d->rows[i].strong_ok - (double)d->rows[i].weak_ok;
    }
}

/* The training recipe's options, shared by both tools. */
#define RFIT_OPTIONS                                                                          \
    {"k", required_argument, NULL, 1001}, {"ridge-alpha", required_argument, NULL, 1002},    \
    {"trees", required_argument, NULL, 1003}, {"min-leaf", required_argument, NULL, 1004},   \
    {"learn-rate", required_argument, NULL, 1005},                                            \
    {"familiar-pct", required_argument, NULL, 1006}

/* Applies one of RFIT_OPTIONS; false when ch is not one. */
static bool rfit_option(int ch, const char *arg, rfit_params *p)
{
    switch (ch) {
    case 1001: p->k = atoi(arg); return true;
    case 1002: p->ridge_alpha = atof(arg); return true;
    case 1003: p->n_trees = atoi(arg); return true;
    case 1004: p->min_leaf = atoi(arg); return true;
    case 1005: p->learn_rate = atof(arg); return true;
    case 1006: p->familiar_pct = atof(arg); return true;
    default: return false;
    }
}

static bool rfit_valid(const rfit_params *p)
{
    return p->k >= 0 && p->k <= ROUTER_MAX_K && p->ridge_alpha > 0 && p->n_trees >= 0 &&
           p->min_leaf >= 1 && p->learn_rate > 0 && p->familiar_pct >= 0 &&
           p->familiar_pct <= 1;
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
    if (eng_bert_load(&m, model_dir, NULL, ENG_BERT_AUTO, &err) != 0 ||
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

/* Are the two text files the same tokens, numbers equal within 1e-6 (relative above 1)? */
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

/* Are two binary files byte for byte equal? */
static bool same_bytes(const char *a_path, const char *b_path, const char *tool)
{
    FILE *fa = fopen(a_path, "rb"), *fb = fopen(b_path, "rb");
    if (fa == NULL || fb == NULL) {
        fprintf(stderr, "%s: %s: %s\n", tool, fa ? b_path : a_path, strerror(errno));
        exit(2);
    }
    int ca, cb;
    long at = 0;
    do {
        ca = getc(fa);
        cb = getc(fb);
        at++;
    } while (ca == cb && ca != EOF);
    fclose(fa);
    fclose(fb);
    if (ca != cb)
        fprintf(stderr, "%s: %s and %s differ at byte %ld\n", tool, a_path, b_path, at - 1);
    return ca == cb;
}

/* "dir/router.weights" -> "router.knn" (the kNN file beside it). */
static void knn_name_of(const char *weights, char *out, size_t size)
{
    const char *base = strrchr(weights, '/');
    base = base ? base + 1 : weights;
    const char *dot = strrchr(base, '.');
    int stem = dot && dot != base ? (int)(dot - base) : (int)strlen(base);
    snprintf(out, size, "%.*s.knn", stem, base);
}

static void path_beside(const char *file, const char *name, char *out, size_t size)
{
    const char *slash = strrchr(file, '/');
    if (slash == NULL)
        snprintf(out, size, "%s", name);
    else
        snprintf(out, size, "%.*s/%s", (int)(slash - file), file, name);
}

static void usage(void)
{
    fprintf(stderr,
            "usage: llmgw-train-router [--holdout s1,s2,...] [--emb-cache FILE] [-m MODEL_DIR]\n"
            "         [--threads N] [--emb-only] [--verify-cache N] [-o WEIGHTS]\n"
            "         [--compare WEIGHTS] [--k K] [--ridge-alpha A] [--trees N]\n"
            "         [--min-leaf N] [--learn-rate R] [--familiar-pct P] CSV|DIR...\n");
}

int main(int argc, char **argv)
{
    const char *tool = "llmgw-train-router", *holdout = NULL, *cache = NULL, *model = NULL;
    const char *out = NULL, *compare = NULL;
    int threads = 0, verify = 0;
    bool emb_only = false;
    rfit_params params = RFIT_DEFAULTS;
    static const struct option opts[] = {
        {"holdout", required_argument, NULL, 'H'}, {"emb-cache", required_argument, NULL, 'e'},
        {"model", required_argument, NULL, 'm'},   {"threads", required_argument, NULL, 't'},
        {"emb-only", no_argument, NULL, 'E'},      {"output", required_argument, NULL, 'o'},
        {"compare", required_argument, NULL, 'C'}, {"help", no_argument, NULL, 'h'},
        {"verify-cache", required_argument, NULL, 'V'}, RFIT_OPTIONS,
        {NULL, 0, NULL, 0},
    };
    int ch;
    while ((ch = getopt_long(argc, argv, "H:e:m:t:Eo:C:V:h", opts, NULL)) != -1) {
        if (rfit_option(ch, optarg, &params))
            continue;
        switch (ch) {
        case 'H': holdout = optarg; break;
        case 'e': cache = optarg; break;
        case 'm': model = optarg; break;
        case 't': threads = atoi(optarg); break;
        case 'E': emb_only = true; break;
        case 'o': out = optarg; break;
        case 'C': compare = optarg; break;
        case 'V': verify = atoi(optarg); break;
        case 'h': usage(); return 0;
        default: usage(); return 2;
        }
    }
    if (optind == argc || !rfit_valid(&params) || verify < 0 ||
        (verify > 0 && model == NULL) || (!emb_only && out == NULL && verify == 0) ||
        (compare != NULL && out == NULL)) {
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
    if (out == NULL) {
        data_free(&d);
        return 0;
    }
    size_t *idx = xrealloc(NULL, d.n * sizeof *idx), n = 0;
    for (size_t i = 0; i < d.n; i++)
        if (!in_list(holdout, d.subjects[d.rows[i].subject]))
            idx[n++] = i;
    if (n <= (size_t)params.k) {
        fprintf(stderr, "%s: %zu training rows left after --holdout (need more than k)\n", tool,
                n);
        return 2;
    }
    float *x;
    double *y;
    rows_inputs(&d, &x, &y);
    router_classifier *c = rfit_train(d.emb, x, y, d.dim, idx, n, &params);
    char recipe[256], comment[1024], knn_name[256];
    rfit_describe(&params, recipe, sizeof recipe);
    /* The comment records what made the file (no paths: the test retrains elsewhere). */
    snprintf(comment, sizeof comment,
             "llmgw-train-router: kNN + ridge + boosted trees of the gain, %zu training rows\n"
             "%s\nheld-out subjects: %s", n, recipe, holdout ? holdout : "(none)");
    knn_name_of(out, knn_name, sizeof knn_name);
    util_err err = {0};
    if (router_classifier_save(c, out, knn_name, comment, &err) != 0) {
        fprintf(stderr, "%s: %s\n", tool, err.msg);
        return 2;
    }
    fprintf(stderr, "%s: %zu training rows, %s -> %s (+ %s)\n", tool, n, recipe, out, knn_name);
    router_classifier_free(c);
    int rc = 0;
    if (compare != NULL) {
        char ka[4096], kb[4096], cmp_knn[256];
        knn_name_of(compare, cmp_knn, sizeof cmp_knn);
        path_beside(out, knn_name, ka, sizeof ka);
        path_beside(compare, cmp_knn, kb, sizeof kb);
        if (same_weights(out, compare, tool) && (params.k == 0 || same_bytes(ka, kb, tool))) {
            fprintf(stderr, "%s: %s matches %s\n", tool, out, compare);
        } else {
            fprintf(stderr, "%s: FAIL: %s differs from %s\n", tool, out, compare);
            rc = 1;
        }
    }
    free(x);
    free(y);
    free(idx);
    data_free(&d);
    return rc;
}

#endif
