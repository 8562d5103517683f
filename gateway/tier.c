/* gateway/tier.c: the calls every tier answers to (see tier.h). */
#include "gateway/tier.h"

#include <stdarg.h>
#include <stdio.h>

void gw_tier_start(gw_req *r)
{
    gw_tier *t = r->srv->tiers[r->tier];
    if (r->tier_impl != NULL && r->tier_impl != t)
        gw_tier_release(r);  /* a fallback: the failed tier's state goes first */
    r->tier_impl = t;
    t->ops->start(t, r);
}

void gw_tier_detach(gw_req *r)
{
    if (r->tier_impl != NULL)
        r->tier_impl->ops->detach(r->tier_impl, r);
}

void gw_tier_release(gw_req *r)
{
    if (r->tier_impl != NULL)
        r->tier_impl->ops->release(r->tier_impl, r);
    r->tier_impl = NULL;
    r->tier_state = NULL;
}

void gw_tier_free(gw_tier *t)
{
    if (t != NULL)
        t->ops->free(t);
}

void gw_tier_fail(gw_req *r, int status, const char *type, const char *code, const char *kind,
                  const char *fmt, ...)
{
    gw_tier_failure f = {.status = status, .type = type, .code = code, .kind = kind};
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(f.message, sizeof f.message, fmt, ap);
    va_end(ap);
    r->srv->hooks.tier_failed(r, &f);
}
