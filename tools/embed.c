/* tools/embed.c: llmgw-embed — sentence embeddings of stdin's lines (one text a line; "\n",
 * "\t" and "\\" escapes are decoded so a line may hold any text).
 *
 *   llmgw-embed [-m MODEL_DIR] [-t THREADS] [-b BATCH] [--f32] [--ids] [--bench SECONDS]
 *               [--tokens FILE] [--device cpu|cuda|cuda:N|shadow]
 *
 * --f32 computes in f32 even where the CPU has AVX512-BF16 (engine/encoder/bert.h, eng_bert_precision).
 * Prints one line per text: its embedding (%.8g, space-separated), or with --ids its token
 * ids. --bench encodes the lines in batches of -b again and again for about SECONDS and prints
 * "sentences/s N tokens/s N batches N" and "kernels: ..." (eng_bert_ctx_kernels) instead.
 * --tokens FILE also writes every text's contextual token vectors (the encoder's last layer
 * before pooling) to FILE, little-endian: per text an int32 token count k, k int32 token ids,
 * then k x dim float32. */
#include "common/arena.h"
#include "common/time.h"
#include "engine/encoder/bert_forward.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(void)
{
    fprintf(stderr, "usage: llmgw-embed [-m MODEL_DIR] [-t THREADS] [-b BATCH] [--ids] [--bf16] "
                    "[--f32] [--bench SECONDS] [--tokens FILE] [--device D] < lines\n");
    exit(2);
}

/* Decodes \n, \t, \r and \\ in place; returns the new length. */
static size_t unescape(char *s, size_t n)
{
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '\\' && i + 1 < n) {
            char c = s[++i];
            s[o++] = c == 'n' ? '\n' : c == 't' ? '\t' : c == 'r' ? '\r' : c;
        } else {
            s[o++] = s[i];
        }
    }
    return o;
}

int main(int argc, char **argv)
{
    const char *dir = "models/all-MiniLM-L6-v2";
    int threads = 0, batch = 32, ids_only = 0;
    eng_bert_precision precision = ENG_BERT_AUTO;
    double bench = 0;
    const char *tokens_path = NULL, *device = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-m") == 0 && i + 1 < argc)
            dir = argv[++i];
        else if (strcmp(argv[i], "-t") == 0 && i + 1 < argc)
            threads = atoi(argv[++i]);
        else if (strcmp(argv[i], "-b") == 0 && i + 1 < argc)
            batch = atoi(argv[++i]);
        else if (strcmp(argv[i], "--bench") == 0 && i + 1 < argc)
            bench = atof(argv[++i]);
        else if (strcmp(argv[i], "--f32") == 0)
            precision = ENG_BERT_F32;
        else if (strcmp(argv[i], "--bf16") == 0)
            precision = ENG_BERT_BF16;
        else if (strcmp(argv[i], "--ids") == 0)
            ids_only = 1;
        else if (strcmp(argv[i], "--tokens") == 0 && i + 1 < argc)
            tokens_path = argv[++i];
        else if (strcmp(argv[i], "--device") == 0 && i + 1 < argc)
            device = argv[++i];
        else
            usage();
    }
    if (batch < 1 || (tokens_path != NULL && bench > 0))
        usage();
    FILE *tokens_out = NULL;
    if (tokens_path != NULL && (tokens_out = fopen(tokens_path, "wb")) == NULL) {
        perror(tokens_path);
        return 1;
    }
    char **texts = NULL;
    size_t *lens = NULL, n = 0, cap = 0;
    char *line = NULL;
    size_t line_cap = 0;
    ssize_t got;
    while ((got = getline(&line, &line_cap, stdin)) >= 0) {
        size_t len = (size_t)got;
        if (len > 0 && line[len - 1] == '\n')
            len--;
        if (n == cap) {
            cap = cap ? 2 * cap : 256;
            texts = realloc(texts, cap * sizeof *texts);
            lens = realloc(lens, cap * sizeof *lens);
            if (texts == NULL || lens == NULL)
                return 1;
        }
        texts[n] = util_xstrndup(line, len);
        lens[n] = unescape(texts[n], len);
        n++;
    }
    free(line);
    eng_bert *m = NULL;
    eng_bert_ctx *c = NULL;
    util_err err = {0};
    if (eng_bert_load(&m, dir, device, precision, &err) != 0 ||
        eng_bert_ctx_new(&c, m, threads, &err) != 0) {
        fprintf(stderr, "llmgw-embed: %s\n", err.msg);
        return 1;
    }
    const int dim = eng_bert_dim(m), max_tok = eng_bert_max_tokens(m);
    if (ids_only) {
        int32_t *ids = util_xmalloc((size_t)max_tok * sizeof *ids);
        for (size_t i = 0; i < n; i++) {
            int k = eng_bert_tokenize(m, texts[i], lens[i], ids, max_tok);
            for (int j = 0; j < k; j++)
                printf(j ? " %d" : "%d", ids[j]);
            printf("\n");
        }
        free(ids);
    } else {
        float *out = util_xmalloc((size_t)batch * dim * sizeof *out);
        int *ntok = util_xmalloc((size_t)batch * sizeof *ntok);
        uint64_t t0 = util_now_ns(), sentences = 0, tokens = 0, batches = 0;
        do {
            for (size_t i = 0; i < n; i += (size_t)batch) {
                int b = (int)(n - i < (size_t)batch ? n - i : (size_t)batch);
                if (eng_bert_encode(c, (const char *const *)texts + i, lens + i, b, out, ntok,
                                    &err) != 0) {
                    fprintf(stderr, "llmgw-embed: %s\n", err.msg);
                    return 1;
                }
                sentences += (uint64_t)b;
                batches++;
                for (int k = 0; k < b; k++)
                    tokens += (uint64_t)ntok[k];
                for (int k = 0; k < b && tokens_out != NULL; k++) {
                    int nt = 0;
                    const int32_t *tid = eng_bert_token_ids(c, k, &nt);
                    const float *tv = eng_bert_token_vectors(c, k, &nt);
                    int32_t n32 = nt;
                    fwrite(&n32, sizeof n32, 1, tokens_out);
                    fwrite(tid, sizeof *tid, (size_t)nt, tokens_out);
                    fwrite(tv, sizeof *tv, (size_t)nt * (size_t)dim, tokens_out);
                }
                for (int k = 0; k < b && bench <= 0; k++) {
                    for (int d = 0; d < dim; d++)
                        printf(d ? " %.8g" : "%.8g", out[(size_t)k * dim + d]);
                    printf("\n");
                }
            }
        } while (bench > 0 && (double)(util_now_ns() - t0) * 1e-9 < bench);
        double s = (double)(util_now_ns() - t0) * 1e-9;
        if (bench > 0)
            printf("sentences/s %.1f tokens/s %.0f batches %llu\nkernels: %s\n",
                   (double)sentences / s, (double)tokens / s, (unsigned long long)batches,
                   eng_bert_ctx_kernels(c));
        free(out);
        free(ntok);
    }
    if (tokens_out != NULL && fclose(tokens_out) != 0) {
        perror(tokens_path);
        return 1;
    }
    for (size_t i = 0; i < n; i++)
        free(texts[i]);
    free(texts);
    free(lens);
    eng_bert_ctx_free(c);
    eng_bert_free(m);
    return 0;
}
