/* engine/encoder/bert_internal.h: the loaded BERT model shared by engine/encoder/bert.c (loading)
 * and engine/encoder/bert_forward.c (the batched forward). Weight shapes are PyTorch's: a Linear
 * weight is [out][in] row-major, so y = x W^T + b. */
#ifndef LLMGW_ENGINE_BERT_INTERNAL_H
#define LLMGW_ENGINE_BERT_INTERNAL_H

#include "engine/encoder/bert.h"
#include "engine/format/safetensors.h"
#include "engine/text/wordpiece.h"
#include "kernels/backend.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct eng__bert_layer {
    const float *wqkv;  /* [3 * dim][dim]: query, key and value weights stacked (owned) */
    const float *bqkv;  /* [3 * dim] (owned) */
    const float *wo, *bo;        /* [dim][dim], [dim] */
    const float *ln1_w, *ln1_b;  /* [dim] attention output LayerNorm */
    const float *w1, *b1;        /* [d_ff][dim], [d_ff] */
    const float *w2, *b2;        /* [dim][d_ff], [dim] */
    const float *ln2_w, *ln2_b;  /* [dim] output LayerNorm */
    /* The four products as the model's backend keeps them (kern_backend.dense_new). */
    kern_dense *qkv, *o, *ff1, *ff2;
    /* ln1_w, ln1_b, ln2_w, ln2_b where the backend reads them (kern_backend_place). */
    const float *ln_at[4];
} eng__bert_layer;

struct eng_bert {
    eng_safetensors *st;
    eng_wordpiece *wp;
    int dim, n_layers, n_heads, head_dim, d_ff, vocab, max_pos, n_types, max_tokens;
    float eps;
    const float *tok_emb;          /* [vocab][dim] */
    const float *pos_emb;          /* [max_pos][dim] */
    const float *type_emb;         /* [n_types][dim]; row 0 is used */
    const float *emb_ln_w, *emb_ln_b;
    const float *emb_ln_at[2];     /* emb_ln_w, emb_ln_b where the backend reads them */
    kern_tensor emb_at[3];         /* tok_emb, pos_emb, type_emb likewise, as f32 tensors for
                                      get_rows and add_row (type_emb: its row 0) */
    eng__bert_layer *layers;       /* [n_layers] */
    float **owned;                 /* [n_owned] buffers made at load (stacked or converted) */
    int n_owned;
    kern_backend *be;              /* the device its weights live on (one thread); contexts
                                      on the same device read them (one address space) */
    char *device;                  /* its name; contexts open their backends there */
    const char *precision;         /* "bf16", "tf32" or "f32": the products' inputs */
};

#endif
