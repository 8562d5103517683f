// tests/unit/cudasim/test_cudasim.cu: the CUDA simulator (tests/cudasim/) itself, on kernels
// written for it here: barriers and warp shuffles give what a GPU gives (block sums at every
// block size), a kernel missing its barrier reads what its neighbours have not yet written (so
// the kernels/cuda tests can fail on one), __shared__ arrays are per block, launches a GPU
// refuses are refused, and each misuse it promises to catch (a thread leaving while others wait
// at a barrier, a shuffle without every lane, a host pointer handed to a kernel, a copy in the
// wrong direction, a deadlock) stops the run with its reason; the f16/bf16 conversions round to
// nearest even; the GEMMs follow cuBLAS's column-major definition (both operations, leading
// dimensions wider than the rows, beta 0 never reading C, TF32 rounding); stream capture
// records launches (arguments by value), copies (reading their source when the graph runs) and
// GEMMs, a graph updates in place only with the same nodes, and the calls a GPU refuses during
// a capture break it. Built and run only in a -DLLMGW_CUDA=SIM build.
#include <cuda_runtime.h>

extern "C" {
#include "tests/unit/unit.h"
}

#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

namespace {

__device__ float warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// out[blockIdx.x] = the sum of x over the block's threads (warp shuffles, then shared memory).
__global__ void block_sum(const float *x, float *out)
{
    __shared__ float part[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    float v = warp_sum(x[blockIdx.x * blockDim.x + threadIdx.x]);
    if (lane == 0)
        part[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = warp_sum(lane < nw ? part[lane] : 0.0f);
        if (lane == 0)
            out[blockIdx.x] = v;
    }
}

// out[i] = the thread after i's index, passed through shared memory; with `barrier` false the
// read does not wait for the write.
__global__ void neighbour(int *out, bool barrier)
{
    __shared__ int s[1024];
    int n = blockDim.x, t = threadIdx.x;
    s[t] = t + 1000 * (int)blockIdx.x;
    if (barrier)
        __syncthreads();
    out[blockIdx.x * n + t] = s[(t + 1) % n];
}

__global__ void write_one(float *p)
{
    if (threadIdx.x == 0 && blockIdx.x == 0)
        p[0] = 1.0f;
}

__global__ void exit_before_barrier(float *p)
{
    if (threadIdx.x == 5)
        return;
    __syncthreads();
    p[threadIdx.x] = 0.0f;
}

__global__ void partial_shuffle(float *p)
{
    if (threadIdx.x < 16)
        p[threadIdx.x] = warp_sum(1.0f);
}

// Lane 0 waits in a shuffle for lanes that wait at a barrier for it.
__global__ void crossed_waits(float *p)
{
    if (threadIdx.x == 0)
        p[0] = warp_sum(1.0f);
    else
        __syncthreads();
}

// y[i] = x[i] * a + b: a kernel with arguments by value, for stream capture.
__global__ void axpb(const float *x, float *y, float a, float b, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        y[i] = x[i] * a + b;
}

__global__ void negate(float *y, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        y[i] = -y[i];
}

void *dev(size_t n)
{
    void *p = nullptr;
    assert_int_equal(cudaMalloc(&p, n), cudaSuccess);
    return p;
}

// Runs f in a child process; it must abort and say `reason` on stderr.
void dies_saying(void (*f)(void), const char *reason)
{
    int fd[2];
    assert_int_equal(pipe(fd), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(fd[1], 2);
        close(fd[0]);
        f();
        _exit(0);
    }
    close(fd[1]);
    char buf[4096] = {0};
    size_t got = 0;
    ssize_t r;
    while (got < sizeof buf - 1 && (r = read(fd[0], buf + got, sizeof buf - 1 - got)) > 0)
        got += (size_t)r;
    close(fd[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    assert_true(WIFSIGNALED(status));
    assert_int_equal(WTERMSIG(status), SIGABRT);
    assert_contains(buf, reason);
}

void block_sums_every_size(void **state)
{
    (void)state;
    for (int threads = 32; threads <= 1024; threads *= 2) {
        int blocks = 3;
        size_t n = (size_t)blocks * threads;
        float *h = (float *)malloc(n * sizeof *h), got[3];
        double want[3] = {0, 0, 0};
        for (size_t i = 0; i < n; i++) {
            h[i] = (float)((i * 37) % 101) - 50.0f;
            want[i / threads] += h[i];
        }
        float *x = (float *)dev(n * sizeof *x), *out = (float *)dev(sizeof got);
        assert_int_equal(cudaMemcpy(x, h, n * sizeof *h, cudaMemcpyHostToDevice), cudaSuccess);
        block_sum<<<blocks, threads>>>(x, out);
        assert_int_equal(cudaGetLastError(), cudaSuccess);
        assert_int_equal(cudaMemcpy(got, out, sizeof got, cudaMemcpyDeviceToHost), cudaSuccess);
        for (int b = 0; b < blocks; b++)
            assert_double_near(got[b], want[b], 0.0);   // small integers: exact
        cudaFree(x);
        cudaFree(out);
        free(h);
    }
}

void barriers_order_shared_memory(void **state)
{
    (void)state;
    int n = 256, blocks = 2, h[512];
    int *out = (int *)dev(sizeof h);
    neighbour<<<blocks, n>>>(out, true);
    assert_int_equal(cudaMemcpy(h, out, sizeof h, cudaMemcpyDeviceToHost), cudaSuccess);
    for (int b = 0; b < blocks; b++)
        for (int t = 0; t < n; t++)
            assert_int_equal(h[b * n + t], (t + 1) % n + 1000 * b);   // per block, after all wrote
    // Without the barrier, thread t reads s[t + 1] before thread t + 1 has run: the second block
    // sees the first block's values (or garbage), never its own.
    neighbour<<<blocks, n>>>(out, false);
    assert_int_equal(cudaMemcpy(h, out, sizeof h, cudaMemcpyDeviceToHost), cudaSuccess);
    int wrong = 0;
    for (int t = 0; t < n - 1; t++)
        wrong += h[n + t] != t + 1 + 1000;
    assert_int_equal(wrong, n - 1);
    cudaFree(out);
}

void refused_launches(void **state)
{
    (void)state;
    float *p = (float *)dev(4);
    write_one<<<0, 32>>>(p);   // an empty grid: what kern_cuda_blocks(0, ...) would give
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidConfiguration);
    assert_int_equal(cudaGetLastError(), cudaSuccess);   // read once, then cleared
    write_one<<<1, 1025>>>(p);
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidConfiguration);
    write_one<<<dim3(1, 65536), 32>>>(p);
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidConfiguration);
    write_one<<<dim3(1, 1), dim3(32, 1, 65)>>>(p);
    assert_int_equal(cudaGetLastError(), cudaErrorInvalidConfiguration);
    cudaFree(p);
}

void misuse_host_pointer(void)
{
    static float host[4];
    write_one<<<1, 32>>>(host);
}
void misuse_exit(void)
{
    exit_before_barrier<<<1, 64>>>((float *)dev(256));
}
void misuse_shuffle(void)
{
    partial_shuffle<<<1, 32>>>((float *)dev(256));
}
void misuse_deadlock(void)
{
    crossed_waits<<<1, 32>>>((float *)dev(4));
}

void misuses_stop_the_run(void **state)
{
    (void)state;
    dies_saying(misuse_host_pointer, "argument 0 is a pointer outside every device allocation");
    dies_saying(misuse_exit, "exited while others of its block wait at __syncthreads");
    dies_saying(misuse_shuffle, "lane 16 exited while its warp waits in __shfl_xor_sync");
    dies_saying(misuse_deadlock, "deadlock");
}

void copies_checked(void **state)
{
    (void)state;
    char host[64] = {0};
    char *d = (char *)dev(32);
    assert_int_equal(cudaMemcpy(d, host, 32, cudaMemcpyHostToDevice), cudaSuccess);
    assert_int_equal(cudaMemcpy(host, d, 32, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
    assert_int_equal(cudaMemcpy(d, host, 33, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
    assert_int_equal(cudaMemcpy(d + 16, d, 16, cudaMemcpyDeviceToDevice), cudaSuccess);
    assert_int_equal(cudaMemcpy(host, d, 32, cudaMemcpyDeviceToHost), cudaSuccess);
    cudaGetLastError();
    assert_int_equal(cudaFree(d + 1), cudaErrorInvalidValue);
    cudaGetLastError();
    assert_int_equal(cudaFree(d), cudaSuccess);
    assert_int_equal(cudasim::live_allocations(), 0);
}

void halves_round_to_nearest_even(void **state)
{
    (void)state;
    // f16: 1 + 2^-11 is halfway between 1 and 1 + 2^-10: to even (1); 1 + 3 * 2^-11 to 1 + 2^-9
    assert_int_equal(__half_as_ushort(__float2half_rn(1.0f + 0x1p-11f)), 0x3c00);
    assert_int_equal(__half_as_ushort(__float2half_rn(1.0f + 3 * 0x1p-11f)), 0x3c02);
    assert_int_equal(__half_as_ushort(__float2half_rn(65520.0f)), 0x7c00);   // rounds to inf
    assert_int_equal(__half_as_ushort(__float2half_rn(0x1p-24f)), 0x0001);   // least subnormal
    assert_double_near(__half2float(__ushort_as_half(0xc000)), -2.0, 0.0);
    // bf16: 1 + 2^-8 halfway between 1 and 1 + 2^-7: to even; 1 + 3 * 2^-8 up
    assert_int_equal(__float2bfloat16_rn(1.0f + 0x1p-8f).x, 0x3f80);
    assert_int_equal(__float2bfloat16_rn(1.0f + 3 * 0x1p-8f).x, 0x3f82);
    assert_true(isnan(__bfloat162float(__float2bfloat16_rn(NAN))));
    assert_double_near(__bfloat162float(__float2bfloat16_rn(-3.0f)), -3.0, 0.0);
}

void gemm_is_cublas_column_major(void **state)
{
    (void)state;
    cublasHandle_t h;
    assert_int_equal(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
    // A: m x k with lda = m + 1 (N) or k x m with lda = k + 2 (T); B: k x n (N) / n x k (T)
    const int m = 3, n = 2, k = 4;
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            int lda = ta ? k + 2 : m + 1, ldb = tb ? n + 1 : k + 3, ldc = m + 2;
            float a[64], b[64], c[64];
            for (int i = 0; i < 64; i++) {
                a[i] = (float)(i % 7) - 3.0f;
                b[i] = (float)(i % 5) - 2.0f;
                c[i] = NAN;   // beta 0: never read
            }
            float *da = (float *)dev(sizeof a), *db = (float *)dev(sizeof b),
                  *dc = (float *)dev(sizeof c);
            cudaMemcpy(da, a, sizeof a, cudaMemcpyHostToDevice);
            cudaMemcpy(db, b, sizeof b, cudaMemcpyHostToDevice);
            cudaMemcpy(dc, c, sizeof c, cudaMemcpyHostToDevice);
            const float one = 1.0f, zero = 0.0f;
            assert_int_equal(cublasSgemm(h, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                                         tb ? CUBLAS_OP_T : CUBLAS_OP_N, m, n, k, &one, da, lda,
                                         db, ldb, &zero, dc, ldc),
                             CUBLAS_STATUS_SUCCESS);
            cudaMemcpy(c, dc, sizeof c, cudaMemcpyDeviceToHost);
            for (int i = 0; i < m; i++)
                for (int j = 0; j < n; j++) {
                    float s = 0.0f;
                    for (int l = 0; l < k; l++)
                        s += (ta ? a[l + i * lda] : a[i + l * lda]) *
                             (tb ? b[j + l * ldb] : b[l + j * ldb]);
                    assert_double_near(c[i + j * ldc], s, 0.0);
                }
            assert_true(isnan(c[m]));   // the rows between m and ldc are left alone
            // a leading dimension below the rows is refused
            assert_int_equal(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, da, m - 1,
                                         db, k, &zero, dc, ldc),
                             CUBLAS_STATUS_INVALID_VALUE);
            cudaFree(da);
            cudaFree(db);
            cudaFree(dc);
        }
    // TF32 keeps 10 mantissa bits: 1 + 2^-12 times 1 is 1 under it, exact under f32
    float a = 1.0f + 0x1p-12f, b = 1.0f, c = 0.0f, one = 1.0f, zero = 0.0f;
    float *da = (float *)dev(4), *db = (float *)dev(4), *dc = (float *)dev(4);
    cudaMemcpy(da, &a, 4, cudaMemcpyHostToDevice);
    cudaMemcpy(db, &b, 4, cudaMemcpyHostToDevice);
    assert_int_equal(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 1, &one, da, CUDA_R_32F, 1,
                                  db, CUDA_R_32F, 1, &zero, dc, CUDA_R_32F, 1,
                                  CUBLAS_COMPUTE_32F_FAST_TF32, CUBLAS_GEMM_DEFAULT),
                     CUBLAS_STATUS_SUCCESS);
    cudaMemcpy(&c, dc, 4, cudaMemcpyDeviceToHost);
    assert_double_near(c, 1.0, 0.0);
    assert_int_equal(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 1, &one, da, CUDA_R_32F, 1,
                                  db, CUDA_R_32F, 1, &zero, dc, CUDA_R_32F, 1,
                                  CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                     CUBLAS_STATUS_SUCCESS);
    cudaMemcpy(&c, dc, 4, cudaMemcpyDeviceToHost);
    assert_double_near(c, 1.0 + 0x1p-12, 0.0);
    // f16 inputs with an f16 output are not a combination this simulator (or our code) uses
    assert_int_equal(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 1, &one, da, CUDA_R_16F, 1,
                                  db, CUDA_R_16F, 1, &zero, dc, CUDA_R_16F, 1,
                                  CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                     CUBLAS_STATUS_NOT_SUPPORTED);
    // host operands are refused
    assert_int_equal(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 1, &one, &a, 1, db, 1, &zero,
                                 dc, 1),
                     CUBLAS_STATUS_INVALID_VALUE);
    cudaFree(da);
    cudaFree(db);
    cudaFree(dc);
    cublasDestroy(h);
}

// Captures, on s, a copy of 4 floats from pinned h into dx, then y = dx * a + b.
cudaGraph_t capture_axpb(cudaStream_t s, const float *h, float *dx, float *dy, float a, float b)
{
    assert_int_equal(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    assert_int_equal(cudaMemcpyAsync(dx, h, 16, cudaMemcpyHostToDevice, s), cudaSuccess);
    axpb<<<1, 32, 0, s>>>(dx, dy, a, b, 4);
    cudaGraph_t g = nullptr;
    assert_int_equal(cudaStreamEndCapture(s, &g), cudaSuccess);
    assert_non_null(g);
    return g;
}

void stream_capture_records_and_replays(void **state)
{
    (void)state;
    cudaStream_t s;
    assert_int_equal(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    float *h = nullptr, got[4];
    assert_int_equal(cudaMallocHost(&h, 16), cudaSuccess);
    float *dx = (float *)dev(16), *dy = (float *)dev(16);
    const float zeros[4] = {0, 0, 0, 0};
    cudaMemcpy(dy, zeros, 16, cudaMemcpyHostToDevice);
    for (int i = 0; i < 4; i++)
        h[i] = (float)i;
    // recorded, not run: y keeps its zeros
    cudaGraph_t g = capture_axpb(s, h, dx, dy, 2.0f, 1.0f);
    cudaMemcpy(got, dy, 16, cudaMemcpyDeviceToHost);
    assert_memory_equal(got, zeros, 16);
    // the copy reads h when the graph runs; the kernel's arguments are the captured ones
    cudaGraphExec_t e = nullptr;
    assert_int_equal(cudaGraphInstantiate(&e, g, 0), cudaSuccess);
    for (int i = 0; i < 4; i++)
        h[i] = (float)(10 * i);
    assert_int_equal(cudaGraphLaunch(e, s), cudaSuccess);
    cudaMemcpy(got, dy, 16, cudaMemcpyDeviceToHost);
    for (int i = 0; i < 4; i++)
        assert_double_near(got[i], 20.0 * i + 1.0, 0.0);
    // the same nodes with other arguments update the graph in place
    cudaGraph_t g2 = capture_axpb(s, h, dx, dy, -1.0f, 0.5f);
    cudaGraphExecUpdateResultInfo info;
    assert_int_equal(cudaGraphExecUpdate(e, g2, &info), cudaSuccess);
    assert_int_equal(cudaGraphLaunch(e, s), cudaSuccess);
    cudaMemcpy(got, dy, 16, cudaMemcpyDeviceToHost);
    for (int i = 0; i < 4; i++)
        assert_double_near(got[i], -10.0 * i + 0.5, 0.0);
    // another kernel, or another count of nodes, is refused (and the old graph kept)
    cudaGraph_t g3 = nullptr;
    assert_int_equal(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    assert_int_equal(cudaMemcpyAsync(dx, h, 16, cudaMemcpyHostToDevice, s), cudaSuccess);
    negate<<<1, 32, 0, s>>>(dy, 4);
    assert_int_equal(cudaStreamEndCapture(s, &g3), cudaSuccess);
    assert_int_equal(cudaGraphExecUpdate(e, g3, &info), cudaErrorGraphExecUpdateFailure);
    assert_int_equal(info.result, cudaGraphExecUpdateErrorFunctionChanged);
    cudaGetLastError();
    cudaGraph_t g4 = nullptr;
    assert_int_equal(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    negate<<<1, 32, 0, s>>>(dy, 4);
    assert_int_equal(cudaStreamEndCapture(s, &g4), cudaSuccess);
    assert_int_equal(cudaGraphExecUpdate(e, g4, &info), cudaErrorGraphExecUpdateFailure);
    assert_int_equal(info.result, cudaGraphExecUpdateErrorTopologyChanged);
    cudaGetLastError();
    assert_int_equal(cudaGraphLaunch(e, s), cudaSuccess);
    cudaMemcpy(got, dy, 16, cudaMemcpyDeviceToHost);
    for (int i = 0; i < 4; i++)
        assert_double_near(got[i], -10.0 * i + 0.5, 0.0);
    // a GEMM captured: alpha read now, the product when the graph runs
    cublasHandle_t bl;
    cublasCreate(&bl);
    cublasSetStream(bl, s);
    float alpha = 3.0f, zero = 0.0f;
    cudaGraph_t g5 = nullptr;
    assert_int_equal(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    assert_int_equal(cublasSgemm(bl, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 1, &alpha, dx, 1, dx, 1,
                                 &zero, dy, 1),
                     CUBLAS_STATUS_SUCCESS);
    assert_int_equal(cudaStreamEndCapture(s, &g5), cudaSuccess);
    alpha = 100.0f;
    cudaGraphExec_t e5 = nullptr;
    assert_int_equal(cudaGraphInstantiate(&e5, g5, 0), cudaSuccess);
    float two = 2.0f;
    cudaMemcpy(dx, &two, 4, cudaMemcpyHostToDevice);
    assert_int_equal(cudaGraphLaunch(e5, s), cudaSuccess);
    cudaMemcpy(got, dy, 4, cudaMemcpyDeviceToHost);
    assert_double_near(got[0], 12.0, 0.0);
    cublasDestroy(bl);
    for (cudaGraph_t x : {g, g2, g3, g4, g5})
        cudaGraphDestroy(x);
    cudaGraphExecDestroy(e);
    cudaGraphExecDestroy(e5);
    cudaFree(dx);
    cudaFree(dy);
    cudaFreeHost(h);
    cudaStreamDestroy(s);
}

// Each call that waits or allocates breaks a capture by the calling thread: it fails, and so
// does the end of the capture (no graph); a copy from pageable memory too.
void calls_that_break_a_capture(void **state)
{
    (void)state;
    cudaStream_t s;
    assert_int_equal(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    float *d = (float *)dev(16), pageable[4] = {1, 2, 3, 4};
    for (int call = 0; call < 5; call++) {
        assert_int_equal(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal),
                         cudaSuccess);
        void *p = nullptr;
        cudaError_t e = call == 0   ? cudaStreamSynchronize(s)
                        : call == 1 ? cudaMalloc(&p, 16)
                        : call == 2 ? cudaFree(d)
                        : call == 3 ? cudaMemcpy(d, pageable, 16, cudaMemcpyHostToDevice)
                                    : cudaMemcpyAsync(d, pageable, 16, cudaMemcpyHostToDevice, s);
        assert_int_equal(e, cudaErrorStreamCaptureUnsupported);
        assert_null(p);
        cudaGraph_t g = (cudaGraph_t)&s;
        assert_int_equal(cudaStreamEndCapture(s, &g), cudaErrorStreamCaptureInvalidated);
        assert_null(g);
        cudaGetLastError();
    }
    // the memory the refused free named is still there; and after the capture all works
    assert_int_equal(cudaMemcpy(d, pageable, 16, cudaMemcpyHostToDevice), cudaSuccess);
    assert_int_equal(cudaStreamSynchronize(s), cudaSuccess);
    cudaFree(d);
    cudaStreamDestroy(s);
}

}  // namespace

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(block_sums_every_size),
        cmocka_unit_test(barriers_order_shared_memory),
        cmocka_unit_test(refused_launches),
        cmocka_unit_test(misuses_stop_the_run),
        cmocka_unit_test(copies_checked),
        cmocka_unit_test(halves_round_to_nearest_even),
        cmocka_unit_test(gemm_is_cublas_column_major),
        cmocka_unit_test(stream_capture_records_and_replays),
        cmocka_unit_test(calls_that_break_a_capture),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
