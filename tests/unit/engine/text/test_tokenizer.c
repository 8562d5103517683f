/* tests/unit/engine/text/test_tokenizer.c: the byte-level BPE tokenizer (eng_tokenizer_*,
 * eng_tokenize, eng_token_piece, eng_detok_*).
 *   - BPE mechanics, special tokens and errors on small vocabularies built here as GGUF;
 *   - streaming detokenization: whole characters only, U+FFFD for what can never complete, an
 *     incomplete tail dropped, and valid UTF-8 out of any bytes cut anywhere;
 *   - the real SmolLM2 model ($LLMGW_MODELS, default <repo>/models): ids identical to llama.cpp
 *     for every string of tests/golden/smollm2_tokens.json in both modes, pieces and
 *     detokenized bytes identical, lossless round trips, the speed of a 4 KB prompt;
 *   - when the llama.cpp source is in the cache (scripts/build-llamacpp-ref), its own vocabulary
 *     test files for Llama-3, Qwen2, GPT-2 and StarCoder vocabularies. */
#include "engine/format/gguf.h"
#include "engine/text/tokenizer.h"
#include "engine/text/tokenizer_internal.h"  /* token attributes and byte symbols */
#include "engine/text/unicode.h"

#include "tests/unit/unit.h"
#include "tests/unit/engine/gguf_writer.h"
#include "tests/unit/engine/smollm2.h"
#include "tests/unit/engine/utf8_valid.h"

#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

/* A little vocabulary: "Ġ" is the byte-level stand-in for a space. Token 7 "e" is missing on
 * purpose ("e" is no token); "cd" is a merge result without a token. */
static const char *const small_tokens[] = {
    "a", "b", "c", "d", "\xc4\xa0", "<", "|",  /* 0-6 */
    "x", "y", "z", "w", ">", "@",              /* 7-12 */
    "ab", "bc", "abc", "aa", "\xc4\xa0" "a",   /* 13-17 */
    "<|x|>", "xyz", "wx", "@@", "<|im_end|>",  /* 18-22: control, control, control, user, normal */
    "",                                        /* 23: empty, named [EMPTY_23] */
    NULL};
static const int32_t small_types[] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
                                      1, 1, 1, 1, 1, 3, 3, 3, 4, 1, 1};
static const char *const small_merges[] = {"a b", "b c", "ab c", "\xc4\xa0 a", "a a", "c d",
                                           "nospace", "\xc4\xa0 \xc4\xa0", NULL};

typedef struct small_opts {
    const char *model, *pre;
    bool no_merges, short_types;
} small_opts;

static int load_small(eng_tokenizer **t, small_opts o, util_err *err)
{
    gbuf b = {0};
    kv(&b, "tokenizer.ggml.model", ENG_GGUF_STRING);
    put_str(&b, o.model ? o.model : "gpt2");
    kv(&b, "tokenizer.ggml.pre", ENG_GGUF_STRING);
    put_str(&b, o.pre ? o.pre : "gpt-2");
    kv_strs(&b, "tokenizer.ggml.tokens", small_tokens);
    kv(&b, "tokenizer.ggml.token_type", ENG_GGUF_ARRAY);
    put_u32(&b, ENG_GGUF_INT32);
    put_u64(&b, o.short_types ? 5 : 24);
    put(&b, small_types, o.short_types ? 20 : 96);
    if (!o.no_merges)
        kv_strs(&b, "tokenizer.ggml.merges", small_merges);
    kv(&b, "tokenizer.ggml.eos_token_id", ENG_GGUF_UINT32);
    put_u32(&b, 18);
    size_t size;
    unsigned char *mem = gguf_finish(&b, NULL, 0, &size);
    eng_gguf *g = NULL;
    int rc = eng_gguf_open_mem(&g, mem, size, "small.gguf", err);
    if (rc == 0)
        rc = eng_tokenizer_load(t, g, err);
    eng_gguf_close(g);  /* the tokenizer copies what it needs */
    free(mem);
    return rc;
}

static eng_tokenizer *small(void)
{
    eng_tokenizer *t = NULL;
    util_err err = {0};
    if (load_small(&t, (small_opts){0}, &err) != 0)
        print_error("%s\n", err.msg);
    assert_non_null(t);
    return t;
}

/* Tokenizes and checks the ids are want[0..n). */
static void expect_ids(const eng_tokenizer *t, const char *text, bool parse_special,
                       const int32_t *want, size_t n_want)
{
    int32_t *ids = NULL;
    size_t n = 0, cap = 0;
    assert_int_equal(eng_tokenize(t, text, strlen(text), false, parse_special, &ids, &n, &cap), 0);
    if (n != n_want || (n > 0 && want != NULL && memcmp(ids, want, n * sizeof *ids) != 0)) {
        print_error("\"%s\" (parse_special %d):", text, parse_special);
        for (size_t i = 0; i < n; i++)
            print_error(" %d", ids[i]);
        print_error(" but want");
        for (size_t i = 0; i < n_want; i++)
            print_error(" %d", want[i]);
        print_error("\n");
        fail();
    }
    free(ids);
}

#define IDS(...) (const int32_t[]){__VA_ARGS__}, sizeof((const int32_t[]){__VA_ARGS__}) / 4
#define NO_IDS NULL, 0

static void merges_by_rank_then_leftmost(void **state)
{
    (void)state;
    eng_tokenizer *t = small();
    expect_ids(t, "abc", false, IDS(15));          /* a+b (rank 0) first, then ab+c */
    expect_ids(t, "bc", false, IDS(14));
    expect_ids(t, "aaa", false, IDS(16, 0));       /* equal ranks: the left pair wins */
    expect_ids(t, "aaaa", false, IDS(16, 16));
    expect_ids(t, " a b", false, IDS(17, 4, 1));   /* Ġ+a merges; "Ġb" has no rule */
    expect_ids(t, "cd", false, IDS(2, 3));         /* "cd" is no token: its bytes' tokens */
    expect_ids(t, "ea", false, IDS(0));            /* "e" has no token at all: dropped */
    expect_ids(t, "", false, NO_IDS);
    eng_tokenizer_free(t);
}

static void specials_are_cut_longest_first(void **state)
{
    (void)state;
    eng_tokenizer *t = small();
    expect_ids(t, "<|x|>a", true, IDS(18, 0));
    expect_ids(t, "<|x|>a", false, IDS(5, 6, 7, 6, 11, 0));
    /* "xyz" (3 bytes) is cut before "wx" (2) although "wx" starts first. */
    expect_ids(t, "wxyz", true, IDS(10, 19));
    /* User-defined tokens are cut even without parse_special. */
    expect_ids(t, "a@@b", false, IDS(0, 21, 1));
    expect_ids(t, "@@@", false, IDS(21, 12));
    /* "<|im_end|>" is typed normal in the file but recognised as an end-of-generation text,
     * which makes it a control token, as llama.cpp does. */
    expect_ids(t, "<|im_end|>", true, IDS(22));
    assert_true(eng_tokenizer_is_eog(t, 22));
    assert_true(eng_tokenizer_is_eog(t, 18));      /* the eos key */
    assert_false(eng_tokenizer_is_eog(t, 0));
    assert_false(eng_tokenizer_is_eog(t, -1));
    assert_int_equal(eng_tokenizer_eot(t), 22);
    assert_int_equal(eng_tokenizer_find_special(t, "<|x|>"), 18);
    assert_int_equal(eng_tokenizer_find_special(t, "@@"), 21);
    assert_int_equal(eng_tokenizer_find_special(t, "ab"), -1);
    assert_int_equal(eng_tokenizer_find_special(t, "nope"), -1);
    eng_tokenizer_free(t);
}

static void small_vocab_metadata(void **state)
{
    (void)state;
    eng_tokenizer *t = small();
    assert_int_equal(eng_tokenizer_n_vocab(t), 24);
    assert_int_equal(eng_tokenizer_eos(t), 18);
    assert_int_equal(eng_tokenizer_bos(t), 11);   /* llama.cpp's default for "gpt2" vocabs */
    assert_false(eng_tokenizer_add_bos(t));
    int32_t *ids = NULL;
    size_t n = 0, cap = 0;
    assert_int_equal(eng_tokenize(t, "a", 1, true, false, &ids, &n, &cap), 0);
    assert_int_equal(n, 2);
    assert_int_equal(ids[0], 11);
    assert_int_equal(ids[1], 0);
    /* Appends: the caller's ids stay. */
    assert_int_equal(eng_tokenize(t, "b", 1, false, false, &ids, &n, &cap), 0);
    assert_int_equal(n, 3);
    assert_int_equal(ids[2], 1);
    free(ids);
    eng_tokenizer_free(t);
}

static void pieces(void **state)
{
    (void)state;
    eng_tokenizer *t = small();
    char buf[64];
    assert_int_equal(eng_token_piece(t, 17, false, buf, sizeof buf), 2);  /* "Ġa" -> " a" */
    assert_memory_equal(buf, " a", 2);
    assert_int_equal(eng_token_piece(t, 18, false, buf, sizeof buf), 0);  /* control */
    assert_int_equal(eng_token_piece(t, 18, true, buf, sizeof buf), 5);
    assert_memory_equal(buf, "<|x|>", 5);
    assert_int_equal(eng_token_piece(t, 21, false, buf, sizeof buf), 2);  /* user-defined */
    assert_int_equal(eng_token_piece(t, 23, true, buf, sizeof buf), 10);
    assert_memory_equal(buf, "[EMPTY_23]", 10);
    memset(buf, '#', sizeof buf);
    assert_int_equal(eng_token_piece(t, 15, false, buf, 2), 3);  /* too small: nothing written */
    assert_int_equal(buf[0], '#');
    assert_int_equal(eng_token_piece(t, 24, false, buf, sizeof buf), LLMGW_EINVAL);
    assert_int_equal(eng_token_piece(t, -1, false, buf, sizeof buf), LLMGW_EINVAL);
    eng_tokenizer_free(t);
}

static void bad_files_are_named(void **state)
{
    (void)state;
    eng_tokenizer *t = NULL;
    util_err err = {0};
    assert_int_equal(load_small(&t, (small_opts){.model = "llama"}, &err), LLMGW_EINVAL);
    assert_contains(err.msg, "small.gguf");
    assert_contains(err.msg, "\"llama\"");
    assert_int_equal(load_small(&t, (small_opts){.pre = "bogus-pre"}, &err), LLMGW_EINVAL);
    assert_contains(err.msg, "small.gguf");
    assert_contains(err.msg, "bogus-pre");
    assert_int_not_equal(load_small(&t, (small_opts){.no_merges = true}, &err), 0);
    assert_contains(err.msg, "tokenizer.ggml.merges");
    assert_int_equal(load_small(&t, (small_opts){.short_types = true}, &err), LLMGW_EINVAL);
    assert_contains(err.msg, "token_type");
    assert_null(t);
    eng_tokenizer_free(NULL);
}

/* ---- streaming detokenization ---- */

/* Pushes `s` cut at the given points, then flushes, and checks that each output fits the
 * documented capacity and that the whole comes out as want[0..want_len). */
static void stream(const char *s, size_t len, const size_t *cuts, size_t n_cuts,
                   const char *want, size_t want_len)
{
    eng_detok d = {0};
    char out[ENG_DETOK_OUT_CAP(64)], all[ENG_DETOK_OUT_CAP(64)];
    size_t n_all = 0, from = 0;
    assert_true(len <= 64);
    for (size_t i = 0; i <= n_cuts; i++) {
        size_t to = i < n_cuts ? cuts[i] : len;
        size_t n = eng_detok_push(&d, s + from, to - from, out);
        assert_true(n <= ENG_DETOK_OUT_CAP(to - from));
        memcpy(all + n_all, out, n);
        n_all += n;
        from = to;
    }
    assert_int_equal(eng_detok_flush(&d, out), 0);
    assert_int_equal(n_all, want_len);
    assert_memory_equal(all, want, want_len);
    assert_int_equal(d.n_pending, 0);
}

static void detok_holds_split_characters(void **state)
{
    (void)state;
    eng_detok d = {0};
    char out[ENG_DETOK_OUT_CAP(8)];
    /* 😀 = F0 9F 98 80, byte by byte: nothing until the last byte. */
    assert_int_equal(eng_detok_push(&d, "\xf0", 1, out), 0);
    assert_int_equal(eng_detok_push(&d, "\x9f", 1, out), 0);
    assert_int_equal(eng_detok_push(&d, "\x98", 1, out), 0);
    assert_int_equal(eng_detok_push(&d, "\x80!", 2, out), 5);
    assert_memory_equal(out, "\xf0\x9f\x98\x80!", 5);
    /* 中 split 1+2 after some ASCII: the ASCII comes out at once. */
    assert_int_equal(eng_detok_push(&d, "ab\xe4", 3, out), 2);
    assert_int_equal(eng_detok_push(&d, "\xb8\xad", 2, out), 3);
    assert_memory_equal(out, "\xe4\xb8\xad", 3);
    /* An empty piece keeps what is pending. */
    assert_int_equal(eng_detok_push(&d, "\xe4", 1, out), 0);
    assert_int_equal(eng_detok_push(&d, "", 0, out), 0);
    assert_int_equal(eng_detok_push(&d, "\xb8\xad", 2, out), 3);

    const char *emoji = "x\xf0\x9f\x91\x8d\xf0\x9f\x8f\xbd y \xe4\xb8\xad\xe6\x96\x87";
    size_t len = strlen(emoji);
    for (size_t a = 0; a <= len; a++)
        for (size_t b = a; b <= len; b++)
            stream(emoji, len, (size_t[]){a, b}, 2, emoji, len);
}

#define FFFD "\xef\xbf\xbd"

/* Pushes `in` whole into a fresh detok and compares the output with want. */
static void replaced(const char *in, size_t len, const char *want)
{
    eng_detok d = {0};
    char out[ENG_DETOK_OUT_CAP(16)];
    assert_true(len <= 16);
    size_t n = eng_detok_push(&d, in, len, out);
    assert_true(n <= ENG_DETOK_OUT_CAP(len));
    assert_int_equal(n, strlen(want));
    assert_memory_equal(out, want, n);
}

static void detok_replaces_hopeless_bytes(void **state)
{
    (void)state;
    replaced("\x80", 1, FFFD);                               /* a lone continuation */
    replaced("\xe4" "A", 2, FFFD "A");                       /* a lead, then no continuation */
    replaced("\xff\xc0\xc1", 3, FFFD FFFD FFFD);             /* bytes that start nothing */
    replaced("\xc0\xaf", 2, FFFD FFFD);                      /* an overlong '/' */
    replaced("\xe0\x80\x80", 3, FFFD FFFD FFFD);             /* an overlong NUL */
    replaced("\xed\xa0\x80", 3, FFFD FFFD FFFD);             /* a surrogate */
    replaced("\xf4\x90\x80\x80", 4, FFFD FFFD FFFD FFFD);    /* past U+10FFFF */
    replaced("\xf5\x80", 2, FFFD FFFD);
    /* A maximal subpart (a lead with the continuations that fit it) is one U+FFFD. */
    replaced("\xe4\xb8z", 3, FFFD "z");
    replaced("\xf0\x9f\x98" "A", 4, FFFD "A");
    replaced("\xf0\x9f\xf0\x9f\x98\x80", 6, FFFD "\xf0\x9f\x98\x80");
    replaced("a\xe2\x82\xac\x80" "b", 6, "a\xe2\x82\xac" FFFD "b");  /* € then a stray byte */

    /* Pending bytes broken by the next piece become one U+FFFD in that push. */
    eng_detok d = {0};
    char out[ENG_DETOK_OUT_CAP(4)];
    assert_int_equal(eng_detok_push(&d, "\xe4\xb8", 2, out), 0);
    assert_int_equal(eng_detok_push(&d, "z", 1, out), 4);
    assert_memory_equal(out, FFFD "z", 4);
    /* The most a push writes: broken pending bytes, then a byte that starts nothing. */
    assert_int_equal(eng_detok_push(&d, "\xf0\x9f", 2, out), 0);
    assert_int_equal(eng_detok_push(&d, "\xff", 1, out), ENG_DETOK_OUT_CAP(1));
    assert_memory_equal(out, FFFD FFFD, 6);
    assert_int_equal(d.n_pending, 0);
}

/* Generation cut inside a character (max_tokens, the context) gives no half character: flush
 * drops it, so each answer is a prefix of what a longer generation gives. */
static void detok_flush_drops_an_incomplete_tail(void **state)
{
    (void)state;
    eng_detok d = {0};
    char out[ENG_DETOK_OUT_CAP(8)];
    assert_int_equal(eng_detok_push(&d, "ab\xf0\x9f\x98", 5, out), 2);
    memset(out, 'x', sizeof out);
    assert_int_equal(eng_detok_flush(&d, out), 0);
    assert_int_equal(out[0], 'x');                           /* nothing written */
    assert_int_equal(d.n_pending, 0);
    assert_int_equal(eng_detok_push(&d, "\x80", 1, out), 3);  /* a new stream: a stray byte */
    assert_memory_equal(out, FFFD, 3);
    stream("\xf0\x9f\x98", 3, (size_t[]){1}, 1, "", 0);

    /* Every cut of a text (valid or not) streams to a prefix of the whole text's output. */
    const char *texts[] = {"hi \xf0\x9f\x98\x80 \xe4\xb8\xad!",
                           "a\xe4\xb8" "b\xf0\x9f\x98\xed\xa0"};
    for (size_t t = 0; t < 2; t++) {
        const char *s = texts[t];
        size_t len = strlen(s);
        char whole[ENG_DETOK_OUT_CAP(32)], part[ENG_DETOK_OUT_CAP(32)];
        eng_detok w = {0};
        size_t n_whole = eng_detok_push(&w, s, len, whole);
        n_whole += eng_detok_flush(&w, whole + n_whole);
        for (size_t cut = 0; cut <= len; cut++) {
            eng_detok p = {0};
            size_t n = eng_detok_push(&p, s, cut, part);
            n += eng_detok_flush(&p, part + n);
            assert_true(n <= n_whole);
            assert_memory_equal(part, whole, n);
            assert_true(utf8_valid(part, n));
        }
    }
}

static uint64_t xorshift(uint64_t *x)
{
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

/* A byte that makes interesting UTF-8: ASCII, continuations, every kind of lead (the special
 * second-byte ranges of E0, ED, F0 and F4 included) and bytes that start nothing. */
static unsigned char random_byte(uint64_t *x)
{
    static const unsigned char pick[] = {'a', ' ', 0x80, 0x8f, 0x90, 0x9f, 0xa0, 0xbf, 0xc0, 0xc1,
                                         0xc2, 0xdf, 0xe0, 0xe4, 0xed, 0xef, 0xf0, 0xf3, 0xf4,
                                         0xf5, 0xff};
    uint64_t r = xorshift(x);
    return r & 1 ? (unsigned char)(r >> 8) : pick[(r >> 8) % sizeof pick];
}

/* Random bytes cut into random pieces: the output is valid UTF-8 and does not depend on the
 * cuts; valid input comes out unchanged. */
static void detok_output_is_always_valid_utf8(void **state)
{
    (void)state;
    /* The validator itself. */
    assert_true(utf8_valid("a\xc2\x80\xe4\xb8\xad\xf0\x9f\x98\x80\xf4\x8f\xbf\xbf", 14));
    assert_false(utf8_valid("\xc0\xaf", 2));
    assert_false(utf8_valid("\xed\xa0\x80", 3));
    assert_false(utf8_valid("\xf4\x90\x80\x80", 4));
    assert_false(utf8_valid("\xe4\xb8", 2));
    assert_false(utf8_valid("\x80", 1));

    uint64_t x = 0x9e3779b97f4a7c15u;
    unsigned char in[48];
    char whole[ENG_DETOK_OUT_CAP(48)], out[ENG_DETOK_OUT_CAP(48)], all[ENG_DETOK_OUT_CAP(48)];
    int valid_inputs = 0;
    for (int round = 0; round < 20000; round++) {
        size_t len = xorshift(&x) % (sizeof in + 1);
        for (size_t i = 0; i < len; i++)
            in[i] = random_byte(&x);
        eng_detok d = {0};
        size_t n_whole = eng_detok_push(&d, (const char *)in, len, whole);
        n_whole += eng_detok_flush(&d, whole + n_whole);
        assert_true(utf8_valid(whole, n_whole));
        if (utf8_valid((const char *)in, len)) {
            valid_inputs++;
            assert_int_equal(n_whole, len);
            assert_memory_equal(whole, in, len);
        }
        size_t n_all = 0;
        for (size_t from = 0; from < len;) {
            size_t k = 1 + xorshift(&x) % (len - from < 6 ? len - from : 6);
            size_t n = eng_detok_push(&d, (const char *)in + from, k, out);
            assert_true(n <= ENG_DETOK_OUT_CAP(k));
            assert_true(utf8_valid(out, n));
            memcpy(all + n_all, out, n);
            n_all += n;
            from += k;
        }
        n_all += eng_detok_flush(&d, all + n_all);
        assert_int_equal(n_all, n_whole);
        assert_memory_equal(all, whole, n_whole);
    }
    assert_true(valid_inputs > 100);
}

/* ---- the real model ---- */

static eng_tokenizer *g_smol;  /* NULL when the model is absent */

static int setup(void **state)
{
    (void)state;
    char path[4096];
    smollm2_path(path, sizeof path);
    eng_gguf *g = NULL;
    util_err err = {0};
    if (eng_gguf_open(&g, path, &err) != 0) {
        fprintf(stderr, "test_tokenizer: model tests skipped (run scripts/fetch-models): %s\n",
                err.msg);
        return 0;
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int rc = eng_tokenizer_load(&g_smol, g, &err);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    eng_gguf_close(g);
    if (rc != 0) {
        fprintf(stderr, "test_tokenizer: %s\n", err.msg);
        return -1;
    }
    printf("[ INFO     ] SmolLM2 tokenizer loaded in %.1f ms\n",
           (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    eng_tokenizer_free(g_smol);
    return 0;
}

#define NEED_MODEL()                                                                             \
    do {                                                                                         \
        if (g_smol == NULL)                                                                      \
            skip();                                                                              \
    } while (0)

static void smollm2_metadata(void **state)
{
    (void)state;
    NEED_MODEL();
    const eng_tokenizer *t = g_smol;
    assert_int_equal(eng_tokenizer_n_vocab(t), 49152);
    assert_int_equal(eng_tokenizer_bos(t), 1);
    assert_int_equal(eng_tokenizer_eos(t), 2);
    /* llama.cpp picks <|endoftext|> or <|im_end|> by its hash map's order (it says 0 here); we
     * take <|im_end|>, the end of a ChatML turn. Both end generation. */
    assert_int_equal(eng_tokenizer_eot(t), 2);
    assert_false(eng_tokenizer_add_bos(t));
    for (int32_t i = 0; i < 100; i++)  /* 0 <|endoftext|>, 2 <|im_end|>, 4 <reponame> (fim_rep) */
        assert_int_equal(eng_tokenizer_is_eog(t, i), i == 0 || i == 2 || i == 4);
    assert_int_equal(eng_tokenizer_find_special(t, "<|im_start|>"), 1);
    assert_int_equal(eng_tokenizer_find_special(t, "<|im_end|>"), 2);
    assert_int_equal(eng_tokenizer_find_special(t, "hello"), -1);
}

/* Ids from llama.cpp 0c1e57098, so that the model is checked even without the golden file. */
static void smollm2_known_ids(void **state)
{
    (void)state;
    NEED_MODEL();
    expect_ids(g_smol, "Hello, world!", true, IDS(19556, 28, 905, 17));
    expect_ids(g_smol, "<|im_start|>user\nI'm 1234 years old   ok<|im_end|>", true,
               IDS(1, 4093, 198, 57, 5248, 216, 33, 34, 35, 36, 929, 1573, 256, 10907, 2));
    expect_ids(g_smol, "<|im_start|>user\nI'm 1234 years old   ok<|im_end|>", false,
               IDS(44, 108, 306, 79, 3738, 108, 46, 4093, 198, 57, 5248, 216, 33, 34, 35, 36, 929,
                   1573, 256, 10907, 44, 108, 306, 79, 486, 108, 46));
    expect_ids(g_smol, "  \xe4\xbd\xa0\xe5\xa5\xbd \xf0\x9f\x8d\x95\n", false,
               IDS(216, 216, 18645, 250, 48392, 138, 15107, 231, 239, 198));
}

static size_t b64_decode(const char *s, unsigned char *out)
{
    size_t n = 0;
    uint32_t acc = 0;
    int bits = 0;
    for (; *s && *s != '='; s++) {
        const char *a = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        const char *p = strchr(a, *s);
        assert_non_null(p);
        acc = acc << 6 | (uint32_t)(p - a);
        if ((bits += 6) >= 8) {
            bits -= 8;
            out[n++] = (unsigned char)(acc >> bits);
        }
    }
    return n;
}

static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *p = malloc((size_t)n + 1);
    assert_non_null(p);
    assert_int_equal(fread(p, 1, (size_t)n, f), (size_t)n);
    p[n] = '\0';
    fclose(f);
    *len = (size_t)n;
    return p;
}

/* The concatenated pieces of ids. */
static size_t render_ids(const int32_t *ids, size_t n, bool special, char *out)
{
    size_t len = 0;
    for (size_t i = 0; i < n; i++) {
        int k = eng_token_piece(g_smol, ids[i], special, out + len, 1 << 16);
        assert_true(k >= 0);
        len += (size_t)k;
    }
    return len;
}

static void check_b64(const cJSON *c, const char *key, const char *got, size_t n, const char *name)
{
    static unsigned char want[1 << 16];
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(c, key);
    assert_true(cJSON_IsString(v));
    size_t m = b64_decode(v->valuestring, want);
    if (m != n || memcmp(want, got, n) != 0) {
        print_error("%s: %s differs from llama.cpp's\n", name, key);
        fail();
    }
}

static void smollm2_matches_golden(void **state)
{
    (void)state;
    NEED_MODEL();
    size_t len;
    char *json = read_file(LLMGW_SOURCE_DIR "/tests/golden/smollm2_tokens.json", &len);
    if (json == NULL) {
        printf("[ INFO     ] tests/golden/smollm2_tokens.json absent: golden comparison skipped\n");
        skip();
    }
    cJSON *doc = cJSON_ParseWithLength(json, len);
    assert_non_null(doc);
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(doc, "vocab");
#define VOCAB_INT(key) cJSON_GetObjectItemCaseSensitive(vocab, key)->valueint
    assert_int_equal(VOCAB_INT("n_vocab"), 49152);
    assert_int_equal(VOCAB_INT("bos"), eng_tokenizer_bos(g_smol));
    assert_int_equal(VOCAB_INT("eos"), eng_tokenizer_eos(g_smol));
    assert_int_equal(VOCAB_INT("eot"), 0);  /* we say 2: see smollm2_metadata */
    assert_int_equal(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(vocab, "add_bos")),
                     eng_tokenizer_add_bos(g_smol));
    const cJSON *v;
    size_t n_eog = 0, n_control = 0;
    cJSON_ArrayForEach(v, cJSON_GetObjectItemCaseSensitive(vocab, "eog_ids")) {
        assert_true(eng_tokenizer_is_eog(g_smol, v->valueint));
        n_eog++;
    }
    cJSON_ArrayForEach(v, cJSON_GetObjectItemCaseSensitive(vocab, "control_ids")) {
        assert_true(g_smol->attr[v->valueint] & ENG__ATTR_CONTROL);
        n_control++;
    }
    size_t our_eog = 0, our_control = 0;
    for (int32_t i = 0; i < eng_tokenizer_n_vocab(g_smol); i++) {
        our_eog += eng_tokenizer_is_eog(g_smol, i);
        our_control += (g_smol->attr[i] & ENG__ATTR_CONTROL) != 0;
    }
    assert_int_equal(our_eog, n_eog);
    assert_int_equal(our_control, n_control);

    size_t n_cases = 0;
    static unsigned char text[1 << 16];
    static char got[1 << 16];
    const cJSON *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItemCaseSensitive(doc, "cases")) {
        const char *name = cJSON_GetObjectItemCaseSensitive(c, "name")->valuestring;
        size_t tl = b64_decode(cJSON_GetObjectItemCaseSensitive(c, "text_b64")->valuestring, text);
        for (int ps = 0; ps < 2; ps++) {
            char key[64];
            const char *mode = ps ? "special" : "nospecial";
            int32_t *ids = NULL;
            size_t n = 0, cap = 0, i = 0;
            assert_int_equal(eng_tokenize(g_smol, (const char *)text, tl,
                                          eng_tokenizer_add_bos(g_smol), ps, &ids, &n, &cap), 0);
            snprintf(key, sizeof key, "ids_%s", mode);
            const cJSON *want = cJSON_GetObjectItemCaseSensitive(c, key);
            bool same = (size_t)cJSON_GetArraySize(want) == n;
            cJSON_ArrayForEach(v, want) {
                same = same && i < n && ids[i] == v->valueint;
                i++;
            }
            if (!same) {
                print_error("%s (parse_special %d): ids differ from llama.cpp's:", name, ps);
                for (i = 0; i < n; i++)
                    print_error(" %d", ids[i]);
                print_error("\n");
                fail();
            }
            snprintf(key, sizeof key, "pieces_%s_b64", mode);
            check_b64(c, key, got, render_ids(ids, n, true, got), name);
            snprintf(key, sizeof key, "detok_%s_b64", mode);  /* smollm: no space clean-up */
            check_b64(c, key, got, render_ids(ids, n, true, got), name);
            snprintf(key, sizeof key, "pieces_%s_nocontrol_b64", mode);
            check_b64(c, key, got, render_ids(ids, n, false, got), name);
            free(ids);
        }
        n_cases++;
    }
    printf("[ INFO     ] %zu golden strings x 2 modes: ids, pieces and detokenized bytes identical "
           "to llama.cpp\n", n_cases);
    assert_true(n_cases >= 30);
    cJSON_Delete(doc);
    free(json);
}

/* Text as llama.cpp reads it (a byte that starts no character is U+FFFD), less the bytes whose
 * token the vocabulary lacks (SmolLM2 has none for 21 bytes: 04 06 13 14 16 1D C0 C1 F1-FF). */
static size_t as_read(const char *s, size_t n, char *out)
{
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        size_t m;
        unsigned char enc[4];
        size_t e = eng_utf8_put(eng_utf8_next((const unsigned char *)s + i, n - i, &m), enc);
        for (size_t j = 0; j < e; j++)
            if (g_smol->sym_tok[g_smol->byte_sym[enc[j]]] >= 0)
                out[o++] = (char)enc[j];
        i += m;
    }
    return o;
}

/* Byte-level BPE loses nothing but what it cannot spell: without parse_special, the pieces give
 * back the text as read. */
static void smollm2_round_trips(void **state)
{
    (void)state;
    NEED_MODEL();
    static char got[1 << 16], want[1 << 16];
    unsigned seed = 99;
    char text[512];
    size_t n_missing = 0;
    for (int b = 0; b < 256; b++)
        n_missing += g_smol->sym_tok[g_smol->byte_sym[b]] < 0;
    assert_int_equal(n_missing, 21);
    for (int iter = 0; iter < 3000; iter++) {
        size_t len = (size_t)(rand_r(&seed) % sizeof text);
        for (size_t i = 0; i < len; i++) {
            unsigned r = (unsigned)rand_r(&seed);
            if (r % 4 == 0)
                text[i] = (char)(r >> 8);  /* any byte */
            else if (r % 4 == 1)
                text[i] = (char)(' ' + (r >> 8) % 95);
            else
                text[i] = "<|im_end>\n \xe4\xb8\xad"[(r >> 8) % 14];
        }
        int32_t *ids = NULL;
        size_t n = 0, cap = 0;
        assert_int_equal(eng_tokenize(g_smol, text, len, false, false, &ids, &n, &cap), 0);
        size_t m = render_ids(ids, n, true, got), w = as_read(text, len, want);
        if (m != w || memcmp(got, want, w) != 0) {
            print_error("round trip of %zu bytes gave %zu, want %zu\n", len, m, w);
            fail();
        }
        free(ids);
    }
    /* Well-formed text of spellable bytes comes back exactly. */
    const char *ok = "caf\xc3\xa9 \xf0\x9f\x8d\x95\t<|im_end|>\r\n \xe4\xb8\xad\x01";
    int32_t *ids = NULL;
    size_t n = 0, cap = 0;
    assert_int_equal(eng_tokenize(g_smol, ok, strlen(ok), false, false, &ids, &n, &cap), 0);
    assert_int_equal(render_ids(ids, n, true, got), strlen(ok));
    assert_memory_equal(got, ok, strlen(ok));
    /* Invalid UTF-8 gives llama.cpp's ids: U+FFFD is token 24211, overlong C0 80 is NUL (190). */
    free(ids);
    expect_ids(g_smol, "a\xff" "b", false, IDS(81, 24211, 82));
    expect_ids(g_smol, "\xc0\x80", false, IDS(190));
}

typedef struct job {
    const char *text;
    size_t len;
    int32_t *ids;
    size_t n;
} job;

static void *run_job(void *arg)
{
    job *j = arg;
    size_t cap = 0;
    for (int r = 0; r < 50; r++) {
        j->n = 0;
        if (eng_tokenize(g_smol, j->text, j->len, false, true, &j->ids, &j->n, &cap) != 0)
            return (void *)1;
    }
    return NULL;
}

static char *long_prompt(size_t *len)
{
    static const char *const parts[] = {
        "The quick brown fox jumps over the lazy dog. ", "It's 12:30, and 3.14159 > 3! ",
        "def f(x):\n    return x * 2\n\n",
        "\xe4\xbd\xa0\xe5\xa5\xbd\xef\xbc\x8c\xe4\xb8\x96\xe7\x95\x8c",
        "<|im_start|>user\nHello!<|im_end|>\n", " \xf0\x9f\x8d\x95\xf0\x9f\x8e\x89  ",
        "\t\tindented\n",
    };
    char *p = malloc(4097);
    size_t n = 0;
    for (size_t i = 0; n < 4000; i++) {
        size_t l = strlen(parts[i % 7]);
        if (n + l > 4096)
            break;
        memcpy(p + n, parts[i % 7], l);
        n += l;
    }
    *len = n;
    return p;
}

static void smollm2_threads_and_speed(void **state)
{
    (void)state;
    NEED_MODEL();
    size_t len;
    char *p = long_prompt(&len);
    int32_t *ids = NULL;
    size_t n = 0, cap = 0;
    struct timespec t0, t1;
    int reps = 200;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int r = 0; r < reps; r++) {
        n = 0;
        assert_int_equal(eng_tokenize(g_smol, p, len, false, true, &ids, &n, &cap), 0);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double us = ((double)(t1.tv_sec - t0.tv_sec) * 1e9 + (double)(t1.tv_nsec - t0.tv_nsec)) /
                1e3 / reps;
    printf("[ INFO     ] tokenize %zu bytes -> %zu tokens: %.1f us per call\n", len, n, us);

    /* One tokenizer, two threads at once: same ids as alone. */
    job j[2] = {{p, len, NULL, 0}, {p, len, NULL, 0}};
    pthread_t th[2];
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&th[i], NULL, run_job, &j[i]), 0);
    for (int i = 0; i < 2; i++) {
        void *ret;
        pthread_join(th[i], &ret);
        assert_null(ret);
        assert_int_equal(j[i].n, n);
        assert_memory_equal(j[i].ids, ids, n * sizeof *ids);
        free(j[i].ids);
    }
    free(ids);
    free(p);
}

/* ---- llama.cpp's vocabulary tests (models/ggml-vocab-*.gguf with .inp/.out) ---- */

static void llama_cpp_vocab_files(void **state)
{
    (void)state;
    char dir[4096];
    const char *cache = getenv("LLMGW_CACHE");
    const char *home = getenv("HOME");
    if (cache != NULL)
        snprintf(dir, sizeof dir, "%s", cache);
    else
        snprintf(dir, sizeof dir, "%s/.cache/llmgw", home ? home : "/root");
    static const char *const vocabs[] = {"llama-bpe", "qwen2", "gpt-2", "starcoder", "refact",
                                         "command-r", "mpt"};
    size_t n_files = 0, n_strings = 0;
    for (size_t v = 0; v < sizeof vocabs / sizeof vocabs[0]; v++) {
        char path[4600], inp_path[4700], out_path[4700];
        snprintf(path, sizeof path,
                 "%s/llama.cpp/llama_cpp_python-0.3.36/vendor/llama.cpp/models/ggml-vocab-%s.gguf",
                 dir, vocabs[v]);
        snprintf(inp_path, sizeof inp_path, "%s.inp", path);
        snprintf(out_path, sizeof out_path, "%s.out", path);
        size_t il, ol;
        char *inp = read_file(inp_path, &il), *out = read_file(out_path, &ol);
        eng_gguf *g = NULL;
        eng_tokenizer *t = NULL;
        util_err err = {0};
        if (inp == NULL || out == NULL || eng_gguf_open(&g, path, &err) != 0) {
            free(inp);
            free(out);
            continue;
        }
        if (eng_tokenizer_load(&t, g, &err) != 0)
            print_error("%s\n", err.msg);
        assert_non_null(t);
        eng_gguf_close(g);
        /* Tests are separated by "\n__ggml_vocab_test__\n"; one line of ids per test. */
        const char *sep = "\n__ggml_vocab_test__\n";
        char *s = inp, *line = out;
        while (s < inp + il) {
            char *end = strstr(s, sep);
            size_t sl = end ? (size_t)(end - s) : (size_t)(inp + il - s);
            char *nl = strchr(line, '\n');
            assert_non_null(line);
            int32_t *ids = NULL;
            size_t n = 0, cap = 0, k = 0;
            assert_int_equal(eng_tokenize(t, s, sl, false, false, &ids, &n, &cap), 0);
            for (char *q = line; q < (nl ? nl : line + strlen(line));) {
                long id = strtol(q, &q, 10);
                if (k >= n || ids[k] != id) {
                    print_error("%s: test %zu: id %zu is %d, llama.cpp says %ld\n", vocabs[v],
                                n_strings, k, k < n ? ids[k] : -1, id);
                    fail();
                }
                k++;
                while (*q == ' ')
                    q++;
            }
            assert_int_equal(k, n);
            free(ids);
            n_strings++;
            line = nl ? nl + 1 : line + strlen(line);
            if (end == NULL)
                break;
            s = end + strlen(sep);
        }
        eng_tokenizer_free(t);
        free(inp);
        free(out);
        n_files++;
    }
    if (n_files == 0) {
        printf("[ INFO     ] llama.cpp's vocabulary files absent (scripts/build-llamacpp-ref): "
               "skipped\n");
        skip();
    }
    printf("[ INFO     ] llama.cpp vocabulary tests: %zu vocabularies, %zu strings identical\n",
           n_files, n_strings);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(merges_by_rank_then_leftmost),
        cmocka_unit_test(specials_are_cut_longest_first),
        cmocka_unit_test(small_vocab_metadata),
        cmocka_unit_test(pieces),
        cmocka_unit_test(bad_files_are_named),
        cmocka_unit_test(detok_holds_split_characters),
        cmocka_unit_test(detok_replaces_hopeless_bytes),
        cmocka_unit_test(detok_flush_drops_an_incomplete_tail),
        cmocka_unit_test(detok_output_is_always_valid_utf8),
        cmocka_unit_test(smollm2_metadata),
        cmocka_unit_test(smollm2_known_ids),
        cmocka_unit_test(smollm2_matches_golden),
        cmocka_unit_test(smollm2_round_trips),
        cmocka_unit_test(smollm2_threads_and_speed),
        cmocka_unit_test(llama_cpp_vocab_files),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
