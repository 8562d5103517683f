/* tests/unit/common/test_mmap.c: whole-file read-only mappings and the errors that name the
 * file. */
#include "common/mmap.h"

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "tests/unit/unit.h"

static void maps_a_file(void **state)
{
    (void)state;
    char path[] = "/tmp/llmgw-mmap-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, "0123456789", 10), 10);
    close(fd);
    util_map m;
    util_err err = {0};
    assert_int_equal(util_map_file(&m, path, 4, &err), 0);
    assert_int_equal(m.size, 10);
    assert_memory_equal(m.base, "0123456789", 10);
    util_map_release(&m);
    assert_null(m.base);
    util_map_release(&m);  /* twice: a no-op */
    /* Shorter than the reader's minimum. */
    assert_int_equal(util_map_file(&m, path, 11, &err), LLMGW_EINVAL);
    assert_non_null(strstr(err.msg, "file is truncated (10 bytes)"));
    assert_non_null(strstr(err.msg, path));
    assert_null(m.base);
    unlink(path);
}

static void errors_name_the_file(void **state)
{
    (void)state;
    util_map m;
    util_err err = {0};
    assert_int_equal(util_map_file(&m, "/nonexistent/llmgw.gguf", 1, &err), LLMGW_EIO);
    assert_non_null(strstr(err.msg, "/nonexistent/llmgw.gguf: No such file"));
    assert_int_equal(util_map_file(&m, "/tmp", 1, &err), LLMGW_EIO);
    assert_non_null(strstr(err.msg, "/tmp: not a regular file"));
    char path[] = "/tmp/llmgw-mmap-XXXXXX";
    int fd = mkstemp(path);
    close(fd);
    assert_int_equal(util_map_file(&m, path, 0, &err), LLMGW_EINVAL);  /* empty: nothing to map */
    unlink(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(maps_a_file),
        cmocka_unit_test(errors_name_the_file),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
