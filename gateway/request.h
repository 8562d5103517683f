/* gateway/request.h: an OpenAI API request body parsed and validated into one struct.
 * gw_request_parse never trusts the body: every field is type- and range-checked the way the
 * OpenAI API checks it, and the first problem is described in `gw_req_error` (HTTP status,
 * OpenAI error type, the offending parameter, a code). Strings point into `json` or `arena`;
 * both outlive the struct's users (the request). Pure and allocation-bounded: a fuzz target. */
#ifndef LLMGW_GATEWAY_REQUEST_H
#define LLMGW_GATEWAY_REQUEST_H

#include "common/arena.h"

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum gw_endpoint {
    GW_EP_CHAT = 0,
    GW_EP_COMPLETIONS = 1,
    GW_EP_EMBEDDINGS = 2,
} gw_endpoint;

typedef struct gw_message {
    const char *role;
    const char *text;   /* the text parts joined by "\n" (arena); "" when none */
    size_t text_len;
    bool has_tool_calls;
    int media_part;     /* the index of its first non-text part (image_url, input_audio, file),
                           -1 when it has none */
    const char *media_type;  /* that part's type (static) */
} gw_message;

#define GW_MAX_STOP 4
#define GW_MAX_LOGIT_BIAS 1024

typedef enum gw_response_format {
    GW_RF_TEXT = 0,
    GW_RF_JSON_OBJECT = 1,
    GW_RF_JSON_SCHEMA = 2,
} gw_response_format;

typedef struct gw_request {
    gw_endpoint ep;
    cJSON *json;             /* the whole body, owned; forwarded upstream */
    const char *model;
    gw_message *messages;    /* chat: [n_messages] */
    size_t n_messages;
    const char *prompt;      /* completions: the prompt when it is one string, else NULL */
    size_t n_inputs;         /* embeddings: number of inputs; completions: number of prompts */
    bool stream;
    bool include_usage;      /* stream_options.include_usage */
    bool has_temperature, has_top_p, has_seed;
    double temperature;      /* [0, 2] */
    double top_p;            /* [0, 1] */
    int64_t max_tokens;      /* -1 when unset; max_completion_tokens wins over max_tokens */
    const char *stop[GW_MAX_STOP];
    size_t n_stop;
    int n;                   /* 1 when unset */
    int64_t seed;
    const char *user;
    int top_logprobs;        /* -1: no logprobs; else how many alternatives per token */
    int top_k;               /* extension (as vLLM): 0 = off */
    double min_p;            /* extension (as vLLM): 0 = off */
    bool echo;               /* completions */
    bool has_tools;          /* tools/tool_choice/functions are passed through untouched */
    const gw_message *media; /* the first message with a non-text part, NULL when none: a tier
                                that reads text only must refuse the request, not drop parts */
    size_t media_msg;        /* its index */
    int64_t logit_bias_n;    /* entries of logit_bias (validated: token-id keys, [-100, 100]) */
    bool has_response_format;
    gw_response_format response_format;  /* text when unset */
    const cJSON *json_schema;  /* json_schema: response_format.json_schema.schema (in json), or
                                  NULL when the format names no schema (then any object) */
} gw_request;

typedef struct gw_req_error {
    int status;              /* HTTP status, 400 for every validation failure */
    const char *type;        /* "invalid_request_error" */
    char param[64];          /* the offending parameter, "" when none */
    const char *code;        /* static string or NULL */
    char message[320];
} gw_req_error;

/* Parses `len` bytes of `body` for endpoint `ep`. On success fills `r` (which owns r->json:
 * release with gw_request_deinit) and returns 0; on failure fills `err`, leaves nothing to
 * release and returns LLMGW_EINVAL. */
int  gw_request_parse(gw_request *r, gw_endpoint ep, const char *body, size_t len,
                      util_arena *arena, gw_req_error *err);
void gw_request_deinit(gw_request *r);

/* The last message with role "user", or NULL. */
const gw_message *gw_request_last_user(const gw_request *r);

/* True when `len` bytes at `s` are well-formed UTF-8 (no overlongs, surrogates or > U+10FFFF). */
bool gw_utf8_valid(const char *s, size_t len);

#endif
