/* tests/unit/gateway/test_request.c: OpenAI request validation (gw_request_parse) and the UTF-8
 * check (gw_utf8_valid). Invalid bodies come from one table, one named subtest per row: each
 * must give 400, the OpenAI error type, the expected `param` and `code`, and a message. */
#include "gateway/request.h"

#include "common/err.h"

#include <stdlib.h>

#include "tests/unit/unit.h"

/* ---- fixture: an arena, a request and its error, released after each test ---- */

typedef struct fixture {
    util_arena arena;
    gw_request r;
    gw_req_error e;
} fixture;

static int fx_setup(void **state)
{
    fixture *f = calloc(1, sizeof *f);
    if (f == NULL)
        return -1;
    util_arena_init(&f->arena, 4096);
    *state = f;
    return 0;
}

static int fx_teardown(void **state)
{
    fixture *f = *state;
    gw_request_deinit(&f->r);
    util_arena_deinit(&f->arena);
    free(f);
    return 0;
}

static int parse_len(fixture *f, gw_endpoint ep, const char *body, size_t len)
{
    gw_request_deinit(&f->r);
    return gw_request_parse(&f->r, ep, body, len, &f->arena, &f->e);
}

static int parse(fixture *f, gw_endpoint ep, const char *body)
{
    return parse_len(f, ep, body, strlen(body));
}

/* Parses a body that must be valid; shows the error message when it is not. */
static void parse_ok(fixture *f, gw_endpoint ep, const char *body)
{
    int rc = parse(f, ep, body);
    if (rc != 0)
        print_error("unexpected error (param '%s'): %s\n", f->e.param, f->e.message);
    assert_int_equal(rc, 0);
    assert_non_null(f->r.json);
    assert_int_equal(f->e.status, 0);
}

#define USER_HI "{\"role\":\"user\",\"content\":\"hi\"}"
#define CHAT(extra) "{\"model\":\"m\",\"messages\":[" USER_HI "]" extra "}"
#define COMPL(extra) "{\"model\":\"m\",\"prompt\":\"p\"" extra "}"

/* ---- invalid bodies: one row each ---- */

typedef struct bad_case {
    const char *name;
    gw_endpoint ep;
    const char *body;
    size_t len;          /* 0: strlen(body) */
    const char *param;   /* "" when the error names no parameter */
    const char *code;    /* NULL when it has none */
} bad_case;

#define BAD(name, ep, body, param, code) {name, ep, body, 0, param, code}
#define BAD_BYTES(name, ep, body, param, code) {name, ep, body, sizeof body - 1, param, code}

static const bad_case k_bad[] = {
    /* the body itself */
    {"empty_body", GW_EP_CHAT, "", 0, "", NULL},
    BAD("whitespace_body", GW_EP_CHAT, "   \n", "", NULL),
    BAD("array_body", GW_EP_CHAT, "[\"an\", \"array\"]", "", NULL),
    BAD("string_body", GW_EP_CHAT, "\"just a string\"", "", NULL),
    BAD("number_body", GW_EP_EMBEDDINGS, "42", "", NULL),
    BAD("null_body", GW_EP_COMPLETIONS, "null", "", NULL),
    BAD("malformed_truncated", GW_EP_CHAT, "{\"model\": \"m\", \"messages\": [", "", NULL),
    BAD("malformed_not_json", GW_EP_CHAT, "not json at all", "", NULL),
    BAD("malformed_single_quotes", GW_EP_CHAT, "{'model': 'm'}", "", NULL),
    BAD("malformed_trailing_comma", GW_EP_CHAT, "{\"model\":\"m\",}", "", NULL),
    BAD("trailing_garbage", GW_EP_CHAT, CHAT("") " trailing", "", NULL),
    BAD("two_objects", GW_EP_CHAT, CHAT("") CHAT(""), "", NULL),
    BAD_BYTES("invalid_utf8_ff", GW_EP_CHAT,
              "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"a\xff\"}]}", "",
              NULL),
    BAD_BYTES("invalid_utf8_lone_continuation", GW_EP_CHAT,
              "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"\x80\"}]}", "",
              NULL),
    BAD_BYTES("invalid_utf8_truncated_sequence", GW_EP_CHAT,
              "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"\xe4\xbd\"}]}", "",
              NULL),
    BAD_BYTES("overlong_utf8_slash", GW_EP_CHAT,
              "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"\xc0\xaf\"}]}", "",
              NULL),
    BAD_BYTES("overlong_utf8_3byte", GW_EP_CHAT,
              "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"\xe0\x80\xaf\"}]}",
              "", NULL),
    BAD_BYTES("utf8_encoded_surrogate_half", GW_EP_CHAT,
              "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"\xed\xa0\x80\"}]}",
              "", NULL),
    BAD_BYTES("utf8_above_u10ffff", GW_EP_CHAT,
              "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":"
              "\"\xf4\x90\x80\x80\"}]}",
              "", NULL),
    BAD("escaped_lone_high_surrogate", GW_EP_CHAT,
        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"\\ud83d\"}]}", "", NULL),
    BAD("escaped_lone_low_surrogate", GW_EP_CHAT,
        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"\\ude00\"}]}", "", NULL),
    BAD("escaped_high_then_letter", GW_EP_CHAT,
        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"\\ud83dx\"}]}", "", NULL),
    BAD("escaped_reversed_pair", GW_EP_CHAT,
        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"\\ude00\\ud83d\"}]}", "",
        NULL),
    /* strict RFC 8259 (cJSON alone takes these, and a peer may read them otherwise) */
    BAD_BYTES("raw_newline_in_string", GW_EP_CHAT,
              "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"a\nb\"}]}", "",
              NULL),
    BAD_BYTES("raw_nul_in_string", GW_EP_CHAT,
              "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"a\0b\"}]}", "",
              NULL),
    BAD_BYTES("raw_tab_in_key", GW_EP_CHAT,
              "{\"mo\tdel\":\"m\",\"messages\":[" USER_HI "]}", "", NULL),
    BAD("escaped_nul", GW_EP_CHAT,
        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"a\\u0000b\"}]}", "",
        NULL),
    BAD("bad_escape", GW_EP_CHAT,
        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"a\\qb\"}]}", "", NULL),
    BAD("number_plus_sign", GW_EP_CHAT, CHAT(",\"temperature\":+1"), "", NULL),
    BAD("number_leading_zero", GW_EP_CHAT, CHAT(",\"max_tokens\":012"), "", NULL),
    BAD("number_leading_dot", GW_EP_CHAT, CHAT(",\"temperature\":.5"), "", NULL),
    BAD("number_trailing_dot", GW_EP_CHAT, CHAT(",\"temperature\":1."), "", NULL),
    BAD("number_bare_exponent", GW_EP_CHAT, CHAT(",\"temperature\":1e"), "", NULL),
    BAD("literal_capitalised", GW_EP_CHAT, CHAT(",\"stream\":True"), "", NULL),

    /* duplicate keys: we would read one copy and the upstream another */
    BAD("duplicate_model", GW_EP_CHAT,
        "{\"model\":\"m\",\"messages\":[" USER_HI "],\"model\":\"gpt-4o\"}", "model",
        "duplicate_key"),
    BAD("duplicate_messages", GW_EP_CHAT,
        "{\"model\":\"m\",\"messages\":[" USER_HI "],\"messages\":[{\"role\":\"user\","
        "\"content\":\"Answer: 5\"}]}",
        "messages", "duplicate_key"),
    BAD("duplicate_content", GW_EP_CHAT,
        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"What is 2+2?\","
        "\"content\":\"Answer: 5\"}]}",
        "messages.[0].content", "duplicate_key"),
    BAD("duplicate_deep_in_tools", GW_EP_CHAT,
        CHAT(",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":"
             "{\"type\":\"object\",\"type\":\"string\"}}}]"),
        "tools.[0].function.parameters.type", "duplicate_key"),
    BAD("duplicate_in_unknown_field", GW_EP_COMPLETIONS, COMPL(",\"extra\":{\"a\":1,\"a\":2}"),
        "extra.a", "duplicate_key"),
    BAD("duplicate_logit_bias_id", GW_EP_CHAT, CHAT(",\"logit_bias\":{\"5\":1,\"5\":-100}"),
        "logit_bias.5", "duplicate_key"),

    /* logit_bias */
    BAD("logit_bias_array", GW_EP_CHAT, CHAT(",\"logit_bias\":[1]"), "logit_bias",
        "invalid_type"),
    BAD("logit_bias_key_word", GW_EP_CHAT, CHAT(",\"logit_bias\":{\"hello\":1}"), "logit_bias",
        "invalid_value"),
    BAD("logit_bias_key_negative", GW_EP_CHAT, CHAT(",\"logit_bias\":{\"-3\":1}"), "logit_bias",
        "invalid_value"),
    BAD("logit_bias_key_huge", GW_EP_COMPLETIONS, COMPL(",\"logit_bias\":{\"99999999999\":1}"),
        "logit_bias", "invalid_value"),
    BAD("logit_bias_value_string", GW_EP_CHAT, CHAT(",\"logit_bias\":{\"7\":\"1\"}"),
        "logit_bias", "invalid_type"),
    BAD("logit_bias_value_above", GW_EP_CHAT, CHAT(",\"logit_bias\":{\"7\":100.5}"),
        "logit_bias", "decimal_out_of_range"),
    BAD("logit_bias_value_below", GW_EP_COMPLETIONS, COMPL(",\"logit_bias\":{\"7\":-101}"),
        "logit_bias", "decimal_out_of_range"),

    /* model */
    BAD("model_missing", GW_EP_CHAT, "{\"messages\":[" USER_HI "]}", "model",
        "missing_required_parameter"),
    BAD("model_null", GW_EP_CHAT, "{\"model\":null,\"messages\":[" USER_HI "]}", "model",
        "missing_required_parameter"),
    BAD("model_number", GW_EP_CHAT, "{\"model\":5,\"messages\":[" USER_HI "]}", "model",
        "invalid_type"),
    BAD("model_array", GW_EP_EMBEDDINGS, "{\"model\":[\"m\"],\"input\":\"x\"}", "model",
        "invalid_type"),
    BAD("model_empty", GW_EP_COMPLETIONS, "{\"model\":\"\",\"prompt\":\"x\"}", "model",
        "invalid_value"),

    /* messages */
    BAD("messages_missing", GW_EP_CHAT, "{\"model\":\"m\"}", "messages",
        "missing_required_parameter"),
    BAD("messages_object", GW_EP_CHAT, "{\"model\":\"m\",\"messages\":" USER_HI "}", "messages",
        "invalid_type"),
    BAD("messages_string", GW_EP_CHAT, "{\"model\":\"m\",\"messages\":\"hi\"}", "messages",
        "invalid_type"),
    BAD("messages_empty", GW_EP_CHAT, "{\"model\":\"m\",\"messages\":[]}", "messages",
        "empty_array"),
    BAD("message_not_object", GW_EP_CHAT, "{\"model\":\"m\",\"messages\":[\"hi\"]}",
        "messages.[0]", "invalid_type"),
    BAD("role_unknown", GW_EP_CHAT,
        "{\"model\":\"m\",\"messages\":[{\"role\":\"wizard\",\"content\":\"hi\"}]}",
        "messages.[0].role", "invalid_value"),
    BAD("role_missing", GW_EP_CHAT, "{\"model\":\"m\",\"messages\":[{\"content\":\"hi\"}]}",
        "messages.[0].role", "missing_required_parameter"),
    BAD("role_number", GW_EP_CHAT,
        "{\"model\":\"m\",\"messages\":[{\"role\":1,\"content\":\"hi\"}]}", "messages.[0].role",
        "invalid_type"),
    BAD("role_wrong_case", GW_EP_CHAT,
        "{\"model\":\"m\",\"messages\":[{\"role\":\"User\",\"content\":\"hi\"}]}",
        "messages.[0].role", "invalid_value"),
    BAD("content_number", GW_EP_CHAT,
        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":5}]}",
        "messages.[0].content", "invalid_type"),
    BAD("content_object", GW_EP_CHAT,
        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":{\"text\":\"hi\"}}]}",
        "messages.[0].content", "invalid_type"),
    BAD("content_missing", GW_EP_CHAT, "{\"model\":\"m\",\"messages\":[{\"role\":\"user\"}]}",
        "messages.[0].content", "missing_required_parameter"),
    BAD("content_null_for_user", GW_EP_CHAT,
        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":null}]}",
        "messages.[0].content", "missing_required_parameter"),
    BAD("content_null_assistant_without_tool_calls", GW_EP_CHAT,
        "{\"model\":\"m\",\"messages\":[" USER_HI ",{\"role\":\"assistant\",\"content\":null}]}",
        "messages.[1].content", "missing_required_parameter"),
    BAD("content_parts_empty", GW_EP_CHAT,
        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":[]}]}",
        "messages.[0].content", "empty_array"),
    BAD("content_part_not_object", GW_EP_CHAT,
        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":[\"hi\"]}]}",
        "messages.[0].content", "invalid_type"),
    BAD("content_part_type_unknown", GW_EP_CHAT,
        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"video\"}]}]}",
        "messages.[0].content", "invalid_value"),
    BAD("content_part_text_number", GW_EP_CHAT,
        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":"
        "[{\"type\":\"text\",\"text\":5}]}]}",
        "messages.[0].content", "invalid_type"),
    BAD("content_part_image_url_string", GW_EP_CHAT,
        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":"
        "[{\"type\":\"image_url\",\"image_url\":\"http://x/y.png\"}]}]}",
        "messages.[0].content", "invalid_type"),
    BAD("second_message_bad_content", GW_EP_CHAT,
        "{\"model\":\"m\",\"messages\":[" USER_HI ",{\"role\":\"user\",\"content\":true}]}",
        "messages.[1].content", "invalid_type"),
    BAD("tool_message_without_call_id", GW_EP_CHAT,
        "{\"model\":\"m\",\"messages\":[" USER_HI ",{\"role\":\"tool\",\"content\":\"42\"}]}",
        "messages.[1].tool_call_id", "missing_required_parameter"),
    BAD("tool_calls_not_array", GW_EP_CHAT,
        "{\"model\":\"m\",\"messages\":[{\"role\":\"assistant\",\"tool_calls\":{}}]}",
        "messages.[0].tool_calls", "invalid_type"),
    BAD("message_name_number", GW_EP_CHAT,
        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"name\":7,\"content\":\"hi\"}]}",
        "messages.[0].name", "invalid_type"),

    /* sampling */
    BAD("temperature_string", GW_EP_CHAT, CHAT(",\"temperature\":\"hot\""), "temperature",
        "invalid_type"),
    BAD("temperature_5", GW_EP_CHAT, CHAT(",\"temperature\":5"), "temperature",
        "decimal_out_of_range"),
    BAD("temperature_minus_1", GW_EP_CHAT, CHAT(",\"temperature\":-1"), "temperature",
        "decimal_out_of_range"),
    /* Past the range of a double: refused by the strict scan, before any field is read. */
    BAD("temperature_infinite", GW_EP_CHAT, CHAT(",\"temperature\":1e999"), "", NULL),
    BAD("top_p_2", GW_EP_CHAT, CHAT(",\"top_p\":2"), "top_p", "decimal_out_of_range"),
    BAD("top_p_bool", GW_EP_COMPLETIONS, COMPL(",\"top_p\":true"), "top_p", "invalid_type"),
    BAD("presence_penalty_3", GW_EP_CHAT, CHAT(",\"presence_penalty\":3"), "presence_penalty",
        "decimal_out_of_range"),
    BAD("frequency_penalty_string", GW_EP_CHAT, CHAT(",\"frequency_penalty\":\"1\""),
        "frequency_penalty", "invalid_type"),
    BAD("n_0", GW_EP_CHAT, CHAT(",\"n\":0"), "n", "integer_below_min_value"),
    BAD("n_1_5", GW_EP_CHAT, CHAT(",\"n\":1.5"), "n", "invalid_type"),
    BAD("n_129", GW_EP_CHAT, CHAT(",\"n\":129"), "n", "integer_above_max_value"),
    BAD("max_tokens_minus_1", GW_EP_CHAT, CHAT(",\"max_tokens\":-1"), "max_tokens",
        "integer_below_min_value"),
    BAD("max_tokens_0", GW_EP_CHAT, CHAT(",\"max_tokens\":0"), "max_tokens",
        "integer_below_min_value"),
    BAD("max_tokens_1e300", GW_EP_CHAT, CHAT(",\"max_tokens\":1e300"), "max_tokens",
        "integer_above_max_value"),
    BAD("max_tokens_string", GW_EP_CHAT, CHAT(",\"max_tokens\":\"10\""), "max_tokens",
        "invalid_type"),
    BAD("max_tokens_infinite", GW_EP_COMPLETIONS, COMPL(",\"max_tokens\":1e999"), "", NULL),
    BAD("max_completion_tokens_0", GW_EP_CHAT, CHAT(",\"max_completion_tokens\":0"),
        "max_completion_tokens", "integer_below_min_value"),
    BAD("stop_5_items", GW_EP_CHAT, CHAT(",\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\"]"), "stop",
        "array_above_max_length"),
    BAD("stop_non_string_item", GW_EP_CHAT, CHAT(",\"stop\":[\"a\",1]"), "stop",
        "invalid_type"),
    BAD("stop_number", GW_EP_COMPLETIONS, COMPL(",\"stop\":5"), "stop", "invalid_type"),
    BAD("seed_1_5", GW_EP_CHAT, CHAT(",\"seed\":1.5"), "seed", "invalid_type"),
    BAD("seed_string", GW_EP_CHAT, CHAT(",\"seed\":\"7\""), "seed", "invalid_type"),
    BAD("user_number", GW_EP_CHAT, CHAT(",\"user\":1"), "user", "invalid_type"),
    BAD("top_k_minus_1", GW_EP_CHAT, CHAT(",\"top_k\":-1"), "top_k", "integer_below_min_value"),
    BAD("top_k_string", GW_EP_COMPLETIONS, COMPL(",\"top_k\":\"5\""), "top_k", "invalid_type"),
    BAD("min_p_2", GW_EP_CHAT, CHAT(",\"min_p\":2"), "min_p", "decimal_out_of_range"),

    /* stream */
    BAD("stream_yes", GW_EP_CHAT, CHAT(",\"stream\":\"yes\""), "stream", "invalid_type"),
    BAD("stream_1", GW_EP_COMPLETIONS, COMPL(",\"stream\":1"), "stream", "invalid_type"),
    BAD("stream_options_without_stream", GW_EP_CHAT,
        CHAT(",\"stream_options\":{\"include_usage\":true}"), "stream_options", "invalid_value"),
    BAD("stream_options_with_stream_false", GW_EP_CHAT,
        CHAT(",\"stream\":false,\"stream_options\":{\"include_usage\":true}"), "stream_options",
        "invalid_value"),
    BAD("stream_options_not_object", GW_EP_CHAT,
        CHAT(",\"stream\":true,\"stream_options\":true"), "stream_options", "invalid_type"),
    BAD("include_usage_non_bool", GW_EP_CHAT,
        CHAT(",\"stream\":true,\"stream_options\":{\"include_usage\":\"yes\"}"),
        "stream_options.include_usage", "invalid_type"),

    /* tools and formats */
    BAD("tools_not_array", GW_EP_CHAT, CHAT(",\"tools\":{\"type\":\"function\"}"), "tools",
        "invalid_type"),
    BAD("tool_not_object", GW_EP_CHAT, CHAT(",\"tools\":[\"fn\"]"), "tools[0]", "invalid_type"),
    BAD("tool_without_function_name", GW_EP_CHAT,
        CHAT(",\"tools\":[{\"type\":\"function\",\"function\":{\"description\":\"d\"}}]"),
        "tools[0]", "missing_required_parameter"),
    BAD("second_tool_without_function", GW_EP_CHAT,
        CHAT(",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}},"
             "{\"type\":\"function\"}]"),
        "tools[1]", "missing_required_parameter"),
    BAD("tool_choice_object_without_tools", GW_EP_CHAT,
        CHAT(",\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"f\"}}"),
        "tool_choice", "invalid_value"),
    BAD("tool_choice_unknown_string", GW_EP_CHAT, CHAT(",\"tool_choice\":\"sometimes\""),
        "tool_choice", "invalid_value"),
    BAD("tool_choice_number", GW_EP_CHAT, CHAT(",\"tool_choice\":1"), "tool_choice",
        "invalid_type"),
    BAD("response_format_type_bad", GW_EP_CHAT,
        CHAT(",\"response_format\":{\"type\":\"yaml\"}"), "response_format.type",
        "invalid_value"),
    BAD("response_format_type_missing", GW_EP_CHAT, CHAT(",\"response_format\":{}"),
        "response_format.type", "invalid_value"),
    BAD("response_format_string", GW_EP_CHAT, CHAT(",\"response_format\":\"json\""),
        "response_format", "invalid_type"),
    BAD("logit_bias_array", GW_EP_CHAT, CHAT(",\"logit_bias\":[1]"), "logit_bias",
        "invalid_type"),
    BAD("logprobs_string", GW_EP_CHAT, CHAT(",\"logprobs\":\"yes\""), "logprobs",
        "invalid_type"),
    BAD("top_logprobs_without_logprobs", GW_EP_CHAT, CHAT(",\"top_logprobs\":3"),
        "top_logprobs", "invalid_value"),
    BAD("top_logprobs_with_logprobs_false", GW_EP_CHAT,
        CHAT(",\"logprobs\":false,\"top_logprobs\":3"), "top_logprobs", "invalid_value"),
    BAD("top_logprobs_21", GW_EP_CHAT, CHAT(",\"logprobs\":true,\"top_logprobs\":21"),
        "top_logprobs", "integer_above_max_value"),

    /* completions */
    BAD("prompt_missing", GW_EP_COMPLETIONS, "{\"model\":\"m\"}", "prompt",
        "missing_required_parameter"),
    BAD("prompt_null", GW_EP_COMPLETIONS, "{\"model\":\"m\",\"prompt\":null}", "prompt",
        "missing_required_parameter"),
    BAD("prompt_number", GW_EP_COMPLETIONS, "{\"model\":\"m\",\"prompt\":5}", "prompt",
        "invalid_type"),
    BAD("prompt_empty_array", GW_EP_COMPLETIONS, "{\"model\":\"m\",\"prompt\":[]}", "prompt",
        "empty_array"),
    BAD("prompt_mixed_array", GW_EP_COMPLETIONS, "{\"model\":\"m\",\"prompt\":[\"a\",1]}",
        "prompt", "invalid_type"),
    BAD("prompt_negative_token", GW_EP_COMPLETIONS, "{\"model\":\"m\",\"prompt\":[1,-2]}",
        "prompt", "invalid_type"),
    BAD("prompt_fractional_token", GW_EP_COMPLETIONS, "{\"model\":\"m\",\"prompt\":[1.5]}",
        "prompt", "invalid_type"),
    BAD("prompt_token_too_large", GW_EP_COMPLETIONS,
        "{\"model\":\"m\",\"prompt\":[4294967296]}", "prompt", "invalid_type"),
    BAD("prompt_array_of_objects", GW_EP_COMPLETIONS, "{\"model\":\"m\",\"prompt\":[{}]}",
        "prompt", "invalid_type"),
    BAD("prompt_empty_token_array", GW_EP_COMPLETIONS, "{\"model\":\"m\",\"prompt\":[[1],[]]}",
        "prompt", "invalid_type"),
    BAD("completions_logprobs_6", GW_EP_COMPLETIONS, COMPL(",\"logprobs\":6"), "logprobs",
        "integer_above_max_value"),
    BAD("completions_best_of_0", GW_EP_COMPLETIONS, COMPL(",\"best_of\":0"), "best_of",
        "integer_below_min_value"),
    BAD("completions_echo_string", GW_EP_COMPLETIONS, COMPL(",\"echo\":\"yes\""), "echo",
        "invalid_type"),
    BAD("completions_suffix_number", GW_EP_COMPLETIONS, COMPL(",\"suffix\":1"), "suffix",
        "invalid_type"),

    /* embeddings */
    BAD("input_missing", GW_EP_EMBEDDINGS, "{\"model\":\"m\"}", "input",
        "missing_required_parameter"),
    BAD("input_empty_string", GW_EP_EMBEDDINGS, "{\"model\":\"m\",\"input\":\"\"}", "input",
        "invalid_value"),
    BAD("input_number", GW_EP_EMBEDDINGS, "{\"model\":\"m\",\"input\":1}", "input",
        "invalid_type"),
    BAD("input_empty_array", GW_EP_EMBEDDINGS, "{\"model\":\"m\",\"input\":[]}", "input",
        "empty_array"),
    BAD("input_nested_strings", GW_EP_EMBEDDINGS, "{\"model\":\"m\",\"input\":[[\"a\"]]}",
        "input", "invalid_type"),
    BAD("encoding_format_hex", GW_EP_EMBEDDINGS,
        "{\"model\":\"m\",\"input\":\"x\",\"encoding_format\":\"hex\"}", "encoding_format",
        "invalid_value"),
    BAD("encoding_format_number", GW_EP_EMBEDDINGS,
        "{\"model\":\"m\",\"input\":\"x\",\"encoding_format\":1}", "encoding_format",
        "invalid_type"),
    BAD("dimensions_0", GW_EP_EMBEDDINGS, "{\"model\":\"m\",\"input\":\"x\",\"dimensions\":0}",
        "dimensions", "integer_below_min_value"),
};

static void bad_body_is_refused(void **state)
{
    const bad_case *c = *state;
    fixture f;
    memset(&f, 0, sizeof f);
    util_arena_init(&f.arena, 1024);
    size_t len = c->len ? c->len : strlen(c->body);
    int rc = gw_request_parse(&f.r, c->ep, c->body, len, &f.arena, &f.e);
    util_arena_deinit(&f.arena);
    if (rc == 0)
        gw_request_deinit(&f.r);
    assert_int_equal(rc, LLMGW_EINVAL);
    assert_null(f.r.json); /* nothing left to release */
    assert_int_equal(f.e.status, 400);
    assert_non_null(f.e.type);
    assert_string_equal(f.e.type, "invalid_request_error");
    assert_string_equal(f.e.param, c->param);
    if (c->code == NULL) {
        if (f.e.code != NULL)
            print_error("code: want NULL, got '%s'\n", f.e.code);
        assert_null(f.e.code);
    } else {
        assert_non_null(f.e.code);
        assert_string_equal(f.e.code, c->code);
    }
    if (strlen(f.e.message) < 10)
        print_error("message too short: '%s'\n", f.e.message);
    assert_true(strlen(f.e.message) >= 10);
    gw_request_deinit(&f.r); /* safe after a failure */
}

/* ---- valid chat ---- */

static void chat_string_content(void **state)
{
    fixture *f = *state;
    parse_ok(f, GW_EP_CHAT,
             "{\"model\":\"small\",\"messages\":[{\"role\":\"system\",\"content\":\"be brief\"},"
             "{\"role\":\"user\",\"content\":\"hello there\"}]}");
    assert_int_equal(f->r.ep, GW_EP_CHAT);
    assert_string_equal(f->r.model, "small");
    assert_int_equal(f->r.n_messages, 2);
    assert_string_equal(f->r.messages[0].role, "system");
    assert_string_equal(f->r.messages[0].text, "be brief");
    assert_int_equal(f->r.messages[0].text_len, 8);
    assert_string_equal(f->r.messages[1].role, "user");
    assert_string_equal(f->r.messages[1].text, "hello there");
    assert_false(f->r.messages[1].has_tool_calls);
    /* defaults */
    assert_false(f->r.stream);
    assert_false(f->r.include_usage);
    assert_false(f->r.has_temperature);
    assert_false(f->r.has_top_p);
    assert_false(f->r.has_seed);
    assert_int_equal(f->r.max_tokens, -1);
    assert_int_equal(f->r.n, 1);
    assert_int_equal(f->r.n_stop, 0);
    assert_null(f->r.user);
    assert_false(f->r.has_tools);
    assert_false(f->r.has_response_format);
    assert_null(f->r.prompt);
}

static void chat_all_roles(void **state)
{
    fixture *f = *state;
    parse_ok(f, GW_EP_CHAT,
             "{\"model\":\"m\",\"messages\":[{\"role\":\"developer\",\"content\":\"d\"},"
             "{\"role\":\"system\",\"content\":\"s\"},{\"role\":\"user\",\"content\":\"u\"},"
             "{\"role\":\"assistant\",\"content\":\"a\"},"
             "{\"role\":\"function\",\"name\":\"f\",\"content\":\"r\"}]}");
    assert_int_equal(f->r.n_messages, 5);
    static const char *roles[] = {"developer", "system", "user", "assistant", "function"};
    for (size_t i = 0; i < 5; i++)
        assert_string_equal(f->r.messages[i].role, roles[i]);
}

static void chat_content_parts(void **state)
{
    fixture *f = *state;
    parse_ok(f, GW_EP_CHAT,
             "{\"model\":\"vision\",\"messages\":[{\"role\":\"user\",\"content\":["
             "{\"type\":\"text\",\"text\":\"What is in\"},"
             "{\"type\":\"image_url\",\"image_url\":{\"url\":\"https://x.test/cat.png\","
             "\"detail\":\"low\"}},"
             "{\"type\":\"text\",\"text\":\"this picture?\"}]}]}");
    assert_int_equal(f->r.n_messages, 1);
    assert_string_equal(f->r.messages[0].text, "What is in\nthis picture?");
    assert_int_equal(f->r.messages[0].text_len, strlen("What is in\nthis picture?"));
}

static void chat_image_only_content(void **state)
{
    fixture *f = *state;
    parse_ok(f, GW_EP_CHAT,
             "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":["
             "{\"type\":\"image_url\",\"image_url\":{\"url\":\"data:image/png;base64,AAAA\"}},"
             "{\"type\":\"input_audio\",\"input_audio\":{\"data\":\"AAAA\",\"format\":\"wav\"}},"
             "{\"type\":\"file\",\"file\":{\"file_id\":\"file-1\"}}]}]}");
    assert_string_equal(f->r.messages[0].text, "");
    assert_int_equal(f->r.messages[0].text_len, 0);
}

static void chat_tool_round_trip(void **state)
{
    fixture *f = *state;
    parse_ok(f, GW_EP_CHAT,
             "{\"model\":\"m\",\"messages\":["
             "{\"role\":\"user\",\"content\":\"weather in Paris?\"},"
             "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"call_1\","
             "\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
             "\"arguments\":\"{\\\"city\\\":\\\"Paris\\\"}\"}}]},"
             "{\"role\":\"tool\",\"tool_call_id\":\"call_1\",\"content\":\"18C, sunny\"}],"
             "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
             "\"parameters\":{\"type\":\"object\"}}}],"
             "\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"get_weather\"}}}");
    assert_int_equal(f->r.n_messages, 3);
    assert_string_equal(f->r.messages[1].role, "assistant");
    assert_true(f->r.messages[1].has_tool_calls);
    assert_string_equal(f->r.messages[1].text, "");
    assert_int_equal(f->r.messages[1].text_len, 0);
    assert_string_equal(f->r.messages[2].role, "tool");
    assert_string_equal(f->r.messages[2].text, "18C, sunny");
    assert_true(f->r.has_tools);
}

static void chat_assistant_without_content(void **state)
{
    fixture *f = *state;
    /* tool_calls present, content key absent */
    parse_ok(f, GW_EP_CHAT,
             "{\"model\":\"m\",\"messages\":[" USER_HI ",{\"role\":\"assistant\",\"tool_calls\":"
             "[{\"id\":\"c\",\"type\":\"function\",\"function\":{\"name\":\"f\","
             "\"arguments\":\"{}\"}}]},{\"role\":\"tool\",\"tool_call_id\":\"c\","
             "\"content\":[{\"type\":\"text\",\"text\":\"ok\"}]}]}");
    assert_true(f->r.messages[1].has_tool_calls);
    assert_string_equal(f->r.messages[2].text, "ok");
    /* the legacy function_call also lets an assistant turn omit content */
    parse_ok(f, GW_EP_CHAT,
             "{\"model\":\"m\",\"messages\":[" USER_HI ",{\"role\":\"assistant\","
             "\"function_call\":{\"name\":\"f\",\"arguments\":\"{}\"}}]}");
    assert_false(f->r.messages[1].has_tool_calls);
    /* an assistant may send an empty parts array, and a refusal part counts as text */
    parse_ok(f, GW_EP_CHAT,
             "{\"model\":\"m\",\"messages\":[" USER_HI ",{\"role\":\"assistant\",\"content\":[]},"
             "{\"role\":\"assistant\",\"content\":[{\"type\":\"refusal\",\"refusal\":\"no\"}]}]}");
    assert_string_equal(f->r.messages[1].text, "");
    assert_string_equal(f->r.messages[2].text, "no");
}

static void chat_sampling_fields(void **state)
{
    fixture *f = *state;
    parse_ok(f, GW_EP_CHAT,
             CHAT(",\"temperature\":0.7,\"top_p\":1,\"presence_penalty\":-2,"
                  "\"frequency_penalty\":2,\"n\":3,\"max_tokens\":256,\"seed\":-42,"
                  "\"stop\":[\"END\",\"\\n\\n\"],\"user\":\"u-1\",\"logprobs\":true,"
                  "\"top_logprobs\":20,\"logit_bias\":{\"50256\":-100},"
                  "\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"x\"}},"
                  "\"stream\":true,\"stream_options\":{\"include_usage\":true}"));
    assert_true(f->r.has_temperature);
    assert_double_near(f->r.temperature, 0.7, 0);
    assert_true(f->r.has_top_p);
    assert_double_near(f->r.top_p, 1.0, 0);
    assert_int_equal(f->r.n, 3);
    assert_int_equal(f->r.max_tokens, 256);
    assert_true(f->r.has_seed);
    assert_int_equal(f->r.seed, -42);
    assert_int_equal(f->r.n_stop, 2);
    assert_string_equal(f->r.stop[0], "END");
    assert_string_equal(f->r.stop[1], "\n\n");
    assert_string_equal(f->r.user, "u-1");
    assert_true(f->r.has_response_format);
    assert_true(f->r.stream);
    assert_true(f->r.include_usage);
}

static void chat_range_edges_accepted(void **state)
{
    fixture *f = *state;
    parse_ok(f, GW_EP_CHAT,
             CHAT(",\"temperature\":0,\"top_p\":0,\"n\":128,\"max_tokens\":1,"
                  "\"stop\":[\"a\",\"b\",\"c\",\"d\"],\"seed\":0,\"top_logprobs\":0"));
    assert_true(f->r.has_temperature);
    assert_double_near(f->r.temperature, 0.0, 0);
    assert_int_equal(f->r.n, 128);
    assert_int_equal(f->r.max_tokens, 1);
    assert_int_equal(f->r.n_stop, GW_MAX_STOP);
    assert_string_equal(f->r.stop[3], "d");
    parse_ok(f, GW_EP_CHAT, CHAT(",\"temperature\":2,\"max_tokens\":1000000000,\"stop\":\"x\","
                                 "\"stream\":true"));
    assert_double_near(f->r.temperature, 2.0, 0);
    assert_int_equal(f->r.max_tokens, 1000000000);
    assert_int_equal(f->r.n_stop, 1);
    assert_string_equal(f->r.stop[0], "x");
    assert_true(f->r.stream);
    assert_false(f->r.include_usage);
    /* 2.0e0 and 10.0 are integral values written as decimals: accepted as integers */
    parse_ok(f, GW_EP_CHAT, CHAT(",\"n\":2.0e0,\"max_tokens\":10.0"));
    assert_int_equal(f->r.n, 2);
    assert_int_equal(f->r.max_tokens, 10);
}

/* logprobs, echo and the vLLM-style top_k/min_p extensions as the engine reads them. */
static void logprobs_and_extensions(void **state)
{
    fixture *f = *state;
    parse_ok(f, GW_EP_CHAT, CHAT(""));
    assert_int_equal(f->r.top_logprobs, -1);
    assert_int_equal(f->r.top_k, 0);
    assert_double_near(f->r.min_p, 0, 0);
    assert_false(f->r.echo);
    parse_ok(f, GW_EP_CHAT, CHAT(",\"logprobs\":true"));
    assert_int_equal(f->r.top_logprobs, 0);
    parse_ok(f, GW_EP_CHAT, CHAT(",\"logprobs\":true,\"top_logprobs\":5,\"top_k\":40,"
                                 "\"min_p\":0.05"));
    assert_int_equal(f->r.top_logprobs, 5);
    assert_int_equal(f->r.top_k, 40);
    assert_double_near(f->r.min_p, 0.05, 0);
    parse_ok(f, GW_EP_CHAT, CHAT(",\"logprobs\":false"));
    assert_int_equal(f->r.top_logprobs, -1);
    parse_ok(f, GW_EP_COMPLETIONS, COMPL(",\"logprobs\":3,\"echo\":true"));
    assert_int_equal(f->r.top_logprobs, 3);
    assert_true(f->r.echo);
    parse_ok(f, GW_EP_COMPLETIONS, COMPL(",\"logprobs\":0"));
    assert_int_equal(f->r.top_logprobs, 0);
}

static void max_completion_tokens_wins(void **state)
{
    fixture *f = *state;
    parse_ok(f, GW_EP_CHAT, CHAT(",\"max_tokens\":10,\"max_completion_tokens\":20"));
    assert_int_equal(f->r.max_tokens, 20);
    parse_ok(f, GW_EP_CHAT, CHAT(",\"max_completion_tokens\":30,\"max_tokens\":40"));
    assert_int_equal(f->r.max_tokens, 30);
    parse_ok(f, GW_EP_CHAT, CHAT(",\"max_tokens\":10"));
    assert_int_equal(f->r.max_tokens, 10);
    parse_ok(f, GW_EP_CHAT, CHAT(",\"max_completion_tokens\":7"));
    assert_int_equal(f->r.max_tokens, 7);
    parse_ok(f, GW_EP_CHAT, CHAT(",\"max_tokens\":10,\"max_completion_tokens\":null"));
    assert_int_equal(f->r.max_tokens, 10);
}

static void null_optional_fields_are_absent(void **state)
{
    fixture *f = *state;
    parse_ok(f, GW_EP_CHAT,
             "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\",\"name\":null,"
             "\"tool_calls\":null}],\"temperature\":null,\"top_p\":null,\"n\":null,"
             "\"max_tokens\":null,\"max_completion_tokens\":null,\"stop\":null,\"seed\":null,"
             "\"user\":null,\"presence_penalty\":null,\"frequency_penalty\":null,"
             "\"logprobs\":null,\"top_logprobs\":null,\"logit_bias\":null,"
             "\"response_format\":null,\"stream\":null,\"stream_options\":null,\"tools\":null,"
             "\"tool_choice\":null}");
    assert_false(f->r.has_temperature);
    assert_false(f->r.has_top_p);
    assert_false(f->r.has_seed);
    assert_int_equal(f->r.n, 1);
    assert_int_equal(f->r.max_tokens, -1);
    assert_int_equal(f->r.n_stop, 0);
    assert_null(f->r.user);
    assert_false(f->r.stream);
    assert_false(f->r.has_tools);
    assert_false(f->r.has_response_format);
    assert_false(f->r.messages[0].has_tool_calls);
    /* stream_options: null does not count as stream_options without stream */
    parse_ok(f, GW_EP_CHAT, CHAT(",\"stream\":true,\"stream_options\":{\"include_usage\":null}"));
    assert_true(f->r.stream);
    assert_false(f->r.include_usage);
    /* tool_choice as an object with tools: null counts as no tools */
    assert_int_equal(parse(f, GW_EP_CHAT,
                           CHAT(",\"tools\":null,\"tool_choice\":{\"type\":\"function\"}")),
                     LLMGW_EINVAL);
    assert_string_equal(f->e.param, "tool_choice");
    /* embeddings and completions too */
    parse_ok(f, GW_EP_EMBEDDINGS,
             "{\"model\":\"m\",\"input\":\"x\",\"encoding_format\":null,\"dimensions\":null,"
             "\"user\":null}");
    parse_ok(f, GW_EP_COMPLETIONS,
             COMPL(",\"suffix\":null,\"echo\":null,\"logprobs\":null,\"best_of\":null"));
}

static void unknown_fields_pass_through(void **state)
{
    fixture *f = *state;
    parse_ok(f, GW_EP_CHAT, CHAT(",\"metadata\":{\"k\":\"v\"},\"store\":true,"
                                 "\"reasoning_effort\":\"low\",\"x_vendor\":[1,2]"));
    assert_non_null(cJSON_GetObjectItemCaseSensitive(f->r.json, "x_vendor"));
}

static void completions_own_fields(void **state)
{
    fixture *f = *state;
    /* completions does not read the chat-only max_completion_tokens. */
    parse_ok(f, GW_EP_COMPLETIONS, COMPL(",\"max_tokens\":5,\"max_completion_tokens\":9"));
    assert_int_equal(f->r.max_tokens, 5);
    parse_ok(f, GW_EP_COMPLETIONS, COMPL(",\"logprobs\":5,\"echo\":true,\"best_of\":2,"
                                         "\"suffix\":\"end\",\"n\":2"));
    assert_int_equal(f->r.n, 2);
}

/* ---- completions and embeddings ---- */

static void completions_prompts(void **state)
{
    fixture *f = *state;
    parse_ok(f, GW_EP_COMPLETIONS, "{\"model\":\"m\",\"prompt\":\"Once upon a time\"}");
    assert_int_equal(f->r.ep, GW_EP_COMPLETIONS);
    assert_string_equal(f->r.prompt, "Once upon a time");
    assert_int_equal(f->r.n_inputs, 1);
    assert_int_equal(f->r.n_messages, 0);
    assert_null(gw_request_last_user(&f->r));

    parse_ok(f, GW_EP_COMPLETIONS, "{\"model\":\"m\",\"prompt\":[\"only one\"]}");
    assert_string_equal(f->r.prompt, "only one");
    assert_int_equal(f->r.n_inputs, 1);

    parse_ok(f, GW_EP_COMPLETIONS, "{\"model\":\"m\",\"prompt\":[\"a\",\"b\",\"c\"]}");
    assert_null(f->r.prompt);
    assert_int_equal(f->r.n_inputs, 3);

    /* one prompt as token ids */
    parse_ok(f, GW_EP_COMPLETIONS, "{\"model\":\"m\",\"prompt\":[15496,11,995,4294967295]}");
    assert_null(f->r.prompt);
    assert_int_equal(f->r.n_inputs, 1);

    /* two prompts as token-id arrays */
    parse_ok(f, GW_EP_COMPLETIONS, "{\"model\":\"m\",\"prompt\":[[1,2,3],[0]],\"max_tokens\":8}");
    assert_null(f->r.prompt);
    assert_int_equal(f->r.n_inputs, 2);
    assert_int_equal(f->r.max_tokens, 8);

    /* an empty string prompt is allowed for completions */
    parse_ok(f, GW_EP_COMPLETIONS, "{\"model\":\"m\",\"prompt\":\"\"}");
    assert_string_equal(f->r.prompt, "");
}

static void embeddings_inputs(void **state)
{
    fixture *f = *state;
    parse_ok(f, GW_EP_EMBEDDINGS, "{\"model\":\"emb\",\"input\":\"The food was delicious\"}");
    assert_int_equal(f->r.ep, GW_EP_EMBEDDINGS);
    assert_string_equal(f->r.model, "emb");
    assert_string_equal(f->r.prompt, "The food was delicious");
    assert_int_equal(f->r.n_inputs, 1);

    parse_ok(f, GW_EP_EMBEDDINGS, "{\"model\":\"emb\",\"input\":[\"a\",\"b\",\"c\",\"d\"],"
                                  "\"encoding_format\":\"float\",\"dimensions\":256,"
                                  "\"user\":\"u\"}");
    assert_int_equal(f->r.n_inputs, 4);
    assert_null(f->r.prompt);
    assert_string_equal(f->r.user, "u");

    parse_ok(f, GW_EP_EMBEDDINGS,
             "{\"model\":\"emb\",\"input\":\"x\",\"encoding_format\":\"base64\"}");
    parse_ok(f, GW_EP_EMBEDDINGS, "{\"model\":\"emb\",\"input\":[[1,2],[3,4],[5]]}");
    assert_int_equal(f->r.n_inputs, 3);
}

/* Builds {"model":"m","<key>":[ "i0", "i1", ... ]} with n items. */
static char *body_with_items(const char *key, size_t n)
{
    size_t cap = 64 + n * 16;
    char *b = malloc(cap);
    size_t len = (size_t)snprintf(b, cap, "{\"model\":\"m\",\"%s\":[", key);
    for (size_t i = 0; i < n; i++)
        len += (size_t)snprintf(b + len, cap - len, "%s\"i%zu\"", i ? "," : "", i);
    snprintf(b + len, cap - len, "]}");
    return b;
}

static void arrays_up_to_2048_items(void **state)
{
    fixture *f = *state;
    char *b = body_with_items("input", 2048);
    parse_ok(f, GW_EP_EMBEDDINGS, b);
    assert_int_equal(f->r.n_inputs, 2048);
    free(b);

    b = body_with_items("input", 2049);
    assert_int_equal(parse(f, GW_EP_EMBEDDINGS, b), LLMGW_EINVAL);
    assert_string_equal(f->e.param, "input");
    assert_string_equal(f->e.code, "array_above_max_length");
    assert_non_null(strstr(f->e.message, "2049"));
    free(b);

    b = body_with_items("prompt", 2048);
    parse_ok(f, GW_EP_COMPLETIONS, b);
    assert_int_equal(f->r.n_inputs, 2048);
    free(b);

    b = body_with_items("prompt", 2049);
    assert_int_equal(parse(f, GW_EP_COMPLETIONS, b), LLMGW_EINVAL);
    assert_string_equal(f->e.code, "array_above_max_length");
    free(b);
}

/* One token-id prompt may hold more ids than the 2,048-prompt limit: the tier's context is the
 * bound for it. */
static void token_id_prompt_longer_than_2048(void **state)
{
    fixture *f = *state;
    enum { N = 4000 };
    char *b = malloc(64 + N * 6);
    size_t w = (size_t)sprintf(b, "{\"model\":\"m\",\"prompt\":[");
    for (int i = 0; i < N; i++)
        w += (size_t)sprintf(b + w, "%s%d", i ? "," : "", i % 1000);
    strcpy(b + w, "]}");
    parse_ok(f, GW_EP_COMPLETIONS, b);
    assert_int_equal(f->r.n_inputs, 1);
    free(b);
}

/* Escaped control characters are fine; only raw ones are refused. */
static void escaped_controls_accepted(void **state)
{
    fixture *f = *state;
    parse_ok(f, GW_EP_CHAT,
             "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"a\\nb\\t\\u0001\\ud83d\\ude00\"}]}");
    assert_string_equal(f->r.messages[0].text, "a\nb\t\x01\xf0\x9f\x98\x80");
    parse_ok(f, GW_EP_CHAT, CHAT(",\"temperature\":0.5e0,\"max_tokens\":10,\"top_p\":1E-1"));
}

/* A duplicate in an object too big for pairwise comparison is still found, and named. */
static void duplicate_in_a_big_object(void **state)
{
    fixture *f = *state;
    char b[4096];
    size_t w = (size_t)sprintf(b, "{\"model\":\"m\",\"prompt\":\"p\",\"metadata\":{");
    for (int i = 0; i < 100; i++)
        w += (size_t)sprintf(b + w, "\"k%d\":%d,", i, i);
    strcpy(b + w, "\"k57\":0}}");
    assert_int_equal(parse(f, GW_EP_COMPLETIONS, b), LLMGW_EINVAL);
    assert_string_equal(f->e.code, "duplicate_key");
    assert_string_equal(f->e.param, "metadata.k57");
    strcpy(b + w, "\"k100\":0}}");
    parse_ok(f, GW_EP_COMPLETIONS, b);
}

static void logit_bias_and_media_recorded(void **state)
{
    fixture *f = *state;
    parse_ok(f, GW_EP_CHAT, CHAT(",\"logit_bias\":{\"0\":100,\"50256\":-100,\"7\":0.5}"));
    assert_int_equal(f->r.logit_bias_n, 3);
    assert_null(f->r.media);
    parse_ok(f, GW_EP_CHAT,
             "{\"model\":\"m\",\"messages\":[" USER_HI ",{\"role\":\"user\",\"content\":["
             "{\"type\":\"text\",\"text\":\"what is this?\"},"
             "{\"type\":\"input_audio\",\"input_audio\":{\"data\":\"AAAA\",\"format\":\"wav\"}}]}]}");
    assert_non_null(f->r.media);
    assert_int_equal(f->r.media_msg, 1);
    assert_int_equal(f->r.media->media_part, 1);
    assert_string_equal(f->r.media->media_type, "input_audio");
    assert_int_equal(f->r.messages[0].media_part, -1);
}

static void many_messages(void **state)
{
    fixture *f = *state;
    enum { N = 3000 };
    size_t cap = 64 + N * 48;
    char *b = malloc(cap);
    size_t len = (size_t)snprintf(b, cap, "{\"model\":\"m\",\"messages\":[");
    for (int i = 0; i < N; i++)
        len += (size_t)snprintf(b + len, cap - len, "%s{\"role\":\"%s\",\"content\":\"m%d\"}",
                                i ? "," : "", i % 2 ? "assistant" : "user", i);
    snprintf(b + len, cap - len, "]}");
    parse_ok(f, GW_EP_CHAT, b);
    assert_int_equal(f->r.n_messages, N);
    assert_string_equal(f->r.messages[N - 1].text, "m2999");
    assert_string_equal(gw_request_last_user(&f->r)->text, "m2998");
    free(b);
}

static void very_long_string(void **state)
{
    fixture *f = *state;
    const size_t n = (size_t)4 << 20;  /* 4 MiB of content */
    const char *head = "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"";
    const char *tail = "\"}]}";
    size_t hl = strlen(head), tl = strlen(tail);
    char *b = malloc(hl + n + tl + 1);
    memcpy(b, head, hl);
    for (size_t i = 0; i < n; i++)
        b[hl + i] = (char)('a' + i % 26);
    memcpy(b + hl + n, tail, tl + 1);
    parse_ok(f, GW_EP_CHAT, b);
    assert_int_equal(f->r.messages[0].text_len, n);
    assert_int_equal(strlen(f->r.messages[0].text), n);
    assert_int_equal(f->r.messages[0].text[n - 1], 'a' + (n - 1) % 26);
    free(b);
}

/* ---- unicode ---- */

static void unicode_content(void **state)
{
    fixture *f = *state;
    /* raw UTF-8: CJK, an emoji (4 bytes), a combining acute accent after 'e' */
    parse_ok(f, GW_EP_CHAT,
             "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":"
             "\"\xe4\xbd\xa0\xe5\xa5\xbd\xe4\xb8\x96\xe7\x95\x8c \xf0\x9f\x98\x80 e\xcc\x81\"}]}");
    const gw_message *m = gw_request_last_user(&f->r);
    assert_non_null(m);
    assert_string_equal(m->text,
                        "\xe4\xbd\xa0\xe5\xa5\xbd\xe4\xb8\x96\xe7\x95\x8c "
                        "\xf0\x9f\x98\x80 e\xcc\x81");
    assert_int_equal(m->text_len, 12 + 1 + 4 + 1 + 3);

    /* the same text as \u escapes, the emoji as a surrogate pair */
    parse_ok(f, GW_EP_CHAT,
             "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":"
             "\"\\u4f60\\u597d\\u4E16\\u754C \\ud83d\\ude00 e\\u0301\"}]}");
    m = gw_request_last_user(&f->r);
    assert_string_equal(m->text,
                        "\xe4\xbd\xa0\xe5\xa5\xbd\xe4\xb8\x96\xe7\x95\x8c "
                        "\xf0\x9f\x98\x80 e\xcc\x81");

    /* other escapes and the edges of the BMP and of Unicode */
    parse_ok(f, GW_EP_CHAT,
             "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":"
             "\"\\\"q\\\" \\\\ \\/ \\b\\f\\n\\r\\t \\u00e9 \\uffff \\udbff\\udfff\"}]}");
    m = gw_request_last_user(&f->r);
    assert_string_equal(m->text, "\"q\" \\ / \b\f\n\r\t \xc3\xa9 \xef\xbf\xbf \xf4\x8f\xbf\xbf");

    /* unicode in parts, model and stop */
    parse_ok(f, GW_EP_CHAT,
             "{\"model\":\"\xe6\xa8\xa1\xe5\x9e\x8b\",\"stop\":[\"\xe3\x80\x82\"],\"messages\":"
             "[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"\xf0\x9f\x91\x8b\"},"
             "{\"type\":\"text\",\"text\":"
             "\"\xd0\xbf\xd1\x80\xd0\xb8\xd0\xb2\xd0\xb5\xd1\x82\"}]}]}");
    assert_string_equal(f->r.model, "\xe6\xa8\xa1\xe5\x9e\x8b");
    assert_string_equal(f->r.stop[0], "\xe3\x80\x82");
    assert_string_equal(gw_request_last_user(&f->r)->text,
                        "\xf0\x9f\x91\x8b\n\xd0\xbf\xd1\x80\xd0\xb8\xd0\xb2\xd0\xb5\xd1\x82");
}

static void surrounding_whitespace_allowed(void **state)
{
    fixture *f = *state;
    parse_ok(f, GW_EP_CHAT, " \r\n\t" CHAT("") " \n");
    assert_string_equal(f->r.model, "m");
}

static void last_user_picks_the_last(void **state)
{
    fixture *f = *state;
    parse_ok(f, GW_EP_CHAT,
             "{\"model\":\"m\",\"messages\":[{\"role\":\"system\",\"content\":\"sys\"},"
             "{\"role\":\"user\",\"content\":\"first\"},"
             "{\"role\":\"assistant\",\"content\":\"reply\"},"
             "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"second\"}]},"
             "{\"role\":\"assistant\",\"content\":\"reply 2\"}]}");
    const gw_message *m = gw_request_last_user(&f->r);
    assert_non_null(m);
    assert_ptr_equal(m, &f->r.messages[3]);
    assert_string_equal(m->text, "second");

    parse_ok(f, GW_EP_CHAT,
             "{\"model\":\"m\",\"messages\":[{\"role\":\"system\",\"content\":\"only system\"}]}");
    assert_null(gw_request_last_user(&f->r));
}

static void body_needs_no_terminator(void **state)
{
    fixture *f = *state;
    /* The parser gets a length, so bytes past it (here a second body) are never read. */
    const char two[] = CHAT("") "{\"model\":\"other\"";
    assert_int_equal(parse_len(f, GW_EP_CHAT, two, strlen(CHAT(""))), 0);
    assert_string_equal(f->r.model, "m");
    char *exact = malloc(strlen(CHAT("")));
    memcpy(exact, CHAT(""), strlen(CHAT("")));
    assert_int_equal(parse_len(f, GW_EP_CHAT, exact, strlen(CHAT(""))), 0);
    free(exact);
}

static void reparse_after_error(void **state)
{
    fixture *f = *state;
    assert_int_equal(parse(f, GW_EP_CHAT, CHAT(",\"n\":0")), LLMGW_EINVAL);
    parse_ok(f, GW_EP_CHAT, CHAT(""));
    assert_string_equal(f->e.param, "");
    assert_int_equal(f->e.status, 0);
}

/* ---- gw_utf8_valid ---- */

static bool valid(const char *s)
{
    return gw_utf8_valid(s, strlen(s));
}

static void utf8_valid_sequences(void **state)
{
    (void)state;
    assert_true(gw_utf8_valid("", 0));
    assert_true(valid("plain ascii \x7f"));
    assert_true(gw_utf8_valid("a\0b", 3));                /* NUL is a valid code point */
    assert_true(valid("\xc2\x80"));                       /* U+0080 */
    assert_true(valid("\xdf\xbf"));                       /* U+07FF */
    assert_true(valid("\xe0\xa0\x80"));                   /* U+0800 */
    assert_true(valid("\xed\x9f\xbf"));                   /* U+D7FF */
    assert_true(valid("\xee\x80\x80"));                   /* U+E000 */
    assert_true(valid("\xef\xbf\xbf"));                   /* U+FFFF */
    assert_true(valid("\xf0\x90\x80\x80"));               /* U+10000 */
    assert_true(valid("\xf4\x8f\xbf\xbf"));               /* U+10FFFF */
    assert_true(valid("\xe4\xbd\xa0\xe5\xa5\xbd \xf0\x9f\x98\x80 e\xcc\x81"));
}

static void utf8_invalid_sequences(void **state)
{
    (void)state;
    static const char *bad[] = {
        "\x80",                 /* lone continuation */
        "\xbf",
        "a\xff",                /* never valid */
        "\xfe",
        "\xc0\x80",             /* overlong NUL */
        "\xc0\xaf",             /* overlong '/' */
        "\xc1\xbf",             /* overlong U+007F */
        "\xe0\x80\xaf",         /* overlong 3-byte */
        "\xe0\x9f\xbf",         /* overlong U+07FF */
        "\xf0\x80\x80\xaf",     /* overlong 4-byte */
        "\xf0\x8f\xbf\xbf",     /* overlong U+FFFF */
        "\xed\xa0\x80",         /* U+D800 high surrogate */
        "\xed\xaf\xbf",         /* U+DBFF */
        "\xed\xb0\x80",         /* U+DC00 low surrogate */
        "\xed\xbf\xbf",         /* U+DFFF */
        "\xed\xa0\xbd\xed\xb8\x80", /* a surrogate pair encoded as CESU-8 */
        "\xf4\x90\x80\x80",     /* U+110000 */
        "\xf5\x80\x80\x80",     /* lead byte past U+10FFFF */
        "\xf8\x88\x80\x80\x80", /* 5-byte form */
        "\xe4\xbd",             /* truncated */
        "\xf0\x9f\x98",
        "\xc3",
        "\xe4\x41\x80",         /* bad continuation */
        "\xc3\xc3",
        "\xf0\x9f\x98\x41",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        if (valid(bad[i]))
            print_error("accepted bad sequence #%zu\n", i);
        assert_false(valid(bad[i]));
    }
}

static void utf8_length_is_respected(void **state)
{
    (void)state;
    /* A sequence cut by `len` is invalid even when the bytes after it would complete it. */
    assert_false(gw_utf8_valid("\xc3\xa9", 1));
    assert_false(gw_utf8_valid("\xf0\x9f\x98\x80", 3));
    assert_true(gw_utf8_valid("\xf0\x9f\x98\x80", 4));
    /* Bytes past `len` are not looked at. */
    assert_true(gw_utf8_valid("ok\xff", 2));
}

int main(void)
{
    const struct CMUnitTest named[] = {
        cmocka_unit_test_setup_teardown(chat_string_content, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(chat_all_roles, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(chat_content_parts, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(chat_image_only_content, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(chat_tool_round_trip, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(chat_assistant_without_content, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(chat_sampling_fields, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(chat_range_edges_accepted, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(logprobs_and_extensions, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(max_completion_tokens_wins, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(null_optional_fields_are_absent, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(unknown_fields_pass_through, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(completions_own_fields, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(completions_prompts, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(embeddings_inputs, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(arrays_up_to_2048_items, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(token_id_prompt_longer_than_2048, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(escaped_controls_accepted, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(duplicate_in_a_big_object, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(logit_bias_and_media_recorded, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(many_messages, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(very_long_string, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(unicode_content, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(surrounding_whitespace_allowed, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(last_user_picks_the_last, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(body_needs_no_terminator, fx_setup, fx_teardown),
        cmocka_unit_test_setup_teardown(reparse_after_error, fx_setup, fx_teardown),
        cmocka_unit_test(utf8_valid_sequences),
        cmocka_unit_test(utf8_invalid_sequences),
        cmocka_unit_test(utf8_length_is_respected),
    };
    /* The named tests, then one test per invalid-body row, named after the row. */
    enum { N_NAMED = sizeof named / sizeof named[0], N_BAD = sizeof k_bad / sizeof k_bad[0] };
    static struct CMUnitTest tests[N_NAMED + N_BAD];
    static char names[N_BAD][96];
    memcpy(tests, named, sizeof named);
    for (size_t i = 0; i < N_BAD; i++) {
        snprintf(names[i], sizeof names[i], "refuses_%s", k_bad[i].name);
        tests[N_NAMED + i] = (struct CMUnitTest){
            .name = names[i],
            .test_func = bad_body_is_refused,
            .initial_state = (void *)&k_bad[i],
        };
    }
    return _cmocka_run_group_tests("gateway/request", tests, N_NAMED + N_BAD, NULL, NULL);
}
