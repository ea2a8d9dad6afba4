/*
 * rls_h2.h: gRPC's unary calls served over HTTP/2 with nghttp2 on one libuv
 * loop: cleartext with prior knowledge (h2c), the client's preface first,
 * or over TLS with ALPN h2 (rls_h2_server_use_tls).
 * Nothing here knows what a call means: the handler gets each call's path
 * and message and answers it, now or later. rl-rls runs one server per
 * loop, a loop per core, each listening on the same port (SO_REUSEPORT).
 *
 * Threads: a server and its calls belong to its loop's thread. Every
 * function here is called on that thread (rls_h2_listen before the loop
 * runs, or on it); none is thread-safe. Another thread hands work to the
 * loop (uv_async_send) and answers from there.
 *
 * Signals: bytes the socket does not take at once are written later by
 * libuv with write(2), which raises SIGPIPE if the peer has gone: the
 * process ignores SIGPIPE (rl's daemons do), or blocks it on the loop's
 * thread.
 */
#ifndef RL_RLS_H2_H
#define RL_RLS_H2_H

#include "log.h"
#include "rls_grpc.h"
#include "rls_tls.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

typedef struct rls_h2_server rls_h2_server;
typedef struct rls_h2_call rls_h2_call; /* one stream's unary call */

/* What a server allows; a field at 0 takes the default beside it. */
typedef struct rls_h2_limits {
    size_t max_message;              /* a request message's bytes: 4 MiB */
    uint32_t max_concurrent_streams; /* per connection, advertised: 1024 */
    uint32_t max_connections;        /* open at once; more are closed at
                                      * once: 16384 */
    uint32_t write_timeout_ms;       /* a peer that takes none of a pending
                                      * write for this long is cut off:
                                      * 10000 */
    /* gRPC's MaxConnectionAge: a connection this old (give or take 10%,
     * as grpc-go spreads them) gets a GOAWAY naming the last call it took:
     * those are answered, new calls go to a new connection, and one with
     * no call left is closed. UINT64_MAX: never. 24 h. */
    uint64_t max_connection_age_ms;
    /* MaxConnectionAgeGrace: this long after that GOAWAY, the connection
     * is closed, its calls left cancelled. UINT64_MAX: never. 1 h. */
    uint64_t max_connection_age_grace_ms;
} rls_h2_limits;

#define RLS_H2_DEFAULT_MAX_MESSAGE (4u << 20)
#define RLS_H2_DEFAULT_MAX_STREAMS 1024u
#define RLS_H2_DEFAULT_MAX_CONNECTIONS 16384u
#define RLS_H2_DEFAULT_WRITE_TIMEOUT_MS 10000u
#define RLS_H2_DEFAULT_MAX_AGE_MS (24ull * 3600 * 1000)
#define RLS_H2_DEFAULT_MAX_AGE_GRACE_MS (3600ull * 1000)

typedef struct rls_h2_handler {
    /* on_call: a whole unary call (a POST of content-type
     * application/grpc*, its one message read): its :path (path_len bytes,
     * not NUL-terminated), its message, both valid only during the call,
     * and its grpc-timeout in ms (0: none, or not gRPC's grammar). The
     * handler answers with rls_h2_reply, during on_call or later on this
     * loop, exactly once, unless on_cancel comes first. An unknown path is
     * the handler's to answer (UNIMPLEMENTED). */
    void (*on_call)(void *arg, rls_h2_call *call, const char *path,
                    size_t path_len, const uint8_t *msg, size_t len,
                    uint64_t timeout_ms);
    /* on_cancel: a call on_call handed over and that was not answered has
     * ended (RST_STREAM from the client, its connection gone, the server
     * closing). The handler forgets it: call is freed when this returns
     * and must never be answered. */
    void (*on_cancel)(void *arg, rls_h2_call *call);
    void *arg;
} rls_h2_handler;

/* rls_h2_reply's results. */
#define RLS_H2_OK 0
/* The call's connection is closing: on_cancel runs for it next; nothing
 * was sent. (A reply from inside another call's on_cancel can meet it.) */
#define RLS_H2_ECANCELLED (-1)
/* No memory for the answer: the stream was reset (INTERNAL_ERROR)
 * instead; the call is over, as after RLS_H2_OK. */
#define RLS_H2_ENOMEM (-2)
/* msg NULL with len > 0, or a message of 4 GiB or more: nothing was done,
 * the call is still the handler's to answer. */
#define RLS_H2_EINVAL (-3)

/* rls_h2_reply answers a call. RLS_GRPC_OK: the message (len bytes,
 * copied; NULL with 0 for an empty one) in DATA, then trailers with
 * grpc-status 0. Another status: no message (msg is ignored), a
 * trailers-only response with grpc-status and grpc-message (text,
 * percent-encoded, cut at 1 KiB; NULL or "" for none). The call must
 * not be used after RLS_H2_OK or RLS_H2_ENOMEM. */
int rls_h2_reply(rls_h2_call *call, rls_grpc_status status,
                 const uint8_t *msg, size_t len, const char *message);

/* rls_h2_call_set_data / rls_h2_call_data: one pointer the handler keeps
 * with a call (NULL at first), for on_cancel to find its own state. */
void rls_h2_call_set_data(rls_h2_call *call, void *data);
void *rls_h2_call_data(const rls_h2_call *call);

/* rls_h2_listen listens on host:port (a name or an address; port 0: any,
 * rls_h2_server_port tells which), with SO_REUSEPORT when reuseport so
 * that several loops' servers share the port, and serves calls to h (the
 * struct is copied; arg is the caller's). limits NULL: every default.
 * The server, or NULL with the reason in err (cap bytes). */
rls_h2_server *rls_h2_listen(uv_loop_t *loop, const char *host,
                             uint16_t port, bool reuseport,
                             const rls_h2_limits *limits,
                             const rls_h2_handler *h, char *err, size_t cap);

/* rls_h2_server_use_tls: every connection it accepts from now on speaks
 * TLS with ctx (rls_tls.h; shared with other loops' servers, it outlives
 * this one) before HTTP/2. A connection TLS refuses or breaks is logged
 * to log (copied), one line for it (event=tls_handshake_failed or
 * tls_error, with peer= and reason=), and closed; no other is affected.
 * Called before the loop runs. TLS's own buffers are OpenSSL's and not in
 * the stats' bytes. */
void rls_h2_server_use_tls(rls_h2_server *s, rls_tls_ctx *ctx,
                           const rl_logger *log);

/* rls_h2_server_port: the port it listens on. */
uint16_t rls_h2_server_port(const rls_h2_server *s);

/* rls_h2_server_drain stops accepting (the listening socket is closed: a
 * new connection is refused), sends each connection a GOAWAY (NO_ERROR,
 * naming the last stream it took), lets the calls in flight be answered
 * and closes each connection once its streams are done. A connection that
 * has sent nothing yet is closed at once. Once is enough; again is a
 * no-op. */
void rls_h2_server_drain(rls_h2_server *s);

/* rls_h2_server_close closes the listener and every connection at once
 * (each unanswered call gets on_cancel, during this call), then, once
 * every handle is closed, frees the server and calls done(arg) (done may
 * be NULL). The loop must run until then. No handler callback runs after
 * this returns. May be called from a handler's callback. */
void rls_h2_server_close(rls_h2_server *s, void (*done)(void *arg),
                         void *arg);

/* What a server holds and has done, for metrics and for the tests. */
typedef struct rls_h2_stats {
    uint64_t accepted;     /* connections accepted since listen */
    uint64_t refused;      /* of those, closed at once: over
                            * max_connections */
    uint64_t stalled;      /* closed after write_timeout_ms without the
                            * peer reading */
    uint32_t connections;  /* open now */
    uint32_t sessions;     /* of those, speaking HTTP/2 (a connection has
                            * no session until its first bytes) */
    uint32_t calls;        /* streams open now */
    uint32_t waiting;      /* connections whose output waits for the peer
                            * to read (they read nothing meanwhile) */
    size_t bytes;          /* memory held now for connections, sessions
                            * (nghttp2's own) and answers; request messages
                            * being read are not counted */
} rls_h2_stats;

/* rls_h2_server_stats fills out. */
void rls_h2_server_stats(const rls_h2_server *s, rls_h2_stats *out);

#endif
