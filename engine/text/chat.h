/* engine/text/chat.h: chat templates for the model families llmgw loads, chosen from the file's
 * tokenizer.chat_template (a Jinja text we recognise, we do not run Jinja): ChatML
 * (SmolLM2, Qwen2: <|im_start|>role\ncontent<|im_end|>\n) and Llama-3 header style
 * (<|start_header_id|>role<|end_header_id|>\n\ncontent<|eot_id|>). Thread-safe (pure). */
#ifndef LLMGW_ENGINE_CHAT_H
#define LLMGW_ENGINE_CHAT_H

#include "common/err.h"

#include <stdbool.h>
#include <stddef.h>

typedef enum eng_chat_kind {
    ENG_CHAT_CHATML = 0,
    ENG_CHAT_LLAMA3 = 1,
} eng_chat_kind;

typedef struct eng_chat_msg {
    const char *role;      /* "system", "user", "assistant", "tool" ... */
    const char *content;
    size_t content_len;
} eng_chat_msg;

/* Recognises a template text; an unknown one is LLMGW_ENOTFOUND with a message saying so
 * (the caller may then use a configured override by name). NULL text → ENOTFOUND too. */
int eng_chat_detect(const char *template_text, size_t len, eng_chat_kind *out, util_err *err);
/* "chatml" or "llama3" → kind; else LLMGW_EINVAL. */
int eng_chat_from_name(const char *name, eng_chat_kind *out, util_err *err);

/* Renders messages as the model expects; when add_generation_prompt, ends with the opening of
 * an assistant turn. A system message default (SmolLM2's template injects one when the
 * conversation has none) is the caller's choice: default_system may be NULL.
 * *out is malloc'd and NUL-terminated. Returns 0 or LLMGW_ENOMEM. */
int eng_chat_render(eng_chat_kind kind, const eng_chat_msg *msgs, size_t n,
                    const char *default_system, bool add_generation_prompt, char **out,
                    size_t *len);

#endif
