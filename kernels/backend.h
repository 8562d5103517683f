/* kernels/backend.h: the arithmetic a model needs, as a struct of function pointers, so that the
 * same model code runs on the CPU backend (always built) and a CUDA backend (when nvcc is found).
 * Models call only this interface. kernels/ knows nothing of models: shapes come as arguments.
 *
 * Conventions: activations are f32, row-major, one row per token ([n_tok][n]). Weights are
 * kern_tensor (ggml types, row-major, ne[0] = cols contiguous). The KV cache is f16 in pages (f16
 * or int8, see kern_kv). Calls are synchronous, made from one thread (an engine's scheduler
 * thread); the backend splits the work over its own threads. Nothing allocates after reserve()
 * but buffer_alloc, dense_new and the encoder entries' scratch (grown to the largest batch). */
#ifndef LLMGW_KERNELS_BACKEND_H
#define LLMGW_KERNELS_BACKEND_H

#include "common/err.h"
#include "kernels/types.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* How a tensor's rows lie: KERN_LAYOUT_ROWS, row r at data + r * row_bytes; KERN_LAYOUT_X8, a
 * backend's repacked copy (repack below), groups of eight rows interleaved, group g (rows 8g ..
 * 8g + 7, the rows rounded up to eight) at data + 8g * row_bytes. Only matmul reads X8. */
enum { KERN_LAYOUT_ROWS = 0, KERN_LAYOUT_X8 = 1 };

typedef struct kern_tensor {
    uint32_t type;        /* kern_type (kernels/types.h) */
    int64_t rows;         /* output features */
    int64_t cols;         /* input features (a multiple of the type's block size) */
    size_t row_bytes;
    const void *data;     /* [rows][row_bytes] */
    uint32_t layout;      /* KERN_LAYOUT_ROWS (0) unless repack made it */
} kern_tensor;

/* How K and V are stored: KERN_KV_F16, or KERN_KV_Q8 (optionally rotated, see kern_kv): int8 values with f16 scales (value =
 * q * scale, scale = max |x| / 127 over the scale's group), V with one scale per head per
 * token, K with one scale per k_group elements of a head per token (k_group = head_dim: one per
 * head, as V; 32: q8_0-like groups of channels, which keeps an outlier channel from flattening
 * the other channels of its head). */
enum { KERN_KV_F16 = 0, KERN_KV_Q8 = 1 };

/* Bytes of one token's one head in a K (group = k_group) or V (group = head_dim) region: f16,
 * head_dim * 2; Q8, head_dim int8 values then head_dim / group f16 scales. */
static inline size_t kern_kv_row_bytes(int type, int head_dim, int group)
{
    if (type == KERN_KV_Q8)
        return (size_t)head_dim + 2 * (size_t)(head_dim / group);
    return 2 * (size_t)head_dim;
}

/* Where one layer's K and V lie in a page. Token t (0-based position in its sequence), kv head
 * h: its K row (kern_kv_row_bytes) at pages[t / page_tokens] + k_off + ((t % page_tokens) *
 * n_kv_head + h) * k_row, its V row likewise at v_off (v_row bytes apart), pages being the
 * sequence's block table (kern_seq). */
typedef struct kern_kv {
    size_t k_off, v_off;    /* this layer's K and V regions within a page */
    int page_tokens;
    int n_kv_head;
    int head_dim;
    int type;               /* KERN_KV_F16 (0) or KERN_KV_Q8 */
    int k_group;            /* Q8: K elements per scale, a divisor of head_dim (0: head_dim) */
    /* Q8: K and V rows are stored rotated by the orthonormal Hadamard matrix H (head_dim a
     * power of two up to 256; the CPU backend aborts on another): an outlier channel is spread over the whole row, so its scale no longer
     * flattens the other channels. Attention rotates the queries alike (q.k = Hq.Hk) and its
     * output back (sum p Hv = H sum p v; H is its own inverse). */
    bool rotate;
} kern_kv;

/* One sequence of a kv_store or attention call, which takes all of a step's sequences at
 * once: its tokens are rows tok0 .. tok0 + n_tok - 1 of the call's arrays (k, v, q, out, pos),
 * its K and V in the pages of its block table. The sequences' rows do not overlap. */
typedef struct kern_seq {
    uint8_t *const *pages;  /* its block table, as page base pointers */
    int tok0, n_tok;
} kern_seq;

typedef struct kern_attn {
    const float *q;         /* [n_tok][n_head][head_dim], RoPE applied */
    float *out;             /* [n_tok][n_head][head_dim] */
    const int32_t *pos;     /* [n_tok]: row i attends to its sequence's positions 0..pos[i] */
    int n_tok;              /* rows of q, out and pos (the sequences' rows lie within) */
    const kern_seq *seqs;   /* [n_seq] */
    int n_seq;
    int n_head;             /* a multiple of kv.n_kv_head (grouped-query attention) */
    float scale;            /* usually 1/sqrt(head_dim) */
    kern_kv kv;
    /* Tokens in the whole forward pass (0: n_tok). Under LLMGW_KERNELS=exact the CPU backend
     * sums the attention products in the order llama.cpp uses for such a batch: its batched
     * (>= 2 tokens) and one-token paths add them in different orders. */
    int n_batch;
} kern_attn;

/* A Linear layer's weights in a backend (dense_new). */
enum { KERN_DENSE_F32 = 0, KERN_DENSE_AUTO = 1, KERN_DENSE_BF16 = 2 };
typedef struct kern_dense {
    int n, k;      /* outputs, inputs */
    bool bf16;     /* its products take BF16 inputs (f32 sums) */
    bool tf32;     /* its products round their inputs to TF32, 10 mantissa bits (f32 sums) */
} kern_dense;

typedef struct kern_backend {
    const char *name;       /* where it computes: "cpu", "shadow", "cuda:N" */
    void *ctx;
    int  (*n_threads)(void *ctx);
    /* The kernels it runs, in words ("avx512", "avx2", "ref" on the CPU). */
    const char *(*kernels)(void *ctx);
    /* Whether matmul and get_rows take weights of this type (kernels/types.h). */
    bool (*supports_type)(void *ctx, uint32_t type);
    /* Sizes scratch for up to max_tok rows of up to max_cols (and attention over max_ctx
     * positions). 0 or LLMGW_ENOMEM. With buffer_alloc, the only calls that allocate. */
    int  (*reserve)(void *ctx, int max_tok, int64_t max_cols, int max_ctx);
    void (*destroy)(void *ctx);   /* use kern_backend_free */

    /* Memory where the backend computes (ggml's backend buffers): the KV pool's pages, a
     * model's activations and, on a GPU, its weights live in them. A buffer is only read and
     * written by this backend's entries (kern_seq.pages point into it) and through copy_in /
     * copy_out / copy; on the CPU it is host memory, reserved lazily (untouched pages cost
     * nothing), on a GPU device memory. alloc returns NULL when the memory is not there; free
     * takes the size alloc was given. copy_in and copy_out take any address inside a buffer
     * (off bytes on from it) and return when the bytes are there. */
    void *(*buffer_alloc)(void *ctx, size_t bytes);
    void  (*buffer_free)(void *ctx, void *buf, size_t bytes);
    void  (*buffer_copy_in)(void *ctx, void *buf, size_t off, const void *src, size_t n);
    void  (*buffer_copy_out)(void *ctx, const void *buf, size_t off, void *dst, size_t n);
    /* dst[0..n) = src[0..n), bytes, both in this backend's buffers. */
    void  (*copy)(void *ctx, void *dst, const void *src, size_t n);
    /* Whether its buffers are host memory (the CPU). Then the host reads and writes them in
     * place and weights in host memory (a model's mmap) are used where they lie. When false (a
     * GPU), every float or weight pointer an entry takes is in its buffers (weights are placed
     * there with kern_backend_place); the small index arrays (get_rows' ids, pos, the
     * sequences and their block tables, encoder_attention's start) stay host memory, which
     * the backend stages itself. */
    bool host_memory;

    /* A step's ops run as one (a CUDA graph: the launches' cost paid once). NULL where the ops
     * always run as called. step_record(key, n_tok) before a step's first op: true when the
     * ops called until step_run are recorded instead of run (recording is on for this backend
     * and takes steps of n_tok), false when they run as called. key names what the step runs
     * (the engine passes its model's weights): steps of one key and size reuse one recording.
     * Between the two only ops and copy may be called. step_run runs what was recorded and
     * returns true, or returns false when the recording failed (nothing of the step ran):
     * the caller then calls the ops again, unrecorded. */
    bool (*step_record)(void *ctx, const void *key, int n_tok);
    bool (*step_run)(void *ctx);

    /* A draft model's copy of w (its data in host memory), for products that need not be
     * matmul's on w bit for bit (a draft model's: the model it drafts for checks each token):
     * the same weights in the layout this backend multiplies fastest, summed in another order
     * (other last bits). Fills *out and returns true, or returns false where it has no such
     * layout for w's type (use w as it is) or no memory. NULL on a backend without any. */
    bool (*repack)(void *ctx, const kern_tensor *w, kern_tensor *out);
    void (*repack_free)(void *ctx, kern_tensor *t);   /* what repack filled in */

    /* y[t][r] = W[r] . x[t] for r < w->rows, t < n_tok; y rows are ldy floats apart. */
    void (*matmul)(void *ctx, const kern_tensor *w, const float *x, int n_tok, float *y,
                   int64_t ldy);
    /* y[i] = W[ids[i]] as f32 (embedding lookup); y is [n][w->cols]. */
    void (*get_rows)(void *ctx, const kern_tensor *w, const int32_t *ids, int n, float *y);
    /* y[t] = x[t] / rms(x[t]) * w, per row of n; y may equal x. */
    void (*rmsnorm)(void *ctx, float *y, const float *x, const float *w, int64_t n, int n_tok,
                    float eps);
    /* Rotates x [n_tok][n_head][head_dim] in place at positions pos: pairs (2i, 2i+1) when
     * !neox (llama), pairs (i, i + head_dim/2) when neox (qwen2); angle of pair i
     * freq_scale * (pos*base^(-2i/d) / freq_factors[i]). freq_factors: [head_dim/2] per-frequency
     * divisors (Llama-3.1's rope_freqs.weight), or NULL for all 1. */
    void (*rope)(void *ctx, float *x, const int32_t *pos, int n_tok, int n_head, int head_dim,
                 float theta_base, float freq_scale, const float *freq_factors, bool neox);
    /* y[i] = silu(gate[i]) * up[i]; y may equal gate. */
    void (*swiglu)(void *ctx, float *y, const float *gate, const float *up, size_t n);
    /* y[i] += x[i]. */
    void (*add)(void *ctx, float *y, const float *x, size_t n);
    /* y[t][i] += b[i] for t < n_tok (biases). */
    void (*add_row)(void *ctx, float *y, const float *b, int64_t n, int n_tok);
    /* Stores k and v ([rows][n_kv_head * head_dim], f32) of each sequence's rows at their
     * positions pos[row] in its pages, in kv->type. */
    void (*kv_store)(void *ctx, const kern_kv *kv, const kern_seq *seqs, int n_seq,
                     const float *k, const float *v, const int32_t *pos);
    /* Causal grouped-query attention of each sequence through its block table, all of a
     * step's sequences in one call. */
    void (*attention)(void *ctx, const kern_attn *a);

    /* ---- the sentence encoder (BERT): activations f32 [n_tok][width], several sequences'
     * tokens back to back in one matrix (no padding). ---- */
    /* A Linear layer's weights as the backend keeps them, from f32 w [n][k] (PyTorch's layout,
     * y = x w^T + bias) and bias [n]; w must outlive the handle (the backend may read it, and
     * keeps repacked or converted copies of its own). precision: KERN_DENSE_F32,
     * KERN_DENSE_BF16 (BF16 products with f32 sums where the backend has them: bf16 set), or
     * KERN_DENSE_AUTO (whichever of the two is faster here; one verdict per backend; a GPU's
     * tensor cores take TF32 for either reduced precision: tf32 set).
     * NULL without memory. */
    kern_dense *(*dense_new)(void *ctx, const float *w, const float *bias, int n, int k,
                             int precision);
    void (*dense_free)(void *ctx, kern_dense *d);   /* NULL is a no-op */
    /* y[t][j] = x[t] . w[j] + bias[j] (+ y[t][j] when accumulate: a residual), then GELU (erf)
     * when gelu, for t < n_tok. A row's result does not depend on n_tok up to the batch size
     * the kernels report (dense_kernels). */
    void (*dense)(void *ctx, const kern_dense *d, const float *x, int n_tok, float *y,
                  bool accumulate, bool gelu);
    /* The kernels dense runs, in words, choosing them on the first call (the CPU races its
     * packed kernel against sgemm on probe, a layer of the model's own). */
    const char *(*dense_kernels)(void *ctx, const kern_dense *probe);
    /* x[t] = (x[t] - mean) / sqrt(var + eps) * w + b, per row of n. */
    void (*layernorm)(void *ctx, float *x, const float *w, const float *b, int64_t n,
                      int n_tok, float eps);
    /* x[i] = x[i] / 2 * (1 + erf(x[i] / sqrt 2)). */
    void (*gelu)(void *ctx, float *x, size_t n);
    /* Bidirectional softmax attention within each sequence s < n_seq (rows start[s] up to
     * start[s + 1]): qkv [T][3][n_head * head_dim] (queries, keys, values side by side),
     * out [T][n_head * head_dim], scale 1 / sqrt(head_dim). */
    void (*encoder_attention)(void *ctx, const float *qkv, float *out, const int32_t *start,
                              int n_seq, int n_head, int head_dim);
    /* How long its threads keep polling for the next call before they sleep (default 0). */
    void (*set_spin)(void *ctx, uint64_t ns);
} kern_backend;

/* The CPU backend with n_threads threads (0 = one per online CPU); NULL on failure. */
kern_backend *kern_cpu_backend_new(int n_threads);

/* n bytes of host data where backend b computes with them: host itself on a host-memory
 * backend, else a new buffer holding a copy; NULL without memory. */
const void *kern_backend_place(const kern_backend *b, const void *host, size_t n);
/* Releases what kern_backend_place returned for host (nothing on a host-memory backend). */
void kern_backend_unplace(const kern_backend *b, const void *placed, const void *host, size_t n);

/* Frees a backend and its struct; NULL is a no-op. */
void kern_backend_free(kern_backend *b);

#endif
