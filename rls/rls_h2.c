/*
 * rls_h2.c: gRPC unary calls over HTTP/2 (h2c) with nghttp2 on one libuv
 * loop. Each connection gets an nghttp2 server session when its first
 * bytes arrive, so a silent connection holds its handle and little else.
 * Bytes read go to the session (feed); what the session has to send is
 * gathered once per loop turn, from a uv_prepare, and written with one
 * send() (flush). Over TLS (rls_tls), ciphertext read goes to the
 * connection's TLS state and its plaintext to feed; what flush gathers is
 * encrypted and the ciphertext sent (ship) the same way, under the same
 * rule: nothing more is read or gathered while a write waits for the peer.
 *
 * A call belongs to its connection's list from its HEADERS to its
 * stream's close; nghttp2 frees streams without a callback when a session
 * is deleted, so the list is what finds unanswered calls to cancel.
 */
#include "rls_h2.h"

#include "rls_pool.h"
#include "rls_tls.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <nghttp2/nghttp2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* The loop reads one connection at a time and feed() consumes what it was
 * given before returning, so one read buffer serves every connection. */
#define READ_BUFFER (64 * 1024)
/* What one write gathers from a session before it goes to the socket. */
#define OUT_BUFFER (64 * 1024)
/* Plaintext out of TLS, a record's worth at most at a time. */
#define PLAIN_BUFFER (16 * 1024)
/* Request headers as SETTINGS_MAX_HEADER_LIST_SIZE counts them (name,
 * value, 32 each): gRPC suggests 8 KiB; a call over twice that is refused. */
#define MAX_HEADER_LIST (16 * 1024)
/* grpc-message, percent-encoded, NUL included. */
#define MESSAGE_TEXT_MAX 1024
#define BACKLOG 1024

typedef struct h2_conn h2_conn;

typedef enum {
    CALL_READING,   /* headers in, the message coming */
    CALL_HELD,      /* the handler's to answer */
    CALL_ANSWERED,  /* an answer (or a reset) is with nghttp2 */
    CALL_CANCELLED, /* on_cancel has run or is about to */
} call_state;

struct rls_h2_call {
    h2_conn *conn;
    rls_h2_call *prev, *next; /* the connection's calls */
    int32_t stream_id;
    call_state state;
    bool post, grpc, headers_over;
    size_t header_bytes;
    nghttp2_rcbuf *path;      /* nghttp2's own buffer, kept by reference */
    uint64_t timeout_ms;
    rls_grpc_reader reader;
    uint8_t *reply;           /* prefix and message, for read_reply */
    size_t reply_len, reply_sent;
    void *data;
};

struct h2_conn {
    uv_tcp_t tcp;
    rls_h2_server *srv;
    h2_conn *prev, *next;             /* the server's connections */
    h2_conn *prev_dirty, *next_dirty; /* the server's, to flush */
    nghttp2_session *session;         /* NULL until the first bytes */
    rls_h2_call *calls;
    uint8_t *pending;                 /* what a uv_write still sends */
    uv_write_t write_req;
    uint64_t write_since;             /* uv_now when it began */
    uint64_t born;                    /* uv_now at the accept */
    uint64_t max_age;                 /* its age, jittered */
    uint64_t aged_at;                 /* uv_now at its age's GOAWAY; 0:
                                       * none yet */
    rls_tls *tls;                     /* NULL: cleartext */
    int in_session;                   /* inside nghttp2 (its callbacks) */
    bool dirty, reading, writing, done_reading, closing, reset;
};

struct rls_h2_server {
    uv_loop_t *loop;
    uv_tcp_t listener;
    uv_prepare_t flusher;
    uv_timer_t stall;
    uv_timer_t retry;                 /* an accept that found no memory */
    uv_timer_t age;                   /* looks for connections grown old */
    uint64_t jitter;                  /* xorshift state for the ages */
    rls_h2_limits limits;
    rls_h2_handler h;
    nghttp2_session_callbacks *callbacks;
    nghttp2_option *option;
    nghttp2_mem mem;
    rls_pool pool;                    /* behind mem, for this loop */
    rls_tls_ctx *tls;                 /* NULL: cleartext (h2c) */
    rl_logger log;
    h2_conn *conns, *dirty;
    rls_h2_stats stats;
    uint16_t port;
    bool listening, draining, closing;
    int open_handles;
    void (*done)(void *arg);
    void *done_arg;
    uint8_t read_buf[READ_BUFFER];
    uint8_t out_buf[OUT_BUFFER];
    uint8_t cipher_buf[OUT_BUFFER];   /* ciphertext on its way out */
    uint8_t plain_buf[PLAIN_BUFFER];  /* plaintext on its way in */
};

static void conn_close(h2_conn *c, bool reset);
static void mark_dirty(h2_conn *c);
static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf);
static void on_read(uv_stream_t *stream, ssize_t n, const uv_buf_t *buf);
static ssize_t send_now(h2_conn *c, struct iovec *iov, int n);

/* ---- memory: nghttp2's and ours, counted per server ---- */

/* Blocks come from the server's pool (rls_pool.h): a stream's eight
 * blocks of nghttp2's, a call and its answer are taken and given back on
 * every call. */
static void *mem_malloc(size_t n, void *arg)
{
    rls_h2_server *s = arg;
    void *p = rls_pool_alloc(&s->pool, n);
    if (p != NULL)
        s->stats.bytes += n;
    return p;
}

static void mem_free(void *p, void *arg)
{
    rls_h2_server *s = arg;
    if (p == NULL)
        return;
    s->stats.bytes -= rls_pool_len(p);
    rls_pool_free(&s->pool, p);
}

static void *mem_calloc(size_t n, size_t size, void *arg)
{
    if (size != 0 && n > SIZE_MAX / size)
        return NULL;
    void *p = mem_malloc(n * size, arg);
    if (p != NULL)
        memset(p, 0, n * size);
    return p;
}

static void *mem_realloc(void *p, size_t n, void *arg)
{
    rls_h2_server *s = arg;
    size_t old = p != NULL ? rls_pool_len(p) : 0;
    void *m = rls_pool_realloc(&s->pool, p, n);
    if (m != NULL)
        s->stats.bytes = s->stats.bytes - old + n;
    return m;
}

/* ---- calls ---- */

static rls_h2_call *call_new(h2_conn *c, int32_t stream_id)
{
    rls_h2_server *s = c->srv;
    rls_h2_call *call = mem_calloc(1, sizeof *call, s);
    if (call == NULL)
        return NULL;
    call->conn = c;
    call->stream_id = stream_id;
    call->state = CALL_READING;
    rls_grpc_reader_init(&call->reader, s->limits.max_message);
    call->next = c->calls;
    if (c->calls != NULL)
        c->calls->prev = call;
    c->calls = call;
    s->stats.calls++;
    return call;
}

static void call_free(rls_h2_call *call)
{
    h2_conn *c = call->conn;
    if (call->prev != NULL)
        call->prev->next = call->next;
    else
        c->calls = call->next;
    if (call->next != NULL)
        call->next->prev = call->prev;
    rls_grpc_reader_free(&call->reader);
    if (call->path != NULL)
        nghttp2_rcbuf_decref(call->path);
    mem_free(call->reply, c->srv);
    c->srv->stats.calls--;
    mem_free(call, c->srv);
}

void rls_h2_call_set_data(rls_h2_call *call, void *data)
{
    call->data = data;
}

void *rls_h2_call_data(const rls_h2_call *call)
{
    return call->data;
}

/* ---- answers ---- */

#define NV(name, value, value_len)                                          \
    {                                                                       \
        (uint8_t *)(name), (uint8_t *)(value), sizeof(name) - 1, value_len, \
            NGHTTP2_NV_FLAG_NONE                                            \
    }
#define NV_LIT(name, value) NV(name, value, sizeof(value) - 1)

/* The answer goes to nghttp2, which copies the headers; one it cannot
 * take resets the stream instead, so that the call ends either way. */
static int submit(rls_h2_call *call, const nghttp2_nv *nva, size_t n,
                  const nghttp2_data_provider *prd)
{
    h2_conn *c = call->conn;
    call->state = CALL_ANSWERED;
    int rv = nghttp2_submit_response(c->session, call->stream_id, nva, n,
                                     prd);
    if (rv != 0)
        nghttp2_submit_rst_stream(c->session, NGHTTP2_FLAG_NONE,
                                  call->stream_id, NGHTTP2_INTERNAL_ERROR);
    mark_dirty(c);
    return rv == 0 ? RLS_H2_OK : RLS_H2_ENOMEM;
}

/* Trailers-Only: an immediate error, one HEADERS frame. */
static int answer_error(rls_h2_call *call, rls_grpc_status status,
                        const char *text)
{
    char code[16], encoded[MESSAGE_TEXT_MAX];
    int code_len = snprintf(code, sizeof code, "%d", (int)status);
    size_t len = rls_grpc_percent_encode(text != NULL ? text : "", encoded,
                                         sizeof encoded);
    nghttp2_nv nva[] = {
        NV_LIT(":status", "200"),
        NV_LIT("content-type", "application/grpc"),
        NV("grpc-status", code, (size_t)code_len),
        NV("grpc-message", encoded, len),
    };
    return submit(call, nva, len > 0 ? 4 : 3, NULL);
}

/* Not a gRPC call at all: plain HTTP's answer, so that no HTTP client
 * reads a gRPC error's 200 as a success (PROTOCOL-HTTP2.md). */
static void answer_http(rls_h2_call *call, bool method)
{
    nghttp2_nv nva[] = {NV_LIT(":status", "405"), NV_LIT("allow", "POST")};
    if (!method)
        nva[0] = (nghttp2_nv)NV_LIT(":status", "415");
    submit(call, nva, method ? 2 : 1, NULL);
}

/* The data source of an OK answer: the message, then the trailers, which
 * nghttp2 takes only from here (NO_END_STREAM with EOF). */
static ssize_t read_reply(nghttp2_session *session, int32_t stream_id,
                          uint8_t *buf, size_t length, uint32_t *flags,
                          nghttp2_data_source *source, void *user)
{
    rls_h2_call *call = source->ptr;
    (void)user;
    size_t n = call->reply_len - call->reply_sent;
    if (n > length)
        n = length;
    memcpy(buf, call->reply + call->reply_sent, n);
    call->reply_sent += n;
    if (call->reply_sent < call->reply_len)
        return (ssize_t)n;
    *flags |= NGHTTP2_DATA_FLAG_EOF | NGHTTP2_DATA_FLAG_NO_END_STREAM;
    nghttp2_nv trailer[] = {NV_LIT("grpc-status", "0")};
    if (nghttp2_submit_trailer(session, stream_id, trailer, 1) != 0)
        return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
    mem_free(call->reply, call->conn->srv);
    call->reply = NULL;
    return (ssize_t)n;
}

int rls_h2_reply(rls_h2_call *call, rls_grpc_status status,
                 const uint8_t *msg, size_t len, const char *message)
{
    if (call->state == CALL_CANCELLED)
        return RLS_H2_ECANCELLED;
    if (call->state != CALL_HELD)
        return RLS_H2_EINVAL;
    if (status != RLS_GRPC_OK)
        return answer_error(call, status, message);
    if ((msg == NULL && len > 0) || len > UINT32_MAX)
        return RLS_H2_EINVAL;
    call->reply = mem_malloc(len + 5, call->conn->srv);
    if (call->reply == NULL) {
        call->state = CALL_ANSWERED;
        nghttp2_submit_rst_stream(call->conn->session, NGHTTP2_FLAG_NONE,
                                  call->stream_id, NGHTTP2_INTERNAL_ERROR);
        mark_dirty(call->conn);
        return RLS_H2_ENOMEM;
    }
    rls_grpc_prefix(call->reply, (uint32_t)len);
    if (len > 0)
        memcpy(call->reply + 5, msg, len);
    call->reply_len = len + 5;
    nghttp2_nv nva[] = {
        NV_LIT(":status", "200"),
        NV_LIT("content-type", "application/grpc"),
    };
    nghttp2_data_provider prd = {.source.ptr = call,
                                 .read_callback = read_reply};
    return submit(call, nva, 2, &prd);
}

/* ---- requests: nghttp2's callbacks ---- */

static bool is(nghttp2_vec v, const char *s, size_t len)
{
    return v.len == len && memcmp(v.base, s, len) == 0;
}

#define IS(v, lit) is(v, lit, sizeof(lit) - 1)

static rls_h2_call *call_of(nghttp2_session *session, int32_t stream_id)
{
    return nghttp2_session_get_stream_user_data(session, stream_id);
}

static int on_begin_headers(nghttp2_session *session,
                            const nghttp2_frame *frame, void *user)
{
    h2_conn *c = user;
    if (c->closing)
        return NGHTTP2_ERR_CALLBACK_FAILURE;
    if (frame->hd.type != NGHTTP2_HEADERS
        || frame->headers.cat != NGHTTP2_HCAT_REQUEST)
        return 0;
    rls_h2_call *call = call_new(c, frame->hd.stream_id);
    /* Without memory for it the stream is reset; the others go on. */
    if (call == NULL)
        return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
    nghttp2_session_set_stream_user_data(session, frame->hd.stream_id, call);
    return 0;
}

static void take_timeout(rls_h2_call *call, nghttp2_vec v)
{
    uint64_t ms;
    call->timeout_ms = rls_grpc_timeout_ms((const char *)v.base, v.len, &ms)
                               == 0
                           ? ms
                           : 0;
}

static int on_header(nghttp2_session *session, const nghttp2_frame *frame,
                     nghttp2_rcbuf *name, nghttp2_rcbuf *value,
                     uint8_t flags, void *user)
{
    h2_conn *c = user;
    (void)flags;
    if (c->closing)
        return NGHTTP2_ERR_CALLBACK_FAILURE;
    /* Trailers from a client mean nothing to a unary call. */
    if (frame->hd.type != NGHTTP2_HEADERS
        || frame->headers.cat != NGHTTP2_HCAT_REQUEST)
        return 0;
    rls_h2_call *call = call_of(session, frame->hd.stream_id);
    if (call == NULL || call->headers_over)
        return 0;
    nghttp2_vec n = nghttp2_rcbuf_get_buf(name);
    nghttp2_vec v = nghttp2_rcbuf_get_buf(value);
    call->header_bytes += n.len + v.len + 32;
    if (call->header_bytes > MAX_HEADER_LIST) {
        call->headers_over = true;
    } else if (IS(n, ":path")) {
        if (call->path != NULL)
            nghttp2_rcbuf_decref(call->path);
        nghttp2_rcbuf_incref(value);
        call->path = value;
    } else if (IS(n, ":method")) {
        call->post = IS(v, "POST");
    } else if (IS(n, "content-type")) {
        call->grpc = v.len >= 16 && memcmp(v.base, "application/grpc", 16)
                                        == 0;
    } else if (IS(n, "grpc-timeout")) {
        take_timeout(call, v);
    }
    return 0;
}

/* The request's headers are in: is it a gRPC call we read? */
static bool check_request(rls_h2_call *call)
{
    if (!call->post) {
        answer_http(call, true);
        return false;
    }
    if (!call->grpc) {
        answer_http(call, false);
        return false;
    }
    if (call->headers_over) {
        char text[96];
        snprintf(text, sizeof text, "request headers over %d bytes",
                 MAX_HEADER_LIST);
        answer_error(call, RLS_GRPC_RESOURCE_EXHAUSTED, text);
        return false;
    }
    return true;
}

/* A read the message refused: the call is answered with gRPC's status. */
static void refuse_message(rls_h2_call *call, rls_grpc_read rc)
{
    char text[128];
    switch (rc) {
    case RLS_GRPC_TOO_LARGE:
        snprintf(text, sizeof text, "request message of %u bytes is over "
                 "the limit of %zu", call->reader.length, call->reader.max);
        answer_error(call, RLS_GRPC_RESOURCE_EXHAUSTED, text);
        break;
    case RLS_GRPC_COMPRESSED:
        answer_error(call, RLS_GRPC_UNIMPLEMENTED,
                     "compressed request messages are not supported");
        break;
    case RLS_GRPC_SECOND:
        answer_error(call, RLS_GRPC_INTERNAL,
                     "a unary call carries one request message, not more");
        break;
    default:
        answer_error(call, RLS_GRPC_RESOURCE_EXHAUSTED,
                     "no memory for the request message");
        break;
    }
}

static int on_data_chunk(nghttp2_session *session, uint8_t flags,
                         int32_t stream_id, const uint8_t *data, size_t len,
                         void *user)
{
    h2_conn *c = user;
    (void)flags;
    if (c->closing)
        return NGHTTP2_ERR_CALLBACK_FAILURE;
    rls_h2_call *call = call_of(session, stream_id);
    /* An answered call's bytes are dropped; nghttp2 still opens the
     * window for more, and the RST_STREAM after the answer stops them. */
    while (call != NULL && call->state == CALL_READING && len > 0) {
        size_t used;
        rls_grpc_read rc = rls_grpc_reader_feed(&call->reader, data, len,
                                                &used);
        if (rc != RLS_GRPC_MORE && rc != RLS_GRPC_MESSAGE)
            refuse_message(call, rc);
        data += used;
        len -= used;
    }
    return 0;
}

/* END_STREAM: one whole message goes to the handler. */
static void end_of_request(rls_h2_call *call)
{
    rls_h2_server *s = call->conn->srv;
    if (call->reader.messages == 0) {
        answer_error(call, RLS_GRPC_INTERNAL,
                     call->reader.have_prefix > 0
                         ? "the request message ended early"
                         : "the call carried no request message");
        return;
    }
    call->state = CALL_HELD;
    nghttp2_vec path = {(uint8_t *)"", 0};
    if (call->path != NULL)
        path = nghttp2_rcbuf_get_buf(call->path);
    s->h.on_call(s->h.arg, call, (const char *)path.base, path.len,
                 call->reader.body, call->reader.length, call->timeout_ms);
    /* Answered or held, the call needs neither any more. */
    rls_grpc_reader_free(&call->reader);
    if (call->path != NULL)
        nghttp2_rcbuf_decref(call->path);
    call->path = NULL;
}

static int on_frame_recv(nghttp2_session *session,
                         const nghttp2_frame *frame, void *user)
{
    h2_conn *c = user;
    if (c->closing)
        return NGHTTP2_ERR_CALLBACK_FAILURE;
    if (frame->hd.type != NGHTTP2_HEADERS && frame->hd.type != NGHTTP2_DATA)
        return 0;
    rls_h2_call *call = call_of(session, frame->hd.stream_id);
    if (call == NULL || call->state != CALL_READING)
        return 0;
    if (frame->hd.type == NGHTTP2_HEADERS
        && frame->headers.cat == NGHTTP2_HCAT_REQUEST && !check_request(call))
        return 0;
    if (frame->hd.flags & NGHTTP2_FLAG_END_STREAM)
        end_of_request(call);
    return 0;
}

/* Early server closure (PROTOCOL-HTTP2.md): an answer that ends the
 * stream before the client ended its side is followed by RST_STREAM
 * NO_ERROR, so that the stream is freed and the client stops sending. */
static int on_frame_send(nghttp2_session *session,
                         const nghttp2_frame *frame, void *user)
{
    h2_conn *c = user;
    if (c->closing)
        return NGHTTP2_ERR_CALLBACK_FAILURE;
    if (frame->hd.type == NGHTTP2_HEADERS
        && (frame->hd.flags & NGHTTP2_FLAG_END_STREAM)
        && nghttp2_session_get_stream_remote_close(session,
                                                   frame->hd.stream_id)
               == 0)
        nghttp2_submit_rst_stream(session, NGHTTP2_FLAG_NONE,
                                  frame->hd.stream_id, NGHTTP2_NO_ERROR);
    return 0;
}

static int on_stream_close(nghttp2_session *session, int32_t stream_id,
                           uint32_t error_code, void *user)
{
    h2_conn *c = user;
    (void)error_code;
    if (c->closing)
        return NGHTTP2_ERR_CALLBACK_FAILURE;
    rls_h2_call *call = call_of(session, stream_id);
    if (call == NULL)
        return 0;
    nghttp2_session_set_stream_user_data(session, stream_id, NULL);
    if (call->state == CALL_HELD) {
        call->state = CALL_CANCELLED;
        c->srv->h.on_cancel(c->srv->h.arg, call);
    }
    call_free(call);
    return 0;
}

static int make_callbacks(rls_h2_server *s)
{
    if (nghttp2_session_callbacks_new(&s->callbacks) != 0)
        return -1;
    nghttp2_session_callbacks *cb = s->callbacks;
    nghttp2_session_callbacks_set_on_begin_headers_callback(cb,
                                                            on_begin_headers);
    nghttp2_session_callbacks_set_on_header_callback2(cb, on_header);
    nghttp2_session_callbacks_set_on_frame_recv_callback(cb, on_frame_recv);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cb,
                                                              on_data_chunk);
    nghttp2_session_callbacks_set_on_frame_send_callback(cb, on_frame_send);
    nghttp2_session_callbacks_set_on_stream_close_callback(cb,
                                                           on_stream_close);
    if (nghttp2_option_new(&s->option) != 0)
        return -1;
    /* Closed streams kept for priorities are memory a unary server does
     * not need. */
    nghttp2_option_set_no_closed_streams(s->option, 1);
    return 0;
}

/* ---- connections: bytes in, bytes out ---- */

/* The connection reads while it can take bytes: not while a write waits
 * for the peer (what the peer sends would only add answers to it), not
 * once the session wants no more. */
static void update_reading(h2_conn *c)
{
    bool want = !c->closing && !c->writing && !c->done_reading
                && (c->session == NULL
                    || nghttp2_session_want_read(c->session));
    if (want == c->reading)
        return;
    c->reading = want;
    if (want)
        uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
    else
        uv_read_stop((uv_stream_t *)&c->tcp);
}

static int start_session(h2_conn *c)
{
    rls_h2_server *s = c->srv;
    if (nghttp2_session_server_new3(&c->session, s->callbacks, c, s->option,
                                    &s->mem)
        != 0)
        return -1;
    nghttp2_settings_entry iv[] = {
        {NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS,
         s->limits.max_concurrent_streams},
        {NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE, MAX_HEADER_LIST},
    };
    if (nghttp2_submit_settings(c->session, NGHTTP2_FLAG_NONE, iv, 2) != 0) {
        nghttp2_session_del(c->session);
        c->session = NULL;
        return -1;
    }
    s->stats.sessions++;
    return 0;
}

/* A close asked for while inside nghttp2 is finished once it returns. */
static void finish_close(h2_conn *c);

static bool closed_meanwhile(h2_conn *c)
{
    if (!c->closing)
        return false;
    finish_close(c);
    return true;
}

/* Bytes from the peer: the socket's, or TLS's plaintext. */
static void feed(h2_conn *c, const uint8_t *data, size_t len)
{
    if (c->session == NULL && start_session(c) != 0) {
        conn_close(c, false);
        return;
    }
    c->in_session++;
    ssize_t rv = nghttp2_session_mem_recv(c->session, data, len);
    c->in_session--;
    if (closed_meanwhile(c))
        return;
    if (rv == NGHTTP2_ERR_BAD_CLIENT_MAGIC) {
        /* Not HTTP/2 (HTTP/1.1, say): a GOAWAY, then the end. */
        nghttp2_session_terminate_session(c->session, NGHTTP2_PROTOCOL_ERROR);
        c->done_reading = true;
    } else if (rv < 0) {
        conn_close(c, false);
        return;
    }
    update_reading(c);
    mark_dirty(c);
}

static int deliver(void *arg, const uint8_t *data, size_t len)
{
    h2_conn *c = arg;
    feed(c, data, len);
    return c->closing || c->done_reading;
}

/* One line for a connection TLS refused (or broke), with its peer and
 * OpenSSL's reason; it changes nothing for the others. */
static void log_tls_refusal(h2_conn *c, int rc)
{
    struct sockaddr_storage sa;
    int len = sizeof sa;
    char host[INET6_ADDRSTRLEN] = "?";
    int port = 0;
    if (uv_tcp_getpeername(&c->tcp, (struct sockaddr *)&sa, &len) == 0) {
        if (sa.ss_family == AF_INET6) {
            struct sockaddr_in6 *a = (struct sockaddr_in6 *)&sa;
            inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
            port = ntohs(a->sin6_port);
        } else {
            struct sockaddr_in *a = (struct sockaddr_in *)&sa;
            inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
            port = ntohs(a->sin_port);
        }
    }
    rl_log(&c->srv->log, RL_LOG_WARN,
           rc == RLS_TLS_EHANDSHAKE ? "tls_handshake_failed" : "tls_error",
           "peer=%s:%d reason=\"%s\"", host, port,
           rls_tls_reason(c->tls));
}

/* Ciphertext from the peer: its plaintext goes to feed; what TLS has to
 * answer (the handshake's messages) goes at the turn's flush. A refused
 * handshake sends its alert if the socket takes it now, and closes. */
static void tls_in(h2_conn *c, const uint8_t *data, size_t len)
{
    rls_h2_server *s = c->srv;
    int rc = rls_tls_in(c->tls, data, len, s->plain_buf, PLAIN_BUFFER,
                        deliver, c);
    if (c->closing)
        return;
    if (rc == RLS_TLS_EHANDSHAKE || rc == RLS_TLS_EPROTO) {
        log_tls_refusal(c, rc);
        size_t n = rls_tls_take(c->tls, s->cipher_buf, OUT_BUFFER);
        struct iovec iov = {s->cipher_buf, n};
        if (n > 0)
            send_now(c, &iov, 1);
        conn_close(c, false);
        return;
    }
    if (rc == RLS_TLS_EOF) {
        conn_close(c, false);
        return;
    }
    if (rls_tls_pending(c->tls) > 0)
        mark_dirty(c);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    h2_conn *c = h->data;
    (void)suggested;
    *buf = uv_buf_init((char *)c->srv->read_buf, READ_BUFFER);
}

static void on_read(uv_stream_t *stream, ssize_t n, const uv_buf_t *buf)
{
    h2_conn *c = stream->data;
    /* EOF too: no HTTP/2 client half-closes TCP and waits for answers. */
    if (n < 0) {
        conn_close(c, false);
        return;
    }
    if (n > 0 && c->tls != NULL)
        tls_in(c, (const uint8_t *)buf->base, (size_t)n);
    else if (n > 0)
        feed(c, (const uint8_t *)buf->base, (size_t)n);
}

/* send() now, with MSG_NOSIGNAL: a peer gone must not raise SIGPIPE. The
 * bytes sent, 0 if the socket takes none, or a libuv error. */
static ssize_t send_now(h2_conn *c, struct iovec *iov, int n)
{
    uv_os_fd_t fd;
    if (uv_fileno((const uv_handle_t *)&c->tcp, &fd) != 0)
        return UV_EBADF;
    struct msghdr m = {.msg_iov = iov, .msg_iovlen = (size_t)n};
    for (;;) {
        ssize_t sent = sendmsg(fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (sent >= 0)
            return sent;
        if (errno == EAGAIN || errno == EWOULDBLOCK)
            return 0;
        if (errno != EINTR)
            return uv_translate_sys_error(errno);
    }
}

static void on_stall_check(uv_timer_t *t);

static void on_written(uv_write_t *w, int status)
{
    h2_conn *c = w->data;
    rls_h2_server *s = c->srv;
    mem_free(c->pending, s);
    c->pending = NULL;
    c->writing = false;
    s->stats.waiting--;
    if (c->closing)
        return;
    if (status < 0) {
        conn_close(c, false);
        return;
    }
    update_reading(c);
    mark_dirty(c);
}

/* What send() left, in c->pending (len bytes): one uv_write, one at a
 * time, while reading waits. 0, or -1 if the connection is done for. */
static int start_write(h2_conn *c, size_t len)
{
    rls_h2_server *s = c->srv;
    uv_buf_t buf = uv_buf_init((char *)c->pending, (unsigned)len);
    c->write_req.data = c;
    if (uv_write(&c->write_req, (uv_stream_t *)&c->tcp, &buf, 1, on_written)
        != 0) {
        mem_free(c->pending, s);
        c->pending = NULL;
        return -1;
    }
    c->writing = true;
    c->write_since = uv_now(s->loop);
    if (s->stats.waiting++ == 0 && !s->closing) {
        uint64_t every = s->limits.write_timeout_ms / 4 + 1;
        uv_timer_start(&s->stall, on_stall_check, every, every);
    }
    update_reading(c);
    return 0;
}

static int write_rest(h2_conn *c, const uint8_t *a, size_t alen,
                      const uint8_t *b, size_t blen)
{
    c->pending = mem_malloc(alen + blen, c->srv);
    if (c->pending == NULL)
        return -1;
    if (alen > 0)
        memcpy(c->pending, a, alen);
    if (blen > 0)
        memcpy(c->pending + alen, b, blen);
    return start_write(c, alen + blen);
}

/* TLS's ciphertext to the socket, as write_out's: what the socket does
 * not take now goes in one write with whatever TLS still holds, so that
 * TLS is empty again before the session gives it more. */
static int ship(h2_conn *c)
{
    rls_h2_server *s = c->srv;
    for (;;) {
        size_t n = rls_tls_take(c->tls, s->cipher_buf, OUT_BUFFER);
        if (n == 0)
            return 1;
        struct iovec iov = {s->cipher_buf, n};
        ssize_t sent = send_now(c, &iov, 1);
        if (sent < 0)
            return -1;
        if ((size_t)sent == n)
            continue;
        size_t rest = n - (size_t)sent, more = rls_tls_pending(c->tls);
        c->pending = mem_malloc(rest + more, s);
        if (c->pending == NULL)
            return -1;
        memcpy(c->pending, s->cipher_buf + sent, rest);
        if (rls_tls_take(c->tls, c->pending + rest, more) != more) {
            mem_free(c->pending, s);
            c->pending = NULL;
            return -1;
        }
        return start_write(c, rest + more);
    }
}

/* The session's bytes to the peer, to the socket or through TLS: 1 when
 * all went, 0 when the rest waits in a write, -1 if the connection is
 * done for. */
static int write_out(h2_conn *c, const uint8_t *a, size_t alen,
                     const uint8_t *b, size_t blen)
{
    if (c->tls != NULL) {
        if (rls_tls_out(c->tls, a, alen) != 0
            || rls_tls_out(c->tls, b, blen) != 0) {
            log_tls_refusal(c, RLS_TLS_EPROTO);
            return -1;
        }
        return ship(c);
    }
    struct iovec iov[2] = {{(void *)a, alen}, {(void *)b, blen}};
    ssize_t n = send_now(c, iov, blen > 0 ? 2 : 1);
    if (n < 0)
        return -1;
    if ((size_t)n == alen + blen)
        return 1;
    size_t done = (size_t)n;
    if (done >= alen)
        return write_rest(c, NULL, 0, b + (done - alen), blen - (done - alen));
    return write_rest(c, a + done, alen - done, b, blen);
}

/* Takes what the session has to send into the server's out buffer; a
 * frame that does not fit is left in *extra (nghttp2's memory, valid
 * until its next mem_send). -1 on nghttp2's fatal errors. */
static int gather(h2_conn *c, size_t *len, const uint8_t **extra,
                  size_t *extra_len)
{
    uint8_t *out = c->srv->out_buf;
    *len = 0;
    *extra_len = 0;
    for (;;) {
        const uint8_t *p;
        ssize_t n = nghttp2_session_mem_send(c->session, &p);
        if (n <= 0)
            return n < 0 ? -1 : 0;
        if ((size_t)n > OUT_BUFFER - *len) {
            *extra = p;
            *extra_len = (size_t)n;
            return 0;
        }
        memcpy(out + *len, p, (size_t)n);
        *len += (size_t)n;
    }
}

/* Everything the session has to send, until it has no more or the
 * socket takes no more; then the connection ends if the session is done
 * (a GOAWAY sent and its streams over). */
static void flush(h2_conn *c)
{
    if (c->closing || c->writing)
        return;
    /* TLS's own bytes first: the handshake's, a session ticket. */
    if (c->tls != NULL && rls_tls_pending(c->tls) > 0 && ship(c) < 0) {
        conn_close(c, false);
        return;
    }
    if (c->writing || c->session == NULL)
        return;
    for (;;) {
        size_t len;
        const uint8_t *extra = NULL;
        size_t extra_len;
        c->in_session++;
        int rc = gather(c, &len, &extra, &extra_len);
        c->in_session--;
        if (closed_meanwhile(c))
            return;
        if (rc == 0 && len + extra_len > 0)
            rc = write_out(c, c->srv->out_buf, len, extra, extra_len);
        if (rc < 0) {
            conn_close(c, false);
            return;
        }
        if (c->writing)
            return;
        if (len + extra_len == 0)
            break;
    }
    if (!nghttp2_session_want_read(c->session)
        && !nghttp2_session_want_write(c->session))
        conn_close(c, false);
}

static void on_flush_turn(uv_prepare_t *p);

static void mark_dirty(h2_conn *c)
{
    rls_h2_server *s = c->srv;
    /* A closing server's prepare handle must not be started again. */
    if (c->dirty || c->closing || s->closing)
        return;
    c->dirty = true;
    c->prev_dirty = NULL;
    c->next_dirty = s->dirty;
    if (s->dirty != NULL)
        s->dirty->prev_dirty = c;
    s->dirty = c;
    uv_prepare_start(&s->flusher, on_flush_turn);
}

static void unmark_dirty(h2_conn *c)
{
    if (!c->dirty)
        return;
    if (c->prev_dirty != NULL)
        c->prev_dirty->next_dirty = c->next_dirty;
    else
        c->srv->dirty = c->next_dirty;
    if (c->next_dirty != NULL)
        c->next_dirty->prev_dirty = c->prev_dirty;
    c->dirty = false;
}

/* Once a loop turn, before the loop waits: what this turn's reads,
 * answers and timers gave the sessions goes out, one write a connection. */
static void on_flush_turn(uv_prepare_t *p)
{
    rls_h2_server *s = p->data;
    while (s->dirty != NULL) {
        h2_conn *c = s->dirty;
        unmark_dirty(c);
        flush(c);
    }
    uv_prepare_stop(p);
}

/* ---- connections: life and death ---- */

static void server_handle_closed(rls_h2_server *s);

static void on_conn_closed(uv_handle_t *h)
{
    h2_conn *c = h->data;
    rls_h2_server *s = c->srv;
    if (c->prev != NULL)
        c->prev->next = c->next;
    else
        s->conns = c->next;
    if (c->next != NULL)
        c->next->prev = c->prev;
    s->stats.connections--;
    rls_tls_free(c->tls);
    mem_free(c, s);
    server_handle_closed(s);
}

/* Every unanswered call is cancelled now, even inside nghttp2: no handler
 * callback comes after a close. The calls are freed with the session. */
static void cancel_calls(h2_conn *c)
{
    rls_h2_server *s = c->srv;
    for (rls_h2_call *call = c->calls; call != NULL; call = call->next)
        if (call->state == CALL_HELD)
            call->state = CALL_CANCELLED;
    for (rls_h2_call *call = c->calls; call != NULL; call = call->next)
        if (call->state == CALL_CANCELLED)
            s->h.on_cancel(s->h.arg, call);
}

static void finish_close(h2_conn *c)
{
    while (c->calls != NULL)
        call_free(c->calls);
    if (c->session != NULL) {
        nghttp2_session_del(c->session);
        c->session = NULL;
        c->srv->stats.sessions--;
    }
    /* A peer that does not read is cut off with RST: its unsent bytes
     * are dropped at once, not kept by the kernel for it. */
    if (!c->reset
        || uv_tcp_close_reset(&c->tcp, on_conn_closed) != 0)
        uv_close((uv_handle_t *)&c->tcp, on_conn_closed);
}

static void conn_close(h2_conn *c, bool reset)
{
    if (c->closing)
        return;
    /* Set first: an on_cancel may close the whole server. */
    c->closing = true;
    c->reset = reset;
    unmark_dirty(c);
    if (c->reading)
        uv_read_stop((uv_stream_t *)&c->tcp);
    c->reading = false;
    cancel_calls(c);
    if (c->in_session == 0)
        finish_close(c);
}

static void on_stall_check(uv_timer_t *t)
{
    rls_h2_server *s = t->data;
    uint64_t now = uv_now(s->loop);
    for (h2_conn *c = s->conns; c != NULL; c = c->next) {
        if (c->writing && !c->closing
            && now - c->write_since >= s->limits.write_timeout_ms) {
            s->stats.stalled++;
            conn_close(c, true);
        }
    }
    if (s->stats.waiting == 0)
        uv_timer_stop(t);
}

/* GOAWAY naming the last stream taken (NO_ERROR): its calls are answered,
 * no new one is taken, and the connection closes when the session is
 * done (flush). One that has not spoken HTTP/2 yet is closed now. */
static void goaway(h2_conn *c)
{
    if (c->session == NULL) {
        conn_close(c, false);
        return;
    }
    nghttp2_submit_goaway(c->session, NGHTTP2_FLAG_NONE,
                          nghttp2_session_get_last_proc_stream_id(c->session),
                          NGHTTP2_NO_ERROR, NULL, 0);
    mark_dirty(c);
}

/* max_connection_age_ms, give or take 10% (grpc-go's jitter). */
static uint64_t jittered_age(rls_h2_server *s)
{
    uint64_t age = s->limits.max_connection_age_ms;
    if (age == UINT64_MAX)
        return age;
    s->jitter ^= s->jitter << 13;
    s->jitter ^= s->jitter >> 7;
    s->jitter ^= s->jitter << 17;
    return age - age / 10 + s->jitter % (age / 5 + 1);
}

/* How often the ages are looked at: a tenth of the shorter of age and
 * grace, between 10 ms and a second. */
static uint64_t age_every(const rls_h2_limits *l)
{
    uint64_t shorter = l->max_connection_age_ms
                               < l->max_connection_age_grace_ms
                           ? l->max_connection_age_ms
                           : l->max_connection_age_grace_ms;
    uint64_t every = shorter / 10;
    return every < 10 ? 10 : every > 1000 ? 1000 : every;
}

static void on_age_check(uv_timer_t *t)
{
    rls_h2_server *s = t->data;
    uint64_t now = uv_now(s->loop);
    for (h2_conn *c = s->conns; c != NULL; c = c->next) {
        if (c->closing)
            continue;
        if (c->aged_at == 0 && now - c->born >= c->max_age) {
            c->aged_at = now > 0 ? now : 1;
            goaway(c);
        } else if (c->aged_at != 0
                   && now - c->aged_at
                          >= s->limits.max_connection_age_grace_ms) {
            conn_close(c, false);
        }
    }
}

static void on_connection(uv_stream_t *listener, int status);

static void on_accept_retry(uv_timer_t *t)
{
    rls_h2_server *s = t->data;
    if (s->listening)
        on_connection((uv_stream_t *)&s->listener, 0);
}

static void on_connection(uv_stream_t *listener, int status)
{
    rls_h2_server *s = listener->data;
    /* EMFILE and the like: libuv has dealt with it. */
    if (status < 0)
        return;
    h2_conn *c = mem_calloc(1, sizeof *c, s);
    if (c == NULL) {
        /* libuv watches the listener again only once this connection is
         * accepted: try again in a moment. */
        uv_timer_start(&s->retry, on_accept_retry, 100, 0);
        return;
    }
    c->srv = s;
    c->born = uv_now(s->loop);
    c->max_age = jittered_age(s);
    uv_tcp_init(s->loop, &c->tcp);
    c->tcp.data = c;
    c->next = s->conns;
    if (s->conns != NULL)
        s->conns->prev = c;
    s->conns = c;
    s->stats.connections++;
    s->open_handles++;
    if (uv_accept(listener, (uv_stream_t *)&c->tcp) != 0) {
        conn_close(c, false);
        return;
    }
    s->stats.accepted++;
    if (s->stats.connections > s->limits.max_connections) {
        s->stats.refused++;
        conn_close(c, false);
        return;
    }
    if (s->tls != NULL && (c->tls = rls_tls_new(s->tls)) == NULL) {
        conn_close(c, false);
        return;
    }
    uv_tcp_nodelay(&c->tcp, 1);
    c->reading = true;
    uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
}

/* ---- the server ---- */

static void server_free(rls_h2_server *s)
{
    nghttp2_session_callbacks_del(s->callbacks);
    nghttp2_option_del(s->option);
    rls_pool_fini(&s->pool);
    free(s);
}

static void server_handle_closed(rls_h2_server *s)
{
    if (--s->open_handles > 0 || !s->closing)
        return;
    void (*done)(void *) = s->done;
    void *arg = s->done_arg;
    server_free(s);
    if (done != NULL)
        done(arg);
}

static void on_server_handle_closed(uv_handle_t *h)
{
    server_handle_closed(h->data);
}

static int bind_one(const struct addrinfo *ai, bool reuseport)
{
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK
                                        | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0)
        return -1;
    int one = 1;
    if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0
        || (reuseport
            && setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one)
                   != 0)
        || bind(fd, ai->ai_addr, ai->ai_addrlen) != 0
        || listen(fd, BACKLOG) != 0) {
        int saved = errno;
        close(fd);
        errno = saved;
        return -1;
    }
    return fd;
}

/* The listening socket, made here rather than by uv_tcp_bind so that
 * SO_REUSEPORT is set before bind (libuv 1.44 has no flag for it). */
static int open_listener(const char *host, uint16_t port, bool reuseport,
                         uint16_t *bound, char *err, size_t cap)
{
    char service[8];
    snprintf(service, sizeof service, "%u", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV},
                    *res;
    int rc = getaddrinfo(host, service, &hints, &res);
    if (rc != 0) {
        snprintf(err, cap, "cannot listen on %s:%u: %s", host, port,
                 gai_strerror(rc));
        return -1;
    }
    int fd = -1, saved = 0;
    for (struct addrinfo *ai = res; ai != NULL && fd < 0; ai = ai->ai_next) {
        fd = bind_one(ai, reuseport);
        saved = errno;
    }
    freeaddrinfo(res);
    if (fd < 0) {
        snprintf(err, cap, "cannot listen on %s:%u: %s%s", host, port,
                 strerror(saved),
                 saved != EADDRINUSE ? ""
                 : reuseport ? " (by a socket without SO_REUSEPORT)"
                             : " (by another socket)");
        return -1;
    }
    struct sockaddr_storage sa;
    socklen_t len = sizeof sa;
    getsockname(fd, (struct sockaddr *)&sa, &len);
    *bound = ntohs(sa.ss_family == AF_INET6
                       ? ((struct sockaddr_in6 *)&sa)->sin6_port
                       : ((struct sockaddr_in *)&sa)->sin_port);
    return fd;
}

static void set_limits(rls_h2_limits *l, const rls_h2_limits *given)
{
    if (given != NULL)
        *l = *given;
    if (l->max_message == 0)
        l->max_message = RLS_H2_DEFAULT_MAX_MESSAGE;
    if (l->max_concurrent_streams == 0)
        l->max_concurrent_streams = RLS_H2_DEFAULT_MAX_STREAMS;
    if (l->max_connections == 0)
        l->max_connections = RLS_H2_DEFAULT_MAX_CONNECTIONS;
    if (l->write_timeout_ms == 0)
        l->write_timeout_ms = RLS_H2_DEFAULT_WRITE_TIMEOUT_MS;
    if (l->max_connection_age_ms == 0)
        l->max_connection_age_ms = RLS_H2_DEFAULT_MAX_AGE_MS;
    if (l->max_connection_age_grace_ms == 0)
        l->max_connection_age_grace_ms = RLS_H2_DEFAULT_MAX_AGE_GRACE_MS;
}

rls_h2_server *rls_h2_listen(uv_loop_t *loop, const char *host,
                             uint16_t port, bool reuseport,
                             const rls_h2_limits *limits,
                             const rls_h2_handler *h, char *err, size_t cap)
{
    if (h == NULL || h->on_call == NULL || h->on_cancel == NULL) {
        snprintf(err, cap, "rls_h2_listen: a handler with on_call and "
                 "on_cancel is required");
        return NULL;
    }
    rls_h2_server *s = calloc(1, sizeof *s);
    if (s == NULL) {
        snprintf(err, cap, "no memory for a server");
        return NULL;
    }
    s->loop = loop;
    s->h = *h;
    set_limits(&s->limits, limits);
    s->mem = (nghttp2_mem){s, mem_malloc, mem_free, mem_calloc, mem_realloc};
    if (make_callbacks(s) != 0) {
        snprintf(err, cap, "no memory for nghttp2's callbacks");
        goto fail;
    }
    int fd = open_listener(host, port, reuseport, &s->port, err, cap);
    if (fd < 0)
        goto fail;
    uv_tcp_init(loop, &s->listener);
    s->listener.data = s;
    int rc = uv_tcp_open(&s->listener, fd);
    if (rc != 0)
        close(fd);
    else
        rc = uv_listen((uv_stream_t *)&s->listener, BACKLOG, on_connection);
    if (rc != 0) {
        snprintf(err, cap, "cannot listen on %s:%u: %s", host, port,
                 uv_strerror(rc));
        /* The handle is the loop's now: it frees the server once closed. */
        s->closing = true;
        s->open_handles = 1;
        uv_close((uv_handle_t *)&s->listener, on_server_handle_closed);
        return NULL;
    }
    s->listening = true;
    uv_prepare_init(loop, &s->flusher);
    uv_timer_init(loop, &s->stall);
    uv_timer_init(loop, &s->retry);
    uv_timer_init(loop, &s->age);
    s->flusher.data = s->stall.data = s->retry.data = s->age.data = s;
    s->open_handles = 5;
    s->jitter = uv_hrtime() | 1;
    uint64_t every = age_every(&s->limits);
    uv_timer_start(&s->age, on_age_check, every, every);
    return s;
fail:
    server_free(s);
    return NULL;
}

void rls_h2_server_use_tls(rls_h2_server *s, rls_tls_ctx *ctx,
                           const rl_logger *log)
{
    s->tls = ctx;
    s->log = *log;
}

uint16_t rls_h2_server_port(const rls_h2_server *s)
{
    return s->port;
}

void rls_h2_server_stats(const rls_h2_server *s, rls_h2_stats *out)
{
    *out = s->stats;
}

static void stop_listening(rls_h2_server *s)
{
    if (!s->listening)
        return;
    s->listening = false;
    uv_close((uv_handle_t *)&s->listener, on_server_handle_closed);
}

void rls_h2_server_drain(rls_h2_server *s)
{
    if (s->draining || s->closing)
        return;
    s->draining = true;
    stop_listening(s);
    for (h2_conn *c = s->conns; c != NULL; c = c->next) {
        if (c->closing)
            continue;
        goaway(c);
    }
}

void rls_h2_server_close(rls_h2_server *s, void (*done)(void *arg),
                         void *arg)
{
    if (s->closing)
        return;
    s->closing = true;
    s->done = done;
    s->done_arg = arg;
    stop_listening(s);
    uv_close((uv_handle_t *)&s->flusher, on_server_handle_closed);
    uv_close((uv_handle_t *)&s->stall, on_server_handle_closed);
    uv_close((uv_handle_t *)&s->retry, on_server_handle_closed);
    uv_close((uv_handle_t *)&s->age, on_server_handle_closed);
    /* Connections leave the list in their close callbacks, later. */
    for (h2_conn *c = s->conns; c != NULL; c = c->next)
        conn_close(c, false);
}
