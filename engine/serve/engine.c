/* engine/serve/engine.c: the scheduler thread of an engine instance (continuous batching).
 *
 * Sequences move inbox → waiting → running → retired. Every step builds one batch: a decode
 * token for each running sequence whose prompt is done, then prefill chunks (running first,
 * then newly admitted ones) up to max_batch_tokens. Pages are taken for every position the
 * batch writes; if the pool runs dry the newest running sequence is preempted: its pages go
 * back and it returns to the head of the waiting queue, to be recomputed from its tokens
 * (prompt + what it generated so far) when pages free up. */
#include "engine/serve/engine.h"
#include "engine/serve/prefix.h"
#include "engine/text/grammar.h"
#include "engine/text/stream.h"

#include "common/arena.h"
#include "common/log.h"
#include "common/time.h"
#include "common/thread.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A cascade sequence's phase (eng_cascade); every other sequence stays in PH_MODEL. */
enum {
    PH_MODEL = 0,                /* the model decodes (with speculation) */
    PH_SMALL = 1,                /* the drafter answers; the model computes nothing */
    PH_CHECK = 2,                /* diff: the model catches up, then checks the held tokens */
    PH_ESCALATE = 3,             /* the model catches up, then verifies the held tokens */
};

#define PEND_CAP (ENG_MAX_DRAFT + 1)   /* held tokens, plus the newest before the oldest goes */

/* A sequence's shareable prompt pages in one model's prefix table (the model's, the
 * drafter's): full pages that end before the last prompt token (that one is always computed,
 * for its logits). */
typedef struct pshare {
    uint64_t *hash;              /* [n]: chain hashes of those pages (engine/serve/prefix.h) */
    int n;                       /* how many (hashed on first use) */
    int registered;              /* of them, offered to (or taken from) the table so far */
} pshare;

/* A block table: the pages holding one model's K/V of a sequence, in position order. */
typedef struct ptable {
    int32_t *ids;                /* [cap] page ids */
    uint8_t **ptrs;              /* [cap] their base pointers */
    int n, cap;
} ptable;

typedef struct seq {
    struct seq *next;
    uint64_t id;
    uint64_t order;              /* admission order: the highest is the newest */
    int32_t *tokens;             /* [cap]: prompt, then generated tokens */
    int n_tokens, cap, n_prompt;
    int n_computed;              /* tokens whose K/V are in pages */
    pshare ps, dps;              /* its prompt pages in the model's and the drafter's tables */
    ptable kv;                   /* the model's pages */
    ptable dkv;                  /* the drafter's pages (draft-model speculation), unless it
                                    reads the model's (drafter_pages) */
    int d_computed;              /* tokens whose drafter K/V are in its pages */
    int k_adapt;                 /* tokens the drafter may propose next step (adapts) */
    eng_sampling sp;             /* sp.logit_bias points at bias */
    eng_logit_bias *bias;        /* [sp.n_logit_bias]: the request's, copied; NULL when none */
    eng_grammar *gram;           /* structured output: a reference, or NULL */
    eng_gstate *gs;              /* with gram: [2] where the text stands, and where this step's
                                    model draft stands */
    eng_rng rng;
    int max_tokens, n_generated;
    bool ignore_eos;
    eng_stream out;              /* its text: detokenized, stop strings held back and cut */
    eng_event_cb cb;
    void *arg;
    bool cancel;                 /* set by eng_engine_cancel (under the lock) */
    bool done;
    int32_t draft[ENG_MAX_DRAFT]; /* this step's draft (drafting -> plan -> verification) */
    int n_draft;
    eng_drafter draft_kind;
    int d_slot;                  /* with a model draft under sampling: its block of e->d_q */
    const float *qrow[ENG_MAX_DRAFT];  /* sampled model draft: the drafter's q of each token */
    /* Cascade (eng_cascade); cas.rule == ENG_DEFER_NONE for the others. */
    eng_cascade cas;
    int phase;
    int32_t pend[PEND_CAP];      /* held drafter tokens (a ring from pend_head), after tokens */
    eng_pick pend_pick[PEND_CAP];
    float pend_conf[PEND_CAP];   /* the drafter's max probability where it chose each */
    int pend_head, n_pend;
    float *cq;                   /* sampled: [PEND_CAP][n_vocab], q of each held token */
    float conf[ENG_CASCADE_MAX_WINDOW];  /* the newest n_conf confidences, a ring ending at
                                            conf_at - 1 */
    int n_conf, conf_at;
    bool escalated;
    int small_tokens, kept;      /* eng_event */
    int large_tokens;            /* positions the model computed for this sequence */
} seq;

struct eng_engine {
    const eng_model *m;
    eng_kvpool *pool;
    const kern_backend *be;
    eng_engine_cfg cfg;
    eng_kv_layout kvl;           /* the model's K/V in the pages (cfg.kv_type) */
    int page_tokens;             /* kvl.page_tokens */
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool stop;
    seq *inbox;                  /* submitted, not yet seen by the scheduler (under mu) */
    uint64_t *cancels;           /* ids to cancel (under mu) */
    size_t n_cancels, cancels_cap;
    uint64_t next_id;            /* under mu */
    /* Scheduler-thread state: */
    seq *waiting;                /* FIFO; preempted ones go to the front */
    seq **running;               /* [max_seqs] */
    int n_running;
    uint64_t next_order;
    eng_work *work;
    eng_sampler *sampler;
    float *logits;               /* [max_seqs][n_vocab] */
    int32_t *b_tokens, *b_pos;   /* [max_batch_tokens + max_seqs] */
    eng_batch_seq *b_seqs;       /* [max_seqs] */
    seq **b_owner;               /* [max_seqs]: the seq of each batch entry */
    eng_prefix *prefix;          /* shared-prefix pages of this instance */
    eng_prefix *d_prefix;        /* the drafter's (with prefix and a drafter) */
    /* Draft-model speculation (cfg.drafter != NULL): */
    eng_kv_layout d_kvl;         /* the drafter's, in the same KV type */
    int d_page_tokens;
    bool d_reads_model;          /* the drafter holds the model's weights at another precision:
                                    while speculating it reads and writes the model's pages
                                    (engine.h: draft_own_kv) */
    eng_work *d_work;
    eng_work *spec_work;         /* with d_reads_model: the drafter's forwards while speculating,
                                    through the backend's draft copies of its weights
                                    (eng_work_new's draft). What they compute is checked token
                                    by token and their K/V in the model's pages are overwritten
                                    by its verification, so nothing of theirs is kept; the
                                    drafter answering for a cascade keeps d_work's bits */
    float *d_logits;             /* [draft_max_batch][n_vocab] */
    float *d_q;                  /* [draft_max_batch][draft_max][n_vocab]: the drafter's
                                    distributions of sampled drafts */
    float *p_dist, *scratch;     /* [n_vocab] each: the target's distribution, residual */
    uint32_t *allow;             /* [(n_vocab + 31) / 32] a constrained choice's token mask */
    seq **d_seqs;                /* [draft_max_batch] */
    /* Which speculation pays, measured (engine.h, specmode.h): */
    eng_spec_table spec;
    eng_spec_arm *step_arm;      /* this step's, NULL when it is no sample */
    int step_mode;
    uint64_t step_catch_ns;      /* of this step's time, the drafter's catching up (no sample) */
    double d_sub_ns;             /* a drafting substep's time (moving average; 0: unmeasured) */
    double d_catch_ns;           /* catching up: the drafter's time per token (same; 0: unmeasured) */
    int gen_len[ENG_GEN_HISTORY];  /* completion tokens of the last finished sequences (a ring) */
    int n_gen_len, gen_at;
    uint64_t step_t0, emitted;   /* emitted: tokens accepted so far (all sequences) */
    eng_engine_stats st;         /* the scheduler's own counters */
    eng_engine_stats stats;      /* st as last published, under mu */
};

static void seq_free(seq *s)
{
    free(s->ps.hash);
    free(s->dps.hash);
    free(s->tokens);
    free(s->kv.ids);
    free(s->kv.ptrs);
    free(s->dkv.ids);
    free(s->dkv.ptrs);
    eng_stream_free(&s->out);
    free(s->bias);
    free(s->cq);
    free(s->gs);
    eng_grammar_unref(s->gram);
    free(s);
}

/* Releases the pages of t past the first keep (a rollback just forgets positions: no copy). */
static void truncate_pages(eng_engine *e, ptable *t, int keep)
{
    for (; t->n > keep; t->n--)
        eng_kvpool_release(e->pool, t->ids[t->n - 1]);
}

static void release_pages(eng_engine *e, seq *s)
{
    truncate_pages(e, &s->kv, 0);
    truncate_pages(e, &s->dkv, 0);
    s->n_computed = 0;
    s->d_computed = 0;
    s->ps.registered = 0;
    s->dps.registered = 0;
    s->n_draft = 0;
}

/* The chain hashes of s's shareable prompt pages of page_tokens tokens, once. */
static void share_hash(seq *s, pshare *ps, int page_tokens)
{
    if (ps->hash != NULL)
        return;
    ps->n = (s->n_prompt - 1) / page_tokens;
    if (ps->n <= 0)
        return;
    ps->hash = util_xmalloc((size_t)ps->n * sizeof *ps->hash);
    uint64_t h = 0;
    for (int i = 0; i < ps->n; i++)
        ps->hash[i] = h = eng_prefix_hash(h, s->tokens + (size_t)i * page_tokens, page_tokens);
}

static void emit_done(eng_engine *e, seq *s, eng_finish f, const char *error)
{
    eng_event ev = {.kind = ENG_EV_DONE, .finish = f, .prompt_tokens = s->n_prompt,
                    .completion_tokens = s->n_generated, .error = error,
                    .escalated = s->escalated, .small_tokens = s->small_tokens,
                    .kept = s->kept, .large_tokens = s->large_tokens};
    if (s->cas.rule != ENG_DEFER_NONE) {
        e->st.cascades[s->cas.rule]++;
        e->st.cascade_kept_tokens += (uint64_t)s->kept;
    }
    s->done = true;
    s->cb(s->arg, &ev);
}

/* Grows a block table to hold need pages (no pool allocation). */
static void grow_table(ptable *t, int need)
{
    if (need <= t->cap)
        return;
    int cap = t->cap ? t->cap : 8;
    while (cap < need)
        cap *= 2;
    t->ids = realloc(t->ids, (size_t)cap * sizeof *t->ids);
    t->ptrs = realloc(t->ptrs, (size_t)cap * sizeof *t->ptrs);
    if (t->ids == NULL || t->ptrs == NULL)
        abort();  /* a few bytes per page: out of memory here is fatal anyway */
    t->cap = cap;
}

/* Frees up to n pages that only the prefix tables hold, the drafter's first (cheaper to compute
 * again); how many. */
static int evict_prefixes(eng_engine *e, int n)
{
    int got = e->d_prefix != NULL ? eng_prefix_evict(e->d_prefix, n) : 0;
    if (got < n && e->prefix != NULL)
        got += eng_prefix_evict(e->prefix, n - got);
    return got;
}

/* Makes sure t has pages (of page_tokens tokens) for positions [0, upto). 0, or LLMGW_EBUSY
 * when the pool is dry. */
static int ensure_pages(eng_engine *e, ptable *t, int page_tokens, int upto)
{
    int need = (upto + page_tokens - 1) / page_tokens;
    grow_table(t, need);
    while (t->n < need) {
        int32_t id = eng_kvpool_alloc(e->pool);
        if (id < 0 && evict_prefixes(e, 1) == 1)
            id = eng_kvpool_alloc(e->pool);
        if (id < 0)
            return LLMGW_EBUSY;
        t->ids[t->n] = id;
        t->ptrs[t->n] = eng_kvpool_page(e->pool, id);
        t->n++;
    }
    return 0;
}

/* A sequence about to start computing in table px (pages of page_tokens tokens) takes the
 * pages of its prompt's prefix that are already there, into t; returns the tokens they hold. */
static int share_take(eng_engine *e, eng_prefix *px, int page_tokens, seq *s, pshare *ps,
                      ptable *t)
{
    share_hash(s, ps, page_tokens);
    int i = 0;
    for (; i < ps->n; i++) {
        int32_t id = eng_prefix_take(px, ps->hash[i]);
        if (id < 0)
            break;
        grow_table(t, i + 1);
        t->ids[i] = id;
        t->ptrs[i] = eng_kvpool_page(e->pool, id);
        t->n = i + 1;
    }
    ps->registered = i;
    return i * page_tokens;
}

/* Offers the prompt pages of t completed (computed tokens) since the last call to px. */
static void share_offer(eng_prefix *px, int page_tokens, seq *s, pshare *ps, const ptable *t,
                        int computed)
{
    share_hash(s, ps, page_tokens);
    int full = computed / page_tokens;
    if (full > ps->n)
        full = ps->n;
    for (; ps->registered < full; ps->registered++)
        eng_prefix_put(px, ps->hash[ps->registered], t->ids[ps->registered]);
}

static void take_prefix(eng_engine *e, seq *s)
{
    if (e->prefix == NULL || s->n_computed != 0 || s->kv.n != 0)
        return;
    s->n_computed = share_take(e, e->prefix, e->page_tokens, s, &s->ps, &s->kv);
    e->st.prefix_hit_tokens += (uint64_t)s->n_computed;
}

static void offer_prefix(eng_engine *e, seq *s)
{
    if (e->prefix != NULL)
        share_offer(e->prefix, e->page_tokens, s, &s->ps, &s->kv, s->n_computed);
}

/* The same for the drafter: before it first reads s's text, and after each of its forwards. */
static void take_drafter_prefix(eng_engine *e, seq *s)
{
    if (e->d_prefix == NULL || s->d_computed != 0 || s->dkv.n != 0)
        return;
    s->d_computed = share_take(e, e->d_prefix, e->d_page_tokens, s, &s->dps, &s->dkv);
    e->st.drafter_prefix_hit_tokens += (uint64_t)s->d_computed;
}

static void offer_drafter_prefix(eng_engine *e, seq *s)
{
    if (e->d_prefix != NULL)
        share_offer(e->d_prefix, e->d_page_tokens, s, &s->dps, &s->dkv, s->d_computed);
}

static void remove_running(eng_engine *e, int i)
{
    e->running[i] = e->running[--e->n_running];
}

static void retire(eng_engine *e, int i, eng_finish f, const char *error)
{
    seq *s = e->running[i];
    release_pages(e, s);
    remove_running(e, i);
    emit_done(e, s, f, error);
    e->st.finished++;
    if (f == ENG_FINISH_STOP || f == ENG_FINISH_LENGTH) {
        e->gen_len[e->gen_at] = s->n_generated;
        e->gen_at = (e->gen_at + 1) % ENG_GEN_HISTORY;
        e->n_gen_len += e->n_gen_len < ENG_GEN_HISTORY;
    }
    seq_free(s);
}

/* Sends s back to the head of the waiting queue without its pages. */
static void preempt(eng_engine *e, int i)
{
    seq *s = e->running[i];
    release_pages(e, s);
    remove_running(e, i);
    s->next = e->waiting;
    e->waiting = s;
    e->st.preemptions++;
    UTIL_LOG_DEBUG("engine", "%s: KV pool full, preempted sequence %llu (%d tokens)",
                   e->cfg.name, (unsigned long long)s->id, s->n_tokens);
}

static int newest_running(const eng_engine *e)
{
    int best = -1;
    for (int i = 0; i < e->n_running; i++)
        if (best < 0 || e->running[i]->order > e->running[best]->order)
            best = i;
    return best;
}

/* Takes a sampled token: text bookkeeping, stop conditions, the event. True when finished. */
static bool accept_token(eng_engine *e, seq *s, const eng_pick *pick, eng_finish *finish)
{
    const eng_tokenizer *tok = e->m->tok;
    int32_t t = pick->token;
    s->n_generated++;
    e->emitted++;
    if (s->n_tokens == s->cap) {
        s->cap *= 2;
        s->tokens = realloc(s->tokens, (size_t)s->cap * sizeof *s->tokens);
        if (s->tokens == NULL)
            abort();
    }
    s->tokens[s->n_tokens++] = t;
    bool eog = (!s->ignore_eos || s->gram != NULL) && eng_tokenizer_is_eog(tok, t);
    /* The mask allowed t, so the grammar takes it; a refusal would be a bug: the answer ends. */
    bool refused = s->gram != NULL && !eng_grammar_advance(s->gram, &s->gs[0], t);
    bool finished = !eog && !refused && eng_stream_push(&s->out, t);   /* a stop string */
    *finish = ENG_FINISH_STOP;
    if (refused) {
        finished = true;
        *finish = ENG_FINISH_ERROR;
        eng_stream_end(&s->out);
    } else if (!finished) {
        if (eog) {
            finished = true;
        } else if ((s->max_tokens > 0 && s->n_generated >= s->max_tokens) ||
                   s->n_tokens >= e->cfg.n_ctx) {
            finished = true;
            *finish = ENG_FINISH_LENGTH;
        }
        if (finished)
            eng_stream_end(&s->out);
    }
    eng_event ev = {.kind = ENG_EV_TOKEN, .pick = pick};
    ev.text = eng_stream_ready(&s->out, &ev.len);
    s->cb(s->arg, &ev);
    eng_stream_take(&s->out);
    return finished;
}

/* Moves what arrived from other threads into the scheduler's own lists. Under mu. */
static void take_inbox(eng_engine *e)
{
    seq *in = e->inbox;
    e->inbox = NULL;
    seq *rev = NULL;                      /* the inbox is LIFO: restore submission order */
    while (in != NULL) {
        seq *n = in->next;
        in->next = rev;
        rev = in;
        in = n;
    }
    seq **tail = &e->waiting;
    while (*tail != NULL)
        tail = &(*tail)->next;
    *tail = rev;
    for (size_t c = 0; c < e->n_cancels; c++) {
        for (seq *s = e->waiting; s != NULL; s = s->next)
            if (s->id == e->cancels[c])
                s->cancel = true;
        for (int i = 0; i < e->n_running; i++)
            if (e->running[i]->id == e->cancels[c])
                e->running[i]->cancel = true;
    }
    e->n_cancels = 0;
    /* Publish the scheduler's counters for eng_engine_stats_get. */
    e->st.waiting = 0;
    for (seq *s = e->waiting; s != NULL; s = s->next)
        e->st.waiting++;
    e->st.running = e->n_running;
    e->st.decoding = 0;
    for (int i = 0; i < e->n_running; i++)
        e->st.decoding += e->running[i]->n_computed >= e->running[i]->n_prompt;
    e->st.prefix_pages = (e->prefix != NULL ? eng_prefix_pages(e->prefix) : 0) +
                         (e->d_prefix != NULL ? eng_prefix_pages(e->d_prefix) : 0);
    e->stats = e->st;
}

static void drop_cancelled(eng_engine *e)
{
    for (seq **l = &e->waiting; *l != NULL;) {
        seq *s = *l;
        if (s->cancel) {
            *l = s->next;
            emit_done(e, s, ENG_FINISH_CANCELLED, NULL);
            e->st.finished++;
            seq_free(s);
        } else {
            l = &s->next;
        }
    }
    for (int i = e->n_running - 1; i >= 0; i--)
        if (e->running[i]->cancel)
            retire(e, i, ENG_FINISH_CANCELLED, NULL);
}

static void retire_seq(eng_engine *e, seq *s, eng_finish f, const char *error)
{
    for (int i = 0; i < e->n_running; i++)
        if (e->running[i] == s) {
            retire(e, i, f, error);
            return;
        }
}

static bool is_greedy(const seq *s)
{
    return s->sp.temperature <= 0 || s->sp.top_k == 1;
}

/* The sampling settings of s's next choice from grammar state gs: its own, with the tokens the
 * grammar allows there (in e->allow, good until the next call) when it has one. A dead state
 * (which the mask never leads to) allows only the end of generation. */
static eng_sampling choice(eng_engine *e, const seq *s, const eng_gstate *gs)
{
    eng_sampling sp = s->sp;
    if (s->gram == NULL)
        return sp;
    if (eng_grammar_allowed(s->gram, gs, e->allow) == 0) {
        int32_t eos = eng_tokenizer_eos(e->m->tok);
        if (eos >= 0)
            e->allow[eos / 32] |= 1u << (eos % 32);
    }
    sp.allow = e->allow;
    return sp;
}

/* How many tokens s may draft this step: at most cap, and few enough that the drafts plus the
 * token the verification adds fit max_tokens and the context. */
static int draft_room(const eng_engine *e, const seq *s, int cap)
{
    int k = cap;
    if (s->max_tokens > 0 && k > s->max_tokens - s->n_generated - 1)
        k = s->max_tokens - s->n_generated - 1;
    if (k > e->cfg.n_ctx - s->n_tokens - 1)
        k = e->cfg.n_ctx - s->n_tokens - 1;
    return k > 0 ? k : 0;
}

/* Prompt lookup: the tokens that followed the most recent earlier occurrence of s's last 3
 * (else 2) tokens in its own text (prompt and output). Returns how many went into s->draft. */
static int propose_ngram(const eng_engine *e, seq *s)
{
    int kmax = draft_room(e, s, e->cfg.ngram_draft);
    if (kmax <= 0)
        return 0;
    const int32_t *t = s->tokens;
    int n_t = s->n_tokens;
    for (int n = 3; n >= 2; n--) {
        if (n_t < n + 1)
            continue;
        const int32_t *suffix = t + n_t - n;
        for (int i = n_t - n - 1; i >= 0; i--) {
            if (memcmp(t + i, suffix, (size_t)n * sizeof *t) != 0)
                continue;
            int k = n_t - (i + n);  /* tokens after the match, all known */
            k = k < kmax ? k : kmax;
            memcpy(s->draft, t + i + n, (size_t)k * sizeof *t);
            return k;
        }
    }
    return 0;
}

/* Whether s's next forward is one token (plus its draft). A cascade sequence about to check or
 * verify its held tokens is, once the model has caught up with all but the last token. */
static bool is_decoding(const seq *s)
{
    return s->phase != PH_SMALL && s->n_tokens - s->n_computed == 1 &&
           (s->n_computed >= s->n_prompt || s->phase != PH_MODEL);
}

/* The pages the drafter's K/V of s go in: the model's own while the drafter speculates for
 * it with d_reads_model (its K/V of the text are then the model's, computed already, and what
 * it writes past them, its draft's, the verification overwrites), else its own. */
static ptable *drafter_pages(eng_engine *e, seq *s)
{
    return e->d_reads_model && s->phase == PH_MODEL ? &s->kv : &s->dkv;
}

/* The drafter's choice after one of its forwards: its token (argmax for a greedy sequence,
 * else drawn from q, which is kept for the verification). False when the drafter is not sure
 * enough (draft_p_min) and drafting stops. */
static bool draft_one(eng_engine *e, seq *s, const float *logits)
{
    const int V = e->m->hp.n_vocab;
    int32_t x;
    if (s->gram != NULL && s->n_draft == 0)
        s->gs[1] = s->gs[0];     /* the draft's grammar state starts where the text is */
    eng_sampling sp = choice(e, s, s->gram != NULL ? &s->gs[1] : NULL);
    if (is_greedy(s)) {
        eng_pick pick;
        sp.top_logprobs = -1;
        eng_sample(e->sampler, &sp, &s->rng, logits, &pick);
        x = pick.token;
    } else {
        float *q = (float *)s->qrow[s->n_draft];
        eng_sample_dist(e->sampler, &sp, logits, q);
        x = eng_sample_from(q, V, &s->rng);
    }
    if (eng_prob_at(logits, V, x) < e->cfg.draft_p_min)
        return false;
    if (s->gram != NULL && (eng_tokenizer_is_eog(e->m->tok, x) ||
                            !eng_grammar_advance(s->gram, &s->gs[1], x)))
        return false;            /* the draft ends where the document may */
    s->draft[s->n_draft++] = x;
    return true;
}

/* Runs the drafter's forward over the sequences in e->d_seqs[0..n) with n_tok[k] tokens each
 * from their text (then their drafts) starting at d_computed; those that reach the end of it
 * draft one more token. Returns how many are still drafting, compacted to the front. */
static int drafter_substep(eng_engine *e, int n, const int *n_tok, int *room)
{
    const eng_model *d = e->cfg.drafter;
    int tok = 0, rows = 0;
    for (int k = 0; k < n; k++) {
        seq *s = e->d_seqs[k];
        eng_batch_seq *bs = &e->b_seqs[k];
        bs->tok0 = tok;
        bs->n_tok = n_tok[k];
        bs->pages = drafter_pages(e, s)->ptrs;
        for (int j = 0; j < n_tok[k]; j++) {
            int at = s->d_computed + j;
            e->b_tokens[tok + j] = at < s->n_tokens ? s->tokens[at] : s->draft[at - s->n_tokens];
            e->b_pos[tok + j] = at;
        }
        bool last = s->d_computed + n_tok[k] == s->n_tokens + s->n_draft;
        bs->logits_row = last ? rows++ : -1;
        bs->n_logits = last ? 1 : 0;
        tok += n_tok[k];
    }
    eng_batch b = {.n_tok = tok, .tokens = e->b_tokens, .pos = e->b_pos, .n_seq = n,
                   .seqs = e->b_seqs};
    eng_model_forward(d, e->be, e->spec_work != NULL ? e->spec_work : e->d_work, &b, &e->d_kvl,
                      e->d_logits);
    e->st.drafter_tokens += (uint64_t)tok;
    int still = 0;
    for (int k = 0; k < n; k++) {
        seq *s = e->d_seqs[k];
        s->d_computed += n_tok[k];
        if (drafter_pages(e, s) == &s->dkv)
            offer_drafter_prefix(e, s);
        int row = e->b_seqs[k].logits_row;
        if (row < 0)
            continue;
        if (draft_one(e, s, e->d_logits + (size_t)row * (size_t)d->hp.n_vocab) &&
            s->n_draft < room[k]) {
            e->d_seqs[still] = s;
            room[still] = room[k];
            still++;
        }
    }
    return still;
}

/* Ends a measured step: its emitted tokens over its wall time go into its arm. */
static void measure_step(eng_engine *e, uint64_t emitted0)
{
    eng_spec_arm *a = e->step_arm;
    if (a == NULL)
        return;
    e->step_arm = NULL;
    uint64_t dt = util_now_ns() - e->step_t0;
    dt = dt > e->step_catch_ns ? dt - e->step_catch_ns : 0;
    if (dt > 0)
        eng_spec_sample(a, e->step_mode, (double)(e->emitted - emitted0), (double)dt);
}

/* Adds v to a moving average that is 0 until its first value. */
static void moving_avg(double *avg, double v)
{
    *avg = *avg == 0 ? v : *avg + 0.125 * (v - *avg);
}

/* The tokens a sequence that has generated g is expected to generate still: the mean of L - g
 * over the recently finished sequences' lengths L above g (lengths are skewed: a mean of all
 * of them, seeded by a few short answers, said 12 where the answers ran 40); g again when
 * none ran longer (it has outlived them all), a large number when none finished yet. */
static double tokens_left(const eng_engine *e, int g)
{
    if (e->n_gen_len == 0)
        return 1e9;
    double sum = 0;
    int n = 0;
    for (int i = 0; i < e->n_gen_len; i++)
        if (e->gen_len[i] > g) {
            sum += e->gen_len[i] - g;
            n++;
        }
    return n > 0 ? sum / n : (g > 1 ? g : 1);
}

/* Whether the drafter should catch up with `behind` tokens of s's text so that s drafts with
 * it: the time that costs (measured per token) against what drafting saves over the tokens s
 * is expected to generate still (tokens_left, within its max_tokens), by a's measured rates of
 * the model mode and of the fastest other one. Until those are measured it pays (the mode is
 * being tried). */
static bool catch_up_pays(const eng_engine *e, const eng_spec_arm *a, unsigned mask,
                          const seq *s, int behind)
{
    if (e->cfg.draft_always || a == NULL || e->d_catch_ns <= 0 ||
        a->n[ENG_SPEC_MODEL] < ENG_SPEC_WARM)
        return true;
    int alt = -1;
    for (int m = 0; m < ENG_SPEC_MODEL; m++)
        if ((mask & (1u << m)) && a->n[m] >= ENG_SPEC_WARM && (alt < 0 || a->rate[m] > a->rate[alt]))
            alt = m;
    if (alt < 0 || a->rate[alt] <= 0 || a->rate[ENG_SPEC_MODEL] <= 0)
        return true;
    double saved = 1.0 / a->rate[alt] - 1.0 / a->rate[ENG_SPEC_MODEL];  /* s per token */
    if (saved <= 0)
        return false;
    double cap = s->max_tokens > 0 ? s->max_tokens - s->n_generated : e->cfg.n_ctx - s->n_tokens;
    double left = tokens_left(e, s->n_generated);
    left = left < cap ? left : cap;
    return left * saved * 1e9 > behind * e->d_catch_ns;
}

/* This step's drafts, in the mode the arm's measurements choose (or the richest with
 * draft_always): prompt lookup where it finds a match, then the draft model for the other
 * decoding sequences while the batch is within draft_max_batch. */
static void draft(eng_engine *e)
{
    int n_dec = 0;
    bool sampled = false;
    for (int i = 0; i < e->n_running; i++) {
        seq *s = e->running[i];
        s->n_draft = 0;
        s->d_slot = -1;
        if (!is_decoding(s))
            continue;
        n_dec++;
        sampled = sampled || !is_greedy(s);
        if (s->phase != PH_MODEL) {
            /* A cascade's held tokens are this step's draft. */
            const int V = e->m->hp.n_vocab;
            for (int j = 0; j < s->n_pend; j++) {
                int at = (s->pend_head + j) % PEND_CAP;
                s->draft[j] = s->pend[at];
                s->qrow[j] = s->cq != NULL ? s->cq + (size_t)at * (size_t)V : NULL;
            }
            s->n_draft = s->n_pend;
            s->draft_kind = ENG_DRAFT_MODEL;
        }
    }
    if (n_dec == 0)
        return;
    /* Prompt lookup first (it costs next to nothing): whether it finds a draft is part of what
     * the step is (specmode.h). */
    bool lookup = false;
    if (e->cfg.ngram_draft > 0)
        for (int i = 0; i < e->n_running; i++) {
            seq *s = e->running[i];
            if (is_decoding(s) && s->phase == PH_MODEL) {
                s->n_draft = propose_ngram(e, s);
                s->draft_kind = ENG_DRAFT_NGRAM;
                lookup = lookup || s->n_draft > 0;
            }
        }
    /* The modes this step may use; the richest one there is, when not used, counts as off. */
    int rich = e->cfg.drafter != NULL ? ENG_SPEC_MODEL : lookup ? ENG_SPEC_NGRAM : ENG_SPEC_NONE;
    unsigned mask = 1u << ENG_SPEC_NONE;
    if (lookup)   /* without a draft it is a plain step, and no choice (eng_spec_step's arms) */
        mask |= 1u << ENG_SPEC_NGRAM;
    if (e->cfg.drafter != NULL && n_dec <= e->cfg.draft_max_batch)
        mask |= 1u << ENG_SPEC_MODEL;
    if (rich == ENG_SPEC_NONE)
        return;
    int mode = 31 - __builtin_clz(mask);   /* the richest */
    eng_spec_arm *a = NULL;
    if (!e->cfg.draft_always) {
        mode = eng_spec_step(&e->spec, n_dec, sampled, mask, &a);
        e->step_arm = n_dec == e->n_running ? a : NULL;  /* a prefill in the step: no sample */
        e->step_mode = mode;
    }
    if (mode == ENG_SPEC_NONE)
        for (int i = 0; i < e->n_running; i++)
            if (e->running[i]->phase == PH_MODEL)
                e->running[i]->n_draft = 0;
    if (mode != ENG_SPEC_MODEL) {
        if (mode < rich)
            e->st.spec_off_steps++;
        return;
    }
    int n = 0, skipped = 0, budget = e->cfg.max_batch_tokens;
    int n_tok[ENG_MAX_DRAFT_BATCH], room[ENG_MAX_DRAFT_BATCH], ones[ENG_MAX_DRAFT_BATCH];
    for (int i = 0; i < e->n_running && n < e->cfg.draft_max_batch; i++) {
        seq *s = e->running[i];
        if (!is_decoding(s) || s->n_draft > 0)
            continue;
        int r = draft_room(e, s, s->k_adapt);
        if (s->n_tokens + r >= e->cfg.drafter->hp.n_ctx_train)
            r = 0;
        if (r <= 0 || budget <= 0)
            continue;
        /* The drafter first catches up with the text (the whole prompt the first time; in
         * chunks of the token budget when long, drafting only once caught up), where that
         * pays: two tokens behind is where a drafting sequence stands after a verification.
         * Reading the model's pages it is never behind: it starts at the last token. */
        ptable *dp = drafter_pages(e, s);
        if (dp == &s->kv) {
            truncate_pages(e, &s->dkv, 0);   /* a cascade's, from before it escalated */
            s->d_computed = s->n_computed;
        } else {
            take_drafter_prefix(e, s);
        }
        int behind = s->n_tokens - s->d_computed;
        if (behind > ENG_CATCH_UP_MIN && !catch_up_pays(e, a, mask, s, behind)) {
            skipped++;
            continue;
        }
        int feed = behind < budget ? behind : budget;
        if (ensure_pages(e, dp, e->d_page_tokens, s->n_tokens + r - 1) != 0)
            continue;  /* the pool is dry: this sequence goes without a draft */
        s->draft_kind = ENG_DRAFT_MODEL;
        s->d_slot = n;
        for (int j = 0; j < r; j++)
            s->qrow[j] = e->d_q + ((size_t)n * (size_t)e->cfg.draft_max + (size_t)j) *
                                      (size_t)e->m->hp.n_vocab;
        e->d_seqs[n] = s;
        n_tok[n] = feed;
        room[n] = r;
        n++;
        budget -= feed;
    }
    if (n == 0) {
        /* Nobody drafts with the model: the step is one of prompt lookup (or none). */
        e->step_mode = lookup ? ENG_SPEC_NGRAM : ENG_SPEC_NONE;
        if (skipped > 0)
            e->st.spec_off_steps++;
        return;
    }
    /* Catching up is paid once per stretch of text, so it is timed apart from drafting: the
     * step's sample of the mode leaves it out (what the mode costs from then on), and its
     * cost per token decides catch_up_pays. Its time: the first substep's beyond a drafting
     * one's (this step's later substeps, else their moving average). */
    int catch_tok = 0, catch_long = 0;
    for (int k = 0; k < n; k++) {
        catch_tok += n_tok[k] > 2 ? n_tok[k] - 2 : 0;
        catch_long += n_tok[k] > ENG_CATCH_UP_MIN;
        ones[k] = 1;
    }
    uint64_t t_first = 0, t_rest = 0;
    int n_rest = 0;
    for (int active = n; active > 0; n_rest++) {
        uint64_t t0 = util_now_ns();
        active = drafter_substep(e, active, n_rest == 0 ? n_tok : ones, room);
        uint64_t dt = util_now_ns() - t0;
        if (n_rest == 0)
            t_first = dt;
        else
            t_rest += dt;
    }
    n_rest--;
    if (n_rest > 0)
        moving_avg(&e->d_sub_ns, (double)t_rest / n_rest);
    if (catch_tok > 0 && e->d_sub_ns > 0) {
        double c = (double)t_first - e->d_sub_ns;
        if (c > 0) {
            e->step_catch_ns = (uint64_t)c;
            c /= catch_tok;
            if (catch_long > 0)   /* a token or two more cost a substep's worth: not per token */
                moving_avg(&e->d_catch_ns, c);
        }
    }
}

/* Plans the batch: which sequences contribute how many tokens, with pages for all of them.
 * Returns the number of entries (in e->b_owner / e->b_seqs[].n_tok). */
static int plan(eng_engine *e)
{
retry:;
    int n_seq = 0, budget = e->cfg.max_batch_tokens;
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < e->n_running; i++) {
            seq *s = e->running[i];
            if (s->phase == PH_SMALL)
                continue;
            int todo = s->n_tokens - s->n_computed;
            bool decoding = is_decoding(s);
            if (!decoding && s->phase != PH_MODEL)
                todo--;   /* the last token goes with the held ones, for their rows */
            if (todo <= 0 || (pass == 0) != decoding)
                continue;
            /* Decodes always go (one token each keeps every stream moving); prefill chunks
             * share what is left of the budget, oldest first. */
            int n = decoding ? 1 : (todo < budget ? todo : budget);
            if (n <= 0)
                continue;
            if (!decoding)
                s->n_draft = 0;
            else if (s->n_draft > budget - 1)
                s->n_draft = budget > 1 ? budget - 1 : 0;
            n += s->n_draft;
            if (ensure_pages(e, &s->kv, e->page_tokens, s->n_computed + n) != 0) {
                if (e->n_running == 1) {
                    retire(e, 0, ENG_FINISH_ERROR, "the KV pool is too small for this sequence");
                    return 0;
                }
                preempt(e, newest_running(e));
                goto retry;
            }
            e->b_owner[n_seq] = s;
            e->b_seqs[n_seq].n_tok = n;
            n_seq++;
            budget -= n;
        }
    }
    return n_seq;
}

/* Verifies s's draft against the logits of its 1 + n_draft rows (row j: after its j-th input)
 * and emits the accepted drafts, then one token of the model's own (the correction at the first
 * rejection, or the next token after a fully accepted draft). Greedy accepts a draft equal to
 * the argmax; sampling by the rule in engine.h, q being a certainty for prompt lookup. The
 * rejected positions are forgotten (block tables truncated). Returns true when s finished (and
 * was retired). */
static bool verify_draft(eng_engine *e, seq *s, int row, bool cascade)
{
    const int V = e->m->hp.n_vocab;
    eng_drafter kind = s->draft_kind;
    int n_draft = s->n_draft, accepted = 0;
    e->st.draft_tokens[kind] += (uint64_t)n_draft;
    e->st.draft_rounds[kind]++;
    bool finished = false;
    for (int j = 0; j <= n_draft && !finished; j++) {
        const float *lg = e->logits + (size_t)(row + j) * (size_t)V;
        eng_pick pick;
        bool agrees = false;
        /* With a grammar, the model's choice at j is masked from the state after the accepted
         * drafts (accept_token advanced it): a draft the grammar forbids has p = 0 there and
         * is rejected. */
        eng_sampling sp = choice(e, s, s->gram != NULL ? &s->gs[0] : NULL);
        if (j == n_draft || is_greedy(s)) {
            eng_sample(e->sampler, &sp, &s->rng, lg, &pick);
            agrees = j < n_draft && pick.token == s->draft[j];
        } else {
            eng_sample_dist(e->sampler, &sp, lg, e->p_dist);
            const float *q = kind == ENG_DRAFT_MODEL ? s->qrow[j] : NULL;
            int32_t t = eng_spec_verify(e->p_dist, q, V, s->draft[j], e->scratch, &s->rng,
                                        &agrees);
            eng_pick_token(e->sampler, &sp, lg, t, &pick);
        }
        eng_finish f;
        if (agrees && cascade)
            s->kept++;   /* before accept_token: a finish reports it */
        finished = accept_token(e, s, &pick, &f);
        if (agrees)
            accepted++;
        if (finished)
            retire_seq(e, s, f, NULL);
        else if (agrees)
            s->n_computed++;  /* the draft's K/V at this position were computed from it */
        else
            break;
    }
    e->st.draft_accepted[kind] += (uint64_t)accepted;
    if (finished)
        return true;
    if (kind == ENG_DRAFT_MODEL && !cascade) {
        if (accepted == n_draft && s->k_adapt < e->cfg.draft_max)
            s->k_adapt++;
        else if (accepted < n_draft && s->k_adapt > 1)
            s->k_adapt--;
    }
    if (s->d_computed > s->n_tokens - 1)
        s->d_computed = s->n_tokens - 1;
    truncate_pages(e, &s->kv, (s->n_computed + e->page_tokens - 1) / e->page_tokens);
    if (e->d_page_tokens > 0)
        truncate_pages(e, &s->dkv, (s->d_computed + e->d_page_tokens - 1) / e->d_page_tokens);
    return false;
}

/* ---- the cascade (engine.h: eng_cascade) ----------------------------------------------------- */

/* Releases the oldest n held tokens to the client (committed: never verified). True when s
 * finished (and was retired). */
static bool commit_held(eng_engine *e, seq *s, int n)
{
    for (int i = 0; i < n; i++) {
        eng_pick pick = s->pend_pick[s->pend_head];
        s->pend_head = (s->pend_head + 1) % PEND_CAP;
        s->n_pend--;
        s->kept++;
        eng_finish f;
        if (accept_token(e, s, &pick, &f)) {
            retire_seq(e, s, f, NULL);
            return true;
        }
    }
    return false;
}

/* Whether the deferral condition holds: the mean confidence of the last `window` tokens is
 * below the threshold (at the drafter's end, over the fewer there may be). */
static bool defer_condition(const seq *s, bool at_end)
{
    int w = s->cas.window;
    if (s->n_conf < w && !(at_end && s->n_conf > 0))
        return false;
    double sum = 0;
    for (int i = 0; i < s->n_conf; i++)
        sum += s->conf[i];
    return sum / s->n_conf < (double)s->cas.threshold;
}

static void escalate(eng_engine *e, seq *s)
{
    s->escalated = true;
    e->st.escalations[s->cas.rule]++;
}

/* The model comes in (small_token, just after a token was held): PH_CHECK (diff) or
 * PH_ESCALATE. It computes the text it has not seen but the last token, which goes into the
 * forward with the held tokens. */
static void cascade_hand_over(eng_engine *e, seq *s, int phase)
{
    s->n_conf = 0;
    s->conf_at = 0;
    if (phase == PH_ESCALATE)
        escalate(e, s);
    else
        e->st.cascade_checks++;
    s->phase = phase;
    if (s->n_computed == s->n_tokens)
        s->n_computed--;    /* its K/V is written again, the same: it gives row 0 */
    if (s->n_computed == 0)
        take_prefix(e, s);
}

/* A token of the drafter answering s (its logits after s's text and held tokens). It is held;
 * the deferral rule may call the model in; tokens past the hold window are released; at the
 * drafter's end everything held is released (s then finishes). */
static void small_token(eng_engine *e, seq *s, const float *logits)
{
    const int V = e->m->hp.n_vocab;
    int at = (s->pend_head + s->n_pend) % PEND_CAP;
    eng_pick *pick = &s->pend_pick[at];
    if (s->cq == NULL) {
        eng_sample(e->sampler, &s->sp, &s->rng, logits, pick);
    } else {
        float *q = s->cq + (size_t)at * (size_t)V;
        eng_sample_dist(e->sampler, &s->sp, logits, q);
        eng_pick_token(e->sampler, &s->sp, logits, eng_sample_from(q, V, &s->rng), pick);
    }
    int32_t x = pick->token;
    float c = eng_prob_at(logits, V, -1);
    s->pend[at] = x;
    s->pend_conf[at] = c;
    s->n_pend++;
    s->small_tokens++;
    e->st.cascade_small_tokens++;
    s->conf[s->conf_at] = c;
    s->conf_at = (s->conf_at + 1) % s->cas.window;
    if (s->n_conf < s->cas.window)
        s->n_conf++;
    int len = s->n_tokens + s->n_pend;
    bool end = (!s->ignore_eos && eng_tokenizer_is_eog(e->m->tok, x)) ||
               (s->max_tokens > 0 && s->n_generated + s->n_pend >= s->max_tokens) ||
               len >= e->cfg.n_ctx;
    if (!end && len >= e->cfg.drafter->hp.n_ctx_train) {
        cascade_hand_over(e, s, PH_ESCALATE);   /* the drafter's context is full, not the model's */
        return;
    }
    if (defer_condition(s, end)) {
        cascade_hand_over(e, s, s->cas.rule == ENG_DEFER_DIFF ? PH_CHECK : PH_ESCALATE);
        return;
    }
    if (end)
        commit_held(e, s, s->n_pend);   /* s finishes there */
    else if (s->n_pend > s->cas.hold)
        commit_held(e, s, s->n_pend - s->cas.hold);
}

/* One drafter forward for the cascade sequences it answers for: what of their text and held
 * tokens it has not seen (in budget-sized chunks), then a token each. */
static void small_step(eng_engine *e)
{
    const eng_model *d = e->cfg.drafter;
    int n = 0, tok = 0, rows = 0, budget = e->cfg.max_batch_tokens;
    for (int i = 0; i < e->n_running && budget > 0; i++) {
        seq *s = e->running[i];
        if (s->phase != PH_SMALL)
            continue;
        take_drafter_prefix(e, s);
        int end = s->n_tokens + s->n_pend;
        int feed = end - s->d_computed;
        feed = feed < budget ? feed : budget;
        if (feed <= 0)
            continue;
        if (ensure_pages(e, &s->dkv, e->d_page_tokens, s->d_computed + feed) != 0) {
            if (e->n_running == 1)
                retire(e, i, ENG_FINISH_ERROR, "the KV pool is too small for this sequence");
            else
                preempt(e, newest_running(e));
            return;   /* the others go on next step */
        }
        eng_batch_seq *bs = &e->b_seqs[n];
        bs->tok0 = tok;
        bs->n_tok = feed;
        bs->pages = s->dkv.ptrs;
        for (int j = 0; j < feed; j++) {
            int p = s->d_computed + j;
            e->b_tokens[tok + j] = p < s->n_tokens
                                       ? s->tokens[p]
                                       : s->pend[(s->pend_head + p - s->n_tokens) % PEND_CAP];
            e->b_pos[tok + j] = p;
        }
        bool last = s->d_computed + feed == end;
        bs->logits_row = last ? rows++ : -1;
        bs->n_logits = last ? 1 : 0;
        e->d_seqs[n++] = s;
        tok += feed;
        budget -= feed;
    }
    if (n == 0)
        return;
    eng_batch b = {.n_tok = tok, .tokens = e->b_tokens, .pos = e->b_pos, .n_seq = n,
                   .seqs = e->b_seqs};
    eng_model_forward(d, e->be, e->d_work, &b, &e->d_kvl, e->d_logits);
    e->st.drafter_tokens += (uint64_t)tok;
    for (int k = 0; k < n; k++) {
        seq *s = e->d_seqs[k];
        s->d_computed += e->b_seqs[k].n_tok;
        offer_drafter_prefix(e, s);
        int row = e->b_seqs[k].logits_row;
        if (row >= 0)
            small_token(e, s, e->d_logits + (size_t)row * (size_t)d->hp.n_vocab);
    }
}

/* diff: whether the model's rows (from row, after s's last token and each held token) defer
 * any of the n_draft held tokens: the drafter's confidence below the model's minus margin. */
static bool diff_defers(const eng_engine *e, const seq *s, int row)
{
    const int V = e->m->hp.n_vocab;
    for (int j = 0; j < s->n_draft; j++) {
        float p = eng_prob_at(e->logits + (size_t)(row + j) * (size_t)V, V, -1);
        if (s->pend_conf[(s->pend_head + j) % PEND_CAP] < p - s->cas.margin)
            return true;
    }
    return false;
}

/* After the model's forward over a cascade sequence's held tokens (its n_draft first). True
 * when s finished. */
static bool cascade_verified(eng_engine *e, seq *s, int row)
{
    if (s->phase == PH_CHECK && !diff_defers(e, s, row)) {
        /* The drafter goes on; the checked tokens are released and the model's K/V of their
         * positions (computed from them) stay. */
        int n = s->n_draft;
        s->phase = PH_SMALL;
        s->n_computed += n;
        s->n_draft = 0;
        return commit_held(e, s, n);
    }
    if (s->phase == PH_CHECK)
        escalate(e, s);
    s->phase = PH_MODEL;
    s->n_pend = 0;
    s->pend_head = 0;
    return verify_draft(e, s, row, true);
}

/* One scheduler step. Returns false when there was nothing to do. */
static bool step(eng_engine *e)
{
    while (e->waiting != NULL && e->n_running < e->cfg.max_seqs) {
        seq *s = e->waiting;
        /* Admit only when the pool holds the first chunk plus a page of headroom for each
         * running sequence; otherwise it would be preempted again in this very step. */
        int chunk = s->n_tokens < e->cfg.max_batch_tokens ? s->n_tokens : e->cfg.max_batch_tokens;
        size_t need = (size_t)((chunk + e->page_tokens - 1) / e->page_tokens + e->n_running);
        size_t avail = eng_kvpool_n_free(e->pool);
        if (e->n_running > 0 && avail < need)
            avail += (size_t)evict_prefixes(e, (int)(need - avail));
        if (e->n_running > 0 && avail < need)
            break;
        e->waiting = s->next;
        s->next = NULL;
        if (s->order == 0)
            s->order = ++e->next_order;
        e->running[e->n_running++] = s;
        if (s->phase != PH_SMALL)
            take_prefix(e, s);
    }
    if (e->n_running == 0)
        return false;
    e->step_t0 = util_now_ns();
    e->step_catch_ns = 0;
    uint64_t emitted0 = e->emitted;
    e->step_arm = NULL;
    bool cascading = false;
    for (int i = 0; i < e->n_running; i++)
        cascading = cascading || e->running[i]->phase != PH_MODEL;
    if (cascading)
        small_step(e);
    draft(e);
    if (cascading)
        e->step_arm = NULL;   /* the drafter's answers are not a sample of speculation */
    int n_seq = plan(e);
    if (n_seq == 0)
        return true;
    int n_tok = 0, rows = 0;
    for (int k = 0; k < n_seq; k++) {
        seq *s = e->b_owner[k];
        eng_batch_seq *bs = &e->b_seqs[k];
        bs->tok0 = n_tok;
        bs->pages = s->kv.ptrs;
        int known = bs->n_tok - s->n_draft;  /* then the draft, at the positions after */
        memcpy(e->b_tokens + n_tok, s->tokens + s->n_computed, (size_t)known * sizeof(int32_t));
        memcpy(e->b_tokens + n_tok + known, s->draft, (size_t)s->n_draft * sizeof(int32_t));
        for (int j = 0; j < bs->n_tok; j++)
            e->b_pos[n_tok + j] = s->n_computed + j;
        bool last = s->n_computed + known == s->n_tokens;
        bs->logits_row = last ? rows : -1;
        bs->n_logits = last ? 1 + s->n_draft : 0;
        rows += bs->n_logits;
        if (s->n_computed < s->n_prompt)
            e->st.prefill_tokens += (uint64_t)bs->n_tok;
        else
            e->st.decode_tokens += (uint64_t)bs->n_tok;
        n_tok += bs->n_tok;
    }
    eng_batch b = {.n_tok = n_tok, .tokens = e->b_tokens, .pos = e->b_pos, .n_seq = n_seq,
                   .seqs = e->b_seqs};
    eng_model_forward(e->m, e->be, e->work, &b, &e->kvl, e->logits);
    e->st.steps++;
    for (int k = 0; k < n_seq; k++) {
        seq *s = e->b_owner[k];
        s->n_computed += e->b_seqs[k].n_tok - s->n_draft;
        s->large_tokens += e->b_seqs[k].n_tok;
        offer_prefix(e, s);
        int row = e->b_seqs[k].logits_row;
        if (row < 0)
            continue;
        if (s->phase != PH_MODEL) {
            cascade_verified(e, s, row);
            continue;
        }
        if (s->n_draft > 0) {
            verify_draft(e, s, row, false);
            continue;
        }
        eng_pick pick;
        eng_sampling sp = choice(e, s, s->gram != NULL ? &s->gs[0] : NULL);
        eng_sample(e->sampler, &sp, &s->rng,
                   e->logits + (size_t)row * (size_t)e->m->hp.n_vocab, &pick);
        eng_finish f;
        if (accept_token(e, s, &pick, &f))
            retire_seq(e, s, f, NULL);
    }
    measure_step(e, emitted0);
    return true;
}

static void cancel_everything(eng_engine *e)
{
    pthread_mutex_lock(&e->mu);
    take_inbox(e);
    pthread_mutex_unlock(&e->mu);
    while (e->n_running > 0)
        retire(e, e->n_running - 1, ENG_FINISH_CANCELLED, NULL);
    while (e->waiting != NULL) {
        seq *s = e->waiting;
        e->waiting = s->next;
        emit_done(e, s, ENG_FINISH_CANCELLED, NULL);
        seq_free(s);
    }
}

static void *thread_main(void *arg)
{
    eng_engine *e = arg;
    pthread_mutex_lock(&e->mu);
    while (!e->stop) {
        take_inbox(e);
        if (e->waiting == NULL && e->n_running == 0) {
            pthread_cond_wait(&e->cv, &e->mu);
            continue;
        }
        pthread_mutex_unlock(&e->mu);
        drop_cancelled(e);
        step(e);
        pthread_mutex_lock(&e->mu);
    }
    pthread_mutex_unlock(&e->mu);
    cancel_everything(e);
    return NULL;
}

/* Fills in the draft settings' defaults and refuses a drafter that cannot draft for m. */
static int check_drafter(eng_engine *e, util_err *err)
{
    const eng_model *m = e->m, *d = e->cfg.drafter;
    eng_engine_cfg *c = &e->cfg;
    if (c->draft_max <= 0)
        c->draft_max = 6;
    if (c->draft_max > ENG_MAX_DRAFT)
        c->draft_max = ENG_MAX_DRAFT;
    if (c->draft_p_min == 0)
        c->draft_p_min = 0.2f;
    if (c->draft_p_min < 0)
        c->draft_p_min = 0;
    if (c->draft_max_batch <= 0)
        c->draft_max_batch = 8;
    if (c->draft_max_batch > ENG_MAX_DRAFT_BATCH)
        c->draft_max_batch = ENG_MAX_DRAFT_BATCH;
    if (c->draft_max_batch > c->max_seqs)
        c->draft_max_batch = c->max_seqs;
    int32_t at;
    if (!eng_tokenizer_same_vocab(m->tok, d->tok, &at) || d->hp.n_vocab != m->hp.n_vocab) {
        util_err_set(err, LLMGW_EINVAL, "%s: the drafter %s does not share the vocabulary of %s "
                     "(%d and %d tokens; they differ at token %d): speculation needs the same "
                     "token ids", c->name, d->path, m->path, (int)d->hp.n_vocab,
                     (int)m->hp.n_vocab, (int)at);
        return LLMGW_EINVAL;
    }
    if (eng_model_kv_layout(d, c->kv_type, c->kv_k_group, c->kv_rotate, eng_kvpool_page_bytes(e->pool),
                            &e->d_kvl, err) != 0)
        return LLMGW_EINVAL;
    e->d_page_tokens = e->d_kvl.page_tokens;
    if (e->d_page_tokens < 1) {
        util_err_set(err, LLMGW_EINVAL, "%s: a KV page holds no token of the drafter %s",
                     c->name, d->path);
        return LLMGW_EINVAL;
    }
    /* The same weights means the same layers, K/V heads and head size, so d_kvl, made from
     * them with this engine's KV settings, is kvl: the drafter's K/V fit the model's pages. */
    e->d_reads_model = !c->draft_own_kv && eng_model_same_weights(m, d);
    UTIL_LOG_INFO("engine", "%s: the drafter %s %s", c->name, d->path,
                  e->d_reads_model ? "holds the same weights: it reads the model's K/V"
                                   : "keeps K/V of its own");
    return 0;
}

static void free_draft_state(eng_engine *e)
{
    eng_work_free(e->d_work);
    eng_work_free(e->spec_work);
    free(e->d_logits);
    free(e->d_q);
    free(e->p_dist);
    free(e->scratch);
    free(e->d_seqs);
}

int eng_engine_new(eng_engine **out, const eng_model *m, eng_kvpool *pool,
                   const kern_backend *be, const eng_engine_cfg *cfg, util_err *err)
{
    eng_engine *e = util_xcalloc(1, sizeof *e);
    e->m = m;
    e->pool = pool;
    e->be = be;
    e->cfg = *cfg;
    if (e->cfg.name == NULL)
        e->cfg.name = "engine";
    if (e->cfg.max_batch_tokens <= 0)
        e->cfg.max_batch_tokens = 256;
    if (e->cfg.max_seqs <= 0)
        e->cfg.max_seqs = 32;
    if (e->cfg.n_ctx <= 0)
        e->cfg.n_ctx = m->hp.n_ctx_train < 4096 ? m->hp.n_ctx_train : 4096;
    if (e->cfg.n_ctx > m->hp.n_ctx_train)
        e->cfg.n_ctx = m->hp.n_ctx_train;
    int rc = eng_model_check_backend(m, be, err);
    if (rc == 0 && cfg->drafter != NULL)
        rc = eng_model_check_backend(cfg->drafter, be, err);
    if (rc == 0)
        rc = eng_model_kv_layout(m, e->cfg.kv_type, e->cfg.kv_k_group, e->cfg.kv_rotate,
                                 eng_kvpool_page_bytes(pool), &e->kvl, err);
    if (rc != 0) {
        free(e);
        return rc;
    }
    e->page_tokens = e->kvl.page_tokens;
    if (e->page_tokens < 1) {
        size_t per_token = e->kvl.bytes_per_token;
        free(e);
        return util_err_set(err, LLMGW_EINVAL, "%s: a KV page (%zu bytes) holds no token of "
                            "%s (%zu bytes per token)", cfg->name, eng_kvpool_page_bytes(pool),
                            m->path, per_token);
    }
    if (e->cfg.ngram_draft < 0)
        e->cfg.ngram_draft = 0;
    if (e->cfg.ngram_draft > ENG_MAX_DRAFT)
        e->cfg.ngram_draft = ENG_MAX_DRAFT;
    if (e->cfg.drafter != NULL && check_drafter(e, err) != 0) {
        free(e);
        return LLMGW_EINVAL;
    }
    /* Logit rows: one per sequence, plus its drafts'; the drafts come out of the token budget. */
    bool drafts = e->cfg.ngram_draft > 0 || e->cfg.drafter != NULL;
    int max_rows = e->cfg.max_seqs + (drafts ? e->cfg.max_batch_tokens : 0);
    int max_tok = e->cfg.max_batch_tokens + e->cfg.max_seqs;
    e->work = eng_work_new(m, be, max_tok, max_rows, e->cfg.n_ctx, false);
    if (e->cfg.drafter != NULL)
        e->d_work = eng_work_new(e->cfg.drafter, be, max_tok, e->cfg.max_seqs, e->cfg.n_ctx,
                                 false);
    if (e->d_reads_model)
        e->spec_work = eng_work_new(e->cfg.drafter, be, max_tok, e->cfg.draft_max_batch,
                                    e->cfg.n_ctx, true);
    if (e->work == NULL || (e->cfg.drafter != NULL && e->d_work == NULL) ||
        (e->d_reads_model && e->spec_work == NULL)) {
        eng_work_free(e->work);
        eng_work_free(e->d_work);
        eng_work_free(e->spec_work);
        free(e);
        return util_err_set(err, LLMGW_ENOMEM, "%s: cannot size the backend's scratch",
                            cfg->name ? cfg->name : "engine");
    }
    if (e->cfg.drafter != NULL) {
        /* Rows for every sequence: the drafter answers for cascades (small_step). */
        size_t V = (size_t)m->hp.n_vocab, nb = (size_t)e->cfg.draft_max_batch;
        size_t ns = (size_t)e->cfg.max_seqs;
        e->d_logits = util_xmalloc(ns * V * sizeof(float));
        e->d_q = util_xmalloc(nb * (size_t)e->cfg.draft_max * V * sizeof(float));
        e->d_seqs = util_xcalloc(ns, sizeof *e->d_seqs);
    }
    if (drafts) {
        e->p_dist = util_xmalloc((size_t)m->hp.n_vocab * sizeof(float));
        e->scratch = util_xmalloc((size_t)m->hp.n_vocab * sizeof(float));
    }
    e->sampler = eng_sampler_new(m->hp.n_vocab);
    e->allow = util_xmalloc((size_t)(m->hp.n_vocab + 31) / 32 * sizeof *e->allow);
    e->logits = util_xmalloc((size_t)max_rows * (size_t)m->hp.n_vocab * sizeof(float));
    e->b_tokens = util_xmalloc((size_t)max_tok * sizeof *e->b_tokens);
    e->b_pos = util_xmalloc((size_t)max_tok * sizeof *e->b_pos);
    e->b_seqs = util_xcalloc((size_t)e->cfg.max_seqs, sizeof *e->b_seqs);
    e->b_owner = util_xcalloc((size_t)e->cfg.max_seqs, sizeof *e->b_owner);
    e->running = util_xcalloc((size_t)e->cfg.max_seqs, sizeof *e->running);
    if (e->cfg.prefix_pages >= 0) {
        size_t px = e->cfg.prefix_pages > 0 ? (size_t)e->cfg.prefix_pages
                                             : eng_kvpool_n_pages(pool) / 4;
        e->prefix = eng_prefix_new(pool, px);
        if (e->cfg.drafter != NULL)
            e->d_prefix = eng_prefix_new(pool, px);
    }
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    e->next_id = 1;
    char name[16];
    snprintf(name, sizeof name, "sched-%s", e->cfg.name ? e->cfg.name : "engine");
    if (util_thread_start(&e->thread, name, thread_main, e, err) != 0) {
        free_draft_state(e);
        eng_work_free(e->work);
        eng_sampler_free(e->sampler);
        free(e->allow);
        free(e->logits);
        free(e->b_tokens);
        free(e->b_pos);
        free(e->b_seqs);
        free(e->b_owner);
        free(e->running);
        eng_prefix_free(e->prefix);
        eng_prefix_free(e->d_prefix);
        free(e);
        return LLMGW_EIO;
    }
    *out = e;
    return 0;
}

void eng_engine_free(eng_engine *e)
{
    if (e == NULL)
        return;
    pthread_mutex_lock(&e->mu);
    e->stop = true;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
    util_thread_join(e->thread);
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv);
    free_draft_state(e);
    eng_work_free(e->work);
    eng_sampler_free(e->sampler);
    free(e->allow);
    free(e->logits);
    free(e->b_tokens);
    free(e->b_pos);
    free(e->b_seqs);
    free(e->b_owner);
    free(e->running);
    free(e->cancels);
    eng_prefix_free(e->prefix);  /* after the thread: every sequence has released its pages */
    eng_prefix_free(e->d_prefix);
    free(e);
}

const eng_kv_layout *eng_engine_kv(const eng_engine *e)
{
    return &e->kvl;
}

int eng_engine_n_ctx(const eng_engine *e)
{
    return e->cfg.n_ctx;
}

int eng_engine_submit(eng_engine *e, const eng_request *r, uint64_t *id, util_err *err)
{
    if (r->n_prompt == 0)
        return util_err_set(err, LLMGW_EINVAL, "the prompt is empty");
    if (r->n_prompt >= (size_t)e->cfg.n_ctx)
        return util_err_set(err, LLMGW_ERANGE, "This model's maximum context length is %d "
                            "tokens. However, your messages resulted in %zu tokens.",
                            e->cfg.n_ctx, r->n_prompt);
    for (size_t i = 0; i < r->n_prompt; i++)
        if (r->prompt[i] < 0 || r->prompt[i] >= e->m->hp.n_vocab)
            return util_err_set(err, LLMGW_EINVAL, "token id %d is outside the vocabulary",
                                (int)r->prompt[i]);
    const eng_sampling *sp = &r->sampling;
    int n_bias = sp->logit_bias != NULL && sp->n_logit_bias > 0 ? sp->n_logit_bias : 0;
    for (int i = 0; i < n_bias; i++) {
        const eng_logit_bias *b = &sp->logit_bias[i];
        if (b->token < 0 || b->token >= e->m->hp.n_vocab)
            return util_err_set(err, LLMGW_EINVAL, "logit_bias: token id %d is outside the "
                                "vocabulary (%d tokens)", (int)b->token, (int)e->m->hp.n_vocab);
        if (!(b->bias >= -100.0f && b->bias <= 100.0f))  /* NaN too */
            return util_err_set(err, LLMGW_EINVAL, "logit_bias: the bias %g of token %d is "
                                "outside [-100, 100]", (double)b->bias, (int)b->token);
    }
    if (r->grammar != NULL && eng_grammar_n_vocab(r->grammar) != e->m->hp.n_vocab)
        return util_err_set(err, LLMGW_EINVAL, "%s: the grammar was compiled for a vocabulary "
                            "of %d tokens, the model has %d", e->cfg.name,
                            (int)eng_grammar_n_vocab(r->grammar), (int)e->m->hp.n_vocab);
    eng_cascade cas = r->cascade;
    if (r->grammar != NULL)
        cas.rule = ENG_DEFER_NONE;   /* engine.h: a constrained answer is the model's */
    if (cas.rule != ENG_DEFER_NONE) {
        if (cas.window == 0)
            cas.window = 4;
        if (cas.hold < 0)
            cas.hold = 8;
        if (e->cfg.drafter == NULL)
            return util_err_set(err, LLMGW_EINVAL, "%s: a cascade needs a drafter (draft_tier)",
                                e->cfg.name);
        if ((cas.rule != ENG_DEFER_CHOW && cas.rule != ENG_DEFER_DIFF) ||
            !(cas.threshold > 0 && cas.threshold <= 1) || cas.window < 1 ||
            cas.window > ENG_CASCADE_MAX_WINDOW || !(cas.margin >= 0 && cas.margin <= 1) ||
            cas.hold > ENG_MAX_DRAFT || (cas.rule == ENG_DEFER_DIFF && cas.hold < 1))
            return util_err_set(err, LLMGW_EINVAL, "cascade: rule %d, threshold %g, window %d, "
                                "margin %g, hold %d: out of range", (int)cas.rule,
                                (double)cas.threshold, cas.window, (double)cas.margin, cas.hold);
    }
    seq *s = util_xcalloc(1, sizeof *s);
    s->cap = (int)r->n_prompt + 64;
    s->tokens = util_xmalloc((size_t)s->cap * sizeof *s->tokens);
    memcpy(s->tokens, r->prompt, r->n_prompt * sizeof *s->tokens);
    s->n_tokens = s->n_prompt = (int)r->n_prompt;
    s->sp = r->sampling;
    s->sp.logit_bias = NULL;     /* the caller's array is only borrowed for this call */
    s->sp.n_logit_bias = n_bias;
    if (n_bias > 0) {
        s->bias = util_xmalloc((size_t)n_bias * sizeof *s->bias);
        memcpy(s->bias, sp->logit_bias, (size_t)n_bias * sizeof *s->bias);
        s->sp.logit_bias = s->bias;
    }
    eng_rng_seed(&s->rng, r->seed);
    s->max_tokens = r->max_tokens;
    eng_stream_init(&s->out, e->m->tok, r->stop, r->n_stop < ENG_MAX_STOP ? r->n_stop
                                                                        : ENG_MAX_STOP);
    s->ignore_eos = r->ignore_eos;
    s->cas = cas;
    if (cas.rule != ENG_DEFER_NONE) {
        /* A prompt the drafter cannot hold goes to the model at once. */
        bool fits = r->n_prompt + 1 < (size_t)e->cfg.drafter->hp.n_ctx_train;
        s->phase = fits ? PH_SMALL : PH_MODEL;
        s->escalated = !fits;
        if (fits && !is_greedy(s))
            s->cq = util_xmalloc((size_t)PEND_CAP * (size_t)e->m->hp.n_vocab * sizeof(float));
    }
    if (r->grammar != NULL) {
        s->gram = eng_grammar_ref(r->grammar);
        s->gs = util_xmalloc(2 * sizeof *s->gs);
        eng_gstate_init(s->gram, &s->gs[0]);
        s->gs[1] = s->gs[0];
    }
    s->k_adapt = e->cfg.draft_max;
    s->cb = r->on_event;
    s->arg = r->arg;
    pthread_mutex_lock(&e->mu);
    s->id = e->next_id++;
    s->next = e->inbox;
    e->inbox = s;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
    *id = s->id;
    return 0;
}

void eng_engine_cancel(eng_engine *e, uint64_t id)
{
    pthread_mutex_lock(&e->mu);
    if (e->n_cancels == e->cancels_cap) {
        e->cancels_cap = e->cancels_cap ? e->cancels_cap * 2 : 16;
        e->cancels = realloc(e->cancels, e->cancels_cap * sizeof *e->cancels);
        if (e->cancels == NULL)
            abort();
    }
    e->cancels[e->n_cancels++] = id;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

void eng_engine_stats_get(eng_engine *e, eng_engine_stats *out)
{
    pthread_mutex_lock(&e->mu);
    *out = e->stats;
    pthread_mutex_unlock(&e->mu);
}
