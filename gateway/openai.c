/* gateway/openai.c: OpenAI stream chunks written without a JSON tree (see openai.h). */
#include "gateway/openai.h"

#include "gateway/json.h"

#include <event2/buffer.h>
#include <string.h>

/* Appends a string literal (its length counted by the compiler, not by hand). */
#define LIT(out, s) evbuffer_add((out), (s), sizeof(s) - 1)

static void head(struct evbuffer *out, const gw_openai_head *h)
{
    LIT(out, "{\"id\":");
    gw_json_print_string(h->id, out);
    evbuffer_add_printf(out, ",\"object\":\"%s\",\"created\":%llu,\"model\":",
                        h->chat ? "chat.completion.chunk" : "text_completion",
                        (unsigned long long)h->created);
    gw_json_print_string(h->model, out);
    if (h->fingerprint != NULL) {
        LIT(out, ",\"system_fingerprint\":");
        gw_json_print_string(h->fingerprint, out);
    }
}

void gw_openai_chunk(struct evbuffer *out, const gw_openai_head *h, const gw_openai_step *s)
{
    head(out, h);
    evbuffer_add_printf(out, ",\"choices\":[{\"index\":%d,", s->index);
    if (h->chat) {
        LIT(out, "\"delta\":{");
        if (s->role)
            LIT(out, "\"role\":\"assistant\"");
        if (s->text != NULL) {
            if (s->role)
                LIT(out, ",");
            LIT(out, "\"content\":");
            gw_json_print_stringn(s->text, s->len, out);
        }
        if (s->tool_calls != NULL) {
            if (s->role || s->text != NULL)
                LIT(out, ",");
            LIT(out, "\"tool_calls\":");
            evbuffer_add(out, s->tool_calls, strlen(s->tool_calls));
        }
        LIT(out, "},");
    } else {
        LIT(out, "\"text\":");
        gw_json_print_stringn(s->text != NULL ? s->text : "", s->text != NULL ? s->len : 0, out);
        LIT(out, ",");
    }
    LIT(out, "\"logprobs\":");
    if (s->logprobs != NULL)
        evbuffer_add(out, s->logprobs, strlen(s->logprobs));
    else
        LIT(out, "null");
    LIT(out, ",\"finish_reason\":");
    if (s->finish != NULL)
        gw_json_print_string(s->finish, out);
    else
        LIT(out, "null");
    LIT(out, "}]}");
}

void gw_openai_usage(struct evbuffer *out, long prompt, long completion)
{
    evbuffer_add_printf(out, "{\"prompt_tokens\":%ld,\"completion_tokens\":%ld,"
                        "\"total_tokens\":%ld}", prompt, completion, prompt + completion);
}

void gw_openai_usage_chunk(struct evbuffer *out, const gw_openai_head *h, long prompt,
                           long completion)
{
    head(out, h);
    LIT(out, ",\"choices\":[],\"usage\":");
    gw_openai_usage(out, prompt, completion);
    LIT(out, "}");
}

void gw_openai_usage_chunk_raw(struct evbuffer *out, const gw_openai_head *h, const char *usage)
{
    head(out, h);
    LIT(out, ",\"choices\":[],\"usage\":");
    if (usage != NULL)
        evbuffer_add(out, usage, strlen(usage));
    else
        LIT(out, "null");
    LIT(out, "}");
}
