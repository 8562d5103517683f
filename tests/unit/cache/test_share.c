/* tests/unit/cache/test_share.c: cache/share against a real redis-server. The test starts its own
 * redis-server (from PATH) on a free loopback port, drives several cache_share instances on one
 * event loop, and kills, stops and restarts the server to exercise the outage paths. */
#include "cache/share.h"
#include "cache/verifier.h"
#include "common/log.h"
#include "common/time.h"

#include <errno.h>
#include <event2/event.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdbool.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <unistd.h>

#include "tests/unit/unit.h"

#define DIM 8
#define MAX_SEEN 64

static struct {
    pid_t redis;
    int port;
    struct event_base *base;
    int warnings;                 /* WARN lines from the "cache" module */
} g;

/* ---- the redis-server child ---- */

static bool in_path(const char *prog)
{
    const char *path = getenv("PATH");
    char buf[4096];
    while (path != NULL && *path) {
        const char *end = strchr(path, ':');
        size_t n = end ? (size_t)(end - path) : strlen(path);
        snprintf(buf, sizeof buf, "%.*s/%s", (int)n, path, prog);
        if (access(buf, X_OK) == 0)
            return true;
        path = end ? end + 1 : NULL;
    }
    return false;
}

static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &len) != 0) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    close(fd);
    return ntohs(a.sin_port);
}

static redisContext *redis_sync(void)
{
    struct timeval tv = {1, 0};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", g.port, tv);
    if (c != NULL && c->err) {
        redisFree(c);
        return NULL;
    }
    return c;
}

/* Starts redis-server on g.port and waits (at most 10 s) until it answers PING. */
static bool redis_start(void)
{
    char port[16];
    snprintf(port, sizeof port, "%d", g.port);
    pid_t pid = fork();
    if (pid < 0)
        return false;
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);      /* never outlive a crashed test */
        int null = open("/dev/null", O_WRONLY);
        if (null >= 0) {
            dup2(null, STDOUT_FILENO);
            dup2(null, STDERR_FILENO);
        }
        execlp("redis-server", "redis-server", "--port", port, "--bind", "127.0.0.1", "--save",
               "", "--appendonly", "no", "--daemonize", "no", "--loglevel", "warning",
               (char *)NULL);
        _exit(127);
    }
    g.redis = pid;
    for (int i = 0; i < 200; i++) {
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid) {
            g.redis = 0;
            fprintf(stderr, "redis-server exited at start (status %d)\n", st);
            return false;
        }
        redisContext *c = redis_sync();
        if (c != NULL) {
            redisReply *r = redisCommand(c, "PING");
            bool ok = r != NULL && r->type == REDIS_REPLY_STATUS;
            if (r)
                freeReplyObject(r);
            redisFree(c);
            if (ok)
                return true;
        }
        usleep(50 * 1000);
    }
    return false;
}

static void redis_kill(void)
{
    if (g.redis > 0) {
        kill(g.redis, SIGKILL);
        waitpid(g.redis, NULL, 0);
        g.redis = 0;
    }
}

static void count_warnings(util_log_level level, const char *line, void *arg)
{
    (void)arg;
    if (level == UTIL_LOG_WARN && strstr(line, "cache") != NULL)
        g.warnings++;
    fprintf(stderr, "%s\n", line);
}

static int group_setup(void **state)
{
    (void)state;
    if (!in_path("redis-server")) {
        fprintf(stderr, "redis-server is not in PATH: install the redis-server package "
                        "(scripts/setup does)\n");
        return -1;
    }
    g.port = free_port();
    if (g.port <= 0 || !redis_start()) {
        fprintf(stderr, "cannot start redis-server on port %d\n", g.port);
        return -1;
    }
    g.base = event_base_new();
    util_log_set_sink(count_warnings, NULL);
    return g.base ? 0 : -1;
}

static int group_teardown(void **state)
{
    (void)state;
    redis_kill();
    util_log_set_sink(NULL, NULL);
    if (g.base)
        event_base_free(g.base);
    return 0;
}

/* ---- replicas: cache_share instances that record what they are told ---- */

typedef struct seen {
    cache_entry e;                /* deep copy */
} seen;

typedef struct replica {
    cache_share *s;
    int ups, downs;
    seen entries[MAX_SEEN];
    int n_entries;
    uint64_t deleted[MAX_SEEN];
    int n_deleted;
} replica;

static void on_entry(void *user, const cache_entry *e)
{
    replica *r = user;
    if (r->n_entries == MAX_SEEN)
        return;
    cache_entry *c = &r->entries[r->n_entries++].e;
    *c = *e;
    c->question = strdup(e->question);
    c->response = malloc(e->response_len + 1);
    memcpy(c->response, e->response, e->response_len);
    c->response[e->response_len] = '\0';
    if (e->vec != NULL) {
        c->vec = malloc((size_t)e->dim * sizeof(float));
        memcpy(c->vec, e->vec, (size_t)e->dim * sizeof(float));
    }
    if (e->tok != NULL) {
        c->tok = malloc(e->tok_len);
        memcpy(c->tok, e->tok, e->tok_len);
    }
}

static void on_delete(void *user, uint64_t id)
{
    replica *r = user;
    if (r->n_deleted < MAX_SEEN)
        r->deleted[r->n_deleted++] = id;
}

static void on_state(void *user, bool up)
{
    replica *r = user;
    if (up)
        r->ups++;
    else
        r->downs++;
}

static const cache_entry *replica_find(const replica *r, uint64_t id)
{
    for (int i = r->n_entries - 1; i >= 0; i--)
        if (r->entries[i].e.id == id)
            return &r->entries[i].e;
    return NULL;
}

static bool replica_deleted(const replica *r, uint64_t id)
{
    for (int i = 0; i < r->n_deleted; i++)
        if (r->deleted[i] == id)
            return true;
    return false;
}

static void replica_free(replica *r)
{
    cache_share_free(r->s);
    r->s = NULL;
    for (int i = 0; i < r->n_entries; i++) {
        free(r->entries[i].e.question);
        free(r->entries[i].e.response);
        free(r->entries[i].e.vec);
        free(r->entries[i].e.tok);
    }
    r->n_entries = 0;
}

static cache_share_cfg test_cfg(const char *prefix, int port)
{
    cache_share_cfg cfg = {
        .host = "127.0.0.1",
        .port = port,
        .prefix = prefix,
        .dim = DIM,
        .check_timeout_ms = 200,
        .reconnect_min_ms = 50,
        .reconnect_max_ms = 400,
    };
    return cfg;
}

static void replica_start_port(replica *r, const char *prefix, int port)
{
    memset(r, 0, sizeof *r);
    cache_share_cfg cfg = test_cfg(prefix, port);
    cache_share_cbs cbs = {on_entry, on_delete, on_state};
    util_err err = {0};
    int rc = cache_share_start(&r->s, g.base, &cfg, &cbs, r, &err);
    if (rc != 0)
        print_error("cache_share_start: %s\n", err.msg);
    assert_int_equal(rc, 0);
    assert_false(cache_share_up(r->s));   /* connecting happens in the background */
    assert_int_equal(r->ups + r->downs, 0);
}

static void replica_start(replica *r, const char *prefix)
{
    replica_start_port(r, prefix, g.port);
}

/* ---- running the loop ---- */

typedef bool (*cond_fn)(void *arg);

/* Runs the loop in 5 ms slices until cond holds or timeout_ms passes. */
static bool run_until(cond_fn cond, void *arg, int timeout_ms)
{
    uint64_t deadline = util_now_ns() + (uint64_t)timeout_ms * 1000000u;
    for (;;) {
        if (cond != NULL && cond(arg))
            return true;
        if (util_now_ns() >= deadline)
            return cond == NULL;
        struct timeval tv = {0, 5000};
        event_base_loopexit(g.base, &tv);
        if (event_base_dispatch(g.base) == 1)
            usleep(5000);
    }
}

static void run_for(int ms)
{
    run_until(NULL, NULL, ms);
}

static bool is_up(void *arg)
{
    return cache_share_up(((replica *)arg)->s);
}

static bool is_down(void *arg)
{
    return ((replica *)arg)->downs > 0;
}

static void wait_up(replica *r)
{
    assert_true(run_until(is_up, r, 5000));
}

static bool scan_done(void *arg)
{
    cache_share_stats st;
    cache_share_get_stats(((replica *)arg)->s, &st);
    return st.scans > 0;
}

/* Up, and its startup scan over: keys written from now on reach it through the feed only. */
static void wait_scanned(replica *r)
{
    wait_up(r);
    assert_true(run_until(scan_done, r, 5000));
}

typedef struct want_entry {
    replica *r;
    uint64_t id;
} want_entry;

static bool has_entry(void *arg)
{
    want_entry *w = arg;
    return replica_find(w->r, w->id) != NULL;
}

static bool has_deleted(void *arg)
{
    want_entry *w = arg;
    return replica_deleted(w->r, w->id);
}

static void wait_entry(replica *r, uint64_t id)
{
    want_entry w = {r, id};
    if (!run_until(has_entry, &w, 5000)) {
        print_error("entry %llx never reached the replica\n", (unsigned long long)id);
        fail();
    }
}

typedef struct chk {
    int calls;
    int r;
} chk;

static void chk_done(void *user, int r)
{
    chk *c = user;
    c->calls++;
    c->r = r;
}

static bool chk_answered(void *arg)
{
    return ((chk *)arg)->calls > 0;
}

/* Checks id, asserts done() did not run inside the call, waits for the answer and returns it. */
static int check_now(replica *r, uint64_t id)
{
    chk c = {0, 99};
    cache_share_check(r->s, id, chk_done, &c);
    assert_int_equal(c.calls, 0);
    assert_true(run_until(chk_answered, &c, 3000));
    run_for(20);
    assert_int_equal(c.calls, 1);
    return c.r;
}

/* ---- entries ---- */

static uint64_t next_id = 0x1234500000000001ull;

typedef struct made {
    cache_entry e;
    float vec[DIM];
    char response[400];
    char question[64];
    uint8_t tok[64];   /* the verifier's token vectors (two tokens), with the vector */
} made;

static void make_entry(made *m, int64_t ttl_ms, bool with_vec)
{
    memset(m, 0, sizeof *m);
    m->e.id = next_id++;
    m->e.ns = 0xfedcba9876543210ull;
    m->e.exact = 18446744073709551615ull;        /* the largest uint64 survives decimal */
    m->e.created_ms = (int64_t)util_wall_ms();
    m->e.expires_ms = m->e.created_ms + ttl_ms;
    snprintf(m->question, sizeof m->question, "what is \xc3\xa9t\xc3\xa9 #%llu? \"quoted\"\n",
             (unsigned long long)m->e.id);
    m->e.question = m->question;
    const float vals[DIM] = {0.5f, -0.25f, -0.0f, 1e-30f, 0.125f, -0.7071f, 0.3333333f, 1.0f};
    memcpy(m->vec, vals, sizeof vals);
    if (with_vec) {
        m->e.vec = m->vec;
        m->e.dim = DIM;
        float tokens[4 * DIM];  /* [CLS] a b [SEP] */
        for (int i = 0; i < 4 * DIM; i++)
            tokens[i] = (float)((i * 7) % 11) - 5;
        uint8_t *packed = cache_tokens_pack(tokens, 4, DIM, &m->e.tok_len);
        assert_true(m->e.tok_len <= sizeof m->tok);
        memcpy(m->tok, packed, m->e.tok_len);
        free(packed);
        m->e.tok = m->tok;
    }
    for (size_t i = 0; i < sizeof m->response; i++)
        m->response[i] = (char)(i * 37 + 11);     /* every byte value, NULs included */
    m->response[5] = '\0';
    m->e.response = m->response;
    m->e.response_len = sizeof m->response;
}

static void assert_same_entry(const cache_entry *a, const cache_entry *b)
{
    assert_int_equal(a->id, b->id);
    assert_int_equal(a->ns, b->ns);
    assert_int_equal(a->exact, b->exact);
    assert_int_equal(a->created_ms, b->created_ms);
    assert_int_equal(a->expires_ms, b->expires_ms);
    assert_string_equal(a->question, b->question);
    assert_int_equal(a->dim, b->dim);
    assert_int_equal(a->vec == NULL, b->vec == NULL);
    if (a->vec != NULL)
        assert_memory_equal(a->vec, b->vec, (size_t)a->dim * sizeof(float));
    assert_int_equal(a->tok_len, b->tok_len);
    if (a->tok != NULL)
        assert_memory_equal(a->tok, b->tok, a->tok_len);
    assert_int_equal(a->response_len, b->response_len);
    assert_memory_equal(a->response, b->response, a->response_len);
}

/* ---- tests ---- */

static void test_publish_reaches_other(void **state)
{
    (void)state;
    replica a, b;
    replica_start(&a, "pub:");
    replica_start(&b, "pub:");
    wait_up(&a);
    wait_up(&b);
    assert_int_equal(a.ups, 1);
    assert_int_equal(a.downs, 0);

    made m, plain;
    make_entry(&m, 60000, true);
    make_entry(&plain, 60000, false);             /* exact-only: no vector */
    cache_share_publish(a.s, &m.e);
    cache_share_publish(a.s, &plain.e);
    wait_entry(&b, m.e.id);
    wait_entry(&b, plain.e.id);
    assert_same_entry(replica_find(&b, m.e.id), &m.e);
    assert_same_entry(replica_find(&b, plain.e.id), &plain.e);
    wait_entry(&a, m.e.id);                        /* its own announcement comes back too */
    assert_same_entry(replica_find(&a, m.e.id), &m.e);

    cache_share_stats sa, sb;
    cache_share_get_stats(a.s, &sa);
    cache_share_get_stats(b.s, &sb);
    assert_int_equal(sa.published, 2);
    assert_int_equal(sb.received, 2);
    assert_int_equal(sa.errors, 0);
    assert_int_equal(sb.errors, 0);
    replica_free(&a);
    replica_free(&b);
}

static void test_delete_reaches_other(void **state)
{
    (void)state;
    replica a, b;
    replica_start(&a, "del:");
    replica_start(&b, "del:");
    wait_up(&a);
    wait_up(&b);
    made m;
    make_entry(&m, 60000, true);
    cache_share_publish(a.s, &m.e);
    wait_entry(&b, m.e.id);
    assert_int_equal(check_now(&b, m.e.id), 1);
    cache_share_delete(a.s, m.e.id);
    want_entry w = {&b, m.e.id};
    assert_true(run_until(has_deleted, &w, 5000));
    assert_int_equal(check_now(&b, m.e.id), 0);
    cache_share_stats sa;
    cache_share_get_stats(a.s, &sa);
    assert_int_equal(sa.deleted, 1);
    replica_free(&a);
    replica_free(&b);
}

static void test_startup_scan(void **state)
{
    (void)state;
    replica a, c;
    replica_start(&a, "scan:");
    wait_up(&a);
    made m[3];
    for (int i = 0; i < 3; i++) {
        make_entry(&m[i], 60000, i != 1);
        cache_share_publish(a.s, &m[i].e);
    }
    for (int i = 0; i < 3; i++)
        wait_entry(&a, m[i].e.id);                 /* stored in Redis by now */

    replica_start(&c, "scan:");                    /* joins after the entries exist */
    for (int i = 0; i < 3; i++) {
        wait_entry(&c, m[i].e.id);
        assert_same_entry(replica_find(&c, m[i].e.id), &m[i].e);
    }
    cache_share_stats sc;
    cache_share_get_stats(c.s, &sc);
    assert_int_equal(sc.scanned, 3);
    assert_int_equal(sc.errors, 0);

    /* And it follows the feed after the scan. */
    made later;
    make_entry(&later, 60000, true);
    cache_share_publish(a.s, &later.e);
    wait_entry(&c, later.e.id);
    cache_share_get_stats(c.s, &sc);
    assert_int_equal(sc.received, 1);
    replica_free(&a);
    replica_free(&c);
}

static void test_check(void **state)
{
    (void)state;
    replica a;
    replica_start(&a, "chk:");
    wait_up(&a);
    assert_int_equal(check_now(&a, 0x0777777777777777ull), 0);   /* never stored */
    made m;
    make_entry(&m, 60000, true);
    cache_share_publish(a.s, &m.e);
    wait_entry(&a, m.e.id);
    assert_int_equal(check_now(&a, m.e.id), 1);
    cache_share_stats st;
    cache_share_get_stats(a.s, &st);
    assert_int_equal(st.checks, 2);
    assert_int_equal(st.check_timeouts, 0);
    replica_free(&a);
}

static void test_ttl(void **state)
{
    (void)state;
    replica a, b;
    replica_start(&a, "ttl:");
    replica_start(&b, "ttl:");
    wait_up(&a);
    wait_up(&b);
    made m;
    make_entry(&m, 400, true);
    cache_share_publish(a.s, &m.e);
    wait_entry(&b, m.e.id);
    assert_int_equal(check_now(&b, m.e.id), 1);
    run_for(600);
    assert_int_equal(check_now(&b, m.e.id), 0);

    /* An entry already dead is not shared at all. */
    made dead;
    make_entry(&dead, -1, true);
    cache_share_publish(a.s, &dead.e);
    run_for(100);
    assert_null(replica_find(&b, dead.e.id));
    assert_int_equal(check_now(&a, dead.e.id), 0);
    replica_free(&a);
    replica_free(&b);
}

/* Entries written by something else with bad fields are skipped and counted, never reported. */
static void test_bad_entries_skipped(void **state)
{
    (void)state;
    replica b;
    replica_start(&b, "bad:");
    wait_scanned(&b);   /* else a slow scan may meet the bad keys too (errors 10, not 6) */
    redisContext *c = redis_sync();
    assert_non_null(c);
    const char *cmds[] = {
        /* a vector of 7 floats where 8 are expected */
        "HSET bad:e:0000000000000101 ns 1 exact 2 created 3 expires 99999999999999 q x "
        "v 0123456789012345678901234567 r y",
        "XADD bad:feed * op add id 0000000000000101",
        /* no r field */
        "HSET bad:e:0000000000000102 ns 1 exact 2 created 3 expires 99999999999999 q x "
        "v 01234567890123456789012345678901",
        "XADD bad:feed * op add id 0000000000000102",
        /* a number that is not one */
        "HSET bad:e:0000000000000103 ns 1x exact 2 created 3 expires 99999999999999 q x "
        "v 01234567890123456789012345678901 r y",
        "XADD bad:feed * op add id 0000000000000103",
        /* an id that is not 16 hex digits, and an unknown op */
        "XADD bad:feed * op add id 12zz",
        "XADD bad:feed * op frob id 0000000000000104",
        /* a key that is not a hash */
        "SET bad:e:0000000000000105 hello",
        "XADD bad:feed * op add id 0000000000000105",
        /* token vectors whose framing does not add up */
        "HSET bad:e:0000000000000106 ns 1 exact 2 created 3 expires 99999999999999 q x "
        "v 01234567890123456789012345678901 r y t garbage",
        "XADD bad:feed * op add id 0000000000000106",
    };
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
        redisReply *r = redisCommand(c, cmds[i]);
        assert_non_null(r);
        if (r->type == REDIS_REPLY_ERROR)
            print_error("%s: %s\n", cmds[i], r->str);
        assert_int_not_equal(r->type, REDIS_REPLY_ERROR);
        freeReplyObject(r);
    }
    redisFree(c);

    replica a;                                     /* a good entry after the bad ones */
    replica_start(&a, "bad:");
    wait_scanned(&a);
    made m;
    make_entry(&m, 60000, true);
    cache_share_publish(a.s, &m.e);
    wait_entry(&b, m.e.id);
    assert_int_equal(b.n_entries, 1);
    cache_share_stats sb, sa;
    cache_share_get_stats(b.s, &sb);
    assert_int_equal(sb.errors, 7);
    /* a's startup scan met the four bad hashes and the string */
    cache_share_get_stats(a.s, &sa);
    assert_int_equal(sa.errors, 5);
    assert_int_equal(sa.scanned, 0);
    replica_free(&a);
    replica_free(&b);
}

/* A stopped (SIGSTOP) server: checks time out with -1, the late reply does nothing, and a free
 * with checks still in flight answers them -1 exactly once. */
static void test_check_timeout_and_free_pending(void **state)
{
    (void)state;
    replica a;
    replica_start(&a, "slow:");
    wait_up(&a);
    kill(g.redis, SIGSTOP);
    chk c1 = {0, 99};
    uint64_t t0 = util_now_ns();
    cache_share_check(a.s, 0x42, chk_done, &c1);
    assert_true(run_until(chk_answered, &c1, 3000));
    uint64_t waited_ms = (util_now_ns() - t0) / 1000000u;
    assert_int_equal(c1.r, -1);
    assert_in_range(waited_ms, 150, 1500);         /* check_timeout_ms is 200 */
    chk pending[20];
    for (int i = 0; i < 20; i++) {
        pending[i] = (chk){0, 99};
        cache_share_check(a.s, 0x100 + (uint64_t)i, chk_done, &pending[i]);
    }
    kill(g.redis, SIGCONT);
    run_for(300);                                   /* the late reply to c1 arrives */
    assert_int_equal(c1.calls, 1);
    cache_share_stats st;
    cache_share_get_stats(a.s, &st);
    assert_true(st.check_timeouts >= 1);

    /* Free with checks in flight (answered by Redis or not, each exactly once). */
    kill(g.redis, SIGSTOP);
    chk more[20];
    for (int i = 0; i < 20; i++) {
        more[i] = (chk){0, 99};
        cache_share_check(a.s, 0x200 + (uint64_t)i, chk_done, &more[i]);
    }
    run_for(10);
    replica_free(&a);
    kill(g.redis, SIGCONT);
    for (int i = 0; i < 20; i++) {
        assert_int_equal(pending[i].calls, 1);
        assert_int_equal(more[i].calls, 1);
        assert_int_equal(more[i].r, -1);
    }
    run_for(50);                                    /* nothing fires after the free */
    for (int i = 0; i < 20; i++)
        assert_int_equal(more[i].calls, 1);
}

/* A hung server (SIGSTOP: connections still open and even accepted, nothing answered) counts
 * as down after the stall deadline, stays down without flapping, and comes back on SIGCONT. */
static void test_redis_hung(void **state)
{
    (void)state;
    replica a;
    replica_start(&a, "hung:");
    wait_up(&a);
    int warnings = g.warnings;
    kill(g.redis, SIGSTOP);
    uint64_t t0 = util_now_ns();
    bool down = run_until(is_down, &a, 10000);
    uint64_t took_ms = (util_now_ns() - t0) / 1000000u;
    if (!down)
        kill(g.redis, SIGCONT);
    assert_true(down);
    assert_in_range(took_ms, 4000, 9000);           /* STALL_MS is 5000 */
    assert_int_equal(check_now(&a, 9), -1);
    run_for(1500);                                   /* reconnects: accepted, never answered */
    kill(g.redis, SIGCONT);
    assert_int_equal(a.ups, 1);
    assert_int_equal(a.downs, 1);
    assert_int_equal(g.warnings - warnings, 1);
    wait_up(&a);
    assert_int_equal(a.ups, 2);
    made m;
    make_entry(&m, 60000, true);
    cache_share_publish(a.s, &m.e);
    wait_entry(&a, m.e.id);
    replica_free(&a);
}

/* Freed while connecting, and while the startup scan is in flight: no callback afterwards. */
static void test_free_early(void **state)
{
    (void)state;
    replica a, b;
    replica_start(&a, "early:");
    replica_free(&a);                               /* connect(2) still in progress */
    replica_start(&b, "early:");
    wait_up(&b);                                    /* XREVRANGE and SCAN queued, not answered */
    replica_free(&b);
    run_for(100);
    assert_int_equal(a.ups + a.downs, 0);
    assert_int_equal(b.downs, 0);
}

/* Redis absent from the start: reported down once, checks answer -1 promptly, nothing breaks. */
static void test_redis_absent(void **state)
{
    (void)state;
    int port = free_port();
    assert_true(port > 0);
    int warnings = g.warnings;
    replica a;
    replica_start_port(&a, "none:", port);
    chk c = {0, 99};
    cache_share_check(a.s, 1, chk_done, &c);
    assert_int_equal(c.calls, 0);
    assert_true(run_until(chk_answered, &c, 100));
    assert_int_equal(c.r, -1);
    run_for(1000);                                  /* several reconnect attempts */
    assert_int_equal(a.downs, 1);
    assert_int_equal(a.ups, 0);
    assert_int_equal(g.warnings - warnings, 1);     /* one warning per outage */
    made m;
    make_entry(&m, 60000, true);
    cache_share_publish(a.s, &m.e);
    cache_share_delete(a.s, m.e.id);
    chk d = {0, 99};
    cache_share_check(a.s, 1, chk_done, &d);        /* freed before the loop runs again */
    replica_free(&a);
    assert_int_equal(d.calls, 1);
    assert_int_equal(d.r, -1);
}

static replica ka, kb;   /* live across the kill and restart tests */

static void test_redis_killed(void **state)
{
    (void)state;
    replica_start(&ka, "kill:");
    replica_start(&kb, "kill:");
    wait_up(&ka);
    wait_up(&kb);
    int warnings = g.warnings;
    redis_kill();
    chk c = {0, 99};
    cache_share_check(ka.s, 5, chk_done, &c);       /* in flight when the server dies */
    assert_true(run_until(chk_answered, &c, 1000));
    assert_int_equal(c.r, -1);
    run_for(800);                                    /* several failed reconnects */
    assert_int_equal(ka.downs, 1);
    assert_int_equal(kb.downs, 1);
    assert_false(cache_share_up(ka.s));
    assert_int_equal(g.warnings - warnings, 2);      /* once per replica */

    uint64_t t0 = util_now_ns();
    assert_int_equal(check_now(&ka, 6), -1);
    assert_true((util_now_ns() - t0) / 1000000u < 500);
    made m;
    make_entry(&m, 60000, true);
    cache_share_publish(ka.s, &m.e);                 /* dropped, no crash */
    cache_share_delete(ka.s, m.e.id);
    run_for(50);
}

static void test_redis_restarted(void **state)
{
    (void)state;
    assert_non_null(ka.s);
    assert_true(redis_start());                      /* the same port */
    wait_up(&ka);
    wait_up(&kb);
    assert_int_equal(ka.ups, 2);
    assert_int_equal(kb.ups, 2);
    made m;
    make_entry(&m, 60000, true);
    cache_share_publish(ka.s, &m.e);
    wait_entry(&kb, m.e.id);
    assert_same_entry(replica_find(&kb, m.e.id), &m.e);
    assert_int_equal(check_now(&kb, m.e.id), 1);
    cache_share_stats st;
    cache_share_get_stats(ka.s, &st);
    assert_int_equal(st.reconnects, 1);
    replica_free(&ka);
    replica_free(&kb);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_publish_reaches_other),
        cmocka_unit_test(test_delete_reaches_other),
        cmocka_unit_test(test_startup_scan),
        cmocka_unit_test(test_check),
        cmocka_unit_test(test_ttl),
        cmocka_unit_test(test_bad_entries_skipped),
        cmocka_unit_test(test_check_timeout_and_free_pending),
        cmocka_unit_test(test_redis_hung),
        cmocka_unit_test(test_free_early),
        cmocka_unit_test(test_redis_absent),
        cmocka_unit_test(test_redis_killed),
        cmocka_unit_test(test_redis_restarted),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
