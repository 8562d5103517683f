/* engine/bert_internal.h: the loaded BERT model shared by engine/bert.c (loading) and
 * engine/bert_forward.c (the batched forward). Weight shapes are PyTorch's: a Linear weight is
 * [out][in] row-major, so y = x W^T + b. */
#ifndef LLMGW_ENGINE_BERT_INTERNAL_H
#define LLMGW_ENGINE_BERT_INTERNAL_H

#include "engine/bert.h"
#include "engine/safetensors.h"
#include "engine/wordpiece.h"

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
    /* The four weight matrices again, packed for the small-batch kernel: [out / 16][in][16]
     * (16 output features side by side per input feature; owned). */
    const float *pwqkv, *pwo, *pw1, *pw2;
    /* Or, when the model computes in BF16 (eng_bert.bf16), packed as BF16 pairs:
     * [out / 16][in / 2][16][2], what AVX512-BF16's pairwise dot product reads (owned). */
    const uint16_t *bwqkv, *bwo, *bw1, *bw2;
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
    eng__bert_layer *layers;       /* [n_layers] */
    float **owned;                 /* [n_owned] buffers made at load (stacked or converted) */
    int n_owned;
    bool bf16;                     /* small batches' products in BF16 (the b* weights) */
};

#endif
