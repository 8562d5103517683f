/* gateway/auth.h: API keys (Authorization: Bearer) mapped to groups (tenants), each key with
 * its own token bucket. Loop thread only; the caller passes the clock so tests can drive it. */
#ifndef LLMGW_GATEWAY_AUTH_H
#define LLMGW_GATEWAY_AUTH_H

#include "gateway/config.h"

#include <stdint.h>

/* A token bucket: `rate` tokens per second up to `burst`; rate 0 means unlimited. */
typedef struct gw_bucket {
    double tokens;
    double rate;
    double burst;
    uint64_t last_ns;
} gw_bucket;

void gw_bucket_init(gw_bucket *b, double rate, double burst, uint64_t now_ns);
/* Takes one token. Returns 0 when allowed, else the nanoseconds until a token is available. */
uint64_t gw_bucket_take(gw_bucket *b, uint64_t now_ns);

typedef enum gw_auth_status {
    GW_AUTH_OK = 0,
    GW_AUTH_MISSING,      /* no or malformed Authorization header */
    GW_AUTH_INVALID,      /* unknown key */
    GW_AUTH_LIMITED,      /* known key over its rate */
} gw_auth_status;

typedef struct gw_auth_result {
    gw_auth_status status;
    const char *group;      /* the key's group ("anonymous" when auth is off); borrowed */
    int key_index;          /* -1 when auth is off */
    uint64_t retry_after_ns;
} gw_auth_result;

typedef struct gw_auth gw_auth;

/* Keeps a reference to cfg's key table (cfg must outlive the gw_auth). */
gw_auth *gw_auth_new(const gw_config *cfg, uint64_t now_ns);
void     gw_auth_free(gw_auth *a);  /* NULL is a no-op */
/* True when the config lists no keys: every request is let through as group "anonymous". */
int      gw_auth_disabled(const gw_auth *a);
void     gw_auth_check(gw_auth *a, const char *authorization, uint64_t now_ns,
                       gw_auth_result *out);

#endif
