// kernels/cuda/kv_store.cu: writes a step's new tokens' K and V into their sequences' pages (the
// layout of kern_kv): f16 rows, or int8 rows with f16 scales (optionally Hadamard-rotated
// first), with the CPU's rules: the scale is max |x| / 127 rounded up to the next f16, q =
// round(x / scale). One launch for all the sequences, a block per (row, KV head).
#include "kernels/cuda/internal.cuh"

namespace {

constexpr int kMaxDim = 256;

struct kv_args {
    uint8_t *const *pages;    // device copy of the sequences' block tables
    const int32_t *pos, *tab;   // a row's position and its table's start (kern_cuda_seqs)
    size_t k_off, v_off, k_row, v_row;
    int page_tokens, n_kv_head, head_dim, type, k_group;
    bool rotate;
};

__device__ void q8_row(const float *x, int8_t *q, uint8_t *scales, int d, int group,
                       float *sc_shared)
{
    int groups = d / group;
    for (int g = threadIdx.x; g < groups; g += blockDim.x) {
        float amax = 0.0f;
        for (int e = 0; e < group; e++)
            amax = fmaxf(amax, fabsf(x[g * group + e]));
        __half h = __float2half_rn(amax / 127.0f);
        if (__half2float(h) < amax / 127.0f)
            h = __ushort_as_half((unsigned short)(__half_as_ushort(h) + 1));
        unsigned short u = __half_as_ushort(h);
        scales[2 * g] = (uint8_t)(u & 0xff);
        scales[2 * g + 1] = (uint8_t)(u >> 8);
        sc_shared[g] = __half2float(h);
    }
    __syncthreads();
    for (int e = threadIdx.x; e < d; e += blockDim.x) {
        float s = sc_shared[e / group], inv = s > 0.0f ? 1.0f / s : 0.0f;
        float r = roundf(x[e] * inv);
        q[e] = (int8_t)(r > 127.0f ? 127.0f : r < -127.0f ? -127.0f : r);
    }
    __syncthreads();
}

__global__ void kv_store_kernel(kv_args a, const float *k, const float *v)
{
    __shared__ float kr[kMaxDim], vr[kMaxDim], sc[kMaxDim];
    int t = blockIdx.x, h = blockIdx.y, d = a.head_dim;
    if (a.tab[t] < 0)   // a row of no sequence
        return;
    int p = a.pos[t];
    uint8_t *page = a.pages[a.tab[t] + p / a.page_tokens];
    size_t slot = (size_t)(p % a.page_tokens) * (size_t)a.n_kv_head + (size_t)h;
    uint8_t *kd = page + a.k_off + slot * a.k_row, *vd = page + a.v_off + slot * a.v_row;
    const float *kt = k + ((size_t)t * (size_t)a.n_kv_head + (size_t)h) * (size_t)d;
    const float *vt = v + ((size_t)t * (size_t)a.n_kv_head + (size_t)h) * (size_t)d;
    if (a.type != KERN_KV_Q8) {
        for (int e = threadIdx.x; e < d; e += blockDim.x) {
            ((__half *)kd)[e] = __float2half_rn(kt[e]);
            ((__half *)vd)[e] = __float2half_rn(vt[e]);
        }
        return;
    }
    for (int e = threadIdx.x; e < d; e += blockDim.x) {
        kr[e] = kt[e];
        vr[e] = vt[e];
    }
    __syncthreads();
    if (a.rotate) {
        kern_cuda_hadamard(kr, d);
        kern_cuda_hadamard(vr, d);
    }
    q8_row(kr, (int8_t *)kd, kd + d, d, a.k_group, sc);
    q8_row(vr, (int8_t *)vd, vd + d, d, d, sc);
}

}  // namespace

void kern_cuda_kv_store(void *ctx, const kern_kv *kv, const kern_seq *seqs, int n_seq,
                        const float *k, const float *v, const int32_t *pos)
{
    kern_cuda *c = (kern_cuda *)ctx;
    kern_cuda_enter(c);
    bool rot = kv->rotate && kv->type == KERN_KV_Q8;   // only int8 rows are stored rotated
    if (kv->head_dim > kMaxDim || (rot && (kv->head_dim & (kv->head_dim - 1)) != 0))
        kern_cuda_fatal("kv_store", "head_dim over 256, or rotated and not a power of two",
                        __FILE__, __LINE__);
    kern_cuda_seqs sq = kern_cuda_seqs_build(c, seqs, n_seq, pos, kv->page_tokens, 0);
    kern_cuda_seqs_stage(c, &sq, 0);
    if (sq.n_rows == 0)
        return;
    int kg = kv->k_group > 0 ? kv->k_group : kv->head_dim;
    kv_args a = {
        sq.pages, sq.pos, sq.tab, kv->k_off, kv->v_off,
        kern_kv_row_bytes(kv->type, kv->head_dim, kg),
        kern_kv_row_bytes(kv->type, kv->head_dim, kv->head_dim), kv->page_tokens, kv->n_kv_head,
        kv->head_dim, kv->type, kg, rot,
    };
    kv_store_kernel<<<dim3(sq.n_rows, kv->n_kv_head), 128, 0, c->stream>>>(a, k, v);
    KERN_CUDA_LAUNCHED();
}
