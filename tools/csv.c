/* tools/csv.c: RFC 4180 fields (see csv.h). */
#include "tools/csv.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

static void *grow(void *p, size_t n)
{
    p = realloc(p, n);
    if (p == NULL) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    return p;
}

char *tool_csv_field(const char **p, size_t *len, long *line)
{
    const char *s = *p;
    size_t n = 0, cap = 128;
    char *out = grow(NULL, cap);
    bool quoted = *s == '"';
    if (quoted)
        s++;
    for (;;) {
        char c = *s;
        if (c == '\0') {
            if (quoted) {
                free(out);
                return NULL;
            }
            break;
        }
        if (quoted) {
            if (c == '"') {
                if (s[1] != '"') {
                    s++;
                    quoted = false;
                    continue;
                }
                s++;
            }
        } else if (c == ',' || c == '\n' || c == '\r') {
            break;
        }
        if (c == '\n')
            (*line)++;
        s++;
        if (n + 2 > cap)
            out = grow(out, cap *= 2);
        out[n++] = c;
    }
    out[n] = '\0';
    *p = s;
    *len = n;
    return out;
}
