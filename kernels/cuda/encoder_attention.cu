// kernels/cuda/encoder_attention.cu: BERT's bidirectional attention within each sequence of a
// batch packed without padding (qkv [T][3][n_head * head_dim]); one warp per (token, head),
// online softmax over the sequence's keys, each lane holding dims lane, lane + 32, ...
#include "kernels/cuda/internal.cuh"

namespace {

constexpr int kMaxDim = 256, kPerLane = kMaxDim / 32;

__global__ void encoder_attention_kernel(const float *qkv, float *out, const int32_t *start,
                                         int n_seq, int n_head, int head_dim)
{
    int t = start[0] + blockIdx.x, h = blockIdx.y, lane = threadIdx.x, d = head_dim;
    int lo = 0, hi = n_seq;   // the sequence holding token t: start[s] <= t < start[s + 1]
    while (hi - lo > 1) {
        int mid = (lo + hi) / 2;
        if (start[mid] <= t)
            lo = mid;
        else
            hi = mid;
    }
    int t0 = start[lo], t1 = start[lo + 1];
    size_t W = (size_t)n_head * (size_t)d, row = 3 * W;
    const float *q = qkv + (size_t)t * row + (size_t)h * (size_t)d;
    float qr[kPerLane], acc[kPerLane];
#pragma unroll
    for (int j = 0; j < kPerLane; j++) {
        int e = lane + 32 * j;
        qr[j] = e < d ? q[e] : 0.0f;
        acc[j] = 0.0f;
    }
    float scale = 1.0f / sqrtf((float)d), m = -INFINITY, l = 0.0f;
    for (int u = t0; u < t1; u++) {
        const float *k = qkv + (size_t)u * row + W + (size_t)h * (size_t)d;
        const float *v = k + W;
        float s = 0.0f;
#pragma unroll
        for (int j = 0; j < kPerLane; j++) {
            int e = lane + 32 * j;
            if (e < d)
                s += qr[j] * k[e];
        }
        s = kern_cuda_warp_sum(s) * scale;
        float m_new = fmaxf(m, s), old = expf(m - m_new), w = expf(s - m_new);
        l = l * old + w;
#pragma unroll
        for (int j = 0; j < kPerLane; j++) {
            int e = lane + 32 * j;
            if (e < d)
                acc[j] = acc[j] * old + w * v[e];
        }
        m = m_new;
    }
    float *o = out + (size_t)t * W + (size_t)h * (size_t)d;
#pragma unroll
    for (int j = 0; j < kPerLane; j++) {
        int e = lane + 32 * j;
        if (e < d)
            o[e] = acc[j] / l;
    }
}

}  // namespace

void kern_cuda_encoder_attention(void *ctx, const float *qkv, float *out, const int32_t *start,
                                 int n_seq, int n_head, int head_dim)
{
    kern_cuda *c = (kern_cuda *)ctx;
    kern_cuda_enter(c);
    int T = n_seq > 0 ? start[n_seq] - start[0] : 0;
    if (T <= 0)
        return;
    if (head_dim > kMaxDim)
        kern_cuda_fatal("encoder_attention", "head_dim over 256", __FILE__, __LINE__);
    const int32_t *d_start =
        (const int32_t *)kern_cuda_stage(c, start, ((size_t)n_seq + 1) * sizeof *start);
    encoder_attention_kernel<<<dim3(T, n_head), 32, 0, c->stream>>>(qkv, out, d_start, n_seq,
                                                                    n_head, head_dim);
    KERN_CUDA_LAUNCHED();
}
