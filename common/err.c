/* common/err.c: util_err helpers. */
#include "common/err.h"

#include <stdarg.h>
#include <stdio.h>

int util_err_set(util_err *err, int code, const char *fmt, ...)
{
    if (err != NULL) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        err->code = code;
    }
    return code;
}

const char *util_err_name(int code)
{
    switch (code) {
    case LLMGW_OK: return "ok";
    case LLMGW_EINVAL: return "invalid";
    case LLMGW_ENOMEM: return "out of memory";
    case LLMGW_EIO: return "i/o error";
    case LLMGW_ENOTFOUND: return "not found";
    case LLMGW_ERANGE: return "out of range";
    case LLMGW_ETLS: return "tls error";
    case LLMGW_EBUSY: return "busy";
    default: return "unknown error";
    }
}
