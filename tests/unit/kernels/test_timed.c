/* tests/unit/kernels/test_timed.c: the timing backend (kernels/timed.h) hands every call to the
 * CPU backend unchanged (same bits out), counts the calls of each kind, names matmuls by shape
 * and type, orders the stages by time, and starts over on reset. */
#include "kernels/timed.h"

#include "kernels/cpu/internal.h"

#include "tests/unit/unit.h"

#include <stdlib.h>
#include <string.h>

static void forwards_and_counts(void **state)
{
    (void)state;
    kern_backend *plain = kern_cpu_backend_new(2);
    kern_backend *t = kern_timed_new(kern_cpu_backend_new(2));
    assert_non_null(plain);
    assert_non_null(t);
    assert_int_equal(t->n_threads(t->ctx), 2);
    assert_int_equal(plain->reserve(plain->ctx, 3, 256, 16), 0);
    assert_int_equal(t->reserve(t->ctx, 3, 256, 16), 0);

    enum { ROWS = 40, COLS = 256 };
    uint16_t *w = malloc(ROWS * COLS * sizeof *w);
    float x[3 * COLS], y1[3 * ROWS], y2[3 * ROWS], n1[3 * COLS], n2[3 * COLS], g[COLS];
    for (int i = 0; i < ROWS * COLS; i++)
        w[i] = kern_f32_to_f16((float)((i * 37) % 101 - 50) / 400.0f);
    for (int i = 0; i < 3 * COLS; i++)
        x[i] = (float)((i * 13) % 29 - 14) / 7.0f;
    for (int i = 0; i < COLS; i++)
        g[i] = 1.0f + (float)(i % 5) / 10.0f;
    kern_tensor wt = {.type = KERN_TYPE_F16, .rows = ROWS, .cols = COLS,
                      .row_bytes = COLS * sizeof *w, .data = w};
    for (int rep = 0; rep < 2; rep++) {
        plain->matmul(plain->ctx, &wt, x, 3, y1, ROWS);
        t->matmul(t->ctx, &wt, x, 3, y2, ROWS);
    }
    assert_memory_equal(y1, y2, sizeof y1);
    plain->rmsnorm(plain->ctx, n1, x, g, COLS, 3, 1e-5f);
    t->rmsnorm(t->ctx, n2, x, g, COLS, 3, 1e-5f);
    assert_memory_equal(n1, n2, sizeof n1);

    kern_stage st[8];
    int n = kern_timed_stages(t, st, 8);
    assert_int_equal(n, 2);
    int mm = strcmp(st[0].name, "matmul 40x256 F16") == 0 ? 0 : 1;
    assert_string_equal(st[mm].name, "matmul 40x256 F16");
    assert_int_equal(st[mm].calls, 2);
    assert_string_equal(st[1 - mm].name, "rmsnorm");
    assert_int_equal(st[1 - mm].calls, 1);
    assert_true(st[0].ns >= st[1].ns);
    assert_int_equal(kern_timed_stages(t, st, 1), 1);

    kern_timed_reset(t);
    assert_int_equal(kern_timed_stages(t, st, 8), 0);
    free(w);
    kern_backend_free(plain);
    kern_backend_free(t);
    assert_null(kern_timed_new(NULL));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(forwards_and_counts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
