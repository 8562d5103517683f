/* engine/text/wordpiece.c: the BERT tokenizer (engine/text/wordpiece.h). One pass over the text
 * with no allocation: each codepoint is normalized by table (engine/text/wordpiece_data.c), words
 * are gathered in a fixed buffer (a word past 100 characters is [UNK] whatever it holds, so only
 * its length is counted beyond that), and each finished word is split into pieces by lookups in an
 * open-addressing hash of the vocabulary. */
#include "engine/text/wordpiece.h"

#include "common/arena.h"
#include "engine/text/unicode.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

/* Flags of wordpiece_data.c, per codepoint: the normalizer drops it, pads it with spaces (a CJK
 * ideograph) or replaces it (map); the pre-tokenizer splits at it (SPACE) or isolates it (PUNCT). */
enum { WP_DROP = 1, WP_CJK = 2, WP_MAPPED = 4, WP_PUNCT = 8, WP_SPACE = 16 };

extern const size_t eng__wp_n_runs;
extern const uint32_t eng__wp_runs[];
extern const size_t eng__wp_n_map;
extern const uint32_t eng__wp_map_cpt[];
extern const uint32_t eng__wp_map_val[];
extern const uint32_t eng__wp_pool[];

#define MAX_WORD_CHARS 100      /* HF WordPiece max_input_chars_per_word */
#define MAX_VOCAB (1 << 22)
#define MAX_VOCAB_BYTES ((size_t)64 << 20)
#define N_SPECIAL 5

static const char *const SPECIALS[N_SPECIAL] = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"};

struct eng_wordpiece {
    char *blob;         /* every token text, NUL-terminated, back to back */
    uint32_t *off;      /* [n] token text offsets into blob */
    uint32_t *len;      /* [n] token text lengths */
    int n;
    int32_t *slots;     /* [mask + 1] token ids keyed by (continuation?, text after "##"), or -1 */
    uint32_t mask;
    int32_t special[N_SPECIAL];  /* ids of SPECIALS, or -1 */
    int32_t unk, cls, sep;
    uint8_t ascii[128]; /* flags of 0x00-0x7F */
};

static unsigned table_flags(uint32_t c)
{
    size_t lo = 0, hi = eng__wp_n_runs;  /* the last run starting at or before c */
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if ((eng__wp_runs[mid] >> 8) <= c)
            lo = mid;
        else
            hi = mid;
    }
    return eng__wp_runs[lo] & 0xff;
}

static inline unsigned cpt_flags(const eng_wordpiece *wp, uint32_t c)
{
    return c < 128 ? wp->ascii[c] : c < 0x110000 ? table_flags(c) : WP_DROP;
}

/* The replacement of a MAPPED codepoint: sets *seq and returns its length. */
static size_t mapped(uint32_t c, const uint32_t **seq)
{
    size_t lo = 0, hi = eng__wp_n_map;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (eng__wp_map_cpt[mid] == c) {
            *seq = eng__wp_pool + (eng__wp_map_val[mid] >> 4);
            return eng__wp_map_val[mid] & 15;
        }
        if (eng__wp_map_cpt[mid] < c)
            lo = mid + 1;
        else
            hi = mid;
    }
    return 0;  /* unreachable for a MAPPED codepoint */
}

/* ---- vocabulary ---- */

static uint32_t key_hash(bool cont, const char *s, size_t n)
{
    return (uint32_t)XXH3_64bits_withSeed(s, n, cont ? 0x9e3779b97f4a7c15ull : 0);
}

/* Token id's key: continuation pieces ("##x") are keyed by the text after "##". */
static void token_key(const eng_wordpiece *wp, int32_t id, bool *cont, const char **s, size_t *n)
{
    const char *t = wp->blob + wp->off[id];
    size_t len = wp->len[id];
    *cont = len > 2 && t[0] == '#' && t[1] == '#';
    *s = *cont ? t + 2 : t;
    *n = *cont ? len - 2 : len;
}

static int32_t lookup(const eng_wordpiece *wp, bool cont, const char *s, size_t n)
{
    for (uint32_t i = key_hash(cont, s, n) & wp->mask;; i = (i + 1) & wp->mask) {
        int32_t id = wp->slots[i];
        if (id < 0)
            return -1;
        bool c;
        const char *ks;
        size_t kn;
        token_key(wp, id, &c, &ks, &kn);
        if (c == cont && kn == n && memcmp(ks, s, n) == 0)
            return id;
    }
}

/* Later duplicates win, as in HF's vocabulary map. */
static void insert(eng_wordpiece *wp, int32_t id)
{
    bool cont, c;
    const char *s, *ks;
    size_t n, kn;
    token_key(wp, id, &cont, &s, &n);
    for (uint32_t i = key_hash(cont, s, n) & wp->mask;; i = (i + 1) & wp->mask) {
        int32_t old = wp->slots[i];
        if (old >= 0) {
            token_key(wp, old, &c, &ks, &kn);
            if (!(c == cont && kn == n && memcmp(ks, s, n) == 0))
                continue;
        }
        wp->slots[i] = id;
        return;
    }
}

int eng_wordpiece_new(eng_wordpiece **out, const char *vocab, size_t len, const char *name,
                      util_err *err)
{
    *out = NULL;
    if (len > MAX_VOCAB_BYTES)
        return util_err_set(err, LLMGW_EINVAL, "%s: vocabulary file is absurdly large", name);
    size_t lines = 0;
    for (size_t i = 0; i < len; i++)
        lines += vocab[i] == '\n';
    if (len > 0 && vocab[len - 1] != '\n')
        lines++;
    if (lines == 0 || lines > MAX_VOCAB)
        return util_err_set(err, LLMGW_EINVAL, "%s: %zu tokens (expected 1..%d)", name, lines,
                            MAX_VOCAB);
    eng_wordpiece *wp = util_xcalloc(1, sizeof *wp);
    wp->blob = util_xmalloc(len + 1);
    wp->off = util_xmalloc(lines * sizeof *wp->off);
    wp->len = util_xmalloc(lines * sizeof *wp->len);
    uint32_t cap = 16;
    while (cap < 2 * lines)
        cap *= 2;
    wp->mask = cap - 1;
    wp->slots = util_xmalloc(cap * sizeof *wp->slots);
    memset(wp->slots, 0xff, cap * sizeof *wp->slots);
    size_t at = 0, bo = 0;
    for (size_t i = 0; i < lines; i++) {
        const char *nl = memchr(vocab + at, '\n', len - at);
        size_t e = nl != NULL ? (size_t)(nl - vocab) : len, n = e - at;
        while (n > 0 && (vocab[at + n - 1] == '\r' || vocab[at + n - 1] == ' ' ||
                         vocab[at + n - 1] == '\t'))
            n--;  /* HF trims the end of each line */
        memcpy(wp->blob + bo, vocab + at, n);
        wp->blob[bo + n] = '\0';
        wp->off[i] = (uint32_t)bo;
        wp->len[i] = (uint32_t)n;
        bo += n + 1;
        at = e + 1;
    }
    wp->n = (int)lines;
    for (int32_t id = 0; id < wp->n; id++)
        insert(wp, id);
    for (int i = 0; i < N_SPECIAL; i++)
        wp->special[i] = lookup(wp, false, SPECIALS[i], strlen(SPECIALS[i]));
    wp->unk = wp->special[1];
    wp->cls = wp->special[2];
    wp->sep = wp->special[3];
    if (wp->unk < 0 || wp->cls < 0 || wp->sep < 0) {
        eng_wordpiece_free(wp);
        return util_err_set(err, LLMGW_EINVAL, "%s: the vocabulary lacks [UNK], [CLS] or [SEP]",
                            name);
    }
    for (uint32_t c = 0; c < 128; c++)
        wp->ascii[c] = (uint8_t)table_flags(c);
    *out = wp;
    return 0;
}

int eng_wordpiece_load(eng_wordpiece **out, const char *vocab_path, util_err *err)
{
    *out = NULL;
    FILE *f = fopen(vocab_path, "rb");
    if (f == NULL)
        return util_err_set(err, LLMGW_EIO, "%s: %s", vocab_path, strerror(errno));
    char *buf = NULL;
    size_t n = 0, cap = 0;
    int rc = 0;
    for (;;) {
        if (n == cap) {
            if (cap > MAX_VOCAB_BYTES) {
                rc = util_err_set(err, LLMGW_EINVAL, "%s: vocabulary file is absurdly large",
                                  vocab_path);
                break;
            }
            cap = cap ? cap * 2 : 1 << 20;
            char *p = realloc(buf, cap);
            if (p == NULL) {
                rc = util_err_set(err, LLMGW_ENOMEM, "%s: out of memory", vocab_path);
                break;
            }
            buf = p;
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0) {
            if (ferror(f))
                rc = util_err_set(err, LLMGW_EIO, "%s: read error", vocab_path);
            break;
        }
    }
    fclose(f);
    if (rc == 0)
        rc = eng_wordpiece_new(out, buf, n, vocab_path, err);
    free(buf);
    return rc;
}

void eng_wordpiece_free(eng_wordpiece *wp)
{
    if (wp == NULL)
        return;
    free(wp->blob);
    free(wp->off);
    free(wp->len);
    free(wp->slots);
    free(wp);
}

int eng_wordpiece_n_vocab(const eng_wordpiece *wp) { return wp->n; }

int32_t eng_wordpiece_id(const eng_wordpiece *wp, const char *tok, size_t len)
{
    bool cont = len > 2 && tok[0] == '#' && tok[1] == '#';
    return lookup(wp, cont, cont ? tok + 2 : tok, cont ? len - 2 : len);
}

const char *eng_wordpiece_token(const eng_wordpiece *wp, int32_t id)
{
    return id >= 0 && id < wp->n ? wp->blob + wp->off[id] : NULL;
}

/* ---- encoding ---- */

typedef struct enc {
    const eng_wordpiece *wp;
    int32_t *ids;
    int cap;
    int n;          /* pieces so far (ids[1 + i]) */
    int limit;      /* pieces kept */
    char word[MAX_WORD_CHARS * 4];
    uint16_t bound[MAX_WORD_CHARS + 1];  /* byte offset of each character of word, and the end */
    int chars;      /* characters in the current word (counted past MAX_WORD_CHARS) */
} enc;

static inline bool full(const enc *e) { return e->n >= e->limit; }

static void emit(enc *e, int32_t id)
{
    if (full(e))
        return;
    if (1 + e->n < e->cap)
        e->ids[1 + e->n] = id;
    e->n++;
}

/* Greedy longest-match-first pieces of the gathered word, or [UNK]. */
static void end_word(enc *e)
{
    int nch = e->chars;
    e->chars = 0;
    if (nch == 0)
        return;
    if (nch > MAX_WORD_CHARS) {
        emit(e, e->wp->unk);
        return;
    }
    int32_t pieces[MAX_WORD_CHARS];
    int np = 0;
    for (int start = 0; start < nch;) {
        int32_t id = -1;
        int end = nch;
        for (; end > start; end--) {
            id = lookup(e->wp, start > 0, e->word + e->bound[start],
                        (size_t)(e->bound[end] - e->bound[start]));
            if (id >= 0)
                break;
        }
        if (id < 0) {
            emit(e, e->wp->unk);
            return;
        }
        pieces[np++] = id;
        start = end;
    }
    for (int i = 0; i < np; i++)
        emit(e, pieces[i]);
}

static void add_char(enc *e, uint32_t c)
{
    if (e->chars < MAX_WORD_CHARS) {
        uint16_t at = e->bound[e->chars];
        at += (uint16_t)eng_utf8_put(c, (unsigned char *)e->word + at);
        e->bound[e->chars + 1] = at;
    }
    e->chars++;
}

/* One normalized codepoint through the pre-tokenizer. */
static void pretok(enc *e, uint32_t c)
{
    unsigned f = cpt_flags(e->wp, c);
    if (f & WP_SPACE) {
        end_word(e);
    } else if (f & WP_PUNCT) {
        end_word(e);
        add_char(e, c);
        end_word(e);
    } else {
        add_char(e, c);
    }
}

/* The special token whose text starts at s[0..len), or -1; *n gets its length. */
static int32_t special_at(const eng_wordpiece *wp, const char *s, size_t len, size_t *n)
{
    for (int i = 0; i < N_SPECIAL; i++) {
        size_t sl = strlen(SPECIALS[i]);
        if (wp->special[i] >= 0 && sl <= len && memcmp(s, SPECIALS[i], sl) == 0) {
            *n = sl;
            return wp->special[i];
        }
    }
    return -1;
}

int eng_wordpiece_encode(const eng_wordpiece *wp, const char *text, size_t len, int max_tokens,
                         int32_t *ids, int cap)
{
    enc e = {.wp = wp, .ids = ids, .cap = cap, .limit = max_tokens > 2 ? max_tokens - 2 : 0};
    e.bound[0] = 0;
    const unsigned char *s = (const unsigned char *)text;
    size_t pos = 0;
    while (pos < len && !full(&e)) {
        size_t n;
        if (s[pos] == '[') {
            int32_t id = special_at(wp, text + pos, len - pos, &n);
            if (id >= 0) {
                end_word(&e);
                emit(&e, id);
                pos += n;
                continue;
            }
        }
        uint32_t c = eng_utf8_next(s + pos, len - pos, &n);
        pos += n;
        unsigned f = cpt_flags(wp, c);
        if (f & WP_DROP)
            continue;
        if (f & WP_CJK) {
            end_word(&e);
            add_char(&e, c);
            end_word(&e);
        } else if (f & WP_MAPPED) {
            const uint32_t *seq = NULL;
            size_t k = mapped(c, &seq);
            for (size_t i = 0; i < k; i++)
                pretok(&e, seq[i]);
        } else {
            pretok(&e, c);
        }
    }
    end_word(&e);
    if (cap > 0)
        ids[0] = wp->cls;
    if (1 + e.n < cap)
        ids[1 + e.n] = wp->sep;
    return e.n + 2;
}
