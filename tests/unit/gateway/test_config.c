/* tests/unit/gateway/test_config.c: the YAML config (gw_config_parse/load). A full config with
 * every key, the defaults, and each error with its exact "name:line:column: " prefix. */
#include "gateway/config.h"

#include "common/log.h"

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests/unit/unit.h"

#define NAME "cfg.yaml"
#define DIR "/etc/llmgw"

static gw_config *parse_ok(const char *yaml)
{
    gw_config *c = NULL;
    util_err err = {0};
    int rc = gw_config_parse(&c, yaml, strlen(yaml), NAME, DIR, &err);
    if (rc != 0)
        print_error("unexpected error: %s\n", err.msg);
    assert_int_equal(rc, 0);
    assert_non_null(c);
    return c;
}

/* Parses `yaml`, which must fail with LLMGW_EINVAL and a message starting with `prefix` and
 * containing `what`. */
static void expect_error(const char *yaml, const char *prefix, const char *what)
{
    gw_config *c = NULL;
    util_err err = {0};
    int rc = gw_config_parse(&c, yaml, strlen(yaml), NAME, DIR, &err);
    if (rc == 0)
        gw_config_free(c);
    assert_int_equal(rc, LLMGW_EINVAL);
    assert_int_equal(err.code, LLMGW_EINVAL);
    assert_null(c);
    assert_prefix(err.msg, prefix);
    assert_contains(err.msg, what);
}

static const char k_full[] =
    "# every key llmgw reads\n"                                /* 1 */
    "listen:\n"                                                /* 2 */
    "  - address: 127.0.0.1:8080\n"                            /* 3 */
    "  - address: \"[::1]:8443\"\n"                            /* 4 */
    "    tls: true\n"                                          /* 5 */
    "    cert: certs/server.pem\n"                             /* 6 */
    "    key: /secure/server.key\n"                            /* 7 */
    "limits:\n"                                                /* 8 */
    "  max_body_bytes: 2097152\n"
    "  max_header_bytes: 32768\n"
    "  read_timeout_ms: 5000\n"
    "  request_timeout_ms: 60000\n"
    "  max_connections: 500\n"
    "  shutdown_grace_ms: 0\n"
    "auth:\n"
    "  keys:\n"
    "    - key: sk-alpha-0001\n"
    "      group: team-a\n"
    "      rate_limit:\n"
    "        requests_per_second: 5\n"
    "        burst: 10\n"
    "    - key: sk-beta-00002\n"
    "      rate_limit: {requests_per_second: 0.5}\n"
    "    - key: sk-gamma-0003\n"
    "      group: team-c\n"
    "log:\n"
    "  level: debug\n"
    "  access_log: logs/access.log\n"
    "tiers:\n"
    "  - name: small\n"
    "    kind: upstream\n"
    "    base_url: http://127.0.0.1:9001/v1//\n"
    "    api_key: up-secret\n"
    "    model: tiny-model\n"
    "    aliases: [gpt-4o-mini, small-latest]\n"
    "    connect_timeout_ms: 500\n"
    "    timeout_ms: 10000\n"
    "    max_connections: 32\n"
    "    retries: 0\n"
    "    fallback: big\n"
    "    tls_verify: false\n"
    "    ca_file: ca.pem\n"
    "  - name: big\n"
    "    base_url: https://api.example.com\n";

static void full_config(void **state)
{
    (void)state;
    gw_config *c = parse_ok(k_full);
    assert_string_equal(c->path, NAME);

    assert_int_equal(c->n_listen, 2);
    assert_string_equal(c->listen[0].host, "127.0.0.1");
    assert_int_equal(c->listen[0].port, 8080);
    assert_false(c->listen[0].tls);
    assert_null(c->listen[0].cert);
    assert_null(c->listen[0].key);
    assert_string_equal(c->listen[1].host, "::1");  /* brackets stripped */
    assert_int_equal(c->listen[1].port, 8443);
    assert_true(c->listen[1].tls);
    assert_string_equal(c->listen[1].cert, DIR "/certs/server.pem");  /* relative: from dir */
    assert_string_equal(c->listen[1].key, "/secure/server.key");      /* absolute: as is */

    assert_int_equal(c->limits.max_body_bytes, 2097152);
    assert_int_equal(c->limits.max_header_bytes, 32768);
    assert_int_equal(c->limits.read_timeout_ms, 5000);
    assert_int_equal(c->limits.request_timeout_ms, 60000);
    assert_int_equal(c->limits.max_connections, 500);
    assert_int_equal(c->limits.shutdown_grace_ms, 0);

    assert_int_equal(c->n_keys, 3);
    assert_string_equal(c->keys[0].key, "sk-alpha-0001");
    assert_string_equal(c->keys[0].group, "team-a");
    assert_double_near(c->keys[0].rate, 5, 0);
    assert_double_near(c->keys[0].burst, 10, 0);
    assert_string_equal(c->keys[1].group, "default");
    assert_double_near(c->keys[1].rate, 0.5, 0);
    assert_double_near(c->keys[1].burst, 1, 0);  /* no burst: max(rate, 1) */
    assert_string_equal(c->keys[2].group, "team-c");
    assert_double_near(c->keys[2].rate, 0, 0);   /* no rate_limit: unlimited */

    assert_int_equal(c->log_level, UTIL_LOG_DEBUG);
    assert_string_equal(c->access_log, DIR "/logs/access.log");

    assert_int_equal(c->n_tiers, 2);
    const gw_tier_cfg *t = &c->tiers[0];
    assert_string_equal(t->name, "small");
    assert_int_equal(t->kind, GW_TIER_UPSTREAM);
    assert_string_equal(t->base_url, "http://127.0.0.1:9001/v1");  /* trailing slashes cut */
    assert_string_equal(t->api_key, "up-secret");
    assert_string_equal(t->model, "tiny-model");
    assert_int_equal(t->n_aliases, 2);
    assert_string_equal(t->aliases[0], "gpt-4o-mini");
    assert_string_equal(t->aliases[1], "small-latest");
    assert_int_equal(t->connect_timeout_ms, 500);
    assert_int_equal(t->timeout_ms, 10000);
    assert_int_equal(t->max_connections, 32);
    assert_int_equal(t->retries, 0);
    assert_string_equal(t->fallback, "big");
    assert_false(t->tls_verify);
    assert_string_equal(t->ca_file, DIR "/ca.pem");

    assert_ptr_equal(gw_config_tier(c, "small"), &c->tiers[0]);
    assert_ptr_equal(gw_config_tier(c, "big"), &c->tiers[1]);
    assert_null(gw_config_tier(c, "gpt-4o-mini"));  /* aliases are the router's business */
    assert_null(gw_config_tier(c, "missing"));
    gw_config_free(c);
}

static void defaults(void **state)
{
    (void)state;
    gw_config *c = parse_ok("listen:\n  - address: 0.0.0.0:80\n");
    assert_int_equal(c->n_listen, 1);
    assert_string_equal(c->listen[0].host, "0.0.0.0");
    assert_int_equal(c->listen[0].port, 80);
    assert_int_equal(c->limits.max_body_bytes, 1u << 20);
    assert_int_equal(c->limits.max_header_bytes, 16384);
    assert_int_equal(c->limits.read_timeout_ms, 15000);
    assert_int_equal(c->limits.request_timeout_ms, 30000);
    assert_int_equal(c->limits.max_connections, 1024);
    assert_int_equal(c->limits.shutdown_grace_ms, 30000);
    assert_int_equal(c->engine.kv_pool_mb, 512);
    assert_int_equal(c->engine.kv_page_kb, 512);
    assert_int_equal(c->log_level, UTIL_LOG_INFO);
    assert_string_equal(c->access_log, "-");
    assert_int_equal(c->n_keys, 0);
    assert_int_equal(c->n_tiers, 0);
    gw_config_free(c);

    c = parse_ok("listen: [{address: 'localhost:1'}]\n"
                 "tiers:\n  - {name: t, base_url: 'https://x'}\n"
                 "log: {access_log: 'off', level: error}\n");
    const gw_tier_cfg *t = &c->tiers[0];
    assert_int_equal(t->kind, GW_TIER_UPSTREAM);
    assert_null(t->api_key);
    assert_null(t->model);
    assert_int_equal(t->n_aliases, 0);
    assert_int_equal(t->connect_timeout_ms, 2000);
    assert_int_equal(t->timeout_ms, 120000);
    assert_int_equal(t->max_connections, 256);
    assert_int_equal(t->retries, 1);
    assert_null(t->fallback);
    assert_true(t->tls_verify);
    assert_null(t->ca_file);
    assert_null(c->access_log);
    assert_int_equal(c->log_level, UTIL_LOG_ERROR);
    gw_config_free(c);

    c = parse_ok("listen: [{address: 'h:2'}]\nlog: {access_log: '-'}\n");
    assert_string_equal(c->access_log, "-");
    gw_config_free(c);
    gw_config_free(NULL);
}

static void bools_and_burst(void **state)
{
    (void)state;
    gw_config *c = parse_ok("listen:\n"
                            "  - {address: 'a:1', tls: yes}\n"
                            "  - {address: 'b:2', tls: off}\n"
                            "auth:\n  keys:\n"
                            "    - {key: k-1234567, rate_limit: {requests_per_second: 7}}\n");
    assert_true(c->listen[0].tls);
    assert_null(c->listen[0].cert);  /* tls without cert: the daemon's --dev-tls */
    assert_false(c->listen[1].tls);
    assert_double_near(c->keys[0].burst, 7, 0);
    gw_config_free(c);
}

static void path_without_dir(void **state)
{
    (void)state;
    const char *y = "listen:\n  - {address: 'a:1', tls: true, cert: c.pem, key: k.pem}\n";
    gw_config *c = NULL;
    util_err err = {0};
    assert_int_equal(gw_config_parse(&c, y, strlen(y), NAME, NULL, &err), 0);
    assert_string_equal(c->listen[0].cert, "c.pem");
    gw_config_free(c);
}

/* ---- errors, each with its position ---- */

static void error_bad_yaml(void **state)
{
    (void)state;
    /* "limits" indented by one space cannot close the listen list */
    expect_error("listen:\n  - address: a:1\n limits: {}\n", NAME ":3:2: invalid YAML",
                 "did not find expected key");
    expect_error("listen: [a, b\n", NAME ":2:1: invalid YAML", "flow sequence");
    expect_error("listen:\n  - address: \"a:1\n", NAME ":3:1: invalid YAML", "quoted scalar");
    expect_error("a: b: c\n", NAME ":1:5: invalid YAML", "mapping values are not allowed");
    expect_error("\tlisten: []\n", NAME ":1:1: invalid YAML", "cannot start any token");
}

static void error_empty_or_not_mapping(void **state)
{
    (void)state;
    expect_error("", NAME ":1:1: ", "empty");
    expect_error("# only a comment\n", NAME ":1:1: ", "empty");
    expect_error("- listen\n", NAME ":1:1: ", "the config must be a mapping");
    expect_error("just text\n", NAME ":1:1: ", "the config must be a mapping");
}

static void error_unknown_keys(void **state)
{
    (void)state;
    expect_error("listen:\n  - address: a:1\nbogus: 1\n", NAME ":3:1: ",
                 "unknown top-level key 'bogus'");
    expect_error("listen:\n  - address: a:1\n    port: 8\n", NAME ":3:5: ",
                 "unknown key 'port' in listen");
    expect_error("listen:\n  - address: a:1\nlimits:\n  max_bodies: 3\n", NAME ":4:3: ",
                 "unknown key 'max_bodies' in limits");
    expect_error("listen:\n  - address: a:1\ntiers:\n  - name: t\n    base_url: http://x\n"
                 "    colour: red\n",
                 NAME ":6:5: ", "unknown key 'colour' in a tier");
    expect_error("listen:\n  - address: a:1\nauth:\n  users: []\n", NAME ":4:3: ",
                 "unknown key 'users' in auth");
    expect_error("listen:\n  - address: a:1\nauth:\n  keys:\n    - key: k-1234567\n"
                 "      rate_limit: {rps: 1}\n",
                 NAME ":6:20: ", "unknown key 'rps' in rate_limit");
    expect_error("listen:\n  - address: a:1\nlog:\n  colour: true\n", NAME ":4:3: ",
                 "unknown key 'colour' in log");
}

static void error_wrong_types(void **state)
{
    (void)state;
    expect_error("listen:\n  - address: a:1\nlimits:\n  max_connections: \"many\"\n",
                 NAME ":4:20: ", "'max_connections' must be an integer, got 'many'");
    expect_error("listen:\n  - address: a:1\nlimits:\n  read_timeout_ms: 10.5\n",
                 NAME ":4:20: ", "must be an integer");
    expect_error("listen:\n  - address: a:1\nlimits:\n  read_timeout_ms: [1]\n",
                 NAME ":4:20: ", "must be an integer");
    expect_error("listen: {address: a:1}\n", NAME ":1:9: ", "'listen' must be a list");
    expect_error("listen:\n  - a:1\n", NAME ":2:5: ", "a listen entry must be a mapping");
    expect_error("listen:\n  - address: [a, 1]\n", NAME ":2:14: ", "'address' must be a string");
    expect_error("listen:\n  - address: a:1\n    tls: maybe\n", NAME ":3:10: ",
                 "'tls' must be true or false");
    expect_error("listen:\n  - address: a:1\nlimits: 5\n", NAME ":3:9: ",
                 "'limits' must be a mapping");
    expect_error("listen:\n  - address: a:1\ntiers:\n  - name: t\n    base_url: http://x\n"
                 "    aliases: one\n",
                 NAME ":6:14: ", "'aliases' must be a list");
    expect_error("listen:\n  - address: a:1\nauth:\n  keys:\n    - key: k-1234567\n"
                 "      rate_limit: {requests_per_second: fast}\n",
                 NAME ":6:41: ", "'requests_per_second' must be a number, got 'fast'");
    expect_error("listen:\n  - address: a:1\nlog:\n  level: loud\n", NAME ":4:10: ",
                 "'level' must be debug, info, warn or error");
}

static void error_out_of_range(void **state)
{
    (void)state;
    expect_error("listen:\n  - address: a:1\nlimits:\n  max_body_bytes: 10\n", NAME ":4:19: ",
                 "'max_body_bytes' must be between 1024 and 1073741824, got 10");
    expect_error("listen:\n  - address: a:1\nlimits:\n  max_connections: 0\n", NAME ":4:20: ",
                 "'max_connections' must be between 1 and 1000000, got 0");
    expect_error("listen:\n  - address: a:1\nlimits:\n  max_connections: 99999999999999999999\n",
                 NAME ":4:20: ", "must be an integer");  /* past long: strtol's ERANGE */
    expect_error("listen:\n  - address: a:1\ntiers:\n  - name: t\n    base_url: http://x\n"
                 "    retries: 11\n",
                 NAME ":6:14: ", "'retries' must be between 0 and 10, got 11");
    expect_error("listen:\n  - address: a:1\ntiers:\n  - name: t\n    base_url: http://x\n"
                 "    timeout_ms: -5\n",
                 NAME ":6:17: ", "'timeout_ms' must be between 1 and 3600000, got -5");
    expect_error("listen:\n  - address: a:1\nauth:\n  keys:\n    - key: k-1234567\n"
                 "      rate_limit: {requests_per_second: 1, burst: 0.5}\n",
                 NAME ":6:51: ", "'burst' must be between 1 and");
    expect_error("listen:\n  - address: a:1\nauth:\n  keys:\n    - key: short\n", NAME ":5:12: ",
                 "at least 8 characters");
}

static void error_tiers(void **state)
{
    (void)state;
    expect_error("listen:\n  - address: a:1\ntiers:\n  - name: a\n    base_url: http://x\n"
                 "  - name: b\n    base_url: http://y\n  - name: a\n    base_url: http://z\n",
                 NAME ":8:5: ", "tier 'a' is defined twice");
    expect_error("listen:\n  - address: a:1\ntiers:\n  - base_url: http://x\n", NAME ":4:5: ",
                 "a tier needs a 'name'");
    expect_error("listen:\n  - address: a:1\ntiers:\n  - name: t\n", NAME ":4:5: ",
                 "upstream tier 't' needs 'base_url'");
    expect_error("listen:\n  - address: a:1\ntiers:\n  - name: t\n    base_url: ftp://x\n",
                 NAME ":5:15: ", "'base_url' must start with http:// or https://");
    expect_error("listen:\n  - address: a:1\ntiers:\n  - name: t\n    kind: magic\n",
                 NAME ":5:11: ", "'kind' must be 'upstream' or 'engine'");
}

/* An engine tier serves a local GGUF model: it needs model_path and takes no base_url. */
static void engine_tiers(void **state)
{
    (void)state;
    gw_config *c = parse_ok("listen:\n  - address: a:1\n"
                            "engine:\n  kv_pool_mb: 1024\n  kv_page_kb: 64\n"
                            "tiers:\n"
                            "  - name: local\n"
                            "    kind: engine\n"
                            "    model_path: models/tiny.gguf\n"
                            "    threads: 4\n"
                            "    context: 2048\n"
                            "    max_batch_tokens: 128\n"
                            "    max_seqs: 8\n"
                            "    chat_template: chatml\n"
                            "    aliases: [tiny]\n"
                            "    fallback: remote\n"
                            "  - {name: remote, base_url: 'http://x'}\n");
    assert_int_equal(c->engine.kv_pool_mb, 1024);
    assert_int_equal(c->engine.kv_page_kb, 64);
    const gw_tier_cfg *t = gw_config_tier(c, "local");
    assert_non_null(t);
    assert_int_equal(t->kind, GW_TIER_ENGINE);
    assert_string_equal(t->model_path, DIR "/models/tiny.gguf");
    assert_null(t->base_url);
    assert_int_equal(t->threads, 4);
    assert_int_equal(t->context, 2048);
    assert_int_equal(t->max_batch_tokens, 128);
    assert_int_equal(t->max_seqs, 8);
    assert_string_equal(t->chat_template, "chatml");
    assert_string_equal(t->fallback, "remote");
    assert_int_equal(gw_config_tier(c, "remote")->kind, GW_TIER_UPSTREAM);
    assert_null(gw_config_tier(c, "remote")->model_path);
    gw_config_free(c);

    const char *head = "listen:\n  - address: a:1\ntiers:\n";
    char y[512];
    snprintf(y, sizeof y, "%s  - name: t\n    kind: engine\n", head);
    expect_error(y, NAME ":4:5: ", "engine tier 't' needs 'model_path'");
    snprintf(y, sizeof y, "%s  - name: t\n    kind: engine\n    model_path: m.gguf\n"
                          "    base_url: http://x\n", head);
    expect_error(y, NAME ":7:15: ", "'base_url' is for upstream tiers");
    snprintf(y, sizeof y, "%s  - name: t\n    base_url: http://x\n    model_path: m.gguf\n",
             head);
    expect_error(y, NAME ":4:5: ", "'model_path' is for engine tiers");
    snprintf(y, sizeof y, "%s  - name: t\n    kind: engine\n    model_path: m.gguf\n"
                          "    chat_template: alpaca\n", head);
    expect_error(y, NAME ":7:20: ", "'chat_template' must be chatml or llama3");
    snprintf(y, sizeof y, "%s  - name: t\n    kind: engine\n    model_path: m.gguf\n"
                          "    max_seqs: 5000\n", head);
    expect_error(y, NAME ":7:15: ", "'max_seqs' must be between 0 and 4096, got 5000");
    expect_error("listen:\n  - address: a:1\nengine:\n  kv_pool: 1\n", NAME ":4:3: ",
                 "unknown key 'kv_pool' in engine");
    expect_error("listen:\n  - address: a:1\nengine:\n  kv_page_kb: 8\n", NAME ":4:15: ",
                 "'kv_page_kb' must be between 16 and");
}

/* Cross-tier checks run once every tier is read; they point at the config's root mapping. */
static void error_aliases_and_fallbacks(void **state)
{
    (void)state;
    const char *head = "listen:\n  - address: a:1\ntiers:\n";
    char y[512];
    snprintf(y, sizeof y, "%s  - {name: a, base_url: 'http://x', aliases: [b]}\n"
                          "  - {name: b, base_url: 'http://y'}\n", head);
    expect_error(y, NAME ":1:1: ", "alias 'b' of tier 'a' is also a tier name");
    snprintf(y, sizeof y, "%s  - {name: a, base_url: 'http://x', aliases: [m]}\n"
                          "  - {name: b, base_url: 'http://y', aliases: [m]}\n", head);
    expect_error(y, NAME ":1:1: ", "alias 'm' is used twice");
    snprintf(y, sizeof y, "%s  - {name: a, base_url: 'http://x', aliases: [m, n, m]}\n", head);
    expect_error(y, NAME ":1:1: ", "alias 'm' is used twice");
    snprintf(y, sizeof y, "%s  - {name: a, base_url: 'http://x', fallback: nowhere}\n", head);
    expect_error(y, NAME ":1:1: ", "tier 'a' falls back to unknown tier 'nowhere'");
    snprintf(y, sizeof y, "%s  - {name: a, base_url: 'http://x', fallback: a}\n", head);
    expect_error(y, NAME ":1:1: ", "tier 'a' falls back to itself");
    /* the root mapping starts at its first key, after any comments */
    snprintf(y, sizeof y, "# gateway\n\n%s  - {name: a, base_url: 'http://x', fallback: q}\n",
             head);
    expect_error(y, NAME ":3:1: ", "tier 'a' falls back to unknown tier 'q'");
    /* draft_tier names another engine tier */
    const char *eng = "  - {name: big, kind: engine, model_path: b.gguf, draft_tier: %s}\n"
                      "  - {name: little, kind: engine, model_path: s.gguf}\n"
                      "  - {name: far, base_url: 'http://x'}\n";
    char tiers[256];
    snprintf(tiers, sizeof tiers, eng, "far");
    snprintf(y, sizeof y, "%s%s", head, tiers);
    expect_error(y, NAME ":1:1: ", "tier 'big' drafts with 'far', which is not an engine tier");
    snprintf(tiers, sizeof tiers, eng, "nobody");
    snprintf(y, sizeof y, "%s%s", head, tiers);
    expect_error(y, NAME ":1:1: ", "tier 'big' drafts with 'nobody', which is not an engine");
    snprintf(tiers, sizeof tiers, eng, "big");
    snprintf(y, sizeof y, "%s%s", head, tiers);
    expect_error(y, NAME ":1:1: ", "tier 'big' drafts with itself");
    snprintf(y, sizeof y, "%s  - {name: far, base_url: 'http://x', draft_tier: far}\n", head);
    expect_error(y, NAME ":1:1: ", "'draft_tier' is for engine tiers");
    snprintf(y, sizeof y, "%s  - {name: big, kind: engine, model_path: b.gguf, draft_max: 17}\n",
             head);
    expect_error(y, NAME ":4:62: ", "'draft_max' must be between 1 and 16, got 17");
    snprintf(y, sizeof y, "%s  - {name: big, kind: engine, model_path: b.gguf, "
                          "draft_p_min: 1.5}\n", head);
    expect_error(y, NAME ":4:64: ", "'draft_p_min' must be between 0 and 1");
    snprintf(tiers, sizeof tiers, eng, "little");
    snprintf(y, sizeof y, "%s%s", head, tiers);
    gw_config *c = parse_ok(y);
    const gw_tier_cfg *big = gw_config_tier(c, "big");
    assert_string_equal(big->draft_tier, "little");
    assert_true(big->draft_p_min < 0);      /* unset: the engine's default */
    assert_int_equal(big->draft_max, 0);
    assert_false(big->draft_always);
    assert_false(big->draft_own_kv);
    assert_null(big->kv_dtype);             /* unset: the engine's default (f16) */
    gw_config_free(c);
    snprintf(y, sizeof y, "%s  - {name: big, kind: engine, model_path: b.gguf, draft_tier: "
                          "little, draft_own_kv: true, draft_always: true}\n"
                          "  - {name: little, kind: engine, model_path: s.gguf}\n", head);
    c = parse_ok(y);
    assert_true(gw_config_tier(c, "big")->draft_own_kv);
    assert_true(gw_config_tier(c, "big")->draft_always);
    gw_config_free(c);
    snprintf(y, sizeof y, "%s  - {name: big, kind: engine, model_path: b.gguf, "
                          "draft_own_kv: 3}\n", head);
    expect_error(y, NAME ":4:", "'draft_own_kv'");
    /* the K/V cache type: engine/decoder/model.h's names, anything else refused where it stands */
    static const char *const kv_ok[] = {"f16", "q8", "q8/16", "q8n", "q8n/32"};
    for (size_t i = 0; i < sizeof kv_ok / sizeof kv_ok[0]; i++) {
        snprintf(y, sizeof y, "%s  - {name: big, kind: engine, model_path: b.gguf, "
                              "kv_dtype: '%s'}\n", head, kv_ok[i]);
        c = parse_ok(y);
        assert_string_equal(gw_config_tier(c, "big")->kv_dtype, kv_ok[i]);
        gw_config_free(c);
    }
    static const char *const kv_bad[] = {"q4", "int8", "q8/", "q8/0", "q8x", "F16", ""};
    for (size_t i = 0; i < sizeof kv_bad / sizeof kv_bad[0]; i++) {
        snprintf(y, sizeof y, "%s  - {name: big, kind: engine, model_path: b.gguf, "
                              "kv_dtype: '%s'}\n", head, kv_bad[i]);
        expect_error(y, NAME ":4:", "'kv_dtype' must be f16 or q8");
    }
    /* where a tier computes: kernels/backend.h's device names */
    static const char *const dev_ok[] = {"cpu", "auto", "cuda", "cuda:1"};
    for (size_t i = 0; i < sizeof dev_ok / sizeof dev_ok[0]; i++) {
        snprintf(y, sizeof y, "%s  - {name: big, kind: engine, model_path: b.gguf, "
                              "device: '%s'}\n", head, dev_ok[i]);
        c = parse_ok(y);
        assert_string_equal(gw_config_tier(c, "big")->device, dev_ok[i]);
        gw_config_free(c);
    }
    snprintf(y, sizeof y, "%s  - {name: big, kind: engine, model_path: b.gguf, "
                          "device: gpu0}\n", head);
    expect_error(y, NAME ":4:", "'device' must be cpu, cuda, cuda:N or auto");
    /* a tier may list its own name as an alias */
    snprintf(y, sizeof y, "%s  - {name: a, base_url: 'http://x', aliases: [a]}\n", head);
    gw_config_free(parse_ok(y));
}

static void error_listen(void **state)
{
    (void)state;
    expect_error("limits: {max_connections: 5}\n", NAME ":1:1: ",
                 "the config needs at least one 'listen' entry");
    expect_error("listen: []\n", NAME ":1:1: ", "at least one 'listen'");
    expect_error("listen:\n  - tls: true\n", NAME ":2:5: ", "a listen entry needs 'address");
    expect_error("listen:\n  - address: 127.0.0.1\n", NAME ":2:14: ",
                 "'address' must be host:port, got '127.0.0.1'");
    expect_error("listen:\n  - address: ':8080'\n", NAME ":2:14: ", "must be host:port");
    expect_error("listen:\n  - address: h:99999\n", NAME ":2:14: ", "must be host:port");
    expect_error("listen:\n  - address: h:http\n", NAME ":2:14: ", "must be host:port");
    expect_error("listen:\n  - address: h:-1\n", NAME ":2:14: ", "must be host:port");
    expect_error("listen:\n  - address: a:1\n    cert: c.pem\n    key: k.pem\n", NAME ":2:5: ",
                 "'cert' and 'key' are only for 'tls: true' listeners");
    expect_error("listen:\n  - address: a:1\n    tls: true\n    cert: c.pem\n", NAME ":2:5: ",
                 "needs both 'cert' and 'key'");
    expect_error("listen:\n  - address: a:1\n    tls: true\n    key: ''\n", NAME ":4:10: ",
                 "'key' must be a non-empty path");
}

static void error_keys(void **state)
{
    (void)state;
    expect_error("listen:\n  - address: a:1\nauth:\n  keys:\n    - group: g\n", NAME ":5:7: ",
                 "a key entry needs 'key'");
    expect_error("listen:\n  - address: a:1\nauth:\n  keys:\n    - {key: k-1234567, group: x}\n"
                 "    - {key: k-1234567, group: y}\n",
                 NAME ":1:1: ", "an API key is listed twice (groups 'x' and 'y')");
}

/* YAML forbids a key twice in one mapping; a list key given twice must not reuse the first
 * list's storage. */
static void error_duplicate_keys(void **state)
{
    (void)state;
    expect_error("listen:\n  - address: a:1\nlisten:\n  - address: b:2\n", NAME ":3:1: ",
                 "'listen' is given twice");
    expect_error("listen:\n  - address: a:1\ntiers:\n  - {name: a, base_url: 'http://x'}\n"
                 "tiers:\n  - {name: b, base_url: 'http://y'}\n"
                 "  - {name: c, base_url: 'http://z'}\n",
                 NAME ":5:1: ", "'tiers' is given twice");
    expect_error("listen:\n  - address: a:1\nauth:\n  keys: [{key: k-1234567}]\n"
                 "  keys: [{key: k-2345678}, {key: k-3456789}]\n",
                 NAME ":5:3: ", "'keys' is given twice");
    expect_error("listen:\n  - address: a:1\ntiers:\n  - name: a\n    base_url: http://x\n"
                 "    aliases: [p]\n    aliases: [q, r, s]\n",
                 NAME ":7:5: ", "'aliases' is given twice");
    expect_error("listen:\n  - address: a:1\n    address: b:2\n", NAME ":3:5: ",
                 "'address' is given twice");
}

/* ---- files ---- */

static void load_missing_file(void **state)
{
    (void)state;
    gw_config *c = NULL;
    util_err err = {0};
    const char *path = "/nonexistent/llmgw/config.yaml";
    assert_int_equal(gw_config_load(&c, path, &err), LLMGW_EIO);
    assert_int_equal(err.code, LLMGW_EIO);
    assert_null(c);
    assert_prefix(err.msg, path);
    assert_contains(err.msg, "No such file");
}

static void load_resolves_against_file_dir(void **state)
{
    (void)state;
    char dir[] = "/tmp/llmgw-test-config-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[128];
    snprintf(path, sizeof path, "%s/gw.yaml", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("listen:\n  - address: a:1\n    tls: true\n    cert: tls/cert.pem\n"
          "    key: tls/key.pem\nlimits:\n  max_connections: zero\n", f);
    fclose(f);

    gw_config *c = NULL;
    util_err err = {0};
    char want[256];
    /* errors name the file by its path */
    assert_int_equal(gw_config_load(&c, path, &err), LLMGW_EINVAL);
    snprintf(want, sizeof want, "%s:7:20: ", path);
    assert_prefix(err.msg, want);

    f = fopen(path, "w");
    assert_non_null(f);
    fputs("listen:\n  - address: a:1\n    tls: true\n    cert: tls/cert.pem\n"
          "    key: tls/key.pem\n", f);
    fclose(f);
    assert_int_equal(gw_config_load(&c, path, &err), 0);
    assert_string_equal(c->path, path);
    snprintf(want, sizeof want, "%s/tls/cert.pem", dir);
    assert_string_equal(c->listen[0].cert, want);
    snprintf(want, sizeof want, "%s/tls/key.pem", dir);
    assert_string_equal(c->listen[0].key, want);
    gw_config_free(c);
    unlink(path);
    rmdir(dir);
}

/* The encoder, cache and policy sections (issue 4 and 5). */
static void encoder_cache_policy(void **state)
{
    (void)state;
    gw_config *c = parse_ok("listen: [{address: 127.0.0.1:1}]\n"
                            "encoder: {model_dir: models/all-MiniLM-L6-v2, threads: 2,\n"
                            "          batch_window_us: 250, max_batch: 16, precision: f32,\n"
                            "          adaptive_window: false, spin_ms: 7, max_wait_ms: 80, nice: 10}\n"
                            "cache:\n"
                            "  enabled: true\n"
                            "  threshold: 0.97\n"
                            "  guard: false\n"
                            "  index: IDMap2,HNSW32\n"
                            "  ttl_s: 60\n"
                            "  max_mb: 8\n"
                            "  max_temperature: 0.5\n"
                            "  cache_tool_calls: true\n"
                            "  redis: {host: 10.0.0.7, port: 6380, prefix: 'a:', check_timeout_ms: 20}\n"
                            "policy: pol/default.yaml\n");
    assert_string_equal(c->encoder.model_dir, DIR "/models/all-MiniLM-L6-v2");
    assert_string_equal(c->encoder.name, "all-MiniLM-L6-v2");  /* the directory's name */
    assert_int_equal(c->encoder.threads, 2);
    assert_int_equal(c->encoder.batch_window_us, 250);
    assert_int_equal(c->encoder.max_batch, 16);
    assert_int_equal(c->encoder.max_queue, 4096);
    assert_int_equal(c->encoder.precision, 1);
    assert_false(c->encoder.adaptive_window);
    assert_int_equal(c->encoder.spin_ms, 7);
    assert_int_equal(c->encoder.max_wait_ms, 80);
    assert_int_equal(c->encoder.nice, 10);
    assert_true(c->cache.enabled);
    assert_double_near(c->cache.threshold, 0.97, 1e-12);
    assert_false(c->cache.guard);
    assert_string_equal(c->cache.index, "IDMap2,HNSW32");
    assert_int_equal(c->cache.ttl_s, 60);
    assert_int_equal(c->cache.max_mb, 8);
    assert_double_near(c->cache.max_temperature, 0.5, 1e-12);
    assert_true(c->cache.cache_tool_calls);
    assert_string_equal(c->cache.redis_host, "10.0.0.7");
    assert_int_equal(c->cache.redis_port, 6380);
    assert_string_equal(c->cache.redis_prefix, "a:");
    assert_int_equal(c->cache.redis_check_timeout_ms, 20);
    assert_string_equal(c->policy_path, DIR "/pol/default.yaml");
    gw_config_free(c);
    /* defaults */
    c = parse_ok("listen: [{address: 127.0.0.1:1}]\n");
    assert_null(c->encoder.model_dir);
    assert_int_equal(c->encoder.precision, 0);
    assert_true(c->encoder.adaptive_window);
    assert_int_equal(c->encoder.spin_ms, 50);
    assert_int_equal(c->encoder.max_wait_ms, 0);
    assert_int_equal(c->encoder.nice, 0);
    assert_false(c->cache.enabled);
    assert_true(c->cache.guard);
    assert_double_near(c->cache.max_temperature, 0.0, 0);
    assert_null(c->cache.redis_host);
    assert_null(c->policy_path);
    gw_config_free(c);
    c = parse_ok("listen: [{address: 127.0.0.1:1}]\nencoder: {model_dir: m, precision: bf16}\n");
    assert_int_equal(c->encoder.precision, 2);
    gw_config_free(c);
}

static void error_encoder_cache(void **state)
{
    (void)state;
    expect_error("listen: [{address: 127.0.0.1:1}]\ncache: {enabled: true}\n", NAME ":2:1: ",
                 "needs an 'encoder'");
    expect_error("listen: [{address: 127.0.0.1:1}]\nencoder: {threads: 1}\n", NAME ":2:10: ",
                 "needs 'model_dir'");
    expect_error("listen: [{address: 127.0.0.1:1}]\nencoder: {model_dir: m, colour: red}\n",
                 NAME ":2:25: ", "unknown key 'colour' in encoder");
    expect_error("listen: [{address: 127.0.0.1:1}]\nencoder: {model_dir: m, precision: f16}\n",
                 NAME ":2:36: ", "'precision' must be auto, f32 or bf16");
    expect_error("listen: [{address: 127.0.0.1:1}]\nencoder: {model_dir: m, nice: 20}\n",
                 NAME ":2:31: ", "nice");
    expect_error("listen: [{address: 127.0.0.1:1}]\ncache:\n  threshold: 1.5\n", NAME ":3:14: ",
                 "'threshold' must be between 0 and 1");
    expect_error("listen: [{address: 127.0.0.1:1}]\ncache:\n  ttl: 5\n", NAME ":3:3: ",
                 "unknown key 'ttl' in cache");
    expect_error("listen: [{address: 127.0.0.1:1}]\ncache:\n  redis: {port: 1}\n", NAME ":3:10: ",
                 "needs 'host'");
    expect_error("listen: [{address: 127.0.0.1:1}]\ncache:\n  guard: maybe\n", NAME ":3:10: ",
                 "'guard' must be true or false");
    expect_error("listen: [{address: 127.0.0.1:1}]\npolicy: ''\n", NAME ":2:9: ",
                 "non-empty path");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(full_config),
        cmocka_unit_test(defaults),
        cmocka_unit_test(bools_and_burst),
        cmocka_unit_test(path_without_dir),
        cmocka_unit_test(error_bad_yaml),
        cmocka_unit_test(error_empty_or_not_mapping),
        cmocka_unit_test(error_unknown_keys),
        cmocka_unit_test(error_wrong_types),
        cmocka_unit_test(error_out_of_range),
        cmocka_unit_test(error_tiers),
        cmocka_unit_test(engine_tiers),
        cmocka_unit_test(error_aliases_and_fallbacks),
        cmocka_unit_test(error_listen),
        cmocka_unit_test(error_keys),
        cmocka_unit_test(error_duplicate_keys),
        cmocka_unit_test(load_missing_file),
        cmocka_unit_test(load_resolves_against_file_dir),
        cmocka_unit_test(encoder_cache_policy),
        cmocka_unit_test(error_encoder_cache),
    };
    return cmocka_run_group_tests_name("gateway/config", tests, NULL, NULL);
}
