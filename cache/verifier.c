/* cache/verifier.c: token-alignment features and the MLP over them (see verifier.h). */
#include "cache/verifier.h"

#include "cache/guard.h"
#include "common/dot.h"

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the token blob ------------------------------------------------------------------------ */

#define TOK_HEADER 4

static void put_u16(uint8_t *p, unsigned v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static unsigned get_u16(const uint8_t *p)
{
    return (unsigned)p[0] | (unsigned)p[1] << 8;
}

static void put_f32(uint8_t *p, float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(u >> (8 * i));
}

static float get_f32(const uint8_t *p)
{
    uint32_t u = 0;
    for (int i = 0; i < 4; i++)
        u |= (uint32_t)p[i] << (8 * i);
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint8_t *cache_tokens_pack(const float *tok, int n, int dim, size_t *len)
{
    if (tok == NULL || n < 1 || dim < 1 || dim > 65535)
        return NULL;
    if (n > 2) {  /* [CLS] ... [SEP] */
        tok += dim;
        n -= 2;
    }
    if (n > 65535)
        return NULL;
    size_t size = TOK_HEADER + (size_t)n * 4 + (size_t)n * (size_t)dim;
    uint8_t *b = malloc(size);
    if (b == NULL)
        return NULL;
    put_u16(b, (unsigned)n);
    put_u16(b + 2, (unsigned)dim);
    int8_t *q = (int8_t *)(b + TOK_HEADER + (size_t)n * 4);
    for (int t = 0; t < n; t++) {
        const float *x = tok + (size_t)t * (size_t)dim;
        float amax = 0;
        for (int i = 0; i < dim; i++)
            amax = fmaxf(amax, fabsf(x[i]));
        float s = amax > 0 && isfinite(amax) ? 127.0f / amax : 0;
        int8_t *qt = q + (size_t)t * (size_t)dim;
        long sq = 0;
        for (int i = 0; i < dim; i++) {
            long v = s > 0 ? lrintf(x[i] * s) : 0;
            v = v > 127 ? 127 : v < -127 ? -127 : v;
            qt[i] = (int8_t)v;
            sq += v * v;
        }
        put_f32(b + TOK_HEADER + (size_t)t * 4, sq > 0 ? (float)(1.0 / sqrt((double)sq)) : 0.0f);
    }
    *len = size;
    return b;
}

int cache_tokens_check(const uint8_t *blob, size_t len, int dim)
{
    if (blob == NULL || len < TOK_HEADER)
        return -1;
    unsigned n = get_u16(blob), d = get_u16(blob + 2);
    if (n < 1 || (int)d != dim || len != TOK_HEADER + (size_t)n * 4 + (size_t)n * d)
        return -1;
    for (unsigned t = 0; t < n; t++) {
        float inv = get_f32(blob + TOK_HEADER + 4 * (size_t)t);
        if (!(inv >= 0 && inv <= 1))  /* 1 / |q| of a nonzero int8 row, or 0: never above 1 */
            return -1;
    }
    return (int)n;
}

/* ---- words ---------------------------------------------------------------------------------- */

#define MAX_WORDS 128
#define WORD_CAP 32

typedef struct words {
    uint64_t h[MAX_WORDS];     /* every word, in text order */
    int n;
    uint64_t content[MAX_WORDS];  /* the content words (not stop words; a plural "s" dropped) */
    int n_content;
} words;

static uint64_t hash_word(const char *w)
{
    uint64_t h = 1469598103934665603ull;
    for (; *w; w++)
        h = (h ^ (unsigned char)*w) * 1099511628211ull;
    return h;
}

static void add_word(words *w, const char *word)
{
    if (w->n == MAX_WORDS || word[0] == '\0')
        return;
    w->h[w->n++] = hash_word(word);
    if (cache_stop_word(word))
        return;
    char stem[WORD_CAP];
    size_t k = strlen(word);
    memcpy(stem, word, k + 1);
    if (k > 3 && stem[k - 1] == 's' && stem[k - 2] != 's')
        stem[k - 1] = '\0';
    w->content[w->n_content++] = hash_word(stem);
}

/* Contractions as the words they stand for, so "what's" meets "what is" and "isn't" meets
 * "is not"; the same without the apostrophe as people type it ("whats", "dont"). */
static const struct {
    const char *word, *a, *b;
} spelled[] = {
    {"whats", "what", "is"}, {"hows", "how", "is"}, {"wheres", "where", "is"},
    {"whos", "who", "is"}, {"thats", "that", "is"}, {"dont", "do", "not"},
    {"doesnt", "does", "not"}, {"didnt", "did", "not"}, {"isnt", "is", "not"},
    {"arent", "are", "not"}, {"cant", "can", "not"}, {"cannot", "can", "not"},
    {"wont", "will", "not"}, {"im", "i", "am"}, {"ive", "i", "have"},
};

static const char *const is_before_s[] = {
    "what", "who", "where", "when", "why", "how", "it", "that", "there", "here", "he", "she",
};

/* One word as typed (lower case, apostrophes kept as '\''): into w as one or two words. */
static void add_typed(words *w, char *t)
{
    char *ap = strchr(t, '\'');
    if (ap != NULL) {
        const char *tail = ap + 1;
        if (ap > t && ap[-1] == 'n' && !strcmp(tail, "t")) {      /* n't */
            ap[-1] = '\0';
            if (!strcmp(t, "ca"))
                add_word(w, "can");
            else if (!strcmp(t, "wo"))
                add_word(w, "will");
            else
                add_word(w, t);
            add_word(w, "not");
            return;
        }
        *ap = '\0';
        add_word(w, t);
        if (!strcmp(tail, "s")) {
            for (size_t i = 0; i < sizeof is_before_s / sizeof is_before_s[0]; i++)
                if (!strcmp(t, is_before_s[i]))
                    add_word(w, "is");
        } else if (!strcmp(tail, "re")) {
            add_word(w, "are");
        } else if (!strcmp(tail, "ll")) {
            add_word(w, "will");
        } else if (!strcmp(tail, "ve")) {
            add_word(w, "have");
        } else if (!strcmp(tail, "d")) {
            add_word(w, "would");
        } else if (!strcmp(tail, "m")) {
            add_word(w, "am");
        } else {
            add_word(w, tail);
        }
        return;
    }
    for (size_t i = 0; i < sizeof spelled / sizeof spelled[0]; i++)
        if (!strcmp(t, spelled[i].word)) {
            add_word(w, spelled[i].a);
            add_word(w, spelled[i].b);
            return;
        }
    add_word(w, t);
}

/* Lower-case ASCII letter/digit runs (an apostrophe, ASCII or U+2019, inside a word is kept so
 * contractions can be spelled out; other bytes separate words), in text order. */
static void split_words(const char *s, size_t len, words *w)
{
    w->n = w->n_content = 0;
    size_t i = 0;
    while (i < len && w->n < MAX_WORDS) {
        char t[WORD_CAP];
        size_t k = 0;
        while (i < len) {
            unsigned char c = (unsigned char)s[i];
            if (c >= 'A' && c <= 'Z')
                c = (unsigned char)(c + 32);
            bool apostrophe = c == '\'' || (c == 0xE2 && i + 2 < len &&
                                             (unsigned char)s[i + 1] == 0x80 &&
                                             (unsigned char)s[i + 2] == 0x99);
            if ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9')) {
                if (k + 1 < WORD_CAP)
                    t[k++] = (char)c;
            } else if (apostrophe && k > 0 && i + 1 < len) {
                if (c == 0xE2)
                    i += 2;
                if (k + 1 < WORD_CAP)
                    t[k++] = '\'';
            } else {
                break;
            }
            i++;
        }
        while (k > 0 && t[k - 1] == '\'')
            k--;
        t[k] = '\0';
        if (k > 0)
            add_typed(w, t);
        else
            i++;
    }
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* |A ∩ B| and |A ∪ B| of two sorted, de-duplicated arrays. */
static void set_counts(const uint64_t *a, int na, const uint64_t *b, int nb, int *inter, int *uni)
{
    int i = 0, j = 0, in = 0;
    while (i < na && j < nb) {
        if (a[i] == b[j]) {
            in++;
            i++;
            j++;
        } else if (a[i] < b[j]) {
            i++;
        } else {
            j++;
        }
    }
    *inter = in;
    *uni = na + nb - in;
}

static int sort_unique(uint64_t *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_u64);
    int m = 0;
    for (int i = 0; i < n; i++)
        if (m == 0 || v[m - 1] != v[i])
            v[m++] = v[i];
    return m;
}

/* Word-set and bigram-set Jaccard, and whether both use the same words in another order. */
static void overlap(const words *a, const words *b, float *jac, float *bjac, float *reordered)
{
    uint64_t sa[MAX_WORDS], sb[MAX_WORDS];
    memcpy(sa, a->h, (size_t)a->n * sizeof *sa);
    memcpy(sb, b->h, (size_t)b->n * sizeof *sb);
    int na = sort_unique(sa, a->n), nb = sort_unique(sb, b->n), in, un;
    set_counts(sa, na, sb, nb, &in, &un);
    *jac = un > 0 ? (float)in / (float)un : 1.0f;
    bool same_set = in == un;
    int ga = 0, gb = 0;
    for (int i = 0; i + 1 < a->n; i++)
        sa[ga++] = a->h[i] * 31 + (a->h[i + 1] ^ 0x9e3779b97f4a7c15ull);
    for (int i = 0; i + 1 < b->n; i++)
        sb[gb++] = b->h[i] * 31 + (b->h[i + 1] ^ 0x9e3779b97f4a7c15ull);
    ga = sort_unique(sa, ga);
    gb = sort_unique(sb, gb);
    set_counts(sa, ga, sb, gb, &in, &un);
    *bjac = un > 0 ? (float)in / (float)un : 1.0f;
    bool same_order = a->n == b->n && memcmp(a->h, b->h, (size_t)a->n * sizeof *a->h) == 0;
    *reordered = same_set && !same_order ? 1.0f : 0.0f;
}

/* Content words: their Jaccard, and the share of each side's that the other lacks. */
static void content_overlap(const words *a, const words *b, float *jac, float *a_only,
                            float *b_only)
{
    uint64_t sa[MAX_WORDS], sb[MAX_WORDS];
    memcpy(sa, a->content, (size_t)a->n_content * sizeof *sa);
    memcpy(sb, b->content, (size_t)b->n_content * sizeof *sb);
    int na = sort_unique(sa, a->n_content), nb = sort_unique(sb, b->n_content), in, un;
    set_counts(sa, na, sb, nb, &in, &un);
    *jac = un > 0 ? (float)in / (float)un : 1.0f;
    *a_only = na > 0 ? (float)(na - in) / (float)na : 0.0f;
    *b_only = nb > 0 ? (float)(nb - in) / (float)nb : 0.0f;
}

/* ---- token alignment ------------------------------------------------------------------------ */

static float mean_of(const float *v, int n)
{
    double s = 0;
    for (int i = 0; i < n; i++)
        s += v[i];
    return n > 0 ? (float)(s / n) : 0;
}

static float min_of(const float *v, int n)
{
    float m = n > 0 ? v[0] : 0;
    for (int i = 1; i < n; i++)
        m = fminf(m, v[i]);
    return m;
}

/* The mean of the two smallest (the weakest matches: a changed word shows here). */
static float low2_of(const float *v, int n)
{
    if (n < 2)
        return min_of(v, n);
    float x = INFINITY, y = INFINITY;
    for (int i = 0; i < n; i++) {
        if (v[i] < x) {
            y = x;
            x = v[i];
        } else if (v[i] < y) {
            y = v[i];
        }
    }
    return (x + y) / 2;
}

static float share_below(const float *v, int n, float t)
{
    int k = 0;
    for (int i = 0; i < n; i++)
        k += v[i] < t;
    return n > 0 ? (float)k / (float)n : 0;
}

#define MAX_TOK 512
#define CONFIDENT 0.6f  /* a match this close counts in the order statistics */

enum {
    F_COS, F_A_MEAN, F_A_MIN, F_B_MEAN, F_B_MIN, F_A_LOW2, F_B_LOW2, F_INVERSIONS, F_POS_GAP,
    F_MUTUAL, F_NEG_MISMATCH, F_NEG_DIFF, F_IDENTIFIER, F_SWAP, F_LEN_RATIO, F_JACCARD,
    F_BIGRAMS, F_JAC_MINUS_BIGRAMS, F_REORDERED, F_A_UNMATCHED, F_B_UNMATCHED, F_LOG_LEN,
    F_CONTENT_JACCARD, F_A_CONTENT_ONLY, F_B_CONTENT_ONLY, F_SAME_WORDS,
};

static const char *const feature_names[CACHE_VERIFIER_FEATURES] = {
    "cosine", "a_best_mean", "a_best_min", "b_best_mean", "b_best_min", "a_best_low2",
    "b_best_low2", "crossed_alignments", "position_gap", "mutual_matches", "negation_mismatch",
    "negation_diff", "identifier_mismatch", "swap", "length_ratio", "word_jaccard",
    "bigram_jaccard", "jaccard_minus_bigrams", "same_words_reordered", "a_unmatched",
    "b_unmatched", "log_min_tokens", "content_jaccard", "a_content_only", "b_content_only",
    "same_words",
};

const char *cache_verifier_feature_name(int i)
{
    return i >= 0 && i < CACHE_VERIFIER_FEATURES ? feature_names[i] : "?";
}

void cache_verifier_text_features(const char *a, size_t a_len, const char *b, size_t b_len,
                                  float *f)
{
    int nga = cache_negation_count(a, a_len), ngb = cache_negation_count(b, b_len);
    f[F_NEG_MISMATCH] = (nga & 1) != (ngb & 1);
    f[F_NEG_DIFF] = (float)abs(nga - ngb);
    unsigned flags = cache_guard_flags(a, a_len, b, b_len);
    f[F_IDENTIFIER] = (flags >> CACHE_GUARD_IDENTIFIER) & 1;
    f[F_SWAP] = (flags >> CACHE_GUARD_SWAP) & 1;
    words *wa = malloc(sizeof *wa), *wb = malloc(sizeof *wb);
    if (wa != NULL && wb != NULL) {
        split_words(a, a_len, wa);
        split_words(b, b_len, wb);
        overlap(wa, wb, &f[F_JACCARD], &f[F_BIGRAMS], &f[F_REORDERED]);
        content_overlap(wa, wb, &f[F_CONTENT_JACCARD], &f[F_A_CONTENT_ONLY],
                        &f[F_B_CONTENT_ONLY]);
        /* the same words in the same order: only case, punctuation or contractions differ */
        f[F_SAME_WORDS] = wa->n == wb->n && wa->n > 0 &&
                          memcmp(wa->h, wb->h, (size_t)wa->n * sizeof *wa->h) == 0;
    } else {
        f[F_JACCARD] = f[F_BIGRAMS] = f[F_REORDERED] = 0;
        f[F_CONTENT_JACCARD] = f[F_A_CONTENT_ONLY] = f[F_B_CONTENT_ONLY] = 0;
        f[F_SAME_WORDS] = 0;
    }
    free(wa);
    free(wb);
    f[F_JAC_MINUS_BIGRAMS] = f[F_JACCARD] - f[F_BIGRAMS];
}

bool cache_verifier_feature_from_text(int i)
{
    switch (i) {
    case F_NEG_MISMATCH: case F_NEG_DIFF: case F_IDENTIFIER: case F_SWAP: case F_JACCARD:
    case F_BIGRAMS: case F_JAC_MINUS_BIGRAMS: case F_REORDERED: case F_CONTENT_JACCARD:
    case F_A_CONTENT_ONLY: case F_B_CONTENT_ONLY: case F_SAME_WORDS:
        return true;
    default:
        return false;
    }
}

int cache_verifier_features(const cache_verifier_side *a, const cache_verifier_side *b, int dim,
                            float *f)
{
    int na = cache_tokens_check(a->tok, a->tok_len, dim);
    int nb = cache_tokens_check(b->tok, b->tok_len, dim);
    if (na < 0 || nb < 0 || a->vec == NULL || b->vec == NULL)
        return LLMGW_EINVAL;
    /* Long texts are compared on their first MAX_TOK tokens (the encoder's limit is lower). */
    int ma = na < MAX_TOK ? na : MAX_TOK, mb = nb < MAX_TOK ? nb : MAX_TOK;
    const int8_t *qa = (const int8_t *)(a->tok + TOK_HEADER + (size_t)na * 4);
    const int8_t *qb = (const int8_t *)(b->tok + TOK_HEADER + (size_t)nb * 4);
    float *best_a = malloc((size_t)(ma + mb) * sizeof *best_a);
    int *arg = malloc((size_t)(ma + mb) * sizeof *arg);
    float *inv_b = malloc((size_t)mb * sizeof *inv_b);
    if (best_a == NULL || arg == NULL || inv_b == NULL) {
        free(best_a);
        free(arg);
        free(inv_b);
        return LLMGW_ENOMEM;
    }
    float *best_b = best_a + ma;
    int *arg_a = arg, *arg_b = arg + ma;
    for (int j = 0; j < mb; j++) {
        inv_b[j] = get_f32(b->tok + TOK_HEADER + 4 * (size_t)j);
        best_b[j] = -2;
        arg_b[j] = 0;
    }
    for (int i = 0; i < ma; i++) {
        float inv_a = get_f32(a->tok + TOK_HEADER + 4 * (size_t)i);
        const int8_t *x = qa + (size_t)i * (size_t)dim;
        best_a[i] = -2;
        arg_a[i] = 0;
        for (int j = 0; j < mb; j++) {
            float s = (float)util_dot_i8(x, qb + (size_t)j * (size_t)dim, dim) * inv_a * inv_b[j];
            s = fminf(1.0f, fmaxf(-1.0f, s));  /* a blob from elsewhere may lie about its norms */
            if (s > best_a[i]) {
                best_a[i] = s;
                arg_a[i] = j;
            }
            if (s > best_b[j]) {
                best_b[j] = s;
                arg_b[j] = i;
            }
        }
    }
    double cos = 0;
    for (int i = 0; i < dim; i++)
        cos += (double)a->vec[i] * b->vec[i];
    f[F_COS] = (float)cos;
    f[F_A_MEAN] = mean_of(best_a, ma);
    f[F_A_MIN] = min_of(best_a, ma);
    f[F_B_MEAN] = mean_of(best_b, mb);
    f[F_B_MIN] = min_of(best_b, mb);
    f[F_A_LOW2] = low2_of(best_a, ma);
    f[F_B_LOW2] = low2_of(best_b, mb);
    /* Word order: among confidently matched tokens of a, how often two of them find their
     * partners in b in the opposite order; and how far partners sit in relative position. */
    long pairs = 0, crossed = 0;
    double gap = 0;
    int mutual = 0;
    for (int i = 0; i < ma; i++) {
        double x = ma > 1 ? (double)i / (ma - 1) : 0, y = mb > 1 ? (double)arg_a[i] / (mb - 1) : 0;
        gap += fabs(x - y);
        mutual += arg_b[arg_a[i]] == i;
        if (best_a[i] <= CONFIDENT)
            continue;
        for (int k = i + 1; k < ma; k++) {
            if (best_a[k] <= CONFIDENT)
                continue;
            pairs++;
            crossed += arg_a[i] > arg_a[k];
        }
    }
    f[F_INVERSIONS] = pairs > 0 ? (float)crossed / (float)pairs : 0;
    f[F_POS_GAP] = ma > 0 ? (float)(gap / ma) : 0;
    f[F_MUTUAL] = ma > 0 ? (float)mutual / (float)ma : 0;
    f[F_LEN_RATIO] = (float)(ma < mb ? ma : mb) / (float)(ma > mb ? ma : mb);
    cache_verifier_text_features(a->text, a->len, b->text, b->len, f);
    f[F_A_UNMATCHED] = share_below(best_a, ma, 0.5f);
    f[F_B_UNMATCHED] = share_below(best_b, mb, 0.5f);
    f[F_LOG_LEN] = logf(1.0f + (float)(ma < mb ? ma : mb));
    free(best_a);
    free(arg);
    free(inv_b);
    return 0;
}

/* ---- the model ------------------------------------------------------------------------------ */

int cache_verifier_new(cache_verifier **out, int hidden, util_err *err)
{
    *out = NULL;
    if (hidden < 1 || hidden > CACHE_VERIFIER_MAX_HIDDEN)
        return util_err_set(err, LLMGW_EINVAL, "verifier: %d hidden units (1-%d)", hidden,
                            CACHE_VERIFIER_MAX_HIDDEN);
    cache_verifier *v = calloc(1, sizeof *v);
    if (v == NULL)
        return util_err_set(err, LLMGW_ENOMEM, "verifier: out of memory");
    v->n_feat = CACHE_VERIFIER_FEATURES;
    v->hidden = hidden;
    v->w1 = calloc((size_t)v->n_feat * (size_t)hidden, sizeof *v->w1);
    v->b1 = calloc((size_t)hidden, sizeof *v->b1);
    v->w2 = calloc((size_t)hidden, sizeof *v->w2);
    if (v->w1 == NULL || v->b1 == NULL || v->w2 == NULL) {
        cache_verifier_free(v);
        return util_err_set(err, LLMGW_ENOMEM, "verifier: out of memory");
    }
    for (int i = 0; i < v->n_feat; i++)
        v->std[i] = 1;
    *out = v;
    return 0;
}

void cache_verifier_free(cache_verifier *v)
{
    if (v == NULL)
        return;
    free(v->w1);
    free(v->b1);
    free(v->w2);
    free(v->comment);
    free(v);
}

double cache_verifier_prob(const cache_verifier *v, const float *features)
{
    float z[CACHE_VERIFIER_FEATURES];
    for (int i = 0; i < v->n_feat; i++)
        z[i] = (features[i] - v->mean[i]) / v->std[i];
    double out = v->b2;
    for (int h = 0; h < v->hidden; h++) {
        double s = v->b1[h];
        for (int i = 0; i < v->n_feat; i++)
            s += (double)z[i] * v->w1[(size_t)i * (size_t)v->hidden + (size_t)h];
        out += tanh(s) * v->w2[h];
    }
    return 1.0 / (1.0 + exp(-out));
}

double cache_verifier_threshold(const cache_verifier *v, double max_false_hit_rate,
                                double *used_rate)
{
    int pick = 0;
    for (int i = 0; i < v->n_points; i++)
        if (v->points[i].false_hit_rate <= max_false_hit_rate * (1 + 1e-6))  /* read as float */
            pick = i;
    if (v->n_points == 0) {
        if (used_rate != NULL)
            *used_rate = 0;
        return 1.0;
    }
    if (used_rate != NULL)
        *used_rate = v->points[pick].false_hit_rate;
    return v->points[pick].threshold;
}

/* ---- the file ------------------------------------------------------------------------------- */

static void write_row(FILE *f, const char *name, const float *x, size_t n)
{
    fputs(name, f);
    for (size_t i = 0; i < n; i++)
        fprintf(f, " %.9g", (double)x[i]);
    fputc('\n', f);
}

int cache_verifier_save(const cache_verifier *v, const char *path, const char *comment,
                        util_err *err)
{
    FILE *f = fopen(path, "w");
    if (f == NULL)
        return util_err_set(err, LLMGW_EIO, "%s: %s", path, strerror(errno));
    fprintf(f, "llmgw-cache-verifier version=1 features=%d hidden=%d\n", v->n_feat, v->hidden);
    if (comment != NULL)
        fputs(comment, f);
    fputs("features", f);
    for (int i = 0; i < v->n_feat; i++)
        fprintf(f, " %s", feature_names[i]);
    fputc('\n', f);
    write_row(f, "mean", v->mean, (size_t)v->n_feat);
    write_row(f, "std", v->std, (size_t)v->n_feat);
    write_row(f, "w1", v->w1, (size_t)v->n_feat * (size_t)v->hidden);
    write_row(f, "b1", v->b1, (size_t)v->hidden);
    write_row(f, "w2", v->w2, (size_t)v->hidden);
    write_row(f, "b2", &v->b2, 1);
    for (int i = 0; i < v->n_points; i++)
        fprintf(f, "point %.6g %.9g\n", v->points[i].false_hit_rate, v->points[i].threshold);
    if (ferror(f) | (fclose(f) != 0))
        return util_err_set(err, LLMGW_EIO, "%s: write error", path);
    return 0;
}

/* Reads exactly n finite numbers after the row's name. */
static bool read_row(char *rest, float *x, size_t n)
{
    char *p = rest;
    for (size_t i = 0; i < n; i++) {
        char *end;
        errno = 0;
        double d = strtod(p, &end);
        if (end == p || errno != 0 || !isfinite(d) || fabs(d) > 1e30)
            return false;
        x[i] = (float)d;
        p = end;
    }
    while (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n')
        p++;
    return *p == '\0';
}

int cache_verifier_load(cache_verifier **out, const char *path, util_err *err)
{
    *out = NULL;
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return util_err_set(err, LLMGW_EIO, "verifier weights %s: %s", path, strerror(errno));
    char line[65536];
    int n_feat = 0, hidden = 0, version = 0;
    if (fgets(line, sizeof line, f) == NULL ||
        sscanf(line, "llmgw-cache-verifier version=%d features=%d hidden=%d", &version, &n_feat,
               &hidden) != 3 ||
        version != 1) {
        fclose(f);
        return util_err_set(err, LLMGW_EINVAL,
                            "%s:1: not a verifier weights file (want \"llmgw-cache-verifier "
                            "version=1 features=N hidden=H\")", path);
    }
    if (n_feat != CACHE_VERIFIER_FEATURES) {
        fclose(f);
        return util_err_set(err, LLMGW_EINVAL,
                            "%s:1: made for %d features, this build computes %d: retrain it with "
                            "llmgw-cache-train", path, n_feat, CACHE_VERIFIER_FEATURES);
    }
    if (hidden < 1 || hidden > CACHE_VERIFIER_MAX_HIDDEN) {
        fclose(f);
        return util_err_set(err, LLMGW_EINVAL, "%s:1: %d hidden units (1-%d)", path, hidden,
                            CACHE_VERIFIER_MAX_HIDDEN);
    }
    cache_verifier *v;
    int rc = cache_verifier_new(&v, hidden, err);
    if (rc != 0) {
        fclose(f);
        return util_err_set(err, rc, "%s: out of memory", path);
    }
    unsigned seen = 0;
    size_t comment_len = 0;
    int lineno = 1;
    char *bad = NULL;
    while (fgets(line, sizeof line, f) != NULL) {
        lineno++;
        if (strchr(line, '\n') == NULL && !feof(f)) {
            bad = "line too long";
            break;
        }
        if (line[0] == '#') {
            size_t k = strlen(line);
            char *c = realloc(v->comment, comment_len + k + 1);
            if (c == NULL) {
                bad = "out of memory";
                break;
            }
            memcpy(c + comment_len, line, k + 1);
            v->comment = c;
            comment_len += k;
            continue;
        }
        char *sp = strchr(line, ' ');
        if (sp == NULL) {
            if (line[0] == '\n' || line[0] == '\r')
                continue;
            bad = "a row without values";
            break;
        }
        *sp = '\0';
        char *rest = sp + 1;
        size_t nf = (size_t)v->n_feat, nh = (size_t)v->hidden;
        bool ok = true;
        if (!strcmp(line, "features")) {
            for (int i = 0; i < v->n_feat && ok; i++) {
                size_t k = strlen(feature_names[i]);
                while (*rest == ' ')
                    rest++;
                ok = !strncmp(rest, feature_names[i], k) &&
                     (rest[k] == ' ' || rest[k] == '\n' || rest[k] == '\r' || rest[k] == '\0');
                rest += k;
            }
            if (!ok) {
                bad = "its features are not the ones this build computes (retrain it)";
                break;
            }
            seen |= 1;
        } else if (!strcmp(line, "mean")) {
            ok = read_row(rest, v->mean, nf), seen |= 2;
        } else if (!strcmp(line, "std")) {
            ok = read_row(rest, v->std, nf), seen |= 4;
            for (size_t i = 0; ok && i < nf; i++)
                ok = v->std[i] > 0;
        } else if (!strcmp(line, "w1")) {
            ok = read_row(rest, v->w1, nf * nh), seen |= 8;
        } else if (!strcmp(line, "b1")) {
            ok = read_row(rest, v->b1, nh), seen |= 16;
        } else if (!strcmp(line, "w2")) {
            ok = read_row(rest, v->w2, nh), seen |= 32;
        } else if (!strcmp(line, "b2")) {
            ok = read_row(rest, &v->b2, 1), seen |= 64;
        } else if (!strcmp(line, "point")) {
            float p[2];
            ok = v->n_points < CACHE_VERIFIER_MAX_POINTS && read_row(rest, p, 2) && p[0] > 0 &&
                 p[0] < 1 && p[1] >= 0 && p[1] <= 1 &&
                 (v->n_points == 0 || p[0] > v->points[v->n_points - 1].false_hit_rate);
            if (ok) {
                v->points[v->n_points].false_hit_rate = p[0];
                v->points[v->n_points].threshold = p[1];
                v->n_points++;
            }
        } else {
            bad = "an unknown row";
            break;
        }
        if (!ok) {
            bad = "a row with the wrong count of numbers, a number out of range, or operating "
                  "points out of order";
            break;
        }
    }
    fclose(f);
    if (bad == NULL && (seen != 127 || v->n_points == 0)) {
        bad = "rows missing (features, mean, std, w1, b1, w2, b2 and at least one point)";
        lineno = 0;
    }
    if (bad != NULL) {
        cache_verifier_free(v);
        if (lineno > 0)
            return util_err_set(err, LLMGW_EINVAL, "%s:%d: %s", path, lineno, bad);
        return util_err_set(err, LLMGW_EINVAL, "%s: %s", path, bad);
    }
    *out = v;
    return 0;
}
