/* router/classifier.c: the complexity classifier — lexical features of a prompt, the weights
 * file (parser, writer) and scoring, P(strong tier needed) = sigmoid(b + w · standardise(x)) over
 * x = [embedding (dim) ; lexical features (ROUTER_LEX_FEATURES)].
 *
 * The weights file is text, one record per line, written by llmgw-train-router:
 *
 *   llmgw-router version=1 kind=lr dim=384 lex=8
 *   # comments and blank lines are skipped
 *   mean <dim+lex numbers>      the training rows' feature means
 *   std <dim+lex numbers>       their standard deviations (> 0)
 *   weight <dim+lex numbers>    the weights of the standardised features
 *   bias <1 number>
 *
 * in this order, each record once. Numbers are finite decimals (strtod syntax, at most 63
 * characters). Any deviation is an error naming the file and the line. */
#include "router/classifier.h"

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define WEIGHTS_MAGIC "llmgw-router"
#define WEIGHTS_VERSION 1
#define MAX_DIM 8192

struct router_classifier {
    int dim;         /* embedding width */
    int n;           /* dim + ROUTER_LEX_FEATURES */
    double *mean;    /* [n] as read */
    double *std;     /* [n] as read */
    double *weight;  /* [n] as read */
    double bias;
    double *scaled;  /* [n] weight / std: scoring folds the standardisation in */
    double offset;   /* bias - sum(weight * mean / std) */
};

/* ---- lexical features --------------------------------------------------------------------- */

static bool has_at(const char *s, size_t len, size_t i, const char *lit)
{
    size_t n = strlen(lit);
    return i + n <= len && memcmp(s + i, lit, n) == 0;
}

/* Markers counted as math: '=' '^' '+' '*' '/' '<' '>' and these words and UTF-8 symbols. */
static const char *const math_words[] = {
    "\\frac", "sqrt", "\\int", "\\sum", "\xe2\x88\xab" /* ∫ */, "\xe2\x88\x91" /* ∑ */,
    "\xe2\x88\x9a" /* √ */, "\xcf\x80" /* π */, "\xe2\x89\xa4" /* ≤ */, "\xe2\x89\xa5" /* ≥ */};
/* Markers counted as code: '{' '}' ';' and these. */
static const char *const code_words[] = {"```", "def ", "return", "#include", "print(", "==",
                                         "->", "++", "int ", "void "};

/* The features, in this order (each a plain number; the weights file standardises them):
 *   0 log(1 + bytes)        1 log(1 + words: runs of non-space bytes)
 *   2 log(1 + '?' count)    3 digits / non-space bytes
 *   4 log(1 + math markers) 5 log(1 + code markers)
 *   6 log(1 + lines)        7 upper-case / ASCII letters
 * A NULL or empty text gives all zeros but for the logs of zero counts (also 0). */
void router_lexical_features(const char *text, size_t len, float out[ROUTER_LEX_FEATURES])
{
    size_t words = 0, questions = 0, digits = 0, visible = 0, math = 0, code = 0, lines = 0;
    size_t upper = 0, letters = 0;
    bool in_word = false;
    if (text == NULL)
        len = 0;
    if (len > 0)
        lines = 1;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)text[i];
        bool space = c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
        if (!space && !in_word)
            words++;
        in_word = !space;
        visible += !space;
        questions += c == '?';
        digits += c >= '0' && c <= '9';
        lines += c == '\n' && i + 1 < len;
        if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z')) {
            letters++;
            upper += c <= 'Z';
        }
        if (c == '=' || c == '^' || c == '+' || c == '*' || c == '/' || c == '<' || c == '>')
            math++;
        if (c == '{' || c == '}' || c == ';')
            code++;
        for (size_t k = 0; k < sizeof math_words / sizeof *math_words; k++)
            math += has_at(text, len, i, math_words[k]);
        for (size_t k = 0; k < sizeof code_words / sizeof *code_words; k++)
            code += has_at(text, len, i, code_words[k]);
    }
    out[0] = (float)log1p((double)len);
    out[1] = (float)log1p((double)words);
    out[2] = (float)log1p((double)questions);
    out[3] = visible ? (float)((double)digits / (double)visible) : 0.0f;
    out[4] = (float)log1p((double)math);
    out[5] = (float)log1p((double)code);
    out[6] = (float)log1p((double)lines);
    out[7] = letters ? (float)((double)upper / (double)letters) : 0.0f;
}

/* ---- construction ----------------------------------------------------------------------- */

void router_classifier_free(router_classifier *c)
{
    if (c == NULL)
        return;
    free(c->mean);
    free(c->std);
    free(c->weight);
    free(c->scaled);
    free(c);
}

static router_classifier *alloc_classifier(int dim)
{
    router_classifier *c = calloc(1, sizeof *c);
    if (c == NULL)
        return NULL;
    c->dim = dim;
    c->n = dim + ROUTER_LEX_FEATURES;
    size_t bytes = (size_t)c->n * sizeof(double);
    c->mean = malloc(bytes);
    c->std = malloc(bytes);
    c->weight = malloc(bytes);
    c->scaled = malloc(bytes);
    if (c->mean == NULL || c->std == NULL || c->weight == NULL || c->scaled == NULL) {
        router_classifier_free(c);
        return NULL;
    }
    return c;
}

/* Folds the standardisation into scaled/offset. Fails (-1) when they grow so large that a score
 * could overflow: |offset| + sum |scaled| must stay below 1e300, so z stays finite for the
 * L2-normalised embeddings and the lexical features (each below 50). */
static int fold(router_classifier *c)
{
    double offset = c->bias, total = 0;
    for (int i = 0; i < c->n; i++) {
        c->scaled[i] = c->weight[i] / c->std[i];
        offset -= c->scaled[i] * c->mean[i];
        total += fabs(c->scaled[i]);
    }
    c->offset = offset;
    total += fabs(offset);
    return isfinite(total) && total < 1e300 ? 0 : -1;
}

int router_classifier_new_lr(router_classifier **out, int dim, const double *mean,
                             const double *std, const double *weight, double bias, util_err *err)
{
    if (dim < 1 || dim > MAX_DIM)
        return util_err_set(err, LLMGW_EINVAL, "classifier: dim %d is outside 1..%d", dim,
                            MAX_DIM);
    int n = dim + ROUTER_LEX_FEATURES;
    if (!isfinite(bias))
        return util_err_set(err, LLMGW_EINVAL, "classifier: the bias is not finite");
    for (int i = 0; i < n; i++) {
        if (!isfinite(mean[i]) || !isfinite(weight[i]) || !isfinite(std[i]))
            return util_err_set(err, LLMGW_EINVAL, "classifier: parameter %d is not finite", i);
        if (!(std[i] > 0))
            return util_err_set(err, LLMGW_EINVAL, "classifier: std %d is not positive", i);
    }
    router_classifier *c = alloc_classifier(dim);
    if (c == NULL)
        return util_err_set(err, LLMGW_ENOMEM, "classifier: out of memory");
    memcpy(c->mean, mean, (size_t)n * sizeof *mean);
    memcpy(c->std, std, (size_t)n * sizeof *std);
    memcpy(c->weight, weight, (size_t)n * sizeof *weight);
    c->bias = bias;
    if (fold(c) != 0) {
        router_classifier_free(c);
        return util_err_set(err, LLMGW_EINVAL, "classifier: weight / std overflows");
    }
    *out = c;
    return 0;
}

int router_classifier_dim(const router_classifier *c)
{
    return c->dim;
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
    long version = 0, lex = 0;
    if (!next_token(cur, &tok, &len) || !token_is(tok, len, WEIGHTS_MAGIC))
        return util_err_set(err, LLMGW_EINVAL,
                            "%s:%ld: not a router weights file (want the magic \"%s\")",
                            cur->name, cur->line, WEIGHTS_MAGIC);
    if (!next_token(cur, &tok, &len) || !parse_key_int(tok, len, "version", 0, 1000000, &version))
        return util_err_set(err, LLMGW_EINVAL, "%s:%ld: want version=<n> after the magic",
                            cur->name, cur->line);
    if (version != WEIGHTS_VERSION)
        return util_err_set(err, LLMGW_EINVAL, "%s:%ld: version %ld, this build reads %d",
                            cur->name, cur->line, version, WEIGHTS_VERSION);
    if (!next_token(cur, &tok, &len) || len < 5 || memcmp(tok, "kind=", 5) != 0)
        return util_err_set(err, LLMGW_EINVAL, "%s:%ld: want kind=<model> after the version",
                            cur->name, cur->line);
    if (!token_is(tok, len, "kind=lr"))
        return util_err_set(err, LLMGW_EINVAL,
                            "%s:%ld: kind \"%.*s\" is unknown (this build reads kind=lr)",
                            cur->name, cur->line, (int)(len - 5 > 32 ? 32 : len - 5), tok + 5);
    if (!next_token(cur, &tok, &len) || !parse_key_int(tok, len, "dim", 1, MAX_DIM, dim))
        return util_err_set(err, LLMGW_EINVAL, "%s:%ld: want dim=<1..%d> after the kind",
                            cur->name, cur->line, MAX_DIM);
    if (!next_token(cur, &tok, &len) || !parse_key_int(tok, len, "lex", 0, 1000000, &lex))
        return util_err_set(err, LLMGW_EINVAL, "%s:%ld: want lex=<n> after the dim", cur->name,
                            cur->line);
    if (lex != ROUTER_LEX_FEATURES)
        return util_err_set(err, LLMGW_EINVAL,
                            "%s:%ld: lex=%ld lexical features, this build computes %d",
                            cur->name, cur->line, lex, ROUTER_LEX_FEATURES);
    if (next_token(cur, &tok, &len))
        return util_err_set(err, LLMGW_EINVAL, "%s:%ld: unexpected \"%.*s\" in the header",
                            cur->name, cur->line, (int)(len > 32 ? 32 : len), tok);
    return 0;
}

/* A record line "<key> v1 ... vn" into out[n]. */
static int parse_record(cursor *cur, const char *key, double *out, int n, util_err *err)
{
    const char *tok;
    size_t len;
    if (!next_token(cur, &tok, &len) || !token_is(tok, len, key))
        return util_err_set(err, LLMGW_EINVAL, "%s:%ld: want the \"%s\" record here", cur->name,
                            cur->line, key);
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

int router_classifier_parse(router_classifier **out, const char *buf, size_t len,
                            const char *name, util_err *err)
{
    cursor cur = {.name = name ? name : "(weights)"};
    const char *line_end = buf, *end = buf + len;
    router_classifier *c = NULL;
    long dim = 0;
    int rc;
    if (len > 0 && memchr(buf, '\0', len) != NULL)
        return util_err_set(err, LLMGW_EINVAL, "%s: a NUL byte in a text file", cur.name);
    if (!next_line(&cur, &line_end, end))
        return util_err_set(err, LLMGW_EINVAL, "%s: empty, want a router weights file",
                            cur.name);
    if ((rc = parse_header(&cur, &dim, err)) != 0)
        return rc;
    if ((c = alloc_classifier((int)dim)) == NULL)
        return util_err_set(err, LLMGW_ENOMEM, "%s: out of memory", cur.name);
    static const char *const keys[] = {"mean", "std", "weight", "bias"};
    double *dest[] = {c->mean, c->std, c->weight, &c->bias};
    for (int r = 0; r < 4; r++) {
        if (!next_line(&cur, &line_end, end)) {
            rc = util_err_set(err, LLMGW_EINVAL, "%s:%ld: truncated: the \"%s\" record is missing",
                              cur.name, cur.line, keys[r]);
            goto fail;
        }
        if ((rc = parse_record(&cur, keys[r], dest[r], r == 3 ? 1 : c->n, err)) != 0)
            goto fail;
    }
    for (int i = 0; i < c->n; i++) {
        if (!(c->std[i] > 0)) {
            rc = util_err_set(err, LLMGW_EINVAL, "%s: std value %d is %g, want > 0", cur.name,
                              i + 1, c->std[i]);
            goto fail;
        }
    }
    if (next_line(&cur, &line_end, end)) {
        rc = util_err_set(err, LLMGW_EINVAL, "%s:%ld: unexpected content after the bias",
                          cur.name, cur.line);
        goto fail;
    }
    if (fold(c) != 0) {
        rc = util_err_set(err, LLMGW_EINVAL, "%s: weight / std overflows (too large to score)",
                          cur.name);
        goto fail;
    }
    *out = c;
    return 0;
fail:
    router_classifier_free(c);
    return rc;
}

int router_classifier_load(router_classifier **out, const char *path, util_err *err)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return util_err_set(err, LLMGW_EIO, "%s: %s", path, strerror(errno));
    char *buf = NULL;
    size_t n = 0, cap = 0, got;
    int rc = 0;
    do {
        if (n + 65536 > cap) {
            if (cap > (64u << 20)) {
                rc = util_err_set(err, LLMGW_ERANGE, "%s: larger than 64 MiB", path);
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
    if (ferror(f)) {
        rc = util_err_set(err, LLMGW_EIO, "%s: read error", path);
        goto out;
    }
    rc = router_classifier_parse(out, buf, n, path, err);
out:
    free(buf);
    fclose(f);
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

int router_classifier_save(const router_classifier *c, const char *path, const char *comment,
                           util_err *err)
{
    FILE *f = fopen(path, "wb");
    if (f == NULL)
        return util_err_set(err, LLMGW_EIO, "%s: %s", path, strerror(errno));
    fprintf(f, "%s version=%d kind=lr dim=%d lex=%d\n", WEIGHTS_MAGIC, WEIGHTS_VERSION, c->dim,
            ROUTER_LEX_FEATURES);
    for (const char *s = comment; s != NULL && *s != '\0';) {
        const char *e = strchr(s, '\n');
        int len = e ? (int)(e - s) : (int)strlen(s);
        fprintf(f, "# %.*s\n", len, s);
        s = e ? e + 1 : NULL;
    }
    write_record(f, "mean", c->mean, c->n);
    write_record(f, "std", c->std, c->n);
    write_record(f, "weight", c->weight, c->n);
    write_record(f, "bias", &c->bias, 1);
    bool bad = ferror(f) != 0;
    if (fclose(f) != 0 || bad)
        return util_err_set(err, LLMGW_EIO, "%s: write error", path);
    return 0;
}

/* ---- scoring ------------------------------------------------------------------------------- */

/* A NULL emb scores as if every embedding component sat at its training mean (the lexical
 * features alone then decide). */
double router_classifier_score(const router_classifier *c, const float *emb, const char *text,
                               size_t len)
{
    float lex[ROUTER_LEX_FEATURES];
    router_lexical_features(text, len, lex);
    double z = c->offset;
    if (emb != NULL) {
        for (int i = 0; i < c->dim; i++)
            z += c->scaled[i] * emb[i];
    } else {
        for (int i = 0; i < c->dim; i++)
            z += c->scaled[i] * c->mean[i];
    }
    for (int i = 0; i < ROUTER_LEX_FEATURES; i++)
        z += c->scaled[c->dim + i] * lex[i];
    return 1.0 / (1.0 + exp(-z));
}
