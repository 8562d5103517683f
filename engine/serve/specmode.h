/* engine/serve/specmode.h: which speculation a scheduler step runs, by measurement — one arm
 * per bucket of decoding sequences keeps each mode's tokens a step and time a step, and picks
 * the fastest, warming every mode up first and exploring the others now and then (the policy,
 * and why, is engine/serve/engine.h's; the constants are there). Plain data, no clock: the
 * engine times its steps and hands the figures in, so the choice can be tested on its own. */
#ifndef LLMGW_ENGINE_SPECMODE_H
#define LLMGW_ENGINE_SPECMODE_H

#include <stdbool.h>
#include <stdint.h>

enum {
    ENG_SPEC_NONE = 0,
    ENG_SPEC_NGRAM = 1,
    ENG_SPEC_MODEL = 2,
    ENG_SPEC_MODES = 3,
};

#define ENG_SPEC_WARM 4
#define ENG_SPEC_EXPLORE 32
#define ENG_SPEC_EXPLORE_MAX 1024
#define ENG_SPEC_EXPLORE_SHARE 0.05
#define ENG_SPEC_CLEAR 0.1         /* a verdict that doubles the gap: the others this much slower */
#define ENG_SPEC_BUCKETS 7         /* 1, 2-3, ..., 32-63, 64 and more */

typedef struct eng_spec_arm {
    double rate[ENG_SPEC_MODES];  /* tokens per second of steps in each mode: tok / ns */
    double tok[ENG_SPEC_MODES];   /* tokens a step emits in each mode (average below) */
    double ns[ENG_SPEC_MODES];    /* wall time of a step in each mode: the mean of the first
                                     ENG_SPEC_WARM samples, then a moving average */
    int n[ENG_SPEC_MODES];        /* samples behind each (to ENG_SPEC_WARM) */
    uint32_t steps;
    int last;                /* the mode of the arm's last step */
    bool again;              /* exploring: the next step keeps that mode */
    int best;                /* the fastest mode when the last exploration began */
    int probe;               /* the mode the last exploration tried */
    uint32_t explore;        /* steps between explorations: ENG_SPEC_EXPLORE, doubled each time
                                one leaves the fastest mode clearly so (to ENG_SPEC_EXPLORE_MAX),
                                back on a close call or a change */
    uint32_t next;           /* steps of the next exploration */
} eng_spec_arm;              /* all zero: nothing measured */

/* An engine's arms: by whether any decoding sequence samples, by whether prompt lookup found a
 * draft for any of them this step, and by bucket. The modes nest (the model mode is prompt
 * lookup where it finds a draft and the drafter elsewhere), so a step's rates depend on the
 * text as much as on the mode: measured in one arm, prompt lookup's rate over stretches that
 * copy their input (two to three times plain decoding) stood against the drafter's over text
 * that copies nothing, and kept it off there (bench/speculative, temperature 0.7, fresh
 * prompts: the shipped tier 1.01x plain where drafting alone made 1.22x). Apart, each step
 * is compared with steps of its own kind: where lookup has nothing, the drafter against
 * plain decoding. */
typedef struct eng_spec_table {
    eng_spec_arm arms[2][2][ENG_SPEC_BUCKETS];   /* [sampled][lookup][bucket] */
} eng_spec_table;                                /* all zero: nothing measured */

/* The bucket of a step with n decoding sequences: 1, 2-3, 4-7, ... (powers of two). */
int eng_spec_bucket(int n);
/* The fastest mode in mask (bit m: mode m) by a's measurements; -1 while one of them has
 * fewer than ENG_SPEC_WARM samples. */
int eng_spec_warm_best(const eng_spec_arm *a, unsigned mask);
/* This step's mode among those in mask (not empty). lower: the nearest arm of fewer sequences
 * that is warm, or NULL; a mode richer than its verdict is neither warmed up nor explored. */
int eng_spec_choose(eng_spec_arm *a, const eng_spec_arm *lower, unsigned mask);
/* This step's mode among those in mask (holding ENG_SPEC_NGRAM only where prompt lookup found
 * a draft: without one it is a plain step), for n decoding sequences (> 0), in the arm of its
 * kind (sampled, and whether mask holds prompt lookup). *arm: the arm the step's figures go in
 * (eng_spec_sample), NULL when mask leaves no choice. */
int eng_spec_step(eng_spec_table *t, int n, bool sampled, unsigned mask, eng_spec_arm **arm);
/* A step in mode m that emitted `tokens` in ns nanoseconds (> 0). */
void eng_spec_sample(eng_spec_arm *a, int m, double tokens, double ns);

#endif
