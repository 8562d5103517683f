/* router/classifier.h: the complexity classifier. It judges how much a request would gain from
 * the strong tier, from the request's MiniLM sentence embedding (the one the cache computed:
 * never encode twice) and structural features of the prompt, and how familiar the prompt is.
 *
 * The model is an ensemble of three regressors of the gain (strong model right minus weak model
 * right, in -1..1) — chosen by grouped cross-validation over whole subjects
 * (tests/golden/router/README.md), where each of them added to the others:
 *   - kNN: the mean gain of the k most similar training prompts (cosine over int8 embeddings);
 *   - ridge regression on the standardised embedding;
 *   - gradient-boosted regression trees (depth ROUTER_TREE_DEPTH) on the structural features;
 * each standardised by the mean and spread of its predictions on the training prompts, summed,
 * and mapped to a percentile of the training prompts' summed scores: the score is in [0, 1],
 * and a threshold T sends roughly the hardest 1 - T of training-like traffic to the strong tier.
 * Familiarity is the mean similarity of the k nearest training prompts; below the weights'
 * familiar_min the prompt is unlike anything the classifier was trained on.
 *
 * Weights are a text file beside the policy, written by llmgw-train-router, plus a binary file
 * of the kNN's training vectors that it names. A loaded classifier is immutable: scoring is
 * thread-safe. */
#ifndef LLMGW_ROUTER_CLASSIFIER_H
#define LLMGW_ROUTER_CLASSIFIER_H

#include "common/err.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Structural features, in this order in router_struct_features' output (see classifier.c). */
#define ROUTER_STRUCT_FEATURES 24
#define ROUTER_TREE_DEPTH 3
#define ROUTER_TREE_NODES ((1 << ROUTER_TREE_DEPTH) - 1)  /* split nodes, heap order */
#define ROUTER_TREE_LEAVES (1 << ROUTER_TREE_DEPTH)
#define ROUTER_QUANTILES 101
#define ROUTER_MAX_K 256

typedef struct router_classifier router_classifier;

/* One regression tree: node i splits on feature[i] (x < threshold[i]: child 2i+1, else 2i+2);
 * a node with feature -1 sends everything left. Leaves hold the learning-rate-scaled values. */
typedef struct router_tree {
    int feature[ROUTER_TREE_NODES];
    double threshold[ROUTER_TREE_NODES];
    double leaf[ROUTER_TREE_LEAVES];
} router_tree;

/* Everything a classifier is made of (what llmgw-train-router fits). Arrays are borrowed by
 * router_classifier_new, which copies them. */
typedef struct router_model {
    int dim;                    /* embedding width (384 for all-MiniLM-L6-v2) */
    /* kNN: n_knn training vectors, int8 with a scale each (q * scale has unit length) */
    int k;                      /* 0 = no kNN part (and no familiarity) */
    size_t n_knn;
    const int8_t *knn_q;        /* [n_knn][dim] */
    const float *knn_scale;     /* [n_knn] */
    const float *knn_target;    /* [n_knn] the gain */
    /* ridge regression on the standardised embedding */
    const double *ridge_mean, *ridge_std, *ridge_weight;  /* [dim] */
    double ridge_bias;
    /* boosted trees on the structural features */
    int n_trees;
    double tree_base;
    const router_tree *trees;
    /* combination: part j contributes (pred_j - combine_mean[j]) / combine_std[j] */
    double combine_mean[3], combine_std[3];
    double quantiles[ROUTER_QUANTILES];  /* the summed score's percentiles 0..100, ascending */
    double familiar_min;        /* familiarity below this is unfamiliar */
} router_model;

/* What scoring one prompt finds. */
typedef struct router_assessment {
    double score;        /* the difficulty percentile, [0, 1] */
    double familiarity;  /* mean cosine of the k nearest training prompts; -1 without kNN */
    bool familiar;       /* familiarity >= familiar_min (true when there is no kNN part) */
    double part[3];      /* the raw predictions: kNN, ridge, trees */
} router_assessment;

/* Structural features of a prompt (shared by training and serving): lengths, answer-option
 * structure, numbers and operators, negations, reasoning cues... Empty or NULL text: zeros. */
void router_struct_features(const char *text, size_t len, float out[ROUTER_STRUCT_FEATURES]);

/* Validates and copies m. EINVAL naming the problem. */
int  router_classifier_new(router_classifier **out, const router_model *m, util_err *err);
void router_classifier_free(router_classifier *c);  /* NULL is a no-op */
int  router_classifier_dim(const router_classifier *c);
/* The model as loaded (arrays owned by c). */
const router_model *router_classifier_model(const router_classifier *c);

/* Reads a weights file; its kNN vectors file resolves against the weights file's directory.
 * A bad file is an error naming it, the line and the problem. */
int  router_classifier_load(router_classifier **out, const char *path, util_err *err);
/* Parses a weights file's bytes (len of them, no NUL needed); name labels the errors
 * ("name:line: ..."); dir resolves the kNN file (NULL: a weights file that names one is an
 * error; "knn 0 -" names none). */
int  router_classifier_parse(router_classifier **out, const char *buf, size_t len,
                             const char *name, const char *dir, util_err *err);
/* Writes c as path (text) and, when it has a kNN part, knn_name (binary) in path's directory.
 * comment (may be NULL) goes in as '#' lines under the header. */
int  router_classifier_save(const router_classifier *c, const char *path, const char *knn_name,
                            const char *comment, util_err *err);

/* Scores one prompt. emb: dim floats, L2-normalised, or NULL (then the kNN and ridge parts sit
 * at their training means and the prompt counts as unfamiliar). */
void router_classifier_assess(const router_classifier *c, const float *emb, const char *text,
                              size_t len, router_assessment *out);
double router_classifier_score(const router_classifier *c, const float *emb, const char *text,
                               size_t len);

/* The kNN part alone, for training: the mean target and mean similarity of the k most similar
 * of n int8 vectors (skip: an index to leave out, or -1). */
void router_knn_query(const int8_t *q, const float *scale, const float *target, size_t n, int dim,
                      int k, const float *emb, long skip, double *pred, double *familiarity);
/* The trees part alone. */
double router_trees_predict(const router_tree *t, int n_trees, double base, const float *x);

#endif
