/* engine/format/safetensors.c: the .safetensors reader. The header is parsed with cJSON; every
 * number is checked to be a non-negative integer below 2^53 before it becomes a size, and every
 * size product for overflow. The first problem ends the open with "<file>: <what>". */
#include "engine/format/safetensors.h"

#include "common/arena.h"
#include "common/mmap.h"

#include <cJSON.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* The format's own limit on the header (100 MB); real headers are a few hundred KB at most. */
#define MAX_HEADER ((uint64_t)100 << 20)
#define MAX_NAME 1024

struct eng_safetensors {
    char *path;
    const uint8_t *base;
    size_t size;
    bool mapped;
    eng_st_tensor *tensors;  /* [n], sorted by name */
    size_t n;
    char *names;             /* every tensor name, NUL-terminated, back to back */
};

static const struct {
    const char *name;
    size_t size;
} DTYPES[ENG_ST_DTYPE_COUNT] = {
    [ENG_ST_DTYPE_F64] = {"F64", 8},   [ENG_ST_DTYPE_F32] = {"F32", 4},
    [ENG_ST_DTYPE_F16] = {"F16", 2},   [ENG_ST_DTYPE_BF16] = {"BF16", 2},
    [ENG_ST_DTYPE_I64] = {"I64", 8},   [ENG_ST_DTYPE_I32] = {"I32", 4},
    [ENG_ST_DTYPE_I16] = {"I16", 2},   [ENG_ST_DTYPE_I8] = {"I8", 1},
    [ENG_ST_DTYPE_U64] = {"U64", 8},   [ENG_ST_DTYPE_U32] = {"U32", 4},
    [ENG_ST_DTYPE_U16] = {"U16", 2},   [ENG_ST_DTYPE_U8] = {"U8", 1},
    [ENG_ST_DTYPE_BOOL] = {"BOOL", 1},
};

const char *eng_st_dtype_name(eng_st_dtype t)
{
    return (unsigned)t < ENG_ST_DTYPE_COUNT ? DTYPES[t].name : "?";
}

size_t eng_st_dtype_size(eng_st_dtype t)
{
    return (unsigned)t < ENG_ST_DTYPE_COUNT ? DTYPES[t].size : 0;
}

/* A JSON number that is an integer in [0, 2^53]. */
static bool json_u64(const cJSON *j, uint64_t *out)
{
    if (!cJSON_IsNumber(j))
        return false;
    double d = j->valuedouble;
    if (!(d >= 0 && d <= 9007199254740992.0) || floor(d) != d)
        return false;
    *out = (uint64_t)d;
    return true;
}

/* Reads one tensor entry; its name is already in t->name. data_size: bytes after the header. */
static int parse_tensor(eng_safetensors *st, const cJSON *j, eng_st_tensor *t, uint64_t *begin,
                        uint64_t *end, util_err *err)
{
    const char *p = st->path, *nm = t->name;
    if (!cJSON_IsObject(j))
        return util_err_set(err, LLMGW_EINVAL, "%s: tensor '%s' is not a JSON object", p, nm);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(j, "dtype");
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(j, "shape");
    const cJSON *offs = cJSON_GetObjectItemCaseSensitive(j, "data_offsets");
    if (!cJSON_IsString(dt))
        return util_err_set(err, LLMGW_EINVAL, "%s: tensor '%s' has no dtype string", p, nm);
    int type = -1;
    for (int i = 0; i < ENG_ST_DTYPE_COUNT; i++)
        if (strcmp(dt->valuestring, DTYPES[i].name) == 0)
            type = i;
    if (type < 0)
        return util_err_set(err, LLMGW_EINVAL, "%s: tensor '%s' has unsupported dtype '%.32s'",
                            p, nm, dt->valuestring);
    t->dtype = (eng_st_dtype)type;
    if (!cJSON_IsArray(shape) || cJSON_GetArraySize(shape) > ENG_ST_MAX_DIMS)
        return util_err_set(err, LLMGW_EINVAL, "%s: tensor '%s' has no shape array of at most "
                            "%d dimensions", p, nm, ENG_ST_MAX_DIMS);
    t->n_dims = cJSON_GetArraySize(shape);
    uint64_t elems = 1;
    int d = 0;
    for (const cJSON *e = shape->child; e != NULL; e = e->next, d++) {
        uint64_t v;
        if (!json_u64(e, &v))
            return util_err_set(err, LLMGW_EINVAL, "%s: tensor '%s': dimension %d is not a "
                                "non-negative integer", p, nm, d);
        if (v != 0 && elems > UINT64_MAX / v)
            return util_err_set(err, LLMGW_EINVAL, "%s: tensor '%s': the shape overflows", p, nm);
        t->shape[d] = v;
        elems *= v;
    }
    for (; d < ENG_ST_MAX_DIMS; d++)
        t->shape[d] = 1;
    t->n_elems = elems;
    if (!cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2 || !json_u64(offs->child, begin) ||
        !json_u64(offs->child->next, end) || *end < *begin)
        return util_err_set(err, LLMGW_EINVAL, "%s: tensor '%s': data_offsets is not a pair of "
                            "integers [begin, end] with begin <= end", p, nm);
    size_t esz = DTYPES[type].size;
    if (elems > UINT64_MAX / esz || elems * esz != *end - *begin)
        return util_err_set(err, LLMGW_EINVAL, "%s: tensor '%s': shape and dtype make a size "
                            "other than its data_offsets span (%llu bytes)", p, nm,
                            (unsigned long long)(*end - *begin));
    return 0;
}

typedef struct span {
    uint64_t begin, end;
    size_t idx;
} span;

static int cmp_span(const void *a, const void *b)
{
    const span *x = a, *y = b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    return (x->end > y->end) - (x->end < y->end);
}

static int cmp_tensor(const void *a, const void *b)
{
    return strcmp(((const eng_st_tensor *)a)->name, ((const eng_st_tensor *)b)->name);
}

static int check_metadata(const eng_safetensors *st, const cJSON *j, util_err *err)
{
    if (!cJSON_IsObject(j))
        return util_err_set(err, LLMGW_EINVAL, "%s: __metadata__ is not a JSON object",
                            st->path);
    for (const cJSON *e = j->child; e != NULL; e = e->next)
        if (!cJSON_IsString(e))
            return util_err_set(err, LLMGW_EINVAL, "%s: __metadata__ value '%.64s' is not a "
                                "string", st->path, e->string);
    return 0;
}

/* Parses the header at st->base + 8 of hlen bytes and fills st->tensors. */
static int parse(eng_safetensors *st, uint64_t hlen, util_err *err)
{
    const char *hdr = (const char *)st->base + 8;
    const uint64_t data_size = st->size - 8 - hlen;
    const uint8_t *data = st->base + 8 + hlen;
    span *spans = NULL;
    int rc = 0;
    if (hlen == 0 || hdr[0] != '{')
        return util_err_set(err, LLMGW_EINVAL, "%s: the header does not start with '{'",
                            st->path);
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(hdr, (size_t)hlen, &end, 0);
    if (root == NULL || !cJSON_IsObject(root)) {
        rc = util_err_set(err, LLMGW_EINVAL, "%s: the header is not a valid JSON object",
                          st->path);
        goto out;
    }
    for (; end != NULL && end < hdr + hlen; end++)  /* writers pad the header with spaces */
        if (*end != ' ' && *end != '\n' && *end != '\r' && *end != '\t' && *end != '\0') {
            rc = util_err_set(err, LLMGW_EINVAL, "%s: bytes after the JSON header", st->path);
            goto out;
        }
    size_t n = 0, names_len = 0;
    for (const cJSON *e = root->child; e != NULL; e = e->next) {
        if (strcmp(e->string, "__metadata__") == 0) {
            if ((rc = check_metadata(st, e, err)) != 0)
                goto out;
            continue;
        }
        size_t len = strlen(e->string);
        if (len == 0 || len > MAX_NAME) {
            rc = util_err_set(err, LLMGW_EINVAL, "%s: a tensor name is empty or longer than %d "
                              "bytes", st->path, MAX_NAME);
            goto out;
        }
        n++;
        names_len += len + 1;
    }
    st->tensors = util_xcalloc(n ? n : 1, sizeof *st->tensors);
    st->names = util_xmalloc(names_len ? names_len : 1);
    spans = util_xcalloc(n ? n : 1, sizeof *spans);
    char *np = st->names;
    size_t i = 0;
    for (const cJSON *e = root->child; e != NULL; e = e->next) {
        if (strcmp(e->string, "__metadata__") == 0)
            continue;
        eng_st_tensor *t = &st->tensors[i];
        size_t len = strlen(e->string);
        memcpy(np, e->string, len + 1);
        t->name = np;
        np += len + 1;
        if ((rc = parse_tensor(st, e, t, &spans[i].begin, &spans[i].end, err)) != 0)
            goto out;
        if (spans[i].end > data_size) {
            rc = util_err_set(err, LLMGW_EINVAL, "%s: tensor '%s' ends at byte %llu of a %llu-"
                              "byte data section (file truncated?)", st->path, t->name,
                              (unsigned long long)spans[i].end,
                              (unsigned long long)data_size);
            goto out;
        }
        t->data = data + spans[i].begin;
        t->bytes = (size_t)(spans[i].end - spans[i].begin);
        spans[i].idx = i;
        i++;
    }
    st->n = n;
    /* The data section is the tensors back to back, in offset order. */
    qsort(spans, n, sizeof *spans, cmp_span);
    uint64_t at = 0;
    for (i = 0; i < n; i++) {
        if (spans[i].begin != at) {
            rc = util_err_set(err, LLMGW_EINVAL, "%s: tensor '%s' %s (data_offsets begin %llu, "
                              "expected %llu)", st->path, st->tensors[spans[i].idx].name,
                              spans[i].begin < at ? "overlaps another" : "leaves a gap before it",
                              (unsigned long long)spans[i].begin, (unsigned long long)at);
            goto out;
        }
        at = spans[i].end;
    }
    if (at != data_size) {
        rc = util_err_set(err, LLMGW_EINVAL, "%s: the tensors cover %llu of the %llu data bytes",
                          st->path, (unsigned long long)at, (unsigned long long)data_size);
        goto out;
    }
    qsort(st->tensors, n, sizeof *st->tensors, cmp_tensor);
    for (i = 1; i < n; i++)
        if (strcmp(st->tensors[i - 1].name, st->tensors[i].name) == 0) {
            rc = util_err_set(err, LLMGW_EINVAL, "%s: tensor '%s' appears twice", st->path,
                              st->tensors[i].name);
            goto out;
        }
out:
    free(spans);
    cJSON_Delete(root);
    return rc;
}

int eng_safetensors_open_mem(eng_safetensors **out, const void *data, size_t size,
                             const char *name, util_err *err)
{
    uint64_t hlen = 0;
    *out = NULL;
    if (size < 8)
        return util_err_set(err, LLMGW_EINVAL, "%s: file is truncated (%zu bytes, no header "
                            "length)", name, size);
    const uint8_t *b = data;
    for (int i = 7; i >= 0; i--)
        hlen = (hlen << 8) | b[i];
    if (hlen > MAX_HEADER)
        return util_err_set(err, LLMGW_EINVAL, "%s: header length %llu is absurdly large", name,
                            (unsigned long long)hlen);
    if (hlen > size - 8)
        return util_err_set(err, LLMGW_EINVAL, "%s: file is truncated (header of %llu bytes, "
                            "file of %zu)", name, (unsigned long long)hlen, size);
    eng_safetensors *st = util_xcalloc(1, sizeof *st);
    st->path = util_xstrdup(name);
    st->base = data;
    st->size = size;
    int rc = parse(st, hlen, err);
    if (rc != 0) {
        eng_safetensors_free(st);
        return rc;
    }
    *out = st;
    return 0;
}

int eng_safetensors_open(eng_safetensors **out, const char *path, util_err *err)
{
    *out = NULL;
    util_map m;
    int rc = util_map_file(&m, path, 8, err);  /* 8: the header length */
    if (rc != 0)
        return rc;
    if ((rc = eng_safetensors_open_mem(out, m.base, m.size, path, err)) != 0) {
        util_map_release(&m);
        return rc;
    }
    (*out)->mapped = true;
    return 0;
}

void eng_safetensors_free(eng_safetensors *st)
{
    if (st == NULL)
        return;
    if (st->mapped)
        util_map_release(&(util_map){.base = st->base, .size = st->size});
    free(st->tensors);
    free(st->names);
    free(st->path);
    free(st);
}

size_t eng_safetensors_count(const eng_safetensors *st) { return st->n; }

const eng_st_tensor *eng_safetensors_at(const eng_safetensors *st, size_t i)
{
    return i < st->n ? &st->tensors[i] : NULL;
}

const eng_st_tensor *eng_safetensors_find(const eng_safetensors *st, const char *name)
{
    size_t lo = 0, hi = st->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(st->tensors[mid].name, name);
        if (c == 0)
            return &st->tensors[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

const char *eng_safetensors_path(const eng_safetensors *st) { return st->path; }
