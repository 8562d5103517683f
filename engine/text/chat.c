/* engine/text/chat.c: recognising a GGUF chat template by the markers llama.cpp looks for
 * (llm_chat_detect_template), and rendering messages as llama.cpp's llm_chat_apply_template
 * does for ChatML and Llama-3. Llama-3's <|begin_of_text|> is not rendered: it is the BOS the
 * tokenizer adds (tokenizer.ggml.add_bos_token). */
#include "engine/text/chat.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

static bool contains(const char *hay, size_t len, const char *needle)
{
    return memmem(hay, len, needle, strlen(needle)) != NULL;
}

/* Markers of templates llama.cpp recognises before it tests for Llama-3: a template carrying
 * one of these is another family even if it also has Llama-3's header tokens. */
static bool other_family(const char *s, size_t len)
{
    static const char *const alone[] = {"[INST]", "[gMASK]<sop>", "bos_token + message['role']",
        "<start_of_turn>", "'\\n\\nAssistant: ' + eos_token", "GPT4 Correct ", NULL};
    static const char *const pairs[][2] = {
        {"<|assistant|>", "<|end|>"}, {"<|assistant|>", "<|user|>"},
        {"<|{{ item['role'] }}|>", "<|begin_of_image|>"}, {"<|user|>", "<|endoftext|>"},
        {"USER: ", "ASSISTANT: "}, {"### Instruction:", "<|EOT|>"},
        {"<|START_OF_TURN_TOKEN|>", "<|USER_TOKEN|>"},
    };
    if (len >= 7 && memcmp(s, "mistral", 7) == 0)
        return true;
    for (size_t i = 0; alone[i] != NULL; i++)
        if (contains(s, len, alone[i]))
            return true;
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++)
        if (contains(s, len, pairs[i][0]) && contains(s, len, pairs[i][1]))
            return true;
    return false;
}

int eng_chat_from_name(const char *name, eng_chat_kind *out, util_err *err)
{
    if (name != NULL && strcmp(name, "chatml") == 0) {
        *out = ENG_CHAT_CHATML;
        return 0;
    }
    if (name != NULL && strcmp(name, "llama3") == 0) {
        *out = ENG_CHAT_LLAMA3;
        return 0;
    }
    return util_err_set(err, LLMGW_EINVAL, "unknown chat template \"%s\" (known: chatml, llama3)",
                        name ? name : "(null)");
}

int eng_chat_detect(const char *s, size_t len, eng_chat_kind *out, util_err *err)
{
    if (s == NULL)
        return util_err_set(err, LLMGW_ENOTFOUND, "the model has no chat template");
    /* A template text that is a name (llama.cpp accepts those too). */
    if (len == 6 && memcmp(s, "chatml", 6) == 0)
        return eng_chat_from_name("chatml", out, err);
    if (len == 6 && memcmp(s, "llama3", 6) == 0)
        return eng_chat_from_name("llama3", out, err);
    if (contains(s, len, "<|im_start|>")) {
        /* Phi-4 (<|im_sep|>) and SmolVLM (<end_of_utterance>) use it too, differently. */
        if (!contains(s, len, "<|im_sep|>") && !contains(s, len, "<end_of_utterance>")) {
            *out = ENG_CHAT_CHATML;
            return 0;
        }
    } else if (!other_family(s, len) && contains(s, len, "<|start_header_id|>") &&
               contains(s, len, "<|end_header_id|>")) {
        *out = ENG_CHAT_LLAMA3;
        return 0;
    }
    return util_err_set(err, LLMGW_ENOTFOUND,
                        "the model's chat template is not one llmgw renders (ChatML, Llama-3); "
                        "configure one by name");
}

/* ---- rendering ---- */

typedef struct buf {
    char *p;
    size_t n, cap;
    bool oom;
} buf;

static void put(buf *b, const char *s, size_t len)
{
    if (b->oom || len == 0)
        return;
    if (b->n + len + 1 > b->cap) {
        size_t cap = (b->n + len + 1) * 2;
        char *p = realloc(b->p, cap);
        if (p == NULL) {
            b->oom = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, len);
    b->n += len;
}

static void puts_(buf *b, const char *s) { put(b, s, strlen(s)); }

/* Llama-3 trims each content (C isspace, as llama.cpp's trim). */
static void put_trimmed(buf *b, const char *s, size_t len)
{
    while (len > 0 && isspace((unsigned char)s[0])) {
        s++;
        len--;
    }
    while (len > 0 && isspace((unsigned char)s[len - 1]))
        len--;
    put(b, s, len);
}

static void put_turn(buf *b, eng_chat_kind kind, const char *role, const char *content,
                     size_t len)
{
    if (kind == ENG_CHAT_CHATML) {
        puts_(b, "<|im_start|>");
        puts_(b, role);
        puts_(b, "\n");
        put(b, content, len);
        puts_(b, "<|im_end|>\n");
    } else {
        puts_(b, "<|start_header_id|>");
        puts_(b, role);
        puts_(b, "<|end_header_id|>\n\n");
        put_trimmed(b, content, len);
        puts_(b, "<|eot_id|>");
    }
}

int eng_chat_render(eng_chat_kind kind, const eng_chat_msg *msgs, size_t n,
                    const char *default_system, bool add_generation_prompt, char **out,
                    size_t *len)
{
    buf b = {0};
    /* SmolLM2's template: a conversation that does not open with a system turn gets one. */
    if (n > 0 && default_system != NULL && (msgs[0].role == NULL ||
                                            strcmp(msgs[0].role, "system") != 0))
        put_turn(&b, kind, "system", default_system, strlen(default_system));
    for (size_t i = 0; i < n; i++)
        put_turn(&b, kind, msgs[i].role ? msgs[i].role : "", msgs[i].content ? msgs[i].content : "",
                 msgs[i].content ? msgs[i].content_len : 0);
    if (add_generation_prompt)
        puts_(&b, kind == ENG_CHAT_CHATML ? "<|im_start|>assistant\n"
                                          : "<|start_header_id|>assistant<|end_header_id|>\n\n");
    if (b.p == NULL && !b.oom && (b.p = malloc(1)) == NULL)
        b.oom = true;
    if (b.oom) {
        free(b.p);
        return LLMGW_ENOMEM;
    }
    b.p[b.n] = '\0';
    *out = b.p;
    *len = b.n;
    return 0;
}
