/* engine/serve/sample.h: choosing the next token from logits: greedy, temperature, top-k, top-p,
 * min-p, with a per-sequence seeded generator (the same seed and logits give the same tokens),
 * and the log-probabilities OpenAI's `logprobs`/`top_logprobs` report (of the model's own
 * distribution, before logit_bias, temperature and filtering). One sampler per scheduler
 * thread: its scratch is sized once for the vocabulary; sampling never allocates. */
#ifndef LLMGW_ENGINE_SAMPLE_H
#define LLMGW_ENGINE_SAMPLE_H

#include <stdbool.h>
#include <stdint.h>

#define ENG_MAX_TOP_LOGPROBS 20

typedef struct eng_logit_bias {
    int32_t token;
    float bias;              /* [-100, 100], added to the token's logit */
} eng_logit_bias;

typedef struct eng_sampling {
    float temperature;   /* 0 = greedy */
    int top_k;           /* 0 = off */
    float top_p;         /* 1 = off */
    float min_p;         /* 0 = off */
    int top_logprobs;    /* -1 = no logprobs; 0..20 = the chosen token's logprob and this many alternatives */
    /* logit_bias[n_logit_bias]; NULL when none. eng_engine_submit copies it. Added to the logits
     * before every choice (greedy too), as OpenAI and llama.cpp do: +100 makes greedy pick the
     * token, -100 in effect bans it. Entries for the same token add up; an id outside
     * [0, n_vocab) is ignored (eng_engine_submit refuses it). The reported logprobs stay those
     * of the model's own logits. */
    const eng_logit_bias *logit_bias;
    int n_logit_bias;
    /* Structured outputs (engine/text/grammar.h): bit t of allow[(n_vocab + 31) / 32] set for
     * the tokens that may be chosen; the others are excluded from every choice (greedy,
     * sampled, the speculative distributions) as if their logits were -inf. NULL: all. The
     * reported logprobs stay those of the model's own logits. */
    const uint32_t *allow;
} eng_sampling;

typedef struct eng_rng {
    uint64_t s[4];       /* xoshiro256** state */
} eng_rng;

void     eng_rng_seed(eng_rng *r, uint64_t seed);
uint64_t eng_rng_next(eng_rng *r);
double   eng_rng_uniform(eng_rng *r);  /* [0, 1) */

typedef struct eng_pick {
    int32_t token;
    float logprob;                               /* when top_logprobs >= 0 */
    int n_top;
    int32_t top_ids[ENG_MAX_TOP_LOGPROBS];       /* best first */
    float top_logprobs[ENG_MAX_TOP_LOGPROBS];
} eng_pick;

typedef struct eng_sampler eng_sampler;

eng_sampler *eng_sampler_new(int n_vocab);
void eng_sampler_free(eng_sampler *s);  /* NULL is a no-op */
/* Picks from logits[n_vocab] (left untouched) plus p->logit_bias. */
void eng_sample(eng_sampler *s, const eng_sampling *p, eng_rng *rng, const float *logits,
                eng_pick *out);

/* Speculative sampling's pieces. eng_sample_dist writes the distribution eng_sample draws from
 * (bias, temperature, top-k, top-p and min-p applied; one-hot at the argmax for greedy) into
 * dist[n_vocab]. eng_pick_token fills a pick for a token chosen elsewhere (its logprobs from
 * these logits). eng_sample_from draws from a distribution (need not sum to 1);
 * eng_sample_residual draws from norm(max(0, p - q)) (from p when that is empty), using
 * scratch[n]. */
void    eng_sample_dist(eng_sampler *s, const eng_sampling *p, const float *logits, float *dist);
void    eng_pick_token(eng_sampler *s, const eng_sampling *p, const float *logits, int32_t token,
                       eng_pick *out);
int32_t eng_sample_from(const float *dist, int n, eng_rng *rng);

/* The first index of the largest of x[0..n) (NaNs never win). */
int eng_argmax(const float *x, int n);
/* The softmax of logits[0..n) at token x; x < 0: at the argmax (the largest probability, a
 * model's confidence). Logits more than 20 below the largest are left out of the sum: with
 * 49k tokens they would add under 1e-4 of it. */
float eng_prob_at(const float *logits, int n, int32_t x);
int32_t eng_sample_residual(const float *p, const float *q, int n, float *scratch,
                            eng_rng *rng);
/* The speculative-sampling rule for draft x: accepted with probability min(1, p[x] / q[x]),
 * else a token drawn from norm(max(0, p - q)); q NULL means x was proposed with certainty
 * (prompt lookup). The token is x or the replacement; whatever x and q, it is distributed as p.
 * p may be changed. */
int32_t eng_spec_verify(float *p, const float *q, int n, int32_t x, float *scratch,
                        eng_rng *rng, bool *accepted);

#endif
