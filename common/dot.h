/* common/dot.h: the int8 dot product that the cache verifier's token alignment and the router's
 * kNN both run in their inner loops (one copy; an AVX2 clone is picked at load time). */
#ifndef LLMGW_COMMON_DOT_H
#define LLMGW_COMMON_DOT_H

#include <stdint.h>

int32_t util_dot_i8(const int8_t *a, const int8_t *b, int n);

#endif
