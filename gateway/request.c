/* gateway/request.c: OpenAI request validation. The messages follow the API's own wording
 * ("Invalid type for 'temperature': expected a number, but got a string instead.") so that SDK
 * users see what they would see from the real API. */
#include "gateway/request.h"

#include "common/err.h"
#include "gateway/json.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define INVALID "invalid_request_error"

static int fail(gw_req_error *e, const char *param, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int fail(gw_req_error *e, const char *param, const char *code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    e->status = 400;
    e->type = INVALID;
    snprintf(e->param, sizeof e->param, "%s", param != NULL ? param : "");
    e->code = code;
    return LLMGW_EINVAL;
}

static const char *json_type_name(const cJSON *v)
{
    if (cJSON_IsString(v)) return "a string";
    if (cJSON_IsNumber(v)) return "a number";
    if (cJSON_IsBool(v)) return "a boolean";
    if (cJSON_IsArray(v)) return "an array";
    if (cJSON_IsObject(v)) return "an object";
    if (cJSON_IsNull(v)) return "null";
    return "an unknown value";
}

static int wrong_type(gw_req_error *e, const char *param, const char *expected, const cJSON *v)
{
    return fail(e, param, "invalid_type",
                "Invalid type for '%s': expected %s, but got %s instead.", param, expected,
                json_type_name(v));
}

bool gw_utf8_valid(const char *str, size_t len)
{
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0;
    while (i < len) {
        unsigned c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t n;
        unsigned cp;
        if (c >= 0xc2 && c <= 0xdf) { n = 1; cp = c & 0x1f; }
        else if (c >= 0xe0 && c <= 0xef) { n = 2; cp = c & 0x0f; }
        else if (c >= 0xf0 && c <= 0xf4) { n = 3; cp = c & 0x07; }
        else return false;
        if (len - i <= n)
            return false;
        for (size_t k = 1; k <= n; k++) {
            if ((s[i + k] & 0xc0) != 0x80)
                return false;
            cp = (cp << 6) | (s[i + k] & 0x3f);
        }
        if ((n == 2 && cp < 0x800) || (n == 3 && (cp < 0x10000 || cp > 0x10ffff)) ||
            (cp >= 0xd800 && cp <= 0xdfff))
            return false;
        i += n + 1;
    }
    return true;
}

/* Optional-field getters: absent or null leaves the output untouched and returns 0. */

static const cJSON *field(const cJSON *obj, const char *name)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, name);
    return (v == NULL || cJSON_IsNull(v)) ? NULL : v;
}

static int opt_number(const cJSON *obj, const char *name, double lo, double hi, bool *has,
                      double *out, gw_req_error *e)
{
    const cJSON *v = field(obj, name);
    if (v == NULL)
        return 0;
    if (!cJSON_IsNumber(v))
        return wrong_type(e, name, "a decimal", v);
    if (!(v->valuedouble >= lo && v->valuedouble <= hi))
        return fail(e, name, "decimal_out_of_range",
                    "Invalid '%s': %g is out of range; expected a value between %g and %g.", name,
                    v->valuedouble, lo, hi);
    if (has != NULL)
        *has = true;
    *out = v->valuedouble;
    return 0;
}

static int opt_int(const cJSON *obj, const char *name, double lo, double hi, bool *has,
                   int64_t *out, gw_req_error *e)
{
    const cJSON *v = field(obj, name);
    if (v == NULL)
        return 0;
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || !isfinite(v->valuedouble))
        return wrong_type(e, name, "an integer", v);
    if (v->valuedouble < lo)
        return fail(e, name, "integer_below_min_value",
                    "Invalid '%s': integer below minimum value. Expected a value >= %.0f, but "
                    "got %.0f instead.", name, lo, v->valuedouble);
    if (v->valuedouble > hi)
        return fail(e, name, "integer_above_max_value",
                    "Invalid '%s': integer above maximum value. Expected a value <= %.0f, but "
                    "got %.0f instead.", name, hi, v->valuedouble);
    if (has != NULL)
        *has = true;
    *out = (int64_t)v->valuedouble;
    return 0;
}

static int opt_bool(const cJSON *obj, const char *name, bool *out, gw_req_error *e)
{
    const cJSON *v = field(obj, name);
    if (v == NULL)
        return 0;
    if (!cJSON_IsBool(v))
        return wrong_type(e, name, "a boolean", v);
    *out = cJSON_IsTrue(v);
    return 0;
}

static int opt_string(const cJSON *obj, const char *name, const char **out, gw_req_error *e)
{
    const cJSON *v = field(obj, name);
    if (v == NULL)
        return 0;
    if (!cJSON_IsString(v))
        return wrong_type(e, name, "a string", v);
    *out = v->valuestring;
    return 0;
}

static int opt_object(const cJSON *obj, const char *name, bool *has, gw_req_error *e)
{
    const cJSON *v = field(obj, name);
    if (v == NULL)
        return 0;
    if (!cJSON_IsObject(v))
        return wrong_type(e, name, "an object", v);
    if (has != NULL)
        *has = true;
    return 0;
}

/* "messages.[i]<suffix>" into param (48 bytes), without printf: it runs for every message of
 * every request, and printf is slow in this process (see gateway/api.c). */
static const char *mparam(char *param, size_t i, const char *suffix)
{
    static const char head[] = "messages.[";
    char digits[24];
    size_t n = 0;
    do {
        digits[n++] = (char)('0' + i % 10);
        i /= 10;
    } while (i != 0);
    size_t at = sizeof head - 1;
    memcpy(param, head, at);
    while (n > 0)
        param[at++] = digits[--n];
    param[at++] = ']';
    size_t k = strlen(suffix);
    if (k > 47 - at)
        k = 47 - at;
    memcpy(param + at, suffix, k);
    param[at + k] = '\0';
    return param;
}

/* Joins the text parts of a message's content (a string or an array of parts) into the arena.
 * Non-text parts (images, audio, files) are checked for shape and passed upstream untouched. */
static int message_content(const cJSON *content, size_t idx, gw_message *m, util_arena *arena,
                           gw_req_error *e)
{
    char param[48];
    mparam(param, idx, ".content");
    if (cJSON_IsString(content)) {
        m->text = content->valuestring;
        m->text_len = strlen(content->valuestring);
        return 0;
    }
    if (!cJSON_IsArray(content))
        return wrong_type(e, param, "a string or an array of content parts", content);
    size_t total = 0, n_parts = 0;
    const cJSON *part;
    cJSON_ArrayForEach(part, content) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
        if (!cJSON_IsObject(part) || !cJSON_IsString(type))
            return fail(e, param, "invalid_type",
                        "Invalid '%s': each content part must be an object with a string 'type'.",
                        param);
        const char *t = type->valuestring;
        if (!strcmp(t, "text") || !strcmp(t, "refusal")) {
            const cJSON *text = cJSON_GetObjectItemCaseSensitive(part, t);
            if (!cJSON_IsString(text))
                return fail(e, param, "invalid_type",
                            "Invalid '%s': a '%s' part needs a string '%s'.", param, t, t);
            total += strlen(text->valuestring) + 1;
        } else if (!strcmp(t, "image_url") || !strcmp(t, "input_audio") || !strcmp(t, "file")) {
            if (!cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(part, t)))
                return fail(e, param, "invalid_type",
                            "Invalid '%s': an '%s' part needs an object '%s'.", param, t, t);
            if (m->media_part < 0) {
                m->media_part = (int)n_parts;
                m->media_type = t[0] == 'i' ? (t[1] == 'm' ? "image_url" : "input_audio")
                                            : "file";
            }
        } else {
            return fail(e, param, "invalid_value",
                        "Invalid value for '%s.type': '%s' is not one of text, image_url, "
                        "input_audio, file, refusal.", param, t);
        }
        n_parts++;
    }
    if (n_parts == 0 && strcmp(m->role, "assistant") != 0)
        return fail(e, param, "empty_array",
                    "Invalid '%s': empty array. Expected an array with minimum length 1.", param);
    char *text = util_arena_alloc(arena, total + 1), *w = text;
    cJSON_ArrayForEach(part, content) {
        const char *t = cJSON_GetObjectItemCaseSensitive(part, "type")->valuestring;
        const cJSON *tx = cJSON_GetObjectItemCaseSensitive(part, t);
        if (!cJSON_IsString(tx))
            continue;
        size_t l = strlen(tx->valuestring);
        if (w != text)
            *w++ = '\n';
        memcpy(w, tx->valuestring, l);
        w += l;
    }
    *w = '\0';
    m->text = text;
    m->text_len = (size_t)(w - text);
    return 0;
}

static int parse_messages(gw_request *r, const cJSON *root, util_arena *arena, gw_req_error *e)
{
    static const char *roles[] = {"system", "developer", "user", "assistant", "tool", "function"};
    char param[48];
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(root, "messages");
    if (msgs == NULL)
        return fail(e, "messages", "missing_required_parameter",
                    "Missing required parameter: 'messages'.");
    if (!cJSON_IsArray(msgs))
        return wrong_type(e, "messages", "an array", msgs);
    int n = cJSON_GetArraySize(msgs);
    if (n == 0)
        return fail(e, "messages", "empty_array",
                    "Invalid 'messages': empty array. Expected an array with minimum length 1, "
                    "but got an empty array instead.");
    r->messages = util_arena_alloc(arena, (size_t)n * sizeof *r->messages);
    r->n_messages = 0;
    const cJSON *msg;
    cJSON_ArrayForEach(msg, msgs) {
        size_t i = r->n_messages;
        gw_message *m = &r->messages[i];
        memset(m, 0, sizeof *m);
        m->text = "";
        m->media_part = -1;
        mparam(param, i, "");
        if (!cJSON_IsObject(msg))
            return wrong_type(e, param, "an object", msg);
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(msg, "role");
        mparam(param, i, ".role");
        if (role == NULL)
            return fail(e, param, "missing_required_parameter",
                        "Missing required parameter: '%s'.", param);
        if (!cJSON_IsString(role))
            return wrong_type(e, param, "a string", role);
        for (size_t k = 0; k < sizeof roles / sizeof roles[0] && m->role == NULL; k++)
            if (!strcmp(role->valuestring, roles[k]))
                m->role = roles[k];
        if (m->role == NULL)
            return fail(e, param, "invalid_value",
                        "Invalid value: '%.64s'. Supported values are: 'system', 'developer', "
                        "'user', 'assistant', 'tool' and 'function'.", role->valuestring);
        const cJSON *tool_calls = field(msg, "tool_calls");
        if (tool_calls != NULL) {
            mparam(param, i, ".tool_calls");
            if (!cJSON_IsArray(tool_calls))
                return wrong_type(e, param, "an array", tool_calls);
            m->has_tool_calls = cJSON_GetArraySize(tool_calls) > 0;
        }
        const cJSON *name = field(msg, "name");
        if (name != NULL && !cJSON_IsString(name)) {
            mparam(param, i, ".name");
            return wrong_type(e, param, "a string", name);
        }
        if (m->role == roles[4]) {
            const cJSON *id = cJSON_GetObjectItemCaseSensitive(msg, "tool_call_id");
            mparam(param, i, ".tool_call_id");
            if (!cJSON_IsString(id))
                return fail(e, param, "missing_required_parameter",
                            "Missing required parameter: '%s'.", param);
        }
        const cJSON *content = field(msg, "content");
        if (content == NULL) {
            /* Only an assistant turn that calls tools (or a function) may omit its content. */
            if (m->role != roles[3] || !(m->has_tool_calls || field(msg, "function_call"))) {
                mparam(param, i, ".content");
                return fail(e, param, "missing_required_parameter",
                            "Missing required parameter: '%s'.", param);
            }
        } else {
            int rc = message_content(content, i, m, arena, e);
            if (rc != 0)
                return rc;
            if (m->media_part >= 0 && r->media == NULL) {
                r->media = m;
                r->media_msg = i;
            }
        }
        r->n_messages++;
    }
    return 0;
}

static int parse_stop(gw_request *r, const cJSON *root, gw_req_error *e)
{
    const cJSON *stop = field(root, "stop");
    if (stop == NULL)
        return 0;
    if (cJSON_IsString(stop)) {
        r->stop[r->n_stop++] = stop->valuestring;
        return 0;
    }
    if (!cJSON_IsArray(stop))
        return wrong_type(e, "stop", "a string or an array of strings", stop);
    if (cJSON_GetArraySize(stop) > GW_MAX_STOP)
        return fail(e, "stop", "array_above_max_length",
                    "Invalid 'stop': array too long. Expected an array with maximum length %d, "
                    "but got an array with length %d instead.", GW_MAX_STOP,
                    cJSON_GetArraySize(stop));
    const cJSON *s;
    cJSON_ArrayForEach(s, stop) {
        if (!cJSON_IsString(s))
            return wrong_type(e, "stop", "an array of strings", s);
        r->stop[r->n_stop++] = s->valuestring;
    }
    return 0;
}

/* The prompt of /v1/completions and the input of /v1/embeddings share one shape: a string, an
 * array of strings, an array of token ids, or an array of arrays of token ids. */
static int parse_texts(gw_request *r, const cJSON *root, const char *name, size_t max_items,
                       gw_req_error *e)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, name);
    if (v == NULL || cJSON_IsNull(v))
        return fail(e, name, "missing_required_parameter", "Missing required parameter: '%s'.",
                    name);
    if (cJSON_IsString(v)) {
        r->prompt = v->valuestring;
        r->n_inputs = 1;
        if (r->ep == GW_EP_EMBEDDINGS && v->valuestring[0] == '\0')
            return fail(e, name, "invalid_value", "'$.%s' is invalid: it must not be empty.",
                        name);
        return 0;
    }
    if (!cJSON_IsArray(v))
        return wrong_type(e, name, "a string or an array", v);
    size_t n = (size_t)cJSON_GetArraySize(v);
    if (n == 0)
        return fail(e, name, "empty_array",
                    "Invalid '%s': empty array. Expected an array with minimum length 1.", name);
    /* The item limit counts prompts (or inputs), not the ids of one token-id prompt: that one
     * is bounded by the body size here and by the tier's context where it runs. */
    if (n > max_items && !cJSON_IsNumber(v->child))
        return fail(e, name, "array_above_max_length",
                    "Invalid '%s': array too long. Expected an array with maximum length %zu, "
                    "but got an array with length %zu instead.", name, max_items, n);
    const cJSON *first = v->child;
    const cJSON *it;
    cJSON_ArrayForEach(it, v) {
        bool ok;
        if (cJSON_IsString(first)) {
            ok = cJSON_IsString(it);
        } else if (cJSON_IsNumber(first)) {
            ok = cJSON_IsNumber(it) && it->valuedouble >= 0 && it->valuedouble < 4294967296.0 &&
                 it->valuedouble == floor(it->valuedouble);
        } else if (cJSON_IsArray(first)) {
            ok = cJSON_IsArray(it) && cJSON_GetArraySize(it) > 0;
            const cJSON *tok;
            cJSON_ArrayForEach(tok, it) ok = ok && cJSON_IsNumber(tok) && tok->valuedouble >= 0 &&
                                             tok->valuedouble == floor(tok->valuedouble);
        } else {
            ok = false;
        }
        if (!ok)
            return fail(e, name, "invalid_type",
                        "Invalid '%s': expected a string, an array of strings, an array of "
                        "token ids or an array of token-id arrays.", name);
    }
    r->n_inputs = cJSON_IsNumber(first) ? 1 : n;
    if (n == 1 && cJSON_IsString(first))
        r->prompt = first->valuestring;
    return 0;
}

/* logit_bias: {"<token id>": bias} with ids as decimal strings and biases in [-100, 100]. Whether
 * an id exists is the tier's question (its vocabulary); engine tiers answer it. */
static int parse_logit_bias(gw_request *r, const cJSON *root, gw_req_error *e)
{
    const cJSON *lb = field(root, "logit_bias");
    if (lb == NULL)
        return 0;
    if (!cJSON_IsObject(lb))
        return wrong_type(e, "logit_bias", "an object", lb);
    int64_t n = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, lb) {
        const char *k = it->string;
        size_t len = strlen(k);
        bool ok = len > 0 && len <= 10 && (len == 1 || k[0] != '0');
        for (size_t i = 0; ok && i < len; i++)
            ok = k[i] >= '0' && k[i] <= '9';
        if (ok && strtoll(k, NULL, 10) > INT32_MAX)
            ok = false;
        if (!ok)
            return fail(e, "logit_bias", "invalid_value",
                        "Invalid key in 'logit_bias': '%.32s'. Keys must be token ids: "
                        "non-negative integers written as strings.", k);
        if (!cJSON_IsNumber(it))
            return fail(e, "logit_bias", "invalid_type",
                        "Invalid type for 'logit_bias.%.16s': expected a number, but got %s "
                        "instead.", k, json_type_name(it));
        if (!(it->valuedouble >= -100 && it->valuedouble <= 100))
            return fail(e, "logit_bias", "decimal_out_of_range",
                        "Invalid 'logit_bias.%.16s': %g is out of range; expected a value "
                        "between -100 and 100.", k, it->valuedouble);
        if (++n > GW_MAX_LOGIT_BIAS)
            return fail(e, "logit_bias", "invalid_value",
                        "Invalid 'logit_bias': too many entries; at most %d tokens may be "
                        "biased.", GW_MAX_LOGIT_BIAS);
    }
    r->logit_bias_n = n;
    return 0;
}

/* response_format: {"type": "text" | "json_object"} or {"type": "json_schema", "json_schema":
 * {"name": ..., "schema": {...}, "strict": bool, "description": ...}} as OpenAI defines it. The
 * schema itself is checked by the tier that constrains decoding (engine/text/grammar.h) or by
 * the upstream that receives it. */
static int parse_response_format(gw_request *r, const cJSON *root, gw_req_error *e)
{
    const cJSON *rf = field(root, "response_format");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(rf, "type");
    if (!cJSON_IsString(type) || (strcmp(type->valuestring, "text") &&
                                  strcmp(type->valuestring, "json_object") &&
                                  strcmp(type->valuestring, "json_schema")))
        return fail(e, "response_format.type", "invalid_value",
                    "Invalid value for 'response_format.type': expected 'text', "
                    "'json_object' or 'json_schema'.");
    if (strcmp(type->valuestring, "json_object") == 0)
        r->response_format = GW_RF_JSON_OBJECT;
    if (strcmp(type->valuestring, "json_schema") != 0)
        return 0;
    r->response_format = GW_RF_JSON_SCHEMA;
    const cJSON *js = cJSON_GetObjectItemCaseSensitive(rf, "json_schema");
    if (js == NULL)
        return fail(e, "response_format.json_schema", "missing_required_parameter",
                    "Missing required parameter: 'response_format.json_schema'.");
    if (!cJSON_IsObject(js))
        return wrong_type(e, "response_format.json_schema", "an object", js);
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(js, "name");
    if (name == NULL)
        return fail(e, "response_format.json_schema.name", "missing_required_parameter",
                    "Missing required parameter: 'response_format.json_schema.name'.");
    if (!cJSON_IsString(name))
        return wrong_type(e, "response_format.json_schema.name", "a string", name);
    size_t n = strlen(name->valuestring);
    bool ok = n >= 1 && n <= 64;
    for (size_t i = 0; ok && i < n; i++) {
        char c = name->valuestring[i];
        ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
             c == '_' || c == '-';
    }
    if (!ok)
        return fail(e, "response_format.json_schema.name", "invalid_value",
                    "Invalid 'response_format.json_schema.name': string does not match "
                    "pattern. Expected a string of 1 to 64 letters, digits, underscores or "
                    "dashes.");
    const cJSON *strict = cJSON_GetObjectItemCaseSensitive(js, "strict");
    if (strict != NULL && !cJSON_IsBool(strict) && !cJSON_IsNull(strict))
        return wrong_type(e, "response_format.json_schema.strict", "a boolean", strict);
    const cJSON *schema = cJSON_GetObjectItemCaseSensitive(js, "schema");
    if (schema != NULL && !cJSON_IsObject(schema))
        return wrong_type(e, "response_format.json_schema.schema", "an object", schema);
    r->json_schema = schema;
    return 0;
}

static int parse_sampling(gw_request *r, const cJSON *root, gw_req_error *e)
{
    int64_t n = 1, max_tokens = -1, mct = -1, top_logprobs = 0, best_of = 1, top_k = 0;
    double ignored;
    bool logprobs = false, has_logprobs = false, echo = false;
    const char *suffix = NULL;
    int rc;
    if ((rc = opt_number(root, "temperature", 0, 2, &r->has_temperature, &r->temperature, e)) ||
        (rc = opt_number(root, "top_p", 0, 1, &r->has_top_p, &r->top_p, e)) ||
        (rc = opt_number(root, "presence_penalty", -2, 2, NULL, &ignored, e)) ||
        (rc = opt_number(root, "frequency_penalty", -2, 2, NULL, &ignored, e)) ||
        (rc = opt_int(root, "n", 1, 128, NULL, &n, e)) ||
        (rc = opt_int(root, "max_tokens", 1, 1e9, NULL, &max_tokens, e)) ||
        (rc = opt_int(root, "seed", -9.2e18, 9.2e18, &r->has_seed, &r->seed, e)) ||
        (rc = opt_string(root, "user", &r->user, e)) ||
        (rc = opt_int(root, "top_k", 0, 1e6, NULL, &top_k, e)) ||          /* vLLM extension */
        (rc = opt_number(root, "min_p", 0, 1, NULL, &r->min_p, e)) ||     /* vLLM extension */
        (rc = parse_logit_bias(r, root, e)) ||
        (rc = parse_stop(r, root, e)))
        return rc;
    r->top_k = (int)top_k;
    r->top_logprobs = -1;
    if (r->ep == GW_EP_CHAT) {
        if ((rc = opt_int(root, "max_completion_tokens", 1, 1e9, NULL, &mct, e)) ||
            (rc = opt_bool(root, "logprobs", &logprobs, e)) ||
            (rc = opt_int(root, "top_logprobs", 0, 20, NULL, &top_logprobs, e)) ||
            (rc = opt_object(root, "response_format", &r->has_response_format, e)))
            return rc;
        if (top_logprobs > 0 && !logprobs)
            return fail(e, "top_logprobs", "invalid_value",
                        "Invalid value for 'top_logprobs': 'logprobs' must be true when "
                        "'top_logprobs' is set.");
        if (logprobs)
            r->top_logprobs = (int)top_logprobs;
        if (r->has_response_format && (rc = parse_response_format(r, root, e)) != 0)
            return rc;
    } else {
        if ((rc = opt_int(root, "logprobs", 0, 5, &has_logprobs, &top_logprobs, e)) ||
            (rc = opt_int(root, "best_of", 1, 20, NULL, &best_of, e)) ||
            (rc = opt_bool(root, "echo", &echo, e)) ||
            (rc = opt_string(root, "suffix", &suffix, e)))
            return rc;
        if (has_logprobs)
            r->top_logprobs = (int)top_logprobs;
        r->echo = echo;
    }
    r->n = (int)n;
    r->max_tokens = mct > 0 ? mct : max_tokens;
    return 0;
}

static int parse_stream(gw_request *r, const cJSON *root, gw_req_error *e)
{
    int rc;
    if ((rc = opt_bool(root, "stream", &r->stream, e)))
        return rc;
    const cJSON *so = field(root, "stream_options");
    if (so == NULL)
        return 0;
    if (!cJSON_IsObject(so))
        return wrong_type(e, "stream_options", "an object", so);
    if (!r->stream)
        return fail(e, "stream_options", "invalid_value",
                    "The 'stream_options' parameter is only allowed when 'stream' is enabled.");
    const cJSON *iu = field(so, "include_usage");
    if (iu != NULL && !cJSON_IsBool(iu))
        return wrong_type(e, "stream_options.include_usage", "a boolean", iu);
    r->include_usage = iu != NULL && cJSON_IsTrue(iu);
    return 0;
}

static int parse_tools(gw_request *r, const cJSON *root, gw_req_error *e)
{
    char param[40];
    const cJSON *tools = field(root, "tools");
    if (tools != NULL) {
        if (!cJSON_IsArray(tools))
            return wrong_type(e, "tools", "an array", tools);
        int i = 0;
        const cJSON *t;
        cJSON_ArrayForEach(t, tools) {
            snprintf(param, sizeof param, "tools[%d]", i++);
            const cJSON *type = cJSON_GetObjectItemCaseSensitive(t, "type");
            if (!cJSON_IsObject(t) || !cJSON_IsString(type))
                return fail(e, param, "invalid_type",
                            "Invalid '%s': a tool must be an object with a string 'type'.", param);
            if (!strcmp(type->valuestring, "function")) {
                const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
                if (!cJSON_IsString(cJSON_GetObjectItemCaseSensitive(fn, "name")))
                    return fail(e, param, "missing_required_parameter",
                                "Missing required parameter: '%s.function.name'.", param);
            }
        }
        r->has_tools = cJSON_GetArraySize(tools) > 0;
    }
    const cJSON *choice = field(root, "tool_choice");
    if (choice != NULL) {
        if (cJSON_IsString(choice)) {
            if (strcmp(choice->valuestring, "none") && strcmp(choice->valuestring, "auto") &&
                strcmp(choice->valuestring, "required"))
                return fail(e, "tool_choice", "invalid_value",
                            "Invalid value for 'tool_choice': expected 'none', 'auto', "
                            "'required' or an object.");
        } else if (!cJSON_IsObject(choice)) {
            return wrong_type(e, "tool_choice", "a string or an object", choice);
        } else if (tools == NULL) {
            return fail(e, "tool_choice", "invalid_value",
                        "Invalid value for 'tool_choice': 'tool_choice' is only allowed when "
                        "'tools' are specified.");
        }
    }
    return 0;
}

int gw_request_parse(gw_request *r, gw_endpoint ep, const char *body, size_t len,
                     util_arena *arena, gw_req_error *e)
{
    memset(r, 0, sizeof *r);
    memset(e, 0, sizeof *e);
    r->ep = ep;
    r->max_tokens = -1;
    r->n = 1;
    if (len == 0)
        return fail(e, NULL, NULL,
                    "We could not parse the JSON body of your request. The body is empty; it "
                    "must be a JSON object.");
    if (!gw_utf8_valid(body, len))
        return fail(e, NULL, NULL,
                    "We could not parse the JSON body of your request. The body is not valid "
                    "UTF-8.");
    /* Strict RFC 8259 first: whatever cJSON would read differently from a peer is refused. */
    gw_json_fault jf;
    if (gw_json_check(body, len, &jf) != 0)
        return fail(e, NULL, NULL,
                    "We could not parse the JSON body of your request: %s (at byte %zu). (HINT: "
                    "The OpenAI API expects a JSON payload.)", jf.what, jf.offset);
    cJSON *root = cJSON_ParseWithLengthOpts(body, len, NULL, 0);
    if (root == NULL)  /* the strict check passed, so only memory or cJSON's own depth cap */
        return fail(e, NULL, NULL,
                    "We could not parse the JSON body of your request (too deeply nested).");
    int rc;
    r->json = root;
    if (!cJSON_IsObject(root)) {
        rc = fail(e, NULL, NULL, "The request body must be a JSON object.");
        goto bad;
    }
    char dup_path[64];
    const char *dup = gw_json_duplicate(root, dup_path, sizeof dup_path);
    if (dup != NULL) {
        rc = fail(e, dup_path, "duplicate_key",
                  "Invalid JSON body: the key '%.64s' appears more than once in the same object "
                  "(at '%s'). Each key may appear only once: JSON parsers disagree on which copy "
                  "counts.", dup, dup_path);
        goto bad;
    }
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (model == NULL || cJSON_IsNull(model)) {
        rc = fail(e, "model", "missing_required_parameter",
                  "Missing required parameter: 'model'.");
        goto bad;
    }
    if (!cJSON_IsString(model)) {
        rc = wrong_type(e, "model", "a string", model);
        goto bad;
    }
    if (model->valuestring[0] == '\0') {
        rc = fail(e, "model", "invalid_value", "'model' must not be empty.");
        goto bad;
    }
    r->model = model->valuestring;
    if (ep == GW_EP_EMBEDDINGS) {
        const char *fmt = NULL;
        int64_t dims = 0;
        bool truncate = false;  /* llmgw extension: cut inputs longer than the model's window */
        if ((rc = parse_texts(r, root, "input", 2048, e)) ||
            (rc = opt_string(root, "encoding_format", &fmt, e)) ||
            (rc = opt_int(root, "dimensions", 1, 65536, NULL, &dims, e)) ||
            (rc = opt_bool(root, "truncate", &truncate, e)) ||
            (rc = opt_string(root, "user", &r->user, e)))
            goto bad;
        if (fmt != NULL && strcmp(fmt, "float") && strcmp(fmt, "base64")) {
            rc = fail(e, "encoding_format", "invalid_value",
                      "Invalid value for 'encoding_format': expected 'float' or 'base64'.");
            goto bad;
        }
        return 0;
    }
    if (ep == GW_EP_CHAT) {
        if ((rc = parse_messages(r, root, arena, e)) || (rc = parse_tools(r, root, e)))
            goto bad;
    } else if ((rc = parse_texts(r, root, "prompt", 2048, e))) {
        goto bad;
    }
    if ((rc = parse_sampling(r, root, e)) || (rc = parse_stream(r, root, e)))
        goto bad;
    return 0;
bad:
    cJSON_Delete(root);
    r->json = NULL;
    return rc;
}

void gw_request_deinit(gw_request *r)
{
    if (r != NULL && r->json != NULL) {
        cJSON_Delete(r->json);
        r->json = NULL;
    }
}

const gw_message *gw_request_last_user(const gw_request *r)
{
    for (size_t i = r->n_messages; i > 0; i--)
        if (!strcmp(r->messages[i - 1].role, "user"))
            return &r->messages[i - 1];
    return NULL;
}
