/* engine/format/gguf.c: GGUF reader. Everything is bounds-checked against the mapping before it is
 * read; sizes are checked for overflow; the first problem ends the open with a message of the
 * form "<file>: <what> (at byte N)". */
#include "engine/format/gguf.h"

#include "common/arena.h"
#include "common/mmap.h"
#include "kernels/types.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GGUF_MAGIC 0x46554747u   /* "GGUF" little-endian */
#define MAX_ITEMS (1u << 24)     /* more kvs or tensors than this is not a model file */

struct eng_gguf {
    char *path;
    const uint8_t *base;
    size_t size;
    bool mapped;
    uint32_t version;
    size_t alignment;
    eng_gguf_kv *kv;          /* [n_kv] */
    size_t n_kv;
    eng_gguf_tensor *tensors; /* [n_tensors] */
    size_t n_tensors;
    size_t data_offset;
};

typedef struct reader {
    const uint8_t *p;
    size_t size, off;
    const char *name;
    util_err *err;
} reader;

static int bad(reader *r, const char *what)
{
    return util_err_set(r->err, LLMGW_EINVAL, "%s: %s (at byte %zu)", r->name, what, r->off);
}

static int need(reader *r, size_t n)
{
    if (n > r->size - r->off)
        return bad(r, "file is truncated");
    return 0;
}

static int rd(reader *r, void *out, size_t n)
{
    int rc = need(r, n);
    if (rc == 0) {
        memcpy(out, r->p + r->off, n);
        r->off += n;
    }
    return rc;
}

static int rd_u32(reader *r, uint32_t *v) { return rd(r, v, 4); }
static int rd_u64(reader *r, uint64_t *v) { return rd(r, v, 8); }

static int rd_str(reader *r, eng_gguf_str *s)
{
    uint64_t len;
    int rc = rd_u64(r, &len);
    if (rc != 0)
        return rc;
    if (len > r->size - r->off)
        return bad(r, "a string runs past the end of the file");
    s->ptr = (const char *)r->p + r->off;
    s->len = len;
    r->off += (size_t)len;
    return 0;
}

static size_t scalar_size(eng_gguf_vtype t)
{
    switch (t) {
    case ENG_GGUF_UINT8: case ENG_GGUF_INT8: case ENG_GGUF_BOOL: return 1;
    case ENG_GGUF_UINT16: case ENG_GGUF_INT16: return 2;
    case ENG_GGUF_UINT32: case ENG_GGUF_INT32: case ENG_GGUF_FLOAT32: return 4;
    case ENG_GGUF_UINT64: case ENG_GGUF_INT64: case ENG_GGUF_FLOAT64: return 8;
    default: return 0;
    }
}

/* Reads one scalar of type t into kv->v (widened). */
static int rd_scalar(reader *r, eng_gguf_vtype t, eng_gguf_kv *kv)
{
    uint8_t b[8] = {0};
    size_t n = scalar_size(t);
    int rc;
    if (t == ENG_GGUF_STRING)
        return rd_str(r, &kv->v.str);
    if (n == 0)
        return bad(r, "unknown metadata value type");
    if ((rc = rd(r, b, n)) != 0)
        return rc;
    switch (t) {
    case ENG_GGUF_UINT8: kv->v.u64 = b[0]; break;
    case ENG_GGUF_INT8: kv->v.i64 = (int8_t)b[0]; break;
    case ENG_GGUF_BOOL:
        if (b[0] > 1)
            return bad(r, "a bool is neither 0 nor 1");
        kv->v.b = b[0];
        break;
    case ENG_GGUF_UINT16: { uint16_t v; memcpy(&v, b, 2); kv->v.u64 = v; break; }
    case ENG_GGUF_INT16: { int16_t v; memcpy(&v, b, 2); kv->v.i64 = v; break; }
    case ENG_GGUF_UINT32: { uint32_t v; memcpy(&v, b, 4); kv->v.u64 = v; break; }
    case ENG_GGUF_INT32: { int32_t v; memcpy(&v, b, 4); kv->v.i64 = v; break; }
    case ENG_GGUF_FLOAT32: { float v; memcpy(&v, b, 4); kv->v.f64 = v; break; }
    case ENG_GGUF_UINT64: memcpy(&kv->v.u64, b, 8); break;
    case ENG_GGUF_INT64: memcpy(&kv->v.i64, b, 8); break;
    case ENG_GGUF_FLOAT64: memcpy(&kv->v.f64, b, 8); break;
    default: return bad(r, "unknown metadata value type");
    }
    return 0;
}

static int rd_kv(reader *r, eng_gguf_kv *kv)
{
    uint32_t t;
    int rc;
    if ((rc = rd_str(r, &kv->key)) != 0 || (rc = rd_u32(r, &t)) != 0)
        return rc;
    if (kv->key.len == 0)
        return bad(r, "a metadata key is empty");
    if (t > ENG_GGUF_FLOAT64)
        return bad(r, "unknown metadata value type");
    kv->type = (eng_gguf_vtype)t;
    if (kv->type != ENG_GGUF_ARRAY)
        return rd_scalar(r, kv->type, kv);
    uint32_t at;
    uint64_t n;
    if ((rc = rd_u32(r, &at)) != 0 || (rc = rd_u64(r, &n)) != 0)
        return rc;
    if (at > ENG_GGUF_FLOAT64)
        return bad(r, "unknown array element type");
    if (at == ENG_GGUF_ARRAY)
        return bad(r, "nested arrays are not supported");
    kv->arr_type = (eng_gguf_vtype)at;
    kv->arr_len = n;
    kv->arr_data = r->p + r->off;
    if (at != ENG_GGUF_STRING) {
        size_t es = scalar_size(kv->arr_type);
        if (n > (r->size - r->off) / es)
            return bad(r, "an array runs past the end of the file");
        if (kv->arr_type == ENG_GGUF_BOOL)
            for (uint64_t i = 0; i < n; i++)
                if (r->p[r->off + i] > 1)
                    return bad(r, "a bool array holds a value other than 0 or 1");
        r->off += (size_t)(n * es);
        return 0;
    }
    /* Every string takes at least its 8-byte length: a bound before allocating the index. */
    if (n > (r->size - r->off) / 8)
        return bad(r, "a string array runs past the end of the file");
    eng_gguf_str *index = malloc((size_t)(n ? n : 1) * sizeof *index);
    if (index == NULL)
        return util_err_set(r->err, LLMGW_ENOMEM, "%s: out of memory", r->name);
    kv->arr_str = index;
    for (uint64_t i = 0; i < n; i++)
        if ((rc = rd_str(r, &index[i])) != 0)
            return rc;
    return 0;
}

static int rd_tensor(reader *r, eng_gguf_tensor *t)
{
    int rc;
    char what[160];
    if ((rc = rd_str(r, &t->name)) != 0 || (rc = rd_u32(r, &t->n_dims)) != 0)
        return rc;
    if (t->name.len == 0 || t->name.len > 255)
        return bad(r, "a tensor name is empty or longer than 255 bytes");
    if (t->n_dims == 0 || t->n_dims > ENG_GGUF_MAX_DIMS)
        return bad(r, "a tensor has 0 or more than 4 dimensions");
    uint64_t elems = 1;
    for (uint32_t d = 0; d < ENG_GGUF_MAX_DIMS; d++) {
        t->ne[d] = 1;
        if (d < t->n_dims && (rc = rd_u64(r, &t->ne[d])) != 0)
            return rc;
        if (t->ne[d] == 0 || t->ne[d] > (uint64_t)1 << 40 || elems > UINT64_MAX / t->ne[d])
            return bad(r, "a tensor dimension is 0 or absurdly large");
        elems *= t->ne[d];
    }
    if ((rc = rd_u32(r, &t->type)) != 0 || (rc = rd_u64(r, &t->offset)) != 0)
        return rc;
    const kern_type_traits *info = kern_type_get(t->type);
    if (info == NULL) {
        snprintf(what, sizeof what, "tensor '%.*s' has weight type %u, which llmgw does not "
                 "load", (int)(t->name.len > 64 ? 64 : t->name.len), t->name.ptr, t->type);
        return bad(r, what);
    }
    if (t->ne[0] % info->block_elems != 0) {
        snprintf(what, sizeof what, "tensor '%.*s': row length %llu is not a multiple of the "
                 "%s block (%u)", (int)(t->name.len > 64 ? 64 : t->name.len), t->name.ptr,
                 (unsigned long long)t->ne[0], info->name, info->block_elems);
        return bad(r, what);
    }
    uint64_t blocks = elems / info->block_elems;
    if (blocks > UINT64_MAX / info->block_bytes)
        return bad(r, "a tensor's size overflows");
    t->bytes = (size_t)(blocks * info->block_bytes);
    return 0;
}

static int cmp_tensor_name(const void *a, const void *b)
{
    const eng_gguf_tensor *x = *(eng_gguf_tensor *const *)a, *y = *(eng_gguf_tensor *const *)b;
    size_t n = x->name.len < y->name.len ? x->name.len : y->name.len;
    int c = memcmp(x->name.ptr, y->name.ptr, n);
    return c != 0 ? c : (x->name.len > y->name.len) - (x->name.len < y->name.len);
}

static int parse(eng_gguf *g, util_err *err)
{
    reader r = {.p = g->base, .size = g->size, .name = g->path, .err = err};
    uint32_t magic;
    uint64_t n_tensors, n_kv;
    int rc;
    if ((rc = rd_u32(&r, &magic)) != 0)
        return rc;
    if (magic != GGUF_MAGIC)
        return bad(&r, "not a GGUF file (bad magic)");
    if ((rc = rd_u32(&r, &g->version)) != 0)
        return rc;
    if (g->version != 2 && g->version != 3)
        return util_err_set(err, LLMGW_EINVAL, "%s: GGUF version %u is not supported (2 or 3)",
                            g->path, g->version);
    if ((rc = rd_u64(&r, &n_tensors)) != 0 || (rc = rd_u64(&r, &n_kv)) != 0)
        return rc;
    if (n_tensors > MAX_ITEMS || n_kv > MAX_ITEMS)
        return bad(&r, "the tensor or metadata count is absurdly large");
    g->kv = calloc(n_kv ? n_kv : 1, sizeof *g->kv);
    g->tensors = calloc(n_tensors ? n_tensors : 1, sizeof *g->tensors);
    if (g->kv == NULL || g->tensors == NULL)
        return util_err_set(err, LLMGW_ENOMEM, "%s: out of memory", g->path);
    for (uint64_t i = 0; i < n_kv; i++) {
        rc = rd_kv(&r, &g->kv[i]);
        g->n_kv = (size_t)i + 1;  /* so that close() frees a partial string index */
        if (rc != 0)
            return rc;
    }
    g->alignment = 32;
    const eng_gguf_kv *al = eng_gguf_find(g, "general.alignment");
    if (al != NULL) {
        if (al->type != ENG_GGUF_UINT32 || al->v.u64 == 0 || (al->v.u64 & (al->v.u64 - 1)) ||
            al->v.u64 > 65536)
            return util_err_set(err, LLMGW_EINVAL, "%s: general.alignment must be a power of "
                                "two up to 65536", g->path);
        g->alignment = (size_t)al->v.u64;
    }
    for (uint64_t i = 0; i < n_tensors; i++) {
        if ((rc = rd_tensor(&r, &g->tensors[i])) != 0)
            return rc;
        g->n_tensors = (size_t)i + 1;
    }
    size_t data = (r.off + g->alignment - 1) / g->alignment * g->alignment;
    if (data > g->size && n_tensors > 0)
        return util_err_set(err, LLMGW_EINVAL, "%s: file is truncated before its tensor data",
                            g->path);
    g->data_offset = data;
    size_t data_size = g->size > data ? g->size - data : 0;
    for (size_t i = 0; i < g->n_tensors; i++) {
        eng_gguf_tensor *t = &g->tensors[i];
        if (t->offset % g->alignment != 0 || t->offset > data_size ||
            t->bytes > data_size - t->offset)
            return util_err_set(err, LLMGW_EINVAL, "%s: tensor '%.*s' (%zu bytes at offset "
                                "%llu) is misaligned or lies outside the file", g->path,
                                (int)(t->name.len > 64 ? 64 : t->name.len), t->name.ptr,
                                t->bytes, (unsigned long long)t->offset);
        t->data = g->base + data + t->offset;
    }
    /* Duplicate tensor names would make lookups ambiguous. */
    if (g->n_tensors > 1) {
        eng_gguf_tensor **sorted = malloc(g->n_tensors * sizeof *sorted);
        if (sorted == NULL)
            return util_err_set(err, LLMGW_ENOMEM, "%s: out of memory", g->path);
        for (size_t i = 0; i < g->n_tensors; i++)
            sorted[i] = &g->tensors[i];
        qsort(sorted, g->n_tensors, sizeof *sorted, cmp_tensor_name);
        for (size_t i = 1; i < g->n_tensors && rc == 0; i++)
            if (cmp_tensor_name(&sorted[i - 1], &sorted[i]) == 0)
                rc = util_err_set(err, LLMGW_EINVAL, "%s: tensor '%.*s' appears twice", g->path,
                                  (int)(sorted[i]->name.len > 64 ? 64 : sorted[i]->name.len),
                                  sorted[i]->name.ptr);
        free(sorted);
    }
    return rc;
}

int eng_gguf_open_mem(eng_gguf **out, const void *data, size_t size, const char *name,
                      util_err *err)
{
    eng_gguf *g = calloc(1, sizeof *g);
    if (g == NULL)
        return util_err_set(err, LLMGW_ENOMEM, "%s: out of memory", name);
    g->path = util_xstrdup(name);
    g->base = data;
    g->size = size;
    int rc = parse(g, err);
    if (rc != 0) {
        eng_gguf_close(g);
        return rc;
    }
    *out = g;
    return 0;
}

int eng_gguf_open(eng_gguf **out, const char *path, util_err *err)
{
    util_map m;
    int rc = util_map_file(&m, path, 24, err);  /* 24: the fixed header */
    if (rc != 0)
        return rc;
    if ((rc = eng_gguf_open_mem(out, m.base, m.size, path, err)) != 0) {
        util_map_release(&m);
        return rc;
    }
    (*out)->mapped = true;
    return 0;
}

void eng_gguf_close(eng_gguf *g)
{
    if (g == NULL)
        return;
    for (size_t i = 0; i < g->n_kv; i++)
        free((void *)g->kv[i].arr_str);
    free(g->kv);
    free(g->tensors);
    if (g->mapped)
        util_map_release(&(util_map){.base = g->base, .size = g->size});
    free(g->path);
    free(g);
}

const char *eng_gguf_path(const eng_gguf *g) { return g->path; }
size_t eng_gguf_alignment(const eng_gguf *g) { return g->alignment; }
size_t eng_gguf_n_kv(const eng_gguf *g) { return g->n_kv; }
const eng_gguf_kv *eng_gguf_kv_at(const eng_gguf *g, size_t i) { return &g->kv[i]; }
size_t eng_gguf_n_tensors(const eng_gguf *g) { return g->n_tensors; }
const eng_gguf_tensor *eng_gguf_tensor_at(const eng_gguf *g, size_t i) { return &g->tensors[i]; }

bool eng_gguf_str_eq(eng_gguf_str s, const char *c)
{
    size_t n = strlen(c);
    return s.len == n && memcmp(s.ptr, c, n) == 0;
}

const eng_gguf_kv *eng_gguf_find(const eng_gguf *g, const char *key)
{
    for (size_t i = 0; i < g->n_kv; i++)
        if (eng_gguf_str_eq(g->kv[i].key, key))
            return &g->kv[i];
    return NULL;
}

const eng_gguf_tensor *eng_gguf_tensor_find(const eng_gguf *g, const char *name)
{
    for (size_t i = 0; i < g->n_tensors; i++)
        if (eng_gguf_str_eq(g->tensors[i].name, name))
            return &g->tensors[i];
    return NULL;
}

static const eng_gguf_kv *get(const eng_gguf *g, const char *key, util_err *err, int *rc)
{
    const eng_gguf_kv *kv = eng_gguf_find(g, key);
    *rc = kv ? 0 : util_err_set(err, LLMGW_ENOTFOUND, "%s: metadata key '%s' is missing",
                                g->path, key);
    return kv;
}

static int wrong(const eng_gguf *g, const char *key, const char *want, util_err *err)
{
    return util_err_set(err, LLMGW_EINVAL, "%s: metadata key '%s' is not %s", g->path, key,
                        want);
}

static bool is_unsigned(eng_gguf_vtype t)
{
    return t == ENG_GGUF_UINT8 || t == ENG_GGUF_UINT16 || t == ENG_GGUF_UINT32 ||
           t == ENG_GGUF_UINT64;
}

static bool is_signed(eng_gguf_vtype t)
{
    return t == ENG_GGUF_INT8 || t == ENG_GGUF_INT16 || t == ENG_GGUF_INT32 ||
           t == ENG_GGUF_INT64;
}

int eng_gguf_get_u32(const eng_gguf *g, const char *key, uint32_t *out, util_err *err)
{
    int rc;
    const eng_gguf_kv *kv = get(g, key, err, &rc);
    if (kv == NULL)
        return rc;
    if (is_unsigned(kv->type) && kv->v.u64 <= UINT32_MAX)
        *out = (uint32_t)kv->v.u64;
    else if (is_signed(kv->type) && kv->v.i64 >= 0 && kv->v.i64 <= (int64_t)UINT32_MAX)
        *out = (uint32_t)kv->v.i64;
    else
        return wrong(g, key, "an unsigned 32-bit integer", err);
    return 0;
}

int eng_gguf_get_f32(const eng_gguf *g, const char *key, float *out, util_err *err)
{
    int rc;
    const eng_gguf_kv *kv = get(g, key, err, &rc);
    if (kv == NULL)
        return rc;
    if (kv->type == ENG_GGUF_FLOAT32 || kv->type == ENG_GGUF_FLOAT64)
        *out = (float)kv->v.f64;
    else if (is_unsigned(kv->type))
        *out = (float)kv->v.u64;
    else if (is_signed(kv->type))
        *out = (float)kv->v.i64;
    else
        return wrong(g, key, "a number", err);
    return 0;
}

int eng_gguf_get_bool(const eng_gguf *g, const char *key, bool *out, util_err *err)
{
    int rc;
    const eng_gguf_kv *kv = get(g, key, err, &rc);
    if (kv == NULL)
        return rc;
    if (kv->type != ENG_GGUF_BOOL)
        return wrong(g, key, "a bool", err);
    *out = kv->v.b;
    return 0;
}

int eng_gguf_get_str(const eng_gguf *g, const char *key, eng_gguf_str *out, util_err *err)
{
    int rc;
    const eng_gguf_kv *kv = get(g, key, err, &rc);
    if (kv == NULL)
        return rc;
    if (kv->type != ENG_GGUF_STRING)
        return wrong(g, key, "a string", err);
    *out = kv->v.str;
    return 0;
}

int eng_gguf_get_arr(const eng_gguf *g, const char *key, eng_gguf_vtype type,
                     const eng_gguf_kv **out, util_err *err)
{
    int rc;
    const eng_gguf_kv *kv = get(g, key, err, &rc);
    if (kv == NULL)
        return rc;
    if (kv->type != ENG_GGUF_ARRAY || kv->arr_type != type)
        return wrong(g, key, "an array of the expected type", err);
    *out = kv;
    return 0;
}
