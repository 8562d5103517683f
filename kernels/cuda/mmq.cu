// kernels/cuda/mmq.cu: quantized weights times KERN_CUDA_MMV_MAX + 1 to KERN_CUDA_MMQ_MAX
// activation rows (batched decode, short prefill chunks) in integer arithmetic, each weight read
// from memory once per tile of up to 32 tokens. Before it, such batches took the cuBLAS path:
// the weights decoded to f16 in scratch and read back by the GEMM, about 8 times the quantized
// weights' bytes of memory traffic a call whatever the batch (Q4_K: 0.56 bytes a weight read, 2
// written, 2 read again), where these products, at 32 tokens, take about 21 instructions a
// weight (Q4_K, the compiled sm_90a loop).
//
// The activations are rounded to int8 in blocks of 32 (quantize_q8.cu). A block of 8 warps
// takes 32 weight rows, a lane each, and NT tokens (blockIdx.y picks which NT); it steps through
// the columns 8 chunks of 32 at a time, warp w taking chunk w of each step, so the 8 warps split
// a row's columns and add their sums at the end. A step's int8 activations and scales are
// copied into shared memory, where every lane of a warp reads the same chunk's (a broadcast),
// and each lane decodes its chunk of its row in registers once (kernels/cuda/qdot.cuh) and
// dots it with every token's. The loads for the next step (weights into registers, the
// activations' share of each thread) are issued before this step's products, which hide them.
// Where the rows make too few blocks to fill the device (a 1024-row K/V projection: 32), the
// columns are also split between blocks (blockIdx.z), whose sums a second kernel adds in a
// fixed order.
#include "kernels/cuda/qdot.cuh"

namespace {

constexpr int kWarps = 8;             // chunks per step, a warp each
constexpr int kRows = 32;             // rows per block, a lane each
constexpr int kThreads = 32 * kWarps;

// y (leading dimension ldy) takes the sums; with the columns split between blocks, block z
// sums split_steps steps and writes at y + z * split_stride.
template <int T, int NT>
__global__ void __launch_bounds__(kThreads)
    mmq_kernel(const uint8_t *w, size_t row_bytes, int64_t rows, int64_t cols, const int8_t *xq,
               const float2 *xds, int n_tok, int64_t split_steps, float *y, int64_t ldy,
               size_t split_stride)
{
    constexpr int kX = NT * kWarps * 2, kXPer = (kX + kThreads - 1) / kThreads;   // int4 halves
    constexpr int kD = NT * kWarps, kDPer = (kD + kThreads - 1) / kThreads;       // scales
    __shared__ int4 xs[NT][kWarps][2];      // a step's activations: token, chunk, half
    __shared__ float2 ds[NT][kWarps];       // and their blocks' scales and sums
    __shared__ float part[kWarps][NT][kRows];   // each warp's sums, added at the end
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int64_t r = (int64_t)blockIdx.x * kRows + lane;
    bool live = r < rows;   // lanes past the last row still copy and wait
    const uint8_t *row = w + (size_t)(live ? r : 0) * row_bytes;
    int64_t chunks = cols / 32, all_steps = (chunks + kWarps - 1) / kWarps;
    int64_t s0 = (int64_t)blockIdx.z * split_steps;   // this block's steps: s0 .. steps - 1
    int64_t steps = s0 + split_steps < all_steps ? s0 + split_steps : all_steps;
    int t0 = (int)blockIdx.y * NT;
    y += (size_t)blockIdx.z * split_stride;
    // Step s's loads: this lane's weight chunk into raw, this thread's share of the step's
    // activations and scales into xr and dr (zeros past the last token or chunk).
    kern_cuda_qraw raw = {};
    int4 xr[kXPer];
    float2 dr[kDPer];
    auto fetch = [&](int64_t s) {
        int64_t c = s * kWarps + warp;
        if (live && c < chunks)
            kern_cuda_qfetch<T>(row, c, raw);
#pragma unroll
        for (int i = 0; i < kXPer; i++) {
            int e = (int)threadIdx.x + i * kThreads, t = e / (kWarps * 2);
            int64_t cc = s * kWarps + (e / 2) % kWarps;
            xr[i] = int4{0, 0, 0, 0};
            if (e < kX && t0 + t < n_tok && cc < chunks)
                xr[i] = ((const int4 *)(xq + (size_t)(t0 + t) * (size_t)cols +
                                        (size_t)cc * 32))[e % 2];
        }
#pragma unroll
        for (int i = 0; i < kDPer; i++) {
            int e = (int)threadIdx.x + i * kThreads, t = e / kWarps;
            int64_t cc = s * kWarps + e % kWarps;
            dr[i] = float2{0.0f, 0.0f};
            if (e < kD && t0 + t < n_tok && cc < chunks)
                dr[i] = xds[(size_t)(t0 + t) * (size_t)chunks + (size_t)cc];
        }
    };
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; t++)
        acc[t] = 0.0f;
    fetch(s0);
    for (int64_t s = s0; s < steps; s++) {
        __syncthreads();   // every warp done with the previous step's activations
#pragma unroll
        for (int i = 0; i < kXPer; i++)
            if ((int)threadIdx.x + i * kThreads < kX)
                (&xs[0][0][0])[threadIdx.x + i * kThreads] = xr[i];
#pragma unroll
        for (int i = 0; i < kDPer; i++)
            if ((int)threadIdx.x + i * kThreads < kD)
                (&ds[0][0])[threadIdx.x + i * kThreads] = dr[i];
        int64_t c = s * kWarps + warp;
        bool mine = live && c < chunks;
        kern_cuda_qchunk k = {};
        if (mine)
            kern_cuda_qdecode<T>(raw, c, k);
        if (s + 1 < steps)
            fetch(s + 1);
        __syncthreads();
        if (!mine)
            continue;
#pragma unroll
        for (int t = 0; t < NT; t++)   // tokens past n_tok have zero activations and scales
            acc[t] = kern_cuda_qdot<T>(k, xs[t][warp], ds[t][warp], acc[t]);
    }
#pragma unroll
    for (int t = 0; t < NT; t++)
        part[warp][t][lane] = acc[t];
    __syncthreads();
    for (int o = threadIdx.x; o < NT * kRows; o += kThreads) {
        int t = o / kRows, l = o % kRows;
        int64_t rr = (int64_t)blockIdx.x * kRows + l;
        float sum = 0.0f;
#pragma unroll
        for (int v = 0; v < kWarps; v++)
            sum += part[v][t][l];
        if (t0 + t < n_tok && rr < rows)
            y[(size_t)(t0 + t) * (size_t)ldy + (size_t)rr] = sum;
    }
}

// y[t][r] = the sum over z of part[z][t][r] (splits parts of n rows x cols), z in order.
__global__ void add_splits_kernel(const float *part, int splits, int n_tok, int64_t rows,
                                  float *y, int64_t ldy)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x, n = (size_t)n_tok * (size_t)rows;
    if (i >= n)
        return;
    float s = 0.0f;
    for (int z = 0; z < splits; z++)
        s += part[(size_t)z * n + i];
    y[i / (size_t)rows * (size_t)ldy + i % (size_t)rows] = s;
}

// How many ways to split the columns: the fewest (at most 8, each split at least one step)
// that keep the device's multiprocessors at least 85 % busy over the waves of blocks, or
// failing that the busiest; 1 where the partial sums would not fit the scratch.
int mmq_splits(const kern_cuda *c, int64_t blocks, int64_t steps, size_t part_bytes)
{
    int best = 1;
    double best_busy = 0.0;
    for (int k = 1; k <= 8 && k <= steps; k++) {
        if (k > 1 && part_bytes * (size_t)k > c->wh_cap)
            break;
        int64_t b = blocks * k, waves = (b + c->n_sm - 1) / c->n_sm;
        double busy = (double)b / (double)(waves * c->n_sm);
        if (busy >= 0.85)
            return k;
        if (busy > best_busy) {
            best = k;
            best_busy = busy;
        }
    }
    return best;
}

template <int T, int NT>
void mmq_launch(kern_cuda *c, const kern_tensor *w, const int8_t *xq, const float2 *xds,
                int n_tok, float *y, int64_t ldy)
{
    dim3 grid(kern_cuda_blocks((size_t)w->rows, kRows), kern_cuda_blocks((size_t)n_tok, NT));
    int64_t steps = (w->cols / 32 + kWarps - 1) / kWarps;
    size_t part = (size_t)n_tok * (size_t)w->rows;
    int splits = mmq_splits(c, (int64_t)grid.x * grid.y, steps, part * sizeof(float));
    int64_t split_steps = (steps + splits - 1) / splits;
    grid.z = (unsigned)((steps + split_steps - 1) / split_steps);   // none left empty
    const uint8_t *wd = (const uint8_t *)w->data;
    if (grid.z == 1) {
        mmq_kernel<T, NT><<<grid, kThreads, 0, c->stream>>>(wd, w->row_bytes, w->rows, w->cols,
                                                             xq, xds, n_tok, steps, y, ldy, 0);
        KERN_CUDA_LAUNCHED();
        return;
    }
    float *sums = (float *)c->wh;   // the dequantization tiles' scratch: unused on this path
    mmq_kernel<T, NT><<<grid, kThreads, 0, c->stream>>>(wd, w->row_bytes, w->rows, w->cols, xq,
                                                         xds, n_tok, split_steps, sums, w->rows,
                                                         part);
    KERN_CUDA_LAUNCHED();
    add_splits_kernel<<<kern_cuda_blocks(part, KERN_CUDA_ROW_THREADS), KERN_CUDA_ROW_THREADS, 0,
                        c->stream>>>(sums, (int)grid.z, n_tok, w->rows, y, ldy);
    KERN_CUDA_LAUNCHED();
}

}  // namespace

bool kern_cuda_mmq(kern_cuda *c, const kern_tensor *w, const float *x, int n_tok, float *y,
                   int64_t ldy)
{
    return kern_cuda_qrun(c, w, x, n_tok, [&](auto type, const int8_t *xq, const float2 *xds) {
        constexpr int T = decltype(type)::value;
        // Every token slot of a block is computed: the fewest slots that hold n_tok, in tiles
        // of 16, 24 or 32 tokens.
        if (n_tok <= 16)
            mmq_launch<T, 16>(c, w, xq, xds, n_tok, y, ldy);
        else if (n_tok <= 24)
            mmq_launch<T, 24>(c, w, xq, xds, n_tok, y, ldy);
        else
            mmq_launch<T, 32>(c, w, xq, xds, n_tok, y, ldy);
    });
}
