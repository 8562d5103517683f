/* engine/serve/sample.c: sampling. Greedy is an argmax. Otherwise the candidates are narrowed by
 * top-k (a bounded min-heap), scaled by the temperature, softmaxed, cut by min-p and top-p
 * (over candidates sorted by probability), renormalised and drawn from with the sequence's
 * generator; with neither top-k nor top-p nothing needs sorting, and nothing is. Without top-k,
 * the sort starts from the 1024 most likely tokens and only falls back to the whole vocabulary
 * when those do not reach top_p. A logit_bias is applied to a copy of the logits in the
 * sampler's scratch, which every step of the choice reads; the logprobs are computed from the
 * model's logits.
 *
 * The softmax terms over the vocabulary are expf's, summed in double: libm's double exp over
 * 49k logits cost 0.5 ms in a loop alone but 3-8 ms a token in the engine's thread (perf: in
 * __ieee754_exp_fma; the cause not pinned down), which made sampled decoding of the stand-in
 * ~40 % slower than greedy; with expf it runs as fast as greedy. A term is a float in the end
 * either way (the probabilities are floats). */
#include "engine/serve/sample.h"

#include "common/arena.h"

#include <float.h>
#include <stdbool.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define FIRST_CUT 1024

typedef struct cand {
    float logit;
    int32_t id;
} cand;

struct eng_sampler {
    int n_vocab;
    cand *c;       /* [n_vocab] */
    float *p;      /* [n_vocab] probabilities of the candidates */
    float *biased; /* [n_vocab] the logits plus the logit_bias, when there is one */
};

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t splitmix(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15u);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
}

void eng_rng_seed(eng_rng *r, uint64_t seed)
{
    for (int i = 0; i < 4; i++)
        r->s[i] = splitmix(&seed);
}

uint64_t eng_rng_next(eng_rng *r)
{
    uint64_t *s = r->s;
    uint64_t out = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return out;
}

double eng_rng_uniform(eng_rng *r)
{
    return (double)(eng_rng_next(r) >> 11) * (1.0 / 9007199254740992.0);
}

eng_sampler *eng_sampler_new(int n_vocab)
{
    eng_sampler *s = util_xcalloc(1, sizeof *s);
    s->n_vocab = n_vocab;
    s->c = util_xmalloc((size_t)n_vocab * sizeof *s->c);
    s->p = util_xmalloc((size_t)n_vocab * sizeof *s->p);
    s->biased = util_xmalloc((size_t)n_vocab * sizeof *s->biased);
    return s;
}

void eng_sampler_free(eng_sampler *s)
{
    if (s == NULL)
        return;
    free(s->c);
    free(s->p);
    free(s->biased);
    free(s);
}

/* Orders candidates by logit, highest first; ties by lower id (deterministic). */
static int cand_cmp(const void *a, const void *b)
{
    const cand *x = a, *y = b;
    if (x->logit != y->logit)
        return x->logit < y->logit ? 1 : -1;
    return (x->id > y->id) - (x->id < y->id);
}

/* Keeps the k best of logits in c[0..k) (unsorted) with a min-heap on logit. */
static int top_k_heap(const float *logits, int n, int k, cand *c)
{
    int size = 0;
    for (int i = 0; i < n; i++) {
        float v = logits[i];
        if (size < k) {
            int j = size++;
            while (j > 0 && c[(j - 1) / 2].logit > v) {
                c[j] = c[(j - 1) / 2];
                j = (j - 1) / 2;
            }
            c[j] = (cand){v, i};
        } else if (v > c[0].logit) {
            int j = 0;
            for (;;) {
                int l = 2 * j + 1, r = l + 1, m = j;
                float mv = v;
                if (l < size && c[l].logit < mv) { m = l; mv = c[l].logit; }
                if (r < size && c[r].logit < mv) { m = r; }
                if (m == j)
                    break;
                c[j] = c[m];
                j = m;
            }
            c[j] = (cand){v, i};
        }
    }
    return size;
}

static void logprobs(eng_sampler *s, const eng_sampling *p, const float *logits, eng_pick *out)
{
    int n = s->n_vocab;
    float mx = -FLT_MAX;
    for (int i = 0; i < n; i++)
        mx = logits[i] > mx ? logits[i] : mx;
    double sum = 0;
    for (int i = 0; i < n; i++)
        sum += expf(logits[i] - mx);
    float lse = mx + (float)log(sum);
    out->logprob = logits[out->token] - lse;
    int k = p->top_logprobs > ENG_MAX_TOP_LOGPROBS ? ENG_MAX_TOP_LOGPROBS : p->top_logprobs;
    if (k <= 0)
        return;
    cand top[ENG_MAX_TOP_LOGPROBS];
    int m = top_k_heap(logits, n, k, top);
    qsort(top, (size_t)m, sizeof *top, cand_cmp);
    out->n_top = m;
    for (int i = 0; i < m; i++) {
        out->top_ids[i] = top[i].id;
        out->top_logprobs[i] = top[i].logit - lse;
    }
}

/* The logits the choice reads: the model's own, or a copy with p->logit_bias added and the
 * tokens p->allow excludes at -inf. */
static const float *apply_bias(eng_sampler *s, const eng_sampling *p, const float *logits)
{
    bool bias = p->logit_bias != NULL && p->n_logit_bias > 0;
    if (!bias && p->allow == NULL)
        return logits;
    memcpy(s->biased, logits, (size_t)s->n_vocab * sizeof *s->biased);
    for (int i = 0; bias && i < p->n_logit_bias; i++) {
        int32_t t = p->logit_bias[i].token;
        if (t >= 0 && t < s->n_vocab)
            s->biased[t] += p->logit_bias[i].bias;
    }
    if (p->allow != NULL)
        for (int w = 0; w < (s->n_vocab + 31) / 32; w++) {
            uint32_t bits = p->allow[w];
            if (bits == 0xFFFFFFFFu)
                continue;
            for (int b = 0; b < 32 && w * 32 + b < s->n_vocab; b++)
                if (!(bits >> b & 1))
                    s->biased[w * 32 + b] = -INFINITY;
        }
    return s->biased;
}

static bool is_greedy(const eng_sampling *p)
{
    return p->temperature <= 0 || p->top_k == 1;
}

/* The largest of x[0..n) in eight chains (an element that is no larger, or a NaN, leaves a
 * chain as it was). */
static float max8(const float *x, int n)
{
    float m[8];
    for (int j = 0; j < 8; j++)
        m[j] = -INFINITY;
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++)
            m[j] = x[i + j] > m[j] ? x[i + j] : m[j];
    for (; i < n; i++)
        m[0] = x[i] > m[0] ? x[i] : m[0];
    float r = m[0];
    for (int j = 1; j < 8; j++)
        r = m[j] > r ? m[j] : r;
    return r;
}

/* A vocabulary's worth of logits, a token at a time, took ~0.2 ms (a compare that depends on
 * the previous one); blocks take their maximum in independent chains and only the block that
 * raises the best is searched. Same answer: the first index of the largest. */
int eng_argmax(const float *x, int n)
{
    enum { BLOCK = 256 };
    int best = 0;
    float bv = x[0];
    for (int b = 0; b < n; b += BLOCK) {
        int len = n - b < BLOCK ? n - b : BLOCK;
        float m = max8(x + b, len);
        if (!(m > bv))
            continue;   /* (x[0] a NaN: nothing is larger, as a token at a time) */
        for (int i = 0; i < len; i++)
            if (x[b + i] == m) {
                best = b + i;
                bv = m;
                break;
            }
    }
    return best;
}

float eng_prob_at(const float *logits, int n, int32_t x)
{
    float mx = max8(logits, n);
    const float floor = mx - 20.0f;
    double sum = 0;
    for (int i = 0; i < n; i++)
        if (logits[i] > floor)
            sum += expf(logits[i] - mx);
    return (float)((x < 0 ? 1.0 : expf(logits[x] - mx)) / sum);
}

/* candidates() without top-k or top-p: nothing needs an order, so the whole vocabulary (less
 * what min-p cuts and the tokens of probability 0) in id order. (Sorting 49k candidates for
 * every token cost 3-4 ms, a third of a decode step of the 135M F16 stand-in.) */
static int all_candidates(eng_sampler *s, const eng_sampling *p, const float *logits,
                          double *mass)
{
    int n = s->n_vocab, m = 0;
    float inv_t = 1.0f / p->temperature, mx = max8(logits, n);
    if (!isfinite(mx)) {   /* no finite largest logit: the terms would be NaN; the first largest */
        int b = eng_argmax(logits, n);
        s->c[0] = (cand){logits[b], b};
        s->p[0] = 1;
        *mass = 1;
        return 1;
    }
    double total = 0;
    for (int i = 0; i < n; i++) {
        float e = expf((logits[i] - mx) * inv_t);
        s->p[i] = e;   /* the term, normalised below */
        total += e;
    }
    /* min-p: p_i >= min_p * p_max, p_max = 1 / total */
    float floor = p->min_p > 0 ? (float)(p->min_p / total) : 0;
    *mass = 0;
    for (int i = 0; i < n; i++) {
        float pi = (float)(s->p[i] / total);
        if (pi <= 0 || pi < floor)
            continue;
        s->c[m] = (cand){logits[i], i};
        s->p[m] = pi;   /* m <= i: the terms still to read lie ahead */
        *mass += pi;
        m++;
    }
    return m;   /* >= 1: the largest term is 1, p_max, which min_p <= 1 keeps */
}

/* The candidates a sampled choice draws from: s->c[0..keep) with their probabilities s->p
 * (not renormalised; *mass is their sum). Not for greedy. */
static int candidates(eng_sampler *s, const eng_sampling *p, const float *logits, double *mass)
{
    int n = s->n_vocab, m;
    bool sorted_all = false;
    if ((p->top_k <= 0 || p->top_k >= n) && p->top_p >= 1.0f)
        return all_candidates(s, p, logits, mass);
    if (p->top_k > 0 && p->top_k < n) {
        m = top_k_heap(logits, n, p->top_k, s->c);
    } else if (p->top_p < 1.0f && n > FIRST_CUT) {
        m = top_k_heap(logits, n, FIRST_CUT, s->c);
    } else {
        for (int i = 0; i < n; i++)
            s->c[i] = (cand){logits[i], i};
        m = n;
        sorted_all = true;
    }
    qsort(s->c, (size_t)m, sizeof *s->c, cand_cmp);
    /* Softmax over the whole vocabulary at this temperature: the mass outside the first cut is
     * needed to know whether the cut reaches top_p. */
    float inv_t = 1.0f / p->temperature, mx = s->c[0].logit;
    double total = 0;
    for (int i = 0; i < n; i++)
        total += expf((logits[i] - mx) * inv_t);
    double cum = 0, p0 = 1.0 / total;
    int keep = m;
    for (int i = 0; i < m; i++) {
        s->p[i] = (float)(expf((s->c[i].logit - mx) * inv_t) / total);
        if (p->min_p > 0 && s->p[i] < p->min_p * p0) {
            keep = i;
            break;
        }
        cum += s->p[i];
        if (p->top_p < 1.0f && cum >= p->top_p) {
            keep = i + 1;
            break;
        }
    }
    if (keep == m && !sorted_all && p->top_k <= 0 && p->top_p < 1.0f && cum < p->top_p) {
        /* The first cut did not reach top_p: sort everything (rare: a very flat dist). */
        for (int i = 0; i < n; i++)
            s->c[i] = (cand){logits[i], i};
        qsort(s->c, (size_t)n, sizeof *s->c, cand_cmp);
        cum = 0;
        keep = n;
        for (int i = 0; i < n; i++) {
            s->p[i] = (float)(expf((s->c[i].logit - mx) * inv_t) / total);
            cum += s->p[i];
            if (cum >= p->top_p) {
                keep = i + 1;
                break;
            }
        }
    }
    while (keep > 1 && s->p[keep - 1] <= 0)   /* excluded (p->allow) or underflowed */
        keep--;
    if (keep < 1)
        keep = 1;
    *mass = 0;
    for (int i = 0; i < keep; i++)
        *mass += s->p[i];
    return keep;
}

void eng_sample(eng_sampler *s, const eng_sampling *p, eng_rng *rng, const float *model_logits,
                eng_pick *out)
{
    const float *logits = apply_bias(s, p, model_logits);
    memset(out, 0, sizeof *out);
    if (is_greedy(p)) {
        out->token = eng_argmax(logits, s->n_vocab);
    } else {
        double mass;
        int keep = candidates(s, p, logits, &mass);
        double u = eng_rng_uniform(rng) * mass, acc = 0;
        out->token = s->c[keep - 1].id;
        for (int i = 0; i < keep; i++) {
            acc += s->p[i];
            if (u < acc) {
                out->token = s->c[i].id;
                break;
            }
        }
    }
    if (p->top_logprobs >= 0)
        logprobs(s, p, model_logits, out);
}

void eng_sample_dist(eng_sampler *s, const eng_sampling *p, const float *model_logits,
                     float *dist)
{
    const float *logits = apply_bias(s, p, model_logits);
    memset(dist, 0, (size_t)s->n_vocab * sizeof *dist);
    if (is_greedy(p)) {
        dist[eng_argmax(logits, s->n_vocab)] = 1.0f;
        return;
    }
    double mass;
    int keep = candidates(s, p, logits, &mass);
    for (int i = 0; i < keep; i++)
        dist[s->c[i].id] = (float)(s->p[i] / mass);
}

void eng_pick_token(eng_sampler *s, const eng_sampling *p, const float *model_logits,
                    int32_t token, eng_pick *out)
{
    memset(out, 0, sizeof *out);
    out->token = token;
    if (p->top_logprobs >= 0)
        logprobs(s, p, model_logits, out);
}

int32_t eng_sample_from(const float *dist, int n, eng_rng *rng)
{
    double mass = 0;
    for (int i = 0; i < n; i++)
        mass += dist[i];
    double u = eng_rng_uniform(rng) * mass, acc = 0;
    int last = 0;
    for (int i = 0; i < n; i++) {
        if (dist[i] <= 0)
            continue;
        last = i;
        acc += dist[i];
        if (u < acc)
            return i;
    }
    return last;
}

int32_t eng_spec_verify(float *p, const float *q, int n, int32_t x, float *scratch, eng_rng *rng,
                        bool *accepted)
{
    double px = p[x], qx = q != NULL ? q[x] : 1.0;
    *accepted = px >= qx || eng_rng_uniform(rng) * qx < px;
    if (*accepted)
        return x;
    if (q != NULL)
        return eng_sample_residual(p, q, n, scratch, rng);
    p[x] = 0;  /* p minus the certainty of x, clipped at 0 */
    return eng_sample_from(p, n, rng);
}

int32_t eng_sample_residual(const float *p, const float *q, int n, float *scratch, eng_rng *rng)
{
    double mass = 0;
    for (int i = 0; i < n; i++) {
        float r = p[i] - q[i];
        scratch[i] = r > 0 ? r : 0;
        mass += scratch[i];
    }
    /* p == q (up to rounding): a rejection cannot happen then, but rounding may get here. */
    return eng_sample_from(mass > 1e-12 ? scratch : p, n, rng);
}
