/* engine/text/grammar_vocab.c: the vocabulary as byte tries for the grammar's mask (all tokens,
 * and those a plain string cannot take whole), with the token sets the mask takes without a
 * walk (engine/text/grammar.h). */
#include "engine/text/grammar_internal.h"

#include "common/arena.h"

#include <string.h>

typedef struct sort_item {
    const char *p;
    uint32_t len;
    int32_t id;
} sort_item;

static int item_cmp(const void *a, const void *b)
{
    const sort_item *x = a, *y = b;
    uint32_t n = x->len < y->len ? x->len : y->len;
    int c = memcmp(x->p, y->p, n);
    if (c != 0)
        return c;
    return (x->len > y->len) - (x->len < y->len);
}

static uint32_t trie_alloc(trie *t, uint32_t n)
{
    if (t->n + n > t->cap) {
        while (t->n + n > t->cap)
            t->cap = t->cap ? 2 * t->cap : 1024;
        t->nodes = gr_xrealloc(t->nodes, (size_t)t->cap * sizeof *t->nodes);
    }
    uint32_t at = t->n;
    memset(t->nodes + at, 0, (size_t)n * sizeof *t->nodes);
    t->n += n;
    return at;
}

/* Node `at` stands for the prefix of length depth shared by items[lo..hi). */
static void trie_fill(trie *t, const sort_item *items, uint32_t at, uint32_t lo, uint32_t hi,
                      uint32_t depth)
{
    uint32_t i = lo;
    while (i < hi && items[i].len == depth)
        i++;
    t->nodes[at].tok0 = lo;
    t->nodes[at].n_tok = (uint16_t)(i - lo);
    uint32_t groups = 0;
    for (uint32_t j = i; j < hi; j++)
        if (j == i || items[j].p[depth] != items[j - 1].p[depth])
            groups++;
    if (groups == 0)
        return;
    uint32_t first = trie_alloc(t, groups);
    t->nodes[at].first_child = first;
    t->nodes[at].n_children = groups;
    uint32_t g = 0, start = i;
    for (uint32_t j = i + 1; j <= hi; j++) {
        if (j < hi && items[j].p[depth] == items[start].p[depth])
            continue;
        t->nodes[first + g].byte = (uint8_t)items[start].p[depth];
        trie_fill(t, items, first + g, start, j, depth + 1);
        g++;
        start = j;
    }
}

static void trie_build(trie *t, sort_item *items, uint32_t n)
{
    qsort(items, n, sizeof *items, item_cmp);
    t->ids = util_xmalloc((n ? n : 1) * sizeof *t->ids);
    for (uint32_t i = 0; i < n; i++)
        t->ids[i] = items[i].id;
    trie_alloc(t, 1);
    trie_fill(t, items, 0, 0, n, 0);
}

/* Whole UTF-8 characters only, no control byte, no quote, no backslash: then *chars is how
 * many characters. */
static bool is_plain(const unsigned char *p, uint32_t n, int *chars)
{
    *chars = 0;
    for (uint32_t i = 0; i < n; (*chars)++) {
        unsigned c = p[i];
        if (c < 0x20 || c == '"' || c == '\\')
            return false;
        if (c < 0x80) {
            i++;
            continue;
        }
        unsigned need, lo = 0x80, hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF) need = 1;
        else if (c >= 0xE0 && c <= 0xEF) need = 2, lo = c == 0xE0 ? 0xA0 : 0x80,
                                         hi = c == 0xED ? 0x9F : 0xBF;
        else if (c >= 0xF0 && c <= 0xF4) need = 3, lo = c == 0xF0 ? 0x90 : 0x80,
                                         hi = c == 0xF4 ? 0x8F : 0xBF;
        else return false;
        if (i + need >= n)
            return false;
        if (p[i + 1] < lo || p[i + 1] > hi)
            return false;
        for (unsigned k = 2; k <= need; k++)
            if (p[i + k] < 0x80 || p[i + k] > 0xBF)
                return false;
        i += need + 1;
    }
    return true;
}

int eng_gvocab_new(eng_gvocab **out, const eng_tokenizer *tok, util_err *err)
{
    int32_t n = eng_tokenizer_n_vocab(tok);
    if (n <= 0)
        return util_err_set(err, LLMGW_EINVAL, "grammar: the tokenizer has no vocabulary");
    eng_gvocab *v = util_xcalloc(1, sizeof *v);
    v->n_vocab = n;
    v->words = (n + 31) / 32;
    v->off = util_xmalloc((size_t)n * sizeof *v->off);
    v->len = util_xmalloc((size_t)n * sizeof *v->len);
    v->eog = util_xcalloc((size_t)v->words, sizeof *v->eog);
    v->plain = util_xcalloc((size_t)v->words, sizeof *v->plain);
    v->any = util_xcalloc((size_t)v->words, sizeof *v->any);
    for (int r = 0; r <= UPTO; r++)
        v->upto[r] = util_xcalloc((size_t)v->words, sizeof *v->upto[r]);
    size_t cap = 1 << 16, used = 0;
    v->blob = util_xmalloc(cap);
    char buf[256];
    for (int32_t id = 0; id < n; id++) {
        if (eng_tokenizer_is_eog(tok, id)) {
            v->eog[id / 32] |= 1u << (id % 32);
            v->n_eog++;
        }
        int k = eng_token_piece(tok, id, false, buf, sizeof buf);
        char *big = NULL;
        if (k > (int)sizeof buf) {
            big = util_xmalloc((size_t)k);
            k = eng_token_piece(tok, id, false, big, (size_t)k);
        }
        if (k < 0)
            k = 0;
        if (used + (size_t)k > cap) {
            while (used + (size_t)k > cap)
                cap *= 2;
            v->blob = gr_xrealloc(v->blob, cap);
        }
        memcpy(v->blob + used, big ? big : buf, (size_t)k);
        free(big);
        v->off[id] = (uint32_t)used;
        v->len[id] = (uint32_t)k;
        used += (size_t)k;
    }
    sort_item *all = util_xmalloc((size_t)n * sizeof *all);
    sort_item *rest = util_xmalloc((size_t)n * sizeof *rest);
    uint32_t n_all = 0, n_rest = 0;
    for (int32_t id = 0; id < n; id++) {
        if (v->len[id] == 0)
            continue;
        sort_item it = {v->blob + v->off[id], v->len[id], id};
        all[n_all++] = it;
        v->any[id / 32] |= 1u << (id % 32);
        v->n_any++;
        int chars;
        if (is_plain((const unsigned char *)it.p, it.len, &chars)) {
            v->plain[id / 32] |= 1u << (id % 32);
            v->n_plain++;
            v->plain_chars = chars > v->plain_chars ? chars : v->plain_chars;
            for (int r = chars; r <= UPTO; r++) {
                v->upto[r][id / 32] |= 1u << (id % 32);
                v->n_upto[r]++;
            }
        } else {
            rest[n_rest++] = it;
        }
    }
    trie_build(&v->all, all, n_all);
    trie_build(&v->rest, rest, n_rest);
    free(all);
    free(rest);
    *out = v;
    return 0;
}

void eng_gvocab_free(eng_gvocab *v)
{
    if (v == NULL)
        return;
    free(v->off);
    free(v->len);
    free(v->blob);
    free(v->eog);
    free(v->plain);
    free(v->any);
    for (int r = 0; r <= UPTO; r++)
        free(v->upto[r]);
    free(v->all.nodes);
    free(v->all.ids);
    free(v->rest.nodes);
    free(v->rest.ids);
    free(v);
}

int32_t eng_gvocab_n_vocab(const eng_gvocab *v) { return v->n_vocab; }
