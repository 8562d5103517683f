/* tests/unit/kernels/test_roofline.c: kernels/roofline.h on this machine: the figures are positive
 * where the CPU can measure them (an f32 FMA peak wherever there is AVX2 and FMA, a BF16 peak
 * only with AVX512_BF16), more threads never read less than a tenth of one thread's, the flags
 * name what cpuid reports, and the markdown has a row per measurement. No speed thresholds: the
 * machines differ and are shared. */
#include "kernels/roofline.h"

#include "tests/unit/unit.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool has_flag(const char *flags, const char *name)
{
    size_t n = strlen(name);
    for (const char *p = strstr(flags, name); p != NULL; p = strstr(p + 1, name))
        if ((p == flags || p[-1] == ' ') && (p[n] == ' ' || p[n] == '\0'))
            return true;
    return false;
}

static void measures_and_prints(void **state)
{
    (void)state;
    char model[128], flags[256];
    kern_cpu_model(model, sizeof model);
    kern_cpu_flags(flags, sizeof flags);
    assert_true(model[0] != '\0');
    assert_true(flags[0] != '\0');
#if defined(__x86_64__)
    __builtin_cpu_init();
    assert_int_equal(has_flag(flags, "avx2"), __builtin_cpu_supports("avx2") != 0);
    assert_int_equal(has_flag(flags, "avx512f"), __builtin_cpu_supports("avx512f") != 0);
#endif
    kern_roofline r[2];
    assert_int_equal(kern_roofline_measure(&r[0], 1), 0);
    assert_int_equal(kern_roofline_measure(&r[1], 2), 0);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(r[i].threads, i + 1);
        assert_true(r[i].read_gbs > 0);
        if (has_flag(flags, "avx2") && has_flag(flags, "fma"))
            assert_true(r[i].f32_gflops > 0);
        assert_int_equal(r[i].bf16_gflops > 0, has_flag(flags, "avx512_bf16"));
        if (!has_flag(flags, "amx_bf16"))
            assert_true(r[i].amx_gflops == 0);
        assert_non_null(r[i].f32_isa);
    }
    assert_true(r[1].read_gbs > r[0].read_gbs / 10);

    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_non_null(f);
    kern_roofline_print(f, r, 2);
    fclose(f);
    assert_non_null(strstr(buf, model));
    assert_non_null(strstr(buf, "| 2 |"));
    assert_non_null(strstr(buf, "read GB/s"));
    assert_non_null(strstr(buf, "AMX BF16 peak"));
    free(buf);
    kern_roofline none;
    assert_int_equal(kern_roofline_measure(&none, 0), -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(measures_and_prints),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
