// kernels/cuda/quantize_q8.cu: activations rounded to int8 in blocks of 32 for the integer
// products (mmvq.cu, mmq.cu): one warp a block, a lane a value (kernels/cuda/qdot.cuh has the
// contract).
#include "kernels/cuda/qdot.cuh"

#include <float.h>

namespace {

__global__ void quantize_q8_kernel(const float *x, int8_t *q, float2 *ds, size_t n_blocks)
{
    size_t blk = (size_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (blk >= n_blocks)   // whole warps: a warp is one block
        return;
    int lane = threadIdx.x & 31;
    float v = x[blk * 32 + lane];
    bool bad = !(fabsf(v) <= FLT_MAX);
    float amax = kern_cuda_warp_max(bad ? 0.0f : fabsf(v));
    bool any_bad = kern_cuda_warp_max(bad ? 1.0f : 0.0f) > 0.0f;
    float d = amax / 127.0f;
    int qi = any_bad || amax == 0.0f ? 0 : (int)roundf(v / d);
    q[blk * 32 + lane] = (int8_t)qi;
    float sum = kern_cuda_warp_sum((float)qi);   // exact: at most 32 * 127
    if (lane == 0)
        ds[blk] = any_bad ? float2{NAN, NAN} : float2{d, d * sum};
}

}  // namespace

void kern_cuda_quantize_q8(kern_cuda *c, const float *x, int n_tok, int64_t cols,
                           const int8_t **xq, const float2 **xds)
{
    size_t n = (size_t)n_tok * (size_t)cols, n_blocks = n / 32;
    bool held = c->q8_held.x == x && c->q8_held.n_tok == n_tok && c->q8_held.cols == cols;
    int8_t *q = (int8_t *)kern_cuda_scratch(c, &c->xh, &c->xh_cap, n + n_blocks * sizeof(float2));
    float2 *ds = (float2 *)(q + n);   // n is a multiple of 32: 8-aligned
    *xq = q;
    *xds = ds;
    if (held)   // rounded by the product before, x unchanged since
        return;
    c->q8_held = {x, n_tok, cols};
    quantize_q8_kernel<<<kern_cuda_blocks(n, KERN_CUDA_ROW_THREADS), KERN_CUDA_ROW_THREADS, 0,
                         c->stream>>>(x, q, ds, n_blocks);
    KERN_CUDA_LAUNCHED();
}
