// kernels/cuda/internal.cuh: what the CUDA backend's files share: its context (one per
// kern_backend: a device, a stream, a cuBLAS handle, staging and scratch), the call checks, and
// each op's entry (one op per .cu; backend.cu puts them in the kern_backend). The entries have
// the CPU backend's contracts (kernels/backend.h); pointers to floats, weights and pages are
// device memory, index arrays (ids, pos, block tables, starts) host memory, staged here.
#ifndef LLMGW_KERNELS_CUDA_INTERNAL_CUH
#define LLMGW_KERNELS_CUDA_INTERNAL_CUH

extern "C" {   // the C headers have no guards of their own
#include "kernels/backend.h"
#include "kernels/cuda/cuda.h"
}

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <stddef.h>
#include <stdint.h>

#include <type_traits>

// A failed CUDA or cuBLAS call is a fault of the device or of this code, never of a request:
// it aborts with the call, its reason and where.
[[noreturn]] void kern_cuda_fatal(const char *call, const char *why, const char *file, int line);
#define KERN_CUDA_CHECK(call)                                                                    \
    do {                                                                                         \
        cudaError_t e_ = (call);                                                                 \
        if (e_ != cudaSuccess)                                                                   \
            kern_cuda_fatal(#call, cudaGetErrorString(e_), __FILE__, __LINE__);                   \
    } while (0)
#define KERN_CUBLAS_CHECK(call)                                                                  \
    do {                                                                                         \
        cublasStatus_t s_ = (call);                                                              \
        if (s_ != CUBLAS_STATUS_SUCCESS)                                                         \
            kern_cuda_fatal(#call, cublasGetStatusString(s_), __FILE__, __LINE__);               \
    } while (0)
// After every kernel launch.
#define KERN_CUDA_LAUNCHED() KERN_CUDA_CHECK(cudaGetLastError())

// A step's graph, ready to launch again (graph.cu).
typedef struct kern_cuda_graph {
    const void *key;
    int n_tok;
    cudaGraphExec_t exec;
} kern_cuda_graph;

typedef struct kern_cuda {
    kern_backend be;
    int device;
    int n_sm;                  // its multiprocessors (launch shapes that fill them)
    char name[16];             // be.name: "cuda:N", where it computes
    cudaStream_t stream;       // every call of this backend is ordered on it
    cublasHandle_t blas;       // bound to stream
    char kernels[160];
    // Host index arrays go through a pinned ring and its device twin: copied asynchronously on
    // the stream, so a kernel enqueued after reads them; the ring restarts (after a stream
    // synchronisation) when full.
    uint8_t *stage_host, *stage_dev;
    size_t stage_cap, stage_off;
    unsigned stage_epoch;      // counts the times the ring's earlier bytes stopped being kept
    // A step's sequences, staged once for all its layers (kern_cuda_seqs_stage): built in
    // seq_build, then compared with what the last call of each kind (K/V store, attention)
    // staged, still in the ring while the epoch is the same.
    uint8_t *seq_build;
    size_t seq_build_cap;
    struct {
        const uint8_t *host;   // in the ring: its bytes, and their device twin
        const void *dev;
        size_t n;
        unsigned epoch;
    } seq_held[2];
    // Scratch (reserve): activations as f16 or bf16 for cuBLAS, tiles of quantized weights
    // decoded to f16 for batched products.
    void *xh;
    size_t xh_cap;
    void *wh;
    size_t wh_cap, wh_want;   // wh_want: the tiles' size asked for (LLMGW_CUDA_DEQUANT_MIB)
    // Steps recorded as CUDA graphs (graph.cu): on with LLMGW_CUDA_GRAPHS=1, for steps of up
    // to KERN_CUDA_GRAPH_MAX_TOK tokens (no cuBLAS call: matmul drops a recording that reaches
    // one and marks it unfit; no scratch to grow). While recording, a
    // call that cannot be recorded (a staging ring too full to take an array without waiting)
    // marks the recording failed instead of waiting; step_run then drops it.
    bool graphs, recording, record_failed;
    const void *rec_key;       // the step being recorded: its key and size, and the bytes it
    int rec_n_tok;             // staged (counted on when the ring had no room)
    size_t rec_staged;
    size_t stage_want;         // the ring a dropped recording needed: made at the next one
    kern_cuda_graph graph[16];  // the graphs of earlier steps, by key and size
    int graph_next;            // the one a new graph replaces
    bool record_unfit;         // the recording reached a call graphs cannot hold (cuBLAS)
    kern_cuda_graph unfit[16];  // keys and sizes not recorded again (no exec), newest replacing
    int unfit_next;
    kern_cuda_graph_stats graph_stats;
    bool quant_f32;   // LLMGW_CUDA_QUANT=f32: quantized products in floats (mmv.cu, cuBLAS)
    // The activations xh holds rounded to int8 (quantize_q8.cu): x's n_tok rows of cols. The
    // next quantized product of the same rows takes them as they are (Q, K and V of a layer,
    // its gate and up) while no other call came between: kern_cuda_enter forgets them, matmul
    // keeps them unless its output overlaps x or it writes xh itself (cuBLAS).
    struct {
        const float *x;
        int n_tok;
        int64_t cols;
    } q8_held;
    bool attn_per_query;   // LLMGW_CUDA_ATTN=query: attention by the per-query kernel only
} kern_cuda;

// Makes the backend's device current for this thread (calls come from the engine's thread);
// every entry calls it first. It forgets the rounded activations (q8_held): the call may write
// their rows.
void kern_cuda_enter(kern_cuda *c);
// A device copy of n bytes of host data, readable by kernels enqueued after on c->stream.
const void *kern_cuda_stage(kern_cuda *c, const void *host, size_t n);
// A kv_store's or attention's sequences (kern_seq) as their kernels read them: row i (i <
// n_rows, the rows up to the sequences' last) at position pos[i], its sequence's block table
// at pages + tab[i] (tab[i] = -1: a row of no sequence, position 0), device memory. With extra
// ints more: the caller's own arrays, at extra. kern_cuda_seqs_build lays them out on the host
// (n_rows, extra_host to fill); kern_cuda_seqs_stage then makes them readable on the device (the pointers),
// reusing the copy the previous call of the same kind (0: K/V store, 1: attention) made
// when the bytes are the same and still staged: a step's layers stage them once.
struct kern_cuda_seqs {
    uint8_t *const *pages;
    const int32_t *pos, *tab;
    const int32_t *extra;
    int n_rows;
    int32_t *extra_host;
    size_t n_pages, bytes;
};
kern_cuda_seqs kern_cuda_seqs_build(kern_cuda *c, const kern_seq *seqs, int n_seq,
                                    const int32_t *pos, int page_tokens, int extra);
void kern_cuda_seqs_stage(kern_cuda *c, kern_cuda_seqs *s, int kind);
// The staging ring replaced by one of bytes (after the stream drains): 0, or LLMGW_ENOMEM
// with no ring left (reserve fails then).
int kern_cuda_stage_resize(kern_cuda *c, size_t bytes);
// Scratch of at least n bytes in *p (capacity *cap), grown after the stream drains.
void *kern_cuda_scratch(kern_cuda *c, void **p, size_t *cap, size_t n);
// Aborts when a step is being recorded: call is one that waits for the stream (a copy out,
// a free), which a recording cannot hold.
void kern_cuda_not_recording(const kern_cuda *c, const char *call);
// The backend's step_record and step_run (graph.cu), and what it frees at destroy.
bool kern_cuda_step_record(void *ctx, const void *key, int n_tok);
bool kern_cuda_step_run(void *ctx);
void kern_cuda_graphs_free(kern_cuda *c);

// Threads per block for row-wise kernels.
enum { KERN_CUDA_ROW_THREADS = 256 };

static inline unsigned kern_cuda_blocks(size_t n, unsigned threads)
{
    return (unsigned)((n + threads - 1) / threads);
}

// ---- the ops (kernels/backend.h has their contracts) ----
void kern_cuda_matmul(void *ctx, const kern_tensor *w, const float *x, int n_tok, float *y,
                      int64_t ldy);
// Matrix times a few activation rows (n_tok <= KERN_CUDA_MMV_MAX), weights decoded in
// registers (mmv.cu).
enum { KERN_CUDA_MMV_MAX = 8 };
void kern_cuda_mmv(kern_cuda *c, const kern_tensor *w, const float *x, int n_tok, float *y,
                   int64_t ldy);
// The same for quantized weights against activations rounded to int8 in blocks of 32, with
// integer dot products (mmvq.cu); false, with nothing done, for a type or placement it does
// not take.
bool kern_cuda_mmvq(kern_cuda *c, const kern_tensor *w, const float *x, int n_tok, float *y,
                    int64_t ldy);
// Quantized weights times up to KERN_CUDA_MMQ_MAX activation rows (beyond the matrix-vector
// kernels' 8), in integer arithmetic as mmvq (mmq.cu); false, with nothing done, where mmvq
// would be.
enum { KERN_CUDA_MMQ_MAX = 64 };
bool kern_cuda_mmq(kern_cuda *c, const kern_tensor *w, const float *x, int n_tok, float *y,
                   int64_t ldy);
// Calls launch(std::integral_constant<int, NT>()) for the token count NT, of those the
// matrix-vector kernels are compiled for (1, 2, 4, KERN_CUDA_MMV_MAX), that is the smallest
// to hold n_tok (1 <= n_tok <= KERN_CUDA_MMV_MAX).
template <typename F> void kern_cuda_mmv_tokens(int n_tok, F &&launch)
{
    if (n_tok == 1)
        launch(std::integral_constant<int, 1>());
    else if (n_tok <= 2)
        launch(std::integral_constant<int, 2>());
    else if (n_tok <= 4)
        launch(std::integral_constant<int, 4>());
    else
        launch(std::integral_constant<int, KERN_CUDA_MMV_MAX>());
}
// w as f16 [rows][cols] into dst (dequant.cu).
void kern_cuda_dequant_f16(kern_cuda *c, const kern_tensor *w, __half *dst);
// x [n] f32 to f16 or bf16 (dequant.cu).
void kern_cuda_f32_to_f16(kern_cuda *c, const float *x, __half *y, size_t n);
void kern_cuda_f32_to_bf16(kern_cuda *c, const float *x, __nv_bfloat16 *y, size_t n);
void kern_cuda_get_rows(void *ctx, const kern_tensor *w, const int32_t *ids, int n, float *y);
void kern_cuda_rmsnorm(void *ctx, float *y, const float *x, const float *w, int64_t n, int n_tok,
                       float eps);
void kern_cuda_rope(void *ctx, float *x, const int32_t *pos, int n_tok, int n_head, int head_dim,
                    float theta_base, float freq_scale, const float *freq_factors, bool neox);
void kern_cuda_swiglu(void *ctx, float *y, const float *gate, const float *up, size_t n);
void kern_cuda_add(void *ctx, float *y, const float *x, size_t n);
void kern_cuda_add_row(void *ctx, float *y, const float *b, int64_t n, int n_tok);
void kern_cuda_kv_store(void *ctx, const kern_kv *kv, const kern_seq *seqs, int n_seq,
                        const float *k, const float *v, const int32_t *pos);
void kern_cuda_attention(void *ctx, const kern_attn *a);
kern_dense *kern_cuda_dense_new(void *ctx, const float *w, const float *bias, int n, int k,
                                int precision);
void kern_cuda_dense_free(void *ctx, kern_dense *d);
void kern_cuda_dense(void *ctx, const kern_dense *d, const float *x, int n_tok, float *y,
                     bool accumulate, bool gelu);
const char *kern_cuda_dense_kernels(void *ctx, const kern_dense *probe);
void kern_cuda_layernorm(void *ctx, float *x, const float *w, const float *b, int64_t n,
                         int n_tok, float eps);
void kern_cuda_gelu(void *ctx, float *x, size_t n);
void kern_cuda_encoder_attention(void *ctx, const float *qkv, float *out, const int32_t *start,
                                 int n_seq, int n_head, int head_dim);

// ---- device helpers shared by the kernels ----
__device__ __forceinline__ float kern_cuda_warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float kern_cuda_warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets it.
__device__ __forceinline__ float kern_cuda_block_sum(float v, float *shared32)
{
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = kern_cuda_warp_sum(v);
    __syncthreads();   // shared32 may still be read by a previous call
    if (lane == 0)
        shared32[warp] = v;
    __syncthreads();
    v = lane < nw ? shared32[lane] : 0.0f;
    return kern_cuda_warp_sum(v);
}

// An f16 stored little-endian at any even or odd address.
__device__ __forceinline__ float kern_cuda_ld_f16(const uint8_t *p)
{
    unsigned short u = (unsigned short)(p[0] | (p[1] << 8));
    return __half2float(__ushort_as_half(u));
}

// The orthonormal Walsh-Hadamard transform of x[d] in shared memory (d a power of two), by the
// block's threads; the same butterflies and final scale as the CPU's (kernels/cpu/ops.c).
__device__ __forceinline__ void kern_cuda_hadamard(float *x, int d)
{
    for (int len = 1; len < d; len <<= 1) {
        __syncthreads();
        for (int p = threadIdx.x; p < d / 2; p += blockDim.x) {
            int i = (p / len) * 2 * len + p % len;
            float a = x[i], b = x[i + len];
            x[i] = a + b;
            x[i + len] = a - b;
        }
    }
    __syncthreads();
    float s = 1.0f / sqrtf((float)d);
    for (int i = threadIdx.x; i < d; i += blockDim.x)
        x[i] *= s;
    __syncthreads();
}

#endif
