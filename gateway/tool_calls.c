/* gateway/tool_calls.c: tool calls on engine tiers (gateway/tool_calls.h). */
#include "gateway/tool_calls.h"

#include "engine/text/tools.h"

#include <cjson/cJSON.h>
#include <openssl/rand.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Takes a malloc'd string into the arena. */
static const char *adopt(util_arena *a, char *s)
{
    const char *c = util_arena_strdup(a, s);
    free(s);
    return c;
}

int gw_tool_req_read(const gw_request *b, eng_chat_kind kind, util_arena *a, gw_tool_req *out,
                     const char **param, char *msg, size_t msg_len)
{
    memset(out, 0, sizeof *out);
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(b->json, "tools");
    const cJSON *choice = cJSON_GetObjectItemCaseSensitive(b->json, "tool_choice");
    int n = cJSON_GetArraySize(tools);
    if (!b->has_tools || n == 0 || (cJSON_IsString(choice) && !strcmp(choice->valuestring, "none")))
        return 0;
    const char *only = NULL;   /* a named tool_choice */
    if (cJSON_IsObject(choice)) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(choice, "function");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
        if (!cJSON_IsString(name)) {
            *param = "tool_choice";
            snprintf(msg, msg_len, "Invalid 'tool_choice': expected {\"type\": \"function\", "
                     "\"function\": {\"name\": ...}}.");
            return LLMGW_EINVAL;
        }
        only = name->valuestring;
    }
    out->mode = only != NULL || (cJSON_IsString(choice) && !strcmp(choice->valuestring,
                                                                     "required"))
                    ? GW_TOOLS_REQUIRED : GW_TOOLS_AUTO;
    out->specs = util_arena_alloc(a, (size_t)n * sizeof *out->specs);
    const char **lines = util_arena_alloc(a, (size_t)n * sizeof *lines);
    int i = 0, k = 0;
    const cJSON *t;
    cJSON_ArrayForEach(t, tools) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(t, "type");
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
        const cJSON *params = cJSON_GetObjectItemCaseSensitive(fn, "parameters");
        if (!cJSON_IsString(type) || strcmp(type->valuestring, "function") != 0 ||
            !cJSON_IsString(name)) {
            *param = "tools";
            snprintf(msg, msg_len, "Invalid 'tools[%d]': engine tiers call function tools only.",
                     i);
            return LLMGW_EINVAL;
        }
        if (params != NULL && !cJSON_IsObject(params)) {
            *param = "tools";
            snprintf(msg, msg_len, "Invalid 'tools[%d].function.parameters': expected an "
                     "object (a JSON schema).", i);
            return LLMGW_EINVAL;
        }
        char *line = cJSON_PrintUnformatted(t);
        lines[i] = adopt(a, line);
        if (only == NULL || strcmp(only, name->valuestring) == 0) {
            eng_tool_spec *s = &out->specs[k++];
            s->name = util_arena_strdup(a, name->valuestring);
            if (params != NULL) {
                char *p = cJSON_PrintUnformatted(params);
                s->params_len = strlen(p);
                s->params = adopt(a, p);
            }
        }
        i++;
    }
    if (k == 0) {
        *param = "tool_choice";
        snprintf(msg, msg_len, "Invalid 'tool_choice': no tool is named '%.64s'.", only);
        return LLMGW_EINVAL;
    }
    out->n = k;
    out->system = adopt(a, eng_tools_system(kind, lines, (size_t)n));
    char *all = cJSON_PrintUnformatted(tools);
    char head[64];
    int hl = snprintf(head, sizeof head, "tools:%d:%d:%s\n", (int)out->mode, (int)kind,
                      only ? only : "");
    size_t al = strlen(all);
    char *key = util_arena_alloc(a, (size_t)hl + al + 1);
    memcpy(key, head, (size_t)hl);
    memcpy(key + hl, all, al + 1);
    free(all);
    out->key = key;
    out->key_len = (size_t)hl + al;
    return 0;
}

void gw_tool_message(const gw_request *b, size_t i, eng_chat_kind kind, util_arena *a,
                     const char **role, const char **content, size_t *len)
{
    const gw_message *m = &b->messages[i];
    *role = !strcmp(m->role, "developer") ? "system" : m->role;
    *content = m->text;
    *len = m->text_len;
    if (!strcmp(m->role, "tool") || !strcmp(m->role, "function")) {
        *role = eng_tools_format(kind)->result_role;
        *content = adopt(a, eng_tools_result(kind, m->text, m->text_len));
        *len = strlen(*content);
        return;
    }
    if (!m->has_tool_calls)
        return;
    const cJSON *msg = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(b->json, "messages"),
                                          (int)i);
    /* The text, then each call on a line of its own (rendered first: a name's escapes make
     * its length unknown until then). */
    const cJSON *calls = cJSON_GetObjectItemCaseSensitive(msg, "tool_calls");
    int n = cJSON_GetArraySize(calls), k = 0;
    char **rendered = util_arena_alloc(a, (size_t)(n ? n : 1) * sizeof *rendered);
    size_t total = m->text_len;
    const cJSON *c;
    cJSON_ArrayForEach(c, calls) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(c, "function");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
        const cJSON *args = cJSON_GetObjectItemCaseSensitive(fn, "arguments");
        if (!cJSON_IsString(name))
            continue;
        rendered[k] = eng_tools_call(kind, name->valuestring,
                                     cJSON_IsString(args) ? args->valuestring : "{}");
        total += strlen(rendered[k++]) + 1;
    }
    char *out = util_arena_alloc(a, total + 1);
    size_t used = m->text_len;
    memcpy(out, m->text, m->text_len);
    for (int j = 0; j < k; j++) {
        size_t cl = strlen(rendered[j]);
        if (used > 0)
            out[used++] = '\n';
        memcpy(out + used, rendered[j], cl);
        used += cl;
        free(rendered[j]);
    }
    out[used] = '\0';
    *content = out;
    *len = used;
}

int gw_tool_calls_json(eng_chat_kind kind, const char *text, size_t len, bool delta,
                       util_arena *a, const char **json)
{
    char *name, *args;
    if (eng_tools_parse(kind, text, len, &name, &args) != 1)
        return 0;
    static const char alnum[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    unsigned char rnd[24];
    char id[5 + 24 + 1] = "call_";
    if (RAND_bytes(rnd, sizeof rnd) != 1)
        memset(rnd, 7, sizeof rnd);
    for (int i = 0; i < 24; i++)
        id[5 + i] = alnum[rnd[i] % 62];
    id[29] = '\0';
    cJSON *arr = cJSON_CreateArray(), *c = cJSON_CreateObject(), *fn = cJSON_CreateObject();
    if (delta)
        cJSON_AddNumberToObject(c, "index", 0);
    cJSON_AddStringToObject(c, "id", id);
    cJSON_AddStringToObject(c, "type", "function");
    cJSON_AddStringToObject(fn, "name", name);
    cJSON_AddStringToObject(fn, "arguments", args);
    cJSON_AddItemToObject(c, "function", fn);
    cJSON_AddItemToArray(arr, c);
    char *s = cJSON_PrintUnformatted(arr);
    cJSON_Delete(arr);
    free(name);
    free(args);
    if (s == NULL)
        return 0;
    *json = adopt(a, s);
    return 1;
}
