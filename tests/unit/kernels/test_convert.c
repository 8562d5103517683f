/* tests/unit/kernels/test_convert.c: rows of each type to f32 and back (kern_type_*_f32). */
#include "kernels/convert.h"
#include "kernels/types.h"

#include "tests/unit/unit.h"

#include <math.h>

/* The row conversions: values a type holds exactly come back exactly; bad lengths and unknown
 * types are refused, not converted. */
static void row_conversions(void **state)
{
    (void)state;
    float x[256], y[256];
    uint8_t row[512];
    for (int i = 0; i < 256; i++)
        x[i] = (float)(i % 16 - 8) * 0.25f;   /* multiples of a power of two: exact in F16/BF16 */
    static const uint32_t exact[] = {KERN_TYPE_F32, KERN_TYPE_F16, KERN_TYPE_BF16};
    for (size_t t = 0; t < 3; t++) {
        assert_int_equal(kern_type_from_f32(exact[t], x, row, 128), 0);
        assert_int_equal(kern_type_to_f32(exact[t], row, y, 128), 0);
        assert_memory_equal(x, y, 128 * sizeof *x);
    }
    /* Q8_0: 32 values with max |x| = 2 at scale 2/127: within half a step */
    assert_int_equal(kern_type_from_f32(KERN_TYPE_Q8_0, x, row, 64), 0);
    assert_int_equal(kern_type_to_f32(KERN_TYPE_Q8_0, row, y, 64), 0);
    for (int i = 0; i < 64; i++)
        assert_true(fabsf(x[i] - y[i]) <= 2.0f / 127 / 2 * 1.001f);
    assert_int_equal(kern_type_from_f32(KERN_TYPE_Q8_0, x, row, 48), -1);
    assert_int_equal(kern_type_to_f32(KERN_TYPE_Q4_K, row, y, 128), -1);
    assert_int_equal(kern_type_to_f32(13, row, y, 256), -1);
    assert_int_equal(kern_type_from_f32(13, x, row, 256), -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(row_conversions),
    };
    return cmocka_run_group_tests_name("kernels/convert", tests, NULL, NULL);
}
