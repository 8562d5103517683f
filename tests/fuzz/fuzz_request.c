/* tests/fuzz/fuzz_request.c: gw_request_parse on arbitrary bodies. The first byte picks the
 * endpoint (byte % 3: 0 chat, 1 completions, 2 embeddings; the seed corpus uses the digits
 * '0', '1', '2'), the rest is the body, which is not NUL-terminated, so reading past `len` is
 * caught. Besides memory errors, the contract is checked: a failure leaves nothing to release
 * and explains itself; a success keeps every field in its documented range, its cache key
 * (gateway/cache_key.h) derives deterministically, the body passed the strict scan and holds no
 * duplicate key (gateway/json.h), and what would go upstream (gw_json_print) is strict JSON that
 * parses back to the same tree: the gateway and the upstream read one request. */
#include "gateway/cache_key.h"
#include "gateway/json.h"
#include "gateway/request.h"

#include "common/err.h"

#include <event2/buffer.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(c)                                                                                 \
    do {                                                                                         \
        if (!(c))                                                                                \
            __builtin_trap();                                                                    \
    } while (0)

static void check_ok(const gw_request *r, gw_endpoint ep)
{
    CHECK(r->json != NULL);
    CHECK(r->ep == ep);
    CHECK(r->model != NULL && r->model[0] != '\0');
    CHECK(r->n >= 1 && r->n <= 128);
    CHECK(r->max_tokens == -1 || (r->max_tokens >= 1 && r->max_tokens <= 1000000000));
    CHECK(r->n_stop <= GW_MAX_STOP);
    for (size_t i = 0; i < r->n_stop; i++)
        CHECK(r->stop[i] != NULL);
    CHECK(!r->has_temperature || (r->temperature >= 0 && r->temperature <= 2));
    CHECK(!r->has_top_p || (r->top_p >= 0 && r->top_p <= 1));
    CHECK(!r->include_usage || r->stream);
    CHECK(r->top_logprobs >= -1 && r->top_logprobs <= 20);
    if (ep == GW_EP_CHAT) {
        CHECK(r->n_messages >= 1);
        for (size_t i = 0; i < r->n_messages; i++) {
            const gw_message *m = &r->messages[i];
            CHECK(m->role != NULL && m->text != NULL);
            CHECK(strlen(m->text) == m->text_len);
        }
        const gw_message *u = gw_request_last_user(r);
        CHECK(u == NULL || strcmp(u->role, "user") == 0);
    } else {
        CHECK(r->n_messages == 0);
        CHECK(r->n_inputs >= 1 && r->n_inputs <= 2048);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    gw_endpoint ep = (gw_endpoint)(data[0] % 3);
    size_t len = size - 1;
    /* A copy of exactly `len` bytes, so ASan sees any read past the body. */
    char *body = malloc(len ? len : 1);
    memcpy(body, data + 1, len);
    util_arena arena;
    util_arena_init(&arena, 4096);
    gw_request r;
    gw_req_error e;
    int rc = gw_request_parse(&r, ep, body, len, &arena, &e);
    if (rc == 0) {
        check_ok(&r, ep);
        CHECK(gw_utf8_valid(body, len));
        /* The cache's key of the same request: deterministic, and its text is the last user
         * message. */
        gw_cache_key k1, k2;
        gw_cache_key_derive(&r, "group", "model", 0.5, &k1);
        gw_cache_key_derive(&r, "group", "model", 0.5, &k2);
        CHECK(k1.cacheable == k2.cacheable && k1.ns == k2.ns && k1.exact == k2.exact);
        CHECK(k1.cacheable ? k1.exact != 0 && k1.text != NULL : k1.why_not != NULL);
        if (k1.cacheable)
            CHECK(k1.text == gw_request_last_user(&r)->text);
        bool nc, ns;
        gw_cache_control_parse(r.model, &nc, &ns);
        gw_json_fault f;
        char path[64];
        CHECK(gw_json_check(body, len, &f) == 0);
        CHECK(gw_json_duplicate(r.json, path, sizeof path) == NULL);
        struct evbuffer *up = evbuffer_new();
        gw_json_print(r.json, (data[0] & 0x80) ? "upstream-model" : NULL, up);
        size_t n = evbuffer_get_length(up);
        const char *p = (const char *)evbuffer_pullup(up, -1);
        CHECK(gw_utf8_valid(p, n) && gw_json_check(p, n, &f) == 0);
        cJSON *back = cJSON_ParseWithLength(p, n);
        CHECK(back != NULL && cJSON_GetArraySize(back) == cJSON_GetArraySize(r.json));
        if (!(data[0] & 0x80))
            CHECK(cJSON_Compare(back, r.json, true));
        cJSON_Delete(back);
        evbuffer_free(up);
    } else {
        CHECK(rc == LLMGW_EINVAL);
        CHECK(r.json == NULL);
        CHECK(e.status == 400);
        CHECK(e.type != NULL && strcmp(e.type, "invalid_request_error") == 0);
        CHECK(e.message[0] != '\0');
        CHECK(memchr(e.param, '\0', sizeof e.param) != NULL);
    }
    gw_request_deinit(&r);
    util_arena_deinit(&arena);
    free(body);
    return 0;
}
