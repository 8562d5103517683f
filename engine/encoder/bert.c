/* engine/encoder/bert.c: loading a sentence-transformers BERT model directory
 * (engine/encoder/bert.h): the JSON configs, the vocabulary and the weights. F32 weights are used
 * in place in the mapping when aligned; F16/BF16 (or misaligned) ones are converted once. The
 * forward: engine/encoder/bert_forward.c. */
#include "engine/encoder/bert_internal.h"
#include "kernels/device.h"

#include "common/arena.h"

#include <cJSON.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_CONFIG_BYTES (1 << 20)

/* Reads a small JSON file into a cJSON tree. */
static int read_json(cJSON **out, const char *path, util_err *err)
{
    FILE *f = fopen(path, "rb");
    *out = NULL;
    if (f == NULL)
        return util_err_set(err, LLMGW_EIO, "%s: %s", path, strerror(errno));
    char *buf = util_xmalloc(MAX_CONFIG_BYTES);
    size_t n = fread(buf, 1, MAX_CONFIG_BYTES, f);
    int rc = 0;
    if (ferror(f))
        rc = util_err_set(err, LLMGW_EIO, "%s: read error", path);
    else if (n == MAX_CONFIG_BYTES)
        rc = util_err_set(err, LLMGW_EINVAL, "%s: larger than 1 MiB", path);
    else if ((*out = cJSON_ParseWithLength(buf, n)) == NULL || !cJSON_IsObject(*out))
        rc = util_err_set(err, LLMGW_EINVAL, "%s: not a JSON object", path);
    fclose(f);
    free(buf);
    if (rc != 0) {
        cJSON_Delete(*out);
        *out = NULL;
    }
    return rc;
}

/* An integer field in [lo, hi]. */
static int json_int(const cJSON *o, const char *key, int lo, int hi, int *v, const char *path,
                    util_err *err)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsNumber(j) || floor(j->valuedouble) != j->valuedouble ||
        j->valuedouble < lo || j->valuedouble > hi)
        return util_err_set(err, LLMGW_EINVAL, "%s: \"%s\" is missing or not an integer in "
                            "[%d, %d]", path, key, lo, hi);
    *v = (int)j->valuedouble;
    return 0;
}

/* A boolean field, dflt when absent. */
static bool json_bool(const cJSON *o, const char *key, bool dflt)
{
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsBool(j) ? cJSON_IsTrue(j) : dflt;
}

static int load_config(eng_bert *m, const char *dir, util_err *err)
{
    char path[PATH_MAX];
    cJSON *c = NULL;
    int rc;
    snprintf(path, sizeof path, "%s/config.json", dir);
    if ((rc = read_json(&c, path, err)) != 0)
        return rc;
    if ((rc = json_int(c, "hidden_size", 1, 1 << 14, &m->dim, path, err)) != 0 ||
        (rc = json_int(c, "num_hidden_layers", 1, 256, &m->n_layers, path, err)) != 0 ||
        (rc = json_int(c, "num_attention_heads", 1, 1024, &m->n_heads, path, err)) != 0 ||
        (rc = json_int(c, "intermediate_size", 1, 1 << 16, &m->d_ff, path, err)) != 0 ||
        (rc = json_int(c, "vocab_size", 1, 1 << 22, &m->vocab, path, err)) != 0 ||
        (rc = json_int(c, "max_position_embeddings", 2, 1 << 16, &m->max_pos, path, err)) != 0 ||
        (rc = json_int(c, "type_vocab_size", 1, 1 << 10, &m->n_types, path, err)) != 0)
        goto out;
    const cJSON *eps = cJSON_GetObjectItemCaseSensitive(c, "layer_norm_eps");
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(c, "hidden_act");
    const cJSON *pos = cJSON_GetObjectItemCaseSensitive(c, "position_embedding_type");
    m->eps = cJSON_IsNumber(eps) ? (float)eps->valuedouble : 1e-12f;
    if (!(m->eps > 0 && m->eps < 1)) {
        rc = util_err_set(err, LLMGW_EINVAL, "%s: layer_norm_eps is not in (0, 1)", path);
    } else if (m->dim % m->n_heads != 0) {
        rc = util_err_set(err, LLMGW_EINVAL, "%s: hidden_size %d is not a multiple of "
                          "num_attention_heads %d", path, m->dim, m->n_heads);
    } else if (act != NULL && !(cJSON_IsString(act) && strcmp(act->valuestring, "gelu") == 0)) {
        rc = util_err_set(err, LLMGW_EINVAL, "%s: hidden_act other than \"gelu\" is not "
                          "supported", path);
    } else if (pos != NULL &&
               !(cJSON_IsString(pos) && strcmp(pos->valuestring, "absolute") == 0)) {
        rc = util_err_set(err, LLMGW_EINVAL, "%s: position_embedding_type other than "
                          "\"absolute\" is not supported", path);
    }
    m->head_dim = m->dim / m->n_heads;
out:
    cJSON_Delete(c);
    return rc;
}

/* sentence_bert_config.json, 1_Pooling/config.json and tokenizer_config.json. */
static int load_st_configs(eng_bert *m, const char *dir, util_err *err)
{
    char path[PATH_MAX];
    cJSON *c = NULL;
    int rc;
    snprintf(path, sizeof path, "%s/sentence_bert_config.json", dir);
    if ((rc = read_json(&c, path, err)) != 0)
        return rc;
    rc = json_int(c, "max_seq_length", 2, 1 << 16, &m->max_tokens, path, err);
    cJSON_Delete(c);
    if (rc != 0)
        return rc;
    if (m->max_tokens > m->max_pos)
        m->max_tokens = m->max_pos;
    snprintf(path, sizeof path, "%s/1_Pooling/config.json", dir);
    if ((rc = read_json(&c, path, err)) != 0)
        return rc;
    if (!json_bool(c, "pooling_mode_mean_tokens", false) ||
        json_bool(c, "pooling_mode_cls_token", false) ||
        json_bool(c, "pooling_mode_max_tokens", false) ||
        json_bool(c, "pooling_mode_mean_sqrt_len_tokens", false))
        rc = util_err_set(err, LLMGW_EINVAL, "%s: only mean pooling is supported", path);
    cJSON_Delete(c);
    if (rc != 0)
        return rc;
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    if ((rc = read_json(&c, path, err)) != 0)
        return rc;
    const cJSON *strip = cJSON_GetObjectItemCaseSensitive(c, "strip_accents");
    if (!json_bool(c, "do_lower_case", true) || !json_bool(c, "tokenize_chinese_chars", true) ||
        cJSON_IsFalse(strip))
        rc = util_err_set(err, LLMGW_EINVAL, "%s: only the uncased BERT tokenizer (lower case, "
                          "accents stripped, CJK split) is supported", path);
    cJSON_Delete(c);
    return rc;
}

static float *own(eng_bert *m, size_t n_floats)
{
    float *p = util_xmalloc(n_floats * sizeof *p);
    m->owned = realloc(m->owned, (size_t)(m->n_owned + 1) * sizeof *m->owned);
    if (m->owned == NULL)
        abort();  /* as util_xmalloc does on OOM: a small fixed size */
    m->owned[m->n_owned++] = p;
    return p;
}

static float f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 31, man = h & 0x3ff, bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else {  /* subnormal: normalise */
            int e = -1;
            do {
                e++;
                man <<= 1;
            } while ((man & 0x400) == 0);
            bits = sign | (uint32_t)(112 - e) << 23 | (man & 0x3ff) << 13;
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | man << 13;
    } else {
        bits = sign | (exp + 112) << 23 | man << 13;
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* Copies (converting to F32) tensor t into dst[n]. */
static void to_f32(const eng_st_tensor *t, float *dst, size_t n)
{
    const uint8_t *src = t->data;
    for (size_t i = 0; i < n; i++) {
        uint16_t h;
        uint32_t bits;
        switch (t->dtype) {
        case ENG_ST_DTYPE_F32: memcpy(&dst[i], src + 4 * i, 4); break;
        case ENG_ST_DTYPE_F16: memcpy(&h, src + 2 * i, 2); dst[i] = f16_to_f32(h); break;
        default:  /* BF16 */
            memcpy(&h, src + 2 * i, 2);
            bits = (uint32_t)h << 16;
            memcpy(&dst[i], &bits, 4);
            break;
        }
    }
}

typedef struct loader {
    eng_bert *m;
    const char *prefix;  /* "" or "bert." */
    util_err *err;
} loader;

/* The weight called prefix + name with shape [rows][cols] (rows 0: a vector of cols), as F32:
 * in place when possible, otherwise converted into dst (or a new owned buffer when dst is NULL). */
static int weight(loader *ld, const char *name, int rows, int cols, float *dst, const float **out)
{
    char full[256];
    snprintf(full, sizeof full, "%s%s", ld->prefix, name);
    const eng_st_tensor *t = eng_safetensors_find(ld->m->st, full);
    const char *path = eng_safetensors_path(ld->m->st);
    if (t == NULL)
        return util_err_set(ld->err, LLMGW_EINVAL, "%s: tensor '%s' is missing", path, full);
    bool shape_ok = rows == 0 ? t->n_dims == 1 && t->shape[0] == (uint64_t)cols
                              : t->n_dims == 2 && t->shape[0] == (uint64_t)rows &&
                                    t->shape[1] == (uint64_t)cols;
    if (!shape_ok)
        return util_err_set(ld->err, LLMGW_EINVAL, "%s: tensor '%s' does not have shape [%d%s%d]"
                            " (config.json)", path, full, rows ? rows : cols, rows ? ", " : "",
                            rows ? cols : 0);
    if (t->dtype != ENG_ST_DTYPE_F32 && t->dtype != ENG_ST_DTYPE_F16 &&
        t->dtype != ENG_ST_DTYPE_BF16)
        return util_err_set(ld->err, LLMGW_EINVAL, "%s: tensor '%s' has dtype %s (F32, F16 or "
                            "BF16 expected)", path, full, eng_st_dtype_name(t->dtype));
    size_t n = (size_t)(rows ? rows : 1) * (size_t)cols;
    if (dst == NULL && t->dtype == ENG_ST_DTYPE_F32 && ((uintptr_t)t->data & 3) == 0) {
        *out = t->data;
        return 0;
    }
    if (dst == NULL)
        dst = own(ld->m, n);
    to_f32(t, dst, n);
    *out = dst;
    return 0;
}

static int load_weights(eng_bert *m, eng_bert_precision precision, util_err *err)
{
    loader ld = {.m = m, .prefix = "", .err = err};
    if (eng_safetensors_find(m->st, "embeddings.word_embeddings.weight") == NULL &&
        eng_safetensors_find(m->st, "bert.embeddings.word_embeddings.weight") != NULL)
        ld.prefix = "bert.";
    const int H = m->dim, F = m->d_ff;
    int rc;
    const float *ignored;
    if ((rc = weight(&ld, "embeddings.word_embeddings.weight", m->vocab, H, NULL,
                     &m->tok_emb)) != 0 ||
        (rc = weight(&ld, "embeddings.position_embeddings.weight", m->max_pos, H, NULL,
                     &m->pos_emb)) != 0 ||
        (rc = weight(&ld, "embeddings.token_type_embeddings.weight", m->n_types, H, NULL,
                     &m->type_emb)) != 0 ||
        (rc = weight(&ld, "embeddings.LayerNorm.weight", 0, H, NULL, &m->emb_ln_w)) != 0 ||
        (rc = weight(&ld, "embeddings.LayerNorm.bias", 0, H, NULL, &m->emb_ln_b)) != 0)
        return rc;
    m->layers = util_xcalloc((size_t)m->n_layers, sizeof *m->layers);
    for (int l = 0; l < m->n_layers; l++) {
        eng__bert_layer *L = &m->layers[l];
        char n[128];
        static const char *const QKV[3] = {"query", "key", "value"};
        float *wqkv = own(m, (size_t)3 * H * H), *bqkv = own(m, (size_t)3 * H);
        for (int i = 0; i < 3; i++) {
            snprintf(n, sizeof n, "encoder.layer.%d.attention.self.%s.weight", l, QKV[i]);
            if ((rc = weight(&ld, n, H, H, wqkv + (size_t)i * H * H, &ignored)) != 0)
                return rc;
            snprintf(n, sizeof n, "encoder.layer.%d.attention.self.%s.bias", l, QKV[i]);
            if ((rc = weight(&ld, n, 0, H, bqkv + (size_t)i * H, &ignored)) != 0)
                return rc;
        }
        L->wqkv = wqkv;
        L->bqkv = bqkv;
        const struct {
            const char *suffix;
            int rows, cols;
            const float **dst;
        } rest[] = {
            {"attention.output.dense.weight", H, H, &L->wo},
            {"attention.output.dense.bias", 0, H, &L->bo},
            {"attention.output.LayerNorm.weight", 0, H, &L->ln1_w},
            {"attention.output.LayerNorm.bias", 0, H, &L->ln1_b},
            {"intermediate.dense.weight", F, H, &L->w1},
            {"intermediate.dense.bias", 0, F, &L->b1},
            {"output.dense.weight", H, F, &L->w2},
            {"output.dense.bias", 0, H, &L->b2},
            {"output.LayerNorm.weight", 0, H, &L->ln2_w},
            {"output.LayerNorm.bias", 0, H, &L->ln2_b},
        };
        for (size_t i = 0; i < sizeof rest / sizeof rest[0]; i++) {
            snprintf(n, sizeof n, "encoder.layer.%d.%s", l, rest[i].suffix);
            if ((rc = weight(&ld, n, rest[i].rows, rest[i].cols, NULL, rest[i].dst)) != 0)
                return rc;
        }
        const int prec = precision == ENG_BERT_AUTO   ? KERN_DENSE_AUTO
                         : precision == ENG_BERT_BF16 ? KERN_DENSE_BF16
                                                      : KERN_DENSE_F32;
        L->qkv = m->be->dense_new(m->be->ctx, L->wqkv, L->bqkv, 3 * H, H, prec);
        L->o = m->be->dense_new(m->be->ctx, L->wo, L->bo, H, H, prec);
        L->ff1 = m->be->dense_new(m->be->ctx, L->w1, L->b1, F, H, prec);
        L->ff2 = m->be->dense_new(m->be->ctx, L->w2, L->b2, H, F, prec);
        const float *ln[4] = {L->ln1_w, L->ln1_b, L->ln2_w, L->ln2_b};
        bool placed = true;
        for (int i = 0; i < 4; i++)
            placed &= (L->ln_at[i] = kern_backend_place(m->be, ln[i], (size_t)H * 4)) != NULL;
        if (L->qkv == NULL || L->o == NULL || L->ff1 == NULL || L->ff2 == NULL || !placed)
            return util_err_set(err, LLMGW_ENOMEM, "bert: out of memory for layer %d's weights",
                                l);
    }
    const float *emb_ln[2] = {m->emb_ln_w, m->emb_ln_b};
    for (int i = 0; i < 2; i++)
        if ((m->emb_ln_at[i] = kern_backend_place(m->be, emb_ln[i], (size_t)H * 4)) == NULL)
            return util_err_set(err, LLMGW_ENOMEM, "bert: out of memory for the embeddings");
    const float *emb[3] = {m->tok_emb, m->pos_emb, m->type_emb};
    const int emb_rows[3] = {m->vocab, m->max_pos, m->n_types};
    for (int i = 0; i < 3; i++) {
        size_t bytes = (size_t)emb_rows[i] * (size_t)H * 4;
        m->emb_at[i] = (kern_tensor){.type = KERN_TYPE_F32, .rows = emb_rows[i], .cols = H,
                                     .row_bytes = (size_t)H * 4,
                                     .data = kern_backend_place(m->be, emb[i], bytes)};
        if (m->emb_at[i].data == NULL)
            return util_err_set(err, LLMGW_ENOMEM, "bert: out of memory for the embeddings");
    }
    /* AUTO asks for BF16; the backend says what it computes in (all layers alike). */
    const kern_dense *d0 = m->n_layers > 0 ? m->layers[0].qkv : NULL;
    m->precision = d0 != NULL && d0->bf16 ? "bf16" : d0 != NULL && d0->tf32 ? "tf32" : "f32";
    return 0;
}

int eng_bert_load(eng_bert **out, const char *model_dir, const char *device,
                  eng_bert_precision precision, util_err *err)
{
    char path[PATH_MAX];
    eng_bert *m = util_xcalloc(1, sizeof *m);
    int rc;
    *out = NULL;
    if ((rc = load_config(m, model_dir, err)) != 0 ||
        (rc = load_st_configs(m, model_dir, err)) != 0)
        goto fail;
    snprintf(path, sizeof path, "%s/vocab.txt", model_dir);
    if ((rc = eng_wordpiece_load(&m->wp, path, err)) != 0)
        goto fail;
    if (eng_wordpiece_n_vocab(m->wp) > m->vocab) {
        rc = util_err_set(err, LLMGW_EINVAL, "%s: %d tokens but config.json has vocab_size %d",
                          path, eng_wordpiece_n_vocab(m->wp), m->vocab);
        goto fail;
    }
    snprintf(path, sizeof path, "%s/model.safetensors", model_dir);
    m->device = util_xstrdup(device != NULL ? device : "auto");
    if ((rc = kern_backend_open(m->device, 1, &m->be, err)) != 0)
        goto fail;
    if ((rc = eng_safetensors_open(&m->st, path, err)) != 0 ||
        (rc = load_weights(m, precision, err)) != 0)
        goto fail;
    *out = m;
    return 0;
fail:
    eng_bert_free(m);
    return rc;
}

void eng_bert_free(eng_bert *m)
{
    if (m == NULL)
        return;
    for (int l = 0; m->layers != NULL && l < m->n_layers; l++) {
        eng__bert_layer *L = &m->layers[l];
        m->be->dense_free(m->be->ctx, L->qkv);
        m->be->dense_free(m->be->ctx, L->o);
        m->be->dense_free(m->be->ctx, L->ff1);
        m->be->dense_free(m->be->ctx, L->ff2);
        const float *ln[4] = {L->ln1_w, L->ln1_b, L->ln2_w, L->ln2_b};
        for (int i = 0; i < 4; i++)
            kern_backend_unplace(m->be, L->ln_at[i], ln[i], (size_t)m->dim * 4);
    }
    const float *emb_ln[2] = {m->emb_ln_w, m->emb_ln_b};
    for (int i = 0; m->be != NULL && i < 2; i++)
        kern_backend_unplace(m->be, m->emb_ln_at[i], emb_ln[i], (size_t)m->dim * 4);
    const float *emb[3] = {m->tok_emb, m->pos_emb, m->type_emb};
    for (int i = 0; m->be != NULL && i < 3; i++)
        kern_backend_unplace(m->be, m->emb_at[i].data, emb[i],
                             (size_t)m->emb_at[i].rows * m->emb_at[i].row_bytes);
    kern_backend_free(m->be);
    free(m->device);
    for (int i = 0; i < m->n_owned; i++)
        free(m->owned[i]);
    free(m->owned);
    free(m->layers);
    eng_wordpiece_free(m->wp);
    eng_safetensors_free(m->st);
    free(m);
}

int eng_bert_dim(const eng_bert *m) { return m->dim; }
const char *eng_bert_precision_name(const eng_bert *m) { return m->precision; }
int eng_bert_max_tokens(const eng_bert *m) { return m->max_tokens; }

int eng_bert_tokenize(const eng_bert *m, const char *text, size_t len, int32_t *ids, int cap)
{
    return eng_wordpiece_encode(m->wp, text, len, m->max_tokens, ids, cap);
}

bool eng_bert_fits(const eng_bert *m, const char *text, size_t len)
{
    return eng_wordpiece_encode(m->wp, text, len, m->max_tokens + 1, NULL, 0) <= m->max_tokens;
}
