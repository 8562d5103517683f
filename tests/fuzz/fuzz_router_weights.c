/* tests/fuzz/fuzz_router_weights.c: the router classifier's weights parser on arbitrary bytes.
 * A file either parses, and then its dim is in range and it scores any text (the input itself)
 * to a number in [0, 1] for a unit-length embedding; or it is refused with a message naming the
 * file, and nothing is handed out. (Seeds: tests/fuzz/corpus/router_weights/, written by hand.) */
#include "router/classifier.h"

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(c) ((c) ? (void)0 : abort())

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    router_classifier *c = NULL;
    util_err err = {0};
    if (router_classifier_parse(&c, (const char *)data, size, "fuzz.weights", NULL, &err) != 0) {
        CHECK(c == NULL);
        CHECK(strncmp(err.msg, "fuzz.weights", 12) == 0);
        return 0;
    }
    int dim = router_classifier_dim(c);
    CHECK(dim >= 1 && dim <= 8192);
    float *emb = calloc((size_t)dim, sizeof *emb);
    CHECK(emb != NULL);
    emb[(size_t)size % (size_t)dim] = 1.0f;
    double p = router_classifier_score(c, emb, (const char *)data, size);
    CHECK(p >= 0 && p <= 1);
    p = router_classifier_score(c, NULL, NULL, 0);
    CHECK(p >= 0 && p <= 1);
    free(emb);
    router_classifier_free(c);
    return 0;
}
