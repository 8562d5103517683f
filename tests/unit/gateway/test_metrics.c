/* tests/unit/gateway/test_metrics.c: the Prometheus registry: series values and the exact text
 * exposition (HELP/TYPE, labels, cumulative buckets, +Inf, _sum, _count). */
#include "gateway/metrics.h"

#include <event2/buffer.h>
#include <stdlib.h>

#include "tests/unit/unit.h"

static char *rendered(gw_metrics *m)
{
    struct evbuffer *b = evbuffer_new();
    gw_metrics_render(m, b);
    size_t n = evbuffer_get_length(b);
    char *s = malloc(n + 1);
    evbuffer_remove(b, s, n);
    s[n] = '\0';
    evbuffer_free(b);
    return s;
}

static void counters(void **state)
{
    (void)state;
    gw_metrics *m = gw_metrics_new();
    gw_metrics_declare(m, "req_total", GW_METRIC_COUNTER, "Requests.");
    assert_double_near(gw_metrics_get(m, "req_total", "a=\"1\""), 0, 0);  /* absent */
    gw_metrics_add(m, "req_total", "a=\"1\"", 1);
    gw_metrics_add(m, "req_total", "a=\"1\"", 1);
    gw_metrics_add(m, "req_total", "a=\"2\"", 2.5);
    gw_metrics_add(m, "req_total", NULL, 4);
    assert_double_near(gw_metrics_get(m, "req_total", "a=\"1\""), 2, 0);
    assert_double_near(gw_metrics_get(m, "req_total", "a=\"2\""), 2.5, 0);
    assert_double_near(gw_metrics_get(m, "req_total", NULL), 4, 0);
    assert_double_near(gw_metrics_get(m, "req_total", ""), 4, 0);  /* NULL labels == "" */
    gw_metrics_free(m);
    gw_metrics_free(NULL);
}

static void gauges(void **state)
{
    (void)state;
    gw_metrics *m = gw_metrics_new();
    gw_metrics_declare(m, "in_flight", GW_METRIC_GAUGE, "Now.");
    gw_metrics_set(m, "in_flight", NULL, 7);
    assert_double_near(gw_metrics_get(m, "in_flight", NULL), 7, 0);
    gw_metrics_add(m, "in_flight", NULL, -3);
    assert_double_near(gw_metrics_get(m, "in_flight", NULL), 4, 0);
    gw_metrics_set(m, "in_flight", NULL, -2);
    assert_double_near(gw_metrics_get(m, "in_flight", NULL), -2, 0);
    gw_metrics_free(m);
}

static void histogram_values(void **state)
{
    (void)state;
    gw_metrics *m = gw_metrics_new();
    gw_metrics_declare(m, "lat_seconds", GW_METRIC_HISTOGRAM, "Latency.");
    gw_metrics_observe(m, "lat_seconds", NULL, 0.25);
    gw_metrics_observe(m, "lat_seconds", NULL, 1.5);
    /* get() on a histogram gives its sum */
    assert_double_near(gw_metrics_get(m, "lat_seconds", NULL), 1.75, 1e-12);
    gw_metrics_free(m);
}

static void render_counter_and_gauge(void **state)
{
    (void)state;
    gw_metrics *m = gw_metrics_new();
    gw_metrics_declare(m, "llmgw_requests_total", GW_METRIC_COUNTER, "Requests answered.");
    gw_metrics_declare(m, "llmgw_in_flight", GW_METRIC_GAUGE, "Requests being answered.");
    gw_metrics_declare(m, "llmgw_unused_total", GW_METRIC_COUNTER, "Never touched.");
    gw_metrics_add(m, "llmgw_requests_total", "endpoint=\"chat\",status=\"200\"", 3);
    gw_metrics_add(m, "llmgw_requests_total", "endpoint=\"chat\",status=\"400\"", 1);
    gw_metrics_add(m, "llmgw_requests_total", "endpoint=\"chat\",status=\"200\"", 0.5);
    gw_metrics_set(m, "llmgw_in_flight", NULL, 2);
    char *text = rendered(m);
    assert_string_equal(text,
                        "# HELP llmgw_requests_total Requests answered.\n"
                        "# TYPE llmgw_requests_total counter\n"
                        "llmgw_requests_total{endpoint=\"chat\",status=\"200\"} 3.5\n"
                        "llmgw_requests_total{endpoint=\"chat\",status=\"400\"} 1\n"
                        "# HELP llmgw_in_flight Requests being answered.\n"
                        "# TYPE llmgw_in_flight gauge\n"
                        "llmgw_in_flight 2\n"
                        "# HELP llmgw_unused_total Never touched.\n"
                        "# TYPE llmgw_unused_total counter\n");
    free(text);
    gw_metrics_free(m);
}

static void render_histogram(void **state)
{
    (void)state;
    gw_metrics *m = gw_metrics_new();
    gw_metrics_declare(m, "lat_seconds", GW_METRIC_HISTOGRAM, "Latency.");
    /* one below the first bound, one on a bound (le is inclusive), one between, one past 60 s */
    gw_metrics_observe(m, "lat_seconds", "endpoint=\"chat\"", 0.0001);
    gw_metrics_observe(m, "lat_seconds", "endpoint=\"chat\"", 0.005);
    gw_metrics_observe(m, "lat_seconds", "endpoint=\"chat\"", 0.2);
    gw_metrics_observe(m, "lat_seconds", "endpoint=\"chat\"", 100);
    char *text = rendered(m);
    assert_string_equal(text,
                        "# HELP lat_seconds Latency.\n"
                        "# TYPE lat_seconds histogram\n"
                        "lat_seconds_bucket{endpoint=\"chat\",le=\"0.0005\"} 1\n"
                        "lat_seconds_bucket{endpoint=\"chat\",le=\"0.001\"} 1\n"
                        "lat_seconds_bucket{endpoint=\"chat\",le=\"0.0025\"} 1\n"
                        "lat_seconds_bucket{endpoint=\"chat\",le=\"0.005\"} 2\n"
                        "lat_seconds_bucket{endpoint=\"chat\",le=\"0.01\"} 2\n"
                        "lat_seconds_bucket{endpoint=\"chat\",le=\"0.025\"} 2\n"
                        "lat_seconds_bucket{endpoint=\"chat\",le=\"0.05\"} 2\n"
                        "lat_seconds_bucket{endpoint=\"chat\",le=\"0.1\"} 2\n"
                        "lat_seconds_bucket{endpoint=\"chat\",le=\"0.25\"} 3\n"
                        "lat_seconds_bucket{endpoint=\"chat\",le=\"0.5\"} 3\n"
                        "lat_seconds_bucket{endpoint=\"chat\",le=\"1\"} 3\n"
                        "lat_seconds_bucket{endpoint=\"chat\",le=\"2.5\"} 3\n"
                        "lat_seconds_bucket{endpoint=\"chat\",le=\"5\"} 3\n"
                        "lat_seconds_bucket{endpoint=\"chat\",le=\"10\"} 3\n"
                        "lat_seconds_bucket{endpoint=\"chat\",le=\"30\"} 3\n"
                        "lat_seconds_bucket{endpoint=\"chat\",le=\"60\"} 3\n"
                        "lat_seconds_bucket{endpoint=\"chat\",le=\"+Inf\"} 4\n"
                        "lat_seconds_sum{endpoint=\"chat\"} 100.2051\n"
                        "lat_seconds_count{endpoint=\"chat\"} 4\n");
    free(text);
    gw_metrics_free(m);
}

/* Bucket counts never decrease along le, and +Inf equals _count, for any observations. */
static void histogram_invariants(void **state)
{
    (void)state;
    gw_metrics *m = gw_metrics_new();
    gw_metrics_declare(m, "h", GW_METRIC_HISTOGRAM, "H.");
    uint32_t x = 7;
    double sum = 0;
    for (int i = 0; i < 5000; i++) {
        x = x * 1664525u + 1013904223u;
        double v = (double)(x >> 8) / (double)(1u << 24) * 80.0;  /* 0 .. 80 s */
        v = v * v * v / 6400.0;                                   /* skewed toward 0 */
        sum += v;
        gw_metrics_observe(m, "h", NULL, v);
    }
    char *text = rendered(m);
    unsigned long long prev = 0, n, inf = 0, count = 0;
    int buckets = 0;
    double got_sum = -1;
    for (char *line = strtok(text, "\n"); line != NULL; line = strtok(NULL, "\n")) {
        if (!strncmp(line, "h_bucket{le=\"+Inf\"} ", 20)) {
            inf = strtoull(line + 20, NULL, 10);
        } else if (!strncmp(line, "h_bucket{le=", 12)) {
            n = strtoull(strchr(line, ' ') + 1, NULL, 10);
            assert_true(n >= prev);
            prev = n;
            buckets++;
        } else if (!strncmp(line, "h_sum ", 6)) {
            got_sum = strtod(line + 6, NULL);
        } else if (!strncmp(line, "h_count ", 8)) {
            count = strtoull(line + 8, NULL, 10);
        }
    }
    assert_int_equal(buckets, 16);
    assert_int_equal(count, 5000);
    assert_int_equal(inf, count);
    assert_true(prev <= inf);
    assert_double_near(got_sum, sum, sum * 1e-8);
    free(text);
    gw_metrics_free(m);
}

static void render_without_labels(void **state)
{
    (void)state;
    gw_metrics *m = gw_metrics_new();
    gw_metrics_declare(m, "h", GW_METRIC_HISTOGRAM, "H.");
    gw_metrics_observe(m, "h", NULL, 30);
    char *text = rendered(m);
    assert_contains(text, "\nh_bucket{le=\"10\"} 0\n");
    assert_contains(text, "\nh_bucket{le=\"30\"} 1\n");
    assert_contains(text, "\nh_bucket{le=\"+Inf\"} 1\n");
    assert_contains(text, "\nh_sum 30\n");
    assert_contains(text, "\nh_count 1\n");
    free(text);
    gw_metrics_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(counters),
        cmocka_unit_test(gauges),
        cmocka_unit_test(histogram_values),
        cmocka_unit_test(render_counter_and_gauge),
        cmocka_unit_test(render_histogram),
        cmocka_unit_test(histogram_invariants),
        cmocka_unit_test(render_without_labels),
    };
    return cmocka_run_group_tests_name("gateway/metrics", tests, NULL, NULL);
}
