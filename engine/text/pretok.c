/* engine/text/pretok.c: pre-tokenizer families (which steps each tokenizer.ggml.pre runs), the
 * three hand-written splitters llama.cpp uses for the GPT-2, Llama-3 and Qwen2 patterns, and the
 * PCRE2 step for other Unicode-class regexes, run on llama.cpp's collapsed text. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "engine/text/pretok.h"

#include "engine/text/unicode.h"

#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum step_kind {
    STEP_NONE = 0,   /* ends a family's step list */
    STEP_REGEX,      /* a regex with \p{..} classes, run by PCRE2 on the collapsed text */
    STEP_GPT2,       /* 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)
                        |\s+ */
    STEP_LLAMA3,     /* (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
                        ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+ */
    STEP_QWEN2,      /* as STEP_LLAMA3 with \p{N} instead of \p{N}{1,3} */
} step_kind;

enum { MAX_STEPS = 4, MAX_NAMES = 10 };

typedef struct step {
    step_kind kind;
    const char *regex;  /* STEP_REGEX only */
} step;

/* One llama.cpp pre-tokenizer type: the names that select it, its steps, its flags. */
typedef struct family {
    const char *names[MAX_NAMES];
    step steps[MAX_STEPS];
    bool ignore_merges;
    bool add_bos;
} family;

static const family families[] = {
    {{"smollm", "starcoder", "refact", "command-r", "codeshell"},
     {{STEP_REGEX, "\\p{N}"}, {STEP_GPT2, NULL}}, false, false},
    {{"gpt-2", "gpt2", "phi-2", "mpt", "olmo"}, {{STEP_GPT2, NULL}}, false, false},
    {{"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2"},
     {{STEP_LLAMA3, NULL}}, true, true},
    {{"qwen2", "deepseek-r1-qwen", "stablelm2"}, {{STEP_QWEN2, NULL}}, false, false},
};

struct eng_pretok {
    const family *fam;
    pcre2_code *re[MAX_STEPS];  /* compiled STEP_REGEX steps, NULL for the others */
    bool collapse;              /* some step needs w->collapsed */
};

/* ---- the collapsed text: one byte per codepoint ----
 * ASCII stays itself, other whitespace becomes 0x0B, other codepoints the byte of their class,
 * and \p{X} in a regex becomes a class of that byte plus the ASCII codepoints of class X. */

enum { COL_OTHER = 0xd0, COL_NUMBER = 0xd1, COL_LETTER = 0xd2, COL_PUNCT = 0xd3, COL_MARK = 0xd4,
       COL_SYMBOL = 0xd5 };

static unsigned char collapse_byte(uint32_t cpt, uint16_t flags)
{
    if (cpt < 128)
        return (unsigned char)cpt;
    if (flags & ENG_UC_WHITESPACE)
        return 0x0b;
    switch (flags & ENG_UC_CATEGORIES) {
    case ENG_UC_NUMBER: return COL_NUMBER;
    case ENG_UC_LETTER: return COL_LETTER;
    case ENG_UC_PUNCT: return COL_PUNCT;
    case ENG_UC_MARK: return COL_MARK;
    case ENG_UC_SYMBOL: return COL_SYMBOL;
    default: return COL_OTHER;
    }
}

/* The class a \p{NAME} stands for in llama.cpp (its letter subclasses all mean any letter). */
static uint16_t class_of_name(const char *name, size_t len)
{
    static const struct { const char *name; uint16_t flag; } names[] = {
        {"N", ENG_UC_NUMBER}, {"L", ENG_UC_LETTER}, {"P", ENG_UC_PUNCT}, {"M", ENG_UC_MARK},
        {"S", ENG_UC_SYMBOL}, {"Lu", ENG_UC_LETTER}, {"Ll", ENG_UC_LETTER},
        {"Lt", ENG_UC_LETTER}, {"Lm", ENG_UC_LETTER}, {"Lo", ENG_UC_LETTER},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strlen(names[i].name) == len && memcmp(names[i].name, name, len) == 0)
            return names[i].flag;
    return 0;
}

/* Appends the members of class `flag` as \x{..} escapes: its collapsed byte, then its ASCII
 * codepoints (from the same table the text is classed by). */
static size_t put_class(char *out, uint16_t flag)
{
    size_t n = 0;
    unsigned char col = collapse_byte(0x80, flag);  /* any non-ASCII codepoint of that class */
    n += (size_t)sprintf(out + n, "\\x{%02x}", col);
    for (uint32_t c = 0; c < 128; c++)
        if ((eng_unicode_flags(c) & ENG_UC_CATEGORIES) == flag)
            n += (size_t)sprintf(out + n, "\\x{%02x}", (unsigned)c);
    return n;
}

/* Rewrites `regex` for the collapsed text into a malloc'd string, or NULL (ENOMEM). */
static char *collapse_regex(const char *regex)
{
    size_t len = strlen(regex), n_classes = 0, n = 0;
    for (const char *q = regex; (q = strstr(q, "\\p{")) != NULL; q += 3)
        n_classes++;
    /* Each \p{..} becomes at most [ + 129 six-byte escapes + ]. */
    char *out = malloc(len + 1 + n_classes * (2 + 129 * 6));
    bool inside = false;
    if (out == NULL)
        return NULL;
    for (size_t i = 0; i < len; i++) {
        char c = regex[i];
        if (c == '[' && (i == 0 || regex[i - 1] != '\\')) {
            inside = true;
        } else if (inside && c == ']' && regex[i - 1] != '\\') {
            inside = false;
        } else if (c == '\\' && i + 3 < len && regex[i + 1] == 'p' && regex[i + 2] == '{') {
            const char *close = strchr(regex + i + 3, '}');
            size_t name_len = close ? (size_t)(close - regex) - i - 3 : 0;
            uint16_t flag = close ? class_of_name(regex + i + 3, name_len) : 0;
            if (flag != 0) {
                if (!inside)
                    out[n++] = '[';
                n += put_class(out + n, flag);
                if (!inside)
                    out[n++] = ']';
                i = (size_t)(close - regex);
                continue;
            }
        }
        out[n++] = c;
    }
    out[n] = '\0';
    return out;
}

/* ---- the hand-written splitters ----
 * Each splits the piece [ini, end) of the codepoints into words and appends their lengths to
 * out. A class or codepoint read past `end` is 0 / none, which is how the patterns' lookahead
 * sees the end of the piece. */

typedef struct piece {
    const uint32_t *cpt;
    const uint16_t *flags;
    size_t end;
    uint32_t *out;
    size_t n_out;
    size_t last;  /* where the next word starts */
} piece;

static inline uint16_t fl(const piece *p, size_t pos)
{
    return pos < p->end ? p->flags[pos] : 0;
}

static inline uint32_t cp(const piece *p, size_t pos)
{
    return pos < p->end ? p->cpt[pos] : UINT32_MAX;
}

static inline void emit(piece *p, size_t end)
{
    if (end > p->last)
        p->out[p->n_out++] = (uint32_t)(end - p->last);
    p->last = end;
}

enum { WS = ENG_UC_WHITESPACE, LET = ENG_UC_LETTER, NUM = ENG_UC_NUMBER };

static inline uint32_t ascii_lower(uint32_t c) { return c >= 'A' && c <= 'Z' ? c + 32 : c; }

/* Length of a contraction ('s 't 'm 'd 're 've 'll) at pos, or 0. */
static size_t contraction(const piece *p, size_t pos, bool any_case)
{
    if (cp(p, pos) != '\'' || pos + 1 >= p->end)
        return 0;
    uint32_t c1 = cp(p, pos + 1);
    if (any_case)
        c1 = ascii_lower(c1);
    if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd')
        return 2;
    if (pos + 2 >= p->end)
        return 0;
    uint32_t c2 = cp(p, pos + 2);
    if (any_case)
        c2 = ascii_lower(c2);
    if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l'))
        return 3;
    return 0;
}

static void split_gpt2(piece *p, size_t ini)
{
    size_t pos = ini;
    p->last = ini;
    while (pos < p->end) {
        uint32_t c = p->cpt[pos];
        size_t k = contraction(p, pos, false);
        if (k > 0) {
            emit(p, pos += k);
            continue;
        }
        /* ` ?X+` for X = letters, numbers, then anything but whitespace/letters/numbers. */
        uint16_t f2 = c == ' ' ? fl(p, pos + 1) : p->flags[pos];
        uint16_t want = (f2 & LET) ? LET : (f2 & NUM) ? NUM : 0;
        if (want != 0 || (!(f2 & (WS | LET | NUM)) && f2 != 0)) {
            pos += c == ' ';
            if (want != 0) {
                while (fl(p, pos) & want)
                    pos++;
            } else {
                uint16_t g;
                while (g = fl(p, pos), !(g & (WS | LET | NUM)) && g != 0)
                    pos++;
            }
            emit(p, pos);
            continue;
        }
        size_t nws = 0;
        while (fl(p, pos + nws) & WS)
            nws++;
        if (nws > 1 && pos + nws < p->end)  /* \s+(?!\S): leave the last one to the next word */
            pos += nws - 1;
        else if (nws > 0)
            pos += nws;
        else
            pos++;
        emit(p, pos);
    }
}

static void split_llama3(piece *p, size_t ini, bool digits_by_three)
{
    size_t pos = ini;
    p->last = ini;
    while (pos < p->end) {
        uint32_t c = p->cpt[pos];
        uint16_t f = p->flags[pos];
        size_t k = contraction(p, pos, true);
        if (k > 0) {
            emit(p, pos += k);
            continue;
        }
        /* [^\r\n\p{L}\p{N}]?\p{L}+ */
        if (!(c == '\r' || c == '\n' || (f & NUM)) && ((f & LET) || (fl(p, pos + 1) & LET))) {
            pos++;
            while (fl(p, pos) & LET)
                pos++;
            emit(p, pos);
            continue;
        }
        /* \p{N}{1,3} (Llama-3) or \p{N} (Qwen2) */
        if (f & NUM) {
            if (!digits_by_three) {
                emit(p, ++pos);
                continue;
            }
            size_t run = pos;
            while (fl(p, pos) & NUM) {
                if (++pos - run >= 3) {
                    emit(p, pos);
                    run = pos;
                }
            }
            emit(p, pos);
            continue;
        }
        /* ` ?[^\s\p{L}\p{N}]+[\r\n]*` */
        uint16_t f2 = c == ' ' ? fl(p, pos + 1) : f;
        if (!(f2 & (WS | LET | NUM)) && f != 0) {
            uint16_t g;
            pos += c == ' ';
            while (g = fl(p, pos), !(g & (WS | LET | NUM)) && g != 0)
                pos++;
            while (cp(p, pos) == '\r' || cp(p, pos) == '\n')
                pos++;
            emit(p, pos);
            continue;
        }
        /* \s*[\r\n]+ | \s+(?!\S) | \s+ */
        size_t nws = 0, after_rn = 0;
        while (fl(p, pos + nws) & WS) {
            uint32_t c2 = p->cpt[pos + nws];
            nws++;
            if (c2 == '\r' || c2 == '\n')
                after_rn = pos + nws;
        }
        if (after_rn > 0)
            pos = after_rn;
        else if (nws > 1 && pos + nws < p->end)
            pos += nws - 1;
        else if (nws > 0)
            pos += nws;
        else
            pos++;
        emit(p, pos);
    }
}

/* The regex step on one piece of the collapsed text: every match is a word and so is every gap
 * between matches, as llama.cpp's std::regex_iterator loop splits. Empty matches give no word. */
static void split_regex(piece *p, const pcre2_code *re, pcre2_match_data *md,
                        const unsigned char *subject, size_t ini)
{
    size_t len = p->end - ini, off = 0;
    uint32_t opts = 0;
    p->last = ini;
    while (off <= len) {
        int rc = pcre2_match(re, subject + ini, len, off, opts, md, NULL);
        if (rc < 0) {
            if (opts != 0 && off < len) {  /* nothing non-empty here: search on from off + 1 */
                opts = 0;
                off++;
                continue;
            }
            break;
        }
        const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        emit(p, ini + ov[0]);  /* the gap before the match */
        emit(p, ini + ov[1]);
        off = ov[1];
        /* After an empty match, the next one must be non-empty at the same place. */
        opts = ov[0] == ov[1] ? PCRE2_NOTEMPTY_ATSTART | PCRE2_ANCHORED : 0;
    }
    emit(p, p->end);
}

/* ---- the object ---- */

int eng_pretok_new(eng_pretok **out, const char *name, size_t name_len, util_err *err)
{
    const family *fam = NULL;
    for (size_t i = 0; i < sizeof families / sizeof families[0] && fam == NULL; i++)
        for (size_t j = 0; j < MAX_NAMES && families[i].names[j] != NULL; j++)
            if (strlen(families[i].names[j]) == name_len &&
                memcmp(families[i].names[j], name, name_len) == 0)
                fam = &families[i];
    if (fam == NULL)
        return util_err_set(err, LLMGW_EINVAL, "unsupported pre-tokenizer \"%.*s\"",
                            (int)(name_len > 64 ? 64 : name_len), name);
    eng_pretok *p = calloc(1, sizeof *p);
    if (p == NULL)
        return util_err_set(err, LLMGW_ENOMEM, "out of memory");
    p->fam = fam;
    for (int i = 0; i < MAX_STEPS && fam->steps[i].kind != STEP_NONE; i++) {
        if (fam->steps[i].kind != STEP_REGEX)
            continue;
        char *pattern = collapse_regex(fam->steps[i].regex);
        int code = 0;
        PCRE2_SIZE at = 0;
        if (pattern != NULL)
            p->re[i] = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED, 0, &code, &at,
                                     NULL);
        free(pattern);
        if (p->re[i] == NULL) {
            eng_pretok_free(p);
            return util_err_set(err, pattern ? LLMGW_EINVAL : LLMGW_ENOMEM,
                                "pre-tokenizer regex %s: PCRE2 error %d at %zu",
                                fam->steps[i].regex, code, (size_t)at);
        }
        (void)pcre2_jit_compile(p->re[i], PCRE2_JIT_COMPLETE);  /* interpreted if JIT fails */
        p->collapse = true;
    }
    *out = p;
    return 0;
}

void eng_pretok_free(eng_pretok *p)
{
    if (p == NULL)
        return;
    for (int i = 0; i < MAX_STEPS; i++)
        pcre2_code_free(p->re[i]);
    free(p);
}

bool eng_pretok_ignore_merges(const eng_pretok *p) { return p->fam->ignore_merges; }
bool eng_pretok_default_add_bos(const eng_pretok *p) { return p->fam->add_bos; }

void eng_pretok_work_deinit(eng_pretok_work *w)
{
    free(w->cpt);
    free(w->flags);
    free(w->at);
    free(w->runs[0]);
    free(w->runs[1]);
    free(w->collapsed);
    free(w->norm);
    pcre2_match_data_free(w->match);
    memset(w, 0, sizeof *w);
}

static int work_reserve(eng_pretok_work *w, size_t n)
{
    if (n <= w->cap && w->cpt != NULL)
        return 0;
    size_t cap = n < 256 ? 256 : n + n / 2;
    eng_pretok_work fresh = {.match = w->match, .norm = w->norm, .norm_cap = w->norm_cap};
    fresh.cpt = malloc(cap * sizeof *fresh.cpt);
    fresh.flags = malloc(cap * sizeof *fresh.flags);
    fresh.at = malloc((cap + 1) * sizeof *fresh.at);
    fresh.runs[0] = malloc(cap * sizeof *fresh.runs[0]);
    fresh.runs[1] = malloc(cap * sizeof *fresh.runs[1]);
    fresh.collapsed = malloc(cap);
    fresh.cap = cap;
    w->match = NULL;
    w->norm = NULL;
    eng_pretok_work_deinit(w);
    *w = fresh;
    if (!fresh.cpt || !fresh.flags || !fresh.at || !fresh.runs[0] || !fresh.runs[1] ||
        !fresh.collapsed) {
        eng_pretok_work_deinit(w);
        return LLMGW_ENOMEM;
    }
    return 0;
}

/* The text as llama.cpp reads it, one codepoint at a time, into w->cpt, flags and at; a copy
 * goes to w->norm from the first codepoint whose canonical UTF-8 differs from its bytes. */
static int read_text(eng_pretok_work *w, const unsigned char *s, size_t len, const char **words,
                     size_t *n_cpt)
{
    size_t k = 0, o = 0;  /* codepoints read, bytes of the text as read */
    char *norm = NULL;
    for (size_t i = 0; i < len; k++) {
        size_t m;
        uint32_t c = eng_utf8_next(s + i, len - i, &m);
        w->cpt[k] = c;
        w->flags[k] = eng_unicode_flags(c);
        w->at[k] = (uint32_t)o;
        if (c < 0x80 && m == 1) {
            if (norm != NULL)
                norm[o] = (char)c;
            o++;
        } else {
            unsigned char enc[4];
            size_t e = eng_utf8_put(c, enc);
            if (norm == NULL && e != m) {  /* up to here, text and reading are the same bytes */
                if (w->norm_cap < 3 * len) {
                    free(w->norm);
                    w->norm_cap = 0;
                    if ((w->norm = malloc(3 * len)) == NULL)
                        return LLMGW_ENOMEM;
                    w->norm_cap = 3 * len;
                }
                norm = w->norm;
                memcpy(norm, s, i);
            }
            if (norm != NULL)
                memcpy(norm + o, enc, e);
            o += e;
        }
        i += m;
    }
    w->at[k] = (uint32_t)o;
    *words = norm != NULL ? norm : (const char *)s;
    *n_cpt = k;
    return 0;
}

int eng_pretok_split(const eng_pretok *p, const char *text, size_t len, eng_pretok_work *w,
                     const char **words, const uint32_t **ends, size_t *n)
{
    size_t k = 0;
    *n = 0;
    *words = text;
    if (len >= (1u << 30))
        return LLMGW_ENOMEM;
    if (work_reserve(w, len) != 0 ||
        read_text(w, (const unsigned char *)text, len, words, &k) != 0)
        return LLMGW_ENOMEM;
    *ends = w->runs[0];
    if (k == 0)
        return 0;
    if (p->collapse) {
        for (size_t i = 0; i < k; i++)
            w->collapsed[i] = collapse_byte(w->cpt[i], w->flags[i]);
        if (w->match == NULL && (w->match = pcre2_match_data_create(4, NULL)) == NULL)
            return LLMGW_ENOMEM;
    }

    /* Each step splits every piece the previous one made. */
    uint32_t *cur = w->runs[0];
    size_t n_cur = 1;
    cur[0] = (uint32_t)k;
    for (int st = 0; st < MAX_STEPS && p->fam->steps[st].kind != STEP_NONE; st++) {
        piece pc = {.cpt = w->cpt, .flags = w->flags, .out = cur == w->runs[0] ? w->runs[1]
                                                                               : w->runs[0]};
        size_t ini = 0;
        for (size_t r = 0; r < n_cur; r++) {
            pc.end = ini + cur[r];
            switch (p->fam->steps[st].kind) {
            case STEP_GPT2: split_gpt2(&pc, ini); break;
            case STEP_LLAMA3: split_llama3(&pc, ini, true); break;
            case STEP_QWEN2: split_llama3(&pc, ini, false); break;
            case STEP_REGEX: split_regex(&pc, p->re[st], w->match, w->collapsed, ini); break;
            case STEP_NONE: break;
            }
            ini = pc.end;
        }
        cur = pc.out;
        n_cur = pc.n_out;
    }

    /* Codepoint lengths -> byte end offsets, in place. */
    size_t acc = 0;
    for (size_t r = 0; r < n_cur; r++) {
        acc += cur[r];
        cur[r] = w->at[acc];
    }
    *ends = cur;
    *n = n_cur;
    return 0;
}
