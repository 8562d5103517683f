// kernels/cuda/rope.cu: rotary position embedding in place, one thread per rotated pair:
// pairs (2i, 2i+1) (llama) or (i, i + d/2) (neox, qwen2); angle of pair i
// freq_scale * (pos base^(-2i/d) / freq_factors[i]) (Llama-3.1's factors, or none).
#include "kernels/cuda/internal.cuh"

namespace {

__global__ void rope_kernel(float *x, const int32_t *pos, int n_tok, int n_head, int head_dim,
                            float theta_base, float freq_scale, const float *ff, bool neox)
{
    int half = head_dim / 2;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)n_tok * (size_t)n_head * (size_t)half)
        return;
    int p = (int)(i % (size_t)half);
    size_t th = i / (size_t)half;              // token * n_head + head
    int t = (int)(th / (size_t)n_head);
    float theta = (float)pos[t] * powf(theta_base, -2.0f * (float)p / (float)head_dim);
    if (ff != nullptr)
        theta /= ff[p];
    float s, c;
    sincosf(freq_scale * theta, &s, &c);
    float *h = x + th * (size_t)head_dim;
    int a = neox ? p : 2 * p, b = neox ? p + half : 2 * p + 1;
    float x0 = h[a], x1 = h[b];
    h[a] = x0 * c - x1 * s;
    h[b] = x0 * s + x1 * c;
}

}  // namespace

void kern_cuda_rope(void *ctx, float *x, const int32_t *pos, int n_tok, int n_head, int head_dim,
                    float theta_base, float freq_scale, const float *freq_factors, bool neox)
{
    kern_cuda *c = (kern_cuda *)ctx;
    kern_cuda_enter(c);
    if (n_tok <= 0)
        return;
    const int32_t *d_pos = (const int32_t *)kern_cuda_stage(c, pos, (size_t)n_tok * sizeof *pos);
    size_t n = (size_t)n_tok * (size_t)n_head * (size_t)(head_dim / 2);
    rope_kernel<<<kern_cuda_blocks(n, 256), 256, 0, c->stream>>>(
        x, d_pos, n_tok, n_head, head_dim, theta_base, freq_scale, freq_factors, neox);
    KERN_CUDA_LAUNCHED();
}
