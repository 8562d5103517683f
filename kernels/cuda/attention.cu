// kernels/cuda/attention.cu: causal grouped-query attention of one sequence through its block
// table (decode and chunked prefill alike), over f16 or int8 KV (kern_kv), by one of two
// kernels. Prefill chunks of 64 tokens or more at head_dim 64 or 128 take the tiled one (below:
// a tile of 16 queries reads each K/V row once). Otherwise one block per (query token, head):
// its four warps take every fourth position, each keeping a running maximum, denominator and
// weighted sum of V (online softmax, each lane holding dims lane, lane + 32, ...), and the
// warps' partial results are merged at the end. With rotated int8 KV the query
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


// Prefill (a chunk of kTiledMin tokens or more, head_dim D of 64 or 128): one block per tile of
// kQ query tokens and one head, so each K/V row is read once per tile instead of once per
// query. The block walks the positions kP at a time up to its last query's: its warps copy
// the K and V rows of those positions into shared memory (decoded to floats), then each warp
// takes kQ / kWarps queries: a lane scores one position against them (the query rows read from
// shared memory by every lane at once), the warp updates the rows' running maximum and
// denominator (online softmax), and each lane adds the weighted V of the kP positions to its
// dims (lane, lane + 32, ...). Positions past a query's own are masked out.
constexpr int kQ = 16, kP = 32, kRowsPerWarp = kQ / kWarps, kTiledMin = 64;

template <int D>
__global__ void attention_tiled_kernel(attn_args a, int n_tok)
{
    constexpr int kPer = D / 32;
    __shared__ float qs[kQ][D];
    __shared__ float4 ks[kP][D / 4 + 1];   // a row's floats four at a time, padded: no conflicts
    __shared__ float vs[kP][D];
    __shared__ float ps[kWarps][kP][kRowsPerWarp];   // each warp's weights, by position
    __shared__ int qpos[kQ];
    int i0 = blockIdx.x * kQ, h = blockIdx.y;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int kvh = h / (a.n_head / a.n_kv_head);
    bool q8 = a.type == KERN_KV_Q8;
    for (int r = threadIdx.x; r < kQ; r += blockDim.x)   // rows past n_tok copy the first's
        qpos[r] = a.pos[i0 + r < n_tok ? i0 + r : i0];
    for (int e = threadIdx.x; e < kQ * D; e += blockDim.x) {
        int r = e / D, i = i0 + r < n_tok ? i0 + r : i0;
        qs[r][e % D] = a.q[((size_t)i * (size_t)a.n_head + (size_t)h) * D + e % D];
    }
    __syncthreads();
    if (a.rotate)
        for (int r = 0; r < kQ; r++)
            kern_cuda_hadamard(qs[r], D);
    int last = 0;
    for (int r = 0; r < kQ; r++)
        last = qpos[r] > last ? qpos[r] : last;
    const int r0 = warp * kRowsPerWarp;
    float m[kRowsPerWarp], l[kRowsPerWarp], acc[kRowsPerWarp][kPer];
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; r++) {
        m[r] = -INFINITY;
        l[r] = 0.0f;
#pragma unroll
        for (int j = 0; j < kPer; j++)
            acc[r][j] = 0.0f;
    }
    for (int p0 = 0; p0 <= last; p0 += kP) {
        __syncthreads();   // every warp done with the previous positions
        for (int pp = warp; pp < kP; pp += kWarps) {
            int p = p0 + pp;
            float *kd = (float *)ks[pp];
            if (p > last) {   // past every query: zeros (masked below)
#pragma unroll
                for (int j = 0; j < kPer; j++)
                    kd[lane + 32 * j] = vs[pp][lane + 32 * j] = 0.0f;
                continue;
            }
            const uint8_t *page = a.pages[p / a.page_tokens];
            size_t slot = (size_t)(p % a.page_tokens) * (size_t)a.n_kv_head + (size_t)kvh;
            const uint8_t *kp = page + a.k_off + slot * a.k_row;
            const uint8_t *vp = page + a.v_off + slot * a.v_row;
            float vscale = q8 ? kern_cuda_ld_f16(vp + D) : 0.0f;
#pragma unroll
            for (int j = 0; j < kPer; j++) {
                int e = lane + 32 * j;
                kd[e] = q8 ? (float)((const int8_t *)kp)[e] *
                                 kern_cuda_ld_f16(kp + D + 2 * (e / a.k_group))
                           : __half2float(((const __half *)kp)[e]);
                vs[pp][e] = q8 ? (float)((const int8_t *)vp)[e] * vscale
                               : __half2float(((const __half *)vp)[e]);
            }
        }
        __syncthreads();
        // Scores: lane = position p0 + lane, against the warp's rows.
        float s[kRowsPerWarp];
#pragma unroll
        for (int r = 0; r < kRowsPerWarp; r++)
            s[r] = 0.0f;
#pragma unroll 8
        for (int e4 = 0; e4 < D / 4; e4++) {
            float4 k4 = ks[lane][e4];
#pragma unroll
            for (int r = 0; r < kRowsPerWarp; r++) {
                float4 q4 = ((const float4 *)qs[r0 + r])[e4];
                s[r] += q4.x * k4.x + q4.y * k4.y + q4.z * k4.z + q4.w * k4.w;
            }
        }
#pragma unroll
        for (int r = 0; r < kRowsPerWarp; r++) {
            float sc = p0 + lane <= qpos[r0 + r] ? s[r] * a.scale : -INFINITY;
            float m_new = fmaxf(m[r], kern_cuda_warp_max(sc));   // finite: position 0 counts
            float corr = expf(m[r] - m_new), w = expf(sc - m_new);
            l[r] = l[r] * corr + kern_cuda_warp_sum(w);
            m[r] = m_new;
#pragma unroll
            for (int j = 0; j < kPer; j++)
                acc[r][j] *= corr;
            ps[warp][lane][r] = w;
        }
        __syncwarp();   // every lane's weights written
#pragma unroll 4
        for (int pp = 0; pp < kP; pp++) {
            float w[kRowsPerWarp];
#pragma unroll
            for (int r = 0; r < kRowsPerWarp; r++)
                w[r] = ps[warp][pp][r];
#pragma unroll
            for (int j = 0; j < kPer; j++) {
                float vv = vs[pp][lane + 32 * j];
#pragma unroll
                for (int r = 0; r < kRowsPerWarp; r++)
                    acc[r][j] += w[r] * vv;
            }
        }
    }
    __syncthreads();   // the queries' rows are written over with the outputs
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; r++)
#pragma unroll
        for (int j = 0; j < kPer; j++)
            qs[r0 + r][lane + 32 * j] = acc[r][j] / l[r];
    __syncthreads();
    if (a.rotate)
        for (int r = 0; r < kQ; r++)
            kern_cuda_hadamard(qs[r], D);
    for (int e = threadIdx.x; e < kQ * D; e += blockDim.x) {
        int r = e / D, i = i0 + r;
        if (i < n_tok)
            a.out[((size_t)i * (size_t)a.n_head + (size_t)h) * D + e % D] = qs[r][e % D];
    }
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
    dim3 tiles(kern_cuda_blocks((size_t)at->n_tok, kQ), at->n_head);
    if (at->n_tok >= kTiledMin && kv->head_dim == 64)
        attention_tiled_kernel<64><<<tiles, 32 * kWarps, 0, c->stream>>>(a, at->n_tok);
    else if (at->n_tok >= kTiledMin && kv->head_dim == 128)
        attention_tiled_kernel<128><<<tiles, 32 * kWarps, 0, c->stream>>>(a, at->n_tok);
    else
        attention_kernel<<<dim3(at->n_tok, at->n_head), 32 * kWarps, 0, c->stream>>>(a);
    KERN_CUDA_LAUNCHED();
}
