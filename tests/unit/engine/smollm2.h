/* tests/unit/engine/smollm2.h: the SmolLM2 file the engine's tests and fuzzers read ($LLMGW_MODELS,
 * default <repo>/models, fetched by scripts/fetch-models): its path and its tokenizer. The
 * including target defines LLMGW_SOURCE_DIR. */
#ifndef LLMGW_TESTS_UNIT_ENGINE_SMOLLM2_H
#define LLMGW_TESTS_UNIT_ENGINE_SMOLLM2_H

#include "engine/format/gguf.h"
#include "engine/text/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>

static inline void smollm2_path(char *buf, size_t n)
{
    const char *dir = getenv("LLMGW_MODELS");
    snprintf(buf, n, "%s/SmolLM2-135M-Instruct.Q4_1.gguf", dir ? dir : LLMGW_SOURCE_DIR "/models");
}

/* The file's tokenizer; an error (no file) in err. */
static inline int smollm2_tokenizer(eng_tokenizer **out, util_err *err)
{
    char path[4096];
    smollm2_path(path, sizeof path);
    eng_gguf *g = NULL;
    int rc = eng_gguf_open(&g, path, err);
    if (rc == 0)
        rc = eng_tokenizer_load(out, g, err);
    eng_gguf_close(g);
    return rc;
}

#endif
