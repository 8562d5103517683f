/* common/log.h: leveled one-line logging to a swappable sink (stderr by default).
 * UTIL_LOG_* checks the level before evaluating its arguments. Thread-safe (one write per line).
 * Never log prompts, completions or API keys. */
#ifndef LLMGW_COMMON_LOG_H
#define LLMGW_COMMON_LOG_H

typedef enum util_log_level {
    UTIL_LOG_DEBUG = 0,
    UTIL_LOG_INFO = 1,
    UTIL_LOG_WARN = 2,
    UTIL_LOG_ERROR = 3,
} util_log_level;

extern util_log_level util_log_min_level;

/* A sink receives one formatted line without the trailing newline. */
typedef void (*util_log_sink)(util_log_level level, const char *line, void *arg);

void util_log_set_sink(util_log_sink sink, void *arg); /* NULL restores stderr */
int  util_log_parse_level(const char *s, util_log_level *out); /* 0 or LLMGW_EINVAL */
void util_log_write(util_log_level level, const char *module, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define UTIL_LOG_(lvl, module, ...)                                                              \
    do {                                                                                       \
        if ((lvl) >= util_log_min_level)                                                       \
            util_log_write((lvl), (module), __VA_ARGS__);                                      \
    } while (0)
#define UTIL_LOG_DEBUG(module, ...) UTIL_LOG_(UTIL_LOG_DEBUG, module, __VA_ARGS__)
#define UTIL_LOG_INFO(module, ...) UTIL_LOG_(UTIL_LOG_INFO, module, __VA_ARGS__)
#define UTIL_LOG_WARN(module, ...) UTIL_LOG_(UTIL_LOG_WARN, module, __VA_ARGS__)
#define UTIL_LOG_ERROR(module, ...) UTIL_LOG_(UTIL_LOG_ERROR, module, __VA_ARGS__)

#endif
