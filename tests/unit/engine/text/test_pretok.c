/* tests/unit/engine/text/test_pretok.c: the pre-tokenizer (eng_pretok_*): known splits per family,
 * and a cross-check of the hand-written splitters against the regexes they stand for, run by
 * PCRE2 in Unicode mode on random text. (Agreement with llama.cpp itself, on the real
 * vocabularies, is test_tokenizer's job.) */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "engine/text/pretok.h"

#include "tests/unit/unit.h"

#include <pcre2.h>
#include <stdlib.h>

/* Splits `text` with pre-tokenizer `name` and checks the words are `want` (NULL-terminated). */
static void check_split(const char *name, const char *text, const char *const *want)
{
    eng_pretok *p = NULL;
    eng_pretok_work w = {0};
    const uint32_t *ends;
    const char *words;
    size_t n = 0, start = 0, i = 0, total = 0;
    assert_int_equal(eng_pretok_new(&p, name, strlen(name), NULL), 0);
    assert_int_equal(eng_pretok_split(p, text, strlen(text), &w, &words, &ends, &n), 0);
    for (; i < n; start = ends[i++]) {
        char word[256];
        assert_true(ends[i] > start && ends[i] - start < sizeof word);
        memcpy(word, words + start, ends[i] - start);
        word[ends[i] - start] = '\0';
        if (want[i] == NULL || strcmp(word, want[i]) != 0)
            print_error("%s: word %zu of \"%s\" is \"%s\", want \"%s\"\n", name, i, text, word,
                        want[i] ? want[i] : "(end)");
        assert_non_null(want[i]);
        assert_string_equal(word, want[i]);
    }
    assert_null(want[i]);
    for (i = 0; want[i] != NULL; i++)
        total += strlen(want[i]);
    assert_int_equal(start, total);
    eng_pretok_work_deinit(&w);
    eng_pretok_free(p);
}

static void smollm_isolates_digits(void **state)
{
    (void)state;
    check_split("smollm", "Hello world 2024, it's 3.14!",
                (const char *[]){"Hello", " world", " ", "2", "0", "2", "4", ",", " it", "'s", " ",
                                 "3", ".", "1", "4", "!", NULL});
    check_split("smollm", "x  \n\n  y\t", (const char *[]){"x", "  \n\n ", " y", "\t", NULL});
    check_split("smollm", "\xd9\xa3\xc2\xbd", (const char *[]){"\xd9\xa3", "\xc2\xbd", NULL});
}

static void gpt2_keeps_numbers_whole(void **state)
{
    (void)state;
    check_split("gpt-2", "I'M at 12345 ok",
                (const char *[]){"I", "'", "M", " at", " 12345", " ok", NULL});
    check_split("gpt2", "a   b", (const char *[]){"a", "  ", " b", NULL});
}

static void llama3_groups_digits_by_three(void **state)
{
    (void)state;
    check_split("llama-bpe", "I'M at 1234567 ok",
                (const char *[]){"I", "'M", " at", " ", "123", "456", "7", " ok", NULL});
    check_split("llama3", "end.\n\n  next", (const char *[]){"end", ".\n\n", " ", " next", NULL});
    check_split("llama3", "a \n b", (const char *[]){"a", " \n", " b", NULL});
    check_split("qwen2", "v1.25", (const char *[]){"v", "1", ".", "2", "5", NULL});
}

static void invalid_utf8_reads_as_llama_cpp_reads_it(void **state)
{
    (void)state;
    /* 0xFF reads as U+FFFD (a symbol), so it is a word of its own between letters. */
    check_split("smollm", "a\xff" "b \x80\x80",
                (const char *[]){"a", "\xef\xbf\xbd", "b", " \xef\xbf\xbd\xef\xbf\xbd", NULL});
    /* An overlong form is its codepoint: C1 81 is "A", a letter like the next one. */
    check_split("smollm", "\xc1\x81" "b\xe4\xb8",
                (const char *[]){"Ab", "\xef\xbf\xbd\xef\xbf\xbd", NULL});
    check_split("smollm", "", (const char *[]){NULL});
}

static void unknown_names_are_errors(void **state)
{
    (void)state;
    eng_pretok *p = NULL;
    util_err err = {0};
    assert_int_equal(eng_pretok_new(&p, "bogus-pre", 9, &err), LLMGW_EINVAL);
    assert_null(p);
    assert_contains(err.msg, "bogus-pre");
    /* The name is a counted string: a longer buffer does not match a shorter name. */
    assert_int_equal(eng_pretok_new(&p, "smollm2", 7, &err), LLMGW_EINVAL);
    assert_int_equal(eng_pretok_new(&p, "smollm2", 6, &err), 0);
    assert_false(eng_pretok_ignore_merges(p));
    eng_pretok_free(p);
    assert_int_equal(eng_pretok_new(&p, "llama-bpe", 9, &err), 0);
    assert_true(eng_pretok_ignore_merges(p));
    assert_true(eng_pretok_default_add_bos(p));
    eng_pretok_free(p);
    eng_pretok_free(NULL);
}

/* ---- cross-check against the regexes ---- */

/* \s and \S spelled out as llama.cpp's White_Space set (PCRE2's \s differs on U+0085). */
#define WS "\\t\\n\\x{0b}\\f\\r\\x{20}\\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}" \
           "\\x{2028}\\x{2029}\\x{202f}\\x{205f}\\x{3000}"
#define GPT2_RE "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^" WS "\\p{L}\\p{N}]+|[" WS \
                "]+(?![^" WS "])|[" WS "]+"
#define LLAMA3_RE(num) "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])" \
                       "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|" num "| ?[^" WS "\\p{L}\\p{N}]+[\\r\\n]*" \
                       "|[" WS "]*[\\r\\n]+|[" WS "]+(?![^" WS "])|[" WS "]+"

/* Splits every piece ending at in[0..n_in) with `re`: matches and the gaps between them are
 * words. Returns the number of words, their ends in out. */
static size_t regex_pass(const pcre2_code *re, pcre2_match_data *md, const char *s,
                         const uint32_t *in, size_t n_in, uint32_t *out)
{
    size_t n = 0, start = 0;
    for (size_t i = 0; i < n_in; start = in[i++]) {
        size_t len = in[i] - start, off = 0;
        while (off < len && pcre2_match(re, (PCRE2_SPTR)s + start, len, off, 0, md, NULL) >= 0) {
            const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
            assert_true(ov[1] > ov[0]);  /* none of these patterns matches empty */
            if (ov[0] > off)
                out[n++] = (uint32_t)(start + ov[0]);
            out[n++] = (uint32_t)(start + ov[1]);
            off = ov[1];
        }
        if (off < len)
            out[n++] = (uint32_t)in[i];
    }
    return n;
}

/* Characters whose class is the same in PCRE2 10.42's Unicode 14 and in Unicode 15.1. */
static const char *const atoms[] = {
    "a", "Z", "hello", " world", "'s", "'S", "'re", "'LL", "'d", "'x", "'", " ", "  ", "\t", "\n",
    "\r\n", "\r", "\v", "\f", "\xc2\xa0", "\xe3\x80\x80", "\xe2\x80\x89", "\xe2\x80\xa8", "0",
    "12", "12345", "\xd9\xa3", "\xc2\xb2", "\xc2\xbd", "\xe2\x85\xab", "\xc3\xa9", "\xd0\x9f",
    "\xe4\xb8\xad\xe6\x96\x87", "\xcc\x81", "\xe2\x80\x8d", "\xf0\x9f\x98\x80", ".", ",", "!?",
    "(", "<|", "$", "+", "=", "_", "\xe2\x82\xac", "\xcd\xb8", "\xee\x80\x80", "\x01",
};

static void cross_check(const char *name, const char *const *patterns)
{
    eng_pretok *p = NULL;
    eng_pretok_work w = {0};
    char text[1024];
    static uint32_t a[1024], b[1024];
    unsigned seed = 12345;
    pcre2_code *re[4] = {NULL};
    size_t n_re = 0;
    for (; patterns[n_re] != NULL; n_re++) {
        int code;
        PCRE2_SIZE at;
        re[n_re] = pcre2_compile((PCRE2_SPTR)patterns[n_re], PCRE2_ZERO_TERMINATED,
                                 PCRE2_UTF | PCRE2_UCP, &code, &at, NULL);
        assert_non_null(re[n_re]);
    }
    pcre2_match_data *md = pcre2_match_data_create(4, NULL);
    assert_int_equal(eng_pretok_new(&p, name, strlen(name), NULL), 0);
    for (int iter = 0; iter < 20000; iter++) {
        size_t len = 0;
        int parts = 1 + (int)(rand_r(&seed) % 24);
        for (int k = 0; k < parts; k++) {
            const char *at = atoms[rand_r(&seed) % (sizeof atoms / sizeof atoms[0])];
            memcpy(text + len, at, strlen(at));
            len += strlen(at);
        }
        text[len] = '\0';
        size_t n = 1;
        a[0] = (uint32_t)len;
        for (size_t r = 0; r < n_re; r++) {
            n = regex_pass(re[r], md, text, a, n, b);
            memcpy(a, b, n * sizeof *a);
        }
        const uint32_t *ends;
        const char *words;
        size_t m = 0;
        assert_int_equal(eng_pretok_split(p, text, len, &w, &words, &ends, &m), 0);
        assert_ptr_equal(words, text);  /* well-formed UTF-8 is split in place */
        if (m != n || memcmp(ends, a, n * sizeof *a) != 0) {
            print_error("%s splits \"%s\" into %zu words, the regex into %zu\n", name, text, m, n);
            fail();
        }
    }
    for (size_t r = 0; r < n_re; r++)
        pcre2_code_free(re[r]);
    pcre2_match_data_free(md);
    eng_pretok_work_deinit(&w);
    eng_pretok_free(p);
}

static void splitters_match_their_regexes(void **state)
{
    (void)state;
    cross_check("gpt-2", (const char *[]){GPT2_RE, NULL});
    cross_check("smollm", (const char *[]){"\\p{N}", GPT2_RE, NULL});
    cross_check("llama-bpe", (const char *[]){LLAMA3_RE("\\p{N}{1,3}"), NULL});
    cross_check("qwen2", (const char *[]){LLAMA3_RE("\\p{N}"), NULL});
}

static void work_grows_and_is_reused(void **state)
{
    (void)state;
    eng_pretok *p = NULL;
    eng_pretok_work w = {0};
    const uint32_t *ends;
    const char *words;
    size_t n;
    assert_int_equal(eng_pretok_new(&p, "smollm", 6, NULL), 0);
    size_t big = 100000;
    char *text = malloc(big);
    for (size_t i = 0; i < big; i++)
        text[i] = (i % 7 == 0) ? ' ' : 'a' + (char)(i % 5);
    assert_int_equal(eng_pretok_split(p, "ab 12", 5, &w, &words, &ends, &n), 0);
    assert_int_equal(n, 4);
    assert_int_equal(eng_pretok_split(p, text, big, &w, &words, &ends, &n), 0);
    assert_int_equal(ends[n - 1], big);
    assert_int_equal(eng_pretok_split(p, "ab 12", 5, &w, &words, &ends, &n), 0);
    assert_int_equal(n, 4);
    assert_int_equal(ends[3], 5);
    free(text);
    eng_pretok_work_deinit(&w);
    eng_pretok_free(p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(smollm_isolates_digits),
        cmocka_unit_test(gpt2_keeps_numbers_whole),
        cmocka_unit_test(llama3_groups_digits_by_three),
        cmocka_unit_test(invalid_utf8_reads_as_llama_cpp_reads_it),
        cmocka_unit_test(unknown_names_are_errors),
        cmocka_unit_test(splitters_match_their_regexes),
        cmocka_unit_test(work_grows_and_is_reused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
