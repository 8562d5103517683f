/* tests/unit/engine/text/test_wordpiece.c: BERT's WordPiece tokenizer (eng_wordpiece_*) on a
 * small vocabulary: normalization, punctuation, greedy pieces, [UNK], the 100-character limit,
 * special-token texts, truncation, and bad vocabularies named. (The real MiniLM vocabulary
 * against sentence-transformers' ids: tests/unit/engine/encoder/test_bert.c.) */
#include "engine/text/wordpiece.h"

#include "tests/unit/unit.h"

#include <stdlib.h>
#include <string.h>

/* ---- WordPiece on a small vocabulary ---- */

static const char VOCAB[] =
    "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nun\n##aff\n##able\nhello\nworld\n,\n!\na\n##a\n"
    "cafe\n中\n##s\nplay\n##ing\n.\n";
enum { PAD, UNK, CLS, SEP, MASK, UN, AFF, ABLE, HELLO, WORLD, COMMA, BANG, A, CA, CAFE, ZH, S,
       PLAY, ING, DOT };

static eng_wordpiece *small_vocab(void)
{
    eng_wordpiece *wp = NULL;
    util_err err = {0};
    assert_int_equal(eng_wordpiece_new(&wp, VOCAB, sizeof VOCAB - 1, "vocab", &err), 0);
    return wp;
}

/* Tokenizes s (NUL-terminated) with max_tokens 64 and compares with the ids after [CLS]
 * up to [SEP], given as a -1-terminated list. */
static void expect_pieces(const eng_wordpiece *wp, const char *s, size_t len, const int *want)
{
    int32_t ids[128];
    int n = eng_wordpiece_encode(wp, s, len, 128, ids, 128), k = 0;
    while (want[k] >= 0)
        k++;
    if (n != k + 2)
        print_error("\"%s\": %d tokens, expected %d\n", s, n, k + 2);
    assert_int_equal(n, k + 2);
    assert_int_equal(ids[0], CLS);
    assert_int_equal(ids[n - 1], SEP);
    for (int i = 0; i < k; i++) {
        if (ids[1 + i] != want[i])
            print_error("\"%s\": piece %d is %d, expected %d\n", s, i, ids[1 + i], want[i]);
        assert_int_equal(ids[1 + i], want[i]);
    }
}

#define PIECES(wp, s, ...)                                                                       \
    expect_pieces(wp, s, sizeof(s) - 1, (const int[]){__VA_ARGS__, -1})

static void wordpiece_cases(void **state)
{
    (void)state;
    eng_wordpiece *wp = small_vocab();
    assert_int_equal(eng_wordpiece_n_vocab(wp), 20);
    assert_int_equal(eng_wordpiece_id(wp, "##able", 6), ABLE);
    assert_int_equal(eng_wordpiece_id(wp, "able", 4), -1);
    assert_string_equal(eng_wordpiece_token(wp, PLAY), "play");
    assert_null(eng_wordpiece_token(wp, 20));
    PIECES(wp, "unaffable", UN, AFF, ABLE);
    PIECES(wp, "Hello, WORLD!", HELLO, COMMA, WORLD, BANG);
    PIECES(wp, "  hello\t\n world  ", HELLO, WORLD);
    PIECES(wp, "Héllo CAFÉ café", HELLO, CAFE, CAFE);              /* accents stripped */
    PIECES(wp, "cafe\xcc\x81", CAFE);                                /* combining acute */
    PIECES(wp, "hel\x01lo wor\xe2\x80\x8bld", HELLO, WORLD);         /* control, ZWSP dropped */
    PIECES(wp, "hel\xffl\xc3o", HELLO);                              /* bad UTF-8 dropped */
    PIECES(wp, "xyz", UNK);
    PIECES(wp, "unaffablex hello", UNK, HELLO);                      /* one miss: whole word */
    PIECES(wp, "playing plays", PLAY, ING, PLAY, S);
    PIECES(wp, "中中hello", ZH, ZH, HELLO);                           /* CJK split */
    PIECES(wp, "hello[MASK]world [mask]", HELLO, MASK, WORLD, UNK, UNK, UNK);
    PIECES(wp, "[CLS][SEP]", CLS, SEP);
    PIECES(wp, "...", DOT, DOT, DOT);
    char s[128];
    memset(s, 'a', 100);
    int want[102];
    want[0] = A;
    for (int i = 1; i < 100; i++)
        want[i] = CA;
    want[100] = -1;
    expect_pieces(wp, s, 100, want);                                 /* 100 characters: pieces */
    memset(s, 'a', 101);
    expect_pieces(wp, s, 101, (const int[]){UNK, -1});                /* 101: [UNK] */
    s[101] = ' ';
    memcpy(s + 102, "hello", 5);
    expect_pieces(wp, s, 107, (const int[]){UNK, HELLO, -1});
    const int empty[] = {-1};
    expect_pieces(wp, "", 0, empty);
    expect_pieces(wp, " \t\x01", 3, empty);
    eng_wordpiece_free(wp);
}

static void wordpiece_truncates(void **state)
{
    (void)state;
    eng_wordpiece *wp = small_vocab();
    int32_t ids[8];
    const char *s = "hello world hello world hello";
    assert_int_equal(eng_wordpiece_encode(wp, s, strlen(s), 5, ids, 8), 5);
    assert_int_equal(ids[0], CLS);
    assert_int_equal(ids[1], HELLO);
    assert_int_equal(ids[2], WORLD);
    assert_int_equal(ids[3], HELLO);
    assert_int_equal(ids[4], SEP);
    /* a word's pieces are cut too */
    assert_int_equal(eng_wordpiece_encode(wp, "unaffable", 9, 4, ids, 8), 4);
    assert_int_equal(ids[2], AFF);
    assert_int_equal(ids[3], SEP);
    /* cap below the count: the count, and only cap ids written */
    ids[3] = 12345;
    assert_int_equal(eng_wordpiece_encode(wp, s, strlen(s), 64, ids, 3), 7);
    assert_int_equal(ids[2], WORLD);
    assert_int_equal(ids[3], 12345);
    assert_int_equal(eng_wordpiece_encode(wp, s, strlen(s), 2, ids, 8), 2);
    assert_int_equal(ids[1], SEP);
    eng_wordpiece_free(wp);
}

static void wordpiece_bad_vocab(void **state)
{
    (void)state;
    eng_wordpiece *wp = NULL;
    util_err err = {0};
    const char v[] = "[PAD]\n[CLS]\n[SEP]\nhello\n";
    assert_int_equal(eng_wordpiece_new(&wp, v, sizeof v - 1, "v.txt", &err), LLMGW_EINVAL);
    assert_null(wp);
    assert_prefix(err.msg, "v.txt");
    assert_contains(err.msg, "[UNK]");
    assert_int_equal(eng_wordpiece_new(&wp, "", 0, "empty.txt", &err), LLMGW_EINVAL);
    assert_prefix(err.msg, "empty.txt");
    assert_int_equal(eng_wordpiece_load(&wp, "/nonexistent/vocab.txt", &err), LLMGW_EIO);
    assert_prefix(err.msg, "/nonexistent/vocab.txt");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(wordpiece_cases),
        cmocka_unit_test(wordpiece_truncates),
        cmocka_unit_test(wordpiece_bad_vocab),
    };
    return cmocka_run_group_tests_name("engine/wordpiece", tests, NULL, NULL);
}
