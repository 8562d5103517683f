/* gateway/cache.c: the semantic cache on the request path (see cache.h). */
#include "gateway/cache.h"

#include "cache/guard.h"
#include "cache/share.h"
#include "cache/store.h"
#include "cache/verifier.h"
#include "common/log.h"
#include "common/time.h"
#include "engine/encoder/bert.h"
#include "engine/encoder/encoder.h"
#include "gateway/cache_key.h"
#include "gateway/json.h"
#include "gateway/mailbox.h"
#include "gateway/openai.h"
#include "gateway/reply.h"
#include "gateway/sse.h"

#include <cjson/cJSON.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define SEARCH_K GW_CACHE_MAX_CANDIDATES  /* room for cache.candidates */
#define REPLAY_PIECE 256           /* bytes of content per replayed stream chunk */
#define MAX_CAPTURE (4u << 20)     /* answers larger than this are not stored */

typedef enum cache_state {
    CS_NONE = 0,   /* not looked at (yet) */
    CS_BYPASS,     /* not cacheable, or Cache-Control: no-cache */
    CS_MISS,
    CS_EXACT,
    CS_SEMANTIC,
} cache_state;

static const char *const state_names[] = {"", "bypass", "miss", "exact", "semantic"};

typedef enum op_kind { OP_LOOKUP, OP_CHECK, OP_EMBED } op_kind;

/* Why a semantic candidate at or above the cosine floor was not served: the guard's verdicts
 * (without a verifier), or the verifier's. */
enum { REJ_GUARD_NEGATION = CACHE_GUARD_NEGATION, REJ_GUARD_IDENTIFIER = CACHE_GUARD_IDENTIFIER,
       REJ_GUARD_SWAP = CACHE_GUARD_SWAP, REJ_VERIFIER, REJ_NO_TOKENS, REJ_TOO_LONG, REJ_COUNT };
static const char *const reject_names[REJ_COUNT] = {
    "", "negation", "identifier", "swap", "below_threshold", "no_tokens", "too_long",
};

typedef struct embed_job embed_job;

/* Work handed to the encoder thread or to Redis; comes back to the loop through the queue (or
 * the share callback). The request may be gone by then: r is NULL. */
typedef struct op {
    gw_letter link;            /* first: ops come back through the mailbox */
    gw_cache *c;
    gw_req *r;                 /* loop thread only */
    op_kind kind;
    /* lookup: inputs copied for the worker */
    uint64_t ns;
    bool search;
    float min_sim;             /* the lowest similarity worth returning */
    char *text;
    size_t len;
    /* results */
    int status;
    float *vec;                /* [dim] */
    int n_tokens;
    const cache_entry *hit;    /* a check's entry (a reference) */
    float sim;                 /* and its similarity */
    const cache_entry *cand[SEARCH_K];  /* a lookup's candidates, best first (references) */
    float cand_sim[SEARCH_K];
    float cand_prob[SEARCH_K];  /* the verifier's probability; < 0: could not be verified */
    int n_cand;
    bool too_long;             /* the text is longer than the encoder reads: no search */
    uint8_t *tok;              /* the text's token vectors (cache_tokens_pack), with a verifier */
    size_t tok_len;
    int n_verified;            /* candidates the verifier scored */
    uint64_t verify_ns;        /* and how long that took */
    cache_state hit_kind;
    /* embeddings */
    embed_job *job;
    int index;
} op;

struct embed_job {
    gw_req *r;                 /* NULL once the request is gone */
    int n, pending;
    int status;                /* first failure */
    float *vecs;               /* [n][dim] */
    long tokens;
    bool base64;
};

/* Per request (r->cache). */
struct gw_cache_req {
    gw_cache_key key;
    bool no_cache, no_store;
    bool lookup;               /* look the request up (cacheable, no Cache-Control: no-cache) */
    bool capture;              /* store the answer when it completes */
    bool exact_tried;
    const cache_entry *cand[SEARCH_K];  /* semantic candidates from the encoder thread */
    float cand_sim[SEARCH_K];
    float cand_prob[SEARCH_K];
    int n_cand;
    bool too_long;             /* the question is longer than the encoder reads: stored without
                                  its vector (exact hits only) */
    uint8_t *tok;              /* the question's token vectors, stored with the answer */
    size_t tok_len;
    int n_verified;
    uint64_t verify_ns;
    float confidence;          /* the served candidate's verifier probability; < 0: none */
    cache_state state;         /* what the client was told (x-llmgw-cache) */
    gw_cache_step outcome;     /* of the last lookup step */
    cJSON *stored;             /* a hit's stored answer, parsed */
    uint64_t hit_id;
    cache_state hit_kind;
    int rejected[REJ_COUNT];   /* semantic candidates refused, by reason */
    float sim;
    float *vec;                /* [dim] once embedded */
    uint64_t t0;
    op *pending;               /* the op in flight, if any */
    /* the answer as the client got it */
    char *json;                /* non-stream body */
    size_t json_len;
    struct evbuffer *content;  /* stream: delta contents */
    bool saw_done, broken;
    char finish[32];
    char *model, *fingerprint;
    long usage_prompt, usage_completion;
    bool have_usage;
};

struct gw_cache {
    gw_server *srv;
    const gw_cache_cfg *cfg;
    eng_bert *bert;
    eng_encoder *encoder;
    int dim;
    const char *encoder_name;
    cache_store *store;        /* NULL when the cache is off (encoder only) */
    cache_verifier *verifier;  /* NULL: the cosine (and the guard) decide */
    double verify_threshold;   /* the operating point for cfg->max_false_hit_rate */
    cache_share *share;
    struct event *expire_timer;
    gw_mailbox *mail;          /* finished ops, for the loop */
    bool redis_up;
    uint64_t insert_fail_logged;
};

/* ---- the queue from the encoder thread to the loop --------------------------------------- */

static void post(gw_cache *c, op *o)
{
    gw_mailbox_post(c->mail, &o->link);
}

static void op_free(op *o)
{
    if (o == NULL)
        return;
    cache_entry_release(o->hit);
    for (int i = 0; i < o->n_cand; i++)
        cache_entry_release(o->cand[i]);
    free(o->text);
    free(o->vec);
    free(o->tok);
    free(o);
}

/* On the encoder thread: the verifier scores each candidate against the query. */
static void verify(gw_cache *c, op *o)
{
    uint64_t t0 = util_now_ns();
    cache_verifier_side q = {.text = o->text, .len = o->len, .vec = o->vec, .tok = o->tok,
                             .tok_len = o->tok_len};
    float f[CACHE_VERIFIER_FEATURES];
    for (int i = 0; i < o->n_cand; i++) {
        const cache_entry *e = o->cand[i];
        cache_verifier_side s = {.text = e->question, .len = strlen(e->question), .vec = e->vec,
                                 .tok = e->tok, .tok_len = e->tok_len};
        o->cand_prob[i] = -1;
        if (o->tok == NULL || e->tok == NULL ||
            cache_verifier_features(&q, &s, c->dim, f) != 0)
            continue;
        o->cand_prob[i] = (float)cache_verifier_prob(c->verifier, f);
        o->n_verified++;
    }
    o->verify_ns = util_now_ns() - t0;
}

/* On the encoder thread: keep the vector (and, with a verifier, the token vectors) and, for a
 * lookup, search the namespace and verify its candidates right here, so the loop never runs a
 * FAISS search or the verifier (o->min_sim is the lowest similarity worth returning; the loop
 * applies the route's floor and the operating point). */
static void on_encoded(void *user, int status, const eng_encoded *x)
{
    op *o = user;
    gw_cache *c = o->c;
    o->status = status;
    if (status == 0) {
        o->n_tokens = x->n_tokens;
        o->vec = util_xmalloc((size_t)x->dim * sizeof *o->vec);
        memcpy(o->vec, x->vec, (size_t)x->dim * sizeof *x->vec);
        if (o->kind == OP_LOOKUP && c->verifier != NULL)
            o->tok = cache_tokens_pack(x->tokens, x->n_tokens, x->dim, &o->tok_len);
        /* The encoder reads the first max_tokens tokens only: two texts that share them (a
         * long passage with different questions after it) embed alike. Such texts get exact
         * hits only: no search, and stored without a vector (see store_answer), so they never
         * serve as another's semantic hit either. */
        if (o->kind == OP_LOOKUP)
            o->too_long = x->n_tokens >= eng_bert_max_tokens(c->bert) &&
                          !eng_bert_fits(c->bert, o->text, o->len);
        if (o->kind == OP_LOOKUP && o->search && !o->too_long) {
            util_err err = {0};
            int n = cache_store_search(c->store, o->ns, x->vec, o->min_sim, c->cfg->candidates,
                                       (int64_t)util_wall_ms(), o->cand, o->cand_sim, &err);
            o->n_cand = n > 0 ? n : 0;
            if (c->verifier != NULL && o->n_cand > 0)
                verify(c, o);
        }
    }
    post(c, o);
}

/* ---- serving a hit ------------------------------------------------------------------------ */

static double secs_since(uint64_t t0)
{
    return (double)(util_now_ns() - t0) / 1e9;
}

static void new_completion_id(const gw_req *r, char *out, size_t cap)
{
    snprintf(out, cap, "chatcmpl-%s", r->id);
}

/* A stored chat.completion replayed as the chunks a streaming call would have produced. */
static void replay_stream(gw_req *r, const cJSON *stored)
{
    char id[96];
    new_completion_id(r, id, sizeof id);
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(stored, "model");
    const cJSON *fp = cJSON_GetObjectItemCaseSensitive(stored, "system_fingerprint");
    gw_openai_head h = {.id = id, .chat = true, .created = util_wall_ms() / 1000,
                        .model = cJSON_IsString(model) ? model->valuestring : "",
                        .fingerprint = cJSON_IsString(fp) ? fp->valuestring : NULL};
    const cJSON *choice = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(stored, "choices"), 0);
    const cJSON *msg = cJSON_GetObjectItemCaseSensitive(choice, "message");
    const cJSON *content = cJSON_GetObjectItemCaseSensitive(msg, "content");
    const cJSON *finish = cJSON_GetObjectItemCaseSensitive(choice, "finish_reason");
    const cJSON *calls = cJSON_GetObjectItemCaseSensitive(msg, "tool_calls");
    struct evbuffer *b = evbuffer_new();
    gw_stream_begin(r, 200, "text/event-stream");
    gw_openai_chunk(b, &h, &(gw_openai_step){.role = true, .text = "", .len = 0});
    gw_stream_buffer(r, b);
    if (cJSON_IsString(content)) {
        const char *s = content->valuestring;
        size_t len = strlen(s), at = 0;
        while (at < len) {
            size_t n = len - at < REPLAY_PIECE ? len - at : REPLAY_PIECE;
            while (at + n < len && ((unsigned char)s[at + n] & 0xC0) == 0x80)
                n--;  /* never split a UTF-8 sequence */
            gw_openai_chunk(b, &h, &(gw_openai_step){.text = s + at, .len = n});
            gw_stream_buffer(r, b);
            at += n;
        }
    }
    if (cJSON_IsArray(calls)) {
        int i = 0;
        for (const cJSON *call = calls->child; call != NULL; call = call->next, i++) {
            cJSON *tc = cJSON_Duplicate(call, 1);
            cJSON_DeleteItemFromObjectCaseSensitive(tc, "index");
            cJSON_AddNumberToObject(tc, "index", i);
            cJSON *arr = cJSON_CreateArray();
            cJSON_AddItemToArray(arr, tc);
            char *text = cJSON_PrintUnformatted(arr);
            cJSON_Delete(arr);
            gw_openai_chunk(b, &h, &(gw_openai_step){.tool_calls = text});
            free(text);
            gw_stream_buffer(r, b);
        }
    }
    gw_openai_chunk(b, &h, &(gw_openai_step){
        .finish = cJSON_IsString(finish) ? finish->valuestring : "stop"});
    gw_stream_buffer(r, b);
    if (r->body.include_usage) {
        const cJSON *u = cJSON_GetObjectItemCaseSensitive(stored, "usage");
        char *text = u != NULL ? cJSON_PrintUnformatted(u) : NULL;
        gw_openai_usage_chunk_raw(b, &h, text);
        free(text);
        gw_stream_buffer(r, b);
    }
    evbuffer_free(b);
    gw_stream_event(r, GW_SSE_DONE, strlen(GW_SSE_DONE));
    gw_stream_end(r);
}

static void count(gw_req *r, const char *name, const char *labels)
{
    gw_metrics_add(r->srv->metrics, name, labels, 1);
}

/* The decision on a candidate: takes the reference e. Its stored answer must be a JSON object
 * (else the entry is dropped and this is a miss). */
static void take(gw_req *r, const cache_entry *e, cache_state kind, float sim, float confidence)
{
    gw_cache *c = r->srv->cache;
    struct gw_cache_req *cr = r->cache;
    cJSON *stored = cJSON_ParseWithLength(e->response, e->response_len);
    if (!cJSON_IsObject(stored)) {
        UTIL_LOG_WARN("cache", "%s: entry %016llx holds no JSON object; dropped", r->id,
                      (unsigned long long)e->id);
        cache_store_remove(c->store, e->id);
        cJSON_Delete(stored);
        cache_entry_release(e);
        cr->outcome = GW_CACHE_MISS;
        return;
    }
    cr->stored = stored;
    cr->hit_id = e->id;
    cr->hit_kind = kind;
    cr->sim = sim;
    cr->confidence = confidence;
    cr->outcome = GW_CACHE_HIT;
    cache_entry_release(e);
}

static void check_done(void *user, int res);

/* A candidate from the exact map or FAISS: re-checked against Redis when sharing is on. */
static gw_cache_step candidate(gw_req *r, const cache_entry *e, cache_state kind, float sim,
                               float confidence)
{
    gw_cache *c = r->srv->cache;
    if (c->share != NULL && cache_share_up(c->share)) {
        op *o = util_xcalloc(1, sizeof *o);
        o->c = c;
        o->r = r;
        o->kind = OP_CHECK;
        o->hit = e;
        o->sim = sim;
        o->cand_prob[0] = confidence;
        o->hit_kind = kind;
        r->cache->pending = o;
        r->cache->outcome = GW_CACHE_PENDING;
        cache_share_check(c->share, e->id, check_done, o);
        return GW_CACHE_PENDING;
    }
    take(r, e, kind, sim, confidence);
    return r->cache->outcome;
}

static void check_done(void *user, int res)
{
    op *o = user;
    gw_req *r = o->r;
    if (r == NULL) {
        op_free(o);
        return;
    }
    struct gw_cache_req *cr = r->cache;
    cr->pending = NULL;
    const cache_entry *e = o->hit;
    o->hit = NULL;
    cache_state kind = o->hit_kind;
    float sim = o->sim, confidence = o->cand_prob[0];
    op_free(o);
    if (res != 0) {  /* present, or Redis cannot say: the local entry is still within its TTL */
        take(r, e, kind, sim, confidence);
    } else {
        /* Deleted or expired elsewhere: forget it here too. */
        count(r, "llmgw_cache_stale_total", NULL);
        cache_store_remove(r->srv->cache->store, e->id);
        cache_entry_release(e);
        cr->outcome = GW_CACHE_MISS;
    }
    r->srv->hooks.cache_done(r);
}

/* ---- capturing a miss's answer (an output filter) ----------------------------------------- */

static void capture_body(gw_req *r, void *ctx, int status, const char *body, size_t len)
{
    struct gw_cache_req *cr = ctx;
    if (!cr->capture || r->body.stream)
        return;
    if (status != 200 || len > MAX_CAPTURE || cr->json != NULL) {
        cr->capture = false;
        return;
    }
    cr->json = util_xstrndup(body, len);
    cr->json_len = len;
}

static void store(gw_req *r, struct gw_cache_req *cr);

/* An engine tier's chunk: what it says is given, nothing to parse. */
static void capture_info(struct gw_cache_req *cr, const gw_stream_info *info)
{
    if (info->index > 0) {
        cr->capture = false;  /* n > 1: one answer per entry */
        return;
    }
    if (cr->model == NULL && info->model != NULL)
        cr->model = util_xstrdup(info->model);
    if (cr->fingerprint == NULL && info->fingerprint != NULL)
        cr->fingerprint = util_xstrdup(info->fingerprint);
    if (info->usage) {
        cr->usage_prompt = info->prompt_tokens;
        cr->usage_completion = info->completion_tokens;
        cr->have_usage = true;
        return;
    }
    if (cr->content == NULL)
        cr->content = evbuffer_new();
    if (info->text != NULL)
        evbuffer_add(cr->content, info->text, info->len);
    if (info->finish != NULL)
        snprintf(cr->finish, sizeof cr->finish, "%s", info->finish);
    if (evbuffer_get_length(cr->content) > MAX_CAPTURE)
        cr->capture = false;
}

static void capture_event(gw_req *r, void *ctx, const char *data, size_t len,
                          const gw_stream_info *info)
{
    struct gw_cache_req *cr = ctx;
    if (!cr->capture || !r->body.stream)
        return;
    if (info != NULL) {
        capture_info(cr, info);
        return;
    }
    if (len == 6 && !memcmp(data, "[DONE]", 6)) {
        /* Stored now, before the client reads [DONE] and asks again. */
        cr->saw_done = true;
        store(r, cr);
        cr->capture = false;
        return;
    }
    cJSON *o = cJSON_ParseWithLength(data, len);
    if (!cJSON_IsObject(o) || cJSON_GetObjectItemCaseSensitive(o, "error") != NULL) {
        cr->broken = true;
        cr->capture = false;
        cJSON_Delete(o);
        return;
    }
    if (cr->content == NULL)
        cr->content = evbuffer_new();
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(o, "model");
    if (cr->model == NULL && cJSON_IsString(model))
        cr->model = util_xstrdup(model->valuestring);
    const cJSON *fp = cJSON_GetObjectItemCaseSensitive(o, "system_fingerprint");
    if (cr->fingerprint == NULL && cJSON_IsString(fp))
        cr->fingerprint = util_xstrdup(fp->valuestring);
    const cJSON *u = cJSON_GetObjectItemCaseSensitive(o, "usage");
    if (cJSON_IsObject(u)) {
        const cJSON *p = cJSON_GetObjectItemCaseSensitive(u, "prompt_tokens");
        const cJSON *k = cJSON_GetObjectItemCaseSensitive(u, "completion_tokens");
        if (cJSON_IsNumber(p) && cJSON_IsNumber(k)) {
            cr->usage_prompt = (long)p->valuedouble;
            cr->usage_completion = (long)k->valuedouble;
            cr->have_usage = true;
        }
    }
    const cJSON *choices = cJSON_GetObjectItemCaseSensitive(o, "choices");
    if (cJSON_GetArraySize(choices) > 1) {
        cr->capture = false;
    } else if (cJSON_GetArraySize(choices) == 1) {
        const cJSON *ch = cJSON_GetArrayItem(choices, 0);
        const cJSON *delta = cJSON_GetObjectItemCaseSensitive(ch, "delta");
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(delta, "content");
        if (cJSON_IsString(text))
            evbuffer_add(cr->content, text->valuestring, strlen(text->valuestring));
        const cJSON *calls = cJSON_GetObjectItemCaseSensitive(delta, "tool_calls");
        if (cJSON_IsArray(calls) && cJSON_GetArraySize(calls) > 0)
            cr->capture = false;  /* streamed tool calls are not reassembled for the cache */
        const cJSON *finish = cJSON_GetObjectItemCaseSensitive(ch, "finish_reason");
        if (cJSON_IsString(finish))
            snprintf(cr->finish, sizeof cr->finish, "%s", finish->valuestring);
        if (evbuffer_get_length(cr->content) > MAX_CAPTURE)
            cr->capture = false;
    }
    cJSON_Delete(o);
}

/* The stored form of a streamed answer: the chat.completion object a non-stream call returns. */
static char *assemble_stream(struct gw_cache_req *cr, const gw_req *r)
{
    cJSON *o = cJSON_CreateObject();
    char id[96];
    new_completion_id(r, id, sizeof id);
    cJSON_AddStringToObject(o, "id", id);
    cJSON_AddStringToObject(o, "object", "chat.completion");
    cJSON_AddNumberToObject(o, "created", (double)(util_wall_ms() / 1000));
    cJSON_AddStringToObject(o, "model", cr->model ? cr->model : r->body.model);
    if (cr->fingerprint)
        cJSON_AddStringToObject(o, "system_fingerprint", cr->fingerprint);
    cJSON *choices = cJSON_AddArrayToObject(o, "choices");
    cJSON *ch = cJSON_CreateObject();
    cJSON_AddItemToArray(choices, ch);
    cJSON_AddNumberToObject(ch, "index", 0);
    cJSON *msg = cJSON_AddObjectToObject(ch, "message");
    cJSON_AddStringToObject(msg, "role", "assistant");
    size_t n = cr->content ? evbuffer_get_length(cr->content) : 0;
    char *text = util_xmalloc(n + 1);
    if (n > 0)
        evbuffer_copyout(cr->content, text, n);
    text[n] = '\0';
    cJSON_AddStringToObject(msg, "content", text);
    free(text);
    cJSON_AddNullToObject(ch, "logprobs");
    cJSON_AddStringToObject(ch, "finish_reason", cr->finish);
    long pt = cr->have_usage ? cr->usage_prompt : r->prompt_tokens;
    long ct = cr->have_usage ? cr->usage_completion : r->completion_tokens;
    if (cr->have_usage || pt || ct) {
        cJSON *u = cJSON_AddObjectToObject(o, "usage");
        cJSON_AddNumberToObject(u, "prompt_tokens", (double)pt);
        cJSON_AddNumberToObject(u, "completion_tokens", (double)ct);
        cJSON_AddNumberToObject(u, "total_tokens", (double)(pt + ct));
    }
    char *out = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return out;
}

/* A non-stream body is stored as sent, if it is one complete choice without tool calls. */
static bool storable_json(const gw_cache *c, const char *body, size_t len)
{
    cJSON *o = cJSON_ParseWithLength(body, len);
    const cJSON *choices = cJSON_GetObjectItemCaseSensitive(o, "choices");
    const cJSON *ch = cJSON_GetArrayItem(choices, 0);
    const cJSON *msg = cJSON_GetObjectItemCaseSensitive(ch, "message");
    const cJSON *finish = cJSON_GetObjectItemCaseSensitive(ch, "finish_reason");
    const cJSON *calls = cJSON_GetObjectItemCaseSensitive(msg, "tool_calls");
    bool ok = cJSON_IsObject(o) && cJSON_GetArraySize(choices) == 1 && cJSON_IsObject(msg) &&
              cJSON_IsString(finish) &&
              (c->cfg->cache_tool_calls || !cJSON_IsArray(calls) || cJSON_GetArraySize(calls) == 0);
    cJSON_Delete(o);
    return ok;
}

static uint64_t random_id(void)
{
    uint64_t id = 0;
    while (id == 0) {
        if (RAND_bytes((unsigned char *)&id, sizeof id) != 1)
            id = util_now_ns() ^ ((uint64_t)util_wall_ms() << 20);
        id &= 0x7fffffffffffffffull;
    }
    return id;
}

/* Stores a complete captured answer. */
static void store(gw_req *r, struct gw_cache_req *cr)
{
    gw_cache *c = r->srv->cache;
    if (!cr->capture || cr->vec == NULL || r->status != 200 || r->client_gone || r->fell_back)
        return;
    char *response = NULL;
    if (r->body.stream) {
        if (!cr->saw_done || cr->broken || cr->finish[0] == '\0')
            return;  /* a stream cut short is not an answer */
        response = assemble_stream(cr, r);
    } else {
        if (cr->json == NULL || !storable_json(c, cr->json, cr->json_len))
            return;
        response = cr->json;
        cr->json = NULL;
    }
    /* Never keep (and so never replay to every later asker) bytes that are not UTF-8: an
     * upstream that cut a character in two is answered once, not forever. */
    if (!gw_utf8_valid(response, strlen(response))) {
        count(r, "llmgw_cache_refused_total", "reason=\"invalid_utf8\"");
        free(response);
        return;
    }
    int64_t now = (int64_t)util_wall_ms();
    char *question = util_xstrndup(cr->key.text, cr->key.text_len);
    cache_entry e = {
        .id = random_id(),
        .ns = cr->key.ns,
        .exact = cr->key.exact,
        .created_ms = now,
        .expires_ms = now + c->cfg->ttl_s * 1000,
        .question = question,
        .vec = cr->too_long ? NULL : cr->vec,  /* exact hits only (on_encoded) */
        .dim = c->dim,
        .tok = cr->too_long ? NULL : cr->tok,
        .tok_len = cr->too_long ? 0 : cr->tok_len,
        .response = response,
        .response_len = strlen(response),
    };
    util_err err = {0};
    if (cache_store_put(c->store, &e, now, &err) == 0) {
        count(r, "llmgw_cache_insertions_total", NULL);
        if (c->share != NULL)
            cache_share_publish(c->share, &e);
    } else if (c->insert_fail_logged++ < 5) {
        UTIL_LOG_WARN("cache", "%s: not stored: %s", r->id, err.msg);
    }
    free(question);
    free(response);
}

static void capture_end(gw_req *r, void *ctx)
{
    store(r, ctx);
}

static void cache_headers(gw_req *r, void *ctx)
{
    struct gw_cache_req *cr = ctx;
    if (cr->state == CS_NONE)
        return;
    gw_reply_header(r, "x-llmgw-cache", state_names[cr->state]);
    if (cr->state == CS_EXACT || cr->state == CS_SEMANTIC) {
        char sim[32];
        snprintf(sim, sizeof sim, "%.4f", cr->sim);
        gw_reply_header(r, "x-llmgw-cache-similarity", sim);
        if (cr->confidence >= 0) {
            snprintf(sim, sizeof sim, "%.4f", cr->confidence);
            gw_reply_header(r, "x-llmgw-cache-confidence", sim);
        }
    }
}

static const gw_filter cache_filter = {.headers = cache_headers, .body = capture_body,
                                       .event = capture_event, .end = capture_end};

/* ---- the lookup (the pipeline drives it) -------------------------------------------------- */

void gw_cache_prepare(gw_req *r, int rule_cache, bool may_store)
{
    gw_cache *c = r->srv->cache;
    if (c == NULL || r->body.ep != GW_EP_CHAT || r->cache != NULL)
        return;
    struct gw_cache_req *cr = util_xcalloc(1, sizeof *cr);
    r->cache = cr;
    cr->t0 = util_now_ns();
    gw_reply_filter(r, &cache_filter, cr);
    if (c->store == NULL)
        return;  /* the encoder only (for the router's classifier) */
    gw_cache_control_parse(gw_request_header(r, "Cache-Control"), &cr->no_cache, &cr->no_store);
    /* The namespace holds the requested model, not the tier the router picks: a policy edit that
     * moves traffic between tiers keeps the cache. */
    gw_cache_key_derive(&r->body, r->group, r->body.model, c->cfg->max_temperature, &cr->key);
    if (!cr->key.cacheable || (cr->no_cache && cr->no_store) || rule_cache == 0) {
        cr->state = CS_BYPASS;
        return;
    }
    cr->capture = !cr->no_store && may_store;
    cr->lookup = !cr->no_cache;
    if (!cr->lookup)
        cr->state = CS_BYPASS;
}

gw_cache_step gw_cache_exact(gw_req *r)
{
    struct gw_cache_req *cr = r->cache;
    if (cr == NULL || !cr->lookup || cr->exact_tried)
        return GW_CACHE_MISS;
    cr->exact_tried = true;
    const cache_entry *e = cache_store_get_exact(r->srv->cache->store, cr->key.ns, cr->key.exact,
                                                 (int64_t)util_wall_ms());
    if (e == NULL)
        return GW_CACHE_MISS;
    return candidate(r, e, CS_EXACT, 1.0f, -1);
}

bool gw_cache_wants_embedding(const gw_req *r)
{
    const struct gw_cache_req *cr = r->cache;
    return cr != NULL && cr->vec == NULL && (cr->lookup || cr->capture);
}

const float *gw_cache_vec(const gw_req *r)
{
    return r->cache != NULL ? r->cache->vec : NULL;
}

void gw_cache_disable(gw_req *r)
{
    struct gw_cache_req *cr = r->cache;
    if (cr == NULL || (!cr->lookup && !cr->capture))
        return;
    cr->lookup = cr->capture = false;
    cr->state = CS_BYPASS;
}

bool gw_cache_embed(gw_req *r)
{
    gw_cache *c = r->srv->cache;
    struct gw_cache_req *cr = r->cache;
    if (c == NULL || cr == NULL)
        return false;
    const char *text;
    size_t len;
    if (cr->key.text != NULL) {
        text = cr->key.text;
        len = cr->key.text_len;
    } else {
        const gw_message *u = gw_request_last_user(&r->body);
        text = u ? u->text : (r->body.prompt ? r->body.prompt : "");
        len = u ? u->text_len : strlen(text);
    }
    op *o = util_xcalloc(1, sizeof *o);
    o->c = c;
    o->r = r;
    o->kind = OP_LOOKUP;
    o->ns = cr->key.ns;
    o->search = cr->lookup;
    /* Candidates from here up come back; the route's own threshold is applied on the loop. */
    o->min_sim = (float)(c->cfg->threshold < 0.8 ? c->cfg->threshold : 0.8);
    o->text = util_xstrndup(text, len);
    o->len = len;
    cr->pending = o;
    if (eng_encoder_submit(c->encoder, o->text, o->len, on_encoded, o) != 0) {
        /* The encoder is saturated: answer without the cache rather than queue forever. */
        cr->pending = NULL;
        op_free(o);
        count(r, "llmgw_encoder_rejected_total", NULL);
        gw_cache_disable(r);
        return false;
    }
    return true;
}

static void lookup_done(op *o)
{
    gw_req *r = o->r;
    struct gw_cache_req *cr = r->cache;
    cr->pending = NULL;
    if (o->status != 0) {
        UTIL_LOG_WARN("cache", "%s: encoding failed (%s); answering without the cache", r->id,
                      util_err_name(o->status));
        op_free(o);
        gw_cache_disable(r);
        r->srv->hooks.cache_done(r);
        return;
    }
    cr->vec = o->vec;
    o->vec = NULL;
    memcpy(cr->cand, o->cand, sizeof cr->cand);
    memcpy(cr->cand_sim, o->cand_sim, sizeof cr->cand_sim);
    memcpy(cr->cand_prob, o->cand_prob, sizeof cr->cand_prob);
    cr->n_cand = o->n_cand;
    cr->too_long = o->too_long;
    o->n_cand = 0;
    cr->tok = o->tok;
    cr->tok_len = o->tok_len;
    o->tok = NULL;
    cr->n_verified = o->n_verified;
    cr->verify_ns = o->verify_ns;
    op_free(o);
    r->srv->hooks.cache_done(r);
}

gw_cache_step gw_cache_semantic(gw_req *r, double threshold, double max_false_hit_rate)
{
    gw_cache *c = r->srv->cache;
    struct gw_cache_req *cr = r->cache;
    if (cr != NULL && cr->lookup && cr->too_long)
        cr->rejected[REJ_TOO_LONG] = 1;  /* one skipped lookup, however often asked */
    if (cr == NULL || !cr->lookup || cr->n_cand == 0)
        return GW_CACHE_MISS;
    if (threshold < 0)
        threshold = c->cfg->threshold;
    double operating = c->verify_threshold;
    if (c->verifier != NULL && max_false_hit_rate >= 0)
        operating = cache_verifier_threshold(c->verifier, max_false_hit_rate, NULL);
    /* Without a verifier: the most similar candidate the guard lets through. With one: the
     * candidate it is surest of, at or above the operating point (the guard's signals are among
     * its features). Either way only candidates at or above the cosine floor count. */
    int best = -1;
    for (int i = 0; i < cr->n_cand; i++) {
        const cache_entry *e = cr->cand[i];
        if (cr->cand_sim[i] < threshold)
            continue;
        if (c->verifier != NULL) {
            if (cr->cand_prob[i] < 0)
                cr->rejected[REJ_NO_TOKENS]++;
            else if (cr->cand_prob[i] < operating)
                cr->rejected[REJ_VERIFIER]++;
            else if (best < 0 || cr->cand_prob[i] > cr->cand_prob[best])
                best = i;
            continue;
        }
        if (best >= 0)
            continue;
        cache_guard_verdict v = c->cfg->guard ? cache_guard_check(cr->key.text, cr->key.text_len,
                                                                  e->question,
                                                                  strlen(e->question))
                                              : CACHE_GUARD_OK;
        if (v == CACHE_GUARD_OK)
            best = i;
        else
            cr->rejected[v]++;
    }
    const cache_entry *hit = best >= 0 ? cr->cand[best] : NULL;
    float sim = best >= 0 ? cr->cand_sim[best] : 0;
    float confidence = best >= 0 && c->verifier != NULL ? cr->cand_prob[best] : -1;
    for (int i = 0; i < cr->n_cand; i++) {
        if (i != best)
            cache_entry_release(cr->cand[i]);
        cr->cand[i] = NULL;
    }
    cr->n_cand = 0;
    if (hit == NULL)
        return GW_CACHE_MISS;
    return candidate(r, hit, CS_SEMANTIC, sim, confidence);
}

gw_cache_step gw_cache_outcome(const gw_req *r)
{
    return r->cache != NULL ? r->cache->outcome : GW_CACHE_MISS;
}

void gw_cache_forget_hit(gw_req *r)
{
    struct gw_cache_req *cr = r->cache;
    if (cr == NULL)
        return;
    cJSON_Delete(cr->stored);
    cr->stored = NULL;
    cr->outcome = GW_CACHE_MISS;
}

bool gw_cache_looked_up(const gw_req *r)
{
    return r->cache != NULL && r->cache->lookup;
}

void gw_cache_hit_info(const gw_req *r, const char **kind, double *similarity, long *prompt,
                       long *completion)
{
    const struct gw_cache_req *cr = r->cache;
    const cJSON *u = cJSON_GetObjectItemCaseSensitive(cr->stored, "usage");
    const cJSON *pt = cJSON_GetObjectItemCaseSensitive(u, "prompt_tokens");
    const cJSON *ct = cJSON_GetObjectItemCaseSensitive(u, "completion_tokens");
    *kind = state_names[cr->hit_kind];
    *similarity = cr->sim;
    *prompt = cJSON_IsNumber(pt) ? (long)pt->valuedouble : 0;
    *completion = cJSON_IsNumber(ct) ? (long)ct->valuedouble : 0;
}

void gw_cache_account(gw_req *r)
{
    struct gw_cache_req *cr = r->cache;
    if (cr == NULL)
        return;
    if (cr->outcome == GW_CACHE_HIT)
        cr->state = cr->hit_kind;
    else if (cr->lookup)
        cr->state = CS_MISS;
    if (cr->state == CS_BYPASS) {
        count(r, "llmgw_cache_bypass_total", NULL);
        return;
    }
    if (cr->state == CS_NONE)
        return;
    count(r, "llmgw_cache_lookups_total", NULL);
    if (cr->state == CS_MISS)
        count(r, "llmgw_cache_misses_total", NULL);
    else
        count(r, "llmgw_cache_hits_total", cr->state == CS_EXACT ? "kind=\"exact\""
                                                                 : "kind=\"semantic\"");
    gw_metrics_observe(r->srv->metrics, "llmgw_cache_lookup_duration_seconds", NULL,
                       secs_since(cr->t0));
    for (int v = 1; v < REJ_COUNT; v++) {
        if (cr->rejected[v] == 0)
            continue;
        char labels[48];
        snprintf(labels, sizeof labels, "reason=\"%s\"", reject_names[v]);
        gw_metrics_add(r->srv->metrics, v == REJ_TOO_LONG ? "llmgw_cache_too_long_total"
                                        : v < REJ_VERIFIER ? "llmgw_cache_guard_rejects_total"
                                                           : "llmgw_cache_verifier_rejects_total",
                       v == REJ_TOO_LONG ? NULL : labels, cr->rejected[v]);
    }
    if (cr->n_verified > 0) {
        gw_metrics_add(r->srv->metrics, "llmgw_cache_verifier_calls_total", NULL,
                       cr->n_verified);
        gw_metrics_observe(r->srv->metrics, "llmgw_cache_verifier_duration_seconds", NULL,
                           (double)cr->verify_ns / 1e9);
    }
}

void gw_cache_serve(gw_req *r)
{
    gw_cache *c = r->srv->cache;
    struct gw_cache_req *cr = r->cache;
    cJSON *stored = cr->stored;
    cr->stored = NULL;
    cr->capture = false;
    cr->state = cr->hit_kind;
    cache_store_touch(c->store, cr->hit_id);
    if (r->body.stream) {
        replay_stream(r, stored);
        cJSON_Delete(stored);
        return;
    }
    char id[96];
    new_completion_id(r, id, sizeof id);
    cJSON_ReplaceItemInObjectCaseSensitive(stored, "id", cJSON_CreateString(id));
    cJSON_ReplaceItemInObjectCaseSensitive(stored, "created",
                                           cJSON_CreateNumber((double)(util_wall_ms() / 1000)));
    gw_reply_json(r, 200, stored);
}

void gw_cache_release(gw_req *r)
{
    struct gw_cache_req *cr = r->cache;
    if (cr != NULL) {
        if (cr->pending != NULL)
            cr->pending->r = NULL;
        for (int i = 0; i < cr->n_cand; i++)
            cache_entry_release(cr->cand[i]);
        cJSON_Delete(cr->stored);
        free(cr->vec);
        free(cr->tok);
        free(cr->json);
        if (cr->content)
            evbuffer_free(cr->content);
        free(cr->model);
        free(cr->fingerprint);
        free(cr);
        r->cache = NULL;
    }
    if (r->embed != NULL) {
        r->embed->r = NULL;
        r->embed = NULL;
    }
}

const char *gw_cache_state_name(const gw_req *r)
{
    return r->cache != NULL && r->cache->state != CS_NONE ? state_names[r->cache->state] : NULL;
}

/* ---- /v1/embeddings ----------------------------------------------------------------------- */

bool gw_cache_serves_embeddings(const gw_cache *c, const char *model)
{
    return c != NULL && c->encoder != NULL && model != NULL && !strcmp(model, c->encoder_name);
}

static void embed_reply(gw_req *r, embed_job *job)
{
    gw_cache *c = r->srv->cache;
    if (job->status != 0) {
        if (job->status == LLMGW_EBUSY)
            gw_reply_error(r, 503, "server_error", NULL, "encoder_overloaded",
                           "The embedding model has too many texts waiting; retry later.");
        else
            gw_reply_error(r, 500, "server_error", NULL, "encoder_error",
                           "The embedding model failed (%s).", util_err_name(job->status));
        return;
    }
    struct evbuffer *b = evbuffer_new();
    evbuffer_add_printf(b, "{\"object\":\"list\",\"data\":[");
    size_t raw = (size_t)c->dim * sizeof(float);
    char *b64 = job->base64 ? util_xmalloc(4 * ((raw + 2) / 3) + 1) : NULL;
    for (int i = 0; i < job->n; i++) {
        const float *v = job->vecs + (size_t)i * (size_t)c->dim;
        evbuffer_add_printf(b, "%s{\"object\":\"embedding\",\"index\":%d,\"embedding\":",
                            i ? "," : "", i);
        if (job->base64) {
            EVP_EncodeBlock((unsigned char *)b64, (const unsigned char *)v, (int)raw);
            evbuffer_add_printf(b, "\"%s\"}", b64);
            continue;
        }
        evbuffer_add(b, "[", 1);
        for (int d = 0; d < c->dim; d++)
            evbuffer_add_printf(b, d ? ",%.9g" : "%.9g", (double)v[d]);
        evbuffer_add(b, "]}", 2);
    }
    free(b64);
    evbuffer_add_printf(b, "],\"model\":");
    gw_json_print_string(c->encoder_name, b);  /* a config string: escaped like any other */
    evbuffer_add_printf(b, ",\"usage\":{\"prompt_tokens\":%ld,\"total_tokens\":%ld}}\n",
                        job->tokens, job->tokens);
    r->prompt_tokens = job->tokens;
    gw_reply_body(r, 200, "application/json", b);
    evbuffer_free(b);
}

static void embed_done(op *o)
{
    embed_job *job = o->job;
    gw_cache *c = o->c;
    if (o->status != 0 && job->status == 0)
        job->status = o->status;
    if (o->status == 0) {
        memcpy(job->vecs + (size_t)o->index * (size_t)c->dim, o->vec,
               (size_t)c->dim * sizeof(float));
        job->tokens += o->n_tokens;
    }
    op_free(o);
    if (--job->pending > 0)
        return;
    gw_req *r = job->r;
    if (r != NULL) {
        r->embed = NULL;
        embed_reply(r, job);
    }
    free(job->vecs);
    free(job);
}

void gw_embeddings_start(gw_req *r)
{
    gw_cache *c = r->srv->cache;
    const cJSON *input = cJSON_GetObjectItemCaseSensitive(r->body.json, "input");
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(r->body.json, "encoding_format");
    const cJSON *dims = cJSON_GetObjectItemCaseSensitive(r->body.json, "dimensions");
    bool base64 = false;
    if (fmt != NULL && !cJSON_IsNull(fmt)) {
        if (cJSON_IsString(fmt) && !strcmp(fmt->valuestring, "base64")) {
            base64 = true;
        } else if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, "float") != 0) {
            gw_reply_error(r, 400, "invalid_request_error", "encoding_format", "invalid_value",
                           "'encoding_format' must be 'float' or 'base64'.");
            return;
        }
    }
    if (dims != NULL && !cJSON_IsNull(dims) &&
        (!cJSON_IsNumber(dims) || dims->valuedouble != (double)c->dim)) {
        gw_reply_error(r, 400, "invalid_request_error", "dimensions", "invalid_value",
                       "Model '%s' produces %d dimensions; it cannot change that.",
                       c->encoder_name, c->dim);
        return;
    }
    int n = cJSON_IsString(input) ? 1 : cJSON_GetArraySize(input);
    for (int i = 0; cJSON_IsArray(input) && i < n; i++) {
        if (!cJSON_IsString(cJSON_GetArrayItem(input, i))) {
            gw_reply_error(r, 400, "invalid_request_error", "input", "invalid_type",
                           "Model '%s' takes text: 'input' must be a string or an array of "
                           "strings (token arrays are not accepted).", c->encoder_name);
            return;
        }
    }
    /* A text longer than the encoder's window is refused unless the request asks for it to be
     * cut (the llmgw extension "truncate": true, as sentence-transformers cuts): an embedding
     * of the first 256 tokens of a 3 MB document must not pass for the document's. */
    const cJSON *trunc = cJSON_GetObjectItemCaseSensitive(r->body.json, "truncate");
    if (!cJSON_IsTrue(trunc)) {
        for (int i = 0; i < n; i++) {
            const cJSON *s = cJSON_IsString(input) ? input : cJSON_GetArrayItem(input, i);
            if (eng_bert_fits(c->bert, s->valuestring, strlen(s->valuestring)))
                continue;
            char param[32];
            snprintf(param, sizeof param, cJSON_IsString(input) ? "input" : "input.[%d]", i);
            gw_reply_error(r, 400, "invalid_request_error", param, "context_length_exceeded",
                           "This model's maximum context length is %d tokens, and input %d is "
                           "longer. Shorten it, or send \"truncate\": true to embed its first "
                           "%d tokens.", eng_bert_max_tokens(c->bert), i,
                           eng_bert_max_tokens(c->bert));
            return;
        }
    }
    embed_job *job = util_xcalloc(1, sizeof *job);
    job->r = r;
    job->n = n;
    job->base64 = base64;
    job->vecs = util_xcalloc((size_t)n * (size_t)c->dim, sizeof(float));
    r->embed = job;
    job->pending = 1;  /* held by this function until every text is queued */
    for (int i = 0; i < n; i++) {
        const cJSON *s = cJSON_IsString(input) ? input : cJSON_GetArrayItem(input, i);
        op *o = util_xcalloc(1, sizeof *o);
        o->c = c;
        o->kind = OP_EMBED;
        o->job = job;
        o->index = i;
        job->pending++;
        if (eng_encoder_submit(c->encoder, s->valuestring, strlen(s->valuestring), on_encoded,
                               o) != 0) {
            job->pending--;
            job->status = LLMGW_EBUSY;
            free(o);
            break;
        }
    }
    /* Results come back through the loop's queue, so none has arrived yet: the count reaches 0
     * here only when nothing was queued. */
    if (--job->pending == 0) {
        r->embed = NULL;
        embed_reply(r, job);
        free(job->vecs);
        free(job);
    }
}

/* ---- the loop side ------------------------------------------------------------------------ */

static void on_mail(gw_letter *first, void *arg)
{
    (void)arg;
    op *list = (op *)first;
    while (list != NULL) {
        op *o = list;
        list = (op *)o->link.next;
        if (o->kind == OP_EMBED)
            embed_done(o);
        else if (o->r == NULL)
            op_free(o);
        else
            lookup_done(o);
    }
}

static void on_expire(evutil_socket_t fd, short what, void *arg)
{
    gw_cache *c = arg;
    (void)fd;
    (void)what;
    cache_store_expire(c->store, (int64_t)util_wall_ms());
}

static void share_entry(void *user, const cache_entry *e)
{
    gw_cache *c = user;
    util_err err = {0};
    if (e->vec != NULL && e->dim != c->dim)
        return;
    /* A replica that predates the long-question rule may send a long question's vector. */
    cache_entry exact_only;
    if (e->vec != NULL && !eng_bert_fits(c->bert, e->question, strlen(e->question))) {
        exact_only = *e;
        exact_only.vec = NULL;
        exact_only.tok = NULL;
        exact_only.tok_len = 0;
        e = &exact_only;
    }
    cache_store_put(c->store, e, (int64_t)util_wall_ms(), &err);
}

static void share_delete(void *user, uint64_t id)
{
    gw_cache *c = user;
    cache_store_remove(c->store, id);
}

static void share_state(void *user, bool up)
{
    gw_cache *c = user;
    if (up != c->redis_up)
        UTIL_LOG_INFO("cache", "redis %s:%d %s", c->cfg->redis_host, c->cfg->redis_port,
                      up ? "connected: sharing entries" : "unreachable: local-only");
    c->redis_up = up;
}

int gw_cache_new(gw_cache **out, gw_server *s, util_err *err)
{
    const gw_config *cfg = s->cfg;
    *out = NULL;
    if (cfg->encoder.model_dir == NULL)
        return 0;
    gw_cache *c = util_xcalloc(1, sizeof *c);
    int rc;
    c->srv = s;
    c->cfg = &cfg->cache;
    c->encoder_name = cfg->encoder.name;
    c->mail = gw_mailbox_new(s->base, on_mail, c);
    if (c->mail == NULL) {
        rc = util_err_set(err, LLMGW_ENOMEM, "cache: cannot make the loop's mailbox");
        goto fail;
    }
    if ((rc = eng_bert_load(&c->bert, cfg->encoder.model_dir, cfg->encoder.device,
                            cfg->encoder.precision == 1   ? ENG_BERT_F32
                            : cfg->encoder.precision == 2 ? ENG_BERT_BF16
                                                          : ENG_BERT_AUTO,
                            err)) != 0)
        goto fail;
    c->dim = eng_bert_dim(c->bert);
    eng_encoder_cfg ecfg = {
        .threads = cfg->encoder.threads,
        .window_us = cfg->encoder.batch_window_us,
        .adaptive = cfg->encoder.adaptive_window,
        .spin_us = cfg->encoder.spin_ms * 1000,
        .max_batch = cfg->encoder.max_batch,
        .max_queue = cfg->encoder.max_queue,
        .max_wait_us = cfg->encoder.max_wait_ms * 1000,
        .nice = cfg->encoder.nice,
    };
    if ((rc = eng_encoder_start(&c->encoder, c->bert, &ecfg, err)) != 0)
        goto fail;
    if (cfg->cache.enabled) {
        cache_store_cfg scfg = {
            .dim = c->dim,
            .index = cfg->cache.index,
            .max_bytes = cfg->cache.max_mb << 20,
        };
        if ((rc = cache_store_new(&c->store, &scfg, err)) != 0)
            goto fail;
        if (cfg->cache.verifier != NULL) {
            if ((rc = cache_verifier_load(&c->verifier, cfg->cache.verifier, err)) != 0)
                goto fail;
            double used;
            c->verify_threshold = cache_verifier_threshold(c->verifier,
                                                           cfg->cache.max_false_hit_rate, &used);
            if (used > cfg->cache.max_false_hit_rate)
                UTIL_LOG_WARN("cache", "max_false_hit_rate %g is below every calibrated point "
                              "of %s; using its strictest (%g)", cfg->cache.max_false_hit_rate,
                              cfg->cache.verifier, used);
            UTIL_LOG_INFO("cache", "verifier %s: serves candidates with probability >= %.4f "
                          "(calibrated for %g false hits), top %d above cosine %.3f",
                          cfg->cache.verifier, c->verify_threshold, used,
                          cfg->cache.candidates, cfg->cache.threshold);
        }
        c->expire_timer = event_new(s->base, -1, EV_PERSIST, on_expire, c);
        struct timeval sec = {1, 0};
        event_add(c->expire_timer, &sec);
        if (cfg->cache.redis_host != NULL) {
            cache_share_cfg rcfg = {
                .host = cfg->cache.redis_host,
                .port = cfg->cache.redis_port,
                .prefix = cfg->cache.redis_prefix,
                .dim = c->dim,
                .check_timeout_ms = cfg->cache.redis_check_timeout_ms,
            };
            static const cache_share_cbs cbs = {share_entry, share_delete, share_state};
            if ((rc = cache_share_start(&c->share, s->base, &rcfg, &cbs, c, err)) != 0)
                goto fail;
        }
    }
    UTIL_LOG_INFO("cache", "encoder '%s' (%d dims, %s) loaded%s%s", c->encoder_name, c->dim,
                  eng_bert_precision_name(c->bert),
                  c->store ? "; semantic cache on" : "",
                  c->share ? ", shared through redis" : "");
    *out = c;
    return 0;
fail:
    gw_cache_free(c);
    return rc;
}

void gw_cache_free(gw_cache *c)
{
    if (c == NULL)
        return;
    cache_share_free(c->share);     /* answers pending checks: their requests are gone */
    eng_encoder_stop(c->encoder);   /* runs done() for what was queued */
    on_mail(gw_mailbox_free(c->mail), c);  /* and frees it (every request is gone) */
    if (c->expire_timer)
        event_free(c->expire_timer);
    cache_store_free(c->store);
    cache_verifier_free(c->verifier);
    eng_bert_free(c->bert);
    free(c);
}

/* ---- metrics ------------------------------------------------------------------------------ */

void gw_cache_declare_metrics(gw_metrics *m)
{
    gw_metrics_declare(m, "llmgw_cache_lookups_total", GW_METRIC_COUNTER,
                       "Cache lookups (cacheable requests without Cache-Control: no-cache).");
    gw_metrics_declare(m, "llmgw_cache_hits_total", GW_METRIC_COUNTER,
                       "Requests answered from the cache, by kind (exact, semantic).");
    gw_metrics_declare(m, "llmgw_cache_misses_total", GW_METRIC_COUNTER,
                       "Lookups that found nothing to serve.");
    gw_metrics_declare(m, "llmgw_cache_bypass_total", GW_METRIC_COUNTER,
                       "Chat requests the cache did not look up (not cacheable, or no-cache).");
    gw_metrics_declare(m, "llmgw_cache_refused_total", GW_METRIC_COUNTER,
                       "Answers not stored because they are unfit to replay, by reason.");
    gw_metrics_declare(m, "llmgw_cache_insertions_total", GW_METRIC_COUNTER,
                       "Answers stored in the cache by this replica.");
    gw_metrics_declare(m, "llmgw_cache_guard_rejects_total", GW_METRIC_COUNTER,
                       "Semantic candidates the guard refused, by reason (negation, identifier, "
                       "swap).");
    gw_metrics_declare(m, "llmgw_cache_verifier_calls_total", GW_METRIC_COUNTER,
                       "Semantic candidates the verifier scored.");
    gw_metrics_declare(m, "llmgw_cache_verifier_rejects_total", GW_METRIC_COUNTER,
                       "Semantic candidates at or above the cosine floor the verifier refused, by "
                       "reason (below_threshold, no_tokens: the entry or query has no token "
                       "vectors).");
    gw_metrics_declare(m, "llmgw_cache_too_long_total", GW_METRIC_COUNTER,
                       "Semantic lookups skipped because the question is longer than the encoder "
                       "reads (max_tokens): such questions are stored without their vector and "
                       "get exact hits only.");
    gw_metrics_declare(m, "llmgw_cache_verifier_duration_seconds", GW_METRIC_HISTOGRAM,
                       "Verifier time per lookup, all candidates together (encoder thread).");
    gw_metrics_declare(m, "llmgw_cache_stale_total", GW_METRIC_COUNTER,
                       "Local hits that Redis no longer holds (expired or deleted elsewhere).");
    gw_metrics_declare(m, "llmgw_cache_evictions_total", GW_METRIC_COUNTER,
                       "Entries removed from the local store, by reason (lru, ttl, removed).");
    gw_metrics_declare(m, "llmgw_cache_entries", GW_METRIC_GAUGE, "Entries in the local store.");
    gw_metrics_declare(m, "llmgw_cache_bytes", GW_METRIC_GAUGE,
                       "Estimated bytes held by the local store.");
    gw_metrics_declare(m, "llmgw_cache_lookup_duration_seconds", GW_METRIC_HISTOGRAM,
                       "From the start of a lookup to its decision (encoding included).");
    gw_metrics_declare(m, "llmgw_cache_redis_up", GW_METRIC_GAUGE,
                       "1 when the Redis that shares the cache is connected.");
    gw_metrics_declare(m, "llmgw_cache_redis_events_total", GW_METRIC_COUNTER,
                       "Redis sharing traffic by kind (published, received, scanned, ...).");
    gw_metrics_declare(m, "llmgw_encoder_texts_total", GW_METRIC_COUNTER,
                       "Texts embedded by the in-process encoder.");
    gw_metrics_declare(m, "llmgw_encoder_batches_total", GW_METRIC_COUNTER,
                       "Batched forwards run by the encoder.");
    gw_metrics_declare(m, "llmgw_encoder_tokens_total", GW_METRIC_COUNTER,
                       "Tokens embedded by the encoder.");
    gw_metrics_declare(m, "llmgw_encoder_queue_depth", GW_METRIC_GAUGE,
                       "Texts waiting for the encoder.");
    gw_metrics_declare(m, "llmgw_encoder_rejected_total", GW_METRIC_COUNTER,
                       "Texts refused because the encoder's queue was full.");
}

void gw_cache_metrics(gw_cache *c, gw_metrics *m)
{
    if (c == NULL)
        return;
    eng_encoder_stats es;
    eng_encoder_get_stats(c->encoder, &es);
    gw_metrics_set(m, "llmgw_encoder_texts_total", NULL, (double)es.texts);
    gw_metrics_set(m, "llmgw_encoder_batches_total", NULL, (double)es.batches);
    gw_metrics_set(m, "llmgw_encoder_tokens_total", NULL, (double)es.tokens);
    gw_metrics_set(m, "llmgw_encoder_queue_depth", NULL, (double)es.queue_depth);
    if (c->store == NULL)
        return;
    cache_store_stats ss;
    cache_store_get_stats(c->store, &ss);
    gw_metrics_set(m, "llmgw_cache_entries", NULL, (double)ss.entries);
    gw_metrics_set(m, "llmgw_cache_bytes", NULL, (double)ss.bytes);
    gw_metrics_set(m, "llmgw_cache_evictions_total", "reason=\"lru\"", (double)ss.evictions);
    gw_metrics_set(m, "llmgw_cache_evictions_total", "reason=\"ttl\"", (double)ss.expirations);
    gw_metrics_set(m, "llmgw_cache_evictions_total", "reason=\"removed\"", (double)ss.removals);
    if (c->share == NULL)
        return;
    gw_metrics_set(m, "llmgw_cache_redis_up", NULL, cache_share_up(c->share) ? 1 : 0);
    cache_share_stats rs;
    cache_share_get_stats(c->share, &rs);
    static const char *const kinds[] = {"published", "deleted", "received", "scanned",
                                        "checks", "check_timeouts", "reconnects", "errors"};
    const uint64_t vals[] = {rs.published, rs.deleted, rs.received, rs.scanned,
                             rs.checks, rs.check_timeouts, rs.reconnects, rs.errors};
    char labels[64];
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        snprintf(labels, sizeof labels, "kind=\"%s\"", kinds[i]);
        gw_metrics_set(m, "llmgw_cache_redis_events_total", labels, (double)vals[i]);
    }
}
