/* tools/csv.h: one RFC 4180 field at a time, for the tools that read labelled CSV files
 * (llmgw-cache-eval, llmgw-train-router, llmgw-eval-router). */
#ifndef LLMGW_TOOLS_CSV_H
#define LLMGW_TOOLS_CSV_H

#include <stddef.h>

/* The field starting at *p (quoted fields may hold commas, doubled quotes and newlines): a
 * malloc'd, NUL-terminated copy of *len bytes; *p is left on the character after it (',', '\n',
 * '\r' or '\0'). NULL for a quoted field that never closes. *line counts the newlines read. */
char *tool_csv_field(const char **p, size_t *len, long *line);

#endif
