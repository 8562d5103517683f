/* engine/text/grammar_internal.h: what the grammar's three files share: the vocabulary trie
 * (grammar_vocab.c builds it), the compiled schema's tables (grammar_schema.c fills them) and
 * the limits the machine (grammar.c) enforces. Not for use outside engine/text/grammar*.c. */
#ifndef LLMGW_ENGINE_TEXT_GRAMMAR_INTERNAL_H
#define LLMGW_ENGINE_TEXT_GRAMMAR_INTERNAL_H

#include "engine/text/grammar.h"

#include <stdatomic.h>
#include <stdlib.h>

#define WS_MAX 16
#define NUM_MAX 24
#define MAX_NODES 4096
#define MAX_LITS 64
#define COMPILE_DEPTH 64
#define UPTO 64

enum { T_NULL = 1, T_BOOL = 2, T_INT = 4, T_NUM = 8, T_STR = 16, T_ARR = 32, T_OBJ = 64,
       T_ANY = 127 };
enum { F_VALUE, F_OBJ, F_ARR, F_STR, F_NUM, F_LIT, F_AUTO, F_TEXT, F_CALL };
enum { O_OPEN, O_KEY, O_COLON, O_VALUE, O_AFTER, O_COMMA };
enum { A_OPEN, A_VALUE, A_AFTER, A_COMMA };
enum { N_MINUS, N_ZERO, N_INT, N_DOT, N_FRAC, N_E, N_ESIGN, N_EXP };
enum { L_ENUM = 0, L_KEY = 1, L_WORD = 2 };   /* eng_gframe.key of a literal frame */
enum { FMT_NONE, FMT_DATE, FMT_TIME, FMT_DATETIME, FMT_UUID };
enum { NODE_ANY = 0, NODE_PLAIN = 1 };         /* made first by every compile */

static inline void *gr_xrealloc(void *p, size_t n)
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

/* ---- the compiled schema -------------------------------------------------------------------- */

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
    uint8_t start[32];    /* the characters a value of it may begin with, a bit each (references
                             and alternatives followed): how a union picks its alternative */
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

#endif
