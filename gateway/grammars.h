/* gateway/grammars.h: the compiled grammars of structured outputs and tool calls for one engine
 * model: the vocabulary trie (built on first use) and the last GW_GRAMMARS_KEEP grammars
 * compiled, looked up by what they were compiled from, so a schema or a set of tools a client
 * sends with every request is compiled once. One thread
 * (the engine tiers' prep thread) uses a cache; the grammars it hands out are references. */
#ifndef LLMGW_GATEWAY_GRAMMARS_H
#define LLMGW_GATEWAY_GRAMMARS_H

#include "common/err.h"
#include "engine/text/grammar.h"
#include "engine/text/tokenizer.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define GW_GRAMMARS_KEEP 64

typedef struct gw_grammars gw_grammars;

/* The tokenizer must outlive the cache. Nothing is built until the first get. */
gw_grammars *gw_grammars_new(const eng_tokenizer *tok);
/* NULL is a no-op. After every grammar it handed out is released (they read its vocabulary). */
void gw_grammars_free(gw_grammars *c);

/* A reference to the grammar of schema (JSON text of len bytes; NULL: any JSON object),
 * compiled now or found. LLMGW_EINVAL with err naming the unsupported part. */
int gw_grammars_get(gw_grammars *c, const char *schema, size_t len, eng_grammar **out,
                    util_err *err);

/* The same for a tool request: key identifies it (gateway/tool_calls.h: gw_tool_req.key). */
int gw_grammars_get_tools(gw_grammars *c, const char *key, size_t key_len,
                          const eng_tool_spec *tools, int n, const eng_tool_format *fmt,
                          bool required, eng_grammar **out, util_err *err);

typedef struct gw_grammars_stats {
    uint64_t hits, compiled, refused;
} gw_grammars_stats;
void gw_grammars_stats_get(const gw_grammars *c, gw_grammars_stats *out);

#endif
