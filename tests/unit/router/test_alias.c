/* tests/unit/router/test_alias.c: the model-name → tier table (router_alias_*). */
#include "router/alias.h"

#include "common/err.h"

#include "tests/unit/unit.h"

static void empty_table(void **state)
{
    (void)state;
    router_alias *a = router_alias_new();
    assert_int_equal(router_alias_count(a), 0);
    assert_int_equal(router_alias_find(a, "anything"), -1);
    assert_int_equal(router_alias_find(a, ""), -1);
    router_alias_free(a);
    router_alias_free(NULL);
}

static void add_and_find(void **state)
{
    (void)state;
    router_alias *a = router_alias_new();
    assert_int_equal(router_alias_add(a, "small", 0), 0);
    assert_int_equal(router_alias_add(a, "gpt-4o-mini", 0), 0);
    assert_int_equal(router_alias_add(a, "big", 1), 0);
    assert_int_equal(router_alias_count(a), 3);
    assert_int_equal(router_alias_find(a, "small"), 0);
    assert_int_equal(router_alias_find(a, "gpt-4o-mini"), 0);
    assert_int_equal(router_alias_find(a, "big"), 1);
    /* Exact, case-sensitive matches only. */
    assert_int_equal(router_alias_find(a, "Small"), -1);
    assert_int_equal(router_alias_find(a, "smal"), -1);
    assert_int_equal(router_alias_find(a, "small "), -1);
    router_alias_free(a);
}

static void name_is_copied(void **state)
{
    (void)state;
    router_alias *a = router_alias_new();
    char name[16] = "temp-name";
    assert_int_equal(router_alias_add(a, name, 4), 0);
    name[0] = 'X';
    assert_int_equal(router_alias_find(a, "temp-name"), 4);
    assert_int_equal(router_alias_find(a, name), -1);
    router_alias_free(a);
}

static void duplicate_is_refused(void **state)
{
    (void)state;
    router_alias *a = router_alias_new();
    assert_int_equal(router_alias_add(a, "m", 2), 0);
    assert_int_equal(router_alias_add(a, "m", 3), LLMGW_EINVAL);
    assert_int_equal(router_alias_count(a), 1);
    assert_int_equal(router_alias_find(a, "m"), 2); /* the first mapping stays */
    router_alias_free(a);
}

static void empty_name(void **state)
{
    (void)state;
    router_alias *a = router_alias_new();
    assert_int_equal(router_alias_add(a, "", 9), 0);
    assert_int_equal(router_alias_find(a, ""), 9);
    assert_int_equal(router_alias_add(a, "", 1), LLMGW_EINVAL);
    router_alias_free(a);
}

/* 5,000 names force many doublings of the table; every name stays findable and duplicates are
 * still refused after each growth. */
static void grows_past_many_entries(void **state)
{
    (void)state;
    enum { N = 5000 };
    char name[32];
    router_alias *a = router_alias_new();
    for (int i = 0; i < N; i++) {
        snprintf(name, sizeof name, "model-%d", i);
        assert_int_equal(router_alias_add(a, name, i), 0);
        assert_int_equal(router_alias_find(a, name), i);
    }
    assert_int_equal(router_alias_count(a), N);
    for (int i = 0; i < N; i++) {
        snprintf(name, sizeof name, "model-%d", i);
        assert_int_equal(router_alias_find(a, name), i);
        assert_int_equal(router_alias_add(a, name, -7), LLMGW_EINVAL);
    }
    assert_int_equal(router_alias_count(a), N);
    assert_int_equal(router_alias_find(a, "model-5000"), -1);
    assert_int_equal(router_alias_find(a, "model-"), -1);
    router_alias_free(a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(empty_table),
        cmocka_unit_test(add_and_find),
        cmocka_unit_test(name_is_copied),
        cmocka_unit_test(duplicate_is_refused),
        cmocka_unit_test(empty_name),
        cmocka_unit_test(grows_past_many_entries),
    };
    return cmocka_run_group_tests_name("router/alias", tests, NULL, NULL);
}
