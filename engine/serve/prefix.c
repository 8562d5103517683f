/* engine/serve/prefix.c: shared-prefix page table (see prefix.h). Open addressing on the chain
 * hash, a use stamp per entry for LRU eviction, tombstones for removed entries. */
#include "engine/serve/prefix.h"

#include "common/arena.h"

#include <stdbool.h>
#include <stdlib.h>
#include <xxhash.h>

typedef struct slot {
    uint64_t h;       /* 0: empty */
    uint64_t used;    /* use stamp */
    int32_t id;       /* page id; -1: a tombstone */
} slot;

struct eng_prefix {
    eng_kvpool *pool;
    slot *slots;      /* [cap], cap a power of two >= 2 * max_pages */
    size_t cap, max_pages, n, n_tomb;
    uint64_t clock;
};

eng_prefix *eng_prefix_new(eng_kvpool *pool, size_t max_pages)
{
    eng_prefix *px = util_xcalloc(1, sizeof *px);
    px->pool = pool;
    px->max_pages = max_pages;
    px->cap = 16;
    while (px->cap < 2 * max_pages)
        px->cap *= 2;
    px->slots = util_xcalloc(px->cap, sizeof *px->slots);
    return px;
}

void eng_prefix_free(eng_prefix *px)
{
    if (px == NULL)
        return;
    for (size_t i = 0; i < px->cap; i++)
        if (px->slots[i].h != 0 && px->slots[i].id >= 0)
            eng_kvpool_release(px->pool, px->slots[i].id);
    free(px->slots);
    free(px);
}

uint64_t eng_prefix_hash(uint64_t prev, const int32_t *tokens, int n)
{
    uint64_t h = XXH3_64bits_withSeed(tokens, (size_t)n * sizeof *tokens, prev);
    return h ? h : 1;  /* 0 marks an empty slot */
}

static slot *find(eng_prefix *px, uint64_t h)
{
    for (size_t i = h & (px->cap - 1), k = 0; k < px->cap; i = (i + 1) & (px->cap - 1), k++) {
        slot *s = &px->slots[i];
        if (s->h == 0)
            return NULL;
        if (s->h == h && s->id >= 0)
            return s;
    }
    return NULL;
}

int32_t eng_prefix_take(eng_prefix *px, uint64_t h)
{
    slot *s = px->max_pages ? find(px, h) : NULL;
    if (s == NULL)
        return -1;
    s->used = ++px->clock;
    eng_kvpool_ref(px->pool, s->id);
    return s->id;
}

static void rehash(eng_prefix *px)
{
    slot *old = px->slots;
    size_t cap = px->cap;
    px->slots = util_xcalloc(cap, sizeof *px->slots);
    px->n_tomb = 0;
    for (size_t i = 0; i < cap; i++) {
        if (old[i].h == 0 || old[i].id < 0)
            continue;
        size_t j = old[i].h & (cap - 1);
        while (px->slots[j].h != 0)
            j = (j + 1) & (cap - 1);
        px->slots[j] = old[i];
    }
    free(old);
}

void eng_prefix_put(eng_prefix *px, uint64_t h, int32_t id)
{
    if (px->max_pages == 0 || find(px, h) != NULL)
        return;
    if (px->n >= px->max_pages && eng_prefix_evict(px, 1) == 0)
        return;  /* full of pages others still use: do not remember this one */
    if (px->n + px->n_tomb + 1 > px->cap / 2)
        rehash(px);
    size_t i = h & (px->cap - 1);
    while (px->slots[i].h != 0)
        i = (i + 1) & (px->cap - 1);
    px->slots[i] = (slot){.h = h, .used = ++px->clock, .id = id};
    px->n++;
    eng_kvpool_ref(px->pool, id);
}

int eng_prefix_evict(eng_prefix *px, int n)
{
    int done = 0;
    while (done < n) {
        slot *victim = NULL;
        for (size_t i = 0; i < px->cap; i++) {
            slot *s = &px->slots[i];
            if (s->h == 0 || s->id < 0 || eng_kvpool_refs(px->pool, s->id) != 1)
                continue;
            if (victim == NULL || s->used < victim->used)
                victim = s;
        }
        if (victim == NULL)
            break;
        eng_kvpool_release(px->pool, victim->id);
        victim->id = -1;  /* a tombstone keeps later entries of its probe chain reachable */
        px->n--;
        px->n_tomb++;
        done++;
    }
    return done;
}

size_t eng_prefix_pages(const eng_prefix *px)
{
    return px->n;
}

