// tests/cudasim/cudasim.cc: the simulator's runtime (tests/cudasim/cudasim.h has the contract):
// fibers for CUDA threads, barriers and shuffles, the launch loop, device memory bookkeeping,
// the runtime calls and cuBLAS's GEMMs as their reference formulas.
#include "tests/cudasim/cudasim.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <map>
#include <mutex>
#include <vector>

#if !defined(__x86_64__)
#error "tests/cudasim: the fiber switch is written for x86-64"
#endif

#if defined(__SANITIZE_ADDRESS__)
#define CUDASIM_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CUDASIM_ASAN 1
#endif
#endif
#ifdef CUDASIM_ASAN
#include <sanitizer/common_interface_defs.h>
#endif

static thread_local uint3 t_thread, t_block;
static thread_local dim3 t_block_dim, t_grid_dim;

uint3 cudasim::thread_idx(void)
{
    return t_thread;
}
uint3 cudasim::block_idx(void)
{
    return t_block;
}
dim3 cudasim::block_dim(void)
{
    return t_block_dim;
}
dim3 cudasim::grid_dim(void)
{
    return t_grid_dim;
}

namespace {

[[noreturn]] __attribute__((format(printf, 1, 2))) void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "cudasim: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    abort();
}

// ---- fibers: a context switch that saves the registers the x86-64 SysV ABI says a callee keeps
// (rbx, rbp, r12-r15) and swaps stacks. The MXCSR and x87 control words, which the ABI also
// has callees keep, are left alone: nothing here or in a kernel changes them.
extern "C" void cudasim_switch(void **save_sp, void *load_sp);
asm(R"(
    .text
    .p2align 4
    .type cudasim_switch,@function
cudasim_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size cudasim_switch,.-cudasim_switch
    .section .note.GNU-stack,"",@progbits
    .text
)");

#ifdef CUDASIM_ASAN
constexpr size_t kStack = 256 << 10;
#else
constexpr size_t kStack = 64 << 10;
#endif
constexpr int kMaxThreads = 1024;

struct fiber {
    void *sp;
    char *stack;   // kStack bytes above a guard page
    uint3 tid;
    bool done;
    unsigned bar_gen;    // the barrier generation it waits to pass
    bool at_bar;
    unsigned shfl_gen;   // likewise for its warp's shuffle
    bool at_shfl;
#ifdef CUDASIM_ASAN
    void *fake;          // ASan's fake stack while switched out
#endif
};

struct warp_state {
    unsigned live_mask;   // lanes not exited
    int arrived;
    unsigned gen;
    int lane_mask;     // of the shuffle the arrived lanes are in
    uint64_t val[2][32];
};

struct block_state {
    fiber f[kMaxThreads];
    warp_state w[kMaxThreads / 32];
    int n;             // threads in the block
    int live;
    int cur;
    int bar_arrived;
    unsigned bar_gen;
    void *sched_sp;
    void *dead_sp;       // where an exited thread's last switch saves its stack pointer
    void (*body)(void *);
    void *arg;
    const char *kernel;
    char *stacks;        // kMaxThreads stacks, made once per OS thread
    const void *sched_bottom;   // the OS thread's stack (ASan's fiber annotations)
    size_t sched_size;
#ifdef CUDASIM_ASAN
    void *fake_stack;
#endif
};

thread_local block_state *g_blk;
thread_local cudaError_t g_last = cudaSuccess;
thread_local int g_device = 0;

block_state *blk()
{
    if (g_blk == nullptr) {
        g_blk = (block_state *)calloc(1, sizeof *g_blk);
        size_t page = (size_t)sysconf(_SC_PAGESIZE), each = kStack + page;
        char *m = (char *)mmap(nullptr, each * kMaxThreads, PROT_READ | PROT_WRITE,
                               MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (g_blk == nullptr || m == MAP_FAILED)
            die("no memory for the thread stacks");
        for (int i = 0; i < kMaxThreads; i++) {   // a guard page below each stack
            mprotect(m + (size_t)i * each, page, PROT_NONE);
            g_blk->f[i].stack = m + (size_t)i * each + page;
        }
        g_blk->stacks = m;
#ifdef CUDASIM_ASAN
        pthread_attr_t attr;   // the OS thread's stack, which the last thread of a block returns to
        void *addr = nullptr;
        size_t size = 0;
        if (pthread_getattr_np(pthread_self(), &attr) == 0) {
            pthread_attr_getstack(&attr, &addr, &size);
            pthread_attr_destroy(&attr);
        }
        g_blk->sched_bottom = addr;
        g_blk->sched_size = size;
#endif
    }
    return g_blk;
}

bool runnable(const block_state *b, int i)
{
    const fiber *f = &b->f[i];
    return !f->done && !(f->at_bar && f->bar_gen == b->bar_gen) &&
           !(f->at_shfl && f->shfl_gen == b->w[i / 32].gen);
}

// The thread to run next, or -1: another lane of the running thread's warp if one can run (a
// warp's shuffles then finish while its 32 stacks are in cache), else the next thread after it.
int next_runnable(const block_state *b)
{
    int base = b->cur & ~31, lanes = b->n - base < 32 ? b->n - base : 32;
    for (int k = 1; k < lanes; k++) {
        int i = base + (b->cur - base + k) % lanes;
        if (runnable(b, i))
            return i;
    }
    for (int k = 1; k <= b->n; k++) {
        int i = (b->cur + k) % b->n;
        if (runnable(b, i))
            return i;
    }
    return -1;
}

// From the running thread (its stack pointer saved in *save, or nowhere when it has exited)
// straight to thread `next`, or to the scheduler when next is -1.
void switch_to(block_state *b, void **save, int next)
{
    const void *bottom = next >= 0 ? b->f[next].stack : b->sched_bottom;
    size_t size = next >= 0 ? kStack : b->sched_size;
    void *to = next >= 0 ? b->f[next].sp : b->sched_sp;
    int me = b->cur;
    (void)bottom;
    (void)size;
    (void)me;
    if (next >= 0) {
        b->cur = next;
        t_thread = b->f[next].tid;
    }
#ifdef CUDASIM_ASAN
    __sanitizer_start_switch_fiber(save != nullptr ? &b->f[me].fake : nullptr, bottom, size);
#endif
    cudasim_switch(save != nullptr ? save : &b->dead_sp, to);
#ifdef CUDASIM_ASAN
    __sanitizer_finish_switch_fiber(b->f[me].fake, nullptr, nullptr);
#endif
}

// The running thread waits (its wait recorded by the caller): another runs until it is released.
void wait_released()
{
    block_state *b = g_blk;
    int next = next_runnable(b);
    if (next < 0)
        die("kernel %s: deadlock: %d live threads of block (%u, %u, %u) wait at a barrier or "
            "shuffle that no other thread reaches", b->kernel, b->live, blockIdx.x, blockIdx.y,
            blockIdx.z);
    switch_to(b, &b->f[b->cur].sp, next);
}

// A thread's first frame: runs the kernel, then marks the thread exited and passes on, for good.
[[noreturn]] void fiber_main()
{
    block_state *b = g_blk;
#ifdef CUDASIM_ASAN
    __sanitizer_finish_switch_fiber(nullptr, nullptr, nullptr);
#endif
    b->body(b->arg);
    fiber *me = &b->f[b->cur];
    me->done = true;
    b->live--;
    if (b->bar_arrived > 0) {
        // others wait at a __syncthreads this thread never reached
        die("kernel %s: thread %d exited while others of its block wait at __syncthreads",
            b->kernel, b->cur);
    }
    warp_state *w = &b->w[b->cur / 32];
    w->live_mask &= ~(1u << (b->cur % 32));
    if (w->arrived > 0)
        die("kernel %s: lane %d exited while its warp waits in __shfl_xor_sync", b->kernel,
            b->cur % 32);
    int next = next_runnable(b);
    if (next < 0 && b->live > 0)
        die("kernel %s: deadlock: %d live threads wait at a barrier or shuffle that no other "
            "thread reaches", b->kernel, b->live);
    switch_to(b, nullptr, next);
    abort();   // an exited thread is never resumed
}

void fiber_init(fiber *f, int i)
{
    // Stack tops staggered by cache lines: at one stride they would all share a cache set.
    uintptr_t top = ((uintptr_t)f->stack + kStack - (uintptr_t)(i % 61) * 64) & ~(uintptr_t)15;
    uint64_t *sp = (uint64_t *)top;
    *--sp = 0;                          // fiber_main's return address: it never returns
    *--sp = (uint64_t)(uintptr_t)&fiber_main;
    for (int i = 0; i < 6; i++)
        *--sp = 0;                      // rbp rbx r12 r13 r14 r15
    f->sp = sp;
    f->done = f->at_bar = f->at_shfl = false;
}

// One block: its threads hand over to one another (a thread runs until it waits or exits); the
// last to exit returns here.
void run_block(block_state *b)
{
    for (int i = 0; i < b->n; i++)
        fiber_init(&b->f[i], i);
    for (int wi = 0; wi < (b->n + 31) / 32; wi++) {
        warp_state *w = &b->w[wi];
        int lanes = b->n - wi * 32 < 32 ? b->n - wi * 32 : 32;
        w->live_mask = lanes == 32 ? 0xffffffffu : (1u << lanes) - 1;
        w->arrived = 0;
        w->gen = 0;
    }
    b->live = b->n;
    b->bar_arrived = 0;
    b->bar_gen = 0;
    b->cur = 0;
    t_thread = b->f[0].tid;
#ifdef CUDASIM_ASAN
    __sanitizer_start_switch_fiber(&b->fake_stack, b->f[0].stack, kStack);
#endif
    cudasim_switch(&b->sched_sp, b->f[0].sp);
#ifdef CUDASIM_ASAN
    __sanitizer_finish_switch_fiber(b->fake_stack, nullptr, nullptr);
#endif
}

// ---- device memory: every allocation its own heap block, so a sanitized build catches a
// kernel reading past one.
std::mutex g_mem_lock;
std::map<uintptr_t, size_t> g_dev, g_pinned;
constexpr size_t kDeviceMemory = (size_t)8 << 30;   // what cudaGetDeviceProperties reports
size_t g_dev_total;
std::atomic<unsigned long> g_launches;   // kernels run so far, all threads

// LLMGW_CUDASIM_TRACE=1: every device allocation and free on stderr, with how many kernels had
// run before it (allocations between a model's first launches and its last are mid-step ones).
bool tracing()
{
    static const bool on = getenv("LLMGW_CUDASIM_TRACE") != nullptr &&
                           strcmp(getenv("LLMGW_CUDASIM_TRACE"), "1") == 0;
    return on;
}

// The allocation of map m holding [p, p + n), or false.
bool inside(const std::map<uintptr_t, size_t> &m, const void *p, size_t n)
{
    uintptr_t a = (uintptr_t)p;
    auto it = m.upper_bound(a);
    if (it == m.begin())
        return false;
    --it;
    return a >= it->first && a + n <= it->first + it->second && n <= it->second;
}

bool is_device(const void *p, size_t n)
{
    std::lock_guard<std::mutex> g(g_mem_lock);
    return inside(g_dev, p, n);
}

bool touches_device(const void *p, size_t n)
{
    std::lock_guard<std::mutex> g(g_mem_lock);
    uintptr_t a = (uintptr_t)p;
    auto it = g_dev.upper_bound(a + (n > 0 ? n - 1 : 0));
    if (it == g_dev.begin())
        return false;
    --it;
    return it->first + it->second > a;
}

cudaError_t fail(cudaError_t e, const char *what, const char *detail)
{
    fprintf(stderr, "cudasim: %s: %s\n", what, detail);
    g_last = e;
    return e;
}

}  // namespace

// ---- block and warp primitives
void __syncthreads(void)
{
    block_state *b = g_blk;
    fiber *me = &b->f[b->cur];
    if (++b->bar_arrived == b->live) {   // the last to arrive releases the others
        b->bar_arrived = 0;
        b->bar_gen++;
        return;
    }
    me->at_bar = true;
    me->bar_gen = b->bar_gen;
    while (me->bar_gen == b->bar_gen)
        wait_released();
    me->at_bar = false;
}

uint64_t cudasim::shfl_xor(unsigned mask, uint64_t bits, int lane_mask, int width)
{
    block_state *b = g_blk;
    int lane = b->cur % 32;
    warp_state *w = &b->w[b->cur / 32];
    fiber *me = &b->f[b->cur];
    unsigned live = w->live_mask;
    if (mask != live)
        die("kernel %s: __shfl_xor_sync with mask %#x, but the warp's live lanes are %#x",
            b->kernel, mask, live);
    if (width != 32 || lane_mask < 0 || lane_mask > 31)
        die("kernel %s: __shfl_xor_sync width %d, lane mask %d (only 32 and 0..31 here)",
            b->kernel, width, lane_mask);
    if (w->arrived > 0 && w->lane_mask != lane_mask)
        die("kernel %s: lanes of one warp shuffle with different lane masks (%d, %d)",
            b->kernel, w->lane_mask, lane_mask);
    unsigned gen = w->gen;
    w->val[gen & 1][lane] = bits;
    w->lane_mask = lane_mask;
    if (++w->arrived == __builtin_popcount(live)) {
        w->arrived = 0;
        w->gen++;
    } else {
        me->at_shfl = true;
        me->shfl_gen = gen;
        while (me->shfl_gen == w->gen)
            wait_released();
        me->at_shfl = false;
    }
    return w->val[gen & 1][lane ^ lane_mask];
}

// ---- launches
bool cudasim::launch_begin(const char *kernel, dim3 grid, dim3 block, size_t smem, cudaStream_t s)
{
    (void)s;
    unsigned long threads = (unsigned long)block.x * block.y * block.z;
    char why[160];
    if (grid.x < 1 || grid.x > 0x7fffffffu || grid.y < 1 || grid.y > 65535 || grid.z < 1 ||
        grid.z > 65535) {
        snprintf(why, sizeof why, "kernel %s: grid (%u, %u, %u) outside 1..2^31-1 x 1..65535 x "
                 "1..65535", kernel, grid.x, grid.y, grid.z);
        fail(cudaErrorInvalidConfiguration, "launch refused", why);
        return false;
    }
    if (block.x < 1 || block.y < 1 || block.z < 1 || block.x > 1024 || block.y > 1024 ||
        block.z > 64 || threads > 1024) {
        snprintf(why, sizeof why, "kernel %s: block (%u, %u, %u) outside the device's limits",
                 kernel, block.x, block.y, block.z);
        fail(cudaErrorInvalidConfiguration, "launch refused", why);
        return false;
    }
    if (smem > 48 * 1024) {
        snprintf(why, sizeof why, "kernel %s: %zu bytes of dynamic shared memory (48 KiB without "
                 "an opt-in)", kernel, smem);
        fail(cudaErrorInvalidConfiguration, "launch refused", why);
        return false;
    }
    if (smem > 0)
        die("kernel %s: dynamic shared memory is not simulated (%zu bytes)", kernel, smem);
    if (g_blk != nullptr && g_blk->kernel != nullptr)
        die("kernel %s launched from inside kernel %s", kernel, g_blk->kernel);
    blk()->kernel = kernel;
    t_grid_dim = grid;
    t_block_dim = block;
    return true;
}

void cudasim::check_arg(const char *kernel, int index, const void *p)
{
    if (p != nullptr && !is_device(p, 1))
        die("kernel %s: argument %d is a pointer outside every device allocation (%p)", kernel,
            index, p);
}

void cudasim::launch_run(void (*body)(void *), void *arg)
{
    g_launches++;
    block_state *b = blk();
    b->body = body;
    b->arg = arg;
    b->n = (int)(blockDim.x * blockDim.y * blockDim.z);
    for (int i = 0; i < b->n; i++)
        b->f[i].tid = uint3{(unsigned)i % blockDim.x, (unsigned)i / blockDim.x % blockDim.y,
                            (unsigned)i / (blockDim.x * blockDim.y)};
    for (unsigned z = 0; z < gridDim.z; z++)
        for (unsigned y = 0; y < gridDim.y; y++)
            for (unsigned x = 0; x < gridDim.x; x++) {
                t_block = uint3{x, y, z};
                run_block(b);
            }
    b->kernel = nullptr;
}

void cudasim::launch_cancel(void)
{
    blk()->kernel = nullptr;
}

size_t cudasim::live_allocations(void)
{
    std::lock_guard<std::mutex> g(g_mem_lock);
    return g_dev.size();
}

// ---- stream capture
struct graph_node {
    const void *what;             // a kernel's function, or a copy's or GEMM's tag
    std::function<void()> run;
};
struct CUgraph_st {
    std::vector<graph_node> nodes;
};
struct CUgraphExec_st {
    std::vector<graph_node> nodes;
};
struct CUstream_st {
    unsigned flags;
    CUgraph_st *capture;   // while captured: the graph so far
    bool invalidated;      // a call broke the capture: EndCapture fails
};

namespace {

thread_local cudaStream_t t_capturing;   // the stream this thread captures, if any

// A call that waits for the device or allocates, by the capturing thread: fails and breaks
// the capture (cudaErrorStreamCaptureUnsupported), as in a GPU's global and thread-local
// capture modes.
bool breaks_capture(const char *call)
{
    if (t_capturing == nullptr)
        return false;
    t_capturing->invalidated = true;
    fail(cudaErrorStreamCaptureUnsupported, call, "called while this thread captures a stream");
    return true;
}

const char kCopyTag[4] = {0, 0, 0, 0};   // &kCopyTag[kind]: a copy node of that direction
const char kGemmTag = 0;

}  // namespace

bool cudasim::capturing(cudaStream_t s)
{
    return s != nullptr && s->capture != nullptr;
}

void cudasim::record(cudaStream_t s, const void *what, std::function<void()> run)
{
    s->capture->nodes.push_back(graph_node{what, std::move(run)});
}

// ---- the runtime API
cudaError_t cudaGetDeviceCount(int *n)
{
    const char *e = getenv("LLMGW_CUDASIM_DEVICES");
    *n = e != nullptr ? atoi(e) : 1;
    if (*n == 0)
        return fail(cudaErrorNoDevice, "cudaGetDeviceCount", "LLMGW_CUDASIM_DEVICES=0");
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int *dev)
{
    *dev = g_device;
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int dev)
{
    int n = 0;
    cudaGetDeviceCount(&n);
    if (dev < 0 || dev >= n)
        return fail(cudaErrorInvalidDevice, "cudaSetDevice", "no such device");
    g_device = dev;
    return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp *prop, int dev)
{
    memset(prop, 0, sizeof *prop);
    snprintf(prop->name, sizeof prop->name, "cudasim %d (CUDA kernels on the CPU)", dev);
    prop->totalGlobalMem = kDeviceMemory;
    prop->sharedMemPerBlock = 48 << 10;
    prop->warpSize = 32;
    prop->maxThreadsPerBlock = 1024;
    prop->maxThreadsDim[0] = prop->maxThreadsDim[1] = 1024;
    prop->maxThreadsDim[2] = 64;
    prop->maxGridSize[0] = 0x7fffffff;
    prop->maxGridSize[1] = prop->maxGridSize[2] = 65535;
    prop->major = 9;
    prop->minor = 0;
    prop->multiProcessorCount = 132;   // an H100 SXM's: the launch shapes chosen for one
    return cudaSuccess;
}

cudaError_t cudaGetLastError(void)
{
    cudaError_t e = g_last;
    g_last = cudaSuccess;
    return e;
}

const char *cudaGetErrorString(cudaError_t e)
{
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorStreamCaptureUnsupported:
        return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated:
        return "operation failed due to a previous error during capture";
    case cudaErrorStreamCaptureImplicit:
        return "operation would make the legacy stream depend on a capturing blocking stream";
    case cudaErrorGraphExecUpdateFailure:
        return "the graph update was not performed because it included changes which violated "
               "constraints specific to instantiated graph update";
    }
    return "unrecognized error code";
}

cudaError_t cudaMalloc(void **p, size_t n)
{
    *p = nullptr;
    if (breaks_capture("cudaMalloc"))
        return cudaErrorStreamCaptureUnsupported;
    if (n == 0)
        return cudaSuccess;
    {
        std::lock_guard<std::mutex> g(g_mem_lock);
        if (n > kDeviceMemory - g_dev_total)
            return fail(cudaErrorMemoryAllocation, "cudaMalloc", "over the device's 8 GiB");
        g_dev_total += n;
    }
    void *m = aligned_alloc(256, (n + 255) / 256 * 256);
    std::lock_guard<std::mutex> g(g_mem_lock);
    if (m == nullptr) {
        g_dev_total -= n;
        return fail(cudaErrorMemoryAllocation, "cudaMalloc", "out of host memory");
    }
    memset(m, 0xff, n);   // device memory starts as garbage (NaN as f32 and f16), not zeros
    g_dev[(uintptr_t)m] = n;
    *p = m;
    if (tracing())
        fprintf(stderr, "cudasim: cudaMalloc %zu bytes at %p (after %lu launches)\n", n, m,
                g_launches.load());
    return cudaSuccess;
}

cudaError_t cudaFree(void *p)
{
    if (p == nullptr)
        return cudaSuccess;
    if (breaks_capture("cudaFree"))
        return cudaErrorStreamCaptureUnsupported;
    {
        std::lock_guard<std::mutex> g(g_mem_lock);
        auto it = g_dev.find((uintptr_t)p);
        if (it == g_dev.end())
            return fail(cudaErrorInvalidValue, "cudaFree", "not a device allocation's start");
        g_dev_total -= it->second;
        if (tracing())
            fprintf(stderr, "cudasim: cudaFree %zu bytes at %p (after %lu launches)\n",
                    it->second, p, g_launches.load());
        g_dev.erase(it);
    }
    free(p);
    return cudaSuccess;
}

cudaError_t cudaMallocHost(void **p, size_t n)
{
    if (breaks_capture("cudaMallocHost"))
        return cudaErrorStreamCaptureUnsupported;
    *p = malloc(n > 0 ? n : 1);
    if (*p == nullptr)
        return fail(cudaErrorMemoryAllocation, "cudaMallocHost", "out of host memory");
    std::lock_guard<std::mutex> g(g_mem_lock);
    g_pinned[(uintptr_t)*p] = n;
    return cudaSuccess;
}

cudaError_t cudaFreeHost(void *p)
{
    if (p == nullptr)
        return cudaSuccess;
    if (breaks_capture("cudaFreeHost"))
        return cudaErrorStreamCaptureUnsupported;
    {
        std::lock_guard<std::mutex> g(g_mem_lock);
        auto it = g_pinned.find((uintptr_t)p);
        if (it == g_pinned.end())
            return fail(cudaErrorInvalidValue, "cudaFreeHost", "not a pinned allocation's start");
        g_pinned.erase(it);
    }
    free(p);
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, cudaMemcpyKind kind,
                            cudaStream_t s)
{
    if (n == 0)
        return cudaSuccess;
    bool dd = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
    bool sd = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
    if (kind == cudaMemcpyDefault || kind == cudaMemcpyHostToHost)
        return fail(cudaErrorInvalidValue, "cudaMemcpyAsync", "only the three directed kinds here");
    if (dd ? !is_device(dst, n) : touches_device(dst, n))
        return fail(cudaErrorInvalidValue, "cudaMemcpyAsync",
                    dd ? "destination not inside one device allocation"
                       : "host destination overlaps device memory");
    if (sd ? !is_device(src, n) : touches_device(src, n))
        return fail(cudaErrorInvalidValue, "cudaMemcpyAsync",
                    sd ? "source not inside one device allocation"
                       : "host source overlaps device memory");
    if (cudasim::capturing(s)) {
        // A captured copy reads its source when the graph runs; from host memory only pinned
        // memory can be captured.
        const void *host = kind == cudaMemcpyHostToDevice   ? src
                           : kind == cudaMemcpyDeviceToHost ? (const void *)dst
                                                            : nullptr;
        bool pinned;
        {
            std::lock_guard<std::mutex> g(g_mem_lock);
            pinned = host == nullptr || inside(g_pinned, host, n);
        }
        if (!pinned) {
            s->invalidated = true;
            return fail(cudaErrorStreamCaptureUnsupported, "cudaMemcpyAsync",
                        "a captured copy from or to pageable host memory");
        }
        cudasim::record(s, &kCopyTag[kind], [dst, src, n] { memmove(dst, src, n); });
        return cudaSuccess;
    }
    memmove(dst, src, n);
    return cudaSuccess;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, cudaMemcpyKind kind)
{
    if (breaks_capture("cudaMemcpy"))
        return cudaErrorStreamCaptureUnsupported;
    return cudaMemcpyAsync(dst, src, n, kind, nullptr);
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags)
{
    *s = new CUstream_st{flags, nullptr, false};
    return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t s)
{
    if (s != nullptr && s->capture != nullptr)
        die("cudaStreamDestroy: the stream is being captured");
    delete s;
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
    if (cudasim::capturing(s)) {
        s->invalidated = true;
        return fail(cudaErrorStreamCaptureUnsupported, "cudaStreamSynchronize",
                    "the stream is being captured");
    }
    if (breaks_capture("cudaStreamSynchronize"))
        return cudaErrorStreamCaptureUnsupported;
    return cudaSuccess;
}

// ---- graphs
cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode)
{
    if (s == nullptr)
        return fail(cudaErrorStreamCaptureUnsupported, "cudaStreamBeginCapture",
                    "the legacy stream cannot be captured");
    if (mode != cudaStreamCaptureModeGlobal && mode != cudaStreamCaptureModeThreadLocal)
        return fail(cudaErrorInvalidValue, "cudaStreamBeginCapture",
                    "only the global and thread-local modes are simulated");
    if (s->capture != nullptr || t_capturing != nullptr)
        return fail(cudaErrorInvalidValue, "cudaStreamBeginCapture",
                    "a capture is already under way on this stream or thread");
    s->capture = new CUgraph_st;
    s->invalidated = false;
    t_capturing = s;
    return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *graph)
{
    *graph = nullptr;
    if (s == nullptr || s->capture == nullptr)
        return fail(cudaErrorInvalidValue, "cudaStreamEndCapture", "the stream is not captured");
    if (t_capturing != s)
        die("cudaStreamEndCapture: called by a thread other than the one that began it");
    CUgraph_st *g = s->capture;
    s->capture = nullptr;
    t_capturing = nullptr;
    if (s->invalidated) {
        delete g;
        return fail(cudaErrorStreamCaptureInvalidated, "cudaStreamEndCapture",
                    "a call during the capture broke it");
    }
    *graph = g;
    return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph,
                                 unsigned long long flags)
{
    if (graph == nullptr || flags != 0)
        return fail(cudaErrorInvalidValue, "cudaGraphInstantiate", "no graph, or flags");
    *exec = new CUgraphExec_st{graph->nodes};
    return cudaSuccess;
}

cudaError_t cudaGraphExecUpdate(cudaGraphExec_t exec, cudaGraph_t graph,
                                cudaGraphExecUpdateResultInfo *info)
{
    *info = cudaGraphExecUpdateResultInfo{cudaGraphExecUpdateSuccess, nullptr, nullptr};
    if (exec == nullptr || graph == nullptr)
        return fail(cudaErrorInvalidValue, "cudaGraphExecUpdate", "no graph");
    if (exec->nodes.size() != graph->nodes.size()) {
        info->result = cudaGraphExecUpdateErrorTopologyChanged;
        g_last = cudaErrorGraphExecUpdateFailure;
        return cudaErrorGraphExecUpdateFailure;
    }
    for (size_t i = 0; i < exec->nodes.size(); i++)
        if (exec->nodes[i].what != graph->nodes[i].what) {
            info->result = cudaGraphExecUpdateErrorFunctionChanged;
            g_last = cudaErrorGraphExecUpdateFailure;
            return cudaErrorGraphExecUpdateFailure;
        }
    exec->nodes = graph->nodes;
    return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s)
{
    if (exec == nullptr)
        return fail(cudaErrorInvalidValue, "cudaGraphLaunch", "no graph");
    if (cudasim::capturing(s))
        return fail(cudaErrorStreamCaptureUnsupported, "cudaGraphLaunch",
                    "graphs inside a capture are not simulated");
    for (const graph_node &n : exec->nodes)
        n.run();
    return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph)
{
    delete graph;
    return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec)
{
    delete exec;
    return cudaSuccess;
}

// ---- cuBLAS
struct cublasContext {
    cudaStream_t stream;
};

cublasStatus_t cublasCreate(cublasHandle_t *h)
{
    *h = new cublasContext{nullptr};
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy(cublasHandle_t h)
{
    delete h;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s)
{
    h->stream = s;
    return CUBLAS_STATUS_SUCCESS;
}

const char *cublasGetStatusString(cublasStatus_t s)
{
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    }
    return "CUBLAS_STATUS_UNKNOWN";
}

namespace {

float load(const void *p, cudaDataType t, size_t i, bool tf32)
{
    float v;
    switch (t) {
    case CUDA_R_16F: v = __half2float(((const __half *)p)[i]); break;
    case CUDA_R_16BF: v = __bfloat162float(((const __nv_bfloat16 *)p)[i]); break;
    default: v = ((const float *)p)[i]; break;
    }
    if (tf32) {   // TF32 keeps 10 of f32's 23 mantissa bits (rounded to nearest)
        uint32_t u;
        memcpy(&u, &v, sizeof u);
        if ((u & 0x7f800000u) != 0x7f800000u)
            u = (u + 0xfffu + ((u >> 13) & 1u)) & ~0x1fffu;
        memcpy(&v, &u, sizeof v);
    }
    return v;
}

typedef float v8 __attribute__((vector_size(32)));

size_t type_size(cudaDataType t)
{
    return t == CUDA_R_32F ? 4 : 2;
}

cublasStatus_t gemm_fail(const char *why)
{
    fprintf(stderr, "cudasim: cuBLAS GEMM: %s\n", why);
    return CUBLAS_STATUS_INVALID_VALUE;
}

// C = alpha op(A) op(B) + beta C, column-major, op(A) m x k, op(B) k x n, C m x n (cuBLAS's
// definition); with beta 0, C is not read.
cublasStatus_t gemm(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                    const float *alpha, const void *A, cudaDataType at, int lda, const void *B,
                    cudaDataType bt, int ldb, const float *beta, float *C, int ldc, bool tf32)
{
    if (m < 0 || n < 0 || k < 0)
        return gemm_fail("negative m, n or k");
    if ((ta != CUBLAS_OP_N && ta != CUBLAS_OP_T) || (tb != CUBLAS_OP_N && tb != CUBLAS_OP_T))
        return gemm_fail("an operation other than N and T");
    int a_rows = ta == CUBLAS_OP_N ? m : k, a_cols = ta == CUBLAS_OP_N ? k : m;
    int b_rows = tb == CUBLAS_OP_N ? k : n, b_cols = tb == CUBLAS_OP_N ? n : k;
    if (lda < (a_rows > 1 ? a_rows : 1) || ldb < (b_rows > 1 ? b_rows : 1) ||
        ldc < (m > 1 ? m : 1))
        return gemm_fail("a leading dimension below its matrix's rows");
    if (m == 0 || n == 0)
        return CUBLAS_STATUS_SUCCESS;
    if (is_device(alpha, sizeof *alpha) || is_device(beta, sizeof *beta))
        return gemm_fail("alpha or beta in device memory under the host pointer mode");
    size_t a_span = ((size_t)(a_cols - 1) * (size_t)lda + (size_t)a_rows) * type_size(at);
    size_t b_span = ((size_t)(b_cols - 1) * (size_t)ldb + (size_t)b_rows) * type_size(bt);
    size_t c_span = ((size_t)(n - 1) * (size_t)ldc + (size_t)m) * sizeof(float);
    if ((k > 0 && (!is_device(A, a_span) || !is_device(B, b_span))) || !is_device(C, c_span))
        return gemm_fail("an operand not inside one device allocation");
    // op(A) as m rows of k and op(B) as n columns of k, converted once (and rounded to TF32)
    std::vector<float> a((size_t)m * (size_t)k), b((size_t)n * (size_t)k);
    for (int i = 0; i < m; i++)
        for (int l = 0; l < k; l++)
            a[(size_t)i * k + l] = load(A, at, ta == CUBLAS_OP_N ? (size_t)i + (size_t)l * lda
                                                                 : (size_t)l + (size_t)i * lda,
                                        tf32);
    for (int j = 0; j < n; j++)
        for (int l = 0; l < k; l++)
            b[(size_t)j * k + l] = load(B, bt, tb == CUBLAS_OP_N ? (size_t)l + (size_t)j * ldb
                                                                 : (size_t)j + (size_t)l * ldb,
                                        tf32);
    float al = *alpha, be = *beta;
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) {
            const float *ar = &a[(size_t)i * k], *bc = &b[(size_t)j * k];
            v8 acc = {0, 0, 0, 0, 0, 0, 0, 0};   // eight running sums, as a GPU's lanes keep
            int l = 0;
            for (; l + 8 <= k; l += 8) {
                v8 x, y;
                memcpy(&x, ar + l, sizeof x);
                memcpy(&y, bc + l, sizeof y);
                acc += x * y;
            }
            float s = 0.0f;
            for (int e = 0; e < 8; e++)
                s += acc[e];
            for (; l < k; l++)
                s += ar[l] * bc[l];
            float *c = &C[(size_t)i + (size_t)j * ldc];
            *c = be == 0.0f ? al * s : al * s + be * *c;
        }
    return CUBLAS_STATUS_SUCCESS;
}

// A GEMM on a captured stream: alpha and beta read now (host pointer mode), the product when
// the graph runs (checked there: a failure then aborts, having no caller to return to).
cublasStatus_t record_gemm(cudaStream_t s, cublasOperation_t ta, cublasOperation_t tb, int m,
                           int n, int k, const float *alpha, const void *A, cudaDataType at,
                           int lda, const void *B, cudaDataType bt, int ldb, const float *beta,
                           float *C, int ldc, bool tf32)
{
    float al = *alpha, be = *beta;
    cudasim::record(s, &kGemmTag, [=] {
        if (gemm(ta, tb, m, n, k, &al, A, at, lda, B, bt, ldb, &be, C, ldc, tf32) !=
            CUBLAS_STATUS_SUCCESS)
            die("a captured cuBLAS GEMM failed when its graph ran");
    });
    return CUBLAS_STATUS_SUCCESS;
}

}  // namespace

cublasStatus_t cublasSgemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                           int n, int k, const float *alpha, const float *A, int lda,
                           const float *B, int ldb, const float *beta, float *C, int ldc)
{
    if (h == nullptr)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (cudasim::capturing(h->stream))
        return record_gemm(h->stream, ta, tb, m, n, k, alpha, A, CUDA_R_32F, lda, B, CUDA_R_32F,
                           ldb, beta, C, ldc, false);
    return gemm(ta, tb, m, n, k, alpha, A, CUDA_R_32F, lda, B, CUDA_R_32F, ldb, beta, C, ldc,
                false);
}

cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                            int n, int k, const void *alpha, const void *A, cudaDataType at,
                            int lda, const void *B, cudaDataType bt, int ldb, const void *beta,
                            void *C, cudaDataType ct, int ldc, cublasComputeType_t compute,
                            cublasGemmAlgo_t algo)
{
    (void)algo;
    if (h == nullptr)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    // The combinations cuBLAS lists for these compute types, with an f32 C (the only ones here).
    bool ok = ct == CUDA_R_32F && at == bt &&
              ((compute == CUBLAS_COMPUTE_32F &&
                (at == CUDA_R_32F || at == CUDA_R_16F || at == CUDA_R_16BF)) ||
               (compute == CUBLAS_COMPUTE_32F_FAST_TF32 && at == CUDA_R_32F));
    if (!ok) {
        fprintf(stderr, "cudasim: cublasGemmEx: types %d x %d -> %d under compute %d\n", at, bt,
                ct, compute);
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    bool tf32 = compute == CUBLAS_COMPUTE_32F_FAST_TF32;
    if (cudasim::capturing(h->stream))
        return record_gemm(h->stream, ta, tb, m, n, k, (const float *)alpha, A, at, lda, B, bt,
                           ldb, (const float *)beta, (float *)C, ldc, tf32);
    return gemm(ta, tb, m, n, k, (const float *)alpha, A, at, lda, B, bt, ldb,
                (const float *)beta, (float *)C, ldc, tf32);
}
