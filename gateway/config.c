/* gateway/config.c: YAML (libyaml document API) → gw_config. Every node keeps its mark, so each
 * error names file:line:column of the offending node (1-based, as editors count). */
#include "gateway/config.h"

#include "common/arena.h"
#include "common/log.h"
#include "common/yaml.h"
#include "engine/decoder/model.h"
#include "kernels/backend.h"
#include "kernels/device.h"

#include <errno.h>
#include <stdarg.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

typedef struct parse_ctx {
    util_yaml y;       /* the document, its file name for messages, the error out-parameter */
    yaml_document_t *doc;
    const char *dir;   /* for relative paths */
} parse_ctx;

#define fail_at(p, n, ...) util_yaml_fail(&(p)->y, LLMGW_EINVAL, (n), __VA_ARGS__)
#define scalar(n) util_yaml_scalar(n)

static int get_str(parse_ctx *p, const yaml_node_t *n, const char *key, char **out)
{
    const char *s = scalar(n);
    if (s == NULL)
        return fail_at(p, n, "'%s' must be a string", key);
    free(*out);
    *out = util_xstrdup(s);
    return 0;
}

static int get_path(parse_ctx *p, const yaml_node_t *n, const char *key, char **out)
{
    const char *s = scalar(n);
    if (s == NULL || *s == '\0')
        return fail_at(p, n, "'%s' must be a non-empty path", key);
    free(*out);
    if (s[0] == '/' || p->dir == NULL) {
        *out = util_xstrdup(s);
    } else {
        size_t len = strlen(p->dir) + strlen(s) + 2;
        *out = util_xmalloc(len);
        snprintf(*out, len, "%s/%s", p->dir, s);
    }
    return 0;
}

/* A device name (kernels/backend.h: cpu, cuda, cuda:N, auto), kept as written. */
static int get_device(parse_ctx *p, const yaml_node_t *n, const char *key, char **out)
{
    const char *s = scalar(n);
    kern_device d;
    if (s == NULL || kern_device_parse(s, &d) != 0)
        return fail_at(p, n, "'%s' must be cpu, cuda, cuda:N or auto", key);
    return get_str(p, n, key, out);
}

static int get_long(parse_ctx *p, const yaml_node_t *n, const char *key, long lo, long hi,
                    long *out)
{
    return util_yaml_long(&p->y, n, key, lo, hi, out);
}

static int get_int(parse_ctx *p, const yaml_node_t *n, const char *key, long lo, long hi, int *out)
{
    long v;
    int rc = get_long(p, n, key, lo, hi, &v);
    if (rc == 0)
        *out = (int)v;
    return rc;
}

static int get_double(parse_ctx *p, const yaml_node_t *n, const char *key, double lo, double hi,
                      double *out)
{
    return util_yaml_double(&p->y, n, key, lo, hi, out);
}

static int get_bool(parse_ctx *p, const yaml_node_t *n, const char *key, bool *out)
{
    return util_yaml_bool(&p->y, n, key, out);
}

static int expect(parse_ctx *p, const yaml_node_t *n, yaml_node_type_t type, const char *what)
{
    return util_yaml_expect(&p->y, n, type, what);
}

#define FOR_PAIRS(p, map, k, kn, v) UTIL_YAML_FOR_PAIRS((p)->doc, map, k, kn, v)
#define FOR_ITEMS(p, seq, it) UTIL_YAML_FOR_ITEMS((p)->doc, seq, it)

static int parse_listen(parse_ctx *p, const yaml_node_t *n, gw_listen_cfg *l)
{
    int rc;
    char *address = NULL;
    const yaml_node_t *addr_node = n;
    if ((rc = expect(p, n, YAML_MAPPING_NODE, "a listen entry")) != 0)
        return rc;
    FOR_PAIRS(p, n, k, kn, v) {
        if (!strcmp(k, "address")) {
            addr_node = v;
            rc = get_str(p, v, k, &address);
        } else if (!strcmp(k, "tls")) {
            rc = get_bool(p, v, k, &l->tls);
        } else if (!strcmp(k, "cert")) {
            rc = get_path(p, v, k, &l->cert);
        } else if (!strcmp(k, "key")) {
            rc = get_path(p, v, k, &l->key);
        } else {
            rc = fail_at(p, kn, "unknown key '%s' in listen (address, tls, cert, key)", k);
        }
        if (rc != 0)
            goto out;
    }
    if (address == NULL) {
        rc = fail_at(p, n, "a listen entry needs 'address: host:port'");
        goto out;
    }
    /* host:port, the last colon separates (so "[::1]:8080" works with brackets stripped). */
    char *colon = strrchr(address, ':');
    char *end;
    long port = colon ? strtol(colon + 1, &end, 10) : -1;
    if (colon == NULL || colon == address || *end != '\0' || port < 0 || port > 65535) {
        rc = fail_at(p, addr_node, "'address' must be host:port, got '%s'", address);
        goto out;
    }
    *colon = '\0';
    const char *host = address;
    size_t hl = strlen(host);
    if (host[0] == '[' && hl > 2 && host[hl - 1] == ']') {
        address[hl - 1] = '\0';
        host++;
    }
    l->host = util_xstrdup(host);
    l->port = (int)port;
    if (!l->tls && (l->cert != NULL || l->key != NULL)) {
        rc = fail_at(p, n, "'cert' and 'key' are only for 'tls: true' listeners");
        goto out;
    }
    if ((l->cert == NULL) != (l->key == NULL)) {
        rc = fail_at(p, n, "a TLS listener needs both 'cert' and 'key'");
        goto out;
    }
out:
    free(address);
    return rc;
}

static int parse_limits(parse_ctx *p, const yaml_node_t *n, gw_limits_cfg *l)
{
    int rc = expect(p, n, YAML_MAPPING_NODE, "'limits'");
    long v;
    if (rc != 0)
        return rc;
    FOR_PAIRS(p, n, k, kn, v_) {
        if (!strcmp(k, "max_body_bytes")) {
            if ((rc = get_long(p, v_, k, 1024, 1L << 30, &v)) == 0)
                l->max_body_bytes = (size_t)v;
        } else if (!strcmp(k, "max_header_bytes")) {
            if ((rc = get_long(p, v_, k, 1024, 1L << 20, &v)) == 0)
                l->max_header_bytes = (size_t)v;
        } else if (!strcmp(k, "read_timeout_ms")) {
            rc = get_int(p, v_, k, 10, 3600000, &l->read_timeout_ms);
        } else if (!strcmp(k, "request_timeout_ms")) {
            rc = get_int(p, v_, k, 10, 3600000, &l->request_timeout_ms);
        } else if (!strcmp(k, "header_timeout_ms")) {
            rc = get_int(p, v_, k, 1, 3600000, &l->header_timeout_ms);
        } else if (!strcmp(k, "max_connections")) {
            rc = get_int(p, v_, k, 1, 1000000, &l->max_connections);
        } else if (!strcmp(k, "shutdown_grace_ms")) {
            rc = get_int(p, v_, k, 0, 3600000, &l->shutdown_grace_ms);
        } else {
            rc = fail_at(p, kn, "unknown key '%s' in limits", k);
        }
        if (rc != 0)
            return rc;
    }
    return 0;
}

static int parse_key(parse_ctx *p, const yaml_node_t *n, gw_key_cfg *key)
{
    int rc = expect(p, n, YAML_MAPPING_NODE, "a key entry");
    if (rc != 0)
        return rc;
    FOR_PAIRS(p, n, k, kn, v) {
        if (!strcmp(k, "key")) {
            rc = get_str(p, v, k, &key->key);
            if (rc == 0 && strlen(key->key) < 8)
                rc = fail_at(p, v, "an API key must be at least 8 characters");
        } else if (!strcmp(k, "group")) {
            rc = get_str(p, v, k, &key->group);
        } else if (!strcmp(k, "rate_limit")) {
            if ((rc = expect(p, v, YAML_MAPPING_NODE, "'rate_limit'")) != 0)
                return rc;
            FOR_PAIRS(p, v, rk, rkn, rv) {
                if (!strcmp(rk, "requests_per_second"))
                    rc = get_double(p, rv, rk, 0.001, 1e9, &key->rate);
                else if (!strcmp(rk, "burst"))
                    rc = get_double(p, rv, rk, 1, 1e9, &key->burst);
                else
                    rc = fail_at(p, rkn, "unknown key '%s' in rate_limit "
                                         "(requests_per_second, burst)", rk);
                if (rc != 0)
                    return rc;
            }
        } else {
            rc = fail_at(p, kn, "unknown key '%s' in a key entry (key, group, rate_limit)", k);
        }
        if (rc != 0)
            return rc;
    }
    if (key->key == NULL)
        return fail_at(p, n, "a key entry needs 'key'");
    if (key->group == NULL)
        key->group = util_xstrdup("default");
    if (key->rate > 0 && key->burst == 0)
        key->burst = key->rate < 1 ? 1 : key->rate;
    return 0;
}

static int parse_tier(parse_ctx *p, const yaml_node_t *n, gw_tier_cfg *t)
{
    int rc = expect(p, n, YAML_MAPPING_NODE, "a tier");
    const yaml_node_t *url_node = n;
    if (rc != 0)
        return rc;
    t->connect_timeout_ms = 2000;
    t->timeout_ms = 120000;
    t->max_connections = 256;
    t->retries = 1;
    t->tls_verify = true;
    t->draft_p_min = -1;
    FOR_PAIRS(p, n, k, kn, v) {
        if (!strcmp(k, "name")) {
            rc = get_str(p, v, k, &t->name);
        } else if (!strcmp(k, "kind")) {
            const char *s = scalar(v);
            if (s != NULL && !strcmp(s, "upstream"))
                t->kind = GW_TIER_UPSTREAM;
            else if (s != NULL && !strcmp(s, "engine"))
                t->kind = GW_TIER_ENGINE;
            else
                rc = fail_at(p, v, "'kind' must be 'upstream' or 'engine'");
        } else if (!strcmp(k, "base_url")) {
            url_node = v;
            rc = get_str(p, v, k, &t->base_url);
        } else if (!strcmp(k, "api_key")) {
            rc = get_str(p, v, k, &t->api_key);
        } else if (!strcmp(k, "model")) {
            rc = get_str(p, v, k, &t->model);
        } else if (!strcmp(k, "aliases")) {
            if ((rc = expect(p, v, YAML_SEQUENCE_NODE, "'aliases'")) != 0)
                return rc;
            size_t cap = (size_t)(v->data.sequence.items.top - v->data.sequence.items.start);
            t->aliases = util_xcalloc(cap, sizeof *t->aliases);
            FOR_ITEMS(p, v, it) {
                if ((rc = get_str(p, it, "aliases[]", &t->aliases[t->n_aliases])) != 0)
                    return rc;
                t->n_aliases++;
            }
        } else if (!strcmp(k, "connect_timeout_ms")) {
            rc = get_int(p, v, k, 1, 600000, &t->connect_timeout_ms);
        } else if (!strcmp(k, "timeout_ms")) {
            rc = get_int(p, v, k, 1, 3600000, &t->timeout_ms);
        } else if (!strcmp(k, "max_connections")) {
            rc = get_int(p, v, k, 1, 100000, &t->max_connections);
        } else if (!strcmp(k, "retries")) {
            rc = get_int(p, v, k, 0, 10, &t->retries);
        } else if (!strcmp(k, "fallback")) {
            rc = get_str(p, v, k, &t->fallback);
        } else if (!strcmp(k, "tls_verify")) {
            rc = get_bool(p, v, k, &t->tls_verify);
        } else if (!strcmp(k, "ca_file")) {
            rc = get_path(p, v, k, &t->ca_file);
        } else if (!strcmp(k, "model_path")) {
            rc = get_path(p, v, k, &t->model_path);
        } else if (!strcmp(k, "threads")) {
            rc = get_int(p, v, k, 0, 1024, &t->threads);
        } else if (!strcmp(k, "context")) {
            rc = get_int(p, v, k, 0, 1 << 20, &t->context);
        } else if (!strcmp(k, "max_batch_tokens")) {
            rc = get_int(p, v, k, 0, 65536, &t->max_batch_tokens);
        } else if (!strcmp(k, "max_seqs")) {
            rc = get_int(p, v, k, 0, 4096, &t->max_seqs);
        } else if (!strcmp(k, "ngram_draft")) {
            rc = get_int(p, v, k, 0, 16, &t->ngram_draft);  /* ENG_MAX_DRAFT */
        } else if (!strcmp(k, "draft_tier")) {
            rc = get_str(p, v, k, &t->draft_tier);
        } else if (!strcmp(k, "draft_max")) {
            rc = get_int(p, v, k, 1, 16, &t->draft_max);     /* ENG_MAX_DRAFT */
        } else if (!strcmp(k, "draft_p_min")) {
            rc = get_double(p, v, k, 0, 1, &t->draft_p_min);
        } else if (!strcmp(k, "draft_max_batch")) {
            rc = get_int(p, v, k, 1, 64, &t->draft_max_batch);  /* ENG_MAX_DRAFT_BATCH */
        } else if (!strcmp(k, "draft_always")) {
            rc = get_bool(p, v, k, &t->draft_always);
        } else if (!strcmp(k, "draft_own_kv")) {
            rc = get_bool(p, v, k, &t->draft_own_kv);
        } else if (!strcmp(k, "kv_dtype")) {
            const char *s = scalar(v);
            int type, group;
            bool rotate;
            if (s == NULL || eng_kv_parse(s, &type, &group, &rotate) != 0)
                rc = fail_at(p, v, "'kv_dtype' must be f16 or q8 (or q8/G: one K scale per G "
                             "channels; q8n, q8n/G: without the rotation)");
            else
                rc = get_str(p, v, k, &t->kv_dtype);
        } else if (!strcmp(k, "device")) {
            rc = get_device(p, v, k, &t->device);
        } else if (!strcmp(k, "chat_template")) {
            const char *s = scalar(v);
            if (s == NULL || (strcmp(s, "chatml") && strcmp(s, "llama3")))
                rc = fail_at(p, v, "'chat_template' must be chatml or llama3");
            else
                rc = get_str(p, v, k, &t->chat_template);
        } else {
            rc = fail_at(p, kn, "unknown key '%s' in a tier", k);
        }
        if (rc != 0)
            return rc;
    }
    if (t->name == NULL || t->name[0] == '\0')
        return fail_at(p, n, "a tier needs a 'name'");
    if (t->kind == GW_TIER_ENGINE) {
        if (t->model_path == NULL)
            return fail_at(p, n, "engine tier '%s' needs 'model_path'", t->name);
        if (t->base_url != NULL)
            return fail_at(p, url_node, "'base_url' is for upstream tiers; '%s' is an engine "
                           "tier", t->name);
        return 0;
    }
    if (t->model_path != NULL)
        return fail_at(p, n, "'model_path' is for engine tiers; '%s' is an upstream tier",
                       t->name);
    if (t->base_url == NULL)
        return fail_at(p, n, "upstream tier '%s' needs 'base_url'", t->name);
    if (strncmp(t->base_url, "http://", 7) != 0 && strncmp(t->base_url, "https://", 8) != 0)
        return fail_at(p, url_node, "'base_url' must start with http:// or https://");
    size_t ul = strlen(t->base_url);
    while (ul > 0 && t->base_url[ul - 1] == '/')
        t->base_url[--ul] = '\0';
    return 0;
}

static int parse_encoder(parse_ctx *p, const yaml_node_t *n, gw_encoder_cfg *e)
{
    int rc = expect(p, n, YAML_MAPPING_NODE, "'encoder'");
    if (rc != 0)
        return rc;
    FOR_PAIRS(p, n, k, kn, v) {
        if (!strcmp(k, "model_dir"))
            rc = get_path(p, v, k, &e->model_dir);
        else if (!strcmp(k, "name"))
            rc = get_str(p, v, k, &e->name);
        else if (!strcmp(k, "threads"))
            rc = get_int(p, v, k, 0, 256, &e->threads);
        else if (!strcmp(k, "batch_window_us"))
            rc = get_int(p, v, k, 0, 1000000, &e->batch_window_us);
        else if (!strcmp(k, "adaptive_window"))
            rc = get_bool(p, v, k, &e->adaptive_window);
        else if (!strcmp(k, "spin_ms"))
            rc = get_int(p, v, k, 0, 10000, &e->spin_ms);
        else if (!strcmp(k, "precision")) {
            const char *s = scalar(v);
            if (s == NULL || (strcmp(s, "auto") && strcmp(s, "f32") && strcmp(s, "bf16")))
                rc = fail_at(p, v, "'precision' must be auto, f32 or bf16");
            else
                e->precision = !strcmp(s, "f32") ? 1 : !strcmp(s, "bf16") ? 2 : 0;
        }
        else if (!strcmp(k, "device"))
            rc = get_device(p, v, k, &e->device);
        else if (!strcmp(k, "max_batch"))
            rc = get_int(p, v, k, 1, 1024, &e->max_batch);
        else if (!strcmp(k, "max_queue"))
            rc = get_int(p, v, k, 1, 1 << 20, &e->max_queue);
        else if (!strcmp(k, "max_wait_ms"))
            rc = get_int(p, v, k, 0, 600000, &e->max_wait_ms);
        else if (!strcmp(k, "nice"))
            rc = get_int(p, v, k, 0, 19, &e->nice);
        else
            rc = fail_at(p, kn, "unknown key '%s' in encoder (model_dir, name, threads, "
                         "device, precision, batch_window_us, adaptive_window, spin_ms, max_batch, "
                         "max_queue, max_wait_ms, nice)", k);
        if (rc != 0)
            return rc;
    }
    if (e->model_dir == NULL)
        return fail_at(p, n, "'encoder' needs 'model_dir'");
    if (e->name == NULL) {  /* the directory's name, as the model is known on the hub */
        const char *base = strrchr(e->model_dir, '/');
        e->name = util_xstrdup(base != NULL && base[1] ? base + 1 : e->model_dir);
    }
    return 0;
}

static int parse_cache(parse_ctx *p, const yaml_node_t *n, gw_cache_cfg *c)
{
    int rc = expect(p, n, YAML_MAPPING_NODE, "'cache'");
    if (rc != 0)
        return rc;
    long mb;
    FOR_PAIRS(p, n, k, kn, v) {
        if (!strcmp(k, "enabled")) {
            rc = get_bool(p, v, k, &c->enabled);
        } else if (!strcmp(k, "threshold")) {
            rc = get_double(p, v, k, 0.0, 1.0, &c->threshold);
        } else if (!strcmp(k, "index")) {
            rc = get_str(p, v, k, &c->index);
        } else if (!strcmp(k, "ttl_s")) {
            rc = get_long(p, v, k, 1, 365L * 86400, &c->ttl_s);
        } else if (!strcmp(k, "max_mb")) {
            if ((rc = get_long(p, v, k, 1, 1L << 20, &mb)) == 0)
                c->max_mb = (size_t)mb;
        } else if (!strcmp(k, "max_temperature")) {
            rc = get_double(p, v, k, 0.0, 2.0, &c->max_temperature);
        } else if (!strcmp(k, "cache_tool_calls")) {
            rc = get_bool(p, v, k, &c->cache_tool_calls);
        } else if (!strcmp(k, "guard")) {
            rc = get_bool(p, v, k, &c->guard);
        } else if (!strcmp(k, "verifier")) {
            rc = get_path(p, v, k, &c->verifier);
        } else if (!strcmp(k, "max_false_hit_rate")) {
            rc = get_double(p, v, k, 0.0, 0.5, &c->max_false_hit_rate);
        } else if (!strcmp(k, "candidates")) {
            rc = get_int(p, v, k, 1, GW_CACHE_MAX_CANDIDATES, &c->candidates);
        } else if (!strcmp(k, "redis")) {
            if ((rc = expect(p, v, YAML_MAPPING_NODE, "'redis'")) != 0)
                return rc;
            FOR_PAIRS(p, v, rk, rkn, rv) {
                if (!strcmp(rk, "host"))
                    rc = get_str(p, rv, rk, &c->redis_host);
                else if (!strcmp(rk, "port"))
                    rc = get_int(p, rv, rk, 1, 65535, &c->redis_port);
                else if (!strcmp(rk, "prefix"))
                    rc = get_str(p, rv, rk, &c->redis_prefix);
                else if (!strcmp(rk, "check_timeout_ms"))
                    rc = get_int(p, rv, rk, 1, 10000, &c->redis_check_timeout_ms);
                else
                    rc = fail_at(p, rkn, "unknown key '%s' in cache.redis (host, port, prefix, "
                                 "check_timeout_ms)", rk);
                if (rc != 0)
                    return rc;
            }
            if (c->redis_host == NULL)
                return fail_at(p, v, "'cache.redis' needs 'host'");
        } else {
            rc = fail_at(p, kn, "unknown key '%s' in cache (enabled, threshold, verifier, "
                         "max_false_hit_rate, candidates, index, ttl_s, max_mb, max_temperature, "
                         "cache_tool_calls, guard, redis)", k);
        }
        if (rc != 0)
            return rc;
    }
    return 0;
}

static int parse_root(parse_ctx *p, gw_config *c, const yaml_node_t *root)
{
    int rc = expect(p, root, YAML_MAPPING_NODE, "the config");
    if (rc != 0)
        return rc;
    const yaml_node_t *cache_node = NULL;
    FOR_PAIRS(p, root, k, kn, v) {
        if (!strcmp(k, "listen")) {
            if ((rc = expect(p, v, YAML_SEQUENCE_NODE, "'listen'")) != 0)
                return rc;
            size_t cap = (size_t)(v->data.sequence.items.top - v->data.sequence.items.start);
            c->listen = util_xcalloc(cap, sizeof *c->listen);
            FOR_ITEMS(p, v, it) {
                if ((rc = parse_listen(p, it, &c->listen[c->n_listen++])) != 0)
                    return rc;
            }
        } else if (!strcmp(k, "limits")) {
            rc = parse_limits(p, v, &c->limits);
        } else if (!strcmp(k, "auth")) {
            if ((rc = expect(p, v, YAML_MAPPING_NODE, "'auth'")) != 0)
                return rc;
            FOR_PAIRS(p, v, ak, akn, av) {
                if (!strcmp(ak, "admin_groups")) {
                    if ((rc = expect(p, av, YAML_SEQUENCE_NODE, "'admin_groups'")) != 0)
                        return rc;
                    if (c->admin_groups != NULL)
                        return fail_at(p, akn, "'admin_groups' is given twice");
                    size_t cap = (size_t)(av->data.sequence.items.top -
                                          av->data.sequence.items.start);
                    c->admin_groups = util_xcalloc(cap ? cap : 1, sizeof *c->admin_groups);
                    FOR_ITEMS(p, av, it) {
                        if ((rc = get_str(p, it, "admin_groups[]",
                                          &c->admin_groups[c->n_admin_groups])) != 0)
                            return rc;
                        c->n_admin_groups++;
                    }
                    continue;
                }
                if (strcmp(ak, "keys") != 0)
                    return fail_at(p, akn, "unknown key '%s' in auth (keys, admin_groups)", ak);
                if ((rc = expect(p, av, YAML_SEQUENCE_NODE, "'keys'")) != 0)
                    return rc;
                size_t cap = (size_t)(av->data.sequence.items.top - av->data.sequence.items.start);
                c->keys = util_xcalloc(cap, sizeof *c->keys);
                FOR_ITEMS(p, av, it) {
                    if ((rc = parse_key(p, it, &c->keys[c->n_keys++])) != 0)
                        return rc;
                }
            }
        } else if (!strcmp(k, "tiers")) {
            if ((rc = expect(p, v, YAML_SEQUENCE_NODE, "'tiers'")) != 0)
                return rc;
            size_t cap = (size_t)(v->data.sequence.items.top - v->data.sequence.items.start);
            c->tiers = util_xcalloc(cap, sizeof *c->tiers);
            FOR_ITEMS(p, v, it) {
                if ((rc = parse_tier(p, it, &c->tiers[c->n_tiers++])) != 0)
                    return rc;
                for (size_t i = 0; i + 1 < c->n_tiers; i++)
                    if (!strcmp(c->tiers[i].name, c->tiers[c->n_tiers - 1].name))
                        return fail_at(p, it, "tier '%s' is defined twice", c->tiers[i].name);
            }
        } else if (!strcmp(k, "engine")) {
            if ((rc = expect(p, v, YAML_MAPPING_NODE, "'engine'")) != 0)
                return rc;
            long n;
            FOR_PAIRS(p, v, ek, ekn, ev) {
                if (!strcmp(ek, "kv_pool_mb")) {
                    if ((rc = get_long(p, ev, ek, 1, 1L << 22, &n)) == 0)
                        c->engine.kv_pool_mb = (size_t)n;
                } else if (!strcmp(ek, "kv_page_kb")) {
                    if ((rc = get_long(p, ev, ek, 16, 1L << 20, &n)) == 0)
                        c->engine.kv_page_kb = (size_t)n;
                } else {
                    rc = fail_at(p, ekn, "unknown key '%s' in engine (kv_pool_mb, kv_page_kb)",
                                 ek);
                }
                if (rc != 0)
                    return rc;
            }
        } else if (!strcmp(k, "policy")) {
            rc = get_path(p, v, k, &c->policy_path);
        } else if (!strcmp(k, "encoder")) {
            rc = parse_encoder(p, v, &c->encoder);
        } else if (!strcmp(k, "cache")) {
            rc = parse_cache(p, v, &c->cache);
            if (rc == 0 && c->cache.enabled)
                cache_node = kn;
        } else if (!strcmp(k, "log")) {
            if ((rc = expect(p, v, YAML_MAPPING_NODE, "'log'")) != 0)
                return rc;
            FOR_PAIRS(p, v, lk, lkn, lv) {
                if (!strcmp(lk, "level")) {
                    util_log_level lvl;
                    if (scalar(lv) == NULL || util_log_parse_level(scalar(lv), &lvl) != 0)
                        return fail_at(p, lv, "'level' must be debug, info, warn or error");
                    c->log_level = (int)lvl;
                } else if (!strcmp(lk, "access_log")) {
                    const char *s = scalar(lv);
                    if (s != NULL && (!strcmp(s, "-") || !strcmp(s, "off"))) {
                        free(c->access_log);
                        c->access_log = strcmp(s, "off") ? util_xstrdup("-") : NULL;
                    } else if ((rc = get_path(p, lv, lk, &c->access_log)) != 0) {
                        return rc;
                    }
                } else {
                    return fail_at(p, lkn, "unknown key '%s' in log (level, access_log)", lk);
                }
            }
        } else {
            rc = fail_at(p, kn, "unknown top-level key '%s' (listen, limits, auth, tiers, "
                         "engine, encoder, cache, policy, log)", k);
        }
        if (rc != 0)
            return rc;
    }
    if (cache_node != NULL && c->encoder.model_dir == NULL)
        return fail_at(p, cache_node, "the cache needs an 'encoder' section (its model_dir)");
    if (c->n_listen == 0)
        return fail_at(p, root, "the config needs at least one 'listen' entry");
    /* Names and aliases share one namespace: the request's model field picks among them. */
    for (size_t i = 0; i < c->n_tiers; i++) {
        const gw_tier_cfg *t = &c->tiers[i];
        for (size_t a = 0; a < t->n_aliases; a++) {
            for (size_t j = 0; j < c->n_tiers; j++) {
                if (!strcmp(c->tiers[j].name, t->aliases[a]) && j != i)
                    return fail_at(p, root, "alias '%s' of tier '%s' is also a tier name",
                                   t->aliases[a], t->name);
                for (size_t b = 0; b < c->tiers[j].n_aliases; b++)
                    if ((j != i || b != a) && !strcmp(c->tiers[j].aliases[b], t->aliases[a]))
                        return fail_at(p, root, "alias '%s' is used twice", t->aliases[a]);
            }
        }
        if (t->fallback != NULL) {
            if (gw_config_tier(c, t->fallback) == NULL)
                return fail_at(p, root, "tier '%s' falls back to unknown tier '%s'", t->name,
                               t->fallback);
            if (!strcmp(t->fallback, t->name))
                return fail_at(p, root, "tier '%s' falls back to itself", t->name);
        }
        if (t->draft_tier != NULL) {
            const gw_tier_cfg *d = gw_config_tier(c, t->draft_tier);
            if (t->kind != GW_TIER_ENGINE)
                return fail_at(p, root, "'draft_tier' is for engine tiers; '%s' is an upstream "
                               "tier", t->name);
            if (d == NULL || d->kind != GW_TIER_ENGINE)
                return fail_at(p, root, "tier '%s' drafts with '%s', which is not an engine "
                               "tier", t->name, t->draft_tier);
            if (d == t)
                return fail_at(p, root, "tier '%s' drafts with itself", t->name);
        }
    }
    for (size_t i = 0; i < c->n_keys; i++)
        for (size_t j = 0; j < i; j++)
            if (!strcmp(c->keys[i].key, c->keys[j].key))
                return fail_at(p, root, "an API key is listed twice (groups '%s' and '%s')",
                               c->keys[j].group, c->keys[i].group);
    return 0;
}

const gw_tier_cfg *gw_config_tier(const gw_config *c, const char *name)
{
    for (size_t i = 0; i < c->n_tiers; i++)
        if (!strcmp(c->tiers[i].name, name))
            return &c->tiers[i];
    return NULL;
}

int gw_config_parse(gw_config **out, const char *text, size_t len, const char *name,
                    const char *dir, util_err *err)
{
    yaml_parser_t parser;
    yaml_document_t doc;
    gw_config *c = util_xcalloc(1, sizeof *c);
    int rc = 0;
    c->limits = (gw_limits_cfg){
        .max_body_bytes = 1u << 20,
        .max_header_bytes = 16384,
        .read_timeout_ms = 15000,
        .request_timeout_ms = 30000,
        .header_timeout_ms = 5000,
        .max_connections = 1024,
        .shutdown_grace_ms = 30000,
    };
    c->engine = (gw_engine_cfg){.kv_pool_mb = 512, .kv_page_kb = 512};
    c->encoder = (gw_encoder_cfg){.batch_window_us = 500, .adaptive_window = true, .spin_ms = 50,
                                  .max_batch = 32, .max_queue = 4096};
    c->cache = (gw_cache_cfg){
        .enabled = false,
        .threshold = 0.95,
        .ttl_s = 3600,
        .max_mb = 256,
        .max_temperature = 0.0,
        .guard = true,
        .max_false_hit_rate = 0.01,
        .candidates = 8,
        .redis_port = 6379,
        .redis_check_timeout_ms = 50,
    };
    c->log_level = UTIL_LOG_INFO;
    c->access_log = util_xstrdup("-");
    c->path = util_xstrdup(name);
    yaml_parser_initialize(&parser);
    yaml_parser_set_input_string(&parser, (const unsigned char *)text, len);
    if (!yaml_parser_load(&parser, &doc)) {
        rc = util_yaml_load_error(&parser, name, err);
        yaml_parser_delete(&parser);
        gw_config_free(c);
        return rc;
    }
    yaml_node_t *root = yaml_document_get_root_node(&doc);
    parse_ctx p = {.y = {.doc = &doc, .name = name, .err = err}, .doc = &doc, .dir = dir};
    if (root == NULL)
        rc = util_err_set(err, LLMGW_EINVAL, "%s:1:1: the config is empty", name);
    else
        rc = parse_root(&p, c, root);
    yaml_document_delete(&doc);
    yaml_parser_delete(&parser);
    if (rc != 0) {
        gw_config_free(c);
        return rc;
    }
    *out = c;
    return 0;
}

int gw_config_load(gw_config **out, const char *path, util_err *err)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return util_err_set(err, LLMGW_EIO, "%s: %s", path, strerror(errno));
    char *text = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (cap - len < 4096) {
            cap = cap ? cap * 2 : 8192;
            if (cap > (16u << 20)) {
                fclose(f);
                free(text);
                return util_err_set(err, LLMGW_ERANGE, "%s: larger than 16 MiB", path);
            }
            char *grown = realloc(text, cap);
            if (grown == NULL) {
                fclose(f);
                free(text);
                return util_err_set(err, LLMGW_ENOMEM, "%s: out of memory", path);
            }
            text = grown;
        }
        size_t n = fread(text + len, 1, cap - len, f);
        len += n;
        if (n == 0)
            break;
    }
    int read_err = ferror(f);
    fclose(f);
    if (read_err) {
        free(text);
        return util_err_set(err, LLMGW_EIO, "%s: read error", path);
    }
    char *dir = util_xstrdup(path);
    char *slash = strrchr(dir, '/');
    if (slash != NULL)
        *slash = '\0';
    else
        strcpy(dir, ".");
    int rc = gw_config_parse(out, text, len, path, dir, err);
    free(dir);
    free(text);
    return rc;
}

static void free_strs(char **v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(v[i]);
    free(v);
}

void gw_config_free(gw_config *c)
{
    if (c == NULL)
        return;
    for (size_t i = 0; i < c->n_listen; i++) {
        free(c->listen[i].host);
        free(c->listen[i].cert);
        free(c->listen[i].key);
    }
    free(c->listen);
    for (size_t i = 0; i < c->n_keys; i++) {
        free(c->keys[i].key);
        free(c->keys[i].group);
    }
    free(c->keys);
    for (size_t i = 0; i < c->n_admin_groups; i++)
        free(c->admin_groups[i]);
    free(c->admin_groups);
    for (size_t i = 0; i < c->n_tiers; i++) {
        gw_tier_cfg *t = &c->tiers[i];
        free(t->name);
        free(t->base_url);
        free(t->api_key);
        free(t->model);
        free_strs(t->aliases, t->n_aliases);
        free(t->fallback);
        free(t->draft_tier);
        free(t->ca_file);
        free(t->model_path);
        free(t->chat_template);
        free(t->kv_dtype);
        free(t->device);
    }
    free(c->tiers);
    free(c->policy_path);
    free(c->encoder.model_dir);
    free(c->encoder.name);
    free(c->encoder.device);
    free(c->cache.index);
    free(c->cache.verifier);
    free(c->cache.redis_host);
    free(c->cache.redis_prefix);
    free(c->access_log);
    free(c->path);
    free(c);
}
