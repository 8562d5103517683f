/* gateway/api.h: the top of the request path: the OpenAI-compatible endpoints (chat,
 * completions, embeddings, models), health, metrics, the stats endpoint and its dashboard, and
 * the dry-run route, each request from its arrival to its accounting. Loop thread only. */
#ifndef LLMGW_GATEWAY_API_H
#define LLMGW_GATEWAY_API_H

#include "gateway/internal.h"

/* Fills the server's hooks: requests arrive here, answers end here (and the pipeline's); starts
 * the stats history's sampling timer on s->base. */
void gw_api_init(gw_server *s);
/* Declares every metric the daemon exports. */
void gw_api_declare_metrics(gw_metrics *m);
/* Frees what gw_api_init made and the request structs kept for reuse (at exit). */
void gw_api_deinit(gw_server *s);

#endif
