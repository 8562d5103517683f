/* tests/unit/gateway/test_openai.c: the stream chunks written without a JSON tree parse as the
 * OpenAI shapes, with every string escaped. */
#include "gateway/json.h"
#include "gateway/openai.h"

#include <cjson/cJSON.h>
#include <event2/buffer.h>
#include <stdlib.h>

#include "tests/unit/unit.h"

/* The buffer's text, checked strict and parsed; the buffer is emptied. */
static cJSON *take(struct evbuffer *b)
{
    size_t n = evbuffer_get_length(b);
    const char *p = (const char *)evbuffer_pullup(b, -1);
    gw_json_fault f;
    if (gw_json_check(p, n, &f) != 0)
        print_error("not strict JSON (%s at %zu): %.*s\n", f.what, f.offset, (int)n, p);
    assert_int_equal(gw_json_check(p, n, &f), 0);
    cJSON *o = cJSON_ParseWithLength(p, n);
    assert_non_null(o);
    char dup[64];
    assert_null(gw_json_duplicate(o, dup, sizeof dup));
    evbuffer_drain(b, n);
    return o;
}

static const char *str(const cJSON *o, const char *path0, const char *path1)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, path0);
    if (path1 != NULL)
        v = cJSON_GetObjectItemCaseSensitive(v, path1);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static void chat_chunks(void **state)
{
    (void)state;
    struct evbuffer *b = evbuffer_new();
    gw_openai_head h = {.id = "chatcmpl-req_1", .chat = true, .created = 1700000000,
                        .model = "gpt-4o-mini", .fingerprint = "llmgw-small"};
    static const char text[] = "a \"quote\"\\ \n\x01 \xf0\x9f\x8e\x89 and more";
    gw_openai_step s = {.index = 2, .role = true, .text = text, .len = 13};
    gw_openai_chunk(b, &h, &s);
    cJSON *o = take(b);
    assert_string_equal(str(o, "id", NULL), "chatcmpl-req_1");
    assert_string_equal(str(o, "object", NULL), "chat.completion.chunk");
    assert_int_equal((long)cJSON_GetObjectItem(o, "created")->valuedouble, 1700000000);
    assert_string_equal(str(o, "system_fingerprint", NULL), "llmgw-small");
    const cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0);
    assert_int_equal(cJSON_GetObjectItem(c, "index")->valueint, 2);
    assert_string_equal(str(c, "delta", "role"), "assistant");
    assert_string_equal(str(c, "delta", "content"), "a \"quote\"\\ \n\x01");  /* len respected */
    assert_true(cJSON_IsNull(cJSON_GetObjectItem(c, "logprobs")));
    assert_true(cJSON_IsNull(cJSON_GetObjectItem(c, "finish_reason")));
    cJSON_Delete(o);
    /* The finish chunk: no content, no role; logprobs passed through as JSON. */
    /* A tool-call delta (a cache replay) alone, and after content. */
    s = (gw_openai_step){.tool_calls = "[{\"index\":0,\"id\":\"c1\"}]"};
    gw_openai_chunk(b, &h, &s);
    o = take(b);
    c = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(c, "delta")), 1);
    assert_string_equal(str(cJSON_GetArrayItem(cJSON_GetObjectItem(cJSON_GetObjectItem(c, "delta"),
                                                                   "tool_calls"), 0), "id", NULL),
                        "c1");
    cJSON_Delete(o);
    s = (gw_openai_step){.text = "x", .len = 1, .tool_calls = "[]"};
    gw_openai_chunk(b, &h, &s);
    cJSON_Delete(take(b));
    s = (gw_openai_step){.index = 0, .finish = "length", .logprobs = "{\"content\":[]}"};
    h.fingerprint = NULL;
    gw_openai_chunk(b, &h, &s);
    o = take(b);
    c = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0);
    assert_null(cJSON_GetObjectItem(o, "system_fingerprint"));
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(c, "delta")), 0);
    assert_string_equal(str(c, "finish_reason", NULL), "length");
    assert_true(cJSON_IsArray(cJSON_GetObjectItem(cJSON_GetObjectItem(c, "logprobs"), "content")));
    cJSON_Delete(o);
    evbuffer_free(b);
}

static void completion_and_usage_chunks(void **state)
{
    (void)state;
    struct evbuffer *b = evbuffer_new();
    gw_openai_head h = {.id = "cmpl-x", .chat = false, .created = 5, .model = "m\"odel"};
    gw_openai_step s = {.index = 0, .text = "\xe4\xb8\xad", .len = 3};
    gw_openai_chunk(b, &h, &s);
    cJSON *o = take(b);
    assert_string_equal(str(o, "object", NULL), "text_completion");
    assert_string_equal(str(o, "model", NULL), "m\"odel");
    const cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0);
    assert_string_equal(str(c, "text", NULL), "\xe4\xb8\xad");
    assert_null(cJSON_GetObjectItem(c, "delta"));
    cJSON_Delete(o);
    s = (gw_openai_step){.index = 1, .finish = "stop"};  /* completions always carry text */
    gw_openai_chunk(b, &h, &s);
    o = take(b);
    c = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0);
    assert_string_equal(str(c, "text", NULL), "");
    cJSON_Delete(o);
    gw_openai_usage_chunk_raw(b, &h, NULL);
    o = take(b);
    assert_true(cJSON_IsNull(cJSON_GetObjectItem(o, "usage")));
    cJSON_Delete(o);
    gw_openai_usage_chunk(b, &h, 12, 30);
    o = take(b);
    assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(o, "choices")), 0);
    const cJSON *u = cJSON_GetObjectItem(o, "usage");
    assert_int_equal(cJSON_GetObjectItem(u, "prompt_tokens")->valueint, 12);
    assert_int_equal(cJSON_GetObjectItem(u, "completion_tokens")->valueint, 30);
    assert_int_equal(cJSON_GetObjectItem(u, "total_tokens")->valueint, 42);
    cJSON_Delete(o);
    gw_openai_usage(b, 0, 7);   /* the bare object, as a whole answer carries it */
    o = take(b);
    assert_int_equal(cJSON_GetObjectItem(o, "prompt_tokens")->valueint, 0);
    assert_int_equal(cJSON_GetObjectItem(o, "total_tokens")->valueint, 7);
    assert_int_equal(cJSON_GetArraySize(o), 3);
    cJSON_Delete(o);
    evbuffer_free(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(chat_chunks),
        cmocka_unit_test(completion_and_usage_chunks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
