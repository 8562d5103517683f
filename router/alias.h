/* router/alias.h: model name → tier index, from tier names and their aliases. This is how a
 * request picks its tier until the policy router arrives: the request's `model` field names a
 * tier or one of its aliases. Immutable after build; safe to share between threads. */
#ifndef LLMGW_ROUTER_ALIAS_H
#define LLMGW_ROUTER_ALIAS_H

#include <stddef.h>

typedef struct router_alias router_alias;

router_alias *router_alias_new(void);
void router_alias_free(router_alias *a);  /* NULL is a no-op */
/* Adds name → tier; returns 0, or LLMGW_EINVAL when the name is already taken. */
int  router_alias_add(router_alias *a, const char *name, int tier);
/* The tier for a model name, or -1. */
int  router_alias_find(const router_alias *a, const char *name);
size_t router_alias_count(const router_alias *a);

#endif
