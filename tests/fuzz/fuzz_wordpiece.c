/* tests/fuzz/fuzz_wordpiece.c: the BERT WordPiece tokenizer on arbitrary bytes, with the
 * all-MiniLM-L6-v2 vocabulary ($LLMGW_MODELS, default <repo>/models) or, without it, a small
 * built-in one. Every result is [CLS] ids-in-range [SEP]; truncating to fewer tokens gives a
 * prefix of the full pieces; a smaller output buffer gets a prefix of the same ids; the same
 * bytes always give the same ids. */
#include "engine/text/wordpiece.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(c) ((c) ? (void)0 : abort())
#define MAX 600

static eng_wordpiece *g_wp;
static int32_t g_cls, g_sep;

static const char SMALL[] = "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nun\n##aff\n##able\na\n##a\n"
                            "hello\nworld\n,\n.\n!\n中\n##s\n";

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    char path[4096];
    const char *dir = getenv("LLMGW_MODELS");
    snprintf(path, sizeof path, "%s/all-MiniLM-L6-v2/vocab.txt",
             dir ? dir : LLMGW_SOURCE_DIR "/models");
    util_err err = {0};
    if (eng_wordpiece_load(&g_wp, path, &err) != 0) {
        fprintf(stderr, "fuzz_wordpiece: %s; using a small built-in vocabulary\n", err.msg);
        if (eng_wordpiece_new(&g_wp, SMALL, sizeof SMALL - 1, "small", &err) != 0)
            abort();
    }
    g_cls = eng_wordpiece_id(g_wp, "[CLS]", 5);
    g_sep = eng_wordpiece_id(g_wp, "[SEP]", 5);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int32_t full[MAX], cut[MAX], small[MAX];
    const char *s = (const char *)data;
    const int n_vocab = eng_wordpiece_n_vocab(g_wp);
    int n = eng_wordpiece_encode(g_wp, s, size, MAX, full, MAX);
    CHECK(n >= 2 && n <= MAX);
    CHECK(full[0] == g_cls && full[n - 1] == g_sep);
    for (int i = 0; i < n; i++)
        CHECK(full[i] >= 0 && full[i] < n_vocab);
    /* Truncation keeps the first pieces. */
    int max = 2 + (int)(size % 7);
    int m = eng_wordpiece_encode(g_wp, s, size, max, cut, MAX);
    CHECK(m == (n < max ? n : max));
    CHECK(memcmp(cut, full, (size_t)(m - 1) * sizeof *cut) == 0 && cut[m - 1] == g_sep);
    /* A short buffer gets the same count and a prefix of the same ids. */
    int cap = (int)(size % 5);
    memset(small, 0xff, sizeof small);
    CHECK(eng_wordpiece_encode(g_wp, s, size, MAX, small, cap) == n);
    for (int i = 0; i < cap && i < n; i++)
        CHECK(small[i] == full[i]);
    CHECK(small[cap] == -1);
    return 0;
}
