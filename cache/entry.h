/* cache/entry.h: one cached answer, as the local store keeps it and as Redis carries it between
 * replicas. An entry is immutable once stored; the store hands out counted references. */
#ifndef LLMGW_CACHE_ENTRY_H
#define LLMGW_CACHE_ENTRY_H

#include <stddef.h>
#include <stdint.h>

typedef struct cache_entry {
    uint64_t id;          /* unique across replicas: random, nonzero, < 2^63 (a FAISS id) */
    uint64_t ns;          /* namespace: tenant x model x context hash x sampling bucket */
    uint64_t exact;       /* hash of the normalised request inside ns; 0 = none */
    int64_t created_ms;   /* wall clock, ms since the epoch (shared across replicas) */
    int64_t expires_ms;   /* wall clock; the entry is dead from this instant on */
    char *question;       /* the embedded text (last user turn), NUL-terminated; may be "" */
    float *vec;           /* dim floats, L2-normalised; NULL = exact lookups only */
    int dim;
    uint8_t *tok;         /* the question's token vectors for the verifier (cache/verifier.h:
                             cache_tokens_pack); NULL = none (then a semantic hit cannot be
                             verified) */
    size_t tok_len;
    char *response;       /* the stored answer (a chat.completion JSON object) */
    size_t response_len;
} cache_entry;

#endif
