/* tests/unit/kernels/test_timed.c: the timing backend (kernels/timed.h) hands every call to the
 * CPU backend unchanged (same bits out), counts the calls of each kind, names matmuls by shape
 * and type, orders the stages by time, and starts over on reset; over a device backend (a fake
 * one whose work is done when something is copied out) each stage's time includes the work. */
#include "kernels/timed.h"

#include "kernels/cpu/internal.h"

#include "tests/unit/unit.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

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

/* A device backend as the timing wrapper sees one: its calls return at once and its queued
 * work (2 ms a call) is done by the next copy out. */
typedef struct fake_dev {
    int queued, copies_out, allocs;
} fake_dev;

static void *fake_alloc(void *ctx, size_t n)
{
    fake_dev *f = ctx;
    f->allocs++;
    return calloc(1, n);
}

static void fake_free(void *ctx, void *buf, size_t n)
{
    fake_dev *f = ctx;
    (void)n;
    f->allocs--;
    free(buf);
}

static void fake_copy_out(void *ctx, const void *buf, size_t off, void *dst, size_t n)
{
    fake_dev *f = ctx;
    struct timespec d = {0, 2000000L * f->queued};
    while (f->queued > 0 && nanosleep(&d, &d) != 0)
        ;
    f->queued = 0;
    f->copies_out++;
    memcpy(dst, (const uint8_t *)buf + off, n);
}

static void fake_add(void *ctx, float *y, const float *x, size_t n)
{
    (void)y, (void)x, (void)n;
    ((fake_dev *)ctx)->queued++;
}

static fake_dev g_fake;

static void fake_destroy(void *ctx)
{
    (void)ctx;
}

static void device_work_is_waited_for(void **state)
{
    (void)state;
    static kern_backend dev = {.name = "fake", .ctx = &g_fake, .host_memory = false,
                               .buffer_alloc = fake_alloc, .buffer_free = fake_free,
                               .buffer_copy_out = fake_copy_out, .add = fake_add,
                               .destroy = fake_destroy};
    kern_backend *t = kern_timed_new(&dev);
    assert_non_null(t);
    assert_int_equal(g_fake.allocs, 1);   /* the probe */
    float y[4] = {0}, x[4] = {0};
    for (int i = 0; i < 3; i++)
        t->add(t->ctx, y, x, 4);
    assert_int_equal(g_fake.queued, 0);   /* each call waited for */
    assert_int_equal(g_fake.copies_out, 3);
    kern_stage st[4];
    assert_int_equal(kern_timed_stages(t, st, 4), 1);
    assert_string_equal(st[0].name, "add");
    assert_true(st[0].ns >= 3 * 2000000u);   /* the device's work, not the calls' return */
    kern_backend_free(t);
    assert_int_equal(g_fake.allocs, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(forwards_and_counts),
        cmocka_unit_test(device_work_is_waited_for),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
