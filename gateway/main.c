/* gateway/main.c: the llmgw daemon's entry: command line, config, wiring, event loop. */
#include "gateway/accesslog.h"
#include "gateway/api.h"
#include "gateway/cache.h"
#include "gateway/engine_tier.h"
#include "gateway/http.h"
#include "gateway/route.h"
#include "gateway/tier.h"
#include "gateway/upstream.h"
#include "router/alias.h"

#include "common/log.h"
#include "common/time.h"

#include <errno.h>
#include <event2/dns.h>
#include <event2/event.h>
#include <event2/thread.h>
#include "engine/decoder/model.h"
#include <getopt.h>
#include <stdlib.h>
#include <string.h>

#define LLMGW_VERSION "0.1.0"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: llmgw -c FILE [--dev-tls DIR]\n"
            "       llmgw --check-config FILE\n"
            "       llmgw --check-policy FILE [-c CONFIG]\n"
            "  -c, --config FILE       the YAML config (see README)\n"
            "      --dev-tls DIR       TLS listeners without cert/key use DIR/cert.pem and\n"
            "                          DIR/key.pem, created self-signed when missing\n"
            "      --check-config FILE validate FILE and exit (0 ok, 2 invalid)\n"
            "      --check-policy FILE validate a routing policy (its tiers against CONFIG's\n"
            "                          when -c is given) and exit (0 ok, 2 invalid)\n"
            "  -V, --version\n");
}

static int check_config(const char *path)
{
    gw_config *c = NULL;
    util_err err = {0};
    if (gw_config_load(&c, path, &err) != 0) {
        fprintf(stderr, "%s\n", err.msg);
        return 2;
    }
    /* Upstream URLs and TLS settings are checked the way the daemon would use them. */
    struct event_base *base = event_base_new();
    int rc = 0;
    for (size_t i = 0; i < c->n_tiers && rc == 0; i++) {
        gw_upstream *u = NULL;
        if (c->tiers[i].kind == GW_TIER_ENGINE) {
            /* The model file is read and validated in full (weights stay unread). */
            eng_model *m = NULL;
            if (eng_model_load(&m, c->tiers[i].model_path, c->tiers[i].chat_template,
                               &err) != 0) {
                fprintf(stderr, "%s: tier '%s': %s\n", path, c->tiers[i].name, err.msg);
                rc = 2;
            }
            eng_model_free(m);
            continue;
        }
        if (gw_upstream_new(&u, base, NULL, &c->tiers[i], &err) != 0) {
            fprintf(stderr, "%s: %s\n", path, err.msg);
            rc = 2;
        }
        gw_upstream_free(u);
    }
    event_base_free(base);
    if (rc == 0 && c->policy_path != NULL && gw_check_policy(c->policy_path, path) != 0)
        rc = 2;
    if (rc == 0)
        printf("%s: ok (%zu listener(s), %zu tier(s), %zu key(s))\n", path, c->n_listen,
               c->n_tiers, c->n_keys);
    gw_config_free(c);
    return rc;
}

static int run(const char *path, const char *dev_tls)
{
    gw_server s = {0};
    util_err err = {0};
    int rc = 1;
    if (gw_config_load(&s.cfg, path, &err) != 0) {
        fprintf(stderr, "llmgw: %s\n", err.msg);
        return 2;
    }
    util_log_min_level = (util_log_level)s.cfg->log_level;
    s.dev_tls_dir = dev_tls;
    s.started_ns = util_now_ns();
    evthread_use_pthreads();  /* engine threads wake the loop with event_active */
    /* The changelist folds the read/write toggles evhttp makes on a connection within one loop
     * turn into one epoll_ctl (or none): a proxied request makes several. */
    struct event_config *ecfg = event_config_new();
    event_config_set_flag(ecfg, EVENT_BASE_FLAG_EPOLL_USE_CHANGELIST);
    s.base = event_base_new_with_config(ecfg);
    event_config_free(ecfg);
    if (s.cfg->access_log != NULL &&
        gw_alog_open(&s.access_log, s.base, s.cfg->access_log, &err) != 0) {
        fprintf(stderr, "llmgw: %s\n", err.msg);
        goto out;
    }
    /* Two priorities: 0 for the connection hook of http.c, 1 (the default) for all else. */
    event_base_priority_init(s.base, 2);
    s.dns = evdns_base_new(s.base, EVDNS_BASE_INITIALIZE_NAMESERVERS);
    if (s.dns == NULL)  /* no resolv.conf: numeric upstream addresses still work */
        s.dns = evdns_base_new(s.base, 0);
    s.metrics = gw_metrics_new();
    gw_api_declare_metrics(s.metrics);
    gw_api_init(&s);
    s.auth = gw_auth_new(s.cfg, util_now_ns());
    /* Names and aliases are unique (the config checked), so every add succeeds. */
    s.models = router_alias_new();
    for (size_t i = 0; i < s.cfg->n_tiers; i++) {
        router_alias_add(s.models, s.cfg->tiers[i].name, (int)i);
        for (size_t a = 0; a < s.cfg->tiers[i].n_aliases; a++)
            router_alias_add(s.models, s.cfg->tiers[i].aliases[a], (int)i);
    }
    if (gw_auth_disabled(s.auth))
        UTIL_LOG_WARN("main", "no API keys configured: authentication is off");
    s.tiers = util_xcalloc(s.cfg->n_tiers ? s.cfg->n_tiers : 1, sizeof *s.tiers);
    if (gw_engines_new(&s.engines, &s, &err) != 0) {
        fprintf(stderr, "llmgw: %s\n", err.msg);
        goto out;
    }
    if (gw_cache_new(&s.cache, &s, &err) != 0) {
        fprintf(stderr, "llmgw: %s\n", err.msg);
        goto out;
    }
    if (gw_router_new(&s.router, &s, &err) != 0) {
        fprintf(stderr, "llmgw: %s\n", err.msg);
        goto out;
    }
    for (size_t i = 0; i < s.cfg->n_tiers; i++) {
        int trc = s.cfg->tiers[i].kind == GW_TIER_ENGINE
                      ? gw_engine_tier_new(&s.tiers[i], s.engines, (int)i)
                      : gw_upstream_tier_new(&s.tiers[i], &s, (int)i, &err);
        if (trc != 0) {
            fprintf(stderr, "llmgw: %s\n", err.msg[0] ? err.msg : "cannot make a tier");
            goto out;
        }
    }
    if (gw_server_start(&s, &err) != 0) {
        fprintf(stderr, "llmgw: %s\n", err.msg);
        goto out;
    }
    UTIL_LOG_INFO("main", "llmgw %s ready: %zu tier(s), %zu key(s)", LLMGW_VERSION,
                  s.cfg->n_tiers, s.cfg->n_keys);
    event_base_dispatch(s.base);
    UTIL_LOG_INFO("main", "stopped");
    rc = 0;
out:
    gw_server_stop(&s);
    gw_api_deinit(&s);
    if (s.tiers != NULL)
        for (size_t i = 0; i < s.cfg->n_tiers; i++)
            gw_tier_free(s.tiers[i]);
    free(s.tiers);
    gw_router_free(s.router);
    gw_cache_free(s.cache);
    gw_engines_free(s.engines);
    free(s.conn_by_fd);
    gw_auth_free(s.auth);
    router_alias_free(s.models);
    gw_metrics_free(s.metrics);
    gw_alog_close(s.access_log);
    if (s.dns)
        evdns_base_free(s.dns, 0);
    if (s.base)
        event_base_free(s.base);
    gw_config_free(s.cfg);
    return rc;
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"config", required_argument, NULL, 'c'},
        {"dev-tls", required_argument, NULL, 'd'},
        {"check-config", required_argument, NULL, 'k'},
        {"check-policy", required_argument, NULL, 'P'},
        {"version", no_argument, NULL, 'V'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *config = NULL, *dev_tls = NULL, *policy = NULL;
    int opt;
    while ((opt = getopt_long(argc, argv, "c:Vh", opts, NULL)) != -1) {
        switch (opt) {
        case 'c': config = optarg; break;
        case 'd': dev_tls = optarg; break;
        case 'k': return check_config(optarg);
        case 'P': policy = optarg; break;
        case 'V': printf("llmgw %s\n", LLMGW_VERSION); return 0;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (policy != NULL && optind == argc)
        return gw_check_policy(policy, config);
    if (config == NULL || optind != argc) {
        usage(stderr);
        return 2;
    }
    return run(config, dev_tls);
}
