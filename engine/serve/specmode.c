/* engine/serve/specmode.c: which speculation a step runs, by measurement (specmode.h). */
#include "engine/serve/specmode.h"

#include <stddef.h>

int eng_spec_bucket(int n)
{
    int b = 0;
    while (n > 1 && b < ENG_SPEC_BUCKETS - 1) {
        n >>= 1;
        b++;
    }
    return b;
}

int eng_spec_warm_best(const eng_spec_arm *a, unsigned mask)
{
    int best = -1;
    for (int m = ENG_SPEC_MODES - 1; m >= 0; m--) {
        if (!(mask & (1u << m)))
            continue;
        if (a->n[m] < ENG_SPEC_WARM)
            return -1;
        if (best < 0 || a->rate[m] > a->rate[best])
            best = m;
    }
    return best;
}

/* Steps until the next exploration: a->explore, or more where exploring costs more than
 * ENG_SPEC_EXPLORE_SHARE of the time between explorations (two steps of the slowest other mode,
 * say a drafter catching up with many sequences' text, against the fastest mode's steps). */
static uint32_t explore_gap(const eng_spec_arm *a, unsigned mask, int best)
{
    double worst = 0;
    for (int m = 0; m < ENG_SPEC_MODES; m++)
        if ((mask & (1u << m)) && m != best && a->ns[m] > worst)
            worst = a->ns[m];
    double gap = a->ns[best] > 0 ? 2 * worst / (ENG_SPEC_EXPLORE_SHARE * a->ns[best]) : 0;
    if (gap > ENG_SPEC_EXPLORE_MAX)
        gap = ENG_SPEC_EXPLORE_MAX;
    return gap > a->explore ? (uint32_t)gap : a->explore;
}

/* Whether best is faster than every other mode in mask by ENG_SPEC_CLEAR. */
static bool clear_verdict(const eng_spec_arm *a, unsigned mask, int best)
{
    for (int m = 0; m < ENG_SPEC_MODES; m++)
        if ((mask & (1u << m)) && m != best && a->rate[m] * (1 + ENG_SPEC_CLEAR) > a->rate[best])
            return false;
    return true;
}

/* Verification costs more, relative to a step, the more sequences share the forward, so a mode
 * richer than the one that won for fewer sequences is neither warmed up nor explored here:
 * trying the draft model at many sequences first has the drafter catch up with all their text,
 * which can cost more than the whole burst of traffic gains. */
int eng_spec_choose(eng_spec_arm *a, const eng_spec_arm *lower, unsigned mask)
{
    a->steps++;
    int lower_best = lower != NULL ? eng_spec_warm_best(lower, mask) : -1;
    if (lower_best >= 0)
        mask &= (2u << lower_best) - 1;   /* the modes up to lower's verdict */
    if ((mask & (mask - 1)) == 0)
        return a->last = __builtin_ctz(mask);   /* one mode left: nothing to choose */
    int best = -1, fewest = -1;
    for (int m = ENG_SPEC_MODES - 1; m >= 0; m--) {
        if (!(mask & (1u << m)))
            continue;
        if (best < 0 || a->rate[m] > a->rate[best])
            best = m;
        if (fewest < 0 || a->n[m] < a->n[fewest])
            fewest = m;   /* ties: the richer mode */
    }
    if (a->n[fewest] < ENG_SPEC_WARM) {
        a->last = fewest;
        a->best = best;
        a->explore = ENG_SPEC_EXPLORE;
        a->next = a->steps + a->explore;
    } else if (a->again) {
        /* The second step of an exploration, unless lower's verdict has since ruled it out. */
        a->again = false;
        if (!(mask & (1u << a->last)))
            a->last = best;
    } else if (a->steps >= a->next) {
        /* The previous exploration's verdict: the same fastest mode, and clearly so, explore
         * less often; a close call (acceptance varies with the text: a stretch the drafter gets
         * wrong turns speculation off, and the next easy one must be noticed) or a change
         * starts over. */
        if (best == a->best && clear_verdict(a, mask, best))
            a->explore = a->explore * 2 < ENG_SPEC_EXPLORE_MAX ? a->explore * 2
                                                               : ENG_SPEC_EXPLORE_MAX;
        else
            a->explore = ENG_SPEC_EXPLORE;
        a->best = best;
        a->next = a->steps + explore_gap(a, mask, best);
        /* Try the other modes in turn. */
        int m = a->probe;
        do
            m = (m + 1) % ENG_SPEC_MODES;
        while (!(mask & (1u << m)) || m == best);
        a->probe = a->last = m;
        a->again = true;
    } else {
        a->last = best;
    }
    return a->last;
}

int eng_spec_step(eng_spec_table *t, int n, bool sampled, unsigned mask, eng_spec_arm **arm)
{
    *arm = NULL;
    if ((mask & (mask - 1)) == 0)
        return __builtin_ctz(mask);
    eng_spec_arm *row = t->arms[sampled][(mask >> ENG_SPEC_NGRAM) & 1];
    int b = eng_spec_bucket(n);
    const eng_spec_arm *lower = NULL;
    for (int l = b - 1; l >= 0 && lower == NULL; l--)
        if (eng_spec_warm_best(&row[l], mask) >= 0)
            lower = &row[l];
    *arm = &row[b];
    return eng_spec_choose(*arm, lower, mask);
}

void eng_spec_sample(eng_spec_arm *a, int m, double tokens, double ns)
{
    /* The mean of the first ENG_SPEC_WARM samples, then a moving average (starting the average
     * at the first sample had it weigh two thirds after four: a first drafting step, with its
     * rejections, held the model mode down). The rate is the average tokens over the average
     * time: a drafting step's tokens vary from 1 to the draft's length, and a mean of
     * per-step rates weighs a short step that emitted one token as much as a long one. */
    double w = a->n[m] < ENG_SPEC_WARM ? 1.0 / (a->n[m] + 1) : 0.125;
    a->tok[m] += w * (tokens - a->tok[m]);
    a->ns[m] += w * (ns - a->ns[m]);
    a->rate[m] = a->tok[m] * 1e9 / a->ns[m];
    if (a->n[m] < ENG_SPEC_WARM)
        a->n[m]++;
}
