// tests/cudasim/cudasim.h: the part of CUDA and cuBLAS that kernels/cuda/ uses, for compiling
// those files with the host's C++ compiler and running their kernels on the CPU (a build with
// -DLLMGW_CUDA=SIM, for tests only). Not a GPU and not fast: it runs each kernel's code as
// written, one thread block at a time, every CUDA thread a fiber, so that a CPU-only machine
// can find what the CPU backend's tests cannot -- wrong indexing, a missed __syncthreads, a
// warp shuffle that not every lane reaches, a launch whose configuration a GPU refuses, a host
// pointer handed to a kernel or a copy in the wrong direction -- and, in a sanitized build,
// reads and writes just past a device allocation (each is its own heap block, so ASan's
// redzones border it).
//
// What it checks, and reports on stderr with "cudasim:" before failing the call or aborting:
//   launches: grid and block within the device's limits (cudaErrorInvalidConfiguration, read
//     back by cudaGetLastError as on a GPU); every pointer argument null or inside a device
//     allocation;
//   __syncthreads: a thread that exits while others of its block wait at a barrier; a block
//     whose live threads all wait without one releasing (deadlock);
//   __shfl_xor_sync: the mask must name exactly the warp's live lanes;
//   copies: their kind against where the pointers lie, and the byte ranges inside allocations;
//   allocations: at most the 8 GiB the device reports, all live ones together;
//   cuBLAS GEMMs: leading dimensions, type combinations, device operands, host alpha and beta;
//   stream capture: calls that wait or allocate while the calling thread captures (they fail
//     and break the capture), copies captured from pageable host memory, a graph updated
//     with other nodes.
// LLMGW_CUDASIM_TRACE=1 prints every device allocation and free, with the number of kernels
// run before it. LLMGW_CUDASIM_DEVICES=N sets the device count (default 1).
// What it cannot see: races between blocks or between threads of a block outside barriers
// (blocks run one after another, threads in a fixed order), the memory model, asynchrony (every
// call completes before it returns), timing, shared memory read before a block wrote it (it
// holds the previous block's values, not garbage), and anything a real driver rejects that is
// not listed above.
#ifndef LLMGW_TESTS_CUDASIM_CUDASIM_H
#define LLMGW_TESTS_CUDASIM_CUDASIM_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <immintrin.h>

#include <functional>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>

// ---- qualifiers: device code is host code here; __shared__ arrays are per block, and blocks
// of one OS thread run one at a time, so a thread-local static is one block's shared memory.
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __shared__ static thread_local
#define __restrict__ __restrict
#define __launch_bounds__(...)

// ---- vector and index types
struct uint3 {
    unsigned x, y, z;
};
struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct __attribute__((aligned(8))) float2 {
    float x, y;
};
struct __attribute__((aligned(16))) float4 {
    float x, y, z, w;
};
struct __attribute__((aligned(16))) int4 {
    int x, y, z, w;
};

// The running CUDA thread's coordinates (the simulator sets them before it resumes a thread);
// read through functions, as the kernels' TUs reaching an extern thread_local went wrong under
// the sanitizers.
namespace cudasim {
uint3 thread_idx(void);
uint3 block_idx(void);
dim3 block_dim(void);
dim3 grid_dim(void);
}  // namespace cudasim
#define threadIdx (::cudasim::thread_idx())
#define blockIdx (::cudasim::block_idx())
#define blockDim (::cudasim::block_dim())
#define gridDim (::cudasim::grid_dim())

// ---- f16 and bf16 (bit patterns; conversions round to nearest even, as the __*_rn intrinsics)
struct __attribute__((aligned(2))) __half {
    unsigned short x;
};
struct __attribute__((aligned(4))) __half2 {
    __half x, y;
};
struct __attribute__((aligned(2))) __nv_bfloat16 {
    unsigned short x;
};

__attribute__((target("f16c"))) inline float __half2float(__half h)
{
    return _cvtsh_ss(h.x);
}
__attribute__((target("f16c"))) inline __half __float2half_rn(float f)
{
    return __half{(unsigned short)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT)};
}
inline __half __ushort_as_half(unsigned short u)
{
    return __half{u};
}
inline unsigned short __half_as_ushort(__half h)
{
    return h.x;
}
inline float2 __half22float2(__half2 h)
{
    return float2{__half2float(h.x), __half2float(h.y)};
}
inline float __bfloat162float(__nv_bfloat16 b)
{
    uint32_t u = (uint32_t)b.x << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
inline __nv_bfloat16 __float2bfloat16_rn(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u)   // NaN stays a (quiet) NaN
        return __nv_bfloat16{(unsigned short)((u >> 16) | 0x40)};
    u += 0x7fffu + ((u >> 16) & 1u);
    return __nv_bfloat16{(unsigned short)(u >> 16)};
}

// ---- integer intrinsics
// c plus the dot product of a's and b's four bytes taken as signed 8-bit integers.
inline int __dp4a(int a, int b, int c)
{
    int s = c;
    for (int i = 0; i < 4; i++)
        s += (int)(int8_t)((unsigned)a >> (8 * i)) * (int)(int8_t)((unsigned)b >> (8 * i));
    return s;
}

// ---- block and warp primitives (tests/cudasim/cudasim.cc)
void __syncthreads(void);
namespace cudasim {
uint64_t shfl_xor(unsigned mask, uint64_t bits, int lane_mask, int width);
}
template <typename T> inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32)
{
    static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value, "a register value");
    uint64_t bits = 0;
    memcpy(&bits, &v, sizeof v);
    bits = cudasim::shfl_xor(mask, bits, lane_mask, width);
    T r;
    memcpy(&r, &bits, sizeof r);
    return r;
}

// A warp barrier: here a shuffle every live lane of the warp must reach (so a lane reading
// what the others wrote to shared memory before it waits for them, as on a GPU).
inline void __syncwarp(unsigned mask = 0xffffffffu)
{
    cudasim::shfl_xor(mask, 0, 0, 32);
}

// ---- the runtime API
typedef enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorNoDevice = 100,
    cudaErrorInvalidDevice = 101,
    cudaErrorInvalidResourceHandle = 400,
    cudaErrorStreamCaptureUnsupported = 900,
    cudaErrorStreamCaptureInvalidated = 901,
    cudaErrorStreamCaptureImplicit = 906,
    cudaErrorGraphExecUpdateFailure = 910,
} cudaError_t;
enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4,
};
struct CUstream_st;
typedef CUstream_st *cudaStream_t;
#define cudaStreamDefault 0x00
#define cudaStreamNonBlocking 0x01
struct cudaDeviceProp {
    char name[256];
    size_t totalGlobalMem;
    size_t sharedMemPerBlock;
    int warpSize;
    int maxThreadsPerBlock;
    int maxThreadsDim[3];
    int maxGridSize[3];
    int major, minor;
    int multiProcessorCount;
};

cudaError_t cudaGetDeviceCount(int *n);
cudaError_t cudaGetDevice(int *dev);
cudaError_t cudaSetDevice(int dev);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *prop, int dev);
cudaError_t cudaGetLastError(void);
const char *cudaGetErrorString(cudaError_t e);
cudaError_t cudaMalloc(void **p, size_t n);
template <typename T> inline cudaError_t cudaMalloc(T **p, size_t n)
{
    return cudaMalloc((void **)p, n);
}
cudaError_t cudaFree(void *p);
cudaError_t cudaMallocHost(void **p, size_t n);
template <typename T> inline cudaError_t cudaMallocHost(T **p, size_t n)
{
    return cudaMallocHost((void **)p, n);
}
cudaError_t cudaFreeHost(void *p);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, cudaMemcpyKind kind,
                            cudaStream_t s = nullptr);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, cudaMemcpyKind kind);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);

// ---- stream capture and graphs: while a stream is captured its launches, copies and GEMMs
// are recorded (kernel arguments by value, copies reading their source when the graph runs)
// and run in order by each cudaGraphLaunch; a call that would wait for the device or
// allocate, made by the capturing thread, fails and breaks the capture, as on a GPU.
enum cudaStreamCaptureMode {
    cudaStreamCaptureModeGlobal = 0,
    cudaStreamCaptureModeThreadLocal = 1,
    cudaStreamCaptureModeRelaxed = 2,
};
struct CUgraph_st;
typedef CUgraph_st *cudaGraph_t;
struct CUgraphExec_st;
typedef CUgraphExec_st *cudaGraphExec_t;
struct CUgraphNode_st;
typedef CUgraphNode_st *cudaGraphNode_t;
enum cudaGraphExecUpdateResult {
    cudaGraphExecUpdateSuccess = 0,
    cudaGraphExecUpdateError = 1,
    cudaGraphExecUpdateErrorTopologyChanged = 2,
    cudaGraphExecUpdateErrorNodeTypeChanged = 3,
    cudaGraphExecUpdateErrorFunctionChanged = 4,
};
struct cudaGraphExecUpdateResultInfo {
    cudaGraphExecUpdateResult result;
    cudaGraphNode_t errorNode;
    cudaGraphNode_t errorFromNode;
};
cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *graph);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph,
                                 unsigned long long flags = 0);
// Takes the new graph's arguments when it has the same nodes in the same order (the same
// kernels, copies of the same direction); cudaErrorGraphExecUpdateFailure otherwise (a GPU
// takes some changes this refuses: callers fall back to instantiating, as they must anyway).
cudaError_t cudaGraphExecUpdate(cudaGraphExec_t exec, cudaGraph_t graph,
                                cudaGraphExecUpdateResultInfo *info);
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s);
cudaError_t cudaGraphDestroy(cudaGraph_t graph);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec);

// ---- cuBLAS (column-major GEMMs; the reference semantics of cublasSgemm / cublasGemmEx)
struct cublasContext;
typedef cublasContext *cublasHandle_t;
typedef enum {
    CUBLAS_STATUS_SUCCESS = 0,
    CUBLAS_STATUS_NOT_INITIALIZED = 1,
    CUBLAS_STATUS_INVALID_VALUE = 7,
    CUBLAS_STATUS_NOT_SUPPORTED = 15,
} cublasStatus_t;
typedef enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1, CUBLAS_OP_C = 2 } cublasOperation_t;
typedef enum { CUDA_R_32F = 0, CUDA_R_16F = 2, CUDA_R_16BF = 14 } cudaDataType;
typedef enum {
    CUBLAS_COMPUTE_32F = 68,
    CUBLAS_COMPUTE_32F_FAST_TF32 = 77,
} cublasComputeType_t;
typedef enum { CUBLAS_GEMM_DEFAULT = -1 } cublasGemmAlgo_t;

cublasStatus_t cublasCreate(cublasHandle_t *h);
cublasStatus_t cublasDestroy(cublasHandle_t h);
cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s);
const char *cublasGetStatusString(cublasStatus_t s);
cublasStatus_t cublasSgemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                           int n, int k, const float *alpha, const float *A, int lda,
                           const float *B, int ldb, const float *beta, float *C, int ldc);
cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                            int n, int k, const void *alpha, const void *A, cudaDataType at,
                            int lda, const void *B, cudaDataType bt, int ldb, const void *beta,
                            void *C, cudaDataType ct, int ldc, cublasComputeType_t compute,
                            cublasGemmAlgo_t algo);

// ---- launches: tests/cudasim/translate.py rewrites k<<<grid, block, smem, stream>>>(args) as
// cudasim::launch("k", grid, block, smem, stream, k, args). The arguments are converted to the
// kernel's parameter types once, as a launch does, and every thread calls the kernel on them.
namespace cudasim {

// Validates the configuration (false: the launch is refused, the error left for
// cudaGetLastError).
bool launch_begin(const char *kernel, dim3 grid, dim3 block, size_t smem, cudaStream_t s);
// A pointer argument must be null or point into a device allocation; aborts otherwise.
void check_arg(const char *kernel, int index, const void *p);
// Runs body(arg) as every thread of every block.
void launch_run(void (*body)(void *), void *arg);
// Undoes launch_begin for a launch that is recorded instead of run.
void launch_cancel(void);
// Whether stream s is being captured; record appends a node to its graph: what it is (a
// kernel's function, or a copy's or a GEMM's tag) and how to run it.
bool capturing(cudaStream_t s);
void record(cudaStream_t s, const void *what, std::function<void()> run);

template <typename... P> struct bound {
    void (*kernel)(P...);
    std::tuple<P...> args;
};

template <typename... P> void run_bound(void *p)
{
    bound<P...> *b = static_cast<bound<P...> *>(p);
    std::apply(b->kernel, b->args);
}

template <size_t I = 0, typename Tuple> void check_args(const char *kernel, const Tuple &t)
{
    if constexpr (I < std::tuple_size<Tuple>::value) {
        using E = std::tuple_element_t<I, Tuple>;
        if constexpr (std::is_pointer<E>::value)
            check_arg(kernel, (int)I, (const void *)std::get<I>(t));
        check_args<I + 1>(kernel, t);
    }
}

template <typename... P, typename... A>
void launch(const char *name, dim3 grid, dim3 block, size_t smem, cudaStream_t s,
            void (*kernel)(P...), A &&...args)
{
    static_assert(sizeof...(P) == sizeof...(A), "a kernel launched with the wrong argument count");
    if (!launch_begin(name, grid, block, smem, s))
        return;
    auto b = std::make_shared<bound<P...>>(
        bound<P...>{kernel, std::tuple<P...>(std::forward<A>(args)...)});
    check_args(name, b->args);
    if (capturing(s)) {   // the arguments as they are now; run when the graph is
        launch_cancel();
        record(s, reinterpret_cast<const void *>(kernel), [name, grid, block, smem, b] {
            if (launch_begin(name, grid, block, smem, nullptr))
                launch_run(run_bound<P...>, b.get());
        });
        return;
    }
    launch_run(run_bound<P...>, b.get());
}

// How many device allocations are live (the unit test's leak check).
size_t live_allocations(void);

}  // namespace cudasim

#endif
