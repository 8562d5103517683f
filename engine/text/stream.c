/* engine/text/stream.c: the streaming detokenizer with stop strings (engine/text/stream.h). */
#include "engine/text/stream.h"

#include "common/arena.h"

#include <stdlib.h>
#include <string.h>

void eng_stream_init(eng_stream *s, const eng_tokenizer *tok, const char *const *stop,
                     size_t n_stop)
{
    *s = (eng_stream){.tok = tok};
    if (n_stop > 0)
        s->stop = util_xcalloc(n_stop, sizeof *s->stop);
    for (size_t i = 0; i < n_stop; i++)
        if (stop[i] != NULL && stop[i][0] != '\0')
            s->stop[s->n_stop++] = util_xstrdup(stop[i]);
}

void eng_stream_free(eng_stream *s)
{
    for (size_t i = 0; i < s->n_stop; i++)
        free(s->stop[i]);
    free(s->stop);
    free(s->held);
    *s = (eng_stream){0};
}

static void held_append(eng_stream *s, const char *p, size_t n)
{
    if (n == 0)
        return;  /* held may still be NULL, and memcpy(NULL, p, 0) is undefined */
    if (s->held_len + n > s->held_cap) {
        size_t cap = s->held_cap ? s->held_cap * 2 : 256;
        while (cap < s->held_len + n)
            cap *= 2;
        s->held = realloc(s->held, cap);
        if (s->held == NULL)
            abort();
        s->held_cap = cap;
    }
    memcpy(s->held + s->held_len, p, n);
    s->held_len += n;
}

/* Bytes at the end of held that could still grow into a stop string. */
static size_t stop_overlap(const eng_stream *s)
{
    size_t keep = 0;
    for (size_t k = 0; k < s->n_stop; k++) {
        size_t sl = strlen(s->stop[k]);
        size_t max = sl - 1 < s->held_len ? sl - 1 : s->held_len;
        for (size_t n = max; n > keep; n--) {
            if (memcmp(s->held + s->held_len - n, s->stop[k], n) == 0) {
                keep = n;
                break;
            }
        }
    }
    return keep;
}

/* The start of the character that byte `at` of held belongs to. Held is valid UTF-8 (from
 * eng_detok), and a stop string that is too can only match at a character start, so this moves
 * only for a stop string that begins inside a character: the text released or kept then still
 * splits at a character boundary. */
static size_t char_start(const eng_stream *s, size_t at)
{
    while (at > 0 && at < s->held_len && ((unsigned char)s->held[at] & 0xc0) == 0x80)
        at--;
    return at;
}

bool eng_stream_push(eng_stream *s, int32_t t)
{
    char piece[256], text[ENG_DETOK_OUT_CAP(256)];
    size_t tl = 0;
    int n = eng_token_piece(s->tok, t, false, piece, sizeof piece);
    if (n > 0 && (size_t)n <= sizeof piece)
        tl = eng_detok_push(&s->detok, piece, (size_t)n, text);
    held_append(s, text, tl);
    size_t cut = s->held_len;
    for (size_t k = 0; k < s->n_stop && s->held_len > 0; k++) {
        /* Only the tail can hold a new match: everything before was checked already. */
        size_t sl = strlen(s->stop[k]);
        size_t from = s->held_len > tl + sl ? s->held_len - tl - sl : 0;
        char *hit = memmem(s->held + from, s->held_len - from, s->stop[k], sl);
        if (hit != NULL && (size_t)(hit - s->held) < cut)
            cut = (size_t)(hit - s->held);
    }
    if (cut < s->held_len) {
        s->ready = char_start(s, cut);
        s->held_len = s->ready;
        return true;
    }
    s->ready = char_start(s, s->held_len - stop_overlap(s));
    return false;
}

void eng_stream_end(eng_stream *s)
{
    char text[4];
    held_append(s, text, eng_detok_flush(&s->detok, text));
    s->ready = s->held_len;
}

const char *eng_stream_ready(const eng_stream *s, size_t *len)
{
    /* held is still NULL when nothing has come out yet (a first token inside a character) */
    *len = s->ready;
    return s->held != NULL ? s->held : "";
}

void eng_stream_take(eng_stream *s)
{
    if (s->ready < s->held_len)
        memmove(s->held, s->held + s->ready, s->held_len - s->ready);
    s->held_len -= s->ready;
    s->ready = 0;
}
