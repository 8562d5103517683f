/* tests/unit/engine/text/test_unicode.c: codepoint classes (Unicode 15.1, as llama.cpp),
 * llama.cpp's lenient UTF-8 reader and the GPT-2 byte-level map (eng_unicode_*, eng_utf8_*,
 * eng_bytelevel_*). */
#include "engine/text/unicode.h"

#include "tests/unit/unit.h"

#include <stdbool.h>

static void bytelevel_map_round_trips(void **state)
{
    (void)state;
    bool seen[0x144] = {false};
    for (int b = 0; b < 256; b++) {
        uint32_t c = eng_bytelevel_cpt((uint8_t)b);
        assert_true(c < 0x144);
        assert_false(seen[c]);  /* one-to-one */
        seen[c] = true;
        assert_int_equal(eng_bytelevel_byte(c), b);
        bool printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xff && b != 0xad);
        if (printable)
            assert_int_equal(c, b);
        else
            assert_true(c >= 0x100);
    }
    /* The well-known stand-ins: space Ġ, newline Ċ, tab ĉ, NUL Ā, DEL ġ, soft hyphen Ń. */
    assert_int_equal(eng_bytelevel_cpt(' '), 0x120);
    assert_int_equal(eng_bytelevel_cpt('\n'), 0x10a);
    assert_int_equal(eng_bytelevel_cpt('\t'), 0x109);
    assert_int_equal(eng_bytelevel_cpt(0), 0x100);
    assert_int_equal(eng_bytelevel_cpt(0x7f), 0x121);
    assert_int_equal(eng_bytelevel_cpt(0xad), 0x143);
    /* Codepoints that stand for no byte. */
    static const uint32_t none[] = {0x20, 0x0a, 0x7f, 0xad, 0x144, 0x3000, 0x1f600, 0x110000};
    for (size_t i = 0; i < sizeof none / sizeof none[0]; i++)
        assert_int_equal(eng_bytelevel_byte(none[i]), -1);
}

static void classes_match_unicode_15_1(void **state)
{
    (void)state;
    static const struct { uint32_t cpt; uint16_t flags; } cases[] = {
        {'a', ENG_UC_LETTER}, {'Z', ENG_UC_LETTER}, {'7', ENG_UC_NUMBER},
        {'\'', ENG_UC_PUNCT}, {'$', ENG_UC_SYMBOL}, {'+', ENG_UC_SYMBOL}, {'_', ENG_UC_PUNCT},
        {' ', ENG_UC_SEPARATOR | ENG_UC_WHITESPACE}, {'\t', ENG_UC_CONTROL | ENG_UC_WHITESPACE},
        {'\n', ENG_UC_CONTROL | ENG_UC_WHITESPACE}, {0x00, ENG_UC_CONTROL},
        {0x85, ENG_UC_CONTROL | ENG_UC_WHITESPACE}, {0xa0, ENG_UC_SEPARATOR | ENG_UC_WHITESPACE},
        {0x3000, ENG_UC_SEPARATOR | ENG_UC_WHITESPACE}, {0x200b, ENG_UC_CONTROL},  /* Cf */
        {0xe9, ENG_UC_LETTER}, {0x4e2d, ENG_UC_LETTER}, {0x0661, ENG_UC_NUMBER},
        {0xb2, ENG_UC_NUMBER}, {0xbd, ENG_UC_NUMBER}, {0x216b, ENG_UC_NUMBER},  /* No, Nl */
        {0x0301, ENG_UC_MARK}, {0x1f600, ENG_UC_SYMBOL}, {0xfffd, ENG_UC_SYMBOL},
        {0x0378, ENG_UC_UNDEFINED}, {0xe000, ENG_UC_CONTROL}, {0xd800, ENG_UC_CONTROL},
        /* New in Unicode 15.1: llama.cpp's table has them, Unicode 15.0 libraries do not. */
        {0x2ffc, ENG_UC_SYMBOL}, {0x31ef, ENG_UC_SYMBOL}, {0x2ebf0, ENG_UC_LETTER},
        /* Assigned only in Unicode 16: still unassigned here, as in llama.cpp. */
        {0x1c89, ENG_UC_UNDEFINED},
        {0x10ffff, ENG_UC_UNDEFINED}, {0x110000, ENG_UC_UNDEFINED}, {0xffffffff, ENG_UC_UNDEFINED},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (eng_unicode_flags(cases[i].cpt) != cases[i].flags)
            print_error("U+%04X\n", (unsigned)cases[i].cpt);
        assert_int_equal(eng_unicode_flags(cases[i].cpt), cases[i].flags);
    }
    /* White_Space is exactly this set. */
    for (uint32_t c = 0; c < 0x3100; c++) {
        bool ws = (c >= 9 && c <= 13) || c == 0x20 || c == 0x85 || c == 0xa0 || c == 0x1680 ||
                  (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f ||
                  c == 0x205f || c == 0x3000;
        assert_int_equal((eng_unicode_flags(c) & ENG_UC_WHITESPACE) != 0, ws);
    }
    /* Every codepoint has exactly one category. */
    for (uint32_t c = 0; c < 0x110000; c += 7) {
        uint16_t cat = eng_unicode_flags(c) & ENG_UC_CATEGORIES;
        assert_true(cat != 0 && (cat & (cat - 1)) == 0);
    }
}

static void reads_utf8_like_llama_cpp(void **state)
{
    (void)state;
    static const struct { const char *s; size_t len; uint32_t cpt; size_t n; } cases[] = {
        {"A", 1, 'A', 1},
        {"\xc3\xa9", 2, 0xe9, 2},
        {"\xe4\xb8\xad", 3, 0x4e2d, 3},
        {"\xf0\x9f\x98\x80", 4, 0x1f600, 4},
        {"\x80", 1, 0xfffd, 1},             /* a lone continuation byte */
        {"\xe4\xb8", 2, 0xfffd, 1},         /* cut short */
        {"\xe4\x41\x42", 3, 0xfffd, 1},     /* not followed by continuations */
        {"\xff", 1, 0xfffd, 1},
        {"\xf8\x80\x80\x80", 4, 0xfffd, 1},
        {"\xc0\x80", 2, 0, 2},              /* overlong: accepted, as llama.cpp does */
        {"\xed\xa0\x80", 3, 0xd800, 3},     /* a surrogate: accepted */
        {"\xf4\x8f\xbf\xbf", 4, 0x10ffff, 4},
        {"\xf5\x80\x80\x80", 4, 0xfffd, 1},    /* past U+10FFFF (llama.cpp aborts) */
        {"\xf4\x90\x80\x80", 4, 0xfffd, 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t n = 0;
        uint32_t c = eng_utf8_next((const unsigned char *)cases[i].s, cases[i].len, &n);
        assert_int_equal(c, cases[i].cpt);
        assert_int_equal(n, cases[i].n);
    }
}

static void writes_utf8(void **state)
{
    (void)state;
    unsigned char out[4];
    for (uint32_t c = 0; c < 0x110000; c += 0x3f) {
        size_t n = eng_utf8_put(c, out), m = 0;
        assert_true(n >= 1 && n <= 4);
        assert_int_equal(eng_utf8_next(out, n, &m), c);
        assert_int_equal(m, n);
    }
    assert_int_equal(eng_utf8_put(0x110000, out), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(bytelevel_map_round_trips),
        cmocka_unit_test(classes_match_unicode_15_1),
        cmocka_unit_test(reads_utf8_like_llama_cpp),
        cmocka_unit_test(writes_utf8),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
