/* engine/encoder/bert_forward.c: the batched BERT forward (eng_bert_ctx, eng_bert_encode). All
 * tokens of a batch are one [T][dim] matrix for the linear layers, so no work is spent on padding;
 * attention runs per sequence and head. Every step is a kern_backend call on the ctx's own backend
 * (kernels/backend.h: dense, layernorm, encoder_attention; the CPU splits each over its threads):
 * this file does the embedding lookup, the pooling and the bookkeeping, no arithmetic of its own.
 * A text encodes bit for bit the same alone or in any batch the backend's packed kernels compute
 * (see dense). Scratch buffers grow with the largest batch seen and are reused; a forward
 * allocates nothing else. */
#include "engine/encoder/bert_forward.h"
#include "kernels/device.h"
#include "engine/encoder/bert_internal.h"

#include "common/arena.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct eng_bert_ctx {
    const eng_bert *m;
    kern_backend *be;   /* the ctx's own (its threads), on the model's device */
    size_t cap_tokens;  /* rows the buffers below hold */
    int cap_seqs;
    int32_t *ids;       /* [cap_tokens + max_tokens] token ids of the batch, back to back */
    int32_t *pos;       /* [cap_tokens] each token's position in its sequence */
    int32_t *start;     /* [cap_seqs + 1] first token of each sequence, then T */
    float *x;           /* [cap_tokens][dim] hidden state (host: the pooling's input) */
    /* In the backend's buffers (on a host-memory backend dx is x and the rest host memory): */
    float *dx;          /* [cap_tokens][dim] hidden state */
    float *qkv;         /* [cap_tokens][3 * dim] queries, keys, values */
    float *att;         /* [cap_tokens][dim] attention output (heads side by side) */
    float *ff;          /* [cap_tokens][d_ff] feed-forward activations */
    size_t dev_tokens;  /* rows of the backend buffers (off the host) */
    char kernels[160];  /* eng_bert_ctx_kernels */
};

static void free_device(eng_bert_ctx *c)
{
    kern_backend *be = c->be;
    if (be != NULL && !be->host_memory) {
        size_t d = (size_t)c->m->dim * sizeof(float), n = c->dev_tokens;
        if (c->dx != NULL)
            be->buffer_free(be->ctx, c->dx, n * d);
        if (c->qkv != NULL)
            be->buffer_free(be->ctx, c->qkv, n * 3 * d);
        if (c->att != NULL)
            be->buffer_free(be->ctx, c->att, n * d);
        if (c->ff != NULL)
            be->buffer_free(be->ctx, c->ff, n * (size_t)c->m->d_ff * sizeof(float));
    } else {
        free(c->qkv);
        free(c->att);
        free(c->ff);
    }
    c->dx = c->qkv = c->att = c->ff = NULL;
    c->dev_tokens = 0;
}

const char *eng_bert_ctx_kernels(const eng_bert_ctx *c)
{
    return c->kernels;
}

int eng_bert_ctx_new(eng_bert_ctx **out, const eng_bert *m, int threads, util_err *err)
{
    *out = NULL;
    eng_bert_ctx *c = util_xcalloc(1, sizeof *c);
    c->m = m;
    int rc = kern_backend_open(m->device, threads, &c->be, err);
    if (rc != 0) {
        free(c);
        return rc;
    }
    const char *k = m->n_layers > 0 ? c->be->dense_kernels(c->be->ctx, m->layers[0].ff1)
                                    : "no layers";
    snprintf(c->kernels, sizeof c->kernels, "%s", k);
    *out = c;
    return 0;
}

void eng_bert_ctx_set_linger(eng_bert_ctx *c, uint64_t ns)
{
    c->be->set_spin(c->be->ctx, ns);
}

void eng_bert_ctx_free(eng_bert_ctx *c)
{
    if (c == NULL)
        return;
    free_device(c);
    kern_backend_free(c->be);
    free(c->ids);
    free(c->pos);
    free(c->start);
    free(c->x);
    free(c);
}

static int grow(void **p, size_t n, size_t elem)
{
    void *q = realloc(*p, n * elem);
    if (q == NULL)
        return LLMGW_ENOMEM;
    *p = q;
    return 0;
}

/* The buffers the backend computes in, for cap tokens. */
static int grow_device(eng_bert_ctx *c, size_t cap)
{
    const eng_bert *m = c->m;
    kern_backend *be = c->be;
    if (be->host_memory) {
        c->dx = c->x;
        if (grow((void **)&c->qkv, cap * 3 * m->dim, sizeof *c->qkv) != 0 ||
            grow((void **)&c->att, cap * m->dim, sizeof *c->att) != 0 ||
            grow((void **)&c->ff, cap * m->d_ff, sizeof *c->ff) != 0)
            return LLMGW_ENOMEM;
        return 0;
    }
    free_device(c);
    size_t d = (size_t)m->dim * sizeof(float);
    c->dx = be->buffer_alloc(be->ctx, cap * d);
    c->qkv = be->buffer_alloc(be->ctx, cap * 3 * d);
    c->att = be->buffer_alloc(be->ctx, cap * d);
    c->ff = be->buffer_alloc(be->ctx, cap * (size_t)m->d_ff * sizeof(float));
    c->dev_tokens = cap;
    return c->dx && c->qkv && c->att && c->ff ? 0 : LLMGW_ENOMEM;
}

/* Room for T tokens (ids: plus one more sequence) and n sequences. */
static int reserve(eng_bert_ctx *c, size_t T, int n)
{
    const eng_bert *m = c->m;
    if (n > c->cap_seqs) {
        int cap = n > 2 * c->cap_seqs ? n : 2 * c->cap_seqs;
        if (grow((void **)&c->start, (size_t)cap + 1, sizeof *c->start) != 0)
            return LLMGW_ENOMEM;
        c->cap_seqs = cap;
    }
    if (T <= c->cap_tokens)
        return 0;
    size_t cap = T > 2 * c->cap_tokens ? T : 2 * c->cap_tokens;
    if (grow((void **)&c->ids, cap + (size_t)m->max_tokens, sizeof *c->ids) != 0 ||
        grow((void **)&c->pos, cap, sizeof *c->pos) != 0 ||
        grow((void **)&c->x, cap * m->dim, sizeof *c->x) != 0 || grow_device(c, cap) != 0)
        return LLMGW_ENOMEM;
    c->cap_tokens = cap;
    return 0;
}

int eng_bert_encode(eng_bert_ctx *c, const char *const *texts, const size_t *lens, int n,
                    float *out, int *n_tokens, util_err *err)
{
    const eng_bert *m = c->m;
    const int H = m->dim;
    if (n <= 0)
        return n == 0 ? 0 : util_err_set(err, LLMGW_EINVAL, "bert: negative batch size");
    /* Tokenize into ids, growing as we go: each text needs at most max_tokens slots. */
    size_t T = 0;
    for (int i = 0; i < n; i++) {
        if (reserve(c, T + 1, i + 1) != 0)
            return util_err_set(err, LLMGW_ENOMEM, "bert: out of memory for a batch of %d", n);
        int k = eng_wordpiece_encode(m->wp, texts[i], lens[i], m->max_tokens, c->ids + T,
                                     m->max_tokens);
        c->start[i] = (int32_t)T;
        if (n_tokens != NULL)
            n_tokens[i] = k;
        T += (size_t)k;
    }
    c->start[n] = (int32_t)T;
    if (reserve(c, T, n) != 0)
        return util_err_set(err, LLMGW_ENOMEM, "bert: out of memory for %zu tokens", T);
    const int Ti = (int)T;
    /* Embeddings on the backend (only the ids cross to a GPU): word + position, + token type 0
     * (in that order, as sentence-transformers adds them), then LayerNorm. */
    for (int s = 0; s < n; s++)
        for (int t = c->start[s]; t < c->start[s + 1]; t++)
            c->pos[t] = t - c->start[s];
    kern_backend *be = c->be;
    void *bc = be->ctx;
    size_t xbytes = T * (size_t)H * sizeof(float);
    float *x = c->dx;
    be->get_rows(bc, &m->emb_at[0], c->ids, Ti, x);
    be->get_rows(bc, &m->emb_at[1], c->pos, Ti, c->att);   /* att: free until the layers */
    be->add(bc, x, c->att, T * (size_t)H);
    be->add_row(bc, x, m->emb_at[2].data, H, Ti);
    be->layernorm(bc, x, m->emb_ln_at[0], m->emb_ln_at[1], H, Ti, m->eps);
    for (int l = 0; l < m->n_layers; l++) {
        const eng__bert_layer *L = &m->layers[l];
        be->dense(bc, L->qkv, x, Ti, c->qkv, false, false);
        be->encoder_attention(bc, c->qkv, c->att, c->start, n, m->n_heads, m->head_dim);
        be->dense(bc, L->o, c->att, Ti, x, true, false);     /* x += att Wo^T + bo */
        be->layernorm(bc, x, L->ln_at[0], L->ln_at[1], H, Ti, m->eps);
        be->dense(bc, L->ff1, x, Ti, c->ff, false, true);    /* GELU(x W1^T + b1) */
        be->dense(bc, L->ff2, c->ff, Ti, x, true, false);    /* x += ff W2^T + b2 */
        be->layernorm(bc, x, L->ln_at[2], L->ln_at[3], H, Ti, m->eps);
    }
    if (c->dx != c->x)
        be->buffer_copy_out(bc, c->dx, 0, c->x, xbytes);
    /* Mean pooling over each sequence's tokens, then L2 normalisation. */
    for (int s = 0; s < n; s++) {
        float *o = out + (size_t)s * H;
        int t0 = c->start[s], t1 = c->start[s + 1];
        memset(o, 0, (size_t)H * sizeof *o);
        for (int t = t0; t < t1; t++) {
            const float *x = c->x + (size_t)t * H;
            for (int d = 0; d < H; d++)
                o[d] += x[d];
        }
        float norm = 0;
        for (int d = 0; d < H; d++) {
            o[d] /= (float)(t1 - t0);
            norm += o[d] * o[d];
        }
        norm = sqrtf(norm);
        float inv = 1.0f / (norm > 1e-12f ? norm : 1e-12f);
        for (int d = 0; d < H; d++)
            o[d] *= inv;
    }
    return 0;
}

const float *eng_bert_token_vectors(const eng_bert_ctx *c, int i, int *n_tokens)
{
    *n_tokens = c->start[i + 1] - c->start[i];
    return c->x + (size_t)c->start[i] * (size_t)c->m->dim;
}

const int32_t *eng_bert_token_ids(const eng_bert_ctx *c, int i, int *n_tokens)
{
    *n_tokens = c->start[i + 1] - c->start[i];
    return c->ids + c->start[i];
}
