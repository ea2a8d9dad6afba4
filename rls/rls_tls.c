/*
 * rls_tls.c: see rls_tls.h. Each connection's SSL reads from one memory
 * BIO and writes to another; rls_h2.c moves the bytes between them and
 * the socket, so a BIO holds at most one read's ciphertext (the read
 * buffer) and one flush's (what one write gathers), and is emptied before
 * the loop turns.
 *
 * The reason of a refusal is kept per connection, because OpenSSL's error
 * queue is the thread's, shared by every connection of the loop: it is
 * cleared before each call and emptied after a failure.
 */
#include "rls_tls.h"

#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define REASON_MAX 256

/* A file's identity as stat sees it through its symlinks: a Kubernetes
 * secret volume swaps a symlink, an editor renames or rewrites. */
typedef struct stamp {
    dev_t dev;
    ino_t ino;
    off_t size;
    struct timespec mtime;
    int err;                 /* stat's errno, or 0 */
} stamp;

struct rls_tls_ctx {
    pthread_mutex_t lock;    /* ctx: replaced by a reload, read by SSL_new */
    SSL_CTX *ctx;
    rls_tls_config c;
    stamp files[3];          /* cert, key, client CA at the last load */
};

struct rls_tls {
    SSL *ssl;
    BIO *rbio, *wbio; /* the SSL's: ciphertext in, ciphertext out */
    char reason[REASON_MAX];
};

/* ---- the context ---- */

/* What OpenSSL said last, and its queue emptied. */
static const char *openssl_reason(void)
{
    unsigned long e = ERR_peek_last_error();
    const char *why = e != 0 ? ERR_reason_error_string(e) : NULL;
    ERR_clear_error();
    return why != NULL ? why : "no detail from OpenSSL";
}

/* A file we cannot open is said in the system's words, not OpenSSL's. */
static int readable(const char *var, const char *path, char *err,
                    size_t cap)
{
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        snprintf(err, cap, "%s=%s: cannot read it: %s", var, path,
                 strerror(errno));
        return -1;
    }
    fclose(f);
    return 0;
}

static int load_pair(SSL_CTX *ctx, const rls_tls_config *c, char *err,
                     size_t cap)
{
    static const char *const needs =
        "GRPC_SERVER_USE_TLS=true needs %s: the file of the server's %s "
        "(PEM)";
    if (c->cert == NULL || c->cert[0] == '\0') {
        snprintf(err, cap, needs, "GRPC_SERVER_TLS_CERT",
                 "certificate chain");
        return -1;
    }
    if (c->key == NULL || c->key[0] == '\0') {
        snprintf(err, cap, needs, "GRPC_SERVER_TLS_KEY", "private key");
        return -1;
    }
    if (readable("GRPC_SERVER_TLS_CERT", c->cert, err, cap) != 0
        || readable("GRPC_SERVER_TLS_KEY", c->key, err, cap) != 0)
        return -1;
    if (SSL_CTX_use_certificate_chain_file(ctx, c->cert) != 1) {
        snprintf(err, cap, "GRPC_SERVER_TLS_CERT=%s: no certificate chain "
                 "in it: %s", c->cert, openssl_reason());
        return -1;
    }
    /* A key of the certificate's type is checked against it as it
     * loads; one of another type, by SSL_CTX_check_private_key. */
    bool loaded = SSL_CTX_use_PrivateKey_file(ctx, c->key,
                                              SSL_FILETYPE_PEM) == 1;
    if (!loaded && ERR_GET_REASON(ERR_peek_last_error())
                       != X509_R_KEY_VALUES_MISMATCH) {
        snprintf(err, cap, "GRPC_SERVER_TLS_KEY=%s: no private key in it: "
                 "%s", c->key, openssl_reason());
        return -1;
    }
    if (!loaded || SSL_CTX_check_private_key(ctx) != 1) {
        snprintf(err, cap, "GRPC_SERVER_TLS_KEY=%s is not the key of "
                 "GRPC_SERVER_TLS_CERT=%s: %s", c->key, c->cert,
                 openssl_reason());
        return -1;
    }
    return 0;
}

/* Go's VerifyHostname, as upstream checks the SAN: an address is matched
 * against the IP SANs, anything else against the DNS SANs (a wildcard
 * only as a whole first label), never against the subject's CN. */
static int want_san(SSL_CTX *ctx, const char *san, char *err, size_t cap)
{
    X509_VERIFY_PARAM *p = SSL_CTX_get0_param(ctx);
    unsigned int flags = X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS
                         | X509_CHECK_FLAG_NEVER_CHECK_SUBJECT;
    X509_VERIFY_PARAM_set_hostflags(p, flags);
    unsigned char addr[16];
    bool ip = inet_pton(AF_INET, san, addr) == 1
              || inet_pton(AF_INET6, san, addr) == 1;
    int ok = ip ? X509_VERIFY_PARAM_set1_ip_asc(p, san)
                : X509_VERIFY_PARAM_set1_host(p, san, 0);
    if (ok != 1) {
        snprintf(err, cap, "GRPC_CLIENT_TLS_SAN=%s: not a name or an "
                 "address a certificate can carry", san);
        ERR_clear_error();
        return -1;
    }
    return 0;
}

/* Client certificates: required, and checked against this CA alone
 * (upstream's pool adds the system's roots, which would let any public
 * CA's customer in). */
static int want_clients(SSL_CTX *ctx, const rls_tls_config *c, char *err,
                        size_t cap)
{
    if (readable("GRPC_CLIENT_TLS_CACERT", c->client_ca, err, cap) != 0)
        return -1;
    STACK_OF(X509_NAME) *names = SSL_load_client_CA_file(c->client_ca);
    if (names == NULL
        || SSL_CTX_load_verify_locations(ctx, c->client_ca, NULL) != 1) {
        sk_X509_NAME_pop_free(names, X509_NAME_free);
        snprintf(err, cap, "GRPC_CLIENT_TLS_CACERT=%s: no CA certificate "
                 "in it: %s", c->client_ca, openssl_reason());
        return -1;
    }
    /* The CAs' names tell a client which of its certificates to send. */
    SSL_CTX_set_client_CA_list(ctx, names);
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER
                                | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, NULL);
    if (c->client_san != NULL && c->client_san[0] != '\0')
        return want_san(ctx, c->client_san, err, cap);
    return 0;
}

static void refuse(SSL *ssl, const char *why)
{
    rls_tls *t = SSL_get_app_data(ssl);
    snprintf(t->reason, sizeof t->reason, "%s", why);
}

/* A client that offers no ALPN at all is refused here; one that offers
 * others but not h2, by on_alpn. */
static int on_client_hello(SSL *ssl, int *alert, void *arg)
{
    (void)arg;
    const unsigned char *ext;
    size_t len;
    int alpn = TLSEXT_TYPE_application_layer_protocol_negotiation;
    if (SSL_client_hello_get0_ext(ssl, (unsigned int)alpn, &ext, &len) == 1)
        return SSL_CLIENT_HELLO_SUCCESS;
    refuse(ssl, "the client offered no ALPN protocol: h2 is required");
    *alert = SSL_AD_NO_APPLICATION_PROTOCOL;
    return SSL_CLIENT_HELLO_ERROR;
}

static int on_alpn(SSL *ssl, const unsigned char **out, unsigned char *outlen,
                   const unsigned char *in, unsigned int inlen, void *arg)
{
    (void)arg;
    for (unsigned int i = 0; i < inlen; i += 1u + in[i]) {
        unsigned int n = in[i];
        if (n == 2 && i + 3 <= inlen && memcmp(in + i + 1, "h2", 2) == 0) {
            *out = in + i + 1;
            *outlen = 2;
            return SSL_TLSEXT_ERR_OK;
        }
    }
    refuse(ssl, "the client offered ALPN protocols but not h2");
    return SSL_TLSEXT_ERR_ALERT_FATAL;
}

/* A context from the files: the SSL_CTX, or NULL with err. */
static SSL_CTX *build(const rls_tls_config *c, char *err, size_t cap)
{
    ERR_clear_error();
    SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
    if (ctx == NULL) {
        snprintf(err, cap, "cannot make a TLS context: %s",
                 openssl_reason());
        return NULL;
    }
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    /* HTTP/2 over TLS forbids renegotiation and compression (RFC 9113,
     * 9.2.1); idle connections give their record buffers back. */
    SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION
                                 | SSL_OP_NO_COMPRESSION);
    SSL_CTX_set_mode(ctx, SSL_MODE_RELEASE_BUFFERS);
    SSL_CTX_set_client_hello_cb(ctx, on_client_hello, NULL);
    SSL_CTX_set_alpn_select_cb(ctx, on_alpn, NULL);
    if (load_pair(ctx, c, err, cap) != 0
        || (c->client_ca != NULL && c->client_ca[0] != '\0'
            && want_clients(ctx, c, err, cap) != 0)) {
        SSL_CTX_free(ctx);
        return NULL;
    }
    return ctx;
}

static void stamp_of(const char *path, stamp *out)
{
    struct stat st;
    *out = (stamp){0};
    if (path == NULL || path[0] == '\0')
        return;
    if (stat(path, &st) != 0) {
        out->err = errno;
        return;
    }
    *out = (stamp){.dev = st.st_dev, .ino = st.st_ino, .size = st.st_size,
                   .mtime = st.st_mtim};
}

static void stamps_of(const rls_tls_config *c, stamp out[3])
{
    stamp_of(c->cert, &out[0]);
    stamp_of(c->key, &out[1]);
    stamp_of(c->client_ca, &out[2]);
}

rls_tls_ctx *rls_tls_ctx_new(const rls_tls_config *c, char *err, size_t cap)
{
    rls_tls_ctx *t = calloc(1, sizeof *t);
    if (t == NULL) {
        snprintf(err, cap, "no memory for TLS");
        return NULL;
    }
    stamps_of(c, t->files);
    if ((t->ctx = build(c, err, cap)) == NULL) {
        free(t);
        return NULL;
    }
    t->c = *c;
    pthread_mutex_init(&t->lock, NULL);
    return t;
}

bool rls_tls_ctx_changed(const rls_tls_ctx *ctx)
{
    stamp now[3];
    stamps_of(&ctx->c, now);
    for (int i = 0; i < 3; i++) {
        const stamp *a = &now[i], *b = &ctx->files[i];
        if (a->err != b->err || a->dev != b->dev || a->ino != b->ino
            || a->size != b->size || a->mtime.tv_sec != b->mtime.tv_sec
            || a->mtime.tv_nsec != b->mtime.tv_nsec)
            return true;
    }
    return false;
}

int rls_tls_ctx_reload(rls_tls_ctx *ctx, char *err, size_t cap)
{
    /* Stamped first: a file replaced while it is read is read again at
     * the next look. A refused one is not, until it changes. */
    stamps_of(&ctx->c, ctx->files);
    SSL_CTX *fresh = build(&ctx->c, err, cap);
    if (fresh == NULL)
        return -1;
    pthread_mutex_lock(&ctx->lock);
    SSL_CTX *old = ctx->ctx;
    ctx->ctx = fresh;
    pthread_mutex_unlock(&ctx->lock);
    /* Each connection's SSL holds a reference: the old context goes with
     * the last connection made with it. */
    SSL_CTX_free(old);
    return 0;
}

void rls_tls_ctx_free(rls_tls_ctx *ctx)
{
    if (ctx == NULL)
        return;
    SSL_CTX_free(ctx->ctx);
    pthread_mutex_destroy(&ctx->lock);
    free(ctx);
}

/* ---- a connection ---- */

rls_tls *rls_tls_new(rls_tls_ctx *ctx)
{
    rls_tls *t = calloc(1, sizeof *t);
    if (t == NULL)
        return NULL;
    pthread_mutex_lock(&ctx->lock);
    t->ssl = SSL_new(ctx->ctx);
    pthread_mutex_unlock(&ctx->lock);
    t->rbio = BIO_new(BIO_s_mem());
    t->wbio = BIO_new(BIO_s_mem());
    if (t->ssl == NULL || t->rbio == NULL || t->wbio == NULL) {
        BIO_free(t->rbio);
        BIO_free(t->wbio);
        SSL_free(t->ssl);
        free(t);
        ERR_clear_error();
        return NULL;
    }
    SSL_set_bio(t->ssl, t->rbio, t->wbio);
    SSL_set_accept_state(t->ssl);
    SSL_set_app_data(t->ssl, t);
    return t;
}

void rls_tls_free(rls_tls *t)
{
    if (t == NULL)
        return;
    SSL_free(t->ssl); /* and its BIOs */
    free(t);
}

/* Why the call failed: a callback's reason if it gave one, else
 * OpenSSL's, with the certificate check's words when that failed. */
static void take_reason(rls_tls *t, int ssl_error)
{
    if (t->reason[0] != '\0') {
        ERR_clear_error();
        return;
    }
    unsigned long e = ERR_peek_error();
    const char *why = e != 0 ? ERR_reason_error_string(e) : NULL;
    long verify = SSL_get_verify_result(t->ssl);
    if (verify != X509_V_OK)
        snprintf(t->reason, sizeof t->reason, "%s: %s",
                 why != NULL ? why : "certificate verify failed",
                 X509_verify_cert_error_string(verify));
    else if (why != NULL)
        snprintf(t->reason, sizeof t->reason, "%s", why);
    else
        snprintf(t->reason, sizeof t->reason, "TLS error %d", ssl_error);
    ERR_clear_error();
}

int rls_tls_in(rls_tls *t, const uint8_t *data, size_t len, uint8_t *buf,
               size_t cap, rls_tls_deliver deliver, void *arg)
{
    ERR_clear_error();
    if (len > INT_MAX || BIO_write(t->rbio, data, (int)len) != (int)len) {
        snprintf(t->reason, sizeof t->reason, "no memory for TLS input");
        return SSL_is_init_finished(t->ssl) ? RLS_TLS_EPROTO
                                            : RLS_TLS_EHANDSHAKE;
    }
    if (!SSL_is_init_finished(t->ssl)) {
        int rc = SSL_do_handshake(t->ssl);
        if (rc != 1) {
            int e = SSL_get_error(t->ssl, rc);
            if (e == SSL_ERROR_WANT_READ)
                return RLS_TLS_OK;
            take_reason(t, e);
            return RLS_TLS_EHANDSHAKE;
        }
    }
    int chunk = cap > INT_MAX ? INT_MAX : (int)cap;
    for (;;) {
        int n = SSL_read(t->ssl, buf, chunk);
        if (n > 0) {
            if (deliver(arg, buf, (size_t)n) != 0)
                return RLS_TLS_OK;
            continue;
        }
        int e = SSL_get_error(t->ssl, n);
        if (e == SSL_ERROR_WANT_READ)
            return RLS_TLS_OK;
        if (e == SSL_ERROR_ZERO_RETURN)
            return RLS_TLS_EOF;
        take_reason(t, e);
        return RLS_TLS_EPROTO;
    }
}

int rls_tls_out(rls_tls *t, const uint8_t *data, size_t len)
{
    ERR_clear_error();
    while (len > 0) {
        int n = SSL_write(t->ssl, data, len > INT_MAX ? INT_MAX : (int)len);
        if (n <= 0) {
            take_reason(t, SSL_get_error(t->ssl, n));
            return -1;
        }
        data += n;
        len -= (size_t)n;
    }
    return 0;
}

size_t rls_tls_pending(const rls_tls *t)
{
    return BIO_ctrl_pending(t->wbio);
}

size_t rls_tls_take(rls_tls *t, uint8_t *buf, size_t cap)
{
    int n = BIO_read(t->wbio, buf, cap > INT_MAX ? INT_MAX : (int)cap);
    return n > 0 ? (size_t)n : 0;
}

const char *rls_tls_reason(const rls_tls *t)
{
    return t->reason[0] != '\0' ? t->reason : "no reason given";
}
