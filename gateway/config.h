/* gateway/config.h: the daemon's one YAML config file, parsed and validated into gw_config.
 * gw_config_load reports the first problem as "file:line:column: what" in err and returns
 * LLMGW_EINVAL (bad content) or LLMGW_EIO (unreadable). The struct is immutable once loaded;
 * every string in it is owned by it and freed by gw_config_free. Paths are resolved against the
 * config file's directory. */
#ifndef LLMGW_GATEWAY_CONFIG_H
#define LLMGW_GATEWAY_CONFIG_H

#include "common/err.h"

#include <stdbool.h>
#include <stddef.h>

typedef struct gw_listen_cfg {
    char *host;  /* numeric or name, e.g. "127.0.0.1" */
    int port;
    bool tls;
    char *cert;  /* PEM paths; NULL with tls means "use --dev-tls" */
    char *key;
} gw_listen_cfg;

typedef struct gw_key_cfg {
    char *key;
    char *group;          /* the tenant */
    double rate;          /* requests per second refilled; 0 = unlimited */
    double burst;         /* bucket size */
} gw_key_cfg;

typedef enum gw_tier_kind {
    GW_TIER_UPSTREAM = 0,
    GW_TIER_ENGINE = 1,   /* a model served in-process (engine/) */
} gw_tier_kind;

typedef struct gw_tier_cfg {
    char *name;
    gw_tier_kind kind;
    char *base_url;       /* "http[s]://host[:port][/prefix]", no trailing slash */
    char *api_key;        /* sent upstream as a bearer token; NULL = none */
    char *model;          /* model name sent upstream; NULL = the requested one */
    char **aliases;
    size_t n_aliases;
    int connect_timeout_ms;
    int timeout_ms;
    int max_connections;
    int retries;          /* extra attempts after a connect failure */
    char *fallback;       /* tier name or NULL */
    bool tls_verify;
    char *ca_file;
    /* engine tiers */
    char *model_path;     /* GGUF file */
    int threads;          /* CPU threads of this instance's backend (0 = all CPUs) */
    int context;          /* per-sequence context (0 = min(model, 4096)) */
    int max_batch_tokens; /* tokens per batched step (0 = 256) */
    int max_seqs;         /* sequences decoded together (0 = 32) */
    int ngram_draft;      /* prompt-lookup speculation: tokens drafted per step (0 = off) */
    char *draft_tier;     /* draft-model speculation: the engine tier whose model drafts, or
                             NULL (engine/serve/engine.h: drafter) */
    int draft_max;        /* 0 = the engine's default, as the next two */
    double draft_p_min;   /* < 0 = unset */
    int draft_max_batch;
    bool draft_always;    /* draft without measuring whether it pays (engine.h) */
    bool draft_own_kv;    /* the drafter keeps K/V of its own even where it could read the
                             model's (engine.h) */
    char *chat_template;  /* "chatml" / "llama3" override, NULL = from the file */
    char *kv_dtype;       /* the K/V cache: "f16" (NULL: the default) or "q8" (engine/decoder/model.h:
                             eng_kv_parse names, e.g. "q8/16") */
    char *device;         /* where it computes: "cpu", "cuda", "cuda:N", "auto" (NULL: auto;
                             kernels/device.h: kern_backend_open) */
} gw_tier_cfg;

typedef struct gw_limits_cfg {
    size_t max_body_bytes;
    size_t max_header_bytes;
    int read_timeout_ms;
    int request_timeout_ms;
    int header_timeout_ms;   /* with every slot taken, a connection that has sent no complete
                                request for this long is the first to be closed */
    int max_connections;
    int shutdown_grace_ms;
} gw_limits_cfg;

typedef struct gw_engine_cfg {
    size_t kv_pool_mb;    /* the KV pool shared by every engine tier */
    size_t kv_page_kb;    /* page size */
} gw_engine_cfg;

/* The in-process sentence encoder (engine/encoder/bert.h) behind /v1/embeddings and the cache. */
typedef struct gw_encoder_cfg {
    char *model_dir;      /* a sentence-transformers directory; NULL = no encoder */
    char *name;           /* the model name /v1/embeddings answers to ("all-MiniLM-L6-v2") */
    int threads;          /* CPU threads of the encoder (0 = all CPUs) */
    char *device;         /* where it encodes (as a tier's device; NULL: auto) */
    int precision;        /* 0 auto (the faster of BF16 and f32 products here), 1 f32, 2 bf16 */
    int batch_window_us;  /* how long a text waits for others to batch with (default 500) */
    bool adaptive_window; /* wait it only when texts come faster than one a window (true) */
    int spin_ms;          /* helper threads keep polling this long after a batch (50) */
    int max_batch;        /* texts per batch (default 32) */
    int max_queue;        /* texts waiting before requests are refused with 503 (4096) */
    int max_wait_ms;      /* refuse a text that would wait longer for its vector (0: off) */
    int nice;             /* the encoder's threads' nice value, 0..19 (0: the process's) */
} gw_encoder_cfg;

/* The semantic cache (cache/store.h, cache/share.h, cache/verifier.h); needs the encoder. */
#define GW_CACHE_MAX_CANDIDATES 32
typedef struct gw_cache_cfg {
    bool enabled;
    double threshold;       /* cosine similarity for a semantic hit; with a verifier, the floor
                               below which candidates are not verified */
    char *verifier;         /* cache/verifier.h weights file; NULL = the cosine decides alone */
    double max_false_hit_rate; /* the verifier's error budget (default 0.01): picks its
                               operating point from the weights file's calibrated table */
    int candidates;         /* FAISS candidates looked at per lookup (k; default 8) */
    char *index;            /* FAISS factory string, "IDMap2,Flat" */
    long ttl_s;
    size_t max_mb;          /* memory budget of the local store */
    double max_temperature; /* requests sampled hotter are not cached (default 0) */
    bool cache_tool_calls;  /* store answers that call tools (default false) */
    bool guard;             /* cache/guard.h checks on semantic hits (negation, ids, swaps);
                               with a verifier they are its features, not vetoes */
    char *redis_host;       /* NULL = no sharing */
    int redis_port;
    char *redis_prefix;
    int redis_check_timeout_ms;
} gw_cache_cfg;

typedef struct gw_config {
    char *path;
    gw_listen_cfg *listen;
    size_t n_listen;
    gw_key_cfg *keys;
    size_t n_keys;
    char **admin_groups;  /* auth.admin_groups: key groups that may read /v1/llmgw/stats; none
                             listed: every key may */
    size_t n_admin_groups;
    gw_tier_cfg *tiers;
    size_t n_tiers;
    gw_limits_cfg limits;
    gw_engine_cfg engine;
    gw_encoder_cfg encoder;
    gw_cache_cfg cache;
    char *policy_path;    /* the routing policy (router/policy.h); NULL = none */
    int log_level;        /* util_log_level */
    char *access_log;     /* "-" = stderr, NULL = off */
} gw_config;

int  gw_config_load(gw_config **out, const char *path, util_err *err);
/* Parses YAML text; `name` is used in messages and `dir` resolves relative paths. */
int  gw_config_parse(gw_config **out, const char *text, size_t len, const char *name,
                     const char *dir, util_err *err);
void gw_config_free(gw_config *c);  /* NULL is a no-op */

/* The tier with this name, or NULL. */
const gw_tier_cfg *gw_config_tier(const gw_config *c, const char *name);

#endif
