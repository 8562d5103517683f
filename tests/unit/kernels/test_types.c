/* tests/unit/kernels/test_types.c: GGUF block layouts and row sizes (kern_type_*). */
#include "kernels/types.h"

#include "tests/unit/unit.h"

#include <math.h>

static void check_type(uint32_t id, const char *name, uint32_t elems, uint32_t bytes)
{
    const kern_type_traits *t = kern_type_get(id);
    assert_non_null(t);
    assert_string_equal(t->name, name);
    assert_int_equal(t->block_elems, elems);
    assert_int_equal(t->block_bytes, bytes);
}

static void block_layouts(void **state)
{
    (void)state;
    check_type(KERN_TYPE_F32, "F32", 1, 4);
    check_type(KERN_TYPE_F16, "F16", 1, 2);
    check_type(KERN_TYPE_BF16, "BF16", 1, 2);
    check_type(KERN_TYPE_Q4_0, "Q4_0", 32, 18);  /* f16 scale + 16 bytes of nibbles */
    check_type(KERN_TYPE_Q4_1, "Q4_1", 32, 20);  /* + f16 min */
    check_type(KERN_TYPE_Q8_0, "Q8_0", 32, 34);  /* f16 scale + 32 int8 */
    check_type(KERN_TYPE_Q4_K, "Q4_K", 256, 144);
    check_type(KERN_TYPE_Q6_K, "Q6_K", 256, 210);
}

static void unknown_types(void **state)
{
    (void)state;
    /* 4-5 are retired ggml ids, 6-7 Q5_0/Q5_1, 9 Q8_1, 10-11 Q2_K/Q3_K, 13 Q5_K, 15 Q8_K, 16+ IQ
     * types: llmgw does not load them. */
    static const uint32_t unknown[] = {4, 5, 6, 7, 9, 10, 11, 13, 15, 16, 29, 31, 1000, UINT32_MAX};
    for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
        assert_null(kern_type_get(unknown[i]));
        assert_int_equal(kern_type_row_bytes(unknown[i], 256), 0);
    }
}

static void row_bytes(void **state)
{
    (void)state;
    assert_int_equal(kern_type_row_bytes(KERN_TYPE_Q4_1, 32), 20);
    assert_int_equal(kern_type_row_bytes(KERN_TYPE_Q4_1, 4096), 4096 / 32 * 20);
    assert_int_equal(kern_type_row_bytes(KERN_TYPE_Q6_K, 256), 210);
    assert_int_equal(kern_type_row_bytes(KERN_TYPE_Q6_K, 4096), 16 * 210);
    assert_int_equal(kern_type_row_bytes(KERN_TYPE_Q4_0, 64), 36);
    assert_int_equal(kern_type_row_bytes(KERN_TYPE_Q8_0, 32), 34);
    assert_int_equal(kern_type_row_bytes(KERN_TYPE_Q4_K, 512), 288);
    assert_int_equal(kern_type_row_bytes(KERN_TYPE_F32, 3), 12);
    assert_int_equal(kern_type_row_bytes(KERN_TYPE_F16, 7), 14);
    assert_int_equal(kern_type_row_bytes(KERN_TYPE_BF16, 1), 2);
    assert_int_equal(kern_type_row_bytes(KERN_TYPE_F32, 0), 0);
    /* Large rows do not overflow in the intermediate product. */
    assert_int_equal(kern_type_row_bytes(KERN_TYPE_Q4_0, (uint64_t)1 << 40),
                     ((uint64_t)1 << 40) / 32 * 18);
}

static void bad_multiples_give_zero(void **state)
{
    (void)state;
    assert_int_equal(kern_type_row_bytes(KERN_TYPE_Q4_1, 33), 0);
    assert_int_equal(kern_type_row_bytes(KERN_TYPE_Q4_1, 31), 0);
    assert_int_equal(kern_type_row_bytes(KERN_TYPE_Q4_0, 16), 0);
    assert_int_equal(kern_type_row_bytes(KERN_TYPE_Q8_0, 48), 0);
    assert_int_equal(kern_type_row_bytes(KERN_TYPE_Q6_K, 128), 0);
    assert_int_equal(kern_type_row_bytes(KERN_TYPE_Q4_K, 257), 0);
}

static void names_and_kinds(void **state)
{
    (void)state;
    assert_string_equal(kern_type_name(KERN_TYPE_Q6_K), "Q6_K");
    assert_string_equal(kern_type_name(13), "?");
    assert_false(kern_type_get(KERN_TYPE_F16)->quantized);
    assert_false(kern_type_get(KERN_TYPE_BF16)->quantized);
    assert_true(kern_type_get(KERN_TYPE_Q4_1)->quantized);
    assert_true(kern_type_get(KERN_TYPE_Q4_K)->quantized);
}

static void half_conversions(void **state)
{
    (void)state;
    assert_int_equal(kern_f32_to_f16(1.0f), 0x3c00);
    assert_int_equal(kern_f32_to_f16(65520.0f), 0x7c00);       /* rounds to infinity */
    assert_true(kern_f16_to_f32(0x0001) == 0x1p-24f);          /* smallest subnormal */
    assert_int_equal(kern_f32_to_bf16(1.0f), 0x3f80);
    assert_true(kern_bf16_to_f32(0x4049) == 3.140625f);
    assert_true(isnan(kern_f16_to_f32(kern_f32_to_f16(NAN))));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(block_layouts),
        cmocka_unit_test(unknown_types),
        cmocka_unit_test(row_bytes),
        cmocka_unit_test(bad_multiples_give_zero),
        cmocka_unit_test(names_and_kinds),
        cmocka_unit_test(half_conversions),
    };
    return cmocka_run_group_tests_name("kernels/types", tests, NULL, NULL);
}
