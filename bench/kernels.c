/* bench/kernels.c: bench_kernels — matmul throughput of the CPU backend for every weight type at
 * the SmolLM2-135M shapes (576x576, 1536x576, 576x1536, 49152x576 as rows x cols), one token
 * (decode) and 128 tokens (prefill), 1 and 2 threads, under this machine's roofline
 * (kernels/roofline.h: FMA peak and streaming-read bandwidth). Decode matrices are cycled
 * through copies totalling more than the last-level cache, so weights come from memory as they
 * do in a real forward.
 *
 *   bench_kernels [--types Q4_1,Q8_0,...] [--threads 1,2] [--tok 1,128] [--reps N] [--csv]
 *
 * Times are the best of --reps runs (other processes share the cores); GB/s counts weight bytes
 * only, GMAC/s multiply-adds. */
#include "common/threadpool.h"
#include "kernels/backend.h"
#include "kernels/convert.h"
#include "kernels/roofline.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- pool dispatch --------------------------------------------------------------------------- */

typedef struct meet {
    _Atomic int arrived;
} meet;

/* Every part waits for all the others (bounded, so a stolen part cannot hang): the run then
 * measures how long it takes for every worker to pick up its part, plus the join. */
static void meet_part(void *arg, int ith, int nth)
{
    (void)ith;
    meet *m = arg;
    atomic_fetch_add(&m->arrived, 1);
    double t0 = now();
    while (atomic_load(&m->arrived) < nth && now() - t0 < 1e-3)
        ;
}

/* Mean cost of one util_pool_run + join where every thread must take part, back to back (as a
 * decode step's hundreds of runs are). */
static double dispatch_us(int threads, int reps)
{
    util_pool *p;
    if (util_pool_new(&p, threads) != 0)
        return 0;
    double best = 1e9;
    for (int r = 0; r < reps; r++) {
        enum { RUNS = 20000 };
        double t = now();
        for (int i = 0; i < RUNS; i++) {
            meet m = {0};
            util_pool_run(p, meet_part, &m);
        }
        t = (now() - t) / RUNS;
        best = t < best ? t : best;
    }
    util_pool_free(p);
    return best * 1e6;
}

/* ---- matmul ---------------------------------------------------------------------------------- */

static const struct { const char *name; uint32_t id; } type_names[] = {
    {"Q4_1", 3}, {"Q8_0", 8}, {"Q4_0", 2}, {"Q4_K", 12}, {"Q6_K", 14},
    {"F16", 1},  {"BF16", 30}, {"F32", 0},
};

static const struct { int64_t rows, cols; const char *what; } shapes[] = {
    {576, 576, "attn q/o"}, {1536, 576, "ffn gate/up"}, {576, 1536, "ffn down"},
    {49152, 576, "output"},
};

static uint64_t rng = 88172645463325252ull;

static float frand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)(rng >> 40) / (float)(1 << 24) * 2.0f - 1.0f;
}

typedef struct result {
    double us, gbs, gmacs;
} result;

static result bench_one(kern_backend *be, uint32_t type, int64_t rows, int64_t cols,
                        int n_tok, int reps)
{
    size_t rb = kern_type_row_bytes(type, (uint64_t)cols), mbytes = rb * (size_t)rows;
    /* Enough copies to overflow a 32 MB last-level cache twice, for decode and the few tokens of
     * a draft's verification (a forward reads every weight from memory); prefill reads each
     * weight once per 128 tokens, where caching matters little, so one copy. */
    int copies = n_tok <= 16 ? (int)((96u << 20) / mbytes + 1) : 1;
    uint8_t *w = aligned_alloc(64, (mbytes * (size_t)copies + 63) / 64 * 64);
    float *row = malloc((size_t)cols * sizeof *row);
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t i = 0; i < cols; i++)
            row[i] = frand() * 0.05f;
        kern_type_from_f32(type, row, w + (size_t)r * rb, cols);
    }
    for (int c = 1; c < copies; c++)
        memcpy(w + (size_t)c * mbytes, w, mbytes);
    float *x = malloc((size_t)n_tok * (size_t)cols * sizeof *x);
    float *y = malloc((size_t)n_tok * (size_t)rows * sizeof *y);
    for (int64_t i = 0; i < (int64_t)n_tok * cols; i++)
        x[i] = frand();
    /* Each timed sample covers at least ~20 ms of calls, cycling through the copies. */
    int calls = 1;
    double best = 1e9;
    for (int r = 0; r < reps + 1; r++) {
        double t0 = now();
        for (int k = 0; k < calls; k++) {
            kern_tensor wt = {.type = type, .rows = rows, .cols = cols, .row_bytes = rb,
                              .data = w + (size_t)(k % copies) * mbytes};
            be->matmul(be->ctx, &wt, x, n_tok, y, rows);
        }
        double per = (now() - t0) / calls;
        if (r == 0) {   /* warm-up run: size the sample */
            calls = (int)(0.02 / per) + 1;
            continue;
        }
        best = per < best ? per : best;
    }
    free(w);
    free(row);
    free(x);
    free(y);
    return (result){best * 1e6, (double)mbytes / best * 1e-9,
                    (double)rows * (double)cols * n_tok / best * 1e-9};
}

static int parse_list(const char *s, int *out, int max)
{
    int n = 0;
    while (*s && n < max) {
        out[n++] = atoi(s);
        const char *c = strchr(s, ',');
        if (c == NULL)
            break;
        s = c + 1;
    }
    return n;
}

int main(int argc, char **argv)
{
    const char *types = "Q4_1,Q8_0,Q4_0,Q4_K,Q6_K,F16,BF16,F32";
    int threads[4] = {1, 2}, n_threads = 2, toks[8] = {1, 128}, n_toks = 2, reps = 5;
    bool csv = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--types") && v) { types = v; i++; }
        else if (!strcmp(a, "--threads") && v) { n_threads = parse_list(v, threads, 4); i++; }
        else if (!strcmp(a, "--tok") && v) { n_toks = parse_list(v, toks, 8); i++; }
        else if (!strcmp(a, "--reps") && v) { reps = atoi(v); i++; }
        else if (!strcmp(a, "--csv")) csv = true;
        else {
            fprintf(stderr, "usage: bench_kernels [--types Q4_1,...] [--threads 1,2] "
                            "[--tok 1,128] [--reps N] [--csv]\n");
            return 2;
        }
    }
    kern_backend *probe = kern_cpu_backend_new(1);
    printf("kernels variant: %s\n", probe != NULL ? probe->kernels(probe->ctx) : "?");
    kern_backend_free(probe);
    kern_roofline roof[4];
    int n_roof = 0;
    for (int k = 0; k < n_threads; k++)
        if (kern_roofline_measure(&roof[n_roof], threads[k]) == 0)
            n_roof++;
    kern_roofline_print(stdout, roof, n_roof);
    for (int k = 0; k < n_threads; k++)
        if (threads[k] > 1)
            printf("pool dispatch + join, %d threads: %.2f us\n", threads[k],
                   dispatch_us(threads[k], reps));
    if (csv)
        printf("type,rows,cols,threads,n_tok,us,GBps,GMACps\n");
    else
        printf("\n| type | rows x cols | what | threads | n_tok | us/call | GB/s | GMAC/s |\n"
               "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |\n");
    for (size_t ti = 0; ti < sizeof type_names / sizeof type_names[0]; ti++) {
        const char *hit = strstr(types, type_names[ti].name);
        size_t len = strlen(type_names[ti].name);
        if (hit == NULL || (hit[len] != ',' && hit[len] != '\0') ||
            (hit != types && hit[-1] != ','))
            continue;
        const uint32_t t = type_names[ti].id;
        for (int k = 0; k < n_threads; k++) {
            kern_backend *be = kern_cpu_backend_new(threads[k]);
            if (be == NULL || be->reserve(be->ctx, 128, 1536, 16) != 0)
                return 1;
            for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
                for (int q = 0; q < n_toks; q++) {
                    result r = bench_one(be, t, shapes[s].rows, shapes[s].cols, toks[q], reps);
                    if (csv)
                        printf("%s,%lld,%lld,%d,%d,%.1f,%.2f,%.2f\n", kern_type_name(t),
                               (long long)shapes[s].rows, (long long)shapes[s].cols, threads[k],
                               toks[q], r.us, r.gbs, r.gmacs);
                    else
                        printf("| %s | %lldx%lld | %s | %d | %d | %.1f | %.2f | %.1f |\n",
                               kern_type_name(t), (long long)shapes[s].rows, (long long)shapes[s].cols,
                               shapes[s].what, threads[k], toks[q], r.us, r.gbs, r.gmacs);
                    fflush(stdout);
                }
            kern_backend_free(be);
        }
    }
    return 0;
}
