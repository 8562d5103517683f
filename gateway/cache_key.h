/* gateway/cache_key.h: what a chat request may be cached under. Pure; a unit-test target.
 *
 * namespace = H(key group, model, context, sampling, history, last) where
 *   model    = the name passed as `tier` below (the gateway passes the requested model, so a
 *              policy edit that moves traffic between tiers keeps the cache),
 *   context  = the request's tools / tool_choice / functions / response_format (as sent),
 *   sampling = temperature (unset = 1), top_p, seed, max_tokens, stop, penalties, logit_bias,
 *              top_k, min_p,
 *   history  = every message before the last one (system prompt and earlier turns), so a
 *              follow-up such as "what are its types?" never meets an entry made under another
 *              conversation;
 *   last     = the last message's other fields (name) and every part that is not text, as sent
 *              (image_url, input_audio, file, refusal: a URL or the data itself), so the same
 *              words about another image or recording are another namespace;
 * exact     = H(the last user message, whitespace collapsed, ASCII lower-cased);
 * text      = the last user message as sent: what the encoder embeds.
 * A request is cacheable only when: chat endpoint, n = 1, temperature <= max_temperature, no
 * logprobs, and the last message is a non-empty user message. */
#ifndef LLMGW_GATEWAY_CACHE_KEY_H
#define LLMGW_GATEWAY_CACHE_KEY_H

#include "gateway/request.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct gw_cache_key {
    bool cacheable;
    const char *why_not;  /* static text when !cacheable */
    uint64_t ns;
    uint64_t exact;       /* never 0 */
    const char *text;     /* points into the request */
    size_t text_len;
} gw_cache_key;

void gw_cache_key_derive(const gw_request *req, const char *group, const char *tier,
                         double max_temperature, gw_cache_key *out);

/* Cache-Control request directives: no-cache (skip the lookup), no-store (skip the insert). */
void gw_cache_control_parse(const char *header, bool *no_cache, bool *no_store);

#endif
