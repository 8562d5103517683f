/* tests/fuzz/fuzz_sse.c: the SSE parser fed in random splits must see exactly the events (and
 * the result) it sees when fed all at once; and the writer's framing of any bytes parses back
 * to those bytes with \r\n and \r read as \n.
 * Input: byte 0 picks max_bytes (16 << (b % 16)), byte 1 the event after which the callback
 * stops (0: never), bytes 2..9 seed the split points; the rest is the stream. */
#include "gateway/sse.h"

#include "common/err.h"

#include <event2/buffer.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(c)                                                                                 \
    do {                                                                                         \
        if (!(c))                                                                                \
            __builtin_trap();                                                                    \
    } while (0)

typedef struct summary {
    uint64_t hash;       /* FNV-1a over every event's type, length and data */
    size_t n;
    size_t stop_after;   /* 0: never stop */
} summary;

static void mix(uint64_t *h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        *h = (*h ^ b[i]) * 1099511628211u;
}

static int on_event(void *arg, const char *event, const char *data, size_t len)
{
    summary *s = arg;
    CHECK(data[len] == '\0');
    CHECK(strlen(event) < 64);
    mix(&s->hash, event, strlen(event) + 1);
    mix(&s->hash, &len, sizeof len);
    mix(&s->hash, data, len);
    s->n++;
    return s->n == s->stop_after ? 99 : 0;
}

static int run(summary *s, const char *buf, size_t len, size_t max_bytes, uint64_t seed)
{
    gw_sse_parser p;
    gw_sse_parser_init(&p, max_bytes);
    size_t at = 0;
    int rc = 0;
    while (at < len && rc == 0) {
        size_t n = len - at;
        if (seed != 0) {
            seed = seed * 6364136223846793005u + 1442695040888963407u;
            n = (size_t)(seed >> 33) % (n < 17 ? n + 1 : 17);  /* 0..16 bytes, empty feeds too */
        }
        /* Each chunk is its own allocation, so reading past a chunk is caught. */
        char *chunk = malloc(n ? n : 1);
        memcpy(chunk, buf + at, n);
        rc = gw_sse_parser_feed(&p, chunk, n, on_event, s);
        free(chunk);
        at += n;
    }
    gw_sse_parser_deinit(&p);
    return rc;
}

static void round_trip(const char *buf, size_t len)
{
    struct evbuffer *out = evbuffer_new();
    gw_sse_write(out, buf, len);
    size_t n = evbuffer_get_length(out);
    char *framed = malloc(n);
    evbuffer_remove(out, framed, n);
    evbuffer_free(out);

    /* the expected data: line ends normalised to \n */
    char *want = malloc(len + 1);
    size_t w = 0;
    for (size_t i = 0; i < len; i++) {
        if (buf[i] == '\r') {
            want[w++] = '\n';
            if (i + 1 < len && buf[i + 1] == '\n')
                i++;
        } else {
            want[w++] = buf[i];
        }
    }
    summary got = {.hash = 1469598103934665603u}, expect = {.hash = 1469598103934665603u};
    CHECK(run(&got, framed, n, SIZE_MAX, 0) == 0);
    CHECK(got.n == 1);
    mix(&expect.hash, "", 1);
    mix(&expect.hash, &w, sizeof w);
    mix(&expect.hash, want, w);
    CHECK(got.hash == expect.hash);
    free(want);
    free(framed);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 10)
        return 0;
    size_t max_bytes = (size_t)16 << (data[0] % 16);
    size_t stop_after = data[1];
    uint64_t seed;
    memcpy(&seed, data + 2, sizeof seed);
    seed |= 1;
    const char *buf = (const char *)data + 10;
    size_t len = size - 10;

    summary whole = {.hash = 1469598103934665603u, .stop_after = stop_after};
    summary split = whole, bytewise = whole;
    int rc_whole = run(&whole, buf, len, max_bytes, 0);
    int rc_split = run(&split, buf, len, max_bytes, seed);
    CHECK(rc_whole == 0 || rc_whole == LLMGW_ERANGE || rc_whole == 99);
    CHECK(rc_whole == rc_split);
    CHECK(whole.n == split.n && whole.hash == split.hash);
    if (len <= 256) {
        gw_sse_parser p;
        gw_sse_parser_init(&p, max_bytes);
        int rc = 0;
        for (size_t i = 0; i < len && rc == 0; i++)
            rc = gw_sse_parser_feed(&p, buf + i, 1, on_event, &bytewise);
        gw_sse_parser_deinit(&p);
        CHECK(rc == rc_whole);
        CHECK(bytewise.n == whole.n && bytewise.hash == whole.hash);
    }
    round_trip(buf, len);
    return 0;
}
