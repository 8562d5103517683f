/* gateway/tool_calls.h: OpenAI tool calls on engine tiers. The request side reads `tools` and
 * `tool_choice` into the tools the answer may call (engine/text/grammar.h constrains it) and
 * writes the conversation as the model family expects (engine/text/tools.h): the tool
 * definitions in the system turn, an assistant's earlier tool_calls as calls, a `tool` message
 * as a result turn. The answer side reads an answer back into OpenAI `tool_calls` (ids
 * "call_" + 24 random characters; arguments a JSON string). While a stream is under way,
 * eng_tools_begins (engine/text/tools.h) tells whether the text so far may still be the start
 * of a call (held back), is text (sent), or is a call (held to the end, then sent as one
 * tool_calls delta).
 * Loop thread; everything allocated comes from the arena given. */
#ifndef LLMGW_GATEWAY_TOOL_CALLS_H
#define LLMGW_GATEWAY_TOOL_CALLS_H

#include "common/arena.h"
#include "engine/text/chat.h"
#include "engine/text/grammar.h"
#include "gateway/request.h"

#include <stdbool.h>
#include <stddef.h>

typedef enum gw_tool_mode {
    GW_TOOLS_NONE = 0,       /* no tools, or tool_choice "none": a plain answer */
    GW_TOOLS_AUTO = 1,       /* text or a call */
    GW_TOOLS_REQUIRED = 2,   /* "required", or a named function: a call */
} gw_tool_mode;

typedef struct gw_tool_req {
    gw_tool_mode mode;
    eng_tool_spec *specs;    /* [n] the tools the answer may call (a named choice: that one) */
    int n;
    const char *system;      /* the tool block of the system turn (every tool, as JSON lines) */
    const char *key;         /* identifies the grammar: mode, chat family and the tools */
    size_t key_len;
} gw_tool_req;

/* Reads b's tools for a model of chat family `kind`. 0, or LLMGW_EINVAL with *param and the
 * message in msg (a named tool_choice that names no tool, parameters that are not an object). */
int gw_tool_req_read(const gw_request *b, eng_chat_kind kind, util_arena *a, gw_tool_req *out,
                     const char **param, char *msg, size_t msg_len);

/* The content message i (of b->messages) has in the model's prompt, and its role: an assistant
 * turn's tool_calls are appended as calls, a tool message becomes a result turn. */
void gw_tool_message(const gw_request *b, size_t i, eng_chat_kind kind, util_arena *a,
                     const char **role, const char **content, size_t *len);

/* The answer as a tool_calls array (JSON text in the arena): 1; 0 when it is no call. With
 * delta, the entries carry "index" (a stream's delta). */
int gw_tool_calls_json(eng_chat_kind kind, const char *text, size_t len, bool delta,
                       util_arena *a, const char **json);

#endif
