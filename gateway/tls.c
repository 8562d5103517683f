/* gateway/tls.c: TLS contexts and the development certificate (OpenSSL 3 API). */
#include "gateway/tls.h"

#include "common/log.h"

#include <errno.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509v3.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *ssl_reason(void)
{
    static char buf[160];
    unsigned long e = ERR_get_error();
    ERR_clear_error();
    if (e == 0)
        return "unknown OpenSSL error";
    ERR_error_string_n(e, buf, sizeof buf);
    return buf;
}

int gw_tls_server_ctx(SSL_CTX **out, const char *cert, const char *key, util_err *err)
{
    SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
    if (ctx == NULL)
        return util_err_set(err, LLMGW_ETLS, "SSL_CTX_new: %s", ssl_reason());
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    SSL_CTX_set_options(ctx, SSL_OP_NO_COMPRESSION | SSL_OP_NO_RENEGOTIATION |
                                 SSL_OP_CIPHER_SERVER_PREFERENCE);
    SSL_CTX_set_mode(ctx, SSL_MODE_RELEASE_BUFFERS);
    if (SSL_CTX_use_certificate_chain_file(ctx, cert) != 1) {
        int rc = util_err_set(err, LLMGW_ETLS, "%s: cannot load certificate: %s", cert,
                              ssl_reason());
        SSL_CTX_free(ctx);
        return rc;
    }
    if (SSL_CTX_use_PrivateKey_file(ctx, key, SSL_FILETYPE_PEM) != 1 ||
        SSL_CTX_check_private_key(ctx) != 1) {
        int rc = util_err_set(err, LLMGW_ETLS, "%s: cannot load private key (or it does not "
                              "match %s): %s", key, cert, ssl_reason());
        SSL_CTX_free(ctx);
        return rc;
    }
    *out = ctx;
    return 0;
}

int gw_tls_client_ctx(SSL_CTX **out, bool verify, const char *ca_file, util_err *err)
{
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
    if (ctx == NULL)
        return util_err_set(err, LLMGW_ETLS, "SSL_CTX_new: %s", ssl_reason());
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    if (verify) {
        SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
        int ok = ca_file ? SSL_CTX_load_verify_locations(ctx, ca_file, NULL)
                         : SSL_CTX_set_default_verify_paths(ctx);
        if (ok != 1) {
            int rc = util_err_set(err, LLMGW_ETLS, "%s: cannot load CA certificates: %s",
                                  ca_file ? ca_file : "system store", ssl_reason());
            SSL_CTX_free(ctx);
            return rc;
        }
    } else {
        SSL_CTX_set_verify(ctx, SSL_VERIFY_NONE, NULL);
    }
    *out = ctx;
    return 0;
}

static int pair_usable(const char *cert, const char *key)
{
    SSL_CTX *ctx = NULL;
    if (access(cert, R_OK) != 0 || access(key, R_OK) != 0)
        return 0;
    if (gw_tls_server_ctx(&ctx, cert, key, NULL) != 0)
        return 0;
    /* Expired or nearly expired development certificates are replaced. */
    X509 *x = SSL_CTX_get0_certificate(ctx);
    int ok = x != NULL && X509_cmp_time(X509_get0_notAfter(x), NULL) > 0;
    SSL_CTX_free(ctx);
    return ok;
}

static int add_ext(X509 *x, int nid, const char *value)
{
    X509V3_CTX v3;
    X509V3_set_ctx_nodb(&v3);
    X509V3_set_ctx(&v3, x, x, NULL, NULL, 0);
    X509_EXTENSION *ext = X509V3_EXT_conf_nid(NULL, &v3, nid, value);
    if (ext == NULL)
        return 0;
    int ok = X509_add_ext(x, ext, -1);
    X509_EXTENSION_free(ext);
    return ok;
}

int gw_tls_dev_cert(const char *dir, util_err *err)
{
    char cert[4096], key[4096];
    snprintf(cert, sizeof cert, "%s/cert.pem", dir);
    snprintf(key, sizeof key, "%s/key.pem", dir);
    if (pair_usable(cert, key))
        return 0;
    /* mkdir -p: the directory and any missing parents. */
    char path[4096];
    snprintf(path, sizeof path, "%s", dir);
    for (char *p = path + 1;; p++) {
        if (*p != '/' && *p != '\0')
            continue;
        char c = *p;
        *p = '\0';
        if (mkdir(path, 0700) != 0 && errno != EEXIST)
            return util_err_set(err, LLMGW_EIO, "%s: %s", path, strerror(errno));
        *p = c;
        if (c == '\0')
            break;
    }
    int rc = LLMGW_ETLS;
    EVP_PKEY *pkey = EVP_EC_gen("P-256");
    X509 *x = X509_new();
    FILE *f = NULL;
    if (pkey == NULL || x == NULL)
        goto fail;
    X509_set_version(x, 2);
    unsigned char serial[16];
    if (RAND_bytes(serial, sizeof serial) != 1)
        goto fail;
    serial[0] &= 0x7f;
    BIGNUM *bn = BN_bin2bn(serial, sizeof serial, NULL);
    BN_to_ASN1_INTEGER(bn, X509_get_serialNumber(x));
    BN_free(bn);
    X509_gmtime_adj(X509_getm_notBefore(x), -3600);
    X509_gmtime_adj(X509_getm_notAfter(x), 30L * 24 * 3600);
    X509_set_pubkey(x, pkey);
    X509_NAME *name = X509_get_subject_name(x);
    X509_NAME_add_entry_by_txt(name, "O", MBSTRING_ASC, (const unsigned char *)"llmgw dev", -1,
                               -1, 0);
    X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, (const unsigned char *)"localhost", -1,
                               -1, 0);
    X509_set_issuer_name(x, name);
    if (!add_ext(x, NID_subject_alt_name, "DNS:localhost,IP:127.0.0.1,IP:::1") ||
        !add_ext(x, NID_basic_constraints, "critical,CA:TRUE") ||
        !add_ext(x, NID_key_usage, "critical,digitalSignature,keyCertSign") ||
        !add_ext(x, NID_ext_key_usage, "serverAuth") ||
        !add_ext(x, NID_subject_key_identifier, "hash"))
        goto fail;
    if (X509_sign(x, pkey, EVP_sha256()) == 0)
        goto fail;
    mode_t old = umask(077);
    f = fopen(key, "wb");
    umask(old);
    if (f == NULL) {
        rc = util_err_set(err, LLMGW_EIO, "%s: %s", key, strerror(errno));
        goto out;
    }
    if (PEM_write_PrivateKey(f, pkey, NULL, NULL, 0, NULL, NULL) != 1 || fclose(f) != 0) {
        f = NULL;
        goto fail;
    }
    f = fopen(cert, "wb");
    if (f == NULL) {
        rc = util_err_set(err, LLMGW_EIO, "%s: %s", cert, strerror(errno));
        goto out;
    }
    if (PEM_write_X509(f, x) != 1 || fclose(f) != 0) {
        f = NULL;
        goto fail;
    }
    f = NULL;
    UTIL_LOG_INFO("tls", "wrote a self-signed development certificate to %s", cert);
    rc = 0;
    goto out;
fail:
    rc = util_err_set(err, LLMGW_ETLS, "%s: cannot create a development certificate: %s", dir,
                      ssl_reason());
out:
    if (f != NULL)
        fclose(f);
    X509_free(x);
    EVP_PKEY_free(pkey);
    return rc;
}
