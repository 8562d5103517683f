/* router/alias.c: an open-addressing hash table (FNV-1a) of names to tier indices. */
#include "router/alias.h"

#include "common/arena.h"
#include "common/err.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct slot {
    char *name;   /* NULL = empty */
    int tier;
} slot;

struct router_alias {
    slot *slots;  /* [cap], cap a power of two, at most half full */
    size_t cap, n;
};

static uint64_t hash(const char *s)
{
    uint64_t h = 1469598103934665603u;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211u;
    return h;
}

router_alias *router_alias_new(void)
{
    router_alias *a = util_xcalloc(1, sizeof *a);
    a->cap = 16;
    a->slots = util_xcalloc(a->cap, sizeof *a->slots);
    return a;
}

void router_alias_free(router_alias *a)
{
    if (a == NULL)
        return;
    for (size_t i = 0; i < a->cap; i++)
        free(a->slots[i].name);
    free(a->slots);
    free(a);
}

static slot *lookup(slot *slots, size_t cap, const char *name)
{
    size_t i = (size_t)hash(name) & (cap - 1);
    while (slots[i].name != NULL && strcmp(slots[i].name, name) != 0)
        i = (i + 1) & (cap - 1);
    return &slots[i];
}

int router_alias_add(router_alias *a, const char *name, int tier)
{
    if (lookup(a->slots, a->cap, name)->name != NULL)
        return LLMGW_EINVAL;
    if ((a->n + 1) * 2 > a->cap) {
        size_t cap = a->cap * 2;
        slot *grown = util_xcalloc(cap, sizeof *grown);
        for (size_t i = 0; i < a->cap; i++)
            if (a->slots[i].name != NULL)
                *lookup(grown, cap, a->slots[i].name) = a->slots[i];
        free(a->slots);
        a->slots = grown;
        a->cap = cap;
    }
    slot *s = lookup(a->slots, a->cap, name);
    s->name = util_xstrdup(name);
    s->tier = tier;
    a->n++;
    return 0;
}

int router_alias_find(const router_alias *a, const char *name)
{
    const slot *s = lookup(a->slots, a->cap, name);
    return s->name != NULL ? s->tier : -1;
}

size_t router_alias_count(const router_alias *a)
{
    return a->n;
}
