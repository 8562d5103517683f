/* engine/dtype.c: block layouts from the GGUF/ggml specification:
 * Q4_0 = f16 scale + 16 bytes of nibbles (32 weights); Q4_1 adds an f16 min; Q8_0 = f16 scale +
 * 32 int8; Q4_K and Q6_K are 256-weight super-blocks of 144 and 210 bytes. */
#include "engine/dtype.h"

static const struct {
    uint32_t id;
    eng_dtype_info info;
} k_types[] = {
    {ENG_DTYPE_F32, {"F32", 1, 4}},     {ENG_DTYPE_F16, {"F16", 1, 2}},
    {ENG_DTYPE_BF16, {"BF16", 1, 2}},   {ENG_DTYPE_Q4_0, {"Q4_0", 32, 18}},
    {ENG_DTYPE_Q4_1, {"Q4_1", 32, 20}}, {ENG_DTYPE_Q8_0, {"Q8_0", 32, 34}},
    {ENG_DTYPE_Q4_K, {"Q4_K", 256, 144}}, {ENG_DTYPE_Q6_K, {"Q6_K", 256, 210}},
};

const eng_dtype_info *eng_dtype_get(uint32_t type_id)
{
    for (size_t i = 0; i < sizeof k_types / sizeof k_types[0]; i++)
        if (k_types[i].id == type_id)
            return &k_types[i].info;
    return 0;
}

size_t eng_dtype_row_bytes(uint32_t type_id, uint64_t n)
{
    const eng_dtype_info *t = eng_dtype_get(type_id);
    if (t == 0 || n % t->block_elems != 0)
        return 0;
    return (size_t)(n / t->block_elems * t->block_bytes);
}
