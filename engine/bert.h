/* engine/bert.h: a BERT sentence encoder (all-MiniLM-L6-v2 and its kind) loaded from a
 * sentence-transformers model directory: config.json, model.safetensors (F32/F16/BF16),
 * vocab.txt + tokenizer_config.json (WordPiece, lower-casing), sentence_bert_config.json
 * (max_seq_length) and 1_Pooling/config.json (mean pooling). Output: mean pooling over the
 * attention mask, then L2 normalisation, as sentence-transformers computes it.
 *
 * A model is immutable after load and may be shared; eng_bert_encode needs its own scratch
 * (eng_bert_ctx), one per thread. Every file is validated before use: a bad one is an error
 * naming the file and the problem. */
#ifndef LLMGW_ENGINE_BERT_H
#define LLMGW_ENGINE_BERT_H

#include "common/err.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct eng_bert eng_bert;
typedef struct eng_bert_ctx eng_bert_ctx;

/* How the matrix products compute. AUTO: BF16 inputs with f32 sums where the CPU has
 * AVX512-BF16 (twice the f32 speed; cosine >= 0.99995 to the f32 result on the golden texts),
 * f32 elsewhere. F32: f32 throughout. Either way the result for a text does not depend on the
 * batch it is encoded in. */
typedef enum { ENG_BERT_AUTO, ENG_BERT_F32 } eng_bert_precision;

/* device: where its weights live and contexts compute (kernels/backend.h: "cpu", "cuda[:N]",
 * "auto"; NULL = auto). */
int  eng_bert_load(eng_bert **out, const char *model_dir, const char *device,
                   eng_bert_precision precision, util_err *err);
void eng_bert_free(eng_bert *m);  /* NULL is a no-op */
const char *eng_bert_precision_name(const eng_bert *m);  /* "bf16" or "f32": what it computes in */

int eng_bert_dim(const eng_bert *m);         /* 384 for MiniLM-L6 */
int eng_bert_max_tokens(const eng_bert *m);  /* sentence_bert_config max_seq_length (256) */

/* Tokenizes text as [CLS] pieces [SEP], truncated to max_tokens (as sentence-transformers
 * truncates); returns the token count (>= 2) and writes up to cap ids. */
int eng_bert_tokenize(const eng_bert *m, const char *text, size_t len, int32_t *ids, int cap);
/* True when text fits max_tokens without truncation. Stops after max_tokens + 1 tokens, so its
 * cost is bounded whatever the text's length. */
bool eng_bert_fits(const eng_bert *m, const char *text, size_t len);

/* threads: CPU threads of the ctx's backend (0 = all CPUs): each ctx has its own. */
int  eng_bert_ctx_new(eng_bert_ctx **out, const eng_bert *m, int threads, util_err *err);
void eng_bert_ctx_free(eng_bert_ctx *c);
/* The kernels the ctx's matrix products run, in words (e.g. "f32 avx2 packed up to 64 tokens,
 * sgemm above"): chosen by its backend when the ctx starts (kern_backend.dense_kernels: on the
 * CPU from cpuid and a short race between the packed kernel and OpenBLAS sgemm on the model's
 * own weights). */
const char *eng_bert_ctx_kernels(const eng_bert_ctx *c);
/* How long the ctx's helper threads keep polling after a forward before they sleep
 * (kern_backend.set_spin; default 0). */
void eng_bert_ctx_set_linger(eng_bert_ctx *c, uint64_t ns);

/* Encodes n texts together (one batched forward) into out[n * dim]; n_tokens[i] (may be NULL)
 * receives each text's token count. Returns 0 or an LLMGW_E* code. */
int eng_bert_encode(eng_bert_ctx *c, const char *const *texts, const size_t *lens, int n,
                    float *out, int *n_tokens, util_err *err);

/* After eng_bert_encode on c: text i's contextual token vectors, the last layer's output before
 * pooling ([CLS] and [SEP] included: *n_tokens rows of dim floats), and its token ids. The
 * pooled vector is their mean, L2-normalised. Valid until the next encode on c; i must be one
 * of that batch's texts. For the cache's verifier, which compares questions token by token. */
const float *eng_bert_token_vectors(const eng_bert_ctx *c, int i, int *n_tokens);
const int32_t *eng_bert_token_ids(const eng_bert_ctx *c, int i, int *n_tokens);

#endif
