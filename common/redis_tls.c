/*
 * redis_tls.c: see redis_tls.h.
 *
 * verify: full checks the chain against the CA and the server's name or
 * IP address against its certificate (X509_VERIFY_PARAM_set1_host or
 * _ip_asc); ca checks the chain only, for services whose certificates
 * name a host the client does not dial (a cluster's nodes by address);
 * none checks nothing and is for tests. Without ca or ca_dir the system's
 * trust store is used, as managed services' public certificates need.
 *
 * Sessions: TLS 1.3 sends its tickets after the handshake, so they are
 * taken from the new-session callback, one per server (host and port),
 * and offered on the next connection to it.
 */
#include "redis_tls.h"

#include <arpa/inet.h>
#include <errno.h>
#include <openssl/err.h>
#include <openssl/x509v3.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SESSIONS_MAX 64

typedef struct kept_session {
    rl_endpoint ep;
    SSL_SESSION *session;
} kept_session;

struct rl_redis_tls {
    SSL_CTX *ctx;
    rl_tls_verify verify;
    char server_name[256];
    pthread_mutex_t lock; /* over sessions */
    kept_session sessions[SESSIONS_MAX];
    size_t n_sessions, next_evicted;
};

static int endpoint_index = -1;
static pthread_once_t index_once = PTHREAD_ONCE_INIT;

static void make_index(void)
{
    endpoint_index = SSL_get_ex_new_index(0, NULL, NULL, NULL, NULL);
}

static bool same_endpoint(const rl_endpoint *a, const rl_endpoint *b)
{
    return a->port == b->port && strcmp(a->host, b->host) == 0;
}

/* Keeps a copy of sess as the one to resume with ep. A copy: sess is
 * the connection's own session, which OpenSSL marks not resumable when the
 * connection ends without a TLS close (a server that restarts, a CLIENT
 * KILL), the usual way a connection to Redis ends. */
static int on_new_session(SSL *ssl, SSL_SESSION *sess)
{
    rl_redis_tls *t = SSL_CTX_get_app_data(SSL_get_SSL_CTX(ssl));
    const rl_endpoint *ep = SSL_get_ex_data(ssl, endpoint_index);
    SSL_SESSION *copy = t != NULL && ep != NULL ? SSL_SESSION_dup(sess)
                                                : NULL;
    if (copy == NULL)
        return 0;
    pthread_mutex_lock(&t->lock);
    kept_session *k = NULL;
    for (size_t i = 0; i < t->n_sessions && k == NULL; i++) {
        if (same_endpoint(&t->sessions[i].ep, ep))
            k = &t->sessions[i];
    }
    if (k == NULL && t->n_sessions < SESSIONS_MAX)
        k = &t->sessions[t->n_sessions++];
    if (k == NULL)
        k = &t->sessions[t->next_evicted++ % SESSIONS_MAX];
    if (k->session != NULL)
        SSL_SESSION_free(k->session);
    k->ep = *ep;
    k->session = copy;
    pthread_mutex_unlock(&t->lock);
    return 0;
}

/* The last OpenSSL error's reason, or what the system said. */
static const char *openssl_reason(void)
{
    unsigned long e = ERR_peek_last_error();
    const char *r = e != 0 ? ERR_reason_error_string(e) : NULL;
    return r != NULL ? r : errno != 0 ? strerror(errno) : "unknown error";
}

static int load_files(rl_redis_tls *t, const rl_store_tls_config *cfg,
                      const char *where, char *err, size_t errlen)
{
    const char *ca = cfg->ca[0] != '\0' ? cfg->ca : NULL;
    const char *dir = cfg->ca_dir[0] != '\0' ? cfg->ca_dir : NULL;
    errno = 0;
    ERR_clear_error();
    if ((ca != NULL || dir != NULL)
        && SSL_CTX_load_verify_locations(t->ctx, ca, dir) != 1) {
        snprintf(err, errlen, "%s.%s: cannot read '%s': %s", where,
                 ca != NULL ? "ca" : "ca_dir", ca != NULL ? ca : dir,
                 openssl_reason());
        return -1;
    }
    if (ca == NULL && dir == NULL
        && SSL_CTX_set_default_verify_paths(t->ctx) != 1) {
        snprintf(err, errlen, "%s: the system's trust store cannot be read "
                 "(%s): give ca or ca_dir", where, openssl_reason());
        return -1;
    }
    if (cfg->cert[0] == '\0')
        return 0;
    errno = 0;
    ERR_clear_error();
    if (SSL_CTX_use_certificate_chain_file(t->ctx, cfg->cert) != 1) {
        snprintf(err, errlen, "%s.cert: cannot read '%s': %s", where,
                 cfg->cert, openssl_reason());
        return -1;
    }
    errno = 0;
    ERR_clear_error();
    if (SSL_CTX_use_PrivateKey_file(t->ctx, cfg->key, SSL_FILETYPE_PEM) != 1
        && ERR_GET_REASON(ERR_peek_last_error())
               != X509_R_KEY_VALUES_MISMATCH) {
        snprintf(err, errlen, "%s.key: cannot read '%s': %s", where,
                 cfg->key, openssl_reason());
        return -1;
    }
    if (SSL_CTX_check_private_key(t->ctx) != 1) {
        snprintf(err, errlen, "%s.key: '%s' is not the key of %s.cert",
                 where, cfg->key, where);
        return -1;
    }
    return 0;
}

rl_redis_tls *rl_redis_tls_new(const rl_store_tls_config *cfg,
                               const char *where, char *err, size_t errlen)
{
    pthread_once(&index_once, make_index);
    rl_redis_tls *t = calloc(1, sizeof *t);
    if (t == NULL || (t->ctx = SSL_CTX_new(TLS_client_method())) == NULL) {
        snprintf(err, errlen, "%s: out of memory", where);
        free(t);
        return NULL;
    }
    pthread_mutex_init(&t->lock, NULL);
    t->verify = cfg->verify;
    snprintf(t->server_name, sizeof t->server_name, "%s", cfg->server_name);
    SSL_CTX_set_app_data(t->ctx, t);
    SSL_CTX_set_min_proto_version(t->ctx, TLS1_2_VERSION);
    SSL_CTX_set_verify(t->ctx, cfg->verify == RL_TLS_VERIFY_NONE
                                   ? SSL_VERIFY_NONE : SSL_VERIFY_PEER,
                       NULL);
    SSL_CTX_set_session_cache_mode(t->ctx, SSL_SESS_CACHE_CLIENT
                                               | SSL_SESS_CACHE_NO_INTERNAL);
    SSL_CTX_sess_set_new_cb(t->ctx, on_new_session);
    if (load_files(t, cfg, where, err, errlen) != 0) {
        rl_redis_tls_free(t);
        return NULL;
    }
    return t;
}

static bool is_ip(const char *host)
{
    unsigned char buf[sizeof(struct in6_addr)];
    return inet_pton(AF_INET, host, buf) == 1
           || inet_pton(AF_INET6, host, buf) == 1;
}

/* SNI for a name (never an address, RFC 6066), and the name or address
 * the certificate must show under verify: full. */
static int set_names(const rl_redis_tls *t, SSL *ssl, const char *name)
{
    bool ip = is_ip(name);
    if (!ip && SSL_set_tlsext_host_name(ssl, name) != 1)
        return -1;
    if (t->verify != RL_TLS_VERIFY_FULL)
        return 0;
    X509_VERIFY_PARAM *p = SSL_get0_param(ssl);
    return (ip ? X509_VERIFY_PARAM_set1_ip_asc(p, name)
               : X509_VERIFY_PARAM_set1_host(p, name, 0))
                   == 1
               ? 0
               : -1;
}

SSL *rl_redis_tls_client(rl_redis_tls *t, const rl_endpoint *ep)
{
    SSL *ssl = SSL_new(t->ctx);
    BIO *in = BIO_new(BIO_s_mem()), *out = BIO_new(BIO_s_mem());
    if (ssl == NULL || in == NULL || out == NULL) {
        SSL_free(ssl);
        BIO_free(in);
        BIO_free(out);
        return NULL;
    }
    SSL_set_bio(ssl, in, out);
    SSL_set_connect_state(ssl);
    SSL_set_ex_data(ssl, endpoint_index, (void *)ep);
    if (set_names(t, ssl, t->server_name[0] != '\0' ? t->server_name
                                                    : ep->host)
        != 0) {
        SSL_free(ssl);
        return NULL;
    }
    /* A copy again: a resumed TLS 1.2 session brings no new one, and the
     * one offered is marked not resumable when this connection ends
     * without a TLS close. */
    pthread_mutex_lock(&t->lock);
    for (size_t i = 0; i < t->n_sessions; i++) {
        SSL_SESSION *copy = same_endpoint(&t->sessions[i].ep, ep)
                                    && t->sessions[i].session != NULL
                                ? SSL_SESSION_dup(t->sessions[i].session)
                                : NULL;
        if (copy != NULL) {
            SSL_set_session(ssl, copy);
            SSL_SESSION_free(copy);
        }
    }
    pthread_mutex_unlock(&t->lock);
    return ssl;
}

void rl_redis_tls_why(const SSL *ssl, int err, char *out, size_t cap)
{
    const rl_redis_tls *t = SSL_CTX_get_app_data(SSL_get_SSL_CTX(ssl));
    /* Under verify: none OpenSSL still notes what it would have refused. */
    long verified = t != NULL && t->verify == RL_TLS_VERIFY_NONE
                        ? X509_V_OK
                        : SSL_get_verify_result(ssl);
    if (verified != X509_V_OK) {
        snprintf(out, cap, "TLS: the server's certificate was refused: %s "
                 "(check store.tls: ca, server_name, verify)",
                 X509_verify_cert_error_string(verified));
        return;
    }
    unsigned long e = ERR_peek_last_error();
    const char *reason = e != 0 ? ERR_reason_error_string(e) : NULL;
    if (reason != NULL && strstr(reason, "alert") != NULL)
        snprintf(out, cap, "TLS: the server refused the session: %s (a "
                 "client certificate it does not take? check store.tls: "
                 "cert, key)", reason);
    else if (reason != NULL)
        snprintf(out, cap, "TLS: %s", reason);
    else if (err == SSL_ERROR_ZERO_RETURN)
        snprintf(out, cap, "TLS: the server closed the session");
    else
        snprintf(out, cap, "TLS: handshake failed (error %d)", err);
}

int rl_redis_tls_resumed(const SSL *ssl)
{
    return SSL_session_reused(ssl);
}

void rl_redis_tls_free(rl_redis_tls *t)
{
    if (t == NULL)
        return;
    for (size_t i = 0; i < t->n_sessions; i++)
        SSL_SESSION_free(t->sessions[i].session);
    SSL_CTX_free(t->ctx);
    pthread_mutex_destroy(&t->lock);
    free(t);
}
