/* engine/encoder/bert_forward.h: encoding with a loaded BERT model (engine/encoder/bert.h): a
 * context holds one thread's scratch and its own backend on the model's device, and encodes a
 * batch of texts in one forward pass. */
#ifndef LLMGW_ENGINE_ENCODER_BERT_FORWARD_H
#define LLMGW_ENGINE_ENCODER_BERT_FORWARD_H

#include "common/err.h"
#include "engine/encoder/bert.h"

#include <stddef.h>
#include <stdint.h>

typedef struct eng_bert_ctx eng_bert_ctx;

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
