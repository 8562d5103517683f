/* cache/verifier.h: the semantic cache's verifier — the probability that a query and a stored
 * question ask the same thing, from what the encoder computed for both in its forward pass.
 *
 * A pooled cosine cannot tell "A flew to B" from "B flew to A". The verifier compares the two
 * questions token by token instead: each question keeps its contextual token vectors (the
 * encoder's last layer, [CLS] and [SEP] dropped) in a compact form (cache_tokens_pack: int8 per
 * component, one scale per token; about dim + 4 bytes per token), and a pair is described by
 * CACHE_VERIFIER_FEATURES numbers — the pooled cosine, how well every token of each side finds a
 * partner on the other, whether the partners come in the same order (who does what to whom),
 * mutual partners, negation, numbers and the guard's other signals (cache/guard.h) as features
 * rather than vetoes, length, word and content-word overlap (contractions spelled out: "what's" is
 * "what is") — fed to a small MLP (one tanh hidden layer,
 * logistic output) trained by tools/llmgw-cache-train on labelled pairs.
 *
 * The weights file also holds a table of operating points: for each false-hit rate the
 * calibration split was checked at, the lowest probability whose false hits stay within it on
 * every calibration set. cache_verifier_threshold picks the point for the operator's budget
 * (cache.max_false_hit_rate).
 *
 * Pure functions over immutable data: a loaded verifier may be shared by threads. */
#ifndef LLMGW_CACHE_VERIFIER_H
#define LLMGW_CACHE_VERIFIER_H

#include "common/err.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- the compact token vectors kept with a stored question -------------------------------- */

/* Packs n token rows of dim floats (the encoder's contextual vectors, [CLS] first and [SEP] last
 * when n > 2: both are dropped) into a malloc'd blob: u16 n, u16 dim, n f32 inverse norms, then
 * n * dim int8 components, all little-endian. *len receives its size. NULL when n < 1 or
 * dim < 1, or dim or n exceeds 65535. */
uint8_t *cache_tokens_pack(const float *tok, int n, int dim, size_t *len);

/* Checks a blob's framing (a blob from another replica is input): sizes, and inverse norms in
 * [0, 1]. Returns its token count, or -1 when it is malformed or its width is not dim. */
int cache_tokens_check(const uint8_t *blob, size_t len, int dim);

/* ---- features ------------------------------------------------------------------------------ */

#define CACHE_VERIFIER_FEATURES 26

/* One side of a pair: its text, its L2-normalised pooled vector and its token blob (checked). */
typedef struct cache_verifier_side {
    const char *text;
    size_t len;
    const float *vec;
    const uint8_t *tok;
    size_t tok_len;
} cache_verifier_side;

/* The pair's features into f[CACHE_VERIFIER_FEATURES]. Returns 0, or LLMGW_EINVAL when a token
 * blob is malformed or the widths differ. */
int cache_verifier_features(const cache_verifier_side *a, const cache_verifier_side *b, int dim,
                            float *f);
const char *cache_verifier_feature_name(int i);
/* Only the features read from the texts (negation, numbers, swaps, word and content-word
 * overlap), into their places in f: cache_verifier_features calls it; the trainer recomputes
 * them on cached features so a change to them needs no encoder. */
void cache_verifier_text_features(const char *a, size_t a_len, const char *b, size_t b_len,
                                  float *f);
/* True for feature i when cache_verifier_text_features computes it (the rest need the encoder). */
bool cache_verifier_feature_from_text(int i);

/* ---- the model ----------------------------------------------------------------------------- */

#define CACHE_VERIFIER_MAX_HIDDEN 256
#define CACHE_VERIFIER_MAX_POINTS 32

typedef struct cache_verifier_point {
    double false_hit_rate;  /* the budget this point was calibrated for */
    double threshold;       /* the lowest probability served */
} cache_verifier_point;

typedef struct cache_verifier {
    int n_feat;             /* CACHE_VERIFIER_FEATURES */
    int hidden;             /* tanh units */
    float mean[CACHE_VERIFIER_FEATURES], std[CACHE_VERIFIER_FEATURES];  /* standardisation */
    float *w1;              /* [n_feat * hidden], row-major by feature */
    float *b1;              /* [hidden] */
    float *w2;              /* [hidden] */
    float b2;
    int n_points;           /* ascending false_hit_rate */
    cache_verifier_point points[CACHE_VERIFIER_MAX_POINTS];
    char *comment;          /* the trainer's "# ..." lines, as read (may be NULL) */
} cache_verifier;

/* An untrained model with `hidden` units (weights zeroed), for the trainer. */
int  cache_verifier_new(cache_verifier **out, int hidden, util_err *err);
void cache_verifier_free(cache_verifier *v);  /* NULL is a no-op */

/* The text file tools/llmgw-cache-train writes (first line "llmgw-cache-verifier version=1
 * features=26 hidden=H"); every number is checked on load. */
int  cache_verifier_load(cache_verifier **out, const char *path, util_err *err);
int  cache_verifier_save(const cache_verifier *v, const char *path, const char *comment,
                         util_err *err);

/* The probability that the pair asks the same thing. */
double cache_verifier_prob(const cache_verifier *v, const float *features);

/* The threshold for a false-hit budget: the point with the largest rate not above it (the
 * strictest point when the budget is below every point: *used_rate says which was taken). */
double cache_verifier_threshold(const cache_verifier *v, double max_false_hit_rate,
                                double *used_rate);

#endif
