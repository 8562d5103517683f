// kernels/cuda/attention.cu: causal grouped-query attention of one sequence through its block
// table (decode and chunked prefill alike), over f16 or int8 KV (kern_kv). One block per (query
// token, head): its four warps take every fourth position, each keeping a running maximum,
// denominator and weighted sum of V (online softmax, each lane holding dims lane, lane + 32,
// ...), and the warps' partial results are merged at the end. With rotated int8 KV the query
// is rotated first and the output rotated back (the Hadamard matrix is its own inverse).
#include "kernels/cuda/internal.cuh"

namespace {

constexpr int kWarps = 4, kMaxDim = 256, kPerLane = kMaxDim / 32;

struct attn_args {
    const float *q;
    float *out;
    const int32_t *pos;
    uint8_t *const *pages;
    size_t k_off, v_off, k_row, v_row;
    int page_tokens, n_kv_head, head_dim, type, k_group, n_head;
    float scale;
    bool rotate;
};

__global__ void attention_kernel(attn_args a)
{
    __shared__ float qs[kMaxDim];
    __shared__ float part[kWarps][kMaxDim];
    __shared__ float pm[kWarps], pl[kWarps];
    int i = blockIdx.x, h = blockIdx.y, d = a.head_dim;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int kvh = h / (a.n_head / a.n_kv_head);
    const float *q = a.q + ((size_t)i * (size_t)a.n_head + (size_t)h) * (size_t)d;
    for (int e = threadIdx.x; e < d; e += blockDim.x)
        qs[e] = q[e];
    __syncthreads();
    if (a.rotate)
        kern_cuda_hadamard(qs, d);
    float qr[kPerLane], acc[kPerLane];
#pragma unroll
    for (int j = 0; j < kPerLane; j++) {
        int e = lane + 32 * j;
        qr[j] = e < d ? qs[e] : 0.0f;
        acc[j] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    int n_pos = a.pos[i] + 1;
    bool q8 = a.type == KERN_KV_Q8;
    for (int p = warp; p < n_pos; p += kWarps) {
        const uint8_t *page = a.pages[p / a.page_tokens];
        size_t slot = (size_t)(p % a.page_tokens) * (size_t)a.n_kv_head + (size_t)kvh;
        const uint8_t *kp = page + a.k_off + slot * a.k_row;
        const uint8_t *vp = page + a.v_off + slot * a.v_row;
        float s = 0.0f;
#pragma unroll
        for (int j = 0; j < kPerLane; j++) {
            int e = lane + 32 * j;
            if (e >= d)
                break;
            float kv = q8 ? (float)((const int8_t *)kp)[e] *
                                kern_cuda_ld_f16(kp + d + 2 * (e / a.k_group))
                          : __half2float(((const __half *)kp)[e]);
            s += qr[j] * kv;
        }
        s = kern_cuda_warp_sum(s) * a.scale;
        float m_new = fmaxf(m, s);
        float old = expf(m - m_new), w = expf(s - m_new);
        l = l * old + w;
        float vs = q8 ? kern_cuda_ld_f16(vp + d) : 0.0f;
#pragma unroll
        for (int j = 0; j < kPerLane; j++) {
            int e = lane + 32 * j;
            if (e >= d)
                break;
            float vv = q8 ? (float)((const int8_t *)vp)[e] * vs
                          : __half2float(((const __half *)vp)[e]);
            acc[j] = acc[j] * old + w * vv;
        }
        m = m_new;
    }
    if (lane == 0) {
        pm[warp] = m;
        pl[warp] = l;
    }
#pragma unroll
    for (int j = 0; j < kPerLane; j++) {
        int e = lane + 32 * j;
        if (e < d)
            part[warp][e] = acc[j];
    }
    __syncthreads();
    float mx = -INFINITY;
    for (int w = 0; w < kWarps; w++)
        mx = fmaxf(mx, pm[w]);
    float den = 0.0f;
    for (int w = 0; w < kWarps; w++)
        den += pm[w] == -INFINITY ? 0.0f : pl[w] * expf(pm[w] - mx);
    for (int e = threadIdx.x; e < d; e += blockDim.x) {
        float num = 0.0f;
        for (int w = 0; w < kWarps; w++)
            num += pm[w] == -INFINITY ? 0.0f : part[w][e] * expf(pm[w] - mx);
        qs[e] = num / den;
    }
    __syncthreads();
    if (a.rotate)
        kern_cuda_hadamard(qs, d);
    float *out = a.out + ((size_t)i * (size_t)a.n_head + (size_t)h) * (size_t)d;
    for (int e = threadIdx.x; e < d; e += blockDim.x)
        out[e] = qs[e];
}

}  // namespace

void kern_cuda_attention(void *ctx, const kern_attn *at)
{
    kern_cuda *c = (kern_cuda *)ctx;
    kern_cuda_enter(c);
    if (at->n_tok <= 0)
        return;
    const kern_kv *kv = &at->kv;
    bool rot = kv->rotate && kv->type == KERN_KV_Q8;   // only int8 rows are stored rotated
    if (kv->head_dim > kMaxDim || (rot && (kv->head_dim & (kv->head_dim - 1)) != 0))
        kern_cuda_fatal("attention", "head_dim over 256, or rotated and not a power of two",
                        __FILE__, __LINE__);
    int last = 0;
    for (int t = 0; t < at->n_tok; t++)
        last = at->pos[t] > last ? at->pos[t] : last;
    size_t n_pages = (size_t)(last / kv->page_tokens + 1);
    int kg = kv->k_group > 0 ? kv->k_group : kv->head_dim;
    attn_args a = {
        at->q, at->out,
        (const int32_t *)kern_cuda_stage(c, at->pos, (size_t)at->n_tok * sizeof *at->pos),
        (uint8_t *const *)kern_cuda_stage(c, kv->pages, n_pages * sizeof *kv->pages),
        kv->k_off, kv->v_off, kern_kv_row_bytes(kv->type, kv->head_dim, kg),
        kern_kv_row_bytes(kv->type, kv->head_dim, kv->head_dim), kv->page_tokens,
        kv->n_kv_head, kv->head_dim, kv->type, kg, at->n_head, at->scale, rot,
    };
    attention_kernel<<<dim3(at->n_tok, at->n_head), 32 * kWarps, 0, c->stream>>>(a);
    KERN_CUDA_LAUNCHED();
}
