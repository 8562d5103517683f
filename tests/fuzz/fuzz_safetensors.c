/* tests/fuzz/fuzz_safetensors.c: the safetensors reader on arbitrary bytes. A file either opens,
 * and then every tensor it reports lies inside the buffer, its size is its element count times
 * its dtype size, and looking it up by name finds it; or it is refused with a message naming
 * the file. (Seeds: tests/fuzz/corpus/safetensors/make.py.) */
#include "engine/format/safetensors.h"

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(c) ((c) ? (void)0 : abort())

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    eng_safetensors *st = NULL;
    util_err err = {0};
    if (eng_safetensors_open_mem(&st, data, size, "fuzz.safetensors", &err) != 0) {
        CHECK(st == NULL);
        CHECK(strncmp(err.msg, "fuzz.safetensors: ", 18) == 0);
        return 0;
    }
    uint64_t covered = 0;
    for (size_t i = 0; i < eng_safetensors_count(st); i++) {
        const eng_st_tensor *t = eng_safetensors_at(st, i);
        const uint8_t *p = t->data;
        CHECK(p >= data && t->bytes <= size && (size_t)(p - data) <= size - t->bytes);
        CHECK(t->n_dims >= 0 && t->n_dims <= ENG_ST_MAX_DIMS);
        CHECK(t->n_elems * eng_st_dtype_size(t->dtype) == t->bytes);
        CHECK(eng_safetensors_find(st, t->name) == t);
        if (i > 0)
            CHECK(strcmp(eng_safetensors_at(st, i - 1)->name, t->name) < 0);
        covered += t->bytes;
    }
    CHECK(covered <= size);
    eng_safetensors_free(st);
    return 0;
}
