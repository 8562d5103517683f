// kernels/cuda/backend.cu: the CUDA kern_backend — one per engine instance or encoding context
// (its own stream and cuBLAS handle), its buffers (device memory), the staging of host index
// arrays, scratch, and the table of its ops (one per .cu in this folder; recording a step as a
// graph in graph.cu).
#include "kernels/cuda/cuda.h"
#include "kernels/cuda/internal.cuh"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void kern_cuda_fatal(const char *call, const char *why, const char *file, int line)
{
    fprintf(stderr, "llmgw: CUDA: %s failed: %s (%s:%d)\n", call, why, file, line);
    abort();
}

extern "C" int kern_cuda_device_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();  // clear the sticky error
        return 0;
    }
    return n;
}

void kern_cuda_enter(kern_cuda *c)
{
    c->q8_held.x = nullptr;
    int cur = -1;
    if (cudaGetDevice(&cur) != cudaSuccess || cur != c->device)
        KERN_CUDA_CHECK(cudaSetDevice(c->device));
}

// n bytes of the ring to fill (*dev: where the kernels read them), then sent: NULL while a
// recording that had no room for them is being dropped (then send does nothing).
static uint8_t *stage_take(kern_cuda *c, size_t n, const void **dev)
{
    size_t need = (n + 255) / 256 * 256;
    if (need > c->stage_cap)
        kern_cuda_fatal("stage", "an index array larger than the staging ring (reserve)",
                        __FILE__, __LINE__);
    if (c->recording)
        c->rec_staged += need;
    if (c->stage_off + need > c->stage_cap) {
        if (c->recording) {   // waiting for the stream would break the recording: drop it
            c->record_failed = true;
            *dev = c->stage_dev;
            return nullptr;
        }
        // Every earlier copy out of the ring has run once the stream drains.
        KERN_CUDA_CHECK(cudaStreamSynchronize(c->stream));
        c->stage_off = 0;
        c->stage_epoch++;   // the bytes staged so far will be written over
    }
    uint8_t *h = c->stage_host + c->stage_off;
    *dev = c->stage_dev + c->stage_off;
    c->stage_off += need;
    return h;
}

static void stage_send(kern_cuda *c, const uint8_t *host, size_t n)
{
    if (host == nullptr)
        return;
    void *d = c->stage_dev + (host - c->stage_host);
    KERN_CUDA_CHECK(cudaMemcpyAsync(d, host, n, cudaMemcpyHostToDevice, c->stream));
}

const void *kern_cuda_stage(kern_cuda *c, const void *host, size_t n)
{
    const void *d;
    uint8_t *h = stage_take(c, n, &d);
    if (h != nullptr)
        memcpy(h, host, n);
    stage_send(c, h, n);
    return d;
}

kern_cuda_seqs kern_cuda_seqs_build(kern_cuda *c, const kern_seq *seqs, int n_seq,
                                    const int32_t *pos, int page_tokens, int extra)
{
    kern_cuda_seqs r = {};
    for (int s = 0; s < n_seq; s++) {
        int last = -1;
        for (int t = seqs[s].tok0; t < seqs[s].tok0 + seqs[s].n_tok; t++)
            last = pos[t] > last ? pos[t] : last;
        if (last >= 0)
            r.n_pages += (size_t)(last / page_tokens + 1);
        if (seqs[s].n_tok > 0 && seqs[s].tok0 + seqs[s].n_tok > r.n_rows)
            r.n_rows = seqs[s].tok0 + seqs[s].n_tok;
    }
    r.bytes = r.n_pages * sizeof(void *) + (2 * (size_t)r.n_rows + (size_t)extra) * 4;
    if (r.bytes > c->seq_build_cap) {
        size_t cap = r.bytes > 2 * c->seq_build_cap ? r.bytes : 2 * c->seq_build_cap;
        uint8_t *p = (uint8_t *)realloc(c->seq_build, cap);
        if (p == nullptr)
            kern_cuda_fatal("realloc", "no host memory to stage a step's sequences", __FILE__,
                            __LINE__);
        c->seq_build = p;
        c->seq_build_cap = cap;
    }
    uint8_t *h = c->seq_build;
    uint8_t **pages = (uint8_t **)h;
    int32_t *hpos = (int32_t *)(h + r.n_pages * sizeof(void *)), *htab = hpos + r.n_rows;
    for (int t = 0; t < r.n_rows; t++) {   // a row of no sequence: position 0, no table
        hpos[t] = 0;
        htab[t] = -1;
    }
    size_t at = 0;
    for (int s = 0; s < n_seq; s++) {
        int last = -1;
        for (int t = seqs[s].tok0; t < seqs[s].tok0 + seqs[s].n_tok; t++) {
            last = pos[t] > last ? pos[t] : last;
            hpos[t] = pos[t];
            htab[t] = (int32_t)at;
        }
        if (last < 0)
            continue;
        size_t np = (size_t)(last / page_tokens + 1);
        memcpy(pages + at, seqs[s].pages, np * sizeof *pages);
        at += np;
    }
    r.extra_host = htab + r.n_rows;
    return r;
}

void kern_cuda_seqs_stage(kern_cuda *c, kern_cuda_seqs *s, int kind)
{
    auto &held = c->seq_held[kind];
    const void *d;
    if (held.host != nullptr && held.epoch == c->stage_epoch && held.n == s->bytes &&
        memcmp(held.host, c->seq_build, s->bytes) == 0) {
        d = held.dev;   // staged by an earlier layer of this step
    } else {
        uint8_t *h = stage_take(c, s->bytes, &d);
        if (h != nullptr) {
            memcpy(h, c->seq_build, s->bytes);
            stage_send(c, h, s->bytes);
        }
        held.host = h;   // NULL (nothing kept) for a recording being dropped
        held.dev = d;
        held.n = s->bytes;
        held.epoch = c->stage_epoch;
    }
    s->pages = (uint8_t *const *)d;
    s->pos = (const int32_t *)((const uint8_t *)d + s->n_pages * sizeof(void *));
    s->tab = s->pos + s->n_rows;
    s->extra = s->tab + s->n_rows;
}

int kern_cuda_stage_resize(kern_cuda *c, size_t bytes)
{
    KERN_CUDA_CHECK(cudaStreamSynchronize(c->stream));
    cudaFreeHost(c->stage_host);
    cudaFree(c->stage_dev);
    c->stage_host = c->stage_dev = nullptr;
    c->stage_cap = c->stage_off = 0;
    c->stage_epoch++;
    if (cudaMallocHost(&c->stage_host, bytes) != cudaSuccess ||
        cudaMalloc(&c->stage_dev, bytes) != cudaSuccess) {
        cudaGetLastError();
        cudaFreeHost(c->stage_host);
        c->stage_host = nullptr;
        return LLMGW_ENOMEM;
    }
    c->stage_cap = bytes;
    return 0;
}

// Device memory *p of at least n bytes (capacity *cap): replaced, after the stream drains,
// when smaller; false (and nothing held) when the memory is not there.
static bool regrow(kern_cuda *c, void **p, size_t *cap, size_t n)
{
    if (n <= *cap)
        return true;
    KERN_CUDA_CHECK(cudaStreamSynchronize(c->stream));
    KERN_CUDA_CHECK(cudaFree(*p));
    *p = nullptr;
    *cap = 0;
    if (cudaMalloc(p, n) != cudaSuccess) {
        cudaGetLastError();
        *p = nullptr;
        return false;
    }
    *cap = n;
    return true;
}

void *kern_cuda_scratch(kern_cuda *c, void **p, size_t *cap, size_t n)
{
    if (c->recording && n > *cap) {   // growing waits for the stream: drop the recording
        c->record_failed = true;
        return *p;
    }
    if (!regrow(c, p, cap, n))
        kern_cuda_fatal("cudaMalloc", "out of device memory for scratch", __FILE__, __LINE__);
    return *p;
}

namespace {

int cuda_n_threads(void *ctx)
{
    (void)ctx;
    return 1;
}

const char *cuda_kernels(void *ctx)
{
    return ((kern_cuda *)ctx)->kernels;
}

bool cuda_supports_type(void *ctx, uint32_t type)
{
    (void)ctx;
    switch (type) {
    case KERN_TYPE_F32: case KERN_TYPE_F16: case KERN_TYPE_BF16: case KERN_TYPE_Q4_0:
    case KERN_TYPE_Q4_1: case KERN_TYPE_Q8_0: case KERN_TYPE_Q4_K: case KERN_TYPE_Q6_K:
        return true;
    default:
        return false;
    }
}

// Staging ring for max_tok positions and a block table of max_ctx pages, many times over (a
// step stages a few arrays per layer and sequence); f16 activations for max_tok x max_cols;
// the tiles quantized weights are decoded into for cuBLAS.
int cuda_reserve(void *ctx, int max_tok, int64_t max_cols, int max_ctx)
{
    kern_cuda *c = (kern_cuda *)ctx;
    kern_cuda_enter(c);
    kern_cuda_not_recording(c, "reserve");
    size_t per_step = (size_t)max_tok * 4 + (size_t)max_ctx * sizeof(void *) + 512;
    size_t stage = per_step * 64 > ((size_t)4 << 20) ? per_step * 64 : ((size_t)4 << 20);
    if (stage > c->stage_cap && kern_cuda_stage_resize(c, stage) != 0)
        return LLMGW_ENOMEM;
    // Dequantized weight tiles (matmul.cu): 64 MiB (LLMGW_CUDA_DEQUANT_MIB), or 256 rows of the
    // widest matrix.
    size_t wh = c->wh_want;
    if ((size_t)max_cols * 256 * sizeof(__half) > wh)
        wh = (size_t)max_cols * 256 * sizeof(__half);
    size_t xh = (size_t)max_tok * (size_t)max_cols * sizeof(__half);
    if (!regrow(c, &c->wh, &c->wh_cap, wh) || !regrow(c, &c->xh, &c->xh_cap, xh))
        return LLMGW_ENOMEM;
    return 0;
}

void cuda_destroy(void *ctx)
{
    kern_cuda *c = (kern_cuda *)ctx;
    if (c == nullptr)
        return;
    cudaSetDevice(c->device);   // unchecked: also the cleanup of a failed construction
    if (c->stream != nullptr)
        cudaStreamSynchronize(c->stream);
    kern_cuda_graphs_free(c);
    if (c->blas != nullptr)
        cublasDestroy(c->blas);
    cudaFreeHost(c->stage_host);
    cudaFree(c->stage_dev);
    free(c->seq_build);
    cudaFree(c->xh);
    cudaFree(c->wh);
    if (c->stream != nullptr)
        cudaStreamDestroy(c->stream);
    free(c);
}

void *cuda_buffer_alloc(void *ctx, size_t bytes)
{
    kern_cuda *c = (kern_cuda *)ctx;
    kern_cuda_enter(c);
    kern_cuda_not_recording(c, "buffer_alloc");
    void *p = nullptr;
    if (bytes == 0 || cudaMalloc(&p, bytes) != cudaSuccess) {
        cudaGetLastError();
        return nullptr;
    }
    return p;
}

void cuda_buffer_free(void *ctx, void *buf, size_t bytes)
{
    (void)bytes;
    kern_cuda *c = (kern_cuda *)ctx;
    if (buf == nullptr)
        return;
    kern_cuda_enter(c);
    kern_cuda_not_recording(c, "buffer_free");
    KERN_CUDA_CHECK(cudaStreamSynchronize(c->stream));
    KERN_CUDA_CHECK(cudaFree(buf));
}

void cuda_copy_in(void *ctx, void *buf, size_t off, const void *src, size_t n)
{
    kern_cuda *c = (kern_cuda *)ctx;
    kern_cuda_enter(c);
    kern_cuda_not_recording(c, "buffer_copy_in");
    if (n == 0)
        return;
    KERN_CUDA_CHECK(cudaMemcpyAsync((uint8_t *)buf + off, src, n, cudaMemcpyHostToDevice,
                                    c->stream));
    KERN_CUDA_CHECK(cudaStreamSynchronize(c->stream));
}

void cuda_copy_out(void *ctx, const void *buf, size_t off, void *dst, size_t n)
{
    kern_cuda *c = (kern_cuda *)ctx;
    kern_cuda_enter(c);
    kern_cuda_not_recording(c, "buffer_copy_out");
    if (n > 0)
        KERN_CUDA_CHECK(cudaMemcpyAsync(dst, (const uint8_t *)buf + off, n,
                                        cudaMemcpyDeviceToHost, c->stream));
    KERN_CUDA_CHECK(cudaStreamSynchronize(c->stream));
}

void cuda_copy(void *ctx, void *dst, const void *src, size_t n)
{
    kern_cuda *c = (kern_cuda *)ctx;
    kern_cuda_enter(c);
    if (n > 0)
        KERN_CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, c->stream));
}

void cuda_set_spin(void *ctx, uint64_t ns)
{
    (void)ctx;
    (void)ns;
}

// Whether environment variable name is set to value (the backend's measurement switches).
bool env_is(const char *name, const char *value)
{
    const char *v = getenv(name);
    return v != nullptr && strcmp(v, value) == 0;
}

}  // namespace

extern "C" kern_backend *kern_cuda_backend_new(int index, char *why, size_t cap)
{
    int n = kern_cuda_device_count();
    if (index < 0 || index >= n) {
        snprintf(why, cap, "device 'cuda:%d': this machine has %d CUDA device%s", index, n,
                 n == 1 ? "" : "s");
        return nullptr;
    }
    kern_cuda *c = (kern_cuda *)calloc(1, sizeof *c);
    if (c == nullptr) {
        snprintf(why, cap, "device 'cuda:%d': out of host memory", index);
        return nullptr;
    }
    c->device = index;
    cudaDeviceProp prop;
    cudaError_t e = cudaSetDevice(index);
    if (e == cudaSuccess)
        e = cudaGetDeviceProperties(&prop, index);
    if (e == cudaSuccess)
        e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
        snprintf(why, cap, "device 'cuda:%d': %s", index, cudaGetErrorString(e));
        cudaGetLastError();
        cuda_destroy(c);
        return nullptr;
    }
    cublasStatus_t s = cublasCreate(&c->blas);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasSetStream(c->blas, c->stream);
    if (s != CUBLAS_STATUS_SUCCESS) {
        snprintf(why, cap, "device 'cuda:%d': cuBLAS: %s", index, cublasGetStatusString(s));
        cuda_destroy(c);
        return nullptr;
    }
    c->n_sm = prop.multiProcessorCount > 0 ? prop.multiProcessorCount : 1;
    c->quant_f32 = env_is("LLMGW_CUDA_QUANT", "f32");
    // LLMGW_CUDA_DEQUANT_MIB: the dequantization tiles' size (scripts/gpu-check measures
    // prefill at several: whether a tile that stays in L2 beats fewer, larger GEMMs).
    const char *mib = getenv("LLMGW_CUDA_DEQUANT_MIB");
    long tile_mib = mib != nullptr ? strtol(mib, nullptr, 10) : 64;
    c->wh_want = (size_t)(tile_mib >= 1 && tile_mib <= 4096 ? tile_mib : 64) << 20;
    // LLMGW_CUDA_ATTN=query: every attention call by the per-query kernel (attention.cu), the
    // one before the tiled kernel (to measure one against the other).
    c->attn_per_query = env_is("LLMGW_CUDA_ATTN", "query");
    snprintf(c->kernels, sizeof c->kernels,
             "cuda sm_%d%d (%.60s), quantized products %s, dequant tiles %zu MiB, attention %s",
             prop.major, prop.minor, prop.name, c->quant_f32 ? "f32" : "int8", c->wh_want >> 20,
             c->attn_per_query ? "per query" : "tiled");
    snprintf(c->name, sizeof c->name, "cuda:%d", index);
    c->be.name = c->name;
    c->be.ctx = c;
    c->be.n_threads = cuda_n_threads;
    c->be.kernels = cuda_kernels;
    c->be.supports_type = cuda_supports_type;
    c->be.reserve = cuda_reserve;
    c->be.destroy = cuda_destroy;
    c->be.buffer_alloc = cuda_buffer_alloc;
    c->be.buffer_free = cuda_buffer_free;
    c->be.buffer_copy_in = cuda_copy_in;
    c->be.buffer_copy_out = cuda_copy_out;
    c->be.copy = cuda_copy;
    c->be.host_memory = false;
    c->be.matmul = kern_cuda_matmul;
    c->be.get_rows = kern_cuda_get_rows;
    c->be.rmsnorm = kern_cuda_rmsnorm;
    c->be.rope = kern_cuda_rope;
    c->be.swiglu = kern_cuda_swiglu;
    c->be.add = kern_cuda_add;
    c->be.add_row = kern_cuda_add_row;
    c->be.kv_store = kern_cuda_kv_store;
    c->be.attention = kern_cuda_attention;
    c->be.dense_new = kern_cuda_dense_new;
    c->be.dense_free = kern_cuda_dense_free;
    c->be.dense = kern_cuda_dense;
    c->be.dense_kernels = kern_cuda_dense_kernels;
    c->be.layernorm = kern_cuda_layernorm;
    c->be.gelu = kern_cuda_gelu;
    c->be.encoder_attention = kern_cuda_encoder_attention;
    c->be.set_spin = cuda_set_spin;
    c->be.step_record = kern_cuda_step_record;
    c->be.step_run = kern_cuda_step_run;
    c->graphs = env_is("LLMGW_CUDA_GRAPHS", "1");
    // The staging ring, before any reserve: dense_new and the encoder stage without one.
    if (cuda_reserve(c, 256, 0, 4096) != 0) {
        snprintf(why, cap, "device 'cuda:%d': out of device memory", index);
        cuda_destroy(c);
        return nullptr;
    }
    return &c->be;
}
