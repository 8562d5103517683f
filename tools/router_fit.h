/* tools/router_fit.h: fits the router's complexity classifier (router/classifier.h) — what
 * llmgw-train-router ships and llmgw-eval-router cross-validates. Deterministic: no seed, fixed
 * order, so a retrain reproduces the shipped weights. */
#ifndef LLMGW_TOOLS_ROUTER_FIT_H
#define LLMGW_TOOLS_ROUTER_FIT_H

#include "router/classifier.h"

#include <stddef.h>

typedef struct rfit_params {
    int k;               /* kNN neighbours */
    double ridge_alpha;  /* ridge penalty on the standardised embedding (sum of squares loss) */
    int n_trees;         /* boosted trees */
    int min_leaf;        /* rows a tree leaf must keep */
    double learn_rate;   /* shrinkage of each tree */
    double familiar_pct; /* familiar_min = this quantile of the training rows' familiarity */
} rfit_params;

#define RFIT_DEFAULTS {.k = 50, .ridge_alpha = 10000, .n_trees = 200, .min_leaf = 100, \
                       .learn_rate = 0.05, .familiar_pct = 0.02}

/* Fits on the rows idx[0..n): emb [*][dim] unit vectors, x [*][ROUTER_STRUCT_FEATURES], y [*]
 * the gain (strong right - weak right). Exits 2 on out of memory or a singular system. */
router_classifier *rfit_train(const float *emb, const float *x, const double *y, int dim,
                              const size_t *idx, size_t n, const rfit_params *p);

/* "k=50 ridge_alpha=10000 ..." for comments and reports. */
void rfit_describe(const rfit_params *p, char *buf, size_t size);

#endif
