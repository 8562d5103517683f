/* engine/serve/engine.h: an engine instance: one model served by one scheduler thread doing
 * continuous batching over the shared KV pool. Between two steps the scheduler admits waiting
 * sequences (their prompts prefilled in chunks), retires finished ones (freeing their pages)
 * and runs one batched forward over every running sequence. When the pool is full, new work
 * waits and the newest running sequence is preempted (pages freed, recomputed later).
 *
 * Results flow through a callback on the scheduler thread, which must not block (the gateway
 * queues them for its loop). Text is always valid UTF-8, released only in whole characters
 * (bytes that can form none become U+FFFD; a character cut by max_tokens or the context is
 * dropped: engine/text/tokenizer.h), and never includes a stop string or anything that may still
 * turn into one. */
#ifndef LLMGW_ENGINE_ENGINE_H
#define LLMGW_ENGINE_ENGINE_H

#include "common/err.h"
#include "engine/serve/kvpool.h"
#include "engine/decoder/model.h"
#include "engine/serve/sample.h"
#include "engine/serve/specmode.h"
#include "engine/text/grammar.h"
#include "kernels/backend.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define ENG_MAX_STOP 4

typedef enum eng_event_kind {
    ENG_EV_TOKEN = 0,
    ENG_EV_DONE = 1,
} eng_event_kind;

typedef enum eng_finish {
    ENG_FINISH_STOP = 0,       /* end-of-generation token or a stop string */
    ENG_FINISH_LENGTH = 1,     /* max_tokens or the context is full */
    ENG_FINISH_CANCELLED = 2,
    ENG_FINISH_ERROR = 3,
} eng_finish;

typedef struct eng_event {
    eng_event_kind kind;
    const char *text;          /* TOKEN: the text this token releases (may be empty, never NULL) */
    size_t len;
    const eng_pick *pick;      /* TOKEN: the token and its log-probabilities */
    eng_finish finish;         /* DONE */
    int prompt_tokens;         /* DONE */
    int completion_tokens;     /* DONE */
    const char *error;         /* DONE with ENG_FINISH_ERROR */
    /* DONE of a cascade (eng_request.cascade): what each model computed. */
    bool escalated;            /* the model took over from the drafter */
    int small_tokens;          /* tokens the drafter generated for it */
    int kept;                  /* of the completion, tokens the drafter generated (all of
                                  them without an escalation) */
    int large_tokens;          /* positions the model computed for it (prefill, checks,
                                  verification, decoding, rejected drafts); 0 when it never
                                  came in */
} eng_event;

/* Runs on the scheduler thread. After DONE (which always comes, cancelled or not) it is never
 * called again for that sequence. */
typedef void (*eng_event_cb)(void *arg, const eng_event *ev);

/* A small-first cascade (needs the engine's drafter). The drafter answers alone, as if it
 * were the model, while a deferral rule watches its confidence c_i = max_v q_i(v) (the softmax
 * of its logits at temperature 1) over the last `window` tokens:
 *   chow: escalate when their mean falls below `threshold` (Chow's rule over a window);
 *   diff: the same condition only makes the model check the held tokens (one batched forward);
 *         it escalates at the first held token where c_i < max_v p_i(v) - margin (the "Diff"
 *         rule of speculative cascades, p the model's distribution), else the drafter goes on
 *         with its tokens (and the condition needs `window` new tokens to hold again).
 * The rule is evaluated once `window` tokens exist, and at the drafter's end (its end-of-text,
 * max_tokens, the context) over those there are. Up to `hold` of the newest drafter tokens are
 * held back, never released; older ones are released (committed: the model, if it comes in,
 * continues after them). On escalation the model computes the prompt and the committed tokens,
 * verifies the held ones in the same forward as a draft (greedy: equal argmax; sampling: the
 * min(1, p/q) rule, engine.h above), keeps the longest accepted prefix, and continues with
 * speculation as usual. So a client never sees a token taken back, an answer that did not
 * escalate is the drafter's, and one that did is the model's continuation of what was kept. */
typedef enum eng_defer {
    ENG_DEFER_NONE = 0,        /* no cascade: the model answers */
    ENG_DEFER_CHOW = 1,
    ENG_DEFER_DIFF = 2,
} eng_defer;

#define ENG_CASCADE_MAX_WINDOW 64

typedef struct eng_cascade {
    eng_defer rule;
    float threshold;           /* (0, 1]; 1 with diff: a check after every window */
    int window;                /* 1..ENG_CASCADE_MAX_WINDOW; 0: 4 */
    float margin;              /* diff: [0, 1] */
    int hold;                  /* 0..ENG_MAX_DRAFT held tokens; < 0: 8 */
} eng_cascade;

typedef struct eng_request {
    const int32_t *prompt;     /* copied */
    size_t n_prompt;
    eng_sampling sampling;     /* its logit_bias is copied */
    uint64_t seed;
    int max_tokens;            /* <= 0: until the context is full */
    const char *stop[ENG_MAX_STOP];  /* copied */
    size_t n_stop;
    bool ignore_eos;
    eng_cascade cascade;       /* rule NONE: none; ignored with a grammar */
    /* Structured output (engine/text/grammar.h), compiled for this model's vocabulary, or NULL.
     * The engine takes a reference. Every choice is masked to the tokens the grammar allows
     * (greedy, sampled, and in speculation both the drafter's choices, from its own copy of
     * the state, and the verification's, so a draft the grammar forbids is rejected); an
     * end-of-generation token ends the answer once the document is whole, even with
     * ignore_eos. A constrained answer is always the model's own (no cascade). */
    eng_grammar *grammar;
    eng_event_cb on_event;
    void *arg;
} eng_request;

typedef struct eng_engine_cfg {
    const char *name;
    int max_batch_tokens;      /* tokens per forward (prefill chunk budget); default 256 */
    int max_seqs;              /* running sequences; default 32 */
    int n_ctx;                 /* per-sequence context; default min(training context, 4096) */
    int prefix_pages;          /* pages the shared-prefix table may hold (engine/serve/prefix.h):
                                  0 = a quarter of the pool, < 0 = no prefix sharing */
    int kv_type;               /* how K/V are stored (kernels/backend.h): KERN_KV_F16 (0, the
                                  default) or KERN_KV_Q8 (int8 with f16 scales: about half the
                                  bytes, so about twice the tokens per page); the drafter's too */
    int kv_k_group;            /* Q8: K elements per scale (0: one scale per head) */
    bool kv_rotate;            /* Q8: rows stored Hadamard-rotated (kernels/backend.h) */
    /* Speculative decoding. Each step, a decoding sequence may bring a draft of tokens that
     * the forward verifies along with its next token: greedy keeps the drafts equal to the
     * model's argmax (output token for token as without a draft, under invariant kernels);
     * sampling accepts draft x with probability min(1, p(x)/q(x)) and on a rejection draws
     * from norm(max(0, p - q)), p the model's and q the drafter's distribution (after bias,
     * temperature and filters), so the output has the model's distribution. Rejected
     * positions are forgotten by truncating the block tables. Prompt lookup drafts first;
     * the draft model only where it proposes nothing. */
    int ngram_draft;           /* prompt lookup: up to this many tokens that followed an
                                  earlier occurrence of the sequence's last 3 (or 2) tokens in
                                  its own text (q is that token with certainty); 0 = off, at
                                  most ENG_MAX_DRAFT */
    const eng_model *drafter;  /* a smaller model with the same vocabulary (eng_engine_new
                                  refuses another), run by this scheduler with its K/V in the
                                  same pool; NULL = none. Must outlive the engine. */
    int draft_max;             /* the most tokens it drafts per step; default 6, at most
                                  ENG_MAX_DRAFT. Per sequence the length adapts: one more after
                                  a fully accepted draft, one less after a rejection. */
    float draft_p_min;         /* drafting stops before a token the drafter itself gives less
                                  than this probability (its softmax); default 0.2, < 0: 0 */
    int draft_max_batch;       /* a step with more decoding sequences than this drafts nothing
                                  with the model; default 8, at most ENG_MAX_DRAFT_BATCH */
    bool draft_own_kv;         /* false (default): a drafter that holds the model's weights at
                                  another precision (eng_model_same_weights: a quantized copy,
                                  as the stand-in pair) reads the model's K/V of the text and
                                  writes its draft's K/V into the model's pages, where the
                                  verification overwrites them: it never catches up with a
                                  prompt, needs no pages of its own, and after a verification
                                  computes only the token it drafts from, through the backend's
                                  draft copies of its weights (engine/decoder/model.h
                                  eng_work_new's draft; the cascade's drafter, whose answers are
                                  kept, runs the exact ones). The model's output is unchanged (it
                                  computes every position it keeps). true: the drafter keeps K/V
                                  of its own, as any other drafter does */
    bool draft_always;         /* false (default): the scheduler measures which speculation
                                  pays (none, prompt lookup, or that and the model) and runs
                                  that (below); true: it always drafts with what is configured
                                  (tests, bench) */
} eng_engine_cfg;

/* Whether speculation pays depends on the machine, the models, the batch and how often the
 * drafts are accepted, so the scheduler measures it instead of guessing. A step runs in one of
 * three modes: no drafts, prompt lookup only (ngram_draft), or prompt lookup then the draft
 * model (drafter; only up to draft_max_batch decoding sequences): those configured. Prompt
 * lookup runs first; where it finds no draft for any sequence, its mode is a plain step and
 * the choice is between plain decoding and the drafter. For each bucket of decoding sequences
 * (1, 2-3, 4-7, ... : powers of two), greedy and sampled steps apart, and steps with and
 * without a lookup draft apart (the modes nest, so a step's rate depends on the text as much as
 * on the mode: specmode.h), it keeps the tokens emitted per second by steps in each mode
 * (average tokens a step over average time a step, each the mean of the first ENG_SPEC_WARM
 * samples, then a moving average; the step's wall time, drafting included, but not the
 * drafter's catching up with text it has not seen, which is paid once; steps that also
 * prefill are not samples). A drafter with K/V of its own (draft_own_kv, or other weights than
 * the model's) must catch up with text it has not read (a prompt, or text written while it sat
 * out); that is weighed apart, per sequence: more than ENG_CATCH_UP_MIN tokens of it go ahead
 * only where its measured cost a token, times the tokens behind, is less than what the model
 * mode saves a token against the fastest other mode, times the tokens the sequence is expected
 * to generate still (the mean of what the last ENG_GEN_HISTORY finished sequences that ran
 * longer generated past that point, within its max_tokens); otherwise that sequence goes
 * without the drafter (a short answer to a long prompt does not pay for the drafter's reading
 * the prompt). It runs the fastest mode, each having ENG_SPEC_WARM samples first (the least
 * sampled mode goes next), then tries another mode (in turn) for two steps after
 * ENG_SPEC_EXPLORE steps, so a change of load or of acceptance is noticed. An exploration
 * costs: each one that leaves the fastest mode as it was, and clearly so (every other mode
 * ENG_SPEC_CLEAR slower), doubles the gap to the next, up to ENG_SPEC_EXPLORE_MAX steps; a close
 * call or a change of the fastest mode resets it (at one stream at temperature 0.7 a stretch
 * of text the drafter got wrong turned drafting off, and with the gap doubling on close calls it
 * stayed off for most of the answers: 1.06x plain where always drafting made 1.23x); and the
 * gap is at least what keeps explorations to
 * ENG_SPEC_EXPLORE_SHARE of the time, by the modes' measured step times. Verification costs more,
 * relative to a plain step, the more sequences share the forward, so a bucket neither warms up
 * nor explores a mode richer than the one its nearest warm smaller bucket runs (a warm-up round
 * of drafting steps at every batch size made short bursts of traffic slower than plain
 * decoding, and an exploration of the draft model at 8 or 16 sequences had the drafter catch up
 * with all their prompts first: in bench/speculative's copy cells, 0.68-0.76x plain). The
 * arms, and the ENG_SPEC_* constants: engine/serve/specmode.h. */
/* Catching up with more tokens than this is weighed (above); fewer (a sequence the drafter sat
 * out a few steps of) always go ahead, and only longer ones measure its cost a token (a token or
 * two more make a substep of 3-4 tokens, which costs about what 16 cost). */
#define ENG_CATCH_UP_MIN 16
#define ENG_GEN_HISTORY 64         /* finished sequences' lengths kept to estimate what is left */

#define ENG_MAX_DRAFT 16
#define ENG_MAX_DRAFT_BATCH 64     /* draft_max_batch's ceiling */

typedef enum eng_drafter {
    ENG_DRAFT_NGRAM = 0,
    ENG_DRAFT_MODEL = 1,
    ENG_DRAFTERS = 2,
} eng_drafter;

typedef struct eng_engine_stats {
    int waiting, running;
    int decoding;                /* of the running, those past their prompt (its K/V all held) */
    uint64_t steps, prefill_tokens, decode_tokens, preemptions, finished;
    uint64_t prefix_hit_tokens;  /* prompt tokens whose K/V came from shared prefix pages */
    uint64_t drafter_prefix_hit_tokens;  /* the same for the drafter's K/V (its own table) */
    size_t prefix_pages;         /* pages the prefix tables (the model's, the drafter's) hold now */
    /* Speculation, by drafter kind: */
    uint64_t draft_tokens[ENG_DRAFTERS];    /* drafted tokens verified */
    uint64_t draft_accepted[ENG_DRAFTERS];  /* of them, accepted */
    uint64_t draft_rounds[ENG_DRAFTERS];    /* drafts verified (mean accepted length =
                                               accepted / rounds) */
    uint64_t drafter_tokens;     /* tokens the draft model computed (catching up and drafting) */
    uint64_t spec_off_steps;     /* steps with decoding sequences that did not use the richest
                                    speculation configured: the model above draft_max_batch,
                                    or measured not to pay (the mode, or the drafter's catching
                                    up with the sequences' text) */
    /* Cascades, by rule (index eng_defer; 0 unused): */
    uint64_t cascades[3];        /* cascade sequences finished */
    uint64_t escalations[3];     /* of them, escalated */
    uint64_t cascade_checks;     /* diff: checks by the model (escalating or not) */
    uint64_t cascade_small_tokens;   /* tokens the drafter generated as the answerer */
    uint64_t cascade_kept_tokens;    /* of them, kept in answers */
} eng_engine_stats;

typedef struct eng_engine eng_engine;

/* Starts the scheduler thread. model, pool and backend must outlive the engine. */
int  eng_engine_new(eng_engine **out, const eng_model *m, eng_kvpool *pool,
                    const kern_backend *be, const eng_engine_cfg *cfg, util_err *err);
/* Stops the thread; every live sequence gets DONE(cancelled) first. NULL is a no-op. */
void eng_engine_free(eng_engine *e);
int  eng_engine_n_ctx(const eng_engine *e);
/* How the engine lays its model's K/V out in the pool's pages (type, bytes, tokens a page). */
const eng_kv_layout *eng_engine_kv(const eng_engine *e);
/* Queues a sequence; the prompt, stop strings and logit_bias are copied. LLMGW_ERANGE (with a
 * message) when the prompt does not fit the context, LLMGW_EINVAL for an empty prompt, a token
 * id outside the vocabulary (prompt or logit_bias), a bias outside [-100, 100], or a cascade
 * on an engine without a drafter or with settings out of range; then no callback runs. */
int  eng_engine_submit(eng_engine *e, const eng_request *r, uint64_t *id, util_err *err);
/* Asks for a sequence to stop; its DONE(cancelled) follows from the scheduler thread. */
void eng_engine_cancel(eng_engine *e, uint64_t id);
void eng_engine_stats_get(eng_engine *e, eng_engine_stats *out);

#endif
