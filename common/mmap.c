/* common/mmap.c: read-only file mappings (see mmap.h). */
#include "common/mmap.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

int util_map_file(util_map *m, const char *path, size_t min_size, util_err *err)
{
    m->base = NULL;
    m->size = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return util_err_set(err, LLMGW_EIO, "%s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return util_err_set(err, LLMGW_EIO, "%s: not a regular file", path);
    }
    if ((size_t)st.st_size < min_size || st.st_size == 0) {
        close(fd);
        return util_err_set(err, LLMGW_EINVAL, "%s: file is truncated (%lld bytes)", path,
                            (long long)st.st_size);
    }
    void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);  /* the mapping keeps the file */
    if (p == MAP_FAILED)
        return util_err_set(err, LLMGW_EIO, "%s: mmap: %s", path, strerror(errno));
    m->base = p;
    m->size = (size_t)st.st_size;
    return 0;
}

void util_map_release(util_map *m)
{
    if (m->base != NULL)
        munmap((void *)m->base, m->size);
    m->base = NULL;
    m->size = 0;
}
