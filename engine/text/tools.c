/* engine/text/tools.c: the tool-use formats of engine/text/tools.h. */
#include "engine/text/tools.h"

#include "common/arena.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const eng_tool_format hermes = {.open = "<tool_call>\n", .close = "\n</tool_call>",
                                       .args_key = "arguments", .result_role = "user",
                                       .trigger = "<tool_call>\n"};
static const eng_tool_format llama31 = {.open = "", .close = "", .args_key = "parameters",
                                        .result_role = "ipython", .trigger = "{"};

const eng_tool_format *eng_tools_format(eng_chat_kind kind)
{
    return kind == ENG_CHAT_LLAMA3 ? &llama31 : &hermes;
}

typedef struct sbuf {
    char *p;
    size_t len, cap;
} sbuf;

static void add(sbuf *b, const char *s, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        while (b->len + n + 1 > b->cap)
            b->cap = b->cap ? 2 * b->cap : 256;
        char *p = realloc(b->p, b->cap);
        if (p == NULL)
            abort();
        b->p = p;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

static void adds(sbuf *b, const char *s) { add(b, s, strlen(s)); }

char *eng_tools_system(eng_chat_kind kind, const char *const *tools, size_t n)
{
    sbuf b = {0};
    if (kind == ENG_CHAT_LLAMA3) {
        adds(&b, "You can call these functions. To call one, answer with only a JSON object of "
                 "the form {\"name\": function name, \"parameters\": an object of its arguments"
                 "}; otherwise answer in text.\n\n");
        for (size_t i = 0; i < n; i++) {
            adds(&b, tools[i]);
            adds(&b, "\n\n");
        }
        return b.p;
    }
    adds(&b, "# Tools\n\nYou may call a function to help with the user's request. Their "
             "signatures are inside <tools></tools>:\n<tools>");
    for (size_t i = 0; i < n; i++) {
        adds(&b, "\n");
        adds(&b, tools[i]);
    }
    adds(&b, "\n</tools>\n\nTo call one, answer with a JSON object of its name and arguments "
             "inside <tool_call></tool_call> tags:\n<tool_call>\n{\"name\": <function-name>, "
             "\"arguments\": <args-json-object>}\n</tool_call>");
    return b.p;
}

char *eng_tools_call(eng_chat_kind kind, const char *name, const char *args)
{
    const eng_tool_format *f = eng_tools_format(kind);
    cJSON *n = cJSON_CreateString(name);
    char *quoted = n ? cJSON_PrintUnformatted(n) : NULL;
    cJSON_Delete(n);
    if (quoted == NULL)
        abort();
    sbuf b = {0};
    adds(&b, f->open);
    adds(&b, "{\"name\": ");
    adds(&b, quoted);
    adds(&b, ", \"");
    adds(&b, f->args_key);
    adds(&b, "\": ");
    adds(&b, args && *args ? args : "{}");
    adds(&b, "}");
    adds(&b, f->close);
    cJSON_free(quoted);
    return b.p;
}

char *eng_tools_result(eng_chat_kind kind, const char *content, size_t len)
{
    sbuf b = {0};
    if (kind == ENG_CHAT_LLAMA3) {
        add(&b, content, len);
        if (b.p == NULL)
            adds(&b, "");
        return b.p;
    }
    adds(&b, "<tool_response>\n");
    add(&b, content, len);
    adds(&b, "\n</tool_response>");
    return b.p;
}

static bool blank(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

eng_tools_start eng_tools_begins(eng_chat_kind kind, const char *text, size_t len, size_t *at)
{
    const char *trigger = eng_tools_format(kind)->trigger;
    size_t i = 0, tl = strlen(trigger);
    while (i < len && blank(text[i]))
        i++;
    *at = i;
    size_t rest = len - i, n = rest < tl ? rest : tl;
    if (memcmp(text + i, trigger, n) != 0)
        return ENG_TOOLS_TEXT;
    return rest < tl ? ENG_TOOLS_MAYBE : ENG_TOOLS_CALL;
}

int eng_tools_parse(eng_chat_kind kind, const char *text, size_t len, char **name, char **args)
{
    const eng_tool_format *f = eng_tools_format(kind);
    *name = *args = NULL;
    size_t i;
    eng_tools_start start = eng_tools_begins(kind, text, len, &i);
    if (start == ENG_TOOLS_MAYBE)   /* a call cut short; nothing at all is text */
        return i < len ? -1 : 0;
    if (start == ENG_TOOLS_TEXT)
        return 0;
    i += strlen(f->open);
    size_t end = len, cl = strlen(f->close);
    while (end > i && blank(text[end - 1]))
        end--;
    if (cl > 0) {
        const char *c = f->close;
        while (*c && blank(*c))
            c++, cl--;
        if (end - i < cl || memcmp(text + end - cl, c, cl) != 0)
            return -1;
        end -= cl;
    }
    cJSON *doc = cJSON_ParseWithLength(text + i, end - i);
    const cJSON *n = cJSON_GetObjectItemCaseSensitive(doc, "name");
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(doc, f->args_key);
    if (!cJSON_IsString(n) || !cJSON_IsObject(a)) {
        cJSON_Delete(doc);
        return -1;
    }
    *name = util_xstrdup(n->valuestring);
    char *s = cJSON_PrintUnformatted(a);
    *args = util_xstrdup(s ? s : "{}");
    cJSON_free(s);
    cJSON_Delete(doc);
    return 1;
}
