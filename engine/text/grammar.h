/* engine/text/grammar.h: structured outputs. A JSON schema (or "any JSON object", OpenAI's
 * json_object) compiled into a constraint on generation: after any prefix the model may only
 * pick tokens whose bytes keep the text a prefix of some document the schema accepts, and an
 * end-of-generation token only once the document is whole. So a generation that ends on its own
 * (not cut by max_tokens) always parses and validates.
 *
 * Three objects:
 *   eng_gvocab   the vocabulary as a byte trie (built once per tokenizer, shared by every grammar
 *                of that model; immutable);
 *   eng_grammar  a compiled schema (immutable, reference-counted: any thread may hold one);
 *   eng_gstate   where one generation stands (a fixed-size value, copied freely: 0 allocations).
 *
 * The schema subset (refused with LLMGW_EINVAL, the message naming the keyword and its path):
 *   type (a name or a list), properties, required, additionalProperties (false, true or a
 *   schema; declared properties are generated in their declared order, optional ones may be
 *   skipped, undeclared ones only for an object with no properties), items, minItems, maxItems,
 *   enum and const (up to 64 values, generated in compact JSON), anyOf / oneOf whose alternatives
 *   start with different characters (a type each: the usual "X or null"), $ref to #/$defs/NAME
 *   or #/definitions/NAME (recursion included, nesting up to ENG_GRAMMAR_MAX_DEPTH), minLength,
 *   maxLength, format date, time, date-time, uuid, nullable (OpenAPI); annotations (title,
 *   description, default, examples, $schema, $id, $comment, deprecated, readOnly, writeOnly,
 *   strict) are ignored. Everything else (pattern, minimum, multipleOf, allOf, not, ...) is
 *   refused rather than silently not enforced.
 *
 * Generation details: whitespace between tokens is allowed in runs of at most 16 characters
 * (a model may indent; it cannot pad forever), numbers have at most 24 characters, and nothing
 * may follow the document but an end-of-generation token. */
#ifndef LLMGW_ENGINE_TEXT_GRAMMAR_H
#define LLMGW_ENGINE_TEXT_GRAMMAR_H

#include "common/err.h"
#include "engine/text/tokenizer.h"
#include "engine/text/tools.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define ENG_GRAMMAR_MAX_DEPTH 24     /* open objects, arrays and strings, nested */

typedef struct eng_gvocab eng_gvocab;
typedef struct eng_grammar eng_grammar;

/* Reads every token's bytes (control tokens have none and are never allowed; end-of-generation
 * tokens are allowed once the document is whole). The tokenizer must outlive the vocab. */
int  eng_gvocab_new(eng_gvocab **out, const eng_tokenizer *tok, util_err *err);
void eng_gvocab_free(eng_gvocab *v);   /* NULL is a no-op; every grammar of it must be gone */
int32_t eng_gvocab_n_vocab(const eng_gvocab *v);

/* Compiles schema (JSON text of len bytes), or any JSON object when schema is NULL. The vocab
 * must outlive the grammar. The result has one reference. */
int  eng_grammar_compile(eng_grammar **out, const eng_gvocab *v, const char *schema, size_t len,
                         util_err *err);
/* Tool calls: the answer is one call of one of the tools, written as the model family writes
 * calls (engine/text/tools.h gives the format):
 *     open {"name": "NAME", "ARGS_KEY": ARGUMENTS} close
 * with ARGUMENTS a value of the tool's parameters schema (params: JSON text, NULL: any
 * object; the schema subset above). required: nothing but a call; else (tool_choice auto)
 * free text, unless the answer begins with the format's trigger, which commits it to a call. */
typedef struct eng_tool_spec {
    const char *name;
    const char *params;
    size_t params_len;
} eng_tool_spec;

int  eng_grammar_compile_tools(eng_grammar **out, const eng_gvocab *v,
                               const eng_tool_spec *tools, int n, const eng_tool_format *fmt,
                               bool required, util_err *err);

eng_grammar *eng_grammar_ref(eng_grammar *g);
int32_t eng_grammar_n_vocab(const eng_grammar *g);
void eng_grammar_unref(eng_grammar *g);   /* NULL is a no-op; frees with the last reference */

/* Where a generation stands. Opaque fields; a value type, copied by assignment. */
typedef struct eng_gframe {
    uint64_t cand;        /* literal: the values still possible */
    uint16_t node;
    uint16_t n;           /* characters, items, properties or literal position so far */
    uint8_t kind, phase, ws, esc;
    uint8_t u8need, u8lo, u8hi, key;
    char fmt[12];         /* format strings: their first characters so far */
} eng_gframe;

typedef struct eng_gstate {
    int depth;            /* open frames; 0 with done: the document is whole */
    bool done;
    bool dead;            /* a token that was not allowed was fed: nothing is allowed now */
    eng_gframe f[ENG_GRAMMAR_MAX_DEPTH];
} eng_gstate;

void eng_gstate_init(const eng_grammar *g, eng_gstate *st);
/* Sets bit t of allow[(n_vocab + 31) / 32] for every token allowed next, clears the others.
 * Returns how many are allowed (0 only for a dead state). */
int  eng_grammar_allowed(const eng_grammar *g, const eng_gstate *st, uint32_t *allow);
/* Feeds token t. False (and st marked dead) when t was not allowed. */
bool eng_grammar_advance(const eng_grammar *g, eng_gstate *st, int32_t t);
/* The document is whole: an end-of-generation token may come now (and only that). */
bool eng_gstate_complete(const eng_grammar *g, const eng_gstate *st);
/* Feeds raw bytes (tests, fuzzing: the character-level machine alone). */
bool eng_grammar_feed(const eng_grammar *g, eng_gstate *st, const char *bytes, size_t len);

#endif
