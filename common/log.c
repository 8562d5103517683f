/* common/log.c: the log sink. Lines look like `2026-12-02T13:44:06.123Z warn cache: text`. */
#include "common/log.h"

#include "common/err.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

util_log_level util_log_min_level = UTIL_LOG_INFO;

static util_log_sink g_sink;
static void *g_sink_arg;

static const char *level_name(util_log_level l)
{
    switch (l) {
    case UTIL_LOG_DEBUG: return "debug";
    case UTIL_LOG_INFO: return "info";
    case UTIL_LOG_WARN: return "warn";
    default: return "error";
    }
}

void util_log_set_sink(util_log_sink sink, void *arg)
{
    g_sink = sink;
    g_sink_arg = arg;
}

int util_log_parse_level(const char *s, util_log_level *out)
{
    static const util_log_level all[] = {UTIL_LOG_DEBUG, UTIL_LOG_INFO, UTIL_LOG_WARN, UTIL_LOG_ERROR};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        if (strcmp(s, level_name(all[i])) == 0) {
            *out = all[i];
            return 0;
        }
    }
    return LLMGW_EINVAL;
}

void util_log_write(util_log_level level, const char *module, const char *fmt, ...)
{
    char line[1024];
    struct timeval tv;
    struct tm tm;
    gettimeofday(&tv, NULL);
    gmtime_r(&tv.tv_sec, &tm);
    int n = (int)strftime(line, sizeof line, "%Y-%m-%dT%H:%M:%S", &tm);
    n += snprintf(line + n, sizeof line - (size_t)n, ".%03dZ %s %s: ", (int)(tv.tv_usec / 1000),
                  level_name(level), module);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    va_end(ap);
    if (g_sink != NULL) {
        g_sink(level, line, g_sink_arg);
        return;
    }
    size_t len = strlen(line);
    line[len < sizeof line - 1 ? len : sizeof line - 2] = '\n';
    /* One write() per line keeps lines whole when several threads log at once. */
    ssize_t w = write(STDERR_FILENO, line, len < sizeof line - 1 ? len + 1 : sizeof line - 1);
    (void)w;
}
