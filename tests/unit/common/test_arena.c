/* tests/unit/common/test_arena.c: util_arena (bump allocation, alignment, oversized blocks,
 * string copies) and the x-allocators. ASan checks that every allocation is really usable. */
#include "common/arena.h"

#include <stdlib.h>

#include "tests/unit/unit.h"

static void assert_aligned16(const void *p)
{
    assert_int_equal((uintptr_t)p % 16, 0);
}

static void default_block_size(void **state)
{
    (void)state;
    util_arena a;
    util_arena_init(&a, 0);
    assert_int_equal(a.block_size, 4096);
    assert_null(a.head);
    util_arena_deinit(&a);
}

/* 10,000 allocations of 1..97 bytes: each 16-byte aligned, and none overlaps another (each is
 * filled with its own pattern, then every pattern is checked once all are made). */
static void many_allocations(void **state)
{
    (void)state;
    enum { N = 10000 };
    static unsigned char *ptrs[N];
    util_arena a;
    util_arena_init(&a, 1024);
    for (size_t i = 0; i < N; i++) {
        size_t n = 1 + i % 97;
        ptrs[i] = util_arena_alloc(&a, n);
        assert_non_null(ptrs[i]);
        assert_aligned16(ptrs[i]);
        memset(ptrs[i], (int)(i & 0xff), n);
    }
    for (size_t i = 0; i < N; i++) {
        size_t n = 1 + i % 97;
        for (size_t k = 0; k < n; k++)
            assert_int_equal(ptrs[i][k], i & 0xff);
    }
    util_arena_deinit(&a);
    assert_null(a.head);
}

static void exact_block_size_fits(void **state)
{
    (void)state;
    util_arena a;
    util_arena_init(&a, 256);
    unsigned char *p = util_arena_alloc(&a, 256);
    memset(p, 0xab, 256);
    unsigned char *q = util_arena_alloc(&a, 1);
    assert_aligned16(q);
    assert_true(q < p || q >= p + 256);
    util_arena_deinit(&a);
}

/* A request larger than the block size gets its own block; smaller requests keep filling the
 * current block, and nothing written before is disturbed. */
static void oversized_allocations(void **state)
{
    (void)state;
    util_arena a;
    util_arena_init(&a, 64);
    unsigned char *small1 = util_arena_alloc(&a, 16);
    memset(small1, 1, 16);
    unsigned char *big = util_arena_alloc(&a, 100000);
    assert_aligned16(big);
    memset(big, 2, 100000);
    unsigned char *small2 = util_arena_alloc(&a, 16);
    assert_aligned16(small2);
    memset(small2, 3, 16);
    assert_ptr_equal(small2, small1 + 16); /* still the first block */
    unsigned char *big2 = util_arena_alloc(&a, 1 << 20);
    memset(big2, 4, 1 << 20);
    for (size_t i = 0; i < 16; i++) {
        assert_int_equal(small1[i], 1);
        assert_int_equal(small2[i], 3);
    }
    for (size_t i = 0; i < 100000; i++)
        assert_int_equal(big[i], 2);
    util_arena_deinit(&a);
}

static void oversized_first_allocation(void **state)
{
    (void)state;
    util_arena a;
    util_arena_init(&a, 32);
    unsigned char *big = util_arena_alloc(&a, 5000);
    memset(big, 7, 5000);
    unsigned char *small = util_arena_alloc(&a, 8);
    memset(small, 8, 8);
    assert_aligned16(small);
    assert_int_equal(big[4999], 7);
    util_arena_deinit(&a);
}

static void strndup_copies_and_terminates(void **state)
{
    (void)state;
    util_arena a;
    util_arena_init(&a, 128);
    const char *src = "hello, world";
    char *p = util_arena_strndup(&a, src, 5);
    assert_string_equal(p, "hello");
    assert_ptr_not_equal(p, src);
    char *e = util_arena_strndup(&a, src, 0);
    assert_string_equal(e, "");
    /* Embedded bytes are copied as they are, up to n. */
    char *z = util_arena_strndup(&a, "a\0b", 3);
    assert_int_equal(z[0], 'a');
    assert_int_equal(z[1], '\0');
    assert_int_equal(z[2], 'b');
    assert_int_equal(z[3], '\0');
    char *d = util_arena_strdup(&a, src);
    assert_string_equal(d, src);
    char long_src[3000];
    memset(long_src, 'x', sizeof long_src - 1);
    long_src[sizeof long_src - 1] = '\0';
    char *l = util_arena_strdup(&a, long_src);
    assert_string_equal(l, long_src);
    assert_int_equal(strlen(l), sizeof long_src - 1);
    util_arena_deinit(&a);
}

static void deinit_twice_is_safe(void **state)
{
    (void)state;
    util_arena a;
    util_arena_init(&a, 64);
    (void)util_arena_alloc(&a, 10);
    util_arena_deinit(&a);
    util_arena_deinit(&a);
    assert_null(a.head);
}

static void xalloc_helpers(void **state)
{
    (void)state;
    unsigned char *z = util_xcalloc(100, 3);
    for (size_t i = 0; i < 300; i++)
        assert_int_equal(z[i], 0);
    free(z);
    char *s = util_xstrdup("copy me");
    assert_string_equal(s, "copy me");
    free(s);
    s = util_xstrndup("copy me", 4);
    assert_string_equal(s, "copy");
    free(s);
    void *p = util_xmalloc(0); /* a zero-size request still gives a freeable pointer */
    assert_non_null(p);
    free(p);
}

/* reset keeps one default block, empty: the next allocation reuses its memory; oversized and
 * extra blocks are freed (ASan would report them leaked otherwise). */
static void reset_keeps_one_block(void **state)
{
    (void)state;
    util_arena a;
    util_arena_init(&a, 256);
    unsigned char *first = util_arena_alloc(&a, 100);
    util_arena_reset(&a);
    assert_ptr_equal(util_arena_alloc(&a, 100), first);
    for (int i = 0; i < 10; i++)
        memset(util_arena_alloc(&a, 200), 0xab, 200);
    memset(util_arena_alloc(&a, 5000), 0xcd, 5000);   /* an oversized block too */
    util_arena_reset(&a);
    unsigned char *p = util_arena_alloc(&a, 256);      /* a whole kept block, no new one */
    memset(p, 0, 256);
    util_arena_reset(&a);
    util_arena_reset(&a);                              /* twice: fine */
    assert_ptr_equal(util_arena_alloc(&a, 16), p);
    util_arena_deinit(&a);
    util_arena a2;
    util_arena_init(&a2, 64);
    util_arena_reset(&a2);                             /* nothing allocated yet */
    assert_non_null(util_arena_alloc(&a2, 8));
    util_arena_deinit(&a2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(default_block_size),
        cmocka_unit_test(many_allocations),
        cmocka_unit_test(exact_block_size_fits),
        cmocka_unit_test(oversized_allocations),
        cmocka_unit_test(oversized_first_allocation),
        cmocka_unit_test(strndup_copies_and_terminates),
        cmocka_unit_test(deinit_twice_is_safe),
        cmocka_unit_test(xalloc_helpers),
        cmocka_unit_test(reset_keeps_one_block),
    };
    return cmocka_run_group_tests_name("common/arena", tests, NULL, NULL);
}
