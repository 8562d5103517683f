/* gateway/openai.h: the OpenAI stream events llmgw writes itself (engine tiers): a
 * chat.completion.chunk or text_completion chunk and the usage chunk, written straight into an
 * evbuffer: no JSON tree and no allocation of ours per token. Strings are escaped (the text
 * must be UTF-8, as the engine guarantees). Pure; any thread. */
#ifndef LLMGW_GATEWAY_OPENAI_H
#define LLMGW_GATEWAY_OPENAI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct evbuffer;

/* What every chunk of one answer repeats. */
typedef struct gw_openai_head {
    const char *id;           /* "chatcmpl-..." or "cmpl-..." */
    bool chat;                /* chat.completion.chunk (else text_completion) */
    uint64_t created;         /* unix seconds */
    const char *model;
    const char *fingerprint;  /* NULL: no system_fingerprint */
} gw_openai_head;

/* One choice's step. Chat: delta {role?, content?}; completions: text. */
typedef struct gw_openai_step {
    int index;
    bool role;                /* chat: this chunk carries "role":"assistant" */
    const char *text;         /* NULL: chat leaves content out (a finish chunk); completions "" */
    size_t len;
    const char *tool_calls;   /* chat: a delta "tool_calls" array as JSON text; NULL: none */
    const char *logprobs;     /* the "logprobs" value as JSON text; NULL: null */
    const char *finish;       /* NULL: null */
} gw_openai_step;

void gw_openai_chunk(struct evbuffer *out, const gw_openai_head *h, const gw_openai_step *s);
/* {"prompt_tokens","completion_tokens","total_tokens"}: the usage object of every answer. */
void gw_openai_usage(struct evbuffer *out, long prompt, long completion);
/* {"id",...,"choices":[],"usage":{prompt_tokens, completion_tokens, total_tokens}} */
void gw_openai_usage_chunk(struct evbuffer *out, const gw_openai_head *h, long prompt,
                           long completion);
/* The same with "usage" given as JSON text (a stored answer's own; NULL: null). */
void gw_openai_usage_chunk_raw(struct evbuffer *out, const gw_openai_head *h, const char *usage);

#endif
