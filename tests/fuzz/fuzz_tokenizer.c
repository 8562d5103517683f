/* tests/fuzz/fuzz_tokenizer.c: eng_tokenize on arbitrary bytes with the real SmolLM2 vocabulary
 * ($LLMGW_MODELS, default <repo>/models; without the model every input is a no-op). For both
 * parse_special modes: every id is in range, and the pieces (render_special) give back the text
 * as llama.cpp reads it (a byte that starts no character is U+FFFD), less the bytes the
 * vocabulary has no token for - byte-level BPE loses nothing else. eng_detok gives valid UTF-8
 * whatever it is fed and however it is cut: streaming the pieces gives what one push of their
 * whole text gives, which is that text when it is valid UTF-8; so does streaming the input. */
#include "engine/text/tokenizer.h"
#include "engine/text/tokenizer_internal.h"  /* which bytes have a token */
#include "engine/text/unicode.h"
#include "tests/unit/engine/smollm2.h"
#include "tests/unit/engine/utf8_valid.h"  /* a strict validator, independent of eng_detok */

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(c)                                                                                 \
    do {                                                                                         \
        if (!(c))                                                                                \
            __builtin_trap();                                                                    \
    } while (0)

static eng_tokenizer *g_tok;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    util_err err = {0};
    if (smollm2_tokenizer(&g_tok, &err) != 0)
        fprintf(stderr, "fuzz_tokenizer: no model, every input is a no-op: %s\n", err.msg);
    return 0;
}

/* The text as read, less the bytes that have no token. Returns its length. */
static size_t as_read(const uint8_t *s, size_t n, char *out)
{
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        size_t m;
        unsigned char enc[4];
        size_t e = eng_utf8_put(eng_utf8_next(s + i, n - i, &m), enc);
        for (size_t j = 0; j < e; j++)
            if (g_tok->sym_tok[g_tok->byte_sym[enc[j]]] >= 0)
                out[o++] = (char)enc[j];
        i += m;
    }
    return o;
}

/* Pushes s[0..n) whole and flushes: eng_detok's reading of it, into out[ENG_DETOK_OUT_CAP(n)]. */
static size_t detok_whole(const char *s, size_t n, char *out)
{
    eng_detok d = {0};
    size_t m = eng_detok_push(&d, s, n, out);
    m += eng_detok_flush(&d, out + m);
    CHECK(m <= ENG_DETOK_OUT_CAP(n) && utf8_valid(out, m));
    CHECK(!utf8_valid(s, n) || (m == n && memcmp(out, s, n) == 0));
    return m;
}

static void check_mode(const uint8_t *data, size_t size, bool parse_special, const char *want,
                       size_t n_want)
{
    int32_t *ids = NULL;
    size_t n = 0, cap = 0, len = 0, streamed = 0;
    CHECK(eng_tokenize(g_tok, (const char *)data, size, false, parse_special, &ids, &n, &cap) ==
          0);
    /* Each byte becomes at most U+FFFD's three, the pending ones included. */
    char *got = malloc(n_want + 1), *out = malloc(ENG_DETOK_OUT_CAP(n_want));
    char *ref = malloc(ENG_DETOK_OUT_CAP(n_want));
    eng_detok d = {0};
    for (size_t i = 0; i < n; i++) {
        CHECK(ids[i] >= 0 && ids[i] < eng_tokenizer_n_vocab(g_tok));
        char piece[256];
        int k = eng_token_piece(g_tok, ids[i], true, piece, sizeof piece);
        CHECK(k >= 0 && (size_t)k <= sizeof piece && len + (size_t)k <= n_want);
        memcpy(got + len, piece, (size_t)k);
        len += (size_t)k;
        size_t m = eng_detok_push(&d, piece, (size_t)k, out + streamed);
        CHECK(m <= ENG_DETOK_OUT_CAP(k) && utf8_valid(out + streamed, m));
        streamed += m;
        CHECK(streamed <= 3 * len);
    }
    streamed += eng_detok_flush(&d, out + streamed);
    CHECK(len == n_want && memcmp(got, want, len) == 0);
    size_t n_ref = detok_whole(want, n_want, ref);
    CHECK(streamed == n_ref && memcmp(out, ref, n_ref) == 0);
    free(got);
    free(out);
    free(ref);
    free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* Streaming the raw input in two pieces gives what one push gives. */
    eng_detok d = {0};
    char *out = malloc(ENG_DETOK_OUT_CAP(size)), *ref = malloc(ENG_DETOK_OUT_CAP(size));
    size_t cut = size ? data[0] % (size + 1) : 0;
    size_t m = eng_detok_push(&d, (const char *)data, cut, out);
    m += eng_detok_push(&d, (const char *)data + cut, size - cut, out + m);
    m += eng_detok_flush(&d, out + m);
    size_t n_ref = detok_whole((const char *)data, size, ref);
    CHECK(m == n_ref && memcmp(out, ref, n_ref) == 0);
    free(out);
    free(ref);

    if (g_tok == NULL || size > 4096)
        return 0;
    /* Each invalid byte may grow to U+FFFD's three. */
    char *want = malloc(3 * size + 1);
    size_t n_want = as_read(data, size, want);
    check_mode(data, size, false, want, n_want);
    check_mode(data, size, true, want, n_want);  /* special texts render back as themselves */
    free(want);
    return 0;
}
