/* gateway/response_store.c: stored responses in a chained hash table with an LRU list. */
#include "gateway/response_store.h"

#include "common/arena.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#define BUCKETS 4096

typedef struct entry {
    struct entry *next_hash, *prev_lru, *next_lru;
    char *tenant, *id, *response, *messages;
    size_t bytes;
} entry;

struct gw_rstore {
    entry *bucket[BUCKETS];
    entry *newest, *oldest;
    size_t n, bytes;
    uint64_t evicted;
};

gw_rstore *gw_rstore_new(void)
{
    return util_xcalloc(1, sizeof(gw_rstore));
}

static void entry_free(entry *e)
{
    free(e->tenant);
    free(e->id);
    free(e->response);
    free(e->messages);
    free(e);
}

void gw_rstore_free(gw_rstore *s)
{
    if (s == NULL)
        return;
    for (entry *e = s->newest, *n; e != NULL; e = n) {
        n = e->next_lru;
        entry_free(e);
    }
    free(s);
}

static entry **slot(gw_rstore *s, const char *id)
{
    entry **p = &s->bucket[XXH3_64bits(id, strlen(id)) % BUCKETS];
    while (*p != NULL && strcmp((*p)->id, id) != 0)
        p = &(*p)->next_hash;
    return p;
}

static void lru_unlink(gw_rstore *s, entry *e)
{
    if (e->prev_lru) e->prev_lru->next_lru = e->next_lru; else s->newest = e->next_lru;
    if (e->next_lru) e->next_lru->prev_lru = e->prev_lru; else s->oldest = e->prev_lru;
    e->prev_lru = e->next_lru = NULL;
}

static void lru_front(gw_rstore *s, entry *e)
{
    e->next_lru = s->newest;
    if (s->newest) s->newest->prev_lru = e; else s->oldest = e;
    s->newest = e;
}

static void remove_entry(gw_rstore *s, entry **at)
{
    entry *e = *at;
    *at = e->next_hash;
    lru_unlink(s, e);
    s->n--;
    s->bytes -= e->bytes;
    entry_free(e);
}

void gw_rstore_put(gw_rstore *s, const char *tenant, const char *id, const char *response,
                   const char *messages)
{
    entry **at = slot(s, id);
    if (*at != NULL)
        remove_entry(s, at);
    entry *e = util_xcalloc(1, sizeof *e);
    e->tenant = util_xstrdup(tenant);
    e->id = util_xstrdup(id);
    e->response = util_xstrdup(response);
    e->messages = util_xstrdup(messages);
    e->bytes = sizeof *e + strlen(tenant) + strlen(id) + strlen(response) + strlen(messages) + 4;
    e->next_hash = *at;
    *at = e;
    lru_front(s, e);
    s->n++;
    s->bytes += e->bytes;
    while ((s->n > GW_RSTORE_MAX || s->bytes > GW_RSTORE_MAX_BYTES) && s->oldest != e) {
        remove_entry(s, slot(s, s->oldest->id));
        s->evicted++;
    }
}

bool gw_rstore_get(gw_rstore *s, const char *tenant, const char *id, const char **response,
                   const char **messages)
{
    entry *e = *slot(s, id);
    if (e == NULL || strcmp(e->tenant, tenant) != 0)
        return false;
    lru_unlink(s, e);
    lru_front(s, e);
    *response = e->response;
    *messages = e->messages;
    return true;
}

bool gw_rstore_delete(gw_rstore *s, const char *tenant, const char *id)
{
    entry **at = slot(s, id);
    if (*at == NULL || strcmp((*at)->tenant, tenant) != 0)
        return false;
    remove_entry(s, at);
    return true;
}

void gw_rstore_stats_get(const gw_rstore *s, gw_rstore_stats *out)
{
    *out = (gw_rstore_stats){s->n, s->bytes, s->evicted};
}
