/* engine/text/grammar_schema.c: compiling a JSON schema, or a set of tools, into the grammar's
 * tables (engine/text/grammar.h lists the subset; anything else is refused by name). */
#include "engine/text/grammar_internal.h"

#include "common/arena.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <string.h>

typedef struct compiler {
    eng_grammar *g;
    const cJSON *root;
    struct { char *name; int node; } *refs;
    int n_refs;
    util_err *err;
    int nodes_cap, props_cap, alts_cap, lits_cap;
    size_t text_cap;
} compiler;

static int new_node(compiler *c)
{
    eng_grammar *g = c->g;
    if (g->n_nodes >= MAX_NODES)
        return util_err_set(c->err, LLMGW_EINVAL, "the schema has more than %d subschemas",
                            MAX_NODES);
    if (g->n_nodes == c->nodes_cap) {
        c->nodes_cap = c->nodes_cap ? 2 * c->nodes_cap : 16;
        g->nodes = gr_xrealloc(g->nodes, (size_t)c->nodes_cap * sizeof *g->nodes);
    }
    gnode *n = &g->nodes[g->n_nodes];
    memset(n, 0, sizeof *n);
    n->ref = -1;
    n->free_keys = -1;
    n->items = NODE_ANY;
    n->max_items = -1;
    n->max_len = -1;
    return g->n_nodes++;
}

static int add_lit(compiler *c, const char *s, size_t len)
{
    eng_grammar *g = c->g;
    if (g->n_lits == c->lits_cap) {
        c->lits_cap = c->lits_cap ? 2 * c->lits_cap : 16;
        g->lits = gr_xrealloc(g->lits, (size_t)c->lits_cap * sizeof *g->lits);
    }
    if (g->text_len + len > c->text_cap) {
        while (g->text_len + len > c->text_cap)
            c->text_cap = c->text_cap ? 2 * c->text_cap : 256;
        g->text = gr_xrealloc(g->text, c->text_cap);
    }
    memcpy(g->text + g->text_len, s, len);
    g->lits[g->n_lits] = (glit){(uint32_t)g->text_len, (uint32_t)len};
    g->text_len += len;
    return g->n_lits++;
}

static int add_json_lit(compiler *c, const cJSON *value)
{
    char *s = cJSON_PrintUnformatted(value);
    if (s == NULL)
        return util_err_set(c->err, LLMGW_ENOMEM, "out of memory");
    int i = add_lit(c, s, strlen(s));
    cJSON_free(s);
    return i;
}

static const char *const known[] = {
    "type", "properties", "required", "additionalProperties", "items", "minItems", "maxItems",
    "enum", "const", "anyOf", "oneOf", "$ref", "$defs", "definitions", "minLength", "maxLength",
    "format", "nullable", "title", "description", "default", "examples", "$schema", "$id",
    "$comment", "deprecated", "readOnly", "writeOnly", "strict", NULL};

static unsigned type_bit(const char *name)
{
    static const struct { const char *name; unsigned bit; } t[] = {
        {"null", T_NULL}, {"boolean", T_BOOL}, {"integer", T_INT}, {"number", T_NUM},
        {"string", T_STR}, {"array", T_ARR}, {"object", T_OBJ}};
    for (size_t i = 0; i < sizeof t / sizeof *t; i++)
        if (strcmp(name, t[i].name) == 0)
            return t[i].bit;
    return 0;
}

static int count_of(compiler *c, const cJSON *s, const char *key, const char *path, int *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(s, key);
    if (v == NULL)
        return 0;
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > 1e6 ||
        v->valuedouble != (double)(int)v->valuedouble)
        return util_err_set(c->err, LLMGW_EINVAL, "%s/%s: expected a non-negative integer",
                            path, key);
    *out = (int)v->valuedouble;
    return 0;
}

static int compile(compiler *c, const cJSON *s, const char *path, int depth, int *out);

static int fill(compiler *c, int at, const cJSON *s, const char *path, int depth);

static int compile_ref(compiler *c, const char *ref, const char *path, int depth, int *out)
{
    const char *name = NULL, *where = NULL;
    if (strncmp(ref, "#/$defs/", 8) == 0)
        name = ref + 8, where = "$defs";
    else if (strncmp(ref, "#/definitions/", 14) == 0)
        name = ref + 14, where = "definitions";
    if (name == NULL || *name == '\0' || strchr(name, '/') != NULL)
        return util_err_set(c->err, LLMGW_EINVAL, "%s/$ref: only \"#/$defs/NAME\" and "
                            "\"#/definitions/NAME\" are supported, not \"%s\"", path, ref);
    for (int i = 0; i < c->n_refs; i++)
        if (strcmp(c->refs[i].name, ref) == 0) {
            *out = c->refs[i].node;
            return 0;
        }
    const cJSON *target = cJSON_GetObjectItemCaseSensitive(
        cJSON_GetObjectItemCaseSensitive(c->root, where), name);
    if (target == NULL)
        return util_err_set(c->err, LLMGW_EINVAL, "%s/$ref: \"%s\" is not defined", path, ref);
    int at = new_node(c);
    if (at < 0)
        return at;
    c->refs = gr_xrealloc(c->refs, (size_t)(c->n_refs + 1) * sizeof *c->refs);
    c->refs[c->n_refs].name = util_xstrdup(ref);
    c->refs[c->n_refs++].node = at;
    *out = at;
    char sub[256];
    snprintf(sub, sizeof sub, "#/%s/%s", where, name);
    return fill(c, at, target, sub, depth + 1);
}

static int fill_object(compiler *c, int at, const cJSON *s, const char *path, int depth)
{
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(s, "properties");
    const cJSON *req = cJSON_GetObjectItemCaseSensitive(s, "required");
    const cJSON *addl = cJSON_GetObjectItemCaseSensitive(s, "additionalProperties");
    char sub[256];
    int rc;
    if (props != NULL && !cJSON_IsObject(props))
        return util_err_set(c->err, LLMGW_EINVAL, "%s/properties: expected an object", path);
    if (req != NULL && !cJSON_IsArray(req))
        return util_err_set(c->err, LLMGW_EINVAL, "%s/required: expected an array", path);
    const cJSON *r;
    cJSON_ArrayForEach(r, req)
        if (!cJSON_IsString(r))
            return util_err_set(c->err, LLMGW_EINVAL, "%s/required: expected strings", path);
    int n = 0;
    const cJSON *p;
    cJSON_ArrayForEach(p, props)
        n++;
    bool closed = cJSON_IsFalse(addl);
    /* Required names the properties lack are generated too (any value), unless closed. */
    cJSON_ArrayForEach(r, req)
        if (cJSON_GetObjectItemCaseSensitive(props, r->valuestring) == NULL) {
            if (closed)
                return util_err_set(c->err, LLMGW_EINVAL, "%s/required: \"%s\" is not among "
                                    "the properties and additionalProperties is false", path,
                                    r->valuestring);
            n++;
        }
    if (n > 64)
        return util_err_set(c->err, LLMGW_EINVAL, "%s/properties: more than 64 properties",
                            path);
    eng_grammar *g = c->g;
    int prop0 = g->n_props;
    if (g->n_props + n > c->props_cap) {
        while (g->n_props + n > c->props_cap)
            c->props_cap = c->props_cap ? 2 * c->props_cap : 16;
        g->props = gr_xrealloc(g->props, (size_t)c->props_cap * sizeof *g->props);
    }
    g->n_props += n;
    int i = 0;
    cJSON_ArrayForEach(p, props) {
        cJSON *key = cJSON_CreateString(p->string);
        int k = key ? add_json_lit(c, key) : LLMGW_ENOMEM;
        cJSON_Delete(key);
        if (k < 0)
            return k;
        snprintf(sub, sizeof sub, "%s/properties/%s", path, p->string);
        int node;
        if ((rc = compile(c, p, sub, depth, &node)) != 0)
            return rc;
        bool required = false;
        cJSON_ArrayForEach(r, req)
            required = required || strcmp(r->valuestring, p->string) == 0;
        g->props[prop0 + i++] = (gprop){k, node, required};
    }
    cJSON_ArrayForEach(r, req)
        if (cJSON_GetObjectItemCaseSensitive(props, r->valuestring) == NULL) {
            cJSON *key = cJSON_CreateString(r->valuestring);
            int k = key ? add_json_lit(c, key) : LLMGW_ENOMEM;
            cJSON_Delete(key);
            if (k < 0)
                return k;
            g->props[prop0 + i++] = (gprop){k, NODE_ANY, true};
        }
    gnode *nd = &g->nodes[at];
    nd->prop0 = prop0;
    nd->n_props = n;
    if (n == 0 && !closed) {
        int node = NODE_ANY;
        if (cJSON_IsObject(addl)) {
            snprintf(sub, sizeof sub, "%s/additionalProperties", path);
            if ((rc = compile(c, addl, sub, depth, &node)) != 0)
                return rc;
        } else if (addl != NULL && !cJSON_IsBool(addl)) {
            return util_err_set(c->err, LLMGW_EINVAL, "%s/additionalProperties: expected a "
                                "boolean or a schema", path);
        }
        g->nodes[at].free_keys = node;
    }
    return 0;
}

static int fill(compiler *c, int at, const cJSON *s, const char *path, int depth)
{
    int rc;
    char sub[256];
    if (depth > COMPILE_DEPTH)
        return util_err_set(c->err, LLMGW_EINVAL, "%s: nested deeper than %d", path,
                            COMPILE_DEPTH);
    if (cJSON_IsTrue(s)) {
        c->g->nodes[at].types = T_ANY;
        c->g->nodes[at].free_keys = NODE_ANY;
        return 0;
    }
    if (!cJSON_IsObject(s))
        return util_err_set(c->err, LLMGW_EINVAL, "%s: a schema must be an object", path);
    const cJSON *kw;
    cJSON_ArrayForEach(kw, s) {
        bool ok = false;
        for (int i = 0; known[i] != NULL && !ok; i++)
            ok = strcmp(kw->string, known[i]) == 0;
        if (!ok)
            return util_err_set(c->err, LLMGW_EINVAL, "%s: the keyword '%s' is not supported "
                                "for constrained decoding", path, kw->string);
    }
    const cJSON *ref = cJSON_GetObjectItemCaseSensitive(s, "$ref");
    if (ref != NULL) {
        if (!cJSON_IsString(ref))
            return util_err_set(c->err, LLMGW_EINVAL, "%s/$ref: expected a string", path);
        int target = NODE_ANY;
        if ((rc = compile_ref(c, ref->valuestring, path, depth, &target)) != 0)
            return rc;
        c->g->nodes[at].ref = target;
        return 0;
    }
    const cJSON *en = cJSON_GetObjectItemCaseSensitive(s, "enum");
    const cJSON *cn = cJSON_GetObjectItemCaseSensitive(s, "const");
    if (en != NULL || cn != NULL) {
        if (en != NULL && (!cJSON_IsArray(en) || cJSON_GetArraySize(en) == 0 ||
                           cJSON_GetArraySize(en) > MAX_LITS))
            return util_err_set(c->err, LLMGW_EINVAL, "%s/enum: expected an array of 1 to %d "
                                "values", path, MAX_LITS);
        int lit0 = c->g->n_lits, n = 0;
        const cJSON *v;
        if (cn != NULL) {
            if ((rc = add_json_lit(c, cn)) < 0)
                return rc;
            n = 1;
        } else {
            cJSON_ArrayForEach(v, en) {
                if ((rc = add_json_lit(c, v)) < 0)
                    return rc;
                n++;
            }
        }
        c->g->nodes[at].is_enum = true;
        c->g->nodes[at].lit0 = lit0;
        c->g->nodes[at].n_lits = n;
        return 0;
    }
    const cJSON *any = cJSON_GetObjectItemCaseSensitive(s, "anyOf");
    const char *any_kw = "anyOf";
    if (any == NULL) {
        any = cJSON_GetObjectItemCaseSensitive(s, "oneOf");
        any_kw = "oneOf";
    }
    if (any != NULL) {
        int n = cJSON_GetArraySize(any);
        if (!cJSON_IsArray(any) || n == 0 || n > 8)
            return util_err_set(c->err, LLMGW_EINVAL, "%s/%s: expected an array of 1 to 8 "
                                "schemas", path, any_kw);
        int nodes[8], i = 0;
        const cJSON *a;
        cJSON_ArrayForEach(a, any) {
            snprintf(sub, sizeof sub, "%s/%s/%d", path, any_kw, i);
            if ((rc = compile(c, a, sub, depth, &nodes[i])) != 0)
                return rc;
            i++;
        }
        eng_grammar *g = c->g;
        if (g->n_alts + n > c->alts_cap) {
            while (g->n_alts + n > c->alts_cap)
                c->alts_cap = c->alts_cap ? 2 * c->alts_cap : 16;
            g->alts = gr_xrealloc(g->alts, (size_t)c->alts_cap * sizeof *g->alts);
        }
        g->nodes[at].alt0 = g->n_alts;
        g->nodes[at].n_alts = n;
        memcpy(g->alts + g->n_alts, nodes, (size_t)n * sizeof *nodes);
        g->n_alts += n;
        return 0;
    }
    unsigned types = 0;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(s, "type");
    if (cJSON_IsString(type)) {
        types = type_bit(type->valuestring);
        if (types == 0)
            return util_err_set(c->err, LLMGW_EINVAL, "%s/type: unknown type \"%s\"", path,
                                type->valuestring);
    } else if (cJSON_IsArray(type)) {
        const cJSON *t;
        cJSON_ArrayForEach(t, type) {
            unsigned b = cJSON_IsString(t) ? type_bit(t->valuestring) : 0;
            if (b == 0)
                return util_err_set(c->err, LLMGW_EINVAL, "%s/type: expected type names",
                                    path);
            types |= b;
        }
    } else if (type != NULL) {
        return util_err_set(c->err, LLMGW_EINVAL, "%s/type: expected a string or an array",
                            path);
    }
    if (types == 0) {
        if (cJSON_GetObjectItemCaseSensitive(s, "properties") ||
            cJSON_GetObjectItemCaseSensitive(s, "required") ||
            cJSON_GetObjectItemCaseSensitive(s, "additionalProperties"))
            types = T_OBJ;
        else if (cJSON_GetObjectItemCaseSensitive(s, "items") ||
                 cJSON_GetObjectItemCaseSensitive(s, "minItems") ||
                 cJSON_GetObjectItemCaseSensitive(s, "maxItems"))
            types = T_ARR;
        else if (cJSON_GetObjectItemCaseSensitive(s, "minLength") ||
                 cJSON_GetObjectItemCaseSensitive(s, "maxLength") ||
                 cJSON_GetObjectItemCaseSensitive(s, "format"))
            types = T_STR;
        else
            types = T_ANY;
    }
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(s, "nullable")))
        types |= T_NULL;
    c->g->nodes[at].types = types;
    if (types & T_OBJ) {
        if ((rc = fill_object(c, at, s, path, depth + 1)) != 0)
            return rc;
    }
    if (types & T_ARR) {
        const cJSON *items = cJSON_GetObjectItemCaseSensitive(s, "items");
        int node = NODE_ANY;
        if (items != NULL) {
            if (cJSON_IsArray(items))
                return util_err_set(c->err, LLMGW_EINVAL, "%s/items: a list of schemas (tuple "
                                    "items) is not supported", path);
            snprintf(sub, sizeof sub, "%s/items", path);
            if ((rc = compile(c, items, sub, depth + 1, &node)) != 0)
                return rc;
        }
        gnode *nd = &c->g->nodes[at];
        nd->items = node;
        if ((rc = count_of(c, s, "minItems", path, &nd->min_items)) != 0 ||
            (rc = count_of(c, s, "maxItems", path, &nd->max_items)) != 0)
            return rc;
        if (nd->max_items >= 0 && nd->max_items < nd->min_items)
            return util_err_set(c->err, LLMGW_EINVAL, "%s: maxItems < minItems", path);
    }
    if (types & T_STR) {
        gnode *nd = &c->g->nodes[at];
        if ((rc = count_of(c, s, "minLength", path, &nd->min_len)) != 0 ||
            (rc = count_of(c, s, "maxLength", path, &nd->max_len)) != 0)
            return rc;
        if (nd->max_len >= 0 && nd->max_len < nd->min_len)
            return util_err_set(c->err, LLMGW_EINVAL, "%s: maxLength < minLength", path);
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(s, "format");
        if (f != NULL) {
            static const char *const names[] = {"", "date", "time", "date-time", "uuid"};
            for (int i = 1; i < 5 && cJSON_IsString(f); i++)
                if (strcmp(f->valuestring, names[i]) == 0)
                    nd->format = i;
            if (nd->format == FMT_NONE)
                return util_err_set(c->err, LLMGW_EINVAL, "%s/format: only date, time, "
                                    "date-time and uuid are supported, not %s", path,
                                    cJSON_IsString(f) ? f->valuestring : "a non-string");
        }
    }
    return 0;
}

static int compile(compiler *c, const cJSON *s, const char *path, int depth, int *out)
{
    int at = new_node(c);
    if (at < 0)
        return at;
    *out = at;
    return fill(c, at, s, path, depth + 1);
}

/* The characters a value of node n may start with (a bit each). */
static void starts(const eng_grammar *g, int n, uint8_t set[32], int hops)
{
    if (hops > MAX_NODES)
        return;
    const gnode *nd = &g->nodes[n];
    if (nd->ref >= 0) {
        starts(g, nd->ref, set, hops + 1);
        return;
    }
    if (nd->n_alts > 0) {
        for (int a = 0; a < nd->n_alts; a++)
            starts(g, g->alts[nd->alt0 + a], set, hops + 1);
        return;
    }
#define SET(ch) (set[(unsigned char)(ch) / 8] |= (uint8_t)(1u << ((unsigned char)(ch) % 8)))
    if (nd->is_enum) {
        for (int i = 0; i < nd->n_lits; i++)
            SET(g->text[g->lits[nd->lit0 + i].off]);
        return;
    }
    if (nd->types & T_OBJ) SET('{');
    if (nd->types & T_ARR) SET('[');
    if (nd->types & T_STR) SET('"');
    if (nd->types & T_BOOL) { SET('t'); SET('f'); }
    if (nd->types & T_NULL) SET('n');
    if (nd->types & (T_NUM | T_INT)) {
        SET('-');
        for (char d = '0'; d <= '9'; d++)
            SET(d);
    }
#undef SET
}

static int check(compiler *c)
{
    eng_grammar *g = c->g;
    for (int n = 0; n < g->n_nodes; n++) {
        /* A cycle of bare references defines nothing. */
        int hop = n, hops = 0;
        while (g->nodes[hop].ref >= 0 && hops <= g->n_nodes)
            hop = g->nodes[hop].ref, hops++;
        if (hops > g->n_nodes)
            return util_err_set(c->err, LLMGW_EINVAL, "$ref: a cycle of references");
    }
    for (int n = 0; n < g->n_nodes; n++)
        starts(g, n, g->nodes[n].start, 0);
    for (int n = 0; n < g->n_nodes; n++) {
        const gnode *nd = &g->nodes[n];
        if (nd->n_alts == 0)
            continue;
        uint8_t seen[32] = {0};
        for (int a = 0; a < nd->n_alts; a++) {
            const uint8_t *mine = g->nodes[g->alts[nd->alt0 + a]].start;
            for (int i = 0; i < 32; i++) {
                if (seen[i] & mine[i])
                    return util_err_set(c->err, LLMGW_EINVAL, "anyOf/oneOf: alternatives that "
                                        "can begin alike (e.g. two objects or two strings) are "
                                        "not supported; give each a different type");
                seen[i] |= mine[i];
            }
        }
    }
    return 0;
}

/* Every grammar's first literals (true, false, null) and nodes (any value, a plain string). */
static int begin(compiler *c)
{
    eng_grammar *g = c->g;
    add_lit(c, "true", 4);
    add_lit(c, "false", 5);
    add_lit(c, "null", 4);
    int any = new_node(c), plain = new_node(c);
    if (any < 0 || plain < 0)
        return any < 0 ? any : plain;
    g->nodes[NODE_ANY].types = T_ANY;
    g->nodes[NODE_ANY].free_keys = NODE_ANY;
    g->nodes[NODE_PLAIN].types = T_STR;
    return 0;
}

static void forget_refs(compiler *c)
{
    for (int i = 0; i < c->n_refs; i++)
        free(c->refs[i].name);
    free(c->refs);
    c->refs = NULL;
    c->n_refs = 0;
}

/* The end of a compile: the compiler's scratch goes; g is handed out, or freed on an error. */
static int finish(compiler *c, cJSON *doc, eng_grammar *g, int rc, eng_grammar **out)
{
    forget_refs(c);
    cJSON_Delete(doc);
    if (rc != 0) {
        eng_grammar_unref(g);
        return rc;
    }
    *out = g;
    return 0;
}

static eng_grammar *grammar_new(const eng_gvocab *v)
{
    eng_grammar *g = util_xcalloc(1, sizeof *g);
    atomic_init(&g->refs, 1);
    g->v = v;
    g->trigger_lit = -1;
    return g;
}

int eng_grammar_compile(eng_grammar **out, const eng_gvocab *v, const char *schema, size_t len,
                        util_err *err)
{
    eng_grammar *g = grammar_new(v);
    compiler c = {.g = g, .err = err};
    cJSON *doc = NULL;
    int rc;
    if ((rc = begin(&c)) != 0)
        goto out;
    if (schema == NULL) {
        int root = new_node(&c);
        if (root < 0) {
            rc = root;
            goto out;
        }
        g->nodes[root].types = T_OBJ;
        g->nodes[root].free_keys = NODE_ANY;
        g->root = root;
    } else {
        doc = cJSON_ParseWithLength(schema, len);
        if (doc == NULL) {
            rc = util_err_set(err, LLMGW_EINVAL, "the schema is not valid JSON");
            goto out;
        }
        c.root = doc;
        if ((rc = compile(&c, doc, "#", 0, &g->root)) != 0 || (rc = check(&c)) != 0)
            goto out;
    }
out:
    return finish(&c, doc, g, rc, out);
}

/* Appends a + b + c as one literal. */
static int add_lit3(compiler *c, const char *a, const char *b, const char *d)
{
    size_t la = strlen(a), lb = strlen(b), ld = strlen(d);
    char *s = util_xmalloc(la + lb + ld + 1);
    memcpy(s, a, la);
    memcpy(s + la, b, lb);
    memcpy(s + la + lb, d, ld);
    int i = add_lit(c, s, la + lb + ld);
    free(s);
    return i;
}

int eng_grammar_compile_tools(eng_grammar **out, const eng_gvocab *v, const eng_tool_spec *tools,
                              int n, const eng_tool_format *fmt, bool required, util_err *err)
{
    if (n < 1 || n > 64)
        return util_err_set(err, LLMGW_EINVAL, "tools: between 1 and 64 tools, not %d", n);
    eng_grammar *g = grammar_new(v);
    compiler c = {.g = g, .err = err};
    cJSON *doc = NULL;
    int rc;
    char path[64];
    if ((rc = begin(&c)) != 0)
        goto out;
    g->tool_args = util_xmalloc((size_t)n * sizeof *g->tool_args);
    g->n_tools = n;
    for (int i = 0; i < n; i++) {
        for (int k = 0; k < i; k++)
            if (strcmp(tools[k].name, tools[i].name) == 0) {
                rc = util_err_set(err, LLMGW_EINVAL, "tools[%d]: the name '%s' is taken by "
                                  "tools[%d]", i, tools[i].name, k);
                goto out;
            }
        snprintf(path, sizeof path, "tools[%d].function.parameters", i);
        int node;
        if (tools[i].params == NULL) {
            if ((node = new_node(&c)) < 0) {
                rc = node;
                goto out;
            }
            g->nodes[node].types = T_OBJ;
            g->nodes[node].free_keys = NODE_ANY;
        } else {
            doc = cJSON_ParseWithLength(tools[i].params, tools[i].params_len);
            if (doc == NULL) {
                rc = util_err_set(err, LLMGW_EINVAL, "%s: not valid JSON", path);
                goto out;
            }
            c.root = doc;
            forget_refs(&c);
            if ((rc = compile(&c, doc, path, 0, &node)) != 0)
                goto out;
            cJSON_Delete(doc);
            doc = NULL;
            uint8_t first[32] = {0};
            starts(g, node, first, 0);
            if (!(first['{' / 8] & (1u << ('{' % 8)))) {
                rc = util_err_set(err, LLMGW_EINVAL, "%s: the arguments must be an object", path);
                goto out;
            }
        }
        g->tool_args[i] = node;
    }
    if ((rc = check(&c)) != 0)
        goto out;
    g->call_lit0 = g->n_lits;
    for (int i = 0; i < n; i++) {   /* open {"name": "NAME", "KEY": */
        cJSON *name = cJSON_CreateString(tools[i].name);
        char *quoted = name ? cJSON_PrintUnformatted(name) : NULL;
        cJSON_Delete(name);
        if (quoted == NULL) {
            rc = util_err_set(err, LLMGW_ENOMEM, "out of memory");
            goto out;
        }
        char mid[160];
        snprintf(mid, sizeof mid, ", \"%s\": ", fmt->args_key);
        char head[64];
        snprintf(head, sizeof head, "%s{\"name\": ", fmt->open);
        add_lit3(&c, head, quoted, mid);
        cJSON_free(quoted);
    }
    g->close_lit = add_lit3(&c, "}", fmt->close, "");
    if (!required)
        g->trigger_lit = add_lit3(&c, fmt->trigger, "", "");
out:
    return finish(&c, doc, g, rc, out);
}
