/* engine/decoder/model.h: a decoder-only transformer (GGUF architectures `llama` and `qwen2`)
 * loaded read-only from its file (weights stay in the mmap), with its tokenizer and chat template,
 * and its batched forward pass over paged KV.
 *
 * A batch is tokens of several sequences at once (prefill chunks and single decode tokens mixed);
 * each sequence brings its block table. The forward pass writes each token's K/V into its
 * sequence's pages, attends through the block table, and produces logits only for the tokens that
 * ask for them. The model is immutable and shared; eng_work is per caller. */
#ifndef LLMGW_ENGINE_MODEL_H
#define LLMGW_ENGINE_MODEL_H

#include "common/err.h"
#include "engine/text/chat.h"
#include "engine/format/gguf.h"
#include "engine/text/tokenizer.h"
#include "kernels/backend.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum eng_arch {
    ENG_ARCH_LLAMA = 0,
    ENG_ARCH_QWEN2 = 1,
} eng_arch;

typedef struct eng_hparams {
    int n_vocab, n_embd, n_layer, n_head, n_kv_head, head_dim, n_ff, n_ctx_train;
    float rms_eps;
    float rope_base;
    float rope_freq_scale;   /* 1 / linear scaling factor */
    bool rope_neox;          /* qwen2: NEOX pairs; llama: adjacent pairs */
} eng_hparams;

typedef struct eng_layer {
    const float *attn_norm;              /* [n_embd] */
    kern_tensor wq, wk, wv, wo;
    const float *bq, *bk, *bv;           /* qwen2 biases, else NULL */
    const float *ffn_norm;               /* [n_embd] */
    kern_tensor w_gate, w_up, w_down;
} eng_layer;

typedef struct eng_model {
    char *path;
    eng_gguf *gguf;
    eng_arch arch;
    eng_hparams hp;
    eng_tokenizer *tok;
    eng_chat_kind chat;
    bool has_chat;                       /* false: no template known (chat needs an override) */
    char *default_system;                /* the template's built-in system prompt, or NULL */
    kern_tensor tok_embd;
    kern_tensor output;                  /* tok_embd when tied */
    const float *output_norm;
    const float *rope_freqs;             /* [head_dim/2] RoPE frequency divisors, or NULL */
    eng_layer *layers;                   /* [n_layer] */
    size_t kv_bytes_per_token;           /* with f16 K/V: n_layer * 2 * n_kv_head * head_dim * 2 */
    float **owned;                       /* f32 copies of non-f32 norm/bias vectors */
    size_t n_owned;
    uint64_t weight_types;               /* bit t set: a weight matrix of kern_type t */
} eng_model;

/* Loads and validates everything (metadata, every tensor's type and shape, tokenizer).
 * chat_override ("chatml", "llama3" or NULL) replaces the file's template. */
int  eng_model_load(eng_model **out, const char *path, const char *chat_override, util_err *err);
void eng_model_free(eng_model *m);  /* NULL is a no-op */
/* 0 when be computes with every weight type of m, else LLMGW_EINVAL naming the first it lacks. */
int  eng_model_check_backend(const eng_model *m, const kern_backend *be, util_err *err);

/* Whether b holds a's weights at another precision (a quantized copy, say): the same
 * architecture and shape, and rows spread over the token embeddings and over the K and V
 * projections of the first, middle and last layers agree (cosine >= 0.98 each; a Q4_0 or Q4_1
 * copy of random weights is about 0.995, unrelated weights about 0). Then b's K/V of a text is
 * a's within quantization error, and b can read a's (engine/serve/engine.h: a drafter). */
bool eng_model_same_weights(const eng_model *a, const eng_model *b);

/* How an engine lays this model's K/V out in its pages: per layer, a K region then a V region,
 * each [page_tokens][n_kv_head] rows of kern_kv_row_bytes (kernels/backend.h). The model is
 * shared; each engine chooses its own KV type. */
typedef struct eng_kv_layout {
    int type;                            /* KERN_KV_F16 or KERN_KV_Q8 */
    int k_group;                         /* Q8: K elements per scale, a divisor of head_dim */
    bool rotate;                         /* Q8: rows stored Hadamard-rotated (kern_kv) */
    size_t k_row, v_row;                 /* bytes of one token's one KV head */
    size_t bytes_per_token;              /* all layers, K and V */
    int page_tokens;                     /* tokens per page (0: a page is too small) */
} eng_kv_layout;

/* The layout of K/V type `type` (k_group: 0 = one scale per head; rotate: Q8 rows rotated,
 * where head_dim is a power of two up to 256) in pages of page_bytes. 0, or LLMGW_EINVAL for
 * an unknown type or a group that does not divide head_dim. */
int eng_model_kv_layout(const eng_model *m, int type, int k_group, bool rotate,
                        size_t page_bytes, eng_kv_layout *out, util_err *err);
/* A K/V cache by name: "f16"; "q8" (one K scale per head), "q8/G" (one per G channels), rows
 * rotated (where the head size allows); "q8n", "q8n/G": the same, not rotated. 0, or
 * LLMGW_EINVAL for another name. */
int eng_kv_parse(const char *name, int *type, int *k_group, bool *rotate);
/* The name of a layout, as eng_kv_parse reads it (buf of at least 16 bytes). */
const char *eng_kv_name(const eng_kv_layout *l, int head_dim, char *buf, size_t cap);

typedef struct eng_batch_seq {
    int tok0, n_tok;                     /* its tokens in the batch: [tok0, tok0 + n_tok) */
    uint8_t *const *pages;               /* its block table (covers every position in the batch) */
    int logits_row;                      /* row of `logits` for its last token, or -1 */
    int n_logits;                        /* with logits_row: rows for its last n_logits tokens
                                            (in order, from logits_row; 0 means 1) */
} eng_batch_seq;

typedef struct eng_batch {
    int n_tok;
    const int32_t *tokens;               /* [n_tok] */
    const int32_t *pos;                  /* [n_tok] positions within their sequences */
    int n_seq;
    const eng_batch_seq *seqs;           /* [n_seq], in token order */
} eng_batch;

/* Scratch for batches of up to max_tok tokens and max_logits logit rows, in be's buffers, and
 * the model's weights where be reads them (kern_backend_place: the mmap itself on the CPU, a
 * copy on a GPU, made here). With draft, for a draft model's forwards (whose tokens the model
 * it drafts for checks): the weight matrices as be's draft copies where it has them
 * (kernels/backend.h repack: a faster layout), so its logits differ from the model's own in
 * the last bits.
 * NULL when be's memory is not there. */
typedef struct eng_work eng_work;
eng_work *eng_work_new(const eng_model *m, const kern_backend *be, int max_tok, int max_logits,
                       int max_ctx, bool draft);
void      eng_work_free(eng_work *w);

/* Runs the batch, its K/V in the pages as kv lays them out; logits is [max_logits][n_vocab]
 * host memory. be is the backend w was made for; the step is done when this returns. Where be
 * records steps (kern_backend.step_record: CUDA graphs) the step's ops are recorded under w
 * and run as one. */
void eng_model_forward(const eng_model *m, const kern_backend *be, eng_work *w,
                       const eng_batch *b, const eng_kv_layout *kv, float *logits);

#endif
