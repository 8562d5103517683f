/* tests/unit/engine/serve/test_specmode.c: the measured choice of speculation (specmode.h) on
 * made-up step figures — buckets, the warm-up (every mode sampled ENG_SPEC_WARM times, the
 * least sampled first), a mode's rate as average tokens over average time, the fastest mode
 * run between explorations, explorations thinning out (the gap doubling to
 * ENG_SPEC_EXPLORE_MAX) only on a clear verdict and staying ENG_SPEC_EXPLORE apart on a close
 * call, a change of the fastest mode noticed at the next exploration, a mode richer than a
 * smaller bucket's verdict never tried, and steps with and without a lookup draft measured
 * apart (eng_spec_step). */
#include "tests/unit/unit.h"

#include "engine/serve/specmode.h"

#define BOTH ((1u << ENG_SPEC_NONE) | (1u << ENG_SPEC_MODEL))
#define ALL ((1u << ENG_SPEC_NONE) | (1u << ENG_SPEC_NGRAM) | (1u << ENG_SPEC_MODEL))

/* Made-up modes: each step of mode m takes ns[m] and emits rate[m] * ns[m] tokens. */
typedef struct fake {
    double ns[ENG_SPEC_MODES], rate[ENG_SPEC_MODES];
} fake;

static int step(eng_spec_arm *a, const eng_spec_arm *lower, unsigned mask, const fake *f)
{
    int m = eng_spec_choose(a, lower, mask);
    eng_spec_sample(a, m, f->rate[m] * f->ns[m] / 1e9, f->ns[m]);
    return m;
}

static void buckets(void **state)
{
    (void)state;
    int want[][2] = {{1, 0}, {2, 1}, {3, 1}, {4, 2}, {7, 2}, {8, 3}, {63, 5}, {64, 6}, {1000, 6}};
    for (size_t i = 0; i < sizeof want / sizeof *want; i++)
        assert_int_equal(eng_spec_bucket(want[i][0]), want[i][1]);
}

static void warm_up_then_the_fastest(void **state)
{
    (void)state;
    eng_spec_arm a = {0};
    fake f = {.ns = {10e6, 10e6, 40e6}, .rate = {100, 0, 150}};
    int count[ENG_SPEC_MODES] = {0};
    assert_int_equal(eng_spec_warm_best(&a, BOTH), -1);
    for (int i = 0; i < 2 * ENG_SPEC_WARM; i++)
        count[step(&a, NULL, BOTH, &f)]++;
    /* The least sampled goes next, the richer on a tie: model, none, model, none, ... */
    assert_int_equal(count[ENG_SPEC_NONE], ENG_SPEC_WARM);
    assert_int_equal(count[ENG_SPEC_MODEL], ENG_SPEC_WARM);
    assert_int_equal(eng_spec_warm_best(&a, BOTH), ENG_SPEC_MODEL);
    for (int i = 0; i < ENG_SPEC_EXPLORE - 1; i++)
        assert_int_equal(step(&a, NULL, BOTH, &f), ENG_SPEC_MODEL);
    /* One mode in the mask: nothing to choose. */
    assert_int_equal(eng_spec_choose(&a, NULL, 1u << ENG_SPEC_NGRAM), ENG_SPEC_NGRAM);
}

/* Steps of one drafting mode emit 1 token in 20 ms, then 7 in 60 ms: 8 tokens in 80 ms is
 * 100 tokens/s (a mean of the two steps' rates would say 83). */
static void rate_is_tokens_over_time(void **state)
{
    (void)state;
    eng_spec_arm a = {0};
    eng_spec_sample(&a, ENG_SPEC_MODEL, 1, 20e6);
    eng_spec_sample(&a, ENG_SPEC_MODEL, 7, 60e6);
    assert_double_near(a.rate[ENG_SPEC_MODEL], 100.0, 1e-9);
    assert_int_equal(a.n[ENG_SPEC_MODEL], 2);
    for (int i = 0; i < 100; i++)
        eng_spec_sample(&a, ENG_SPEC_MODEL, 3, 10e6);   /* the moving average follows */
    assert_double_near(a.rate[ENG_SPEC_MODEL], 300.0, 1e-3);
    assert_int_equal(a.n[ENG_SPEC_MODEL], ENG_SPEC_WARM);
}

/* The steps where an exploration began (the mode is not the fastest), over n steps after the
 * warm-up; returns how many, gaps between them in gap[]. */
static int explorations(eng_spec_arm *a, const fake *f, int fastest, int n, int *gap, int cap)
{
    int k = 0, prev = -1;
    for (int i = 0; i < 2 * ENG_SPEC_WARM; i++)
        step(a, NULL, BOTH, f);
    for (int i = 0; i < n; i++) {
        bool again = a->again;
        int m = step(a, NULL, BOTH, f);
        if (m != fastest && !again) {
            if (prev >= 0 && k < cap)
                gap[k++] = i - prev;
            prev = i;
        }
    }
    return k;
}

static void clear_verdicts_explore_less_often(void **state)
{
    (void)state;
    int gap[16];
    /* The model mode 50 % faster: each exploration confirms it, the gap doubles to the cap. */
    eng_spec_arm a = {0};
    fake clear = {.ns = {10e6, 10e6, 40e6}, .rate = {100, 0, 150}};
    int n = explorations(&a, &clear, ENG_SPEC_MODEL, 4000, gap, 16);
    assert_true(n >= 5);
    int want = 2 * ENG_SPEC_EXPLORE;
    for (int i = 0; i < n; i++) {
        assert_int_equal(gap[i], want);
        want = want * 2 < ENG_SPEC_EXPLORE_MAX ? want * 2 : ENG_SPEC_EXPLORE_MAX;
    }
    /* 5 % faster: a close call, explored every ENG_SPEC_EXPLORE steps. */
    eng_spec_arm b = {0};
    fake close = {.ns = {10e6, 10e6, 40e6}, .rate = {100, 0, 105}};
    n = explorations(&b, &close, ENG_SPEC_MODEL, 1000, gap, 16);
    assert_true(n >= 16);
    for (int i = 0; i < n; i++)
        assert_int_equal(gap[i], ENG_SPEC_EXPLORE);
}

/* The text turns hard: the model mode drops below plain decoding, and an exploration of plain
 * decoding turns it off (the model then runs only when explored); when it is fast again the
 * next exploration brings it back. */
static int model_steps(eng_spec_arm *a, const fake *f, int n)
{
    int k = 0;
    for (int i = 0; i < n; i++)
        k += step(a, NULL, BOTH, f) == ENG_SPEC_MODEL;
    return k;
}

static void a_change_is_noticed(void **state)
{
    (void)state;
    eng_spec_arm a = {0};
    fake f = {.ns = {10e6, 10e6, 40e6}, .rate = {100, 0, 150}};
    model_steps(&a, &f, 300);
    f.rate[ENG_SPEC_MODEL] = 60;
    model_steps(&a, &f, 200);
    assert_true(model_steps(&a, &f, 320) <= 2 * (320 / ENG_SPEC_EXPLORE + 1));
    f.rate[ENG_SPEC_MODEL] = 150;   /* noticed within one gap, at most ENG_SPEC_EXPLORE_MAX */
    model_steps(&a, &f, ENG_SPEC_EXPLORE_MAX + 2);
    assert_true(model_steps(&a, &f, 100) >= 100 - 2 * (100 / ENG_SPEC_EXPLORE + 1));
}

/* A smaller bucket found prompt lookup fastest: this one never tries the draft model, not
 * even to warm it up. */
static void richer_than_a_smaller_bucket_is_not_tried(void **state)
{
    (void)state;
    eng_spec_arm lower = {0}, a = {0};
    fake f = {.ns = {10e6, 12e6, 40e6}, .rate = {100, 130, 200}};
    double tokens[ENG_SPEC_MODES] = {1.0, 1.2, 0.9};   /* 10 ms steps: 100, 120, 90 tokens/s */
    for (int m = 0; m < ENG_SPEC_MODES; m++)
        for (int i = 0; i < ENG_SPEC_WARM; i++)
            eng_spec_sample(&lower, m, tokens[m], 10e6);
    assert_int_equal(eng_spec_warm_best(&lower, ALL), ENG_SPEC_NGRAM);
    for (int i = 0; i < 3000; i++)
        assert_int_not_equal(step(&a, &lower, ALL, &f), ENG_SPEC_MODEL);
    assert_int_equal(a.n[ENG_SPEC_MODEL], 0);
}

/* Text that copies its input (prompt lookup finds drafts: a lookup step emits 5 tokens in
 * 15 ms, and the model mode is the same step at one stream) alternates with text that copies
 * nothing (lookup finds none: only the drafter drafts, 4 tokens in 40 ms), 40 steps each;
 * plain decoding is 1 token in 13 ms throughout (the engine offers prompt lookup only where it
 * found a draft). On fresh text, measured in an arm of its own, the drafter runs but for the
 * explorations of plain decoding. */
static void lookup_and_fresh_text_measured_apart(void **state)
{
    (void)state;
    eng_spec_table t = {0};
    int model = 0, fresh = 0;
    for (int stretch = 0; stretch < 40; stretch++) {
        bool copy = stretch % 2 == 0;
        for (int i = 0; i < 40; i++) {
            eng_spec_arm *a;
            int m = eng_spec_step(&t, 1, false, copy ? ALL : BOTH, &a);
            assert_ptr_equal(a, &t.arms[0][copy][0]);
            bool drafts = m != ENG_SPEC_NONE;
            eng_spec_sample(a, m, !drafts ? 1 : copy ? 5 : 4, !drafts ? 13e6 : copy ? 15e6 : 40e6);
            if (!copy && stretch >= 4) {
                fresh++;
                model += m == ENG_SPEC_MODEL;
            }
        }
    }
    assert_true(model >= 0.9 * fresh);
    /* No drafter and no lookup draft: nothing to choose, no sample. */
    eng_spec_arm *a = &t.arms[0][0][0];
    unsigned lookup_only = (1u << ENG_SPEC_NONE) | (1u << ENG_SPEC_NGRAM);
    t = (eng_spec_table){0};
    assert_int_equal(eng_spec_step(&t, 1, false, 1u << ENG_SPEC_NONE, &a), ENG_SPEC_NONE);
    assert_null(a);
    assert_int_equal(eng_spec_step(&t, 1, false, lookup_only, &a), ENG_SPEC_NGRAM);
    assert_ptr_equal(a, &t.arms[0][1][0]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(buckets),
        cmocka_unit_test(warm_up_then_the_fastest),
        cmocka_unit_test(rate_is_tokens_over_time),
        cmocka_unit_test(clear_verdicts_explore_less_often),
        cmocka_unit_test(a_change_is_noticed),
        cmocka_unit_test(richer_than_a_smaller_bucket_is_not_tried),
        cmocka_unit_test(lookup_and_fresh_text_measured_apart),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
