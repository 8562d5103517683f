/* kernels/cpu/attention.c: causal grouped-query attention of a step's sequences, reading K and V
 * (f16, or int8 with their scales: KERN_KV_Q8, never dequantized but a row at a time in
 * registers) through each sequence's block table (kern_seq in kernels/backend.h); there is no
 * contiguous copy.
 *
 * Work unit: one sequence's KV head and a block of its query rows that share it: up to
 * KERN_ATT_ROWS of (query token, query head) pairs, i.e. all the heads of the group for a few
 * consecutive tokens (prefill), or a single head when that leaves too few units to keep every
 * thread busy (decoding a token or a few). The units of all the sequences are claimed from one
 * pool run. A unit makes two passes over the positions 0..max pos of its tokens, page by page:
 * scores of all its rows (each K row converted once for all of them) into per-thread scratch,
 * then, after a per-row softmax that masks the positions past each token's own, the weighted sum
 * of V rows. Units are claimed from an atomic counter, since their cost grows with the position
 * (prefill) and a thread may be slowed by another process. LLMGW_KERNELS=exact computes a unit
 * as llama.cpp does instead (att_unit_exact), slower; f16 K/V only (a Q8 cache takes the
 * default path under every mode: its rows do not depend on the batch either). */
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
    int heads;          /* query heads per unit: a divisor of group */
    int toks;           /* query tokens per unit */
    int hchunks;
    long units;         /* of all the sequences, in their order */
    _Atomic long next;
} att_job;

/* What a unit computes: rows t0 .. t0 + nt - 1 of the call (of sequence seq) against KV head h,
 * its query heads h * group + hc * heads .. + heads - 1. */
typedef struct att_unit {
    const kern_seq *seq;
    int t0, nt, h, hc;
} att_unit;

/* A sequence's units. */
static long seq_units(const att_job *j, const kern_seq *sq)
{
    return (long)((sq->n_tok + j->toks - 1) / j->toks) * j->a->kv.n_kv_head * j->hchunks;
}

/* Per thread: the scores of up to KERN_ATT_ROWS rows over max_ctx positions; under
 * LLMGW_KERNELS=exact also the f16-rounded query rows, the K and V row pointers of every
 * position, and pv_exact's accumulators. */
size_t kern__attention_scratch(int max_ctx, int64_t max_cols)
{
    size_t scores = (size_t)KERN_ATT_ROWS * (size_t)max_ctx * sizeof(float);
    if (!kern__exact())
        return scores;
    return scores + (size_t)KERN_ATT_ROWS * (size_t)max_cols * sizeof(float) +
           2 * (size_t)max_ctx * sizeof(uint16_t *) + KERN_PV_ACC_FLOATS * sizeof(float);
}

/* Default (and =invariant, whose results this already keeps batch-independent): any order. */
static void att_unit_fast(const att_job *j, const att_unit *un, float *scratch)
{
    const kern_attn *a = j->a;
    const kern_vops *v = j->c->v;
    const kern_kv *kv = &a->kv;
    uint8_t *const *pages = un->seq->pages;
    int hc = un->hc, h = un->h, t0 = un->t0, nt = un->nt;
    int d = kv->head_dim, pt = kv->page_tokens, rows = nt * j->heads;
    size_t stride = (size_t)kv->n_kv_head * (size_t)d;    /* f16 elements between tokens */
    size_t ctx = (size_t)j->c->max_ctx;
    const float *q[KERN_ATT_ROWS];
    float *s[KERN_ATT_ROWS], *out[KERN_ATT_ROWS];
    int len[KERN_ATT_ROWS], max_len = 0;
    for (int i = 0; i < rows; i++) {
        int t = t0 + i / j->heads, hq = h * j->group + hc * j->heads + i % j->heads;
        size_t at = ((size_t)t * (size_t)a->n_head + (size_t)hq) * (size_t)d;
        q[i] = a->q + at;
        out[i] = a->out + at;
        s[i] = scratch + (size_t)i * ctx;
        len[i] = a->pos[t] + 1;
        max_len = len[i] > max_len ? len[i] : max_len;
    }
    if (max_len > j->c->max_ctx) {
        fprintf(stderr, "kern attention: position %d beyond the reserved context %d\n",
                max_len - 1, j->c->max_ctx);
        abort();
    }
    bool q8 = kv->type == KERN_KV_Q8;
    kern__kv_check_rotate(kv);
    float qrot[KERN_ATT_ROWS][KERN_KV_MAX_DIM];
    if (q8 && kv->rotate)   /* the queries in the keys' rotated basis */
        for (int i = 0; i < rows; i++) {
            memcpy(qrot[i], q[i], (size_t)d * sizeof(float));
            v->hadamard(qrot[i], d);
            q[i] = qrot[i];
        }
    int kg = kv->k_group > 0 ? kv->k_group : d;
    size_t k_row = kern_kv_row_bytes(kv->type, d, kg), v_row = kern_kv_row_bytes(kv->type, d, d);
    for (int p = 0, p0 = 0; p0 < max_len; p++, p0 += pt) {
        int cnt = max_len - p0 < pt ? max_len - p0 : pt;
        const uint8_t *k = pages[p] + kv->k_off + (size_t)h * k_row;
        if (q8)
            v->qk_q8(q, rows, k, (size_t)kv->n_kv_head * k_row, cnt, d, kg, a->scale, s, p0);
        else
            v->qk(q, rows, (const uint16_t *)k, stride, cnt, d, a->scale, s, p0);
    }
    float inv[KERN_ATT_ROWS];
    for (int i = 0; i < rows; i++) {
        float max = s[i][0];
        for (int k = 1; k < len[i]; k++)
            max = s[i][k] > max ? s[i][k] : max;
        inv[i] = 1.0f / v->softmax_exp(s[i], len[i], max);
        for (int k = len[i]; k < max_len; k++)   /* causal: later positions weigh nothing */
            s[i][k] = 0;
        memset(out[i], 0, (size_t)d * sizeof(float));
    }
    for (int p = 0, p0 = 0; p0 < max_len; p++, p0 += pt) {
        int cnt = max_len - p0 < pt ? max_len - p0 : pt;
        const uint8_t *vv = pages[p] + kv->v_off + (size_t)h * v_row;
        if (q8)
            v->pv_q8(out, rows, (const float *const *)s, p0, vv, (size_t)kv->n_kv_head * v_row,
                     cnt, d);
        else
            v->pv(out, rows, (const float *const *)s, p0, (const uint16_t *)vv, stride, cnt, d);
    }
    for (int i = 0; i < rows; i++) {
        if (q8 && kv->rotate)   /* back from the values' rotated basis */
            v->hadamard(out[i], d);
        for (int e = 0; e < d; e++)
            out[i][e] *= inv[i];
    }
}

/* LLMGW_KERNELS=exact: as llama.cpp without flash attention: KQ = K (f16) times Q rounded to
 * f16, times scale; softmax with its expf and double sum; the probabilities normalized, then
 * rounded to f16; KQV = V (f16) times them. Sums in llama.cpp's order for the batch size
 * (internal.h). */
static void att_unit_exact(const att_job *j, const att_unit *un, uint8_t *scratch)
{
    const kern_attn *a = j->a;
    const kern_vops *v = j->c->v;
    const kern_kv *kv = &a->kv;
    uint8_t *const *pages = un->seq->pages;
    int hc = un->hc, h = un->h, t0 = un->t0, nt = un->nt;
    int d = kv->head_dim, pt = kv->page_tokens, rows = nt * j->heads;
    int order = (a->n_batch > 0 ? a->n_batch : a->n_tok) >= 2 ? KERN_ORDER_GEMM : KERN_ORDER_DOT;
    size_t ctx = (size_t)j->c->max_ctx;
    float *sbase = (float *)scratch;
    float *qbase = sbase + (size_t)KERN_ATT_ROWS * ctx;
    const uint16_t **krow = (const uint16_t **)(qbase + (size_t)KERN_ATT_ROWS * (size_t)j->c->max_cols);
    const uint16_t **vrow = krow + ctx;
    float *acc = (float *)(vrow + ctx);
    const float *q[KERN_ATT_ROWS] = {0};
    float *s[KERN_ATT_ROWS] = {0}, *out[KERN_ATT_ROWS] = {0};
    int len[KERN_ATT_ROWS], max_len = 0;
    for (int i = 0; i < rows; i++) {
        int t = t0 + i / j->heads, hq = h * j->group + hc * j->heads + i % j->heads;
        size_t at = ((size_t)t * (size_t)a->n_head + (size_t)hq) * (size_t)d;
        float *qi = qbase + (size_t)i * (size_t)d;
        kern__f16_round_row(a->q + at, qi, d);
        q[i] = qi;
        out[i] = a->out + at;
        s[i] = sbase + (size_t)i * ctx;
        len[i] = a->pos[t] + 1;
        max_len = len[i] > max_len ? len[i] : max_len;
    }
    if (max_len > j->c->max_ctx) {
        fprintf(stderr, "kern attention: position %d beyond the reserved context %d\n",
                max_len - 1, j->c->max_ctx);
        abort();
    }
    size_t slot = (size_t)kv->n_kv_head * (size_t)d * 2, head = (size_t)h * (size_t)d * 2;
    for (int p = 0; p < max_len; p++) {
        const uint8_t *base = pages[p / pt] + (size_t)(p % pt) * slot + head;
        krow[p] = (const uint16_t *)(base + kv->k_off);
        vrow[p] = (const uint16_t *)(base + kv->v_off);
    }
    v->qk_exact(q, rows, krow, max_len, d, a->scale, s, order);
    for (int i = 0; i < rows; i++) {
        float max = s[i][0];
        for (int k = 1; k < len[i]; k++)
            max = s[i][k] > max ? s[i][k] : max;
        double sum = v->softmax_exact(s[i], len[i], max);
        v->probs_f16(s[i], len[i], (float)(1.0 / sum));
        for (int k = len[i]; k < max_len; k++)   /* causal: later positions weigh nothing */
            s[i][k] = 0;
    }
    for (int i = 0; i < rows; i += 3)
        v->pv_exact(out + i, rows - i < 3 ? rows - i : 3, (const float *const *)s + i, vrow,
                    max_len, d, order, acc);
}

static void att_run(void *arg, int ith, int nth)
{
    (void)nth;
    att_job *j = arg;
    const kern_attn *a = j->a;
    uint8_t *scratch = j->c->scratch + (size_t)ith * j->c->scratch_stride;
    bool exact = kern__exact() && a->kv.type == KERN_KV_F16;  /* llama.cpp's order: f16 */
    int s = 0;        /* the sequence of the units from base on (a thread's claims only grow) */
    long base = 0;
    for (;;) {
        long u = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
        if (u >= j->units)
            break;
        while (u >= base + seq_units(j, &a->seqs[s]))
            base += seq_units(j, &a->seqs[s++]);
        const kern_seq *sq = &a->seqs[s];
        long l = u - base;
        att_unit un = {.seq = sq, .hc = (int)(l % j->hchunks),
                       .h = (int)(l / j->hchunks % a->kv.n_kv_head)};
        un.t0 = sq->tok0 + (int)(l / j->hchunks / a->kv.n_kv_head) * j->toks;
        un.nt = sq->tok0 + sq->n_tok - un.t0 < j->toks ? sq->tok0 + sq->n_tok - un.t0 : j->toks;
        if (exact)
            att_unit_exact(j, &un, scratch);
        else
            att_unit_fast(j, &un, (float *)scratch);
    }
}

static void plan(att_job *j, int heads)
{
    j->heads = heads;
    j->toks = KERN_ATT_ROWS / heads;
    j->hchunks = j->group / heads;
    j->units = 0;
    for (int s = 0; s < j->a->n_seq; s++)
        j->units += seq_units(j, &j->a->seqs[s]);
}

void kern__op_attention(void *ctx, const kern_attn *a)
{
    kern_cpu *c = ctx;
    att_job j = {.c = c, .a = a, .group = a->n_head / a->kv.n_kv_head};
    int heads = j.group;
    while (heads > KERN_ATT_ROWS || j.group % heads != 0)
        heads--;
    plan(&j, heads);
    if (j.units == 0)
        return;
    if (j.units < 2L * c->nth && heads > 1)   /* too few units: one head each */
        plan(&j, 1);
    atomic_init(&j.next, 0);
    if (c->nth > 1 && j.units > 1)
        util_pool_run(c->pool, att_run, &j);
    else
        att_run(&j, 0, 1);
}
