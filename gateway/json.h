/* gateway/json.h: strict JSON in and out, so that a request body means one thing to us and to
 * every server we forward it to: the RFC 8259 checks that cJSON does not make, and a printer.
 *
 * gw_json_check scans the bytes before cJSON parses them: the grammar exactly as RFC 8259 writes
 * it (cJSON also takes "+1", ".5", "01" and "1."), no raw control bytes (U+0000..U+001F) inside
 * strings, valid escapes with paired surrogates, no escaped U+0000 (C strings would cut the text
 * there, so we would judge a shorter string than the one a peer reads), no number beyond the
 * range of a double (it would be infinity here), and a nesting limit.
 * The body must already be valid UTF-8 (gw_utf8_valid).
 *
 * gw_json_duplicate walks a parsed tree for an object that holds a key twice. Parsers disagree
 * on which occurrence wins (cJSON: the first; Python, Go and most servers: the last), so a body
 * with duplicate keys is refused rather than read one way here and another way upstream.
 * gw_json_print writes a tree back out (what goes upstream). Unlike cJSON's printer it writes
 * integral numbers as integers at any magnitude (cJSON writes a seed of 10^12 as "1e+12", which
 * the OpenAI API refuses as "not an integer"); integers beyond 2^53 are what the double holds.
 * All three are pure; fuzzed through fuzz_request. */
#ifndef LLMGW_GATEWAY_JSON_H
#define LLMGW_GATEWAY_JSON_H

#include <cjson/cJSON.h>
#include <event2/buffer.h>
#include <stdbool.h>
#include <stddef.h>

#define GW_JSON_MAX_DEPTH 512

typedef struct gw_json_fault {
    size_t offset;           /* the byte where the problem is */
    char what[120];          /* e.g. "a raw control byte (0x0a) inside a string" */
} gw_json_fault;

/* 0 when `len` bytes at `s` are one strict JSON value (surrounding whitespace allowed), else
 * -1 with *f describing the first problem. */
int gw_json_check(const char *s, size_t len, gw_json_fault *f);

/* The first key that some object under `root` holds twice, or NULL. When found, `path` (of
 * `cap` bytes) gets where, in the API's param style: "messages.[0].content" for the key
 * "content" of the first message; a duplicate top-level key is just its name. */
const char *gw_json_duplicate(const cJSON *root, char *path, size_t cap);

/* Appends `v` as compact JSON to `out`. When `model` is not NULL, a top-level "model" string is
 * written as `model` instead (a tier's upstream model name); the tree is not changed. */
void gw_json_print(const cJSON *v, const char *model, struct evbuffer *out);
/* Appends the NUL-terminated UTF-8 string `s` as a JSON string (quotes, escapes). */
void gw_json_print_string(const char *s, struct evbuffer *out);
/* The same for len bytes at s (a NUL among them is written as \u0000). */
void gw_json_print_stringn(const char *s, size_t len, struct evbuffer *out);

#endif
