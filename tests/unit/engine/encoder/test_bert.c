/* tests/unit/engine/encoder/test_bert.c: the sentence encoder (engine/encoder/bert.h,
 * bert_forward.h; its file format and tokenizer have their own tests in the format and text
 * wings):
 *   - the real all-MiniLM-L6-v2 ($LLMGW_MODELS, default <repo>/models; the tests fail without
 *     it): token ids identical to sentence-transformers for every text of
 *     tests/golden/minilm_embeddings.json, cosine >= 0.9999 with its embeddings, a batch equal
 *     to one-at-a-time results, 1 and 2 threads alike. */
#include "engine/encoder/bert_forward.h"
#include "kernels/device.h"

#include "tests/unit/unit.h"

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static char g_tmp[256];   /* an empty directory: a model dir with nothing in it */

/* ---- the real model against sentence-transformers ---- */

static eng_bert *g_bert, *g_bert_f32;  /* precision AUTO (BF16 where the CPU has it), F32 */
static char g_model_dir[4096];

typedef struct golden {
    int n, dim;
    char **text;
    size_t *len;
    int32_t **ids;
    int *n_ids;
    float *emb;  /* [n][dim] */
} golden;
static golden g_gold;

static size_t b64_decode(const char *s, char *out)
{
    static const char A[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    uint32_t acc = 0;
    int bits = 0;
    size_t n = 0;
    for (; *s && *s != '='; s++) {
        const char *p = strchr(A, *s);
        assert_non_null(p);
        acc = acc << 6 | (uint32_t)(p - A);
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out[n++] = (char)(acc >> bits & 0xff);
        }
    }
    return n;
}

static char *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return NULL;
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)sz + 1);
    *n = fread(buf, 1, (size_t)sz, f);
    buf[*n] = '\0';
    fclose(f);
    return buf;
}

static int load_golden(void)
{
    size_t n_json = 0, n_bin = 0;
    char *json = slurp(LLMGW_SOURCE_DIR "/tests/golden/minilm_embeddings.json", &n_json);
    char *bin = slurp(LLMGW_SOURCE_DIR "/tests/golden/minilm_embeddings.bin", &n_bin);
    cJSON *doc = json ? cJSON_Parse(json) : NULL;
    free(json);
    if (doc == NULL || bin == NULL) {
        fprintf(stderr, "test_bert: cannot read tests/golden/minilm_embeddings.{json,bin}\n");
        return -1;
    }
    const cJSON *texts = cJSON_GetObjectItem(doc, "texts");
    golden *g = &g_gold;
    g->n = cJSON_GetArraySize(texts);
    g->dim = cJSON_GetObjectItem(doc, "dim")->valueint;
    if (n_bin != (size_t)g->n * g->dim * sizeof(float)) {
        fprintf(stderr, "test_bert: minilm_embeddings.bin has the wrong size\n");
        return -1;
    }
    g->emb = (float *)bin;
    g->text = calloc((size_t)g->n, sizeof *g->text);
    g->len = calloc((size_t)g->n, sizeof *g->len);
    g->ids = calloc((size_t)g->n, sizeof *g->ids);
    g->n_ids = calloc((size_t)g->n, sizeof *g->n_ids);
    int i = 0;
    for (const cJSON *t = texts->child; t != NULL; t = t->next, i++) {
        const char *b64 = cJSON_GetObjectItem(t, "b64")->valuestring;
        g->text[i] = malloc(strlen(b64) + 1);
        g->len[i] = b64_decode(b64, g->text[i]);
        const cJSON *ids = cJSON_GetObjectItem(t, "ids");
        g->n_ids[i] = cJSON_GetArraySize(ids);
        g->ids[i] = calloc((size_t)g->n_ids[i], sizeof(int32_t));
        int k = 0;
        for (const cJSON *id = ids->child; id != NULL; id = id->next)
            g->ids[i][k++] = id->valueint;
    }
    cJSON_Delete(doc);
    return 0;
}

/* LLMGW_TEST_DEVICE=cuda (ctest engine/bert_cuda): the model on that device; =shadow
 * (engine/bert_shadow): on the CPU under a device's memory discipline (kernels/shadow.h). */
static const char *test_device(void)
{
    const char *d = getenv("LLMGW_TEST_DEVICE");
    return d != NULL && d[0] != '\0' ? d : NULL;
}

static int setup(void **state)
{
    (void)state;
    char tmpl[] = "/tmp/llmgw-test-bert-XXXXXX";
    if (mkdtemp(tmpl) == NULL)
        return -1;
    snprintf(g_tmp, sizeof g_tmp, "%s", tmpl);
    const char *dir = getenv("LLMGW_MODELS");
    snprintf(g_model_dir, sizeof g_model_dir, "%s/all-MiniLM-L6-v2",
             dir ? dir : LLMGW_SOURCE_DIR "/models");
    util_err err = {0};
    if (eng_bert_load(&g_bert, g_model_dir, test_device(), ENG_BERT_AUTO, &err) != 0 ||
        eng_bert_load(&g_bert_f32, g_model_dir, test_device(), ENG_BERT_F32, &err) != 0) {
        fprintf(stderr, "test_bert: FAILED to load the model (scripts/fetch-models fetches it; "
                        "$LLMGW_MODELS overrides the folder): %s\n", err.msg);
        return -1;
    }
    return load_golden();
}

static int teardown(void **state)
{
    (void)state;
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_tmp);
    if (g_tmp[0] != '\0' && system(cmd) != 0)
        fprintf(stderr, "test_bert: could not remove %s\n", g_tmp);
    for (int i = 0; i < g_gold.n; i++) {
        free(g_gold.text[i]);
        free(g_gold.ids[i]);
    }
    free(g_gold.text);
    free(g_gold.len);
    free(g_gold.ids);
    free(g_gold.n_ids);
    free(g_gold.emb);
    eng_bert_free(g_bert);
    eng_bert_free(g_bert_f32);
    return 0;
}

static void model_metadata(void **state)
{
    (void)state;
    assert_int_equal(eng_bert_dim(g_bert), 384);
    assert_int_equal(eng_bert_max_tokens(g_bert), 256);
    assert_int_equal(g_gold.dim, 384);
    assert_true(g_gold.n >= 300);
}

static void golden_token_ids(void **state)
{
    (void)state;
    int32_t ids[512];
    int same = 0, truncated = 0;
    for (int i = 0; i < g_gold.n; i++) {
        int n = eng_bert_tokenize(g_bert, g_gold.text[i], g_gold.len[i], ids, 512);
        bool eq = n == g_gold.n_ids[i] &&
                  memcmp(ids, g_gold.ids[i], (size_t)n * sizeof *ids) == 0;
        if (!eq) {
            int k = 0;
            while (k < n && k < g_gold.n_ids[i] && ids[k] == g_gold.ids[i][k])
                k++;
            print_error("text %d (%zu bytes): %d tokens vs %d, first difference at %d\n", i,
                        g_gold.len[i], n, g_gold.n_ids[i], k);
        }
        same += eq;
        truncated += n == 256;
    }
    printf("[ INFO     ] token ids identical for %d/%d texts (%d truncated at 256)\n", same,
           g_gold.n, truncated);
    assert_int_equal(same, g_gold.n);
    assert_true(truncated >= 3);
}

static double cosine(const float *a, const float *b, int n)
{
    double ab = 0, aa = 0, bb = 0;
    for (int i = 0; i < n; i++) {
        ab += (double)a[i] * b[i];
        aa += (double)a[i] * a[i];
        bb += (double)b[i] * b[i];
    }
    return ab / sqrt(aa * bb);
}

/* Encodes the first n golden texts in batches of `batch` on `threads` threads into
 * out[n][dim]. */
static void encode_n(const eng_bert *m, int n, int batch, int threads, float *out)
{
    eng_bert_ctx *c = NULL;
    util_err err = {0};
    assert_int_equal(eng_bert_ctx_new(&c, m, threads, &err), 0);
    for (int i = 0; i < n; i += batch) {
        int b = n - i < batch ? n - i : batch;
        int ntok[64];
        assert_int_equal(eng_bert_encode(c, (const char *const *)g_gold.text + i, g_gold.len + i,
                                         b, out + (size_t)i * g_gold.dim, ntok, &err), 0);
        for (int k = 0; k < b; k++)
            assert_int_equal(ntok[k], g_gold.n_ids[i + k]);
    }
    eng_bert_ctx_free(c);
}

static void golden_embeddings(void **state)
{
    (void)state;
    /* LLMGW_BERT_TEXTS: only the first n texts (the CUDA simulator's run, which is slow) */
    const char *cap = getenv("LLMGW_BERT_TEXTS");
    int n = cap != NULL && atoi(cap) > 0 && atoi(cap) < g_gold.n ? atoi(cap) : g_gold.n;
    float *out = malloc((size_t)n * g_gold.dim * sizeof *out);
    /* Both precisions; one text at a time (the cache's case) and 32 at a time (for F32, the
     * sgemm path). */
    static const int batches[] = {1, 32};
    for (size_t b = 0; b < 2 * sizeof batches / sizeof batches[0]; b++) {
        const eng_bert *m = b % 2 ? g_bert_f32 : g_bert;
        encode_n(m, n, batches[b / 2], 2, out);
        double min = 1;
        int worst = 0;
        for (int i = 0; i < n; i++) {
            double c = cosine(out + (size_t)i * g_gold.dim, g_gold.emb + (size_t)i * g_gold.dim,
                              g_gold.dim);
            if (c < min) {
                min = c;
                worst = i;
            }
        }
        printf("[ INFO     ] %s, batch %d: cosine vs sentence-transformers over %d texts: "
               "min %.10f (1 - min = %.2g, text %d)\n", eng_bert_precision_name(m),
               batches[b / 2], n, min, 1 - min, worst);
        assert_true(min >= 0.9999);
    }
    free(out);
}

/* The QQP questions and the hand-written texts (not the long ones, to keep the test quick). */
static void batch_equals_single(void **state)
{
    (void)state;
    const size_t D = (size_t)g_gold.dim;
    const int n = 260;
    float *batched = malloc((size_t)n * D * sizeof(float));
    float *single = malloc((size_t)n * D * sizeof(float));
    float *one_thread = malloc((size_t)n * D * sizeof(float));
    for (int p = 0; p < 2; p++) {
        const eng_bert *m = p ? g_bert_f32 : g_bert;
        encode_n(m, n, 64, 2, batched);
        encode_n(m, n, 1, 2, single);
        encode_n(m, n, 17, 1, one_thread);
        double max_diff = 0, max_diff_t = 0;
        for (size_t i = 0; i < (size_t)n * D; i++) {
            max_diff = fmax(max_diff, fabs((double)batched[i] - single[i]));
            max_diff_t = fmax(max_diff_t, fabs((double)one_thread[i] - single[i]));
        }
        printf("[ INFO     ] %s: %d texts, batch of 64 vs one at a time: max |diff| %.3g; 1 vs 2 "
               "threads %.3g\n", eng_bert_precision_name(m), n, max_diff, max_diff_t);
        assert_true(max_diff < 1e-5);
        assert_true(max_diff_t < 1e-5);
    }
    free(batched);
    free(single);
    free(one_thread);
}

/* The token vectors a forward leaves behind: one row per token of each text (ids as the
 * tokenizer gives them), and their mean, normalised, is the pooled embedding. */
static void token_vectors_pool_to_embedding(void **state)
{
    (void)state;
    const int n = 24, D = g_gold.dim;
    eng_bert_ctx *c = NULL;
    util_err err = {0};
    assert_int_equal(eng_bert_ctx_new(&c, g_bert, 2, &err), 0);
    float *out = malloc((size_t)n * D * sizeof *out);
    int ntok[24];
    assert_int_equal(eng_bert_encode(c, (const char *const *)g_gold.text, g_gold.len, n, out, ntok,
                                     &err), 0);
    double worst = 0;
    for (int i = 0; i < n; i++) {
        int k = 0, k2 = 0;
        const float *tv = eng_bert_token_vectors(c, i, &k);
        const int32_t *ids = eng_bert_token_ids(c, i, &k2);
        assert_int_equal(k, ntok[i]);
        assert_int_equal(k2, ntok[i]);
        assert_memory_equal(ids, g_gold.ids[i], (size_t)k * sizeof *ids);
        double mean[384] = {0}, norm = 0;
        for (int t = 0; t < k; t++)
            for (int d = 0; d < D; d++)
                mean[d] += tv[(size_t)t * D + d] / k;
        for (int d = 0; d < D; d++)
            norm += mean[d] * mean[d];
        norm = sqrt(norm);
        for (int d = 0; d < D; d++)
            worst = fmax(worst, fabs(mean[d] / norm - out[(size_t)i * D + d]));
    }
    printf("[ INFO     ] %d texts: pooled token vectors vs the embedding: max |diff| %.3g\n", n,
           worst);
    assert_true(worst < 1e-5);
    free(out);
    eng_bert_ctx_free(c);
}

/* The f32 kernels a ctx picks at startup: the packed kernel (AVX-512 or AVX2 by cpuid; forced
 * here for every batch size) gives a text the same bits in any batch, and agrees with OpenBLAS
 * sgemm (forced for every batch size), a reference no one here wrote. */
static void f32_kernels_packed_vs_sgemm(void **state)
{
    (void)state;
    const size_t D = (size_t)g_gold.dim;
    const int n = 96;
    float *packed64 = malloc((size_t)n * D * sizeof(float));
    float *packed1 = malloc((size_t)n * D * sizeof(float));
    float *sgemm = malloc((size_t)n * D * sizeof(float));
    eng_bert_ctx *c = NULL;
    util_err err = {0};
    assert_int_equal(setenv("LLMGW_BERT_SGEMM", "1", 1), 0);
    assert_int_equal(eng_bert_ctx_new(&c, g_bert_f32, 2, &err), 0);
    printf("[ INFO     ] LLMGW_BERT_SGEMM=1: %s\n", eng_bert_ctx_kernels(c));
    assert_non_null(strstr(eng_bert_ctx_kernels(c), "sgemm at every batch"));
    eng_bert_ctx_free(c);
    encode_n(g_bert_f32, n, 32, 2, sgemm);
    unsetenv("LLMGW_BERT_SGEMM");
    assert_int_equal(setenv("LLMGW_BERT_PACKED", "1", 1), 0);
    assert_int_equal(eng_bert_ctx_new(&c, g_bert_f32, 2, &err), 0);
    const char *k = eng_bert_ctx_kernels(c);
    printf("[ INFO     ] LLMGW_BERT_PACKED=1: %s\n", k);
    bool packed = strstr(k, "packed at every batch") != NULL;
    eng_bert_ctx_free(c);
    encode_n(g_bert_f32, n, 64, 2, packed64);
    encode_n(g_bert_f32, n, 1, 1, packed1);
    unsetenv("LLMGW_BERT_PACKED");
    double max_diff = 0;
    for (size_t i = 0; i < (size_t)n * D; i++)
        max_diff = fmax(max_diff, fabs((double)packed64[i] - sgemm[i]));
    printf("[ INFO     ] f32, %d texts: packed (batch 64) vs sgemm (batch 32): max |diff| %.3g\n",
           n, max_diff);
    assert_true(max_diff < 1e-5);
    if (packed) /* a CPU with a packed kernel: bit for bit, in any batch, on 1 or 2 threads */
        assert_memory_equal(packed64, packed1, (size_t)n * D * sizeof(float));
    /* What the ctx picks without either variable is one of the two, in words. */
    assert_int_equal(eng_bert_ctx_new(&c, g_bert_f32, 1, &err), 0);
    printf("[ INFO     ] chosen at startup: %s\n", eng_bert_ctx_kernels(c));
    assert_non_null(strstr(eng_bert_ctx_kernels(c), "f32 "));
    eng_bert_ctx_free(c);
    free(packed64);
    free(packed1);
    free(sgemm);
}

static void empty_batch_and_bad_dir(void **state)
{
    (void)state;
    eng_bert_ctx *c = NULL;
    util_err err = {0};
    assert_int_equal(eng_bert_ctx_new(&c, g_bert, 1, &err), 0);
    assert_int_equal(eng_bert_encode(c, NULL, NULL, 0, NULL, NULL, &err), 0);
    eng_bert_ctx_free(c);
    eng_bert *m = NULL;
    assert_int_equal(eng_bert_load(&m, g_tmp, NULL, ENG_BERT_AUTO, &err), LLMGW_EIO);
    assert_null(m);
    assert_contains(err.msg, "config.json");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(token_vectors_pool_to_embedding),
        cmocka_unit_test(model_metadata),
        cmocka_unit_test(golden_token_ids),
        cmocka_unit_test(golden_embeddings),
        cmocka_unit_test(batch_equals_single),
        cmocka_unit_test(f32_kernels_packed_vs_sgemm),
        cmocka_unit_test(empty_batch_and_bad_dir),
    };
    if (test_device() == NULL)
        return cmocka_run_group_tests(tests, setup, teardown);
    /* On a device: skipped (ctest's SKIP_RETURN_CODE) where the machine has none. */
    kern_device d;
    if (kern_device_parse(test_device(), &d) == 0 && d.kind == KERN_DEV_CUDA &&
        kern_cuda_devices() == 0) {
        printf("skipped: no CUDA device\n");
        return 77;
    }
    const struct CMUnitTest on_device[] = {
        cmocka_unit_test(token_vectors_pool_to_embedding),
        cmocka_unit_test(golden_embeddings),
    };
    const char *filter = getenv("LLMGW_TEST_FILTER");   /* a cmocka pattern */
    if (filter != NULL && filter[0] != '\0')
        cmocka_set_test_filter(filter);
    return cmocka_run_group_tests(on_device, setup, teardown);
}
