// kernels/cuda/dense.cu: the encoder's Linear layers. The weights are copied to the device at
// dense_new (f32); a product is one cuBLAS GEMM with f32 sums (KERN_DENSE_AUTO lets the tensor
// cores take TF32 inputs, 10 mantissa bits, more than the CPU's BF16 path keeps), with the
// residual as its C (beta = 1), then one pass for the bias and the GELU.
#include "kernels/cuda/internal.cuh"

#include <stdlib.h>

namespace {

struct cuda_dense {
    kern_dense pub;
    float *w;      // [n][k]
    float *bias;   // [n]
};

__global__ void bias_gelu_kernel(float *y, const float *bias, int n, size_t total, bool gelu)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total)
        return;
    float v = y[i] + bias[i % (size_t)n];
    y[i] = gelu ? 0.5f * v * (1.0f + erff(v * 0.70710678118654752f)) : v;
}

}  // namespace

kern_dense *kern_cuda_dense_new(void *ctx, const float *w, const float *bias, int n, int k,
                                int precision)
{
    kern_cuda *c = (kern_cuda *)ctx;
    kern_cuda_enter(c);
    kern_cuda_not_recording(c, "dense_new");
    cuda_dense *d = (cuda_dense *)calloc(1, sizeof *d);
    if (d == nullptr)
        return nullptr;
    // AUTO or BF16: reduced-precision products, which the tensor cores take as TF32
    d->pub = kern_dense{n, k, false, precision != KERN_DENSE_F32};
    size_t wb = (size_t)n * (size_t)k * sizeof(float), bb = (size_t)n * sizeof(float);
    if (cudaMalloc(&d->w, wb) != cudaSuccess || cudaMalloc(&d->bias, bb) != cudaSuccess) {
        cudaGetLastError();
        cudaFree(d->w);
        free(d);
        return nullptr;
    }
    // on the backend's stream (non-blocking: not ordered with the legacy one), then waited for
    KERN_CUDA_CHECK(cudaMemcpyAsync(d->w, w, wb, cudaMemcpyHostToDevice, c->stream));
    KERN_CUDA_CHECK(cudaMemcpyAsync(d->bias, bias, bb, cudaMemcpyHostToDevice, c->stream));
    KERN_CUDA_CHECK(cudaStreamSynchronize(c->stream));
    return &d->pub;
}

void kern_cuda_dense_free(void *ctx, kern_dense *pub)
{
    if (pub == nullptr)
        return;
    kern_cuda *c = (kern_cuda *)ctx;
    kern_cuda_enter(c);
    kern_cuda_not_recording(c, "dense_free");
    cuda_dense *d = (cuda_dense *)pub;
    KERN_CUDA_CHECK(cudaStreamSynchronize(c->stream));
    cudaFree(d->w);
    cudaFree(d->bias);
    free(d);
}

void kern_cuda_dense(void *ctx, const kern_dense *pub, const float *x, int n_tok, float *y,
                     bool accumulate, bool gelu)
{
    kern_cuda *c = (kern_cuda *)ctx;
    kern_cuda_enter(c);
    if (n_tok <= 0)
        return;
    const cuda_dense *d = (const cuda_dense *)pub;
    const float one = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    // y^T (n x n_tok) = W (cuBLAS sees w [n][k] as k x n, transposed) x^T (k x n_tok)
    KERN_CUBLAS_CHECK(cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, d->pub.n, n_tok, d->pub.k,
                                   &one, d->w, CUDA_R_32F, d->pub.k, x, CUDA_R_32F, d->pub.k,
                                   &beta, y, CUDA_R_32F, d->pub.n,
                                   d->pub.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F,
                                   CUBLAS_GEMM_DEFAULT));
    size_t total = (size_t)n_tok * (size_t)d->pub.n;
    bias_gelu_kernel<<<kern_cuda_blocks(total, 256), 256, 0, c->stream>>>(y, d->bias, d->pub.n,
                                                                          total, gelu);
    KERN_CUDA_LAUNCHED();
}

const char *kern_cuda_dense_kernels(void *ctx, const kern_dense *probe)
{
    (void)ctx;
    return probe != nullptr && probe->tf32 ? "cublas gemm (tf32 inputs)" : "cublas gemm (f32)";
}
