/* tests/unit/engine/serve/test_sample.c: the sampler — greedy, seeded reproducibility, the filters
 * (top-k, top-p, min-p) never yield a token they exclude, temperature shapes frequencies,
 * logprobs match a log-softmax computed here, logit_bias steers every choice while the
 * logprobs stay the model's, and speculative sampling's rule keeps the target's distribution
 * (chi-square goodness of fit at a stated false-alarm rate). */
#include "tests/unit/unit.h"

#include "engine/serve/sample.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define V 1000

static void fill(float *l, unsigned seed)
{
    srand(seed);
    for (int i = 0; i < V; i++)
        l[i] = (float)(rand() % 2000) / 100.0f - 10.0f;
}

/* The first index of the largest, a token at a time (what eng_argmax must equal). */
static int argmax_n(const float *l, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        if (l[i] > l[b])
            b = i;
    return b;
}

static int argmax(const float *l)
{
    return argmax_n(l, V);
}

static void greedy_is_argmax(void **state)
{
    (void)state;
    float l[V];
    eng_sampler *s = eng_sampler_new(V);
    eng_rng rng;
    eng_rng_seed(&rng, 1);
    eng_sampling p = {.temperature = 0, .top_p = 1, .top_logprobs = -1};
    for (unsigned k = 0; k < 20; k++) {
        fill(l, k);
        eng_pick pick;
        eng_sample(s, &p, &rng, l, &pick);
        assert_int_equal(pick.token, argmax(l));
    }
    eng_sampler_free(s);
}

/* eng_argmax is the first index of the largest (ties, a maximum in any block of its search,
 * NaNs and infinities as a token-at-a-time scan has them), at lengths around its blocks. */
static void argmax_is_the_first_largest(void **state)
{
    (void)state;
    static const int lens[] = {1, 7, 8, 255, 256, 257, 1000, 49152};
    float *l = malloc(49152 * sizeof *l);
    srand(7);
    for (int li = 0; li < 8; li++)
        for (int rep = 0; rep < 40; rep++) {
            int n = lens[li];
            for (int i = 0; i < n; i++)
                l[i] = (float)(rand() % (rep % 2 ? 50 : 5000)) / 10.0f;   /* odd reps: ties */
            if (rep % 5 == 1)
                l[rand() % n] = NAN;
            if (rep % 7 == 2)
                l[rand() % n] = -INFINITY;
            if (rep % 9 == 3)
                l[0] = NAN;
            if (rep % 11 == 4)
                l[n - 1] = INFINITY;
            assert_int_equal(eng_argmax(l, n), argmax_n(l, n));
        }
    free(l);
}

/* eng_prob_at is the softmax at a token, within float rounding of a full double sum. */
static void prob_at_is_the_softmax(void **state)
{
    (void)state;
    float l[V];
    for (unsigned k = 0; k < 10; k++) {
        fill(l, 100 + k);
        if (k % 2)
            for (int i = 0; i < V; i++)
                l[i] *= 4.0f;   /* spread past the 20 left out */
        double mx = l[argmax(l)], sum = 0;
        for (int i = 0; i < V; i++)
            sum += exp((double)l[i] - mx);
        for (int x = -1; x < V; x += 97) {
            double want = (x < 0 ? 1.0 : exp((double)l[x] - mx)) / sum;
            assert_double_near(eng_prob_at(l, V, x), want, 1e-6 + 1e-4 * want);
        }
    }
}

static void same_seed_same_tokens(void **state)
{
    (void)state;
    float l[V];
    fill(l, 7);
    eng_sampler *s = eng_sampler_new(V);
    eng_sampling p = {.temperature = 1.0f, .top_p = 0.95f, .top_logprobs = -1};
    int32_t a[64], b[64];
    eng_rng r1, r2;
    eng_rng_seed(&r1, 1234);
    eng_rng_seed(&r2, 1234);
    for (int i = 0; i < 64; i++) {
        eng_pick pa, pb;
        eng_sample(s, &p, &r1, l, &pa);
        eng_sample(s, &p, &r2, l, &pb);
        a[i] = pa.token;
        b[i] = pb.token;
    }
    assert_memory_equal(a, b, sizeof a);
    /* A different seed gives a different sequence (with overwhelming probability). */
    eng_rng_seed(&r2, 99);
    int differ = 0;
    for (int i = 0; i < 64; i++) {
        eng_pick pb;
        eng_sample(s, &p, &r2, l, &pb);
        differ += pb.token != a[i];
    }
    assert_true(differ > 0);
    eng_sampler_free(s);
}

static void top_k_stays_in_the_top(void **state)
{
    (void)state;
    float l[V];
    fill(l, 3);
    eng_sampler *s = eng_sampler_new(V);
    eng_rng rng;
    eng_rng_seed(&rng, 5);
    eng_sampling p = {.temperature = 5.0f, .top_k = 3, .top_p = 1, .top_logprobs = -1};
    /* The three largest logits. */
    float sorted[V];
    memcpy(sorted, l, sizeof l);
    for (int i = 0; i < 3; i++)
        for (int j = i + 1; j < V; j++)
            if (sorted[j] > sorted[i]) {
                float t = sorted[i];
                sorted[i] = sorted[j];
                sorted[j] = t;
            }
    for (int i = 0; i < 500; i++) {
        eng_pick pick;
        eng_sample(s, &p, &rng, l, &pick);
        assert_true(l[pick.token] >= sorted[2]);
    }
    eng_sampler_free(s);
}

static void top_p_and_min_p_cut_the_tail(void **state)
{
    (void)state;
    float l[V];
    for (int i = 0; i < V; i++)
        l[i] = -20.0f;
    l[10] = 5.0f;   /* p ~ 0.73 */
    l[20] = 4.0f;   /* p ~ 0.27 */
    eng_sampler *s = eng_sampler_new(V);
    eng_rng rng;
    eng_rng_seed(&rng, 11);
    eng_sampling top_p = {.temperature = 1.0f, .top_p = 0.5f, .top_logprobs = -1};
    eng_sampling min_p = {.temperature = 1.0f, .top_p = 1.0f, .min_p = 0.5f, .top_logprobs = -1};
    eng_sampling both = {.temperature = 1.0f, .top_p = 0.99f, .top_logprobs = -1};
    int seen20 = 0;
    for (int i = 0; i < 300; i++) {
        eng_pick pick;
        eng_sample(s, &top_p, &rng, l, &pick);
        assert_int_equal(pick.token, 10);      /* 0.73 alone passes 0.5 */
        eng_sample(s, &min_p, &rng, l, &pick);
        assert_int_equal(pick.token, 10);      /* 0.27 < 0.5 * 0.73 */
        eng_sample(s, &both, &rng, l, &pick);
        assert_true(pick.token == 10 || pick.token == 20);
        seen20 += pick.token == 20;
    }
    assert_true(seen20 > 30 && seen20 < 150);  /* ~27% of 300 */
    eng_sampler_free(s);
}

static void logprobs_are_log_softmax(void **state)
{
    (void)state;
    float l[V];
    fill(l, 9);
    double mx = l[argmax(l)], sum = 0;
    for (int i = 0; i < V; i++)
        sum += exp(l[i] - mx);
    eng_sampler *s = eng_sampler_new(V);
    eng_rng rng;
    eng_rng_seed(&rng, 2);
    eng_sampling p = {.temperature = 0, .top_p = 1, .top_logprobs = 5};
    eng_pick pick;
    eng_sample(s, &p, &rng, l, &pick);
    assert_double_near(pick.logprob, l[pick.token] - mx - log(sum), 1e-4);
    assert_int_equal(pick.n_top, 5);
    assert_int_equal(pick.top_ids[0], pick.token);
    for (int i = 1; i < 5; i++)
        assert_true(pick.top_logprobs[i] <= pick.top_logprobs[i - 1]);
    for (int i = 0; i < 5; i++)
        assert_double_near(pick.top_logprobs[i], l[pick.top_ids[i]] - mx - log(sum), 1e-4);
    eng_sampler_free(s);
}

static int argmin(const float *l)
{
    int b = 0;
    for (int i = 1; i < V; i++)
        if (l[i] < l[b])
            b = i;
    return b;
}

/* +100 on the least likely token: greedy and every filter pick it (logits span 20 here). */
static void logit_bias_plus_100_picks_a_low_token(void **state)
{
    (void)state;
    float l[V], copy[V];
    eng_sampler *s = eng_sampler_new(V);
    eng_rng rng;
    eng_rng_seed(&rng, 3);
    for (unsigned k = 0; k < 10; k++) {
        fill(l, k);
        memcpy(copy, l, sizeof l);
        int low = argmin(l);
        eng_logit_bias b = {.token = low, .bias = 100};
        eng_sampling ps[] = {
            {.temperature = 0, .top_p = 1, .top_logprobs = -1, .logit_bias = &b, .n_logit_bias = 1},
            {.temperature = 1, .top_p = 0.9f, .top_logprobs = -1, .logit_bias = &b,
             .n_logit_bias = 1},
            {.temperature = 2, .top_k = 5, .top_p = 1, .min_p = 0.1f, .top_logprobs = -1,
             .logit_bias = &b, .n_logit_bias = 1},
        };
        for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) {
            eng_pick pick;
            eng_sample(s, &ps[i], &rng, l, &pick);
            assert_int_equal(pick.token, low);
        }
        assert_memory_equal(l, copy, sizeof l);  /* the caller's logits are left alone */
    }
    eng_sampler_free(s);
}

/* -100 on the argmax: greedy picks the runner-up. */
static void logit_bias_minus_100_bans_the_argmax(void **state)
{
    (void)state;
    float l[V];
    eng_sampler *s = eng_sampler_new(V);
    eng_rng rng;
    eng_rng_seed(&rng, 4);
    for (unsigned k = 0; k < 10; k++) {
        fill(l, k);
        int best = argmax(l), second = best == 0 ? 1 : 0;
        for (int i = 0; i < V; i++)
            if (i != best && l[i] > l[second])
                second = i;
        eng_logit_bias b = {.token = best, .bias = -100};
        eng_sampling p = {.temperature = 0, .top_p = 1, .top_logprobs = -1, .logit_bias = &b,
                          .n_logit_bias = 1};
        eng_pick pick;
        eng_sample(s, &p, &rng, l, &pick);
        assert_int_not_equal(pick.token, best);
        assert_int_equal(pick.token, second);
    }
    eng_sampler_free(s);
}

/* The logprobs reported with a bias are those of the model's logits, as without one. */
static void logit_bias_keeps_the_models_logprobs(void **state)
{
    (void)state;
    float l[V];
    fill(l, 9);
    int low = argmin(l);
    eng_sampler *s = eng_sampler_new(V);
    eng_rng rng;
    eng_rng_seed(&rng, 2);
    eng_sampling plain = {.temperature = 0, .top_p = 1, .top_logprobs = 5};
    eng_logit_bias b[] = {{.token = low, .bias = 100}, {.token = argmax(l), .bias = -100}};
    eng_sampling biased = plain;
    biased.logit_bias = b;
    biased.n_logit_bias = 2;
    eng_pick want, got;
    eng_sample(s, &plain, &rng, l, &want);
    eng_sample(s, &biased, &rng, l, &got);
    assert_int_equal(got.token, low);
    double mx = l[argmax(l)], sum = 0;
    for (int i = 0; i < V; i++)
        sum += exp(l[i] - mx);
    assert_double_near(got.logprob, l[low] - mx - log(sum), 1e-4);
    assert_true(got.logprob < -10);
    assert_int_equal(got.n_top, want.n_top);
    assert_memory_equal(got.top_ids, want.top_ids, sizeof want.top_ids);
    assert_memory_equal(got.top_logprobs, want.top_logprobs, sizeof want.top_logprobs);
    assert_int_equal(got.top_ids[0], argmax(l));
    eng_sampler_free(s);
}

/* No entries (an array with n_logit_bias 0, or zero biases) change nothing: the same seed gives
 * the same tokens as without a bias. */
static void logit_bias_without_entries_changes_nothing(void **state)
{
    (void)state;
    float l[V];
    fill(l, 7);
    eng_sampler *s = eng_sampler_new(V);
    eng_logit_bias zero[] = {{.token = 1, .bias = 0}, {.token = 500, .bias = 0}};
    eng_sampling p = {.temperature = 1.0f, .top_p = 0.95f, .top_logprobs = 3};
    eng_sampling empty = p, zeros = p;
    empty.logit_bias = zero;     /* present but no entries */
    empty.n_logit_bias = 0;
    zeros.logit_bias = zero;
    zeros.n_logit_bias = 2;
    eng_rng r0, r1, r2;
    eng_rng_seed(&r0, 77);
    eng_rng_seed(&r1, 77);
    eng_rng_seed(&r2, 77);
    for (int i = 0; i < 64; i++) {
        eng_pick a, b, c;
        eng_sample(s, &p, &r0, l, &a);
        eng_sample(s, &empty, &r1, l, &b);
        eng_sample(s, &zeros, &r2, l, &c);
        assert_int_equal(b.token, a.token);
        assert_int_equal(c.token, a.token);
        assert_true(b.logprob == a.logprob && c.logprob == a.logprob);
    }
    eng_sampler_free(s);
}

/* The chi-square statistic's critical value at false-alarm rate 0.001 for df degrees of freedom
 * (Wilson-Hilferty; within 1 % of the exact quantile for df >= 3). */
static double chi2_crit_001(int df)
{
    double z = 3.0902, a = 2.0 / (9.0 * df);
    double c = 1.0 - a + z * sqrt(a);
    return df * c * c * c;
}

/* Goodness of fit of counts[V] (n draws) to dist[V]: every count outside dist's support fails;
 * the statistic over the support must stay under the 0.001 critical value. With a correct
 * sampler a fresh seed fails this with probability 0.001; the seeds here are fixed. */
static void assert_follows(const int *counts, int n, const float *dist)
{
    double chi2 = 0;
    int df = -1;
    for (int i = 0; i < V; i++) {
        if (dist[i] <= 0) {
            assert_int_equal(counts[i], 0);
            continue;
        }
        double e = (double)n * dist[i];
        chi2 += (counts[i] - e) * (counts[i] - e) / e;
        df++;
    }
    assert_true(df >= 3);
    if (chi2 >= chi2_crit_001(df))
        fail_msg("chi-square %.1f >= %.1f (df %d)", chi2, chi2_crit_001(df), df);
}

/* 20,000 draws of eng_sample with p from a generator seeded with seed follow dist. */
static void assert_draws_follow(eng_sampler *s, const eng_sampling *p, uint64_t seed,
                                const float *l, const float *dist)
{
    enum { N = 20000 };
    static int counts[V];
    memset(counts, 0, sizeof counts);
    eng_rng rng;
    eng_rng_seed(&rng, seed);
    for (int k = 0; k < N; k++) {
        eng_pick pick;
        eng_sample(s, p, &rng, l, &pick);
        counts[pick.token]++;
    }
    assert_follows(counts, N, dist);
}

/* eng_sample_dist is the distribution eng_sample draws from: same support, frequencies fit. */
static void sample_dist_is_what_sample_draws(void **state)
{
    (void)state;
    float l[V], dist[V];
    eng_sampler *s = eng_sampler_new(V);
    fill(l, 3);
    for (int i = 0; i < V; i++)
        l[i] *= 0.25f;   /* a flatter distribution: more tokens to test */
    eng_sampling p = {.temperature = 0.8f, .top_k = 12, .top_p = 0.95f, .top_logprobs = -1};
    eng_sample_dist(s, &p, l, dist);
    double sum = 0;
    for (int i = 0; i < V; i++)
        sum += dist[i];
    assert_true(fabs(sum - 1.0) < 1e-5);
    assert_draws_follow(s, &p, 7, l, dist);
    eng_sampler_free(s);
}

/* Temperature alone, and with min-p (no order needed, so the candidates are not sorted): the
 * distribution is the softmax at that temperature (cut at min_p times the largest probability
 * and renormalised), computed here in double, and the draws follow it. */
static void temperature_alone_is_the_softmax(void **state)
{
    (void)state;
    float l[V], dist[V], want[V];
    eng_sampler *s = eng_sampler_new(V);
    fill(l, 5);
    for (int i = 0; i < V; i++)
        l[i] *= 0.25f;
    const float min_ps[] = {0, 0.05f};
    for (int c = 0; c < 2; c++) {
        eng_sampling p = {.temperature = 0.7f, .top_p = 1, .min_p = min_ps[c], .top_logprobs = -1};
        double mx = -INFINITY, sum = 0;
        for (int i = 0; i < V; i++)
            mx = l[i] > mx ? l[i] : mx;
        for (int i = 0; i < V; i++) {
            double e = exp(((double)l[i] - mx) / 0.7);
            want[i] = e >= min_ps[c] ? (float)e : 0;   /* the largest term is 1 */
            sum += want[i];
        }
        int support = 0;
        for (int i = 0; i < V; i++) {
            want[i] = (float)(want[i] / sum);
            support += want[i] > 0;
        }
        assert_true(c == 0 ? support == V : support < V);
        eng_sample_dist(s, &p, l, dist);
        for (int i = 0; i < V; i++)
            assert_float_equal(dist[i], want[i], 1e-6);
        assert_draws_follow(s, &p, 11 + (uint64_t)c, l, want);
    }
    /* No finite largest logit (all -inf, or one +inf): the first largest, not NaN terms. */
    eng_sampling hot = {.temperature = 0.7f, .top_p = 1, .top_logprobs = -1};
    for (int c = 0; c < 2; c++) {
        for (int i = 0; i < V; i++)
            l[i] = -INFINITY;
        if (c == 1)
            l[V / 2] = INFINITY;
        eng_rng rng;
        eng_rng_seed(&rng, 3);
        eng_pick pick;
        eng_sample(s, &hot, &rng, l, &pick);
        assert_int_equal(pick.token, c == 0 ? 0 : V / 2);
    }
    eng_sampler_free(s);
}

/* Speculative sampling: drafts drawn from a drafter's q and passed through eng_spec_verify come
 * out distributed as the target's p (the replacement drawn from norm(max(0, p - q))), and are
 * accepted at the rate sum(min(p, q)); a certain draft (prompt lookup, q NULL) too, whether p
 * gives it much, little or nothing. */
static void spec_verify_keeps_the_target_distribution(void **state)
{
    (void)state;
    float lp[V], lq[V], p[V], q[V], pw[V], scratch[V];
    static int counts[V];
    eng_sampler *s = eng_sampler_new(V);
    eng_rng rng;
    eng_rng_seed(&rng, 11);
    fill(lp, 5);
    for (int i = 0; i < V; i++)
        lp[i] *= 0.2f;
    memcpy(lq, lp, sizeof lq);
    for (int i = 0; i < V; i++)           /* the drafter: the target's logits, disturbed */
        lq[i] += (float)((i * 7919) % 13) * 0.15f;
    eng_sampling sp = {.temperature = 1.0f, .top_k = 16, .top_p = 1, .top_logprobs = -1};
    eng_sample_dist(s, &sp, lp, p);
    eng_sample_dist(s, &sp, lq, q);
    double overlap = 0;
    for (int i = 0; i < V; i++)
        overlap += p[i] < q[i] ? p[i] : q[i];
    assert_true(overlap > 0.2 && overlap < 0.95);   /* rejections happen, and so do accepts */
    enum { N = 40000 };
    memset(counts, 0, sizeof counts);
    int acc = 0;
    for (int k = 0; k < N; k++) {
        int32_t x = eng_sample_from(q, V, &rng);
        memcpy(pw, p, sizeof pw);
        bool ok;
        counts[eng_spec_verify(pw, q, V, x, scratch, &rng, &ok)]++;
        acc += ok;
    }
    assert_follows(counts, N, p);
    double sd = sqrt(overlap * (1 - overlap) / N);
    assert_true(fabs((double)acc / N - overlap) < 5 * sd);
    /* A certain draft: the most likely token, a middling one, one p excludes. */
    int32_t order[3] = {argmax(lp), -1, -1};
    for (int i = 0; i < V; i++) {
        if (p[i] > 0 && i != order[0] && order[1] < 0)
            order[1] = i;
        if (p[i] == 0 && order[2] < 0)
            order[2] = i;
    }
    for (int c = 0; c < 3; c++) {
        memset(counts, 0, sizeof counts);
        for (int k = 0; k < N; k++) {
            memcpy(pw, p, sizeof pw);
            bool ok;
            counts[eng_spec_verify(pw, NULL, V, order[c], scratch, &rng, &ok)]++;
        }
        assert_follows(counts, N, p);
    }
    eng_sampler_free(s);
}

static void uniform_in_unit_interval(void **state)
{
    (void)state;
    eng_rng r;
    eng_rng_seed(&r, 0);
    double sum = 0;
    for (int i = 0; i < 10000; i++) {
        double u = eng_rng_uniform(&r);
        assert_true(u >= 0 && u < 1);
        sum += u;
    }
    assert_double_near(sum / 10000, 0.5, 0.02);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(greedy_is_argmax),
        cmocka_unit_test(argmax_is_the_first_largest),
        cmocka_unit_test(prob_at_is_the_softmax),
        cmocka_unit_test(same_seed_same_tokens),
        cmocka_unit_test(top_k_stays_in_the_top),
        cmocka_unit_test(top_p_and_min_p_cut_the_tail),
        cmocka_unit_test(temperature_alone_is_the_softmax),
        cmocka_unit_test(logprobs_are_log_softmax),
        cmocka_unit_test(logit_bias_plus_100_picks_a_low_token),
        cmocka_unit_test(logit_bias_minus_100_bans_the_argmax),
        cmocka_unit_test(logit_bias_keeps_the_models_logprobs),
        cmocka_unit_test(logit_bias_without_entries_changes_nothing),
        cmocka_unit_test(uniform_in_unit_interval),
        cmocka_unit_test(sample_dist_is_what_sample_draws),
        cmocka_unit_test(spec_verify_keeps_the_target_distribution),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
