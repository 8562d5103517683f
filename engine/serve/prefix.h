/* engine/serve/prefix.h: shared-prefix reuse for one engine instance. Full KV pages of prompts are
 * remembered by a chain hash of every token up to the page's end (K/V at a position depend on
 * all tokens before it), so a later prompt that starts with the same tokens takes those pages
 * (one more reference each) instead of recomputing them. Only full pages are shared and a
 * sequence writes only past its shared pages, so no copy-on-write is needed. The table holds
 * one reference per page; pages nobody else holds are evicted, least recently used first, when
 * the pool runs dry. Scheduler thread only. */
#ifndef LLMGW_ENGINE_PREFIX_H
#define LLMGW_ENGINE_PREFIX_H

#include "engine/serve/kvpool.h"

#include <stddef.h>
#include <stdint.h>

typedef struct eng_prefix eng_prefix;

/* max_pages: the most pages the table remembers (0: none; every call is then a no-op). */
eng_prefix *eng_prefix_new(eng_kvpool *pool, size_t max_pages);
void eng_prefix_free(eng_prefix *px);  /* releases the table's pages; NULL is a no-op */

/* The chain hash of a page holding tokens[0..n) after a prefix whose hash is prev (0 first). */
uint64_t eng_prefix_hash(uint64_t prev, const int32_t *tokens, int n);

/* The page remembered under h with a new reference for the caller, or -1. */
int32_t eng_prefix_take(eng_prefix *px, uint64_t h);
/* Remembers page id under h (the table takes its own reference); no-op when h is known. */
void eng_prefix_put(eng_prefix *px, uint64_t h, int32_t id);
/* Frees up to n pages that only the table holds, least recently used first; how many. */
int  eng_prefix_evict(eng_prefix *px, int n);
/* Pages the table holds. */
size_t eng_prefix_pages(const eng_prefix *px);

#endif
