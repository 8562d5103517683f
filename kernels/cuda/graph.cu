// kernels/cuda/graph.cu: a decode step as one CUDA graph. step_record begins capturing the
// backend's stream (thread-local mode: only this thread's unsafe calls break it), the engine
// calls the step's ops as usual (each launch and staging copy is recorded, not run), and
// step_run ends the capture and launches the graph: the host pays for one launch, the device
// runs the kernels back to back. The graph of an earlier step of the same key (the model) and
// size is updated in place (new arguments, positions, block tables) when its shape allows and
// rebuilt when not.
#include "kernels/cuda/internal.cuh"

#include <stdio.h>

// A recorded step must not call cuBLAS (its workspace) nor grow scratch: only the sizes of the
// matrix-vector and int8 batch kernels are recorded, and matmul drops a recording that would
// call cuBLAS (float weights, or LLMGW_CUDA_QUANT=f32, beyond 8 tokens).
static_assert((int)KERN_CUDA_GRAPH_MAX_TOK <= (int)KERN_CUDA_MMQ_MAX, "graphs beyond mmq's sizes");

// The largest staging ring a recording may ask for.
static const size_t kMaxStage = (size_t)256 << 20;

void kern_cuda_not_recording(const kern_cuda *c, const char *call)
{
    if (c->recording)
        kern_cuda_fatal(call, "waits for the stream while a step is being recorded", __FILE__,
                        __LINE__);
}

bool kern_cuda_step_record(void *ctx, const void *key, int n_tok)
{
    kern_cuda *c = (kern_cuda *)ctx;
    if (!c->graphs || n_tok < 1 || n_tok > KERN_CUDA_GRAPH_MAX_TOK || c->recording)
        return false;
    for (const kern_cuda_graph &u : c->unfit)
        if (u.key == key && u.n_tok == n_tok)
            return false;
    kern_cuda_enter(c);
    // A step stages a few small arrays per layer and sequence: it starts on an empty half of
    // the ring, and a step that did not fit in one (dropped) has the ring made twice what it
    // staged, here, between steps (once: the ring only grows).
    if (c->stage_want > c->stage_cap) {
        size_t want = c->stage_want, had = c->stage_cap;
        c->stage_want = 0;
        if (kern_cuda_stage_resize(c, want) != 0 && kern_cuda_stage_resize(c, had) != 0)
            kern_cuda_fatal("cudaMallocHost", "no memory for the staging ring it had", __FILE__,
                            __LINE__);
    }
    if (c->stage_off > c->stage_cap / 2) {
        KERN_CUDA_CHECK(cudaStreamSynchronize(c->stream));
        c->stage_off = 0;
        c->stage_epoch++;
    }
    KERN_CUDA_CHECK(cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal));
    c->recording = true;
    c->record_failed = c->record_unfit = false;
    c->rec_staged = 0;
    c->rec_key = key;
    c->rec_n_tok = n_tok;
    return true;
}

// The slot of (key, n_tok), or the one a new graph replaces (its graph destroyed).
static kern_cuda_graph *slot_for(kern_cuda *c, const void *key, int n_tok)
{
    const int n = (int)(sizeof c->graph / sizeof c->graph[0]);
    for (int i = 0; i < n; i++)
        if (c->graph[i].exec != nullptr && c->graph[i].key == key &&
            c->graph[i].n_tok == n_tok)
            return &c->graph[i];
    kern_cuda_graph *s = &c->graph[c->graph_next];
    c->graph_next = (c->graph_next + 1) % n;
    if (s->exec != nullptr)
        KERN_CUDA_CHECK(cudaGraphExecDestroy(s->exec));
    s->exec = nullptr;
    s->key = key;
    s->n_tok = n_tok;
    return s;
}

bool kern_cuda_step_run(void *ctx)
{
    kern_cuda *c = (kern_cuda *)ctx;
    kern_cuda_enter(c);
    if (!c->recording)
        kern_cuda_fatal("step_run", "no step is being recorded", __FILE__, __LINE__);
    cudaGraph_t g = nullptr;
    cudaError_t e = cudaStreamEndCapture(c->stream, &g);
    c->recording = false;
    if (e != cudaSuccess || c->record_failed) {
        // Nothing of the step ran. A capture the runtime broke is a call this backend makes
        // that graphs do not take: stop recording (the steps run as called, as without graphs).
        if (e != cudaSuccess) {
            fprintf(stderr, "llmgw: CUDA: recording a step failed (%s); graphs off for %s\n",
                    cudaGetErrorString(e), c->name);
            cudaGetLastError();
            c->graphs = false;
        }
        if (g != nullptr)
            KERN_CUDA_CHECK(cudaGraphDestroy(g));
        c->stage_epoch++;   // what the recording staged was never copied
        if (c->record_unfit) {   // not again for this key and size
            const int n = (int)(sizeof c->unfit / sizeof c->unfit[0]);
            c->unfit[c->unfit_next] = kern_cuda_graph{c->rec_key, c->rec_n_tok, nullptr};
            c->unfit_next = (c->unfit_next + 1) % n;
        }
        if (c->record_failed && !c->record_unfit && c->rec_staged <= kMaxStage / 2 &&
            2 * c->rec_staged > c->stage_want)
            c->stage_want = 2 * c->rec_staged;   // the next recording has room (up to a limit)
        c->graph_stats.dropped++;
        return false;
    }
    kern_cuda_graph *s = slot_for(c, c->rec_key, c->rec_n_tok);
    if (s->exec != nullptr) {
        cudaGraphExecUpdateResultInfo info;
        if (cudaGraphExecUpdate(s->exec, g, &info) == cudaSuccess) {
            c->graph_stats.updated++;
        } else {   // another shape (more sequences, more pages staged...): built anew
            cudaGetLastError();
            KERN_CUDA_CHECK(cudaGraphExecDestroy(s->exec));
            s->exec = nullptr;
        }
    }
    if (s->exec == nullptr) {
        KERN_CUDA_CHECK(cudaGraphInstantiate(&s->exec, g, 0));
        c->graph_stats.built++;
    }
    KERN_CUDA_CHECK(cudaGraphDestroy(g));
    KERN_CUDA_CHECK(cudaGraphLaunch(s->exec, c->stream));
    c->graph_stats.steps++;
    return true;
}

void kern_cuda_graphs_free(kern_cuda *c)
{
    for (auto &s : c->graph)
        if (s.exec != nullptr) {
            cudaGraphExecDestroy(s.exec);   // unchecked: also the cleanup of a failed start
            s.exec = nullptr;
        }
}

extern "C" kern_cuda_graph_stats kern_cuda_graphs(const kern_backend *b)
{
    if (b == nullptr || b->step_record != kern_cuda_step_record)
        return kern_cuda_graph_stats{0, 0, 0, 0};
    return ((const kern_cuda *)b->ctx)->graph_stats;
}
