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

#endif
