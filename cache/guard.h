/* cache/guard.h: checks a semantic hit must pass besides the similarity threshold.
 * Sentence embeddings place "how do I X" and "how do I not X" close together; serving one's
 * answer for the other is the classic semantic-cache failure. Pure functions, thread-safe. */
#ifndef LLMGW_CACHE_GUARD_H
#define LLMGW_CACHE_GUARD_H

#include <stdbool.h>
#include <stddef.h>

/* How many negation cues the text holds: the words not, no, never, none, nobody, nothing,
 * nowhere, neither, nor, cannot, without, and every word ending in "n't" (also the apostrophe-less
 * spellings dont, cant, wont, isnt, ...). Case-insensitive; ASCII and U+2019 apostrophes. */
int  cache_negation_count(const char *text, size_t len);

/* True when one question is negated and the other is not (their cue counts differ in parity):
 * the hit must not be served. */
bool cache_negation_mismatch(const char *a, size_t a_len, const char *b, size_t b_len);

typedef enum cache_guard_verdict {
    CACHE_GUARD_OK = 0,
    CACHE_GUARD_NEGATION,    /* one negated, the other not */
    CACHE_GUARD_IDENTIFIER,  /* the tokens holding digits differ: "M604n" / "M604dn", 2014 / 2015 */
    CACHE_GUARD_SWAP,        /* two content words trade places: "A think of B" / "B think of A" */
} cache_guard_verdict;

/* Every check above on two questions (ASCII words; stop words and a plural "s" ignored for the
 * swap check). Measured on ../shared/data/cache/qqp_dev.csv by tools/llmgw-cache-eval. */
cache_guard_verdict cache_guard_check(const char *a, size_t a_len, const char *b, size_t b_len);
/* A function word the swap check and the verifier's content-word features skip ("the",
 * "what", "is", ...): w lower-case ASCII. */
bool cache_stop_word(const char *w);

/* Every check at once: bit (1u << verdict) set for each that fails (the verifier's features). */
unsigned cache_guard_flags(const char *a, size_t a_len, const char *b, size_t b_len);
const char *cache_guard_name(cache_guard_verdict v);

#endif
