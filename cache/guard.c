/* cache/guard.c: the negation guard (see guard.h). */
#include "cache/guard.h"

#include <stdlib.h>
#include <string.h>

static const char *const cues[] = {
    "not", "no", "never", "none", "nobody", "nothing", "nowhere", "neither", "nor", "cannot",
    "without",
    /* "n't" forms as people type them without the apostrophe */
    "dont", "doesnt", "didnt", "cant", "couldnt", "wont", "wouldnt", "shouldnt", "isnt", "arent",
    "wasnt", "werent", "havent", "hasnt", "hadnt", "mustnt", "neednt", "aint",
};

static bool is_word_byte(unsigned char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '\'' || c >= 0x80;
}

static bool is_cue(const char *w, size_t n)
{
    /* Apostrophes normalised away: "n't" becomes "nt" at the end of a word; only the listed
     * contractions count, so "want", "event" and "cent" are not cues. */
    char low[24];
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)w[i];
        if (c == '\'')
            continue;
        if (c == 0xE2 && i + 2 < n && (unsigned char)w[i + 1] == 0x80 &&
            (unsigned char)w[i + 2] == 0x99) {  /* U+2019 */
            i += 2;
            continue;
        }
        if (k + 1 >= sizeof low)
            return false;
        low[k++] = (char)(c >= 'A' && c <= 'Z' ? c + 32 : c);
    }
    low[k] = '\0';
    for (size_t i = 0; i < sizeof cues / sizeof cues[0]; i++)
        if (!strcmp(low, cues[i]))
            return true;
    /* Any other contraction in n't: "mightn't", "oughtn't" (the apostrophe was there). */
    if (k >= 3 && low[k - 1] == 't' && low[k - 2] == 'n' && memchr(w, '\'', n) != NULL)
        return true;
    return false;
}

int cache_negation_count(const char *text, size_t len)
{
    int count = 0;
    size_t i = 0;
    while (i < len) {
        while (i < len && !is_word_byte((unsigned char)text[i]))
            i++;
        size_t start = i;
        while (i < len && is_word_byte((unsigned char)text[i]))
            i++;
        if (i > start && is_cue(text + start, i - start))
            count++;
    }
    return count;
}

bool cache_negation_mismatch(const char *a, size_t a_len, const char *b, size_t b_len)
{
    return (cache_negation_count(a, a_len) & 1) != (cache_negation_count(b, b_len) & 1);
}

/* ---- identifier and swap checks ---------------------------------------------------------- */

enum { MAX_WORDS = 96, WORD_CAP = 32 };

static const char *const stop_words[] = {
    "a", "about", "all", "also", "an", "and", "any", "are", "as", "at", "be", "been", "best",
    "but", "by", "can", "could", "did", "do", "does", "doing", "each", "every", "for", "from",
    "get", "gets", "good", "got", "had", "has", "have", "having", "he", "here", "how", "i", "if",
    "in", "into", "is", "it", "its", "just", "make", "may", "me", "might", "more", "most", "must",
    "my", "no", "not", "of", "on", "one", "only", "or", "our", "s", "shall", "she", "should",
    "so", "some", "t", "than", "that", "the", "their", "them", "then", "there", "these", "they",
    "this", "those", "to", "very", "was", "way", "ways", "we", "were", "what", "when", "where",
    "which", "who", "whom", "whose", "why", "will", "with", "would", "you", "your",
};

typedef struct words {
    char w[MAX_WORDS][WORD_CAP];
    int n;
    bool overflow;
} words;

static int cmp_str(const void *a, const void *b)
{
    return strcmp((const char *)a, (const char *)b);
}

static int cmp_ptr_str(const void *key, const void *elem)
{
    return strcmp((const char *)key, *(const char *const *)elem);
}

static bool is_stop(const char *w)
{
    return bsearch(w, stop_words, sizeof stop_words / sizeof stop_words[0], sizeof stop_words[0],
                   cmp_ptr_str) != NULL;
}

bool cache_stop_word(const char *w)
{
    return is_stop(w);
}

/* Splits text into lower-case ASCII tokens; `keep` picks which characters belong to a token. */
static void split(const char *text, size_t len, bool with_dots, words *out)
{
    out->n = 0;
    out->overflow = false;
    size_t i = 0;
    while (i < len) {
        char c = text[i];
        bool alnum = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
        if (!alnum) {
            i++;
            continue;
        }
        size_t k = 0;
        char buf[WORD_CAP];
        while (i < len) {
            c = text[i];
            alnum = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
            if (!alnum && !(with_dots && c == '.' && k > 0))
                break;
            if (k + 1 < WORD_CAP)
                buf[k++] = (char)(c >= 'A' && c <= 'Z' ? c + 32 : c);
            i++;
        }
        while (k > 0 && buf[k - 1] == '.')
            k--;
        buf[k] = '\0';
        if (k == 0)
            continue;
        if (out->n == MAX_WORDS) {
            out->overflow = true;
            return;
        }
        memcpy(out->w[out->n++], buf, k + 1);
    }
}

static bool has_digit(const char *w)
{
    for (; *w; w++)
        if (*w >= '0' && *w <= '9')
            return true;
    return false;
}

/* The sorted, de-duplicated tokens holding a digit. */
static void digit_tokens(const char *text, size_t len, words *out)
{
    words all;
    split(text, len, true, &all);
    out->n = 0;
    out->overflow = all.overflow;
    for (int i = 0; i < all.n; i++)
        if (has_digit(all.w[i]))
            memcpy(out->w[out->n++], all.w[i], WORD_CAP);
    qsort(out->w, (size_t)out->n, WORD_CAP, cmp_str);
    int u = 0;
    for (int i = 0; i < out->n; i++)
        if (u == 0 || strcmp(out->w[u - 1], out->w[i]) != 0)
            memmove(out->w[u++], out->w[i], WORD_CAP);
    out->n = u;
}

/* Content words in order: stop words dropped, a plural "s" cut from words longer than 3. */
static void content_words(const char *text, size_t len, words *out)
{
    words all;
    split(text, len, false, &all);
    out->n = 0;
    out->overflow = all.overflow;
    for (int i = 0; i < all.n; i++) {
        if (is_stop(all.w[i]))
            continue;
        size_t k = strlen(all.w[i]);
        memcpy(out->w[out->n], all.w[i], WORD_CAP);
        if (k > 3 && out->w[out->n][k - 1] == 's')
            out->w[out->n][k - 1] = '\0';
        out->n++;
    }
}

static bool same_words(const words *a, const words *b)
{
    if (a->n != b->n)
        return false;
    for (int i = 0; i < a->n; i++)
        if (strcmp(a->w[i], b->w[i]) != 0)
            return false;
    return true;
}

unsigned cache_guard_flags(const char *a, size_t a_len, const char *b, size_t b_len)
{
    unsigned flags = 0;
    if (cache_negation_mismatch(a, a_len, b, b_len))
        flags |= 1u << CACHE_GUARD_NEGATION;
    words *x = malloc(sizeof *x), *y = malloc(sizeof *y);
    if (x == NULL || y == NULL)
        goto out;
    digit_tokens(a, a_len, x);
    digit_tokens(b, b_len, y);
    if (!x->overflow && !y->overflow && !same_words(x, y))
        flags |= 1u << CACHE_GUARD_IDENTIFIER;
    content_words(a, a_len, x);
    content_words(b, b_len, y);
    if (x->overflow || y->overflow || x->n != y->n)
        goto out;
    /* Two content words trade places and nothing else moves: "what do Croats think of Turks" /
     * "what do Turks think of Croats". A paraphrase that moves a phrase is not this. */
    int diff[3], n_diff = 0;
    for (int i = 0; i < x->n && n_diff < 3; i++)
        if (strcmp(x->w[i], y->w[i]) != 0)
            diff[n_diff++] = i;
    if (n_diff == 2 && !strcmp(x->w[diff[0]], y->w[diff[1]]) &&
        !strcmp(x->w[diff[1]], y->w[diff[0]]))
        flags |= 1u << CACHE_GUARD_SWAP;
out:
    free(x);
    free(y);
    return flags;
}

cache_guard_verdict cache_guard_check(const char *a, size_t a_len, const char *b, size_t b_len)
{
    unsigned flags = cache_guard_flags(a, a_len, b, b_len);
    for (int v = CACHE_GUARD_NEGATION; v <= CACHE_GUARD_SWAP; v++)
        if (flags & (1u << v))
            return (cache_guard_verdict)v;
    return CACHE_GUARD_OK;
}

const char *cache_guard_name(cache_guard_verdict v)
{
    switch (v) {
    case CACHE_GUARD_OK: return "ok";
    case CACHE_GUARD_NEGATION: return "negation";
    case CACHE_GUARD_IDENTIFIER: return "identifier";
    case CACHE_GUARD_SWAP: return "swap";
    }
    return "?";
}
