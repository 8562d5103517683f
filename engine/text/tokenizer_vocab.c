/* engine/text/tokenizer_vocab.c: building an eng_tokenizer from GGUF metadata the way llama.cpp's
 * llama_vocab::load does for "gpt2" models: token texts and attributes, the interned symbols and
 * merge table BPE runs on, special ids (from keys, else recognised by text, with the attribute
 * fixes that come with that), the end-of-generation set, the special-token list and the
 * rendered pieces; plus the small accessors. */
#include "engine/text/tokenizer_internal.h"

#include "engine/text/unicode.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

/* ---- string table ---- */

static uint32_t str_hash(const void *s, size_t len) { return (uint32_t)XXH3_64bits(s, len); }

int64_t eng__strtab_find(const eng__strtab *t, const void *s, size_t len)
{
    if (t->slot == NULL)
        return -1;
    uint32_t h = str_hash(s, len);
    for (uint32_t i = h & t->mask;; i = (i + 1) & t->mask) {
        uint32_t v = t->slot[i];
        if (v == 0)
            return -1;
        uint32_t id = v - 1;
        if (t->hash[id] == h && t->len[id] == len && memcmp(t->blob + t->off[id], s, len) == 0)
            return id;
    }
}

static void strtab_deinit(eng__strtab *t)
{
    free(t->blob);
    free(t->off);
    free(t->len);
    free(t->hash);
    free(t->slot);
    memset(t, 0, sizeof *t);
}

static int strtab_rehash(eng__strtab *t, uint32_t n_slots)
{
    uint32_t *slot = calloc(n_slots, sizeof *slot);
    if (slot == NULL)
        return LLMGW_ENOMEM;
    free(t->slot);
    t->slot = slot;
    t->mask = n_slots - 1;
    for (uint32_t id = 0; id < t->n; id++) {
        uint32_t i = t->hash[id] & t->mask;
        while (slot[i] != 0)
            i = (i + 1) & t->mask;
        slot[i] = id + 1;
    }
    return 0;
}

/* Adds s unless present; *id is its id either way. */
static int strtab_add(eng__strtab *t, const void *s, size_t len, uint32_t *id)
{
    int64_t found = eng__strtab_find(t, s, len);
    if (found >= 0) {
        *id = (uint32_t)found;
        return 0;
    }
    if (len >= UINT32_MAX || t->n >= UINT32_MAX / 4)
        return LLMGW_ENOMEM;
    if (t->n == t->cap) {
        uint32_t cap = t->cap < 1024 ? 1024 : t->cap * 2;
        uint32_t *off = realloc(t->off, cap * sizeof *off);
        if (off != NULL)
            t->off = off;
        uint32_t *ln = realloc(t->len, cap * sizeof *ln);
        if (ln != NULL)
            t->len = ln;
        uint32_t *hash = realloc(t->hash, cap * sizeof *hash);
        if (hash != NULL)
            t->hash = hash;
        if (off == NULL || ln == NULL || hash == NULL)
            return LLMGW_ENOMEM;
        t->cap = cap;
    }
    if (t->blob_len + len > t->blob_cap) {
        size_t cap = (t->blob_cap + len) * 2;
        char *blob = cap < UINT32_MAX ? realloc(t->blob, cap) : NULL;
        if (blob == NULL)
            return LLMGW_ENOMEM;
        t->blob = blob;
        t->blob_cap = cap;
    }
    if (((uint64_t)t->n + 1) * 2 > (uint64_t)t->mask + 1 || t->slot == NULL) {
        int rc = strtab_rehash(t, t->slot == NULL ? 2048 : (t->mask + 1) * 2);
        if (rc != 0)
            return rc;
    }
    uint32_t h = str_hash(s, len), i = h & t->mask;
    memcpy(t->blob + t->blob_len, s, len);
    t->off[t->n] = (uint32_t)t->blob_len;
    t->len[t->n] = (uint32_t)len;
    t->hash[t->n] = h;
    t->blob_len += len;
    while (t->slot[i] != 0)
        i = (i + 1) & t->mask;
    t->slot[i] = ++t->n;
    *id = t->n - 1;
    return 0;
}

/* ---- reading the file ---- */

/* A GGUF string as llama.cpp reads it: through a C string, so cut at the first NUL. */
static size_t c_len(eng_gguf_str s)
{
    const char *nul = memchr(s.ptr, '\0', s.len);
    return nul ? (size_t)(nul - s.ptr) : s.len;
}

/* Decodes a stored (GPT-2 byte-mapped) string into raw bytes in out (capacity >= len). Returns
 * the length, or -1 if some character is not a byte stand-in or not in canonical UTF-8. */
static int64_t decode_bytes(const char *s, size_t len, unsigned char *out)
{
    size_t n = 0;
    for (size_t i = 0; i < len;) {
        size_t m;
        unsigned char canon[4];
        uint32_t cpt = eng_utf8_next((const unsigned char *)s + i, len - i, &m);
        int b = eng_bytelevel_byte(cpt);
        if (b < 0 || eng_utf8_put(cpt, canon) != m || memcmp(canon, s + i, m) != 0)
            return -1;
        out[n++] = (unsigned char)b;
        i += m;
    }
    return (int64_t)n;
}

static int load_tokens(eng_tokenizer *t, const eng_gguf *g, const char *path, util_err *err)
{
    const eng_gguf_kv *toks, *types = eng_gguf_find(g, "tokenizer.ggml.token_type");
    int rc = eng_gguf_get_arr(g, "tokenizer.ggml.tokens", ENG_GGUF_STRING, &toks, err);
    if (rc != 0)
        return rc;
    if (toks->arr_len == 0 || toks->arr_len >= INT32_MAX)
        return util_err_set(err, LLMGW_EINVAL, "%s: tokenizer.ggml.tokens has %llu entries",
                            path, (unsigned long long)toks->arr_len);
    if (types != NULL && (types->type != ENG_GGUF_ARRAY || types->arr_type != ENG_GGUF_INT32 ||
                          types->arr_len < toks->arr_len))
        return util_err_set(err, LLMGW_EINVAL,
                            "%s: tokenizer.ggml.token_type is not an int32 array of %llu entries",
                            path, (unsigned long long)toks->arr_len);
    int32_t n = (int32_t)toks->arr_len;
    size_t total = 0;
    for (int32_t i = 0; i < n; i++) {
        size_t l = c_len(toks->arr_str[i]);
        total += l ? l : 24;  /* "[EMPTY_<id>]" */
    }
    if (total >= UINT32_MAX)
        return util_err_set(err, LLMGW_EINVAL, "%s: the token texts are too long", path);
    t->n_vocab = n;
    t->text = malloc(total + 1);
    t->text_off = malloc(((size_t)n + 1) * sizeof *t->text_off);
    t->attr = malloc((size_t)n);
    if (t->text == NULL || t->text_off == NULL || t->attr == NULL)
        return util_err_set(err, LLMGW_ENOMEM, "%s: out of memory for the vocabulary", path);
    size_t at = 0;
    for (int32_t i = 0; i < n; i++) {
        size_t l = c_len(toks->arr_str[i]);
        t->text_off[i] = (uint32_t)at;
        if (l == 0) {  /* llama.cpp names empty tokens so they stay distinct */
            at += (size_t)snprintf(t->text + at, 25, "[EMPTY_%d]", (int)i);
        } else {
            memcpy(t->text + at, toks->arr_str[i].ptr, l);
            at += l;
        }
        int32_t ty = 1;
        if (types != NULL)
            memcpy(&ty, (const char *)types->arr_data + 4 * (size_t)i, 4);
        static const uint8_t by_type[7] = {0, ENG__ATTR_NORMAL, ENG__ATTR_UNKNOWN,
                                           ENG__ATTR_CONTROL, ENG__ATTR_USER_DEFINED,
                                           ENG__ATTR_UNUSED, ENG__ATTR_BYTE};
        t->attr[i] = ty >= 0 && ty < 7 ? by_type[ty] : 0;
    }
    t->text_off[n] = (uint32_t)at;

    /* Stored text -> token; with duplicate texts the last token wins, as in llama.cpp's map. */
    uint32_t *sid = malloc((size_t)n * sizeof *sid);
    if (sid == NULL)
        return util_err_set(err, LLMGW_ENOMEM, "%s: out of memory for the vocabulary", path);
    for (int32_t i = 0; i < n && rc == 0; i++)
        rc = strtab_add(&t->texts, t->text + t->text_off[i], t->text_off[i + 1] - t->text_off[i],
                        &sid[i]);
    if (rc == 0 && (t->text_tok = malloc(t->texts.n * sizeof *t->text_tok)) == NULL)
        rc = LLMGW_ENOMEM;
    for (int32_t i = 0; i < n && rc == 0; i++)
        t->text_tok[sid[i]] = i;
    free(sid);
    if (rc != 0)
        return util_err_set(err, rc, "%s: out of memory for the vocabulary", path);
    return 0;
}

static int add_merge(eng_tokenizer *t, const char *s, size_t len, int32_t rank, unsigned char *buf)
{
    /* "left right", split at the first space after the first byte (llama.cpp: find(' ', 1)). */
    const char *sp = len > 1 ? memchr(s + 1, ' ', len - 1) : NULL;
    if (sp == NULL)
        return 0;
    size_t ll = (size_t)(sp - s), rl = len - ll - 1;
    int64_t lb = decode_bytes(s, ll, buf), rb = decode_bytes(sp + 1, rl, buf + ll);
    if (lb <= 0 || rb <= 0)
        return 0;  /* BPE can never build a half with other characters: the rule never applies */
    uint32_t l, r, m;
    int rc;
    if ((rc = strtab_add(&t->syms, buf, (size_t)lb, &l)) != 0 ||
        (rc = strtab_add(&t->syms, buf + ll, (size_t)rb, &r)) != 0)
        return rc;
    memmove(buf + lb, buf + ll, (size_t)rb);
    if ((rc = strtab_add(&t->syms, buf, (size_t)(lb + rb), &m)) != 0)
        return rc;
    uint64_t key = (uint64_t)l << 32 | r;
    for (uint64_t i = eng__merge_slot(key, t->merge_mask);; i = (i + 1) & t->merge_mask) {
        eng__merge *e = &t->merges[i];
        if (e->key == key)
            return 0;  /* a repeated rule keeps its first rank */
        if (e->key == UINT64_MAX) {
            *e = (eng__merge){key, rank, m};
            return 0;
        }
    }
}

static int load_bpe(eng_tokenizer *t, const eng_gguf *g, const char *path, util_err *err)
{
    const eng_gguf_kv *merges;
    int rc = eng_gguf_get_arr(g, "tokenizer.ggml.merges", ENG_GGUF_STRING, &merges, err);
    if (rc != 0)
        return rc;
    if (merges->arr_len >= INT32_MAX / 4)
        return util_err_set(err, LLMGW_EINVAL, "%s: tokenizer.ggml.merges has %llu entries",
                            path, (unsigned long long)merges->arr_len);
    size_t max_len = 0;
    for (int32_t i = 0; i < t->n_vocab; i++)
        if (t->text_off[i + 1] - t->text_off[i] > max_len)
            max_len = t->text_off[i + 1] - t->text_off[i];
    for (uint64_t i = 0; i < merges->arr_len; i++)
        if (merges->arr_str[i].len > max_len)
            max_len = merges->arr_str[i].len;
    unsigned char *buf = malloc(max_len + 1);
    uint32_t *tok_sym = malloc((size_t)t->n_vocab * sizeof *tok_sym);
    uint64_t slots = 16;
    while (slots < 2 * merges->arr_len + 16)
        slots *= 2;
    t->merges = malloc(slots * sizeof *t->merges);
    t->merge_mask = slots - 1;
    if (buf == NULL || tok_sym == NULL || t->merges == NULL) {
        rc = LLMGW_ENOMEM;
        goto out;
    }
    for (uint64_t i = 0; i < slots; i++)
        t->merges[i].key = UINT64_MAX;
    for (int b = 0; b < 256 && rc == 0; b++) {
        unsigned char c = (unsigned char)b;
        rc = strtab_add(&t->syms, &c, 1, &t->byte_sym[b]);
    }
    for (int32_t i = 0; i < t->n_vocab && rc == 0; i++) {
        size_t len = t->text_off[i + 1] - t->text_off[i];
        int64_t n = decode_bytes(t->text + t->text_off[i], len, buf);
        tok_sym[i] = UINT32_MAX;
        if (n > 0)
            rc = strtab_add(&t->syms, buf, (size_t)n, &tok_sym[i]);
    }
    for (uint64_t i = 0; i < merges->arr_len && rc == 0; i++)
        rc = add_merge(t, merges->arr_str[i].ptr, c_len(merges->arr_str[i]), (int32_t)i, buf);
    if (rc == 0 && (t->sym_tok = malloc(t->syms.n * sizeof *t->sym_tok)) == NULL)
        rc = LLMGW_ENOMEM;
    if (rc != 0)
        goto out;
    for (uint32_t s = 0; s < t->syms.n; s++)
        t->sym_tok[s] = -1;
    for (int b = 0; b < 256; b++)
        t->single_tok[b] = -1;
    for (int32_t i = 0; i < t->n_vocab; i++) {
        if (tok_sym[i] != UINT32_MAX)
            t->sym_tok[tok_sym[i]] = i;
        if (t->text_off[i + 1] - t->text_off[i] == 1)
            t->single_tok[(unsigned char)t->text[t->text_off[i]]] = i;
    }
out:
    free(buf);
    free(tok_sym);
    if (rc != 0)
        return util_err_set(err, rc, "%s: out of memory for the BPE merges", path);
    return 0;
}

/* ---- special tokens ---- */

/* Fullwidth bars and the SentencePiece space, as in DeepSeek's and CodeLlama's special texts. */
#define BAR "\xef\xbd\x9c"
#define SP "\xe2\x96\x81"

static int32_t by_text(const eng_tokenizer *t, const char *s)
{
    int64_t id = eng__strtab_find(&t->texts, s, strlen(s));
    return id < 0 ? -1 : t->text_tok[id];
}

/* The first of the NULL-terminated `texts` the vocabulary has, or -1. llama.cpp takes whichever
 * its hash map yields first when a vocabulary has several; we take the list's order. */
static int32_t first_of(const eng_tokenizer *t, const char *const *texts)
{
    for (; *texts != NULL; texts++) {
        int32_t id = by_text(t, *texts);
        if (id >= 0)
            return id;
    }
    return -1;
}

static const char *const eot_texts[] = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>",
    "<|endoftext|>", "<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]",
    "<" BAR "end" SP "of" SP "sentence" BAR ">", "<end_of_utterance>", NULL};
static const char *const eom_texts[] = {"<|eom_id|>", NULL};
static const char *const fim_texts[6][9] = {
    {"<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<" BAR "fim" SP "begin" BAR ">", "<PRE>",
     SP "<PRE>", "<|code_prefix|>", "<|prefix|>", NULL},
    {"<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<" BAR "fim" SP "hole" BAR ">", "<SUF>",
     SP "<SUF>", "<|code_suffix|>", "<|suffix|>", NULL},
    {"<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<" BAR "fim" SP "end" BAR ">", "<MID>",
     SP "<MID>", "<|code_middle|>", "<|middle|>", NULL},
    {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]", NULL},
    {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>", NULL},
    {"<|file_sep|>", NULL},
};
static const char *const fim_keys[6] = {"tokenizer.ggml.fim_pre_token_id",
    "tokenizer.ggml.fim_suf_token_id", "tokenizer.ggml.fim_mid_token_id",
    "tokenizer.ggml.fim_pad_token_id", "tokenizer.ggml.fim_rep_token_id",
    "tokenizer.ggml.fim_sep_token_id"};
static const char *const eog_texts[] = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>",
    "<|call|>", "<|flush|>", "<|calls|>", "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>",
    "<EOT>", "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>", "<end_of_utterance>", "<eos>",
    "<turn|>", "<|tool_response>", "<" BAR "end" SP "of" SP "sentence" BAR ">", "[e~[", NULL};

/* A key's token id when present and in range (llama.cpp ignores an out-of-range one). */
static void read_id(const eng_gguf *g, const char *key, int32_t n_vocab, int32_t *id)
{
    uint32_t v;
    if (eng_gguf_get_u32(g, key, &v, NULL) == 0 && v < (uint32_t)n_vocab)
        *id = (int32_t)v;
}

static void eog_add(eng_tokenizer *t, int32_t id)
{
    if (id < 0)
        return;
    for (size_t i = 0; i < t->n_eog; i++)
        if (t->eog[i] == id)
            return;
    t->eog[t->n_eog++] = id;
}

static void eog_remove(eng_tokenizer *t, int32_t id)
{
    for (size_t i = 0; i < t->n_eog; i++)
        if (t->eog[i] == id)
            t->eog[i--] = t->eog[--t->n_eog];
}

static bool eog_has_text(const eng_tokenizer *t, const char *s)
{
    int32_t id = by_text(t, s);
    for (size_t i = 0; id >= 0 && i < t->n_eog; i++)
        if (t->eog[i] == id)
            return true;
    return false;
}

static int cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

static int load_specials(eng_tokenizer *t, const eng_gguf *g)
{
    int32_t n = t->n_vocab, eom = -1, fim[6] = {-1, -1, -1, -1, -1, -1};
    /* "gpt2" vocabularies default to id 11 for both, as in llama.cpp. */
    t->bos = t->eos = 11 < n ? 11 : -1;
    t->eot = -1;
    read_id(g, "tokenizer.ggml.bos_token_id", n, &t->bos);
    read_id(g, "tokenizer.ggml.eos_token_id", n, &t->eos);
    read_id(g, "tokenizer.ggml.eot_token_id", n, &t->eot);
    read_id(g, "tokenizer.ggml.eom_token_id", n, &eom);
    for (int i = 0; i < 6; i++)
        read_id(g, fim_keys[i], n, &fim[i]);
    read_id(g, "tokenizer.ggml.prefix_token_id", n, &fim[0]);  /* older names */
    read_id(g, "tokenizer.ggml.suffix_token_id", n, &fim[1]);
    read_id(g, "tokenizer.ggml.middle_token_id", n, &fim[2]);
    t->add_bos = eng_pretok_default_add_bos(t->pre);
    (void)eng_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &t->add_bos, NULL);

    /* Ids the file does not give are recognised by text; such a token becomes a control one. */
    if (t->eot < 0 && (t->eot = first_of(t, eot_texts)) >= 0)
        t->attr[t->eot] |= ENG__ATTR_CONTROL;
    if (eom < 0 && (eom = first_of(t, eom_texts)) >= 0)
        t->attr[eom] |= ENG__ATTR_CONTROL;
    for (int i = 0; i < 6; i++)
        if (fim[i] < 0 && (fim[i] = first_of(t, fim_texts[i])) >= 0)
            t->attr[fim[i]] |= ENG__ATTR_CONTROL;

    /* fim pad/rep/sep, the texts, eos/eot/eom */
    size_t max_eog = 3 + sizeof eog_texts / sizeof eog_texts[0] + 3;
    if ((t->eog = malloc(max_eog * sizeof *t->eog)) == NULL)
        return LLMGW_ENOMEM;
    eog_add(t, fim[3]);
    eog_add(t, fim[4]);
    eog_add(t, fim[5]);
    for (const char *const *s = eog_texts; *s != NULL; s++) {
        int32_t id = by_text(t, *s);
        if (id >= 0) {
            eog_add(t, id);
            t->attr[id] |= ENG__ATTR_CONTROL;
        }
    }
    /* gpt-oss: these are rendered even without render_special. */
    static const char *const shown[] = {"<|channel|>", "<|message|>", "<|start|>",
                                        "<|constrain|>", NULL};
    for (const char *const *s = shown; *s != NULL; s++) {
        int32_t id = by_text(t, *s);
        if (id >= 0)
            t->attr[id] = ENG__ATTR_USER_DEFINED;
    }
    eog_add(t, t->eos);
    eog_add(t, t->eot);
    eog_add(t, eom);
    /* o200k_harmony / solar-open: <|end|> ends a message, not the generation. */
    int32_t end = by_text(t, "<|end|>");
    if (eog_has_text(t, "<|end|>") &&
        ((eog_has_text(t, "<|return|>") && eog_has_text(t, "<|call|>")) ||
         (eog_has_text(t, "<|calls|>") && eog_has_text(t, "<|flush|>")))) {
        eog_remove(t, end);
        t->attr[end] = ENG__ATTR_USER_DEFINED;
    }
    /* gemma4 and plamo have an ordinary </s>. */
    int32_t s_end = by_text(t, "</s>");
    if (eog_has_text(t, "</s>") &&
        (eog_has_text(t, "<|tool_response>") || eog_has_text(t, "<|plamo:eos|>"))) {
        eog_remove(t, s_end);
        t->attr[s_end] = ENG__ATTR_NORMAL;
    }
    qsort(t->eog, t->n_eog, sizeof *t->eog, cmp_i32);
    return 0;
}

typedef struct special_key {
    uint32_t len;
    int32_t id;
} special_key;

static int cmp_special(const void *a, const void *b)
{
    const special_key *x = a, *y = b;
    if (x->len != y->len)
        return x->len > y->len ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

/* The tokens cut out of the input before BPE: control, user-defined and unknown ones, longest
 * text first (llama.cpp sorts by length alone; of equal lengths we keep id order). */
static int list_specials(eng_tokenizer *t)
{
    size_t n = 0;
    for (int32_t i = 0; i < t->n_vocab; i++)
        n += (t->attr[i] & (ENG__ATTR_CONTROL | ENG__ATTR_USER_DEFINED | ENG__ATTR_UNKNOWN)) != 0;
    special_key *keys = malloc((n ? n : 1) * sizeof *keys);
    t->special = malloc((n ? n : 1) * sizeof *t->special);
    if (keys == NULL || t->special == NULL) {
        free(keys);
        return LLMGW_ENOMEM;
    }
    n = 0;
    for (int32_t i = 0; i < t->n_vocab; i++)
        if (t->attr[i] & (ENG__ATTR_CONTROL | ENG__ATTR_USER_DEFINED | ENG__ATTR_UNKNOWN))
            keys[n++] = (special_key){t->text_off[i + 1] - t->text_off[i], i};
    qsort(keys, n, sizeof *keys, cmp_special);
    for (size_t i = 0; i < n; i++)
        t->special[i] = keys[i].id;
    t->n_special = n;
    free(keys);
    return 0;
}

/* ---- pieces ---- */

/* The bytes of token `id` rendered with render_special, as llama.cpp's token_to_piece: special
 * and user-defined tokens as stored; normal ones byte-decoded, where a character outside the
 * byte map becomes "[UNK_BYTE_0x<its hex>" + the whole text + "]"; byte tokens ("<0xXX>") as
 * that byte; anything else as nothing. Writes into out when it is not NULL; returns the length. */
static size_t render(const eng_tokenizer *t, int32_t id, char *out)
{
    const char *s = t->text + t->text_off[id];
    size_t len = t->text_off[id + 1] - t->text_off[id], n = 0;
    uint8_t a = t->attr[id];
    if (a & (ENG__ATTR_UNKNOWN | ENG__ATTR_CONTROL | ENG__ATTR_USER_DEFINED)) {
        if (out)
            memcpy(out, s, len);
        return len;
    }
    if (a & ENG__ATTR_NORMAL) {
        for (size_t i = 0; i < len;) {
            size_t m;
            unsigned char enc[4];
            uint32_t cpt = eng_utf8_next((const unsigned char *)s + i, len - i, &m);
            int b = eng_bytelevel_byte(cpt);
            i += m;
            if (b >= 0) {
                if (out)
                    out[n] = (char)b;
                n++;
                continue;
            }
            size_t el = eng_utf8_put(cpt, enc);
            if (out) {
                n += (size_t)sprintf(out + n, "[UNK_BYTE_0x");
                for (size_t j = 0; j < el; j++)
                    n += (size_t)sprintf(out + n, "%02x", enc[j]);
                memcpy(out + n, s, len);
                out[n + len] = ']';
            } else {
                n += 12 + 2 * el;
            }
            n += len + 1;
        }
        return n;
    }
    if ((a & ENG__ATTR_BYTE) && len >= 3) {  /* "<0xXX>" */
        unsigned v = 0;
        for (size_t i = 3; i < 5 && i < len; i++) {
            char c = s[i];
            int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
                  : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
            if (d < 0)
                break;
            v = v * 16 + (unsigned)d;
        }
        if (out)
            out[0] = (char)v;
        return 1;
    }
    return 0;
}

static int render_pieces(eng_tokenizer *t, const char *path, util_err *err)
{
    size_t total = 0;
    for (int32_t i = 0; i < t->n_vocab; i++)
        total += render(t, i, NULL);
    if (total >= UINT32_MAX / 2)
        return util_err_set(err, LLMGW_EINVAL, "%s: the token pieces are too long", path);
    t->piece = malloc(total + 1);
    t->piece_off = malloc(((size_t)t->n_vocab + 1) * sizeof *t->piece_off);
    if (t->piece == NULL || t->piece_off == NULL)
        return util_err_set(err, LLMGW_ENOMEM, "%s: out of memory for the pieces", path);
    size_t at = 0;
    for (int32_t i = 0; i < t->n_vocab; i++) {
        t->piece_off[i] = (uint32_t)at;
        at += render(t, i, t->piece + at);
    }
    t->piece_off[t->n_vocab] = (uint32_t)at;
    return 0;
}

/* ---- the object ---- */

static int load(eng_tokenizer *t, const eng_gguf *g, util_err *err)
{
    const char *path = eng_gguf_path(g);
    eng_gguf_str model, pre;
    int rc = eng_gguf_get_str(g, "tokenizer.ggml.model", &model, err);
    if (rc != 0)
        return rc;
    if (!eng_gguf_str_eq(model, "gpt2"))
        return util_err_set(err, LLMGW_EINVAL,
                            "%s: tokenizer model \"%.*s\" is not supported (only byte-level BPE, "
                            "\"gpt2\")", path, (int)(model.len > 64 ? 64 : model.len), model.ptr);
    if ((rc = eng_gguf_get_str(g, "tokenizer.ggml.pre", &pre, err)) != 0)
        return rc;
    util_err perr = {0};
    if ((rc = eng_pretok_new(&t->pre, pre.ptr, (size_t)pre.len, &perr)) != 0)
        return util_err_set(err, rc, "%s: %s", path, perr.msg);
    t->ignore_merges = eng_pretok_ignore_merges(t->pre);
    if ((rc = load_tokens(t, g, path, err)) != 0 || (rc = load_bpe(t, g, path, err)) != 0)
        return rc;
    if ((rc = load_specials(t, g)) != 0 || (rc = list_specials(t)) != 0)
        return util_err_set(err, rc, "%s: out of memory for the special tokens", path);
    return render_pieces(t, path, err);
}

int eng_tokenizer_load(eng_tokenizer **out, const eng_gguf *g, util_err *err)
{
    eng_tokenizer *t = calloc(1, sizeof *t);
    if (t == NULL)
        return util_err_set(err, LLMGW_ENOMEM, "out of memory");
    int rc = load(t, g, err);
    if (rc != 0) {
        eng_tokenizer_free(t);
        if (rc == LLMGW_ENOTFOUND) {  /* a key the tokenizer needs: the file is incomplete */
            rc = LLMGW_EINVAL;
            if (err != NULL)
                err->code = rc;
        }
        return rc;
    }
    *out = t;
    return 0;
}

void eng_tokenizer_free(eng_tokenizer *t)
{
    if (t == NULL)
        return;
    free(t->text);
    free(t->text_off);
    free(t->attr);
    free(t->piece);
    free(t->piece_off);
    strtab_deinit(&t->texts);
    free(t->text_tok);
    strtab_deinit(&t->syms);
    free(t->sym_tok);
    free(t->merges);
    free(t->special);
    free(t->eog);
    eng_pretok_free(t->pre);
    free(t);
}

int32_t eng_tokenizer_n_vocab(const eng_tokenizer *t) { return t->n_vocab; }
int32_t eng_tokenizer_bos(const eng_tokenizer *t) { return t->bos; }
int32_t eng_tokenizer_eos(const eng_tokenizer *t) { return t->eos; }
int32_t eng_tokenizer_eot(const eng_tokenizer *t) { return t->eot; }
bool eng_tokenizer_add_bos(const eng_tokenizer *t) { return t->add_bos; }

bool eng_tokenizer_is_eog(const eng_tokenizer *t, int32_t id)
{
    return id >= 0 && bsearch(&id, t->eog, t->n_eog, sizeof *t->eog, cmp_i32) != NULL;
}

int32_t eng_tokenizer_find_special(const eng_tokenizer *t, const char *text)
{
    int32_t id = by_text(t, text);
    if (id < 0 || !(t->attr[id] & (ENG__ATTR_CONTROL | ENG__ATTR_USER_DEFINED | ENG__ATTR_UNKNOWN)))
        return -1;
    return id;
}

int eng_token_piece(const eng_tokenizer *t, int32_t id, bool render_special, char *buf,
                    size_t cap)
{
    if (id < 0 || id >= t->n_vocab)
        return LLMGW_EINVAL;
    if (!render_special && (t->attr[id] & (ENG__ATTR_UNKNOWN | ENG__ATTR_CONTROL)))
        return 0;
    size_t len = t->piece_off[id + 1] - t->piece_off[id];
    if (len <= cap)
        memcpy(buf, t->piece + t->piece_off[id], len);
    return (int)len;
}

bool eng_tokenizer_same_vocab(const eng_tokenizer *a, const eng_tokenizer *b, int32_t *first_diff)
{
    int32_t n = a->n_vocab < b->n_vocab ? a->n_vocab : b->n_vocab;
    for (int32_t i = 0; i < n; i++) {
        uint32_t la = a->text_off[i + 1] - a->text_off[i], lb = b->text_off[i + 1] - b->text_off[i];
        if (la != lb || memcmp(a->text + a->text_off[i], b->text + b->text_off[i], la) != 0 ||
            a->attr[i] != b->attr[i]) {
            *first_diff = i;
            return false;
        }
    }
    *first_diff = n;
    return a->n_vocab == b->n_vocab;
}
