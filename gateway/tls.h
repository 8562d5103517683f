/* gateway/tls.h: OpenSSL contexts for the HTTPS listeners and the upstream client, and the
 * --dev-tls self-signed certificate. TLS 1.2 is the minimum everywhere. Errors name the file. */
#ifndef LLMGW_GATEWAY_TLS_H
#define LLMGW_GATEWAY_TLS_H

#include "common/err.h"

#include <openssl/ssl.h>
#include <stdbool.h>

/* A server context for cert/key PEM files; the caller SSL_CTX_free()s it. */
int gw_tls_server_ctx(SSL_CTX **out, const char *cert, const char *key, util_err *err);

/* A client context; verify=false skips certificate checks (a config choice, logged). */
int gw_tls_client_ctx(SSL_CTX **out, bool verify, const char *ca_file, util_err *err);

/* Makes sure dir/cert.pem and dir/key.pem exist: reuses a valid pair, else creates a P-256 key
 * and a self-signed certificate for localhost, 127.0.0.1 and ::1 (30 days). */
int gw_tls_dev_cert(const char *dir, util_err *err);

#endif
