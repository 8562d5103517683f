/* kernels/types.c: the type table (block layouts from the GGUF/ggml specification) and the
 * scalar f16/bf16 conversions. */
#include "kernels/types.h"

#include <string.h>

static const kern_type_traits k_types[] = {
    {KERN_TYPE_F32, "F32", 1, 4, false},      {KERN_TYPE_F16, "F16", 1, 2, false},
    {KERN_TYPE_BF16, "BF16", 1, 2, false},    {KERN_TYPE_Q4_0, "Q4_0", 32, 18, true},
    {KERN_TYPE_Q4_1, "Q4_1", 32, 20, true},   {KERN_TYPE_Q8_0, "Q8_0", 32, 34, true},
    {KERN_TYPE_Q4_K, "Q4_K", 256, 144, true}, {KERN_TYPE_Q6_K, "Q6_K", 256, 210, true},
};

const kern_type_traits *kern_type_get(uint32_t id)
{
    for (size_t i = 0; i < sizeof k_types / sizeof k_types[0]; i++)
        if (k_types[i].id == id)
            return &k_types[i];
    return NULL;
}

const char *kern_type_name(uint32_t id)
{
    const kern_type_traits *t = kern_type_get(id);
    return t != NULL ? t->name : "?";
}

size_t kern_type_row_bytes(uint32_t id, uint64_t n)
{
    const kern_type_traits *t = kern_type_get(id);
    if (t == NULL || n % t->block_elems != 0)
        return 0;
    return (size_t)(n / t->block_elems * t->block_bytes);
}

/* ---- f16 / bf16 ---- */

float kern_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t e = (h >> 10) & 0x1f, m = h & 0x3ff, bits;
    float f;
    if (e == 0) {
        f = (float)m * 0x1p-24f;              /* zero or subnormal: exact in f32 */
        return sign ? -f : f;
    }
    if (e == 31)
        bits = sign | 0x7f800000u | (m << 13);
    else
        bits = sign | ((e + 112) << 23) | (m << 13);
    memcpy(&f, &bits, sizeof f);
    return f;
}

uint16_t kern_f32_to_f16(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u)                       /* NaN: keep the top payload bits, make it quiet */
        return (uint16_t)(sign | 0x7e00 | ((ax >> 13) & 0x3ff));
    if (ax >= 0x477ff000u)                      /* >= 65520 rounds to infinity (and inf itself) */
        return (uint16_t)(sign | 0x7c00);
    if (ax < 0x38800000u) {                     /* below 2^-14: a half subnormal or zero */
        uint32_t e = ax >> 23;
        uint32_t m = e ? (ax & 0x7fffff) | 0x800000 : ax;
        uint32_t s = 126 - (e ? e : 1);         /* m * 2^(e-150) in units of 2^-24 */
        if (s > 31)
            return sign;
        uint32_t q = m >> s, rem = m & ((1u << s) - 1), half = 1u << (s - 1);
        if (rem > half || (rem == half && (q & 1)))
            q++;                                /* may carry into the smallest normal: correct */
        return (uint16_t)(sign | q);
    }
    ax += 0xfff + ((ax >> 13) & 1);             /* round to nearest even at bit 13 */
    return (uint16_t)(sign | ((ax - 0x38000000u) >> 13));
}

float kern_bf16_to_f32(uint16_t h)
{
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

uint16_t kern_f32_to_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x40);    /* quiet NaN */
    x += 0x7fff + ((x >> 16) & 1);
    return (uint16_t)(x >> 16);
}

