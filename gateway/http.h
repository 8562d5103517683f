/* gateway/http.h: listeners (HTTP and HTTPS on libevent evhttp), connections, slow-client
 * deadlines, max connections, graceful shutdown, and the evhttp transport requests answer
 * through. A request goes up through hooks.request, a client's leaving through
 * hooks.client_gone. Loop thread only. */
#ifndef LLMGW_GATEWAY_HTTP_H
#define LLMGW_GATEWAY_HTTP_H

#include "gateway/internal.h"

struct evhttp_request;

int  gw_server_start(gw_server *s, util_err *err);
void gw_server_stop(gw_server *s);
gw_conn *gw_conn_of(gw_server *s, struct evhttp_request *ereq);
void gw_conn_request_start(gw_conn *c, gw_req *r);  /* busy: at the limit, stop accepting */
void gw_conn_request_done(gw_conn *c);                         /* re-arms the deadline */
void gw_conn_watch_close(gw_conn *c);         /* a request is pending: notice the client leave */
void gw_server_maybe_exit(gw_server *s);                       /* when draining and idle */

/* Answers go out through evhttp; io_ctx is the struct evhttp_request. */
extern const gw_transport gw_http_transport;

#endif
