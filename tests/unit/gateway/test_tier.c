/* tests/unit/gateway/test_tier.c: the tier interface alone (gateway/tier.c) with fake tiers:
 * start binds the request to its tier, a start on another tier releases the first one's state,
 * detach and release reach the tier that holds the request (and are safe when none does), and
 * a failure report reaches hooks.tier_failed with its message. */
#include "gateway/tier.h"

#include "tests/unit/unit.h"
#include "tests/unit/gateway/fake.h"

static const char k_config[] =
    "tiers:\n"
    "  - {name: one, base_url: 'http://127.0.0.1:9'}\n"
    "  - {name: two, base_url: 'http://127.0.0.1:9'}\n";

static gw_tier_failure g_failure;
static int g_failures;

static void on_failed(gw_req *r, const gw_tier_failure *f)
{
    (void)r;
    g_failure = *f;
    g_failures++;
}

static int setup(void **state)
{
    static fake_srv f;
    fake_srv_init(&f, k_config);
    f.release = gw_tier_release;
    f.s.hooks.tier_failed = on_failed;
    g_failures = 0;
    *state = &f;
    return 0;
}

static int teardown(void **state)
{
    fake_srv_deinit(*state);
    return 0;
}

static void start_binds_and_answers(void **state)
{
    fake_srv *f = *state;
    rec x = {0};
    gw_req *r = fake_req(f, &x, "req_t");
    r->tier = 1;
    gw_tier_start(r);
    assert_int_equal(f->fakes[1]->started, 1);
    assert_int_equal(f->fakes[1]->released, 1);   /* answered at once, then freed */
    assert_int_equal(f->done, 1);
    assert_contains(x.body, "\"tier\":\"two\"");
}

static void another_tier_releases_the_first(void **state)
{
    fake_srv *f = *state;
    rec x = {0};
    f->fakes[0]->mode = FAKE_HOLD;
    gw_req *r = fake_req(f, &x, "req_t");
    r->tier = 0;
    gw_tier_start(r);
    assert_ptr_equal(r->tier_impl, f->s.tiers[0]);
    assert_non_null(r->tier_state);
    r->tier = 1;
    gw_tier_start(r);          /* a fallback: tier one's state goes before two starts */
    assert_int_equal(f->fakes[0]->released, 1);
    assert_int_equal(f->fakes[1]->started, 1);
    assert_int_equal(f->done, 1);
}

static void detach_and_release_are_safe(void **state)
{
    fake_srv *f = *state;
    rec x = {0};
    gw_req *r = fake_req(f, &x, "req_t");
    gw_tier_detach(r);         /* on no tier: nothing to do */
    gw_tier_release(r);
    assert_null(r->tier_impl);
    f->fakes[0]->mode = FAKE_HOLD;
    r->tier = 0;
    gw_tier_start(r);
    gw_tier_detach(r);
    assert_int_equal(f->fakes[0]->detached, 1);
    gw_tier_release(r);
    gw_tier_release(r);        /* twice: once released, nothing is left */
    assert_int_equal(f->fakes[0]->released, 1);
    assert_null(r->tier_state);
    gw_reply_abandon(r);
    gw_tier_free(NULL);
}

static void failure_reaches_the_hook(void **state)
{
    fake_srv *f = *state;
    rec x = {0};
    f->fakes[0]->mode = FAKE_FAIL;
    gw_req *r = fake_req(f, &x, "req_t");
    r->tier = 0;
    r->fallback_ok = true;
    gw_tier_start(r);
    assert_int_equal(g_failures, 1);
    assert_int_equal(g_failure.status, 502);
    assert_string_equal(g_failure.code, "upstream_unavailable");
    assert_string_equal(g_failure.kind, "connect");
    assert_string_equal(g_failure.message, "Tier 'one' is down.");
    assert_int_equal(f->done, 0);              /* the hook owns what happens next */
    r->fallback_ok = false;
    gw_tier_start(r);                          /* no fallback left: the tier answers */
    assert_int_equal(g_failures, 1);
    assert_int_equal(f->done, 1);
    assert_int_equal(x.status, 502);
}

static void long_failure_message_is_cut(void **state)
{
    fake_srv *f = *state;
    rec x = {0};
    gw_req *r = fake_req(f, &x, "req_t");
    char big[1000];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    gw_tier_fail(r, 503, "server_error", "engine_error", "engine", "%s", big);
    assert_int_equal(strlen(g_failure.message), sizeof g_failure.message - 1);
    gw_reply_abandon(r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(start_binds_and_answers, setup, teardown),
        cmocka_unit_test_setup_teardown(another_tier_releases_the_first, setup, teardown),
        cmocka_unit_test_setup_teardown(detach_and_release_are_safe, setup, teardown),
        cmocka_unit_test_setup_teardown(failure_reaches_the_hook, setup, teardown),
        cmocka_unit_test_setup_teardown(long_failure_message_is_cut, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
