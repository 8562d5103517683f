/* tests/unit/engine/gguf_writer.h: a GGUF v3 writer for unit tests (metadata of any type and a
 * few tensors), shared by the format and text wings' tests. Aborts the test on no memory. */
#ifndef LLMGW_TESTS_UNIT_ENGINE_GGUF_WRITER_H
#define LLMGW_TESTS_UNIT_ENGINE_GGUF_WRITER_H

#include "engine/format/gguf.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct gbuf {
    unsigned char *p;
    size_t n, cap;
    uint64_t n_kv;
} gbuf;

static inline void put(gbuf *b, const void *d, size_t n)
{
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2;
        b->p = realloc(b->p, b->cap);
        if (b->p == NULL)
            abort();
    }
    memcpy(b->p + b->n, d, n);
    b->n += n;
}

static inline void put_u32(gbuf *b, uint32_t v) { put(b, &v, 4); }
static inline void put_u64(gbuf *b, uint64_t v) { put(b, &v, 8); }
static inline void put_str(gbuf *b, const char *s)
{
    put_u64(b, strlen(s));
    put(b, s, strlen(s));
}

/* A key and its type: the caller then puts the value. */
static inline void kv(gbuf *b, const char *key, eng_gguf_vtype type)
{
    put_str(b, key);
    put_u32(b, type);
    b->n_kv++;
}

static inline void kv_strs(gbuf *b, const char *key, const char *const *v)
{
    uint64_t n = 0;
    while (v[n] != NULL)
        n++;
    kv(b, key, ENG_GGUF_ARRAY);
    put_u32(b, ENG_GGUF_STRING);
    put_u64(b, n);
    for (uint64_t i = 0; i < n; i++)
        put_str(b, v[i]);
}

typedef struct gguf_tensor_in {
    const char *name;
    uint32_t n_dims;
    uint64_t ne[4];
    uint32_t type;
    const void *data;
    size_t bytes;
} gguf_tensor_in;

enum { GGUF_TEST_ALIGN = 32 };

/* Header + the key-values in b + the tensors (their data aligned to 32 bytes), as one buffer
 * (the caller frees it); b is consumed. */
static inline unsigned char *gguf_finish(gbuf *b, const gguf_tensor_in *t, size_t n_t,
                                         size_t *size)
{
    static const unsigned char zeros[GGUF_TEST_ALIGN];
    gbuf out = {0};
    put(&out, "GGUF", 4);
    put_u32(&out, 3);
    put_u64(&out, n_t);
    put_u64(&out, b->n_kv);
    put(&out, b->p, b->n);
    free(b->p);
    uint64_t off = 0;
    for (size_t i = 0; i < n_t; i++) {
        put_str(&out, t[i].name);
        put_u32(&out, t[i].n_dims);
        for (uint32_t d = 0; d < t[i].n_dims; d++)
            put_u64(&out, t[i].ne[d]);
        put_u32(&out, t[i].type);
        put_u64(&out, off);
        off += (t[i].bytes + GGUF_TEST_ALIGN - 1) / GGUF_TEST_ALIGN * GGUF_TEST_ALIGN;
    }
    if (n_t > 0)
        put(&out, zeros, (GGUF_TEST_ALIGN - out.n % GGUF_TEST_ALIGN) % GGUF_TEST_ALIGN);
    for (size_t i = 0; i < n_t; i++) {
        put(&out, t[i].data, t[i].bytes);
        put(&out, zeros, (GGUF_TEST_ALIGN - t[i].bytes % GGUF_TEST_ALIGN) % GGUF_TEST_ALIGN);
    }
    *size = out.n;
    return out.p;
}

#endif
