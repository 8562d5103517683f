/* engine/text/tools: the tool-use formats: what the system turn gets, a call written and read
 * back, a result's turn, and answers that are text or a call cut short. */
#include "engine/text/tools.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

static const char *const tool =
    "{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{}}}";

static void chatml_writes_hermes_calls(void **state)
{
    (void)state;
    char *sys = eng_tools_system(ENG_CHAT_CHATML, &tool, 1);
    assert_non_null(strstr(sys, "<tools>\n{\"type\":\"function\""));
    assert_non_null(strstr(sys, "</tools>"));
    assert_non_null(strstr(sys, "<tool_call>"));
    free(sys);
    char *call = eng_tools_call(ENG_CHAT_CHATML, "get_weather", "{\"city\":\"Paris\"}");
    assert_string_equal(call, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
                              "{\"city\":\"Paris\"}}\n</tool_call>");
    char *name, *args;
    assert_int_equal(eng_tools_parse(ENG_CHAT_CHATML, call, strlen(call), &name, &args), 1);
    assert_string_equal(name, "get_weather");
    assert_string_equal(args, "{\"city\":\"Paris\"}");
    free(name);
    free(args);
    free(call);
    char *res = eng_tools_result(ENG_CHAT_CHATML, "18 C", 4);
    assert_string_equal(res, "<tool_response>\n18 C\n</tool_response>");
    free(res);
    assert_string_equal(eng_tools_format(ENG_CHAT_CHATML)->result_role, "user");
}

static void llama3_writes_json_calls(void **state)
{
    (void)state;
    char *call = eng_tools_call(ENG_CHAT_LLAMA3, "f", NULL);
    assert_string_equal(call, "{\"name\": \"f\", \"parameters\": {}}");
    char *name, *args;
    assert_int_equal(eng_tools_parse(ENG_CHAT_LLAMA3, call, strlen(call), &name, &args), 1);
    assert_string_equal(args, "{}");
    free(name);
    free(args);
    free(call);
    assert_string_equal(eng_tools_format(ENG_CHAT_LLAMA3)->result_role, "ipython");
    char *res = eng_tools_result(ENG_CHAT_LLAMA3, "", 0);
    assert_string_equal(res, "");
    free(res);
}

static void text_and_cut_calls_are_told_apart(void **state)
{
    (void)state;
    char *name, *args;
    static const struct { eng_chat_kind kind; const char *text; int want; } cases[] = {
        {ENG_CHAT_CHATML, "The weather is fine.", 0},
        {ENG_CHAT_CHATML, "", 0},
        {ENG_CHAT_CHATML, "  <tool_ca", -1},
        {ENG_CHAT_CHATML, "<tool_call>\n{\"name\": \"f\", \"arguments\": {", -1},
        {ENG_CHAT_CHATML, "\n<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>\n", 1},
        {ENG_CHAT_LLAMA3, "Hello", 0},
        {ENG_CHAT_LLAMA3, "{\"a\": 1}", -1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        int got = eng_tools_parse(cases[i].kind, cases[i].text, strlen(cases[i].text), &name,
                                  &args);
        if (got != cases[i].want)
            fail_msg("'%s': %d, want %d", cases[i].text, got, cases[i].want);
        free(name);
        free(args);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(chatml_writes_hermes_calls),
        cmocka_unit_test(llama3_writes_json_calls),
        cmocka_unit_test(text_and_cut_calls_are_told_apart),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
