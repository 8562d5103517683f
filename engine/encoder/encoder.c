/* engine/encoder/encoder.c: the embedding worker (engine/encoder/encoder.h). Submitters append to
 * a ring of queued texts under a mutex; the worker waits for the first text, then until max_batch
 * texts are queued or window_us has passed since the oldest one arrived, and encodes them in one
 * forward outside the lock. Adaptive: the window is waited only when the oldest text came within a
 * window of the text before it (traffic dense enough for company to be likely); otherwise the
 * texts queued at that moment go at once. Texts that queue up while a batch is encoded form the
 * next batch either way. Stop lets the worker drain the ring without waiting for windows. With
 * max_wait_us, submit refuses a text whose wait would exceed it, estimated from the texts ahead of
 * it (queued and in the batch being encoded) and the moving average of the nanoseconds a text has
 * cost in recent batches. The worker creates its forward context itself, after taking its nice
 * value, so that the context's kernel threads inherit it. */
#include "engine/encoder/encoder.h"

#include "engine/encoder/bert_forward.h"

#include "common/arena.h"
#include "common/thread.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <sys/resource.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct job {
    char *text;     /* owned copy */
    size_t len;
    eng_encoder_done done;
    void *user;
    uint64_t t_ns;  /* when it was submitted (CLOCK_MONOTONIC) */
    uint64_t gap_ns;  /* since the text submitted before it (UINT64_MAX: none) */
} job;

struct eng_encoder {
    const eng_bert *m;
    eng_bert_ctx *ctx;   /* the worker's */
    int window_us, max_batch, max_queue, dim;
    uint64_t max_wait_ns;     /* 0: no limit */
    double ns_per_text;       /* under mu: moving average over batches; 0 before the first */
    int in_flight;            /* under mu: texts of the batch being encoded */
    bool adaptive;
    int threads, nice;        /* the context's threads; the worker's nice value */
    uint64_t spin_ns;         /* the context's linger */
    int start_rc;             /* under mu: the context's creation (1: not yet) */
    util_err start_err;       /* its error, read by start once start_rc <= 0 */
    uint64_t last_submit_ns;  /* under mu; 0: none yet */
    pthread_mutex_t mu;
    pthread_cond_t cv;   /* a text was queued, or stop, or the context was created */
    pthread_t thread;
    job *ring;           /* [max_queue] */
    int head, count;     /* under mu */
    bool stopping;       /* under mu */
    eng_encoder_stats stats;  /* under mu (queue_depth is filled in by get_stats) */
    /* The worker's batch: */
    job *batch;          /* [max_batch] */
    const char **texts;  /* [max_batch] */
    size_t *lens;        /* [max_batch] */
    int *n_tokens;       /* [max_batch] */
    float *vecs;         /* [max_batch][dim] */
};

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Takes the next batch off the ring into e->batch; returns its size, 0 when stopped and
 * drained. Called with mu held. */
static int next_batch(eng_encoder *e)
{
    while (e->count == 0 && !e->stopping)
        pthread_cond_wait(&e->cv, &e->mu);
    if (e->count == 0)
        return 0;
    const job *first = &e->ring[e->head];
    uint64_t window_ns = (uint64_t)e->window_us * 1000u;
    uint64_t deadline = e->adaptive && first->gap_ns > window_ns ? 0 : first->t_ns + window_ns;
    while (e->count < e->max_batch && !e->stopping && now_ns() < deadline) {
        struct timespec ts = {(time_t)(deadline / 1000000000u), (long)(deadline % 1000000000u)};
        pthread_cond_timedwait(&e->cv, &e->mu, &ts);
    }
    int n = e->count < e->max_batch ? e->count : e->max_batch;
    for (int i = 0; i < n; i++) {
        e->batch[i] = e->ring[e->head];
        e->head = (e->head + 1) % e->max_queue;
    }
    e->count -= n;
    e->in_flight = n;
    return n;
}

/* The worker's first steps: its nice value (Linux: setpriority on PRIO_PROCESS 0 applies to the
 * calling thread, and threads it starts inherit it), then its context; start() waits for them. */
static int worker_begin(eng_encoder *e)
{
    int rc = 0;
    errno = 0;
    int now = getpriority(PRIO_PROCESS, 0);   /* a nice value the process already has stays */
    if (e->nice > 0 && (errno != 0 || e->nice > now) && setpriority(PRIO_PROCESS, 0, e->nice) != 0)
        rc = util_err_set(&e->start_err, LLMGW_EIO, "encoder: setpriority(nice %d) failed",
                          e->nice);
    if (rc == 0)
        rc = eng_bert_ctx_new(&e->ctx, e->m, e->threads, &e->start_err);
    if (rc == 0)
        eng_bert_ctx_set_linger(e->ctx, e->spin_ns);
    pthread_mutex_lock(&e->mu);
    e->start_rc = rc;
    pthread_cond_broadcast(&e->cv);
    return rc;   /* with mu held */
}

static void *worker(void *arg)
{
    eng_encoder *e = arg;
    if (worker_begin(e) != 0) {
        pthread_mutex_unlock(&e->mu);
        return NULL;
    }
    for (;;) {
        int n = next_batch(e);
        if (n == 0)
            break;
        pthread_mutex_unlock(&e->mu);
        for (int i = 0; i < n; i++) {
            e->texts[i] = e->batch[i].text;
            e->lens[i] = e->batch[i].len;
        }
        util_err err = {0};
        uint64_t t0 = now_ns();
        int rc = eng_bert_encode(e->ctx, e->texts, e->lens, n, e->vecs, e->n_tokens, &err);
        uint64_t tokens = 0;
        for (int i = 0; i < n; i++) {
            job *j = &e->batch[i];
            if (rc == 0) {
                eng_encoded x = {.vec = e->vecs + (size_t)i * e->dim, .dim = e->dim,
                                 .n_tokens = e->n_tokens[i]};
                x.tokens = eng_bert_token_vectors(e->ctx, i, &x.n_tokens);
                j->done(j->user, 0, &x);
            } else {
                j->done(j->user, rc, NULL);
            }
            tokens += rc == 0 ? (uint64_t)e->n_tokens[i] : 0;
            free(j->text);
        }
        double per = (double)(now_ns() - t0) / n;
        pthread_mutex_lock(&e->mu);
        e->in_flight = 0;
        e->ns_per_text = e->ns_per_text > 0 ? 0.8 * e->ns_per_text + 0.2 * per : per;
        e->stats.texts += (uint64_t)n;
        e->stats.batches++;
        e->stats.tokens += tokens;
    }
    pthread_mutex_unlock(&e->mu);
    return NULL;
}

static void encoder_free(eng_encoder *e)
{
    eng_bert_ctx_free(e->ctx);
    free(e->ring);
    free(e->batch);
    free(e->texts);
    free(e->lens);
    free(e->n_tokens);
    free(e->vecs);
    free(e);
}

int eng_encoder_start(eng_encoder **out, const eng_bert *m, const eng_encoder_cfg *cfg,
                      util_err *err)
{
    eng_encoder_cfg d = {0};
    if (cfg == NULL)
        cfg = &d;
    *out = NULL;
    if (cfg->window_us < 0 || cfg->max_batch < 0 || cfg->max_queue < 0 || cfg->threads < 0 ||
        cfg->spin_us < 0 || cfg->max_batch > 1 << 16 || cfg->max_queue > 1 << 20 ||
        cfg->window_us > 10000000 || cfg->spin_us > 10000000 || cfg->max_wait_us < 0 ||
        cfg->nice < 0 || cfg->nice > 19)
        return util_err_set(err, LLMGW_EINVAL, "encoder: a setting is negative or absurdly "
                            "large (window_us %d, max_batch %d, max_queue %d, threads %d, "
                            "spin_us %d, max_wait_us %d, nice %d: 0..19)", cfg->window_us,
                            cfg->max_batch, cfg->max_queue, cfg->threads, cfg->spin_us,
                            cfg->max_wait_us, cfg->nice);
    eng_encoder *e = util_xcalloc(1, sizeof *e);
    e->m = m;
    e->dim = eng_bert_dim(m);
    e->window_us = cfg->window_us ? cfg->window_us : 500;
    e->adaptive = cfg->adaptive;
    e->max_batch = cfg->max_batch ? cfg->max_batch : 32;
    e->max_queue = cfg->max_queue ? cfg->max_queue : 4096;
    e->max_wait_ns = (uint64_t)cfg->max_wait_us * 1000u;
    e->threads = cfg->threads;
    e->nice = cfg->nice;
    e->spin_ns = (uint64_t)cfg->spin_us * 1000u;
    e->start_rc = 1;
    e->ring = util_xcalloc((size_t)e->max_queue, sizeof *e->ring);
    e->batch = util_xcalloc((size_t)e->max_batch, sizeof *e->batch);
    e->texts = util_xcalloc((size_t)e->max_batch, sizeof *e->texts);
    e->lens = util_xcalloc((size_t)e->max_batch, sizeof *e->lens);
    e->n_tokens = util_xcalloc((size_t)e->max_batch, sizeof *e->n_tokens);
    e->vecs = util_xcalloc((size_t)e->max_batch * e->dim, sizeof *e->vecs);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&e->cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_init(&e->mu, NULL);
    if (util_thread_start(&e->thread, "encoder", worker, e, err) != 0) {
        pthread_cond_destroy(&e->cv);
        pthread_mutex_destroy(&e->mu);
        encoder_free(e);
        return LLMGW_EIO;
    }
    pthread_mutex_lock(&e->mu);
    while (e->start_rc > 0)
        pthread_cond_wait(&e->cv, &e->mu);
    int rc = e->start_rc;
    pthread_mutex_unlock(&e->mu);
    if (rc != 0) {   /* the worker has returned: stop joins it and frees what start made */
        if (err != NULL)
            *err = e->start_err;
        eng_encoder_stop(e);
        return rc;
    }
    *out = e;
    return 0;
}

void eng_encoder_stop(eng_encoder *e)
{
    if (e == NULL)
        return;
    pthread_mutex_lock(&e->mu);
    e->stopping = true;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
    util_thread_join(e->thread);
    pthread_cond_destroy(&e->cv);
    pthread_mutex_destroy(&e->mu);
    encoder_free(e);
}

int eng_encoder_submit(eng_encoder *e, const char *text, size_t len, eng_encoder_done done,
                       void *user)
{
    char *copy = malloc(len + 1);
    if (copy == NULL)
        return LLMGW_ENOMEM;
    memcpy(copy, text, len);
    copy[len] = '\0';
    pthread_mutex_lock(&e->mu);
    if (e->count >= e->max_queue || e->stopping ||
        (e->max_wait_ns > 0 &&
         (double)(e->count + e->in_flight + 1) * e->ns_per_text > (double)e->max_wait_ns)) {
        pthread_mutex_unlock(&e->mu);
        free(copy);
        return LLMGW_EBUSY;
    }
    job *j = &e->ring[(e->head + e->count) % e->max_queue];
    uint64_t t = now_ns();
    *j = (job){copy, len, done, user, t, e->last_submit_ns ? t - e->last_submit_ns : UINT64_MAX};
    e->last_submit_ns = t;
    e->count++;
    /* The worker waits for the first text, and then for a full batch. */
    if (e->count == 1 || e->count >= e->max_batch)
        pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
    return 0;
}

void eng_encoder_get_stats(eng_encoder *e, eng_encoder_stats *out)
{
    pthread_mutex_lock(&e->mu);
    *out = e->stats;
    out->queue_depth = (uint64_t)e->count;
    pthread_mutex_unlock(&e->mu);
}
