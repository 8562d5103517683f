/* kernels/cpu/attention.c: causal grouped-query attention of one sequence, reading K and V (f16)
 * through the sequence's block table (kern_kv in kernels/backend.h); there is no contiguous copy.
 *
 * Work unit: one query token, one KV head and a chunk of the query heads that share it (all of
 * them when there are enough units to keep every thread busy, one otherwise, as when decoding one
 * token). A unit makes two passes over the token's positions 0..pos: scores q.k scaled, page by
 * page, into per-thread scratch, then exp(s - max) and the weighted sum of V rows. Units are
 * claimed from an atomic counter, since their cost grows with the position (prefill) and a
 * thread may be slowed by another process. */
#include "kernels/cpu/internal.h"

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct att_job {
    kern_cpu *c;
    const kern_attn *a;
    int group;          /* query heads per KV head */
    int chunk;          /* query heads per unit */
    int n_chunks;       /* per KV head */
    long units;
    _Atomic long next;
} att_job;

size_t kern__attention_scratch(int max_ctx, int64_t max_cols)
{
    (void)max_cols;
    return (size_t)KERN_ATT_GROUP * (size_t)max_ctx * sizeof(float);
}

static void att_unit(att_job *j, long u, float *scores)
{
    const kern_attn *a = j->a;
    const kern_vops *v = j->c->v;
    const kern_kv *kv = &a->kv;
    long per_tok = (long)kv->n_kv_head * j->n_chunks;
    int t = (int)(u / per_tok), h = (int)(u % per_tok / j->n_chunks);
    int g0 = (int)(u % j->n_chunks) * j->chunk;
    int ng = j->group - g0 < j->chunk ? j->group - g0 : j->chunk;
    int d = kv->head_dim, pt = kv->page_tokens, len = a->pos[t] + 1;
    size_t stride = (size_t)kv->n_kv_head * (size_t)d;    /* f16 elements between tokens */
    size_t ctx = (size_t)j->c->max_ctx;
    if (len > j->c->max_ctx) {
        fprintf(stderr, "kern attention: position %d beyond the reserved context %d\n", len - 1,
                j->c->max_ctx);
        abort();
    }
    int hq0 = h * j->group + g0;                           /* first query head of the unit */
    const float *q = a->q + ((size_t)t * (size_t)a->n_head + (size_t)hq0) * (size_t)d;
    float *out = a->out + ((size_t)t * (size_t)a->n_head + (size_t)hq0) * (size_t)d;

    for (int p = 0, p0 = 0; p0 < len; p++, p0 += pt) {
        int cnt = len - p0 < pt ? len - p0 : pt;
        const uint16_t *k = (const uint16_t *)(kv->pages[p] + kv->k_off) + (size_t)h * (size_t)d;
        for (int g = 0; g < ng; g++)
            v->qk(q + (size_t)g * (size_t)d, k, stride, cnt, d, a->scale,
                  scores + (size_t)g * ctx + p0);
    }
    float inv[KERN_ATT_GROUP];
    for (int g = 0; g < ng; g++) {
        float *s = scores + (size_t)g * ctx, max = s[0];
        for (int i = 1; i < len; i++)
            max = s[i] > max ? s[i] : max;
        inv[g] = 1.0f / v->softmax_exp(s, len, max);
        memset(out + (size_t)g * (size_t)d, 0, (size_t)d * sizeof(float));
    }
    for (int p = 0, p0 = 0; p0 < len; p++, p0 += pt) {
        int cnt = len - p0 < pt ? len - p0 : pt;
        const uint16_t *vv = (const uint16_t *)(kv->pages[p] + kv->v_off) + (size_t)h * (size_t)d;
        for (int g = 0; g < ng; g++)
            v->pv(out + (size_t)g * (size_t)d, scores + (size_t)g * ctx + p0, vv, stride, cnt, d);
    }
    for (int g = 0; g < ng; g++)
        for (int e = 0; e < d; e++)
            out[(size_t)g * (size_t)d + (size_t)e] *= inv[g];
}

static void att_run(void *arg, int ith, int nth)
{
    (void)nth;
    att_job *j = arg;
    float *scores = (float *)(j->c->scratch + (size_t)ith * j->c->scratch_stride);
    for (;;) {
        long u = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
        if (u >= j->units)
            break;
        att_unit(j, u, scores);
    }
}

void kern__op_attention(void *ctx, const kern_attn *a)
{
    kern_cpu *c = ctx;
    if (a->n_tok <= 0)
        return;
    att_job j = {.c = c, .a = a, .group = a->n_head / a->kv.n_kv_head};
    long base = (long)a->n_tok * a->kv.n_kv_head;
    j.chunk = base >= 2L * c->nth ? j.group : 1;
    if (j.chunk > KERN_ATT_GROUP)
        j.chunk = KERN_ATT_GROUP;
    j.n_chunks = (j.group + j.chunk - 1) / j.chunk;
    j.units = base * j.n_chunks;
    atomic_init(&j.next, 0);
    if (c->nth > 1 && j.units > 1)
        util_pool_run(c->pool, att_run, &j);
    else
        att_run(&j, 0, 1);
}
