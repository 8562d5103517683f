/* engine/text/tools.h: tool use as each chat family writes it. The tool definitions go into the
 * system turn, a call is written in the family's call format, and a tool's result goes back as
 * the family expects:
 *   ChatML (Qwen2.5, Hermes; SmolLM2 has no format of its own and gets this one): the tools as
 *     JSON lines inside <tools></tools>; a call is <tool_call>\n{"name": ..., "arguments":
 *     {...}}\n</tool_call>; a result is a user turn holding <tool_response>\n...\n</tool_response>.
 *   Llama 3.1 (JSON tool calling): a call is {"name": ..., "parameters": {...}}; a result is an
 *     ipython turn.
 * Pure functions, any thread. Strings out are malloc'd and NUL-terminated. */
#ifndef LLMGW_ENGINE_TEXT_TOOLS_H
#define LLMGW_ENGINE_TEXT_TOOLS_H

#include "engine/text/chat.h"

#include <stdbool.h>
#include <stddef.h>

typedef struct eng_tool_format {
    const char *open;       /* before a call: "<tool_call>\n" or "" */
    const char *close;      /* after it: "\n</tool_call>" or "" */
    const char *args_key;   /* "arguments" or "parameters" */
    const char *result_role;   /* the role of a tool's result turn: "user" or "ipython" */
    const char *trigger;    /* an answer that begins with this is a call: open, or "{" */
} eng_tool_format;

const eng_tool_format *eng_tools_format(eng_chat_kind kind);

/* The text the system turn gets (after its own, if any) for tools[n], each the JSON text of an
 * OpenAI tool ({"type": "function", "function": {...}}). */
char *eng_tools_system(eng_chat_kind kind, const char *const *tools, size_t n);
/* A call as the assistant turn writes it; args is the arguments' JSON text. */
char *eng_tools_call(eng_chat_kind kind, const char *name, const char *args);
/* A result's content as its turn holds it. */
char *eng_tools_result(eng_chat_kind kind, const char *content, size_t len);

/* How an answer begins, after any blanks (*at: where that is): with the trigger (a call), with
 * a strict prefix of it, nothing included (the next bytes decide), or otherwise (text). */
typedef enum eng_tools_start {
    ENG_TOOLS_TEXT = 0,
    ENG_TOOLS_MAYBE = 1,
    ENG_TOOLS_CALL = 2,
} eng_tools_start;

eng_tools_start eng_tools_begins(eng_chat_kind kind, const char *text, size_t len, size_t *at);

/* Reads an answer: 1 when it is one call (then *name and *args, the arguments as compact JSON,
 * are malloc'd), 0 when it is text, -1 when it begins like a call but is not one (cut short). */
int eng_tools_parse(eng_chat_kind kind, const char *text, size_t len, char **name, char **args);

#endif
