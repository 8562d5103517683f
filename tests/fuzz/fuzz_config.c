/* tests/fuzz/fuzz_config.c: gw_config_parse on arbitrary YAML. A failure must name the file
 * with a line:column; a success must hold together (every tier found by its name, fallbacks
 * resolved, listeners with a host and a port). */
#include "gateway/config.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(c)                                                                                 \
    do {                                                                                         \
        if (!(c))                                                                                \
            __builtin_trap();                                                                    \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* A copy of exactly `size` bytes, so ASan sees any read past the text. */
    char *text = malloc(size ? size : 1);
    memcpy(text, data, size);
    gw_config *c = NULL;
    util_err err = {0};
    int rc = gw_config_parse(&c, text, size, "fuzz.yaml", "/etc/llmgw", &err);
    if (rc == 0) {
        CHECK(c != NULL && c->n_listen >= 1);
        for (size_t i = 0; i < c->n_listen; i++)
            CHECK(c->listen[i].host != NULL && c->listen[i].port >= 0 &&
                  c->listen[i].port <= 65535);
        for (size_t i = 0; i < c->n_tiers; i++) {
            const gw_tier_cfg *t = &c->tiers[i];
            CHECK(gw_config_tier(c, t->name) == t);
            CHECK(t->fallback == NULL || gw_config_tier(c, t->fallback) != NULL);
            CHECK(strncmp(t->base_url, "http", 4) == 0);
        }
        for (size_t i = 0; i < c->n_keys; i++)
            CHECK(c->keys[i].key != NULL && c->keys[i].group != NULL);
        gw_config_free(c);
    } else {
        CHECK(rc == LLMGW_EINVAL);
        CHECK(err.code == rc);
        CHECK(strncmp(err.msg, "fuzz.yaml:", 10) == 0);
        CHECK(c == NULL);
    }
    free(text);
    return 0;
}
