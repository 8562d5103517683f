/* engine/text/tokenizer_internal.h: the eng_tokenizer struct and the tables shared by
 * engine/text/tokenizer.c (tokenize, detokenize) and engine/text/tokenizer_vocab.c (load, specials,
 * pieces). Not for use outside the tokenizer. */
#ifndef LLMGW_ENGINE_TOKENIZER_INTERNAL_H
#define LLMGW_ENGINE_TOKENIZER_INTERNAL_H

#include "engine/text/pretok.h"
#include "engine/text/tokenizer.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* llama.cpp's token attributes (from tokenizer.ggml.token_type, then adjusted by text). */
enum {
    ENG__ATTR_UNKNOWN = 1 << 0,
    ENG__ATTR_UNUSED = 1 << 1,
    ENG__ATTR_NORMAL = 1 << 2,
    ENG__ATTR_CONTROL = 1 << 3,
    ENG__ATTR_USER_DEFINED = 1 << 4,
    ENG__ATTR_BYTE = 1 << 5,
};

/* A set of byte strings, each with a dense id (0, 1, ...) in insertion order. */
typedef struct eng__strtab {
    char *blob;            /* the strings, concatenated */
    size_t blob_len, blob_cap;
    uint32_t *off, *len;   /* [cap] where string `id` is in blob */
    uint32_t *hash;        /* [cap] its hash */
    uint32_t n, cap;
    uint32_t *slot;        /* [mask + 1] open addressing: id + 1, 0 = empty */
    uint32_t mask;
} eng__strtab;

int64_t eng__strtab_find(const eng__strtab *t, const void *s, size_t len);  /* id or -1 */

/* One merge rule: the pair (left symbol, right symbol) -> its rank and the merged symbol. */
typedef struct eng__merge {
    uint64_t key;     /* left << 32 | right; UINT64_MAX = empty slot */
    int32_t rank;
    uint32_t merged;
} eng__merge;

struct eng_tokenizer {
    int32_t n_vocab;
    char *text;              /* token texts as stored (cut at a NUL, "[EMPTY_i]" if empty) */
    uint32_t *text_off;      /* [n_vocab + 1] */
    uint8_t *attr;           /* [n_vocab] ENG__ATTR_* */
    char *piece;             /* token bytes as rendered with render_special */
    uint32_t *piece_off;     /* [n_vocab + 1] */
    eng__strtab texts;       /* stored texts; id -> text_tok */
    int32_t *text_tok;       /* [texts.n] the (last) token with that text */

    eng__strtab syms;        /* raw-byte strings BPE can build; bytes 0-255 are ids 0-255 */
    int32_t *sym_tok;        /* [syms.n] the token with those bytes, or -1 */
    uint32_t byte_sym[256];
    eng__merge *merges;      /* [merge_mask + 1] open addressing */
    uint64_t merge_mask;
    int32_t single_tok[256]; /* the token whose stored text is this one byte, or -1 */

    int32_t *special;        /* [n_special] tokens cut out of the input, longest text first */
    size_t n_special;
    int32_t *eog;            /* [n_eog] end-of-generation tokens, ascending */
    size_t n_eog;
    int32_t bos, eos, eot;
    bool add_bos;
    bool ignore_merges;
    eng_pretok *pre;
};

static inline uint64_t eng__merge_slot(uint64_t key, uint64_t mask)
{
    return (key * 0x9e3779b97f4a7c15ull >> 32) & mask;
}

static inline const eng__merge *eng__merge_find(const eng_tokenizer *t, uint32_t l, uint32_t r)
{
    uint64_t key = (uint64_t)l << 32 | r;
    for (uint64_t i = eng__merge_slot(key, t->merge_mask);; i = (i + 1) & t->merge_mask) {
        const eng__merge *m = &t->merges[i];
        if (m->key == key)
            return m;
        if (m->key == UINT64_MAX)
            return NULL;
    }
}

#endif
