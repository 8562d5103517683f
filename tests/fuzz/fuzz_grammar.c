/* tests/fuzz/fuzz_grammar.c: the structured-output grammar (engine/text/grammar.h) on arbitrary
 * input: the bytes before the first NUL are a JSON schema (or, when they are empty, json_object
 * mode), the bytes after it a document fed to the machine. The compiler refuses or compiles
 * without a fault; the machine never leaves a live state with nothing allowed (no dead ends);
 * the first allowed tokens are taken by advance; and a document the machine takes whole is JSON
 * that cJSON parses. The vocabulary is SmolLM2's ($LLMGW_MODELS, default <repo>/models);
 * without the model every input is a no-op. */
#include "engine/text/grammar.h"
#include "tests/unit/engine/smollm2.h"

#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(c)                                                                                 \
    do {                                                                                         \
        if (!(c))                                                                                \
            __builtin_trap();                                                                    \
    } while (0)

static eng_tokenizer *g_tok;
static eng_gvocab *g_voc;
static uint32_t *g_allow;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    util_err err = {0};
    if (smollm2_tokenizer(&g_tok, &err) != 0 || eng_gvocab_new(&g_voc, g_tok, &err) != 0) {
        fprintf(stderr, "fuzz_grammar: no model, every input is a no-op: %s\n", err.msg);
        g_voc = NULL;
    }
    if (g_voc != NULL)
        g_allow = calloc((size_t)(eng_gvocab_n_vocab(g_voc) + 31) / 32, sizeof *g_allow);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (g_voc == NULL)
        return 0;
    const uint8_t *nul = memchr(data, 0, size);
    size_t schema_len = nul ? (size_t)(nul - data) : size;
    const char *doc = nul ? (const char *)nul + 1 : "";
    size_t doc_len = nul ? size - schema_len - 1 : 0;
    eng_grammar *g = NULL;
    util_err err = {0};
    if (eng_grammar_compile(&g, g_voc, schema_len ? (const char *)data : NULL, schema_len,
                            &err) != 0)
        return 0;
    eng_gstate st;
    eng_gstate_init(g, &st);
    size_t taken = 0;
    int n_vocab = eng_gvocab_n_vocab(g_voc);
    for (; taken < doc_len && taken < 256; taken++) {
        if (!eng_grammar_feed(g, &st, doc + taken, 1))
            break;
        if (taken % 16 == 0) {   /* a live state always allows something, and it is taken */
            CHECK(eng_grammar_allowed(g, &st, g_allow) > 0);
            for (int32_t t = 0, tried = 0; t < n_vocab && tried < 4; t++)
                if (g_allow[t / 32] >> (t % 32) & 1) {
                    eng_gstate probe = st;
                    CHECK(eng_grammar_advance(g, &probe, t));
                    tried++;
                }
        }
    }
    if (taken == doc_len && eng_gstate_complete(g, &st)) {
        cJSON *j = cJSON_ParseWithLength(doc, doc_len);
        CHECK(j != NULL);
        cJSON_Delete(j);
    }
    eng_grammar_unref(g);
    return 0;
}
