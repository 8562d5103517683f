/* gateway/auth.c: bearer-key lookup (constant-time per key) and token buckets. */
#include "gateway/auth.h"

#include "common/arena.h"

#include <openssl/crypto.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

struct gw_auth {
    const gw_config *cfg;
    gw_bucket *buckets;  /* [cfg->n_keys] */
    size_t *key_len;     /* [cfg->n_keys] */
};

void gw_bucket_init(gw_bucket *b, double rate, double burst, uint64_t now_ns)
{
    b->rate = rate;
    b->burst = burst < 1 ? 1 : burst;
    b->tokens = b->burst;
    b->last_ns = now_ns;
}

uint64_t gw_bucket_take(gw_bucket *b, uint64_t now_ns)
{
    if (b->rate <= 0)
        return 0;
    if (now_ns > b->last_ns) {
        b->tokens += (double)(now_ns - b->last_ns) * 1e-9 * b->rate;
        if (b->tokens > b->burst)
            b->tokens = b->burst;
        b->last_ns = now_ns;
    }
    if (b->tokens >= 1.0) {
        b->tokens -= 1.0;
        return 0;
    }
    double wait_s = (1.0 - b->tokens) / b->rate;
    uint64_t wait = (uint64_t)(wait_s * 1e9);
    return wait ? wait : 1;
}

gw_auth *gw_auth_new(const gw_config *cfg, uint64_t now_ns)
{
    gw_auth *a = util_xcalloc(1, sizeof *a);
    a->cfg = cfg;
    a->buckets = util_xcalloc(cfg->n_keys, sizeof *a->buckets);
    a->key_len = util_xcalloc(cfg->n_keys, sizeof *a->key_len);
    for (size_t i = 0; i < cfg->n_keys; i++) {
        gw_bucket_init(&a->buckets[i], cfg->keys[i].rate, cfg->keys[i].burst, now_ns);
        a->key_len[i] = strlen(cfg->keys[i].key);
    }
    return a;
}

void gw_auth_free(gw_auth *a)
{
    if (a == NULL)
        return;
    free(a->buckets);
    free(a->key_len);
    free(a);
}

int gw_auth_disabled(const gw_auth *a)
{
    return a->cfg->n_keys == 0;
}

void gw_auth_check(gw_auth *a, const char *authorization, uint64_t now_ns, gw_auth_result *out)
{
    memset(out, 0, sizeof *out);
    out->key_index = -1;
    if (gw_auth_disabled(a)) {
        out->group = "anonymous";
        return;
    }
    if (authorization == NULL || strncasecmp(authorization, "Bearer ", 7) != 0) {
        out->status = GW_AUTH_MISSING;
        return;
    }
    const char *key = authorization + 7;
    while (*key == ' ')
        key++;
    size_t len = strlen(key);
    while (len > 0 && (key[len - 1] == ' ' || key[len - 1] == '\t'))
        len--;
    int found = -1;
    /* Compare against every key of the same length in constant time, without an early exit. */
    for (size_t i = 0; i < a->cfg->n_keys; i++)
        if (a->key_len[i] == len && CRYPTO_memcmp(a->cfg->keys[i].key, key, len) == 0)
            found = (int)i;
    if (found < 0) {
        out->status = GW_AUTH_INVALID;
        return;
    }
    out->key_index = found;
    out->group = a->cfg->keys[found].group;
    uint64_t wait = gw_bucket_take(&a->buckets[found], now_ns);
    if (wait != 0) {
        out->status = GW_AUTH_LIMITED;
        out->retry_after_ns = wait;
    }
}
