/* gateway/grammars.c: a small cache of compiled grammars, most recently used first. */
#include "gateway/grammars.h"

#include "common/arena.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

typedef struct slot {
    uint64_t hash;
    char *text;           /* the schema, or NULL for json_object */
    size_t len;
    eng_grammar *g;
} slot;

struct gw_grammars {
    const eng_tokenizer *tok;
    eng_gvocab *voc;      /* NULL until the first get */
    slot keep[GW_GRAMMARS_KEEP];   /* [0, n) most recent first */
    int n;
    gw_grammars_stats st;
};

gw_grammars *gw_grammars_new(const eng_tokenizer *tok)
{
    gw_grammars *c = util_xcalloc(1, sizeof *c);
    c->tok = tok;
    return c;
}

void gw_grammars_free(gw_grammars *c)
{
    if (c == NULL)
        return;
    for (int i = 0; i < c->n; i++) {
        eng_grammar_unref(c->keep[i].g);
        free(c->keep[i].text);
    }
    eng_gvocab_free(c->voc);
    free(c);
}

/* Moves slot i to the front. */
static void promote(gw_grammars *c, int i)
{
    slot s = c->keep[i];
    memmove(&c->keep[1], &c->keep[0], (size_t)i * sizeof *c->keep);
    c->keep[0] = s;
}

int gw_grammars_get(gw_grammars *c, const char *schema, size_t len, eng_grammar **out,
                    util_err *err)
{
    uint64_t h = schema != NULL ? XXH3_64bits(schema, len) : 0;
    for (int i = 0; i < c->n; i++) {
        slot *s = &c->keep[i];
        if (s->hash == h && (s->text == NULL) == (schema == NULL) && s->len == len &&
            (schema == NULL || memcmp(s->text, schema, len) == 0)) {
            c->st.hits++;
            promote(c, i);
            *out = eng_grammar_ref(c->keep[0].g);
            return 0;
        }
    }
    int rc;
    if (c->voc == NULL && (rc = eng_gvocab_new(&c->voc, c->tok, err)) != 0)
        return rc;
    eng_grammar *g;
    if ((rc = eng_grammar_compile(&g, c->voc, schema, len, err)) != 0) {
        c->st.refused++;
        return rc;
    }
    c->st.compiled++;
    if (c->n == GW_GRAMMARS_KEEP) {   /* the least recently used goes */
        slot *last = &c->keep[--c->n];
        eng_grammar_unref(last->g);
        free(last->text);
    }
    c->keep[c->n] = (slot){h, schema != NULL ? util_xstrndup(schema, len) : NULL, len, g};
    promote(c, c->n++);
    *out = eng_grammar_ref(g);
    return 0;
}

void gw_grammars_stats_get(const gw_grammars *c, gw_grammars_stats *out)
{
    *out = c->st;
}
