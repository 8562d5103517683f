/* engine/text/grammar.c: JSON schema -> a character-level pushdown machine, and the token mask.
 *
 * The machine is a stack of frames (eng_gframe), one per open value: an object, an array, a
 * string, a number, a literal (enum values, true/false/null, an object's declared keys) or a
 * value not yet begun. feed() takes one byte; a frame that ends pops and tells its parent.
 * Every prefix the machine accepts can be completed, so masking never leads into a dead end.
 *
 * The mask walks the vocabulary's byte trie depth first with a copy of the state per edge: a
 * byte the machine refuses prunes the whole subtree. Inside a plain string (the common case)
 * every "plain" token (printable, no quote or backslash, whole UTF-8 characters) is allowed
 * without a walk, and only the other tokens are walked, in a second, much smaller trie. */
#include "engine/text/grammar.h"

#include "common/arena.h"

#include <cjson/cJSON.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define WS_MAX 16
#define NUM_MAX 24
#define MAX_NODES 4096
#define MAX_LITS 64
#define COMPILE_DEPTH 64
#define UPTO 32

enum { T_NULL = 1, T_BOOL = 2, T_INT = 4, T_NUM = 8, T_STR = 16, T_ARR = 32, T_OBJ = 64,
       T_ANY = 127 };
enum { F_VALUE, F_OBJ, F_ARR, F_STR, F_NUM, F_LIT, F_AUTO, F_TEXT, F_CALL };
enum { O_OPEN, O_KEY, O_COLON, O_VALUE, O_AFTER, O_COMMA };
enum { A_OPEN, A_VALUE, A_AFTER, A_COMMA };
enum { N_MINUS, N_ZERO, N_INT, N_DOT, N_FRAC, N_E, N_ESIGN, N_EXP };
enum { L_ENUM = 0, L_KEY = 1, L_WORD = 2 };   /* eng_gframe.key of a literal frame */
enum { FMT_NONE, FMT_DATE, FMT_TIME, FMT_DATETIME, FMT_UUID };
enum { NODE_ANY = 0, NODE_PLAIN = 1 };         /* made first by every compile */

static void *xrealloc(void *p, size_t n)
{
    void *q = realloc(p, n);
    if (q == NULL)
        abort();
    return q;
}

/* ---- the vocabulary -------------------------------------------------------------------------- */

typedef struct tnode {
    uint32_t first_child, n_children;
    uint32_t tok0;        /* tokens spelled exactly like this node's prefix: ids[tok0..+n_tok) */
    uint16_t n_tok;
    uint8_t byte;
} tnode;

typedef struct trie {
    tnode *nodes;         /* [n]; 0 is the root */
    uint32_t n, cap;
    int32_t *ids;         /* the trie's tokens, sorted by their bytes */
} trie;

struct eng_gvocab {
    int32_t n_vocab;
    uint32_t *off, *len;  /* [n_vocab] each token's bytes in blob */
    char *blob;
    uint32_t *eog;        /* [words] end-of-generation tokens */
    uint32_t *plain;      /* [words] tokens a plain string takes whole (file comment) */
    uint32_t *any;        /* [words] every token with bytes (free text takes them all) */
    int n_any;
    int n_plain, n_eog, words;
    /* A string with a maxLength and room for r more characters takes the plain tokens of at
     * most r characters: upto[r] for r <= UPTO (the plain set itself from plain_chars on). */
    uint32_t *upto[UPTO + 1];
    int n_upto[UPTO + 1];
    int plain_chars;      /* the most characters a plain token has */
    trie all, rest;       /* every token with bytes; those not plain */
};

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
        t->nodes = xrealloc(t->nodes, (size_t)t->cap * sizeof *t->nodes);
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
            v->blob = xrealloc(v->blob, cap);
        }
        memcpy(v->blob + used, big ? big : buf, (size_t)k);
        free(big);
        v->off[id] = (uint32_t)used;
        v->len[id] = (uint32_t)k;
        used += (size_t)k;
    }
    sort_item *all = util_xmalloc((size_t)n * sizeof *all), *rest = util_xmalloc((size_t)n * sizeof *rest);
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

/* ---- the compiled schema ---------------------------------------------------------------------- */

typedef struct gnode {
    unsigned types;
    int ref;              /* >= 0: this node is that node ($ref) */
    bool is_enum;
    int lit0, n_lits;     /* enum: g->lits[lit0..) */
    int prop0, n_props;   /* object: g->props[prop0..) in generation order */
    int free_keys;        /* object: the node of undeclared keys' values, or -1: none */
    int items;            /* array: the items' node */
    int min_items, max_items;   /* max -1: none */
    int min_len, max_len;       /* strings; max -1: none */
    int format;
    int alt0, n_alts;     /* anyOf / oneOf: g->alts[alt0..) */
} gnode;

typedef struct gprop {
    int key;              /* g->lits index: the key in JSON, quotes included */
    int node;
    bool required;
} gprop;

typedef struct glit {
    uint32_t off, len;
} glit;

struct eng_grammar {
    atomic_int refs;
    const eng_gvocab *v;
    gnode *nodes;
    int n_nodes, root;
    gprop *props;
    int n_props;
    int *alts;
    int n_alts;
    glit *lits;           /* 0..2: true, false, null */
    int n_lits;
    char *text;
    size_t text_len;
    /* A tool call (eng_grammar_compile_tools): */
    int n_tools;
    int call_lit0;        /* lits[call_lit0 + i]: tool i's opening, up to its arguments */
    int *tool_args;       /* [n_tools] the arguments' nodes */
    int close_lit;        /* what follows the arguments */
    int trigger_lit;      /* auto: the text that starts a call; -1: a call is required */
};

static int resolve(const eng_grammar *g, int n)
{
    while (g->nodes[n].ref >= 0)
        n = g->nodes[n].ref;
    return n;
}

static const glit *frame_lit(const eng_grammar *g, const eng_gframe *f, int i)
{
    const gnode *nd = &g->nodes[f->node];
    if (f->key == L_KEY)
        return &g->lits[g->props[nd->prop0 + i].key];
    if (f->key == L_WORD)
        return &g->lits[i];
    return &g->lits[nd->lit0 + i];
}

/* ---- the machine -------------------------------------------------------------------------------- */

static bool is_ws(unsigned c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }
static bool is_digit(unsigned c) { return c >= '0' && c <= '9'; }
static bool is_hex(unsigned c)
{
    return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

static bool ws(eng_gframe *f)
{
    if (f->ws >= WS_MAX)
        return false;
    f->ws++;
    return true;
}

static int fmt_len(int format)
{
    static const int len[] = {0, 10, 9, 20, 36};
    return len[format];
}

static int days_in(int y, int m)
{
    static const int d[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    if (m == 2 && ((y % 4 == 0 && y % 100 != 0) || y % 400 == 0))
        return 29;
    return d[m - 1];
}

/* Position p (0..9) of YYYY-MM-DD, s the characters before it. */
static bool date_ok(const char *s, int p, unsigned c)
{
    if (p == 4 || p == 7)
        return c == '-';
    if (!is_digit(c))
        return false;
    if (p == 3)
        return !(s[0] == '0' && s[1] == '0' && s[2] == '0' && c == '0');   /* year 1..9999 */
    if (p == 5)
        return c <= '1';
    if (p == 6)
        return s[5] == '0' ? c != '0' : c <= '2';
    int y = (s[0] - '0') * 1000 + (s[1] - '0') * 100 + (s[2] - '0') * 10 + (s[3] - '0');
    int m = (s[5] - '0') * 10 + (s[6] - '0');
    if (p == 8)
        return c <= '2' || (c == '3' && days_in(y, m) >= 30);
    if (p == 9) {
        int d = (s[8] - '0') * 10 + (int)(c - '0');
        return d >= 1 && d <= days_in(y, m);
    }
    return true;
}

/* Position p (0..8) of HH:MM:SSZ; h1 the hour's first digit once there. */
static bool time_ok(char h1, int p, unsigned c)
{
    switch (p) {
    case 0: return c >= '0' && c <= '2';
    case 1: return is_digit(c) && (h1 != '2' || c <= '3');
    case 2: case 5: return c == ':';
    case 3: case 6: return c >= '0' && c <= '5';
    case 4: case 7: return is_digit(c);
    default: return c == 'Z';
    }
}

static bool fmt_ok(int format, const eng_gframe *f, unsigned c)
{
    int p = f->n;
    if (p >= fmt_len(format))
        return false;
    switch (format) {
    case FMT_DATE: return date_ok(f->fmt, p, c);
    case FMT_TIME: return time_ok(f->fmt[0], p, c);
    case FMT_DATETIME:
        if (p < 10)
            return date_ok(f->fmt, p, c);
        if (p == 10)
            return c == 'T';
        return time_ok(f->fmt[11], p - 11, c);
    default:
        if (p == 8 || p == 13 || p == 18 || p == 23)
            return c == '-';
        return is_hex(c);
    }
}

static bool push(eng_gstate *st, int kind, int node, int phase)
{
    if (st->depth >= ENG_GRAMMAR_MAX_DEPTH)
        return false;
    eng_gframe *f = &st->f[st->depth++];
    memset(f, 0, sizeof *f);
    f->kind = (uint8_t)kind;
    f->node = (uint16_t)node;
    f->phase = (uint8_t)phase;
    return true;
}

/* The declared properties an object at property `next` may emit next (a bit per property). */
static uint64_t key_cands(const eng_grammar *g, const gnode *nd, int next)
{
    uint64_t c = 0;
    for (int j = next; j < nd->n_props; j++) {
        c |= 1ull << j;
        if (g->props[nd->prop0 + j].required)
            break;
    }
    return c;
}

static bool required_left(const eng_grammar *g, const gnode *nd, int next)
{
    for (int j = next; j < nd->n_props; j++)
        if (g->props[nd->prop0 + j].required)
            return true;
    return false;
}

/* The literal frame's chosen literal once it ended: the one as long as its position. */
static int lit_chosen(const eng_grammar *g, const eng_gframe *f)
{
    for (int i = 0; i < 64; i++)
        if ((f->cand >> i & 1) && frame_lit(g, f, i)->len == f->n)
            return i;
    return -1;
}

/* The top frame's value is whole: pop it and move its parent on. */
static void pop(const eng_grammar *g, eng_gstate *st)
{
    eng_gframe child = st->f[--st->depth];
    if (st->depth == 0) {
        st->done = true;
        return;
    }
    eng_gframe *p = &st->f[st->depth - 1];
    p->ws = 0;
    if (p->kind == F_CALL) {   /* the arguments are whole: the call's closing follows */
        p->phase = 2;
        p->n = 0;
        return;
    }
    if (p->kind == F_ARR) {
        p->n++;
        p->phase = A_AFTER;
    } else if (p->phase == O_KEY) {
        if (child.kind == F_LIT)
            p->n = (uint16_t)lit_chosen(g, &child);
        p->phase = O_COLON;
    } else {
        if (g->nodes[p->node].n_props > 0)
            p->n++;
        p->phase = O_AFTER;
    }
}

/* Whether the top frame may end here (a number or a literal ends only when what follows is
 * not part of it). */
static bool may_end(const eng_grammar *g, const eng_gframe *f)
{
    if (f->kind == F_NUM)
        return f->phase == N_ZERO || f->phase == N_INT || f->phase == N_FRAC ||
               f->phase == N_EXP;
    if (f->kind == F_LIT)
        return lit_chosen(g, f) >= 0;
    return f->kind == F_TEXT || f->kind == F_AUTO;
}

/* 1: taken; 0: refused; 2: the number ended before c. */
static int num_char(const gnode *nd, eng_gframe *f, unsigned c)
{
    bool integer = !(nd->types & T_NUM);
    bool end = f->phase == N_ZERO || f->phase == N_INT || f->phase == N_FRAC ||
               f->phase == N_EXP;
    int next = -1;
    if (is_digit(c)) {
        switch (f->phase) {
        case N_MINUS: next = c == '0' ? N_ZERO : N_INT; break;
        case N_INT: next = N_INT; break;
        case N_DOT: case N_FRAC: next = N_FRAC; break;
        case N_E: case N_ESIGN: case N_EXP: next = N_EXP; break;
        default: break;
        }
        if (next >= 0 && f->n + 1 > NUM_MAX)
            next = -1;
    } else if (c == '.' && !integer && (f->phase == N_ZERO || f->phase == N_INT) &&
               f->n + 2 <= NUM_MAX) {
        next = N_DOT;
    } else if ((c == 'e' || c == 'E') && !integer &&
               (f->phase == N_ZERO || f->phase == N_INT || f->phase == N_FRAC) &&
               f->n + 2 <= NUM_MAX) {
        next = N_E;
    } else if ((c == '-' || c == '+') && f->phase == N_E && f->n + 2 <= NUM_MAX) {
        next = N_ESIGN;
    }
    if (next < 0)
        return end ? 2 : 0;
    f->phase = (uint8_t)next;
    f->n++;
    return 1;
}

/* 1: taken; 0: refused; 2: the literal ended before c. */
static int lit_char(const eng_grammar *g, eng_gframe *f, unsigned c)
{
    uint64_t next = 0;
    for (int i = 0; i < 64; i++) {
        if (!(f->cand >> i & 1))
            continue;
        const glit *l = frame_lit(g, f, i);
        if (l->len > f->n && (unsigned char)g->text[l->off + f->n] == c)
            next |= 1ull << i;
    }
    if (next != 0) {
        f->cand = next;
        f->n++;
        return 1;
    }
    return lit_chosen(g, f) >= 0 ? 2 : 0;
}

static bool str_char(const eng_grammar *g, eng_gstate *st, eng_gframe *f, unsigned c)
{
    const gnode *nd = &g->nodes[f->node];
    if (f->esc == 1) {
        if (c == 'u') {
            f->esc = 2;
            return true;
        }
        f->esc = 0;
        return c == '"' || c == '\\' || c == '/' || c == 'b' || c == 'f' || c == 'n' ||
               c == 'r' || c == 't';
    }
    if (f->esc >= 2) {
        if (!is_hex(c))
            return false;
        f->esc = f->esc == 5 ? 0 : (uint8_t)(f->esc + 1);
        return true;
    }
    if (f->u8need > 0) {
        if (c < f->u8lo || c > f->u8hi)
            return false;
        f->u8need--;
        f->u8lo = 0x80;
        f->u8hi = 0xBF;
        return true;
    }
    if (c == '"') {
        if (f->n < nd->min_len || (nd->format && f->n != fmt_len(nd->format)))
            return false;
        pop(g, st);
        return true;
    }
    if (nd->format) {
        if (!fmt_ok(nd->format, f, c))
            return false;
        if (f->n < (int)sizeof f->fmt)
            f->fmt[f->n] = (char)c;
        f->n++;
        return true;
    }
    if (c < 0x20 || (nd->max_len >= 0 && f->n >= nd->max_len))
        return false;
    if (c == '\\') {
        f->esc = 1;
    } else if (c >= 0x80) {
        f->u8lo = 0x80;
        f->u8hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF) {
            f->u8need = 1;
        } else if (c >= 0xE0 && c <= 0xEF) {
            f->u8need = 2;
            f->u8lo = c == 0xE0 ? 0xA0 : 0x80;
            f->u8hi = c == 0xED ? 0x9F : 0xBF;
        } else if (c >= 0xF0 && c <= 0xF4) {
            f->u8need = 3;
            f->u8lo = c == 0xF0 ? 0x90 : 0x80;
            f->u8hi = c == 0xF4 ? 0x8F : 0xBF;
        } else {
            return false;
        }
    }
    f->n++;
    return true;
}

/* A value of f->node begins with c: the frame becomes that value's frame. */
static bool value_start(const eng_grammar *g, eng_gstate *st, eng_gframe *f, unsigned c)
{
    if (is_ws(c))
        return ws(f);
    int n = resolve(g, f->node);
    while (g->nodes[n].n_alts > 0) {
        const gnode *u = &g->nodes[n];
        int pick = -1;
        for (int a = 0; a < u->n_alts && pick < 0; a++) {
            int alt = resolve(g, g->alts[u->alt0 + a]);
            /* The alternatives start apart (checked at compile): the first that takes c. */
            const gnode *an = &g->nodes[alt];
            bool starts = an->n_alts > 0;
            if (!starts && an->is_enum) {
                for (int i = 0; i < an->n_lits && !starts; i++)
                    starts = (unsigned char)g->text[g->lits[an->lit0 + i].off] == c;
            } else if (!starts) {
                unsigned t = an->types;
                starts = (c == '{' && (t & T_OBJ)) || (c == '[' && (t & T_ARR)) ||
                         (c == '"' && (t & T_STR)) || ((c == 't' || c == 'f') && (t & T_BOOL)) ||
                         (c == 'n' && (t & T_NULL)) ||
                         ((c == '-' || is_digit(c)) && (t & (T_NUM | T_INT)));
            }
            if (starts)
                pick = alt;
        }
        if (pick < 0)
            return false;
        n = pick;
    }
    const gnode *nd = &g->nodes[n];
    f->node = (uint16_t)n;
    f->ws = 0;
    f->n = 0;
    if (nd->is_enum) {
        f->kind = F_LIT;
        f->key = L_ENUM;
        f->cand = nd->n_lits >= 64 ? ~0ull : (1ull << nd->n_lits) - 1;
        return lit_char(g, f, c) == 1;
    }
    unsigned t = nd->types;
    if (c == '{' && (t & T_OBJ)) {
        f->kind = F_OBJ;
        f->phase = O_OPEN;
        return true;
    }
    if (c == '[' && (t & T_ARR)) {
        f->kind = F_ARR;
        f->phase = A_OPEN;
        return true;
    }
    if (c == '"' && (t & T_STR)) {
        f->kind = F_STR;
        return true;
    }
    if ((c == '-' || is_digit(c)) && (t & (T_NUM | T_INT))) {
        f->kind = F_NUM;
        f->phase = N_MINUS;
        if (c == '-') {
            f->n = 1;
            return true;
        }
        return num_char(nd, f, c) == 1;
    }
    if (c == 't' || c == 'f' || c == 'n') {
        f->kind = F_LIT;
        f->key = L_WORD;
        f->cand = ((t & T_BOOL) ? 3u : 0u) | ((t & T_NULL) ? 4u : 0u);
        return f->cand != 0 && lit_char(g, f, c) == 1;
    }
    (void)st;
    return false;
}

static bool feed_byte(const eng_grammar *g, eng_gstate *st, unsigned c);

static bool obj_char(const eng_grammar *g, eng_gstate *st, eng_gframe *f, unsigned c)
{
    const gnode *nd = &g->nodes[f->node];
    bool declared = nd->n_props > 0;
    if (is_ws(c))
        return ws(f);
    switch (f->phase) {
    case O_OPEN:
    case O_COMMA:
        if (c == '}' && f->phase == O_OPEN && !(declared && required_left(g, nd, f->n))) {
            pop(g, st);
            return true;
        }
        if (c != '"')
            return false;
        f->ws = 0;
        if (declared) {
            uint64_t cand = key_cands(g, nd, f->n);
            if (cand == 0)
                return false;
            int node = f->node;
            f->phase = O_KEY;
            if (!push(st, F_LIT, node, 0))
                return false;
            eng_gframe *k = &st->f[st->depth - 1];
            k->key = L_KEY;
            k->cand = cand;
            return lit_char(g, k, c) == 1;
        }
        if (nd->free_keys < 0)
            return false;
        f->phase = O_KEY;
        return push(st, F_STR, NODE_PLAIN, 0);
    case O_COLON:
        if (c != ':')
            return false;
        f->phase = O_VALUE;
        return push(st, F_VALUE, declared ? g->props[nd->prop0 + f->n].node : nd->free_keys, 0);
    case O_AFTER:
        f->ws = 0;
        if (c == '}' && !(declared && required_left(g, nd, f->n))) {
            pop(g, st);
            return true;
        }
        if (c == ',' && (declared ? key_cands(g, nd, f->n) != 0 : true)) {
            f->phase = O_COMMA;
            return true;
        }
        return false;
    default:
        return false;
    }
}

static bool arr_char(const eng_grammar *g, eng_gstate *st, eng_gframe *f, unsigned c)
{
    const gnode *nd = &g->nodes[f->node];
    if (is_ws(c))
        return ws(f);
    f->ws = 0;
    switch (f->phase) {
    case A_OPEN:
        if (c == ']') {
            if (nd->min_items > 0)
                return false;
            pop(g, st);
            return true;
        }
        if (nd->max_items == 0)
            return false;
        /* fall through */
    case A_COMMA:
        f->phase = A_VALUE;
        if (!push(st, F_VALUE, nd->items, 0))
            return false;
        return feed_byte(g, st, c);
    case A_AFTER:
        if (c == ']' && f->n >= nd->min_items) {
            pop(g, st);
            return true;
        }
        if (c == ',' && (nd->max_items < 0 || f->n < nd->max_items)) {
            f->phase = A_COMMA;
            return true;
        }
        return false;
    default:
        return false;
    }
}

/* A tool call: its opening (a literal per tool: the first that completes picks the tool), the
 * arguments (a value of the tool's schema), then the closing. */
static bool call_char(const eng_grammar *g, eng_gstate *st, eng_gframe *f, unsigned c)
{
    if (f->phase == 0) {
        uint64_t next = 0;
        int last = -1;
        for (int i = 0; i < g->n_tools; i++) {
            const glit *l = &g->lits[g->call_lit0 + i];
            if ((f->cand >> i & 1) && l->len > f->n && (unsigned char)g->text[l->off + f->n] == c)
                next |= 1ull << i, last = i;
        }
        if (next == 0)
            return false;
        f->cand = next;
        f->n++;
        /* Openings differ after the name's closing quote, so none is a prefix of another. */
        if ((next & (next - 1)) == 0 && g->lits[g->call_lit0 + last].len == f->n) {
            f->phase = 1;
            f->node = (uint16_t)last;
            return push(st, F_VALUE, g->tool_args[last], 0);
        }
        return true;
    }
    if (f->phase != 2)
        return false;
    const glit *l = &g->lits[g->close_lit];
    if (f->n >= l->len || (unsigned char)g->text[l->off + f->n] != c)
        return false;
    if (++f->n == l->len)
        pop(g, st);
    return true;
}

/* auto: text, unless it begins with the trigger (after up to WS_MAX blanks): then a call. */
static bool auto_char(const eng_grammar *g, eng_gframe *f, unsigned c)
{
    const glit *t = &g->lits[g->trigger_lit];
    if (f->n == 0 && is_ws(c) && f->ws < WS_MAX) {
        f->ws++;
        return true;
    }
    if ((unsigned char)g->text[t->off + f->n] != c) {
        f->kind = F_TEXT;
        return true;
    }
    if (++f->n < t->len)
        return true;
    f->kind = F_CALL;   /* every opening begins with the trigger */
    f->phase = 0;
    f->cand = g->n_tools >= 64 ? ~0ull : (1ull << g->n_tools) - 1;
    return true;
}

static bool feed_byte(const eng_grammar *g, eng_gstate *st, unsigned c)
{
    for (;;) {
        if (st->done || st->depth == 0)
            return false;
        eng_gframe *f = &st->f[st->depth - 1];
        int r;
        switch (f->kind) {
        case F_VALUE: return value_start(g, st, f, c);
        case F_OBJ: return obj_char(g, st, f, c);
        case F_ARR: return arr_char(g, st, f, c);
        case F_STR: return str_char(g, st, f, c);
        case F_AUTO: return auto_char(g, f, c);
        case F_TEXT: return true;
        case F_CALL: return call_char(g, st, f, c);
        case F_NUM: r = num_char(&g->nodes[f->node], f, c); break;
        default: r = lit_char(g, f, c); break;
        }
        if (r != 2)
            return r == 1;
        pop(g, st);   /* the number or literal ended: c is for its parent */
    }
}

/* ---- states and the mask --------------------------------------------------------------------- */

void eng_gstate_init(const eng_grammar *g, eng_gstate *st)
{
    memset(st, 0, sizeof *st);
    st->depth = 1;
    st->f[0].kind = F_VALUE;
    st->f[0].node = (uint16_t)g->root;
    if (g->n_tools > 0) {
        st->f[0].kind = g->trigger_lit >= 0 ? F_AUTO : F_CALL;
        st->f[0].cand = g->n_tools >= 64 ? ~0ull : (1ull << g->n_tools) - 1;
    }
}

bool eng_gstate_complete(const eng_grammar *g, const eng_gstate *st)
{
    if (st->dead)
        return false;
    return st->done || (st->depth == 1 && may_end(g, &st->f[0]));
}

bool eng_grammar_feed(const eng_grammar *g, eng_gstate *st, const char *bytes, size_t len)
{
    if (st->dead)
        return false;
    for (size_t i = 0; i < len; i++)
        if (!feed_byte(g, st, (unsigned char)bytes[i])) {
            st->dead = true;
            return false;
        }
    return true;
}

bool eng_grammar_advance(const eng_grammar *g, eng_gstate *st, int32_t t)
{
    const eng_gvocab *v = g->v;
    if (st->dead || t < 0 || t >= v->n_vocab) {
        st->dead = true;
        return false;
    }
    if (v->eog[t / 32] >> (t % 32) & 1) {
        if (!eng_gstate_complete(g, st)) {
            st->dead = true;
            return false;
        }
        st->done = true;
        st->depth = 0;
        return true;
    }
    if (v->len[t] == 0) {
        st->dead = true;
        return false;
    }
    return eng_grammar_feed(g, st, v->blob + v->off[t], v->len[t]);
}

typedef struct walk {
    const eng_grammar *g;
    const trie *t;
    uint32_t *allow;
    int count;
} walk;

static void copy_state(eng_gstate *dst, const eng_gstate *src)
{
    dst->depth = src->depth;
    dst->done = src->done;
    dst->dead = false;
    memcpy(dst->f, src->f, (size_t)src->depth * sizeof *src->f);
}

static void dfs(walk *w, uint32_t node, const eng_gstate *st)
{
    const tnode *p = &w->t->nodes[node];
    for (uint32_t k = 0; k < p->n_children; k++) {
        uint32_t ci = p->first_child + k;
        const tnode *ch = &w->t->nodes[ci];
        eng_gstate ns;
        copy_state(&ns, st);
        if (!feed_byte(w->g, &ns, ch->byte))
            continue;
        for (uint32_t i = 0; i < ch->n_tok; i++) {
            int32_t id = w->t->ids[ch->tok0 + i];
            w->allow[id / 32] |= 1u << (id % 32);
            w->count++;
        }
        if (ch->n_children > 0)
            dfs(w, ci, &ns);
    }
}

int eng_grammar_allowed(const eng_grammar *g, const eng_gstate *st, uint32_t *allow)
{
    const eng_gvocab *v = g->v;
    memset(allow, 0, (size_t)v->words * sizeof *allow);
    if (st->dead)
        return 0;
    walk w = {.g = g, .t = &v->all, .allow = allow};
    if (eng_gstate_complete(g, st)) {
        for (int i = 0; i < v->words; i++)
            allow[i] |= v->eog[i];
        w.count += v->n_eog;
    }
    if (st->done)
        return w.count;
    const eng_gframe *top = &st->f[st->depth - 1];
    if (top->kind == F_TEXT || top->kind == F_AUTO) {   /* every token is text or the trigger */
        for (int i = 0; i < v->words; i++)
            allow[i] |= v->any[i];
        return w.count + v->n_any;
    }
    const gnode *nd = top->kind == F_STR ? &g->nodes[top->node] : NULL;
    if (nd != NULL && top->esc == 0 && top->u8need == 0 && nd->format == FMT_NONE) {
        int room = nd->max_len < 0 ? INT32_MAX : nd->max_len - top->n;
        const uint32_t *set = room >= v->plain_chars ? v->plain : room <= UPTO ? v->upto[room]
                                                                               : NULL;
        if (set != NULL) {
            for (int i = 0; i < v->words; i++)
                allow[i] |= set[i];
            w.count += set == v->plain ? v->n_plain : v->n_upto[room];
            w.t = &v->rest;
        }
    }
    dfs(&w, 0, st);
    return w.count;
}

/* ---- compiling a schema ----------------------------------------------------------------------- */

typedef struct compiler {
    eng_grammar *g;
    const cJSON *root;
    struct { char *name; int node; } *refs;
    int n_refs;
    util_err *err;
    int nodes_cap, props_cap, alts_cap, lits_cap;
    size_t text_cap;
} compiler;

static int new_node(compiler *c)
{
    eng_grammar *g = c->g;
    if (g->n_nodes >= MAX_NODES)
        return util_err_set(c->err, LLMGW_EINVAL, "the schema has more than %d subschemas",
                            MAX_NODES);
    if (g->n_nodes == c->nodes_cap) {
        c->nodes_cap = c->nodes_cap ? 2 * c->nodes_cap : 16;
        g->nodes = xrealloc(g->nodes, (size_t)c->nodes_cap * sizeof *g->nodes);
    }
    gnode *n = &g->nodes[g->n_nodes];
    memset(n, 0, sizeof *n);
    n->ref = -1;
    n->free_keys = -1;
    n->items = NODE_ANY;
    n->max_items = -1;
    n->max_len = -1;
    return g->n_nodes++;
}

static int add_lit(compiler *c, const char *s, size_t len)
{
    eng_grammar *g = c->g;
    if (g->n_lits == c->lits_cap) {
        c->lits_cap = c->lits_cap ? 2 * c->lits_cap : 16;
        g->lits = xrealloc(g->lits, (size_t)c->lits_cap * sizeof *g->lits);
    }
    if (g->text_len + len > c->text_cap) {
        while (g->text_len + len > c->text_cap)
            c->text_cap = c->text_cap ? 2 * c->text_cap : 256;
        g->text = xrealloc(g->text, c->text_cap);
    }
    memcpy(g->text + g->text_len, s, len);
    g->lits[g->n_lits] = (glit){(uint32_t)g->text_len, (uint32_t)len};
    g->text_len += len;
    return g->n_lits++;
}

static int add_json_lit(compiler *c, const cJSON *value)
{
    char *s = cJSON_PrintUnformatted(value);
    if (s == NULL)
        return util_err_set(c->err, LLMGW_ENOMEM, "out of memory");
    int i = add_lit(c, s, strlen(s));
    cJSON_free(s);
    return i;
}

static const char *const known[] = {
    "type", "properties", "required", "additionalProperties", "items", "minItems", "maxItems",
    "enum", "const", "anyOf", "oneOf", "$ref", "$defs", "definitions", "minLength", "maxLength",
    "format", "nullable", "title", "description", "default", "examples", "$schema", "$id",
    "$comment", "deprecated", "readOnly", "writeOnly", "strict", NULL};

static unsigned type_bit(const char *name)
{
    static const struct { const char *name; unsigned bit; } t[] = {
        {"null", T_NULL}, {"boolean", T_BOOL}, {"integer", T_INT}, {"number", T_NUM},
        {"string", T_STR}, {"array", T_ARR}, {"object", T_OBJ}};
    for (size_t i = 0; i < sizeof t / sizeof *t; i++)
        if (strcmp(name, t[i].name) == 0)
            return t[i].bit;
    return 0;
}

static int count_of(compiler *c, const cJSON *s, const char *key, const char *path, int *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(s, key);
    if (v == NULL)
        return 0;
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > 1e6 ||
        v->valuedouble != (double)(int)v->valuedouble)
        return util_err_set(c->err, LLMGW_EINVAL, "%s/%s: expected a non-negative integer",
                            path, key);
    *out = (int)v->valuedouble;
    return 0;
}

static int compile(compiler *c, const cJSON *s, const char *path, int depth, int *out);

static int fill(compiler *c, int at, const cJSON *s, const char *path, int depth);

static int compile_ref(compiler *c, const char *ref, const char *path, int depth, int *out)
{
    const char *name = NULL, *where = NULL;
    if (strncmp(ref, "#/$defs/", 8) == 0)
        name = ref + 8, where = "$defs";
    else if (strncmp(ref, "#/definitions/", 14) == 0)
        name = ref + 14, where = "definitions";
    if (name == NULL || *name == '\0' || strchr(name, '/') != NULL)
        return util_err_set(c->err, LLMGW_EINVAL, "%s/$ref: only \"#/$defs/NAME\" and "
                            "\"#/definitions/NAME\" are supported, not \"%s\"", path, ref);
    for (int i = 0; i < c->n_refs; i++)
        if (strcmp(c->refs[i].name, ref) == 0) {
            *out = c->refs[i].node;
            return 0;
        }
    const cJSON *target = cJSON_GetObjectItemCaseSensitive(
        cJSON_GetObjectItemCaseSensitive(c->root, where), name);
    if (target == NULL)
        return util_err_set(c->err, LLMGW_EINVAL, "%s/$ref: \"%s\" is not defined", path, ref);
    int at = new_node(c);
    if (at < 0)
        return at;
    c->refs = xrealloc(c->refs, (size_t)(c->n_refs + 1) * sizeof *c->refs);
    c->refs[c->n_refs].name = util_xstrdup(ref);
    c->refs[c->n_refs++].node = at;
    *out = at;
    char sub[256];
    snprintf(sub, sizeof sub, "#/%s/%s", where, name);
    return fill(c, at, target, sub, depth + 1);
}

static int fill_object(compiler *c, int at, const cJSON *s, const char *path, int depth)
{
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(s, "properties");
    const cJSON *req = cJSON_GetObjectItemCaseSensitive(s, "required");
    const cJSON *addl = cJSON_GetObjectItemCaseSensitive(s, "additionalProperties");
    char sub[256];
    int rc;
    if (props != NULL && !cJSON_IsObject(props))
        return util_err_set(c->err, LLMGW_EINVAL, "%s/properties: expected an object", path);
    if (req != NULL && !cJSON_IsArray(req))
        return util_err_set(c->err, LLMGW_EINVAL, "%s/required: expected an array", path);
    const cJSON *r;
    cJSON_ArrayForEach(r, req)
        if (!cJSON_IsString(r))
            return util_err_set(c->err, LLMGW_EINVAL, "%s/required: expected strings", path);
    int n = 0;
    const cJSON *p;
    cJSON_ArrayForEach(p, props)
        n++;
    bool closed = cJSON_IsFalse(addl);
    /* Required names the properties lack are generated too (any value), unless closed. */
    cJSON_ArrayForEach(r, req)
        if (cJSON_GetObjectItemCaseSensitive(props, r->valuestring) == NULL) {
            if (closed)
                return util_err_set(c->err, LLMGW_EINVAL, "%s/required: \"%s\" is not among "
                                    "the properties and additionalProperties is false", path,
                                    r->valuestring);
            n++;
        }
    if (n > 64)
        return util_err_set(c->err, LLMGW_EINVAL, "%s/properties: more than 64 properties",
                            path);
    eng_grammar *g = c->g;
    int prop0 = g->n_props;
    if (g->n_props + n > c->props_cap) {
        while (g->n_props + n > c->props_cap)
            c->props_cap = c->props_cap ? 2 * c->props_cap : 16;
        g->props = xrealloc(g->props, (size_t)c->props_cap * sizeof *g->props);
    }
    g->n_props += n;
    int i = 0;
    cJSON_ArrayForEach(p, props) {
        cJSON *key = cJSON_CreateString(p->string);
        int k = key ? add_json_lit(c, key) : LLMGW_ENOMEM;
        cJSON_Delete(key);
        if (k < 0)
            return k;
        snprintf(sub, sizeof sub, "%s/properties/%s", path, p->string);
        int node;
        if ((rc = compile(c, p, sub, depth, &node)) != 0)
            return rc;
        bool required = false;
        cJSON_ArrayForEach(r, req)
            required = required || strcmp(r->valuestring, p->string) == 0;
        g->props[prop0 + i++] = (gprop){k, node, required};
    }
    cJSON_ArrayForEach(r, req)
        if (cJSON_GetObjectItemCaseSensitive(props, r->valuestring) == NULL) {
            cJSON *key = cJSON_CreateString(r->valuestring);
            int k = key ? add_json_lit(c, key) : LLMGW_ENOMEM;
            cJSON_Delete(key);
            if (k < 0)
                return k;
            g->props[prop0 + i++] = (gprop){k, NODE_ANY, true};
        }
    gnode *nd = &g->nodes[at];
    nd->prop0 = prop0;
    nd->n_props = n;
    if (n == 0 && !closed) {
        int node = NODE_ANY;
        if (cJSON_IsObject(addl)) {
            snprintf(sub, sizeof sub, "%s/additionalProperties", path);
            if ((rc = compile(c, addl, sub, depth, &node)) != 0)
                return rc;
        } else if (addl != NULL && !cJSON_IsBool(addl)) {
            return util_err_set(c->err, LLMGW_EINVAL, "%s/additionalProperties: expected a "
                                "boolean or a schema", path);
        }
        g->nodes[at].free_keys = node;
    }
    return 0;
}

static int fill(compiler *c, int at, const cJSON *s, const char *path, int depth)
{
    int rc;
    char sub[256];
    if (depth > COMPILE_DEPTH)
        return util_err_set(c->err, LLMGW_EINVAL, "%s: nested deeper than %d", path,
                            COMPILE_DEPTH);
    if (cJSON_IsTrue(s)) {
        c->g->nodes[at].types = T_ANY;
        c->g->nodes[at].free_keys = NODE_ANY;
        return 0;
    }
    if (!cJSON_IsObject(s))
        return util_err_set(c->err, LLMGW_EINVAL, "%s: a schema must be an object", path);
    const cJSON *kw;
    cJSON_ArrayForEach(kw, s) {
        bool ok = false;
        for (int i = 0; known[i] != NULL && !ok; i++)
            ok = strcmp(kw->string, known[i]) == 0;
        if (!ok)
            return util_err_set(c->err, LLMGW_EINVAL, "%s: the keyword '%s' is not supported "
                                "for constrained decoding", path, kw->string);
    }
    const cJSON *ref = cJSON_GetObjectItemCaseSensitive(s, "$ref");
    if (ref != NULL) {
        if (!cJSON_IsString(ref))
            return util_err_set(c->err, LLMGW_EINVAL, "%s/$ref: expected a string", path);
        int target = NODE_ANY;
        if ((rc = compile_ref(c, ref->valuestring, path, depth, &target)) != 0)
            return rc;
        c->g->nodes[at].ref = target;
        return 0;
    }
    const cJSON *en = cJSON_GetObjectItemCaseSensitive(s, "enum");
    const cJSON *cn = cJSON_GetObjectItemCaseSensitive(s, "const");
    if (en != NULL || cn != NULL) {
        if (en != NULL && (!cJSON_IsArray(en) || cJSON_GetArraySize(en) == 0 ||
                           cJSON_GetArraySize(en) > MAX_LITS))
            return util_err_set(c->err, LLMGW_EINVAL, "%s/enum: expected an array of 1 to %d "
                                "values", path, MAX_LITS);
        int lit0 = c->g->n_lits, n = 0;
        const cJSON *v;
        if (cn != NULL) {
            if ((rc = add_json_lit(c, cn)) < 0)
                return rc;
            n = 1;
        } else {
            cJSON_ArrayForEach(v, en) {
                if ((rc = add_json_lit(c, v)) < 0)
                    return rc;
                n++;
            }
        }
        c->g->nodes[at].is_enum = true;
        c->g->nodes[at].lit0 = lit0;
        c->g->nodes[at].n_lits = n;
        return 0;
    }
    const cJSON *any = cJSON_GetObjectItemCaseSensitive(s, "anyOf");
    const char *any_kw = "anyOf";
    if (any == NULL) {
        any = cJSON_GetObjectItemCaseSensitive(s, "oneOf");
        any_kw = "oneOf";
    }
    if (any != NULL) {
        int n = cJSON_GetArraySize(any);
        if (!cJSON_IsArray(any) || n == 0 || n > 8)
            return util_err_set(c->err, LLMGW_EINVAL, "%s/%s: expected an array of 1 to 8 "
                                "schemas", path, any_kw);
        int nodes[8], i = 0;
        const cJSON *a;
        cJSON_ArrayForEach(a, any) {
            snprintf(sub, sizeof sub, "%s/%s/%d", path, any_kw, i);
            if ((rc = compile(c, a, sub, depth, &nodes[i])) != 0)
                return rc;
            i++;
        }
        eng_grammar *g = c->g;
        if (g->n_alts + n > c->alts_cap) {
            while (g->n_alts + n > c->alts_cap)
                c->alts_cap = c->alts_cap ? 2 * c->alts_cap : 16;
            g->alts = xrealloc(g->alts, (size_t)c->alts_cap * sizeof *g->alts);
        }
        g->nodes[at].alt0 = g->n_alts;
        g->nodes[at].n_alts = n;
        memcpy(g->alts + g->n_alts, nodes, (size_t)n * sizeof *nodes);
        g->n_alts += n;
        return 0;
    }
    unsigned types = 0;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(s, "type");
    if (cJSON_IsString(type)) {
        types = type_bit(type->valuestring);
        if (types == 0)
            return util_err_set(c->err, LLMGW_EINVAL, "%s/type: unknown type \"%s\"", path,
                                type->valuestring);
    } else if (cJSON_IsArray(type)) {
        const cJSON *t;
        cJSON_ArrayForEach(t, type) {
            unsigned b = cJSON_IsString(t) ? type_bit(t->valuestring) : 0;
            if (b == 0)
                return util_err_set(c->err, LLMGW_EINVAL, "%s/type: expected type names",
                                    path);
            types |= b;
        }
    } else if (type != NULL) {
        return util_err_set(c->err, LLMGW_EINVAL, "%s/type: expected a string or an array",
                            path);
    }
    if (types == 0) {
        if (cJSON_GetObjectItemCaseSensitive(s, "properties") ||
            cJSON_GetObjectItemCaseSensitive(s, "required") ||
            cJSON_GetObjectItemCaseSensitive(s, "additionalProperties"))
            types = T_OBJ;
        else if (cJSON_GetObjectItemCaseSensitive(s, "items") ||
                 cJSON_GetObjectItemCaseSensitive(s, "minItems") ||
                 cJSON_GetObjectItemCaseSensitive(s, "maxItems"))
            types = T_ARR;
        else if (cJSON_GetObjectItemCaseSensitive(s, "minLength") ||
                 cJSON_GetObjectItemCaseSensitive(s, "maxLength") ||
                 cJSON_GetObjectItemCaseSensitive(s, "format"))
            types = T_STR;
        else
            types = T_ANY;
    }
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(s, "nullable")))
        types |= T_NULL;
    c->g->nodes[at].types = types;
    if (types & T_OBJ) {
        if ((rc = fill_object(c, at, s, path, depth + 1)) != 0)
            return rc;
    }
    if (types & T_ARR) {
        const cJSON *items = cJSON_GetObjectItemCaseSensitive(s, "items");
        int node = NODE_ANY;
        if (items != NULL) {
            if (cJSON_IsArray(items))
                return util_err_set(c->err, LLMGW_EINVAL, "%s/items: a list of schemas (tuple "
                                    "items) is not supported", path);
            snprintf(sub, sizeof sub, "%s/items", path);
            if ((rc = compile(c, items, sub, depth + 1, &node)) != 0)
                return rc;
        }
        gnode *nd = &c->g->nodes[at];
        nd->items = node;
        if ((rc = count_of(c, s, "minItems", path, &nd->min_items)) != 0 ||
            (rc = count_of(c, s, "maxItems", path, &nd->max_items)) != 0)
            return rc;
        if (nd->max_items >= 0 && nd->max_items < nd->min_items)
            return util_err_set(c->err, LLMGW_EINVAL, "%s: maxItems < minItems", path);
    }
    if (types & T_STR) {
        gnode *nd = &c->g->nodes[at];
        if ((rc = count_of(c, s, "minLength", path, &nd->min_len)) != 0 ||
            (rc = count_of(c, s, "maxLength", path, &nd->max_len)) != 0)
            return rc;
        if (nd->max_len >= 0 && nd->max_len < nd->min_len)
            return util_err_set(c->err, LLMGW_EINVAL, "%s: maxLength < minLength", path);
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(s, "format");
        if (f != NULL) {
            static const char *const names[] = {"", "date", "time", "date-time", "uuid"};
            for (int i = 1; i < 5 && cJSON_IsString(f); i++)
                if (strcmp(f->valuestring, names[i]) == 0)
                    nd->format = i;
            if (nd->format == FMT_NONE)
                return util_err_set(c->err, LLMGW_EINVAL, "%s/format: only date, time, "
                                    "date-time and uuid are supported, not %s", path,
                                    cJSON_IsString(f) ? f->valuestring : "a non-string");
        }
    }
    return 0;
}

static int compile(compiler *c, const cJSON *s, const char *path, int depth, int *out)
{
    int at = new_node(c);
    if (at < 0)
        return at;
    *out = at;
    return fill(c, at, s, path, depth + 1);
}

/* The characters a value of node n may start with (a bit each). */
static void starts(const eng_grammar *g, int n, uint8_t set[32], int hops)
{
    if (hops > MAX_NODES)
        return;
    const gnode *nd = &g->nodes[n];
    if (nd->ref >= 0) {
        starts(g, nd->ref, set, hops + 1);
        return;
    }
    if (nd->n_alts > 0) {
        for (int a = 0; a < nd->n_alts; a++)
            starts(g, g->alts[nd->alt0 + a], set, hops + 1);
        return;
    }
#define SET(ch) (set[(unsigned char)(ch) / 8] |= (uint8_t)(1u << ((unsigned char)(ch) % 8)))
    if (nd->is_enum) {
        for (int i = 0; i < nd->n_lits; i++)
            SET(g->text[g->lits[nd->lit0 + i].off]);
        return;
    }
    if (nd->types & T_OBJ) SET('{');
    if (nd->types & T_ARR) SET('[');
    if (nd->types & T_STR) SET('"');
    if (nd->types & T_BOOL) { SET('t'); SET('f'); }
    if (nd->types & T_NULL) SET('n');
    if (nd->types & (T_NUM | T_INT)) {
        SET('-');
        for (char d = '0'; d <= '9'; d++)
            SET(d);
    }
#undef SET
}

static int check(compiler *c)
{
    eng_grammar *g = c->g;
    for (int n = 0; n < g->n_nodes; n++) {
        /* A cycle of bare references defines nothing. */
        int hop = n, hops = 0;
        while (g->nodes[hop].ref >= 0 && hops <= g->n_nodes)
            hop = g->nodes[hop].ref, hops++;
        if (hops > g->n_nodes)
            return util_err_set(c->err, LLMGW_EINVAL, "$ref: a cycle of references");
    }
    for (int n = 0; n < g->n_nodes; n++) {
        const gnode *nd = &g->nodes[n];
        if (nd->n_alts == 0)
            continue;
        uint8_t seen[32] = {0};
        for (int a = 0; a < nd->n_alts; a++) {
            uint8_t mine[32] = {0};
            starts(g, g->alts[nd->alt0 + a], mine, 0);
            for (int i = 0; i < 32; i++) {
                if (seen[i] & mine[i])
                    return util_err_set(c->err, LLMGW_EINVAL, "anyOf/oneOf: alternatives that "
                                        "can begin alike (e.g. two objects or two strings) are "
                                        "not supported; give each a different type");
                seen[i] |= mine[i];
            }
        }
    }
    return 0;
}

/* Every grammar's first literals (true, false, null) and nodes (any value, a plain string). */
static int begin(compiler *c)
{
    eng_grammar *g = c->g;
    add_lit(c, "true", 4);
    add_lit(c, "false", 5);
    add_lit(c, "null", 4);
    int any = new_node(c), plain = new_node(c);
    if (any < 0 || plain < 0)
        return any < 0 ? any : plain;
    g->nodes[NODE_ANY].types = T_ANY;
    g->nodes[NODE_ANY].free_keys = NODE_ANY;
    g->nodes[NODE_PLAIN].types = T_STR;
    return 0;
}

static void forget_refs(compiler *c)
{
    for (int i = 0; i < c->n_refs; i++)
        free(c->refs[i].name);
    free(c->refs);
    c->refs = NULL;
    c->n_refs = 0;
}

static eng_grammar *grammar_new(const eng_gvocab *v)
{
    eng_grammar *g = util_xcalloc(1, sizeof *g);
    atomic_init(&g->refs, 1);
    g->v = v;
    g->trigger_lit = -1;
    return g;
}

int eng_grammar_compile(eng_grammar **out, const eng_gvocab *v, const char *schema, size_t len,
                        util_err *err)
{
    eng_grammar *g = grammar_new(v);
    compiler c = {.g = g, .err = err};
    cJSON *doc = NULL;
    int rc;
    if ((rc = begin(&c)) != 0)
        goto out;
    if (schema == NULL) {
        int root = new_node(&c);
        if (root < 0) {
            rc = root;
            goto out;
        }
        g->nodes[root].types = T_OBJ;
        g->nodes[root].free_keys = NODE_ANY;
        g->root = root;
    } else {
        doc = cJSON_ParseWithLength(schema, len);
        if (doc == NULL) {
            rc = util_err_set(err, LLMGW_EINVAL, "the schema is not valid JSON");
            goto out;
        }
        c.root = doc;
        if ((rc = compile(&c, doc, "#", 0, &g->root)) != 0 || (rc = check(&c)) != 0)
            goto out;
    }
out:
    forget_refs(&c);
    cJSON_Delete(doc);
    if (rc != 0) {
        eng_grammar_unref(g);
        return rc;
    }
    *out = g;
    return 0;
}

/* Appends a + b + c as one literal. */
static int add_lit3(compiler *c, const char *a, const char *b, const char *d)
{
    size_t la = strlen(a), lb = strlen(b), ld = strlen(d);
    char *s = util_xmalloc(la + lb + ld + 1);
    memcpy(s, a, la);
    memcpy(s + la, b, lb);
    memcpy(s + la + lb, d, ld);
    int i = add_lit(c, s, la + lb + ld);
    free(s);
    return i;
}

int eng_grammar_compile_tools(eng_grammar **out, const eng_gvocab *v, const eng_tool_spec *tools,
                              int n, const eng_tool_format *fmt, bool required, util_err *err)
{
    if (n < 1 || n > 64)
        return util_err_set(err, LLMGW_EINVAL, "tools: between 1 and 64 tools, not %d", n);
    eng_grammar *g = grammar_new(v);
    compiler c = {.g = g, .err = err};
    cJSON *doc = NULL;
    int rc;
    char path[64];
    if ((rc = begin(&c)) != 0)
        goto out;
    g->tool_args = util_xmalloc((size_t)n * sizeof *g->tool_args);
    g->n_tools = n;
    for (int i = 0; i < n; i++) {
        for (int k = 0; k < i; k++)
            if (strcmp(tools[k].name, tools[i].name) == 0) {
                rc = util_err_set(err, LLMGW_EINVAL, "tools[%d]: the name '%s' is taken by "
                                  "tools[%d]", i, tools[i].name, k);
                goto out;
            }
        snprintf(path, sizeof path, "tools[%d].function.parameters", i);
        int node;
        if (tools[i].params == NULL) {
            if ((node = new_node(&c)) < 0) {
                rc = node;
                goto out;
            }
            g->nodes[node].types = T_OBJ;
            g->nodes[node].free_keys = NODE_ANY;
        } else {
            doc = cJSON_ParseWithLength(tools[i].params, tools[i].params_len);
            if (doc == NULL) {
                rc = util_err_set(err, LLMGW_EINVAL, "%s: not valid JSON", path);
                goto out;
            }
            c.root = doc;
            forget_refs(&c);
            if ((rc = compile(&c, doc, path, 0, &node)) != 0)
                goto out;
            cJSON_Delete(doc);
            doc = NULL;
            uint8_t first[32] = {0};
            starts(g, node, first, 0);
            if (!(first['{' / 8] & (1u << ('{' % 8)))) {
                rc = util_err_set(err, LLMGW_EINVAL, "%s: the arguments must be an object", path);
                goto out;
            }
        }
        g->tool_args[i] = node;
    }
    if ((rc = check(&c)) != 0)
        goto out;
    g->call_lit0 = g->n_lits;
    for (int i = 0; i < n; i++) {   /* open {"name": "NAME", "KEY": */
        cJSON *name = cJSON_CreateString(tools[i].name);
        char *quoted = name ? cJSON_PrintUnformatted(name) : NULL;
        cJSON_Delete(name);
        if (quoted == NULL) {
            rc = util_err_set(err, LLMGW_ENOMEM, "out of memory");
            goto out;
        }
        char mid[160];
        snprintf(mid, sizeof mid, ", \"%s\": ", fmt->args_key);
        char head[64];
        snprintf(head, sizeof head, "%s{\"name\": ", fmt->open);
        add_lit3(&c, head, quoted, mid);
        cJSON_free(quoted);
    }
    g->close_lit = add_lit3(&c, "}", fmt->close, "");
    if (!required)
        g->trigger_lit = add_lit3(&c, fmt->open[0] ? fmt->open : "{", "", "");
out:
    forget_refs(&c);
    cJSON_Delete(doc);
    if (rc != 0) {
        eng_grammar_unref(g);
        return rc;
    }
    *out = g;
    return 0;
}

int32_t eng_grammar_n_vocab(const eng_grammar *g) { return g->v->n_vocab; }

eng_grammar *eng_grammar_ref(eng_grammar *g)
{
    atomic_fetch_add(&g->refs, 1);
    return g;
}

void eng_grammar_unref(eng_grammar *g)
{
    if (g == NULL || atomic_fetch_sub(&g->refs, 1) != 1)
        return;
    free(g->nodes);
    free(g->props);
    free(g->alts);
    free(g->lits);
    free(g->text);
    free(g->tool_args);
    free(g);
}
