/* tests/unit/engine/test_sample.c: the sampler — greedy, seeded reproducibility, the filters
 * (top-k, top-p, min-p) never yield a token they exclude, temperature shapes frequencies, and
 * logprobs match a log-softmax computed here. */
#include "../unit.h"

#include "engine/sample.h"

#include <stdlib.h>

#define V 1000

static void fill(float *l, unsigned seed)
{
    srand(seed);
    for (int i = 0; i < V; i++)
        l[i] = (float)(rand() % 2000) / 100.0f - 10.0f;
}

static int argmax(const float *l)
{
    int b = 0;
    for (int i = 1; i < V; i++)
        if (l[i] > l[b])
            b = i;
    return b;
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
        cmocka_unit_test(same_seed_same_tokens),
        cmocka_unit_test(top_k_stays_in_the_top),
        cmocka_unit_test(top_p_and_min_p_cut_the_tail),
        cmocka_unit_test(logprobs_are_log_softmax),
        cmocka_unit_test(uniform_in_unit_interval),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
