/* gateway/responses.c: the Responses API (gateway/responses.h): request translation, the
 * answer's transport wrapper, and the stored responses' endpoints. */
#include "gateway/responses.h"

#include "common/arena.h"
#include "common/time.h"
#include "gateway/reply.h"
#include "gateway/response_store.h"
#include "gateway/sse.h"

#include <cjson/cJSON.h>
#include <event2/buffer.h>
#include <openssl/rand.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_CALLS 16
#define MAX_EVENT (4u << 20)

typedef struct call {
    char *id, *name;          /* malloc'd */
    struct evbuffer *args;
    char item_id[40];
    int output_index;
} call;

struct gw_resp_req {
    const gw_transport *inner;
    char id[56], msg_id[56];
    uint64_t created;
    bool store;
    cJSON *echo;              /* request fields the response object repeats */
    cJSON *messages;          /* the conversation, for the store (no instructions) */
    /* the answer */
    gw_sse_parser sse;
    bool sse_ready, started, done;
    int seq;                  /* sequence_number of the next event */
    int n_items;
    struct evbuffer *text;
    bool text_open;
    int text_index;
    call calls[MAX_CALLS];
    int n_calls;
    char finish[24];
    long in_tokens, out_tokens;
    char model[128];
};

/* ---- ids and small helpers ---------------------------------------------------------------- */

static void random_id(char *out, size_t cap, const char *prefix)
{
    unsigned char b[24];
    if (RAND_bytes(b, sizeof b) != 1)
        for (size_t i = 0; i < sizeof b; i++)
            b[i] = (unsigned char)(util_now_ns() >> (i % 8));
    size_t n = (size_t)snprintf(out, cap, "%s", prefix);
    for (size_t i = 0; i < sizeof b && n + 2 < cap; i++)
        n += (size_t)snprintf(out + n, cap - n, "%02x", b[i]);
}

static const char *tenant(const gw_req *r)
{
    return r->group != NULL ? r->group : "";
}

static gw_rstore *store_of(gw_req *r)
{
    if (r->srv->responses == NULL)
        r->srv->responses = gw_rstore_new();
    return r->srv->responses;
}

/* ---- the request --------------------------------------------------------------------------- */

typedef struct tr_err {
    char param[96];
    char msg[256];
    int status;
} tr_err;

static bool bad(tr_err *e, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static bool bad(tr_err *e, const char *param, const char *fmt, ...)
{
    snprintf(e->param, sizeof e->param, "%s", param);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    e->status = 400;
    return false;
}

/* A message item's content as chat content: a string, or parts. */
static bool content_of(const cJSON *c, const char *param, cJSON **out, tr_err *e)
{
    if (cJSON_IsString(c)) {
        *out = cJSON_CreateString(c->valuestring);
        return true;
    }
    if (!cJSON_IsArray(c))
        return bad(e, param, "Invalid type for '%s': expected a string or an array of content "
                   "parts.", param);
    cJSON *parts = cJSON_CreateArray();
    const cJSON *p;
    cJSON_ArrayForEach(p, c) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(p, "type");
        const char *t = cJSON_IsString(type) ? type->valuestring : "";
        if (!strcmp(t, "input_text") || !strcmp(t, "output_text") || !strcmp(t, "text")) {
            const cJSON *text = cJSON_GetObjectItemCaseSensitive(p, "text");
            if (!cJSON_IsString(text)) {
                cJSON_Delete(parts);
                return bad(e, param, "Invalid '%s': a text part needs a string 'text'.", param);
            }
            cJSON *q = cJSON_CreateObject();
            cJSON_AddStringToObject(q, "type", "text");
            cJSON_AddStringToObject(q, "text", text->valuestring);
            cJSON_AddItemToArray(parts, q);
        } else if (!strcmp(t, "input_image")) {
            const cJSON *url = cJSON_GetObjectItemCaseSensitive(p, "image_url");
            cJSON *q = cJSON_CreateObject(), *iu = cJSON_CreateObject();
            cJSON_AddStringToObject(q, "type", "image_url");
            cJSON_AddStringToObject(iu, "url", cJSON_IsString(url) ? url->valuestring : "");
            cJSON_AddItemToObject(q, "image_url", iu);
            cJSON_AddItemToArray(parts, q);
        } else if (!strcmp(t, "refusal")) {
            continue;
        } else {
            cJSON_Delete(parts);
            return bad(e, param, "Invalid content part type '%s': supported are input_text, "
                       "output_text and input_image.", t);
        }
    }
    *out = parts;
    return true;
}

/* Appends the Responses input (a string or items) to msgs as chat messages. */
static bool input_items(const cJSON *input, cJSON *msgs, tr_err *e)
{
    char param[64];
    if (cJSON_IsString(input)) {
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", "user");
        cJSON_AddStringToObject(m, "content", input->valuestring);
        cJSON_AddItemToArray(msgs, m);
        return true;
    }
    if (!cJSON_IsArray(input))
        return bad(e, "input", "Invalid type for 'input': expected a string or an array of "
                   "input items.");
    int i = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, input) {
        snprintf(param, sizeof param, "input[%d]", i++);
        if (!cJSON_IsObject(it))
            return bad(e, param, "Invalid type for '%s': expected an object.", param);
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(it, "type");
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(it, "role");
        const char *t = cJSON_IsString(type) ? type->valuestring : "message";
        if (!strcmp(t, "message")) {
            const char *rl = cJSON_IsString(role) ? role->valuestring : "";
            if (strcmp(rl, "user") && strcmp(rl, "system") && strcmp(rl, "developer") &&
                strcmp(rl, "assistant"))
                return bad(e, param, "Invalid '%s.role': expected user, system, developer or "
                           "assistant.", param);
            cJSON *content = NULL;
            char cparam[80];
            snprintf(cparam, sizeof cparam, "%s.content", param);
            if (!content_of(cJSON_GetObjectItemCaseSensitive(it, "content"), cparam, &content,
                            e))
                return false;
            cJSON *m = cJSON_CreateObject();
            cJSON_AddStringToObject(m, "role", rl);
            cJSON_AddItemToObject(m, "content", content);
            cJSON_AddItemToArray(msgs, m);
        } else if (!strcmp(t, "function_call")) {
            const cJSON *id = cJSON_GetObjectItemCaseSensitive(it, "call_id");
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(it, "name");
            const cJSON *args = cJSON_GetObjectItemCaseSensitive(it, "arguments");
            if (!cJSON_IsString(id) || !cJSON_IsString(name))
                return bad(e, param, "Invalid '%s': a function_call needs 'call_id' and "
                           "'name'.", param);
            /* Calls in a row are one assistant turn. */
            cJSON *last = cJSON_GetArrayItem(msgs, cJSON_GetArraySize(msgs) - 1);
            cJSON *calls = cJSON_GetObjectItemCaseSensitive(last, "tool_calls");
            if (calls == NULL) {
                last = cJSON_CreateObject();
                cJSON_AddStringToObject(last, "role", "assistant");
                cJSON_AddNullToObject(last, "content");
                calls = cJSON_AddArrayToObject(last, "tool_calls");
                cJSON_AddItemToArray(msgs, last);
            }
            cJSON *c = cJSON_CreateObject(), *fn = cJSON_CreateObject();
            cJSON_AddStringToObject(c, "id", id->valuestring);
            cJSON_AddStringToObject(c, "type", "function");
            cJSON_AddStringToObject(fn, "name", name->valuestring);
            cJSON_AddStringToObject(fn, "arguments",
                                    cJSON_IsString(args) ? args->valuestring : "{}");
            cJSON_AddItemToObject(c, "function", fn);
            cJSON_AddItemToArray(calls, c);
        } else if (!strcmp(t, "function_call_output")) {
            const cJSON *id = cJSON_GetObjectItemCaseSensitive(it, "call_id");
            const cJSON *out = cJSON_GetObjectItemCaseSensitive(it, "output");
            if (!cJSON_IsString(id) || !cJSON_IsString(out))
                return bad(e, param, "Invalid '%s': a function_call_output needs string "
                           "'call_id' and 'output'.", param);
            cJSON *m = cJSON_CreateObject();
            cJSON_AddStringToObject(m, "role", "tool");
            cJSON_AddStringToObject(m, "tool_call_id", id->valuestring);
            cJSON_AddStringToObject(m, "content", out->valuestring);
            cJSON_AddItemToArray(msgs, m);
        } else {
            return bad(e, param, "Input items of type '%s' are not supported: use messages, "
                       "function_call and function_call_output items.", t);
        }
    }
    return true;
}

/* Responses tools ({"type":"function","name",...}) as chat tools. */
static bool tools_of(const cJSON *tools, cJSON *chat, tr_err *e)
{
    if (tools == NULL)
        return true;
    if (!cJSON_IsArray(tools))
        return bad(e, "tools", "Invalid type for 'tools': expected an array.");
    cJSON *out = cJSON_AddArrayToObject(chat, "tools");
    int i = 0;
    const cJSON *t;
    cJSON_ArrayForEach(t, tools) {
        char param[48];
        snprintf(param, sizeof param, "tools[%d]", i++);
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(t, "type");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(t, "name");
        if (!cJSON_IsString(type) || strcmp(type->valuestring, "function") != 0)
            return bad(e, param, "Invalid '%s.type': this gateway serves function tools only.",
                       param);
        if (!cJSON_IsString(name))
            return bad(e, param, "Missing required parameter: '%s.name'.", param);
        cJSON *c = cJSON_CreateObject(), *fn = cJSON_CreateObject();
        cJSON_AddStringToObject(c, "type", "function");
        static const char *const keep[] = {"name", "description", "parameters", "strict"};
        for (size_t k = 0; k < 4; k++) {
            const cJSON *v = cJSON_GetObjectItemCaseSensitive(t, keep[k]);
            if (v != NULL && !cJSON_IsNull(v))
                cJSON_AddItemToObject(fn, keep[k], cJSON_Duplicate(v, true));
        }
        cJSON_AddItemToObject(c, "function", fn);
        cJSON_AddItemToArray(out, c);
    }
    return true;
}

static bool translate(gw_req *r, struct gw_resp_req *q, const cJSON *in, cJSON *chat, tr_err *e)
{
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(in, "model");
    if (!cJSON_IsString(model))
        return bad(e, "model", "Missing required parameter: 'model'.");
    cJSON_AddStringToObject(chat, "model", model->valuestring);
    snprintf(q->model, sizeof q->model, "%s", model->valuestring);
    cJSON *msgs = cJSON_AddArrayToObject(chat, "messages");
    const cJSON *ins = cJSON_GetObjectItemCaseSensitive(in, "instructions");
    if (ins != NULL && !cJSON_IsNull(ins)) {
        if (!cJSON_IsString(ins))
            return bad(e, "instructions", "Invalid type for 'instructions': expected a "
                       "string.");
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", "system");
        cJSON_AddStringToObject(m, "content", ins->valuestring);
        cJSON_AddItemToArray(msgs, m);
    }
    q->messages = cJSON_CreateArray();
    const cJSON *prev = cJSON_GetObjectItemCaseSensitive(in, "previous_response_id");
    if (prev != NULL && !cJSON_IsNull(prev)) {
        const char *resp, *history;
        if (!cJSON_IsString(prev) ||
            !gw_rstore_get(store_of(r), tenant(r), prev->valuestring, &resp, &history))
            return bad(e, "previous_response_id", "Previous response with id '%.64s' not "
                       "found.", cJSON_IsString(prev) ? prev->valuestring : "");
        cJSON *h = cJSON_Parse(history);
        const cJSON *m;
        cJSON_ArrayForEach(m, h)
            cJSON_AddItemToArray(q->messages, cJSON_Duplicate(m, true));
        cJSON_Delete(h);
    }
    const cJSON *input = cJSON_GetObjectItemCaseSensitive(in, "input");
    if (input == NULL)
        return bad(e, "input", "Missing required parameter: 'input'.");
    if (!input_items(input, q->messages, e))
        return false;
    const cJSON *m;
    cJSON_ArrayForEach(m, q->messages)
        cJSON_AddItemToArray(msgs, cJSON_Duplicate(m, true));
    const cJSON *mot = cJSON_GetObjectItemCaseSensitive(in, "max_output_tokens");
    if (cJSON_IsNumber(mot))
        cJSON_AddNumberToObject(chat, "max_completion_tokens", mot->valuedouble);
    else if (mot != NULL && !cJSON_IsNull(mot))
        return bad(e, "max_output_tokens", "Invalid type for 'max_output_tokens': expected an "
                   "integer.");
    static const char *const same[] = {"temperature", "top_p", "user", "parallel_tool_calls",
                                       "seed"};
    for (size_t i = 0; i < sizeof same / sizeof *same; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(in, same[i]);
        if (v != NULL && !cJSON_IsNull(v))
            cJSON_AddItemToObject(chat, same[i], cJSON_Duplicate(v, true));
    }
    const cJSON *format = cJSON_GetObjectItemCaseSensitive(
        cJSON_GetObjectItemCaseSensitive(in, "text"), "format");
    if (format != NULL) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(format, "type");
        const char *t = cJSON_IsString(type) ? type->valuestring : "";
        if (!strcmp(t, "json_schema")) {
            cJSON *rf = cJSON_AddObjectToObject(chat, "response_format"),
                  *js = cJSON_CreateObject();
            cJSON_AddStringToObject(rf, "type", "json_schema");
            static const char *const keep[] = {"name", "schema", "strict", "description"};
            for (size_t k = 0; k < 4; k++) {
                const cJSON *v = cJSON_GetObjectItemCaseSensitive(format, keep[k]);
                if (v != NULL && !cJSON_IsNull(v))
                    cJSON_AddItemToObject(js, keep[k], cJSON_Duplicate(v, true));
            }
            cJSON_AddItemToObject(rf, "json_schema", js);
        } else if (!strcmp(t, "json_object")) {
            cJSON *rf = cJSON_AddObjectToObject(chat, "response_format");
            cJSON_AddStringToObject(rf, "type", "json_object");
        } else if (strcmp(t, "text") != 0) {
            return bad(e, "text.format.type", "Invalid value for 'text.format.type': expected "
                       "text, json_object or json_schema.");
        }
    }
    if (!tools_of(cJSON_GetObjectItemCaseSensitive(in, "tools"), chat, e))
        return false;
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(in, "tool_choice");
    if (cJSON_IsString(tc)) {
        cJSON_AddStringToObject(chat, "tool_choice", tc->valuestring);
    } else if (cJSON_IsObject(tc)) {
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(tc, "name");
        if (!cJSON_IsString(name))
            return bad(e, "tool_choice", "Invalid 'tool_choice': expected {\"type\": "
                       "\"function\", \"name\": ...}.");
        cJSON *c = cJSON_AddObjectToObject(chat, "tool_choice"), *fn = cJSON_CreateObject();
        cJSON_AddStringToObject(c, "type", "function");
        cJSON_AddStringToObject(fn, "name", name->valuestring);
        cJSON_AddItemToObject(c, "function", fn);
    }
    const cJSON *stream = cJSON_GetObjectItemCaseSensitive(in, "stream");
    if (cJSON_IsTrue(stream)) {
        cJSON_AddTrueToObject(chat, "stream");
        cJSON_AddTrueToObject(cJSON_AddObjectToObject(chat, "stream_options"), "include_usage");
    }
    q->store = !cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(in, "store"));
    /* What the response object repeats. */
    q->echo = cJSON_CreateObject();
    static const char *const echo[] = {"instructions", "max_output_tokens", "temperature",
                                       "top_p", "tool_choice", "tools", "parallel_tool_calls",
                                       "previous_response_id", "metadata", "user", "text"};
    for (size_t i = 0; i < sizeof echo / sizeof *echo; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(in, echo[i]);
        cJSON_AddItemToObject(q->echo, echo[i], v ? cJSON_Duplicate(v, true) : cJSON_CreateNull());
    }
    return true;
}

/* A buffer's bytes as a malloc'd string (NULL buffer: ""). */
static char *buf_str(struct evbuffer *b)
{
    size_t n = b ? evbuffer_get_length(b) : 0;
    return util_xstrndup(n ? (const char *)evbuffer_pullup(b, -1) : "", n);
}

/* ---- the response object ------------------------------------------------------------------- */

/* The message item; its output_text part holds text (none while text is NULL). */
static cJSON *text_item(struct gw_resp_req *q, const char *text, const char *status)
{
    cJSON *it = cJSON_CreateObject(), *content = cJSON_CreateArray();
    cJSON_AddStringToObject(it, "type", "message");
    cJSON_AddStringToObject(it, "id", q->msg_id);
    cJSON_AddStringToObject(it, "status", status);
    cJSON_AddStringToObject(it, "role", "assistant");
    if (text != NULL) {
        cJSON *part = cJSON_CreateObject();
        cJSON_AddStringToObject(part, "type", "output_text");
        cJSON_AddStringToObject(part, "text", text);
        cJSON_AddArrayToObject(part, "annotations");
        cJSON_AddItemToArray(content, part);
    }
    cJSON_AddItemToObject(it, "content", content);
    return it;
}

static cJSON *call_item(const call *c, const char *status)
{
    cJSON *it = cJSON_CreateObject();
    char *args = buf_str(c->args);
    cJSON_AddStringToObject(it, "type", "function_call");
    cJSON_AddStringToObject(it, "id", c->item_id);
    cJSON_AddStringToObject(it, "call_id", c->id ? c->id : "");
    cJSON_AddStringToObject(it, "name", c->name ? c->name : "");
    cJSON_AddStringToObject(it, "arguments", args);
    cJSON_AddStringToObject(it, "status", status);
    free(args);
    return it;
}

/* The output items of what was answered, in order. */
static cJSON *output_of(struct gw_resp_req *q)
{
    cJSON *out = cJSON_CreateArray();
    char *text = buf_str(q->text);
    for (int k = 0; k <= q->n_items; k++) {
        if (q->text_open && q->text_index == k)
            cJSON_AddItemToArray(out, text_item(q, text, "completed"));
        for (int i = 0; i < q->n_calls; i++)
            if (q->calls[i].output_index == k)
                cJSON_AddItemToArray(out, call_item(&q->calls[i], "completed"));
    }
    free(text);
    return out;
}

static cJSON *response_object(struct gw_resp_req *q, const char *status, bool whole)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", q->id);
    cJSON_AddStringToObject(o, "object", "response");
    cJSON_AddNumberToObject(o, "created_at", (double)q->created);
    bool cut = whole && !strcmp(q->finish, "length");
    cJSON_AddStringToObject(o, "status", cut ? "incomplete" : status);
    cJSON_AddNullToObject(o, "error");
    if (cut)
        cJSON_AddStringToObject(cJSON_AddObjectToObject(o, "incomplete_details"), "reason",
                                "max_output_tokens");
    else
        cJSON_AddNullToObject(o, "incomplete_details");
    cJSON_AddStringToObject(o, "model", q->model);
    cJSON_AddItemToObject(o, "output", whole ? output_of(q) : cJSON_CreateArray());
    const cJSON *e;
    cJSON_ArrayForEach(e, q->echo) {
        if (!strcmp(e->string, "parallel_tool_calls") && cJSON_IsNull(e))
            cJSON_AddTrueToObject(o, e->string);
        else if (!strcmp(e->string, "tools") && cJSON_IsNull(e))
            cJSON_AddArrayToObject(o, e->string);
        else if (!strcmp(e->string, "tool_choice") && cJSON_IsNull(e))
            cJSON_AddStringToObject(o, e->string, "auto");
        else if (!strcmp(e->string, "metadata") && cJSON_IsNull(e))
            cJSON_AddObjectToObject(o, e->string);
        else if (!strcmp(e->string, "text") && cJSON_IsNull(e))
            cJSON_AddStringToObject(cJSON_AddObjectToObject(cJSON_AddObjectToObject(o, "text"),
                                                            "format"), "type", "text");
        else
            cJSON_AddItemToObject(o, e->string, cJSON_Duplicate(e, true));
    }
    cJSON_AddBoolToObject(o, "store", q->store);
    cJSON_AddStringToObject(o, "truncation", "disabled");
    if (whole) {
        cJSON *u = cJSON_AddObjectToObject(o, "usage");
        cJSON_AddNumberToObject(u, "input_tokens", (double)q->in_tokens);
        cJSON_AddNumberToObject(cJSON_AddObjectToObject(u, "input_tokens_details"),
                                "cached_tokens", 0);
        cJSON_AddNumberToObject(u, "output_tokens", (double)q->out_tokens);
        cJSON_AddNumberToObject(cJSON_AddObjectToObject(u, "output_tokens_details"),
                                "reasoning_tokens", 0);
        cJSON_AddNumberToObject(u, "total_tokens", (double)(q->in_tokens + q->out_tokens));
    } else {
        cJSON_AddNullToObject(o, "usage");
    }
    return o;
}

/* The answer's assistant turn as a chat message, appended to the stored conversation. */
static void remember(gw_req *r, struct gw_resp_req *q, const cJSON *resp)
{
    if (!q->store)
        return;
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", "assistant");
    if (q->text_open) {
        char *s = buf_str(q->text);
        cJSON_AddStringToObject(m, "content", s);
        free(s);
    } else {
        cJSON_AddNullToObject(m, "content");
    }
    if (q->n_calls > 0) {
        cJSON *calls = cJSON_AddArrayToObject(m, "tool_calls");
        for (int i = 0; i < q->n_calls; i++) {
            cJSON *c = cJSON_CreateObject(), *fn = cJSON_CreateObject();
            char *args = buf_str(q->calls[i].args);
            cJSON_AddStringToObject(c, "id", q->calls[i].id ? q->calls[i].id : "");
            cJSON_AddStringToObject(c, "type", "function");
            cJSON_AddStringToObject(fn, "name", q->calls[i].name ? q->calls[i].name : "");
            cJSON_AddStringToObject(fn, "arguments", args);
            cJSON_AddItemToObject(c, "function", fn);
            cJSON_AddItemToArray(calls, c);
            free(args);
        }
    }
    cJSON_AddItemToArray(q->messages, m);
    char *rtext = cJSON_PrintUnformatted(resp), *mtext = cJSON_PrintUnformatted(q->messages);
    if (rtext != NULL && mtext != NULL)
        gw_rstore_put(store_of(r), tenant(r), q->id, rtext, mtext);
    cJSON_free(rtext);
    cJSON_free(mtext);
}

static call *call_at(struct gw_resp_req *q, int index)
{
    if (index < 0 || index >= MAX_CALLS)
        return NULL;
    while (q->n_calls <= index) {
        call *c = &q->calls[q->n_calls++];
        memset(c, 0, sizeof *c);
        c->args = evbuffer_new();
        c->output_index = -1;
        random_id(c->item_id, sizeof c->item_id, "fc_");
    }
    return &q->calls[index];
}

/* A number field as a count (0 when absent or not a number). */
static long count(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(v) && v->valuedouble >= 0 && v->valuedouble < 1e15 ? (long)v->valuedouble
                                                                           : 0;
}

static void set_str(char **dst, const cJSON *v)
{
    if (cJSON_IsString(v) && *dst == NULL)
        *dst = util_xstrdup(v->valuestring);
}

/* A whole chat.completion read into the answer's state. */
static bool read_completion(struct gw_resp_req *q, const cJSON *o)
{
    const cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(o, "choices"), 0);
    const cJSON *msg = cJSON_GetObjectItemCaseSensitive(ch, "message");
    if (!cJSON_IsObject(msg))
        return false;
    const cJSON *content = cJSON_GetObjectItemCaseSensitive(msg, "content");
    if (cJSON_IsString(content)) {
        q->text = evbuffer_new();
        evbuffer_add(q->text, content->valuestring, strlen(content->valuestring));
        q->text_open = true;
        q->text_index = q->n_items++;
    }
    const cJSON *c;
    int i = 0;
    cJSON_ArrayForEach(c, cJSON_GetObjectItemCaseSensitive(msg, "tool_calls")) {
        call *k = call_at(q, i++);
        if (k == NULL)
            break;
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(c, "function");
        set_str(&k->id, cJSON_GetObjectItemCaseSensitive(c, "id"));
        set_str(&k->name, cJSON_GetObjectItemCaseSensitive(fn, "name"));
        const cJSON *args = cJSON_GetObjectItemCaseSensitive(fn, "arguments");
        if (cJSON_IsString(args))
            evbuffer_add(k->args, args->valuestring, strlen(args->valuestring));
        k->output_index = q->n_items++;
    }
    const cJSON *fr = cJSON_GetObjectItemCaseSensitive(ch, "finish_reason");
    snprintf(q->finish, sizeof q->finish, "%s", cJSON_IsString(fr) ? fr->valuestring : "stop");
    const cJSON *u = cJSON_GetObjectItemCaseSensitive(o, "usage");
    q->in_tokens = count(u, "prompt_tokens");
    q->out_tokens = count(u, "completion_tokens");
    return true;
}

/* ---- the wrapped transport ------------------------------------------------------------------ */

static const char *w_header(gw_req *r, const char *name)
{
    return r->resp->inner->header(r, name);
}

static void w_add_header(gw_req *r, const char *name, const char *value)
{
    r->resp->inner->add_header(r, name, value);
}

static void w_send(gw_req *r, int status, struct evbuffer *body)
{
    struct gw_resp_req *q = r->resp;
    if (status != 200) {
        q->inner->send(r, status, body);
        return;
    }
    size_t n = evbuffer_get_length(body);
    cJSON *o = cJSON_ParseWithLength((const char *)evbuffer_pullup(body, -1), n);
    if (o == NULL || !read_completion(q, o)) {
        cJSON_Delete(o);
        q->inner->send(r, status, body);
        return;
    }
    cJSON_Delete(o);
    cJSON *resp = response_object(q, "completed", true);
    remember(r, q, resp);
    char *text = cJSON_PrintUnformatted(resp);
    cJSON_Delete(resp);
    evbuffer_drain(body, n);
    evbuffer_add(body, text, strlen(text));
    evbuffer_add(body, "\n", 1);
    cJSON_free(text);
    q->inner->send(r, status, body);
}

/* One Responses event: "event: TYPE" and its data (o, consumed: sequence_number added). */
static void emit(gw_req *r, const char *type, cJSON *o)
{
    struct gw_resp_req *q = r->resp;
    cJSON_AddStringToObject(o, "type", type);
    cJSON_AddNumberToObject(o, "sequence_number", q->seq++);
    char *data = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    struct evbuffer *b = evbuffer_new();
    evbuffer_add_printf(b, "event: %s\n", type);
    gw_sse_write(b, data, strlen(data));
    cJSON_free(data);
    q->inner->chunk(r, b);
    evbuffer_free(b);
}

static void emit_response(gw_req *r, const char *type, const char *status, bool whole)
{
    cJSON *o = cJSON_CreateObject();
    cJSON *resp = response_object(r->resp, status, whole);
    if (whole)
        remember(r, r->resp, resp);
    cJSON_AddItemToObject(o, "response", resp);
    emit(r, type, o);
}

static cJSON *at(const char *item_id, int output_index)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "item_id", item_id);
    cJSON_AddNumberToObject(o, "output_index", output_index);
    return o;
}

static void text_delta(gw_req *r, const char *s, size_t len)
{
    struct gw_resp_req *q = r->resp;
    if (!q->text_open) {
        q->text_open = true;
        q->text_index = q->n_items++;
        q->text = evbuffer_new();
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "output_index", q->text_index);
        cJSON_AddItemToObject(o, "item", text_item(q, NULL, "in_progress"));
        emit(r, "response.output_item.added", o);
        o = at(q->msg_id, q->text_index);
        cJSON_AddNumberToObject(o, "content_index", 0);
        cJSON *part = cJSON_AddObjectToObject(o, "part");
        cJSON_AddStringToObject(part, "type", "output_text");
        cJSON_AddStringToObject(part, "text", "");
        cJSON_AddArrayToObject(part, "annotations");
        emit(r, "response.content_part.added", o);
    }
    if (len == 0)
        return;
    evbuffer_add(q->text, s, len);
    cJSON *o = at(q->msg_id, q->text_index);
    cJSON_AddNumberToObject(o, "content_index", 0);
    char *d = util_xstrndup(s, len);
    cJSON_AddStringToObject(o, "delta", d);
    free(d);
    emit(r, "response.output_text.delta", o);
}

static void call_delta(gw_req *r, const cJSON *tc)
{
    struct gw_resp_req *q = r->resp;
    const cJSON *idx = cJSON_GetObjectItemCaseSensitive(tc, "index");
    call *c = call_at(q, cJSON_IsNumber(idx) ? (int)idx->valuedouble : 0);
    if (c == NULL)
        return;
    const cJSON *fn = cJSON_GetObjectItemCaseSensitive(tc, "function");
    set_str(&c->id, cJSON_GetObjectItemCaseSensitive(tc, "id"));
    set_str(&c->name, cJSON_GetObjectItemCaseSensitive(fn, "name"));
    if (c->output_index < 0) {
        c->output_index = q->n_items++;
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "output_index", c->output_index);
        cJSON_AddItemToObject(o, "item", call_item(c, "in_progress"));
        emit(r, "response.output_item.added", o);
    }
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(fn, "arguments");
    if (cJSON_IsString(args) && args->valuestring[0] != '\0') {
        evbuffer_add(c->args, args->valuestring, strlen(args->valuestring));
        cJSON *o = at(c->item_id, c->output_index);
        cJSON_AddStringToObject(o, "delta", args->valuestring);
        emit(r, "response.function_call_arguments.delta", o);
    }
}

/* The answer is over: every open item closes, then response.completed. */
static void finish_stream(gw_req *r)
{
    struct gw_resp_req *q = r->resp;
    if (q->done)
        return;
    q->done = true;
    if (q->text_open) {
        char *s = buf_str(q->text);
        cJSON *o = at(q->msg_id, q->text_index);
        cJSON_AddNumberToObject(o, "content_index", 0);
        cJSON_AddStringToObject(o, "text", s);
        emit(r, "response.output_text.done", o);
        o = at(q->msg_id, q->text_index);
        cJSON_AddNumberToObject(o, "content_index", 0);
        cJSON *part = cJSON_AddObjectToObject(o, "part");
        cJSON_AddStringToObject(part, "type", "output_text");
        cJSON_AddStringToObject(part, "text", s);
        cJSON_AddArrayToObject(part, "annotations");
        emit(r, "response.content_part.done", o);
        o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "output_index", q->text_index);
        cJSON_AddItemToObject(o, "item", text_item(q, s, "completed"));
        emit(r, "response.output_item.done", o);
        free(s);
    }
    for (int i = 0; i < q->n_calls; i++) {
        call *c = &q->calls[i];
        char *args = buf_str(c->args);
        cJSON *o = at(c->item_id, c->output_index);
        cJSON_AddStringToObject(o, "arguments", args);
        emit(r, "response.function_call_arguments.done", o);
        free(args);
        o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "output_index", c->output_index);
        cJSON_AddItemToObject(o, "item", call_item(c, "completed"));
        emit(r, "response.output_item.done", o);
    }
    emit_response(r, strcmp(q->finish, "length") ? "response.completed"
                                                : "response.incomplete", "completed", true);
}

/* One chat chunk (or [DONE], or an error) of the wrapped stream. */
static int on_chat_event(void *arg, const char *event, const char *data, size_t len)
{
    gw_req *r = arg;
    struct gw_resp_req *q = r->resp;
    (void)event;
    if (q->done)
        return 0;
    if (len == 6 && !memcmp(data, "[DONE]", 6)) {
        finish_stream(r);
        return 0;
    }
    cJSON *o = cJSON_ParseWithLength(data, len);
    const cJSON *err = cJSON_GetObjectItemCaseSensitive(o, "error");
    if (err != NULL) {
        cJSON *e = cJSON_CreateObject();
        static const char *const keep[] = {"message", "type", "code", "param"};
        for (size_t k = 0; k < 4; k++) {
            const cJSON *v = cJSON_GetObjectItemCaseSensitive(err, keep[k]);
            cJSON_AddItemToObject(e, keep[k], v ? cJSON_Duplicate(v, true) : cJSON_CreateNull());
        }
        emit(r, "error", e);
        q->done = true;
        cJSON_Delete(o);
        return 0;
    }
    const cJSON *u = cJSON_GetObjectItemCaseSensitive(o, "usage");
    if (cJSON_IsObject(u)) {
        q->in_tokens = count(u, "prompt_tokens");
        q->out_tokens = count(u, "completion_tokens");
    }
    const cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(o, "choices"), 0);
    const cJSON *delta = cJSON_GetObjectItemCaseSensitive(ch, "delta");
    const cJSON *content = cJSON_GetObjectItemCaseSensitive(delta, "content");
    if (cJSON_IsString(content) && (content->valuestring[0] != '\0' || !q->text_open))
        text_delta(r, content->valuestring, strlen(content->valuestring));
    const cJSON *tc;
    cJSON_ArrayForEach(tc, cJSON_GetObjectItemCaseSensitive(delta, "tool_calls"))
        call_delta(r, tc);
    const cJSON *fr = cJSON_GetObjectItemCaseSensitive(ch, "finish_reason");
    if (cJSON_IsString(fr))
        snprintf(q->finish, sizeof q->finish, "%s", fr->valuestring);
    cJSON_Delete(o);
    return 0;
}

static void w_start(gw_req *r, int status)
{
    struct gw_resp_req *q = r->resp;
    q->inner->start(r, status);
    q->started = true;
    emit_response(r, "response.created", "in_progress", false);
    emit_response(r, "response.in_progress", "in_progress", false);
}

static void w_chunk(gw_req *r, struct evbuffer *data)
{
    struct gw_resp_req *q = r->resp;
    if (!q->sse_ready) {
        gw_sse_parser_init(&q->sse, MAX_EVENT);
        q->sse_ready = true;
    }
    struct evbuffer_iovec v[16];
    int n = evbuffer_peek(data, -1, NULL, v, 16);
    for (int i = 0; i < n && i < 16; i++)
        if (gw_sse_parser_feed(&q->sse, v[i].iov_base, v[i].iov_len, on_chat_event, r) != 0)
            break;
    evbuffer_drain(data, evbuffer_get_length(data));
}

static void w_end(gw_req *r)
{
    struct gw_resp_req *q = r->resp;
    if (q->started && !q->done)
        finish_stream(r);
    q->inner->end(r);
}

static const gw_transport wrapped = {w_header, w_add_header, w_send, w_start, w_chunk, w_end};

/* ---- the endpoints -------------------------------------------------------------------------- */

bool gw_responses_begin(gw_req *r, const char *body, size_t len, const char **chat,
                        size_t *chat_len)
{
    struct gw_resp_req *q = util_arena_alloc(&r->arena, sizeof *q);
    memset(q, 0, sizeof *q);
    r->resp = q;
    q->inner = r->io;
    q->created = util_wall_ms() / 1000;
    random_id(q->id, sizeof q->id, "resp_");
    random_id(q->msg_id, sizeof q->msg_id, "msg_");
    cJSON *in = cJSON_ParseWithLength(body, len);
    if (!cJSON_IsObject(in)) {
        cJSON_Delete(in);
        gw_reply_error(r, 400, "invalid_request_error", NULL, NULL,
                       "We could not parse the JSON body of your request: it must be a JSON "
                       "object.");
        return false;
    }
    cJSON *out = cJSON_CreateObject();
    tr_err e = {.status = 0};
    bool ok = translate(r, q, in, out, &e);
    cJSON_Delete(in);
    if (!ok) {
        cJSON_Delete(out);
        gw_reply_error(r, e.status, "invalid_request_error", e.param, NULL, "%s", e.msg);
        return false;
    }
    char *text = cJSON_PrintUnformatted(out);
    cJSON_Delete(out);
    *chat_len = strlen(text);
    *chat = util_arena_strndup(&r->arena, text, *chat_len);
    cJSON_free(text);
    r->io = &wrapped;   /* from now on the answer leaves as a Responses answer */
    return true;
}

void gw_responses_get(gw_req *r, const char *id)
{
    const char *resp, *messages;
    if (!gw_rstore_get(store_of(r), tenant(r), id, &resp, &messages)) {
        gw_reply_error(r, 404, "invalid_request_error", NULL, NULL,
                       "Response with id '%.64s' not found.", id);
        return;
    }
    struct evbuffer *b = evbuffer_new();
    evbuffer_add(b, resp, strlen(resp));
    evbuffer_add(b, "\n", 1);
    gw_reply_body(r, 200, "application/json", b);
    evbuffer_free(b);
}

void gw_responses_delete(gw_req *r, const char *id)
{
    if (!gw_rstore_delete(store_of(r), tenant(r), id)) {
        gw_reply_error(r, 404, "invalid_request_error", NULL, NULL,
                       "Response with id '%.64s' not found.", id);
        return;
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", id);
    cJSON_AddStringToObject(o, "object", "response");
    cJSON_AddTrueToObject(o, "deleted");
    gw_reply_json(r, 200, o);
}

void gw_responses_release(gw_req *r)
{
    struct gw_resp_req *q = r->resp;
    if (q == NULL)
        return;
    if (q->sse_ready)
        gw_sse_parser_deinit(&q->sse);
    if (q->text != NULL)
        evbuffer_free(q->text);
    for (int i = 0; i < q->n_calls; i++) {
        evbuffer_free(q->calls[i].args);
        free(q->calls[i].id);
        free(q->calls[i].name);
    }
    cJSON_Delete(q->echo);
    cJSON_Delete(q->messages);
    r->resp = NULL;
}
