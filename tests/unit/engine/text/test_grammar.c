/* engine/text/grammar: JSON schemas compiled into a token constraint over SmolLM2's vocabulary
 * ($LLMGW_MODELS, default <repo>/models).
 *   - the character machine takes the documents a schema accepts and refuses the others;
 *   - random walks over the allowed tokens (many seeds, several schemas) never reach a state
 *     with nothing allowed, every allowed token is taken, and every walk that ends gives JSON
 *     that parses and has what the schema requires (tests/integration/test_structured.py checks
 *     the model's answers against the jsonschema package);
 *   - unsupported keywords are refused by name;
 *   - the mask's cost is printed (bench/structured measures it against a decode step). */
#include "engine/text/grammar.h"

#include "common/err.h"
#include "tests/unit/engine/smollm2.h"

#include <cjson/cJSON.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

static eng_tokenizer *g_tok;

typedef struct rng { uint64_t s; } rng;
static uint64_t rng_next(rng *r)
{
    uint64_t z = (r->s += 0x9e3779b97f4a7c15u);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
}
static double rng_uniform(rng *r) { return (double)(rng_next(r) >> 11) / 9007199254740992.0; }
static eng_gvocab *g_voc;

static eng_grammar *compile(const char *schema)
{
    eng_grammar *g = NULL;
    util_err err = {0};
    int rc = eng_grammar_compile(&g, g_voc, schema, schema ? strlen(schema) : 0, &err);
    if (rc != 0)
        fprintf(stderr, "compile: %s\n", err.msg);
    assert_int_equal(rc, 0);
    return g;
}

/* Feeds text; returns 1 when taken and whole, 0 when taken but not whole, -1 when refused. */
static int feed(eng_grammar *g, const char *text)
{
    eng_gstate st;
    eng_gstate_init(g, &st);
    if (!eng_grammar_feed(g, &st, text, strlen(text)))
        return -1;
    return eng_gstate_complete(g, &st) ? 1 : 0;
}

static const char *const person =
    "{\"type\":\"object\",\"additionalProperties\":false,\"required\":[\"name\",\"age\","
    "\"tags\",\"kind\"],\"properties\":{"
    "\"name\":{\"type\":\"string\",\"minLength\":1,\"maxLength\":12},"
    "\"age\":{\"type\":\"integer\"},"
    "\"nick\":{\"type\":[\"string\",\"null\"]},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"},\"maxItems\":3},"
    "\"kind\":{\"enum\":[\"cat\",\"dog\",7,null]},"
    "\"born\":{\"type\":\"string\",\"format\":\"date\"},"
    "\"score\":{\"type\":\"number\"},"
    "\"ok\":{\"type\":\"boolean\"}}}";

static void documents_that_fit_are_taken(void **state)
{
    (void)state;
    eng_grammar *g = compile(person);
    assert_int_equal(feed(g, "{\"name\":\"Ann\",\"age\":31,\"tags\":[],\"kind\":\"cat\"}"), 1);
    assert_int_equal(feed(g, "{ \"name\" : \"\\u00e9\\n\", \"age\": -0, \"nick\": null,\n"
                             "  \"tags\": [\"a\", \"b\"], \"kind\": 7, \"born\": \"2024-02-29\","
                             " \"score\": -1.5e+3, \"ok\": false }"), 1);
    assert_int_equal(feed(g, "{\"name\":\"\xc3\xa9t\xc3\xa9\",\"age\":0,\"nick\":\"x\","
                             "\"tags\":[\"\"],\"kind\":null}"), 1);
    assert_int_equal(feed(g, "{\"name\":\"Ann\",\"age\":31,"), 0);   /* a prefix */
    eng_grammar_unref(g);

    g = compile(NULL);   /* json_object: any object */
    assert_int_equal(feed(g, "{}"), 1);
    assert_int_equal(feed(g, "{\"a\":[1,{\"b\":null},\"x\",true,2.5e-3],\"c\":{}}"), 1);
    eng_grammar_unref(g);

    g = compile("{\"$defs\":{\"node\":{\"type\":\"object\",\"required\":[\"v\"],\"properties\":{"
                "\"v\":{\"type\":\"integer\"},\"next\":{\"anyOf\":[{\"$ref\":\"#/$defs/node\"},"
                "{\"type\":\"null\"}]}}}},\"$ref\":\"#/$defs/node\"}");
    assert_int_equal(feed(g, "{\"v\":1,\"next\":{\"v\":2,\"next\":null}}"), 1);
    assert_int_equal(feed(g, "{\"v\":1}"), 1);
    eng_grammar_unref(g);

    /* A union whose first alternative is a union: the value goes to the one it can begin. */
    g = compile("{\"anyOf\":[{\"anyOf\":[{\"type\":\"string\"},{\"type\":\"null\"}]},"
                "{\"type\":\"integer\"}]}");
    assert_int_equal(feed(g, "5"), 1);
    assert_int_equal(feed(g, "null"), 1);
    assert_int_equal(feed(g, "\"x\""), 1);
    eng_grammar_unref(g);

    g = compile("{\"type\":\"object\",\"properties\":{\"when\":{\"type\":\"string\","
                "\"format\":\"date-time\"},\"id\":{\"type\":\"string\",\"format\":\"uuid\"},"
                "\"at\":{\"type\":\"string\",\"format\":\"time\"}},"
                "\"required\":[\"when\",\"id\",\"at\"]}");
    assert_int_equal(feed(g, "{\"when\":\"1999-12-31T23:59:59Z\",\"id\":"
                             "\"123e4567-e89b-12d3-a456-426614174000\",\"at\":\"00:00:00Z\"}"), 1);
    eng_grammar_unref(g);
}

static void documents_that_do_not_fit_are_refused(void **state)
{
    (void)state;
    eng_grammar *g = compile(person);
    static const char *const bad[] = {
        "[",                                                  /* not an object */
        "{\"age\":1",                                         /* name is required first */
        "{\"name\":\"\",",                                    /* minLength 1 */
        "{\"name\":\"abcdefghijklm\"",                        /* maxLength 12 */
        "{\"name\":\"a\",\"age\":1.5",                        /* an integer */
        "{\"name\":\"a\",\"age\":01",                         /* a leading zero */
        "{\"name\":\"a\",\"age\":1,\"extra\":1",              /* closed */
        "{\"name\":\"a\",\"age\":1,\"tags\":[\"a\",\"b\",\"c\",\"d\"",   /* maxItems */
        "{\"name\":\"a\",\"age\":1,\"tags\":[],\"kind\":\"cow\"",       /* enum */
        "{\"name\":\"a\",\"age\":1,\"tags\":[],\"kind\":true",
        "{\"name\":\"a\",\"age\":1,\"tags\":[],\"kind\":7,\"born\":\"2023-02-29\"",  /* no leap */
        "{\"name\":\"a\",\"age\":1,\"tags\":[],\"kind\":7,\"born\":\"2023-13",
        "{\"name\":\"a\x01",                                  /* a control character */
        "{\"name\":\"\\x",                                    /* a bad escape */
        "{\"name\":\"\xc3(",                                  /* broken UTF-8 */
        "{\"name\":\"\xed\xa0\x80",                           /* a surrogate in UTF-8 */
        "{\"name\":\"a\"}",                                   /* age is required */
        "{\"name\":\"a\",\"age\":1,\"tags\":[],\"kind\":7}x", /* nothing after the document */
        "{                 \"name\"",                         /* 17 spaces */
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        int r = feed(g, bad[i]);
        if (r == 1)
            fail_msg("taken: %s", bad[i]);
        if (r == 0 && i != 16)
            fail_msg("not refused: %s", bad[i]);
    }
    assert_int_equal(feed(g, bad[16]), -1);
    eng_grammar_unref(g);
}

static void unsupported_keywords_are_named(void **state)
{
    (void)state;
    static const struct { const char *schema, *needle; } cases[] = {
        {"{\"type\":\"string\",\"pattern\":\"^a\"}", "'pattern'"},
        {"{\"type\":\"object\",\"properties\":{\"n\":{\"type\":\"integer\",\"minimum\":0}}}",
         "#/properties/n: the keyword 'minimum'"},
        {"{\"anyOf\":[{\"type\":\"object\"},{\"type\":\"object\",\"required\":[\"a\"]}]}",
         "begin alike"},
        {"{\"$ref\":\"#/$defs/missing\"}", "not defined"},
        {"{\"type\":\"string\",\"format\":\"email\"}", "format"},
        {"{\"type\":\"strange\"}", "unknown type"},
        {"{\"type\":\"array\",\"items\":[{\"type\":\"string\"}]}", "tuple"},
        {"{\"$defs\":{\"a\":{\"$ref\":\"#/$defs/a\"}},\"$ref\":\"#/$defs/a\"}", "cycle"},
        {"not json", "not valid JSON"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        eng_grammar *g = NULL;
        util_err err = {0};
        int rc = eng_grammar_compile(&g, g_voc, cases[i].schema, strlen(cases[i].schema), &err);
        assert_int_equal(rc, LLMGW_EINVAL);
        assert_null(g);
        if (strstr(err.msg, cases[i].needle) == NULL)
            fail_msg("%s: '%s' lacks '%s'", cases[i].schema, err.msg, cases[i].needle);
    }
}

static int32_t pick(const uint32_t *allow, int n_vocab, rng *rng, int32_t *ids)
{
    int n = 0, structural = 0;
    for (int32_t t = 0; t < n_vocab; t++)
        if (allow[t / 32] >> (t % 32) & 1)
            ids[n++] = t;
    assert_true(n > 0);
    /* Half the time, a token with a quote, bracket, brace, comma or colon, so walks end. */
    if (rng_uniform(rng) < 0.5) {
        for (int i = 0; i < n; i++) {
            char piece[257];
            int k = eng_token_piece(g_tok, ids[i], false, piece, sizeof piece - 1);
            if (k <= 0 || k > (int)sizeof piece - 1 || memchr(piece, '\0', (size_t)k) != NULL)
                continue;
            piece[k] = '\0';
            if (strpbrk(piece, "\"}],:") != NULL)
                ids[structural++] = ids[i];
        }
        if (structural > 0)
            n = structural;
    }
    return ids[rng_next(rng) % (uint64_t)n];
}

/* Walks from the start, picking allowed tokens, until an end-of-generation token; the text must
 * parse. Returns the parsed document (NULL when the walk ran out of steps). */
static cJSON *walk(eng_grammar *g, uint64_t seed, int max_steps)
{
    int n_vocab = eng_tokenizer_n_vocab(g_tok);
    uint32_t *allow = calloc((size_t)(n_vocab + 31) / 32, sizeof *allow);
    int32_t *ids = malloc((size_t)n_vocab * sizeof *ids);
    char *text = calloc(1, 64 * 1024);
    size_t len = 0;
    rng rng = {seed};
    eng_gstate st;
    eng_gstate_init(g, &st);
    cJSON *doc = NULL;
    for (int step = 0; step < max_steps; step++) {
        int n = eng_grammar_allowed(g, &st, allow);
        assert_true(n > 0);
        int32_t t = pick(allow, n_vocab, &rng, ids);
        assert_true(eng_grammar_advance(g, &st, t));
        if (eng_tokenizer_is_eog(g_tok, t)) {
            doc = cJSON_ParseWithLength(text, len);
            if (doc == NULL)
                fail_msg("seed %llu: not JSON: %s", (unsigned long long)seed, text);
            break;
        }
        char piece[256];
        int k = eng_token_piece(g_tok, t, false, piece, sizeof piece);
        assert_true(k > 0 && k <= (int)sizeof piece && len + (size_t)k < 64 * 1024);
        memcpy(text + len, piece, (size_t)k);
        len += (size_t)k;
    }
    free(allow);
    free(ids);
    free(text);
    return doc;
}

static void random_walks_end_in_valid_json(void **state)
{
    (void)state;
    const char *schemas[] = {person, NULL,
                             "{\"type\":\"object\",\"properties\":{\"items\":{\"type\":\"array\","
                             "\"minItems\":2,\"items\":{\"type\":\"object\",\"properties\":{"
                             "\"q\":{\"type\":\"number\"},\"when\":{\"type\":\"string\","
                             "\"format\":\"date\"}},\"required\":[\"q\",\"when\"]}}},"
                             "\"required\":[\"items\"]}"};
    int ended = 0, total = 0;
    /* LLMGW_GRAMMAR_WALKS: more walks a schema (a longer search for a machine bug). */
    uint64_t walks = getenv("LLMGW_GRAMMAR_WALKS") ? strtoull(getenv("LLMGW_GRAMMAR_WALKS"),
                                                               NULL, 10) : 24;
    for (size_t s = 0; s < sizeof schemas / sizeof *schemas; s++) {
        eng_grammar *g = compile(schemas[s]);
        for (uint64_t seed = 1; seed <= walks; seed++) {
            cJSON *doc = walk(g, seed * 7919 + s, 400);
            total++;
            if (doc == NULL)
                continue;
            ended++;
            assert_true(cJSON_IsObject(doc));
            if (s == 0) {
                const cJSON *name = cJSON_GetObjectItemCaseSensitive(doc, "name");
                assert_true(cJSON_IsString(name));
                assert_true(cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(doc, "age")));
                assert_true(cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(doc, "tags")));
                assert_non_null(cJSON_GetObjectItemCaseSensitive(doc, "kind"));
                assert_null(cJSON_GetObjectItemCaseSensitive(doc, "extra"));
            } else if (s == 2) {
                assert_true(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(doc, "items")) >=
                            2);
            }
            cJSON_Delete(doc);
        }
        eng_grammar_unref(g);
    }
    printf("[ INFO     ] %d of %d walks ended (the rest ran out of steps)\n", ended, total);
    assert_true(ended >= total / 2);
}

static eng_grammar *compile_tools(eng_chat_kind kind, bool required)
{
    static const char weather[] =
        "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"},\"unit\":{\"enum\":"
        "[\"c\",\"f\"]}},\"required\":[\"city\"],\"additionalProperties\":false}";
    eng_tool_spec tools[] = {{"get_weather", weather, sizeof weather - 1},
                             {"get_time", NULL, 0}};
    eng_grammar *g = NULL;
    util_err err = {0};
    int rc = eng_grammar_compile_tools(&g, g_voc, tools, 2, eng_tools_format(kind), required,
                                       &err);
    if (rc != 0)
        fprintf(stderr, "compile_tools: %s\n", err.msg);
    assert_int_equal(rc, 0);
    return g;
}

static void tool_calls_are_constrained(void **state)
{
    (void)state;
    static const char call[] = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
                               "{\"city\": \"Paris\", \"unit\": \"c\"}}\n</tool_call>";
    eng_grammar *g = compile_tools(ENG_CHAT_CHATML, true);
    assert_int_equal(feed(g, call), 1);
    assert_int_equal(feed(g, "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n"
                             "</tool_call>"), 1);
    assert_int_equal(feed(g, "Hello"), -1);                                   /* required */
    assert_int_equal(feed(g, "<tool_call>\n{\"name\": \"nope\""), -1);       /* no such tool */
    assert_int_equal(feed(g, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}"), -1);
    assert_int_equal(feed(g, "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}"), 0);
    eng_grammar_unref(g);

    g = compile_tools(ENG_CHAT_CHATML, false);   /* auto: text, or a call */
    assert_int_equal(feed(g, "It is sunny in Paris."), 1);
    assert_int_equal(feed(g, "<tool_cal!"), 1);            /* text after all */
    assert_int_equal(feed(g, call), 1);
    assert_int_equal(feed(g, "\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"unit\""),
                     -1);                                  /* city first: it is required */
    eng_grammar_unref(g);

    g = compile_tools(ENG_CHAT_LLAMA3, false);
    assert_int_equal(feed(g, "{\"name\": \"get_time\", \"parameters\": {}}"), 1);
    assert_int_equal(feed(g, "{\"city\": 1}"), -1);        /* "{" commits to a call */
    assert_int_equal(feed(g, "Sure."), 1);
    eng_grammar_unref(g);

    /* Random walks through required calls end in calls the format's parser reads back. */
    int n_vocab = eng_tokenizer_n_vocab(g_tok);
    uint32_t *allow = calloc((size_t)(n_vocab + 31) / 32, sizeof *allow);
    int32_t *ids = malloc((size_t)n_vocab * sizeof *ids);
    g = compile_tools(ENG_CHAT_CHATML, true);
    int ended = 0;
    for (uint64_t seed = 1; seed <= 16; seed++) {
        rng r = {seed};
        eng_gstate st;
        eng_gstate_init(g, &st);
        char text[8192];
        size_t len = 0;
        for (int step = 0; step < 300; step++) {
            assert_true(eng_grammar_allowed(g, &st, allow) > 0);
            int32_t t = pick(allow, n_vocab, &r, ids);
            assert_true(eng_grammar_advance(g, &st, t));
            if (eng_tokenizer_is_eog(g_tok, t)) {
                char *name, *args;
                assert_int_equal(eng_tools_parse(ENG_CHAT_CHATML, text, len, &name, &args), 1);
                assert_true(strcmp(name, "get_weather") == 0 || strcmp(name, "get_time") == 0);
                free(name);
                free(args);
                ended++;
                break;
            }
            char piece[256];
            int k = eng_token_piece(g_tok, t, false, piece, sizeof piece);
            assert_true(k > 0 && k <= (int)sizeof piece && len + (size_t)k < sizeof text);
            memcpy(text + len, piece, (size_t)k);
            len += (size_t)k;
        }
    }
    assert_true(ended >= 8);
    eng_grammar_unref(g);
    free(allow);
    free(ids);
}

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static void mask_cost_is_printed(void **state)
{
    (void)state;
    eng_grammar *g = compile(person);
    int n_vocab = eng_tokenizer_n_vocab(g_tok);
    uint32_t *allow = calloc((size_t)(n_vocab + 31) / 32, sizeof *allow);
    static const char *const where[] = {"", "{\"name\":\"An", "{\"name\":\"Ann\",\"age\":3",
                                        "{\"name\":\"Ann\",\"age\":3,\"tags\":[\"x\", ",
                                        "{\"name\":\"Ann\",\"age\":3,\"tags\":[\"x"};
    for (size_t i = 0; i < sizeof where / sizeof *where; i++) {
        eng_gstate st;
        eng_gstate_init(g, &st);
        assert_true(eng_grammar_feed(g, &st, where[i], strlen(where[i])));
        int reps = 50, n = 0;
        double t0 = now_ms();
        for (int r = 0; r < reps; r++)
            n = eng_grammar_allowed(g, &st, allow);
        printf("[ INFO     ] mask after '%s': %d tokens allowed, %.3f ms\n", where[i], n,
               (now_ms() - t0) / reps);
        assert_true(n > 0);
    }
    free(allow);
    eng_grammar_unref(g);
}

static int setup(void **state)
{
    (void)state;
    util_err err = {0};
    int rc = smollm2_tokenizer(&g_tok, &err);
    double t0 = now_ms();
    if (rc == 0)
        rc = eng_gvocab_new(&g_voc, g_tok, &err);
    if (rc != 0) {
        fprintf(stderr, "test_grammar: %s\n", err.msg);
        return -1;
    }
    printf("[ INFO     ] vocabulary trie built in %.1f ms\n", now_ms() - t0);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    eng_gvocab_free(g_voc);
    eng_tokenizer_free(g_tok);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(documents_that_fit_are_taken),
        cmocka_unit_test(documents_that_do_not_fit_are_refused),
        cmocka_unit_test(unsupported_keywords_are_named),
        cmocka_unit_test(random_walks_end_in_valid_json),
        cmocka_unit_test(tool_calls_are_constrained),
        cmocka_unit_test(mask_cost_is_printed),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
