/* tests/unit/gateway/test_json.c: the strict JSON scan (gw_json_check), duplicate keys
 * (gw_json_duplicate) and the printer (gw_json_print), alone. */
#include "gateway/json.h"

#include <event2/buffer.h>
#include <stdlib.h>

#include "tests/unit/unit.h"

static int check(const char *s)
{
    gw_json_fault f;
    return gw_json_check(s, strlen(s), &f);
}

static void accepts_rfc8259(void **state)
{
    (void)state;
    static const char *const ok[] = {
        "{}", "[]", " \t\r\n{ } ", "0", "-0", "1.5", "-1.25e+10", "1E-3", "true", "false", "null",
        "\"\"", "\"a\\\"b\\\\c\\/d\\b\\f\\n\\r\\t\"", "\"\\u00e9\\ud83d\\ude00\"", "[1,[2,[3,{}]]]",
        "{\"a\":{\"b\":[null,true]},\"c\":\"\xc3\xa9\"}", "123456789012345678901234567890",
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        if (check(ok[i]) != 0)
            print_error("refused: %s\n", ok[i]);
        assert_int_equal(check(ok[i]), 0);
    }
}

static void refuses_what_cjson_takes(void **state)
{
    (void)state;
    static const struct {
        const char *text;
        size_t offset;
        const char *what;
    } bad[] = {
        {"+1", 0, "unexpected character"},
        {"01", 0, "leading zero"},
        {".5", 0, "unexpected character"},
        {"1.", 0, "after its '.'"},
        {"1e", 0, "exponent"},
        {"-", 0, "without digits"},
        {"[1,]", 3, "unexpected character"},
        {"{\"a\":1,}", 7, "not a string"},
        {"{\"a\" 1}", 5, "missing ':'"},
        {"[1 2]", 3, "missing ','"},
        {"\"a\nb\"", 2, "control byte (0x0a)"},
        {"\"a\tb\"", 2, "control byte (0x09)"},
        {"\"\\u0000\"", 1, "NUL"},
        {"\"\\x41\"", 1, "invalid escape"},
        {"\"\\u12\"", 1, "four hex digits"},
        {"\"\\ud800\"", 1, "without a low one"},
        {"\"\\udc00\"", 1, "without a high one"},
        {"\"\\ud800\\u0041\"", 1, "without a low one"},
        {"\"abc", 4, "unterminated"},
        {"{} {}", 3, "after the JSON value"},
        {"", 0, "ends where a value"},
        {"tru", 0, "unexpected character"},
        {"True", 0, "unexpected character"},
        {"nul", 0, "unexpected character"},
        {"[1e400]", 1, "too large"},
        {"-2E+999", 0, "too large"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        gw_json_fault f = {0};
        int rc = gw_json_check(bad[i].text, strlen(bad[i].text), &f);
        if (rc == 0 || f.offset != bad[i].offset || strstr(f.what, bad[i].what) == NULL)
            print_error("'%s': rc %d offset %zu what '%s'\n", bad[i].text, rc, f.offset, f.what);
        assert_int_equal(rc, -1);
        assert_int_equal(f.offset, bad[i].offset);
        assert_non_null(strstr(f.what, bad[i].what));
    }
    /* The length is respected: a NUL byte inside the buffer is a control byte in a string and
     * text after the value elsewhere. */
    gw_json_fault f;
    assert_int_equal(gw_json_check("\"a\0\"", 4, &f), -1);
    assert_int_equal(gw_json_check("{}\0", 3, &f), -1);
    assert_int_equal(gw_json_check("{}x", 2, &f), 0);
}

static void nesting_limit(void **state)
{
    (void)state;
    size_t n = GW_JSON_MAX_DEPTH + 1;
    char *s = malloc(2 * n + 1);
    for (size_t i = 0; i < n; i++) {
        s[i] = '[';
        s[2 * n - 1 - i] = ']';
    }
    s[2 * n] = '\0';
    gw_json_fault f;
    assert_int_equal(gw_json_check(s, 2 * n, &f), -1);
    assert_non_null(strstr(f.what, "nested"));
    assert_int_equal(gw_json_check(s + 1, 2 * n - 2, &f), 0);  /* exactly the limit */
    free(s);
}

static const char *dup_of(const char *text, char *path, size_t cap)
{
    static char name[64];
    cJSON *v = cJSON_Parse(text);
    assert_non_null(v);
    const char *d = gw_json_duplicate(v, path, cap);
    snprintf(name, sizeof name, "%s", d ? d : "");
    cJSON_Delete(v);
    return d ? name : NULL;
}

static void duplicates_named_with_their_path(void **state)
{
    (void)state;
    char path[64];
    assert_null(dup_of("{\"a\":1,\"b\":{\"a\":2},\"c\":[{\"a\":3},{\"a\":4}]}", path, sizeof path));
    assert_string_equal(dup_of("{\"a\":1,\"a\":2}", path, sizeof path), "a");
    assert_string_equal(path, "a");
    assert_string_equal(dup_of("{\"m\":[{\"r\":1},{\"c\":1,\"x\":0,\"c\":2}]}", path, sizeof path),
                        "c");
    assert_string_equal(path, "m.[1].c");
    assert_string_equal(dup_of("[[{\"k\":{\"z\":1,\"z\":1}}]]", path, sizeof path), "z");
    assert_string_equal(path, "[0].[0].k.z");
    /* Keys differ in case or by a byte: not duplicates. */
    assert_null(dup_of("{\"a\":1,\"A\":2,\"a \":3,\"\":4}", path, sizeof path));
    /* A path longer than the buffer is cut, not overrun. */
    char small[6];
    assert_string_equal(dup_of("{\"outer\":{\"inner\":{\"q\":1,\"q\":2}}}", small, sizeof small),
                        "q");
    assert_true(strlen(small) < sizeof small);
}

static void duplicates_in_big_objects(void **state)
{
    (void)state;
    enum { N = 5000 };
    char *s = malloc(N * 16 + 64), path[64];
    size_t w = (size_t)sprintf(s, "{");
    for (int i = 0; i < N; i++)
        w += (size_t)sprintf(s + w, "\"k%d\":%d,", i, i);
    strcpy(s + w, "\"end\":0}");
    assert_null(dup_of(s, path, sizeof path));
    strcpy(s + w, "\"k4321\":0}");
    assert_string_equal(dup_of(s, path, sizeof path), "k4321");
    assert_string_equal(path, "k4321");
    free(s);
}

static char *print_of(const char *text, const char *model)
{
    cJSON *v = cJSON_Parse(text);
    assert_non_null(v);
    struct evbuffer *b = evbuffer_new();
    gw_json_print(v, model, b);
    size_t n = evbuffer_get_length(b);
    char *out = malloc(n + 1);
    evbuffer_remove(b, out, n);
    out[n] = '\0';
    evbuffer_free(b);
    cJSON_Delete(v);
    return out;
}

static void printer_keeps_integers_and_escapes(void **state)
{
    (void)state;
    static const struct {
        const char *in, *out;
    } cases[] = {
        {"{\"seed\":1000000000000}", "{\"seed\":1000000000000}"},
        {"{\"seed\":-9007199254740992}", "{\"seed\":-9007199254740992}"},
        {"[0.1,2.5,-3e2,1e300,0]", "[0.1,2.5,-300,1e+300,0]"},
        {"{\"s\":\"a\\nb\\u0001\\\"\\\\/\\u00e9\"}", "{\"s\":\"a\\nb\\u0001\\\"\\\\/\xc3\xa9\"}"},
        {"[true,false,null,{},[]]", "[true,false,null,{},[]]"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *got = print_of(cases[i].in, NULL);
        if (strcmp(got, cases[i].out) != 0)
            print_error("%s -> %s (want %s)\n", cases[i].in, got, cases[i].out);
        assert_string_equal(got, cases[i].out);
        free(got);
    }
    /* The model override is for the top-level "model" only. */
    char *got = print_of("{\"model\":\"gpt-4o\",\"x\":{\"model\":\"keep\"}}", "stub-large");
    assert_string_equal(got, "{\"model\":\"stub-large\",\"x\":{\"model\":\"keep\"}}");
    free(got);
}

/* Random bodies: whatever the strict scan accepts, cJSON parses, and our printout of it passes
 * the scan again and parses to the same tree. */
static void property_scan_parse_print(void **state)
{
    (void)state;
    static const char alphabet[] = "{}[]:,\"\\ 0123456789.-+eEtrufalsnu\n\t\x01\xc3\xa9" "a";
    uint64_t x = 0x9e3779b97f4a7c15ull;
    int accepted = 0;
    for (int it = 0; it < 200000; it++) {
        char s[24];
        size_t n = 1 + (size_t)(it % 23);
        for (size_t i = 0; i < n; i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            s[i] = alphabet[x % (sizeof alphabet - 1)];
        }
        gw_json_fault f;
        if (gw_json_check(s, n, &f) != 0) {
            assert_true(f.offset <= n);
            continue;
        }
        accepted++;
        cJSON *v = cJSON_ParseWithLength(s, n);
        assert_non_null(v);
        struct evbuffer *b = evbuffer_new();
        gw_json_print(v, NULL, b);
        size_t m = evbuffer_get_length(b);
        const char *p = (const char *)evbuffer_pullup(b, -1);
        assert_int_equal(gw_json_check(p, m, &f), 0);
        cJSON *w = cJSON_ParseWithLength(p, m);
        if (!cJSON_Compare(v, w, true))
            print_error("'%.*s' printed as '%.*s'\n", (int)n, s, (int)m, p);
        assert_true(cJSON_Compare(v, w, true));
        cJSON_Delete(w);
        cJSON_Delete(v);
        evbuffer_free(b);
    }
    assert_true(accepted > 100);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(accepts_rfc8259),
        cmocka_unit_test(refuses_what_cjson_takes),
        cmocka_unit_test(nesting_limit),
        cmocka_unit_test(duplicates_named_with_their_path),
        cmocka_unit_test(duplicates_in_big_objects),
        cmocka_unit_test(printer_keeps_integers_and_escapes),
        cmocka_unit_test(property_scan_parse_print),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
