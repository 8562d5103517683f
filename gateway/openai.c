/* gateway/openai.c: OpenAI stream chunks written without a JSON tree (see openai.h). */
#include "gateway/openai.h"

#include "gateway/json.h"

#include <event2/buffer.h>
#include <string.h>

static void head(struct evbuffer *out, const gw_openai_head *h)
{
    evbuffer_add(out, "{\"id\":", 6);
    gw_json_print_string(h->id, out);
    evbuffer_add_printf(out, ",\"object\":\"%s\",\"created\":%llu,\"model\":",
                        h->chat ? "chat.completion.chunk" : "text_completion",
                        (unsigned long long)h->created);
    gw_json_print_string(h->model, out);
    if (h->fingerprint != NULL) {
        evbuffer_add(out, ",\"system_fingerprint\":", 22);
        gw_json_print_string(h->fingerprint, out);
    }
}

void gw_openai_chunk(struct evbuffer *out, const gw_openai_head *h, const gw_openai_step *s)
{
    head(out, h);
    evbuffer_add_printf(out, ",\"choices\":[{\"index\":%d,", s->index);
    if (h->chat) {
        evbuffer_add(out, "\"delta\":{", 9);
        if (s->role)
            evbuffer_add(out, "\"role\":\"assistant\"", 18);
        if (s->text != NULL) {
            if (s->role)
                evbuffer_add(out, ",", 1);
            evbuffer_add(out, "\"content\":", 10);
            gw_json_print_stringn(s->text, s->len, out);
        }
        evbuffer_add(out, "},", 2);
    } else {
        evbuffer_add(out, "\"text\":", 7);
        gw_json_print_stringn(s->text != NULL ? s->text : "", s->text != NULL ? s->len : 0, out);
        evbuffer_add(out, ",", 1);
    }
    evbuffer_add(out, "\"logprobs\":", 11);
    if (s->logprobs != NULL)
        evbuffer_add(out, s->logprobs, strlen(s->logprobs));
    else
        evbuffer_add(out, "null", 4);
    evbuffer_add(out, ",\"finish_reason\":", 17);
    if (s->finish != NULL)
        gw_json_print_string(s->finish, out);
    else
        evbuffer_add(out, "null", 4);
    evbuffer_add(out, "}]}", 3);
}

void gw_openai_usage_chunk(struct evbuffer *out, const gw_openai_head *h, long prompt,
                           long completion)
{
    head(out, h);
    evbuffer_add_printf(out, ",\"choices\":[],\"usage\":{\"prompt_tokens\":%ld,"
                        "\"completion_tokens\":%ld,\"total_tokens\":%ld}}", prompt, completion,
                        prompt + completion);
}
