/* gateway/cache_key.c: cache namespaces and exact keys (see cache_key.h). */
#include "gateway/cache_key.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

/* Each field goes in with its length first, so ("ab","c") and ("a","bc") differ. */
static void put(XXH3_state_t *h, const void *p, size_t n)
{
    uint64_t len = n;
    XXH3_64bits_update(h, &len, sizeof len);
    if (n > 0)
        XXH3_64bits_update(h, p, n);
}

static void put_str(XXH3_state_t *h, const char *s)
{
    put(h, s ? s : "", s ? strlen(s) : 0);
}

static void put_item(XXH3_state_t *h, const cJSON *root, const char *key)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(root, key);
    put_str(h, key);
    if (it == NULL) {
        put(h, "", 0);
        return;
    }
    char *text = cJSON_PrintUnformatted(it);
    put_str(h, text);
    free(text);
}

static void put_double(XXH3_state_t *h, double v)
{
    put(h, &v, sizeof v);
}

static uint64_t exact_hash(const char *s, size_t n)
{
    XXH3_state_t *h = XXH3_createState();
    XXH3_64bits_reset(h);
    char buf[256];
    size_t k = 0;
    bool space = false;
    size_t i = 0;
    while (i < n && isspace((unsigned char)s[i]))
        i++;
    for (; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (isspace(c)) {
            space = true;
            continue;
        }
        if (space && k > 0)
            buf[k++] = ' ';
        space = false;
        buf[k++] = (char)(c < 0x80 ? tolower(c) : c);
        if (k >= sizeof buf - 2) {
            XXH3_64bits_update(h, buf, k);
            k = 0;
        }
    }
    XXH3_64bits_update(h, buf, k);
    uint64_t v = XXH3_64bits_digest(h);
    XXH3_freeState(h);
    return v ? v : 1;
}

void gw_cache_key_derive(const gw_request *req, const char *group, const char *tier,
                         double max_temperature, gw_cache_key *out)
{
    memset(out, 0, sizeof *out);
    double temperature = req->has_temperature ? req->temperature : 1.0;
    if (req->ep != GW_EP_CHAT)
        out->why_not = "only chat completions are cached";
    else if (req->n != 1)
        out->why_not = "n > 1";
    else if (temperature > max_temperature)
        out->why_not = "temperature above the cache's bound";
    else if (req->top_logprobs >= 0)
        out->why_not = "logprobs requested";
    else if (req->n_messages == 0 ||
             strcmp(req->messages[req->n_messages - 1].role, "user") != 0)
        out->why_not = "the last message is not a user message";
    else if (req->messages[req->n_messages - 1].text_len == 0)
        out->why_not = "the last user message has no text";
    if (out->why_not != NULL)
        return;
    const gw_message *last = &req->messages[req->n_messages - 1];
    XXH3_state_t *h = XXH3_createState();
    XXH3_64bits_reset(h);
    put_str(h, "llmgw-cache-v1");
    put_str(h, group);
    put_str(h, tier);
    /* context */
    static const char *const context_keys[] = {"tools", "tool_choice", "functions",
                                               "function_call", "response_format",
                                               "parallel_tool_calls"};
    for (size_t i = 0; i < sizeof context_keys / sizeof context_keys[0]; i++)
        put_item(h, req->json, context_keys[i]);
    /* sampling bucket */
    put_double(h, temperature);
    put_double(h, req->has_top_p ? req->top_p : 1.0);
    put_double(h, req->has_seed ? (double)req->seed : -1.0);
    put_double(h, (double)req->max_tokens);
    for (size_t i = 0; i < req->n_stop; i++)
        put_str(h, req->stop[i]);
    put_double(h, (double)req->n_stop);
    put_double(h, (double)req->top_k);
    put_double(h, req->min_p);
    static const char *const sampling_keys[] = {"presence_penalty", "frequency_penalty",
                                                "logit_bias", "repetition_penalty"};
    for (size_t i = 0; i < sizeof sampling_keys / sizeof sampling_keys[0]; i++)
        put_item(h, req->json, sampling_keys[i]);
    /* history: every message before the last, as sent */
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(req->json, "messages");
    int n_msgs = cJSON_GetArraySize(msgs);
    put_double(h, (double)n_msgs);
    for (int i = 0; i + 1 < n_msgs; i++) {
        char *text = cJSON_PrintUnformatted(cJSON_GetArrayItem(msgs, i));
        put_str(h, text);
        free(text);
    }
    /* the last message beyond its text: its other fields (name) and every non-text part as
     * sent (an image's URL or data, audio, a file), so "what is in this picture?" asked of
     * another picture never meets this entry */
    const cJSON *lastj = cJSON_GetArrayItem(msgs, n_msgs - 1);
    const cJSON *f;
    cJSON_ArrayForEach(f, lastj) {
        if (strcmp(f->string, "content") != 0) {
            put_item(h, lastj, f->string);
            continue;
        }
        const cJSON *part;
        if (cJSON_IsArray(f))
            cJSON_ArrayForEach(part, f) {
                const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
                if (cJSON_IsString(type) && !strcmp(type->valuestring, "text"))
                    continue;
                char *text = cJSON_PrintUnformatted(part);
                put_str(h, text);
                free(text);
            }
    }
    out->ns = XXH3_64bits_digest(h);
    XXH3_freeState(h);
    out->exact = exact_hash(last->text, last->text_len);
    out->text = last->text;
    out->text_len = last->text_len;
    out->cacheable = true;
}

static bool directive(const char *h, const char *name)
{
    size_t n = strlen(name);
    for (const char *p = h; (p = strcasestr(p, name)) != NULL; p += n) {
        bool start = p == h || p[-1] == ',' || p[-1] == ' ' || p[-1] == '\t';
        char e = p[n];
        bool end = e == '\0' || e == ',' || e == ' ' || e == '\t' || e == ';' || e == '=';
        if (start && end)
            return true;
    }
    return false;
}

void gw_cache_control_parse(const char *header, bool *no_cache, bool *no_store)
{
    *no_cache = header != NULL && directive(header, "no-cache");
    *no_store = header != NULL && directive(header, "no-store");
}
