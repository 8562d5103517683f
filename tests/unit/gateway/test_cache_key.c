/* tests/unit/gateway/test_cache_key.c: what a chat request is cached under (gw_cache_key_derive)
 * and the Cache-Control directives. Each test derives keys for two bodies and says whether the
 * namespace and the exact key must agree. */
#include "gateway/cache_key.h"

#include <stdlib.h>

#include "tests/unit/unit.h"

typedef struct derived {
    util_arena arena;
    gw_request req;
    gw_cache_key key;
} derived;

static void derive(derived *d, const char *body, const char *group, const char *tier,
                   double max_temp)
{
    gw_req_error e;
    memset(d, 0, sizeof *d);
    util_arena_init(&d->arena, 4096);
    int rc = gw_request_parse(&d->req, GW_EP_CHAT, body, strlen(body), &d->arena, &e);
    if (rc != 0)
        print_error("parse: %s\n", e.message);
    assert_int_equal(rc, 0);
    gw_cache_key_derive(&d->req, group, tier, max_temp, &d->key);
}

static void release(derived *d)
{
    gw_request_deinit(&d->req);
    util_arena_deinit(&d->arena);
}

#define USER(text) "{\"role\":\"user\",\"content\":\"" text "\"}"
#define SYS(text) "{\"role\":\"system\",\"content\":\"" text "\"}"
/* The messages are one string literal: join several with "," */
#define BODY(extra, msgs) "{\"model\":\"m\",\"temperature\":0" extra ",\"messages\":[" msgs "]}"

/* Derives both and checks: same namespace? same exact key? (both cacheable) */
static void compare(const char *a, const char *ga, const char *ta, const char *b,
                    const char *gb, const char *tb, bool same_ns, bool same_exact)
{
    derived x, y;
    derive(&x, a, ga, ta, 0.0);
    derive(&y, b, gb, tb, 0.0);
    assert_true(x.key.cacheable);
    assert_true(y.key.cacheable);
    assert_true(x.key.exact != 0);
    if (same_ns)
        assert_true(x.key.ns == y.key.ns);
    else
        assert_true(x.key.ns != y.key.ns);
    if (same_exact)
        assert_true(x.key.exact == y.key.exact);
    else
        assert_true(x.key.exact != y.key.exact);
    release(&x);
    release(&y);
}

static void test_same_request_same_keys(void **state)
{
    (void)state;
    const char *b = BODY("", SYS("be brief") "," USER("What is FAISS?"));
    compare(b, "team-a", "small", b, "team-a", "small", true, true);
}

static void test_exact_key_normalises_space_and_case(void **state)
{
    (void)state;
    compare(BODY("", USER("What is FAISS?")), "g", "small",
            BODY("", USER("  what   IS\\tfaiss? ")), "g", "small", true, true);
    compare(BODY("", USER("What is FAISS?")), "g", "small",
            BODY("", USER("What is FAISS")), "g", "small", true, false);
}

static void test_text_is_last_user_turn(void **state)
{
    (void)state;
    derived d;
    derive(&d, BODY("", SYS("s") "," USER("first") "," "{\"role\":\"assistant\",\"content\":\"a\"}"
                             "," USER("What are its types?")), "g", "t", 0.0);
    assert_true(d.key.cacheable);
    assert_int_equal(d.key.text_len, strlen("What are its types?"));
    assert_memory_equal(d.key.text, "What are its types?", d.key.text_len);
    release(&d);
}

static void test_tenant_and_tier_split_namespaces(void **state)
{
    (void)state;
    const char *b = BODY("", USER("hello"));
    compare(b, "team-a", "small", b, "team-b", "small", false, true);
    compare(b, "team-a", "small", b, "team-a", "large", false, true);
}

static void test_system_prompt_splits_namespaces(void **state)
{
    (void)state;
    compare(BODY("", SYS("Answer in French.") "," USER("hello")), "g", "t",
            BODY("", SYS("Answer in German.") "," USER("hello")), "g", "t", false, true);
    compare(BODY("", SYS("x") "," USER("hello")), "g", "t", BODY("", USER("hello")), "g", "t",
            false, true);
}

static void test_conversation_splits_namespaces(void **state)
{
    (void)state;
    /* The same follow-up under two different conversations never shares a namespace. */
    compare(BODY("", USER("Tell me about Python.") ","
                 "{\"role\":\"assistant\",\"content\":\"A language.\"}" "," USER("What are its types?")),
            "g", "t",
            BODY("", USER("Tell me about cancer.") ","
                 "{\"role\":\"assistant\",\"content\":\"A disease.\"}" "," USER("What are its types?")),
            "g", "t", false, true);
}

static void test_context_and_sampling_split_namespaces(void **state)
{
    (void)state;
    const char *plain = BODY("", USER("q"));
    compare(plain, "g", "t",
            BODY(",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]", USER("q")),
            "g", "t", false, true);
    compare(plain, "g", "t", BODY(",\"response_format\":{\"type\":\"json_object\"}", USER("q")),
            "g", "t", false, true);
    compare(plain, "g", "t", BODY(",\"max_tokens\":5", USER("q")), "g", "t", false, true);
    compare(plain, "g", "t", BODY(",\"stop\":[\"x\"]", USER("q")), "g", "t", false, true);
    compare(plain, "g", "t", BODY(",\"seed\":7", USER("q")), "g", "t", false, true);
    compare(plain, "g", "t", BODY(",\"presence_penalty\":0.5", USER("q")), "g", "t", false, true);
    compare(BODY(",\"max_tokens\":5", USER("q")), "g", "t", BODY(",\"max_tokens\":5", USER("q")),
            "g", "t", true, true);
}

#define PARTS(text, part) "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"" \
    text "\"}," part "]}"
#define IMAGE(url) "{\"type\":\"image_url\",\"image_url\":{\"url\":\"" url "\"}}"
#define AUDIO(data) "{\"type\":\"input_audio\",\"input_audio\":{\"data\":\"" data \
    "\",\"format\":\"wav\"}}"
#define FILEPART(id) "{\"type\":\"file\",\"file\":{\"file_id\":\"" id "\"}}"
#define REFUSAL(t) "{\"type\":\"refusal\",\"refusal\":\"" t "\"}"

/* Every part of the last message is in its identity: the same words about another image, audio
 * clip or file are another namespace (the same exact key: the text is the same); the same part
 * twice is the same namespace. */
static void test_non_text_parts_split_namespaces(void **state)
{
    (void)state;
#define SAME_AND_OTHER(a, b)                                                                    \
    compare(BODY("", PARTS("What is in this?", a)), "g", "t",                                 \
            BODY("", PARTS("What is in this?", b)), "g", "t", false, true);                   \
    compare(BODY("", PARTS("What is in this?", a)), "g", "t",                                 \
            BODY("", PARTS("What is in this?", a)), "g", "t", true, true);                    \
    compare(BODY("", PARTS("What is in this?", a)), "g", "t", BODY("", USER("What is in this?")), \
            "g", "t", false, true)
    SAME_AND_OTHER(IMAGE("https://example.com/cat.png"), IMAGE("https://example.com/dog.png"));
    SAME_AND_OTHER(IMAGE("data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAA"),
                   IMAGE("data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAB"));
    SAME_AND_OTHER(AUDIO("UklGRiQAAABXQVZFZm10IBAAAAABAAEA"),
                   AUDIO("UklGRiQAAABXQVZFZm10IBAAAAABAAEB"));
    SAME_AND_OTHER(FILEPART("file-abc"), FILEPART("file-abd"));
#undef SAME_AND_OTHER
    /* A refusal part is text of its own (in the exact key) and in the namespace as sent. */
    compare(BODY("", PARTS("x", REFUSAL("no"))), "g", "t", BODY("", PARTS("x", REFUSAL("nope"))),
            "g", "t", false, false);
    /* The last message's name is part of it as well. */
    compare(BODY("", "{\"role\":\"user\",\"name\":\"alice\",\"content\":\"hi\"}"), "g", "t",
            BODY("", "{\"role\":\"user\",\"name\":\"bob\",\"content\":\"hi\"}"), "g", "t",
            false, true);
}

static void test_temperature_buckets(void **state)
{
    (void)state;
    derived a, b;
    derive(&a, "{\"model\":\"m\",\"temperature\":0.2,\"messages\":[" USER("q") "]}", "g", "t", 0.5);
    derive(&b, "{\"model\":\"m\",\"temperature\":0.4,\"messages\":[" USER("q") "]}", "g", "t", 0.5);
    assert_true(a.key.cacheable && b.key.cacheable);
    assert_true(a.key.ns != b.key.ns);
    release(&a);
    release(&b);
}

static void not_cacheable(const char *body, double max_temp, const char *why)
{
    derived d;
    derive(&d, body, "g", "t", max_temp);
    assert_false(d.key.cacheable);
    assert_non_null(d.key.why_not);
    assert_contains(d.key.why_not, why);
    release(&d);
}

static void test_not_cacheable(void **state)
{
    (void)state;
    /* Unset temperature means 1 (the API's default): above the default bound 0. */
    not_cacheable("{\"model\":\"m\",\"messages\":[" USER("q") "]}", 0.0, "temperature");
    not_cacheable("{\"model\":\"m\",\"temperature\":0.7,\"messages\":[" USER("q") "]}", 0.5,
                  "temperature");
    not_cacheable(BODY(",\"n\":2", USER("q")), 0.0, "n > 1");
    not_cacheable(BODY(",\"logprobs\":true", USER("q")), 0.0, "logprobs");
    not_cacheable(BODY("", USER("q") "," "{\"role\":\"assistant\",\"content\":\"partial\"}"), 0.0,
                  "last message");
    not_cacheable(BODY("", USER("")), 0.0, "no text");
}

static void test_cache_control(void **state)
{
    (void)state;
    bool nc, ns;
    gw_cache_control_parse(NULL, &nc, &ns);
    assert_false(nc || ns);
    gw_cache_control_parse("no-cache", &nc, &ns);
    assert_true(nc && !ns);
    gw_cache_control_parse("max-age=0, No-Store", &nc, &ns);
    assert_true(!nc && ns);
    gw_cache_control_parse("no-store,no-cache", &nc, &ns);
    assert_true(nc && ns);
    gw_cache_control_parse("no-cachex, xno-store", &nc, &ns);
    assert_false(nc || ns);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_same_request_same_keys),
        cmocka_unit_test(test_exact_key_normalises_space_and_case),
        cmocka_unit_test(test_text_is_last_user_turn),
        cmocka_unit_test(test_tenant_and_tier_split_namespaces),
        cmocka_unit_test(test_system_prompt_splits_namespaces),
        cmocka_unit_test(test_conversation_splits_namespaces),
        cmocka_unit_test(test_context_and_sampling_split_namespaces),
        cmocka_unit_test(test_non_text_parts_split_namespaces),
        cmocka_unit_test(test_temperature_buckets),
        cmocka_unit_test(test_not_cacheable),
        cmocka_unit_test(test_cache_control),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
