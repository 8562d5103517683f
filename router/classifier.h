/* router/classifier.h: the complexity classifier. It scores how likely a request needs the
 * strong tier, from the request's MiniLM sentence embedding (the one the cache computed: never
 * encode twice) plus a few lexical features of the prompt, as logistic regression (or a small
 * MLP) whose weights live in a text file beside the policy, written by llmgw-train-router.
 * A loaded classifier is immutable: scoring is thread-safe. */
#ifndef LLMGW_ROUTER_CLASSIFIER_H
#define LLMGW_ROUTER_CLASSIFIER_H

#include "common/err.h"

#include <stddef.h>

/* Lexical features, in this order in router_lexical_features' output. */
#define ROUTER_LEX_FEATURES 8

typedef struct router_classifier router_classifier;

/* Reads and validates a weights file; a bad file is an error naming it and the problem. */
int  router_classifier_load(router_classifier **out, const char *path, util_err *err);
void router_classifier_free(router_classifier *c);  /* NULL is a no-op */

/* The embedding width the weights expect (384 for all-MiniLM-L6-v2). */
int  router_classifier_dim(const router_classifier *c);

/* Lexical features of a prompt (shared by training and serving): e.g. log length, code and math
 * markers, question count, digits share, ... (see classifier.c). */
void router_lexical_features(const char *text, size_t len, float out[ROUTER_LEX_FEATURES]);

/* P(the strong tier is needed) in [0, 1]. emb: dim floats, L2-normalised. */
double router_classifier_score(const router_classifier *c, const float *emb, const char *text,
                               size_t len);

/* Parses a weights file's bytes (len of them, no NUL needed); name labels the errors
 * ("name:line: ..."). router_classifier_load reads a file through it. */
int router_classifier_parse(router_classifier **out, const char *buf, size_t len,
                            const char *name, util_err *err);

/* Logistic regression over dim + ROUTER_LEX_FEATURES inputs: P = sigmoid(bias + sum weight[i] *
 * (x[i] - mean[i]) / std[i]). Copies the arrays; EINVAL for non-finite values or std <= 0. */
int router_classifier_new_lr(router_classifier **out, int dim, const double *mean,
                             const double *std, const double *weight, double bias, util_err *err);

/* Writes c as a weights file that router_classifier_load reads back (numbers to 9 significant
 * digits); comment (may be NULL) goes in as '#' lines under the header. */
int router_classifier_save(const router_classifier *c, const char *path, const char *comment,
                           util_err *err);

#endif
