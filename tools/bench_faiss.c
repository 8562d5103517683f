/* tools/bench_faiss.c: lookup latency of the semantic cache through cache_store_search, per index
 * type and namespace size: random L2-normalised vectors in one namespace, queries near stored ones
 * (a stored vector plus noise), p50/p99 of single searches, the build time (puts, index adds and
 * any training) and the process's resident memory after the build. The recall column says how
 * often the query's source vector came back first.
 *
 *   llmgw-bench-faiss [--sizes 10000,100000,1000000] [--max N] [--queries N] [--dim D]
 *                     [--index "IDMap2,Flat;IDMap2,IVF4096,Flat@nprobe=16,20;..."] [--k K]
 *                     [--hnsw-max N] [--row-seconds S] [--train-max N]
 *
 * An index with "@name=v1,v2" after its factory string is measured on the FAISS index itself
 * (cache/index.h, as cache_store_search runs it: one thread) instead of through the store, once
 * per value of the search parameter (nprobe for IVF, efSearch for HNSW), which the store fixes
 * (nprobe 16, efSearch 64). Such an IVF index is measured only at sizes of at least 39 * nlist
 * (below, the store searches flat) and trained on its first min(39 * nlist, --train-max) vectors
 * (default 65536: k-means on 160k vectors for IVF4096 takes minutes here).
 *
 * --max drops sizes above N (1M entries take about 3 GB each through the store, 1.6 GB on the
 * index alone). HNSW rows above --hnsw-max (default 20000; 0 = none) are skipped: even FAISS with
 * AVX2 inserts at 0.3-3 ms per vector on two cores (--hnsw-max 0 measured here: 100k built in
 * 56 s, 1M in 20 minutes; Debian's FAISS without AVX2: 2-5 ms per vector). A row stops querying
 * after --row-seconds (default 20; at least 50 queries), which is what bounds Flat at 1M. The
 * default run takes about 6 minutes here. */
#include "cache/index.h"
#include "cache/store.h"
#include "common/time.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct rng {
    uint64_t s;
} rng;

static uint64_t rng_next(rng *r)
{
    r->s += 0x9e3779b97f4a7c15u;
    uint64_t z = r->s;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
}

/* Approximately normal (sum of four uniforms), good enough for random directions. */
static float rng_gauss(rng *r)
{
    double s = 0;
    for (int i = 0; i < 4; i++)
        s += (double)(rng_next(r) >> 11) / 9007199254740992.0;
    return (float)((s - 2.0) * 1.7320508);
}

static void normalise(float *v, int dim)
{
    double n = 0;
    for (int i = 0; i < dim; i++)
        n += (double)v[i] * v[i];
    n = sqrt(n);
    for (int i = 0; i < dim; i++)
        v[i] = (float)(v[i] / n);
}

/* Vector number i, the same on every call. */
static void stored_vec(float *v, int dim, uint64_t i)
{
    rng r = {i * 0x2545f4914f6cdd1du + 1};
    for (int j = 0; j < dim; j++)
        v[j] = rng_gauss(&r);
    normalise(v, dim);
}

static long rss_kib(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kib = -1;
    if (f == NULL)
        return -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %ld kB", &kib) == 1)
            break;
    fclose(f);
    return kib;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static int run(const char *factory, long n, int dim, int queries, int k, double row_s)
{
    cache_store *s = NULL;
    util_err err = {0};
    cache_store_cfg cfg = {.dim = dim, .index = factory};
    long rss0 = rss_kib();
    if (cache_store_new(&s, &cfg, &err) != 0) {
        fprintf(stderr, "bench_faiss: %s\n", err.msg);
        return 1;
    }
    float *v = malloc((size_t)dim * sizeof *v), *q = malloc((size_t)dim * sizeof *q);
    const cache_entry **out = malloc((size_t)k * sizeof *out);
    float *sims = malloc((size_t)k * sizeof *sims);
    uint64_t *lat = malloc((size_t)queries * sizeof *lat);
    int64_t now = 1000000;
    static const char resp[] = "{\"object\":\"chat.completion\"}";

    uint64_t t0 = util_now_ns();
    for (long i = 0; i < n; i++) {
        stored_vec(v, dim, (uint64_t)i);
        cache_entry e = {.id = (uint64_t)i + 1, .ns = 1, .created_ms = now,
                         .expires_ms = now + 3600000, .question = "q", .vec = v, .dim = dim,
                         .response = (char *)resp, .response_len = sizeof resp - 1};
        if (cache_store_put(s, &e, now, &err) != 0) {
            fprintf(stderr, "bench_faiss: put: %s\n", err.msg);
            return 1;
        }
    }
    /* The first search moves the last queued vectors into the index (and trains IVF). */
    stored_vec(q, dim, 0);
    int got = cache_store_search(s, 1, q, -1.0f, k, now, out, sims, &err);
    for (int j = 0; j < got; j++)
        cache_entry_release(out[j]);
    double build_s = (double)(util_now_ns() - t0) / 1e9;
    long rss = rss_kib();

    rng r = {42};
    int hits = 0, done = 0;
    uint64_t q0 = util_now_ns();
    for (int i = 0; i < queries; i++) {
        /* A slow row (Flat at 1M) stops after its time budget, with at least 50 queries. */
        if (i >= 50 && (double)(util_now_ns() - q0) / 1e9 > row_s)
            break;
        done++;
        uint64_t src = rng_next(&r) % (uint64_t)n;
        stored_vec(q, dim, src);
        for (int j = 0; j < dim; j++) /* near, not equal: cosine about 0.9 */
            q[j] += 0.5f * rng_gauss(&r) / sqrtf((float)dim);
        normalise(q, dim);
        uint64_t a = util_now_ns();
        got = cache_store_search(s, 1, q, 0.0f, k, now, out, sims, &err);
        lat[i] = util_now_ns() - a;
        if (got < 0) {
            fprintf(stderr, "bench_faiss: search: %s\n", err.msg);
            return 1;
        }
        hits += got > 0 && out[0]->id == src + 1;
        for (int j = 0; j < got; j++)
            cache_entry_release(out[j]);
    }
    queries = done;
    qsort(lat, (size_t)queries, sizeof *lat, cmp_u64);
    cache_store_stats st;
    cache_store_get_stats(s, &st);
    printf("| %-34s | %9ld | %7d | %9.3f | %9.3f | %9.3f | %8.1f | %8.0f | %7.1f%% |\n", factory, n,
           queries,
           (double)lat[queries / 2] / 1e6, (double)lat[(size_t)queries * 99 / 100] / 1e6,
           (double)lat[queries - 1] / 1e6, build_s, (double)(rss - rss0) / 1024.0,
           100.0 * hits / queries);
    fflush(stdout);
    cache_store_free(s);
    free(v);
    free(q);
    free(out);
    free(sims);
    free(lat);
    return 0;
}

/* The "@param=v1,v2" rows: the factory's index alone, trained on a sample, one row per value. */
static int run_index(const char *factory, const char *param, const char *values, long n, int dim,
                     int queries, int k, double row_s, long train_max)
{
    enum { CHUNK = 16384 };
    cache_index *ix = NULL;
    util_err err = {0};
    long rss0 = rss_kib();
    if (cache_index_new(&ix, dim, factory, &err) != 0) {
        fprintf(stderr, "bench_faiss: %s\n", err.msg);
        return 1;
    }
    float *x = malloc((size_t)CHUNK * (size_t)dim * sizeof *x);
    float *q = malloc((size_t)dim * sizeof *q);
    int64_t *ids = malloc((size_t)CHUNK * sizeof *ids), *out = malloc((size_t)k * sizeof *out);
    float *scores = malloc((size_t)k * sizeof *scores);
    uint64_t *lat = malloc((size_t)queries * sizeof *lat);
    uint64_t t0 = util_now_ns();
    if (!cache_index_is_trained(ix)) {
        const char *p = strstr(factory, "IVF");
        long nlist = p ? atol(p + 3) : 256, t = 39 * (nlist > 0 ? nlist : 256);
        if (t > n)
            t = n;
        if (train_max > 0 && t > train_max)
            t = train_max;
        float *tx = malloc((size_t)t * (size_t)dim * sizeof *tx);
        for (long i = 0; i < t; i++)
            stored_vec(tx + (size_t)i * (size_t)dim, dim, (uint64_t)i);
        if (cache_index_train(ix, (size_t)t, tx, &err) != 0) {
            fprintf(stderr, "bench_faiss: train: %s\n", err.msg);
            return 1;
        }
        free(tx);
    }
    for (long i0 = 0; i0 < n; i0 += CHUNK) {
        long m = n - i0 < CHUNK ? n - i0 : CHUNK;
        for (long i = 0; i < m; i++) {
            stored_vec(x + (size_t)i * (size_t)dim, dim, (uint64_t)(i0 + i));
            ids[i] = i0 + i + 1;
        }
        if (cache_index_add_n(ix, (size_t)m, ids, x, &err) != 0) {
            fprintf(stderr, "bench_faiss: add: %s\n", err.msg);
            return 1;
        }
    }
    double build_s = (double)(util_now_ns() - t0) / 1e9;
    long rss = rss_kib();

    char *vlist = strdup(values);
    for (char *save = NULL, *v = strtok_r(vlist, ",", &save); v; v = strtok_r(NULL, ",", &save)) {
        if (cache_index_set_param(ix, param, atof(v), &err) != 0) {
            fprintf(stderr, "bench_faiss: %s\n", err.msg);
            return 1;
        }
        rng r = {42};
        int hits = 0, done = 0;
        uint64_t q0 = util_now_ns();
        for (int i = 0; i < queries; i++) {
            if (i >= 50 && (double)(util_now_ns() - q0) / 1e9 > row_s)
                break;
            done++;
            uint64_t src = rng_next(&r) % (uint64_t)n;
            stored_vec(q, dim, src);
            for (int j = 0; j < dim; j++)
                q[j] += 0.5f * rng_gauss(&r) / sqrtf((float)dim);
            normalise(q, dim);
            int got = 0;
            uint64_t a = util_now_ns();
            int rc = cache_index_search(ix, q, k, out, scores, &got, &err);
            lat[i] = util_now_ns() - a;
            if (rc != 0) {
                fprintf(stderr, "bench_faiss: search: %s\n", err.msg);
                return 1;
            }
            hits += got > 0 && out[0] == (int64_t)src + 1;
        }
        qsort(lat, (size_t)done, sizeof *lat, cmp_u64);
        char label[160];
        snprintf(label, sizeof label, "%s %s=%s", factory, param, v);
        printf("| %-34s | %9ld | %7d | %9.3f | %9.3f | %9.3f | %8.1f | %8.0f | %7.1f%% |\n", label,
               n, done, (double)lat[done / 2] / 1e6, (double)lat[(size_t)done * 99 / 100] / 1e6,
               (double)lat[done - 1] / 1e6, build_s, (double)(rss - rss0) / 1024.0,
               100.0 * hits / done);
        fflush(stdout);
    }
    free(vlist);
    cache_index_free(ix);
    free(x);
    free(q);
    free(ids);
    free(out);
    free(scores);
    free(lat);
    return 0;
}

int main(int argc, char **argv)
{
    const char *sizes = "10000,100000,1000000";
    const char *indexes = "IDMap2,Flat;IDMap2,IVF1024,Flat;IDMap2,IVF4096,Flat@nprobe=8,16,20,32;"
                          "IDMap2,HNSW32@efSearch=32,64";
    long max = 0, hnsw_max = 20000, train_max = 65536;
    double row_s = 20;
    int queries = 2000, dim = 384, k = 4;
    for (int i = 1; i < argc; i += 2) {  /* --option value pairs */
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (val == NULL) {
            fprintf(stderr, "bench_faiss: %s needs a value\n", a);
            return 2;
        }
        if (strcmp(a, "--sizes") == 0)
            sizes = val;
        else if (strcmp(a, "--max") == 0)
            max = atol(val);
        else if (strcmp(a, "--hnsw-max") == 0)
            hnsw_max = atol(val);
        else if (strcmp(a, "--train-max") == 0)
            train_max = atol(val);
        else if (strcmp(a, "--row-seconds") == 0)
            row_s = atof(val);
        else if (strcmp(a, "--queries") == 0)
            queries = atoi(val);
        else if (strcmp(a, "--dim") == 0)
            dim = atoi(val);
        else if (strcmp(a, "--k") == 0)
            k = atoi(val);
        else if (strcmp(a, "--index") == 0)
            indexes = val;
        else {
            fprintf(stderr, "bench_faiss: unknown option %s\n", a);
            return 2;
        }
    }
    if (queries < 1 || dim < 1 || k < 1) {
        fprintf(stderr, "bench_faiss: --queries, --dim and --k must be positive\n");
        return 2;
    }
    printf("dim %d, k %d, %d queries per row (one thread); build = puts + index adds + training;"
           " mem = RSS growth\n\n", dim, k, queries);
    printf("| %-34s | %9s | %7s | %9s | %9s | %9s | %8s | %8s | %8s |\n", "index", "entries",
           "queries", "p50 ms",
           "p99 ms", "max ms", "build s", "mem MiB", "recall@1");
    printf("|------------------------------------|-----------|---------|-----------|-----------|"
           "-----------|"
           "----------|----------|----------|\n");
    char *ilist = strdup(indexes);
    for (char *save_i = NULL, *f = strtok_r(ilist, ";", &save_i); f;
         f = strtok_r(NULL, ";", &save_i)) {
        char *slist = strdup(sizes);
        for (char *save_s = NULL, *n = strtok_r(slist, ",", &save_s); n;
             n = strtok_r(NULL, ",", &save_s)) {
            long count = atol(n);
            if (count <= 0 || (max > 0 && count > max))
                continue;
            if (strstr(f, "HNSW") != NULL && hnsw_max > 0 && count > hnsw_max) {
                printf("| %-34s | %9ld | skipped: HNSW builds take 1-5 ms per vector here "
                       "(--hnsw-max) |\n", f, count);
                continue;
            }
            /* "factory@param=v1,v2": the index alone, one row per parameter value. */
            char *at = strchr(f, '@'), *eq = at ? strchr(at, '=') : NULL;
            if (at != NULL && eq == NULL) {
                fprintf(stderr, "bench_faiss: %s: want factory@param=v1,v2\n", f);
                return 2;
            }
            /* The store searches an IVF namespace flat until it holds 39 * nlist vectors. */
            const char *ivf = strstr(f, "IVF");
            if (at != NULL && ivf != NULL && count < 39 * atol(ivf + 3)) {
                printf("| %-34s | %9ld | skipped: fewer than 39 * nlist vectors (the store "
                       "searches these flat) |\n", f, count);
                continue;
            }
            int rc;
            if (at != NULL) {
                char *fac = strndup(f, (size_t)(at - f));
                char *param = strndup(at + 1, (size_t)(eq - at - 1));
                rc = run_index(fac, param, eq + 1, count, dim, queries, k, row_s, train_max);
                free(fac);
                free(param);
            } else {
                rc = run(f, count, dim, queries, k, row_s);
            }
            if (rc != 0)
                return 1;
        }
        free(slist);
    }
    free(ilist);
    return 0;
}
