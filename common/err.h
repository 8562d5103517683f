/* common/err.h: error codes and the caller-owned error message used across llmgw.
 * Every int-returning llmgw call returns 0 or one of these codes (< 0); the message, when the
 * call takes a util_err *, says what went wrong in a full sentence (file:line:col for files). */
#ifndef LLMGW_COMMON_ERR_H
#define LLMGW_COMMON_ERR_H

enum {
    LLMGW_OK = 0,
    LLMGW_EINVAL = -1,    /* bad input: a request field, a config value, a file's content */
    LLMGW_ENOMEM = -2,
    LLMGW_EIO = -3,       /* a file or socket call failed */
    LLMGW_ENOTFOUND = -4,
    LLMGW_ERANGE = -5,    /* a size or count beyond a limit */
    LLMGW_ETLS = -6,
    LLMGW_EBUSY = -7,
};

typedef struct util_err {
    int code;
    char msg[256];
} util_err;

/* Formats msg into err (NULL-safe) and returns code, so callers can `return util_err_set(...)`. */
int util_err_set(util_err *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

const char *util_err_name(int code);

#endif
