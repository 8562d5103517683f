/* kernels/cpu/internal.h: what the files of kernels/cpu share and nothing outside uses: the GGUF
 * block structs, the per-type operation table behind kern_wtype (with the multi-row, multi-token
 * tile that the matmul uses), and the hooks through which the SIMD files install their twins. */
#ifndef LLMGW_KERNELS_CPU_INTERNAL_H
#define LLMGW_KERNELS_CPU_INTERNAL_H

#include "common/threadpool.h"
#include "kernels/backend.h"
#include "kernels/cpu/quant.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* GGUF blocks, byte for byte (f16 fields as raw bits). Element j of a Q4_0/Q4_1 block is the
 * low nibble of qs[j] for j < 16 and the high nibble of qs[j - 16] for j >= 16. */
typedef struct kern_blk_q4_0 {
    uint16_t d;
    uint8_t qs[16];       /* value (q - 8) * d */
} kern_blk_q4_0;

typedef struct kern_blk_q4_1 {
    uint16_t d, m;
    uint8_t qs[16];       /* value q * d + m */
} kern_blk_q4_1;

typedef struct kern_blk_q8_0 {
    uint16_t d;
    int8_t qs[32];        /* value q * d */
} kern_blk_q8_0;

/* 256 elements in 8 sub-blocks of 32, each with a 6-bit scale sc and min m packed in `scales`
 * (sub-block j < 4: sc = scales[j] & 63, m = scales[j + 4] & 63; j >= 4: the low 4 bits in
 * scales[j + 4] (sc low nibble, m high nibble), the top 2 bits in bits 6-7 of scales[j - 4]
 * (sc) and scales[j] (m)). qs[32c + l]: low nibble element 64c + l, high nibble 64c + 32 + l.
 * Value d * sc * q - dmin * m. */
typedef struct kern_blk_q4_k {
    uint16_t d, dmin;
    uint8_t scales[12];
    uint8_t qs[128];
} kern_blk_q4_k;

/* 256 elements, 6-bit q in two halves of 128: element 128h + 32k + l (k < 4, l < 32) takes its
 * low 4 bits from ql[64h + l + 32 (k & 1)] (low nibble for k < 2, high for k >= 2) and its top
 * 2 bits from bits 2k..2k+1 of qh[32h + l]. Value d * scales[e / 16] * (q - 32). */
typedef struct kern_blk_q6_k {
    uint8_t ql[128];
    uint8_t qh[64];
    int8_t scales[16];
    uint16_t d;
} kern_blk_q6_k;

/* Eight Q4_1 rows interleaved, one block of each (KERN_LAYOUT_X8, the repack entry of
 * backend.h): their scales and mins, then four 32-byte vectors; byte 4j + i of vector v holds
 * row j's qs[4v + i] (elements 4v + i in its low nibble, 16 + 4v + i in its high one), so one
 * vector times four activation bytes broadcast gives all eight rows' products of four elements. */
typedef struct kern_blk_q4_1x8 {
    uint16_t d[8], m[8];
    uint8_t qs[128];
} kern_blk_q4_1x8;

_Static_assert(sizeof(kern_blk_q4_0) == 18, "Q4_0 block");
_Static_assert(sizeof(kern_blk_q4_1x8) == 8 * sizeof(kern_blk_q4_1), "Q4_1x8 block");
_Static_assert(sizeof(kern_blk_q4_1) == 20, "Q4_1 block");
_Static_assert(sizeof(kern_blk_q8_0) == 34, "Q8_0 block");
_Static_assert(sizeof(kern_blk_q4_k) == 144, "Q4_K block");
_Static_assert(sizeof(kern_blk_q6_k) == 210, "Q6_K block");
_Static_assert(sizeof(kern_q8_32) == 40, "q8_32 block");
_Static_assert(sizeof(kern_q8_k) == 292, "q8_K block");

/* Matrix times one activation row (decode): y[r] = W[r] . act for r < nr, W rows w_stride bytes
 * apart. */
typedef void (*kern_mv_fn)(int64_t n, const void *w, size_t w_stride, int nr, const void *act,
                           float *y);
/* A block of at most tile_rows rows against every token (prefill): y[t * ldy + r] = W[r] .
 * act[t] for r < nr, t < nt, activations in the tile's own format (tile_act_bytes per row,
 * a_stride apart), with tile_scratch(n) bytes of per-thread scratch. */
typedef void (*kern_tile_fn)(int64_t n, const void *w, size_t w_stride, int nr, const void *act,
                             size_t a_stride, int nt, float *y, int64_t ldy, void *scratch);

/* A few tokens against one row: y[t * ldy] = W . act[t] for t < nt <= KERN_DOTN_MAX, in
 * pub.dot's activation format (a_stride apart), each token's result the same bits as pub.dot
 * gives it alone; the row is read (and unpacked) once for all of them. */
typedef void (*kern_dotn_fn)(int64_t n, const void *w, const void *act, size_t a_stride, int nt,
                             float *y, int64_t ldy);
#define KERN_DOTN_MAX 3

typedef struct kern_wops {
    kern_wtype pub;                 /* first member: kern_wtype_get hands out &pub */
    kern_mv_fn mv;                  /* NULL: a loop over pub.dot */
    /* Below tile_min_tok tokens (verifying a short draft, a drafter catching up a token or
     * two), rows go through dotn where there is one, else through mv / dot token by token. */
    kern_dotn_fn dotn;
    kern_tile_fn tile;              /* NULL: the matmul loops over mv / dot */
    int tile_rows;
    int tile_min_tok;               /* below this many tokens the matmul uses dotn, else mv */
    /* The tile gives every (row, token) the same bits as the one-token kernel (pub.dot; such a
     * type has no mv), whatever else is in the batch: LLMGW_KERNELS=invariant keeps it. */
    bool tile_invariant;
    size_t (*tile_act_bytes)(int64_t n);
    void (*tile_quantize)(const float *x, void *act, int64_t n);   /* NULL: f32 rows in place */
    size_t (*tile_scratch)(int64_t n);
    /* The type's rows in KERN_LAYOUT_X8 (the backend's repack; NULL: it has none): x8 takes nr
     * rows from the first of a group of eight (w; the last group may be partial), against nt
     * tokens in pub.quantize_act's format (a_stride apart): y[t * ldy + r] for r < nr. Every
     * token through the same steps alone or in a batch, in another order than pub.dot. */
    void (*x8)(int64_t n, const void *w, int nr, const void *act, size_t a_stride, int nt,
               float *y, int64_t ldy);
} kern_wops;

/* Q4_1 rows (ws bytes apart) into KERN_LAYOUT_X8: rows rounded up to eight, the padding rows
 * zero (out: that many rows of the same bytes). */
void kern__repack_q4_1x8(const void *w, size_t ws, int64_t rows, int64_t n, void *out);

/* The op table kern_wtype_get / kern_wtype_get_ref describe (NULL for an unknown type). */
const kern_wops *kern__wops_get(uint32_t type);
void kern__quantize_f16_round(const float *x, void *act, int64_t n);
/* Q4_1's activations: q8 blocks whose s is llama.cpp's block_q8_1 sum (see quant.c). */
void kern__quantize_q8_1_ref(const float *x, void *act, int64_t n);
void kern__quantize_bf16_round(const float *x, void *act, int64_t n);
const kern_wops *kern__wops_get_ref(uint32_t type);
/* LLMGW_KERNELS=exact: llama.cpp's summation orders wherever they cost speed (quant.c). */
bool kern__exact(void);

/* The SIMD files overwrite the entries they implement; called once, in this order, when the
 * CPU has the features. */
void kern__quant_install_avx2(kern_wops *ops, int n);
void kern__quant_install_avx512(kern_wops *ops, int n);
/* LLMGW_KERNELS=exact, applied to a table the above filled: the types whose fast kernels sum
 * in another order than llama.cpp (Q4_1) lose their tile and mv and get the dot that sums in
 * llama.cpp's order (the reference's, or its AVX2 twin, which kern__quant_install_exact_avx2
 * installs). */
void kern__quant_make_exact(kern_wops *ops, int n);
void kern__quant_install_exact_avx2(kern_wops *ops, int n);
/* The AVX-512 matrix-vector kernels of mv_avx512.c (init once before use). */
void kern__mv_init_avx512(void);
void kern__mv_q4_0_avx512(int64_t n, const void *w, size_t ws, int nr, const void *act, float *y);
void kern__mv_q4_1_avx512(int64_t n, const void *w, size_t ws, int nr, const void *act, float *y);
void kern__mv_q8_0_avx512(int64_t n, const void *w, size_t ws, int nr, const void *act, float *y);

/* Vector helpers behind the non-matmul ops (ops.c, attention.c): scalar references in ops.c, AVX2
 * twins in ops_avx2.c, chosen once like the weight types. */
typedef struct kern_vops {
    double (*sumsq)(const float *x, int64_t n);   /* sum of f32 squares, in double */
    void (*scale_mul)(float *y, const float *x, const float *w, float s, int64_t n); /* y = x*s*w */
    void (*swiglu)(float *y, const float *g, const float *u, int64_t n);
    void (*add)(float *y, const float *x, int64_t n);
    /* Attention, default (fast) path: any summation order. Attention rows: nq query rows q[i]
     * (d floats each) against n f16 rows k_j = k + j * stride (d elements):
     * s[i][off + j] = scale * q[i] . k_j. */
    void (*qk)(const float *const *q, int nq, const uint16_t *k, size_t stride, int n, int d,
               float scale, float *const *s, int off);
    /* s[j] = exp(s[j] - max); returns the sum. */
    float (*softmax_exp)(float *s, int n, float max);
    /* out[i] += sum_j p[i][off + j] * v_j for i < nq, v_j = v + j * stride (f16), d elements. */
    void (*pv)(float *const *out, int nq, const float *const *p, int off, const uint16_t *v,
               size_t stride, int n, int d);
    /* The same two for KERN_KV_Q8 rows (kern_kv in backend.h): row j at k + j * stride bytes,
     * d int8 values then d / group f16 scales. qk_q8: s[i][off + j] = scale * sum over groups
     * of the group's scale times q[i] . (its int8 values). */
    void (*qk_q8)(const float *const *q, int nq, const uint8_t *k, size_t stride, int n, int d,
                  int group, float scale, float *const *s, int off);
    /* out[i] += sum_j p[i][off + j] * scale_j * v8_j (V rows have one scale, after d values). */
    void (*pv_q8)(float *const *out, int nq, const float *const *p, int off, const uint8_t *v,
                  size_t stride, int n, int d);
    /* x = H x / sqrt(d) in place (the fast Walsh-Hadamard transform, d a power of two): the
     * rotation of a rotated Q8 cache. Every twin does the same additions in the same order,
     * so they agree bit for bit. */
    void (*hadamard)(float *x, int d);
    /* Attention under LLMGW_KERNELS=exact, as llama.cpp computes it without flash attention
     * (K/V f16, the query rows rounded to f16 by the caller, the probabilities rounded to f16
     * before they meet V), with its summation orders: order KERN_ORDER_GEMM (batches of >= 2
     * tokens: 16 lanes, lane l summing elements l, l+16, ... with FMAs, then a tree over the
     * lanes) or KERN_ORDER_DOT (one token: 64-element steps, 4 x 16 lanes, see ops.c).
     * qk_exact: s[i][j] = scale * (q[i] . k[j]) over d elements, k[j] the f16 key rows, j < n. */
    void (*qk_exact)(const float *const *q, int nq, const uint16_t *const *k, int n, int d,
                     float scale, float *const *s, int order);
    /* s[j] = exp(s[j] - max) (llama.cpp's vector expf), returns the sum of the n values as
     * llama.cpp adds them: 16 at a time (a tree), the partial sums in double. */
    double (*softmax_exact)(float *s, int n, float max);
    /* s[j] = f16(s[j] * inv): normalized probabilities, rounded to f16 as the matmul with the
     * f16 V cache rounds them. */
    void (*probs_f16)(float *s, int n, float inv);
    /* out[i][e] = sum_j p[i][j] * v[j][e] for i < nq (at most 3), e < d, j < n, in `order` over
     * j (n padded with zeros to the order's step); acc: 3 * 64 * 32 floats of scratch. */
    void (*pv_exact)(float *const *out, int nq, const float *const *p, const uint16_t *const *v,
                     int n, int d, int order, float *acc);
} kern_vops;

enum { KERN_ORDER_DOT = 0, KERN_ORDER_GEMM = 1 };
enum { KERN_PV_ACC_FLOATS = 3 * 64 * 32 };

/* exp(x) computed as llama.cpp's vector expf (ggml_v_expf): the same float operations, so the
 * same bits (ops.c). */
float kern__expf(float x);
/* y[i] = f16(x[i]) as f32 (round to nearest even); y may equal x. */
void kern__f16_round_row(const float *x, float *y, int64_t n);

const kern_vops *kern__vops_get(void);
const kern_vops *kern__vops_get_ref(void);
void kern__vops_install_avx2(kern_vops *v);
/* After the AVX2 twins: the int8 K/V helpers for 16 lanes (ops_avx512.c). */
void kern__vops_install_avx512(kern_vops *v);

/* One head of one token as KERN_KV_Q8: q[e] = round(x[e] / s_g), s_g = max |x| over group g of
 * `group` elements / 127 rounded up to an f16 (sc[g]), so |q s_g - x| <= s_g / 2. */
void kern__kv_q8_row(const float *x, int8_t *q, uint16_t *sc, int d, int group);

/* Bulk conversions for the ops (kv_store, get_rows): the best variant, chosen with the table. */
void kern__f32_to_f16_row(const float *x, uint16_t *y, int64_t n);
void kern__f16_to_f32_row(const uint16_t *x, float *y, int64_t n);
void kern__f32_to_f16_row_avx2(const float *x, uint16_t *y, int64_t n);
void kern__f16_to_f32_row_avx2(const uint16_t *x, float *y, int64_t n);

/* The CPU backend's state, shared by backend.c (matmul, reserve), ops.c and attention.c. */
enum { KERN_ATT_ROWS = 16 };
enum { KERN_KV_MAX_DIM = 256 }; /* the largest head a rotated (kern_kv.rotate) Q8 cache takes */
/* Aborts with a message when kv asks for a rotation its head size does not allow (a caller's
 * bug: engine/decoder/model.c never asks). */
void kern__kv_check_rotate(const kern_kv *kv);   /* query rows (tokens x grouped heads) per attention unit, at most */

/* One thread's share of a matmul's row blocks (backend.c): the next block to claim and the end. */
typedef struct kern_share {
    _Alignas(64) _Atomic long next;   /* a cache line each */
    long end;
} kern_share;

typedef struct kern_cpu {
    kern_backend be;               /* be.ctx points back here */
    util_pool *pool;
    int nth;
    kern_share *share;             /* [nth], 64-byte aligned */
    const kern_vops *v;
    int max_tok;
    int64_t max_cols;
    int max_ctx;
    uint8_t *act;                  /* [max_tok] quantized activation rows */
    size_t act_bytes;
    uint8_t *scratch;              /* [nth][scratch_stride]: tile packing, attention scores */
    size_t scratch_stride;
    /* RoPE cos/sin of the last positions seen (every layer rotates the same ones). */
    float *rope_cs;                /* [max_tok][max_cols / 2][2] */
    int32_t *rope_pos;             /* [max_tok] */
    float *rope_ff;                /* [max_cols / 2]: the cached angles' freq_factors */
    int rope_n, rope_dim;
    float rope_base, rope_scale;
    bool rope_has_ff;              /* rope_ff holds them (false: none, all 1) */
    /* The encoder's entries (encoder.c): which f32 dense kernel runs up to how many tokens
     * (chosen by the first dense_kernels call), and scratch grown to the largest batch. */
    bool enc_ref;                  /* LLMGW_KERNELS=ref: the scalar references */
    int enc_packed, enc_packed_max;
    int enc_auto;                  /* KERN_DENSE_AUTO's race: 0 not run, 1 f32 won, 2 bf16 won */
    char enc_auto_why[88];         /* its times, in words */
    char enc_kernels[160];
    uint16_t *enc_xb;              /* a product's input in BF16 */
    size_t enc_xb_cap;
    float *enc_scores;             /* [nth][(head_dim + 4) x max_len rounded up to 16]: attention */
    size_t enc_scores_cap;
} kern_cpu;

void kern__op_get_rows(void *ctx, const kern_tensor *w, const int32_t *ids, int n, float *y);
void kern__op_rmsnorm(void *ctx, float *y, const float *x, const float *w, int64_t n, int n_tok,
                      float eps);
void kern__op_rope(void *ctx, float *x, const int32_t *pos, int n_tok, int n_head, int head_dim,
                   float theta_base, float freq_scale, const float *freq_factors, bool neox);
void kern__op_swiglu(void *ctx, float *y, const float *gate, const float *up, size_t n);
void kern__op_add(void *ctx, float *y, const float *x, size_t n);
void kern__op_add_row(void *ctx, float *y, const float *b, int64_t n, int n_tok);
void kern__op_kv_store(void *ctx, const kern_kv *kv, const kern_seq *seqs, int n_seq,
                       const float *k, const float *v, const int32_t *pos);
void kern__op_attention(void *ctx, const kern_attn *a);
/* The encoder's entries (encoder.c) and their scalar references (encoder_ref.c). */
/* encoder_amx.c: whether AMX BF16 tiles run here (cpuid, and the OS granted them: asked once),
 * and columns [n0, n1) of y = x W^T + bias (+ y when acc), epi (may be NULL) applied to each
 * 16-column piece of a row after; xb [T rounded up to 32][K] BF16 with zero rows past T,
 * wb encoder.c's BF16 packing, K a multiple of 32. */
bool kern__amx_usable(void);
/* Loads this thread's tile configuration (palette 1, tiles 0-7 of 16 rows x 64 bytes); only
 * where kern__amx_usable. The caller releases the tiles (_tile_release) when done. */
void kern__amx_tiles_16x64(void);
void kern__amx_bf16_gemm(const uint16_t *xb, int T, int K, const uint16_t *wb, const float *bias,
                         float *y, int N, int n0, int n1, bool acc, void (*epi)(float *, int));
kern_dense *kern__enc_dense_new(void *ctx, const float *w, const float *bias, int n, int k,
                                int precision);
void kern__enc_dense_free(void *ctx, kern_dense *d);
void kern__enc_dense(void *ctx, const kern_dense *d, const float *x, int n_tok, float *y,
                     bool accumulate, bool gelu);
const char *kern__enc_dense_kernels(void *ctx, const kern_dense *probe);
void kern__enc_layernorm(void *ctx, float *x, const float *w, const float *b, int64_t n,
                         int n_tok, float eps);
void kern__enc_gelu(void *ctx, float *x, size_t n);
void kern__enc_attention(void *ctx, const float *qkv, float *out, const int32_t *start,
                         int n_seq, int n_head, int head_dim);
void kern__enc_set_spin(void *ctx, uint64_t ns);
void kern__enc_dense_ref(const float *w, const float *bias, int n, int k, const float *x,
                         int n_tok, float *y, bool accumulate, bool gelu);
void kern__enc_layernorm_ref(float *x, const float *w, const float *b, int64_t n, int n_tok,
                             float eps);
void kern__enc_gelu_ref(float *x, size_t n);
void kern__enc_attention_ref(const float *qkv, float *out, const int32_t *start, int n_seq,
                             int n_head, int head_dim);

/* Bytes of per-thread scratch attention needs for contexts up to max_ctx. */
size_t kern__attention_scratch(int max_ctx, int64_t max_cols);

#endif
