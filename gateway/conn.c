/*
 * conn.c: one client connection, one request at a time. Bytes are parsed
 * as they arrive; when a request is complete the parser pauses and reading
 * stops (pipelined requests wait in the buffer), the request goes to the
 * agent with rl_check_async, and the decision comes back to the loop
 * through the server's async handle. The response is written (the
 * gateway's own, or the upstream's), and the next request is parsed.
 *
 * While the upstream has the request, the client is watched for its going
 * away (as nginx does, a client's end of sending counts): its exchange is
 * cancelled, and the request's hold ends at its estimate (cost.c). It is
 * read on meanwhile, so a client that sent more (a pipelined request)
 * before it went is seen too, up to READ_CHUNK bytes buffered.
 *
 * A connection is freed once its handles are closed and no check or
 * upstream exchange still refers to it.
 */
#include "gateway.h"

#include <stdlib.h>
#include <string.h>

#define READ_CHUNK 65536

typedef enum { READING, DECIDING, FORWARDING, RESPONDING } conn_state;

struct gw_conn {
    uv_tcp_t tcp;
    uv_timer_t idle;
    gw_server *srv;
    gw_conn *prev, *next;    /* the server's connections */
    gw_conn *next_decided;   /* the server's decided list */
    http_parser parser;
    gw_message req;
    gw_buf in;               /* read, parsed up to in_off */
    size_t in_off;
    char peer_ip[INET6_ADDRSTRLEN + 1];
    conn_state state;
    bool keep_alive, head, eof;
    bool busy;               /* a check or an upstream exchange refers to it */
    bool metrics;            /* a --metrics connection: no checks */
    bool closing;
    int open_handles;
    rl_decision decision;
    /* The request's charge held open, from its decision to the end of its
     * upstream exchange (NULL when none), and what it holds. */
    rl_hold *hold;
    gw_cost cost;
    gw_upstream *upstream;   /* the exchange under way, or NULL */
    gw_buf out;
    uv_write_t write_req;
};

static http_parser_settings settings;

static void advance(gw_conn *c);

static void maybe_free(gw_conn *c)
{
    if (!c->closing || c->open_handles > 0 || c->busy)
        return;
    gw_server *srv = c->srv;
    if (c->prev != NULL)
        c->prev->next = c->next;
    else
        srv->conns = c->next;
    if (c->next != NULL)
        c->next->prev = c->prev;
    srv->n_conns--;
    gw_message_reset(&c->req);
    gw_buf_free(&c->in);
    gw_buf_free(&c->out);
    free(c);
    gw_server_conn_gone(srv);
}

static void on_handle_closed(uv_handle_t *h)
{
    gw_conn *c = h->data;
    c->open_handles--;
    maybe_free(c);
}

static void close_conn(gw_conn *c)
{
    if (c->closing)
        return;
    c->closing = true;
    uv_close((uv_handle_t *)&c->tcp, on_handle_closed);
    uv_close((uv_handle_t *)&c->idle, on_handle_closed);
    /* Nobody to relay its response to: gw_conn_upstream_done follows. */
    if (c->upstream != NULL)
        gw_upstream_cancel(c->upstream, "the client went away");
}

static void on_idle(uv_timer_t *t)
{
    gw_conn *c = t->data;
    if (c->state == READING)
        close_conn(c);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    gw_conn *c = h->data;
    (void)suggested;
    /* Room for one chunk at the end of the input buffer. */
    if (c->in.cap - c->in.len < READ_CHUNK + 1) {
        size_t cap = c->in.len + READ_CHUNK + 1;
        char *data = realloc(c->in.data, cap);
        if (data == NULL) {
            *buf = uv_buf_init(NULL, 0);
            return;
        }
        c->in.data = data;
        c->in.cap = cap;
    }
    *buf = uv_buf_init(c->in.data + c->in.len, READ_CHUNK);
}

static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf)
{
    gw_conn *c = s->data;
    (void)buf;
    if (n < 0) {
        /* EOF or error: a request being decided is still answered; one
         * with the upstream is not (nginx's 499). */
        c->eof = true;
        uv_read_stop(s);
        if (c->state == FORWARDING)
            rl_log(&c->srv->log, RL_LOG_INFO, "client_gone",
                   "peer=%s reason=\"%s\"", c->peer_ip,
                   n == UV_EOF ? "end of stream" : uv_strerror((int)n));
        if (c->state == READING || c->state == FORWARDING)
            close_conn(c);
        return;
    }
    c->in.len += (size_t)n;
    /* Past a request, the client is read on to see it go (above) while
     * its exchange lasts; what it pipelines meanwhile waits in the
     * buffer, READ_CHUNK bytes at most: beyond, reading stops until the
     * response is written, and a client gone is seen only then. */
    if (c->state != READING && c->in.len - c->in_off >= READ_CHUNK)
        uv_read_stop(s);
    uv_timer_again(&c->idle);
    advance(c);
}

static void start_reading(gw_conn *c)
{
    c->state = READING;
    if (!c->eof)
        uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
}

static void on_written(uv_write_t *w, int status)
{
    gw_conn *c = w->data;
    gw_buf_free(&c->out);
    if (c->closing)
        return;
    if (status < 0 || !c->keep_alive || c->eof) {
        close_conn(c);
        return;
    }
    gw_message_reset(&c->req);
    http_parser_pause(&c->parser, 0);
    uv_timer_again(&c->idle);
    start_reading(c);
    advance(c);
}

/* Counts the status of the response about to be written. */
static void count_status(gw_conn *c)
{
    int status = 0;
    if (c->out.len > 12)
        status = atoi(c->out.data + 9); /* "HTTP/1.1 429 ..." */
    if (status >= 100 && status < 600)
        c->srv->counts.by_status[status / 100]++;
    if (status == 502 || status == 504)
        c->srv->counts.upstream_errors++;
}

static void respond(gw_conn *c)
{
    count_status(c);
    c->state = RESPONDING;
    if (c->srv->draining)
        c->keep_alive = false;
    uv_buf_t b = uv_buf_init(c->out.data, (unsigned)c->out.len);
    c->write_req.data = c;
    if (uv_write(&c->write_req, (uv_stream_t *)&c->tcp, &b, 1, on_written)
        != 0) {
        gw_buf_free(&c->out);
        close_conn(c);
    }
}

static void refuse(gw_conn *c, int status, const char *error,
                   const char *reason)
{
    gw_buf_free(&c->out);
    gw_respond_error(&c->out, status, error, reason, c->keep_alive);
    respond(c);
}

static void on_decided(const rl_decision *d, void *arg)
{
    gw_conn *c = arg;
    gw_server *srv = c->srv;
    c->decision = *d;
    /* Handed to the loop under the lock, with the decision. */
    pthread_mutex_lock(&srv->decided_lock);
    c->next_decided = srv->decided_head;
    srv->decided_head = c;
    pthread_mutex_unlock(&srv->decided_lock);
    uv_async_send(&srv->decided);
}

static void on_held(const rl_decision *d, rl_hold *hold, void *arg)
{
    gw_conn *c = arg;
    c->hold = hold;
    on_decided(d, arg);
}

/* The request's check: held open for its exchange when holds are on. */
static int check_async(gw_conn *c, const gw_attrs *attrs)
{
    gw_server *srv = c->srv;
    gw_cost_of(srv, &c->cost);
    if (gw_holds(srv))
        return rl_check_hold(srv->agent, attrs->attrs, attrs->n,
                             c->cost.estimate, on_held, c);
    return rl_check_async(srv->agent, attrs->attrs, attrs->n,
                          c->cost.estimate, on_decided, c);
}

/* The one end of a request's hold: at its response's cost, or (resp
 * NULL: no exchange, or one that failed or was cancelled) its estimate. */
static void end_hold(gw_conn *c, const gw_message *resp)
{
    if (c->hold == NULL)
        return;
    gw_cost_end(c->srv, c->hold, &c->cost, resp, c->peer_ip);
    c->hold = NULL;
}

static void check(gw_conn *c)
{
    gw_server *srv = c->srv;
    c->state = DECIDING;
    uv_read_stop((uv_stream_t *)&c->tcp);
    c->keep_alive = http_should_keep_alive(&c->parser) && !srv->draining;
    c->head = c->parser.method == HTTP_HEAD;
    if (c->metrics) {
        gw_buf_free(&c->out);
        gw_respond_metrics(&c->out, srv, c->req.url.data, c->keep_alive);
        respond(c);
        return;
    }
    gw_attrs attrs;
    gw_attrs_of(srv, &c->req, c->peer_ip, &attrs);
    c->busy = true;
    int rc = check_async(c, &attrs);
    if (rc == RL_OK)
        return;
    c->busy = false;
    if (rc == RL_ETOOLONG || rc == RL_EINVAL)
        refuse(c, 400, "bad_request", "a value the rules key on is over 256 "
               "bytes or holds a NUL byte");
    else
        refuse(c, 503, "rate_limiter_unavailable", rl_strerror(rc));
}

static void bad_request(gw_conn *c)
{
    int status = c->req.error_status ? c->req.error_status : 400;
    const char *reason = c->req.error != NULL
        ? c->req.error
        : http_errno_description(HTTP_PARSER_ERRNO(&c->parser));
    c->keep_alive = false;
    uv_read_stop((uv_stream_t *)&c->tcp);
    rl_log(&c->srv->log, RL_LOG_INFO, "bad_request",
           "peer=%s status=%d reason=\"%s\"", c->peer_ip, status, reason);
    refuse(c, status, status == 400 ? "bad_request" : "request_too_large",
           reason);
}

/* Parses what is buffered, up to the end of one request. */
static void advance(gw_conn *c)
{
    while (c->state == READING && !c->closing && c->in_off < c->in.len) {
        size_t avail = c->in.len - c->in_off;
        size_t n = http_parser_execute(&c->parser, &settings,
                                       c->in.data + c->in_off, avail);
        c->in_off += n;
        enum http_errno e = HTTP_PARSER_ERRNO(&c->parser);
        if (e == HPE_PAUSED && c->req.complete) {
            check(c);
        } else if (e != HPE_OK || n == 0) {
            /* n == 0 with no error: an upgrade (WebSocket, CONNECT),
             * which this gateway does not tunnel. */
            if (e == HPE_OK)
                c->req.error = "upgrades (WebSocket, CONNECT) are not "
                               "supported";
            bad_request(c);
        }
    }
    if (c->in_off == c->in.len) {
        c->in.len = 0;
        c->in_off = 0;
    } else if (c->in_off > 0 && c->state == READING) {
        memmove(c->in.data, c->in.data + c->in_off, c->in.len - c->in_off);
        c->in.len -= c->in_off;
        c->in_off = 0;
    }
}

static void forward_or_respond(gw_conn *c)
{
    if (c->decision.allowed && c->srv->has_upstream) {
        c->busy = true;
        c->state = FORWARDING;
        if (!c->eof)
            uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
        c->upstream = gw_upstream_forward(c);
        return;
    }
    end_hold(c, NULL);
    gw_buf_free(&c->out);
    gw_respond_decision(&c->out, &c->decision, c->keep_alive, c->head);
    respond(c);
}

void gw_conn_take_decisions(gw_server *srv)
{
    pthread_mutex_lock(&srv->decided_lock);
    gw_conn *c = srv->decided_head;
    srv->decided_head = NULL;
    pthread_mutex_unlock(&srv->decided_lock);
    while (c != NULL) {
        gw_conn *next = c->next_decided;
        c->busy = false;
        gw_shadow_note(srv, &c->decision, c->peer_ip);
        if (c->closing) {
            end_hold(c, NULL);
            maybe_free(c);
        } else {
            forward_or_respond(c);
        }
        c = next;
    }
}

void gw_conn_upstream_done(gw_conn *c, const gw_message *resp, int status,
                           const char *error)
{
    c->busy = false;
    c->upstream = NULL;
    end_hold(c, resp);
    if (c->closing) {
        maybe_free(c);
        return;
    }
    gw_buf_free(&c->out);
    if (resp != NULL) {
        gw_respond_proxied(&c->out, resp, status, &c->decision,
                           c->keep_alive && !c->srv->draining);
        respond(c);
    } else {
        refuse(c, status, status == 504 ? "upstream_timeout"
                                        : "bad_gateway", error);
    }
}

gw_conn_view gw_conn_view_of(gw_conn *c)
{
    return (gw_conn_view){c->srv, &c->req, &c->parser, c->peer_ip};
}

static void peer_name(gw_conn *c)
{
    struct sockaddr_storage sa;
    int len = sizeof sa;
    strcpy(c->peer_ip, "unknown");
    if (uv_tcp_getpeername(&c->tcp, (struct sockaddr *)&sa, &len) != 0)
        return;
    if (sa.ss_family == AF_INET)
        uv_ip4_name((struct sockaddr_in *)&sa, c->peer_ip, sizeof c->peer_ip);
    else if (sa.ss_family == AF_INET6)
        uv_ip6_name((struct sockaddr_in6 *)&sa, c->peer_ip,
                    sizeof c->peer_ip);
}

void gw_conn_accept(gw_server *srv, uv_stream_t *listener, bool metrics)
{
    if (settings.on_message_complete == NULL)
        gw_message_settings(&settings);
    gw_conn *c = calloc(1, sizeof *c);
    if (c == NULL)
        return;
    c->srv = srv;
    c->metrics = metrics;
    uv_tcp_init(srv->loop, &c->tcp);
    uv_timer_init(srv->loop, &c->idle);
    c->tcp.data = c->idle.data = c;
    c->open_handles = 2;
    c->next = srv->conns;
    if (srv->conns != NULL)
        srv->conns->prev = c;
    srv->conns = c;
    srv->n_conns++;
    if (uv_accept(listener, (uv_stream_t *)&c->tcp) != 0) {
        close_conn(c);
        return;
    }
    uv_tcp_nodelay(&c->tcp, 1);
    peer_name(c);
    http_parser_init(&c->parser, HTTP_REQUEST);
    c->parser.data = &c->req;
    c->req.body_max = GW_BODY_MAX;
    uv_timer_start(&c->idle, on_idle, GW_IDLE_TIMEOUT_MS, GW_IDLE_TIMEOUT_MS);
    start_reading(c);
}

/* Whether the connection holds nothing of a request. */
static bool idle(const gw_conn *c)
{
    return c->state == READING && c->in.len == c->in_off
           && c->req.url.len == 0 && c->req.n_headers == 0;
}

void gw_conn_close_idle(gw_server *srv)
{
    for (gw_conn *c = srv->conns; c != NULL; c = c->next) {
        if (idle(c))
            close_conn(c);
    }
}

void gw_conn_close_all(gw_server *srv)
{
    for (gw_conn *c = srv->conns; c != NULL; c = c->next)
        close_conn(c);
}
