/* gateway/engine_tier.c: the `engine` tier: OpenAI requests answered by in-process engine
 * instances (see engine_tier.h). A request's prompt is rendered and tokenized on the tiers'
 * prep thread, which submits it; tokens come back from the scheduler threads through the
 * mailbox and go out as OpenAI JSON or SSE, written without a JSON tree. */
#include "gateway/engine_tier.h"
#include "kernels/device.h"

#include "common/log.h"
#include "common/time.h"
#include "common/worker.h"
#include "engine/serve/engine.h"
#include "engine/text/tools.h"
#include "gateway/grammars.h"
#include "gateway/json.h"
#include "gateway/mailbox.h"
#include "gateway/openai.h"
#include "gateway/reply.h"
#include "gateway/sse.h"
#include "gateway/tool_calls.h"
#include "gateway/tier.h"
#include "router/policy.h"

#include <cjson/cJSON.h>
#include <event2/buffer.h>
#include <openssl/rand.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#define MAX_ENGINE_CHOICES 16
#define ITEM_TEXT 96        /* text up to this long travels inside the item */
#define ITEM_POOL 4096      /* spare items kept for reuse */

typedef struct inst {
    uint64_t load_ns;
    eng_model *model;
    kern_backend *be;
    eng_engine *eng;
    gw_grammars *grammars;   /* structured outputs' grammars (prep thread) */
} inst;

typedef struct eng_tier {
    gw_tier base;
    gw_engines *g;
    inst *in;
} eng_tier;

typedef struct prep prep;

/* One sequence's link to its request: what the engine callback carries. */
typedef struct gw_sink {
    gw_engines *g;
    gw_req *req;          /* NULL once the request is gone (loop thread) */
    eng_tier *t;
    int index;            /* the choice it produces */
    uint64_t seq_id;
    bool dead;            /* submitted, then cancelled by a failed prep: events are ignored
                             (atomic: set on the prep thread) */
} gw_sink;

/* Legacy /v1/completions logprobs being built: each buffer holds one of the four arrays'
 * items, comma-separated. */
typedef struct comp_lp {
    struct evbuffer *part[4];
    int n;
} comp_lp;

/* One choice of a request (n of them): its sequence and what it produced so far. */
typedef struct choice {
    gw_sink *sink;            /* NULL once its sequence is done or cancelled */
    struct evbuffer *text;    /* non-stream: the answer so far */
    struct evbuffer *chat_lp; /* non-stream chat: logprobs entries so far, comma-separated */
    comp_lp comp_lp;          /* non-stream completions: the logprobs arrays so far */
    bool role_sent;
    size_t offset;            /* bytes of text so far (completions' text_offset) */
    const char *finish;       /* once done */
    eng_tools_start tool;     /* with tools: what the answer is so far (a stream holds back
                                 an undecided or call answer in text) */
} choice;

/* The tier's state of one request (r->tier_state). */
typedef struct eng_req {
    eng_tier *t;
    choice *choices;          /* [n] */
    int n;
    int pending;              /* choices not finished yet */
    uint64_t created;
    struct evbuffer *out;     /* a stream's chunk scratch, reused for every token */
    struct evbuffer *lp;      /* a stream chunk's logprobs scratch, reused */
    prep *prep;               /* on the prep thread, or NULL */
    bool cascade;             /* its sequences are small-first cascades */
    gw_tool_mode tools;       /* the answer may be a tool call */
    eng_chat_kind kind;       /* the model's chat family (its call format) */
    char id[96], fp[96];      /* the answer's id and system_fingerprint */
} eng_req;

enum { MAIL_EVENT = 1, MAIL_PREP = 2 };

typedef struct mail_head {
    gw_letter link;           /* first: letters travel through the mailbox */
    int kind;                 /* MAIL_EVENT, MAIL_PREP */
} mail_head;

/* One engine event on its way to the loop. Items are reused (see item_get), so a streamed token
 * costs no allocation once the pool is warm. */
typedef struct item {
    mail_head head;
    struct item *spare;   /* in the pool */
    gw_sink *sink;
    eng_event_kind kind;
    char *text;           /* inline, or allocated when longer than ITEM_TEXT */
    size_t len;
    char inline_text[ITEM_TEXT];
    bool has_pick;
    eng_pick pick;
    eng_finish finish;
    int prompt_tokens, completion_tokens;
    bool escalated;       /* DONE of a cascade: eng_event */
    int small_tokens, kept, large_tokens;
    char error[160];
} item;

/* A request's prompt on its way to the engine: rendered, tokenized and submitted on the prep
 * thread, then back to the loop as a letter (failed or not). It owns copies of everything it
 * reads, so the request may go away meanwhile. */
struct prep {
    mail_head head;
    util_job job;
    util_arena arena;         /* the copies */
    eng_tier *t;
    gw_req *req;              /* loop thread: NULL once the request is gone */
    bool chat;
    eng_chat_msg *msgs;       /* chat */
    size_t n_msgs;
    const char *text;         /* completions: the prompt text, or NULL for ids */
    size_t text_len;
    int32_t *ids;             /* completions: token ids */
    size_t n_ids;
    long long max_tokens;     /* as asked (0: unset) */
    bool constrained;         /* response_format json_object / json_schema */
    gw_tool_req tools;        /* tools and tool_choice (strings in arena) */
    eng_chat_kind kind;
    const char *schema;       /* json_schema's schema (compact JSON), or NULL: any object */
    size_t schema_len;
    eng_request er;           /* everything but the prompt (and its grammar) */
    uint64_t seed;
    gw_sink **sinks;          /* [n] */
    int n;
    pthread_mutex_t mu;       /* cancelled and n_submitted */
    bool cancelled;
    int n_submitted;          /* sinks[0, n_submitted) went to the engine: their DONE events
                                 free them; the others are freed with the prep */
    /* the outcome (prep thread, read on the loop after the letter) */
    int status;               /* 0, or the HTTP status of the failure */
    const char *code, *param;
    char message[400];
};

struct gw_engines {
    gw_server *srv;
    eng_kvpool *pool;
    inst *inst;            /* [n_tiers]; model == NULL for upstream tiers */
    gw_mailbox *mail;      /* events from the scheduler threads and the prep thread */
    util_worker *prep;     /* renders and tokenizes prompts */
    pthread_mutex_t spares_mu;
    item *spares;          /* items for reuse, under spares_mu */
    int n_spares;
};

/* On a scheduler thread: a spare item, or a new one. */
static item *item_get(gw_engines *g)
{
    pthread_mutex_lock(&g->spares_mu);
    item *it = g->spares;
    if (it != NULL) {
        g->spares = it->spare;
        g->n_spares--;
    }
    pthread_mutex_unlock(&g->spares_mu);
    if (it == NULL)
        it = util_xmalloc(sizeof *it);
    return it;
}

/* On the loop: the item goes back to the pool (or is freed when the pool is full). */
static void item_put(gw_engines *g, item *it)
{
    if (it->text != it->inline_text)
        free(it->text);
    pthread_mutex_lock(&g->spares_mu);
    bool keep = g->n_spares < ITEM_POOL;
    if (keep) {
        it->spare = g->spares;
        g->spares = it;
        g->n_spares++;
    }
    pthread_mutex_unlock(&g->spares_mu);
    if (!keep)
        free(it);
}

/* The engine callback, on a scheduler thread: copy, enqueue, wake the loop. */
static void on_event(void *arg, const eng_event *ev)
{
    gw_sink *sink = arg;
    gw_engines *g = sink->g;
    item *it = item_get(g);  /* reused: every field is set here */
    it->head.kind = MAIL_EVENT;
    it->sink = sink;
    it->kind = ev->kind;
    it->len = ev->len;
    it->text = ev->len < ITEM_TEXT ? it->inline_text : util_xmalloc(ev->len + 1);
    if (ev->len > 0)
        memcpy(it->text, ev->text, ev->len);
    it->text[ev->len] = '\0';
    it->has_pick = ev->pick != NULL;
    if (it->has_pick)
        it->pick = *ev->pick;
    it->finish = ev->finish;
    it->prompt_tokens = ev->prompt_tokens;
    it->completion_tokens = ev->completion_tokens;
    it->escalated = ev->escalated;
    it->small_tokens = ev->small_tokens;
    it->kept = ev->kept;
    it->large_tokens = ev->large_tokens;
    snprintf(it->error, sizeof it->error, "%s", ev->error != NULL ? ev->error : "");
    gw_mailbox_post(g->mail, &it->head.link);
}

/* ---- OpenAI shapes ---------------------------------------------------------------------- */

static bool is_chat(const gw_req *r)
{
    return r->body.ep == GW_EP_CHAT;
}

static const char *finish_name(eng_finish f)
{
    return f == ENG_FINISH_LENGTH ? "length" : "stop";
}

/* A logprob as JSON: OpenAI's -9999.0 stands for a probability too small to write. */
static void put_logprob(struct evbuffer *b, float v)
{
    evbuffer_add_printf(b, "%.9g", isfinite(v) ? (double)v : -9999.0);
}

/* "token":"..." (the raw piece with invalid UTF-8 replaced: bytes carry the truth), and with
 * with_bytes ,"bytes":[...]. Returns the cleaned text's length in clean (for dedupe). */
static size_t put_token(struct evbuffer *b, const eng_tokenizer *tok, int32_t id, bool with_bytes,
                        char *clean)
{
    char piece[256];
    int n = eng_token_piece(tok, id, true, piece, sizeof piece);
    if (n < 0 || (size_t)n > sizeof piece)
        n = 0;
    size_t w = 0;
    for (int i = 0; i < n;) {
        int len = 1;
        unsigned char c = (unsigned char)piece[i];
        if (c >= 0xc0)
            len = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : 2;
        if (i + len <= n && gw_utf8_valid(piece + i, (size_t)len)) {
            memcpy(clean + w, piece + i, (size_t)len);
            w += (size_t)len;
            i += len;
        } else {
            memcpy(clean + w, "\xef\xbf\xbd", 3);
            w += 3;
            i++;
        }
    }
    clean[w] = '\0';
    if (b == NULL)
        return w;
    evbuffer_add(b, "\"token\":", 8);
    gw_json_print_stringn(clean, w, b);
    if (with_bytes) {
        evbuffer_add(b, ",\"bytes\":[", 10);
        for (int i = 0; i < n; i++)
            evbuffer_add_printf(b, i ? ",%u" : "%u", (unsigned char)piece[i]);
        evbuffer_add(b, "]", 1);
    }
    return w;
}

#define CLEAN_CAP (256 * 3 + 1)

/* One chat logprobs entry, {"token","bytes","logprob","top_logprobs":[...]}, appended to b. */
static void chat_logprob(struct evbuffer *b, const eng_tokenizer *tok, const eng_pick *p)
{
    char clean[CLEAN_CAP];
    evbuffer_add(b, "{", 1);
    put_token(b, tok, p->token, true, clean);
    evbuffer_add(b, ",\"logprob\":", 11);
    put_logprob(b, p->logprob);
    evbuffer_add(b, ",\"top_logprobs\":[", 17);
    for (int i = 0; i < p->n_top; i++) {
        evbuffer_add(b, i ? ",{" : "{", i ? 2 : 1);
        put_token(b, tok, p->top_ids[i], true, clean);
        evbuffer_add(b, ",\"logprob\":", 11);
        put_logprob(b, p->top_logprobs[i]);
        evbuffer_add(b, "}", 1);
    }
    evbuffer_add(b, "]}", 2);
}

/* Legacy /v1/completions logprobs, {"tokens","token_logprobs","top_logprobs","text_offset"}:
 * four arrays built entry by entry (comp_lp, above). */
static void comp_logprob(comp_lp *c, const eng_tokenizer *tok, const eng_pick *p, size_t offset)
{
    if (c->part[0] == NULL)
        for (int i = 0; i < 4; i++)
            c->part[i] = evbuffer_new();
    if (c->n++ > 0)
        for (int i = 0; i < 4; i++)
            evbuffer_add(c->part[i], ",", 1);
    char clean[CLEAN_CAP];
    size_t w = put_token(NULL, tok, p->token, false, clean);
    gw_json_print_stringn(clean, w, c->part[0]);
    put_logprob(c->part[1], p->logprob);
    /* top_logprobs is an object keyed by token text: the first of equal texts keeps it. */
    char seen[ENG_MAX_TOP_LOGPROBS][CLEAN_CAP];
    int n_seen = 0;
    evbuffer_add(c->part[2], "{", 1);
    for (int i = 0; i < p->n_top; i++) {
        w = put_token(NULL, tok, p->top_ids[i], false, clean);
        bool dup = false;
        for (int k = 0; k < n_seen && !dup; k++)
            dup = !strcmp(seen[k], clean);
        if (dup)
            continue;
        if (n_seen > 0)
            evbuffer_add(c->part[2], ",", 1);
        memcpy(seen[n_seen++], clean, w + 1);
        gw_json_print_stringn(clean, w, c->part[2]);
        evbuffer_add(c->part[2], ":", 1);
        put_logprob(c->part[2], p->top_logprobs[i]);
    }
    evbuffer_add(c->part[2], "}", 1);
    evbuffer_add_printf(c->part[3], "%zu", offset);
}

/* The object, appended to out; c is emptied. */
static void comp_close(comp_lp *c, struct evbuffer *out)
{
    static const char *const names[4] = {"{\"tokens\":[", "],\"token_logprobs\":[",
                                         "],\"top_logprobs\":[", "],\"text_offset\":["};
    for (int i = 0; i < 4; i++) {
        evbuffer_add(out, names[i], strlen(names[i]));
        if (c->part[i] != NULL)
            evbuffer_add_buffer(out, c->part[i]);
    }
    evbuffer_add(out, "]}", 2);
    c->n = 0;
}

static void comp_free(comp_lp *c)
{
    for (int i = 0; i < 4; i++)
        if (c->part[i] != NULL)
            evbuffer_free(c->part[i]);
}

static const eng_tokenizer *req_tok(const eng_req *q)
{
    return q->t->in->model->tok;
}

/* The stream's chunk head: the same id, created, model and fingerprint on every chunk. */
static gw_openai_head chunk_head(const gw_req *r, const eng_req *q)
{
    return (gw_openai_head){.id = q->id, .chat = is_chat(r), .created = q->created,
                            .model = r->body.model, .fingerprint = q->fp};
}

/* A streamed chunk carrying text (and its token's logprobs), or the final finish_reason, written
 * straight into buffers kept for the request: no JSON tree and no allocation per token. */
static void stream_chunk(gw_req *r, eng_req *q, int idx, const char *text, size_t len,
                         const eng_pick *pick, const char *finish)
{
    choice *ch = &q->choices[idx];
    gw_openai_head h = chunk_head(r, q);
    gw_openai_step st = {.index = idx, .role = is_chat(r) && !ch->role_sent,
                         .text = finish == NULL || !is_chat(r) ? (text ? text : "") : NULL,
                         .len = finish == NULL ? len : 0, .finish = finish};
    if (pick != NULL && r->body.top_logprobs >= 0) {
        if (q->lp == NULL)
            q->lp = evbuffer_new();
        if (is_chat(r)) {
            static const char content[] = "{\"content\":[";
            evbuffer_add(q->lp, content, sizeof content - 1);
            chat_logprob(q->lp, req_tok(q), pick);
            evbuffer_add(q->lp, "]}", 2);
        } else {
            comp_lp one = {0};
            comp_logprob(&one, req_tok(q), pick, ch->offset);
            comp_close(&one, q->lp);
            comp_free(&one);
        }
        evbuffer_add(q->lp, "", 1);
        st.logprobs = (const char *)evbuffer_pullup(q->lp, -1);
    }
    ch->role_sent = ch->role_sent || is_chat(r);
    ch->offset += len;
    if (q->out == NULL)
        q->out = evbuffer_new();
    gw_openai_chunk(q->out, &h, &st);
    if (q->lp != NULL)
        evbuffer_drain(q->lp, evbuffer_get_length(q->lp));
    gw_stream_info info = {.model = r->body.model, .fingerprint = q->fp, .index = idx,
                           .text = finish == NULL ? (text ? text : "") : NULL,
                           .len = finish == NULL ? len : 0, .finish = finish};
    gw_stream_buffer_info(r, q->out, &info);
}

static void deliver_token(gw_req *r, eng_req *q, int idx, const item *it)
{
    choice *ch = &q->choices[idx];
    if (r->body.stream) {
        if (!r->replying)
            gw_stream_begin(r, 200, "text/event-stream");
        if (q->tools != GW_TOOLS_NONE && ch->tool != ENG_TOOLS_TEXT) {
            /* Held back until the answer shows whether it is a call (gateway/tool_calls.h). */
            if (ch->text == NULL)
                ch->text = evbuffer_new();
            evbuffer_add(ch->text, it->text ? it->text : "", it->len);
            size_t len = evbuffer_get_length(ch->text);
            const char *held = len ? (const char *)evbuffer_pullup(ch->text, -1) : "";
            size_t at;
            ch->tool = eng_tools_begins(q->kind, held, len, &at);
            if (ch->tool == ENG_TOOLS_TEXT)
                stream_chunk(r, q, idx, held, len, NULL, NULL);
            return;
        }
        if (it->len > 0 || (it->has_pick && r->body.top_logprobs >= 0) || !ch->role_sent)
            stream_chunk(r, q, idx, it->text, it->len, it->has_pick ? &it->pick : NULL, NULL);
        return;
    }
    if (r->t_first_byte == 0)
        r->t_first_byte = util_now_ns();
    if (ch->text == NULL)
        ch->text = evbuffer_new();
    evbuffer_add(ch->text, it->text ? it->text : "", it->len);
    if (it->has_pick && r->body.top_logprobs >= 0) {
        if (!is_chat(r)) {
            comp_logprob(&ch->comp_lp, req_tok(q), &it->pick, ch->offset);
        } else {
            if (ch->chat_lp == NULL)
                ch->chat_lp = evbuffer_new();
            else
                evbuffer_add(ch->chat_lp, ",", 1);
            chat_logprob(ch->chat_lp, req_tok(q), &it->pick);
        }
    }
    ch->offset += it->len;
}

static void detach(gw_tier *t, gw_req *r);

/* The whole (non-stream) answer once every choice is done, written as JSON text. */
static void reply_whole(gw_req *r, eng_req *q)
{
    bool chat = is_chat(r);
    struct evbuffer *b = evbuffer_new();
    evbuffer_add(b, "{\"id\":", 6);
    gw_json_print_string(q->id, b);
    evbuffer_add_printf(b, ",\"object\":\"%s\",\"created\":%llu,\"model\":",
                        chat ? "chat.completion" : "text_completion",
                        (unsigned long long)q->created);
    gw_json_print_string(r->body.model, b);
    evbuffer_add(b, ",\"system_fingerprint\":", 22);
    gw_json_print_string(q->fp, b);
    evbuffer_add(b, ",\"choices\":[", 12);
    for (int i = 0; i < q->n; i++) {
        choice *ch = &q->choices[i];
        size_t len = ch->text ? evbuffer_get_length(ch->text) : 0;
        const char *text = len ? (const char *)evbuffer_pullup(ch->text, -1) : "";
        evbuffer_add_printf(b, "%s{\"index\":%d,", i ? "," : "", i);
        const char *calls = NULL;
        if (chat && q->tools != GW_TOOLS_NONE &&
            gw_tool_calls_json(q->kind, text, len, false, &r->arena, &calls) == 1) {
            static const char msg[] = "\"message\":{\"role\":\"assistant\",\"content\":null,"
                                      "\"tool_calls\":";
            evbuffer_add(b, msg, sizeof msg - 1);
            evbuffer_add(b, calls, strlen(calls));
            static const char refusal[] = ",\"refusal\":null}";
            evbuffer_add(b, refusal, sizeof refusal - 1);
            if (ch->finish == NULL || !strcmp(ch->finish, "stop"))
                ch->finish = "tool_calls";
        } else if (chat) {
            static const char msg[] = "\"message\":{\"role\":\"assistant\",\"content\":";
            evbuffer_add(b, msg, sizeof msg - 1);
            gw_json_print_stringn(text, len, b);
            static const char refusal[] = ",\"refusal\":null}";
            evbuffer_add(b, refusal, sizeof refusal - 1);
        } else {
            evbuffer_add(b, "\"text\":", 7);
            gw_json_print_stringn(text, len, b);
        }
        static const char lp[] = ",\"logprobs\":";
        evbuffer_add(b, lp, sizeof lp - 1);
        if (chat && ch->chat_lp != NULL) {
            static const char content[] = "{\"content\":[";
            evbuffer_add(b, content, sizeof content - 1);
            evbuffer_add_buffer(b, ch->chat_lp);
            evbuffer_add(b, "]}", 2);
        } else if (!chat && ch->comp_lp.n > 0) {
            comp_close(&ch->comp_lp, b);
        } else {
            evbuffer_add(b, "null", 4);
        }
        static const char fr[] = ",\"finish_reason\":";
        evbuffer_add(b, fr, sizeof fr - 1);
        gw_json_print_string(ch->finish ? ch->finish : "stop", b);
        evbuffer_add(b, "}", 1);
    }
    static const char usage[] = "],\"usage\":";
    evbuffer_add(b, usage, sizeof usage - 1);
    gw_openai_usage(b, r->prompt_tokens, r->completion_tokens);
    evbuffer_add(b, "}\n", 2);
    gw_reply_body(r, 200, "application/json", b);
    evbuffer_free(b);
}

/* A stream's held answer at its end: one tool_calls delta when it is a call (finish_reason
 * tool_calls), else the text (a call cut short by max_tokens is sent as the text it is). */
static void stream_tool_end(gw_req *r, eng_req *q, int idx)
{
    choice *ch = &q->choices[idx];
    size_t len = ch->text ? evbuffer_get_length(ch->text) : 0;
    const char *held = len ? (const char *)evbuffer_pullup(ch->text, -1) : "";
    const char *calls;
    if (ch->tool == ENG_TOOLS_CALL &&
        gw_tool_calls_json(q->kind, held, len, true, &r->arena, &calls) == 1) {
        gw_openai_head h = chunk_head(r, q);
        gw_openai_step st = {.index = idx, .role = !ch->role_sent, .text = NULL,
                             .tool_calls = calls};
        ch->role_sent = true;
        if (q->out == NULL)
            q->out = evbuffer_new();
        gw_openai_chunk(q->out, &h, &st);
        /* No info: the cache reads the chunk itself, and keeps no streamed call. */
        gw_stream_buffer_info(r, q->out, NULL);
        if (!strcmp(ch->finish, "stop"))
            ch->finish = "tool_calls";
    } else if (len > 0) {
        stream_chunk(r, q, idx, held, len, NULL, NULL);
    }
    ch->tool = ENG_TOOLS_TEXT;
}

static void deliver_done(gw_req *r, eng_req *q, int idx, const item *it)
{
    choice *ch = &q->choices[idx];
    const char *name = q->t->base.cfg->name;
    if (it->finish == ENG_FINISH_ERROR || it->finish == ENG_FINISH_CANCELLED) {
        const char *why = it->finish == ENG_FINISH_ERROR ? it->error : "the engine stopped";
        detach(&q->t->base, r);  /* the other choices stop too */
        if (!r->replying && r->fallback_ok) {
            gw_tier_fail(r, 503, "server_error", "engine_error", "engine_error",
                         "Tier '%s' could not finish this request: %s.", name, why);
            return;
        }
        if (!r->replying) {
            gw_reply_error(r, 503, "server_error", NULL, "engine_error",
                           "Tier '%s' could not finish this request: %s.", name, why);
            return;
        }
        gw_stream_error(r, "server_error", "engine_error", "Tier '%s' could not finish this "
                        "request: %s.", name, why);
        return;
    }
    ch->finish = finish_name(it->finish);
    r->prompt_tokens = it->prompt_tokens;       /* the same prompt for every choice */
    r->completion_tokens += it->completion_tokens;
    if (q->cascade) {
        const gw_config *c = r->srv->cfg;
        r->cascade_did.ran = true;
        r->cascade_did.escalated = r->cascade_did.escalated || it->escalated;
        r->cascade_did.small_tier = (int)(gw_config_tier(c, q->t->base.cfg->draft_tier) -
                                          c->tiers);
        r->cascade_did.small_tokens += it->small_tokens;
        r->cascade_did.kept += it->kept;
        r->cascade_did.large_tokens += it->large_tokens;
    }
    if (r->body.stream) {
        if (!r->replying)
            gw_stream_begin(r, 200, "text/event-stream");
        if (q->tools != GW_TOOLS_NONE && ch->tool != ENG_TOOLS_TEXT)
            stream_tool_end(r, q, idx);
        stream_chunk(r, q, idx, NULL, 0, NULL, ch->finish);
    }
    if (--q->pending > 0)
        return;
    if (!r->body.stream) {
        reply_whole(r, q);
        return;
    }
    if (r->body.include_usage) {
        gw_openai_head h = chunk_head(r, q);
        if (q->out == NULL)
            q->out = evbuffer_new();
        gw_openai_usage_chunk(q->out, &h, r->prompt_tokens, r->completion_tokens);
        gw_stream_info info = {.model = r->body.model, .fingerprint = q->fp, .usage = true,
                               .prompt_tokens = r->prompt_tokens,
                               .completion_tokens = r->completion_tokens};
        gw_stream_buffer_info(r, q->out, &info);
    }
    gw_stream_event(r, GW_SSE_DONE, strlen(GW_SSE_DONE));
    gw_stream_end(r);
}

static void deliver_event(gw_engines *g, item *it)
{
    gw_sink *sink = it->sink;
    if (sink->req != NULL && !__atomic_load_n(&sink->dead, __ATOMIC_ACQUIRE)) {
        gw_req *r = sink->req;
        eng_req *q = r->tier_state;
        if (it->kind == ENG_EV_TOKEN) {
            deliver_token(r, q, sink->index, it);
        } else {
            q->choices[sink->index].sink = NULL;  /* done: nothing left to cancel */
            sink->req = NULL;
            deliver_done(r, q, sink->index, it);
        }
    }
    if (it->kind == ENG_EV_DONE)
        free(sink);              /* the engine is done with it, and so is the request */
    item_put(g, it);
}

/* ---- the prep thread ------------------------------------------------------------------------ */

static void prep_fail(prep *p, int status, const char *code, const char *param, const char *fmt,
                      ...) __attribute__((format(printf, 5, 6)));

static void prep_fail(prep *p, int status, const char *code, const char *param, const char *fmt,
                      ...)
{
    p->status = status;
    p->code = code;
    p->param = param;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->message, sizeof p->message, fmt, ap);
    va_end(ap);
}

/* On the prep thread: the prompt's token ids (chat: rendered with the model's template). */
static int prep_tokens(prep *p, const eng_model *m, int32_t **ids, size_t *n)
{
    size_t cap = 0;
    if (p->ids != NULL) {
        *ids = p->ids;
        *n = p->n_ids;
        return 0;
    }
    if (p->chat) {
        char *text = NULL;
        size_t len = 0;
        if (eng_chat_render(m->chat, p->msgs, p->n_msgs, m->default_system, true, &text,
                            &len) != 0 ||
            eng_tokenize(m->tok, text, len, eng_tokenizer_add_bos(m->tok), true, ids, n,
                         &cap) != 0) {
            free(text);
            prep_fail(p, 500, NULL, NULL, "Out of memory.");
            return -1;
        }
        free(text);
        return 0;
    }
    if (eng_tokenize(m->tok, p->text, p->text_len, eng_tokenizer_add_bos(m->tok), true, ids, n,
                     &cap) != 0) {
        prep_fail(p, 500, NULL, NULL, "Out of memory.");
        return -1;
    }
    return 0;
}

static void prep_run(void *arg)
{
    prep *p = arg;
    inst *in = p->t->in;
    const char *what = p->chat ? "messages" : "prompt";
    int32_t *ids = NULL;
    size_t n = 0;
    if (prep_tokens(p, in->model, &ids, &n) != 0)
        goto out;
    /* As the OpenAI API does: a prompt that fits but leaves no room for the max_tokens asked
     * for is refused, not cut short. Unset max_tokens means "until the context is full". */
    int n_ctx = eng_engine_n_ctx(in->eng);
    if (p->max_tokens > 0 && (int64_t)n + p->max_tokens > n_ctx && n < (size_t)n_ctx) {
        prep_fail(p, 400, "context_length_exceeded", what,
                  "This model's maximum context length is %d tokens. However, you requested "
                  "%lld tokens (%zu in the %s, %lld in the completion). Please reduce the "
                  "length of the %s or completion.", n_ctx, (long long)n + p->max_tokens, n,
                  what, p->max_tokens, what);
        goto out;
    }
    p->er.prompt = ids;
    p->er.n_prompt = n;
    if (p->tools.mode != GW_TOOLS_NONE) {
        util_err err = {0};
        if (gw_grammars_get_tools(in->grammars, p->tools.key, p->tools.key_len, p->tools.specs,
                                  p->tools.n, eng_tools_format(p->kind),
                                  p->tools.mode == GW_TOOLS_REQUIRED, &p->er.grammar,
                                  &err) != 0) {
            prep_fail(p, 400, "invalid_value", "tools", "Invalid 'tools' for tier '%s': %s",
                      p->t->base.cfg->name, err.msg);
            goto out;
        }
    } else if (p->constrained) {
        util_err err = {0};
        if (gw_grammars_get(in->grammars, p->schema, p->schema_len, &p->er.grammar, &err) != 0) {
            prep_fail(p, 400, "invalid_json_schema", "response_format.json_schema.schema",
                      "Invalid schema for response_format on tier '%s': %s", p->t->base.cfg->name,
                      err.msg);
            goto out;
        }
    }
    pthread_mutex_lock(&p->mu);
    /* One sequence per choice; choice i samples with seed + i (the same seed gives the same n
     * choices again). Their shared prompt pages come from the prefix table once computed. */
    for (int i = 0; i < p->n && !p->cancelled; i++) {
        util_err err = {0};
        p->er.seed = p->seed + (uint64_t)i;
        p->er.arg = p->sinks[i];
        int rc = eng_engine_submit(in->eng, &p->er, &p->sinks[i]->seq_id, &err);
        if (rc != 0) {
            bool bias_err = strncmp(err.msg, "logit_bias", 10) == 0;
            prep_fail(p, 400, rc == LLMGW_ERANGE ? "context_length_exceeded" : "invalid_value",
                      bias_err ? "logit_bias" : what, "%s", err.msg);
            for (int k = 0; k < i; k++) {   /* the choices already queued stop */
                __atomic_store_n(&p->sinks[k]->dead, true, __ATOMIC_RELEASE);
                eng_engine_cancel(in->eng, p->sinks[k]->seq_id);
            }
            break;
        }
        p->n_submitted = i + 1;
    }
    pthread_mutex_unlock(&p->mu);
out:
    eng_grammar_unref(p->er.grammar);   /* the engine holds its own references */
    p->er.grammar = NULL;
    if (ids != p->ids)
        free(ids);
    gw_mailbox_post(p->t->g->mail, &p->head.link);
}

static void prep_free(prep *p)
{
    for (int i = p->n_submitted; i < p->n; i++)
        free(p->sinks[i]);   /* never given to the engine: no DONE will free it */
    pthread_mutex_destroy(&p->mu);
    util_arena_deinit(&p->arena);
    free(p);
}

/* On the loop: the prep thread is done with p. */
static void deliver_prep(prep *p)
{
    gw_req *r = p->req;
    if (r != NULL) {
        eng_req *q = r->tier_state;
        q->prep = NULL;
        if (p->status != 0) {
            /* Submitted sinks (dead now) free themselves; the others go with p. */
            for (int i = 0; i < p->n; i++)
                q->choices[i].sink = NULL;
            gw_reply_error(r, p->status, p->status == 500 ? "server_error"
                                                          : "invalid_request_error",
                           p->param, p->code, "%s", p->message);
        }
    }
    prep_free(p);
}

static void deliver_all(gw_letter *first, void *arg)
{
    gw_engines *g = arg;
    for (gw_letter *l = first, *next; l != NULL; l = next) {
        next = l->next;
        mail_head *h = (mail_head *)l;
        if (h->kind == MAIL_PREP)
            deliver_prep((prep *)h);
        else
            deliver_event(g, (item *)h);
    }
}

/* ---- the tier ------------------------------------------------------------------------------- */

/* The conversation as the model reads it (copied into p's arena): tool calls and results in the
 * family's format, and with tools, their block at the end of the system turn (one is made, with
 * the template's default text, when the conversation has none). */
static void prep_messages(prep *p, const gw_request *b, const eng_model *m)
{
    bool tools = p->tools.mode != GW_TOOLS_NONE;
    bool has_system = b->n_messages > 0 && (!strcmp(b->messages[0].role, "system") ||
                                            !strcmp(b->messages[0].role, "developer"));
    size_t extra = tools && !has_system ? 1 : 0;
    p->n_msgs = b->n_messages + extra;
    p->msgs = util_arena_alloc(&p->arena, (p->n_msgs ? p->n_msgs : 1) * sizeof *p->msgs);
    if (extra) {
        const char *def = m->default_system;
        size_t dl = def ? strlen(def) : 0, sl = strlen(p->tools.system);
        char *sys = util_arena_alloc(&p->arena, dl + sl + 3);
        int n = snprintf(sys, dl + sl + 3, "%s%s%s", def ? def : "", def ? "\n\n" : "",
                         p->tools.system);
        p->msgs[0] = (eng_chat_msg){.role = "system", .content = sys, .content_len = (size_t)n};
    }
    for (size_t i = 0; i < b->n_messages; i++) {
        const char *role, *content;
        size_t len;
        gw_tool_message(b, i, m->chat, &p->arena, &role, &content, &len);
        if (tools && i == 0 && has_system) {
            size_t sl = strlen(p->tools.system);
            char *sys = util_arena_alloc(&p->arena, len + sl + 3);
            memcpy(sys, content, len);
            memcpy(sys + len, "\n\n", 2);
            memcpy(sys + len + 2, p->tools.system, sl + 1);
            content = sys;
            len += sl + 2;
        }
        p->msgs[i + extra] = (eng_chat_msg){.role = util_arena_strdup(&p->arena, role),
                                            .content = util_arena_strndup(&p->arena, content, len),
                                            .content_len = len};
    }
}

/* What the prep thread needs, copied out of the request; NULL after answering r (an error). */
static prep *prep_new(gw_req *r, eng_tier *t)
{
    const gw_request *b = &r->body;
    const char *name = t->base.cfg->name;
    prep *p = util_xcalloc(1, sizeof *p);
    util_arena_init(&p->arena, 4096);
    pthread_mutex_init(&p->mu, NULL);
    p->head.kind = MAIL_PREP;
    p->t = t;
    p->req = r;
    p->chat = is_chat(r);
    if (p->chat) {
        if (!t->in->model->has_chat) {
            prep_free(p);
            gw_reply_error(r, 400, "invalid_request_error", "messages", "no_chat_template",
                           "Tier '%s' has no chat template; set chat_template in its config "
                           "or use /v1/completions.", name);
            return NULL;
        }
        const eng_model *m = t->in->model;
        p->kind = m->chat;
        const char *param = NULL;
        char why[200];
        if (gw_tool_req_read(b, m->chat, &p->arena, &p->tools, &param, why, sizeof why) != 0) {
            prep_free(p);
            gw_reply_error(r, 400, "invalid_request_error", param, "invalid_value", "%s", why);
            return NULL;
        }
        prep_messages(p, b, m);
    } else {
        const cJSON *prompt = cJSON_GetObjectItemCaseSensitive(b->json, "prompt");
        const cJSON *list = prompt;
        if (cJSON_IsArray(prompt) && cJSON_GetArraySize(prompt) == 1)
            list = prompt->child;
        if (cJSON_IsString(list)) {
            p->text_len = strlen(list->valuestring);
            p->text = util_arena_strndup(&p->arena, list->valuestring, p->text_len);
        } else if (cJSON_IsArray(list) && cJSON_IsNumber(list->child)) {
            p->n_ids = (size_t)cJSON_GetArraySize(list);
            p->ids = util_arena_alloc(&p->arena, p->n_ids * sizeof *p->ids);
            size_t i = 0;
            const cJSON *tk;
            cJSON_ArrayForEach(tk, list) p->ids[i++] = (int32_t)tk->valuedouble;
        } else {
            prep_free(p);
            gw_reply_error(r, 400, "invalid_request_error", "prompt", "unsupported_value",
                           "Engine tiers take one prompt per request (a string or one list of "
                           "token ids).");
            return NULL;
        }
    }
    eng_logit_bias *bias = NULL;
    int n_bias = 0;
    const cJSON *lb = cJSON_GetObjectItemCaseSensitive(b->json, "logit_bias");
    if (b->logit_bias_n > 0 && cJSON_IsObject(lb)) {
        /* Keys and values were validated by gw_request_parse; the vocabulary is checked by
         * eng_engine_submit (400 naming the id). */
        bias = util_arena_alloc(&p->arena, (size_t)b->logit_bias_n * sizeof *bias);
        const cJSON *it;
        cJSON_ArrayForEach(it, lb) {
            bias[n_bias].token = (int32_t)strtol(it->string, NULL, 10);
            bias[n_bias].bias = (float)it->valuedouble;
            n_bias++;
        }
    }
    p->max_tokens = b->max_tokens;
    p->er = (eng_request){
        .sampling = {.temperature = b->has_temperature ? (float)b->temperature : 1.0f,
                     .top_k = b->top_k,
                     .top_p = b->has_top_p ? (float)b->top_p : 1.0f,
                     .min_p = (float)b->min_p,
                     .top_logprobs = b->top_logprobs,
                     .logit_bias = bias,
                     .n_logit_bias = n_bias},
        .max_tokens = b->max_tokens > 0 ? (int)(b->max_tokens > 1 << 30 ? 1 << 30 : b->max_tokens)
                                        : (p->chat ? 0 : 16),
        .n_stop = b->n_stop,
        .on_event = on_event,
    };
    for (size_t i = 0; i < b->n_stop; i++)
        p->er.stop[i] = util_arena_strdup(&p->arena, b->stop[i]);
    p->constrained = b->response_format != GW_RF_TEXT;
    if (b->json_schema != NULL) {
        char *schema = cJSON_PrintUnformatted(b->json_schema);
        if (schema == NULL) {
            prep_free(p);
            gw_reply_error(r, 500, "server_error", NULL, NULL, "Out of memory.");
            return NULL;
        }
        p->schema_len = strlen(schema);
        p->schema = util_arena_strndup(&p->arena, schema, p->schema_len);
        cJSON_free(schema);
    }
    const router_cascade *rc = r->cascade;
    bool grammar = p->constrained || p->tools.mode != GW_TOOLS_NONE;   /* engine.h: no cascade */
    if (rc != NULL && t->base.cfg->draft_tier != NULL && !grammar)   /* the drafter answers first */
        p->er.cascade = (eng_cascade){
            .rule = rc->rule == ROUTER_DEFER_DIFF ? ENG_DEFER_DIFF : ENG_DEFER_CHOW,
            .threshold = (float)rc->threshold, .window = rc->window,
            .margin = (float)rc->margin, .hold = rc->hold};
    if (b->has_seed)
        p->seed = (uint64_t)b->seed;
    else if (RAND_bytes((unsigned char *)&p->seed, sizeof p->seed) != 1)
        p->seed = util_now_ns();
    return p;
}

const char *gw_engine_tier_lacks(const gw_request *b)
{
    if (b->media != NULL)
        return b->media->media_type;   /* "image_url", "input_audio", "file" */
    if (b->n > MAX_ENGINE_CHOICES)
        return "more than 16 choices (n)";
    return NULL;
}

static void start(gw_tier *base, gw_req *r)
{
    eng_tier *t = (eng_tier *)base;
    const char *name = base->cfg->name;
    const gw_request *b = &r->body;
    if (b->ep == GW_EP_EMBEDDINGS) {
        gw_reply_error(r, 400, "invalid_request_error", "model", "unsupported_model",
                       "Tier '%s' is a generation model; it does not serve embeddings.", name);
        return;
    }
    if (b->media != NULL) {
        /* A text-only model would answer as if the part were not there: refuse, naming it. */
        char param[64];
        snprintf(param, sizeof param, "messages.[%zu].content.[%d]", b->media_msg,
                 b->media->media_part);
        gw_reply_error(r, 400, "invalid_request_error", param, "unsupported_content",
                       "Tier '%s' reads text only; it cannot read the '%s' part at %s. Send the "
                       "request to a model that accepts %s, or remove the part.", name,
                       b->media->media_type, param,
                       b->media->media_type[1] == 'm' ? "images"
                       : b->media->media_type[1] == 'n' ? "audio" : "files");
        return;
    }
    if (b->n > MAX_ENGINE_CHOICES) {
        gw_reply_error(r, 400, "invalid_request_error", "n", "unsupported_value",
                       "Tier '%s' generates at most %d choices per request.", name,
                       MAX_ENGINE_CHOICES);
        return;
    }
    prep *p = prep_new(r, t);
    if (p == NULL)
        return;
    eng_req *q = util_arena_alloc(&r->arena, sizeof *q);
    *q = (eng_req){.t = t, .n = b->n, .pending = b->n, .prep = p,
                   .created = util_wall_ms() / 1000,
                   .cascade = p->er.cascade.rule != ENG_DEFER_NONE, .tools = p->tools.mode,
                   .kind = p->kind};
    snprintf(q->id, sizeof q->id, "%s%s", is_chat(r) ? "chatcmpl-" : "cmpl-", r->id);
    snprintf(q->fp, sizeof q->fp, "llmgw-%s", name);
    q->choices = util_arena_alloc(&r->arena, (size_t)b->n * sizeof *q->choices);
    memset(q->choices, 0, (size_t)b->n * sizeof *q->choices);
    p->n = b->n;
    p->sinks = util_arena_alloc(&p->arena, (size_t)b->n * sizeof *p->sinks);
    for (int i = 0; i < b->n; i++) {
        gw_sink *sink = util_xcalloc(1, sizeof *sink);
        *sink = (gw_sink){.g = t->g, .req = r, .t = t, .index = i};
        p->sinks[i] = sink;
        q->choices[i].sink = sink;
        q->choices[i].tool = ENG_TOOLS_MAYBE;   /* nothing yet: a call may begin */
    }
    r->tier_state = q;
    r->attempts = 1;
    p->job = (util_job){.fn = prep_run, .arg = p};
    util_worker_post(t->g->prep, &p->job);
}

static void detach(gw_tier *base, gw_req *r)
{
    (void)base;
    eng_req *q = r->tier_state;
    if (q == NULL)
        return;
    prep *p = q->prep;
    if (p != NULL) {
        /* Still on the prep thread: it submits nothing more, and its letter frees it. */
        pthread_mutex_lock(&p->mu);
        p->cancelled = true;
        pthread_mutex_unlock(&p->mu);
        p->req = NULL;
        q->prep = NULL;
    }
    for (int i = 0; i < q->n; i++) {
        gw_sink *sink = q->choices[i].sink;
        if (sink == NULL)
            continue;
        q->choices[i].sink = NULL;
        sink->req = NULL;   /* its DONE event (or the prep letter) frees it */
        bool submitted = true;      /* the prep is over: every sink went to the engine */
        if (p != NULL) {
            pthread_mutex_lock(&p->mu);
            submitted = i < p->n_submitted;
            pthread_mutex_unlock(&p->mu);
        }
        if (submitted)
            eng_engine_cancel(q->t->in->eng, sink->seq_id);
    }
}

static void release(gw_tier *base, gw_req *r)
{
    detach(base, r);
    eng_req *q = r->tier_state;
    if (q == NULL)
        return;
    for (int i = 0; i < q->n; i++) {
        if (q->choices[i].text)
            evbuffer_free(q->choices[i].text);
        if (q->choices[i].chat_lp)
            evbuffer_free(q->choices[i].chat_lp);
        comp_free(&q->choices[i].comp_lp);
    }
    if (q->out != NULL)
        evbuffer_free(q->out);
    if (q->lp != NULL)
        evbuffer_free(q->lp);
    r->tier_state = NULL;   /* q itself lives in r's arena */
}

static void metrics(gw_tier *base, gw_metrics *m)
{
    eng_tier *t = (eng_tier *)base;
    char labels[160];
    eng_engine_stats st;
    eng_engine_stats_get(t->in->eng, &st);
    const char *name = base->cfg->name;
    snprintf(labels, sizeof labels, "tier=\"%s\",state=\"waiting\"", name);
    gw_metrics_set(m, "llmgw_engine_sequences", labels, st.waiting);
    snprintf(labels, sizeof labels, "tier=\"%s\",state=\"running\"", name);
    gw_metrics_set(m, "llmgw_engine_sequences", labels, st.running);
    snprintf(labels, sizeof labels, "tier=\"%s\",phase=\"prefill\"", name);
    gw_metrics_set(m, "llmgw_engine_tokens_total", labels, (double)st.prefill_tokens);
    snprintf(labels, sizeof labels, "tier=\"%s\",phase=\"decode\"", name);
    gw_metrics_set(m, "llmgw_engine_tokens_total", labels, (double)st.decode_tokens);
    snprintf(labels, sizeof labels, "tier=\"%s\"", name);
    gw_metrics_set(m, "llmgw_engine_steps_total", labels, (double)st.steps);
    gw_metrics_set(m, "llmgw_engine_preemptions_total", labels, (double)st.preemptions);
    gw_metrics_set(m, "llmgw_engine_prefix_hit_tokens_total", labels,
                   (double)st.prefix_hit_tokens);
    gw_metrics_set(m, "llmgw_engine_prefix_pages", labels, (double)st.prefix_pages);
    gw_metrics_set(m, "llmgw_engine_drafter_prefix_hit_tokens_total", labels,
                   (double)st.drafter_prefix_hit_tokens);
    gw_metrics_set(m, "llmgw_engine_spec_off_steps_total", labels, (double)st.spec_off_steps);
    const char *dt = base->cfg->draft_tier;
    if (dt != NULL) {
        gw_metrics_set(m, "llmgw_engine_drafter_tokens_total", labels,
                       (double)st.drafter_tokens);
        gw_metrics_set(m, "llmgw_engine_cascade_checks_total", labels,
                       (double)st.cascade_checks);
    }
    for (int k = 0; k < ENG_DRAFTERS; k++) {
        if (k == ENG_DRAFT_MODEL && dt == NULL)
            continue;
        snprintf(labels, sizeof labels, "tier=\"%s\",drafter=\"%s\"", name,
                 k == ENG_DRAFT_MODEL ? dt : "ngram");
        gw_metrics_set(m, "llmgw_engine_draft_tokens_total", labels, (double)st.draft_tokens[k]);
        gw_metrics_set(m, "llmgw_engine_draft_accepted_total", labels,
                       (double)st.draft_accepted[k]);
        gw_metrics_set(m, "llmgw_engine_draft_rejected_total", labels,
                       (double)(st.draft_tokens[k] - st.draft_accepted[k]));
        gw_metrics_set(m, "llmgw_engine_draft_rounds_total", labels, (double)st.draft_rounds[k]);
    }
    gw_engines *g = t->g;
    if (g->pool != NULL) {
        size_t total = eng_kvpool_n_pages(g->pool);
        gw_metrics_set(m, "llmgw_kv_pages", "state=\"total\"", (double)total);
        gw_metrics_set(m, "llmgw_kv_pages", "state=\"used\"",
                       (double)(total - eng_kvpool_n_free(g->pool)));
    }
}

static void tier_free(gw_tier *base)
{
    free(base->impl);   /* the instance belongs to gw_engines */
}

static const gw_tier_ops ops = {"engine", start, detach, release, metrics, tier_free};

/* ---- the instances -------------------------------------------------------------------------- */

int gw_engines_new(gw_engines **out, gw_server *s, util_err *err)
{
    const gw_config *c = s->cfg;
    *out = NULL;
    bool any = false;
    for (size_t i = 0; i < c->n_tiers; i++)
        any = any || c->tiers[i].kind == GW_TIER_ENGINE;
    if (!any)
        return 0;
    gw_engines *g = util_xcalloc(1, sizeof *g);
    int rc = 0;
    g->srv = s;
    g->inst = util_xcalloc(c->n_tiers, sizeof *g->inst);
    pthread_mutex_init(&g->spares_mu, NULL);
    g->mail = gw_mailbox_new(s->base, deliver_all, g);
    if (g->mail == NULL) {
        rc = util_err_set(err, LLMGW_ENOMEM, "engine tiers: cannot make the loop's mailbox");
        goto fail;
    }
    if ((rc = util_worker_start(&g->prep, "llmgw-prep", err)) != 0)
        goto fail;
    /* Every model and backend first: a tier may draft with another tier's model, and the
     * pool's pages are a buffer of the first tier's backend. */
    kern_backend *pool_be = NULL;
    for (size_t i = 0; i < c->n_tiers; i++) {
        const gw_tier_cfg *t = &c->tiers[i];
        inst *in = &g->inst[i];
        if (t->kind != GW_TIER_ENGINE)
            continue;
        in->load_ns = util_now_ns();
        if ((rc = eng_model_load(&in->model, t->model_path, t->chat_template, err)) != 0)
            goto fail;
        in->grammars = gw_grammars_new(in->model->tok);
        in->load_ns = util_now_ns() - in->load_ns;
        util_err why = {0};
        if ((rc = kern_backend_open(t->device, t->threads, &in->be, &why)) != 0) {
            rc = util_err_set(err, rc, "tier '%s': %s", t->name, why.msg);
            goto fail;
        }
        /* One pool serves every tier: they must compute where its pages are (a backend's
         * name says where: cpu, shadow, cuda:N). */
        if (pool_be != NULL && strcmp(pool_be->name, in->be->name) != 0) {
            rc = util_err_set(err, LLMGW_EINVAL, "tier '%s' computes on %s, the K/V pool is on "
                              "%s: engine tiers share one device", t->name, in->be->name,
                              pool_be->name);
            goto fail;
        }
        if (pool_be == NULL)
            pool_be = in->be;
    }
    size_t page = c->engine.kv_page_kb * 1024;
    size_t n_pages = c->engine.kv_pool_mb * 1024 * 1024 / page;
    if ((rc = eng_kvpool_new(&g->pool, pool_be, page, n_pages ? n_pages : 1, err)) != 0)
        goto fail;
    for (size_t i = 0; i < c->n_tiers; i++) {
        const gw_tier_cfg *t = &c->tiers[i];
        inst *in = &g->inst[i];
        if (t->kind != GW_TIER_ENGINE)
            continue;
        uint64_t t0 = util_now_ns() - in->load_ns;
        eng_engine_cfg ec = {.name = t->name, .max_batch_tokens = t->max_batch_tokens,
                             .max_seqs = t->max_seqs, .n_ctx = t->context,
                             .ngram_draft = t->ngram_draft, .draft_max = t->draft_max,
                             .draft_max_batch = t->draft_max_batch,
                             .draft_always = t->draft_always,
                             .draft_own_kv = t->draft_own_kv};
        /* config: < 0 unset, 0 never stop; engine: 0 default, < 0 never stop */
        ec.draft_p_min = t->draft_p_min < 0 ? 0.0f
                         : t->draft_p_min == 0 ? -1.0f : (float)t->draft_p_min;
        if (t->draft_tier != NULL)
            ec.drafter = g->inst[gw_config_tier(c, t->draft_tier) - c->tiers].model;
        if (t->kv_dtype != NULL)   /* validated by the config */
            eng_kv_parse(t->kv_dtype, &ec.kv_type, &ec.kv_k_group, &ec.kv_rotate);
        if ((rc = eng_engine_new(&in->eng, in->model, g->pool, in->be, &ec, err)) != 0)
            goto fail;
        const eng_kv_layout *kvl = eng_engine_kv(in->eng);
        char kvname[24];
        UTIL_LOG_INFO("engine", "tier '%s': %s loaded in %.0f ms (%d layers, vocab %d, "
                      "context %d, %d threads, %s K/V: %zu bytes a token, %d a page)", t->name,
                      t->model_path, (double)(util_now_ns() - t0) / 1e6, in->model->hp.n_layer,
                      in->model->hp.n_vocab, eng_engine_n_ctx(in->eng),
                      in->be->n_threads(in->be->ctx),
                      eng_kv_name(kvl, in->model->hp.head_dim, kvname, sizeof kvname),
                      kvl->bytes_per_token, kvl->page_tokens);
    }
    *out = g;
    return 0;
fail:
    gw_engines_free(g);
    return rc;
}

int gw_engine_tier_new(gw_tier **out, gw_engines *g, int index)
{
    if (g == NULL || g->inst[index].eng == NULL)
        return LLMGW_EINVAL;
    eng_tier *t = util_xcalloc(1, sizeof *t);
    t->base = (gw_tier){.ops = &ops, .cfg = &g->srv->cfg->tiers[index], .index = index,
                        .impl = t};
    t->g = g;
    t->in = &g->inst[index];
    *out = &t->base;
    return 0;
}

void gw_engines_free(gw_engines *g)
{
    if (g == NULL)
        return;
    util_worker_stop(g->prep);      /* what it held is submitted (or failed) and posted */
    for (size_t i = 0; i < g->srv->cfg->n_tiers; i++)
        eng_engine_free(g->inst[i].eng);   /* its last callbacks post DONE(cancelled) */
    eng_kvpool_free(g->pool);              /* a buffer of one of the backends */
    for (size_t i = 0; i < g->srv->cfg->n_tiers; i++) {
        gw_grammars_free(g->inst[i].grammars);   /* the engines released their grammars */
        kern_backend_free(g->inst[i].be);
        eng_model_free(g->inst[i].model);
    }
    /* Every request is gone by now: what is left in the mailbox only needs freeing. */
    for (gw_letter *l = gw_mailbox_free(g->mail), *n; l != NULL; l = n) {
        n = l->next;
        mail_head *h = (mail_head *)l;
        if (h->kind == MAIL_PREP) {
            prep_free((prep *)h);
            continue;
        }
        item *it = (item *)h;
        if (it->kind == ENG_EV_DONE)
            free(it->sink);
        if (it->text != it->inline_text)
            free(it->text);
        free(it);
    }
    for (item *it = g->spares, *n; it != NULL; it = n) {
        n = it->spare;
        free(it);
    }
    pthread_mutex_destroy(&g->spares_mu);
    free(g->inst);
    free(g);
}

void gw_engines_declare_metrics(gw_metrics *m)
{
    gw_metrics_declare(m, "llmgw_kv_pages", GW_METRIC_GAUGE,
                       "KV pool pages shared by the engine tiers (total, used).");
    gw_metrics_declare(m, "llmgw_engine_sequences", GW_METRIC_GAUGE,
                       "Engine sequences by tier and state (waiting = queue depth, running).");
    gw_metrics_declare(m, "llmgw_engine_tokens_total", GW_METRIC_COUNTER,
                       "Tokens processed by engine tiers, by phase (prefill, decode).");
    gw_metrics_declare(m, "llmgw_engine_steps_total", GW_METRIC_COUNTER,
                       "Batched forward steps run by each engine tier.");
    gw_metrics_declare(m, "llmgw_engine_prefix_hit_tokens_total", GW_METRIC_COUNTER,
                       "Prompt tokens whose K/V came from shared prefix pages, by tier.");
    gw_metrics_declare(m, "llmgw_engine_prefix_pages", GW_METRIC_GAUGE,
                       "KV pages the tier's shared-prefix tables (its model's and its "
                       "drafter's) hold.");
    gw_metrics_declare(m, "llmgw_engine_drafter_prefix_hit_tokens_total", GW_METRIC_COUNTER,
                       "Prompt tokens whose drafter K/V came from shared prefix pages, by tier.");
    gw_metrics_declare(m, "llmgw_engine_preemptions_total", GW_METRIC_COUNTER,
                       "Sequences preempted because the KV pool was full.");
    gw_metrics_declare(m, "llmgw_engine_draft_tokens_total", GW_METRIC_COUNTER,
                       "Tokens drafted for speculation and verified by the tier, by drafter.");
    gw_metrics_declare(m, "llmgw_engine_draft_accepted_total", GW_METRIC_COUNTER,
                       "Drafted tokens the tier accepted, by drafter (ngram or the drafting "
                       "tier).");
    gw_metrics_declare(m, "llmgw_engine_draft_rejected_total", GW_METRIC_COUNTER,
                       "Drafted tokens the tier rejected, by drafter.");
    gw_metrics_declare(m, "llmgw_engine_draft_rounds_total", GW_METRIC_COUNTER,
                       "Drafts verified, by drafter (mean accepted length = accepted / "
                       "rounds).");
    gw_metrics_declare(m, "llmgw_engine_drafter_tokens_total", GW_METRIC_COUNTER,
                       "Tokens the drafting tier's model computed for this tier's drafts.");
    gw_metrics_declare(m, "llmgw_engine_cascade_checks_total", GW_METRIC_COUNTER,
                       "Cascade checks (the diff rule): forwards of the tier over a drafter's "
                       "held tokens, escalating or not.");
    gw_metrics_declare(m, "llmgw_engine_spec_off_steps_total", GW_METRIC_COUNTER,
                       "Steps whose batch was too large for draft-model speculation.");
}
