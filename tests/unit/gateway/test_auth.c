/* tests/unit/gateway/test_auth.c: token buckets on a simulated clock, and bearer-key checks
 * (gw_auth_check) against a hand-built key table. */
#include "gateway/auth.h"

#include "tests/unit/unit.h"

#define SEC 1000000000ull
#define MS 1000000ull
#define T0 (1000 * SEC)   /* an arbitrary start: the monotonic clock is never 0 in practice */

/* ---- buckets ---- */

static void bucket_burst_then_refusal(void **state)
{
    (void)state;
    gw_bucket b;
    gw_bucket_init(&b, 2, 3, T0);  /* 2/s, burst 3 */
    for (int i = 0; i < 3; i++)
        assert_int_equal(gw_bucket_take(&b, T0), 0);
    uint64_t wait = gw_bucket_take(&b, T0);
    assert_int_not_equal(wait, 0);
    assert_in_range(wait, 500 * MS - 1000, 500 * MS);  /* one token at 2/s: 0.5 s */
    /* a refusal does not spend a token: the wait only shrinks */
    uint64_t wait2 = gw_bucket_take(&b, T0 + 100 * MS);
    assert_in_range(wait2, 400 * MS - 1000, 400 * MS);
}

static void bucket_refills_over_time(void **state)
{
    (void)state;
    gw_bucket b;
    gw_bucket_init(&b, 4, 2, T0);  /* 4/s, burst 2 */
    assert_int_equal(gw_bucket_take(&b, T0), 0);
    assert_int_equal(gw_bucket_take(&b, T0), 0);
    assert_int_not_equal(gw_bucket_take(&b, T0), 0);
    /* 250 ms later: exactly one token back */
    assert_int_equal(gw_bucket_take(&b, T0 + 250 * MS + 1000), 0);
    assert_int_not_equal(gw_bucket_take(&b, T0 + 250 * MS + 1000), 0);
    /* a long idle period refills only up to the burst */
    uint64_t later = T0 + 3600 * SEC;
    assert_int_equal(gw_bucket_take(&b, later), 0);
    assert_int_equal(gw_bucket_take(&b, later), 0);
    assert_int_not_equal(gw_bucket_take(&b, later), 0);
}

/* The advised wait is the time until a token exists, within rounding: a little earlier is
 * refused, a little later is allowed. */
static void bucket_retry_after_is_right(void **state)
{
    (void)state;
    static const double rates[] = {0.1, 1, 3, 7.5, 1000};
    for (size_t i = 0; i < sizeof rates / sizeof rates[0]; i++) {
        gw_bucket b;
        gw_bucket_init(&b, rates[i], 1, T0);
        assert_int_equal(gw_bucket_take(&b, T0), 0);
        uint64_t wait = gw_bucket_take(&b, T0 + 1);
        double want = 1e9 / rates[i] - 1;
        assert_double_near((double)wait, want, 2);
        assert_int_not_equal(gw_bucket_take(&b, T0 + 1 + wait - 1000), 0);
        assert_int_equal(gw_bucket_take(&b, T0 + 1 + wait + 1000), 0);
    }
}

static void bucket_rate_zero_is_unlimited(void **state)
{
    (void)state;
    gw_bucket b;
    gw_bucket_init(&b, 0, 1, T0);
    for (int i = 0; i < 100000; i++)
        assert_int_equal(gw_bucket_take(&b, T0), 0);
}

static void bucket_burst_below_one(void **state)
{
    (void)state;
    gw_bucket b;
    gw_bucket_init(&b, 10, 0, T0);  /* a burst under 1 would never allow anything */
    assert_double_near(b.burst, 1, 0);
    assert_int_equal(gw_bucket_take(&b, T0), 0);
    assert_int_not_equal(gw_bucket_take(&b, T0), 0);
}

static void bucket_clock_going_back(void **state)
{
    (void)state;
    gw_bucket b;
    gw_bucket_init(&b, 1, 1, T0);
    assert_int_equal(gw_bucket_take(&b, T0), 0);
    /* an earlier timestamp neither refills nor breaks the bucket */
    uint64_t wait = gw_bucket_take(&b, T0 - 10 * SEC);
    assert_in_range(wait, SEC - 1000, SEC);
    assert_int_equal(gw_bucket_take(&b, T0 + SEC + 1000), 0);
}

/* ---- keys ---- */

static gw_key_cfg k_keys[] = {
    {.key = "sk-alpha-0001", .group = "team-a", .rate = 1, .burst = 2},
    {.key = "sk-beta-00002", .group = "team-b", .rate = 1, .burst = 2},
    {.key = "sk-free-00003", .group = "free", .rate = 0, .burst = 0},
    {.key = "sk-alpha-0001-long", .group = "team-long", .rate = 0, .burst = 0},
};

static gw_config k_cfg = {.keys = k_keys, .n_keys = 4};

static void check(gw_auth *a, const char *header, uint64_t now, gw_auth_status status,
                  const char *group, int key_index)
{
    gw_auth_result r;
    gw_auth_check(a, header, now, &r);
    assert_int_equal(r.status, status);
    if (group == NULL)
        assert_null(r.group);
    else
        assert_string_equal(r.group, group);
    assert_int_equal(r.key_index, key_index);
}

static void missing_or_malformed_header(void **state)
{
    (void)state;
    gw_auth *a = gw_auth_new(&k_cfg, T0);
    assert_false(gw_auth_disabled(a));
    check(a, NULL, T0, GW_AUTH_MISSING, NULL, -1);
    check(a, "", T0, GW_AUTH_MISSING, NULL, -1);
    check(a, "sk-alpha-0001", T0, GW_AUTH_MISSING, NULL, -1);
    check(a, "Basic c2stYWxwaGEtMDAwMQ==", T0, GW_AUTH_MISSING, NULL, -1);
    check(a, "Bearer", T0, GW_AUTH_MISSING, NULL, -1);
    check(a, "Bearersk-alpha-0001", T0, GW_AUTH_MISSING, NULL, -1);
    gw_auth_free(a);
}

static void wrong_key(void **state)
{
    (void)state;
    gw_auth *a = gw_auth_new(&k_cfg, T0);
    check(a, "Bearer sk-alpha-0002", T0, GW_AUTH_INVALID, NULL, -1);
    check(a, "Bearer sk-alpha-000", T0, GW_AUTH_INVALID, NULL, -1);    /* a prefix */
    check(a, "Bearer sk-alpha-00011", T0, GW_AUTH_INVALID, NULL, -1);  /* longer */
    check(a, "Bearer SK-ALPHA-0001", T0, GW_AUTH_INVALID, NULL, -1);   /* keys are exact */
    check(a, "Bearer ", T0, GW_AUTH_INVALID, NULL, -1);
    gw_auth_free(a);
}

static void right_key_gives_group(void **state)
{
    (void)state;
    gw_auth *a = gw_auth_new(&k_cfg, T0);
    check(a, "Bearer sk-alpha-0001", T0, GW_AUTH_OK, "team-a", 0);
    check(a, "Bearer sk-beta-00002", T0, GW_AUTH_OK, "team-b", 1);
    check(a, "Bearer sk-alpha-0001-long", T0, GW_AUTH_OK, "team-long", 3);
    /* the scheme is case-insensitive; spaces around the key are not part of it */
    check(a, "bearer sk-free-00003", T0, GW_AUTH_OK, "free", 2);
    check(a, "BEARER   sk-free-00003  \t", T0, GW_AUTH_OK, "free", 2);
    gw_auth_result r;
    gw_auth_check(a, "Bearer sk-free-00003", T0, &r);
    assert_int_equal(r.retry_after_ns, 0);
    gw_auth_free(a);
}

static void auth_disabled_is_anonymous(void **state)
{
    (void)state;
    gw_config empty = {0};
    gw_auth *a = gw_auth_new(&empty, T0);
    assert_true(gw_auth_disabled(a));
    check(a, NULL, T0, GW_AUTH_OK, "anonymous", -1);
    check(a, "Bearer whatever", T0, GW_AUTH_OK, "anonymous", -1);
    check(a, "garbage", T0, GW_AUTH_OK, "anonymous", -1);
    gw_auth_free(a);
    gw_auth_free(NULL);
}

static void limited_key(void **state)
{
    (void)state;
    gw_auth *a = gw_auth_new(&k_cfg, T0);
    gw_auth_result r;
    check(a, "Bearer sk-alpha-0001", T0, GW_AUTH_OK, "team-a", 0);
    check(a, "Bearer sk-alpha-0001", T0, GW_AUTH_OK, "team-a", 0);
    gw_auth_check(a, "Bearer sk-alpha-0001", T0 + 10 * MS, &r);
    assert_int_equal(r.status, GW_AUTH_LIMITED);
    assert_string_equal(r.group, "team-a");  /* still known: accounted to its group */
    assert_int_equal(r.key_index, 0);
    assert_true(r.retry_after_ns > 0);
    assert_in_range(r.retry_after_ns, 990 * MS - 1000, 990 * MS);
    /* after the advised wait the key works again */
    check(a, "Bearer sk-alpha-0001", T0 + 10 * MS + r.retry_after_ns + 1000, GW_AUTH_OK,
          "team-a", 0);
    gw_auth_free(a);
}

static void keys_are_limited_independently(void **state)
{
    (void)state;
    gw_auth *a = gw_auth_new(&k_cfg, T0);
    gw_auth_result r;
    for (int i = 0; i < 2; i++)
        check(a, "Bearer sk-alpha-0001", T0, GW_AUTH_OK, "team-a", 0);
    gw_auth_check(a, "Bearer sk-alpha-0001", T0, &r);
    assert_int_equal(r.status, GW_AUTH_LIMITED);
    /* team-b's bucket is untouched, and the unlimited keys never run out */
    check(a, "Bearer sk-beta-00002", T0, GW_AUTH_OK, "team-b", 1);
    check(a, "Bearer sk-beta-00002", T0, GW_AUTH_OK, "team-b", 1);
    gw_auth_check(a, "Bearer sk-beta-00002", T0, &r);
    assert_int_equal(r.status, GW_AUTH_LIMITED);
    for (int i = 0; i < 1000; i++)
        check(a, "Bearer sk-free-00003", T0, GW_AUTH_OK, "free", 2);
    /* two auth instances over the same config do not share buckets */
    gw_auth *b = gw_auth_new(&k_cfg, T0);
    check(b, "Bearer sk-alpha-0001", T0, GW_AUTH_OK, "team-a", 0);
    gw_auth_free(b);
    gw_auth_free(a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(bucket_burst_then_refusal),
        cmocka_unit_test(bucket_refills_over_time),
        cmocka_unit_test(bucket_retry_after_is_right),
        cmocka_unit_test(bucket_rate_zero_is_unlimited),
        cmocka_unit_test(bucket_burst_below_one),
        cmocka_unit_test(bucket_clock_going_back),
        cmocka_unit_test(missing_or_malformed_header),
        cmocka_unit_test(wrong_key),
        cmocka_unit_test(right_key_gives_group),
        cmocka_unit_test(auth_disabled_is_anonymous),
        cmocka_unit_test(limited_key),
        cmocka_unit_test(keys_are_limited_independently),
    };
    return cmocka_run_group_tests_name("gateway/auth", tests, NULL, NULL);
}
