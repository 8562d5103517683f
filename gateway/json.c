/* gateway/json.c: strict JSON grammar, duplicate keys and the printer (see json.h). */
#include "gateway/json.h"

#include "common/arena.h"

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

static int fault(gw_json_fault *f, const char *s, const char *at, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int fault(gw_json_fault *f, const char *s, const char *at, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(f->what, sizeof f->what, fmt, ap);
    va_end(ap);
    f->offset = (size_t)(at - s);
    return -1;
}

static bool is_ws(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

static bool is_digit(char c)
{
    return c >= '0' && c <= '9';
}

static int hex4(const char *p, const char *end, unsigned *out)
{
    unsigned v = 0;
    if (end - p < 4)
        return -1;
    for (int i = 0; i < 4; i++) {
        char c = p[i];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f') v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') v |= (unsigned)(c - 'A' + 10);
        else return -1;
    }
    *out = v;
    return 0;
}

/* A string whose opening quote is at *pp; on success *pp is just past the closing quote. */
static int scan_string(const char *s, const char **pp, const char *end, gw_json_fault *f)
{
    const char *p = *pp + 1;
    while (p < end) {
        unsigned char c = (unsigned char)*p;
        if (c == '"') {
            *pp = p + 1;
            return 0;
        }
        if (c < 0x20)
            return fault(f, s, p, "a raw control byte (0x%02x) inside a string; escape it "
                         "(\\n, \\t or \\u%04x)", c, c);
        if (c != '\\') {
            p++;
            continue;
        }
        if (end - p < 2)
            break;
        char e = p[1];
        if (e == '"' || e == '\\' || e == '/' || e == 'b' || e == 'f' || e == 'n' || e == 'r' ||
            e == 't') {
            p += 2;
            continue;
        }
        if (e != 'u')
            return fault(f, s, p, "an invalid escape '\\%c' inside a string", e);
        unsigned u;
        if (hex4(p + 2, end, &u) != 0)
            return fault(f, s, p, "a \\u escape without four hex digits");
        if (u == 0)
            return fault(f, s, p, "the escape \\u0000 (a NUL character) inside a string");
        if (u >= 0xdc00 && u <= 0xdfff)
            return fault(f, s, p, "a low surrogate \\u%04x without a high one before it", u);
        p += 6;
        if (u >= 0xd800 && u <= 0xdbff) {
            unsigned lo;
            if (end - p < 6 || p[0] != '\\' || p[1] != 'u' || hex4(p + 2, end, &lo) != 0 ||
                lo < 0xdc00 || lo > 0xdfff)
                return fault(f, s, p - 6, "a high surrogate \\u%04x without a low one after it",
                             u);
            p += 6;
        }
    }
    return fault(f, s, end, "an unterminated string");
}

/* -? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)? */
static int scan_number(const char *s, const char **pp, const char *end, gw_json_fault *f)
{
    const char *p = *pp, *start = p;
    if (p < end && *p == '-')
        p++;
    if (p < end && *p == '0') {
        p++;
    } else if (p < end && is_digit(*p)) {
        while (p < end && is_digit(*p))
            p++;
    } else {
        return fault(f, s, start, "a number without digits");
    }
    if (p < end && *p == '.') {
        p++;
        if (p >= end || !is_digit(*p))
            return fault(f, s, start, "a number with no digit after its '.'");
        while (p < end && is_digit(*p))
            p++;
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        p++;
        if (p < end && (*p == '+' || *p == '-'))
            p++;
        if (p >= end || !is_digit(*p))
            return fault(f, s, start, "a number with no digit in its exponent");
        while (p < end && is_digit(*p))
            p++;
    }
    if (p < end && (is_digit(*p) || *p == '.' || *p == 'e' || *p == 'E' || *p == '+' ||
                    *p == '-'))
        return fault(f, s, start, "a malformed number (leading zero or stray sign)");
    /* A number past the double range would be infinity here and something else to a peer. */
    size_t n = (size_t)(p - start);
    char small[64], *buf = n < sizeof small ? small : util_xmalloc(n + 1);
    memcpy(buf, start, n);
    buf[n] = '\0';
    bool finite = isfinite(strtod(buf, NULL));
    if (buf != small)
        free(buf);
    if (!finite)
        return fault(f, s, start, "a number too large for a double");
    *pp = p;
    return 0;
}

static int scan_literal(const char *s, const char **pp, const char *end, gw_json_fault *f)
{
    static const char *const words[] = {"true", "false", "null"};
    for (size_t i = 0; i < 3; i++) {
        size_t n = strlen(words[i]);
        if ((size_t)(end - *pp) >= n && memcmp(*pp, words[i], n) == 0) {
            *pp += n;
            return 0;
        }
    }
    return fault(f, s, *pp, "an unexpected character '%c'",
                 (unsigned char)**pp >= 0x20 && (unsigned char)**pp < 0x7f ? **pp : '?');
}

int gw_json_check(const char *s, size_t len, gw_json_fault *f)
{
    enum { VALUE, AFTER_VALUE, KEY } state = VALUE;
    char stack[GW_JSON_MAX_DEPTH];  /* '{' or '[' per open container */
    size_t depth = 0;
    const char *p = s, *end = s + len;
    for (;;) {
        while (p < end && is_ws(*p))
            p++;
        if (state == VALUE) {
            if (p >= end)
                return fault(f, s, p, "the body ends where a value was expected");
            char c = *p;
            if (c == '{' || c == '[') {
                if (depth == GW_JSON_MAX_DEPTH)
                    return fault(f, s, p, "values nested more than %d deep",
                                 GW_JSON_MAX_DEPTH);
                stack[depth++] = c;
                p++;
                while (p < end && is_ws(*p))
                    p++;
                if (p < end && *p == (c == '{' ? '}' : ']')) {
                    depth--;
                    p++;
                    state = AFTER_VALUE;
                } else {
                    state = c == '{' ? KEY : VALUE;
                }
                continue;
            }
            int rc = c == '"' ? scan_string(s, &p, end, f)
                     : (c == '-' || is_digit(c)) ? scan_number(s, &p, end, f)
                                                 : scan_literal(s, &p, end, f);
            if (rc != 0)
                return rc;
            state = AFTER_VALUE;
        } else if (state == KEY) {
            if (p >= end || *p != '"')
                return fault(f, s, p, "an object key that is not a string");
            if (scan_string(s, &p, end, f) != 0)
                return -1;
            while (p < end && is_ws(*p))
                p++;
            if (p >= end || *p != ':')
                return fault(f, s, p, "a missing ':' after an object key");
            p++;
            state = VALUE;
        } else {
            if (depth == 0) {
                if (p != end)
                    return fault(f, s, p, "unexpected text after the JSON value");
                return 0;
            }
            char open = stack[depth - 1];
            if (p < end && *p == ',') {
                p++;
                state = open == '{' ? KEY : VALUE;
            } else if (p < end && *p == (open == '{' ? '}' : ']')) {
                p++;
                depth--;
            } else {
                return fault(f, s, p, open == '{' ? "a missing ',' or '}' in an object"
                                                  : "a missing ',' or ']' in an array");
            }
        }
    }
}

/* ---- duplicate keys ------------------------------------------------------------------------ */

/* Appends ".name" (or "name" at the start) or ".[i]" to path, truncating quietly. */
static void path_push(char *path, size_t cap, const char *name, int index)
{
    size_t n = strlen(path);
    if (n >= cap)
        return;
    if (name != NULL)
        snprintf(path + n, cap - n, "%s%s", n ? "." : "", name);
    else
        snprintf(path + n, cap - n, "%s[%d]", n ? "." : "", index);
}

/* The first key of object `o` seen twice, or NULL. Small objects compare pairwise; larger ones
 * use a hash set so a body with a million keys costs linear time. */
static const char *object_duplicate(const cJSON *o)
{
    size_t n = 0;
    for (const cJSON *c = o->child; c != NULL; c = c->next)
        n++;
    if (n < 2)
        return NULL;
    if (n <= 16) {
        for (const cJSON *a = o->child; a != NULL; a = a->next)
            for (const cJSON *b = a->next; b != NULL; b = b->next)
                if (!strcmp(a->string, b->string))
                    return b->string;
        return NULL;
    }
    size_t cap = 32;
    while (cap < 2 * n)
        cap *= 2;
    const char **set = util_xcalloc(cap, sizeof *set);
    const char *dup = NULL;
    for (const cJSON *c = o->child; c != NULL && dup == NULL; c = c->next) {
        size_t h = (size_t)XXH3_64bits(c->string, strlen(c->string)) & (cap - 1);
        while (set[h] != NULL && strcmp(set[h], c->string) != 0)
            h = (h + 1) & (cap - 1);
        if (set[h] != NULL)
            dup = c->string;
        set[h] = c->string;
    }
    free(set);
    return dup;
}

static const char *walk(const cJSON *v, char *path, size_t cap, size_t depth)
{
    if (depth > GW_JSON_MAX_DEPTH + 1 || !(cJSON_IsObject(v) || cJSON_IsArray(v)))
        return NULL;
    size_t mark = strlen(path);
    if (cJSON_IsObject(v)) {
        const char *dup = object_duplicate(v);
        if (dup != NULL) {
            path_push(path, cap, dup, 0);
            return dup;
        }
    }
    int i = 0;
    for (const cJSON *c = v->child; c != NULL; c = c->next, i++) {
        if (!(cJSON_IsObject(c) || cJSON_IsArray(c)))
            continue;
        path_push(path, cap, cJSON_IsObject(v) ? c->string : NULL, i);
        const char *dup = walk(c, path, cap, depth + 1);
        if (dup != NULL)
            return dup;
        path[mark] = '\0';
    }
    return NULL;
}

const char *gw_json_duplicate(const cJSON *root, char *path, size_t cap)
{
    if (cap == 0)
        return NULL;
    path[0] = '\0';
    return walk(root, path, cap, 0);
}

/* ---- printing ------------------------------------------------------------------------------ */

void gw_json_print_stringn(const char *str, size_t len, struct evbuffer *out)
{
    static const char hex[] = "0123456789abcdef";
    const unsigned char *s = (const unsigned char *)str, *end = s + len, *run = s;
    evbuffer_add(out, "\"", 1);
    for (; s < end; s++) {
        unsigned char c = *s;
        if (c >= 0x20 && c != '"' && c != '\\')
            continue;
        evbuffer_add(out, run, (size_t)(s - run));
        run = s + 1;
        char esc[6] = {'\\', 'u', '0', '0', hex[c >> 4], hex[c & 15]};
        switch (c) {
        case '"': evbuffer_add(out, "\\\"", 2); break;
        case '\\': evbuffer_add(out, "\\\\", 2); break;
        case '\n': evbuffer_add(out, "\\n", 2); break;
        case '\r': evbuffer_add(out, "\\r", 2); break;
        case '\t': evbuffer_add(out, "\\t", 2); break;
        default: evbuffer_add(out, esc, 6); break;
        }
    }
    evbuffer_add(out, run, (size_t)(s - run));
    evbuffer_add(out, "\"", 1);
}

void gw_json_print_string(const char *str, struct evbuffer *out)
{
    gw_json_print_stringn(str, strlen(str), out);
}

static void print_number(double d, struct evbuffer *out)
{
    char buf[40];
    if (!isfinite(d))
        snprintf(buf, sizeof buf, "null");  /* cannot come from a parsed body */
    else if (d == floor(d) && fabs(d) < 1e18)
        snprintf(buf, sizeof buf, "%.0f", d);
    else {
        snprintf(buf, sizeof buf, "%.15g", d);
        if (strtod(buf, NULL) != d)
            snprintf(buf, sizeof buf, "%.17g", d);
    }
    evbuffer_add(out, buf, strlen(buf));
}

static void print_value(const cJSON *v, const char *model, int depth, struct evbuffer *out)
{
    if (cJSON_IsString(v)) {
        gw_json_print_string(v->valuestring, out);
    } else if (cJSON_IsNumber(v)) {
        print_number(v->valuedouble, out);
    } else if (cJSON_IsTrue(v)) {
        evbuffer_add(out, "true", 4);
    } else if (cJSON_IsFalse(v)) {
        evbuffer_add(out, "false", 5);
    } else if (cJSON_IsArray(v) || cJSON_IsObject(v)) {
        bool obj = cJSON_IsObject(v);
        evbuffer_add(out, obj ? "{" : "[", 1);
        for (const cJSON *c = v->child; c != NULL; c = c->next) {
            if (c != v->child)
                evbuffer_add(out, ",", 1);
            if (obj) {
                gw_json_print_string(c->string, out);
                evbuffer_add(out, ":", 1);
                if (depth == 0 && model != NULL && cJSON_IsString(c) &&
                    !strcmp(c->string, "model")) {
                    gw_json_print_string(model, out);
                    continue;
                }
            }
            print_value(c, model, depth + 1, out);
        }
        evbuffer_add(out, obj ? "}" : "]", 1);
    } else {
        evbuffer_add(out, "null", 4);
    }
}

void gw_json_print(const cJSON *v, const char *model, struct evbuffer *out)
{
    print_value(v, model, 0, out);
}
