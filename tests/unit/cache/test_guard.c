/* tests/unit/cache/test_guard.c: the negation guard (cache/guard.h). */
#include "cache/guard.h"

#include "tests/unit/unit.h"

static int cues(const char *s)
{
    return cache_negation_count(s, strlen(s));
}

static bool mismatch(const char *a, const char *b)
{
    return cache_negation_mismatch(a, strlen(a), b, strlen(b));
}

static void test_counts(void **state)
{
    (void)state;
    assert_int_equal(cues("What is a black hole?"), 0);
    assert_int_equal(cues("What is not a black hole?"), 1);
    assert_int_equal(cues("Why don't cats swim?"), 1);
    assert_int_equal(cues("Why don\xe2\x80\x99t cats swim?"), 1);   /* U+2019 */
    assert_int_equal(cues("Why dont cats swim"), 1);
    assert_int_equal(cues("NEVER say NO"), 2);
    assert_int_equal(cues("I cannot live without you"), 2);
    assert_int_equal(cues("I want an event, not a cent"), 1);      /* want/event/cent: no */
    assert_int_equal(cues("Nothing, nobody, nowhere, none, neither, nor"), 6);
    assert_int_equal(cues("mightn't"), 1);
    assert_int_equal(cues("notable nominal knot"), 0);
    assert_int_equal(cues(""), 0);
}

static void test_mismatch(void **state)
{
    (void)state;
    assert_true(mismatch("How do I lose weight?", "How do I not lose weight?"));
    assert_true(mismatch("What is X?", "What isn't X?"));
    assert_false(mismatch("How do I lose weight?", "How can I lose weight fast?"));
    assert_false(mismatch("Why can't I sleep?", "Why can I not sleep?"));
    assert_false(mismatch("It is not not true", "It is true"));  /* parity */
}

static cache_guard_verdict check(const char *a, const char *b)
{
    return cache_guard_check(a, strlen(a), b, strlen(b));
}

static void test_identifiers(void **state)
{
    (void)state;
    assert_int_equal(check("What does 0.080 inches of rain feel like?",
                           "What does 0.020 inches of rain feel like?"), CACHE_GUARD_IDENTIFIER);
    assert_int_equal(check("Compare the HP M604n and the HP 4620", "Compare the HP M604dn and the HP 4620"),
                     CACHE_GUARD_IDENTIFIER);
    assert_int_equal(check("Best movies of 2014?", "Best films of 2015?"), CACHE_GUARD_IDENTIFIER);
    assert_int_equal(check("Best movies of 2014?", "What were the best films of 2014."), CACHE_GUARD_OK);
    assert_int_equal(check("Is 7 prime?", "is 7 a prime number"), CACHE_GUARD_OK);
}

static void test_swaps(void **state)
{
    (void)state;
    assert_int_equal(check("What do Croats think of Turks?", "What do Turks think of Croats?"),
                     CACHE_GUARD_SWAP);
    assert_int_equal(check("What secrets would a girl never share with a boy?",
                           "What secrets would a boy never share with a girl?"), CACHE_GUARD_SWAP);
    /* a phrase that moves is a paraphrase, not a swap */
    assert_int_equal(check("What is the best way to learn Java for a beginner?",
                           "What's the best way for a beginner to learn Java?"), CACHE_GUARD_OK);
    assert_int_equal(check("How do I learn guitars?", "How can I learn guitar?"), CACHE_GUARD_OK);
}

static void test_negation_wins(void **state)
{
    (void)state;
    assert_int_equal(check("Is it safe to eat raw eggs?", "Is it not safe to eat raw eggs?"),
                     CACHE_GUARD_NEGATION);
    assert_string_equal(cache_guard_name(CACHE_GUARD_NEGATION), "negation");
    assert_string_equal(cache_guard_name(CACHE_GUARD_OK), "ok");
}

static void test_long_and_odd_input(void **state)
{
    (void)state;
    char big[8192];
    for (size_t i = 0; i < sizeof big - 1; i++)
        big[i] = (char)("ab 1.\xc3\xa9x"[i % 8]);
    big[sizeof big - 1] = '\0';
    assert_int_equal(check(big, big), CACHE_GUARD_OK);
    assert_int_equal(cache_guard_check("", 0, "", 0), CACHE_GUARD_OK);
    const char nul[] = {'a', '\0', 'b'};
    assert_int_equal(cache_guard_check(nul, 3, nul, 3), CACHE_GUARD_OK);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_counts),
        cmocka_unit_test(test_mismatch),
        cmocka_unit_test(test_identifiers),
        cmocka_unit_test(test_swaps),
        cmocka_unit_test(test_negation_wins),
        cmocka_unit_test(test_long_and_odd_input),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
