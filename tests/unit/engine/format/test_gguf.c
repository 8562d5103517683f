/* tests/unit/engine/format/test_gguf.c: the GGUF reader (eng_gguf_*) on files written here: a
 * valid file's metadata, typed getters and tensors read back; every prefix of it refused as
 * truncated, never a crash; bad magic, versions, tensor types, row lengths, duplicate and
 * out-of-file tensors refused with a message naming the file and the problem. */
#include "engine/format/gguf.h"
#include "kernels/types.h"

#include "tests/unit/engine/gguf_writer.h"
#include "tests/unit/unit.h"

#include <stdlib.h>
#include <string.h>

static float g_a[8] = {1, 2, 3, 4, 5, 6, 7, 8};
static uint8_t g_q[34];   /* one Q8_0 block of 32 weights */

/* A small valid file: six kinds of metadata, an F32 [4 x 2] and a Q8_0 [32] tensor. */
static unsigned char *valid_file(size_t *size, const gguf_tensor_in *override, size_t n_t)
{
    gbuf b = {0};
    kv(&b, "general.architecture", ENG_GGUF_STRING);
    put_str(&b, "llama");
    kv(&b, "llama.block_count", ENG_GGUF_UINT32);
    put_u32(&b, 30);
    kv(&b, "llama.rope.freq_base", ENG_GGUF_FLOAT32);
    float fb = 10000.0f;
    put(&b, &fb, 4);
    kv(&b, "general.flag", ENG_GGUF_BOOL);
    put(&b, "\x01", 1);
    static const char *const names[] = {"a", "bc", "", NULL};
    kv_strs(&b, "tokenizer.ggml.tokens", names);
    kv(&b, "llama.ids", ENG_GGUF_ARRAY);
    put_u32(&b, ENG_GGUF_INT32);
    put_u64(&b, 3);
    int32_t ids[3] = {-1, 0, 7};
    put(&b, ids, sizeof ids);
    gguf_tensor_in t[2] = {
        {"a.weight", 2, {4, 2, 1, 1}, KERN_TYPE_F32, g_a, sizeof g_a},
        {"q.weight", 1, {32, 1, 1, 1}, KERN_TYPE_Q8_0, g_q, sizeof g_q},
    };
    return gguf_finish(&b, override != NULL ? override : t, override != NULL ? n_t : 2, size);
}

static void valid_file_reads_back(void **state)
{
    (void)state;
    size_t size;
    unsigned char *mem = valid_file(&size, NULL, 0);
    eng_gguf *g = NULL;
    util_err err = {0};
    assert_int_equal(eng_gguf_open_mem(&g, mem, size, "ok.gguf", &err), 0);
    assert_int_equal(eng_gguf_n_kv(g), 6);
    assert_int_equal(eng_gguf_alignment(g), 32);
    uint32_t u;
    float f;
    bool flag;
    eng_gguf_str s;
    assert_int_equal(eng_gguf_get_u32(g, "llama.block_count", &u, &err), 0);
    assert_int_equal(u, 30);
    assert_int_equal(eng_gguf_get_f32(g, "llama.rope.freq_base", &f, &err), 0);
    assert_true(f == 10000.0f);
    assert_int_equal(eng_gguf_get_bool(g, "general.flag", &flag, &err), 0);
    assert_true(flag);
    assert_int_equal(eng_gguf_get_str(g, "general.architecture", &s, &err), 0);
    assert_true(eng_gguf_str_eq(s, "llama"));
    const eng_gguf_kv *arr;
    assert_int_equal(eng_gguf_get_arr(g, "tokenizer.ggml.tokens", ENG_GGUF_STRING, &arr, &err), 0);
    assert_int_equal(arr->arr_len, 3);
    assert_true(eng_gguf_str_eq(arr->arr_str[1], "bc"));
    assert_int_equal(arr->arr_str[2].len, 0);
    assert_int_equal(eng_gguf_get_arr(g, "llama.ids", ENG_GGUF_INT32, &arr, &err), 0);
    assert_int_equal(((const int32_t *)arr->arr_data)[0], -1);
    /* absent and wrongly typed keys */
    assert_int_equal(eng_gguf_get_u32(g, "nope", &u, &err), LLMGW_ENOTFOUND);
    assert_contains(err.msg, "nope");
    assert_int_equal(eng_gguf_get_u32(g, "general.architecture", &u, &err), LLMGW_EINVAL);
    assert_contains(err.msg, "ok.gguf");
    assert_int_equal(eng_gguf_get_arr(g, "llama.ids", ENG_GGUF_STRING, &arr, &err),
                     LLMGW_EINVAL);
    /* tensors */
    assert_int_equal(eng_gguf_n_tensors(g), 2);
    const eng_gguf_tensor *a = eng_gguf_tensor_find(g, "a.weight");
    assert_non_null(a);
    assert_int_equal(a->type, KERN_TYPE_F32);
    assert_int_equal(a->ne[0], 4);
    assert_int_equal(a->ne[1], 2);
    assert_int_equal(a->bytes, sizeof g_a);
    assert_memory_equal(a->data, g_a, sizeof g_a);
    assert_int_equal((uintptr_t)a->data % 32, (uintptr_t)mem % 32);
    const eng_gguf_tensor *q = eng_gguf_tensor_find(g, "q.weight");
    assert_non_null(q);
    assert_int_equal(q->bytes, kern_type_row_bytes(KERN_TYPE_Q8_0, 32));
    assert_null(eng_gguf_tensor_find(g, "a"));
    eng_gguf_close(g);
    eng_gguf_close(NULL);
    free(mem);
}

/* Every prefix of a valid file that cuts into its last tensor's data or before is refused (with
 * a message naming the file), never read past: each prefix is copied into a buffer of exactly
 * its size, so ASan sees any overrun. The padding after the last tensor is not needed. */
static void every_prefix_is_refused(void **state)
{
    (void)state;
    size_t size;
    unsigned char *mem = valid_file(&size, NULL, 0);
    size_t data_end = size - (32 - sizeof g_q % 32) % 32;
    for (size_t n = data_end; n <= size; n++) {
        eng_gguf *g = NULL;
        util_err err = {0};
        assert_int_equal(eng_gguf_open_mem(&g, mem, n, "pad.gguf", &err), 0);
        eng_gguf_close(g);
    }
    for (size_t n = 0; n < data_end; n++) {
        unsigned char *cut = malloc(n ? n : 1);
        memcpy(cut, mem, n);
        eng_gguf *g = NULL;
        util_err err = {0};
        int rc = eng_gguf_open_mem(&g, cut, n, "cut.gguf", &err);
        if (rc != LLMGW_EINVAL)
            fail_msg("a %zu-byte prefix of %zu: rc %d", n, size, rc);
        assert_null(g);
        assert_contains(err.msg, "cut.gguf");
        free(cut);
    }
    free(mem);
}

static void expect_refused(unsigned char *mem, size_t size, const char *what)
{
    eng_gguf *g = NULL;
    util_err err = {0};
    assert_int_equal(eng_gguf_open_mem(&g, mem, size, "bad.gguf", &err), LLMGW_EINVAL);
    assert_null(g);
    assert_contains(err.msg, "bad.gguf");
    assert_contains(err.msg, what);
    free(mem);
}

static void bad_files_are_named(void **state)
{
    (void)state;
    size_t size;
    unsigned char *mem = valid_file(&size, NULL, 0);
    mem[0] = 'X';
    expect_refused(mem, size, "bad magic");
    mem = valid_file(&size, NULL, 0);
    mem[4] = 7;   /* version */
    expect_refused(mem, size, "version 7");
    /* a type llmgw has no table entry for (13: Q5_K) */
    gguf_tensor_in t = {"w", 1, {256, 1, 1, 1}, 13, g_q, sizeof g_q};
    mem = valid_file(&size, &t, 1);
    expect_refused(mem, size, "weight type 13");
    /* a row length that is no whole number of blocks */
    t = (gguf_tensor_in){"w", 1, {16, 1, 1, 1}, KERN_TYPE_Q8_0, g_q, sizeof g_q};
    mem = valid_file(&size, &t, 1);
    expect_refused(mem, size, "not a multiple");
    /* the same name twice */
    gguf_tensor_in two[2] = {{"w", 1, {8, 1, 1, 1}, KERN_TYPE_F32, g_a, sizeof g_a},
                             {"w", 1, {8, 1, 1, 1}, KERN_TYPE_F32, g_a, sizeof g_a}};
    mem = valid_file(&size, two, 2);
    expect_refused(mem, size, "appears twice");
    /* a tensor whose data lies past the end (its declared shape is larger than what follows) */
    t = (gguf_tensor_in){"w", 2, {8, 1000, 1, 1}, KERN_TYPE_F32, g_a, sizeof g_a};
    mem = valid_file(&size, &t, 1);
    expect_refused(mem, size, "outside the file");
    /* no dimensions */
    t = (gguf_tensor_in){"w", 0, {1, 1, 1, 1}, KERN_TYPE_F32, g_a, 4};
    mem = valid_file(&size, &t, 1);
    expect_refused(mem, size, "dimensions");
}

int main(void)
{
    for (size_t i = 0; i < sizeof g_q; i++)
        g_q[i] = (uint8_t)i;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(valid_file_reads_back),
        cmocka_unit_test(every_prefix_is_refused),
        cmocka_unit_test(bad_files_are_named),
    };
    return cmocka_run_group_tests_name("engine/gguf", tests, NULL, NULL);
}
