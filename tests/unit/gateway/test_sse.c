/* tests/unit/gateway/test_sse.c: SSE framing. The writer's exact bytes for single- and
 * multi-line data; the parser's events for every way the same bytes can be split, for LF, CRLF
 * and CR line ends, comments, fields, partial events, limits and a callback that stops it. */
#include "gateway/sse.h"

#include "common/err.h"

#include <event2/buffer.h>
#include <stdlib.h>

#include "tests/unit/unit.h"

/* ---- writer ---- */

/* The writer's output for `len` bytes of `data`, NUL-terminated (caller frees). */
static char *written(const char *data, size_t len)
{
    struct evbuffer *b = evbuffer_new();
    gw_sse_write(b, data, len);
    size_t n = evbuffer_get_length(b);
    char *s = malloc(n + 1);
    evbuffer_remove(b, s, n);
    s[n] = '\0';
    evbuffer_free(b);
    return s;
}

static void expect_written(const char *data, const char *want)
{
    char *got = written(data, strlen(data));
    assert_string_equal(got, want);
    free(got);
}

static void write_single_line(void **state)
{
    (void)state;
    expect_written("hello", "data: hello\n\n");
    expect_written("{\"id\":\"c1\",\"choices\":[]}", "data: {\"id\":\"c1\",\"choices\":[]}\n\n");
    expect_written(GW_SSE_DONE, "data: [DONE]\n\n");
    expect_written("", "data: \n\n");
    expect_written(" leading space", "data:  leading space\n\n");
}

static void write_multi_line(void **state)
{
    (void)state;
    expect_written("a\nb", "data: a\ndata: b\n\n");
    expect_written("a\r\nb", "data: a\ndata: b\n\n");
    expect_written("a\rb", "data: a\ndata: b\n\n");
    expect_written("a\n\nb", "data: a\ndata: \ndata: b\n\n");
    expect_written("a\r\rb", "data: a\ndata: \ndata: b\n\n");
    expect_written("a\n\rb", "data: a\ndata: \ndata: b\n\n");   /* \n then \r: two breaks */
    expect_written("a\r\r\nb", "data: a\ndata: \ndata: b\n\n"); /* \r then \r\n */
    expect_written("a\n", "data: a\ndata: \n\n");
    expect_written("a\r\n", "data: a\ndata: \n\n");
    expect_written("\n", "data: \ndata: \n\n");
    expect_written("x\ny\r\nz\rw", "data: x\ndata: y\ndata: z\ndata: w\n\n");
}

static void write_uses_length(void **state)
{
    (void)state;
    char *got = written("abc\ndef", 5);    /* "abc\nd" */
    assert_string_equal(got, "data: abc\ndata: d\n\n");
    free(got);
    got = written("a\0b", 3);               /* NUL bytes go through untouched */
    assert_memory_equal(got, "data: a\0b\n\n", 11);
    free(got);
}

/* ---- parser ---- */

#define MAX_EVENTS 64

typedef struct recorder {
    size_t n;
    char event[MAX_EVENTS][64];
    char *data[MAX_EVENTS];
    size_t len[MAX_EVENTS];
    int stop_after;   /* return `stop_rc` from the callback for event number stop_after (1-based) */
    int stop_rc;
} recorder;

static int record(void *arg, const char *event, const char *data, size_t len)
{
    recorder *r = arg;
    assert_true(r->n < MAX_EVENTS);
    assert_int_equal(data[len], '\0');
    snprintf(r->event[r->n], sizeof r->event[r->n], "%s", event);
    r->data[r->n] = malloc(len + 1);
    memcpy(r->data[r->n], data, len + 1);
    r->len[r->n] = len;
    r->n++;
    return (int)r->n == r->stop_after ? r->stop_rc : 0;
}

static void recorder_clear(recorder *r)
{
    for (size_t i = 0; i < r->n; i++)
        free(r->data[i]);
    memset(r, 0, sizeof *r);
}

/* Feeds `len` bytes cut before each offset in cuts[0..n_cuts) (ascending); returns the first
 * non-zero feed result, or 0. */
static int feed_split(recorder *rec, size_t max_bytes, const char *s, size_t len,
                      const size_t *cuts, size_t n_cuts)
{
    gw_sse_parser p;
    gw_sse_parser_init(&p, max_bytes);
    size_t at = 0;
    int rc = 0;
    for (size_t i = 0; i <= n_cuts && rc == 0; i++) {
        size_t end = i < n_cuts ? cuts[i] : len;
        rc = gw_sse_parser_feed(&p, s + at, end - at, record, rec);
        at = end;
    }
    gw_sse_parser_deinit(&p);
    return rc;
}

static int feed_all(recorder *rec, const char *s)
{
    return feed_split(rec, 1 << 20, s, strlen(s), NULL, 0);
}

static void assert_same_events(const recorder *a, const recorder *b)
{
    assert_int_equal(a->n, b->n);
    for (size_t i = 0; i < a->n; i++) {
        assert_string_equal(a->event[i], b->event[i]);
        assert_int_equal(a->len[i], b->len[i]);
        assert_memory_equal(a->data[i], b->data[i], a->len[i]);
    }
}

static void expect_event(const recorder *r, size_t i, const char *event, const char *data)
{
    assert_true(i < r->n);
    assert_string_equal(r->event[i], event);
    assert_string_equal(r->data[i], data);
    assert_int_equal(r->len[i], strlen(data));
}

static void parse_one_event(void **state)
{
    (void)state;
    recorder r = {0};
    assert_int_equal(feed_all(&r, "data: hello\n\n"), 0);
    assert_int_equal(r.n, 1);
    expect_event(&r, 0, "", "hello");
    recorder_clear(&r);

    /* no space after the colon, and only one space is stripped */
    assert_int_equal(feed_all(&r, "data:x\n\ndata:  two\n\ndata\n\n"), 0);
    assert_int_equal(r.n, 3);
    expect_event(&r, 0, "", "x");
    expect_event(&r, 1, "", " two");
    expect_event(&r, 2, "", "");  /* a field name alone is an empty value */
    recorder_clear(&r);
}

static void parse_multiple_data_lines(void **state)
{
    (void)state;
    recorder r = {0};
    assert_int_equal(feed_all(&r, "data: a\ndata: b\ndata:\ndata: c\n\n"), 0);
    assert_int_equal(r.n, 1);
    expect_event(&r, 0, "", "a\nb\n\nc");
    recorder_clear(&r);
}

static void parse_event_field(void **state)
{
    (void)state;
    recorder r = {0};
    assert_int_equal(feed_all(&r, "event: ping\ndata: 1\n\ndata: 2\n\n"
                                  "data: 3\nevent:error\n\n"),
                     0);
    assert_int_equal(r.n, 3);
    expect_event(&r, 0, "ping", "1");
    expect_event(&r, 1, "", "2");       /* the type resets after each event */
    expect_event(&r, 2, "error", "3");  /* the field may come after the data */
    recorder_clear(&r);

    /* an over-long type is cut to the buffer, never overflowing it */
    char long_event[256];
    memset(long_event, 'e', 200);
    long_event[200] = '\0';
    char body[300];
    snprintf(body, sizeof body, "event: %s\ndata: x\n\n", long_event);
    assert_int_equal(feed_all(&r, body), 0);
    assert_int_equal(r.n, 1);
    assert_int_equal(strlen(r.event[0]), 63);
    recorder_clear(&r);
}

static void parse_ignores_comments_and_other_fields(void **state)
{
    (void)state;
    recorder r = {0};
    assert_int_equal(feed_all(&r, ": keep-alive\n\n:\n\n: comment\ndata: x\n: more\n\n"
                                  "id: 7\nretry: 1000\nfoo: bar\ndata: y\n\n"),
                     0);
    assert_int_equal(r.n, 2);
    expect_event(&r, 0, "", "x");
    expect_event(&r, 1, "", "y");
    recorder_clear(&r);
}

static void parse_event_without_data_is_dropped(void **state)
{
    (void)state;
    recorder r = {0};
    assert_int_equal(feed_all(&r, "event: lonely\n\n\n\n\ndata: after\n\n"), 0);
    assert_int_equal(r.n, 1);
    expect_event(&r, 0, "", "after");
    recorder_clear(&r);
}

static void parse_line_endings(void **state)
{
    (void)state;
    static const char *forms[] = {
        "event: e\ndata: a\ndata: b\n\ndata: c\n\n",
        "event: e\r\ndata: a\r\ndata: b\r\n\r\ndata: c\r\n\r\n",
        "event: e\rdata: a\rdata: b\r\rdata: c\r\r",
        "event: e\r\ndata: a\rdata: b\n\r\ndata: c\r\n\n",
    };
    for (size_t i = 0; i < sizeof forms / sizeof forms[0]; i++) {
        recorder r = {0};
        assert_int_equal(feed_all(&r, forms[i]), 0);
        assert_int_equal(r.n, 2);
        expect_event(&r, 0, "e", "a\nb");
        expect_event(&r, 1, "", "c");
        recorder_clear(&r);
    }
}

static void parse_trailing_partial_event(void **state)
{
    (void)state;
    recorder r = {0};
    gw_sse_parser p;
    gw_sse_parser_init(&p, 1 << 16);
    const char *s = "data: one\n\ndata: two\n";
    assert_int_equal(gw_sse_parser_feed(&p, s, strlen(s), record, &r), 0);
    assert_int_equal(r.n, 1);  /* "two" has no blank line yet */
    assert_int_equal(gw_sse_parser_feed(&p, "data: more", 10, record, &r), 0);
    assert_int_equal(r.n, 1);
    assert_int_equal(gw_sse_parser_feed(&p, "\n\n", 2, record, &r), 0);
    assert_int_equal(r.n, 2);
    expect_event(&r, 1, "", "two\nmore");
    /* a last line without its end is not a line yet */
    assert_int_equal(gw_sse_parser_feed(&p, "data: x\n", 8, record, &r), 0);
    assert_int_equal(gw_sse_parser_feed(&p, "", 0, record, &r), 0);
    assert_int_equal(r.n, 2);
    gw_sse_parser_deinit(&p);
    recorder_clear(&r);
}

/* A \r at the end of one chunk and \n at the start of the next is one line end, not two. */
static void parse_crlf_across_chunks(void **state)
{
    (void)state;
    recorder r = {0};
    gw_sse_parser p;
    gw_sse_parser_init(&p, 1 << 16);
    assert_int_equal(gw_sse_parser_feed(&p, "data: a\r", 8, record, &r), 0);
    assert_int_equal(gw_sse_parser_feed(&p, "\n", 1, record, &r), 0);
    assert_int_equal(r.n, 0);
    assert_int_equal(gw_sse_parser_feed(&p, "data: b\r", 8, record, &r), 0);
    assert_int_equal(gw_sse_parser_feed(&p, "\n\r", 2, record, &r), 0);
    assert_int_equal(r.n, 1);
    expect_event(&r, 0, "", "a\nb");
    gw_sse_parser_deinit(&p);
    recorder_clear(&r);
}

static const char k_stream[] =
    ": hello\r\n"
    "event: message\n"
    "data: {\"id\":\"1\",\"choices\":[{\"delta\":{\"content\":\"Hel\"}}]}\n\n"
    "data: {\"id\":\"1\",\"choices\":[{\"delta\":{\"content\":\"lo\\n\"}}]}\r\n\r\n"
    "data: line1\rdata: line2\r\r"
    "id: 3\r\n"
    "data\r\n"
    "data:\r\n\r\n"
    "event: x\n\n"
    "retry: 10\n"
    "data: \xe4\xbd\xa0\xe5\xa5\xbd\n\n"
    "data: [DONE]\n\n"
    "data: partial";

static void split_every_byte(void **state)
{
    (void)state;
    const size_t len = sizeof k_stream - 1;
    recorder whole = {0}, r = {0};
    assert_int_equal(feed_split(&whole, 1 << 16, k_stream, len, NULL, 0), 0);
    assert_int_equal(whole.n, 6);
    expect_event(&whole, 0, "message",
                 "{\"id\":\"1\",\"choices\":[{\"delta\":{\"content\":\"Hel\"}}]}");
    expect_event(&whole, 2, "", "line1\nline2");
    expect_event(&whole, 3, "", "\n");
    expect_event(&whole, 4, "", "\xe4\xbd\xa0\xe5\xa5\xbd");
    expect_event(&whole, 5, "", "[DONE]");

    /* one byte at a time */
    size_t cuts[sizeof k_stream];
    for (size_t i = 0; i + 1 < len; i++)
        cuts[i] = i + 1;
    assert_int_equal(feed_split(&r, 1 << 16, k_stream, len, cuts, len - 1), 0);
    assert_same_events(&whole, &r);
    recorder_clear(&r);

    /* two chunks, cut at every offset (including empty first and last chunks) */
    for (size_t c = 0; c <= len; c++) {
        assert_int_equal(feed_split(&r, 1 << 16, k_stream, len, &c, 1), 0);
        assert_same_events(&whole, &r);
        recorder_clear(&r);
    }
    /* three chunks, every pair of offsets */
    for (size_t a = 0; a <= len; a++) {
        for (size_t b = a; b <= len; b++) {
            size_t two[2] = {a, b};
            assert_int_equal(feed_split(&r, 1 << 16, k_stream, len, two, 2), 0);
            assert_same_events(&whole, &r);
            recorder_clear(&r);
        }
    }
    recorder_clear(&whole);
}

static void split_random(void **state)
{
    (void)state;
    const size_t len = sizeof k_stream - 1;
    recorder whole = {0}, r = {0};
    assert_int_equal(feed_split(&whole, 1 << 16, k_stream, len, NULL, 0), 0);
    uint32_t x = 12345;  /* a fixed LCG: failures reproduce */
    for (int iter = 0; iter < 2000; iter++) {
        size_t cuts[64], n = 0, at = 0;
        while (n < 64) {
            x = x * 1103515245u + 12345u;
            at += (x >> 16) % 24;
            if (at > len)
                break;
            cuts[n++] = at;
        }
        assert_int_equal(feed_split(&r, 1 << 16, k_stream, len, cuts, n), 0);
        assert_same_events(&whole, &r);
        recorder_clear(&r);
    }
    recorder_clear(&whole);
}

/* What the writer frames, the parser gives back (with \r\n and \r read as \n). */
static void writer_parser_round_trip(void **state)
{
    (void)state;
    static const char *in[] = {"plain", "", "a\nb", "a\r\nb\rc", "\n\n", "x\r", GW_SSE_DONE};
    static const char *out[] = {"plain", "", "a\nb", "a\nb\nc", "\n\n", "x\n", "[DONE]"};
    for (size_t i = 0; i < sizeof in / sizeof in[0]; i++) {
        char *framed = written(in[i], strlen(in[i]));
        recorder r = {0};
        assert_int_equal(feed_all(&r, framed), 0);
        assert_int_equal(r.n, 1);
        expect_event(&r, 0, "", out[i]);
        recorder_clear(&r);
        free(framed);
    }
}

/* max_bytes bounds a line and an event's data: at the limit it is accepted, one byte past it
 * is LLMGW_ERANGE, whether the bytes come at once or one by one. */
static void max_bytes_limit(void **state)
{
    (void)state;
    enum { MAX = 32 };
    char line[MAX + 8];
    recorder r = {0};

    /* a line of exactly MAX bytes ("data: " + 26) */
    snprintf(line, sizeof line, "data: %.*s\n\n", MAX - 6, "abcdefghijklmnopqrstuvwxyz0123456789");
    assert_int_equal(feed_split(&r, MAX, line, strlen(line), NULL, 0), 0);
    assert_int_equal(r.n, 1);
    assert_int_equal(r.len[0], MAX - 6);
    recorder_clear(&r);

    /* MAX + 1 bytes */
    snprintf(line, sizeof line, "data: %.*s\n\n", MAX - 5, "abcdefghijklmnopqrstuvwxyz0123456789");
    assert_int_equal(feed_split(&r, MAX, line, strlen(line), NULL, 0), LLMGW_ERANGE);
    assert_int_equal(r.n, 0);
    size_t cuts[MAX + 8];
    size_t len = strlen(line);
    for (size_t i = 0; i + 1 < len; i++)
        cuts[i] = i + 1;
    assert_int_equal(feed_split(&r, MAX, line, len, cuts, len - 1), LLMGW_ERANGE);
    assert_int_equal(r.n, 0);

    /* a comment line counts too: it is held until its end arrives */
    char comment[64];
    memset(comment, 'c', sizeof comment);
    comment[0] = ':';
    assert_int_equal(feed_split(&r, MAX, comment, sizeof comment, NULL, 0), LLMGW_ERANGE);

    /* short lines whose data adds up past MAX: "0123456789" x 3 + 2 joining \n = 32 is fine */
    const char *ok = "data: 0123456789\ndata: 0123456789\ndata: 0123456789\n\n";
    assert_int_equal(feed_split(&r, MAX, ok, strlen(ok), NULL, 0), 0);
    assert_int_equal(r.n, 1);
    assert_int_equal(r.len[0], MAX);
    recorder_clear(&r);
    const char *big = "data: 0123456789\ndata: 0123456789\ndata: 0123456789\ndata: x\n\n";
    assert_int_equal(feed_split(&r, MAX, big, strlen(big), NULL, 0), LLMGW_ERANGE);
    assert_int_equal(r.n, 0);

    /* events before the one that is too large are still delivered */
    const char *mixed = "data: small\n\ndata: 0123456789012345678901234567890123456789\n\n";
    assert_int_equal(feed_split(&r, MAX, mixed, strlen(mixed), NULL, 0), LLMGW_ERANGE);
    assert_int_equal(r.n, 1);
    expect_event(&r, 0, "", "small");
    recorder_clear(&r);
}

static void callback_stops_the_feed(void **state)
{
    (void)state;
    recorder r = {0};
    r.stop_after = 2;
    r.stop_rc = 7;
    const char *s = "data: 1\n\ndata: 2\n\ndata: 3\n\n";
    assert_int_equal(feed_split(&r, 1 << 16, s, strlen(s), NULL, 0), 7);
    assert_int_equal(r.n, 2);  /* event 3 never reaches the callback */
    expect_event(&r, 1, "", "2");
    recorder_clear(&r);

    r.stop_after = 1;
    r.stop_rc = -1;
    assert_int_equal(feed_split(&r, 1 << 16, s, strlen(s), NULL, 0), -1);
    assert_int_equal(r.n, 1);
    recorder_clear(&r);

    /* the same when the stopping event's last byte arrives alone */
    r.stop_after = 1;
    r.stop_rc = 3;
    size_t cut = 8;
    assert_int_equal(feed_split(&r, 1 << 16, s, strlen(s), &cut, 1), 3);
    assert_int_equal(r.n, 1);
    recorder_clear(&r);
}

static void deinit_is_safe(void **state)
{
    (void)state;
    gw_sse_parser p;
    gw_sse_parser_init(&p, 100);
    gw_sse_parser_deinit(&p);   /* nothing allocated yet */
    gw_sse_parser_deinit(&p);   /* and twice */
    recorder r = {0};
    gw_sse_parser_init(&p, 100);
    assert_int_equal(gw_sse_parser_feed(&p, "data: half", 10, record, &r), 0);
    gw_sse_parser_deinit(&p);   /* with a partial line and event held */
    assert_int_equal(r.n, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(write_single_line),
        cmocka_unit_test(write_multi_line),
        cmocka_unit_test(write_uses_length),
        cmocka_unit_test(parse_one_event),
        cmocka_unit_test(parse_multiple_data_lines),
        cmocka_unit_test(parse_event_field),
        cmocka_unit_test(parse_ignores_comments_and_other_fields),
        cmocka_unit_test(parse_event_without_data_is_dropped),
        cmocka_unit_test(parse_line_endings),
        cmocka_unit_test(parse_trailing_partial_event),
        cmocka_unit_test(parse_crlf_across_chunks),
        cmocka_unit_test(split_every_byte),
        cmocka_unit_test(split_random),
        cmocka_unit_test(writer_parser_round_trip),
        cmocka_unit_test(max_bytes_limit),
        cmocka_unit_test(callback_stops_the_feed),
        cmocka_unit_test(deinit_is_safe),
    };
    return cmocka_run_group_tests_name("gateway/sse", tests, NULL, NULL);
}
