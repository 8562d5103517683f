/* tests/fuzz/fuzz_gguf.c: the GGUF reader on arbitrary bytes. A file either opens, and then
 * every key, array element and tensor it reports lies inside the buffer, or it is refused with
 * a message naming the file. */
#include "engine/format/gguf.h"

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* assert() is compiled out in optimised builds; the fuzzer's checks must not be. */
#define CHECK(c) ((c) ? (void)0 : abort())

static void inside(const uint8_t *base, size_t size, const void *p, uint64_t len)
{
    const uint8_t *q = p;
    CHECK(len == 0 || (q >= base && len <= size && (size_t)(q - base) <= size - len));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    eng_gguf *g = NULL;
    util_err err = {0};
    if (eng_gguf_open_mem(&g, data, size, "fuzz.gguf", &err) != 0) {
        CHECK(strncmp(err.msg, "fuzz.gguf", 9) == 0);
        return 0;
    }
    for (size_t i = 0; i < eng_gguf_n_kv(g); i++) {
        const eng_gguf_kv *kv = eng_gguf_kv_at(g, i);
        inside(data, size, kv->key.ptr, kv->key.len);
        if (kv->type == ENG_GGUF_STRING)
            inside(data, size, kv->v.str.ptr, kv->v.str.len);
        if (kv->type == ENG_GGUF_ARRAY && kv->arr_type == ENG_GGUF_STRING)
            for (uint64_t j = 0; j < kv->arr_len; j++)
                inside(data, size, kv->arr_str[j].ptr, kv->arr_str[j].len);
    }
    for (size_t i = 0; i < eng_gguf_n_tensors(g); i++) {
        const eng_gguf_tensor *t = eng_gguf_tensor_at(g, i);
        inside(data, size, t->name.ptr, t->name.len);
        inside(data, size, t->data, t->bytes);
    }
    uint32_t u;
    eng_gguf_get_u32(g, "general.alignment", &u, &err);
    eng_gguf_close(g);
    return 0;
}
