/* engine/serve/kvpool.h: the KV pool: one region of memory cut into fixed-size pages (bytes, not
 * tokens), shared by every engine instance on the device. An engine lays one page out as
 * [layer][K|V][page_tokens][n_kv_head] rows of its K/V type (engine/decoder/model.h:
 * eng_kv_layout; f16, or int8 with scales at about half the bytes), so page_tokens = page_bytes /
 * its bytes per token: the same page holds about twice the tokens of a q8 engine. Pages are
 * reference-counted (a shared prefix may be held by several sequences). Thread-safe: instances
 * allocate from their own scheduler threads. */
#ifndef LLMGW_ENGINE_KVPOOL_H
#define LLMGW_ENGINE_KVPOOL_H

#include "common/err.h"
#include "kernels/backend.h"

#include <stddef.h>
#include <stdint.h>

typedef struct eng_kvpool eng_kvpool;

/* page_bytes is rounded up to 4 KiB. The region is one buffer of be (kernels/backend.h: on the
 * CPU reserved lazily, so untouched pages cost no memory), which must outlive the pool; page
 * pointers are be's to read and write (kern_seq.pages), not the host's. */
int  eng_kvpool_new(eng_kvpool **out, kern_backend *be, size_t page_bytes, size_t n_pages,
                    util_err *err);
void eng_kvpool_free(eng_kvpool *p);  /* NULL is a no-op */

size_t   eng_kvpool_page_bytes(const eng_kvpool *p);
size_t   eng_kvpool_n_pages(const eng_kvpool *p);
size_t   eng_kvpool_n_free(eng_kvpool *p);
uint8_t *eng_kvpool_page(const eng_kvpool *p, int32_t id);  /* a pointer into be's buffer */

/* A free page with one reference, or -1 when the pool is full. */
int32_t eng_kvpool_alloc(eng_kvpool *p);
/* Takes up to n pages at once, all or nothing: 0, or LLMGW_EBUSY when fewer are free. */
int     eng_kvpool_alloc_n(eng_kvpool *p, int32_t *ids, size_t n);
void    eng_kvpool_ref(eng_kvpool *p, int32_t id);
void    eng_kvpool_release(eng_kvpool *p, int32_t id);  /* the last release frees the page */
uint32_t eng_kvpool_refs(eng_kvpool *p, int32_t id);    /* references now (0: free) */

#endif
