/* engine/text/unicode.h: the little Unicode the tokenizer needs, with llama.cpp's exact semantics:
 * codepoint classes (Unicode 15.1 general categories + White_Space, the table llama.cpp's
 * pre-tokenizers use), llama.cpp's lenient UTF-8 reader, and the GPT-2 byte <-> codepoint map
 * of byte-level BPE vocabularies. Pure functions and constant tables: thread-safe. */
#ifndef LLMGW_ENGINE_UNICODE_H
#define LLMGW_ENGINE_UNICODE_H

#include <stddef.h>
#include <stdint.h>

/* Class bits of a codepoint. Every codepoint below 0x110000 has exactly one of the first eight
 * (ENG_UC_UNDEFINED is an unassigned codepoint), plus ENG_UC_WHITESPACE for White_Space. */
enum {
    ENG_UC_UNDEFINED = 0x001,
    ENG_UC_NUMBER = 0x002,     /* \p{N} */
    ENG_UC_LETTER = 0x004,     /* \p{L} */
    ENG_UC_SEPARATOR = 0x008,  /* \p{Z} */
    ENG_UC_MARK = 0x010,       /* \p{M} */
    ENG_UC_PUNCT = 0x020,      /* \p{P} */
    ENG_UC_SYMBOL = 0x040,     /* \p{S} */
    ENG_UC_CONTROL = 0x080,    /* \p{C} except Cn */
    ENG_UC_CATEGORIES = 0x0ff,
    ENG_UC_WHITESPACE = 0x100, /* \s */
};

/* The class bits of cpt; codepoints >= 0x110000 are ENG_UC_UNDEFINED. */
uint16_t eng_unicode_flags(uint32_t cpt);

/* Reads the codepoint at s[0..len) (len >= 1) as llama.cpp does: no overlong or surrogate
 * checks, F0-F7 start 4-byte sequences; a byte that starts no complete sequence reads as
 * U+FFFD of length 1. So does a sequence past U+10FFFF (on which llama.cpp aborts). Stores the
 * byte length in *n. */
uint32_t eng_utf8_next(const unsigned char *s, size_t len, size_t *n);

/* Writes cpt (< 0x110000) as UTF-8 into out[4]; returns the length (1-4), 0 if out of range. */
size_t eng_utf8_put(uint32_t cpt, unsigned char *out);

/* The GPT-2 byte-level map: bytes 0x21-0x7E, 0xA1-0xAC and 0xAE-0xFF stand for themselves, the
 * other 68 bytes for U+0100.. in byte order. */
uint32_t eng_bytelevel_cpt(uint8_t byte);
int eng_bytelevel_byte(uint32_t cpt);  /* the byte cpt stands for, or -1 */

#endif
