/* common/yaml.h: reading a libyaml document tree with errors that point at the node:
 * "file:line:column: what" (1-based, as editors count). Shared by the config (gateway/config.c)
 * and the routing policy (router/policy.c). Every int return is 0 or LLMGW_EINVAL with the
 * message in y->err. */
#ifndef LLMGW_COMMON_YAML_H
#define LLMGW_COMMON_YAML_H

#include "common/err.h"

#include <stdbool.h>
#include <yaml.h>

typedef struct util_yaml {
    yaml_document_t *doc;
    const char *name;           /* the file name in messages */
    util_err *err;
} util_yaml;

/* The text of a scalar node, or NULL for a mapping or list. */
const char *util_yaml_scalar(const yaml_node_t *n);

int util_yaml_fail(const util_yaml *y, int code, const yaml_node_t *n, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* n has this type; a mapping's keys are strings, each at most once (libyaml does not check). */
int util_yaml_expect(const util_yaml *y, const yaml_node_t *n, yaml_node_type_t type,
                     const char *what);

/* Typed scalars, range-checked; `key` names the field in messages. */
int util_yaml_long(const util_yaml *y, const yaml_node_t *n, const char *key, long lo, long hi,
                   long *out);
int util_yaml_double(const util_yaml *y, const yaml_node_t *n, const char *key, double lo,
                     double hi, double *out);
int util_yaml_bool(const util_yaml *y, const yaml_node_t *n, const char *key, bool *out);

/* The parser's own error (bad syntax) as "name:line:column: invalid YAML: ...". */
int util_yaml_load_error(const yaml_parser_t *parser, const char *name, util_err *err);

/* Iterates a mapping's pairs; the body sees `k` (key text), `kn` (key node), `v` (value). */
#define UTIL_YAML_FOR_PAIRS(doc, map, k, kn, v)                                                    \
    for (yaml_node_pair_t *pair_ = (map)->data.mapping.pairs.start;                                \
         pair_ < (map)->data.mapping.pairs.top; pair_++)                                           \
        for (yaml_node_t *kn = yaml_document_get_node((doc), pair_->key),                          \
                         *v = yaml_document_get_node((doc), pair_->value);                         \
             kn != NULL; kn = NULL)                                                                \
            for (const char *k = util_yaml_scalar(kn) ? util_yaml_scalar(kn) : ""; k != NULL;      \
                 k = NULL)

/* Iterates a list's items as `it`. */
#define UTIL_YAML_FOR_ITEMS(doc, seq, it)                                                          \
    for (yaml_node_item_t *item_ = (seq)->data.sequence.items.start;                               \
         item_ < (seq)->data.sequence.items.top; item_++)                                          \
        for (yaml_node_t *it = yaml_document_get_node((doc), *item_); it != NULL; it = NULL)

#endif
