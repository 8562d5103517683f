/* engine/sample.h: choosing the next token from logits: greedy, temperature, top-k, top-p,
 * min-p, with a per-sequence seeded generator (the same seed and logits give the same tokens),
 * and the log-probabilities OpenAI's `logprobs`/`top_logprobs` report (of the model's own
 * distribution, before temperature and filtering). One sampler per scheduler thread: its
 * scratch is sized once for the vocabulary; sampling never allocates. */
#ifndef LLMGW_ENGINE_SAMPLE_H
#define LLMGW_ENGINE_SAMPLE_H

#include <stdbool.h>
#include <stdint.h>

#define ENG_MAX_TOP_LOGPROBS 20

typedef struct eng_sampling {
    float temperature;   /* 0 = greedy */
    int top_k;           /* 0 = off */
    float top_p;         /* 1 = off */
    float min_p;         /* 0 = off */
    int top_logprobs;    /* -1 = no logprobs; 0..20 = the chosen token's logprob and this many alternatives */
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
/* Picks from logits[n_vocab] (left untouched). */
void eng_sample(eng_sampler *s, const eng_sampling *p, eng_rng *rng, const float *logits,
                eng_pick *out);

#endif
