/*
 * redis_conn.c: see redis_conn.h.
 *
 * rl drives the socket itself rather than through hiredis's async context,
 * whose redisAsyncHandleRead and Write call read() and write() on the fd:
 * nothing can sit between them and the socket (TLS cannot), and its
 * connect resolves names with a blocking getaddrinfo on the loop's thread.
 * Here a numeric address is connected at once and a name is resolved on
 * libuv's thread pool.
 *
 * Output is one buffer: commands are appended to it, and a prepare handle
 * (which runs once per turn of the loop, just before the loop polls)
 * writes it to the socket, so that all the commands queued in one turn go
 * out in one write (automatic pipelining). The write is a send() at once,
 * as hiredis's write() was; only what the socket does not take
 * waits in a uv_write, and meanwhile new commands gather in a second
 * buffer, which goes the moment that write completes. Waiting for a turn
 * there, or for a completion every time, added a loop turn or two to
 * every batch: under TSan, whose loop turns can take hundreds of ms, the
 * aggregator's calls then waited past its stall limit.
 * Neither buffer shrinks: a connection's output reaches its working size
 * once and is then reused, so a command costs no allocation.
 *
 * Over TLS the session reads from and writes to memory BIOs (redis_tls.c):
 * what the socket brings is written into the session, which gives the
 * plaintext to the reader; a flush writes the turn's commands into the
 * session and sends what it makes of them. The handshake runs first, and
 * the owner hears `connected` only once it is done. A refusal the server
 * sends after the handshake (TLS 1.3 reports a client certificate refused
 * on the first read) is lost with the alert's reason.
 */
#include "redis_conn.h"

#include "resp.h"

#include <errno.h>
#include <hiredis/hiredis.h>
#include <openssl/err.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

/* Replies are small (a bucket, a SCAN page); a server that sends more than
 * this unparsed is not one rl should keep reading from. */
#define REPLY_MAX_BYTES (64u << 20)
#define READ_BYTES 65536
#define SEND_ARGS_MAX 16

typedef struct out_buf {
    char *data;
    size_t len, cap;
} out_buf;

struct rl_redis_conn {
    uv_loop_t *loop;
    const rl_redis_conn_events *ev;
    void *arg;
    rl_endpoint ep;
    uv_tcp_t tcp;
    uv_prepare_t flush;
    uv_getaddrinfo_t resolve;
    uv_connect_t connect;
    uv_write_t write;
    struct addrinfo *addrs, *next_addr; /* a name's addresses, tried in turn */
    redisReader *reader;
    rl_redis_tls *tls; /* NULL: plain TCP */
    SSL *ssl;          /* this connection's session, once TCP is up */
    bool handshaking;
    out_buf out;       /* commands not yet handed to uv_write */
    out_buf sending;   /* the write in flight */
    bool resolving;    /* a name on libuv's thread pool */
    bool tcp_open;     /* tcp initialised (closed with the connection) */
    bool up;           /* connected: out may be written */
    bool writing;
    bool write_broken; /* the peer reset: its reason comes by the read */
    bool dead;         /* lost: nothing more is sent or delivered */
    bool opening;      /* inside rl_redis_conn_open: lost waits a turn */
    bool lost_due;     /* a loss in open, to be told from the loop */
    char lost_why[RL_HOST_MAX + 200];
    bool closed;       /* the owner closed it: no callback any more */
    int refs;          /* handles and requests libuv still holds */
    char read_buf[READ_BYTES];
};

static void release(rl_redis_conn *c)
{
    if (--c->refs > 0)
        return;
    if (c->addrs != NULL)
        uv_freeaddrinfo(c->addrs);
    if (c->reader != NULL)
        redisReaderFree(c->reader);
    SSL_free(c->ssl);
    free(c->out.data);
    free(c->sending.data);
    free(c);
}

static void handle_closed(uv_handle_t *h)
{
    release(h->data);
}

static void on_flush(uv_prepare_t *p);

/* The connection is gone: said once, and only to an owner still there. */
static void fail(rl_redis_conn *c, const char *why)
{
    if (c->dead)
        return;
    c->dead = true;
    c->up = false;
    uv_prepare_stop(&c->flush);
    if (c->tcp_open)
        uv_read_stop((uv_stream_t *)&c->tcp);
    if (c->opening) {
        /* The owner does not hold the connection yet: it hears from the
         * loop's next turn (on_flush). */
        snprintf(c->lost_why, sizeof c->lost_why, "%s", why);
        c->lost_due = true;
        uv_prepare_start(&c->flush, on_flush);
    } else if (!c->closed) {
        c->ev->lost(c->arg, why);
    }
}

static void fail_uv(rl_redis_conn *c, const char *what, int status)
{
    char why[RL_HOST_MAX + 160];
    snprintf(why, sizeof why, "%s %s:%u: %s", what, c->ep.host, c->ep.port,
             uv_strerror(status));
    fail(c, why);
}

/* --- Output ------------------------------------------------------------ */

static int reserve(out_buf *b, size_t more)
{
    if (b->cap - b->len >= more)
        return 0;
    size_t cap = b->cap > 0 ? b->cap : 4096;
    while (cap - b->len < more)
        cap *= 2;
    char *data = realloc(b->data, cap);
    if (data == NULL)
        return -1;
    b->data = data;
    b->cap = cap;
    return 0;
}


static void write_sending(rl_redis_conn *c);
static void tls_send(rl_redis_conn *c);
static void flush_now(rl_redis_conn *c);

/* A peer that reset the connection has usually said why first (a TLS
 * alert, a closing error line), and the read side reports it, or the reset
 * itself: reported here, the reset would hide the reason, and a refusal
 * said once per reason would be said at every reconnect. */
static void write_failed(rl_redis_conn *c, int status)
{
    if (status == UV_ECONNRESET || status == UV_EPIPE)
        c->write_broken = true;
    else
        fail_uv(c, "writing to", status);
}

static void on_written(uv_write_t *w, int status)
{
    rl_redis_conn *c = w->data;
    c->writing = false;
    c->sending.len = 0;
    if (status < 0) {
        write_failed(c, status);
    } else if (!c->dead) {
        /* At once, not at the next turn: what gathered while the socket
         * was full has waited long enough. */
        if (c->ssl != NULL)
            tls_send(c); /* what the session made meanwhile */
        flush_now(c); /* stops at a connection tls_send lost */
    }
    release(c);
}

/* What the session has made (records, handshake messages) goes out, after
 * the write in flight. */
static void tls_send(rl_redis_conn *c)
{
    BIO *wire = SSL_get_wbio(c->ssl);
    size_t pending = BIO_ctrl_pending(wire);
    if (c->writing || c->dead || c->write_broken || pending == 0)
        return;
    if (reserve(&c->sending, pending) != 0) {
        fail(c, "out of memory writing TLS records");
        return;
    }
    int n = BIO_read(wire, c->sending.data, (int)pending);
    c->sending.len = n > 0 ? (size_t)n : 0;
    write_sending(c);
}

/* The turn's commands into the session, and out as records. */
static void tls_flush(rl_redis_conn *c)
{
    ERR_clear_error();
    int n = SSL_write(c->ssl, c->out.data, (int)c->out.len);
    if (n <= 0) {
        char why[300];
        rl_redis_tls_why(c->ssl, SSL_get_error(c->ssl, n), why, sizeof why);
        fail(c, why);
        return;
    }
    c->out.len = 0;
    tls_send(c);
}

/* Everything queued goes out, unless a write still waits for the socket
 * (its completion calls this again). */
static void flush_now(rl_redis_conn *c)
{
    if (c->writing || !c->up || c->dead || c->write_broken
        || c->out.len == 0)
        return;
    if (c->ssl != NULL) {
        tls_flush(c);
        return;
    }
    out_buf filled = c->out;
    c->out = c->sending;
    c->sending = filled;
    write_sending(c);
}

static void on_flush(uv_prepare_t *p)
{
    rl_redis_conn *c = p->data;
    uv_prepare_stop(p);
    if (c->lost_due) {
        c->lost_due = false;
        if (!c->closed)
            c->ev->lost(c->arg, c->lost_why);
        return;
    }
    flush_now(c);
}

/* send() with MSG_NOSIGNAL: a peer gone must not raise SIGPIPE in a host
 * that does not ignore it (uv_try_write's write() would). Called only
 * when no uv_write is queued, so that the bytes keep their order. */
static int try_send(rl_redis_conn *c, const char *data, size_t len)
{
    uv_os_fd_t fd;
    if (uv_fileno((const uv_handle_t *)&c->tcp, &fd) != 0)
        return UV_EBADF;
    ssize_t n = send(fd, data, len, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n >= 0)
        return (int)n;
    return errno == EAGAIN || errno == EWOULDBLOCK
               ? 0
               : uv_translate_sys_error(errno);
}

/* sending goes to the socket now, as much as it takes (send(), as
 * hiredis's write() did); only a remainder waits for writability in a
 * uv_write, whose completion sends what gathered meanwhile. */
static void write_sending(rl_redis_conn *c)
{
    int n = try_send(c, c->sending.data, c->sending.len);
    if (n < 0) {
        c->sending.len = 0;
        write_failed(c, n);
        return;
    }
    if ((size_t)n == c->sending.len) {
        c->sending.len = 0;
        return;
    }
    uv_buf_t buf = uv_buf_init(c->sending.data + n,
                               (unsigned)(c->sending.len - n));
    int rc = uv_write(&c->write, (uv_stream_t *)&c->tcp, &buf, 1,
                      on_written);
    if (rc < 0) {
        c->sending.len = 0;
        write_failed(c, rc);
        return;
    }
    c->writing = true;
    c->refs++;
}

int rl_redis_conn_command(rl_redis_conn *c, int argc,
                          const char *const *argv, const size_t *lens)
{
    if (c->dead || c->closed)
        return -1;
    size_t len = rl_resp_length(argc, lens);
    if (len > UINT32_MAX - c->out.len || reserve(&c->out, len) != 0)
        return -1;
    c->out.len += rl_resp_format(c->out.data + c->out.len, argc, argv, lens);
    if (c->up && !c->writing)
        uv_prepare_start(&c->flush, on_flush);
    return 0;
}

int rl_redis_conn_send(rl_redis_conn *c, const char *arg0, ...)
{
    const char *argv[SEND_ARGS_MAX];
    size_t lens[SEND_ARGS_MAX];
    int argc = 0;
    va_list ap;
    va_start(ap, arg0);
    for (const char *a = arg0; a != NULL; a = va_arg(ap, const char *)) {
        if (argc == SEND_ARGS_MAX) {
            va_end(ap);
            return -1;
        }
        argv[argc] = a;
        lens[argc++] = strlen(a);
    }
    va_end(ap);
    return rl_redis_conn_command(c, argc, argv, lens);
}

/* --- Input ------------------------------------------------------------- */

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    rl_redis_conn *c = h->data;
    (void)suggested;
    *buf = uv_buf_init(c->read_buf, sizeof c->read_buf);
}

/* Every whole reply in what was read goes to the owner, who may close the
 * connection from inside the call. */
static void deliver(rl_redis_conn *c, const char *bytes, size_t n)
{
    if (redisReaderFeed(c->reader, bytes, n) != REDIS_OK) {
        fail(c, "out of memory reading a reply");
        return;
    }
    while (!c->dead && !c->closed) {
        void *r = NULL;
        if (redisReaderGetReply(c->reader, &r) != REDIS_OK) {
            char why[200];
            snprintf(why, sizeof why, "a reply rl cannot read: %s",
                     c->reader->errstr);
            fail(c, why);
            return;
        }
        if (r == NULL)
            break;
        c->ev->reply(c->arg, r);
    }
    if (!c->dead && c->reader->len - c->reader->pos > REPLY_MAX_BYTES)
        fail(c, "a reply larger than 64 MiB");
}

static void became_up(rl_redis_conn *c)
{
    if (c->dead)
        return;
    c->up = true;
    c->ev->connected(c->arg);
    if (!c->dead && !c->closed && c->out.len > 0)
        uv_prepare_start(&c->flush, on_flush);
}

static void tls_failed(rl_redis_conn *c, int rc)
{
    char why[300];
    rl_redis_tls_why(c->ssl, SSL_get_error(c->ssl, rc), why, sizeof why);
    fail(c, why);
}

/* Records read from the socket: the handshake's next step, then the
 * plaintext, read out of the session a buffer at a time. */
static void tls_received(rl_redis_conn *c, const char *bytes, size_t n)
{
    if (BIO_write(SSL_get_rbio(c->ssl), bytes, (int)n) != (int)n) {
        fail(c, "out of memory reading TLS records");
        return;
    }
    ERR_clear_error();
    if (c->handshaking) {
        int rc = SSL_do_handshake(c->ssl);
        tls_send(c);
        if (c->dead)
            return;
        if (rc <= 0 && SSL_get_error(c->ssl, rc) != SSL_ERROR_WANT_READ) {
            tls_failed(c, rc);
            return;
        }
        if (rc <= 0)
            return;
        c->handshaking = false;
        became_up(c);
    }
    char plain[16384];
    while (!c->dead && !c->closed) {
        ERR_clear_error();
        int got = SSL_read(c->ssl, plain, sizeof plain);
        if (got <= 0) {
            if (SSL_get_error(c->ssl, got) != SSL_ERROR_WANT_READ)
                tls_failed(c, got);
            break;
        }
        deliver(c, plain, (size_t)got);
    }
    if (!c->dead)
        tls_send(c); /* a key update, a ticket's acknowledgement */
}

static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf)
{
    rl_redis_conn *c = s->data;
    if (n == UV_EOF)
        fail(c, c->handshaking ? "the server closed the connection during "
                                 "the TLS handshake (is its port TLS?)"
                               : "the server closed the connection");
    else if (n < 0)
        fail_uv(c, "reading from", (int)n);
    else if (n > 0 && c->ssl != NULL)
        tls_received(c, buf->base, (size_t)n);
    else if (n > 0)
        deliver(c, buf->base, (size_t)n);
}

/* TCP is up: plain, the connection is; over TLS, the handshake starts. */
static void tcp_up(rl_redis_conn *c)
{
    if (c->tls == NULL) {
        became_up(c);
        return;
    }
    c->ssl = rl_redis_tls_client(c->tls, &c->ep);
    if (c->ssl == NULL) {
        fail(c, "out of memory starting TLS");
        return;
    }
    c->handshaking = true;
    ERR_clear_error();
    int rc = SSL_do_handshake(c->ssl); /* the ClientHello */
    if (rc <= 0 && SSL_get_error(c->ssl, rc) != SSL_ERROR_WANT_READ)
        tls_failed(c, rc);
    else
        tls_send(c);
}

/* --- Connecting -------------------------------------------------------- */

static void connect_to(rl_redis_conn *c, const struct sockaddr *addr);

static void try_next_address(uv_handle_t *h)
{
    rl_redis_conn *c = h->data;
    if (!c->closed) {
        const struct sockaddr *a = c->next_addr->ai_addr;
        c->next_addr = c->next_addr->ai_next;
        connect_to(c, a);
    }
    release(c);
}

static void on_connected(uv_connect_t *req, int status)
{
    rl_redis_conn *c = req->data;
    if (status == 0 && !c->dead && !c->closed) {
        uv_tcp_nodelay(&c->tcp, 1);
        int rc = uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
        if (rc < 0)
            fail_uv(c, "reading from", rc);
        else
            tcp_up(c);
    } else if (status != UV_ECANCELED && !c->dead && !c->closed) {
        /* A name's next address, on a fresh socket once this one is
         * closed. */
        if (c->next_addr != NULL) {
            c->tcp_open = false;
            uv_close((uv_handle_t *)&c->tcp, try_next_address);
        } else {
            fail_uv(c, "connecting to", status);
        }
    }
    release(c);
}

static void connect_to(rl_redis_conn *c, const struct sockaddr *addr)
{
    int rc = uv_tcp_init(c->loop, &c->tcp);
    if (rc < 0) {
        fail_uv(c, "connecting to", rc);
        return;
    }
    c->tcp.data = c;
    c->tcp_open = true;
    c->refs++;
    rc = uv_tcp_connect(&c->connect, &c->tcp, addr, on_connected);
    if (rc < 0 && c->next_addr != NULL) {
        /* This address cannot be dialled at all (no IPv6 here, say): the
         * name's next one, on a fresh socket. */
        c->tcp_open = false;
        uv_close((uv_handle_t *)&c->tcp, try_next_address);
    } else if (rc < 0) {
        fail_uv(c, "connecting to", rc);
    } else {
        c->refs++;
    }
}

static void on_resolved(uv_getaddrinfo_t *req, int status,
                        struct addrinfo *res)
{
    rl_redis_conn *c = req->data;
    c->resolving = false;
    c->addrs = res;
    if (status < 0) {
        if (status != UV_ECANCELED)
            fail_uv(c, "resolving", status);
    } else if (!c->closed) {
        c->next_addr = res->ai_next;
        connect_to(c, res->ai_addr);
    }
    release(c);
}

static void start(rl_redis_conn *c)
{
    struct sockaddr_storage sa;
    if (uv_ip4_addr(c->ep.host, c->ep.port, (struct sockaddr_in *)&sa) == 0
        || uv_ip6_addr(c->ep.host, c->ep.port, (struct sockaddr_in6 *)&sa)
               == 0) {
        connect_to(c, (struct sockaddr *)&sa);
        return;
    }
    char port[8];
    snprintf(port, sizeof port, "%u", c->ep.port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM};
    int rc = uv_getaddrinfo(c->loop, &c->resolve, on_resolved, c->ep.host,
                            port, &hints);
    if (rc < 0) {
        fail_uv(c, "resolving", rc);
        return;
    }
    c->resolving = true;
    c->refs++;
}

rl_redis_conn *rl_redis_conn_open(uv_loop_t *loop, const rl_endpoint *ep,
                                  rl_redis_tls *tls,
                                  const rl_redis_conn_events *ev, void *arg)
{
    rl_redis_conn *c = calloc(1, sizeof *c);
    if (c == NULL)
        return NULL;
    c->reader = redisReaderCreate();
    if (c->reader == NULL) {
        free(c);
        return NULL;
    }
    c->loop = loop;
    c->tls = tls;
    c->ev = ev;
    c->arg = arg;
    c->ep = *ep;
    uv_prepare_init(loop, &c->flush);
    c->flush.data = c->resolve.data = c->connect.data = c->write.data = c;
    c->refs = 1; /* the prepare handle */
    c->opening = true;
    start(c);
    c->opening = false;
    return c;
}

bool rl_redis_conn_input_waiting(const rl_redis_conn *c)
{
    uv_os_fd_t fd;
    char byte;
    if (c == NULL || !c->tcp_open
        || uv_fileno((const uv_handle_t *)&c->tcp, &fd) != 0)
        return false;
    ssize_t n = recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    return n >= 0 || (errno != EAGAIN && errno != EWOULDBLOCK);
}

const char *rl_redis_conn_tls(const rl_redis_conn *c)
{
    if (c->ssl == NULL)
        return "none";
    return rl_redis_tls_resumed(c->ssl) ? "resumed" : "full";
}

void rl_redis_conn_close(rl_redis_conn *c)
{
    if (c == NULL || c->closed)
        return;
    c->closed = true;
    c->dead = true;
    c->up = false;
    if (c->resolving)
        uv_cancel((uv_req_t *)&c->resolve);
    if (c->tcp_open)
        uv_close((uv_handle_t *)&c->tcp, handle_closed);
    uv_close((uv_handle_t *)&c->flush, handle_closed);
}
