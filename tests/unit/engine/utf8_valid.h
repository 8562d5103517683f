/* tests/unit/engine/utf8_valid.h: a strict UTF-8 validator for the engine tests, written
 * independently of engine/text/tokenizer.c (it decodes each character and checks the code point):
 * no overlong forms, surrogates, code points past U+10FFFF, stray or missing continuations. */
#ifndef LLMGW_TESTS_UNIT_ENGINE_UTF8_VALID_H
#define LLMGW_TESTS_UNIT_ENGINE_UTF8_VALID_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

static inline bool utf8_valid(const char *text, size_t n)
{
    const unsigned char *s = (const unsigned char *)text;
    for (size_t i = 0; i < n;) {
        unsigned c = s[i];
        size_t len;
        uint32_t cp, min;
        if (c < 0x80) {
            i++;
            continue;
        } else if ((c & 0xe0) == 0xc0) {
            len = 2, cp = c & 0x1f, min = 0x80;
        } else if ((c & 0xf0) == 0xe0) {
            len = 3, cp = c & 0x0f, min = 0x800;
        } else if ((c & 0xf8) == 0xf0) {
            len = 4, cp = c & 0x07, min = 0x10000;
        } else {
            return false;
        }
        if (len > n - i)
            return false;
        for (size_t k = 1; k < len; k++) {
            if ((s[i + k] & 0xc0) != 0x80)
                return false;
            cp = cp << 6 | (s[i + k] & 0x3f);
        }
        if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
            return false;
        i += len;
    }
    return true;
}

#endif
