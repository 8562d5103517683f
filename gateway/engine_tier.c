/* gateway/engine_tier.c: serving OpenAI requests from in-process engine instances. */
#include "gateway/engine_tier.h"

#include "common/log.h"
#include "common/time.h"
#include "engine/engine.h"
#include "gateway/internal.h"
#include "gateway/mailbox.h"
#include "gateway/openai.h"

#include <cjson/cJSON.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <openssl/rand.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef struct gw_sink {
    gw_engines *g;
    gw_req *req;          /* NULL once the request is gone */
    int tier;
    int index;            /* the choice it produces */
    uint64_t seq_id;
} gw_sink;

/* One choice of a request (n of them): its sequence and what it produced so far. */
typedef struct gw_choice {
    gw_sink *sink;            /* NULL once its sequence is done or cancelled */
    struct evbuffer *text;    /* non-stream: the answer so far */
    cJSON *logprobs;          /* non-stream: logprobs entries so far */
    bool role_sent;
    size_t offset;            /* bytes of text so far (completions' text_offset) */
    const char *finish;       /* once done */
} gw_choice;

#define MAX_ENGINE_CHOICES 16

#define ITEM_TEXT 96        /* text up to this long travels inside the item */
#define ITEM_POOL 4096     /* spare items kept for reuse */

/* One engine event on its way to the loop. Items are reused (see item_get), so a streamed token
 * costs no allocation once the pool is warm. */
typedef struct item {
    gw_letter link;       /* first: items travel through the mailbox */
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
    char error[160];
} item;

typedef struct inst {
    eng_model *model;
    kern_backend *be;
    eng_engine *eng;
} inst;

struct gw_engines {
    gw_server *srv;
    eng_kvpool *pool;
    inst *inst;            /* [n_tiers]; model == NULL for upstream tiers */
    gw_mailbox *mail;      /* events from the scheduler threads */
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

static void deliver_all(gw_letter *first, void *arg);

int gw_engines_new(gw_engines **out, gw_server *s, util_err *err)
{
    const gw_config *c = s->cfg;
    gw_engines *g = util_xcalloc(1, sizeof *g);
    int rc = 0;
    g->srv = s;
    g->inst = util_xcalloc(c->n_tiers, sizeof *g->inst);
    pthread_mutex_init(&g->spares_mu, NULL);
    g->mail = gw_mailbox_new(s->base, deliver_all, g);
    if (g->mail == NULL) {
        pthread_mutex_destroy(&g->spares_mu);
        free(g->inst);
        free(g);
        return util_err_set(err, LLMGW_ENOMEM, "engine tiers: cannot make the loop's mailbox");
    }
    bool any = false;
    for (size_t i = 0; i < c->n_tiers; i++)
        any = any || c->tiers[i].kind == GW_TIER_ENGINE;
    if (any) {
        size_t page = c->engine.kv_page_kb * 1024;
        size_t n_pages = c->engine.kv_pool_mb * 1024 * 1024 / page;
        if ((rc = eng_kvpool_new(&g->pool, page, n_pages ? n_pages : 1, err)) != 0)
            goto fail;
    }
    for (size_t i = 0; i < c->n_tiers; i++) {
        const gw_tier_cfg *t = &c->tiers[i];
        inst *in = &g->inst[i];
        if (t->kind != GW_TIER_ENGINE)
            continue;
        uint64_t t0 = util_now_ns();
        if ((rc = eng_model_load(&in->model, t->model_path, t->chat_template, err)) != 0)
            goto fail;
        in->be = kern_cpu_backend_new(t->threads);
        if (in->be == NULL) {
            rc = util_err_set(err, LLMGW_ENOMEM, "tier '%s': cannot start the CPU backend",
                              t->name);
            goto fail;
        }
        eng_engine_cfg ec = {.name = t->name, .max_batch_tokens = t->max_batch_tokens,
                             .max_seqs = t->max_seqs, .n_ctx = t->context};
        if ((rc = eng_engine_new(&in->eng, in->model, g->pool, in->be, &ec, err)) != 0)
            goto fail;
        UTIL_LOG_INFO("engine", "tier '%s': %s loaded in %.0f ms (%d layers, vocab %d, "
                      "context %d, %d threads)", t->name, t->model_path,
                      (double)(util_now_ns() - t0) / 1e6, in->model->hp.n_layer,
                      in->model->hp.n_vocab, eng_engine_n_ctx(in->eng),
                      in->be->n_threads(in->be->ctx));
    }
    *out = g;
    return 0;
fail:
    gw_engines_free(g);
    return rc;
}

void gw_engines_free(gw_engines *g)
{
    if (g == NULL)
        return;
    for (size_t i = 0; i < g->srv->cfg->n_tiers; i++) {
        inst *in = &g->inst[i];
        eng_engine_free(in->eng);   /* its last callbacks enqueue DONE(cancelled) */
        if (in->be)
            in->be->destroy(in->be->ctx);
        eng_model_free(in->model);
    }
    for (gw_letter *l = gw_mailbox_free(g->mail), *n; l != NULL; l = n) {
        item *it = (item *)l;
        n = l->next;
        if (it->kind == ENG_EV_DONE && it->sink->req == NULL)
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
    eng_kvpool_free(g->pool);
    free(g->inst);
    free(g);
}

/* The engine callback, on a scheduler thread: copy, enqueue, wake the loop. */
static void on_event(void *arg, const eng_event *ev)
{
    gw_sink *sink = arg;
    gw_engines *g = sink->g;
    item *it = item_get(g);  /* reused: every field is set here */
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
    snprintf(it->error, sizeof it->error, "%s", ev->error != NULL ? ev->error : "");
    gw_mailbox_post(g->mail, &it->link);
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

/* Token text for logprobs: the raw piece with invalid UTF-8 replaced (bytes carry the truth). */
static void add_token_fields(cJSON *o, const eng_tokenizer *tok, int32_t id, bool with_bytes)
{
    char piece[256];
    int n = eng_token_piece(tok, id, true, piece, sizeof piece);
    if (n < 0 || (size_t)n > sizeof piece)
        n = 0;
    char clean[256 * 3 + 1];
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
    cJSON_AddStringToObject(o, "token", clean);
    if (with_bytes) {
        cJSON *bytes = cJSON_AddArrayToObject(o, "bytes");
        for (int i = 0; i < n; i++)
            cJSON_AddItemToArray(bytes, cJSON_CreateNumber((unsigned char)piece[i]));
    }
}

/* One chat logprobs entry: {"token","logprob","bytes","top_logprobs":[...]}. */
static cJSON *chat_logprob(const eng_tokenizer *tok, const eng_pick *p)
{
    cJSON *o = cJSON_CreateObject();
    add_token_fields(o, tok, p->token, true);
    cJSON_AddNumberToObject(o, "logprob", p->logprob);
    cJSON *top = cJSON_AddArrayToObject(o, "top_logprobs");
    for (int i = 0; i < p->n_top; i++) {
        cJSON *t = cJSON_CreateObject();
        add_token_fields(t, tok, p->top_ids[i], true);
        cJSON_AddNumberToObject(t, "logprob", p->top_logprobs[i]);
        cJSON_AddItemToArray(top, t);
    }
    return o;
}

/* Legacy /v1/completions logprobs: {"tokens","token_logprobs","top_logprobs","text_offset"},
 * built entry by entry (`lp` is created on first use). */
static void completion_logprob(cJSON **lp, const eng_tokenizer *tok, const eng_pick *p,
                               size_t offset)
{
    if (*lp == NULL) {
        *lp = cJSON_CreateObject();
        cJSON_AddArrayToObject(*lp, "tokens");
        cJSON_AddArrayToObject(*lp, "token_logprobs");
        cJSON_AddArrayToObject(*lp, "top_logprobs");
        cJSON_AddArrayToObject(*lp, "text_offset");
    }
    cJSON *t = cJSON_CreateObject();
    add_token_fields(t, tok, p->token, false);
    cJSON_AddItemToArray(cJSON_GetObjectItemCaseSensitive(*lp, "tokens"),
                         cJSON_CreateString(cJSON_GetObjectItemCaseSensitive(t, "token")->valuestring));
    cJSON_Delete(t);
    cJSON_AddItemToArray(cJSON_GetObjectItemCaseSensitive(*lp, "token_logprobs"),
                         cJSON_CreateNumber(p->logprob));
    cJSON *top = cJSON_CreateObject();
    for (int i = 0; i < p->n_top; i++) {
        cJSON *e = cJSON_CreateObject();
        add_token_fields(e, tok, p->top_ids[i], false);
        const char *name = cJSON_GetObjectItemCaseSensitive(e, "token")->valuestring;
        if (cJSON_GetObjectItemCaseSensitive(top, name) == NULL)
            cJSON_AddNumberToObject(top, name, p->top_logprobs[i]);
        cJSON_Delete(e);
    }
    cJSON_AddItemToArray(cJSON_GetObjectItemCaseSensitive(*lp, "top_logprobs"), top);
    cJSON_AddItemToArray(cJSON_GetObjectItemCaseSensitive(*lp, "text_offset"),
                         cJSON_CreateNumber((double)offset));
}

static const eng_tokenizer *req_tok(const gw_req *r)
{
    return r->srv->engines->inst[r->tier].model->tok;
}

/* The head of a whole (non-stream) answer. */
static cJSON *envelope(gw_req *r)
{
    char id[96];
    cJSON *o = cJSON_CreateObject();
    snprintf(id, sizeof id, "%s%s", is_chat(r) ? "chatcmpl-" : "cmpl-", r->id);
    cJSON_AddStringToObject(o, "id", id);
    cJSON_AddStringToObject(o, "object", is_chat(r) ? "chat.completion" : "text_completion");
    cJSON_AddNumberToObject(o, "created", (double)r->eng_created);
    cJSON_AddStringToObject(o, "model", r->body.model);
    char fp[96];
    snprintf(fp, sizeof fp, "llmgw-%s", r->srv->cfg->tiers[r->tier].name);
    cJSON_AddStringToObject(o, "system_fingerprint", fp);
    return o;
}

static cJSON *usage(int prompt, int completion)
{
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "prompt_tokens", prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", completion);
    cJSON_AddNumberToObject(u, "total_tokens", prompt + completion);
    return u;
}

/* The stream's chunk head: the same id, created, model and fingerprint on every chunk. */
static gw_openai_head chunk_head(const gw_req *r, char *id, size_t id_cap, char *fp,
                                 size_t fp_cap)
{
    snprintf(id, id_cap, "%s%s", is_chat(r) ? "chatcmpl-" : "cmpl-", r->id);
    snprintf(fp, fp_cap, "llmgw-%s", r->srv->cfg->tiers[r->tier].name);
    return (gw_openai_head){.id = id, .chat = is_chat(r), .created = r->eng_created,
                            .model = r->body.model, .fingerprint = fp};
}

/* A streamed chunk carrying text (and its token's logprobs), or the final finish_reason. The
 * chunk is written straight into a buffer kept for the request: no JSON tree per token; only
 * the logprobs entry, when asked for, is built as one. */
static void stream_chunk(gw_req *r, int idx, const char *text, size_t len, const eng_pick *pick,
                         const char *finish)
{
    gw_choice *ch = &r->eng_choices[idx];
    char id[96], fp[96];
    gw_openai_head h = chunk_head(r, id, sizeof id, fp, sizeof fp);
    gw_openai_step st = {.index = idx, .role = is_chat(r) && !ch->role_sent,
                         .text = finish == NULL || !is_chat(r) ? (text ? text : "") : NULL,
                         .len = finish == NULL ? len : 0, .finish = finish};
    char *lp_text = NULL;
    if (pick != NULL && r->body.top_logprobs >= 0) {
        cJSON *lp;
        if (is_chat(r)) {
            lp = cJSON_CreateObject();
            cJSON *content = cJSON_AddArrayToObject(lp, "content");
            cJSON_AddItemToArray(content, chat_logprob(req_tok(r), pick));
        } else {
            lp = NULL;
            completion_logprob(&lp, req_tok(r), pick, ch->offset);
        }
        lp_text = cJSON_PrintUnformatted(lp);
        cJSON_Delete(lp);
        st.logprobs = lp_text;
    }
    ch->role_sent = ch->role_sent || is_chat(r);
    ch->offset += len;
    if (r->eng_out == NULL)
        r->eng_out = evbuffer_new();
    gw_openai_chunk(r->eng_out, &h, &st);
    free(lp_text);
    gw_stream_buffer(r, r->eng_out);
}

static void deliver_token(gw_req *r, int idx, const item *it)
{
    gw_choice *ch = &r->eng_choices[idx];
    if (r->t_first_byte == 0)
        r->t_first_byte = util_now_ns();
    if (r->body.stream) {
        if (!r->replying)
            gw_stream_begin(r, 200, "text/event-stream");
        if (it->len > 0 || (it->has_pick && r->body.top_logprobs >= 0) || !ch->role_sent)
            stream_chunk(r, idx, it->text, it->len, it->has_pick ? &it->pick : NULL, NULL);
        return;
    }
    if (ch->text == NULL)
        ch->text = evbuffer_new();
    evbuffer_add(ch->text, it->text ? it->text : "", it->len);
    if (it->has_pick && r->body.top_logprobs >= 0) {
        if (!is_chat(r)) {
            completion_logprob(&ch->logprobs, req_tok(r), &it->pick, ch->offset);
        } else {
            if (ch->logprobs == NULL)
                ch->logprobs = cJSON_CreateArray();
            cJSON_AddItemToArray(ch->logprobs, chat_logprob(req_tok(r), &it->pick));
        }
    }
    ch->offset += it->len;
}

/* The finished choice idx as an entry of a non-stream answer's choices. */
static cJSON *choice_object(gw_req *r, int idx)
{
    gw_choice *ch = &r->eng_choices[idx];
    cJSON *c = cJSON_CreateObject();
    cJSON_AddNumberToObject(c, "index", idx);
    size_t len = ch->text ? evbuffer_get_length(ch->text) : 0;
    char *text = util_xstrndup(len ? (const char *)evbuffer_pullup(ch->text, -1) : "", len);
    if (is_chat(r)) {
        cJSON *msg = cJSON_AddObjectToObject(c, "message");
        cJSON_AddStringToObject(msg, "role", "assistant");
        cJSON_AddStringToObject(msg, "content", text);
        cJSON_AddNullToObject(msg, "refusal");
    } else {
        cJSON_AddStringToObject(c, "text", text);
    }
    free(text);
    if (ch->logprobs != NULL && !is_chat(r)) {
        cJSON_AddItemToObject(c, "logprobs", ch->logprobs);
        ch->logprobs = NULL;
    } else if (ch->logprobs != NULL) {
        cJSON *lp = cJSON_AddObjectToObject(c, "logprobs");
        cJSON_AddItemToObject(lp, "content", ch->logprobs);
        ch->logprobs = NULL;
    } else {
        cJSON_AddNullToObject(c, "logprobs");
    }
    cJSON_AddStringToObject(c, "finish_reason", ch->finish ? ch->finish : "stop");
    return c;
}

static void deliver_done(gw_req *r, int idx, const item *it)
{
    gw_choice *ch = &r->eng_choices[idx];
    if (it->finish == ENG_FINISH_ERROR || it->finish == ENG_FINISH_CANCELLED) {
        const char *why = it->finish == ENG_FINISH_ERROR ? it->error : "the engine stopped";
        gw_engine_detach(r);  /* the other choices stop too */
        if (!r->replying) {
            gw_reply_error(r, 503, "server_error", NULL, "engine_error",
                           "Tier '%s' could not finish this request: %s.",
                           r->srv->cfg->tiers[r->tier].name, why);
            return;
        }
        gw_stream_error(r, "server_error", "engine_error", "Tier '%s' could not finish this "
                        "request: %s.", r->srv->cfg->tiers[r->tier].name, why);
        return;
    }
    ch->finish = finish_name(it->finish);
    r->prompt_tokens = it->prompt_tokens;       /* the same prompt for every choice */
    r->completion_tokens += it->completion_tokens;
    if (r->body.stream) {
        if (!r->replying)
            gw_stream_begin(r, 200, "text/event-stream");
        stream_chunk(r, idx, NULL, 0, NULL, ch->finish);
    }
    if (--r->eng_pending > 0)
        return;
    if (r->body.stream) {
        if (r->body.include_usage) {
            char id[96], fp[96];
            gw_openai_head h = chunk_head(r, id, sizeof id, fp, sizeof fp);
            if (r->eng_out == NULL)
                r->eng_out = evbuffer_new();
            gw_openai_usage_chunk(r->eng_out, &h, r->prompt_tokens, r->completion_tokens);
            gw_stream_buffer(r, r->eng_out);
        }
        gw_stream_data(r, GW_SSE_DONE, strlen(GW_SSE_DONE));
        gw_stream_end(r);
        return;
    }
    cJSON *o = envelope(r);
    cJSON *choices = cJSON_AddArrayToObject(o, "choices");
    for (int i = 0; i < r->eng_n; i++)
        cJSON_AddItemToArray(choices, choice_object(r, i));
    cJSON_AddItemToObject(o, "usage", usage((int)r->prompt_tokens, (int)r->completion_tokens));
    r->t_first_byte = r->t_first_byte ? r->t_first_byte : util_now_ns();
    gw_reply_json(r, 200, o);
}

static void deliver_all(gw_letter *first, void *arg)
{
    gw_engines *g = arg;
    item *it = (item *)first;
    while (it != NULL) {
        item *next = (item *)it->link.next;
        gw_sink *sink = it->sink;
        if (sink->req != NULL) {
            gw_req *r = sink->req;
            if (it->kind == ENG_EV_TOKEN) {
                deliver_token(r, sink->index, it);
            } else {
                r->eng_choices[sink->index].sink = NULL;  /* done: nothing left to cancel */
                sink->req = NULL;
                deliver_done(r, sink->index, it);
            }
        }
        if (it->kind == ENG_EV_DONE)
            free(sink);              /* the engine is done with it, and so is the request */
        item_put(g, it);
        it = next;
    }
}

/* ---- requests ---------------------------------------------------------------------------- */

static int build_prompt(gw_req *r, const eng_model *m, int32_t **ids, size_t *n)
{
    size_t cap = 0;
    *ids = NULL;
    *n = 0;
    if (is_chat(r)) {
        if (!m->has_chat) {
            gw_reply_error(r, 400, "invalid_request_error", "messages", "no_chat_template",
                           "Tier '%s' has no chat template; set chat_template in its config "
                           "or use /v1/completions.", r->srv->cfg->tiers[r->tier].name);
            return -1;
        }
        eng_chat_msg *msgs = util_arena_alloc(&r->arena, r->body.n_messages * sizeof *msgs);
        for (size_t i = 0; i < r->body.n_messages; i++) {
            const gw_message *gm = &r->body.messages[i];
            msgs[i] = (eng_chat_msg){.role = !strcmp(gm->role, "developer") ? "system" : gm->role,
                                     .content = gm->text, .content_len = gm->text_len};
        }
        char *text = NULL;
        size_t len = 0;
        if (eng_chat_render(m->chat, msgs, r->body.n_messages, m->default_system, true, &text,
                            &len) != 0 ||
            eng_tokenize(m->tok, text, len, eng_tokenizer_add_bos(m->tok), true, ids, n,
                         &cap) != 0) {
            free(text);
            gw_reply_error(r, 500, "server_error", NULL, NULL, "Out of memory.");
            return -1;
        }
        free(text);
        return 0;
    }
    const cJSON *prompt = cJSON_GetObjectItemCaseSensitive(r->body.json, "prompt");
    if (cJSON_IsString(prompt) || (cJSON_IsArray(prompt) && cJSON_GetArraySize(prompt) == 1 &&
                                   cJSON_IsString(prompt->child))) {
        const char *p = cJSON_IsString(prompt) ? prompt->valuestring : prompt->child->valuestring;
        if (eng_tokenize(m->tok, p, strlen(p), eng_tokenizer_add_bos(m->tok), true, ids, n,
                         &cap) != 0) {
            gw_reply_error(r, 500, "server_error", NULL, NULL, "Out of memory.");
            return -1;
        }
        return 0;
    }
    const cJSON *list = prompt;
    if (cJSON_IsArray(prompt) && cJSON_GetArraySize(prompt) == 1 && cJSON_IsArray(prompt->child))
        list = prompt->child;
    if (!cJSON_IsArray(list) || !cJSON_IsNumber(list->child)) {
        gw_reply_error(r, 400, "invalid_request_error", "prompt", "unsupported_value",
                       "Engine tiers take one prompt per request (a string or one list of "
                       "token ids).");
        return -1;
    }
    size_t count = (size_t)cJSON_GetArraySize(list);
    *ids = util_xmalloc(count * sizeof **ids);
    const cJSON *tk;
    cJSON_ArrayForEach(tk, list) (*ids)[(*n)++] = (int32_t)tk->valuedouble;
    return 0;
}

void gw_engine_start(gw_req *r)
{
    gw_engines *g = r->srv->engines;
    inst *in = &g->inst[r->tier];
    const gw_tier_cfg *t = &r->srv->cfg->tiers[r->tier];
    const gw_request *b = &r->body;
    if (b->ep == GW_EP_EMBEDDINGS) {
        gw_reply_error(r, 400, "invalid_request_error", "model", "unsupported_model",
                       "Tier '%s' is a generation model; it does not serve embeddings.", t->name);
        return;
    }
    if (b->media != NULL) {
        /* A text-only model would answer as if the part were not there: refuse, naming it. */
        char param[64];
        snprintf(param, sizeof param, "messages.[%zu].content.[%d]", b->media_msg,
                 b->media->media_part);
        gw_reply_error(r, 400, "invalid_request_error", param, "unsupported_content",
                       "Tier '%s' reads text only; it cannot read the '%s' part at %s. Send the "
                       "request to a model that accepts %s, or remove the part.", t->name,
                       b->media->media_type, param,
                       b->media->media_type[1] == 'm' ? "images"
                       : b->media->media_type[1] == 'n' ? "audio" : "files");
        return;
    }
    if (b->has_tools) {
        gw_reply_error(r, 400, "invalid_request_error", "tools", "unsupported_parameter",
                       "Tier '%s' does not support tools; send tool calls to an upstream tier.",
                       t->name);
        return;
    }
    if (b->n > MAX_ENGINE_CHOICES) {
        gw_reply_error(r, 400, "invalid_request_error", "n", "unsupported_value",
                       "Tier '%s' generates at most %d choices per request.", t->name,
                       MAX_ENGINE_CHOICES);
        return;
    }
    int32_t *ids = NULL;
    size_t n = 0;
    if (build_prompt(r, in->model, &ids, &n) != 0) {
        free(ids);
        return;
    }
    /* As the OpenAI API does: a prompt that fits but leaves no room for the max_tokens asked
     * for is refused, not cut short. Unset max_tokens means "until the context is full". */
    int n_ctx = eng_engine_n_ctx(in->eng);
    if (b->max_tokens > 0 && (int64_t)n + b->max_tokens > n_ctx && n < (size_t)n_ctx) {
        free(ids);
        gw_reply_error(r, 400, "invalid_request_error", is_chat(r) ? "messages" : "prompt",
                       "context_length_exceeded",
                       "This model's maximum context length is %d tokens. However, you requested "
                       "%lld tokens (%zu in the %s, %lld in the completion). Please reduce the "
                       "length of the %s or completion.", n_ctx,
                       (long long)((int64_t)n + b->max_tokens), n,
                       is_chat(r) ? "messages" : "prompt", (long long)b->max_tokens,
                       is_chat(r) ? "messages" : "prompt");
        return;
    }
    eng_logit_bias *bias = NULL;
    int n_bias = 0;
    const cJSON *lb = cJSON_GetObjectItemCaseSensitive(b->json, "logit_bias");
    if (b->logit_bias_n > 0 && cJSON_IsObject(lb)) {
        /* Keys and values were validated by gw_request_parse; the vocabulary is checked by
         * eng_engine_submit (400 naming the id). */
        bias = util_arena_alloc(&r->arena, (size_t)b->logit_bias_n * sizeof *bias);
        const cJSON *it;
        cJSON_ArrayForEach(it, lb) {
            bias[n_bias].token = (int32_t)strtol(it->string, NULL, 10);
            bias[n_bias].bias = (float)it->valuedouble;
            n_bias++;
        }
    }
    eng_request er = {
        .prompt = ids,
        .n_prompt = n,
        .sampling = {.temperature = b->has_temperature ? (float)b->temperature : 1.0f,
                     .top_k = b->top_k,
                     .top_p = b->has_top_p ? (float)b->top_p : 1.0f,
                     .min_p = (float)b->min_p,
                     .top_logprobs = b->top_logprobs,
                     .logit_bias = bias,
                     .n_logit_bias = n_bias},
        .max_tokens = b->max_tokens > 0 ? (int)(b->max_tokens > 1 << 30 ? 1 << 30 : b->max_tokens)
                                        : (is_chat(r) ? 0 : 16),
        .n_stop = b->n_stop,
        .on_event = on_event,
    };
    for (size_t i = 0; i < b->n_stop; i++)
        er.stop[i] = b->stop[i];
    r->eng_created = util_wall_ms() / 1000;
    r->eng_n = b->n;
    r->eng_choices = util_xcalloc((size_t)b->n, sizeof *r->eng_choices);
    uint64_t seed = 0;
    if (b->has_seed)
        seed = (uint64_t)b->seed;
    else if (RAND_bytes((unsigned char *)&seed, sizeof seed) != 1)
        seed = util_now_ns();
    /* One sequence per choice; choice i samples with seed + i (the same seed gives the same n
     * choices again). Their shared prompt pages come from the prefix table once computed. */
    for (int i = 0; i < b->n; i++) {
        er.seed = seed + (uint64_t)i;
        gw_sink *sink = util_xcalloc(1, sizeof *sink);
        sink->g = g;
        sink->req = r;
        sink->tier = r->tier;
        sink->index = i;
        er.arg = sink;
        util_err err = {0};
        int rc = eng_engine_submit(in->eng, &er, &sink->seq_id, &err);
        if (rc != 0) {
            free(sink);
            free(ids);
            gw_engine_detach(r);  /* choices already queued are cancelled */
            bool bias_err = strncmp(err.msg, "logit_bias", 10) == 0;
            gw_reply_error(r, 400, "invalid_request_error",
                           bias_err ? "logit_bias" : is_chat(r) ? "messages" : "prompt",
                           rc == LLMGW_ERANGE ? "context_length_exceeded" : "invalid_value",
                           "%s", err.msg);
            return;
        }
        r->eng_choices[i].sink = sink;
        r->eng_pending++;
    }
    free(ids);
    r->attempts = 1;
}

void gw_engine_detach(gw_req *r)
{
    for (int i = 0; i < r->eng_n; i++) {
        gw_sink *sink = r->eng_choices[i].sink;
        if (sink == NULL)
            continue;
        r->eng_choices[i].sink = NULL;
        sink->req = NULL;   /* its DONE event frees it */
        eng_engine_cancel(sink->g->inst[sink->tier].eng, sink->seq_id);
    }
}

void gw_engine_release(gw_req *r)
{
    gw_engine_detach(r);
    for (int i = 0; i < r->eng_n; i++) {
        if (r->eng_choices[i].text)
            evbuffer_free(r->eng_choices[i].text);
        cJSON_Delete(r->eng_choices[i].logprobs);
    }
    free(r->eng_choices);
    r->eng_choices = NULL;
    r->eng_n = 0;
    if (r->eng_out != NULL) {
        evbuffer_free(r->eng_out);
        r->eng_out = NULL;
    }
}

void gw_engines_metrics(gw_engines *g, gw_metrics *m)
{
    if (g->pool != NULL) {
        size_t total = eng_kvpool_n_pages(g->pool);
        gw_metrics_set(m, "llmgw_kv_pages", "state=\"total\"", (double)total);
        gw_metrics_set(m, "llmgw_kv_pages", "state=\"used\"",
                       (double)(total - eng_kvpool_n_free(g->pool)));
    }
    char labels[160];
    for (size_t i = 0; i < g->srv->cfg->n_tiers; i++) {
        if (g->inst[i].eng == NULL)
            continue;
        eng_engine_stats st;
        eng_engine_stats_get(g->inst[i].eng, &st);
        const char *name = g->srv->cfg->tiers[i].name;
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
    }
}
