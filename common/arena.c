/* common/arena.c: bump allocation in a chain of blocks; oversized requests get their own block. */
#include "common/arena.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct util_arena_block {
    util_arena_block *next;
    size_t used, cap;
    _Alignas(16) unsigned char data[];
};

void *util_xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (p == NULL) {
        fprintf(stderr, "llmgw: out of memory allocating %zu bytes\n", n);
        abort();
    }
    return p;
}

void *util_xcalloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (p == NULL) {
        fprintf(stderr, "llmgw: out of memory allocating %zu x %zu bytes\n", n, size);
        abort();
    }
    return p;
}

char *util_xstrdup(const char *s)
{
    size_t n = strlen(s) + 1;
    return memcpy(util_xmalloc(n), s, n);
}

char *util_xstrndup(const char *s, size_t n)
{
    char *p = util_xmalloc(n + 1);
    memcpy(p, s, n);
    p[n] = '\0';
    return p;
}

void util_arena_init(util_arena *a, size_t block_size)
{
    a->head = NULL;
    a->block_size = block_size ? block_size : 4096;
}

void util_arena_deinit(util_arena *a)
{
    util_arena_block *b = a->head;
    while (b != NULL) {
        util_arena_block *next = b->next;
        free(b);
        b = next;
    }
    a->head = NULL;
}

void util_arena_reset(util_arena *a)
{
    /* Keep one block of the default size (the first one made, usually) for the next owner. */
    util_arena_block *keep = NULL;
    util_arena_block *b = a->head;
    while (b != NULL) {
        util_arena_block *next = b->next;
        if (keep == NULL && b->cap == a->block_size) {
            keep = b;
        } else {
            free(b);
        }
        b = next;
    }
    if (keep != NULL) {
        keep->next = NULL;
        keep->used = 0;
    }
    a->head = keep;
}

void *util_arena_alloc(util_arena *a, size_t n)
{
    n = (n + 15) & ~(size_t)15;
    util_arena_block *b = a->head;
    if (b == NULL || b->cap - b->used < n) {
        size_t cap = n > a->block_size ? n : a->block_size;
        b = util_xmalloc(sizeof *b + cap);
        b->used = 0;
        b->cap = cap;
        /* An oversized block goes behind the current one so the current one keeps filling. */
        if (n > a->block_size && a->head != NULL) {
            b->next = a->head->next;
            a->head->next = b;
        } else {
            b->next = a->head;
            a->head = b;
        }
    }
    void *p = b->data + b->used;
    b->used += n;
    return p;
}

char *util_arena_strndup(util_arena *a, const char *s, size_t n)
{
    char *p = util_arena_alloc(a, n + 1);
    memcpy(p, s, n);
    p[n] = '\0';
    return p;
}

char *util_arena_strdup(util_arena *a, const char *s)
{
    return util_arena_strndup(a, s, strlen(s));
}
