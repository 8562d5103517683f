/* cache/store.h: the local semantic-cache store: entries with TTL and an LRU memory budget, an
 * exact (ns, hash) map, and one FAISS index per namespace so that a semantic search can never
 * return an entry of another namespace. Thread-safe: one internal mutex; searches may run on
 * the encoder's worker thread while the event loop inserts.
 *
 * Index types come from a FAISS factory string (cfg.index): "IDMap2,Flat" (default; exact
 * deletes), "IDMap2,HNSW32" (FAISS cannot delete from HNSW: removed ids become tombstones that
 * searches skip, and the namespace's index is rebuilt from the live entries once tombstones pass
 * cfg.rebuild_ratio of it), or an IVF string such as "IDMap2,IVF256,Flat" (trained on the
 * namespace's first vectors once it holds enough of them; until then searched flat).
 * Times are wall-clock milliseconds passed in by the caller. */
#ifndef LLMGW_CACHE_STORE_H
#define LLMGW_CACHE_STORE_H

#include "cache/entry.h"
#include "common/err.h"

#include <stdint.h>

typedef struct cache_store cache_store;

typedef struct cache_store_cfg {
    int dim;               /* embedding width, e.g. 384 */
    const char *index;     /* FAISS factory string; NULL = "IDMap2,Flat" */
    size_t max_bytes;      /* memory budget: entries + vectors + index estimate; LRU evicts */
    double rebuild_ratio;  /* tombstone share that triggers a rebuild; 0 = 0.25 */
} cache_store_cfg;

typedef struct cache_store_stats {
    size_t entries;
    size_t bytes;
    size_t namespaces;
    uint64_t insertions;
    uint64_t evictions;    /* LRU, over the memory budget */
    uint64_t expirations;  /* TTL */
    uint64_t removals;     /* cache_store_remove */
    uint64_t rebuilds;     /* index rebuilds (tombstones, IVF training) */
} cache_store_stats;

int  cache_store_new(cache_store **out, const cache_store_cfg *cfg, util_err *err);
void cache_store_free(cache_store *s);  /* NULL is a no-op; waits for no one: release first */

/* Stores a copy of e (e->dim must equal cfg.dim when e->vec is set). An entry with the same id
 * is left as is (returns 0: replicas announce the same entry more than once); one with the same
 * nonzero (ns, exact) is replaced. Evicts least recently used entries until within max_bytes;
 * an entry larger than the whole budget is refused with LLMGW_ERANGE. An already expired entry
 * is not stored (returns 0). */
int  cache_store_put(cache_store *s, const cache_entry *e, int64_t now_ms, util_err *err);

/* The live entry with this (ns, exact), marked recently used, or NULL. Release it. */
const cache_entry *cache_store_get_exact(cache_store *s, uint64_t ns, uint64_t exact,
                                         int64_t now_ms);
/* The live entry with this id (not marked used), or NULL. Release it. */
const cache_entry *cache_store_get(cache_store *s, uint64_t id, int64_t now_ms);

/* Up to k live entries of namespace ns whose cosine similarity to vec (L2-normalised) is at least
 * min_sim, best first, into out[] (references: release each) and sims[]; returns how many (0 when
 * the namespace is empty), or an LLMGW_E* code with err set. Marks nothing used. */
int  cache_store_search(cache_store *s, uint64_t ns, const float *vec, float min_sim, int k,
                        int64_t now_ms, const cache_entry **out, float *sims, util_err *err);

/* Marks the entry recently used (the caller served it). No-op when gone. */
void cache_store_touch(cache_store *s, uint64_t id);

/* Removes the entry (and its vector); LLMGW_ENOTFOUND when absent. */
int  cache_store_remove(cache_store *s, uint64_t id);

/* Removes every entry whose expires_ms <= now_ms; returns how many. */
size_t cache_store_expire(cache_store *s, int64_t now_ms);

void cache_store_get_stats(cache_store *s, cache_store_stats *out);

/* Drops a reference from get/get_exact/search. NULL is a no-op. Thread-safe. */
void cache_entry_release(const cache_entry *e);

#endif
