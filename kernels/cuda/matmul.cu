// kernels/cuda/matmul.cu: y = W x for a batch of activation rows. Up to KERN_CUDA_MMV_MAX rows
// (decode, small batches) go through our matrix-vector kernels, which decode any weight type
// in registers: quantized weights against int8 activations (mmvq.cu), float weights (and
// LLMGW_CUDA_QUANT=f32, and weights placed where the int8 loads cannot go) in f32 (mmv.cu).
// Quantized weights up to KERN_CUDA_MMQ_MAX rows go through mmq.cu, in int8 as well. Larger
// batches (prefill) are cuBLAS GEMMs with f32 sums: f32 weights as they are, BF16 weights with
// the activations as bf16, the others as f16 (F16 weights directly, quantized weights decoded
// to f16 for the call, as llama.cpp's cuBLAS path does, a tile of rows at a time into scratch
// reserved up front) with the activations converted to f16 (as llama.cpp's cuBLAS path: an
// activation beyond f16's 65504 would overflow).
//
// Layout: W is row-major [rows][cols], which cuBLAS (column-major) sees as W^T of cols x rows;
// x row-major [n_tok][cols] is cols x n_tok; y row-major [n_tok][ldy] is rows x n_tok with
// leading dimension ldy. So y = op(W^T)^T x: GEMM(T, N, m = rows, n = n_tok, k = cols).
#include "kernels/cuda/internal.cuh"

// The products by path, y written; matmul below decides what the rounded activations held
// for the next product are worth after it.
static void products(kern_cuda *c, const kern_tensor *w, const float *x, int n_tok, float *y,
                     int64_t ldy)
{
    if (n_tok <= KERN_CUDA_MMV_MAX) {
        if (!c->quant_f32 && kern_cuda_mmvq(c, w, x, n_tok, y, ldy))
            return;
        kern_cuda_mmv(c, w, x, n_tok, y, ldy);
        return;
    }
    if (n_tok <= KERN_CUDA_MMQ_MAX && !c->quant_f32 && kern_cuda_mmq(c, w, x, n_tok, y, ldy))
        return;
    c->q8_held.x = nullptr;   // xh written below (or the step dropped)
    if (c->recording) {   // cuBLAS is not recorded (its workspace): the step runs unrecorded
        c->record_failed = c->record_unfit = true;
        return;
    }
    const float one = 1.0f, zero = 0.0f;
    int m = (int)w->rows, n = n_tok, k = (int)w->cols;
    if (w->type == KERN_TYPE_F32) {
        KERN_CUBLAS_CHECK(cublasSgemm(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one,
                                      (const float *)w->data, k, x, k, &zero, y, (int)ldy));
        return;
    }
    size_t xn = (size_t)n_tok * (size_t)w->cols;
    if (w->type == KERN_TYPE_BF16) {   // bf16 both sides: f16 could not hold every bf16 weight
        __nv_bfloat16 *xb = (__nv_bfloat16 *)kern_cuda_scratch(c, &c->xh, &c->xh_cap,
                                                               xn * sizeof(__nv_bfloat16));
        kern_cuda_f32_to_bf16(c, x, xb, xn);
        KERN_CUBLAS_CHECK(cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one, w->data,
                                       CUDA_R_16BF, k, xb, CUDA_R_16BF, k, &zero, y, CUDA_R_32F,
                                       (int)ldy, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        return;
    }
    __half *xh = (__half *)kern_cuda_scratch(c, &c->xh, &c->xh_cap, xn * sizeof(__half));
    kern_cuda_f32_to_f16(c, x, xh, xn);
    if (w->type == KERN_TYPE_F16) {
        KERN_CUBLAS_CHECK(cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one, w->data,
                                       CUDA_R_16F, k, xh, CUDA_R_16F, k, &zero, y, CUDA_R_32F,
                                       (int)ldy, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        return;
    }
    // Quantized weights: decoded to f16 a tile of rows at a time into the reserved scratch (never
    // the whole matrix), one GEMM per tile writing its rows of y.
    int64_t tile = (int64_t)(c->wh_cap / sizeof(__half)) / w->cols;
    if (tile < 1)
        kern_cuda_fatal("matmul", "a weight row longer than the dequantization scratch",
                        __FILE__, __LINE__);
    for (int64_t r0 = 0; r0 < w->rows; r0 += tile) {
        kern_tensor part = *w;
        part.rows = w->rows - r0 < tile ? w->rows - r0 : tile;
        part.data = (const uint8_t *)w->data + (size_t)r0 * w->row_bytes;
        kern_cuda_dequant_f16(c, &part, (__half *)c->wh);
        KERN_CUBLAS_CHECK(cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)part.rows, n, k,
                                       &one, c->wh, CUDA_R_16F, k, xh, CUDA_R_16F, k, &zero,
                                       y + r0, CUDA_R_32F, (int)ldy, CUBLAS_COMPUTE_32F,
                                       CUBLAS_GEMM_DEFAULT));
    }
}

void kern_cuda_matmul(void *ctx, const kern_tensor *w, const float *x, int n_tok, float *y,
                      int64_t ldy)
{
    kern_cuda *c = (kern_cuda *)ctx;
    auto held = c->q8_held;   // products in a row share their rounded activations
    kern_cuda_enter(c);
    c->q8_held = held;
    if (n_tok <= 0 || w->rows == 0)
        return;
    products(c, w, x, n_tok, y, ldy);
    // y's rows written: the held activations stand only if they do not overlap them.
    const float *hx = c->q8_held.x;
    if (hx != nullptr && hx < y + (size_t)(n_tok - 1) * (size_t)ldy + w->rows &&
        y < hx + (size_t)c->q8_held.n_tok * (size_t)c->q8_held.cols)
        c->q8_held.x = nullptr;
}
