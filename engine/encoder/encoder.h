/* engine/encoder/encoder.h: the embedding worker. One thread owns an eng_bert_ctx; texts submitted
 * from any thread within a short window (window_us) are encoded together in one batch (up to
 * max_batch texts). Never runs model code on the caller's thread.
 *
 * done() runs on the worker thread after the batch (so a caller may, e.g., search an index there
 * before handing the result to its event loop). Its vectors are valid only during the call. */
#ifndef LLMGW_ENGINE_ENCODER_H
#define LLMGW_ENGINE_ENCODER_H

#include "common/err.h"
#include "engine/encoder/bert.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct eng_encoder eng_encoder;

typedef struct eng_encoder_cfg {
    int threads;      /* CPU threads for the forward (0 = all CPUs) */
    int window_us;    /* how long the first text of a batch waits for company; 0 = 500 */
    bool adaptive;    /* wait the window only when the text before came within a window of the
                         first: a lone text (sparse traffic) is encoded at once */
    int spin_us;      /* how long the forward's helper threads keep polling after a batch
                         before they sleep (eng_bert_ctx_set_linger); 0: they sleep at once */
    int max_batch;    /* texts per batch; 0 = 32 */
    int max_queue;    /* queued texts before submit says LLMGW_EBUSY; 0 = 4096 */
    int max_wait_us;  /* submit says LLMGW_EBUSY when a new text would wait longer than this
                         for its vector: (texts queued and being encoded) x the measured time a
                         text costs (a moving average over batches); 0: no such limit */
    int nice;         /* 0..19: the worker and its kernel threads run at this nice value (the
                         worker creates its forward context, so the kernel threads inherit it):
                         under a CPU shortage the scheduler gives them only what the rest of the
                         process leaves, and with max_wait_us the texts they cannot keep up with
                         are refused instead of slowing everything; 0: the process's priority */
} eng_encoder_cfg;

/* One text's result, valid only during the done() call: the pooled vector and the contextual
 * token vectors it was pooled from (eng_bert_token_vectors: [CLS] and [SEP] included). */
typedef struct eng_encoded {
    const float *vec;      /* [dim], L2-normalised */
    const float *tokens;   /* [n_tokens * dim] */
    int dim;
    int n_tokens;
} eng_encoded;

/* status: 0, or an LLMGW_E* code (then x is NULL). */
typedef void (*eng_encoder_done)(void *user, int status, const eng_encoded *x);

/* The model must outlive the encoder. */
int  eng_encoder_start(eng_encoder **out, const eng_bert *m, const eng_encoder_cfg *cfg,
                       util_err *err);
/* Finishes the queued work (done() runs for each), then joins the thread. NULL is a no-op. */
void eng_encoder_stop(eng_encoder *e);

/* Queues a copy of text[0..len). Returns 0, or LLMGW_EBUSY when the queue is full or the text
 * would wait longer than max_wait_us (done() is then not called). Thread-safe. */
int  eng_encoder_submit(eng_encoder *e, const char *text, size_t len, eng_encoder_done done,
                        void *user);

typedef struct eng_encoder_stats {
    uint64_t texts, batches, tokens;
    uint64_t queue_depth;  /* now */
} eng_encoder_stats;
void eng_encoder_get_stats(eng_encoder *e, eng_encoder_stats *out);

#endif
