/* tests/fuzz/fuzz_cache_verifier.c: the cache verifier's two inputs from outside — the token
 * blobs another replica sends through Redis, and the weights file — on arbitrary bytes.
 * The first byte picks which. Blobs: the rest is cut into two blobs and two texts; a blob that
 * cache_tokens_check accepts is scored without a fault and gives finite features, one it refuses
 * makes cache_verifier_features refuse too. Weights: the rest is written to a file and loaded; a
 * file that loads gives a probability in [0, 1] for any features and thresholds in [0, 1], one
 * that does not names the file in its message. (Seeds: tests/fuzz/corpus/cache_verifier/.) */
#include "cache/verifier.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CHECK(c) ((c) ? (void)0 : abort())
#define DIM 8

static void blobs(const uint8_t *d, size_t n)
{
    if (n < 3)
        return;
    size_t la = d[0] % (n - 2), lb = d[1] % (n - 2 - la + 1);
    d += 2;
    n -= 2;
    const uint8_t *a = d, *b = d + la;
    const char *text = (const char *)(b + lb);
    size_t tl = n - la - lb, ta = tl / 2;
    float va[DIM] = {1, 0}, vb[DIM] = {0.6f, 0.8f};
    cache_verifier_side sa = {text, ta, va, a, la}, sb = {text + ta, tl - ta, vb, b, lb};
    float f[CACHE_VERIFIER_FEATURES];
    int ok = cache_tokens_check(a, la, DIM) >= 0 && cache_tokens_check(b, lb, DIM) >= 0;
    int rc = cache_verifier_features(&sa, &sb, DIM, f);
    CHECK(ok ? rc == 0 : rc != 0);
    for (int i = 0; ok && i < CACHE_VERIFIER_FEATURES; i++)
        CHECK(isfinite(f[i]));
}

static char path[64];

__attribute__((destructor)) static void remove_file(void)
{
    if (path[0] != '\0')
        unlink(path);
}

static void weights(const uint8_t *d, size_t n)
{
    if (path[0] == '\0')
        snprintf(path, sizeof path, "/tmp/fuzz-verifier-%d.weights", (int)getpid());
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    fwrite(d, 1, n, f);
    fclose(f);
    cache_verifier *v = NULL;
    util_err err = {0};
    if (cache_verifier_load(&v, path, &err) != 0) {
        CHECK(v == NULL);
        CHECK(strstr(err.msg, path) != NULL);
        return;
    }
    float x[CACHE_VERIFIER_FEATURES];
    for (int i = 0; i < CACHE_VERIFIER_FEATURES; i++)
        x[i] = (float)(n % 7) - 3;
    double p = cache_verifier_prob(v, x);
    CHECK(p >= 0 && p <= 1);
    double t = cache_verifier_threshold(v, 0.01, NULL);
    CHECK(t >= 0 && t <= 1);
    cache_verifier_free(v);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    if (data[0] & 1)
        weights(data + 1, size - 1);
    else
        blobs(data + 1, size - 1);
    return 0;
}
