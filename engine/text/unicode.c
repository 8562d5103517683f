/* engine/text/unicode.c: codepoint classes (a search in the generated engine/text/unicode_data.c),
 * llama.cpp's UTF-8 reader, and the GPT-2 byte-level map. */
#include "engine/text/unicode.h"

/* engine/text/unicode_data.c (generated): sorted (first codepoint << 9) | flags runs. */
extern const size_t eng__unicode_n_ranges;
extern const uint32_t eng__unicode_ranges[];
extern const uint16_t eng__unicode_ascii[128];

uint16_t eng_unicode_flags(uint32_t cpt)
{
    if (cpt < 128)
        return eng__unicode_ascii[cpt];
    if (cpt >= 0x110000)
        return ENG_UC_UNDEFINED;
    /* The last run whose first codepoint is <= cpt. */
    size_t lo = 0, hi = eng__unicode_n_ranges;
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if ((eng__unicode_ranges[mid] >> 9) <= cpt)
            lo = mid;
        else
            hi = mid;
    }
    return (uint16_t)(eng__unicode_ranges[lo] & 0x1ff);
}

static int is_cont(unsigned char c) { return (c & 0xc0) == 0x80; }

uint32_t eng_utf8_next(const unsigned char *s, size_t len, size_t *n)
{
    unsigned char c = s[0];
    *n = 1;
    if (c < 0x80)
        return c;
    if ((c & 0x40) == 0)  /* a continuation byte where a character should start */
        return 0xfffd;
    if ((c & 0x20) == 0) {
        if (len < 2 || !is_cont(s[1]))
            return 0xfffd;
        *n = 2;
        return ((uint32_t)(c & 0x1f) << 6) | (s[1] & 0x3f);
    }
    if ((c & 0x10) == 0) {
        if (len < 3 || !is_cont(s[1]) || !is_cont(s[2]))
            return 0xfffd;
        *n = 3;
        return ((uint32_t)(c & 0x0f) << 12) | ((uint32_t)(s[1] & 0x3f) << 6) | (s[2] & 0x3f);
    }
    if ((c & 0x08) == 0) {
        if (len < 4 || !is_cont(s[1]) || !is_cont(s[2]) || !is_cont(s[3]))
            return 0xfffd;
        uint32_t cpt = ((uint32_t)(c & 0x07) << 18) | ((uint32_t)(s[1] & 0x3f) << 12) |
                       ((uint32_t)(s[2] & 0x3f) << 6) | (s[3] & 0x3f);
        if (cpt >= 0x110000)  /* llama.cpp throws on these later (and aborts) */
            return 0xfffd;
        *n = 4;
        return cpt;
    }
    return 0xfffd;  /* F8-FF */
}

size_t eng_utf8_put(uint32_t cpt, unsigned char *out)
{
    if (cpt < 0x80) {
        out[0] = (unsigned char)cpt;
        return 1;
    }
    if (cpt < 0x800) {
        out[0] = (unsigned char)(0xc0 | (cpt >> 6));
        out[1] = (unsigned char)(0x80 | (cpt & 0x3f));
        return 2;
    }
    if (cpt < 0x10000) {
        out[0] = (unsigned char)(0xe0 | (cpt >> 12));
        out[1] = (unsigned char)(0x80 | ((cpt >> 6) & 0x3f));
        out[2] = (unsigned char)(0x80 | (cpt & 0x3f));
        return 3;
    }
    if (cpt < 0x110000) {
        out[0] = (unsigned char)(0xf0 | (cpt >> 18));
        out[1] = (unsigned char)(0x80 | ((cpt >> 12) & 0x3f));
        out[2] = (unsigned char)(0x80 | ((cpt >> 6) & 0x3f));
        out[3] = (unsigned char)(0x80 | (cpt & 0x3f));
        return 4;
    }
    return 0;
}

/* The 68 bytes without a printable stand-in, in order: 0x00-0x20, 0x7F-0xA0, 0xAD. They map to
 * U+0100-U+0120, U+0121-U+0142 and U+0143. */
uint32_t eng_bytelevel_cpt(uint8_t b)
{
    if (b <= 0x20)
        return 0x100u + b;
    if (b >= 0x7f && b <= 0xa0)
        return 0x121u + (uint32_t)(b - 0x7f);
    if (b == 0xad)
        return 0x143;
    return b;
}

int eng_bytelevel_byte(uint32_t cpt)
{
    if ((cpt >= 0x21 && cpt <= 0x7e) || (cpt >= 0xa1 && cpt <= 0xff && cpt != 0xad))
        return (int)cpt;
    if (cpt >= 0x100 && cpt <= 0x120)
        return (int)(cpt - 0x100);
    if (cpt >= 0x121 && cpt <= 0x142)
        return (int)(0x7f + (cpt - 0x121));
    if (cpt == 0x143)
        return 0xad;
    return -1;
}
