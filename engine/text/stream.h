/* engine/text/stream.h: a generation's text as it streams out: token ids in, text out that is
 * whole UTF-8 characters (eng_detok) and never any part of a stop string. Text that could still
 * grow into a stop string is held back until the next token decides; a completed stop string
 * ends the text just before it (the stop string and everything after it are dropped). One
 * stream per sequence, used from one thread. */
#ifndef LLMGW_ENGINE_TEXT_STREAM_H
#define LLMGW_ENGINE_TEXT_STREAM_H

#include "engine/text/tokenizer.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct eng_stream {
    const eng_tokenizer *tok;
    char **stop;            /* [n_stop] copies, none empty */
    size_t n_stop;
    eng_detok detok;
    char *held;             /* text not yet taken; may be NULL while empty */
    size_t held_len, held_cap;
    size_t ready;           /* of held, the bytes that may go out */
} eng_stream;

/* stop: up to n_stop strings (NULL and empty ones are skipped), copied. */
void eng_stream_init(eng_stream *s, const eng_tokenizer *tok, const char *const *stop,
                     size_t n_stop);
void eng_stream_free(eng_stream *s);

/* Appends token t's text (its special tokens rendered as nothing). Returns true when a stop
 * string is complete: the text before it is then ready, and the stream is over. */
bool eng_stream_push(eng_stream *s, int32_t t);
/* The generation ended otherwise (end of generation, a length limit): everything held is
 * ready (a character left incomplete is dropped: eng_detok_flush). */
void eng_stream_end(eng_stream *s);

/* The text that may go out now: *len bytes (the pointer is valid, "" when empty, until the
 * next call on s). */
const char *eng_stream_ready(const eng_stream *s, size_t *len);
/* Drops the ready text once it went out. */
void eng_stream_take(eng_stream *s);

#endif
