/* cache/guard.c: the negation guard (see guard.h). */
#include "cache/guard.h"

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
