/* common/arena.h: a bump allocator for memory that lives exactly as long as one owner (a request).
 * util_arena_alloc never fails (it aborts on OOM like util_xmalloc); sizes taken from input must be
 * checked by the caller first. Not thread-safe: one owner, one thread. */
#ifndef LLMGW_COMMON_ARENA_H
#define LLMGW_COMMON_ARENA_H

#include <stddef.h>

typedef struct util_arena_block util_arena_block;

typedef struct util_arena {
    util_arena_block *head; /* newest block first */
    size_t block_size;      /* default size of a new block */
} util_arena;

void  util_arena_init(util_arena *a, size_t block_size);
void  util_arena_deinit(util_arena *a);                 /* frees every block */
/* Forgets every allocation but keeps one default-size block for reuse (a recycled owner). */
void  util_arena_reset(util_arena *a);
void *util_arena_alloc(util_arena *a, size_t n);        /* 16-byte aligned, uninitialised */
char *util_arena_strndup(util_arena *a, const char *s, size_t n); /* NUL-terminated copy */
char *util_arena_strdup(util_arena *a, const char *s);

void *util_xmalloc(size_t n);  /* aborts on OOM: for small fixed sizes only */
void *util_xcalloc(size_t n, size_t size);
char *util_xstrdup(const char *s);
char *util_xstrndup(const char *s, size_t n);  /* copies n bytes and a NUL */

#endif
