/* engine/serve/kvpool.c: a free stack of page ids and a refcount per page under one mutex. Pages
 * are taken a few per step (one per page_tokens tokens), so the lock is never contended for long. */
#include "engine/serve/kvpool.h"

#include "common/arena.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

struct eng_kvpool {
    kern_backend *be;         /* whose buffer the pages are */
    uint8_t *base;            /* [n_pages][page_bytes] */
    size_t page_bytes, n_pages, map_bytes;
    pthread_mutex_t mu;
    int32_t *free_stack;      /* [n_pages]; the top n_free entries are free ids */
    size_t n_free;
    uint32_t *refs;           /* [n_pages] */
};

int eng_kvpool_new(eng_kvpool **out, kern_backend *be, size_t page_bytes, size_t n_pages,
                   util_err *err)
{
    if (page_bytes == 0 || n_pages == 0 || n_pages > (1u << 30))
        return util_err_set(err, LLMGW_EINVAL, "kv pool: bad size (%zu pages of %zu bytes)",
                            n_pages, page_bytes);
    page_bytes = (page_bytes + 4095) & ~(size_t)4095;
    if (n_pages > SIZE_MAX / page_bytes)
        return util_err_set(err, LLMGW_ERANGE, "kv pool: size overflows");
    eng_kvpool *p = util_xcalloc(1, sizeof *p);
    p->page_bytes = page_bytes;
    p->n_pages = n_pages;
    p->map_bytes = page_bytes * n_pages;
    p->be = be;
    p->base = be->buffer_alloc(be->ctx, p->map_bytes);
    if (p->base == NULL) {
        free(p);
        return util_err_set(err, LLMGW_ENOMEM, "kv pool: backend %s cannot allocate %zu MiB",
                            be->name, n_pages * page_bytes >> 20);
    }
    pthread_mutex_init(&p->mu, NULL);
    p->free_stack = util_xmalloc(n_pages * sizeof *p->free_stack);
    p->refs = util_xcalloc(n_pages, sizeof *p->refs);
    /* Low ids on top, so a lightly used pool touches the start of the region only. */
    for (size_t i = 0; i < n_pages; i++)
        p->free_stack[i] = (int32_t)(n_pages - 1 - i);
    p->n_free = n_pages;
    *out = p;
    return 0;
}

void eng_kvpool_free(eng_kvpool *p)
{
    if (p == NULL)
        return;
    p->be->buffer_free(p->be->ctx, p->base, p->map_bytes);
    pthread_mutex_destroy(&p->mu);
    free(p->free_stack);
    free(p->refs);
    free(p);
}

size_t eng_kvpool_page_bytes(const eng_kvpool *p) { return p->page_bytes; }
size_t eng_kvpool_n_pages(const eng_kvpool *p) { return p->n_pages; }

size_t eng_kvpool_n_free(eng_kvpool *p)
{
    pthread_mutex_lock(&p->mu);
    size_t n = p->n_free;
    pthread_mutex_unlock(&p->mu);
    return n;
}

uint8_t *eng_kvpool_page(const eng_kvpool *p, int32_t id)
{
    return p->base + (size_t)id * p->page_bytes;
}

int32_t eng_kvpool_alloc(eng_kvpool *p)
{
    int32_t id = -1;
    pthread_mutex_lock(&p->mu);
    if (p->n_free > 0) {
        id = p->free_stack[--p->n_free];
        p->refs[id] = 1;
    }
    pthread_mutex_unlock(&p->mu);
    return id;
}

int eng_kvpool_alloc_n(eng_kvpool *p, int32_t *ids, size_t n)
{
    int rc = LLMGW_EBUSY;
    pthread_mutex_lock(&p->mu);
    if (p->n_free >= n) {
        for (size_t i = 0; i < n; i++) {
            ids[i] = p->free_stack[--p->n_free];
            p->refs[ids[i]] = 1;
        }
        rc = 0;
    }
    pthread_mutex_unlock(&p->mu);
    return rc;
}

void eng_kvpool_ref(eng_kvpool *p, int32_t id)
{
    pthread_mutex_lock(&p->mu);
    p->refs[id]++;
    pthread_mutex_unlock(&p->mu);
}

void eng_kvpool_release(eng_kvpool *p, int32_t id)
{
    pthread_mutex_lock(&p->mu);
    if (p->refs[id] > 0 && --p->refs[id] == 0)
        p->free_stack[p->n_free++] = id;
    pthread_mutex_unlock(&p->mu);
}

uint32_t eng_kvpool_refs(eng_kvpool *p, int32_t id)
{
    pthread_mutex_lock(&p->mu);
    uint32_t n = p->refs[id];
    pthread_mutex_unlock(&p->mu);
    return n;
}
