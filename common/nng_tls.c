/*
 * nng_tls.c: see nng_tls.h. A client (agent) verifies the aggregator
 * against the CA, and presents its own certificate when it has one; a
 * server (aggregator) presents its certificate and, with client_auth:
 * required, accepts only agents whose certificate the CA signed (mutual
 * TLS). The files are read by nng (mbedTLS) when the socket starts.
 */
#include "nng_tls.h"

#include "nng_handoff.h"

#include <errno.h>
#include <nng/supplemental/tls/tls.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PEM_MAX (1u << 20)

static bool is_tls(const char *url)
{
    return strncmp(url, "tls+tcp://", 10) == 0;
}

/* A whole PEM file, NUL-terminated; NULL with a message. */
static char *read_pem(const char *path, char *err, size_t errlen)
{
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        snprintf(err, errlen, "cannot read %s: %s", path, strerror(errno));
        return NULL;
    }
    char *text = malloc(PEM_MAX + 1);
    size_t n = text != NULL ? fread(text, 1, PEM_MAX + 1, f) : 0;
    fclose(f);
    if (text == NULL || n > PEM_MAX) {
        snprintf(err, errlen, "%s is over 1 MiB", path);
        free(text);
        return NULL;
    }
    text[n] = '\0';
    return text;
}

static int own_cert(nng_tls_config *c, const rl_tls_config *tls, char *err,
                    size_t errlen)
{
    char *cert = read_pem(tls->cert, err, errlen);
    char *key = cert != NULL ? read_pem(tls->key, err, errlen) : NULL;
    int rv = key != NULL ? nng_tls_config_own_cert(c, cert, key, NULL) : -1;
    if (rv > 0)
        snprintf(err, errlen, "cannot use %s with %s: %s", tls->cert,
                 tls->key, nng_strerror(rv));
    free(cert);
    free(key);
    return rv == 0 ? 0 : -1;
}

static nng_tls_config *make_config(const rl_tls_config *tls, bool server,
                                   char *err, size_t errlen)
{
    nng_tls_config *c;
    int rv = nng_tls_config_alloc(&c, server ? NNG_TLS_MODE_SERVER
                                             : NNG_TLS_MODE_CLIENT);
    if (rv != 0) {
        snprintf(err, errlen, "TLS: %s", nng_strerror(rv));
        return NULL;
    }
    if ((rv = nng_tls_config_ca_file(c, tls->ca)) != 0) {
        snprintf(err, errlen, "cannot use the CA file %s: %s", tls->ca,
                 nng_strerror(rv));
    } else if ((server || tls->cert[0] != '\0')
               && own_cert(c, tls, err, errlen) != 0) {
        rv = -1;
    } else if (server) {
        rv = nng_tls_config_auth_mode(c, tls->require_client_cert
                                             ? NNG_TLS_AUTH_MODE_REQUIRED
                                             : NNG_TLS_AUTH_MODE_NONE);
    } else if (tls->server_name[0] != '\0') {
        rv = nng_tls_config_server_name(c, tls->server_name);
    }
    if (rv != 0) {
        if (rv > 0)
            snprintf(err, errlen, "TLS: %s", nng_strerror(rv));
        nng_tls_config_free(c);
        return NULL;
    }
    return c;
}

int rl_nng_tls_check(const rl_tls_config *tls, char *err, size_t errlen)
{
    nng_tls_config *c = make_config(tls, false, err, errlen);
    if (c == NULL)
        return -1;
    nng_tls_config_free(c);
    return 0;
}

int rl_nng_dial(nng_socket s, const char *url, const rl_tls_config *tls,
                char *err, size_t errlen)
{
    nng_dialer d;
    int rv = nng_dialer_create(&d, s, url);
    if (rv == 0 && is_tls(url)) {
        nng_tls_config *c = make_config(tls, false, err, errlen);
        if (c == NULL) {
            nng_dialer_close(d);
            return -1;
        }
        rv = nng_dialer_set_ptr(d, NNG_OPT_TLS_CONFIG, c);
        nng_tls_config_free(c); /* the dialer holds its own reference */
    }
    if (rv == 0)
        rv = nng_dialer_start(d, NNG_FLAG_NONBLOCK);
    if (rv != 0) {
        snprintf(err, errlen, "cannot dial %s: %s", url, nng_strerror(rv));
        return -1;
    }
    return 0;
}

int rl_nng_listen(nng_socket s, const char *url, const rl_tls_config *tls,
                  char *err, size_t errlen)
{
    nng_listener l;
    int rv = nng_listener_create(&l, s, url);
    if (rv == 0 && is_tls(url)) {
        nng_tls_config *c = make_config(tls, true, err, errlen);
        if (c == NULL) {
            nng_listener_close(l);
            return -1;
        }
        rv = nng_listener_set_ptr(l, NNG_OPT_TLS_CONFIG, c);
        nng_tls_config_free(c);
    }
    if (rv == 0)
        rv = nng_listener_start(l, 0);
    if (rv != 0) {
        snprintf(err, errlen, "cannot listen on %s: %s", url,
                 nng_strerror(rv));
        return -1;
    }
    return 0;
}

struct rl_nng_probe {
    nng_stream_dialer *dialer;
    nng_stream *stream;       /* connected, until reset */
    nng_aio *aio;
    bool tls;
    int timeout_ms;
    char header[8];
    void (*done)(void *arg, int result);
    void *arg;
};

/* nng thread: connected, which says enough for plain TCP; for TLS the
 * handshake is under way then, and the peer's first bytes come once it is
 * over. Or an error. */
static void probe_step(void *arg)
{
    rl_nng_probe *p = arg;
    rl_nng_handoff(p);
    int rv = nng_aio_result(p->aio);
    if (rv == 0 && p->stream == NULL && p->tls) {
        /* Read before the hand-off: nothing of p is touched after it. */
        nng_stream *stream = nng_aio_get_output(p->aio, 0);
        p->stream = stream;
        nng_iov iov = {p->header, sizeof p->header};
        nng_aio_set_iov(p->aio, 1, &iov);
        nng_aio_set_timeout(p->aio, p->timeout_ms);
        nng_aio *aio = p->aio;
        rl_nng_handoff(p);
        nng_stream_recv(stream, aio);
        return;
    }
    if (rv == 0 && p->stream == NULL)
        p->stream = nng_aio_get_output(p->aio, 0);
    p->done(p->arg, rv);
    rl_nng_handoff(p);
}

rl_nng_probe *rl_nng_probe_new(const char *url, const rl_tls_config *tls,
                               void (*done)(void *arg, int result),
                               void *arg, char *err, size_t errlen)
{
    rl_nng_probe *p = calloc(1, sizeof *p);
    if (p == NULL) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    p->done = done;
    p->arg = arg;
    p->tls = is_tls(url);
    int rv = nng_stream_dialer_alloc(&p->dialer, url);
    if (rv == 0)
        rv = nng_aio_alloc(&p->aio, probe_step, p);
    if (rv == 0 && p->tls) {
        nng_tls_config *c = make_config(tls, false, err, errlen);
        if (c == NULL) {
            rl_nng_probe_free(p);
            return NULL;
        }
        rv = nng_stream_dialer_set_ptr(p->dialer, NNG_OPT_TLS_CONFIG, c);
        nng_tls_config_free(c);
    }
    if (rv != 0) {
        snprintf(err, errlen, "cannot dial %s: %s", url, nng_strerror(rv));
        rl_nng_probe_free(p);
        return NULL;
    }
    return p;
}

void rl_nng_probe_start(rl_nng_probe *p, int timeout_ms)
{
    p->timeout_ms = timeout_ms;
    nng_aio_set_timeout(p->aio, timeout_ms);
    rl_nng_handoff(p);
    nng_stream_dialer_dial(p->dialer, p->aio);
}

void rl_nng_probe_reset(rl_nng_probe *p)
{
    if (p->stream != NULL)
        nng_stream_free(p->stream);
    p->stream = NULL;
}

void rl_nng_probe_free(rl_nng_probe *p)
{
    if (p == NULL)
        return;
    if (p->aio != NULL)
        nng_aio_stop(p->aio);
    rl_nng_handoff(p);
    rl_nng_probe_reset(p);
    if (p->dialer != NULL)
        nng_stream_dialer_free(p->dialer);
    if (p->aio != NULL)
        nng_aio_free(p->aio);
    free(p);
}

bool rl_nng_probe_tls_refused(int result)
{
    return result == NNG_EPEERAUTH || result == NNG_ECRYPTO;
}
