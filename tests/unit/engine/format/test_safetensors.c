/* tests/unit/engine/format/test_safetensors.c: the safetensors reader (eng_safetensors_*): a
 * valid file read back, and every kind of broken file refused with a message naming the file and
 * the problem (small files written to a temp dir). */
#include "engine/format/safetensors.h"

#include "tests/unit/unit.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- safetensors ---- */

static char g_tmp[256];

/* Writes an 8-byte header length, hdr, then n_data bytes of data to g_tmp/name. */
static const char *write_st(const char *name, const char *hdr, const void *data, size_t n_data,
                            long long hlen_override)
{
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", g_tmp, name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    uint64_t hlen = hlen_override >= 0 ? (uint64_t)hlen_override : strlen(hdr);
    unsigned char le[8];
    for (int i = 0; i < 8; i++)
        le[i] = (unsigned char)(hlen >> (8 * i));
    assert_int_equal(fwrite(le, 1, 8, f), 8);
    fwrite(hdr, 1, strlen(hdr), f);
    if (n_data > 0)
        fwrite(data, 1, n_data, f);
    fclose(f);
    return path;
}

static const float DATA[8] = {1, 2, 3, 4, 5, 6, 0, 0};  /* 24 bytes F32 + 8 bytes BF16 */

static void safetensors_valid(void **state)
{
    (void)state;
    unsigned char data[32];
    memcpy(data, DATA, 24);
    const uint16_t bf[4] = {0x3f80, 0x4000, 0xbf80, 0x0000};  /* 1, 2, -1, 0 */
    memcpy(data + 24, bf, 8);
    const char *hdr = "{\"__metadata__\":{\"format\":\"pt\"},"
                      "\"b\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[24,32]},"
                      "\"a.weight\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}}  ";
    const char *path = write_st("ok.safetensors", hdr, data, sizeof data, -1);
    eng_safetensors *st = NULL;
    util_err err = {0};
    assert_int_equal(eng_safetensors_open(&st, path, &err), 0);
    assert_int_equal(eng_safetensors_count(st), 2);
    const eng_st_tensor *a = eng_safetensors_find(st, "a.weight");
    assert_non_null(a);
    assert_int_equal(a->dtype, ENG_ST_DTYPE_F32);
    assert_int_equal(a->n_dims, 2);
    assert_int_equal(a->shape[0], 2);
    assert_int_equal(a->shape[1], 3);
    assert_int_equal(a->n_elems, 6);
    assert_int_equal(a->bytes, 24);
    float v[6];
    memcpy(v, a->data, sizeof v);
    assert_double_near(v[5], 6.0, 0);
    const eng_st_tensor *b = eng_safetensors_find(st, "b");
    assert_non_null(b);
    assert_int_equal(b->dtype, ENG_ST_DTYPE_BF16);
    assert_int_equal(b->bytes, 8);
    assert_null(eng_safetensors_find(st, "c"));
    assert_string_equal(eng_safetensors_at(st, 0)->name, "a.weight");  /* by name */
    eng_safetensors_free(st);
}

static void expect_refused(const char *path, int code, const char *what)
{
    eng_safetensors *st = NULL;
    util_err err = {0};
    int rc = eng_safetensors_open(&st, path, &err);
    if (rc == 0)
        eng_safetensors_free(st);
    assert_int_equal(rc, code);
    assert_null(st);
    assert_prefix(err.msg, path);
    assert_contains(err.msg, what);
}

static void safetensors_refused(void **state)
{
    (void)state;
    const char *ok = "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}}";
    expect_refused(write_st("short", "", NULL, 0, 0) /* header length 0 */, LLMGW_EINVAL, "'{'");
    /* fewer than 8 bytes */
    char p7[512];
    snprintf(p7, sizeof p7, "%s/tiny", g_tmp);
    FILE *f = fopen(p7, "wb");
    fwrite("abc", 1, 3, f);
    fclose(f);
    expect_refused(p7, LLMGW_EINVAL, "truncated");
    expect_refused(write_st("trunc_data", ok, DATA, 20, -1), LLMGW_EINVAL, "truncated");
    expect_refused(write_st("trunc_hdr", ok, NULL, 0, (long long)strlen(ok) + 100),
                   LLMGW_EINVAL, "truncated");
    expect_refused(write_st("huge_hdr", ok, DATA, 24, 1LL << 40), LLMGW_EINVAL,
                   "absurdly large");
    expect_refused(write_st("bad_json", "{\"a\":{\"dtype\":\"F32\",", DATA, 24, -1), LLMGW_EINVAL,
                   "not a valid JSON");
    expect_refused(write_st("not_obj", "[1,2]", DATA, 24, -1), LLMGW_EINVAL, "'{'");
    expect_refused(write_st("trailing", "{} x", NULL, 0, -1), LLMGW_EINVAL, "after the JSON");
    expect_refused(write_st("range", "{\"a\":{\"dtype\":\"F32\",\"shape\":[250],"
                            "\"data_offsets\":[0,1000]}}", DATA, 24, -1), LLMGW_EINVAL,
                   "ends at byte 1000");
    expect_refused(write_st("shape", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,2],"
                            "\"data_offsets\":[0,24]}}", DATA, 24, -1), LLMGW_EINVAL,
                   "shape and dtype");
    expect_refused(write_st("dtype", "{\"a\":{\"dtype\":\"F8\",\"shape\":[24],"
                            "\"data_offsets\":[0,24]}}", DATA, 24, -1), LLMGW_EINVAL,
                   "unsupported dtype");
    expect_refused(write_st("negative", "{\"a\":{\"dtype\":\"F32\",\"shape\":[-6],"
                            "\"data_offsets\":[0,24]}}", DATA, 24, -1), LLMGW_EINVAL,
                   "non-negative");
    expect_refused(write_st("order", "{\"a\":{\"dtype\":\"F32\",\"shape\":[6],"
                            "\"data_offsets\":[24,0]}}", DATA, 24, -1), LLMGW_EINVAL,
                   "begin <= end");
    expect_refused(write_st("overlap", "{\"a\":{\"dtype\":\"F32\",\"shape\":[6],"
                            "\"data_offsets\":[0,24]},\"b\":{\"dtype\":\"F32\",\"shape\":[2],"
                            "\"data_offsets\":[16,24]}}", DATA, 24, -1), LLMGW_EINVAL,
                   "overlaps");
    expect_refused(write_st("gap", "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],"
                            "\"data_offsets\":[8,24]}}", DATA, 24, -1), LLMGW_EINVAL, "gap");
    expect_refused(write_st("slack", ok, DATA, 32, -1), LLMGW_EINVAL, "cover 24 of the 32");
    expect_refused(write_st("dup", "{\"a\":{\"dtype\":\"F32\",\"shape\":[3],"
                            "\"data_offsets\":[0,12]},\"a\":{\"dtype\":\"F32\",\"shape\":[3],"
                            "\"data_offsets\":[12,24]}}", DATA, 24, -1), LLMGW_EINVAL, "twice");
    expect_refused(write_st("meta", "{\"__metadata__\":{\"x\":1}}", NULL, 0, -1), LLMGW_EINVAL,
                   "__metadata__");
    expect_refused(write_st("dims", "{\"a\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],"
                            "\"data_offsets\":[0,1]}}", DATA, 1, -1), LLMGW_EINVAL,
                   "dimensions");
    expect_refused(write_st("overflow", "{\"a\":{\"dtype\":\"F64\",\"shape\":[4294967296,"
                            "4294967296],\"data_offsets\":[0,0]}}", NULL, 0, -1), LLMGW_EINVAL,
                   "overflows");
    char missing[512];
    snprintf(missing, sizeof missing, "%s/does-not-exist", g_tmp);
    expect_refused(missing, LLMGW_EIO, "No such file");
}

static int setup(void **state)
{
    (void)state;
    char tmpl[] = "/tmp/llmgw-test-st-XXXXXX";
    if (mkdtemp(tmpl) == NULL)
        return -1;
    snprintf(g_tmp, sizeof g_tmp, "%s", tmpl);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_tmp);
    if (g_tmp[0] != '\0' && system(cmd) != 0)
        fprintf(stderr, "test_safetensors: could not remove %s\n", g_tmp);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(safetensors_valid),
        cmocka_unit_test(safetensors_refused),
    };
    return cmocka_run_group_tests_name("engine/safetensors", tests, setup, teardown);
}
