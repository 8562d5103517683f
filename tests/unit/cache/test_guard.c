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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_counts),
        cmocka_unit_test(test_mismatch),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
