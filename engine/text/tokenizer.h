/* engine/text/tokenizer.h: the byte-level BPE tokenizer of a GGUF model (tokenizer.ggml.model
 * "gpt2"), built from the file's vocab, merges and token types, with the pre-tokenizer split the
 * file names in tokenizer.ggml.pre (smollm, llama3/llama-bpe, qwen2, gpt-2 and their aliases:
 * engine/text/pretok.h). Gives exactly llama.cpp's token ids for the same file and text.
 * Immutable after load: any number of threads may use one tokenizer. */
#ifndef LLMGW_ENGINE_TOKENIZER_H
#define LLMGW_ENGINE_TOKENIZER_H

#include "common/err.h"
#include "engine/format/gguf.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct eng_tokenizer eng_tokenizer;

/* Builds the tokenizer from g's metadata (g may be closed afterwards: everything is copied).
 * An unknown tokenizer model or pre-tokenizer is an LLMGW_EINVAL naming the file and value. */
int  eng_tokenizer_load(eng_tokenizer **out, const eng_gguf *g, util_err *err);
void eng_tokenizer_free(eng_tokenizer *t);  /* NULL is a no-op */

int32_t eng_tokenizer_n_vocab(const eng_tokenizer *t);
/* -1 if the model has none; a "gpt2" file without the key gets llama.cpp's default, 11. */
int32_t eng_tokenizer_bos(const eng_tokenizer *t);
int32_t eng_tokenizer_eos(const eng_tokenizer *t);
/* End of turn (e.g. <|im_end|>), or -1: tokenizer.ggml.eot_token_id, else the first of
 * llama.cpp's end-of-turn texts the vocabulary has, in llama.cpp's list order (llama.cpp itself
 * takes the first its hash map yields, so for SmolLM2 it says <|endoftext|>). */
int32_t eng_tokenizer_eot(const eng_tokenizer *t);
bool    eng_tokenizer_add_bos(const eng_tokenizer *t); /* tokenizer.ggml.add_bos_token */
/* True for every token that ends generation (eos, eot and other end-of-generation tokens). */
bool    eng_tokenizer_is_eog(const eng_tokenizer *t, int32_t id);
/* True when a and b have the same tokens (texts and kinds) under the same ids; otherwise
 * *first_diff is the first id where they differ (or the shorter vocabulary's size). */
bool    eng_tokenizer_same_vocab(const eng_tokenizer *a, const eng_tokenizer *b,
                                 int32_t *first_diff);
/* The id of a special/control token by its text (e.g. "<|im_end|>"), or -1. */
int32_t eng_tokenizer_find_special(const eng_tokenizer *t, const char *text);

/* Tokenizes len bytes of text. Text need not be valid UTF-8: it is read as llama.cpp reads it,
 * so a byte that starts no character becomes U+FFFD (and a byte whose token the vocabulary
 * lacks is dropped, as in llama.cpp). add_bos prepends BOS when the model has one.
 * parse_special: the texts of special/control tokens in the input become those tokens (else
 * they are ordinary text; user-defined tokens are matched either way, as in llama.cpp).
 * Appends into *ids (a malloc'd array the function grows; *n and *cap track it). Returns 0 or
 * LLMGW_ENOMEM (also for len >= 1 GiB). */
int  eng_tokenize(const eng_tokenizer *t, const char *text, size_t len, bool add_bos,
                  bool parse_special, int32_t **ids, size_t *n, size_t *cap);

/* The bytes token `id` stands for (byte-level BPE decoded). Control tokens give "" unless
 * render_special. Returns the length written (it may exceed cap: then nothing is written and the
 * caller retries with a larger buffer), or LLMGW_EINVAL for an out-of-range id. */
int  eng_token_piece(const eng_tokenizer *t, int32_t id, bool render_special, char *buf,
                     size_t cap);

/* Streaming detokenization: pieces in, only whole, well-formed UTF-8 characters out, so that
 * a character split across tokens is never emitted half and every output is valid UTF-8 (the
 * model may sample byte tokens that form no character). */
typedef struct eng_detok {
    unsigned char pending[4];  /* the start of a character that may still complete */
    size_t n_pending;
} eng_detok;

/* The capacity eng_detok_push needs for a piece of len bytes: each byte may become U+FFFD's
 * three, and so may the pending bytes when the piece breaks them. */
#define ENG_DETOK_OUT_CAP(len) (3 * (size_t)(len) + 3)

/* Appends to out (capacity >= ENG_DETOK_OUT_CAP(len)) the complete characters of pending +
 * piece and returns the number of bytes written. Each maximal subpart of an ill-formed sequence
 * (a byte that starts no character, or a lead byte with the continuations it had before the
 * sequence broke) becomes one U+FFFD (EF BF BD), as the Unicode standard recommends. A valid
 * but incomplete character at the end stays pending. */
size_t eng_detok_push(eng_detok *d, const char *piece, size_t len, char *out);
/* Ends the stream: an incomplete character still pending is dropped, so out is left untouched
 * and the result is always 0. Such a tail means generation was cut (max_tokens, the context)
 * inside a character. Dropping it keeps every answer a prefix of what a longer generation
 * gives (streamed and cached answers agree) and invents no character, as a U+FFFD would. */
size_t eng_detok_flush(eng_detok *d, char *out);

#endif
