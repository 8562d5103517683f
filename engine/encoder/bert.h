/* engine/encoder/bert.h: a BERT sentence encoder (all-MiniLM-L6-v2 and its kind) loaded from a
 * sentence-transformers model directory: config.json, model.safetensors (F32/F16/BF16), vocab.txt
 * + tokenizer_config.json (WordPiece, lower-casing), sentence_bert_config.json (max_seq_length)
 * and 1_Pooling/config.json (mean pooling). Output: mean pooling over the attention mask, then L2
 * normalisation, as sentence-transformers computes it.
 *
 * A model is immutable after load and may be shared; encoding needs a context of its own
 * (engine/encoder/bert_forward.h), one per thread. Every file is validated before use: a bad one
 * is an error naming the file and the problem. */
#ifndef LLMGW_ENGINE_BERT_H
#define LLMGW_ENGINE_BERT_H

#include "common/err.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct eng_bert eng_bert;

/* How the matrix products compute. AUTO: BF16 inputs with f32 sums where the CPU has
 * AVX512-BF16 (twice the f32 speed; cosine >= 0.99995 to the f32 result on the golden texts),
 * f32 elsewhere. F32: f32 throughout. Either way the result for a text does not depend on the
 * batch it is encoded in. */
/* AUTO: whichever of BF16 and f32 products the device runs faster (one verdict per model);
 * BF16: BF16 products (f32 sums) where the device has them, else f32. */
typedef enum { ENG_BERT_AUTO, ENG_BERT_F32, ENG_BERT_BF16 } eng_bert_precision;

/* device: where its weights live and contexts compute (kernels/backend.h: "cpu", "cuda[:N]",
 * "auto"; NULL = auto). */
int  eng_bert_load(eng_bert **out, const char *model_dir, const char *device,
                   eng_bert_precision precision, util_err *err);
void eng_bert_free(eng_bert *m);  /* NULL is a no-op */
/* "bf16", "tf32" or "f32": what its products take as inputs. */
const char *eng_bert_precision_name(const eng_bert *m);

int eng_bert_dim(const eng_bert *m);         /* 384 for MiniLM-L6 */
int eng_bert_max_tokens(const eng_bert *m);  /* sentence_bert_config max_seq_length (256) */

/* Tokenizes text as [CLS] pieces [SEP], truncated to max_tokens (as sentence-transformers
 * truncates); returns the token count (>= 2) and writes up to cap ids. */
int eng_bert_tokenize(const eng_bert *m, const char *text, size_t len, int32_t *ids, int cap);
/* True when text fits max_tokens without truncation. Stops after max_tokens + 1 tokens, so its
 * cost is bounded whatever the text's length. */
bool eng_bert_fits(const eng_bert *m, const char *text, size_t len);

#endif
