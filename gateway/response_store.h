/* gateway/response_store.h: the Responses API's stored responses (store: true, the default),
 * kept in this gateway's memory for GET/DELETE /v1/responses/{id} and previous_response_id
 * chaining. Each entry belongs to a tenant (the API key's group): another tenant neither sees
 * nor deletes it. Bounded: at most GW_RSTORE_MAX entries and GW_RSTORE_MAX_BYTES bytes; the
 * least recently used go first. An entry holds the response object (JSON text) and the
 * conversation that led to it, with the answer, as Chat Completions messages (JSON text of
 * an array), which a chained request continues. Loop thread only. */
#ifndef LLMGW_GATEWAY_RESPONSE_STORE_H
#define LLMGW_GATEWAY_RESPONSE_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define GW_RSTORE_MAX 10000
#define GW_RSTORE_MAX_BYTES (64u << 20)

typedef struct gw_rstore gw_rstore;

gw_rstore *gw_rstore_new(void);
void gw_rstore_free(gw_rstore *s);   /* NULL is a no-op */

/* Copies the strings; an id stored before is replaced. */
void gw_rstore_put(gw_rstore *s, const char *tenant, const char *id, const char *response,
                   const char *messages);
/* The entry's strings (valid until the next put or delete), or false when there is none for
 * this tenant. */
bool gw_rstore_get(gw_rstore *s, const char *tenant, const char *id, const char **response,
                   const char **messages);
bool gw_rstore_delete(gw_rstore *s, const char *tenant, const char *id);

typedef struct gw_rstore_stats {
    size_t entries, bytes;
    uint64_t evicted;
} gw_rstore_stats;
void gw_rstore_stats_get(const gw_rstore *s, gw_rstore_stats *out);

#endif
