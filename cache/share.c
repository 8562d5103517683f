/* cache/share.c: cache entries shared across replicas through Redis (see cache/share.h).
 *
 * Two hiredis async connections live on the caller's event loop: `cmd` carries every ordinary
 * command (HSET, PEXPIREAT, XADD, DEL, EXISTS, SCAN, HGETALL) and `feed` only the blocking
 * XREAD loop on <prefix>feed, so a blocked read never delays a check. When both are open the
 * replica reads the feed's last id, scans <prefix>e:* (HGETALL per key), then follows the feed
 * from that id. Feed events are turned into HGETALLs (add) or PINGs (del) on `cmd`, so adds and
 * deletes reach the callbacks in the order the feed announced them.
 *
 * hiredis frees a context itself when the connection fails (after running every pending
 * callback with a NULL reply, then the disconnect callback), and a context must not be freed
 * from inside its own connect or disconnect callbacks. So every failure only forgets the dead
 * context and activates `reset_ev`; reset_cb, on a fresh loop turn, frees what is left, reports
 * the state and arms the reconnect timer (backing off from reconnect_min_ms to reconnect_max_ms).
 *
 * A check owns a timer. Whichever comes first, the EXISTS reply or the timer, answers it; the
 * check is freed only when it has been answered and hiredis no longer holds it as privdata
 * (hiredis runs every pending callback, with a NULL reply when the context dies), so a late
 * reply never calls done() twice nor touches freed memory.
 *
 * Stats: `received` counts the entries and deletions the feed delivered (this replica's own
 * announcements included), `scanned` the entries a (re)connect scan delivered, `scans` the
 * (re)connect scans that reached their end (every key's HGETALL sent), `reconnects` the
 * times the connection came back after it was lost, `errors` Redis error replies, malformed
 * entries or feed events, and commands hiredis refused.
 *
 * Not supported: calling cache_share_free from inside one of this module's callbacks (on_entry,
 * on_delete, on_state, a check's done). A host name other than a numeric address is resolved by
 * hiredis with a blocking getaddrinfo: configure an IP address. */
#include "cache/share.h"

#include "cache/verifier.h"

#include "common/arena.h"
#include "common/log.h"
#include "common/time.h"

#include <event2/event.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <hiredis/async.h>
#include <hiredis/hiredis.h>
#include <hiredis/adapters/libevent.h>

#define PREFIX_MAX 200
#define KEY_MAX (PREFIX_MAX + 32)
#define FEED_BLOCK_MS "2000"   /* XREAD BLOCK: re-issued after each (possibly empty) reply */
/* Redis silent this long while the sync or the XREAD loop waits on it (a hung server, a
 * partition without a reset) counts as down: BLOCK plus a margin. */
#define STALL_MS 5000
#define FEED_COUNT "1000"      /* feed events per XREAD reply at most */
#define SCAN_COUNT "500"

enum { STATE_NONE = -1, STATE_DOWN = 0, STATE_UP = 1 };

typedef struct check {
    struct check *prev, *next;        /* in cache_share.checks until freed */
    cache_share *s;
    struct event *ev;                 /* the deadline, or a zero timeout when Redis is not asked */
    void (*done)(void *user, int r);
    void *user;
    bool answered;                    /* done() has run (or is running) */
    bool in_redis;                    /* hiredis still holds it as a callback's privdata */
} check;

/* privdata of an HGETALL (add or scan) or of the PING that orders a delete. */
typedef struct fetch {
    uint64_t id;
    bool scan;
} fetch;

struct cache_share {
    struct event_base *base;
    cache_share_cbs cbs;
    void *user;
    char *host;
    int port;
    char prefix[PREFIX_MAX + 1];
    char feed_key[PREFIX_MAX + 8];
    int dim;
    int connect_timeout_ms, check_timeout_ms, reconnect_min_ms, reconnect_max_ms;
    char maxlen[24];                  /* feed_maxlen, decimal */

    redisAsyncContext *cmd, *feed;    /* NULL once hiredis or we freed them */
    bool cmd_ready, feed_ready;       /* their connect callbacks said OK */
    bool up;                          /* both open and no reset pending */
    bool ever_up;
    bool closing;                     /* inside cache_share_free: no user callback but done() */
    int reported;                     /* the last state on_state was told (STATE_*) */
    int backoff_ms;                   /* the next reconnect delay */
    char why[128];                    /* the first reason of the pending reset */
    char last_id[48];                 /* the feed id read last ("ms-seq") */
    struct event *connect_timer, *retry_timer, *reset_ev;
    struct event *stall_timer;        /* see STALL_MS; re-armed at every step of sync and feed */

    check *checks;
    float *vec;                       /* [dim] f32: a received v, decoded */
    unsigned char *vbuf;              /* [dim * 4] bytes: a published v, little-endian f32 */
    cache_share_stats st;
};

static void connect_start(cache_share *s);
static void feed_read(cache_share *s);

/* ---- small helpers ---- */

static void put_f32le(unsigned char *p, float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    p[0] = (unsigned char)u;
    p[1] = (unsigned char)(u >> 8);
    p[2] = (unsigned char)(u >> 16);
    p[3] = (unsigned char)(u >> 24);
}

static float get_f32le(const unsigned char *p)
{
    uint32_t u = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                 (uint32_t)p[3] << 24;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static bool parse_u64(const char *p, size_t n, uint64_t *out)
{
    uint64_t v = 0;
    if (n == 0 || n > 20)
        return false;
    for (size_t i = 0; i < n; i++) {
        if (p[i] < '0' || p[i] > '9')
            return false;
        unsigned d = (unsigned)(p[i] - '0');
        if (v > (UINT64_MAX - d) / 10)
            return false;
        v = v * 10 + d;
    }
    *out = v;
    return true;
}

static bool parse_i64(const char *p, size_t n, int64_t *out)
{
    bool neg = n > 0 && p[0] == '-';
    uint64_t v;
    if (!parse_u64(p + neg, n - neg, &v) || v > (uint64_t)INT64_MAX)
        return false;
    *out = neg ? -(int64_t)v : (int64_t)v;
    return true;
}

/* An entry id as the keys and the feed carry it: 16 hex digits, nonzero, below 2^63. */
static bool parse_id(const char *p, size_t n, uint64_t *out)
{
    uint64_t v = 0;
    if (n != 16)
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = p[i];
        unsigned d;
        if (c >= '0' && c <= '9')
            d = (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f')
            d = (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F')
            d = (unsigned)(c - 'A' + 10);
        else
            return false;
        v = v << 4 | d;
    }
    if (v == 0 || v >> 63)
        return false;
    *out = v;
    return true;
}

static void entry_key(const cache_share *s, uint64_t id, char key[KEY_MAX])
{
    snprintf(key, KEY_MAX, "%se:%016" PRIx64, s->prefix, id);
}

static bool is_str(const redisReply *r)
{
    return r != NULL && r->type == REDIS_REPLY_STRING;
}

static bool reply_is(const redisReply *r, const char *s)
{
    size_t n = strlen(s);
    return is_str(r) && r->len == n && memcmp(r->str, s, n) == 0;
}

/* Queues a command on ac; false when ac is gone or hiredis refuses (the context is dying). */
static bool send_argv(redisAsyncContext *ac, redisCallbackFn *fn, void *priv, int argc,
                      const char **argv, const size_t *lens)
{
    return ac != NULL && redisAsyncCommandArgv(ac, fn, priv, argc, argv, lens) == REDIS_OK;
}

/* ---- connection state ---- */

/* Drops sharing until reset_cb has run on a later loop turn (see the file comment). */
static void schedule_reset(cache_share *s, const char *why)
{
    if (s->closing)
        return;
    if (s->why[0] == '\0')
        snprintf(s->why, sizeof s->why, "%s", why && why[0] ? why : "connection lost");
    s->up = false;
    event_active(s->reset_ev, EV_TIMEOUT, 1);
}

static void reset_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    cache_share *s = arg;
    redisAsyncContext *cmd = s->cmd, *feed = s->feed;
    s->cmd = s->feed = NULL;
    s->cmd_ready = s->feed_ready = false;
    s->up = false;
    evtimer_del(s->connect_timer);
    evtimer_del(s->stall_timer);
    if (cmd != NULL)
        redisAsyncFree(cmd);     /* pending checks are answered -1 by their callbacks */
    if (feed != NULL)
        redisAsyncFree(feed);

    struct timeval tv = {s->backoff_ms / 1000, (s->backoff_ms % 1000) * 1000};
    evtimer_add(s->retry_timer, &tv);
    s->backoff_ms = s->backoff_ms > s->reconnect_max_ms / 2 ? s->reconnect_max_ms
                                                             : s->backoff_ms * 2;

    bool tell = s->reported != STATE_DOWN;
    if (tell)
        UTIL_LOG_WARN("cache", "redis %s:%d unavailable, cache sharing off until it returns: %s",
                      s->host, s->port, s->why);
    else
        UTIL_LOG_DEBUG("cache", "redis %s:%d still unavailable: %s", s->host, s->port, s->why);
    s->why[0] = '\0';
    s->reported = STATE_DOWN;
    if (tell && s->cbs.on_state != NULL)
        s->cbs.on_state(s->user, false);
}

static void retry_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    connect_start(arg);
}

static void connect_timeout_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    schedule_reset(arg, "no connection or no answer within connect_timeout_ms");
}

static void stall_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    schedule_reset(arg, "no answer from redis");
}

/* Redis answered (or was just asked): restart the stall deadline. */
static void alive(cache_share *s)
{
    struct timeval tv = {STALL_MS / 1000, (STALL_MS % 1000) * 1000};
    evtimer_add(s->stall_timer, &tv);
}

static void lastid_cb(redisAsyncContext *ac, void *r, void *priv);

/* Both connections are open: ask for the feed's last id. The connect deadline still runs: a
 * server that accepts connections but does not answer (stopped, loading) is not up. */
static void sync_begin(cache_share *s)
{
    const char *argv[] = {"XREVRANGE", s->feed_key, "+", "-", "COUNT", "1"};
    if (!send_argv(s->cmd, lastid_cb, NULL, 6, argv, NULL))
        schedule_reset(s, "cannot queue XREVRANGE");
}

/* Redis answered on the new connection: report it (the scan is under way). */
static void went_up(cache_share *s)
{
    evtimer_del(s->connect_timer);
    alive(s);
    s->up = true;
    s->backoff_ms = s->reconnect_min_ms;
    if (s->ever_up)
        s->st.reconnects++;
    s->ever_up = true;
    bool tell = s->reported != STATE_UP;
    if (s->reported == STATE_DOWN)
        UTIL_LOG_INFO("cache", "redis %s:%d is back, cache sharing resumes", s->host, s->port);
    s->reported = STATE_UP;
    if (tell && s->cbs.on_state != NULL)
        s->cbs.on_state(s->user, true);
}

static void on_connect(const redisAsyncContext *ac, int status)
{
    cache_share *s = ac->data;
    bool is_cmd = ac == s->cmd;
    if (!is_cmd && ac != s->feed)
        return;
    if (status != REDIS_OK) {
        /* hiredis frees the context when this returns. */
        if (is_cmd)
            s->cmd = NULL;
        else
            s->feed = NULL;
        schedule_reset(s, ac->c.errstr);
        return;
    }
    if (is_cmd)
        s->cmd_ready = true;
    else
        s->feed_ready = true;
    if (s->cmd_ready && s->feed_ready && s->why[0] == '\0')
        sync_begin(s);
}

static void on_disconnect(const redisAsyncContext *ac, int status)
{
    (void)status;
    cache_share *s = ac->data;
    /* hiredis frees the context when this returns; ours were forgotten before we freed them. */
    if (ac == s->cmd)
        s->cmd = NULL;
    else if (ac == s->feed)
        s->feed = NULL;
    else
        return;
    schedule_reset(s, ac->errstr ? ac->errstr : ac->c.errstr);
}

static int open_one(cache_share *s, redisAsyncContext **slot)
{
    redisAsyncContext *ac = redisAsyncConnect(s->host, s->port);
    if (ac == NULL) {
        schedule_reset(s, "out of memory");
        return -1;
    }
    if (ac->err) {
        schedule_reset(s, ac->errstr);
        redisAsyncFree(ac);
        return -1;
    }
    ac->data = s;
    if (redisLibeventAttach(ac, s->base) != REDIS_OK) {
        redisAsyncFree(ac);
        schedule_reset(s, "cannot attach to the event loop");
        return -1;
    }
    redisAsyncSetConnectCallback(ac, on_connect);
    redisAsyncSetDisconnectCallback(ac, on_disconnect);
    *slot = ac;
    return 0;
}

/* Starts both connections; connect(2) runs in the background and on_connect reports. */
static void connect_start(cache_share *s)
{
    if (s->closing)
        return;
    if (open_one(s, &s->cmd) != 0 || open_one(s, &s->feed) != 0)
        return;
    struct timeval tv = {s->connect_timeout_ms / 1000, (s->connect_timeout_ms % 1000) * 1000};
    evtimer_add(s->connect_timer, &tv);
}

/* ---- reading entries ---- */

/* "t" (the verifier's token vectors) is optional: a replica without a verifier sends none. */
enum { F_NS, F_EXACT, F_CREATED, F_EXPIRES, F_Q, F_V, F_R, F_T, F_COUNT };
static const char *const field_names[F_COUNT] = {"ns", "exact", "created", "expires", "q", "v", "r",
                                                 "t"};

/* Fills e from an HGETALL reply; e's strings and vector point into r and s->vec. Returns NULL
 * or what was wrong. */
static const char *parse_entry(cache_share *s, const redisReply *r, uint64_t id, cache_entry *e)
{
    const redisReply *f[F_COUNT] = {0};
    if (r->type != REDIS_REPLY_ARRAY || r->elements % 2 != 0)
        return "not a hash";
    for (size_t i = 0; i < r->elements; i += 2) {
        const redisReply *k = r->element[i], *v = r->element[i + 1];
        if (!is_str(k) || !is_str(v))
            return "a field is not a string";
        for (int j = 0; j < F_COUNT; j++)
            if (reply_is(k, field_names[j]))
                f[j] = v;
    }
    for (int j = 0; j < F_T; j++)
        if (f[j] == NULL)
            return "a field is missing";
    memset(e, 0, sizeof *e);
    e->id = id;
    if (!parse_u64(f[F_NS]->str, f[F_NS]->len, &e->ns) ||
        !parse_u64(f[F_EXACT]->str, f[F_EXACT]->len, &e->exact) ||
        !parse_i64(f[F_CREATED]->str, f[F_CREATED]->len, &e->created_ms) ||
        !parse_i64(f[F_EXPIRES]->str, f[F_EXPIRES]->len, &e->expires_ms))
        return "a number field is malformed";
    const redisReply *v = f[F_V];
    if (v->len != 0) {
        if (s->dim <= 0 || v->len != (size_t)s->dim * 4)
            return "the vector has the wrong size";
        for (int i = 0; i < s->dim; i++) {
            s->vec[i] = get_f32le((const unsigned char *)v->str + 4 * (size_t)i);
            if (!isfinite(s->vec[i]))
                return "the vector is not finite";
        }
        e->vec = s->vec;
        e->dim = s->dim;
    }
    if (f[F_T] != NULL && f[F_T]->len != 0) {
        if (cache_tokens_check((const uint8_t *)f[F_T]->str, f[F_T]->len, s->dim) < 0)
            return "the token vectors are malformed";
        e->tok = (uint8_t *)f[F_T]->str;
        e->tok_len = f[F_T]->len;
    }
    e->question = f[F_Q]->str;            /* hiredis NUL-terminates every string */
    e->response = f[F_R]->str;
    e->response_len = f[F_R]->len;
    return NULL;
}

static void fetch_cb(redisAsyncContext *ac, void *r, void *priv)
{
    cache_share *s = ac->data;
    fetch *f = priv;
    redisReply *rep = r;
    uint64_t id = f->id;
    bool scan = f->scan;
    free(f);
    if (rep == NULL || s->closing)
        return;
    if (rep->type == REDIS_REPLY_ERROR) {
        s->st.errors++;
        UTIL_LOG_DEBUG("cache", "redis HGETALL of entry %016" PRIx64 ": %s", id, rep->str);
        return;
    }
    if (rep->type == REDIS_REPLY_ARRAY && rep->elements == 0)
        return;                            /* deleted or expired since it was announced */
    cache_entry e;
    const char *bad = parse_entry(s, rep, id, &e);
    if (bad != NULL) {
        s->st.errors++;
        UTIL_LOG_DEBUG("cache", "redis entry %016" PRIx64 " skipped: %s", id, bad);
        return;
    }
    if (e.expires_ms <= (int64_t)util_wall_ms())
        return;
    if (scan)
        s->st.scanned++;
    else
        s->st.received++;
    if (s->cbs.on_entry != NULL)
        s->cbs.on_entry(s->user, &e);
}

static void fetch_entry(cache_share *s, uint64_t id, bool scan)
{
    char key[KEY_MAX];
    entry_key(s, id, key);
    fetch *f = util_xmalloc(sizeof *f);
    f->id = id;
    f->scan = scan;
    const char *argv[] = {"HGETALL", key};
    if (!send_argv(s->cmd, fetch_cb, f, 2, argv, NULL))
        free(f);
}

static void deleted_cb(redisAsyncContext *ac, void *r, void *priv)
{
    cache_share *s = ac->data;
    fetch *f = priv;
    uint64_t id = f->id;
    free(f);
    if (r == NULL || s->closing)
        return;
    s->st.received++;
    if (s->cbs.on_delete != NULL)
        s->cbs.on_delete(s->user, id);
}

/* Reports a deletion once the fetches queued before it have been answered. */
static void delete_after_fetches(cache_share *s, uint64_t id)
{
    fetch *f = util_xmalloc(sizeof *f);
    f->id = id;
    f->scan = false;
    const char *argv[] = {"PING"};
    if (!send_argv(s->cmd, deleted_cb, f, 1, argv, NULL))
        free(f);
}

static void scan_next(cache_share *s, const char *cursor);

static void scan_cb(redisAsyncContext *ac, void *r, void *priv)
{
    (void)priv;
    cache_share *s = ac->data;
    redisReply *rep = r;
    if (rep == NULL || s->closing)
        return;
    if (rep->type != REDIS_REPLY_ARRAY || rep->elements != 2 || !is_str(rep->element[0]) ||
        rep->element[1]->type != REDIS_REPLY_ARRAY) {
        s->st.errors++;
        schedule_reset(s, rep->type == REDIS_REPLY_ERROR ? rep->str : "unexpected SCAN reply");
        return;
    }
    alive(s);
    size_t plen = strlen(s->prefix) + 2;
    const redisReply *keys = rep->element[1];
    for (size_t i = 0; i < keys->elements; i++) {
        const redisReply *k = keys->element[i];
        uint64_t id;
        if (is_str(k) && k->len == plen + 16 && parse_id(k->str + plen, 16, &id))
            fetch_entry(s, id, true);
    }
    const redisReply *cursor = rep->element[0];
    if (reply_is(cursor, "0")) {
        s->st.scans++;
        feed_read(s);
    } else {
        scan_next(s, cursor->str);
    }
}

static void scan_next(cache_share *s, const char *cursor)
{
    char match[KEY_MAX];
    snprintf(match, sizeof match, "%se:*", s->prefix);
    const char *argv[] = {"SCAN", cursor, "MATCH", match, "COUNT", SCAN_COUNT};
    if (!send_argv(s->cmd, scan_cb, NULL, 6, argv, NULL))
        schedule_reset(s, "cannot queue SCAN");
}

/* The feed's newest id is where the feed is followed from once the scan is over. */
static void lastid_cb(redisAsyncContext *ac, void *r, void *priv)
{
    (void)priv;
    cache_share *s = ac->data;
    redisReply *rep = r;
    if (rep == NULL || s->closing || s->why[0] != '\0')
        return;                        /* a reset is pending: it will reconnect */
    if (rep->type == REDIS_REPLY_ARRAY && rep->elements == 0) {
        snprintf(s->last_id, sizeof s->last_id, "0-0");
    } else if (rep->type == REDIS_REPLY_ARRAY && rep->element[0]->type == REDIS_REPLY_ARRAY &&
               rep->element[0]->elements >= 1 && is_str(rep->element[0]->element[0]) &&
               rep->element[0]->element[0]->len < sizeof s->last_id) {
        memcpy(s->last_id, rep->element[0]->element[0]->str, rep->element[0]->element[0]->len + 1);
    } else {
        s->st.errors++;
        schedule_reset(s, rep->type == REDIS_REPLY_ERROR ? rep->str : "unexpected XREVRANGE reply");
        return;
    }
    scan_next(s, "0");
    if (s->why[0] == '\0')
        went_up(s);
}

/* One XREAD reply: [[feed, [[id, [field, value, ...]], ...]]], or nil when BLOCK ran out. */
static void feed_cb(redisAsyncContext *ac, void *r, void *priv)
{
    (void)priv;
    cache_share *s = ac->data;
    redisReply *rep = r;
    if (rep == NULL || s->closing)
        return;
    if (rep->type == REDIS_REPLY_ERROR) {
        s->st.errors++;
        schedule_reset(s, rep->str);
        return;
    }
    if (rep->type == REDIS_REPLY_ARRAY && rep->elements == 1 &&
        rep->element[0]->type == REDIS_REPLY_ARRAY && rep->element[0]->elements == 2 &&
        rep->element[0]->element[1]->type == REDIS_REPLY_ARRAY) {
        const redisReply *msgs = rep->element[0]->element[1];
        for (size_t i = 0; i < msgs->elements; i++) {
            const redisReply *m = msgs->element[i];
            if (m->type != REDIS_REPLY_ARRAY || m->elements != 2 || !is_str(m->element[0]) ||
                m->element[0]->len >= sizeof s->last_id) {
                s->st.errors++;
                continue;
            }
            /* Move past it even when its fields are bad, or the next XREAD returns it again. */
            memcpy(s->last_id, m->element[0]->str, m->element[0]->len + 1);
            if (m->element[1]->type != REDIS_REPLY_ARRAY) {
                s->st.errors++;
                continue;
            }
            const redisReply *fv = m->element[1], *op = NULL, *idr = NULL;
            for (size_t j = 0; j + 1 < fv->elements; j += 2) {
                if (reply_is(fv->element[j], "op"))
                    op = fv->element[j + 1];
                else if (reply_is(fv->element[j], "id"))
                    idr = fv->element[j + 1];
            }
            uint64_t id;
            if (!is_str(idr) || !parse_id(idr->str, idr->len, &id))
                s->st.errors++;
            else if (reply_is(op, "add"))
                fetch_entry(s, id, false);
            else if (reply_is(op, "del"))
                delete_after_fetches(s, id);
            else
                s->st.errors++;
        }
    } else if (rep->type != REDIS_REPLY_NIL) {
        s->st.errors++;
    }
    feed_read(s);
}

static void feed_read(cache_share *s)
{
    const char *argv[] = {"XREAD", "COUNT", FEED_COUNT, "BLOCK", FEED_BLOCK_MS, "STREAMS",
                          s->feed_key, s->last_id};
    if (!send_argv(s->feed, feed_cb, NULL, 8, argv, NULL))
        schedule_reset(s, "cannot queue XREAD");
    else
        alive(s);
}

/* ---- public calls ---- */

int cache_share_start(cache_share **out, struct event_base *base, const cache_share_cfg *cfg,
                      const cache_share_cbs *cbs, void *user, util_err *err)
{
    if (out == NULL || base == NULL || cfg == NULL || cbs == NULL)
        return util_err_set(err, LLMGW_EINVAL, "cache share: missing argument");
    const char *prefix = cfg->prefix ? cfg->prefix : "llmgw:";
    int min = cfg->reconnect_min_ms ? cfg->reconnect_min_ms : 100;
    int max = cfg->reconnect_max_ms ? cfg->reconnect_max_ms : 5000;
    if (strlen(prefix) > PREFIX_MAX)
        return util_err_set(err, LLMGW_EINVAL, "cache share: prefix longer than %d bytes",
                            PREFIX_MAX);
    if (cfg->port < 0 || cfg->port > 65535)
        return util_err_set(err, LLMGW_EINVAL, "cache share: port %d out of range", cfg->port);
    if (cfg->dim < 0 || cfg->dim > (1 << 20))
        return util_err_set(err, LLMGW_EINVAL, "cache share: dim %d out of range", cfg->dim);
    if (cfg->connect_timeout_ms < 0 || cfg->check_timeout_ms < 0 || min < 0 || max < min ||
        cfg->feed_maxlen < 0)
        return util_err_set(err, LLMGW_EINVAL,
                            "cache share: negative timeout or maxlen, or reconnect_min_ms above "
                            "reconnect_max_ms");

    cache_share *s = util_xcalloc(1, sizeof *s);
    s->base = base;
    s->cbs = *cbs;
    s->user = user;
    s->host = util_xstrdup(cfg->host ? cfg->host : "127.0.0.1");
    s->port = cfg->port ? cfg->port : 6379;
    snprintf(s->prefix, sizeof s->prefix, "%s", prefix);
    snprintf(s->feed_key, sizeof s->feed_key, "%sfeed", prefix);
    s->dim = cfg->dim;
    s->connect_timeout_ms = cfg->connect_timeout_ms ? cfg->connect_timeout_ms : 500;
    s->check_timeout_ms = cfg->check_timeout_ms ? cfg->check_timeout_ms : 50;
    s->reconnect_min_ms = min;
    s->reconnect_max_ms = max;
    s->backoff_ms = min;
    snprintf(s->maxlen, sizeof s->maxlen, "%ld", cfg->feed_maxlen ? cfg->feed_maxlen : 100000);
    s->reported = STATE_NONE;
    snprintf(s->last_id, sizeof s->last_id, "0-0");
    if (s->dim > 0) {
        s->vec = util_xcalloc((size_t)s->dim, sizeof *s->vec);
        s->vbuf = util_xmalloc((size_t)s->dim * 4);
    }
    s->connect_timer = evtimer_new(base, connect_timeout_cb, s);
    s->retry_timer = evtimer_new(base, retry_cb, s);
    s->reset_ev = event_new(base, -1, 0, reset_cb, s);
    s->stall_timer = evtimer_new(base, stall_cb, s);
    connect_start(s);
    *out = s;
    return 0;
}

static void check_unlink_free(check *c)
{
    cache_share *s = c->s;
    if (c->prev != NULL)
        c->prev->next = c->next;
    else
        s->checks = c->next;
    if (c->next != NULL)
        c->next->prev = c->prev;
    event_free(c->ev);
    free(c);
}

/* Answers c (once), frees it if hiredis no longer holds it, then calls done last. */
static void check_answer(check *c, int r)
{
    void (*done)(void *, int) = c->done;
    void *user = c->user;
    c->answered = true;
    if (!c->in_redis)
        check_unlink_free(c);
    else
        evtimer_del(c->ev);
    done(user, r);
}

static void check_timer_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    check *c = arg;
    if (c->in_redis)
        c->s->st.check_timeouts++;
    check_answer(c, -1);
}

static void check_reply_cb(redisAsyncContext *ac, void *r, void *priv)
{
    (void)ac;
    check *c = priv;
    redisReply *rep = r;
    c->in_redis = false;
    if (c->answered) {                 /* timed out already, or cache_share_free answered it */
        check_unlink_free(c);
        return;
    }
    int res = -1;
    if (rep != NULL && rep->type == REDIS_REPLY_INTEGER)
        res = rep->integer > 0;
    else if (rep != NULL)
        c->s->st.errors++;
    check_answer(c, res);
}

void cache_share_check(cache_share *s, uint64_t id, void (*done)(void *user, int r), void *user)
{
    check *c = util_xcalloc(1, sizeof *c);
    c->s = s;
    c->done = done;
    c->user = user;
    c->ev = evtimer_new(s->base, check_timer_cb, c);
    c->next = s->checks;
    if (s->checks != NULL)
        s->checks->prev = c;
    s->checks = c;
    s->st.checks++;

    char key[KEY_MAX];
    entry_key(s, id, key);
    const char *argv[] = {"EXISTS", key};
    struct timeval tv = {0, 0};
    if (s->up && !s->closing && send_argv(s->cmd, check_reply_cb, c, 2, argv, NULL)) {
        c->in_redis = true;
        tv.tv_sec = s->check_timeout_ms / 1000;
        tv.tv_usec = (s->check_timeout_ms % 1000) * 1000;
    }
    evtimer_add(c->ev, &tv);   /* zero: Redis is not asked, answer -1 on the next loop turn */
}

static void count_cb(redisAsyncContext *ac, void *r, void *priv)
{
    (void)priv;
    cache_share *s = ac->data;
    redisReply *rep = r;
    if (rep != NULL && rep->type == REDIS_REPLY_ERROR) {
        s->st.errors++;
        UTIL_LOG_DEBUG("cache", "redis: %s", rep->str);
    }
}

static void announce(cache_share *s, const char *op, uint64_t id)
{
    char hex[17];
    snprintf(hex, sizeof hex, "%016" PRIx64, id);
    const char *argv[] = {"XADD", s->feed_key, "MAXLEN", "~", s->maxlen, "*",
                          "op", op, "id", hex};
    if (!send_argv(s->cmd, count_cb, NULL, 10, argv, NULL))
        s->st.errors++;
}

void cache_share_publish(cache_share *s, const cache_entry *e)
{
    if (s == NULL || e == NULL || !s->up || s->cmd == NULL)
        return;                                        /* Redis down: local only */
    if (e->id == 0 || e->id >> 63 || (e->vec != NULL && e->dim != s->dim)) {
        s->st.errors++;
        UTIL_LOG_DEBUG("cache", "entry %016" PRIx64 " not shared: bad id or dim %d", e->id, e->dim);
        return;
    }
    if (e->expires_ms <= (int64_t)util_wall_ms())
        return;
    char key[KEY_MAX], ns[24], exact[24], created[24], expires[24];
    entry_key(s, e->id, key);
    snprintf(ns, sizeof ns, "%" PRIu64, e->ns);
    snprintf(exact, sizeof exact, "%" PRIu64, e->exact);
    snprintf(created, sizeof created, "%" PRId64, e->created_ms);
    snprintf(expires, sizeof expires, "%" PRId64, e->expires_ms);
    size_t vlen = 0;
    if (e->vec != NULL) {
        for (int i = 0; i < s->dim; i++)
            put_f32le(s->vbuf + 4 * (size_t)i, e->vec[i]);
        vlen = (size_t)s->dim * 4;
    }
    const char *q = e->question ? e->question : "";
    const char *argv[] = {"HSET", key, "ns", ns, "exact", exact, "created", created,
                          "expires", expires, "q", q, "v", vlen ? (const char *)s->vbuf : "",
                          "r", e->response ? e->response : "",
                          "t", e->tok != NULL ? (const char *)e->tok : ""};
    size_t lens[18];
    for (int i = 0; i < 13; i++)
        lens[i] = strlen(argv[i]);
    lens[13] = vlen;                                   /* binary */
    lens[14] = 1;
    lens[15] = e->response ? e->response_len : 0;      /* may hold any byte */
    lens[16] = 1;
    lens[17] = e->tok != NULL ? e->tok_len : 0;        /* binary */
    const char *exp_argv[] = {"PEXPIREAT", key, expires};
    if (!send_argv(s->cmd, count_cb, NULL, 18, argv, lens) ||
        !send_argv(s->cmd, count_cb, NULL, 3, exp_argv, NULL)) {
        s->st.errors++;
        return;
    }
    announce(s, "add", e->id);
    s->st.published++;
}

void cache_share_delete(cache_share *s, uint64_t id)
{
    if (s == NULL || !s->up || s->cmd == NULL)
        return;
    char key[KEY_MAX];
    entry_key(s, id, key);
    const char *argv[] = {"DEL", key};
    if (!send_argv(s->cmd, count_cb, NULL, 2, argv, NULL)) {
        s->st.errors++;
        return;
    }
    announce(s, "del", id);
    s->st.deleted++;
}

bool cache_share_up(const cache_share *s)
{
    return s != NULL && s->up;
}

void cache_share_get_stats(const cache_share *s, cache_share_stats *out)
{
    if (s == NULL)
        memset(out, 0, sizeof *out);
    else
        *out = s->st;
}

void cache_share_free(cache_share *s)
{
    if (s == NULL)
        return;
    s->closing = true;
    s->up = false;
    /* Answer every pending check first; a done() that checks again adds one we answer too. */
    for (;;) {
        check *c = s->checks;
        while (c != NULL && c->answered)
            c = c->next;
        if (c == NULL)
            break;
        check_answer(c, -1);
    }
    redisAsyncContext *cmd = s->cmd, *feed = s->feed;
    s->cmd = s->feed = NULL;
    if (cmd != NULL)
        redisAsyncFree(cmd);     /* runs the pending callbacks with NULL replies */
    if (feed != NULL)
        redisAsyncFree(feed);
    while (s->checks != NULL)    /* only answered ones are left, none held by hiredis */
        check_unlink_free(s->checks);
    event_free(s->connect_timer);
    event_free(s->retry_timer);
    event_free(s->reset_ev);
    event_free(s->stall_timer);
    free(s->vec);
    free(s->vbuf);
    free(s->host);
    free(s);
}
