/* kernels/backend.c: placing host data where a backend computes, and freeing a backend. */
#include "kernels/backend.h"

#include <stdlib.h>
#include <string.h>

const void *kern_backend_place(const kern_backend *b, const void *host, size_t n)
{
    if (b->host_memory || host == NULL)
        return host;
    void *buf = b->buffer_alloc(b->ctx, n);
    if (buf != NULL)
        b->buffer_copy_in(b->ctx, buf, 0, host, n);
    return buf;
}

void kern_backend_unplace(const kern_backend *b, const void *placed, const void *host, size_t n)
{
    if (placed != NULL && placed != host)
        b->buffer_free(b->ctx, (void *)placed, n);
}

void kern_backend_free(kern_backend *b)
{
    if (b != NULL)
        b->destroy(b->ctx);
}
