/* gateway/grammars.c: a small cache of compiled grammars, most recently used first, by a key
 * that says what was compiled ("object", "schema:" + the schema, or a tool request's key). */
#include "gateway/grammars.h"

#include "common/arena.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

typedef struct slot {
    uint64_t hash;
    char *key;
    size_t len;
    eng_grammar *g;
} slot;

struct gw_grammars {
    const eng_tokenizer *tok;
    eng_gvocab *voc;      /* NULL until the first compile */
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
        free(c->keep[i].key);
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

/* A reference to the grammar under key, or NULL. */
static eng_grammar *lookup(gw_grammars *c, const char *key, size_t len, uint64_t h)
{
    for (int i = 0; i < c->n; i++) {
        slot *s = &c->keep[i];
        if (s->hash == h && s->len == len && memcmp(s->key, key, len) == 0) {
            c->st.hits++;
            promote(c, i);
            return eng_grammar_ref(c->keep[0].g);
        }
    }
    return NULL;
}

static eng_grammar *insert(gw_grammars *c, const char *key, size_t len, uint64_t h,
                           eng_grammar *g)
{
    c->st.compiled++;
    if (c->n == GW_GRAMMARS_KEEP) {   /* the least recently used goes */
        slot *last = &c->keep[--c->n];
        eng_grammar_unref(last->g);
        free(last->key);
    }
    c->keep[c->n] = (slot){h, util_xstrndup(key, len), len, g};
    promote(c, c->n++);
    return eng_grammar_ref(g);
}

/* The vocabulary tries, built on the first compile. */
static int vocab(gw_grammars *c, util_err *err)
{
    return c->voc != NULL ? 0 : eng_gvocab_new(&c->voc, c->tok, err);
}

int gw_grammars_get(gw_grammars *c, const char *schema, size_t len, eng_grammar **out,
                    util_err *err)
{
    size_t kl = schema != NULL ? 7 + len : 6;
    char *key = util_xmalloc(kl + 1);
    if (schema != NULL) {
        memcpy(key, "schema:", 7);
        memcpy(key + 7, schema, len);
    } else {
        memcpy(key, "object", 6);
    }
    uint64_t h = XXH3_64bits(key, kl);
    int rc = 0;
    eng_grammar *g;
    if ((*out = lookup(c, key, kl, h)) != NULL)
        goto out;
    if ((rc = vocab(c, err)) != 0 ||
        (rc = eng_grammar_compile(&g, c->voc, schema, len, err)) != 0) {
        c->st.refused++;
        goto out;
    }
    *out = insert(c, key, kl, h, g);
out:
    free(key);
    return rc;
}

int gw_grammars_get_tools(gw_grammars *c, const char *key, size_t key_len,
                          const eng_tool_spec *tools, int n, const eng_tool_format *fmt,
                          bool required, eng_grammar **out, util_err *err)
{
    uint64_t h = XXH3_64bits(key, key_len);
    if ((*out = lookup(c, key, key_len, h)) != NULL)
        return 0;
    int rc;
    eng_grammar *g;
    if ((rc = vocab(c, err)) != 0 ||
        (rc = eng_grammar_compile_tools(&g, c->voc, tools, n, fmt, required, err)) != 0) {
        c->st.refused++;
        return rc;
    }
    *out = insert(c, key, key_len, h, g);
    return 0;
}

void gw_grammars_stats_get(const gw_grammars *c, gw_grammars_stats *out)
{
    *out = c->st;
}
