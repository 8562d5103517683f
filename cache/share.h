/* cache/share.h: the cache shared across replicas through Redis (hiredis 0.14, async, on the
 * event loop through hiredis's libevent adapter: nothing here ever blocks the loop).
 *
 * Layout under cfg.prefix (default "llmgw:"):
 *   <prefix>e:<id as 16 hex digits>  a hash: ns, exact, created, expires (decimal), q (question),
 *                                    v (embedding: dim little-endian float32, binary), r (response)
 *                                    with PEXPIREAT = expires, so Redis drops it with the TTL;
 *   <prefix>feed                     a stream (MAXLEN ~ cfg.feed_maxlen): fields op (add|del), id.
 * Every replica reads the feed (XREAD BLOCK on a second connection, from the last id it saw) and
 * reports new and deleted entries through the callbacks; its own announcements come back too
 * (the store ignores an id it holds). On every (re)connect the replica scans <prefix>e:* and
 * reports each live entry (on_entry), then follows the feed from the id that was last before the
 * scan. Redis down or restarted: publish/delete are dropped (local-only), check answers
 * "unavailable", a warning is logged once, and reconnects back off from reconnect_min_ms to
 * reconnect_max_ms. All callbacks run on the loop thread. */
#ifndef LLMGW_CACHE_SHARE_H
#define LLMGW_CACHE_SHARE_H

#include "cache/entry.h"
#include "common/err.h"

#include <stdbool.h>
#include <stdint.h>

struct event_base;
typedef struct cache_share cache_share;

typedef struct cache_share_cfg {
    const char *host;        /* "127.0.0.1" */
    int port;                /* 6379 */
    const char *prefix;      /* NULL = "llmgw:" */
    int dim;                 /* embedding width; an entry whose v has another size is skipped */
    int connect_timeout_ms;  /* 0 = 500 */
    int check_timeout_ms;    /* cache_share_check gives up after this; 0 = 50 */
    int reconnect_min_ms;    /* 0 = 100 */
    int reconnect_max_ms;    /* 0 = 5000 */
    long feed_maxlen;        /* 0 = 100000 */
} cache_share_cfg;

typedef struct cache_share_cbs {
    /* An entry announced by a replica (this one included) or found by the startup scan. The
     * entry and its strings live only during the call: copy what you keep. */
    void (*on_entry)(void *user, const cache_entry *e);
    void (*on_delete)(void *user, uint64_t id);
    void (*on_state)(void *user, bool up);   /* connection up / down (may be NULL) */
} cache_share_cbs;

/* Starts connecting (in the background; returns before Redis answers). */
int  cache_share_start(cache_share **out, struct event_base *base, const cache_share_cfg *cfg,
                       const cache_share_cbs *cbs, void *user, util_err *err);
/* Disconnects; no callback runs after it returns (pending checks are answered -1 first). */
void cache_share_free(cache_share *s);

/* Stores e in Redis with its TTL and announces it on the feed. Fire and forget. */
void cache_share_publish(cache_share *s, const cache_entry *e);
/* Deletes the entry and announces the deletion. Fire and forget. */
void cache_share_delete(cache_share *s, uint64_t id);

/* Asks whether the entry still lives in Redis. done(user, r) runs exactly once, on the loop
 * thread, never inside this call: r = 1 present, 0 gone (deleted or expired), -1 unknown (Redis
 * down or slower than check_timeout_ms: serve from the local store). */
void cache_share_check(cache_share *s, uint64_t id, void (*done)(void *user, int r), void *user);

bool cache_share_up(const cache_share *s);

typedef struct cache_share_stats {
    uint64_t published, deleted, received, scanned, scans, checks, check_timeouts, reconnects,
        errors;
} cache_share_stats;
void cache_share_get_stats(const cache_share *s, cache_share_stats *out);

#endif
