/* tests/unit/gateway/test_reply.c: the reply layer alone (gateway/reply.c over a recording
 * transport): whole answers and OpenAI error bodies, SSE framing, a forwarded stream split
 * anywhere, an error sent mid-stream, output filters in order, and the end of an answer run
 * exactly once however it ends (sent, broken, abandoned). */
#include "gateway/reply.h"

#include "gateway/sse.h"

#include "tests/unit/unit.h"
#include "tests/unit/gateway/fake.h"

static const char k_config[] =
    "tiers:\n"
    "  - {name: up, base_url: 'http://127.0.0.1:9'}\n";

/* A filter that writes down what it saw, in order, into a shared log. */
typedef struct seen {
    char log[4096];
    const char *name;
} seen;

static char g_log[8192];

static void f_headers(gw_req *r, void *ctx)
{
    seen *s = ctx;
    char v[64];
    snprintf(v, sizeof v, "from-%s", s->name);
    gw_reply_header(r, "x-filter", v);
    strcat(g_log, s->name);
    strcat(g_log, ":headers;");
}

static void f_body(gw_req *r, void *ctx, int status, const char *data, size_t len)
{
    seen *s = ctx;
    (void)r;
    char line[256];
    snprintf(line, sizeof line, "%s:body %d %.*s;", s->name, status, (int)(len < 60 ? len : 60),
             data);
    strcat(g_log, line);
}

static void f_event(gw_req *r, void *ctx, const char *data, size_t len,
                    const gw_stream_info *info)
{
    seen *s = ctx;
    (void)r;
    char line[256];
    if (info != NULL)
        snprintf(line, sizeof line, "%s:event %.*s (info %.*s);", s->name, (int)len, data,
                 (int)info->len, info->text ? info->text : "");
    else
        snprintf(line, sizeof line, "%s:event %.*s;", s->name, (int)len, data);
    strcat(g_log, line);
}

static void f_end(gw_req *r, void *ctx)
{
    seen *s = ctx;
    char line[64];
    snprintf(line, sizeof line, "%s:end %d;", s->name, r->status);
    strcat(g_log, line);
}

static const gw_filter k_filter = {f_headers, f_body, f_event, f_end};

static int setup(void **state)
{
    static fake_srv f;
    fake_srv_init(&f, k_config);
    g_log[0] = '\0';
    *state = &f;
    return 0;
}

static int teardown(void **state)
{
    fake_srv_deinit(*state);
    return 0;
}

static void error_body_is_escaped_json(void **state)
{
    fake_srv *f = *state;
    rec x = {0};
    gw_req *r = fake_req(f, &x, "req_1");
    gw_reply_error(r, 400, "invalid_request_error", "messages.[0]", "bad", "quote \" tab \t "
                   "nl \n bs \\ ctl \x01 end");
    assert_int_equal(f->done, 1);
    assert_int_equal(f->last_status, 400);
    assert_true(x.sent);
    assert_int_equal(x.status, 400);
    cJSON *o = cJSON_Parse(x.body);
    assert_non_null(o);
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(o, "error");
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(e, "message")->valuestring,
                        "quote \" tab \t nl \n bs \\ ctl \x01 end");
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(e, "type")->valuestring,
                        "invalid_request_error");
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(e, "param")->valuestring,
                        "messages.[0]");
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(e, "code")->valuestring, "bad");
    cJSON_Delete(o);
    char v[128];
    assert_string_equal(rec_find(&x, "Content-Type", v, sizeof v), "application/json");
    assert_string_equal(rec_find(&x, "x-request-id", v, sizeof v), "req_1");
    assert_null(rec_find(&x, "x-llmgw-tier", v, sizeof v));  /* not routed */
}

static void null_param_and_code(void **state)
{
    fake_srv *f = *state;
    rec x = {0};
    gw_req *r = fake_req(f, &x, "req_2");
    r->tier = 0;
    gw_reply_error(r, 502, "upstream_error", NULL, NULL, "down");
    cJSON *o = cJSON_Parse(x.body);
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(o, "error");
    assert_true(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(e, "param")));
    assert_true(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(e, "code")));
    cJSON_Delete(o);
    char v[64];
    assert_string_equal(rec_find(&x, "x-llmgw-tier", v, sizeof v), "up");
}

static void filters_run_in_order_once(void **state)
{
    fake_srv *f = *state;
    rec x = {0};
    seen a = {.name = "a"}, b = {.name = "b"};
    gw_req *r = fake_req(f, &x, "req_3");
    gw_reply_filter(r, &k_filter, &a);
    gw_reply_filter(r, &k_filter, &b);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "k", "v");
    gw_reply_json(r, 200, o);
    assert_string_equal(g_log, "a:body 200 {\"k\":\"v\"}\n;b:body 200 {\"k\":\"v\"}\n;"
                               "a:headers;b:headers;a:end 200;b:end 200;");
    assert_contains(x.headers, "x-filter: from-a\nx-filter: from-b\n");
    assert_int_equal(f->done, 1);
}

static void stream_frames_events(void **state)
{
    fake_srv *f = *state;
    rec x = {0};
    seen a = {.name = "a"};
    gw_req *r = fake_req(f, &x, "req_4");
    gw_reply_filter(r, &k_filter, &a);
    gw_stream_begin(r, 200, "text/event-stream");
    assert_true(x.started);
    assert_true(r->replying);
    gw_stream_event(r, "{\"n\":1}", 7);
    struct evbuffer *b = evbuffer_new();
    evbuffer_add(b, "two\nlines", 9);
    gw_stream_info info = {.text = "tw", .len = 2};
    gw_stream_buffer_info(r, b, &info);
    assert_int_equal(evbuffer_get_length(b), 0);
    evbuffer_free(b);
    gw_stream_event(r, GW_SSE_DONE, strlen(GW_SSE_DONE));
    assert_int_equal(f->done, 0);
    gw_stream_end(r);
    assert_true(x.ended);
    assert_int_equal(f->done, 1);
    assert_int_equal(x.n_chunks, 3);
    assert_string_equal(x.body, "data: {\"n\":1}\n\ndata: two\ndata: lines\n\ndata: [DONE]\n\n");
    assert_string_equal(g_log, "a:headers;a:event {\"n\":1};a:event two\nlines (info tw);"
                               "a:event [DONE];a:end 200;");
    char v[64];
    assert_string_equal(rec_find(&x, "Content-Type", v, sizeof v), "text/event-stream");
    assert_string_equal(rec_find(&x, "Cache-Control", v, sizeof v), "no-cache");
}

static void stream_error_is_last_event(void **state)
{
    fake_srv *f = *state;
    rec x = {0};
    gw_req *r = fake_req(f, &x, "req_5");
    gw_stream_begin(r, 200, "text/event-stream");
    gw_stream_event(r, "{}", 2);
    gw_stream_error(r, "server_error", "engine_error", "broke: \"%s\"\n", "why");
    assert_int_equal(f->done, 1);
    assert_true(x.ended);
    const char *last = strstr(x.body, "data: {\"error\"");
    assert_non_null(last);
    cJSON *o = cJSON_ParseWithLength(last + 6, strlen(last + 6) - 2);
    assert_non_null(o);
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(o, "error");
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(e, "message")->valuestring,
                        "broke: \"why\"\n");
    assert_string_equal(cJSON_GetObjectItemCaseSensitive(e, "code")->valuestring,
                        "engine_error");
    cJSON_Delete(o);
}

static int g_cb_events;

static void count_cb(gw_req *r, const char *data, size_t len)
{
    (void)r;
    (void)data;
    (void)len;
    g_cb_events++;
}

/* An upstream's SSE bytes, cut at every possible point: sent unchanged, and every filter sees
 * each complete event once. */
static void forward_any_split(void **state)
{
    fake_srv *f = *state;
    static const char stream[] = "data: {\"a\":1}\n\n: comment\n\ndata: x\r\ndata: y\r\n\r\n"
                                 "event: ping\ndata: p\n\ndata: [DONE]\n\n";
    size_t n = strlen(stream);
    for (size_t cut = 0; cut <= n; cut++) {
        rec x = {0};
        seen a = {.name = "a"};
        g_log[0] = '\0';
        g_cb_events = 0;
        gw_req *r = fake_req(f, &x, "req_6");
        gw_reply_filter(r, &k_filter, &a);
        gw_stream_begin(r, 200, "text/event-stream");
        struct evbuffer *b = evbuffer_new();
        evbuffer_add(b, stream, cut);
        gw_stream_forward(r, b, count_cb);
        assert_int_equal(evbuffer_get_length(b), 0);
        evbuffer_add(b, stream + cut, n - cut);
        gw_stream_forward(r, b, count_cb);
        evbuffer_free(b);
        gw_stream_end(r);
        assert_string_equal(x.body, stream);
        assert_int_equal(g_cb_events, 4);
        assert_string_equal(g_log, "a:headers;a:event {\"a\":1};a:event x\ny;a:event p;"
                                   "a:event [DONE];a:end 200;");
    }
}

static void abandoned_answer_ends_once(void **state)
{
    fake_srv *f = *state;
    rec x = {0};
    seen a = {.name = "a"};
    gw_req *r = fake_req(f, &x, "req_7");
    gw_reply_filter(r, &k_filter, &a);
    gw_stream_begin(r, 200, "text/event-stream");
    gw_stream_event(r, "{}", 2);
    r->status = 200;
    gw_reply_abandon(r);
    assert_int_equal(f->done, 1);
    assert_false(x.ended);
    assert_string_equal(g_log, "a:headers;a:event {};a:end 200;");
}

static void gone_client_gets_nothing(void **state)
{
    fake_srv *f = *state;
    rec x = {0};
    seen a = {.name = "a"};
    gw_req *r = fake_req(f, &x, "req_8");
    gw_reply_filter(r, &k_filter, &a);
    r->io_ctx = NULL;   /* the client left; the answer still ends through the filters */
    gw_reply_error(r, 503, "server_error", NULL, NULL, "late");
    assert_false(x.sent);
    assert_int_equal(x.len, 0);
    assert_int_equal(f->done, 1);
    assert_int_equal(f->last_status, 503);
    assert_contains(g_log, "a:end 503;");
    assert_null(strstr(g_log, "headers"));
}

static void request_headers_read_through_transport(void **state)
{
    fake_srv *f = *state;
    rec x = {.in_headers = {{"Cache-Control", "no-cache"}}};
    gw_req *r = fake_req(f, &x, "req_9");
    assert_string_equal(gw_request_header(r, "cache-control"), "no-cache");
    assert_null(gw_request_header(r, "x-missing"));
    r->io_ctx = NULL;
    assert_null(gw_request_header(r, "cache-control"));
    gw_reply_abandon(r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(error_body_is_escaped_json, setup, teardown),
        cmocka_unit_test_setup_teardown(null_param_and_code, setup, teardown),
        cmocka_unit_test_setup_teardown(filters_run_in_order_once, setup, teardown),
        cmocka_unit_test_setup_teardown(stream_frames_events, setup, teardown),
        cmocka_unit_test_setup_teardown(stream_error_is_last_event, setup, teardown),
        cmocka_unit_test_setup_teardown(forward_any_split, setup, teardown),
        cmocka_unit_test_setup_teardown(abandoned_answer_ends_once, setup, teardown),
        cmocka_unit_test_setup_teardown(gone_client_gets_nothing, setup, teardown),
        cmocka_unit_test_setup_teardown(request_headers_read_through_transport, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
