/* gateway/api.h: the top of the request path: the OpenAI-compatible endpoints (chat,
 * completions, embeddings, models), health, metrics and the dry-run route, each request from
 * its arrival to its accounting. Loop thread only. */
#ifndef LLMGW_GATEWAY_API_H
#define LLMGW_GATEWAY_API_H

#include "gateway/internal.h"

/* Fills the server's hooks: requests arrive here, answers end here (and the pipeline's). */
void gw_api_init(gw_server *s);
/* Declares every metric the daemon exports. */
void gw_api_declare_metrics(gw_metrics *m);
/* Frees the request structs kept for reuse (at exit). */
void gw_api_free_spares(gw_server *s);

#endif
