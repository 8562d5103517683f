/* common/yaml.c: libyaml document helpers with node locations (see yaml.h). */
#include "common/yaml.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *util_yaml_scalar(const yaml_node_t *n)
{
    return n != NULL && n->type == YAML_SCALAR_NODE ? (const char *)n->data.scalar.value : NULL;
}

int util_yaml_fail(const util_yaml *y, int code, const yaml_node_t *n, const char *fmt, ...)
{
    char what[224];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return util_err_set(y->err, code, "%s:%zu:%zu: %s", y->name, n->start_mark.line + 1,
                        n->start_mark.column + 1, what);
}

static int unique_keys(const util_yaml *y, const yaml_node_t *map)
{
    for (yaml_node_pair_t *a = map->data.mapping.pairs.start; a < map->data.mapping.pairs.top;
         a++) {
        const yaml_node_t *ka = yaml_document_get_node(y->doc, a->key);
        if (util_yaml_scalar(ka) == NULL)
            return util_yaml_fail(y, LLMGW_EINVAL, ka ? ka : map, "keys must be strings");
        for (yaml_node_pair_t *b = map->data.mapping.pairs.start; b < a; b++) {
            const yaml_node_t *kb = yaml_document_get_node(y->doc, b->key);
            if (!strcmp(util_yaml_scalar(ka), util_yaml_scalar(kb)))
                return util_yaml_fail(y, LLMGW_EINVAL, ka, "'%s' is given twice",
                                      util_yaml_scalar(ka));
        }
    }
    return 0;
}

int util_yaml_expect(const util_yaml *y, const yaml_node_t *n, yaml_node_type_t type,
                     const char *what)
{
    if (n->type == type)
        return type == YAML_MAPPING_NODE ? unique_keys(y, n) : 0;
    return util_yaml_fail(y, LLMGW_EINVAL, n, "%s must be a %s", what,
                          type == YAML_MAPPING_NODE  ? "mapping"
                          : type == YAML_SEQUENCE_NODE ? "list"
                                                       : "scalar");
}

int util_yaml_long(const util_yaml *y, const yaml_node_t *n, const char *key, long lo, long hi,
                   long *out)
{
    const char *s = util_yaml_scalar(n);
    char *end;
    if (s == NULL || *s == '\0')
        return util_yaml_fail(y, LLMGW_EINVAL, n, "'%s' must be an integer", key);
    errno = 0;
    long v = strtol(s, &end, 10);
    if (*end != '\0' || errno != 0)
        return util_yaml_fail(y, LLMGW_EINVAL, n, "'%s' must be an integer, got '%.40s'", key,
                              s);
    if (v < lo || v > hi)
        return util_yaml_fail(y, LLMGW_EINVAL, n, "'%s' must be between %ld and %ld, got %ld",
                              key, lo, hi, v);
    *out = v;
    return 0;
}

int util_yaml_double(const util_yaml *y, const yaml_node_t *n, const char *key, double lo,
                     double hi, double *out)
{
    const char *s = util_yaml_scalar(n);
    char *end;
    if (s == NULL || *s == '\0')
        return util_yaml_fail(y, LLMGW_EINVAL, n, "'%s' must be a number", key);
    double v = strtod(s, &end);
    if (*end != '\0' || v != v)
        return util_yaml_fail(y, LLMGW_EINVAL, n, "'%s' must be a number, got '%.40s'", key, s);
    if (v < lo || v > hi)
        return util_yaml_fail(y, LLMGW_EINVAL, n, "'%s' must be between %g and %g, got %g", key,
                              lo, hi, v);
    *out = v;
    return 0;
}

int util_yaml_bool(const util_yaml *y, const yaml_node_t *n, const char *key, bool *out)
{
    const char *s = util_yaml_scalar(n);
    if (s != NULL && (!strcmp(s, "true") || !strcmp(s, "yes") || !strcmp(s, "on"))) {
        *out = true;
        return 0;
    }
    if (s != NULL && (!strcmp(s, "false") || !strcmp(s, "no") || !strcmp(s, "off"))) {
        *out = false;
        return 0;
    }
    return util_yaml_fail(y, LLMGW_EINVAL, n, "'%s' must be true or false", key);
}

int util_yaml_load_error(const yaml_parser_t *parser, const char *name, util_err *err)
{
    const yaml_mark_t *m = parser->context ? &parser->context_mark : &parser->problem_mark;
    if (parser->problem_mark.line || parser->problem_mark.column)
        m = &parser->problem_mark;
    return util_err_set(err, LLMGW_EINVAL, "%s:%zu:%zu: invalid YAML: %s%s%s", name,
                        m->line + 1, m->column + 1, parser->problem ? parser->problem : "error",
                        parser->context ? " " : "", parser->context ? parser->context : "");
}
