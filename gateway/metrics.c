/* gateway/metrics.c: a small Prometheus registry. Cardinality is bounded by configuration
 * (endpoints x status codes x tiers), so series live in per-family linked lists (the render
 * order); an open-addressing table on (name, labels) finds a series in one probe or two, since
 * a request updates a dozen of them. */
#include "gateway/metrics.h"

#include "common/arena.h"

#include <assert.h>
#include <event2/buffer.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const double k_buckets[] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                   0.25,   0.5,   1,      2.5,   5,     10,    30,    60};
#define N_BUCKETS (sizeof k_buckets / sizeof k_buckets[0])

typedef struct series {
    struct series *next;
    const char *name;                /* its family's */
    char *labels;
    uint64_t hash;
    double value;                    /* counter/gauge; histogram sum */
    unsigned long long count;        /* histogram */
    unsigned long long bucket[N_BUCKETS];
} series;

typedef struct family {
    struct family *next;
    char *name;
    char *help;
    gw_metric_type type;
    series *series;
} family;

struct gw_metrics {
    family *families;   /* in declaration order */
    family **tail;
    series **table;     /* [cap], NULL = empty; every series once */
    size_t cap, n;
};

static uint64_t key_hash(const char *name, const char *labels)
{
    uint64_t h = 1469598103934665603ull;
    for (const unsigned char *p = (const unsigned char *)name; *p; p++)
        h = (h ^ *p) * 1099511628211ull;
    h = (h ^ 0xff) * 1099511628211ull;
    for (const unsigned char *p = (const unsigned char *)labels; *p; p++)
        h = (h ^ *p) * 1099511628211ull;
    return h ^ (h >> 29);
}

static void table_put(gw_metrics *m, series *s)
{
    if (2 * (m->n + 1) > m->cap) {
        size_t cap = m->cap ? 2 * m->cap : 256;
        series **t = util_xcalloc(cap, sizeof *t);
        for (size_t i = 0; i < m->cap; i++) {
            series *x = m->table[i];
            if (x == NULL)
                continue;
            size_t j = (size_t)x->hash & (cap - 1);
            while (t[j] != NULL)
                j = (j + 1) & (cap - 1);
            t[j] = x;
        }
        free(m->table);
        m->table = t;
        m->cap = cap;
    }
    size_t j = (size_t)s->hash & (m->cap - 1);
    while (m->table[j] != NULL)
        j = (j + 1) & (m->cap - 1);
    m->table[j] = s;
    m->n++;
}

gw_metrics *gw_metrics_new(void)
{
    gw_metrics *m = util_xcalloc(1, sizeof *m);
    m->tail = &m->families;
    return m;
}

void gw_metrics_free(gw_metrics *m)
{
    if (m == NULL)
        return;
    for (family *f = m->families, *fn; f != NULL; f = fn) {
        fn = f->next;
        for (series *s = f->series, *sn; s != NULL; s = sn) {
            sn = s->next;
            free(s->labels);
            free(s);
        }
        free(f->name);
        free(f->help);
        free(f);
    }
    free(m->table);
    free(m);
}

void gw_metrics_declare(gw_metrics *m, const char *name, gw_metric_type type, const char *help)
{
    family *f = util_xcalloc(1, sizeof *f);
    f->name = util_xstrdup(name);
    f->help = util_xstrdup(help);
    f->type = type;
    *m->tail = f;
    m->tail = &f->next;
}

static family *find_family(gw_metrics *m, const char *name)
{
    for (family *f = m->families; f != NULL; f = f->next)
        if (!strcmp(f->name, name))
            return f;
    return NULL;
}

static series *find_series(gw_metrics *m, const char *name, const char *labels, int create)
{
    labels = labels ? labels : "";
    uint64_t h = key_hash(name, labels);
    for (size_t j = (size_t)h & (m->cap - 1); m->cap > 0 && m->table[j] != NULL;
         j = (j + 1) & (m->cap - 1)) {
        series *s = m->table[j];
        if (s->hash == h && !strcmp(s->name, name) && !strcmp(s->labels, labels))
            return s;
    }
    family *f = find_family(m, name);
    assert(f != NULL && "metric family not declared");
    if (f == NULL || !create)
        return NULL;
    series **link = &f->series;
    while (*link != NULL)
        link = &(*link)->next;
    series *s = util_xcalloc(1, sizeof *s);
    s->name = f->name;
    s->labels = util_xstrdup(labels);
    s->hash = h;
    *link = s;
    table_put(m, s);
    return s;
}

void gw_metrics_add(gw_metrics *m, const char *name, const char *labels, double v)
{
    series *s = find_series(m, name, labels, 1);
    if (s != NULL)
        s->value += v;
}

void gw_metrics_set(gw_metrics *m, const char *name, const char *labels, double v)
{
    series *s = find_series(m, name, labels, 1);
    if (s != NULL)
        s->value = v;
}

void gw_metrics_observe(gw_metrics *m, const char *name, const char *labels, double seconds)
{
    series *s = find_series(m, name, labels, 1);
    if (s == NULL)
        return;
    s->value += seconds;
    s->count++;
    for (size_t i = 0; i < N_BUCKETS; i++)
        if (seconds <= k_buckets[i])
            s->bucket[i]++;
}

double gw_metrics_get(gw_metrics *m, const char *name, const char *labels)
{
    series *s = find_series(m, name, labels, 0);
    return s ? s->value : 0;
}

static void render_name(struct evbuffer *out, const char *name, const char *suffix,
                        const char *labels, const char *extra)
{
    int has = labels && *labels, ext = extra && *extra;
    evbuffer_add_printf(out, "%s%s%s%s%s%s%s", name, suffix, has || ext ? "{" : "",
                        has ? labels : "", has && ext ? "," : "", ext ? extra : "",
                        has || ext ? "}" : "");
}

void gw_metrics_render(gw_metrics *m, struct evbuffer *out)
{
    static const char *type_names[] = {"counter", "gauge", "histogram"};
    for (family *f = m->families; f != NULL; f = f->next) {
        evbuffer_add_printf(out, "# HELP %s %s\n# TYPE %s %s\n", f->name, f->help, f->name,
                            type_names[f->type]);
        for (series *s = f->series; s != NULL; s = s->next) {
            if (f->type != GW_METRIC_HISTOGRAM) {
                render_name(out, f->name, "", s->labels, NULL);
                evbuffer_add_printf(out, " %.17g\n", s->value);
                continue;
            }
            char le[32];
            for (size_t i = 0; i < N_BUCKETS; i++) {
                snprintf(le, sizeof le, "le=\"%g\"", k_buckets[i]);
                render_name(out, f->name, "_bucket", s->labels, le);
                evbuffer_add_printf(out, " %llu\n", s->bucket[i]);
            }
            render_name(out, f->name, "_bucket", s->labels, "le=\"+Inf\"");
            evbuffer_add_printf(out, " %llu\n", s->count);
            render_name(out, f->name, "_sum", s->labels, NULL);
            evbuffer_add_printf(out, " %.9g\n", s->value);
            render_name(out, f->name, "_count", s->labels, NULL);
            evbuffer_add_printf(out, " %llu\n", s->count);
        }
    }
}

void gw_metrics_each(gw_metrics *m, const char *name,
                     void (*fn)(void *ctx, const gw_metric_sample *s), void *ctx)
{
    family *f = find_family(m, name);
    for (series *x = f != NULL ? f->series : NULL; x != NULL; x = x->next) {
        gw_metric_sample s = {.labels = x->labels, .value = x->value, .count = x->count,
                              .bounds = k_buckets, .buckets = x->bucket,
                              .n_buckets = (int)N_BUCKETS};
        fn(ctx, &s);
    }
}
