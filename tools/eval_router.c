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

enum { MAX_RESULTS = 32 };

static void add_result(result *r, int *n, const char *key, double v)
{
    if (*n < MAX_RESULTS)
        r[(*n)++] = (result){key, v};
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

static void usage(void)
{
    fprintf(stderr,
            "usage: llmgw-eval-router -w WEIGHTS [--emb-cache FILE] [-m MODEL_DIR] [--threads N]\n"
            "         [--subjects s1,s2,... | --exclude s1,s2,...] [--threshold T]\n"
            "         [--target-share S]"
            " [--record FILE] [--expect FILE [--tol E]] CSV|DIR...\n");
}

int main(int argc, char **argv)
{
    const char *tool = "llmgw-eval-router", *weights = NULL, *cache = NULL, *model = NULL;
    const char *subjects = NULL, *exclude = NULL, *record = NULL, *expect = NULL;
    int threads = 0;
    double threshold = -1, target = -1, tol = 1e-6;
    static const struct option opts[] = {
        {"weights", required_argument, NULL, 'w'},  {"emb-cache", required_argument, NULL, 'e'},
        {"model", required_argument, NULL, 'm'},    {"threads", required_argument, NULL, 't'},
        {"subjects", required_argument, NULL, 's'}, {"threshold", required_argument, NULL, 'T'},
        {"exclude", required_argument, NULL, 'X'},
        {"target-share", required_argument, NULL, 'S'},
        {"record", required_argument, NULL, 'r'},   {"expect", required_argument, NULL, 'x'},
        {"tol", required_argument, NULL, 'E'},      {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int ch;
    while ((ch = getopt_long(argc, argv, "w:e:m:t:s:X:T:S:r:x:E:h", opts, NULL)) != -1) {
        switch (ch) {
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
    ranked *v = xrealloc(NULL, n * sizeof *v);
    double weak = 0, strong = 0;
    for (size_t i = 0; i < n; i++) {
        const rt_row *r = &d.rows[i];
        v[i] = (ranked){router_classifier_score(c, r->emb, r->prompt, r->len), i};
        weak += r->weak_ok;
        strong += r->strong_ok;
    }
    qsort(v, n, sizeof *v, cmp_ranked);
    /* correct[k]: rows answered correctly when the top k go to the strong model. */
    double *acc = xrealloc(NULL, (n + 1) * sizeof *acc);
    double correct = weak;
    acc[0] = correct / (double)n;
    for (size_t k = 1; k <= n; k++) {
        const rt_row *r = &d.rows[v[k - 1].row];
        correct += (double)r->strong_ok - (double)r->weak_ok;
        acc[k] = correct / (double)n;
    }
    double weak_acc = weak / (double)n, strong_acc = strong / (double)n;
    double gap = strong_acc - weak_acc;
    int n_subjects = 0;
    for (int s = 0; s < d.n_subjects; s++)
        n_subjects += (subjects == NULL || in_list(subjects, d.subjects[s])) &&
                      (exclude == NULL || !in_list(exclude, d.subjects[s]));
    printf("%zu rows from %d subject(s); weak accuracy %.4f, strong accuracy %.4f\n", n,
           n_subjects, weak_acc, strong_acc);
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
    double apgr = 0;
    for (int j = 0; j <= 10; j++) {
        size_t k = (n * (size_t)j + 5) / 10;
        double pgr = gap > 0 ? (acc[k] - weak_acc) / gap : 0;
        apgr += (j == 0 || j == 10 ? 0.5 : 1.0) * pgr / 10.0;
        char th[32] = "-";
        if (k > 0)
            snprintf(th, sizeof th, "%.4f", v[k - 1].score);
        printf("| %d%% | %s | %.4f | %.3f | %.4f |\n", 10 * j, th, acc[k], pgr,
               weak_acc + j / 10.0 * gap);
        add_result(res, &n_res, acc_keys[j], acc[k]);
    }
    double apgr_fine = 0, cpt50 = -1, cpt95 = -1;
    for (size_t k = 0; k <= n && gap > 0; k++) {
        double pgr = (acc[k] - weak_acc) / gap;
        apgr_fine += (k == 0 || k == n ? 0.5 : 1.0) * pgr / (double)n;
        if (cpt50 < 0 && acc[k] >= weak_acc + 0.50 * gap - 1e-12)
            cpt50 = (double)k / (double)n;
        if (cpt95 < 0 && acc[k] >= weak_acc + 0.95 * gap - 1e-12)
            cpt95 = (double)k / (double)n;
    }
    if (gap > 0) {
        printf("APGR %.4f (random 0.5000); APGR over all %zu cuts %.4f\n", apgr, n + 1,
               apgr_fine);
        printf("CPT(50%%) %.2f%% strong calls (random 50%%); CPT(95%%) %.2f%% (random 95%%)\n",
               100 * cpt50, 100 * cpt95);
        add_result(res, &n_res, "apgr", apgr);
        add_result(res, &n_res, "apgr_all_cuts", apgr_fine);
        add_result(res, &n_res, "cpt50", cpt50);
        add_result(res, &n_res, "cpt95", cpt95);
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
    if (record != NULL) {
        FILE *f = fopen(record, "w");
        if (f == NULL) {
            fprintf(stderr, "%s: %s: %s\n", tool, record, strerror(errno));
            return 2;
        }
        fprintf(f, "# llmgw-eval-router numbers (see tools/eval_router.c for the definitions)\n");
        for (int i = 0; i < n_res; i++)
            fprintf(f, "%s %.9g\n", res[i].key, res[i].value);
        if (fclose(f) != 0) {
            fprintf(stderr, "%s: %s: write error\n", tool, record);
            return 2;
        }
    }
    if (expect != NULL)
        rc = check_expect(expect, res, n_res, tol, tool);
    free(acc);
    free(v);
    all.n = kept;
    all.emb = d.emb;
    data_free(&all);
    router_classifier_free(c);
    return rc;
}
