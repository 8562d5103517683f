/* tools/router_fit.c: see router_fit.h. The three parts are fitted on the same rows:
 *   kNN: the rows' embeddings as int8 (q * scale of unit length) with their gains;
 *   ridge: (Z'Z + alpha I) w = Z'(y - mean y) on the standardised embedding Z, bias mean y;
 *   trees: least-squares gradient boosting, each tree of depth ROUTER_TREE_DEPTH grown level by
 *     level by exact greedy splits (every distinct value of every feature, leaves of at least
 *     min_leaf rows), leaf values learn_rate * the mean residual.
 * Each part's predictions on the training rows (the kNN's leaving the row itself out) give its
 * mean and spread for the combination, and the summed standardised predictions give the
 * quantiles. familiar_min is the familiar_pct quantile of the rows' leave-one-out familiarity. */
#include "tools/router_fit.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (p == NULL) {
        fprintf(stderr, "router_fit: out of memory\n");
        exit(2);
    }
    return p;
}

void rfit_describe(const rfit_params *p, char *buf, size_t size)
{
    snprintf(buf, size, "k=%d ridge_alpha=%g trees=%d depth=%d min_leaf=%d learn_rate=%g "
             "familiar_pct=%g", p->k, p->ridge_alpha, p->n_trees, ROUTER_TREE_DEPTH, p->min_leaf,
             p->learn_rate, p->familiar_pct);
}

/* In-place Cholesky solve of a x = b (a q x q symmetric positive definite, lower triangle used);
 * b becomes x. -1 when a is not positive definite. */
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

static void fit_ridge(const float *emb, const double *y, int dim, const size_t *idx, size_t n,
                      double alpha, double *mean, double *std, double *w, double *bias)
{
    size_t d = (size_t)dim;
    memset(mean, 0, d * sizeof *mean);
    memset(std, 0, d * sizeof *std);
    double ym = 0;
    for (size_t i = 0; i < n; i++) {
        const float *e = emb + idx[i] * d;
        for (size_t k = 0; k < d; k++)
            mean[k] += e[k];
        ym += y[idx[i]];
    }
    ym /= (double)n;
    for (size_t k = 0; k < d; k++)
        mean[k] /= (double)n;
    for (size_t i = 0; i < n; i++) {
        const float *e = emb + idx[i] * d;
        for (size_t k = 0; k < d; k++)
            std[k] += (e[k] - mean[k]) * (e[k] - mean[k]);
    }
    for (size_t k = 0; k < d; k++) {
        std[k] = sqrt(std[k] / (double)n);
        if (!(std[k] > 1e-12))
            std[k] = 1;
    }
    double *a = calloc(d * d, sizeof *a), *z = xmalloc(d * sizeof *z);
    if (a == NULL) {
        fprintf(stderr, "router_fit: out of memory\n");
        exit(2);
    }
    memset(w, 0, d * sizeof *w);
    for (size_t i = 0; i < n; i++) {
        const float *e = emb + idx[i] * d;
        for (size_t k = 0; k < d; k++)
            z[k] = (e[k] - mean[k]) / std[k];
        double r = y[idx[i]] - ym;
        for (size_t k = 0; k < d; k++) {
            w[k] += z[k] * r;
            double zk = z[k];
            double *row = a + k * d;
            for (size_t l = 0; l <= k; l++)
                row[l] += zk * z[l];
        }
    }
    for (size_t k = 0; k < d; k++)
        a[k * d + k] += alpha;
    if (cholesky_solve(a, w, dim) != 0) {
        fprintf(stderr, "router_fit: the ridge system is singular\n");
        exit(2);
    }
    *bias = ym;
    free(a);
    free(z);
}

/* ---- boosted trees ------------------------------------------------------------------------- */

/* The column of xs that rows are sorted by (qsort_r's argument). */
typedef struct column {
    const float *xs;  /* [n][ROUTER_STRUCT_FEATURES] */
    size_t f;
} column;

static int cmp_pos(const void *a, const void *b, void *arg)
{
    const column *c = arg;
    size_t i = *(const size_t *)a, j = *(const size_t *)b;
    float u = c->xs[i * ROUTER_STRUCT_FEATURES + c->f];
    float v = c->xs[j * ROUTER_STRUCT_FEATURES + c->f];
    if (u != v)
        return u < v ? -1 : 1;
    return i < j ? -1 : i > j;
}

static void fit_trees(const float *xs, const double *y, size_t n, const rfit_params *p,
                      router_tree *trees, double *base, double *pred)
{
    enum { F = ROUTER_STRUCT_FEATURES };
    size_t *order = xmalloc((size_t)F * n * sizeof *order);
    for (size_t f = 0; f < F; f++) {
        size_t *o = order + f * n;
        for (size_t i = 0; i < n; i++)
            o[i] = i;
        qsort_r(o, n, sizeof *o, cmp_pos, &(column){xs, f});
    }
    double b = 0;
    for (size_t i = 0; i < n; i++)
        b += y[i];
    b /= (double)n;
    *base = b;
    double *res = xmalloc(n * sizeof *res);
    int *node = xmalloc(n * sizeof *node);
    for (size_t i = 0; i < n; i++)
        pred[i] = b;
    for (int t = 0; t < p->n_trees; t++) {
        router_tree *tr = &trees[t];
        for (size_t i = 0; i < n; i++) {
            res[i] = y[i] - pred[i];
            node[i] = 0;
        }
        for (int level = 0; level < ROUTER_TREE_DEPTH; level++) {
            int first = (1 << level) - 1, count = 1 << level;
            double tot[ROUTER_TREE_LEAVES] = {0}, lsum[ROUTER_TREE_LEAVES];
            size_t cnt[ROUTER_TREE_LEAVES] = {0}, lcnt[ROUTER_TREE_LEAVES];
            float last[ROUTER_TREE_LEAVES] = {0};
            double best_gain[ROUTER_TREE_LEAVES];
            for (int j = 0; j < count; j++) {
                tr->feature[first + j] = -1;
                tr->threshold[first + j] = 0;
                best_gain[j] = 1e-12;
            }
            for (size_t i = 0; i < n; i++) {
                tot[node[i] - first] += res[i];
                cnt[node[i] - first]++;
            }
            for (int f = 0; f < F; f++) {
                for (int j = 0; j < count; j++) {
                    lsum[j] = 0;
                    lcnt[j] = 0;
                }
                const size_t *o = order + (size_t)f * n;
                for (size_t s = 0; s < n; s++) {
                    size_t i = o[s];
                    int j = node[i] - first;
                    float v = xs[i * F + f];
                    size_t nl = lcnt[j], nr = cnt[j] - nl;
                    if (nl >= (size_t)p->min_leaf && nr >= (size_t)p->min_leaf && v > last[j]) {
                        double sl = lsum[j], sr = tot[j] - sl;
                        double gain = sl * sl / (double)nl + sr * sr / (double)nr -
                                      tot[j] * tot[j] / (double)cnt[j];
                        if (gain > best_gain[j]) {
                            best_gain[j] = gain;
                            tr->feature[first + j] = f;
                            tr->threshold[first + j] = 0.5 * ((double)last[j] + (double)v);
                        }
                    }
                    lsum[j] += res[i];
                    lcnt[j]++;
                    last[j] = v;
                }
            }
            for (size_t i = 0; i < n; i++) {
                int nd = node[i], f = tr->feature[nd];
                node[i] = 2 * nd + (f >= 0 && !(xs[i * F + f] < tr->threshold[nd]) ? 2 : 1);
            }
        }
        double lsum[ROUTER_TREE_LEAVES] = {0};
        size_t lcnt[ROUTER_TREE_LEAVES] = {0};
        for (size_t i = 0; i < n; i++) {
            lsum[node[i] - ROUTER_TREE_NODES] += res[i];
            lcnt[node[i] - ROUTER_TREE_NODES]++;
        }
        for (int l = 0; l < ROUTER_TREE_LEAVES; l++)
            tr->leaf[l] = lcnt[l] ? p->learn_rate * lsum[l] / (double)lcnt[l] : 0;
        for (size_t i = 0; i < n; i++)
            pred[i] += tr->leaf[node[i] - ROUTER_TREE_NODES];
    }
    free(order);
    free(res);
    free(node);
}

/* ---- the whole model ----------------------------------------------------------------------- */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void mean_std(const double *v, size_t n, double *mean, double *std)
{
    double m = 0, s = 0;
    for (size_t i = 0; i < n; i++)
        m += v[i];
    m /= (double)n;
    for (size_t i = 0; i < n; i++)
        s += (v[i] - m) * (v[i] - m);
    s = sqrt(s / (double)n);
    *mean = m;
    *std = s > 1e-12 ? s : 1;
}

/* The q quantile of sorted v[0..n) (linear between order statistics). */
static double quantile(const double *v, size_t n, double q)
{
    double pos = q * (double)(n - 1);
    size_t lo = (size_t)pos;
    if (lo + 1 >= n)
        return v[n - 1];
    return v[lo] + (pos - (double)lo) * (v[lo + 1] - v[lo]);
}

router_classifier *rfit_train(const float *emb, const float *x, const double *y, int dim,
                              const size_t *idx, size_t n, const rfit_params *p)
{
    size_t d = (size_t)dim;
    router_model m = {.dim = dim, .k = p->k, .n_knn = n, .n_trees = p->n_trees};
    int8_t *q = xmalloc(n * d);
    float *scale = xmalloc(n * sizeof *scale), *target = xmalloc(n * sizeof *target);
    for (size_t i = 0; i < n; i++) {
        const float *e = emb + idx[i] * d;
        float mx = 0;
        for (size_t k = 0; k < d; k++)
            mx = fabsf(e[k]) > mx ? fabsf(e[k]) : mx;
        float s = mx > 0 ? mx / 127.0f : 1.0f;
        double ss = 0;
        for (size_t k = 0; k < d; k++) {
            long v = lrintf(e[k] / s);
            v = v > 127 ? 127 : v < -127 ? -127 : v;
            q[i * d + k] = (int8_t)v;
            ss += (double)v * (double)v;
        }
        scale[i] = ss > 0 ? (float)(1.0 / sqrt(ss)) : 0.0f;
        target[i] = (float)y[idx[i]];
    }
    m.knn_q = q;
    m.knn_scale = scale;
    m.knn_target = target;
    double *parts = xmalloc(3 * n * sizeof *parts), *fam = xmalloc(n * sizeof *fam);
    for (size_t i = 0; i < n; i++)
        router_knn_query(q, scale, target, n, dim, p->k, emb + idx[i] * d, (long)i, &parts[i],
                         &fam[i]);
    double *rm = xmalloc(3 * d * sizeof *rm);
    fit_ridge(emb, y, dim, idx, n, p->ridge_alpha, rm, rm + d, rm + 2 * d, &m.ridge_bias);
    m.ridge_mean = rm;
    m.ridge_std = rm + d;
    m.ridge_weight = rm + 2 * d;
    for (size_t i = 0; i < n; i++) {
        const float *e = emb + idx[i] * d;
        double r = m.ridge_bias;
        for (size_t k = 0; k < d; k++)
            r += rm[2 * d + k] * (e[k] - rm[k]) / rm[d + k];
        parts[n + i] = r;
    }
    float *xs = xmalloc(n * ROUTER_STRUCT_FEATURES * sizeof *xs);
    double *ys = xmalloc(n * sizeof *ys);
    for (size_t i = 0; i < n; i++) {
        memcpy(xs + i * ROUTER_STRUCT_FEATURES, x + idx[i] * ROUTER_STRUCT_FEATURES,
               ROUTER_STRUCT_FEATURES * sizeof *xs);
        ys[i] = y[idx[i]];
    }
    router_tree *trees = calloc((size_t)p->n_trees + 1, sizeof *trees);
    if (trees == NULL)
        exit(2);
    fit_trees(xs, ys, n, p, trees, &m.tree_base, parts + 2 * n);
    m.trees = trees;
    for (int j = 0; j < 3; j++)
        mean_std(parts + (size_t)j * n, n, &m.combine_mean[j], &m.combine_std[j]);
    double *z = xmalloc(n * sizeof *z);
    for (size_t i = 0; i < n; i++) {
        z[i] = 0;
        for (int j = 0; j < 3; j++)
            z[i] += (parts[(size_t)j * n + i] - m.combine_mean[j]) / m.combine_std[j];
    }
    qsort(z, n, sizeof *z, cmp_double);
    for (int i = 0; i < ROUTER_QUANTILES; i++)
        m.quantiles[i] = quantile(z, n, (double)i / (ROUTER_QUANTILES - 1));
    qsort(fam, n, sizeof *fam, cmp_double);
    m.familiar_min = p->k > 0 ? quantile(fam, n, p->familiar_pct) : 0;
    router_classifier *c = NULL;
    util_err err = {0};
    if (router_classifier_new(&c, &m, &err) != 0) {
        fprintf(stderr, "router_fit: %s\n", err.msg);
        exit(2);
    }
    free(q);
    free(scale);
    free(target);
    free(parts);
    free(fam);
    free(rm);
    free(xs);
    free(ys);
    free(trees);
    free(z);
    return c;
}
