/* engine/text/grammar.c: the character-level pushdown machine of a compiled grammar, and the
 * token mask.
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
#include "engine/text/grammar_internal.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

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

/* ---- the machine ---------------------------------------------------------------------------- */

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
        /* The alternatives start apart (checked at compile): the one that may begin with c. */
        for (int a = 0; a < u->n_alts && pick < 0; a++) {
            int alt = resolve(g, g->alts[u->alt0 + a]);
            if (g->nodes[alt].start[c / 8] >> (c % 8) & 1)
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
