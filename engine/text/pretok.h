/* engine/text/pretok.h: the pre-tokenizer of byte-level BPE models. It splits text into the words
 * that BPE then merges one at a time, exactly as llama.cpp splits for the same tokenizer.ggml.pre:
 * the same sequence of split steps, its hand-written splitters for the GPT-2, Llama-3 and Qwen2
 * patterns (what llama.cpp runs for those, rather than the regex), and PCRE2 on llama.cpp's
 * "collapsed" text (one byte per codepoint, its class) for the other Unicode-class regexes. An
 * eng_pretok is immutable after new: any number of threads may use it, each with its own
 * eng_pretok_work. */
#ifndef LLMGW_ENGINE_PRETOK_H
#define LLMGW_ENGINE_PRETOK_H

#include "common/err.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct eng_pretok eng_pretok;

/* Scratch space of one split, owned by one thread. Zero-initialise it, reuse it across calls,
 * release it with eng_pretok_work_deinit. */
typedef struct eng_pretok_work {
    uint32_t *cpt;             /* [cap] codepoints of the text */
    uint16_t *flags;           /* [cap] their engine/text/unicode.h class bits */
    uint32_t *at;              /* [cap + 1] byte offset of each codepoint, then the length */
    uint32_t *runs[2];         /* [cap] piece lengths in codepoints, one array per step parity */
    unsigned char *collapsed;  /* [cap] one class byte per codepoint, for PCRE2 steps */
    char *norm;                /* [norm_cap] the text as read, when that differs from it */
    void *match;               /* pcre2_match_data_8 *, made on first use */
    size_t cap, norm_cap;
} eng_pretok_work;

/* The pre-tokenizer named `name` (tokenizer.ggml.pre; not NUL-terminated). An unknown name is
 * LLMGW_EINVAL naming it; LLMGW_ENOMEM. */
int  eng_pretok_new(eng_pretok **out, const char *name, size_t name_len, util_err *err);
void eng_pretok_free(eng_pretok *p);  /* NULL is a no-op */

/* llama.cpp's flags that come with the name: a word that is itself a token skips BPE
 * (Llama-3), and whether the model adds BOS when the file does not say. */
bool eng_pretok_ignore_merges(const eng_pretok *p);
bool eng_pretok_default_add_bos(const eng_pretok *p);

/* Splits text[0..len) into words. Text need not be valid UTF-8: it is read as llama.cpp reads
 * it (engine/text/unicode.h: eng_utf8_next), so a byte that starts no character becomes U+FFFD and an
 * overlong form its codepoint, and the words are cut from that reading. On success *words is
 * the text as read (text itself when it is well-formed UTF-8, else a copy in w) and *ends holds
 * *n ascending word end offsets into it (the first word starts at 0); both stay valid until w is
 * used again. Returns 0 or LLMGW_ENOMEM (also for len >= 1 GiB). */
int  eng_pretok_split(const eng_pretok *p, const char *text, size_t len, eng_pretok_work *w,
                      const char **words, const uint32_t **ends, size_t *n);
void eng_pretok_work_deinit(eng_pretok_work *w);  /* leaves w zeroed */

#endif
