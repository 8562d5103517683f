// kernels/cuda/attention.cu: causal grouped-query attention of a step's sequences through their
// block tables (decode and chunked prefill alike, all the sequences in one call: a launch per
// kind of row, not per sequence), over f16 or int8 KV (kern_kv), by one of two kernels. At
// head_dim 64 or 128 (every tier's) the tiled one (below), which reads each K/V row once for 16
// queries of a head in prefill (a sequence of kTiledMin rows or more), once for all the heads
// sharing it in decode (the other rows), and splits long contexts between blocks. Otherwise
// (and with LLMGW_CUDA_ATTN=query, to measure one against the other) one block per (query row,
// head): its four warps take every fourth
// position, each keeping a running maximum, denominator and weighted sum of V (online softmax,
// each lane holding dims lane, lane + 32, ...), and the warps' partial results are merged at
// the end. With rotated int8 KV the query is rotated first and
// the output rotated back (the Hadamard matrix is its own inverse).
#include "kernels/cuda/internal.cuh"

namespace {

constexpr int kWarps = 4, kMaxDim = 256, kPerLane = kMaxDim / 32;

struct attn_args {
    const float *q;
    float *out;
    const int32_t *pos, *tab;   // a row's position and its block table's start in pages
    uint8_t *const *pages;      // the sequences' block tables, back to back (kern_cuda_seqs)
    size_t k_off, v_off, k_row, v_row;
    int page_tokens, n_kv_head, head_dim, type, k_group, n_head;
    float scale;
    bool rotate;
};

// Position p's K and V rows of KV head kvh, through the block table at pages + tab.
__device__ __forceinline__ void kv_rows(const attn_args &a, int tab, int p, int kvh,
                                        const uint8_t **kp, const uint8_t **vp)
{
    const uint8_t *page = a.pages[tab + p / a.page_tokens];
    size_t slot = (size_t)(p % a.page_tokens) * (size_t)a.n_kv_head + (size_t)kvh;
    *kp = page + a.k_off + slot * a.k_row;
    *vp = page + a.v_off + slot * a.v_row;
}

// Element e of a K row (int8 with an f16 scale per k_group after the d values, or f16) and of
// a V row (int8 times its one scale, kv_vscale, or f16).
__device__ __forceinline__ float kv_k(const attn_args &a, const uint8_t *kp, int e, int d)
{
    return a.type == KERN_KV_Q8
               ? (float)((const int8_t *)kp)[e] * kern_cuda_ld_f16(kp + d + 2 * (e / a.k_group))
               : __half2float(((const __half *)kp)[e]);
}
__device__ __forceinline__ float kv_vscale(const attn_args &a, const uint8_t *vp, int d)
{
    return a.type == KERN_KV_Q8 ? kern_cuda_ld_f16(vp + d) : 0.0f;
}
__device__ __forceinline__ float kv_v(const attn_args &a, const uint8_t *vp, int e, float vscale)
{
    return a.type == KERN_KV_Q8 ? (float)((const int8_t *)vp)[e] * vscale
                                : __half2float(((const __half *)vp)[e]);
}

// Row rows[blockIdx.x], head blockIdx.y.
__global__ void attention_kernel(attn_args a, const int32_t *rows)
{
    __shared__ float qs[kMaxDim];
    __shared__ float part[kWarps][kMaxDim];
    __shared__ float pm[kWarps], pl[kWarps];
    int i = rows[blockIdx.x], h = blockIdx.y, d = a.head_dim, tab = a.tab[i];
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
    for (int p = warp; p < n_pos; p += kWarps) {
        const uint8_t *kp, *vp;
        kv_rows(a, tab, p, kvh, &kp, &vp);
        float s = 0.0f;
#pragma unroll
        for (int j = 0; j < kPerLane; j++) {
            int e = lane + 32 * j;
            if (e >= d)
                break;
            s += qr[j] * kv_k(a, kp, e, d);
        }
        s = kern_cuda_warp_sum(s) * a.scale;
        float m_new = fmaxf(m, s);
        float old = expf(m - m_new), w = expf(s - m_new);
        l = l * old + w;
        float vs = kv_vscale(a, vp, d);
#pragma unroll
        for (int j = 0; j < kPerLane; j++) {
            int e = lane + 32 * j;
            if (e >= d)
                break;
            float vv = kv_v(a, vp, e, vs);
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

// The tiled kernel, for head_dim D of 64 or 128. A block takes kQ query rows against one KV
// head: in prefill (BY_HEAD false: sequences of kTiledMin rows or more) kQ = 16 consecutive
// rows of one sequence (a tile: items[2x], its first row, and items[2x + 1], its rows) and one
// head, so each K/V row is read once per 16 queries; otherwise (decode, short chunks) the G
// heads that share the KV head, for one row (items[x]; kQ = 4, 8 or 16 >= G), so each K/V row
// is read once per token for all of them. The block walks its positions kP at a time: its
// warps copy the K and V rows of those positions into shared memory (decoded to floats), then
// each warp takes kQ / kWarps rows: a lane scores one position against them (the query rows
// read from shared memory by every lane at once), the warp updates the rows' running maximum
// and denominator (online softmax), and each lane adds the weighted V of the kP positions to
// its dims (lane, lane + 32, ...). Positions past a row's own are masked out. Long contexts
// are also split between blocks (by head only: blockIdx.z, span positions each, the last
// taking the rest), which write their unnormalized sums, maximum and denominator per (item,
// head) (attn_part) for combine_kernel to merge.
constexpr int kP = 32, kTiledMin = 64, kSplit = 128;

// Block z's partial result for one (token, head) row: the sum of e^(s - m) v over its
// positions, their maximum score m and the sum of e^(s - m).
template <int D> struct attn_part {
    float acc[D];
    float m, l;
};

template <int D, int KQ, bool BY_HEAD>
__global__ void attention_tiled_kernel(attn_args a, const int32_t *items, attn_part<D> *parts,
                                       int span)
{
    constexpr int kPer = D / 32, kRows = KQ / kWarps;
    __shared__ float qs[KQ][D];
    __shared__ float4 ks[kP][D / 4 + 1];   // a row's floats four at a time, padded: no conflicts
    __shared__ float vs[kP][D];
    __shared__ float ps[kWarps][kP][kRows];   // each warp's weights, by position
    __shared__ int qpos[KQ], qtok[KQ], qhead[KQ];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int group = a.n_head / a.n_kv_head;
    int kvh = BY_HEAD ? (int)blockIdx.y : (int)blockIdx.y / group;
    int first = BY_HEAD ? items[blockIdx.x] : items[2 * blockIdx.x];
    int count = BY_HEAD ? 1 : items[2 * blockIdx.x + 1];
    int tab = a.tab[first];   // the rows' sequence's block table
    // Row r's token and head (-1: no row; it computes a copy of row 0 and writes nothing).
    for (int r = threadIdx.x; r < KQ; r += blockDim.x) {
        int i = BY_HEAD ? first : first + r;
        int hh = BY_HEAD ? kvh * group + r : (int)blockIdx.y;
        bool real = BY_HEAD ? r < group : r < count;
        qtok[r] = real ? i : -1;
        qhead[r] = real ? hh : -1;
        qpos[r] = a.pos[real ? i : first];
    }
    __syncthreads();
    for (int e = threadIdx.x; e < KQ * D; e += blockDim.x) {
        int r = e / D, i = qtok[r] >= 0 ? qtok[r] : qtok[0];
        int hh = qhead[r] >= 0 ? qhead[r] : qhead[0];
        qs[r][e % D] = a.q[((size_t)i * (size_t)a.n_head + (size_t)hh) * D + e % D];
    }
    __syncthreads();
    if (a.rotate)
        for (int r = 0; r < KQ; r++)
            kern_cuda_hadamard(qs[r], D);
    int last = 0;
    for (int r = 0; r < KQ; r++)
        last = qpos[r] > last ? qpos[r] : last;
    int begin = (int)blockIdx.z * span;   // this block's positions: begin .. end - 1
    int end = blockIdx.z + 1 == gridDim.z || begin + span > last ? last + 1 : begin + span;
    const int r0 = warp * kRows;
    float m[kRows], l[kRows], acc[kRows][kPer];
#pragma unroll
    for (int r = 0; r < kRows; r++) {
        m[r] = -INFINITY;
        l[r] = 0.0f;
#pragma unroll
        for (int j = 0; j < kPer; j++)
            acc[r][j] = 0.0f;
    }
    for (int p0 = begin; p0 < end; p0 += kP) {
        __syncthreads();   // every warp done with the previous positions
        for (int pp = warp; pp < kP; pp += kWarps) {
            int p = p0 + pp;
            float *kd = (float *)ks[pp];
            if (p >= end) {   // past every row's: zeros (masked below)
#pragma unroll
                for (int j = 0; j < kPer; j++)
                    kd[lane + 32 * j] = vs[pp][lane + 32 * j] = 0.0f;
                continue;
            }
            const uint8_t *kp, *vp;
            kv_rows(a, tab, p, kvh, &kp, &vp);
            float vscale = kv_vscale(a, vp, D);
#pragma unroll
            for (int j = 0; j < kPer; j++) {
                int e = lane + 32 * j;
                kd[e] = kv_k(a, kp, e, D);
                vs[pp][e] = kv_v(a, vp, e, vscale);
            }
        }
        __syncthreads();
        // Scores: lane = position p0 + lane, against the warp's rows.
        float s[kRows];
#pragma unroll
        for (int r = 0; r < kRows; r++)
            s[r] = 0.0f;
#pragma unroll 8
        for (int e4 = 0; e4 < D / 4; e4++) {
            float4 k4 = ks[lane][e4];
#pragma unroll
            for (int r = 0; r < kRows; r++) {
                float4 q4 = ((const float4 *)qs[r0 + r])[e4];
                s[r] += q4.x * k4.x + q4.y * k4.y + q4.z * k4.z + q4.w * k4.w;
            }
        }
#pragma unroll
        for (int r = 0; r < kRows; r++) {
            float sc = p0 + lane <= qpos[r0 + r] ? s[r] * a.scale : -INFINITY;
            // Finite: a block's first tile holds a position of every row's own (position 0 in
            // prefill; in decode a split starts at or before its token's position, or is empty).
            float m_new = fmaxf(m[r], kern_cuda_warp_max(sc));
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
            float w[kRows];
#pragma unroll
            for (int r = 0; r < kRows; r++)
                w[r] = ps[warp][pp][r];
#pragma unroll
            for (int j = 0; j < kPer; j++) {
                float vv = vs[pp][lane + 32 * j];
#pragma unroll
                for (int r = 0; r < kRows; r++)
                    acc[r][j] += w[r] * vv;
            }
        }
    }
    if (gridDim.z > 1) {   // partial sums, merged by combine_kernel
#pragma unroll
        for (int r = 0; r < kRows; r++) {
            if (qtok[r0 + r] < 0)
                continue;
            size_t row = (size_t)blockIdx.x * (size_t)a.n_head + (size_t)qhead[r0 + r];
            attn_part<D> *pt = parts + row * gridDim.z + blockIdx.z;
#pragma unroll
            for (int j = 0; j < kPer; j++)
                pt->acc[lane + 32 * j] = acc[r][j];
            if (lane == 0) {
                pt->m = m[r];
                pt->l = l[r];
            }
        }
        return;
    }
    __syncthreads();   // the queries' rows are written over with the outputs
#pragma unroll
    for (int r = 0; r < kRows; r++)
#pragma unroll
        for (int j = 0; j < kPer; j++)
            qs[r0 + r][lane + 32 * j] = acc[r][j] / l[r];
    __syncthreads();
    if (a.rotate)
        for (int r = 0; r < KQ; r++)
            kern_cuda_hadamard(qs[r], D);
    for (int e = threadIdx.x; e < KQ * D; e += blockDim.x) {
        int r = e / D;
        if (qtok[r] >= 0)
            a.out[((size_t)qtok[r] * (size_t)a.n_head + (size_t)qhead[r]) * D + e % D] =
                qs[r][e % D];
    }
}

// One (item, head) row from its splits' partial results, into row items[item]'s: a block of D
// threads per (item, head).
template <int D>
__global__ void combine_kernel(const attn_part<D> *parts, int splits, const int32_t *items,
                               int n_head, float *out, bool rotate)
{
    __shared__ float o[D];
    const attn_part<D> *pt = parts + (size_t)blockIdx.x * splits;
    float mx = -INFINITY;
    for (int z = 0; z < splits; z++)
        mx = fmaxf(mx, pt[z].m);
    float num = 0.0f, den = 0.0f;
    for (int z = 0; z < splits; z++) {   // a split past the row's position: -inf, 0, 0
        float f = expf(pt[z].m - mx);
        num += pt[z].acc[threadIdx.x] * f;
        den += pt[z].l * f;
    }
    o[threadIdx.x] = num / den;
    __syncthreads();
    if (rotate)
        kern_cuda_hadamard(o, D);
    size_t row = (size_t)items[blockIdx.x / n_head] * n_head + blockIdx.x % n_head;
    out[row * D + threadIdx.x] = o[threadIdx.x];
}

// The tiled kernel for head_dim D over n_tiles prefill tiles (tiles: first row, rows).
template <int D> void attention_tiles(kern_cuda *c, const attn_args &a, const int32_t *tiles,
                                      int n_tiles)
{
    dim3 grid(n_tiles, a.n_head);
    attention_tiled_kernel<D, 16, false><<<grid, 32 * kWarps, 0, c->stream>>>(a, tiles, nullptr,
                                                                              0);
    KERN_CUDA_LAUNCHED();
}

// The tiled kernel for head_dim D by KV head over n rows (group <= 16), whose largest position
// is last: where the blocks are too few for the multiprocessors, their positions split (kSplit
// each, more where the splits are capped: as many as the scratch holds) and merged.
template <int D> void attention_by_head(kern_cuda *c, const attn_args &a, const int32_t *rows,
                                        int n, int last)
{
    int group = a.n_head / a.n_kv_head;
    size_t parts_rows = (size_t)n * (size_t)a.n_head;
    int splits = (last + kSplit) / kSplit;
    int want = (int)((2 * (size_t)c->n_sm + (size_t)n * a.n_kv_head - 1) /
                     ((size_t)n * a.n_kv_head));
    splits = splits < want ? splits : want;
    size_t fit = c->wh_cap / (parts_rows * sizeof(attn_part<D>));
    splits = (size_t)splits <= fit ? splits : (int)fit;
    splits = splits > 1 ? splits : 1;
    // Each split's positions: a multiple of kP, the last split taking the rest.
    int span = ((last + 1 + splits - 1) / splits + kP - 1) / kP * kP;
    attn_part<D> *parts = (attn_part<D> *)c->wh;   // the dequantization tiles' scratch
    dim3 grid(n, a.n_kv_head, splits);
    if (group <= 4)
        attention_tiled_kernel<D, 4, true><<<grid, 32 * kWarps, 0, c->stream>>>(a, rows, parts,
                                                                                span);
    else if (group <= 8)
        attention_tiled_kernel<D, 8, true><<<grid, 32 * kWarps, 0, c->stream>>>(a, rows, parts,
                                                                                span);
    else
        attention_tiled_kernel<D, 16, true><<<grid, 32 * kWarps, 0, c->stream>>>(a, rows, parts,
                                                                                 span);
    KERN_CUDA_LAUNCHED();
    if (splits > 1) {
        combine_kernel<D><<<(unsigned)parts_rows, D, 0, c->stream>>>(parts, splits, rows,
                                                                     a.n_head, a.out, a.rotate);
        KERN_CUDA_LAUNCHED();
    }
}

}  // namespace

void kern_cuda_attention(void *ctx, const kern_attn *at)
{
    kern_cuda *c = (kern_cuda *)ctx;
    kern_cuda_enter(c);
    const kern_kv *kv = &at->kv;
    bool rot = kv->rotate && kv->type == KERN_KV_Q8;   // only int8 rows are stored rotated
    if (kv->head_dim > kMaxDim || (rot && (kv->head_dim & (kv->head_dim - 1)) != 0))
        kern_cuda_fatal("attention", "head_dim over 256, or rotated and not a power of two",
                        __FILE__, __LINE__);
    int d = kv->head_dim, group = at->n_head / kv->n_kv_head;
    bool tiled = !c->attn_per_query && (d == 64 || d == 128);
    // The rows of sequences of kTiledMin rows or more go in prefill tiles of 16 (tiled); the
    // others one at a time (by KV head where tiled and the group is at most 16, else per query).
    int n_tiles = 0, n_one = 0, last_one = -1;
    for (int s = 0; s < at->n_seq; s++) {
        const kern_seq *sq = &at->seqs[s];
        if (tiled && sq->n_tok >= kTiledMin) {
            n_tiles += (sq->n_tok + 15) / 16;
            continue;
        }
        n_one += sq->n_tok > 0 ? sq->n_tok : 0;
        for (int t = sq->tok0; t < sq->tok0 + sq->n_tok; t++)
            last_one = at->pos[t] > last_one ? at->pos[t] : last_one;
    }
    kern_cuda_seqs st = kern_cuda_seqs_build(c, at->seqs, at->n_seq, at->pos, kv->page_tokens,
                                             2 * n_tiles + n_one);
    int32_t *tile = st.extra_host, *one = st.extra_host + 2 * n_tiles;   // the row lists
    for (int s = 0; s < at->n_seq; s++) {
        const kern_seq *sq = &at->seqs[s];
        bool tiles = tiled && sq->n_tok >= kTiledMin;
        for (int t = sq->tok0; t < sq->tok0 + sq->n_tok; t += tiles ? 16 : 1) {
            if (!tiles) {
                *one++ = t;
                continue;
            }
            *tile++ = t;
            *tile++ = sq->tok0 + sq->n_tok - t < 16 ? sq->tok0 + sq->n_tok - t : 16;
        }
    }
    kern_cuda_seqs_stage(c, &st, 1);
    int kg = kv->k_group > 0 ? kv->k_group : kv->head_dim;
    attn_args a = {
        at->q, at->out, st.pos, st.tab, st.pages,
        kv->k_off, kv->v_off, kern_kv_row_bytes(kv->type, kv->head_dim, kg),
        kern_kv_row_bytes(kv->type, kv->head_dim, kv->head_dim), kv->page_tokens,
        kv->n_kv_head, kv->head_dim, kv->type, kg, at->n_head, at->scale, rot,
    };
    const int32_t *tiles = st.extra, *ones = st.extra + 2 * n_tiles;
    if (n_tiles > 0 && d == 64)
        attention_tiles<64>(c, a, tiles, n_tiles);
    if (n_tiles > 0 && d == 128)
        attention_tiles<128>(c, a, tiles, n_tiles);
    if (n_one == 0)
        return;
    if (tiled && group <= 16 && d == 64) {
        attention_by_head<64>(c, a, ones, n_one, last_one);
    } else if (tiled && group <= 16 && d == 128) {
        attention_by_head<128>(c, a, ones, n_one, last_one);
    } else {
        attention_kernel<<<dim3(n_one, at->n_head), 32 * kWarps, 0, c->stream>>>(a, ones);
        KERN_CUDA_LAUNCHED();
    }
}
