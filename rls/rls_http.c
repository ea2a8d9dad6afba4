/*
 * rls_http.c: /healthcheck, /json and /rlconfig (rls_http.h) on nng's
 * HTTP server. Each handler reads what it serves when asked: the draining
 * flag, a referenced snapshot of the config. /json's aio is finished by
 * the worker's thread when the call answers; nng waits for it before a
 * connection or the server goes.
 */
#include "rls_http.h"

#include "rls_chunked.h"
#include "rls_json.h"

#include "nng_handoff.h"

#include <nng/nng.h>
#include <nng/supplemental/http/http.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

struct rls_http {
    const rls_http_config *c;
    nng_http_server *main, *debug;
    pthread_mutex_t lock;        /* the workers */
    rls_worker *const *workers;
    size_t n_workers, next;
};

typedef struct route {
    const char *path, *method;   /* method NULL: any, as upstream's /json */
    void (*fn)(nng_aio *);
} route;

void rls_http_reply(nng_aio *aio, uint16_t status, const char *reason,
                    const char *type, const char *body, size_t len,
                    bool closing)
{
    nng_http_res *res;
    int rv = nng_http_res_alloc(&res);
    if (rv == 0)
        rv = nng_http_res_set_status(res, status);
    if (rv == 0 && reason != NULL)
        rv = nng_http_res_set_reason(res, reason);
    if (rv == 0 && closing)
        rv = nng_http_res_set_header(res, "Connection", "close");
    /* A refusal for now, not for this request: try again in a second. */
    if (rv == 0 && status == 503)
        rv = nng_http_res_set_header(res, "Retry-After", "1");
    if (rv == 0)
        rv = nng_http_res_set_header(res, "Content-Type", type);
    if (rv == 0)
        rv = nng_http_res_copy_data(res, body, len);
    if (rv != 0) {
        if (res != NULL)
            nng_http_res_free(res);
        nng_aio_finish(aio, rv);
        return;
    }
    nng_aio_set_output(aio, 0, res);
    nng_aio_finish(aio, 0);
}

static void reply(nng_aio *aio, uint16_t status, const char *type,
                  const char *body, size_t len)
{
    rls_http_reply(aio, status, NULL, type, body, len, false);
}

static rls_http *http_of(nng_aio *aio)
{
    nng_http_handler *h = nng_aio_get_input(aio, 1);
    rls_http *http = nng_http_handler_get_data(h);
    rl_nng_handoff(http);
    return http;
}

static void serve_health(nng_aio *aio)
{
    rls_http *http = http_of(aio);
    const rls_http_config *c = http->c;
    rls_snapshot *s = rls_runtime_get(c->runtime);
    bool loaded = s != NULL;
    rls_snapshot_put(s);
    rl_nng_handoff(http);
    if (atomic_load(c->draining))
        reply(aio, 500, "text/plain", "draining\n", 9);
    else if (c->need_config && !loaded)
        reply(aio, 500, "text/plain", "no config loaded\n", 17);
    else
        reply(aio, 200, "text/plain", "OK", 2);
}

static void serve_rlconfig(nng_aio *aio)
{
    rls_http *http = http_of(aio);
    rls_snapshot *s = rls_runtime_get(http->c->runtime);
    rl_nng_handoff(http);
    char *dump = s != NULL ? rls_config_dump(s->cfg) : NULL;
    rls_snapshot_put(s);
    if (s != NULL && dump == NULL) {
        nng_aio_finish(aio, NNG_ENOMEM);
        return;
    }
    const char *body = dump != NULL ? dump : "";
    reply(aio, 200, "text/plain", body, strlen(body));
    free(dump);
}

/* An error's answer, in Go's http.Error words (text, nng has not all of
 * them), and why. */
static void reply_error(nng_aio *aio, uint16_t status, const char *text,
                        const char *why)
{
    char body[600];
    int n = snprintf(body, sizeof body, "%s%s%s\n", text,
                     why != NULL ? ": " : "", why != NULL ? why : "");
    size_t len = n < (int)sizeof body ? (size_t)n : sizeof body - 1;
    rls_http_reply(aio, status, text, "text/plain; charset=utf-8", body, len,
                  status == 413);
}

/* On the worker's thread: the call's answer. */
static void on_json_answer(void *arg, rls_grpc_status status,
                           const uint8_t *msg, size_t len,
                           const char *message)
{
    nng_aio *aio = arg;
    if (status == RLS_GRPC_UNKNOWN) {
        reply_error(aio, 400, "Bad Request", message);
        return;
    }
    if (status != RLS_GRPC_OK) {
        reply_error(aio, status == RLS_GRPC_UNAVAILABLE ? 503 : 500,
                    status == RLS_GRPC_UNAVAILABLE ? "Service Unavailable"
                                                   : "Internal Server Error",
                    message);
        return;
    }
    int code = 0;
    char *json = rls_json_response(msg, len, &code);
    if (json == NULL) {
        reply_error(aio, 500, "Internal Server Error",
                    "the answer has no JSON form");
        return;
    }
    /* Upstream's: UNKNOWN is 500, as it never answers so. */
    reply(aio, code == 2 ? 429 : code == 1 ? 200 : 500, "application/json",
          json, strlen(json));
    free(json);
}

static int hand_over(rls_http *http, const uint8_t *msg, size_t len,
                     nng_aio *aio)
{
    pthread_mutex_lock(&http->lock);
    int rc = -1;
    if (http->n_workers > 0) {
        rls_worker *w = http->workers[http->next++ % http->n_workers];
        rc = rls_worker_call(w, msg, len, on_json_answer, aio);
    }
    pthread_mutex_unlock(&http->lock);
    return rc;
}

/* A /json call from its body's bytes. */
static void call_json(rls_http *http, nng_aio *aio, const char *json,
                      size_t len)
{
    uint8_t *msg;
    size_t msg_len;
    char err[300];
    if (rls_json_request(json, len, &msg, &msg_len, err, sizeof err) != 0) {
        reply_error(aio, 400, "Bad Request", err);
        return;
    }
    int rc = hand_over(http, msg, msg_len, aio);
    free(msg);
    if (rc != 0)
        reply_error(aio, 503, "Service Unavailable",
                    "no worker takes calls now");
}

/* A /json body being read: by its Content-Length (nng collects none
 * itself: over its cap it answers 400, where a body over the cap is a
 * 413) or chunked, a piece at a time (rls_chunked.h). A client that asks
 * "Expect: 100-continue" (curl's, for a body it streams) is told to go on
 * first, as Go's server tells it when the handler reads. */
typedef struct body {
    rls_http *http;
    nng_aio *aio, *io;
    nng_http_conn *conn;
    bool greeting;      /* "100 Continue" is being written */
    bool chunked;
    rls_chunked ck;
    uint8_t byte;       /* a chunked line's byte */
    size_t len, cap;
    char *bytes;
} body;

static void body_free(body *b)
{
    nng_aio_reap(b->io);
    free(b->bytes);
    free(b);
}

/* An answer that ends the connection: the body's rest is unread. */
static void refuse(nng_aio *aio, uint16_t status, const char *text,
                   const char *why)
{
    char msg[300];
    int n = snprintf(msg, sizeof msg, "%s: %s\n", text, why);
    size_t len = n < (int)sizeof msg ? (size_t)n : sizeof msg - 1;
    rls_http_reply(aio, status, text, "text/plain; charset=utf-8", msg, len,
                  true);
}

/* The next read: a chunk's data into the body, else a line's byte, else
 * (Content-Length) the whole body. */
static void read_next(body *b)
{
    nng_iov iov = {.iov_buf = b->bytes, .iov_len = b->len};
    if (b->chunked && rls_chunked_in_data(&b->ck))
        iov = (nng_iov){.iov_buf = b->bytes + b->ck.len,
                        .iov_len = rls_chunked_want(&b->ck)};
    else if (b->chunked)
        iov = (nng_iov){.iov_buf = &b->byte, .iov_len = 1};
    nng_aio *io = b->io;
    nng_http_conn *conn = b->conn;
    bool chunked = b->chunked;
    nng_aio_set_iov(io, 1, &iov);
    /* b is on_body's from here on: it may be freed before this returns. */
    rl_nng_handoff(b);
    if (chunked)
        nng_http_conn_read(conn, io);
    else
        nng_http_conn_read_all(conn, io);
}

/* Room for the chunk about to be read: doubling, never past the cap
 * (rls_chunked refused a chunk over it). */
static int make_room(body *b)
{
    size_t need = b->ck.len + rls_chunked_want(&b->ck);
    if (need <= b->cap)
        return 0;
    size_t cap = b->cap > 0 ? b->cap : 4096;
    while (cap < need)
        cap *= 2;
    if (cap > RLS_HTTP_JSON_MAX)
        cap = RLS_HTTP_JSON_MAX;
    char *bytes = realloc(b->bytes, cap);
    if (bytes == NULL)
        return -1;
    b->bytes = bytes;
    b->cap = cap;
    return 0;
}

/* A chunked body's n bytes read: 1 to read on, else the body is over and
 * answered. */
static int on_chunk_bytes(body *b, size_t n)
{
    int st = rls_chunked_in_data(&b->ck) ? rls_chunked_data(&b->ck, n)
                                         : rls_chunked_byte(&b->ck, b->byte);
    if (st == RLS_CHUNKED_EBAD)
        refuse(b->aio, 400, "Bad Request", b->ck.why);
    else if (st == RLS_CHUNKED_EBIG)
        refuse(b->aio, 413, "Request Entity Too Large",
               "the body is over 4 MiB, gRPC's message cap");
    else if (st == RLS_CHUNKED_DONE)
        call_json(b->http, b->aio, b->bytes != NULL ? b->bytes : "",
                  b->ck.len);
    else if (rls_chunked_in_data(&b->ck) && make_room(b) != 0)
        nng_aio_finish(b->aio, NNG_ENOMEM);
    else
        return 1;
    return 0;
}

static void on_body(void *arg)
{
    body *b = arg;
    rl_nng_handoff(b);
    int rv = nng_aio_result(b->io);
    size_t n = nng_aio_count(b->io);
    if (rv == 0 && b->greeting) {
        b->greeting = false;
        read_next(b);
        return;
    }
    if (rv == 0 && b->chunked && n == 0)
        rv = NNG_ECLOSED;
    if (rv != 0)
        nng_aio_finish(b->aio, rv);
    else if (!b->chunked)
        call_json(b->http, b->aio, b->bytes, b->len);
    else if (on_chunk_bytes(b, n)) {
        read_next(b);
        return;
    }
    body_free(b);
}

static void read_body(rls_http *http, nng_aio *aio, bool chunked,
                      size_t len)
{
    body *b = calloc(1, sizeof *b);
    if (b == NULL || nng_aio_alloc(&b->io, on_body, b) != 0 ||
        (!chunked && (b->bytes = malloc(len)) == NULL)) {
        if (b != NULL && b->io != NULL)
            nng_aio_free(b->io);
        free(b);
        nng_aio_finish(aio, NNG_ENOMEM);
        return;
    }
    b->http = http;
    b->aio = aio;
    b->conn = nng_aio_get_input(aio, 2);
    b->chunked = chunked;
    b->len = len;
    rls_chunked_init(&b->ck, RLS_HTTP_JSON_MAX);
    const char *expect =
        nng_http_req_get_header(nng_aio_get_input(aio, 0), "Expect");
    if (expect == NULL || strcasecmp(expect, "100-continue") != 0) {
        read_next(b);
        return;
    }
    static char go_on[] = "HTTP/1.1 100 Continue\r\n\r\n";
    nng_iov iov = {.iov_buf = go_on, .iov_len = sizeof go_on - 1};
    b->greeting = true;
    nng_aio *io = b->io;
    nng_http_conn *conn = b->conn;
    nng_aio_set_iov(io, 1, &iov);
    rl_nng_handoff(b);
    nng_http_conn_write_all(conn, io);
}

/* A body's framing, as RFC 9112 §6 has it; Content-Length and
 * Transfer-Encoding both is refused (§6.3 lets a server treat it as an
 * error): it is how a request is smuggled past a proxy that reads the
 * other one. Only the chunked coding is read (Go's 501 for others). */
static void serve_json(nng_aio *aio)
{
    rls_http *http = http_of(aio);
    nng_http_req *req = nng_aio_get_input(aio, 0);
    const char *cl = nng_http_req_get_header(req, "Content-Length");
    const char *te = nng_http_req_get_header(req, "Transfer-Encoding");
    char *end = NULL;
    unsigned long long len = cl != NULL ? strtoull(cl, &end, 10) : 0;
    if (cl != NULL && te != NULL)
        refuse(aio, 400, "Bad Request", "both Content-Length and "
               "Transfer-Encoding");
    else if (te != NULL && strcasecmp(te, "chunked") != 0)
        refuse(aio, 501, "Not Implemented", "a transfer coding other than "
               "chunked");
    else if (te != NULL)
        read_body(http, aio, true, 0);
    else if (cl != NULL && (cl[0] < '0' || cl[0] > '9' || *end != '\0'))
        refuse(aio, 400, "Bad Request", "Content-Length is no length");
    else if (len > RLS_HTTP_JSON_MAX)
        reply_error(aio, 413, "Request Entity Too Large",
                    "the body is over 4 MiB, gRPC's message cap");
    else if (len == 0)
        call_json(http, aio, "", 0);
    else
        read_body(http, aio, false, (size_t)len);
}

static int add_route(nng_http_server *s, rls_http *http, const route *r)
{
    nng_http_handler *h = NULL;
    int rv = nng_http_handler_alloc(&h, r->path, r->fn);
    if (rv == 0)
        rv = nng_http_handler_set_method(h, r->method);
    if (rv == 0 && r->method == NULL)
        rv = nng_http_handler_collect_body(h, false, 0);
    if (rv == 0)
        rv = nng_http_handler_set_data(h, http, NULL);
    if (rv == 0)
        rv = nng_http_server_add_handler(s, h);
    else if (h != NULL)
        nng_http_handler_free(h);
    return rv;
}

static int serve(nng_http_server **out, rls_http *http, const char *host,
                 uint16_t port, const route *routes, size_t n)
{
    char url[300];
    snprintf(url, sizeof url, strchr(host, ':') ? "http://[%s]:%u"
                                                : "http://%s:%u",
             host[0] != '\0' ? host : "0.0.0.0", port);
    nng_url *u = NULL;
    int rv = nng_url_parse(&u, url);
    if (rv == 0)
        rv = nng_http_server_hold(out, u);
    for (size_t i = 0; rv == 0 && i < n; i++)
        rv = add_route(*out, http, &routes[i]);
    if (rv == 0)
        rv = nng_http_server_start(*out);
    nng_url_free(u);
    return rv;
}

int rls_http_start(rls_http **out, const rls_http_config *c, char *err,
                   size_t cap)
{
    rls_http *http = calloc(1, sizeof *http);
    *out = NULL;
    if (http == NULL) {
        snprintf(err, cap, "out of memory");
        return -1;
    }
    http->c = c;
    pthread_mutex_init(&http->lock, NULL);
    rl_nng_handoff(http);
    static const route main_routes[] = {
        {"/healthcheck", "GET", serve_health}, {"/json", NULL, serve_json}};
    static const route debug_routes[] = {
        {"/rlconfig", "GET", serve_rlconfig}};
    int rv = serve(&http->main, http, c->host, c->port, main_routes, 2);
    const char *which = "HOST:PORT";
    if (rv == 0) {
        which = "DEBUG_HOST:DEBUG_PORT";
        rv = serve(&http->debug, http, c->debug_host, c->debug_port,
                   debug_routes, 1);
    }
    if (rv != 0) {
        snprintf(err, cap, "cannot serve HTTP on %s: %s", which,
                 nng_strerror(rv));
        rls_http_stop(http);
        return -1;
    }
    *out = http;
    return 0;
}

void rls_http_stop(rls_http *h)
{
    if (h == NULL)
        return;
    if (h->main != NULL) {
        nng_http_server_stop(h->main);
        nng_http_server_release(h->main);
    }
    if (h->debug != NULL) {
        nng_http_server_stop(h->debug);
        nng_http_server_release(h->debug);
    }
    rl_nng_handoff(h);
    pthread_mutex_destroy(&h->lock);
    free(h);
}

void rls_http_set_workers(rls_http *h, rls_worker *const *w, size_t n)
{
    if (h == NULL)
        return;
    pthread_mutex_lock(&h->lock);
    h->workers = w;
    h->n_workers = n;
    pthread_mutex_unlock(&h->lock);
}
