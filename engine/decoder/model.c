/* engine/decoder/model.c: loading a llama/qwen2 GGUF and its batched forward pass. */
#include "engine/decoder/model.h"

#include "common/arena.h"
#include "kernels/convert.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Per caller: the activations, in the backend's buffers, and the model's weights as that
 * backend reads them (the mmap itself on the CPU, copies in device memory on a GPU). */
struct eng_work {
    const kern_backend *be;
    int max_tok, max_logits;
    float *x;      /* [max_tok][n_embd] the residual stream */
    float *xb;     /* [max_tok][n_embd] */
    float *q;      /* [max_tok][n_head * head_dim] */
    float *k, *v;  /* [max_tok][n_kv_head * head_dim] */
    float *att;    /* [max_tok][n_head * head_dim] */
    float *hb;     /* [max_tok][n_ff] */
    float *hb2;    /* [max_tok][n_ff] */
    float *xl;     /* [max_logits][n_embd] the rows that produce logits */
    float *logits; /* [max_logits][n_vocab] off the host (copied out), else NULL */
    size_t bytes[10];               /* of the ten buffers above, for buffer_free */
    /* The weights where the backend reads them. */
    eng_layer *layers;              /* [n_layer] */
    kern_tensor tok_embd, output;
    const float *output_norm, *rope_freqs;
    struct placed { const void *host, *at; size_t n; } *placed;
    int n_placed;
    kern_tensor **repacked;         /* the backend's draft copies among the above (repack) */
    int n_repacked;
    kern_seq *seqs;                 /* [max_tok] a step's sequences as the backend takes them */
};

typedef struct loader {
    eng_model *m;
    util_err *err;
} loader;

static int fail(loader *l, const char *fmt, const char *a, const char *b)
{
    char what[200];
    snprintf(what, sizeof what, fmt, a, b);
    return util_err_set(l->err, LLMGW_EINVAL, "%s: %s", l->m->path, what);
}

static int hparam(loader *l, const char *arch, const char *name, uint32_t *out, bool required)
{
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, name);
    int rc = eng_gguf_get_u32(l->m->gguf, key, out, l->err);
    if (rc == LLMGW_ENOTFOUND && !required)
        return 0;
    return rc;
}

/* A weight matrix named `name` of shape [cols, rows] (GGUF order). */
static int matrix(loader *l, const char *name, int64_t cols, int64_t rows, kern_tensor *out)
{
    const eng_gguf_tensor *t = eng_gguf_tensor_find(l->m->gguf, name);
    char dims[64];
    if (t == NULL)
        return fail(l, "tensor '%s' is missing%s", name, "");
    if (t->n_dims != 2 || (int64_t)t->ne[0] != cols || (int64_t)t->ne[1] != rows) {
        snprintf(dims, sizeof dims, "[%lld, %lld]", (long long)cols, (long long)rows);
        return fail(l, "tensor '%s' does not have the expected shape %s", name, dims);
    }
    if (kern_type_get(t->type) == NULL)    /* gguf.c admits known types only */
        return fail(l, "tensor '%s' has an unknown weight type%s", name, "");
    if (t->type < 64)
        l->m->weight_types |= 1ull << t->type;
    *out = (kern_tensor){.type = t->type, .rows = rows, .cols = cols,
                         .row_bytes = kern_type_row_bytes(t->type, (uint64_t)cols),
                         .data = t->data};
    return 0;
}

/* A vector of n floats (norm weights, biases); converted to f32 when stored otherwise. */
static int vector(loader *l, const char *name, int64_t n, bool required, const float **out)
{
    const eng_gguf_tensor *t = eng_gguf_tensor_find(l->m->gguf, name);
    *out = NULL;
    if (t == NULL)
        return required ? fail(l, "tensor '%s' is missing%s", name, "") : 0;
    uint64_t elems = t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
    if ((int64_t)elems != n)
        return fail(l, "tensor '%s' does not have the expected length%s", name, "");
    if (t->type == KERN_TYPE_F32) {
        *out = t->data;
        return 0;
    }
    float *f = util_xmalloc((size_t)n * sizeof *f);
    if (kern_type_to_f32(t->type, t->data, f, n) != 0) {
        free(f);
        return fail(l, "tensor '%s' has an unsupported type%s", name, "");
    }
    eng_model *m = l->m;
    m->owned = realloc(m->owned, (m->n_owned + 1) * sizeof *m->owned);
    m->owned[m->n_owned++] = f;
    *out = f;
    return 0;
}

/* The built-in system prompt of a ChatML template, e.g. SmolLM2's
 * '<|im_start|>system\nYou are a helpful AI assistant named SmolLM...<|im_end|>\n'. */
static char *template_default_system(eng_gguf_str tpl)
{
    static const char *opens[] = {"<|im_start|>system\\n", "<|im_start|>system\n"};
    for (size_t i = 0; i < 2; i++) {
        size_t ol = strlen(opens[i]);
        for (const char *p = tpl.ptr; p + ol <= tpl.ptr + tpl.len; p++) {
            if (memcmp(p, opens[i], ol) != 0)
                continue;
            const char *s = p + ol, *e = s;
            while (e + 10 <= tpl.ptr + tpl.len && memcmp(e, "<|im_end|>", 10) != 0)
                e++;
            /* A Jinja expression there means the system text comes from the messages. */
            if (e + 10 > tpl.ptr + tpl.len || memchr(s, '{', (size_t)(e - s)) ||
                memchr(s, '\'', (size_t)(e - s)))
                continue;
            return util_xstrndup(s, (size_t)(e - s));
        }
    }
    return NULL;
}

static int load_hparams(loader *l, const char *arch)
{
    eng_model *m = l->m;
    eng_hparams *hp = &m->hp;
    uint32_t v = 0, n_embd = 0, n_layer = 0, n_head = 0, n_kv = 0, n_ff = 0, ctx = 0;
    int rc;
    if ((rc = hparam(l, arch, "embedding_length", &n_embd, true)) ||
        (rc = hparam(l, arch, "block_count", &n_layer, true)) ||
        (rc = hparam(l, arch, "attention.head_count", &n_head, true)) ||
        (rc = hparam(l, arch, "feed_forward_length", &n_ff, true)) ||
        (rc = hparam(l, arch, "context_length", &ctx, true)))
        return rc;
    n_kv = n_head;
    if ((rc = hparam(l, arch, "attention.head_count_kv", &n_kv, false)))
        return rc;
    if (n_embd == 0 || n_embd > 65536 || n_layer == 0 || n_layer > 1024 || n_head == 0 ||
        n_head > 1024 || n_kv == 0 || n_head % n_kv != 0 || n_embd % n_head != 0 || n_ff == 0 ||
        n_ff > 1 << 20 || ctx == 0)
        return fail(l, "implausible hyper-parameters%s%s", "", "");
    hp->n_embd = (int)n_embd;
    hp->n_layer = (int)n_layer;
    hp->n_head = (int)n_head;
    hp->n_kv_head = (int)n_kv;
    hp->n_ff = (int)n_ff;
    hp->n_ctx_train = (int)ctx;
    hp->head_dim = (int)(n_embd / n_head);
    if ((rc = hparam(l, arch, "rope.dimension_count", &v, false)))
        return rc;
    if (v != 0 && (int)v != hp->head_dim)
        return fail(l, "partial RoPE (rope.dimension_count != head size) is not supported%s%s",
                    "", "");
    char key[128];
    hp->rms_eps = 1e-5f;
    hp->rope_base = 10000.0f;
    hp->rope_freq_scale = 1.0f;
    snprintf(key, sizeof key, "%s.attention.layer_norm_rms_epsilon", arch);
    if ((rc = eng_gguf_get_f32(m->gguf, key, &hp->rms_eps, l->err)) && rc != LLMGW_ENOTFOUND)
        return rc;
    snprintf(key, sizeof key, "%s.rope.freq_base", arch);
    if ((rc = eng_gguf_get_f32(m->gguf, key, &hp->rope_base, l->err)) && rc != LLMGW_ENOTFOUND)
        return rc;
    eng_gguf_str scaling;
    snprintf(key, sizeof key, "%s.rope.scaling.type", arch);
    if (eng_gguf_get_str(m->gguf, key, &scaling, NULL) == 0 && !eng_gguf_str_eq(scaling, "none")) {
        float factor = 1.0f;
        snprintf(key, sizeof key, "%s.rope.scaling.factor", arch);
        if (!eng_gguf_str_eq(scaling, "linear") ||
            eng_gguf_get_f32(m->gguf, key, &factor, NULL) != 0 || !(factor >= 1.0f))
            return fail(l, "RoPE scaling other than linear is not supported yet%s%s", "", "");
        hp->rope_freq_scale = 1.0f / factor;
    }
    hp->rope_neox = m->arch == ENG_ARCH_QWEN2;
    return 0;
}

/* Llama-3.1's per-frequency RoPE factors (llama3 rope scaling baked into the file): optional,
 * F32 [head_dim/2], each a finite divisor > 0 of its pair's angle. */
static int load_rope_freqs(loader *l)
{
    eng_model *m = l->m;
    const char *name = "rope_freqs.weight";
    const eng_gguf_tensor *t = eng_gguf_tensor_find(m->gguf, name);
    char dims[64];
    m->rope_freqs = NULL;
    if (t == NULL)
        return 0;
    if (m->arch != ENG_ARCH_LLAMA)
        return fail(l, "tensor '%s' (per-frequency RoPE factors) is only supported for llama%s",
                    name, "");
    int64_t n = m->hp.head_dim / 2;
    if (t->type != KERN_TYPE_F32)
        return fail(l, "tensor '%s' must be F32, it is %s", name, kern_type_name(t->type));
    if (t->n_dims != 1 || (int64_t)t->ne[0] != n) {
        snprintf(dims, sizeof dims, "[%lld] (head size / 2)", (long long)n);
        return fail(l, "tensor '%s' does not have the expected shape %s", name, dims);
    }
    const float *f = t->data;
    for (int64_t i = 0; i < n; i++)
        if (!(f[i] > 0.0f) || !isfinite(f[i]))
            return fail(l, "tensor '%s' holds a factor that is not a finite number > 0%s", name,
                        "");
    m->rope_freqs = f;
    return 0;
}

static int load_tensors(loader *l)
{
    eng_model *m = l->m;
    const eng_hparams *hp = &m->hp;
    int64_t E = hp->n_embd, Q = (int64_t)hp->n_head * hp->head_dim;
    int64_t KV = (int64_t)hp->n_kv_head * hp->head_dim, F = hp->n_ff;
    const eng_gguf_tensor *emb = eng_gguf_tensor_find(m->gguf, "token_embd.weight");
    int rc;
    if (emb == NULL)
        return fail(l, "tensor '%s' is missing%s", "token_embd.weight", "");
    hp = &m->hp;
    m->hp.n_vocab = (int)emb->ne[1];
    if ((rc = matrix(l, "token_embd.weight", E, hp->n_vocab, &m->tok_embd)) ||
        (rc = vector(l, "output_norm.weight", E, true, &m->output_norm)))
        return rc;
    if (eng_gguf_tensor_find(m->gguf, "output.weight") != NULL) {
        if ((rc = matrix(l, "output.weight", E, hp->n_vocab, &m->output)))
            return rc;
    } else {
        m->output = m->tok_embd;  /* tied embeddings */
    }
    m->layers = util_xcalloc((size_t)hp->n_layer, sizeof *m->layers);
    for (int i = 0; i < hp->n_layer; i++) {
        eng_layer *L = &m->layers[i];
        char n[13][64];
        static const char *names[] = {"attn_norm.weight", "attn_q.weight", "attn_k.weight",
                                      "attn_v.weight", "attn_output.weight", "ffn_norm.weight",
                                      "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight",
                                      "attn_q.bias", "attn_k.bias", "attn_v.bias"};
        for (int j = 0; j < 12; j++)
            snprintf(n[j], sizeof n[j], "blk.%d.%s", i, names[j]);
        bool bias = m->arch == ENG_ARCH_QWEN2;
        if ((rc = vector(l, n[0], E, true, &L->attn_norm)) ||
            (rc = matrix(l, n[1], E, Q, &L->wq)) || (rc = matrix(l, n[2], E, KV, &L->wk)) ||
            (rc = matrix(l, n[3], E, KV, &L->wv)) || (rc = matrix(l, n[4], Q, E, &L->wo)) ||
            (rc = vector(l, n[5], E, true, &L->ffn_norm)) ||
            (rc = matrix(l, n[6], E, F, &L->w_gate)) || (rc = matrix(l, n[7], E, F, &L->w_up)) ||
            (rc = matrix(l, n[8], F, E, &L->w_down)) ||
            (rc = vector(l, n[9], Q, bias, &L->bq)) || (rc = vector(l, n[10], KV, bias, &L->bk)) ||
            (rc = vector(l, n[11], KV, bias, &L->bv)))
            return rc;
    }
    m->kv_bytes_per_token = (size_t)hp->n_layer * 2 * (size_t)KV * 2;
    return load_rope_freqs(l);
}

int eng_model_load(eng_model **out, const char *path, const char *chat_override, util_err *err)
{
    eng_model *m = util_xcalloc(1, sizeof *m);
    loader l = {.m = m, .err = err};
    eng_gguf_str arch, tpl;
    char arch_name[32];
    int rc;
    m->path = util_xstrdup(path);
    if ((rc = eng_gguf_open(&m->gguf, path, err)) != 0)
        goto fail;
    if ((rc = eng_gguf_get_str(m->gguf, "general.architecture", &arch, err)) != 0)
        goto fail;
    if (eng_gguf_str_eq(arch, "llama")) {
        m->arch = ENG_ARCH_LLAMA;
    } else if (eng_gguf_str_eq(arch, "qwen2")) {
        m->arch = ENG_ARCH_QWEN2;
    } else {
        snprintf(arch_name, sizeof arch_name, "%.*s", (int)(arch.len > 24 ? 24 : arch.len),
                 arch.ptr);
        rc = fail(&l, "architecture '%s' is not supported (llama, qwen2)%s", arch_name, "");
        goto fail;
    }
    snprintf(arch_name, sizeof arch_name, "%s", m->arch == ENG_ARCH_LLAMA ? "llama" : "qwen2");
    if ((rc = load_hparams(&l, arch_name)) != 0 || (rc = load_tensors(&l)) != 0)
        goto fail;
    if ((rc = eng_tokenizer_load(&m->tok, m->gguf, err)) != 0)
        goto fail;
    if (eng_tokenizer_n_vocab(m->tok) > m->hp.n_vocab) {
        rc = fail(&l, "the vocabulary is larger than the embedding matrix%s%s", "", "");
        goto fail;
    }
    if (chat_override != NULL) {
        if ((rc = eng_chat_from_name(chat_override, &m->chat, err)) != 0)
            goto fail;
        m->has_chat = true;
    } else if (eng_gguf_get_str(m->gguf, "tokenizer.chat_template", &tpl, NULL) == 0) {
        m->has_chat = eng_chat_detect(tpl.ptr, (size_t)tpl.len, &m->chat, NULL) == 0;
        if (m->has_chat && m->chat == ENG_CHAT_CHATML)
            m->default_system = template_default_system(tpl);
    }
    *out = m;
    return 0;
fail:
    eng_model_free(m);
    return rc;
}

int eng_model_check_backend(const eng_model *m, const kern_backend *be, util_err *err)
{
    for (uint32_t t = 0; t < 64; t++)
        if ((m->weight_types >> t & 1) && !be->supports_type(be->ctx, t))
            return util_err_set(err, LLMGW_EINVAL, "%s: backend %s does not compute with %s "
                                "weights", m->path, be->name, kern_type_name(t));
    return 0;
}

void eng_model_free(eng_model *m)
{
    if (m == NULL)
        return;
    eng_tokenizer_free(m->tok);
    eng_gguf_close(m->gguf);
    for (size_t i = 0; i < m->n_owned; i++)
        free(m->owned[i]);
    free(m->owned);
    free(m->layers);
    free(m->default_system);
    free(m->path);
    free(m);
}

/* The cosine of row r of a and b (same shape), or -2 when a type cannot be read. */
static double row_cosine(const kern_tensor *a, const kern_tensor *b, int64_t r, float *buf)
{
    float *x = buf, *y = buf + a->cols;
    if (kern_type_to_f32(a->type, (const uint8_t *)a->data + (size_t)r * a->row_bytes, x,
                         a->cols) != 0 ||
        kern_type_to_f32(b->type, (const uint8_t *)b->data + (size_t)r * b->row_bytes, y,
                         b->cols) != 0)
        return -2;
    double xy = 0, xx = 0, yy = 0;
    for (int64_t i = 0; i < a->cols; i++) {
        xy += (double)x[i] * y[i];
        xx += (double)x[i] * x[i];
        yy += (double)y[i] * y[i];
    }
    return xx > 0 && yy > 0 ? xy / sqrt(xx * yy) : (xx == yy ? 1 : 0);
}

/* Whether SAME_ROWS rows spread over a and b agree to SAME_COSINE. */
#define SAME_ROWS 8
#define SAME_COSINE 0.98
static bool rows_agree(const kern_tensor *a, const kern_tensor *b)
{
    if (a->rows != b->rows || a->cols != b->cols)
        return false;
    float *buf = util_xmalloc(2 * (size_t)a->cols * sizeof *buf);
    bool ok = true;
    for (int i = 0; i < SAME_ROWS && ok; i++)
        ok = row_cosine(a, b, (a->rows - 1) * i / (SAME_ROWS - 1), buf) >= SAME_COSINE;
    free(buf);
    return ok;
}

bool eng_model_same_weights(const eng_model *a, const eng_model *b)
{
    const eng_hparams *x = &a->hp, *y = &b->hp;
    if (a->arch != b->arch || x->n_vocab != y->n_vocab || x->n_embd != y->n_embd ||
        x->n_layer != y->n_layer || x->n_head != y->n_head || x->n_kv_head != y->n_kv_head ||
        x->head_dim != y->head_dim || x->n_ff != y->n_ff || x->rope_base != y->rope_base ||
        x->rope_freq_scale != y->rope_freq_scale || x->rope_neox != y->rope_neox ||
        (a->rope_freqs == NULL) != (b->rope_freqs == NULL))
        return false;
    if (!rows_agree(&a->tok_embd, &b->tok_embd))
        return false;
    int probe[3] = {0, x->n_layer / 2, x->n_layer - 1};
    for (int i = 0; i < 3; i++) {
        const eng_layer *la = &a->layers[probe[i]], *lb = &b->layers[probe[i]];
        if (!rows_agree(&la->wk, &lb->wk) || !rows_agree(&la->wv, &lb->wv))
            return false;
    }
    return true;
}

int eng_model_kv_layout(const eng_model *m, int type, int k_group, bool rotate,
                        size_t page_bytes, eng_kv_layout *out, util_err *err)
{
    int d = m->hp.head_dim;
    if (type != KERN_KV_F16 && type != KERN_KV_Q8)
        return util_err_set(err, LLMGW_EINVAL, "unknown KV type %d", type);
    if (k_group <= 0 || type != KERN_KV_Q8)
        k_group = d;
    if (d % k_group != 0)
        return util_err_set(err, LLMGW_EINVAL, "a K scale group of %d does not divide the "
                            "head size %d of %s", k_group, d, m->path);
    /* The rotation needs a head size that is a power of two (up to 256): else rows stay as
     * they are. */
    rotate = rotate && type == KERN_KV_Q8 && d <= 256 && (d & (d - 1)) == 0;
    eng_kv_layout l = {.type = type, .k_group = k_group, .rotate = rotate,
                       .k_row = kern_kv_row_bytes(type, d, k_group),
                       .v_row = kern_kv_row_bytes(type, d, d)};
    l.bytes_per_token = (size_t)m->hp.n_layer * (size_t)m->hp.n_kv_head * (l.k_row + l.v_row);
    size_t n = page_bytes / l.bytes_per_token;
    l.page_tokens = n > (size_t)1 << 20 ? 1 << 20 : (int)n;
    *out = l;
    return 0;
}

int eng_kv_parse(const char *name, int *type, int *k_group, bool *rotate)
{
    if (name == NULL)
        return LLMGW_EINVAL;
    *k_group = 0;
    *rotate = false;
    if (strcmp(name, "f16") == 0) {
        *type = KERN_KV_F16;
        return 0;
    }
    if (strncmp(name, "q8", 2) != 0)
        return LLMGW_EINVAL;
    *type = KERN_KV_Q8;
    const char *p = name + 2;
    *rotate = *p != 'n';
    if (*p == 'n')
        p++;
    if (*p == '\0')
        return 0;
    char *end;
    long g = *p == '/' && p[1] >= '1' && p[1] <= '9' ? strtol(p + 1, &end, 10) : 0;
    if (g <= 0 || g > 4096 || *end != '\0')
        return LLMGW_EINVAL;
    *k_group = (int)g;
    return 0;
}

const char *eng_kv_name(const eng_kv_layout *l, int head_dim, char *buf, size_t cap)
{
    if (l->type != KERN_KV_Q8)
        snprintf(buf, cap, "f16");
    else if (l->k_group != head_dim)
        snprintf(buf, cap, "q8%s/%d", l->rotate ? "" : "n", l->k_group);
    else
        snprintf(buf, cap, "q8%s", l->rotate ? "" : "n");
    return buf;
}

/* Where w->be reads n bytes of host data: placed once (a tied output matrix shares its
 * embedding's copy). NULL without device memory. */
static const void *place(eng_work *w, const void *host, size_t n)
{
    if (host == NULL)
        return NULL;
    for (int i = 0; i < w->n_placed; i++)
        if (w->placed[i].host == host)
            return w->placed[i].at;
    const void *at = kern_backend_place(w->be, host, n);
    if (at == NULL)
        return NULL;
    w->placed[w->n_placed++] = (struct placed){host, at, n};
    return at;
}

static bool place_tensor(eng_work *w, kern_tensor *dst, const kern_tensor *src)
{
    *dst = *src;
    dst->data = place(w, src->data, (size_t)src->rows * src->row_bytes);
    return dst->data != NULL;
}

/* A draft model's matrix: the backend's draft copy (kernels/backend.h repack) where it has one,
 * else placed as it is. */
static bool place_matrix(eng_work *w, kern_tensor *dst, const kern_tensor *src, bool draft)
{
    if (draft && w->be->repack != NULL && w->be->repack(w->be->ctx, src, dst)) {
        w->repacked[w->n_repacked++] = dst;
        return true;
    }
    return place_tensor(w, dst, src);
}

static bool place_vector(eng_work *w, const float **dst, const float *src, int64_t n)
{
    *dst = place(w, src, (size_t)n * sizeof(float));
    return src == NULL || *dst != NULL;
}

static bool place_weights(eng_work *w, const eng_model *m, bool draft)
{
    const eng_hparams *hp = &m->hp;
    int64_t E = hp->n_embd, Q = (int64_t)hp->n_head * hp->head_dim;
    int64_t KV = (int64_t)hp->n_kv_head * hp->head_dim;
    w->layers = util_xcalloc((size_t)hp->n_layer, sizeof *w->layers);
    w->placed = util_xcalloc(4 + 12 * (size_t)hp->n_layer, sizeof *w->placed);
    w->repacked = util_xcalloc(1 + 7 * (size_t)hp->n_layer, sizeof *w->repacked);
    bool ok = place_tensor(w, &w->tok_embd, &m->tok_embd) &&
              place_matrix(w, &w->output, &m->output, draft) &&
              place_vector(w, &w->output_norm, m->output_norm, E) &&
              place_vector(w, &w->rope_freqs, m->rope_freqs, hp->head_dim / 2);
    for (int l = 0; ok && l < hp->n_layer; l++) {
        const eng_layer *s = &m->layers[l];
        eng_layer *d = &w->layers[l];
        ok = place_vector(w, &d->attn_norm, s->attn_norm, E) &&
             place_matrix(w, &d->wq, &s->wq, draft) &&
             place_matrix(w, &d->wk, &s->wk, draft) &&
             place_matrix(w, &d->wv, &s->wv, draft) &&
             place_matrix(w, &d->wo, &s->wo, draft) &&
             place_vector(w, &d->bq, s->bq, Q) && place_vector(w, &d->bk, s->bk, KV) &&
             place_vector(w, &d->bv, s->bv, KV) &&
             place_vector(w, &d->ffn_norm, s->ffn_norm, E) &&
             place_matrix(w, &d->w_gate, &s->w_gate, draft) &&
             place_matrix(w, &d->w_up, &s->w_up, draft) &&
             place_matrix(w, &d->w_down, &s->w_down, draft);
    }
    return ok;
}

eng_work *eng_work_new(const eng_model *m, const kern_backend *be, int max_tok, int max_logits,
                       int max_ctx, bool draft)
{
    const eng_hparams *hp = &m->hp;
    size_t T = (size_t)max_tok, E = (size_t)hp->n_embd;
    size_t Q = (size_t)hp->n_head * (size_t)hp->head_dim;
    size_t KV = (size_t)hp->n_kv_head * (size_t)hp->head_dim, F = (size_t)hp->n_ff;
    size_t L = (size_t)max_logits;
    eng_work *w = util_xcalloc(1, sizeof *w);
    w->be = be;
    w->max_tok = max_tok;
    w->max_logits = max_logits;
    w->seqs = util_xcalloc((size_t)max_tok, sizeof *w->seqs);
    float **bufs[10] = {&w->x, &w->xb, &w->q, &w->k, &w->v, &w->att, &w->hb, &w->hb2, &w->xl,
                        &w->logits};
    size_t floats[10] = {T * E, T * E, T * Q, T * KV, T * KV, T * Q, T * F, T * F, L * E,
                         be->host_memory ? 0 : L * (size_t)hp->n_vocab};
    bool ok = true;
    for (int i = 0; i < 10 && ok; i++) {
        w->bytes[i] = floats[i] * sizeof(float);
        if (w->bytes[i] > 0)
            ok = (*bufs[i] = be->buffer_alloc(be->ctx, w->bytes[i])) != NULL;
    }
    ok = ok && place_weights(w, m, draft);
    int64_t cols = hp->n_ff > hp->n_embd ? hp->n_ff : hp->n_embd;
    if ((int64_t)Q > cols)
        cols = (int64_t)Q;
    int rows = max_tok > max_logits ? max_tok : max_logits;
    if (!ok || be->reserve(be->ctx, rows, cols, max_ctx) != 0) {
        eng_work_free(w);
        return NULL;
    }
    return w;
}

void eng_work_free(eng_work *w)
{
    if (w == NULL)
        return;
    float *bufs[10] = {w->x, w->xb, w->q, w->k, w->v, w->att, w->hb, w->hb2, w->xl, w->logits};
    for (int i = 0; i < 10; i++)
        if (bufs[i] != NULL)
            w->be->buffer_free(w->be->ctx, bufs[i], w->bytes[i]);
    for (int i = 0; i < w->n_placed; i++)
        kern_backend_unplace(w->be, w->placed[i].at, w->placed[i].host, w->placed[i].n);
    for (int i = 0; i < w->n_repacked; i++)
        w->be->repack_free(w->be->ctx, w->repacked[i]);
    free(w->placed);
    free(w->repacked);
    free(w->seqs);
    free(w->layers);
    free(w);
}

/* LLMGW_DUMP=<dir> (a debugging aid, off by default): every forward writes its intermediate
 * tensors to <dir>/s<call>_<name>.f32 (int32 ne0..ne3 and a zero, then f32 data), named as
 * llama.cpp's graph names them (attn_norm-0, Qcur-0, ...; the RoPE'd Q and K as Qcur-0.3 and
 * Kcur-0.3, the way a tensor dump of llama.cpp numbers repeated names), so that the two
 * engines can be compared op by op. One getenv per forward when unset. */
static const char *dump_dir(void)
{
    const char *d = getenv("LLMGW_DUMP");
    return d != NULL && d[0] != '\0' ? d : NULL;
}

static void dump(const kern_backend *be, const char *dir, int call, const char *name,
                 int layer, const float *x, int64_t ne0, int64_t ne1, int64_t ne2)
{
    char path[4096], nm[64];
    if (layer >= 0) {
        const char *dot = strchr(name, '.');
        int base = dot ? (int)(dot - name) : (int)strlen(name);
        snprintf(nm, sizeof nm, "%.*s-%d%s", base, name, layer, dot ? dot : "");
    } else {
        snprintf(nm, sizeof nm, "%s", name);
    }
    snprintf(path, sizeof path, "%s/s%d_%s.f32", dir, call, nm);
    FILE *f = fopen(path, "wb");
    if (f == NULL)
        return;
    int32_t hdr[5] = {(int32_t)ne0, (int32_t)ne1, (int32_t)ne2, 1, 0};
    fwrite(hdr, sizeof hdr[0], 5, f);
    size_t n = (size_t)(ne0 * ne1 * ne2);
    float *host = NULL;
    if (!be->host_memory) {
        host = util_xmalloc(n * sizeof *host);
        be->buffer_copy_out(be->ctx, x, 0, host, n * sizeof *host);
        x = host;
    }
    fwrite(x, sizeof *x, n, f);
    free(host);
    fclose(f);
}

/* The step's ops, up to the logits in the backend's memory (*out, rows of them: 0 when no
 * sequence asked for any). dd: LLMGW_DUMP's folder, or NULL. */
static int forward_ops(const eng_model *m, const kern_backend *be, eng_work *w,
                       const eng_batch *b, const eng_kv_layout *kvl, float *logits,
                       const char *dd, int call, float **out_at)
{
#define DUMP(name, layer, x, ne0, ne1, ne2)                                                      \
    do {                                                                                         \
        if (dd != NULL)                                                                          \
            dump(be, dd, call, name, layer, x, ne0, ne1, ne2);                                   \
    } while (0)
    const eng_hparams *hp = &m->hp;
    void *c = be->ctx;
    int T = b->n_tok;
    int64_t E = hp->n_embd, Q = (int64_t)hp->n_head * hp->head_dim;
    int64_t KV = (int64_t)hp->n_kv_head * hp->head_dim, F = hp->n_ff;
    /* One layer's K and V regions in a page. */
    size_t k_region = (size_t)kvl->page_tokens * (size_t)hp->n_kv_head * kvl->k_row;
    size_t v_region = (size_t)kvl->page_tokens * (size_t)hp->n_kv_head * kvl->v_row;
    float scale = 1.0f / sqrtf((float)hp->head_dim);

    /* The sequences with tokens this step (at most one a token), for kv_store and attention. */
    int n_seq = 0;
    for (int s = 0; s < b->n_seq; s++)
        if (b->seqs[s].n_tok > 0)
            w->seqs[n_seq++] = (kern_seq){.pages = b->seqs[s].pages, .tok0 = b->seqs[s].tok0,
                                          .n_tok = b->seqs[s].n_tok};

    be->get_rows(c, &w->tok_embd, b->tokens, T, w->x);
    DUMP("embd", -1, w->x, E, T, 1);
    for (int l = 0; l < hp->n_layer; l++) {
        const eng_layer *L = &w->layers[l];
        be->rmsnorm(c, w->xb, w->x, L->attn_norm, E, T, hp->rms_eps);
        DUMP("attn_norm", l, w->xb, E, T, 1);
        be->matmul(c, &L->wq, w->xb, T, w->q, Q);
        be->matmul(c, &L->wk, w->xb, T, w->k, KV);
        be->matmul(c, &L->wv, w->xb, T, w->v, KV);
        DUMP("Qcur", l, w->q, Q, T, 1);
        DUMP("Kcur", l, w->k, KV, T, 1);
        DUMP("Vcur", l, w->v, KV, T, 1);
        if (L->bq != NULL) {
            be->add_row(c, w->q, L->bq, Q, T);
            be->add_row(c, w->k, L->bk, KV, T);
            be->add_row(c, w->v, L->bv, KV, T);
        }
        be->rope(c, w->q, b->pos, T, hp->n_head, hp->head_dim, hp->rope_base,
                 hp->rope_freq_scale, w->rope_freqs, hp->rope_neox);
        be->rope(c, w->k, b->pos, T, hp->n_kv_head, hp->head_dim, hp->rope_base,
                 hp->rope_freq_scale, w->rope_freqs, hp->rope_neox);
        DUMP("Qcur.3", l, w->q, hp->head_dim, hp->n_head, T);
        DUMP("Kcur.3", l, w->k, hp->head_dim, hp->n_kv_head, T);
        kern_attn a = {
            .q = w->q, .out = w->att, .pos = b->pos, .n_tok = T,
            .seqs = w->seqs, .n_seq = n_seq,
            .n_head = hp->n_head,
            .scale = scale,
            .kv = {.k_off = (size_t)l * (k_region + v_region),
                   .v_off = (size_t)l * (k_region + v_region) + k_region,
                   .page_tokens = kvl->page_tokens, .n_kv_head = hp->n_kv_head,
                   .head_dim = hp->head_dim, .type = kvl->type, .k_group = kvl->k_group,
                   .rotate = kvl->rotate},
            .n_batch = T,
        };
        be->kv_store(c, &a.kv, w->seqs, n_seq, w->k, w->v, b->pos);
        be->attention(c, &a);
        DUMP("kqv_out", l, w->att, Q, T, 1);
        be->matmul(c, &L->wo, w->att, T, w->xb, E);
        DUMP("attn_out", l, w->xb, E, T, 1);
        be->add(c, w->x, w->xb, (size_t)T * (size_t)E);
        DUMP("ffn_inp", l, w->x, E, T, 1);
        be->rmsnorm(c, w->xb, w->x, L->ffn_norm, E, T, hp->rms_eps);
        DUMP("ffn_norm", l, w->xb, E, T, 1);
        be->matmul(c, &L->w_gate, w->xb, T, w->hb, F);
        be->matmul(c, &L->w_up, w->xb, T, w->hb2, F);
        DUMP("ffn_gate", l, w->hb, F, T, 1);
        DUMP("ffn_up", l, w->hb2, F, T, 1);
        be->swiglu(c, w->hb, w->hb, w->hb2, (size_t)T * (size_t)F);
        DUMP("ffn_swiglu", l, w->hb, F, T, 1);
        be->matmul(c, &L->w_down, w->hb, T, w->xb, E);
        DUMP("ffn_out", l, w->xb, E, T, 1);
        be->add(c, w->x, w->xb, (size_t)T * (size_t)E);
        DUMP("l_out", l, w->x, E, T, 1);
    }
    int rows = 0;
    for (int s = 0; s < b->n_seq; s++) {
        int r = b->seqs[s].logits_row;
        if (r < 0)
            continue;
        int nl = b->seqs[s].n_logits > 0 ? b->seqs[s].n_logits : 1;
        if (nl > b->seqs[s].n_tok)
            nl = b->seqs[s].n_tok;
        int first = b->seqs[s].tok0 + b->seqs[s].n_tok - nl;
        be->copy(c, w->xl + (size_t)r * (size_t)E, w->x + (size_t)first * (size_t)E,
                 (size_t)nl * (size_t)E * sizeof(float));
        if (r + nl > rows)
            rows = r + nl;
    }
    if (rows == 0)
        return 0;
    be->rmsnorm(c, w->xl, w->xl, w->output_norm, E, rows, hp->rms_eps);
    DUMP("result_norm", -1, w->xl, E, rows, 1);
    float *out = be->host_memory ? logits : w->logits;
    be->matmul(c, &w->output, w->xl, rows, out, hp->n_vocab);
    DUMP("result_output", -1, out, hp->n_vocab, rows, 1);
    *out_at = out;
    return rows;
#undef DUMP
}

void eng_model_forward(const eng_model *m, const kern_backend *be, eng_work *w,
                       const eng_batch *b, const eng_kv_layout *kvl, float *logits)
{
    static int dump_calls;
    const char *dd = dump_dir();
    int call = dd != NULL ? dump_calls++ : 0;
    /* A step recorded and run as one where the backend does so (a CUDA graph); not while
     * dumping, which copies tensors out between the ops. */
    bool recorded = dd == NULL && be->step_record != NULL && be->step_record(be->ctx, w, b->n_tok);
    float *out = NULL;
    int rows = forward_ops(m, be, w, b, kvl, logits, dd, call, &out);
    if (recorded && !be->step_run(be->ctx))   /* nothing of it ran: the ops once more, as called */
        rows = forward_ops(m, be, w, b, kvl, logits, dd, call, &out);
    if (rows > 0 && out != logits)
        be->buffer_copy_out(be->ctx, out, 0, logits,
                            (size_t)rows * (size_t)m->hp.n_vocab * sizeof *out);
}
