/* cache/store.c: the local semantic-cache store (see store.h for the contract).
 *
 * Everything lives under one mutex: an id map and an exact map (open-addressing hash tables), an
 * LRU list, a min-heap on expires_ms for cache_store_expire, and one state per namespace with its
 * entries, its FAISS index (created lazily), the ids that became tombstones in that index and the
 * ids whose vectors wait to be added.
 *
 * Vectors are added in batches: a put queues the id, and the queue goes into the index before the
 * next search of that namespace (or once it holds PENDING_MAX ids), so that bulk loads reach FAISS
 * in calls it can parallelise. Removing an entry from a small index calls remove_ids; in a large
 * one (where remove_ids costs a pass over the whole index) or one that cannot delete (HNSW) the id
 * becomes a tombstone that searches skip, and once tombstones pass rebuild_ratio of the index they
 * are purged in one batch remove_ids, or by rebuilding the index from the live entries.
 * An index type that needs training (IVF) is stood in for by a flat index until its namespace
 * holds train_min vectors; then the namespace is rebuilt with the trained index.
 *
 * Choosing cfg.index (bench/faiss_lookup: 384-d random vectors, queries near stored ones, one
 * search thread, FAISS built with AVX2 by scripts/setup, two busy cores, so p99s are noisy):
 * IDMap2,Flat is exact and fine to about 10k entries per namespace (p50 9 ms at 100k, 190 ms at
 * 1M). IVF wants nlist of about sqrt(n) to 4 sqrt(n) and is searched with nprobe =
 * min(nlist, IVF_NPROBE): IDMap2,IVF1024,Flat for about 100k entries (p50 0.2 ms, recall@1 0.95),
 * IDMap2,IVF4096,Flat for 1M (p50 0.45-0.55 ms, p99 0.7-1.3 ms, recall@1 0.89 at nprobe 16;
 * nprobe 20 gave 0.915 at p99 about 1 ms, nprobe 32 0.955 at 1.5-1.7 ms); IVF1024 at 1M costs
 * 1.2-1.5 ms p50. Clustered real embeddings find their list more often than random vectors, so
 * recall there is a floor. IVF4096 trains once its namespace holds 39 * 4096 vectors (minutes
 * of k-means on two cores). HNSW32 searches 10k in 0.3-0.7 ms but inserts at about 1 ms per vector
 * (Debian's FAISS without AVX2: 2-5 ms) and cannot delete.
 *
 * Entries are items: the public cache_entry first, then the bookkeeping, in one allocation with the
 * strings and the vector. The store holds one reference while an item is stored and each reader
 * one more; whoever drops the last frees it. max_bytes = 0 means no budget. */
#include "cache/store.h"

#include "cache/index.h"
#include "common/arena.h"
#include "common/log.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DEFAULT_FACTORY "IDMap2,Flat"
#define DEFAULT_REBUILD_RATIO 0.25
#define PENDING_MAX 1024        /* queued vectors that force a flush into the index */
#define REMOVE_NOW_MAX 16384    /* indexes up to this size delete at once; larger ones batch */
#define IVF_NPROBE 16           /* IVF lists searched (at most nlist): see "Choosing cfg.index" */
#define HNSW_EF_SEARCH 64
#define TRAIN_PER_LIST 39       /* FAISS's k-means wants 39 points per centroid */
#define REBUILD_CHUNK 8192      /* vectors per add call during a rebuild */

/* ---- an open-addressing hash map: (a, b) -> non-NULL pointer; linear probing, deletion by
 * backward shift (no tombstones of its own) ---- */

typedef struct map_slot {
    uint64_t a, b;
    void *v; /* NULL: empty */
} map_slot;

typedef struct map {
    map_slot *slots; /* [cap], cap a power of two (or 0) */
    size_t cap, n;
} map;

static uint64_t map_hash(uint64_t a, uint64_t b)
{
    uint64_t x = a ^ (b * 0x9e3779b97f4a7c15u + 0x632be59bd9b4e019u);
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9u;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebu;
    return x ^ (x >> 31);
}

static size_t map_find(const map *m, uint64_t a, uint64_t b)
{
    size_t mask = m->cap - 1;
    for (size_t i = map_hash(a, b) & mask;; i = (i + 1) & mask) {
        const map_slot *sl = &m->slots[i];
        if (sl->v == NULL || (sl->a == a && sl->b == b))
            return i;
    }
}

static void *map_get(const map *m, uint64_t a, uint64_t b)
{
    return m->cap == 0 ? NULL : m->slots[map_find(m, a, b)].v;
}

static void map_put(map *m, uint64_t a, uint64_t b, void *v); /* defined after map_grow */

static void map_grow(map *m)
{
    map old = *m;
    m->cap = old.cap ? old.cap * 2 : 16;
    m->slots = util_xcalloc(m->cap, sizeof *m->slots);
    m->n = 0;
    for (size_t i = 0; i < old.cap; i++)
        if (old.slots[i].v != NULL)
            map_put(m, old.slots[i].a, old.slots[i].b, old.slots[i].v);
    free(old.slots);
}

/* Inserts or replaces. */
static void map_put(map *m, uint64_t a, uint64_t b, void *v)
{
    if ((m->n + 1) * 4 > m->cap * 3)
        map_grow(m);
    map_slot *sl = &m->slots[map_find(m, a, b)];
    if (sl->v == NULL)
        m->n++;
    *sl = (map_slot){a, b, v};
}

/* Removes the key; returns its value or NULL. */
static void *map_del(map *m, uint64_t a, uint64_t b)
{
    if (m->cap == 0)
        return NULL;
    size_t mask = m->cap - 1, i = map_find(m, a, b), j = i;
    void *v = m->slots[i].v;
    if (v == NULL)
        return NULL;
    for (;;) {
        j = (j + 1) & mask;
        if (m->slots[j].v == NULL)
            break;
        /* slots[j] may fill the hole at i unless its home lies cyclically in (i, j]. */
        size_t h = map_hash(m->slots[j].a, m->slots[j].b) & mask;
        bool stays = i <= j ? (i < h && h <= j) : (i < h || h <= j);
        if (!stays) {
            m->slots[i] = m->slots[j];
            i = j;
        }
    }
    m->slots[i].v = NULL;
    m->n--;
    return v;
}

static void map_deinit(map *m)
{
    free(m->slots);
    *m = (map){0};
}

/* ---- items and namespaces ---- */

typedef struct item {
    cache_entry e;                    /* first: a const cache_entry * is an item * */
    atomic_int refs;                  /* the store's one while stored, plus one per reader */
    struct item *lru_prev, *lru_next; /* most recently used first */
    struct item *ns_prev, *ns_next;   /* the namespace's entries */
    size_t heap_at;                   /* position in the expiry heap */
    size_t bytes;                     /* what it counts against max_bytes */
    bool in_index;                    /* its vector is in the namespace's index */
} item;

typedef struct nspace {
    uint64_t ns;
    item *head;          /* its entries */
    size_t count;        /* entries */
    size_t nvec;         /* entries with a vector */
    cache_index *ix;     /* NULL while nothing was added */
    bool trained;        /* ix comes from the factory (false: the flat stand-in before training) */
    bool can_remove;     /* ix implements remove_ids */
    map tombs;           /* ids in ix whose entries are gone: (id, 0) -> (void *)1 */
    int64_t *pending;    /* [n_pending] ids whose vectors are not yet in ix */
    size_t n_pending, cap_pending;
} nspace;

struct cache_store {
    pthread_mutex_t mu;
    int dim;
    char *factory;          /* with an IDMap2 prefix added where the type lacks ids */
    size_t max_bytes;       /* 0: no budget */
    double rebuild_ratio;
    bool needs_train;       /* the factory's index must be trained (IVF, PQ) */
    bool tombstone_only;    /* the factory's index cannot delete (HNSW) */
    size_t train_min;       /* vectors a namespace holds before it is trained */
    size_t vec_bytes;       /* estimate per vector: our copy plus the index's share */
    size_t remove_now_max;  /* see REMOVE_NOW_MAX (a field so that tests can lower it) */
    size_t pending_max;
    map ids;                /* (id, 0) -> item */
    map exact;              /* (ns, exact) -> item */
    map spaces;             /* (ns, 0) -> nspace */
    item *lru_head, *lru_tail;
    item **heap;            /* [heap_n] min-heap on e.expires_ms */
    size_t heap_n, heap_cap;
    cache_store_stats st;   /* entries, bytes, namespaces kept current */
};

static void item_unref(item *it)
{
    if (atomic_fetch_sub_explicit(&it->refs, 1, memory_order_acq_rel) == 1)
        free(it);
}

void cache_entry_release(const cache_entry *e)
{
    if (e != NULL)
        item_unref((item *)e);
}

static const cache_entry *item_lend(item *it)
{
    atomic_fetch_add_explicit(&it->refs, 1, memory_order_relaxed);
    return &it->e;
}

/* One allocation: the item, the vector (aligned after it), the token blob, the question and the
 * response. */
static item *item_new(const cache_entry *e, size_t bytes)
{
    const char *q = e->question ? e->question : "";
    size_t qlen = strlen(q), vlen = e->vec ? (size_t)e->dim * sizeof(float) : 0;
    size_t tlen = e->tok != NULL ? e->tok_len : 0;
    item *it = malloc(sizeof *it + vlen + tlen + qlen + 1 + e->response_len + 1);
    if (it == NULL)
        return NULL;
    memset(it, 0, sizeof *it);
    it->e = *e;
    char *p = (char *)(it + 1);
    if (e->vec != NULL) {
        it->e.vec = (float *)p;
        memcpy(p, e->vec, vlen);
        p += vlen;
    } else {
        it->e.dim = 0;
    }
    if (tlen > 0) {
        it->e.tok = memcpy(p, e->tok, tlen);
        p += tlen;
    } else {
        it->e.tok = NULL;
        it->e.tok_len = 0;
    }
    it->e.question = memcpy(p, q, qlen + 1);
    p += qlen + 1;
    it->e.response = p;
    if (e->response_len > 0)
        memcpy(p, e->response, e->response_len);
    p[e->response_len] = '\0';
    atomic_init(&it->refs, 1);
    it->bytes = bytes;
    return it;
}

static bool expired(const item *it, int64_t now_ms)
{
    return it->e.expires_ms <= now_ms;
}

/* ---- LRU list and expiry heap ---- */

static void lru_unlink(cache_store *s, item *it)
{
    if (it->lru_prev)
        it->lru_prev->lru_next = it->lru_next;
    else
        s->lru_head = it->lru_next;
    if (it->lru_next)
        it->lru_next->lru_prev = it->lru_prev;
    else
        s->lru_tail = it->lru_prev;
    it->lru_prev = it->lru_next = NULL;
}

static void lru_push_front(cache_store *s, item *it)
{
    it->lru_prev = NULL;
    it->lru_next = s->lru_head;
    if (s->lru_head)
        s->lru_head->lru_prev = it;
    else
        s->lru_tail = it;
    s->lru_head = it;
}

static void heap_set(cache_store *s, size_t at, item *it)
{
    s->heap[at] = it;
    it->heap_at = at;
}

static void heap_sift(cache_store *s, size_t at)
{
    item *it = s->heap[at];
    while (at > 0 && s->heap[(at - 1) / 2]->e.expires_ms > it->e.expires_ms) {
        heap_set(s, at, s->heap[(at - 1) / 2]);
        at = (at - 1) / 2;
    }
    for (;;) {
        size_t c = 2 * at + 1;
        if (c >= s->heap_n)
            break;
        if (c + 1 < s->heap_n && s->heap[c + 1]->e.expires_ms < s->heap[c]->e.expires_ms)
            c++;
        if (s->heap[c]->e.expires_ms >= it->e.expires_ms)
            break;
        heap_set(s, at, s->heap[c]);
        at = c;
    }
    heap_set(s, at, it);
}

static void heap_push(cache_store *s, item *it)
{
    if (s->heap_n == s->heap_cap) {
        s->heap_cap = s->heap_cap ? s->heap_cap * 2 : 64;
        item **h = realloc(s->heap, s->heap_cap * sizeof *h);
        if (h == NULL)
            abort();
        s->heap = h;
    }
    heap_set(s, s->heap_n++, it);
    heap_sift(s, it->heap_at);
}

static void heap_remove(cache_store *s, item *it)
{
    size_t at = it->heap_at;
    item *last = s->heap[--s->heap_n];
    if (last != it) {
        heap_set(s, at, last);
        heap_sift(s, at);
    }
}

/* ---- per-namespace indexes ---- */

/* The first number after `key` in the factory string, or dflt. */
static long factory_num(const char *factory, const char *key, long dflt)
{
    const char *p = strstr(factory, key);
    if (p == NULL)
        return dflt;
    char *end;
    long v = strtol(p + strlen(key), &end, 10);
    return end == p + strlen(key) || v <= 0 ? dflt : v;
}

/* A fresh namespace index: the factory's, or the flat stand-in while an index type that
 * needs training has too few vectors. */
static int ns_index_new(cache_store *s, bool trained, cache_index **out, util_err *err)
{
    int rc = cache_index_new(out, s->dim, trained ? s->factory : DEFAULT_FACTORY, err);
    if (rc != 0)
        return rc;
    long nlist = factory_num(s->factory, "IVF", IVF_NPROBE);
    if (trained && strstr(s->factory, "IVF") != NULL) {
        /* 16 lists, or 1/200 of them for big indexes (IVF4096: 20, recall@1 0.915 at p99 < 1 ms
         * at 1M entries where 16 gave 0.89) */
        long nprobe = nlist / 200 > IVF_NPROBE ? nlist / 200 : IVF_NPROBE;
        (void)cache_index_set_param(*out, "nprobe", nlist < nprobe ? nlist : nprobe, NULL);
    }
    if (trained && strstr(s->factory, "HNSW") != NULL)
        (void)cache_index_set_param(*out, "efSearch", HNSW_EF_SEARCH, NULL);
    return 0;
}

static void ns_drop_index(nspace *n)
{
    for (item *it = n->head; it; it = it->ns_next)
        it->in_index = false;
    cache_index_free(n->ix);
    n->ix = NULL;
    n->trained = false;
    map_deinit(&n->tombs);
    n->n_pending = 0;
}

/* Adds the listed items' vectors to ix in chunks. */
static int index_add_items(cache_store *s, cache_index *ix, item **its, size_t m, util_err *err)
{
    size_t chunk = m < REBUILD_CHUNK ? m : REBUILD_CHUNK;
    int64_t *ids = util_xmalloc((chunk ? chunk : 1) * sizeof *ids);
    float *vecs = util_xmalloc((chunk ? chunk : 1) * (size_t)s->dim * sizeof *vecs);
    int rc = 0;
    for (size_t at = 0; at < m && rc == 0; at += chunk) {
        size_t c = m - at < chunk ? m - at : chunk;
        for (size_t i = 0; i < c; i++) {
            ids[i] = (int64_t)its[at + i]->e.id;
            memcpy(vecs + i * (size_t)s->dim, its[at + i]->e.vec, (size_t)s->dim * sizeof *vecs);
        }
        rc = cache_index_add_n(ix, c, ids, vecs, err);
    }
    free(ids);
    free(vecs);
    return rc;
}

/* Builds n's index again from its live entries (training it when the factory needs training and
 * there are enough vectors), replacing tombstones and the pending queue. */
static int ns_rebuild(cache_store *s, nspace *n, util_err *err)
{
    bool train = s->needs_train && n->nvec >= s->train_min;
    bool trained = !s->needs_train || train;
    cache_index *ix = NULL;
    item **its = util_xmalloc((n->nvec ? n->nvec : 1) * sizeof *its);
    size_t m = 0;
    int rc;
    for (item *it = n->head; it; it = it->ns_next)
        if (it->e.vec != NULL)
            its[m++] = it;
    if ((rc = ns_index_new(s, trained, &ix, err)) != 0)
        goto out;
    if (train) {
        float *x = util_xmalloc(m * (size_t)s->dim * sizeof *x);
        for (size_t i = 0; i < m; i++)
            memcpy(x + i * (size_t)s->dim, its[i]->e.vec, (size_t)s->dim * sizeof *x);
        rc = cache_index_train(ix, m, x, err);
        free(x);
        if (rc != 0)
            goto out;
    }
    if ((rc = index_add_items(s, ix, its, m, err)) != 0)
        goto out;
    ns_drop_index(n);
    n->ix = ix;
    ix = NULL;
    n->trained = trained;
    n->can_remove = !(trained && s->tombstone_only);
    for (size_t i = 0; i < m; i++)
        its[i]->in_index = true;
    s->st.rebuilds++;
out:
    cache_index_free(ix);
    free(its);
    return rc;
}

/* Moves the pending vectors into the index (creating it), or trains the namespace once it holds
 * enough vectors. */
static int ns_flush(cache_store *s, nspace *n, util_err *err)
{
    if (n->n_pending == 0)
        return 0;
    if (s->needs_train && !n->trained && n->nvec >= s->train_min)
        return ns_rebuild(s, n, err);
    int rc;
    if (n->ix == NULL) {
        if ((rc = ns_index_new(s, !s->needs_train, &n->ix, err)) != 0)
            return rc;
        n->trained = !s->needs_train;
        n->can_remove = !(n->trained && s->tombstone_only);
    }
    item **its = util_xmalloc(n->n_pending * sizeof *its);
    size_t m = 0;
    for (size_t i = 0; i < n->n_pending; i++) {
        /* Skips ids removed since (or queued twice after a removal and a new put). */
        item *it = map_get(&s->ids, (uint64_t)n->pending[i], 0);
        if (it != NULL && it->e.ns == n->ns && it->e.vec != NULL && !it->in_index) {
            it->in_index = true;
            its[m++] = it;
        }
    }
    rc = index_add_items(s, n->ix, its, m, err);
    for (size_t i = 0; i < m; i++)
        its[i]->in_index = rc == 0;
    free(its);
    if (rc == 0)
        n->n_pending = 0;
    return rc;
}

/* Purges n's tombstones: one batch remove_ids where the index can delete, else a rebuild. */
static int ns_compact(cache_store *s, nspace *n, util_err *err)
{
    if (n->can_remove && n->tombs.n > 0) {
        int64_t *ids = util_xmalloc(n->tombs.n * sizeof *ids);
        size_t m = 0;
        for (size_t i = 0; i < n->tombs.cap; i++)
            if (n->tombs.slots[i].v != NULL)
                ids[m++] = (int64_t)n->tombs.slots[i].a;
        int rc = cache_index_remove_n(n->ix, m, ids, NULL, err);
        free(ids);
        if (rc == 0) {
            map_deinit(&n->tombs);
            s->st.rebuilds++;
            return 0;
        }
        n->can_remove = false;
    }
    return ns_rebuild(s, n, err);
}

static void ns_queue(cache_store *s, nspace *n, item *it)
{
    util_err err = {0};
    if (n->tombs.n > 0 && map_get(&n->tombs, it->e.id, 0) != NULL) {
        /* Its old vector is still in the index under the same id: purge it first. */
        if (ns_compact(s, n, &err) != 0)
            UTIL_LOG_WARN("cache", "index compaction failed: %s", err.msg);
        if (it->in_index)
            return;
    }
    if (n->n_pending == n->cap_pending) {
        n->cap_pending = n->cap_pending ? n->cap_pending * 2 : 16;
        int64_t *p = realloc(n->pending, n->cap_pending * sizeof *p);
        if (p == NULL)
            abort();
        n->pending = p;
    }
    n->pending[n->n_pending++] = (int64_t)it->e.id;
    if (n->n_pending >= s->pending_max && ns_flush(s, n, &err) != 0)
        UTIL_LOG_WARN("cache", "index add failed (retried at the next search): %s", err.msg);
}

static void ns_free(nspace *n)
{
    if (n == NULL)
        return;
    cache_index_free(n->ix);
    map_deinit(&n->tombs);
    free(n->pending);
    free(n);
}

/* Takes it out of its namespace and its vector out of the index (or tombstones it). */
static void ns_unlink(cache_store *s, item *it)
{
    nspace *n = map_get(&s->spaces, it->e.ns, 0);
    util_err err = {0};
    if (it->ns_prev)
        it->ns_prev->ns_next = it->ns_next;
    else
        n->head = it->ns_next;
    if (it->ns_next)
        it->ns_next->ns_prev = it->ns_prev;
    it->ns_prev = it->ns_next = NULL;
    n->count--;
    if (it->e.vec != NULL)
        n->nvec--;
    if (n->count == 0) {
        map_del(&s->spaces, n->ns, 0);
        ns_free(n);
        s->st.namespaces--;
        return;
    }
    if (n->nvec == 0) {
        ns_drop_index(n);
        return;
    }
    if (!it->in_index)
        return; /* still queued: the flush skips it */
    it->in_index = false;
    int64_t total = cache_index_size(n->ix);
    if (n->can_remove && (size_t)total <= s->remove_now_max) {
        if (cache_index_remove(n->ix, (int64_t)it->e.id, &err) == 0)
            return;
        UTIL_LOG_DEBUG("cache", "remove_ids unavailable, tombstones from now on: %s", err.msg);
        n->can_remove = false;
    }
    map_put(&n->tombs, it->e.id, 0, (void *)1);
    if ((double)n->tombs.n > s->rebuild_ratio * (double)total && ns_compact(s, n, &err) != 0)
        UTIL_LOG_WARN("cache", "index rebuild failed: %s", err.msg);
}

/* Drops the store's reference to it after unlinking it from everything. */
static void store_drop(cache_store *s, item *it)
{
    map_del(&s->ids, it->e.id, 0);
    if (it->e.exact != 0 && map_get(&s->exact, it->e.ns, it->e.exact) == it)
        map_del(&s->exact, it->e.ns, it->e.exact);
    lru_unlink(s, it);
    heap_remove(s, it);
    ns_unlink(s, it);
    s->st.bytes -= it->bytes;
    s->st.entries--;
    item_unref(it);
}

/* ---- the public calls ---- */

int cache_store_new(cache_store **out, const cache_store_cfg *cfg, util_err *err)
{
    const char *f = cfg->index ? cfg->index : DEFAULT_FACTORY;
    cache_index *probe = NULL;
    int rc;
    *out = NULL;
    if (cfg->rebuild_ratio < 0 || cfg->rebuild_ratio >= 1)
        return util_err_set(err, LLMGW_EINVAL, "cache store: rebuild_ratio %g is not in [0, 1)",
                            cfg->rebuild_ratio);
    cache_store *s = util_xcalloc(1, sizeof *s);
    /* Flat and HNSW take caller-chosen ids only behind an IDMap; IVF takes them itself. */
    if (strstr(f, "IDMap") == NULL && strncmp(f, "IVF", 3) != 0) {
        size_t len = strlen(f) + sizeof "IDMap2,";
        s->factory = util_xmalloc(len);
        snprintf(s->factory, len, "IDMap2,%s", f);
    } else {
        s->factory = util_xstrdup(f);
    }
    if ((rc = cache_index_new(&probe, cfg->dim, s->factory, err)) != 0) {
        free(s->factory);
        free(s);
        return rc;
    }
    s->needs_train = !cache_index_is_trained(probe);
    cache_index_free(probe);
    s->dim = cfg->dim;
    s->max_bytes = cfg->max_bytes;
    s->rebuild_ratio = cfg->rebuild_ratio > 0 ? cfg->rebuild_ratio : DEFAULT_REBUILD_RATIO;
    s->tombstone_only = strstr(s->factory, "HNSW") != NULL;
    s->train_min = (size_t)TRAIN_PER_LIST * (size_t)factory_num(s->factory, "IVF", 256);
    /* Our copy of the vector, the index's (20% over for its layout), IDMap2's two id maps, and
     * HNSW's links (2M neighbours on level 0, a little more above). */
    double vb = (double)cfg->dim * sizeof(float);
    double extra = vb * 1.2 + 64;
    if (s->tombstone_only)
        extra += 2.0 * (double)factory_num(s->factory, "HNSW", 32) * sizeof(int32_t) * 1.1 + 16;
    s->vec_bytes = (size_t)(vb + extra);
    s->remove_now_max = REMOVE_NOW_MAX;
    s->pending_max = PENDING_MAX;
    pthread_mutex_init(&s->mu, NULL);
    *out = s;
    return 0;
}

void cache_store_free(cache_store *s)
{
    if (s == NULL)
        return;
    while (s->lru_head != NULL) {
        item *it = s->lru_head;
        s->lru_head = it->lru_next;
        item_unref(it);
    }
    for (size_t i = 0; i < s->spaces.cap; i++)
        ns_free(s->spaces.slots[i].v);
    map_deinit(&s->spaces);
    map_deinit(&s->ids);
    map_deinit(&s->exact);
    free(s->heap);
    free(s->factory);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

/* The bytes an entry counts against the budget: the item and its copies, its vector with the
 * index's share, and its slots in the maps and the heap. */
static size_t entry_bytes(const cache_store *s, const cache_entry *e)
{
    size_t b = sizeof(item) + (e->question ? strlen(e->question) : 0) + 1 + e->response_len + 1;
    b += e->tok != NULL ? e->tok_len : 0;
    b += 2 * sizeof(map_slot) * 4 / 3 + sizeof(item *);
    if (e->vec != NULL)
        b += s->vec_bytes;
    return b;
}

int cache_store_put(cache_store *s, const cache_entry *e, int64_t now_ms, util_err *err)
{
    if (e->vec != NULL && e->dim != s->dim)
        return util_err_set(err, LLMGW_EINVAL, "cache entry: vector of %d floats, the store's are %d",
                            e->dim, s->dim);
    if (e->id > (uint64_t)INT64_MAX)
        return util_err_set(err, LLMGW_EINVAL, "cache entry: id %llu is not below 2^63",
                            (unsigned long long)e->id);
    if (e->response == NULL && e->response_len > 0)
        return util_err_set(err, LLMGW_EINVAL, "cache entry: no response bytes");
    if (e->expires_ms <= now_ms)
        return 0;
    size_t bytes = entry_bytes(s, e);
    if (s->max_bytes != 0 && bytes > s->max_bytes)
        return util_err_set(err, LLMGW_ERANGE, "cache entry of %zu bytes exceeds the %zu-byte budget",
                            bytes, s->max_bytes);
    item *it = item_new(e, bytes); /* copied before the lock: responses can be large */
    if (it == NULL)
        return util_err_set(err, LLMGW_ENOMEM, "cache entry: out of memory (%zu bytes)", bytes);

    pthread_mutex_lock(&s->mu);
    if (map_get(&s->ids, e->id, 0) != NULL) {
        pthread_mutex_unlock(&s->mu);
        free(it);
        return 0;
    }
    item *old = e->exact != 0 ? map_get(&s->exact, e->ns, e->exact) : NULL;
    if (old != NULL)
        store_drop(s, old);
    while (s->max_bytes != 0 && s->st.bytes + bytes > s->max_bytes && s->lru_tail != NULL) {
        store_drop(s, s->lru_tail);
        s->st.evictions++;
    }
    map_put(&s->ids, it->e.id, 0, it);
    if (it->e.exact != 0)
        map_put(&s->exact, it->e.ns, it->e.exact, it);
    lru_push_front(s, it);
    heap_push(s, it);
    nspace *n = map_get(&s->spaces, it->e.ns, 0);
    if (n == NULL) {
        n = util_xcalloc(1, sizeof *n);
        n->ns = it->e.ns;
        map_put(&s->spaces, n->ns, 0, n);
        s->st.namespaces++;
    }
    it->ns_next = n->head;
    if (n->head)
        n->head->ns_prev = it;
    n->head = it;
    n->count++;
    s->st.entries++;
    s->st.bytes += bytes;
    s->st.insertions++;
    if (it->e.vec != NULL) {
        n->nvec++;
        ns_queue(s, n, it);
    }
    pthread_mutex_unlock(&s->mu);
    return 0;
}

const cache_entry *cache_store_get_exact(cache_store *s, uint64_t ns, uint64_t exact,
                                         int64_t now_ms)
{
    const cache_entry *r = NULL;
    if (exact == 0)
        return NULL;
    pthread_mutex_lock(&s->mu);
    item *it = map_get(&s->exact, ns, exact);
    if (it != NULL && !expired(it, now_ms)) {
        lru_unlink(s, it);
        lru_push_front(s, it);
        r = item_lend(it);
    }
    pthread_mutex_unlock(&s->mu);
    return r;
}

const cache_entry *cache_store_get(cache_store *s, uint64_t id, int64_t now_ms)
{
    const cache_entry *r = NULL;
    pthread_mutex_lock(&s->mu);
    item *it = map_get(&s->ids, id, 0);
    if (it != NULL && !expired(it, now_ms))
        r = item_lend(it);
    pthread_mutex_unlock(&s->mu);
    return r;
}

int cache_store_search(cache_store *s, uint64_t ns, const float *vec, float min_sim, int k,
                       int64_t now_ms, const cache_entry **out, float *sims, util_err *err)
{
    int found = 0, rc = 0;
    if (k <= 0)
        return 0;
    if (vec == NULL)
        return util_err_set(err, LLMGW_EINVAL, "cache search: no vector");
    pthread_mutex_lock(&s->mu);
    nspace *n = map_get(&s->spaces, ns, 0);
    if (n == NULL || n->nvec == 0 || (rc = ns_flush(s, n, err)) != 0 || n->ix == NULL)
        goto out;
    /* Ask for more than k: tombstones and expired entries take places; ask again for four times as
     * many while the answer was full and still short of k live entries above min_sim. */
    int64_t total = cache_index_size(n->ix);
    if (total == 0)
        goto out;
    int64_t want = (int64_t)k * 2 + 8 + (int64_t)(n->tombs.n < 64 ? n->tombs.n : 64);
    for (;;) {
        if (want > total)
            want = total;
        int64_t *ids = util_xmalloc((size_t)want * sizeof *ids);
        float *scores = util_xmalloc((size_t)want * sizeof *scores);
        int got = 0;
        bool below = false;
        rc = cache_index_search(n->ix, vec, (int)want, ids, scores, &got, err);
        found = 0;
        for (int i = 0; rc == 0 && i < got && found < k; i++) {
            if (scores[i] < min_sim) {
                below = true;
                break;
            }
            item *it = map_get(&s->ids, (uint64_t)ids[i], 0);
            if (it == NULL || it->e.ns != ns || !it->in_index || expired(it, now_ms))
                continue; /* a tombstone, or an entry past its TTL */
            out[found] = &it->e;
            sims[found++] = scores[i];
        }
        free(ids);
        free(scores);
        if (rc != 0 || found == k || below || got < want || want >= total || want >= INT32_MAX / 4)
            break;
        want *= 4;
    }
    for (int i = 0; i < found; i++)
        (void)item_lend((item *)out[i]);
out:
    pthread_mutex_unlock(&s->mu);
    return rc != 0 ? rc : found;
}

void cache_store_touch(cache_store *s, uint64_t id)
{
    pthread_mutex_lock(&s->mu);
    item *it = map_get(&s->ids, id, 0);
    if (it != NULL) {
        lru_unlink(s, it);
        lru_push_front(s, it);
    }
    pthread_mutex_unlock(&s->mu);
}

int cache_store_remove(cache_store *s, uint64_t id)
{
    pthread_mutex_lock(&s->mu);
    item *it = map_get(&s->ids, id, 0);
    if (it != NULL) {
        store_drop(s, it);
        s->st.removals++;
    }
    pthread_mutex_unlock(&s->mu);
    return it != NULL ? 0 : LLMGW_ENOTFOUND;
}

size_t cache_store_expire(cache_store *s, int64_t now_ms)
{
    size_t n = 0;
    pthread_mutex_lock(&s->mu);
    while (s->heap_n > 0 && expired(s->heap[0], now_ms)) {
        store_drop(s, s->heap[0]);
        n++;
    }
    s->st.expirations += n;
    pthread_mutex_unlock(&s->mu);
    return n;
}

void cache_store_get_stats(cache_store *s, cache_store_stats *out)
{
    pthread_mutex_lock(&s->mu);
    *out = s->st;
    pthread_mutex_unlock(&s->mu);
}
