/* engine/text/tokenizer.c: byte-level BPE as llama.cpp runs it. Text is cut at special-token texts
 * (llama.cpp's tokenizer_st_partition), each remaining fragment is split into words
 * (engine/text/pretok.c), and each word is merged by rank from single bytes.
 *
 * BPE works on raw bytes, not on the GPT-2 encoded strings the file stores: every string BPE can
 * build (token texts, merge halves and results) is decoded to its bytes once at load and interned
 * as a "symbol" id, so a merge is a lookup of the pair (left symbol, right symbol) and a symbol's
 * token is an array index. Strings with a character outside the byte map can never be built by BPE
 * and are left out. Vocabulary, specials and pieces: engine/text/tokenizer_vocab.c. */
#include "engine/text/tokenizer_internal.h"

#include "engine/text/unicode.h"

#include <stdlib.h>
#include <string.h>

/* ---- output ---- */

typedef struct out_ids {
    int32_t **ids;
    size_t *n, *cap;
} out_ids;

static int push(out_ids *o, int32_t id)
{
    if (*o->n == *o->cap) {
        size_t cap = *o->cap < 64 ? 64 : *o->cap * 2;
        int32_t *p = realloc(*o->ids, cap * sizeof *p);
        if (p == NULL)
            return LLMGW_ENOMEM;
        *o->ids = p;
        *o->cap = cap;
    }
    (*o->ids)[(*o->n)++] = id;
    return 0;
}

/* ---- BPE over one word ---- */

typedef struct bpe_sym {
    uint32_t sid;      /* symbol id, or DEAD once merged into its left neighbour */
    int32_t prev, next;
} bpe_sym;

typedef struct bpe_pair {
    int32_t rank;
    int32_t left, right;
    uint32_t lsid, rsid;  /* what the two symbols were when the pair was queued */
    uint32_t merged;      /* the symbol they make */
} bpe_pair;

#define DEAD UINT32_MAX

typedef struct bpe_work {
    bpe_sym *sym;    /* [cap] */
    bpe_pair *heap;  /* [3 * cap]: n - 1 first pairs, then at most 2 per merge */
    size_t cap, n_heap;
} bpe_work;

static int bpe_reserve(bpe_work *b, size_t n)
{
    if (n <= b->cap)
        return 0;
    size_t cap = n < 64 ? 64 : n;
    bpe_sym *sym = malloc(cap * sizeof *sym);
    bpe_pair *heap = malloc(3 * cap * sizeof *heap);
    if (sym == NULL || heap == NULL) {
        free(sym);
        free(heap);
        return LLMGW_ENOMEM;
    }
    free(b->sym);
    free(b->heap);
    b->sym = sym;
    b->heap = heap;
    b->cap = cap;
    return 0;
}

/* llama.cpp pops the lowest rank first, and of equal ranks the leftmost pair. */
static inline bool pair_before(const bpe_pair *a, const bpe_pair *b)
{
    return a->rank < b->rank || (a->rank == b->rank && a->left < b->left);
}

static void heap_push(bpe_work *b, bpe_pair p)
{
    size_t i = b->n_heap++;
    while (i > 0) {
        size_t up = (i - 1) / 2;
        if (!pair_before(&p, &b->heap[up]))
            break;
        b->heap[i] = b->heap[up];
        i = up;
    }
    b->heap[i] = p;
}

static bpe_pair heap_pop(bpe_work *b)
{
    bpe_pair top = b->heap[0], last = b->heap[--b->n_heap];
    size_t i = 0, n = b->n_heap;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && pair_before(&b->heap[c + 1], &b->heap[c]))
            c++;
        if (!pair_before(&b->heap[c], &last))
            break;
        b->heap[i] = b->heap[c];
        i = c;
    }
    if (n > 0)
        b->heap[i] = last;
    return top;
}

static void queue_pair(const eng_tokenizer *t, bpe_work *b, int32_t left, int32_t right)
{
    if (left < 0 || right < 0)
        return;
    const eng__merge *m = eng__merge_find(t, b->sym[left].sid, b->sym[right].sid);
    if (m == NULL)
        return;
    heap_push(b, (bpe_pair){m->rank, left, right, b->sym[left].sid, b->sym[right].sid,
                            m->merged});
}

/* The token of a finished symbol; a symbol that is no token (a vocabulary without some byte or
 * merge result) becomes, as in llama.cpp, the one-byte tokens of its encoded text's bytes. */
static int emit_sym(const eng_tokenizer *t, uint32_t sid, out_ids *o)
{
    int32_t id = t->sym_tok[sid];
    if (id >= 0)
        return push(o, id);
    const unsigned char *s = (const unsigned char *)t->syms.blob + t->syms.off[sid];
    for (uint32_t i = 0; i < t->syms.len[sid]; i++) {
        unsigned char enc[4];
        size_t m = eng_utf8_put(eng_bytelevel_cpt(s[i]), enc);
        for (size_t j = 0; j < m; j++)
            if (t->single_tok[enc[j]] >= 0 && push(o, t->single_tok[enc[j]]) != 0)
                return LLMGW_ENOMEM;
    }
    return 0;
}

static int bpe_word(const eng_tokenizer *t, bpe_work *b, const unsigned char *w, size_t n,
                    out_ids *o)
{
    if (t->ignore_merges) {
        int64_t sid = eng__strtab_find(&t->syms, w, n);
        if (sid >= 0 && t->sym_tok[sid] >= 0)
            return push(o, t->sym_tok[sid]);
    }
    if (n == 1)
        return emit_sym(t, t->byte_sym[w[0]], o);
    if (bpe_reserve(b, n) != 0)
        return LLMGW_ENOMEM;
    for (size_t i = 0; i < n; i++)
        b->sym[i] = (bpe_sym){t->byte_sym[w[i]], (int32_t)i - 1, i + 1 < n ? (int32_t)i + 1 : -1};
    b->n_heap = 0;
    for (size_t i = 1; i < n; i++)
        queue_pair(t, b, (int32_t)i - 1, (int32_t)i);
    while (b->n_heap > 0) {
        bpe_pair p = heap_pop(b);
        bpe_sym *l = &b->sym[p.left], *r = &b->sym[p.right];
        if (l->sid != p.lsid || r->sid != p.rsid)  /* stale: one side changed since */
            continue;
        l->sid = p.merged;
        r->sid = DEAD;
        l->next = r->next;
        if (r->next >= 0)
            b->sym[r->next].prev = p.left;
        queue_pair(t, b, l->prev, p.left);
        queue_pair(t, b, p.left, l->next);
    }
    for (int32_t i = 0; i >= 0; i = b->sym[i].next)
        if (emit_sym(t, b->sym[i].sid, o) != 0)
            return LLMGW_ENOMEM;
    return 0;
}

/* ---- special-token partition ---- */

typedef struct frag {
    int32_t tok;       /* a special token, or -1 for raw text */
    uint32_t off, len; /* raw text */
} frag;

typedef struct frags {
    frag *v;
    size_t n, cap;
} frags;

static int frag_add(frags *f, frag x)
{
    if (f->n == f->cap) {
        size_t cap = f->cap < 16 ? 16 : f->cap * 2;
        frag *v = realloc(f->v, cap * sizeof *v);
        if (v == NULL)
            return LLMGW_ENOMEM;
        f->v = v;
        f->cap = cap;
    }
    f->v[f->n++] = x;
    return 0;
}

/* llama.cpp's order: each special in turn (longest text first) cuts every raw fragment at all
 * of its occurrences, left to right. Control and unknown tokens take part only with
 * parse_special; user-defined ones always do. */
static int partition(const eng_tokenizer *t, const char *text, size_t len, bool parse_special,
                     frags *cur, frags *next)
{
    uint8_t present[32] = {0};
    for (size_t i = 0; i < len; i++)
        present[(uint8_t)text[i] >> 3] |= (uint8_t)(1u << ((uint8_t)text[i] & 7));
    cur->n = 0;
    if (frag_add(cur, (frag){-1, 0, (uint32_t)len}) != 0)
        return LLMGW_ENOMEM;
    for (size_t s = 0; s < t->n_special; s++) {
        int32_t id = t->special[s];
        if (!parse_special && (t->attr[id] & (ENG__ATTR_CONTROL | ENG__ATTR_UNKNOWN)))
            continue;
        const char *st = t->text + t->text_off[id];
        size_t sl = t->text_off[id + 1] - t->text_off[id];
        if (!(present[(uint8_t)st[0] >> 3] & (1u << ((uint8_t)st[0] & 7))))
            continue;
        next->n = 0;
        for (size_t i = 0; i < cur->n; i++) {
            frag f = cur->v[i];
            while (f.tok < 0 && f.len >= sl) {
                const char *hit = memmem(text + f.off, f.len, st, sl);
                if (hit == NULL)
                    break;
                uint32_t at = (uint32_t)(hit - text);
                if (at > f.off && frag_add(next, (frag){-1, f.off, at - f.off}) != 0)
                    return LLMGW_ENOMEM;
                if (frag_add(next, (frag){id, 0, 0}) != 0)
                    return LLMGW_ENOMEM;
                f.len -= (at - f.off) + (uint32_t)sl;
                f.off = at + (uint32_t)sl;
            }
            if ((f.tok >= 0 || f.len > 0) && frag_add(next, f) != 0)
                return LLMGW_ENOMEM;
        }
        frags tmp = *cur;
        *cur = *next;
        *next = tmp;
    }
    return 0;
}

/* ---- tokenize ---- */

int eng_tokenize(const eng_tokenizer *t, const char *text, size_t len, bool add_bos,
                 bool parse_special, int32_t **ids, size_t *n, size_t *cap)
{
    out_ids o = {ids, n, cap};
    frags cur = {0}, next = {0};
    eng_pretok_work pw = {0};
    bpe_work bw = {0};
    int rc = 0;
    if (add_bos && t->bos >= 0 && (rc = push(&o, t->bos)) != 0)
        return rc;
    if (len == 0)
        return 0;
    if (len >= (1u << 30))
        return LLMGW_ENOMEM;
    if ((rc = partition(t, text, len, parse_special, &cur, &next)) != 0)
        goto out;
    for (size_t i = 0; i < cur.n && rc == 0; i++) {
        frag f = cur.v[i];
        if (f.tok >= 0) {
            rc = push(&o, f.tok);
            continue;
        }
        const uint32_t *ends;
        const char *words;
        size_t n_words;
        if ((rc = eng_pretok_split(t->pre, text + f.off, f.len, &pw, &words, &ends, &n_words)) != 0)
            break;
        const unsigned char *base = (const unsigned char *)words;
        for (size_t w = 0, start = 0; w < n_words && rc == 0; start = ends[w++])
            rc = bpe_word(t, &bw, base + start, ends[w] - start, &o);
    }
out:
    free(cur.v);
    free(next.v);
    eng_pretok_work_deinit(&pw);
    free(bw.sym);
    free(bw.heap);
    return rc;
}

/* ---- streaming detokenization ---- */

/* The length of the UTF-8 character that starts with byte c, or 0 if none can. */
static size_t utf8_len(unsigned char c)
{
    if (c < 0x80)
        return 1;
    if (c >= 0xc2 && c <= 0xdf)
        return 2;
    if (c >= 0xe0 && c <= 0xef)
        return 3;
    if (c >= 0xf0 && c <= 0xf4)
        return 4;
    return 0;
}

/* Whether c may follow `lead` as byte i (1-3) of a well-formed character. */
static bool utf8_cont_ok(unsigned char lead, size_t i, unsigned char c)
{
    if ((c & 0xc0) != 0x80)
        return false;
    if (i != 1)
        return true;
    switch (lead) {
    case 0xe0: return c >= 0xa0;  /* no overlong forms */
    case 0xed: return c <= 0x9f;  /* no surrogates */
    case 0xf0: return c >= 0x90;
    case 0xf4: return c <= 0x8f;  /* nothing past U+10FFFF */
    default: return true;
    }
}

size_t eng_detok_push(eng_detok *d, const char *piece, size_t len, char *out)
{
    size_t n_out = 0, total = d->n_pending + len, i = 0;
    /* The bytes are pending[0..n_pending) then piece[0..len). */
#define BYTE(k) ((k) < d->n_pending ? d->pending[k] : (unsigned char)piece[(k) - d->n_pending])
    while (i < total) {
        unsigned char c = BYTE(i);
        size_t need = utf8_len(c), k = 1;
        while (k < need && i + k < total && utf8_cont_ok(c, k, BYTE(i + k)))
            k++;
        if (need > 1 && k < need && i + k == total) {  /* may still complete: keep it */
            unsigned char keep[4];
            for (size_t j = 0; j < k; j++)
                keep[j] = BYTE(i + j);
            memcpy(d->pending, keep, k);
            d->n_pending = k;
            return n_out;
        }
        if (need == 0 || k < need) {
            /* Can never complete: the maximal subpart (the lead byte and the continuations that
             * fitted it, or a lone byte) becomes one U+FFFD. */
            memcpy(out + n_out, "\xef\xbf\xbd", 3);
            n_out += 3;
        } else {
            for (size_t j = 0; j < k; j++)
                out[n_out++] = (char)BYTE(i + j);
        }
        i += k;
    }
#undef BYTE
    d->n_pending = 0;
    return n_out;
}

size_t eng_detok_flush(eng_detok *d, char *out)
{
    (void)out;  /* an incomplete tail is dropped: see engine/text/tokenizer.h */
    d->n_pending = 0;
    return 0;
}
