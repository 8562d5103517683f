/* gateway/responses.h: OpenAI's Responses API on the Chat Completions pipeline.
 *
 * POST /v1/responses: the body is translated into a Chat Completions request (instructions ->
 * a system message; input, a string or items: messages with input_text/output_text/input_image
 * parts, function_call and function_call_output items; max_output_tokens, temperature, top_p;
 * text.format -> response_format; function tools and tool_choice; stream with usage), which
 * then goes through the same pipeline as /v1/chat/completions: cache, router, any tier (an
 * upstream that speaks only Chat Completions included), cost headers. Its answer leaves as a
 * Responses answer: the transport is wrapped, so a whole chat.completion becomes a response
 * object, and a chat stream becomes the Responses event sequence (response.created,
 * response.in_progress, response.output_item.added, response.content_part.added,
 * response.output_text.delta ... response.output_text.done, response.content_part.done,
 * response.output_item.done, function-call items and their argument events, and
 * response.completed with the usage). Errors keep the OpenAI error shape.
 *
 * Stored responses (store, default true; gateway/response_store.h): GET /v1/responses/{id},
 * DELETE /v1/responses/{id}, and previous_response_id, which continues the stored
 * conversation (its input and output; not its instructions, as OpenAI does). Loop thread. */
#ifndef LLMGW_GATEWAY_RESPONSES_H
#define LLMGW_GATEWAY_RESPONSES_H

#include "gateway/internal.h"

#include <stdbool.h>
#include <stddef.h>

/* Translates r's Responses body into a Chat Completions body (*chat: text in r's arena) and
 * wraps r's transport. False after answering r (400 naming the field, or the stored response
 * previous_response_id names is not there). */
bool gw_responses_begin(gw_req *r, const char *body, size_t len, const char **chat,
                        size_t *chat_len);
/* GET and DELETE /v1/responses/{id}, for r's tenant. */
void gw_responses_get(gw_req *r, const char *id);
void gw_responses_delete(gw_req *r, const char *id);
/* r is finished: what the wrapper held. */
void gw_responses_release(gw_req *r);

#endif
