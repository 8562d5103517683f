/* tests/unit/engine/text/test_stream.c: a generation's text as it streams (eng_stream_*), on the
 * real SmolLM2 tokenizer: token by token, the released text is whole UTF-8 characters, joins up
 * to the text that was tokenized, and never shows any part of a stop string; a stop string cuts
 * the text just before it, also when it begins inside a token or inside a character. */
#include "engine/text/stream.h"
#include "engine/text/tokenizer.h"

#include "tests/unit/engine/smollm2.h"
#include "tests/unit/engine/utf8_valid.h"
#include "tests/unit/unit.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static eng_tokenizer *g_tok;

static int setup(void **state)
{
    (void)state;
    util_err err = {0};
    if (smollm2_tokenizer(&g_tok, &err) != 0) {
        fprintf(stderr, "test_stream: %s (run scripts/fetch-models)\n", err.msg);
        return -1;
    }
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    eng_tokenizer_free(g_tok);
    return 0;
}

typedef struct run {
    char out[1024];
    size_t len;
    int stopped_at;   /* index of the token that completed a stop string, or -1 */
    int n_tok;
} run;

/* Streams text's tokens through a stream with the given stop strings, as a sequence would:
 * each push's ready text goes out, a stop ends it, else the end flushes after the last token. */
static run stream_text(const char *text, const char *const *stop, size_t n_stop)
{
    run r = {.stopped_at = -1};
    int32_t *ids = NULL;
    size_t n = 0, cap = 0;
    assert_int_equal(eng_tokenize(g_tok, text, strlen(text), false, false, &ids, &n, &cap), 0);
    eng_stream s;
    eng_stream_init(&s, g_tok, stop, n_stop);
    r.n_tok = (int)n;
    for (size_t i = 0; i < n; i++) {
        bool done = eng_stream_push(&s, ids[i]);
        if (!done && i + 1 == n)
            eng_stream_end(&s);
        size_t len;
        const char *t = eng_stream_ready(&s, &len);
        assert_true(utf8_valid(t, len));
        assert_true(r.len + len < sizeof r.out);
        memcpy(r.out + r.len, t, len);
        r.len += len;
        eng_stream_take(&s);
        if (done) {
            r.stopped_at = (int)i;
            break;
        }
    }
    r.out[r.len] = '\0';
    eng_stream_free(&s);
    free(ids);
    return r;
}

static void text_joins_up_without_stops(void **state)
{
    (void)state;
    static const char *const texts[] = {
        "Hello, world!", "naïve café, Grüße: 你好，世界 🙂🚀 done", "tabs\tand\nnewlines  ",
    };
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        run r = stream_text(texts[i], NULL, 0);
        assert_string_equal(r.out, texts[i]);
        assert_int_equal(r.stopped_at, -1);
    }
    /* stop strings that never occur change nothing */
    static const char *const stop[] = {"\nUser:", "STOP", ""};
    run r = stream_text(texts[1], stop, 3);
    assert_string_equal(r.out, texts[1]);
}

static void stop_cuts_before_it(void **state)
{
    (void)state;
    static const char *const stop[] = {"\nUser:"};
    run r = stream_text("The answer is 42.\nUser: and more", stop, 1);
    assert_string_equal(r.out, "The answer is 42.");
    assert_true(r.stopped_at >= 0 && r.stopped_at < r.n_tok - 1);
    /* a stop string that starts inside a token ("answer" is one token) */
    static const char *const inside[] = {"swer is"};
    r = stream_text("The answer is 42.", inside, 1);
    assert_string_equal(r.out, "The an");
    /* the first of two stop strings to complete wins; a held prefix that then differs goes
     * out ("42" waits for "!" and is released by ".") */
    static const char *const two[] = {"42!", "more"};
    r = stream_text("It is 42. Or 42! And more", two, 2);
    assert_string_equal(r.out, "It is 42. Or ");
}

/* Text that may still become a stop string is held, and goes out when the generation ends. */
static void prefix_is_held_until_decided(void **state)
{
    (void)state;
    int32_t *ids = NULL;
    size_t n = 0, cap = 0;
    const char *text = "Hello wor";
    assert_int_equal(eng_tokenize(g_tok, text, strlen(text), false, false, &ids, &n, &cap), 0);
    static const char *const stop[] = {" world"};
    eng_stream s;
    eng_stream_init(&s, g_tok, stop, 1);
    char out[64] = "";
    size_t len = 0;
    for (size_t i = 0; i < n; i++) {
        assert_false(eng_stream_push(&s, ids[i]));
        size_t l;
        const char *t = eng_stream_ready(&s, &l);
        memcpy(out + len, t, l);
        len += l;
        eng_stream_take(&s);
    }
    out[len] = '\0';
    assert_string_equal(out, "Hello");   /* " wor" may still become " world" */
    eng_stream_end(&s);                   /* the generation ended: it goes out after all */
    const char *t = eng_stream_ready(&s, &len);
    assert_int_equal(len, 4);
    assert_memory_equal(t, " wor", 4);
    eng_stream_free(&s);
    free(ids);
}

/* A stop string that begins inside a multi-byte character cuts at the character's start, so
 * the text stays valid UTF-8; a character cut off by the end is dropped, not half sent. */
static void characters_stay_whole(void **state)
{
    (void)state;
    static const char *const stop[] = {"\xa9 2024"};   /* the tail of U+00A9 (C2 A9) */
    run r = stream_text("Copyright \xc2\xa9 2024 Acme", stop, 1);
    assert_string_equal(r.out, "Copyright ");
    /* the first byte token of an emoji alone, then the end: nothing of it goes out */
    int32_t *ids = NULL;
    size_t n = 0, cap = 0;
    const char *emoji = "\xf0\x9f\x99\x82";
    assert_int_equal(eng_tokenize(g_tok, emoji, 4, false, false, &ids, &n, &cap), 0);
    if (n > 1) {
        eng_stream s;
        eng_stream_init(&s, g_tok, NULL, 0);
        assert_false(eng_stream_push(&s, ids[0]));
        size_t len;
        eng_stream_ready(&s, &len);
        assert_int_equal(len, 0);
        eng_stream_end(&s);
        eng_stream_ready(&s, &len);
        assert_int_equal(len, 0);
        eng_stream_free(&s);
    }
    free(ids);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(text_joins_up_without_stops),
        cmocka_unit_test(stop_cuts_before_it),
        cmocka_unit_test(prefix_is_held_until_decided),
        cmocka_unit_test(characters_stay_whole),
    };
    return cmocka_run_group_tests_name("engine/stream", tests, setup, teardown);
}
