/*
 * rls_tls.h: gRPC over TLS for rl-rls (upstream's GRPC_SERVER_USE_TLS and
 * friends). A context is built at start from the PEM files, and built
 * again from them on a reload (rls_tls_ctx_reload: SIGHUP, or a file
 * changed), which new connections take and old ones ignore; each
 * connection gets a TLS state that sits between its socket and its
 * HTTP/2 session through memory BIOs: ciphertext read from the socket goes
 * in and comes out as plaintext for nghttp2, the session's bytes go in and
 * come out as ciphertext for the socket. Nothing here touches a socket,
 * so the connection keeps its own backpressure (rls_h2.c).
 *
 * What a handshake demands: TLS 1.2 or later; ALPN with h2 (a client that
 * offers no ALPN, or not h2, is refused with the no_application_protocol
 * alert, as grpc-go does); with a client CA, a client certificate that
 * chains to it (only to it: not to the system's roots), for client
 * authentication; with a SAN, a certificate that names it among its DNS
 * or IP subject alternative names (Go's VerifyHostname, which upstream
 * uses: the subject's CN is not looked at).
 *
 * Threads: a context is used by every loop at once (OpenSSL's SSL_CTX is
 * safe for that once built, and is never changed after: a reload swaps
 * in a new one under a lock); a reload and rls_tls_ctx_changed are
 * called from one thread; a connection's state belongs to its loop's
 * thread.
 */
#ifndef RL_RLS_TLS_H
#define RL_RLS_TLS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct rls_tls_config {
    const char *cert;       /* GRPC_SERVER_TLS_CERT: the chain, PEM */
    const char *key;        /* GRPC_SERVER_TLS_KEY: its key, PEM */
    const char *client_ca;  /* GRPC_CLIENT_TLS_CACERT; NULL or "": no
                             * client certificate is asked for */
    const char *client_san; /* GRPC_CLIENT_TLS_SAN; NULL or "": any */
} rls_tls_config;

typedef struct rls_tls_ctx rls_tls_ctx;
typedef struct rls_tls rls_tls;

/* rls_tls_ctx_new loads the files and checks that the key is the
 * certificate's: the context, or NULL with err naming the variable, its
 * file and what is wrong. c is copied; its strings must outlive the
 * context. */
rls_tls_ctx *rls_tls_ctx_new(const rls_tls_config *c, char *err,
                             size_t cap);

/* rls_tls_ctx_reload reads the files again, as rls_tls_ctx_new: 0, and
 * connections from now on use them; or -1 with err (as _new's, OpenSSL's
 * reason in it), and the context is as it was. */
int rls_tls_ctx_reload(rls_tls_ctx *ctx, char *err, size_t cap);

/* rls_tls_ctx_changed: whether a file is not the one last loaded (or
 * refused), by stat: another inode, size or modification time. */
bool rls_tls_ctx_changed(const rls_tls_ctx *ctx);

/* rls_tls_ctx_free: after every connection's state is freed. NULL: a
 * no-op. */
void rls_tls_ctx_free(rls_tls_ctx *ctx);

/* rls_tls_new: a server side state for one connection, or NULL without
 * memory. rls_tls_free(NULL) is a no-op. */
rls_tls *rls_tls_new(rls_tls_ctx *ctx);
void rls_tls_free(rls_tls *t);

/* Where rls_tls_in hands plaintext: 0 to go on, nonzero to stop (the
 * connection is closing). */
typedef int (*rls_tls_deliver)(void *arg, const uint8_t *data, size_t len);

/* rls_tls_in's results. */
#define RLS_TLS_OK 0
#define RLS_TLS_EOF (-1)       /* the peer's close_notify */
#define RLS_TLS_EHANDSHAKE (-2) /* refused during the handshake */
#define RLS_TLS_EPROTO (-3)    /* a TLS error after it */

/* rls_tls_in takes len bytes of ciphertext, goes on with the handshake
 * and hands every byte of plaintext it yields to deliver (in pieces of at
 * most cap bytes, through buf), until it has none or deliver says stop.
 * What the peer must get next (handshake messages, an alert) waits for
 * rls_tls_take. An error's reason: rls_tls_reason. */
int rls_tls_in(rls_tls *t, const uint8_t *data, size_t len, uint8_t *buf,
               size_t cap, rls_tls_deliver deliver, void *arg);

/* rls_tls_out encrypts len bytes of plaintext for the peer (the
 * handshake must be over): 0, or -1 (reason in rls_tls_reason). */
int rls_tls_out(rls_tls *t, const uint8_t *data, size_t len);

/* rls_tls_pending: ciphertext waiting to be sent. */
size_t rls_tls_pending(const rls_tls *t);

/* rls_tls_take moves up to cap bytes of it into buf: how many. */
size_t rls_tls_take(rls_tls *t, uint8_t *buf, size_t cap);

/* rls_tls_reason: why the last call failed, in OpenSSL's words (and the
 * certificate check's, when that is what failed). */
const char *rls_tls_reason(const rls_tls *t);

#endif
