/* tools/convert.c: llmgw-convert — rewrites a GGUF model with its weight matrices in another
 * type (F32, F16, BF16, Q8_0, Q4_0, Q4_1), metadata and vectors unchanged. llmgw ships it to
 * make a higher-precision stand-in `large` tier from the small model (Q4_1 → Q8_0 or F16).
 *
 *   llmgw-convert -i IN.gguf -o OUT.gguf -t q8_0
 */
#include "common/arena.h"
#include "engine/format/gguf.h"
#include "kernels/convert.h"
#include "kernels/types.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static const struct {
    const char *name;
    uint32_t type;
    uint32_t file_type;   /* general.file_type (llama.cpp's ftype numbering) */
} k_targets[] = {
    {"f32", KERN_TYPE_F32, 0},   {"f16", KERN_TYPE_F16, 1},   {"bf16", KERN_TYPE_BF16, 32},
    {"q8_0", KERN_TYPE_Q8_0, 7}, {"q4_0", KERN_TYPE_Q4_0, 2}, {"q4_1", KERN_TYPE_Q4_1, 3},
};

static int put(FILE *f, const void *p, size_t n)
{
    return fwrite(p, 1, n, f) == n ? 0 : -1;
}

static int put_u32(FILE *f, uint32_t v) { return put(f, &v, 4); }
static int put_u64(FILE *f, uint64_t v) { return put(f, &v, 8); }

static int put_str(FILE *f, eng_gguf_str s)
{
    return put_u64(f, s.len) || put(f, s.ptr, (size_t)s.len) ? -1 : 0;
}

static size_t scalar_size(eng_gguf_vtype t)
{
    static const size_t sz[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    return (unsigned)t < sizeof sz / sizeof sz[0] ? sz[t] : 0;
}

static int put_scalar(FILE *f, const eng_gguf_kv *kv, uint32_t file_type)
{
    union {
        uint8_t u8; uint16_t u16; uint32_t u32; uint64_t u64; float f32; double f64;
    } v;
    bool is_ft = eng_gguf_str_eq(kv->key, "general.file_type");
    switch (kv->type) {
    case ENG_GGUF_UINT8: case ENG_GGUF_INT8: v.u8 = (uint8_t)kv->v.u64; break;
    case ENG_GGUF_BOOL: v.u8 = kv->v.b; break;
    case ENG_GGUF_UINT16: case ENG_GGUF_INT16: v.u16 = (uint16_t)kv->v.u64; break;
    case ENG_GGUF_UINT32: case ENG_GGUF_INT32:
        v.u32 = is_ft ? file_type : (uint32_t)kv->v.u64;
        break;
    case ENG_GGUF_FLOAT32: v.f32 = (float)kv->v.f64; break;
    case ENG_GGUF_FLOAT64: v.f64 = kv->v.f64; break;
    case ENG_GGUF_UINT64: case ENG_GGUF_INT64: v.u64 = kv->v.u64; break;
    case ENG_GGUF_STRING: return put_str(f, kv->v.str);
    default: return -1;
    }
    return put(f, &v, scalar_size(kv->type));
}

static int put_kv(FILE *f, const eng_gguf_kv *kv, uint32_t file_type)
{
    if (put_str(f, kv->key) || put_u32(f, kv->type))
        return -1;
    if (kv->type != ENG_GGUF_ARRAY)
        return put_scalar(f, kv, file_type);
    if (put_u32(f, kv->arr_type) || put_u64(f, kv->arr_len))
        return -1;
    if (kv->arr_type == ENG_GGUF_STRING) {
        for (uint64_t i = 0; i < kv->arr_len; i++)
            if (put_str(f, kv->arr_str[i]))
                return -1;
        return 0;
    }
    return put(f, kv->arr_data, (size_t)(kv->arr_len * scalar_size(kv->arr_type)));
}

/* Weight matrices change type; vectors (norms, biases) and 1-row tensors stay as they are. */
static uint32_t new_type(const eng_gguf_tensor *t, uint32_t target)
{
    if (t->n_dims < 2 || t->ne[1] == 1)
        return t->type;
    return t->ne[0] % kern_type_get(target)->block_elems == 0 ? target : t->type;
}

static int write_model(const eng_gguf *g, const char *out, uint32_t target, uint32_t ft)
{
    FILE *f = fopen(out, "wb");
    if (f == NULL) {
        perror(out);
        return 1;
    }
    size_t align = eng_gguf_alignment(g), nt = eng_gguf_n_tensors(g);
    int rc = put_u32(f, 0x46554747u) || put_u32(f, 3) || put_u64(f, nt) ||
             put_u64(f, eng_gguf_n_kv(g));
    for (size_t i = 0; i < eng_gguf_n_kv(g) && rc == 0; i++)
        rc = put_kv(f, eng_gguf_kv_at(g, i), ft);
    uint64_t off = 0;
    for (size_t i = 0; i < nt && rc == 0; i++) {
        const eng_gguf_tensor *t = eng_gguf_tensor_at(g, i);
        uint32_t ty = new_type(t, target);
        rc = put_str(f, t->name) || put_u32(f, t->n_dims);
        for (uint32_t d = 0; d < t->n_dims && rc == 0; d++)
            rc = put_u64(f, t->ne[d]);
        rc = rc || put_u32(f, ty) || put_u64(f, off);
        uint64_t bytes = kern_type_row_bytes(ty, t->ne[0]) * (t->ne[1] * t->ne[2] * t->ne[3]);
        off += (bytes + align - 1) / align * align;
    }
    static const uint8_t zeros[65536];
    long pos = ftell(f);
    size_t pad = (align - (size_t)pos % align) % align;
    rc = rc || put(f, zeros, pad);
    float *row = NULL;
    void *qrow = NULL;
    for (size_t i = 0; i < nt && rc == 0; i++) {
        const eng_gguf_tensor *t = eng_gguf_tensor_at(g, i);
        uint32_t ty = new_type(t, target);
        uint64_t rows = t->ne[1] * t->ne[2] * t->ne[3], bytes;
        if (ty == t->type) {
            bytes = t->bytes;
            rc = put(f, t->data, t->bytes);
        } else {
            size_t in_rb = kern_type_row_bytes(t->type, t->ne[0]);
            size_t out_rb = kern_type_row_bytes(ty, t->ne[0]);
            row = realloc(row, (size_t)t->ne[0] * sizeof *row);
            qrow = realloc(qrow, out_rb);
            for (uint64_t r = 0; r < rows && rc == 0; r++) {
                if (kern_type_to_f32(t->type, (const uint8_t *)t->data + r * in_rb, row,
                                     (int64_t)t->ne[0]) != 0 ||
                    kern_type_from_f32(ty, row, qrow, (int64_t)t->ne[0]) != 0) {
                    fprintf(stderr, "llmgw-convert: cannot convert %s to %s\n",
                            kern_type_name(t->type), kern_type_name(ty));
                    rc = 1;
                    break;
                }
                rc = put(f, qrow, out_rb);
            }
            if (rc != 0)
                break;
            bytes = out_rb * rows;
        }
        pad = (align - (size_t)(bytes % align)) % align;
        rc = rc || put(f, zeros, pad);
    }
    free(row);
    free(qrow);
    if (fclose(f) != 0)
        rc = 1;
    if (rc != 0)
        fprintf(stderr, "llmgw-convert: writing %s failed\n", out);
    return rc ? 1 : 0;
}

int main(int argc, char **argv)
{
    const char *in = NULL, *out = NULL, *to = NULL;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "-i")) in = argv[i + 1];
        else if (!strcmp(argv[i], "-o")) out = argv[i + 1];
        else if (!strcmp(argv[i], "-t")) to = argv[i + 1];
    }
    int t = -1;
    for (size_t i = 0; to && i < sizeof k_targets / sizeof k_targets[0]; i++)
        if (!strcasecmp(to, k_targets[i].name))
            t = (int)i;
    if (in == NULL || out == NULL || t < 0) {
        fprintf(stderr, "usage: llmgw-convert -i IN.gguf -o OUT.gguf -t f32|f16|bf16|q8_0|q4_0|q4_1\n");
        return 2;
    }
    eng_gguf *g = NULL;
    util_err err;
    if (eng_gguf_open(&g, in, &err) != 0) {
        fprintf(stderr, "llmgw-convert: %s\n", err.msg);
        return 1;
    }
    int rc = write_model(g, out, k_targets[t].type, k_targets[t].file_type);
    eng_gguf_close(g);
    if (rc == 0)
        printf("llmgw-convert: wrote %s (%s weights)\n", out, k_targets[t].name);
    return rc;
}
