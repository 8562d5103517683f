/* tests/unit/router/test_classifier.c: the complexity classifier (router_classifier_*): lexical
 * features, the weights file (round trip and every load error) and scoring. */
#include "router/classifier.h"

#include "common/err.h"

#include "tests/unit/unit.h"

#include <stdlib.h>
#include <unistd.h>

#define LEX ROUTER_LEX_FEATURES

static void features_of(const char *s, float out[LEX])
{
    router_lexical_features(s, strlen(s), out);
}

static void lexical_empty(void **state)
{
    (void)state;
    float f[LEX];
    features_of("", f);
    for (int i = 0; i < LEX; i++)
        assert_double_near(f[i], 0.0, 0.0);
    router_lexical_features(NULL, 5, f);  /* NULL text is empty whatever len says */
    for (int i = 0; i < LEX; i++)
        assert_double_near(f[i], 0.0, 0.0);
}

static void lexical_question(void **state)
{
    (void)state;
    float f[LEX];
    /* 12 bytes, 3 words, one '?', 2 digits of 10 visible bytes, one '+', no code, one line,
     * 1 upper-case of 6 letters. */
    features_of("What is 2+2?", f);
    assert_double_near(f[0], log1p(12), 1e-6);
    assert_double_near(f[1], log1p(3), 1e-6);
    assert_double_near(f[2], log1p(1), 1e-6);
    assert_double_near(f[3], 0.2, 1e-6);
    assert_double_near(f[4], log1p(1), 1e-6);
    assert_double_near(f[5], 0.0, 0.0);
    assert_double_near(f[6], log1p(1), 1e-6);
    assert_double_near(f[7], 1.0 / 6.0, 1e-6);
}

static void lexical_code(void **state)
{
    (void)state;
    float f[LEX];
    /* Code markers: ``` twice, "def ", "return", '{', ';', '}' = 7. Lines: 4 (the last newline
     * ends the text, it opens no line). Math: none. */
    const char *s = "```\ndef f(x):\n    return {x; x}\n```\n";
    features_of(s, f);
    assert_double_near(f[5], log1p(7), 1e-6);
    assert_double_near(f[6], log1p(4), 1e-6);
    assert_double_near(f[4], 0.0, 0.0);
    assert_double_near(f[2], 0.0, 0.0);
    assert_double_near(f[1], log1p(7), 1e-6);  /* ``` def f(x): return {x; x} ``` */
}

static void lexical_math(void **state)
{
    (void)state;
    float f[LEX];
    /* Math: \frac, '=', '^', '+', sqrt, ∫ = 6 (the braces count as code: 4). */
    features_of("\\frac{1}{2} = x^2 + sqrt \xe2\x88\xab", f);
    assert_double_near(f[4], log1p(6), 1e-6);
    assert_double_near(f[5], log1p(4), 1e-6);
    assert_double_near(f[1], log1p(6), 1e-6);
    /* digits 1, 2, 2 of 23 visible bytes (∫ is 3 bytes). */
    assert_double_near(f[3], 3.0 / 23.0, 1e-6);
    features_of("ABC def", f);
    assert_double_near(f[7], 0.5, 1e-6);
}

/* ---- weights files ------------------------------------------------------------------------ */

enum { DIM = 2, N = DIM + LEX };

static void params(double mean[N], double std[N], double w[N])
{
    for (int i = 0; i < N; i++) {
        mean[i] = 0.25 * i - 1;
        std[i] = 0.5 + 0.125 * i;
        w[i] = (i % 2 ? -0.75 : 0.5) / (i + 1);
    }
}

static char *temp_path(const char *tag)
{
    static char buf[4][256];
    static int k;
    char *p = buf[k++ % 4];
    const char *dir = getenv("TMPDIR");
    snprintf(p, 256, "%s/llmgw_test_classifier_%d_%s", dir ? dir : "/tmp", (int)getpid(), tag);
    return p;
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    return strdup(buf);
}

static void round_trip(void **state)
{
    (void)state;
    double mean[N], std[N], w[N];
    params(mean, std, w);
    router_classifier *a = NULL, *b = NULL;
    util_err err = {0};
    assert_int_equal(router_classifier_new_lr(&a, DIM, mean, std, w, 0.125, &err), 0);
    assert_int_equal(router_classifier_dim(a), DIM);
    const char *p1 = temp_path("a"), *p2 = temp_path("b");
    assert_int_equal(router_classifier_save(a, p1, "a test\nsecond line", &err), 0);
    assert_int_equal(router_classifier_load(&b, p1, &err), 0);
    assert_int_equal(router_classifier_dim(b), DIM);
    const float emb[DIM] = {0.6f, -0.8f};
    const char *text = "Why is the sky blue? Explain 3 reasons.";
    assert_double_near(router_classifier_score(a, emb, text, strlen(text)),
                       router_classifier_score(b, emb, text, strlen(text)), 1e-8);
    /* Saving what was loaded writes the same bytes. */
    assert_int_equal(router_classifier_save(b, p2, "a test\nsecond line", &err), 0);
    char *s1 = slurp(p1), *s2 = slurp(p2);
    assert_string_equal(s1, s2);
    assert_prefix(s1, "llmgw-router version=1 kind=lr dim=2 lex=8\n# a test\n# second line\nmean ");
    free(s1);
    free(s2);
    remove(p1);
    remove(p2);
    router_classifier_free(a);
    router_classifier_free(b);
    router_classifier_free(NULL);
}

/* A valid file's text, with the given header and records. */
static void valid_text(char *buf, size_t cap, const char *header)
{
    double mean[N], std[N], w[N];
    params(mean, std, w);
    size_t n = (size_t)snprintf(buf, cap, "%s\n", header);
    const char *keys[] = {"mean", "std", "weight"};
    const double *vals[] = {mean, std, w};
    for (int r = 0; r < 3; r++) {
        n += (size_t)snprintf(buf + n, cap - n, "%s", keys[r]);
        for (int i = 0; i < N; i++)
            n += (size_t)snprintf(buf + n, cap - n, " %.9g", vals[r][i]);
        n += (size_t)snprintf(buf + n, cap - n, "\n");
    }
    snprintf(buf + n, cap - n, "bias 0.125\n");
}

static void expect_error(const char *text, const char *message)
{
    router_classifier *c = NULL;
    util_err err = {0};
    int rc = router_classifier_parse(&c, text, strlen(text), "w.txt", &err);
    if (rc == 0)
        print_error("parsed, expected \"%s\"\n", message);
    assert_int_equal(rc, LLMGW_EINVAL);
    assert_null(c);
    assert_contains(err.msg, message);
}

/* The valid text with the first occurrence of `from` replaced by `to`. */
static void expect_edit_error(const char *from, const char *to, const char *message)
{
    char buf[4096], out[4096];
    valid_text(buf, sizeof buf, "llmgw-router version=1 kind=lr dim=2 lex=8");
    char *at = strstr(buf, from);
    assert_non_null(at);
    snprintf(out, sizeof out, "%.*s%s%s", (int)(at - buf), buf, to, at + strlen(from));
    expect_error(out, message);
}

static void parse_valid(void **state)
{
    (void)state;
    char buf[4096];
    valid_text(buf, sizeof buf,
               "# leading comment\n\n  llmgw-router version=1 kind=lr dim=2 lex=8");
    router_classifier *c = NULL;
    util_err err = {0};
    assert_int_equal(router_classifier_parse(&c, buf, strlen(buf), "w.txt", &err), 0);
    assert_int_equal(router_classifier_dim(c), 2);
    router_classifier_free(c);
    /* Without the final newline: still valid. */
    buf[strlen(buf) - 1] = '\0';
    assert_int_equal(router_classifier_parse(&c, buf, strlen(buf), "w.txt", &err), 0);
    router_classifier_free(c);
    /* CRLF line ends: valid. */
    char crlf[8192];
    size_t n = 0;
    for (const char *p = buf; *p; p++) {
        if (*p == '\n')
            crlf[n++] = '\r';
        crlf[n++] = *p;
    }
    crlf[n] = '\0';
    assert_int_equal(router_classifier_parse(&c, crlf, n, "w.txt", &err), 0);
    router_classifier_free(c);
}

static void load_errors(void **state)
{
    (void)state;
    expect_error("", "w.txt: empty");
    expect_error("# only a comment\n", "w.txt: empty");
    expect_edit_error("llmgw-router", "llmgw-routers", "w.txt:1: not a router weights file");
    expect_edit_error("llmgw-router", "GGUF", "not a router weights file");
    expect_edit_error("version=1", "version=2", "w.txt:1: version 2");
    expect_edit_error("version=1", "version=x", "want version=");
    expect_edit_error("kind=lr", "kind=mlp", "kind \"mlp\" is unknown");
    expect_edit_error("dim=2", "dim=0", "want dim=");
    expect_edit_error("dim=2", "dim=99999999", "want dim=");
    expect_edit_error("lex=8", "lex=7", "lex=7 lexical features");
    expect_edit_error("lex=8", "lex=8 extra", "unexpected \"extra\" in the header");
    /* A header whose dim disagrees with the records: the counts are wrong. */
    expect_edit_error("dim=2", "dim=3", "w.txt:2: mean: 10 numbers, want 11");
    expect_edit_error("dim=2", "dim=1", "w.txt:2: mean: more than 9 numbers");
    expect_edit_error("\nstd 0.5", "\nstd", "w.txt:3: std: 9 numbers, want 10");
    expect_edit_error("bias 0.125", "bias 0.125 1", "w.txt:5: bias: more than 1 numbers");
    expect_edit_error("bias 0.125", "bias", "w.txt:5: bias: 0 numbers, want 1");
    expect_edit_error("\nstd 0.5 ", "\nstd nan ", "w.txt:3: std: value 1 \"nan\" is not a finite");
    expect_edit_error("\nweight 0.5 ", "\nweight inf ", "weight: value 1 \"inf\"");
    expect_edit_error("\nweight 0.5 ", "\nweight 1e999 ", "\"1e999\" is not a finite");
    expect_edit_error("\nweight 0.5 ", "\nweight 0.5x ", "\"0.5x\" is not a finite");
    expect_edit_error("\nstd 0.5 ", "\nstd 0 ", "std value 1 is 0, want > 0");
    expect_edit_error("\nstd 0.5 ", "\nstd -1 ", "std value 1 is -1, want > 0");
    expect_edit_error("\nstd 0.5 ", "\nstd 1e-305 ", "weight / std overflows");
    /* Records out of order, missing (truncated), repeated, or followed by more. */
    expect_edit_error("\nstd ", "\nweight ", "w.txt:3: want the \"std\" record");
    expect_edit_error("\nbias 0.125\n", "\n", "truncated: the \"bias\" record is missing");
    expect_edit_error("bias 0.125\n", "bias 0.125\nbias 1\n", "w.txt:6: unexpected content");
    expect_edit_error("\nstd ", "\n", "w.txt:3: want the \"std\" record");
    /* A long token is not a number (the parser copies at most 63 bytes). */
    char big[200];
    memset(big, '1', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    char with[220];
    snprintf(with, sizeof with, "bias %s", big);
    expect_edit_error("bias 0.125", with, "bias: value 1");
    /* A NUL byte anywhere. */
    router_classifier *c = NULL;
    util_err err = {0};
    assert_int_equal(router_classifier_parse(&c, "llmgw-router\0", 13, "w.txt", &err),
                     LLMGW_EINVAL);
    assert_contains(err.msg, "NUL");
    /* Truncated at every byte: always an error, never a crash. */
    char buf[4096];
    valid_text(buf, sizeof buf, "llmgw-router version=1 kind=lr dim=2 lex=8");
    size_t len = strlen(buf);
    for (size_t cut = 0; cut + 1 < len; cut++) {
        int rc = router_classifier_parse(&c, buf, cut, "w.txt", &err);
        /* Cutting inside the bias's last digits leaves a valid, shorter number. */
        if (rc == 0) {
            assert_true(cut >= len - 5);
            router_classifier_free(c);
        }
    }
    /* A missing file. */
    assert_int_equal(router_classifier_load(&c, "/nonexistent/router.weights", &err), LLMGW_EIO);
    assert_contains(err.msg, "/nonexistent/router.weights");
}

static void new_lr_errors(void **state)
{
    (void)state;
    double mean[N], std[N], w[N];
    params(mean, std, w);
    router_classifier *c = NULL;
    util_err err = {0};
    assert_int_equal(router_classifier_new_lr(&c, 0, mean, std, w, 0, &err), LLMGW_EINVAL);
    std[3] = 0;
    assert_int_equal(router_classifier_new_lr(&c, DIM, mean, std, w, 0, &err), LLMGW_EINVAL);
    assert_contains(err.msg, "std 3");
    std[3] = 1;
    w[1] = NAN;
    assert_int_equal(router_classifier_new_lr(&c, DIM, mean, std, w, 0, &err), LLMGW_EINVAL);
    w[1] = 0;
    assert_int_equal(router_classifier_new_lr(&c, DIM, mean, std, w, INFINITY, &err),
                     LLMGW_EINVAL);
    assert_null(c);
}

/* ---- scoring ------------------------------------------------------------------------------- */

static void score_by_hand(void **state)
{
    (void)state;
    double mean[N] = {0.1, 0}, std[N], w[N] = {1, -2};
    for (int i = 0; i < N; i++)
        std[i] = 1;
    std[0] = 0.5;
    w[DIM + 2] = 1.5;  /* the question-mark feature */
    router_classifier *c = NULL;
    util_err err = {0};
    assert_int_equal(router_classifier_new_lr(&c, DIM, mean, std, w, 0.5, &err), 0);
    const float emb[DIM] = {0.6f, 0.8f};
    /* z = 0.5 + 1 * (0.6 - 0.1) / 0.5 - 2 * 0.8 = -0.1 (no '?' in the empty text) */
    assert_double_near(router_classifier_score(c, emb, "", 0), 1 / (1 + exp(0.1)), 1e-7);
    /* One '?': + 1.5 * log(2). */
    assert_double_near(router_classifier_score(c, emb, "Why?", 4),
                       1 / (1 + exp(0.1 - 1.5 * log(2))), 1e-7);
    /* No embedding: its components sit at their means, z = 0.5 + 1.5 * log(2). */
    assert_double_near(router_classifier_score(c, NULL, "Why?", 4),
                       1 / (1 + exp(-0.5 - 1.5 * log(2))), 1e-7);
    router_classifier_free(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(lexical_empty),    cmocka_unit_test(lexical_question),
        cmocka_unit_test(lexical_code),     cmocka_unit_test(lexical_math),
        cmocka_unit_test(round_trip),       cmocka_unit_test(parse_valid),
        cmocka_unit_test(load_errors),      cmocka_unit_test(new_lr_errors),
        cmocka_unit_test(score_by_hand),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
