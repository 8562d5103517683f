/* tests/unit/engine/text/test_chat.c: chat templates (eng_chat_*): recognising real template texts,
 * rendering ChatML and Llama-3 as llama.cpp's llama_chat_apply_template does, and SmolLM2's
 * injected system turn as its Jinja template does. */
#include "engine/text/chat.h"

#include "tests/unit/unit.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>

/* tokenizer.chat_template of SmolLM2-135M-Instruct. */
static const char smollm2_template[] =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}";
/* Qwen2-Instruct's (ChatML with a default system turn of its own). */
static const char qwen2_template[] =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
/* Meta-Llama-3-Instruct's. */
static const char llama3_template[] =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | "
    "trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}"
    "{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}";
static const char gemma_template[] =
    "{{ bos_token }}{% for message in messages %}{{ '<start_of_turn>' + role + '\\n' + "
    "message['content'] | trim + '<end_of_turn>\\n' }}{% endfor %}";
static const char phi4_template[] =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '<|im_sep|>' + "
    "message['content'] + '<|im_end|>'}}{% endfor %}";

static const char smollm2_system[] =
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face";

static void detects_real_templates(void **state)
{
    (void)state;
    eng_chat_kind k = (eng_chat_kind)-1;
    util_err err = {0};
    assert_int_equal(eng_chat_detect(smollm2_template, strlen(smollm2_template), &k, &err), 0);
    assert_int_equal(k, ENG_CHAT_CHATML);
    assert_int_equal(eng_chat_detect(qwen2_template, strlen(qwen2_template), &k, &err), 0);
    assert_int_equal(k, ENG_CHAT_CHATML);
    assert_int_equal(eng_chat_detect(llama3_template, strlen(llama3_template), &k, &err), 0);
    assert_int_equal(k, ENG_CHAT_LLAMA3);
    assert_int_equal(eng_chat_detect("llama3", 6, &k, &err), 0);  /* a name works as a text */
    assert_int_equal(k, ENG_CHAT_LLAMA3);
    /* Only the given length counts. */
    assert_int_equal(eng_chat_detect(smollm2_template, 20, &k, &err), LLMGW_ENOTFOUND);
}

static void unknown_templates_are_not_found(void **state)
{
    (void)state;
    eng_chat_kind k;
    util_err err = {0};
    assert_int_equal(eng_chat_detect(gemma_template, strlen(gemma_template), &k, &err),
                     LLMGW_ENOTFOUND);
    assert_contains(err.msg, "not one llmgw renders");
    assert_int_equal(eng_chat_detect(phi4_template, strlen(phi4_template), &k, &err),
                     LLMGW_ENOTFOUND);
    assert_int_equal(eng_chat_detect(NULL, 0, &k, &err), LLMGW_ENOTFOUND);
    assert_int_equal(eng_chat_detect("", 0, &k, &err), LLMGW_ENOTFOUND);
}

static void names(void **state)
{
    (void)state;
    eng_chat_kind k;
    util_err err = {0};
    assert_int_equal(eng_chat_from_name("chatml", &k, &err), 0);
    assert_int_equal(k, ENG_CHAT_CHATML);
    assert_int_equal(eng_chat_from_name("llama3", &k, &err), 0);
    assert_int_equal(k, ENG_CHAT_LLAMA3);
    assert_int_equal(eng_chat_from_name("vicuna", &k, &err), LLMGW_EINVAL);
    assert_contains(err.msg, "vicuna");
    assert_int_equal(eng_chat_from_name(NULL, &k, &err), LLMGW_EINVAL);
}

#define MSG(r, c) {r, c, sizeof(c) - 1}

static void expect(eng_chat_kind kind, const eng_chat_msg *m, size_t n, const char *sys,
                   bool gen, const char *want)
{
    char *out = NULL;
    size_t len = 0;
    assert_int_equal(eng_chat_render(kind, m, n, sys, gen, &out, &len), 0);
    assert_string_equal(out, want);
    assert_int_equal(len, strlen(want));
    free(out);
}

static void renders_chatml(void **state)
{
    (void)state;
    const eng_chat_msg user[] = {MSG("user", "Hello!")};
    /* llama.cpp's built-in ChatML adds no system turn. */
    expect(ENG_CHAT_CHATML, user, 1, NULL, true,
           "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n");
    /* SmolLM2's Jinja template does, when the first message is not a system one. */
    expect(ENG_CHAT_CHATML, user, 1, smollm2_system, true,
           "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
           "Face<|im_end|>\n<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n");
    const eng_chat_msg conv[] = {MSG("system", "Be brief."), MSG("user", " 2+2? "),
                                 MSG("assistant", "4"), MSG("user", "And 3+3?")};
    expect(ENG_CHAT_CHATML, conv, 4, smollm2_system, false,
           "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n 2+2? <|im_end|>\n"
           "<|im_start|>assistant\n4<|im_end|>\n<|im_start|>user\nAnd 3+3?<|im_end|>\n");
    expect(ENG_CHAT_CHATML, NULL, 0, smollm2_system, true, "<|im_start|>assistant\n");
    expect(ENG_CHAT_CHATML, NULL, 0, NULL, false, "");
    /* Content is counted, not NUL-terminated. */
    const eng_chat_msg cut[] = {{"user", "abcdef", 3}};
    expect(ENG_CHAT_CHATML, cut, 1, NULL, false, "<|im_start|>user\nabc<|im_end|>\n");
}

static void renders_llama3(void **state)
{
    (void)state;
    const eng_chat_msg conv[] = {MSG("system", "  Be brief.\n"), MSG("user", "\t2+2? ")};
    expect(ENG_CHAT_LLAMA3, conv, 2, NULL, true,
           "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
           "<|start_header_id|>user<|end_header_id|>\n\n2+2?<|eot_id|>"
           "<|start_header_id|>assistant<|end_header_id|>\n\n");
    const eng_chat_msg user[] = {MSG("user", "Hi")};
    expect(ENG_CHAT_LLAMA3, user, 1, "Sys", false,
           "<|start_header_id|>system<|end_header_id|>\n\nSys<|eot_id|>"
           "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>");
}

/* tests/golden/smollm2_tokens.json: the model's template and how llama.cpp (built-in) and Jinja2
 * render three conversations. Built-in = no default system; Jinja2 = SmolLM2's default. */
static void matches_golden_renderings(void **state)
{
    (void)state;
    FILE *f = fopen(LLMGW_SOURCE_DIR "/tests/golden/smollm2_tokens.json", "rb");
    if (f == NULL) {
        printf("[ INFO     ] tests/golden/smollm2_tokens.json absent: skipped\n");
        skip();
    }
    static char json[1 << 20];
    size_t len = fread(json, 1, sizeof json, f);
    fclose(f);
    cJSON *doc = cJSON_ParseWithLength(json, len);
    assert_non_null(doc);
    const cJSON *ct = cJSON_GetObjectItemCaseSensitive(doc, "chat_template");
    const char *tmpl = cJSON_GetObjectItemCaseSensitive(ct, "template")->valuestring;
    eng_chat_kind k;
    assert_int_equal(eng_chat_detect(tmpl, strlen(tmpl), &k, NULL), 0);
    assert_int_equal(k, ENG_CHAT_CHATML);
    assert_string_equal(tmpl, smollm2_template);
    const cJSON *r;
    size_t n_conv = 0;
    cJSON_ArrayForEach(r, cJSON_GetObjectItemCaseSensitive(ct, "renderings")) {
        eng_chat_msg m[8];
        size_t n = 0;
        const cJSON *pair;
        cJSON_ArrayForEach(pair, cJSON_GetObjectItemCaseSensitive(r, "messages")) {
            assert_true(n < 8);
            m[n].role = cJSON_GetArrayItem(pair, 0)->valuestring;
            m[n].content = cJSON_GetArrayItem(pair, 1)->valuestring;
            m[n].content_len = strlen(m[n].content);
            n++;
        }
        expect(ENG_CHAT_CHATML, m, n, NULL, true,
               cJSON_GetObjectItemCaseSensitive(r, "llama_chat_apply_template")->valuestring);
        expect(ENG_CHAT_CHATML, m, n, smollm2_system, true,
               cJSON_GetObjectItemCaseSensitive(r, "jinja2")->valuestring);
        n_conv++;
    }
    assert_int_equal(n_conv, 3);
    cJSON_Delete(doc);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(detects_real_templates),
        cmocka_unit_test(unknown_templates_are_not_found),
        cmocka_unit_test(names),
        cmocka_unit_test(renders_chatml),
        cmocka_unit_test(renders_llama3),
        cmocka_unit_test(matches_golden_renderings),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
