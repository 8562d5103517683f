/* tools/eval_router.c: llmgw-eval-router — how well the complexity classifier's weights route
 * between a weak and a strong model, on labelled routing CSVs (llmgw-train-router's input).
 *
 *   llmgw-eval-router -w WEIGHTS [--emb-cache FILE] [-m MODEL_DIR] [--threads N]
 *                     [--subjects s1,s2,... | --exclude s1,s2,...] [--threshold T]
 *                     [--target-share S]
 *                     [--record FILE] [--expect FILE [--tol E]] CSV|DIR...
 *
 * Every row is scored with router_classifier_score; routing a share c of the rows to the strong
 * model sends the round(c * n) highest-scoring rows there (ties broken by row order), i.e. the
 * threshold is the score quantile. A routed row counts as correct when the model it went to
 * answered it correctly. Printed:
 *   - accuracy at strong-call shares 0%, 10%, ..., 100%, and random routing's expected accuracy
 *     weak_acc + c * (strong_acc - weak_acc);
 *   - PGR(c) = (acc(c) - weak_acc) / (strong_acc - weak_acc), the performance gap recovered;
 *   - APGR = the area under PGR over c in [0, 1] by the trapezoid rule on the 11 shares of the
 *     table, (PGR(0)/2 + PGR(0.1) + ... + PGR(0.9) + PGR(1)/2) / 10 (random routing: 0.5); also
 *     "APGR (all cuts)", the same trapezoid over every cut k/n, k = 0..n;
 *   - CPT(x) = the smallest share k/n (over every cut) whose accuracy reaches
 *     weak_acc + x * (strong_acc - weak_acc): the share of strong calls needed to recover x of
 *     the gap (random routing: x), for x = 50% and 95%.
 * --threshold T also reports routing by score >= T; --target-share S prints the threshold that
 * sends a share S of these rows to the strong model. --subjects keeps only those subjects,
 * --exclude all but those.
 * --record writes the numbers as "key value" lines; --expect compares with such a file and exits 1
 * when any differs by more than --tol (default 1e-6). */
#define ROUTER_TOOL_DATA_ONLY
#include "train_router.c"

#include <stdarg.h>

typedef struct ranked {
    double score;
    size_t row;
} ranked;

static int cmp_ranked(const void *a, const void *b)
{
    const ranked *x = a, *y = b;
    if (x->score != y->score)
        return x->score > y->score ? -1 : 1;  /* highest score first */
    return x->row < y->row ? -1 : x->row > y->row;
}

typedef struct result {
    const char *key;
    double value;
} result;

enum { MAX_RESULTS = 256 };

static void add_result(result *r, int *n, const char *key, double v)
{
    if (*n < MAX_RESULTS)
        r[(*n)++] = (result){key, v};
}

/* Keys made at run time (per fold) live here until exit. */
__attribute__((format(printf, 1, 2)))
static const char *key_printf(const char *fmt, ...)
{
    static char store[MAX_RESULTS][48];
    static int used;
    if (used == MAX_RESULTS)
        return "overflow";
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(store[used], sizeof store[used], fmt, ap);
    va_end(ap);
    return store[used++];
}

/* Compares results with a "key value" file; every key in the file must be known. */
static int check_expect(const char *path, const result *r, int n, double tol, const char *tool)
{
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        fprintf(stderr, "%s: %s: %s\n", tool, path, strerror(errno));
        return 2;
    }
    char line[256];
    int bad = 0, checked = 0;
    long no = 0;
    while (fgets(line, sizeof line, f) != NULL) {
        no++;
        char key[64];
        double v;
        if (line[0] == '#' || line[0] == '\n')
            continue;
        if (sscanf(line, "%63s %lf", key, &v) != 2) {
            fprintf(stderr, "%s: %s:%ld: want \"key value\"\n", tool, path, no);
            bad = 1;
            continue;
        }
        int i = 0;
        while (i < n && strcmp(r[i].key, key) != 0)
            i++;
        if (i == n) {
            fprintf(stderr, "%s: %s:%ld: unknown key %s\n", tool, path, no, key);
            bad = 1;
        } else if (!(fabs(r[i].value - v) <= tol)) {
            fprintf(stderr, "%s: %s: %.9g, expected %.9g (within %g)\n", tool, key, r[i].value,
                    v, tol);
            bad = 1;
        }
        checked++;
    }
    fclose(f);
    if (checked == 0) {
        fprintf(stderr, "%s: %s: no expectations\n", tool, path);
        bad = 1;
    }
    printf("%s: %d expectations from %s %s\n", tool, checked, path, bad ? "FAILED" : "hold");
    return bad;
}


/* ---- routing quality of a ranking --------------------------------------------------------- */

/* The top k of the rows by score go to the strong model (ties broken by row order). */
typedef struct route_eval {
    double weak, strong;   /* accuracies of all-weak and all-strong */
    double apgr;           /* trapezoid over the 11 shares 0%, 10%, ..., 100%; 0 without a gap */
    double apgr_all_cuts;  /* the same over every cut k/n */
    double cpt50, cpt95;   /* the smallest share recovering 50% / 95% of the gap; -1 without */
} route_eval;

/* Ranks the n rows and fills *acc_out with acc[k], k = 0..n (the accuracy when the top k go to
 * the strong model) and *v_out with the ranking; both are the caller's to free. */
static route_eval route_curve(const double *score, const bool *weak_ok, const bool *strong_ok,
                              size_t n, ranked **v_out, double **acc_out)
{
    ranked *v = xrealloc(NULL, n * sizeof *v);
    route_eval e = {0};
    for (size_t i = 0; i < n; i++) {
        v[i] = (ranked){score[i], i};
        e.weak += weak_ok[i];
        e.strong += strong_ok[i];
    }
    qsort(v, n, sizeof *v, cmp_ranked);
    double *acc = xrealloc(NULL, (n + 1) * sizeof *acc), correct = e.weak;
    acc[0] = correct / (double)n;
    for (size_t k = 1; k <= n; k++) {
        correct += (double)strong_ok[v[k - 1].row] - (double)weak_ok[v[k - 1].row];
        acc[k] = correct / (double)n;
    }
    e.weak /= (double)n;
    e.strong /= (double)n;
    double gap = e.strong - e.weak;
    for (int j = 0; j <= 10 && gap > 0; j++) {
        size_t k = (n * (size_t)j + 5) / 10;
        e.apgr += (j == 0 || j == 10 ? 0.5 : 1.0) * ((acc[k] - e.weak) / gap) / 10.0;
    }
    e.cpt50 = e.cpt95 = -1;
    for (size_t k = 0; k <= n && gap > 0; k++) {
        double pgr = (acc[k] - e.weak) / gap;
        e.apgr_all_cuts += (k == 0 || k == n ? 0.5 : 1.0) * pgr / (double)n;
        if (e.cpt50 < 0 && acc[k] >= e.weak + 0.50 * gap - 1e-12)
            e.cpt50 = (double)k / (double)n;
        if (e.cpt95 < 0 && acc[k] >= e.weak + 0.95 * gap - 1e-12)
            e.cpt95 = (double)k / (double)n;
    }
    *v_out = v;
    *acc_out = acc;
    return e;
}

static route_eval evaluate_ranking(const double *score, const bool *weak_ok, const bool *strong_ok,
                                   size_t n)
{
    ranked *v;
    double *acc;
    route_eval e = route_curve(score, weak_ok, strong_ok, n, &v, &acc);
    free(acc);
    free(v);
    return e;
}

/* ---- grouped cross-validation over subjects --------------------------------------------- */

enum { MAX_FOLDS = 45, N_SUBSETS = 7 };
/* The parts' subsets whose cross-validated APGR is reported (bit 0 kNN, 1 ridge, 2 trees). */
static const int subset_bits[N_SUBSETS] = {1, 2, 4, 3, 5, 6, 7};
static const char *const subset_names[N_SUBSETS] = {
    "knn", "ridge", "trees", "knn+ridge", "knn+trees", "ridge+trees", "all"};

/* Trains on every fold but one and scores that fold, for each of K folds of whole subjects
 * (subject i, in name order, is in fold i mod K); prints and records the table. The threshold
 * it reports is the largest of 0.00, 0.01, ..., 1.00 at which every fold keeps at least 95 % of
 * its strong-model accuracy. */
static int cross_validate_subjects(rt_data *d, int folds, const rfit_params *params,
                                   const char *fold_dir, double shipped, result *res, int *n_res,
                                   const char *tool)
{
    size_t n = d->n;
    float *x;
    double *y;
    rows_inputs(d, &x, &y);
    int *fold_of = xrealloc(NULL, n * sizeof *fold_of);
    for (size_t i = 0; i < n; i++)
        fold_of[i] = d->rows[i].subject % folds;
    double *score = xrealloc(NULL, n * sizeof *score), *part = xrealloc(NULL, 3 * n * sizeof *part);
    bool *familiar = xrealloc(NULL, n * sizeof *familiar);
    size_t *tr = xrealloc(NULL, n * sizeof *tr);
    double comb_mean[MAX_FOLDS][3], comb_std[MAX_FOLDS][3];
    char recipe[256];
    rfit_describe(params, recipe, sizeof recipe);
    printf("grouped %d-fold cross-validation over %d subjects (subject i in fold i mod %d), "
           "%zu rows; recipe %s\n", folds, d->n_subjects, folds, n, recipe);
    for (int f = 0; f < folds; f++) {
        size_t n_tr = 0;
        for (size_t i = 0; i < n; i++)
            if (fold_of[i] != f)
                tr[n_tr++] = i;
        router_classifier *c = rfit_train(d->emb, x, y, d->dim, tr, n_tr, params);
        const router_model *m = router_classifier_model(c);
        for (int j = 0; j < 3; j++) {
            comb_mean[f][j] = m->combine_mean[j];
            comb_std[f][j] = m->combine_std[j];
        }
        for (size_t i = 0; i < n; i++) {
            if (fold_of[i] != f)
                continue;
            router_assessment a;
            router_classifier_assess(c, d->rows[i].emb, d->rows[i].prompt, d->rows[i].len, &a);
            score[i] = a.score;
            familiar[i] = a.familiar;
            for (int j = 0; j < 3; j++)
                part[3 * i + j] = a.part[j];
        }
        if (fold_dir != NULL) {
            char path[4096], knn[64], comment[512];
            snprintf(path, sizeof path, "%s/fold%d.weights", fold_dir, f);
            snprintf(knn, sizeof knn, "fold%d.knn", f);
            snprintf(comment, sizeof comment, "llmgw-eval-router --cv-subjects %d: fold %d held "
                     "out (subject i in fold i mod %d)\n%s", folds, f, folds, recipe);
            util_err err = {0};
            if (router_classifier_save(c, path, knn, comment, &err) != 0) {
                fprintf(stderr, "%s: %s\n", tool, err.msg);
                exit(2);
            }
        }
        router_classifier_free(c);
    }
    /* Per fold: the ensemble's ranking, the parts' subsets, the threshold grid. */
    bool *wk = xrealloc(NULL, n * sizeof *wk), *st = xrealloc(NULL, n * sizeof *st);
    double *sc = xrealloc(NULL, n * sizeof *sc);
    route_eval ev[MAX_FOLDS];
    double sub_apgr[N_SUBSETS][MAX_FOLDS];
    double grid_acc[MAX_FOLDS][101], unfamiliar[MAX_FOLDS];
    size_t rows_of[MAX_FOLDS];
    for (int f = 0; f < folds; f++) {
        size_t m = 0;
        for (size_t i = 0; i < n; i++) {
            if (fold_of[i] != f)
                continue;
            wk[m] = d->rows[i].weak_ok;
            st[m] = d->rows[i].strong_ok;
            sc[m++] = score[i];
        }
        rows_of[f] = m;
        ev[f] = evaluate_ranking(sc, wk, st, m);
        for (int s = 0; s < N_SUBSETS; s++) {
            size_t k = 0;
            for (size_t i = 0; i < n; i++) {
                if (fold_of[i] != f)
                    continue;
                double z = 0;
                for (int j = 0; j < 3; j++)
                    if (subset_bits[s] >> j & 1)
                        z += (part[3 * i + j] - comb_mean[f][j]) / comb_std[f][j];
                sc[k++] = z;
            }
            sub_apgr[s][f] = evaluate_ranking(sc, wk, st, m).apgr;
        }
        size_t unf = 0;
        for (int t = 0; t <= 100; t++) {
            double correct = 0;
            for (size_t i = 0; i < n; i++)
                if (fold_of[i] == f)
                    correct += score[i] >= t / 100.0 ? d->rows[i].strong_ok : d->rows[i].weak_ok;
            grid_acc[f][t] = correct / (double)m;
        }
        for (size_t i = 0; i < n; i++)
            unf += fold_of[i] == f && !familiar[i];
        unfamiliar[f] = (double)unf / (double)m;
    }
    int chosen = 0;
    for (int t = 0; t <= 100; t++) {
        bool ok = true;
        for (int f = 0; f < folds; f++)
            ok = ok && grid_acc[f][t] >= 0.95 * ev[f].strong - 1e-12;
        if (ok)
            chosen = t;
    }
    double thr = shipped >= 0 ? shipped : chosen / 100.0;
    printf("\n| fold | subjects | rows | weak acc | strong acc | APGR | CPT(50%%) | CPT(95%%) | "
           "strong calls at %.2f | accuracy at %.2f | of strong | quality loss | unfamiliar |\n"
           "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n", thr, thr);
    double sum_apgr = 0, worst = 2, sum50 = 0, sum95 = 0, pooled_calls = 0, pooled_ok = 0;
    double pooled_weak = 0, pooled_strong = 0, worst_keep = 2, unf_calls = 0, unf_ok = 0;
    for (int f = 0; f < folds; f++) {
        char names[1024] = "";
        for (int s = f; s < d->n_subjects; s += folds)
            snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s",
                     s == f ? "" : ", ", d->subjects[s]);
        double calls = 0, ok = 0;
        for (size_t i = 0; i < n; i++) {
            if (fold_of[i] != f)
                continue;
            bool go = score[i] >= thr, go_unf = go || !familiar[i];
            calls += go;
            ok += go ? d->rows[i].strong_ok : d->rows[i].weak_ok;
            unf_calls += go_unf;
            unf_ok += go_unf ? d->rows[i].strong_ok : d->rows[i].weak_ok;
        }
        double m = (double)rows_of[f], acc = ok / m;
        printf("| %d | %s | %zu | %.3f | %.3f | %.3f | %.1f%% | %.1f%% | %.1f%% | %.3f | %.1f%% | "
               "%.3f | %.1f%% |\n", f, names, rows_of[f], ev[f].weak, ev[f].strong, ev[f].apgr,
               100 * ev[f].cpt50, 100 * ev[f].cpt95, 100 * calls / m, acc,
               100 * acc / ev[f].strong, ev[f].strong - acc, 100 * unfamiliar[f]);
        add_result(res, n_res, key_printf("fold%d_apgr", f), ev[f].apgr);
        add_result(res, n_res, key_printf("fold%d_cpt50", f), ev[f].cpt50);
        add_result(res, n_res, key_printf("fold%d_cpt95", f), ev[f].cpt95);
        add_result(res, n_res, key_printf("fold%d_strong_share", f), calls / m);
        add_result(res, n_res, key_printf("fold%d_acc", f), acc);
        add_result(res, n_res, key_printf("fold%d_unfamiliar", f), unfamiliar[f]);
        sum_apgr += ev[f].apgr;
        worst = ev[f].apgr < worst ? ev[f].apgr : worst;
        worst_keep = acc / ev[f].strong < worst_keep ? acc / ev[f].strong : worst_keep;
        sum50 += ev[f].cpt50;
        sum95 += ev[f].cpt95;
        pooled_calls += calls;
        pooled_ok += ok;
        pooled_weak += ev[f].weak * m;
        pooled_strong += ev[f].strong * m;
    }
    double N = (double)n;
    printf("\nmean APGR %.3f, worst fold %.3f (random 0.5); mean CPT(50%%) %.1f%%, "
           "CPT(95%%) %.1f%%\n", sum_apgr / folds, worst, 100 * sum50 / folds,
           100 * sum95 / folds);
    printf("threshold %.2f (%s): %.1f%% strong calls over all rows, accuracy %.4f "
           "(all weak %.4f, all strong %.4f: %.1f%% of strong); worst fold keeps %.1f%% of its "
           "strong accuracy\n", thr, shipped >= 0 ? "given" : "the largest keeping >= 95% in "
           "every fold", 100 * pooled_calls / N, pooled_ok / N, pooled_weak / N,
           pooled_strong / N, 100 * pooled_ok / pooled_strong, 100 * worst_keep);
    if (shipped >= 0)
        printf("(the largest threshold keeping >= 95%% in every fold is %.2f)\n", chosen / 100.0);
    printf("with route_unfamiliar_to the strong tier as well: %.1f%% strong calls, accuracy %.4f "
           "(%.1f%% of strong)\n", 100 * unf_calls / N, unf_ok / N, 100 * unf_ok / pooled_strong);
    printf("\n| parts | mean APGR | worst fold |\n|---|---:|---:|\n");
    for (int s = 0; s < N_SUBSETS; s++) {
        double sum = 0, w = 2;
        for (int f = 0; f < folds; f++) {
            sum += sub_apgr[s][f];
            w = sub_apgr[s][f] < w ? sub_apgr[s][f] : w;
        }
        printf("| %s | %.3f | %.3f |\n", subset_names[s], sum / folds, w);
        add_result(res, n_res, key_printf("parts_%s_mean_apgr", subset_names[s]),
                   sum / folds);
    }
    add_result(res, n_res, "mean_apgr", sum_apgr / folds);
    add_result(res, n_res, "worst_apgr", worst);
    add_result(res, n_res, "mean_cpt50", sum50 / folds);
    add_result(res, n_res, "mean_cpt95", sum95 / folds);
    add_result(res, n_res, "chosen_threshold", chosen / 100.0);
    add_result(res, n_res, "threshold_share", pooled_calls / N);
    add_result(res, n_res, "threshold_acc", pooled_ok / N);
    add_result(res, n_res, "worst_fold_keep", worst_keep);
    add_result(res, n_res, "unfamiliar_strong_share", unf_calls / N);
    add_result(res, n_res, "unfamiliar_strong_acc", unf_ok / N);
    free(x);
    free(y);
    free(fold_of);
    free(score);
    free(part);
    free(familiar);
    free(tr);
    free(wk);
    free(st);
    free(sc);
    return 0;
}

static int write_record_file(const char *path, const result *res, int n_res, const char *tool)
{
    FILE *f = fopen(path, "w");
    if (f == NULL) {
        fprintf(stderr, "%s: %s: %s\n", tool, path, strerror(errno));
        return 2;
    }
    fprintf(f, "# llmgw-eval-router numbers (see tools/eval_router.c for the definitions)\n");
    for (int i = 0; i < n_res; i++)
        fprintf(f, "%s %.9g\n", res[i].key, res[i].value);
    if (fclose(f) != 0) {
        fprintf(stderr, "%s: %s: write error\n", tool, path);
        return 2;
    }
    return 0;
}

static void usage(void)
{
    fprintf(stderr,
            "usage: llmgw-eval-router -w WEIGHTS [--emb-cache FILE] [-m MODEL_DIR] [--threads N]\n"
            "         [--subjects s1,s2,... | --exclude s1,s2,...] [--threshold T]\n"
            "         [--target-share S]"
            " [--record FILE] [--expect FILE [--tol E]] [--dump FILE] CSV|DIR...\n"
            "       llmgw-eval-router --cv-subjects K [--emb-cache FILE] [--fold-weights DIR]\n"
            "         [--threshold T] [recipe options of llmgw-train-router]\n"
            "         [--record FILE] [--expect FILE [--tol E]] CSV|DIR...\n");
}

int main(int argc, char **argv)
{
    const char *tool = "llmgw-eval-router", *weights = NULL, *cache = NULL, *model = NULL;
    const char *subjects = NULL, *exclude = NULL, *record = NULL, *expect = NULL;
    const char *fold_dir = NULL, *dump_path = NULL;
    FILE *dump = NULL;
    int threads = 0, cv = 0;
    double threshold = -1, target = -1, tol = 1e-6;
    rfit_params params = RFIT_DEFAULTS;
    static const struct option opts[] = {
        {"weights", required_argument, NULL, 'w'},  {"emb-cache", required_argument, NULL, 'e'},
        {"model", required_argument, NULL, 'm'},    {"threads", required_argument, NULL, 't'},
        {"subjects", required_argument, NULL, 's'}, {"threshold", required_argument, NULL, 'T'},
        {"exclude", required_argument, NULL, 'X'},
        {"target-share", required_argument, NULL, 'S'},
        {"record", required_argument, NULL, 'r'},   {"expect", required_argument, NULL, 'x'},
        {"tol", required_argument, NULL, 'E'},      {"help", no_argument, NULL, 'h'},
        {"cv-subjects", required_argument, NULL, 'K'},
        {"fold-weights", required_argument, NULL, 'F'}, {"dump", required_argument, NULL, 'D'},
        RFIT_OPTIONS,
        {NULL, 0, NULL, 0},
    };
    int ch;
    while ((ch = getopt_long(argc, argv, "w:e:m:t:s:X:T:S:r:x:E:h", opts, NULL)) != -1) {
        if (rfit_option(ch, optarg, &params))
            continue;
        switch (ch) {
        case 'K': cv = atoi(optarg); break;
        case 'F': fold_dir = optarg; break;
        case 'D': dump_path = optarg; break;
        case 'w': weights = optarg; break;
        case 'e': cache = optarg; break;
        case 'm': model = optarg; break;
        case 't': threads = atoi(optarg); break;
        case 's': subjects = optarg; break;
        case 'X': exclude = optarg; break;
        case 'T': threshold = atof(optarg); break;
        case 'S': target = atof(optarg); break;
        case 'r': record = optarg; break;
        case 'x': expect = optarg; break;
        case 'E': tol = atof(optarg); break;
        case 'h': usage(); return 0;
        default: usage(); return 2;
        }
    }
    if (cv != 0) {
        if (cv < 2 || cv > MAX_FOLDS || weights != NULL || subjects || exclude ||
            optind == argc || !rfit_valid(&params) || threshold > 1) {
            usage();
            return 2;
        }
        rt_data d = {0};
        for (int i = optind; i < argc; i++)
            read_path(&d, argv[i], tool);
        if (d.n_subjects < cv) {
            fprintf(stderr, "%s: %d subjects cannot make %d folds\n", tool, d.n_subjects, cv);
            return 2;
        }
        embed_rows(&d, cache, model, threads, tool);
        result res[MAX_RESULTS];
        int n_res = 0;
        cross_validate_subjects(&d, cv, &params, fold_dir, threshold, res, &n_res, tool);
        int rc = 0;
        if (record != NULL && write_record_file(record, res, n_res, tool) != 0)
            rc = 2;
        if (rc == 0 && expect != NULL)
            rc = check_expect(expect, res, n_res, tol, tool);
        data_free(&d);
        return rc;
    }
    if (weights == NULL || optind == argc || target > 1 || (subjects && exclude)) {
        usage();
        return 2;
    }
    util_err err = {0};
    router_classifier *c = NULL;
    if (router_classifier_load(&c, weights, &err) != 0) {
        fprintf(stderr, "%s: %s\n", tool, err.msg);
        return 2;
    }
    rt_data all = {0};
    for (int i = optind; i < argc; i++)
        read_path(&all, argv[i], tool);
    if (subjects != NULL)
        check_list(&all, subjects, tool);
    if (exclude != NULL)
        check_list(&all, exclude, tool);
    /* Keep the chosen subjects' rows (all of them without --subjects). */
    rt_data d = all;
    size_t kept = 0;
    for (size_t i = 0; i < all.n; i++) {
        const char *s = all.subjects[all.rows[i].subject];
        if ((subjects == NULL || in_list(subjects, s)) && (exclude == NULL || !in_list(exclude, s)))
            d.rows[kept++] = all.rows[i];
        else
            free(all.rows[i].prompt);
    }
    d.n = kept;
    if (d.n == 0) {
        fprintf(stderr, "%s: no rows to evaluate\n", tool);
        return 2;
    }
    embed_rows(&d, cache, model, threads, tool);
    if (d.dim != router_classifier_dim(c)) {
        fprintf(stderr, "%s: %s wants dim %d, the embeddings have %d\n", tool, weights,
                router_classifier_dim(c), d.dim);
        return 2;
    }
    size_t n = d.n;
    double *scores = xrealloc(NULL, n * sizeof *scores);
    bool *weak_ok = xrealloc(NULL, n * sizeof *weak_ok), *strong_ok = xrealloc(NULL, n);
    if (dump_path != NULL && (dump = fopen(dump_path, "w")) == NULL) {
        fprintf(stderr, "%s: %s: %s\n", tool, dump_path, strerror(errno));
        return 2;
    }
    double unfamiliar = 0;
    for (size_t i = 0; i < n; i++) {
        const rt_row *r = &d.rows[i];
        router_assessment a;
        router_classifier_assess(c, r->emb, r->prompt, r->len, &a);
        scores[i] = a.score;
        if (dump != NULL) {
            const char *nl = memchr(r->prompt, '\n', r->len);
            int head = (int)(nl ? (size_t)(nl - r->prompt) : r->len);
            fprintf(dump, "%.6f\t%.6f\t%d\t%.*s\n", a.score, a.familiarity, a.familiar,
                    head > 80 ? 80 : head, r->prompt);
        }
        unfamiliar += !a.familiar;
        weak_ok[i] = r->weak_ok;
        strong_ok[i] = r->strong_ok;
    }
    if (dump != NULL && fclose(dump) != 0) {
        fprintf(stderr, "%s: %s: write error\n", tool, dump_path);
        return 2;
    }
    ranked *v;
    double *acc;
    route_eval ev = route_curve(scores, weak_ok, strong_ok, n, &v, &acc);
    double weak_acc = ev.weak, strong_acc = ev.strong;
    double gap = strong_acc - weak_acc;
    int n_subjects = 0;
    for (int s = 0; s < d.n_subjects; s++)
        n_subjects += (subjects == NULL || in_list(subjects, d.subjects[s])) &&
                      (exclude == NULL || !in_list(exclude, d.subjects[s]));
    printf("%zu rows from %d subject(s); weak accuracy %.4f, strong accuracy %.4f; "
           "%.1f%% unfamiliar to the classifier\n", n, n_subjects, weak_acc, strong_acc,
           100 * unfamiliar / (double)n);
    if (!(gap > 0))
        printf("the strong model is not better here: PGR, APGR and CPT are undefined\n");
    printf("| strong calls | threshold | accuracy | PGR | random accuracy |\n"
           "|---:|---:|---:|---:|---:|\n");
    result res[MAX_RESULTS];
    int n_res = 0;
    static const char *const acc_keys[] = {"acc_00", "acc_10", "acc_20", "acc_30", "acc_40",
                                           "acc_50", "acc_60", "acc_70", "acc_80", "acc_90",
                                           "acc_100"};
    add_result(res, &n_res, "rows", (double)n);
    add_result(res, &n_res, "weak_acc", weak_acc);
    add_result(res, &n_res, "strong_acc", strong_acc);
    add_result(res, &n_res, "unfamiliar_share", unfamiliar / (double)n);
    for (int j = 0; j <= 10; j++) {
        size_t k = (n * (size_t)j + 5) / 10;
        double pgr = gap > 0 ? (acc[k] - weak_acc) / gap : 0;
        char th[32] = "-";
        if (k > 0)
            snprintf(th, sizeof th, "%.4f", v[k - 1].score);
        printf("| %d%% | %s | %.4f | %.3f | %.4f |\n", 10 * j, th, acc[k], pgr,
               weak_acc + j / 10.0 * gap);
        add_result(res, &n_res, acc_keys[j], acc[k]);
    }
    if (gap > 0) {
        printf("APGR %.4f (random 0.5000); APGR over all %zu cuts %.4f\n", ev.apgr, n + 1,
               ev.apgr_all_cuts);
        printf("CPT(50%%) %.2f%% strong calls (random 50%%); CPT(95%%) %.2f%% (random 95%%)\n",
               100 * ev.cpt50, 100 * ev.cpt95);
        add_result(res, &n_res, "apgr", ev.apgr);
        add_result(res, &n_res, "apgr_all_cuts", ev.apgr_all_cuts);
        add_result(res, &n_res, "cpt50", ev.cpt50);
        add_result(res, &n_res, "cpt95", ev.cpt95);
    }
    if (target >= 0) {
        size_t k = (size_t)llround(target * (double)n);
        double t = k == 0 ? nextafter(v[0].score, 2.0) : v[k - 1].score;
        printf("--target-share %.3f: threshold %.6f (route strong when score >= it)\n", target, t);
    }
    if (threshold >= 0) {
        size_t k = 0;
        while (k < n && v[k].score >= threshold)
            k++;
        printf("threshold %.6f: %.2f%% strong calls, accuracy %.4f (PGR %.3f)\n", threshold,
               100.0 * (double)k / (double)n, acc[k], gap > 0 ? (acc[k] - weak_acc) / gap : 0);
        add_result(res, &n_res, "threshold_share", (double)k / (double)n);
        add_result(res, &n_res, "threshold_acc", acc[k]);
    }
    int rc = 0;
    if (record != NULL && write_record_file(record, res, n_res, tool) != 0)
        return 2;
    if (expect != NULL)
        rc = check_expect(expect, res, n_res, tol, tool);
    free(acc);
    free(v);
    free(scores);
    free(weak_ok);
    free(strong_ok);
    all.n = kept;
    all.emb = d.emb;
    data_free(&all);
    router_classifier_free(c);
    return rc;
}
