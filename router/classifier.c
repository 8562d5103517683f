/* router/classifier.c: the complexity classifier (see classifier.h) — structural features of a
 * prompt, the weights files (parser, writer) and scoring.
 *
 * The weights file is text, one record per line, in this order, written by llmgw-train-router:
 *
 *   llmgw-router version=2 dim=384 features=24
 *   # comments and blank lines are skipped
 *   knn <k> <file>              the kNN part: k and its vectors file (relative), or "knn 0 -"
 *   ridge_mean <dim numbers>    the ridge part: the training embeddings' means,
 *   ridge_std <dim numbers>     their standard deviations (> 0),
 *   ridge_weight <dim numbers>  the weights of the standardised embedding,
 *   ridge_bias <1 number>
 *   trees <count> <base>        the boosted trees: how many, and the starting value
 *   tree <7 features> <7 thresholds> <8 leaves>   count times (features: -1..features-1)
 *   combine <6 numbers>         mean and spread (> 0) of each part's training predictions
 *   quantiles <101 numbers>     the summed score's percentiles 0..100, ascending
 *   familiar_min <1 number>
 *
 * Numbers are finite decimals (strtod syntax, at most 63 characters). Any deviation is an error
 * naming the file and the line.
 *
 * The kNN vectors file is binary, little-endian: the 8 bytes "LLMGWKNN", u32 version (1),
 * u32 dim, u32 n, then n records of f32 scale, f32 target, int8 q[dim]; a vector is q * scale,
 * of unit length. */
#include "router/classifier.h"

#include "common/dot.h"
#include "common/mmap.h"

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define WEIGHTS_MAGIC "llmgw-router"
#define WEIGHTS_VERSION 2
#define KNN_MAGIC "LLMGWKNN"
#define KNN_VERSION 1u
#define MAX_DIM 8192
#define MAX_TREES 100000
#define MAX_KNN ((size_t)1 << 24)

struct router_classifier {
    router_model m;   /* arrays below are owned */
    int8_t *knn_q;
    float *knn_scale, *knn_target;
    double *ridge_mean, *ridge_std, *ridge_weight;
    router_tree *trees;
    double *ridge_scaled;  /* weight / std */
    double ridge_offset;   /* bias - sum(weight * mean / std) */
};
/* ---- structural features -------------------------------------------------------------------- */

#define FEATURE_TEXT_MAX 65536   /* bytes looked at beyond the length features */
#define MAX_WORDS 4096           /* distinct-word counting stops here */

static bool is_space(unsigned char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

static bool is_alnum(unsigned char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

static unsigned char lower(unsigned char c)
{
    return c >= 'A' && c <= 'Z' ? (unsigned char)(c + 32) : c;
}

/* An answer option line: "A. text", "B) text" (A..J). Sets *body past the marker. */
static bool option_line(const char *s, size_t n, const char **body, size_t *body_len)
{
    if (n < 2 || s[0] < 'A' || s[0] > 'J' || (s[1] != '.' && s[1] != ')'))
        return false;
    if (n > 2 && s[2] != ' ')
        return false;
    size_t skip = n > 2 ? 3 : 2;
    *body = s + skip;
    *body_len = n - skip;
    return true;
}

/* Case-insensitive: does lit (lower case) occur in s[0..n)? */
static bool contains(const char *s, size_t n, const char *lit)
{
    size_t m = strlen(lit);
    for (size_t i = 0; i + m <= n; i++) {
        size_t j = 0;
        while (j < m && lower((unsigned char)s[i + j]) == (unsigned char)lit[j])
            j++;
        if (j == m)
            return true;
    }
    return false;
}

static bool in_words(const char *w, const char *const *list, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(w, list[i]) == 0)
            return true;
    return false;
}

static const char *const negation_words[] = {"not", "no", "never", "except", "least", "false",
                                             "incorrect", "cannot", "none", "isn't", "doesn't",
                                             "don't", "aren't", "wasn't"};
static const char *const reasoning_words[] = {"calculate", "compute", "find", "solve",
                                              "determine", "estimate", "evaluate", "simplify",
                                              "derive", "prove", "probability", "expected",
                                              "rate"};
static const char *const person_words[] = {"you", "your", "my", "me"};

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

typedef struct stem_stats {
    size_t bytes, words, digits, numbers, operators, questions, negations, reasoning;
    size_t capitalised, word_bytes, n_hashes;
    bool which_of, except, not_word, statement, person, how;
    uint64_t hashes[MAX_WORDS];
} stem_stats;

/* One line of the question stem. */
static void stem_line(stem_stats *st, const char *s, size_t n)
{
    st->bytes += n;
    st->which_of |= contains(s, n, "which of the following");
    st->statement |= contains(s, n, "statement 1");
    st->how |= contains(s, n, "how many") || contains(s, n, "how much");
    bool in_number = false;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        bool digit = c >= '0' && c <= '9';
        st->digits += digit;
        if (digit && !in_number)
            st->numbers++;
        in_number = digit || (in_number && (c == '.' || c == ',') && i + 1 < n &&
                              s[i + 1] >= '0' && s[i + 1] <= '9');
        st->operators += c == '=' || c == '+' || c == '*' || c == '/' || c == '^' || c == '<' ||
                         c == '>';
        st->questions += c == '?';
    }
    for (size_t i = 0; i < n;) {
        while (i < n && is_space((unsigned char)s[i]))
            i++;
        size_t b = i;
        while (i < n && !is_space((unsigned char)s[i]))
            i++;
        if (i == b)
            break;
        st->words++;
        st->word_bytes += i - b;
        size_t wb = b, we = i;  /* the word without surrounding punctuation */
        while (wb < we && !is_alnum((unsigned char)s[wb]))
            wb++;
        while (we > wb && !is_alnum((unsigned char)s[we - 1]))
            we--;
        if (we == wb)
            continue;
        st->capitalised += s[wb] >= 'A' && s[wb] <= 'Z';
        char w[24];
        size_t wl = we - wb < sizeof w - 1 ? we - wb : sizeof w - 1;
        uint64_t h = 1469598103934665603ull;
        for (size_t k = 0; k < wl; k++) {
            w[k] = (char)lower((unsigned char)s[wb + k]);
            h = (h ^ (unsigned char)w[k]) * 1099511628211ull;
        }
        w[wl] = '\0';
        if (st->n_hashes < MAX_WORDS)
            st->hashes[st->n_hashes++] = h;
        bool neg = in_words(w, negation_words, sizeof negation_words / sizeof *negation_words);
        st->negations += neg;
        st->not_word |= neg && strcmp(w, "not") == 0;
        st->except |= strcmp(w, "except") == 0;
        st->reasoning += in_words(w, reasoning_words,
                                  sizeof reasoning_words / sizeof *reasoning_words);
        st->person |= in_words(w, person_words, sizeof person_words / sizeof *person_words) ||
                      (we - wb == 1 && s[wb] == 'I');
    }
}

/* A numeric answer option: a digit, and at most 6 letters (a unit). */
static bool numeric_option(const char *s, size_t n)
{
    size_t digits = 0, letters = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        digits += c >= '0' && c <= '9';
        letters += (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
    }
    return digits > 0 && letters <= 6;
}

/* A Roman numeral I..IV as a whole word. */
static bool has_roman(const char *s, size_t n)
{
    static const char *const romans[] = {"IV", "III", "II", "I"};
    for (size_t i = 0; i < n; i++) {
        if (i > 0 && is_alnum((unsigned char)s[i - 1]))
            continue;
        for (size_t r = 0; r < 4; r++) {
            size_t m = strlen(romans[r]);
            if (i + m <= n && memcmp(s + i, romans[r], m) == 0 &&
                (i + m == n || !is_alnum((unsigned char)s[i + m])))
                return true;
        }
    }
    return false;
}

/* The features, in order:
 *   0 log(1 + bytes)                 1 log(1 + stem words)        2 log(1 + answer options)
 *   3 log(1 + mean option bytes)     4 log(1 + longest option)    5 option length spread
 *   6 share of numeric options       7 log(1 + numbers in stem)   8 log(1 + operators = + * / ^ < >)
 *   9 digit share of the stem       10 log(1 + negation words)   11 log(1 + reasoning cues)
 *  12 "which of the following"      13 "except", or "not" in a question
 *  14 "Statement 1"                 15 Roman numerals in options 16 '?' count
 *  17 log(1 + lines)                18 every option a short pair ("Wrong, Not wrong")
 *  19 distinct-word ratio           20 mean word bytes           21 capitalised word share
 *  22 first/second person           23 "all/none of the above", "both" in options
 * The stem is every line that is neither an option ("A. ...") nor "Answer:". Only the first
 * FEATURE_TEXT_MAX bytes are read beyond feature 0. */
void router_struct_features(const char *text, size_t len, float out[ROUTER_STRUCT_FEATURES])
{
    memset(out, 0, ROUTER_STRUCT_FEATURES * sizeof *out);
    if (text == NULL || len == 0)
        return;
    out[0] = (float)log1p((double)len);
    size_t n = len < FEATURE_TEXT_MAX ? len : FEATURE_TEXT_MAX;
    stem_stats *st = calloc(1, sizeof *st);
    if (st == NULL)
        return;
    size_t options = 0, opt_bytes = 0, opt_max = 0, numeric = 0, pairs = 0, lines = 0;
    double opt_sq = 0;
    bool roman = false, above = false;
    for (size_t i = 0; i < n;) {
        const char *e = memchr(text + i, '\n', n - i);
        size_t end = e ? (size_t)(e - text) : n;
        const char *s = text + i, *body;
        size_t sn = end - i, bn;
        lines++;
        while (sn > 0 && (s[sn - 1] == '\r' || s[sn - 1] == ' '))
            sn--;
        if (option_line(s, sn, &body, &bn)) {
            options++;
            opt_bytes += bn;
            opt_sq += (double)bn * (double)bn;
            opt_max = bn > opt_max ? bn : opt_max;
            numeric += numeric_option(body, bn);
            pairs += bn < 25 && memchr(body, ',', bn) != NULL;
            roman |= has_roman(body, bn);
            above |= contains(body, bn, "all of the above") ||
                     contains(body, bn, "none of the above") || contains(body, bn, "both");
        } else if (!(sn == 7 && memcmp(s, "Answer:", 7) == 0)) {
            stem_line(st, s, sn);
        }
        i = end + 1;
    }
    double mean = options ? (double)opt_bytes / (double)options : 0;
    double var = options ? opt_sq / (double)options - mean * mean : 0;
    qsort(st->hashes, st->n_hashes, sizeof *st->hashes, cmp_u64);
    size_t distinct = 0;
    for (size_t i = 0; i < st->n_hashes; i++)
        distinct += i == 0 || st->hashes[i] != st->hashes[i - 1];
    out[1] = (float)log1p((double)st->words);
    out[2] = (float)log1p((double)options);
    out[3] = (float)log1p(mean);
    out[4] = (float)log1p((double)opt_max);
    out[5] = (float)(sqrt(var > 0 ? var : 0) / (mean + 1));
    out[6] = options ? (float)((double)numeric / (double)options) : 0;
    out[7] = (float)log1p((double)st->numbers);
    out[8] = (float)log1p((double)st->operators);
    out[9] = (float)((double)st->digits / (double)(st->bytes + 1));
    out[10] = (float)log1p((double)st->negations);
    out[11] = (float)log1p((double)(st->reasoning + st->how));
    out[12] = st->which_of;
    out[13] = st->except || (st->not_word && st->questions > 0);
    out[14] = st->statement;
    out[15] = roman;
    out[16] = (float)st->questions;
    out[17] = (float)log1p((double)lines);
    out[18] = options > 0 && pairs == options;
    out[19] = st->words ? (float)(log1p((double)distinct) / log1p((double)st->words)) : 0;
    out[20] = st->words ? (float)((double)st->word_bytes / (double)st->words) : 0;
    out[21] = (float)((double)st->capitalised / (double)(st->words + 1));
    out[22] = st->person;
    out[23] = above;
    free(st);
}

/* ---- construction ----------------------------------------------------------------------- */

void router_classifier_free(router_classifier *c)
{
    if (c == NULL)
        return;
    free(c->knn_q);
    free(c->knn_scale);
    free(c->knn_target);
    free(c->ridge_mean);
    free(c->ridge_std);
    free(c->ridge_weight);
    free(c->ridge_scaled);
    free(c->trees);
    free(c);
}

static void *dup_array(const void *src, size_t bytes, bool *oom)
{
    void *p = malloc(bytes ? bytes : 1);
    if (p == NULL)
        *oom = true;
    else if (bytes)
        memcpy(p, src, bytes);
    return p;
}

static bool finite_all(const double *v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!isfinite(v[i]))
            return false;
    return true;
}

/* Everything router_classifier_new checks; 0 or EINVAL with err set. */
static int validate(const router_model *m, util_err *err)
{
#define BAD(...) util_err_set(err, LLMGW_EINVAL, "classifier: " __VA_ARGS__)
    if (m->dim < 1 || m->dim > MAX_DIM)
        return BAD("dim %d is outside 1..%d", m->dim, MAX_DIM);
    size_t dim = (size_t)m->dim;
    if (m->k < 0 || m->k > ROUTER_MAX_K)
        return BAD("k %d is outside 0..%d", m->k, ROUTER_MAX_K);
    if (m->k > 0 && ((size_t)m->k > m->n_knn || m->n_knn > MAX_KNN))
        return BAD("k %d needs between k and %zu vectors, not %zu", m->k, MAX_KNN, m->n_knn);
    for (size_t i = 0; m->k > 0 && i < m->n_knn; i++)
        if (!isfinite(m->knn_scale[i]) || !(m->knn_scale[i] >= 0) ||
            !isfinite(m->knn_target[i]) || fabsf(m->knn_target[i]) > 1e6f)
            return BAD("kNN vector %zu has a bad scale or target", i);
    if (!finite_all(m->ridge_mean, dim) || !finite_all(m->ridge_weight, dim) ||
        !isfinite(m->ridge_bias))
        return BAD("a ridge parameter is not finite");
    for (size_t i = 0; i < dim; i++)
        if (!(m->ridge_std[i] > 0) || !isfinite(m->ridge_std[i]))
            return BAD("ridge std %zu is not positive", i + 1);
    if (m->n_trees < 0 || m->n_trees > MAX_TREES || !isfinite(m->tree_base))
        return BAD("bad trees (%d, base %g)", m->n_trees, m->tree_base);
    for (int t = 0; t < m->n_trees; t++) {
        const router_tree *tr = &m->trees[t];
        for (int i = 0; i < ROUTER_TREE_NODES; i++)
            if (tr->feature[i] < -1 || tr->feature[i] >= ROUTER_STRUCT_FEATURES ||
                !isfinite(tr->threshold[i]))
                return BAD("tree %d node %d: feature %d or its threshold is invalid", t + 1, i,
                           tr->feature[i]);
        if (!finite_all(tr->leaf, ROUTER_TREE_LEAVES))
            return BAD("tree %d: a leaf is not finite", t + 1);
    }
    if (!finite_all(m->combine_mean, 3) || !finite_all(m->combine_std, 3))
        return BAD("a combine value is not finite");
    for (int j = 0; j < 3; j++)
        if (!(m->combine_std[j] > 0))
            return BAD("combine spread %d is not positive", j + 1);
    if (!finite_all(m->quantiles, ROUTER_QUANTILES))
        return BAD("a quantile is not finite");
    for (int i = 1; i < ROUTER_QUANTILES; i++)
        if (m->quantiles[i] < m->quantiles[i - 1])
            return BAD("quantiles are not ascending (at %d)", i);
    if (!isfinite(m->familiar_min))
        return BAD("familiar_min is not finite");
    /* The folded ridge must not overflow: |offset| + sum |weight / std| stays below 1e300. */
    double total = fabs(m->ridge_bias);
    for (size_t i = 0; i < dim; i++)
        total += fabs(m->ridge_weight[i] / m->ridge_std[i]) * (1 + fabs(m->ridge_mean[i]));
    if (!(total < 1e300))
        return BAD("ridge weight / std overflows");
    return 0;
#undef BAD
}

int router_classifier_new(router_classifier **out, const router_model *m, util_err *err)
{
    int rc = validate(m, err);
    if (rc != 0)
        return rc;
    router_classifier *c = calloc(1, sizeof *c);
    if (c == NULL)
        return util_err_set(err, LLMGW_ENOMEM, "classifier: out of memory");
    size_t dim = (size_t)m->dim, n = m->k > 0 ? m->n_knn : 0;
    bool oom = false;
    c->m = *m;
    c->m.n_knn = n;
    c->knn_q = dup_array(m->knn_q, n * dim, &oom);
    c->knn_scale = dup_array(m->knn_scale, n * sizeof(float), &oom);
    c->knn_target = dup_array(m->knn_target, n * sizeof(float), &oom);
    c->ridge_mean = dup_array(m->ridge_mean, dim * sizeof(double), &oom);
    c->ridge_std = dup_array(m->ridge_std, dim * sizeof(double), &oom);
    c->ridge_weight = dup_array(m->ridge_weight, dim * sizeof(double), &oom);
    c->trees = dup_array(m->trees, (size_t)m->n_trees * sizeof(router_tree), &oom);
    c->ridge_scaled = malloc(dim * sizeof(double));
    if (oom || c->ridge_scaled == NULL) {
        router_classifier_free(c);
        return util_err_set(err, LLMGW_ENOMEM, "classifier: out of memory");
    }
    c->m.knn_q = c->knn_q;
    c->m.knn_scale = c->knn_scale;
    c->m.knn_target = c->knn_target;
    c->m.ridge_mean = c->ridge_mean;
    c->m.ridge_std = c->ridge_std;
    c->m.ridge_weight = c->ridge_weight;
    c->m.trees = c->trees;
    c->ridge_offset = m->ridge_bias;
    for (size_t i = 0; i < dim; i++) {
        c->ridge_scaled[i] = m->ridge_weight[i] / m->ridge_std[i];
        c->ridge_offset -= c->ridge_scaled[i] * m->ridge_mean[i];
    }
    *out = c;
    return 0;
}

int router_classifier_dim(const router_classifier *c)
{
    return c->m.dim;
}

const router_model *router_classifier_model(const router_classifier *c)
{
    return &c->m;
}

/* ---- scoring ------------------------------------------------------------------------------- */

void router_knn_query(const int8_t *q, const float *scale, const float *target, size_t n, int dim,
                      int k, const float *emb, long skip, double *pred, double *familiarity)
{
    *pred = 0;
    *familiarity = -1;
    if (k <= 0 || n == 0 || emb == NULL)
        return;
    int8_t qe[MAX_DIM];
    float mx = 0;
    for (int i = 0; i < dim; i++)
        mx = fabsf(emb[i]) > mx ? fabsf(emb[i]) : mx;
    float se = mx > 0 ? mx / 127.0f : 1.0f;
    for (int i = 0; i < dim; i++) {
        long v = lrintf(emb[i] / se);
        qe[i] = (int8_t)(v > 127 ? 127 : v < -127 ? -127 : v);
    }
    /* The k best, kept unordered with the position of the weakest. */
    float best[ROUTER_MAX_K];
    size_t who[ROUTER_MAX_K];
    int have = 0, weakest = 0;
    for (size_t j = 0; j < n; j++) {
        if ((long)j == skip)
            continue;
        float s = (float)util_dot_i8(qe, q + j * (size_t)dim, dim) * se * scale[j];
        if (have < k) {
            best[have] = s;
            who[have] = j;
            if (have == 0 || s < best[weakest])
                weakest = have;
            have++;
        } else if (s > best[weakest]) {
            best[weakest] = s;
            who[weakest] = j;
            for (int i = 0; i < k; i++)
                if (best[i] < best[weakest])
                    weakest = i;
        }
    }
    double t = 0, f = 0;
    for (int i = 0; i < have; i++) {
        t += target[who[i]];
        f += best[i];
    }
    if (have > 0) {
        *pred = t / have;
        *familiarity = f / have;
    }
}

double router_trees_predict(const router_tree *t, int n_trees, double base, const float *x)
{
    double y = base;
    for (int i = 0; i < n_trees; i++) {
        int node = 0;
        while (node < ROUTER_TREE_NODES) {
            int f = t[i].feature[node];
            node = 2 * node + (f >= 0 && !(x[f] < t[i].threshold[node]) ? 2 : 1);
        }
        y += t[i].leaf[node - ROUTER_TREE_NODES];
    }
    return y;
}

/* The percentile of z among the quantiles, interpolated: [0, 1]. */
static double percentile(const double *qs, double z)
{
    if (!(z > qs[0]))
        return 0;
    if (z >= qs[ROUTER_QUANTILES - 1])
        return 1;
    int lo = 0, hi = ROUTER_QUANTILES - 1;  /* qs[lo] < z <= qs[hi] */
    while (hi - lo > 1) {
        int mid = (lo + hi) / 2;
        if (qs[mid] < z)
            lo = mid;
        else
            hi = mid;
    }
    double span = qs[hi] - qs[lo];
    double frac = span > 0 ? (z - qs[lo]) / span : 1;
    return ((double)lo + frac) / (ROUTER_QUANTILES - 1);
}

void router_classifier_assess(const router_classifier *c, const float *emb, const char *text,
                              size_t len, router_assessment *out)
{
    const router_model *m = &c->m;
    float x[ROUTER_STRUCT_FEATURES];
    router_struct_features(text, len, x);
    double part[3];
    part[0] = m->combine_mean[0];
    out->familiarity = -1;
    if (m->k > 0 && emb != NULL)
        router_knn_query(m->knn_q, m->knn_scale, m->knn_target, m->n_knn, m->dim, m->k, emb, -1,
                         &part[0], &out->familiarity);
    part[1] = m->combine_mean[1];
    if (emb != NULL) {
        double r = c->ridge_offset;
        for (int i = 0; i < m->dim; i++)
            r += c->ridge_scaled[i] * emb[i];
        part[1] = isfinite(r) ? r : m->combine_mean[1];
    }
    part[2] = router_trees_predict(m->trees, m->n_trees, m->tree_base, x);
    double z = 0;
    for (int j = 0; j < 3; j++) {
        out->part[j] = part[j];
        z += (part[j] - m->combine_mean[j]) / m->combine_std[j];
    }
    out->score = isfinite(z) ? percentile(m->quantiles, z) : 0.5;
    out->familiar = m->k == 0 || out->familiarity >= m->familiar_min;
}

double router_classifier_score(const router_classifier *c, const float *emb, const char *text,
                               size_t len)
{
    router_assessment a;
    router_classifier_assess(c, emb, text, len, &a);
    return a.score;
}

/* ---- the parser ---------------------------------------------------------------------------- */

typedef struct cursor {
    const char *p, *end;  /* the current line's unread bytes: [p, end) */
    const char *name;
    long line;
} cursor;

/* The next whitespace-separated token of the line, or false at its end. */
static bool next_token(cursor *cur, const char **tok, size_t *len)
{
    while (cur->p < cur->end && (*cur->p == ' ' || *cur->p == '\t' || *cur->p == '\r'))
        cur->p++;
    if (cur->p == cur->end)
        return false;
    const char *s = cur->p;
    while (cur->p < cur->end && *cur->p != ' ' && *cur->p != '\t' && *cur->p != '\r')
        cur->p++;
    *tok = s;
    *len = (size_t)(cur->p - s);
    return true;
}

static bool token_is(const char *tok, size_t len, const char *lit)
{
    return len == strlen(lit) && memcmp(tok, lit, len) == 0;
}

/* A finite number from a token (strtod syntax, whole token). */
static bool parse_number(const char *tok, size_t len, double *out)
{
    char buf[64];
    if (len == 0 || len >= sizeof buf)
        return false;
    memcpy(buf, tok, len);
    buf[len] = '\0';
    char *end;
    errno = 0;
    double v = strtod(buf, &end);
    if (end != buf + len || !isfinite(v))
        return false;
    *out = v;
    return true;
}

/* "key=<integer>" within [lo, hi]. */
static bool parse_key_int(const char *tok, size_t len, const char *key, long lo, long hi,
                          long *out)
{
    size_t k = strlen(key);
    if (len <= k + 1 || memcmp(tok, key, k) != 0 || tok[k] != '=' || len - k - 1 > 9)
        return false;
    long v = 0;
    for (size_t i = k + 1; i < len; i++) {
        if (tok[i] < '0' || tok[i] > '9')
            return false;
        v = v * 10 + (tok[i] - '0');
    }
    if (v < lo || v > hi)
        return false;
    *out = v;
    return true;
}

/* Moves cur to the next line holding something other than a comment; false at the end. */
static bool next_line(cursor *cur, const char **line_end, const char *buf_end)
{
    const char *s = *line_end;
    while (s < buf_end) {
        if (*s == '\n')
            s++;
        const char *e = memchr(s, '\n', (size_t)(buf_end - s));
        e = e ? e : buf_end;
        cur->line++;
        const char *q = s;
        while (q < e && (*q == ' ' || *q == '\t' || *q == '\r'))
            q++;
        if (q < e && *q != '#') {
            cur->p = q;
            cur->end = e;
            *line_end = e;
            return true;
        }
        s = e;
    }
    *line_end = buf_end;
    return false;
}


static int parse_header(cursor *cur, long *dim, util_err *err)
{
    const char *tok;
    size_t len;
    long version = 0, features = 0;
    if (!next_token(cur, &tok, &len) || !token_is(tok, len, WEIGHTS_MAGIC))
        return util_err_set(err, LLMGW_EINVAL,
                            "%s:%ld: not a router weights file (want the magic \"%s\")",
                            cur->name, cur->line, WEIGHTS_MAGIC);
    if (!next_token(cur, &tok, &len) || !parse_key_int(tok, len, "version", 0, 1000000, &version))
        return util_err_set(err, LLMGW_EINVAL, "%s:%ld: want version=<n> after the magic",
                            cur->name, cur->line);
    if (version != WEIGHTS_VERSION)
        return util_err_set(err, LLMGW_EINVAL,
                            "%s:%ld: version %ld, this build reads %d (retrain with "
                            "llmgw-train-router)", cur->name, cur->line, version, WEIGHTS_VERSION);
    if (!next_token(cur, &tok, &len) || !parse_key_int(tok, len, "dim", 1, MAX_DIM, dim))
        return util_err_set(err, LLMGW_EINVAL, "%s:%ld: want dim=<1..%d> after the version",
                            cur->name, cur->line, MAX_DIM);
    if (!next_token(cur, &tok, &len) ||
        !parse_key_int(tok, len, "features", 0, 1000000, &features))
        return util_err_set(err, LLMGW_EINVAL, "%s:%ld: want features=<n> after the dim",
                            cur->name, cur->line);
    if (features != ROUTER_STRUCT_FEATURES)
        return util_err_set(err, LLMGW_EINVAL,
                            "%s:%ld: features=%ld structural features, this build computes %d",
                            cur->name, cur->line, features, ROUTER_STRUCT_FEATURES);
    if (next_token(cur, &tok, &len))
        return util_err_set(err, LLMGW_EINVAL, "%s:%ld: unexpected \"%.*s\" in the header",
                            cur->name, cur->line, (int)(len > 32 ? 32 : len), tok);
    return 0;
}

/* The rest of a record line after its key: exactly n numbers into out. */
static int parse_numbers(cursor *cur, const char *key, double *out, int n, util_err *err)
{
    const char *tok;
    size_t len;
    int k = 0;
    while (next_token(cur, &tok, &len)) {
        if (k == n)
            return util_err_set(err, LLMGW_EINVAL, "%s:%ld: %s: more than %d numbers",
                                cur->name, cur->line, key, n);
        if (!parse_number(tok, len, &out[k]))
            return util_err_set(err, LLMGW_EINVAL,
                                "%s:%ld: %s: value %d \"%.*s\" is not a finite number",
                                cur->name, cur->line, key, k + 1, (int)(len > 32 ? 32 : len),
                                tok);
        k++;
    }
    if (k != n)
        return util_err_set(err, LLMGW_EINVAL, "%s:%ld: %s: %d numbers, want %d", cur->name,
                            cur->line, key, k, n);
    return 0;
}

/* The next record line, which must start with key. */
static int want_record(cursor *cur, const char **line_end, const char *end, const char *key,
                       util_err *err)
{
    const char *tok;
    size_t len;
    if (!next_line(cur, line_end, end))
        return util_err_set(err, LLMGW_EINVAL, "%s:%ld: truncated: the \"%s\" record is missing",
                            cur->name, cur->line, key);
    if (!next_token(cur, &tok, &len) || !token_is(tok, len, key))
        return util_err_set(err, LLMGW_EINVAL, "%s:%ld: want the \"%s\" record here", cur->name,
                            cur->line, key);
    return 0;
}

static uint32_t get_u32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static float get_f32(const unsigned char *p)
{
    uint32_t bits = get_u32(p);
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* Reads a whole file (at most max bytes). */
static int read_file(const char *path, size_t max, char **out, size_t *out_len, util_err *err)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return util_err_set(err, LLMGW_EIO, "%s: %s", path, strerror(errno));
    char *buf = NULL;
    size_t n = 0, cap = 0, got;
    int rc = 0;
    do {
        if (n + 65536 > cap) {
            if (cap > max) {
                rc = util_err_set(err, LLMGW_ERANGE, "%s: larger than %zu MiB", path, max >> 20);
                goto out;
            }
            char *grown = realloc(buf, cap = 2 * cap + 65536);
            if (grown == NULL) {
                rc = util_err_set(err, LLMGW_ENOMEM, "%s: out of memory", path);
                goto out;
            }
            buf = grown;
        }
        got = fread(buf + n, 1, cap - n, f);
        n += got;
    } while (got > 0);
    if (ferror(f))
        rc = util_err_set(err, LLMGW_EIO, "%s: read error", path);
out:
    fclose(f);
    if (rc != 0) {
        free(buf);
        return rc;
    }
    *out = buf;
    *out_len = n;
    return 0;
}

typedef struct knn_data {
    int8_t *q;
    float *scale, *target;
    size_t n;
} knn_data;

static void knn_data_free(knn_data *k)
{
    free(k->q);
    free(k->scale);
    free(k->target);
}

/* Loads a kNN vectors file of dim-wide vectors. */
static int load_knn(const char *path, int dim, knn_data *out, util_err *err)
{
    util_map map;
    int rc = util_map_file(&map, path, 20, err);  /* 20: the header */
    if (rc != 0)
        return rc;
    const unsigned char *p = map.base;
    size_t len = map.size, rec = 8 + (size_t)dim;
    if (memcmp(p, KNN_MAGIC, 8) != 0) {
        rc = util_err_set(err, LLMGW_EINVAL, "%s: not an llmgw kNN file (bad magic)", path);
    } else if (get_u32(p + 8) != KNN_VERSION || get_u32(p + 12) != (uint32_t)dim) {
        rc = util_err_set(err, LLMGW_EINVAL, "%s: version %u dim %u, want version %u dim %d",
                          path, get_u32(p + 8), get_u32(p + 12), KNN_VERSION, dim);
    } else if (get_u32(p + 16) > MAX_KNN || (len - 20) != (size_t)get_u32(p + 16) * rec) {
        rc = util_err_set(err, LLMGW_EINVAL, "%s: %zu bytes of records for %u vectors of %zu",
                          path, len - 20, get_u32(p + 16), rec);
    } else {
        size_t n = get_u32(p + 16);
        out->n = n;
        out->q = malloc(n * (size_t)dim + 1);
        out->scale = malloc(n * sizeof(float) + 1);
        out->target = malloc(n * sizeof(float) + 1);
        if (out->q == NULL || out->scale == NULL || out->target == NULL) {
            knn_data_free(out);
            rc = util_err_set(err, LLMGW_ENOMEM, "%s: out of memory", path);
        }
        for (size_t i = 0; rc == 0 && i < n; i++) {
            const unsigned char *r = p + 20 + i * rec;
            out->scale[i] = get_f32(r);
            out->target[i] = get_f32(r + 4);
            memcpy(out->q + i * (size_t)dim, r + 8, (size_t)dim);
        }
    }
    util_map_release(&map);
    return rc;
}

int router_classifier_parse(router_classifier **out, const char *buf, size_t len,
                            const char *name, const char *dir, util_err *err)
{
    cursor cur = {.name = name ? name : "(weights)"};
    const char *line_end = buf, *end = buf + len, *tok;
    size_t tlen;
    long dim = 0;
    int rc;
    router_model m = {0};
    knn_data knn = {0};
    double *ridge = NULL;
    router_tree *trees = NULL;
    if (len > 0 && memchr(buf, '\0', len) != NULL)
        return util_err_set(err, LLMGW_EINVAL, "%s: a NUL byte in a text file", cur.name);
    if (!next_line(&cur, &line_end, end))
        return util_err_set(err, LLMGW_EINVAL, "%s: empty, want a router weights file",
                            cur.name);
    if ((rc = parse_header(&cur, &dim, err)) != 0)
        return rc;
    m.dim = (int)dim;
    /* knn <k> <file> */
    if ((rc = want_record(&cur, &line_end, end, "knn", err)) != 0)
        return rc;
    double kv;
    if (!next_token(&cur, &tok, &tlen) || !parse_number(tok, tlen, &kv) || kv != floor(kv) ||
        kv < 0 || kv > ROUTER_MAX_K)
        return util_err_set(err, LLMGW_EINVAL, "%s:%ld: knn: want k in 0..%d", cur.name,
                            cur.line, ROUTER_MAX_K);
    m.k = (int)kv;
    if (!next_token(&cur, &tok, &tlen) || tlen > 255)
        return util_err_set(err, LLMGW_EINVAL, "%s:%ld: knn: want a file name after k",
                            cur.name, cur.line);
    char file[256];
    memcpy(file, tok, tlen);
    file[tlen] = '\0';
    if (next_token(&cur, &tok, &tlen))
        return util_err_set(err, LLMGW_EINVAL, "%s:%ld: knn: unexpected \"%.*s\"", cur.name,
                            cur.line, (int)(tlen > 32 ? 32 : tlen), tok);
    if (m.k > 0) {
        if (dir == NULL || strcmp(file, "-") == 0 || strchr(file, '/') != NULL)
            return util_err_set(err, LLMGW_EINVAL,
                                "%s:%ld: knn: \"%s\" is not a file name beside the weights",
                                cur.name, cur.line, file);
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, file);
        util_err sub = {0};
        if ((rc = load_knn(path, m.dim, &knn, &sub)) != 0)
            return util_err_set(err, rc, "%s:%ld: knn: %s", cur.name, cur.line, sub.msg);
        m.n_knn = knn.n;
        m.knn_q = knn.q;
        m.knn_scale = knn.scale;
        m.knn_target = knn.target;
    }
    ridge = calloc(3 * (size_t)dim + 1, sizeof *ridge);
    if (ridge == NULL) {
        rc = util_err_set(err, LLMGW_ENOMEM, "%s: out of memory", cur.name);
        goto done;
    }
    static const char *const ridge_keys[] = {"ridge_mean", "ridge_std", "ridge_weight"};
    for (int r = 0; r < 3; r++)
        if ((rc = want_record(&cur, &line_end, end, ridge_keys[r], err)) != 0 ||
            (rc = parse_numbers(&cur, ridge_keys[r], ridge + (size_t)r * (size_t)dim, (int)dim,
                                err)) != 0)
            goto done;
    m.ridge_mean = ridge;
    m.ridge_std = ridge + dim;
    m.ridge_weight = ridge + 2 * dim;
    if ((rc = want_record(&cur, &line_end, end, "ridge_bias", err)) != 0 ||
        (rc = parse_numbers(&cur, "ridge_bias", &m.ridge_bias, 1, err)) != 0)
        goto done;
    double tv[2];
    if ((rc = want_record(&cur, &line_end, end, "trees", err)) != 0 ||
        (rc = parse_numbers(&cur, "trees", tv, 2, err)) != 0)
        goto done;
    if (tv[0] != floor(tv[0]) || tv[0] < 0 || tv[0] > MAX_TREES) {
        rc = util_err_set(err, LLMGW_EINVAL, "%s:%ld: trees: want a count in 0..%d", cur.name,
                          cur.line, MAX_TREES);
        goto done;
    }
    m.n_trees = (int)tv[0];
    m.tree_base = tv[1];
    trees = calloc((size_t)m.n_trees + 1, sizeof *trees);
    if (trees == NULL) {
        rc = util_err_set(err, LLMGW_ENOMEM, "%s: out of memory", cur.name);
        goto done;
    }
    for (int t = 0; t < m.n_trees; t++) {
        enum { W = 2 * ROUTER_TREE_NODES + ROUTER_TREE_LEAVES };
        double v[W];
        if ((rc = want_record(&cur, &line_end, end, "tree", err)) != 0 ||
            (rc = parse_numbers(&cur, "tree", v, W, err)) != 0)
            goto done;
        for (int i = 0; i < ROUTER_TREE_NODES; i++) {
            if (v[i] != floor(v[i]) || v[i] < -1 || v[i] >= ROUTER_STRUCT_FEATURES) {
                rc = util_err_set(err, LLMGW_EINVAL, "%s:%ld: tree: feature %g is not -1..%d",
                                  cur.name, cur.line, v[i], ROUTER_STRUCT_FEATURES - 1);
                goto done;
            }
            trees[t].feature[i] = (int)v[i];
            trees[t].threshold[i] = v[ROUTER_TREE_NODES + i];
        }
        memcpy(trees[t].leaf, v + 2 * ROUTER_TREE_NODES, sizeof trees[t].leaf);
    }
    m.trees = trees;
    double comb[6];
    if ((rc = want_record(&cur, &line_end, end, "combine", err)) != 0 ||
        (rc = parse_numbers(&cur, "combine", comb, 6, err)) != 0)
        goto done;
    for (int j = 0; j < 3; j++) {
        m.combine_mean[j] = comb[2 * j];
        m.combine_std[j] = comb[2 * j + 1];
    }
    if ((rc = want_record(&cur, &line_end, end, "quantiles", err)) != 0 ||
        (rc = parse_numbers(&cur, "quantiles", m.quantiles, ROUTER_QUANTILES, err)) != 0 ||
        (rc = want_record(&cur, &line_end, end, "familiar_min", err)) != 0 ||
        (rc = parse_numbers(&cur, "familiar_min", &m.familiar_min, 1, err)) != 0)
        goto done;
    if (next_line(&cur, &line_end, end)) {
        rc = util_err_set(err, LLMGW_EINVAL, "%s:%ld: unexpected content after familiar_min",
                          cur.name, cur.line);
        goto done;
    }
    util_err sub = {0};
    if ((rc = router_classifier_new(out, &m, &sub)) != 0)
        util_err_set(err, rc, "%s: %s", cur.name, sub.msg);
done:
    knn_data_free(&knn);
    free(ridge);
    free(trees);
    return rc;
}

int router_classifier_load(router_classifier **out, const char *path, util_err *err)
{
    char *buf = NULL;
    size_t n = 0;
    int rc = read_file(path, (size_t)64 << 20, &buf, &n, err);
    if (rc != 0)
        return rc;
    char dir[4096];
    const char *slash = strrchr(path, '/');
    if (slash == NULL)
        snprintf(dir, sizeof dir, ".");
    else
        snprintf(dir, sizeof dir, "%.*s", (int)(slash - path > 0 ? slash - path : 1), path);
    rc = router_classifier_parse(out, buf, n, path, dir, err);
    free(buf);
    return rc;
}

/* ---- the writer ---------------------------------------------------------------------------- */

static void write_record(FILE *f, const char *key, const double *v, int n)
{
    fputs(key, f);
    for (int i = 0; i < n; i++)
        fprintf(f, " %.9g", v[i]);
    fputc('\n', f);
}

static void put_u32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static int save_knn(const router_model *m, const char *path, util_err *err)
{
    FILE *f = fopen(path, "wb");
    if (f == NULL)
        return util_err_set(err, LLMGW_EIO, "%s: %s", path, strerror(errno));
    unsigned char head[20];
    memcpy(head, KNN_MAGIC, 8);
    put_u32(head + 8, KNN_VERSION);
    put_u32(head + 12, (uint32_t)m->dim);
    put_u32(head + 16, (uint32_t)m->n_knn);
    fwrite(head, 1, sizeof head, f);
    for (size_t i = 0; i < m->n_knn; i++) {
        unsigned char r[8];
        uint32_t bits;
        memcpy(&bits, &m->knn_scale[i], 4);
        put_u32(r, bits);
        memcpy(&bits, &m->knn_target[i], 4);
        put_u32(r + 4, bits);
        fwrite(r, 1, 8, f);
        fwrite(m->knn_q + i * (size_t)m->dim, 1, (size_t)m->dim, f);
    }
    bool bad = ferror(f) != 0;
    if (fclose(f) != 0 || bad)
        return util_err_set(err, LLMGW_EIO, "%s: write error", path);
    return 0;
}

int router_classifier_save(const router_classifier *c, const char *path, const char *knn_name,
                           const char *comment, util_err *err)
{
    const router_model *m = &c->m;
    if (m->k > 0) {
        if (knn_name == NULL || strchr(knn_name, '/') != NULL || strchr(knn_name, ' ') != NULL)
            return util_err_set(err, LLMGW_EINVAL, "%s: the kNN file needs a plain file name",
                                path);
        char kpath[4096];
        const char *slash = strrchr(path, '/');
        if (slash == NULL)
            snprintf(kpath, sizeof kpath, "%s", knn_name);
        else
            snprintf(kpath, sizeof kpath, "%.*s/%s", (int)(slash - path), path, knn_name);
        int rc = save_knn(m, kpath, err);
        if (rc != 0)
            return rc;
    }
    FILE *f = fopen(path, "wb");
    if (f == NULL)
        return util_err_set(err, LLMGW_EIO, "%s: %s", path, strerror(errno));
    fprintf(f, "%s version=%d dim=%d features=%d\n", WEIGHTS_MAGIC, WEIGHTS_VERSION, m->dim,
            ROUTER_STRUCT_FEATURES);
    for (const char *s = comment; s != NULL && *s != '\0';) {
        const char *e = strchr(s, '\n');
        int len = e ? (int)(e - s) : (int)strlen(s);
        fprintf(f, "# %.*s\n", len, s);
        s = e ? e + 1 : NULL;
    }
    fprintf(f, "knn %d %s\n", m->k, m->k > 0 ? knn_name : "-");
    write_record(f, "ridge_mean", m->ridge_mean, m->dim);
    write_record(f, "ridge_std", m->ridge_std, m->dim);
    write_record(f, "ridge_weight", m->ridge_weight, m->dim);
    write_record(f, "ridge_bias", &m->ridge_bias, 1);
    fprintf(f, "trees %d %.17g\n", m->n_trees, m->tree_base);
    for (int t = 0; t < m->n_trees; t++) {
        const router_tree *tr = &m->trees[t];
        fputs("tree", f);
        for (int i = 0; i < ROUTER_TREE_NODES; i++)
            fprintf(f, " %d", tr->feature[i]);
        for (int i = 0; i < ROUTER_TREE_NODES; i++)
            fprintf(f, " %.9g", tr->threshold[i]);
        for (int i = 0; i < ROUTER_TREE_LEAVES; i++)
            fprintf(f, " %.9g", tr->leaf[i]);
        fputc('\n', f);
    }
    double comb[6];
    for (int j = 0; j < 3; j++) {
        comb[2 * j] = m->combine_mean[j];
        comb[2 * j + 1] = m->combine_std[j];
    }
    write_record(f, "combine", comb, 6);
    write_record(f, "quantiles", m->quantiles, ROUTER_QUANTILES);
    write_record(f, "familiar_min", &m->familiar_min, 1);
    bool bad = ferror(f) != 0;
    if (fclose(f) != 0 || bad)
        return util_err_set(err, LLMGW_EIO, "%s: write error", path);
    return 0;
}
