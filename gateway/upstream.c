/*
 * upstream.c: an allowed request sent on to the upstream, one connection
 * per request ("Connection: close": the simplest exchange that cannot mix
 * up two responses). The response is read whole (up to 8 MiB), then handed
 * to the client's connection with the decision's headers added. Anything
 * that goes wrong becomes a 502, no answer in 30 s a 504.
 */
#include "gateway.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

struct gw_upstream {
    uv_tcp_t tcp;
    uv_timer_t timer;
    uv_connect_t connect;
    uv_write_t write;
    gw_conn *conn;
    gw_buf out;
    http_parser parser;
    gw_message resp;
    char chunk[65536];
    bool finished;
    int open_handles;
};

static http_parser_settings settings;

static void on_closed(uv_handle_t *h)
{
    gw_upstream *u = h->data;
    if (--u->open_handles == 0) {
        gw_message_reset(&u->resp);
        gw_buf_free(&u->out);
        free(u);
    }
}

/* Hands the outcome to the client's connection, once, and closes. */
static void finish(gw_upstream *u, int status, const char *error)
{
    if (u->finished)
        return;
    u->finished = true;
    gw_conn_upstream_done(u->conn, error == NULL ? &u->resp : NULL, status,
                          error);
    uv_close((uv_handle_t *)&u->tcp, on_closed);
    uv_close((uv_handle_t *)&u->timer, on_closed);
}

static void fail(gw_upstream *u, int status, const char *error)
{
    gw_conn_view v = gw_conn_view_of(u->conn);
    rl_log(&v.srv->log, RL_LOG_WARN, "upstream_failed",
           "peer=%s status=%d reason=\"%s\"", v.peer_ip, status, error);
    finish(u, status, error);
}

void gw_upstream_cancel(gw_upstream *u, const char *why)
{
    finish(u, 499, why);
}

static void on_timeout(uv_timer_t *t)
{
    fail(t->data, 504, "the upstream did not answer within 30 s");
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    gw_upstream *u = h->data;
    (void)suggested;
    *buf = uv_buf_init(u->chunk, sizeof u->chunk);
}

static void parsed(gw_upstream *u)
{
    if (u->resp.complete) {
        finish(u, u->parser.status_code, NULL);
        return;
    }
    enum http_errno e = HTTP_PARSER_ERRNO(&u->parser);
    if (e != HPE_OK)
        fail(u, 502, u->resp.error != NULL ? u->resp.error
                                           : http_errno_description(e));
}

static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf)
{
    gw_upstream *u = s->data;
    if (u->finished)
        return;
    if (n == UV_EOF) {
        /* The end of a response that is framed by the connection's end. */
        http_parser_execute(&u->parser, &settings, NULL, 0);
        if (!u->resp.complete && HTTP_PARSER_ERRNO(&u->parser) == HPE_OK) {
            fail(u, 502, "the upstream closed the connection before the "
                 "end of its response");
            return;
        }
        parsed(u);
    } else if (n < 0) {
        fail(u, 502, uv_strerror((int)n));
    } else {
        http_parser_execute(&u->parser, &settings, buf->base, (size_t)n);
        parsed(u);
    }
}

static void on_written(uv_write_t *w, int status)
{
    gw_upstream *u = w->data;
    /* Once finished, the write is cancelled by the close, and the client's
     * connection may be gone. */
    if (status < 0 && !u->finished)
        fail(u, 502, uv_strerror(status));
}

static void on_connect(uv_connect_t *req, int status)
{
    gw_upstream *u = req->data;
    if (u->finished)
        return;
    if (status < 0) {
        fail(u, 502, uv_strerror(status));
        return;
    }
    uv_buf_t b = uv_buf_init(u->out.data, (unsigned)u->out.len);
    u->write.data = u;
    if (uv_write(&u->write, (uv_stream_t *)&u->tcp, &b, 1, on_written) != 0
        || uv_read_start((uv_stream_t *)&u->tcp, on_alloc, on_read) != 0)
        fail(u, 502, "cannot write to the upstream");
}

/* The request as the upstream sees it: the client's, minus hop-by-hop
 * headers, with X-Forwarded-For extended and the body's length. */
static void build(gw_upstream *u, const gw_conn_view *v)
{
    const gw_message *req = v->req;
    gw_buf *out = &u->out;
    gw_buf_printf(out, "%s %s HTTP/1.1\r\n",
                  http_method_str((enum http_method)v->parser->method),
                  req->url.data != NULL ? req->url.data : "/");
    const char *xff = NULL;
    bool host = false;
    for (int i = 0; i < req->n_headers; i++) {
        const gw_header *h = &req->headers[i];
        if (strcasecmp(h->name.data, "X-Forwarded-For") == 0) {
            xff = h->value.data;
            continue;
        }
        host |= strcasecmp(h->name.data, "Host") == 0;
        /* The body is sent whole: no interim 100 Continue to relay. */
        if (!gw_is_hop_by_hop(h->name.data)
            && strcasecmp(h->name.data, "Expect") != 0)
            gw_buf_printf(out, "%s: %s\r\n", h->name.data, h->value.data);
    }
    if (!host)
        gw_buf_printf(out, "Host: %s\r\n", v->srv->upstream_host);
    if (xff != NULL)
        gw_buf_printf(out, "X-Forwarded-For: %s, %s\r\n", xff, v->peer_ip);
    else
        gw_buf_printf(out, "X-Forwarded-For: %s\r\n", v->peer_ip);
    gw_buf_printf(out, "Content-Length: %zu\r\nConnection: close\r\n\r\n",
                  req->body.len);
    if (req->body.len > 0)
        gw_buf_append(out, req->body.data, req->body.len, SIZE_MAX / 2);
}

gw_upstream *gw_upstream_forward(gw_conn *c)
{
    if (settings.on_message_complete == NULL)
        gw_message_settings(&settings);
    gw_conn_view v = gw_conn_view_of(c);
    gw_upstream *u = calloc(1, sizeof *u);
    if (u == NULL) {
        gw_conn_upstream_done(c, NULL, 502, "out of memory");
        return NULL;
    }
    u->conn = c;
    http_parser_init(&u->parser, HTTP_RESPONSE);
    u->parser.data = &u->resp;
    u->resp.body_max = GW_UPSTREAM_BODY_MAX;
    u->resp.skip_body = v.parser->method == HTTP_HEAD;
    build(u, &v);
    uv_tcp_init(v.srv->loop, &u->tcp);
    uv_timer_init(v.srv->loop, &u->timer);
    u->tcp.data = u->timer.data = u->connect.data = u;
    u->open_handles = 2;
    uv_timer_start(&u->timer, on_timeout, GW_UPSTREAM_TIMEOUT_MS, 0);
    int rc = uv_tcp_connect(&u->connect, &u->tcp,
                            (const struct sockaddr *)&v.srv->upstream,
                            on_connect);
    if (rc != 0)
        fail(u, 502, uv_strerror(rc));
    return u->finished ? NULL : u;
}
