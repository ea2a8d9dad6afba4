/*
 * rl-rls's HTTP/2 transport (rls_h2.c) serving a test handler on a loop in
 * a thread of the test: driven by a real gRPC client (grpcio, through
 * tests/support/grpc_raw_call.py) for what a client sees, and by raw bytes
 * over a socket for what a hostile or broken peer sends. The handler:
 *   /t.T/Echo     answers the message back
 *   /t.T/Later    answers it back after 1 s, from a timer (long enough
 *                 that a sanitized, loaded run cancels it first where a
 *                 test means to)
 *   /t.T/Fail     "<code>:<text>" answers that status and text
 *   /t.T/Timeout  answers the call's grpc-timeout in ms, as text
 *   /t.T/Size     "<n>" answers n bytes
 *   /t.T/Hold     holds the call until the test releases it
 *   /t.T/Gather   holds calls until gather_n are held, then answers them
 *                 all back, last first
 *   anything else UNIMPLEMENTED
 */
#include "rls_h2.h"

#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <errno.h>
#include <netinet/in.h>
#include <nghttp2/nghttp2.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAX_HELD 256
#define WAIT_MS 5000
#define CLIENT "tests/support/grpc_raw_call.py"

/* ---- the server's side: a loop thread and its handler ---- */

typedef struct held {
    rls_h2_call *call;
    uint8_t msg[64];
    size_t len;
} held;

typedef struct later {
    uv_timer_t timer;
    rls_h2_call *call;
    uint8_t msg[64];
    size_t len;
} later;

typedef struct fixture fixture;
typedef void job_fn(fixture *fx, void *arg);

struct fixture {
    uv_loop_t loop;
    uv_async_t wake;
    pthread_t thread;
    rls_h2_server *srv;
    uint16_t port;
    atomic_int gather_n;  /* set by the test, read by the handler */
    /* the loop's: calls the handler holds */
    held held[MAX_HELD];
    /* one job at a time from the test's thread */
    pthread_mutex_t lock;
    pthread_cond_t cond;
    job_fn *job;
    void *job_arg;
    bool job_done;
    /* what the test reads */
    atomic_int calls, cancels, n_held, closed;
};

static held *hold(fixture *fx, rls_h2_call *call, const uint8_t *msg,
                  size_t len)
{
    for (size_t i = 0; i < MAX_HELD; i++) {
        held *h = &fx->held[i];
        if (h->call != NULL)
            continue;
        h->call = call;
        h->len = len < sizeof h->msg ? len : sizeof h->msg;
        memcpy(h->msg, msg, h->len);
        rls_h2_call_set_data(call, h);
        atomic_fetch_add(&fx->n_held, 1);
        return h;
    }
    cr_assert_fail("more than %d calls held", MAX_HELD);
    return NULL;
}

static void answer_held(fixture *fx, held *h)
{
    cr_assert_eq(rls_h2_reply(h->call, RLS_GRPC_OK, h->msg, h->len, NULL),
                 RLS_H2_OK);
    h->call = NULL;
    atomic_fetch_sub(&fx->n_held, 1);
}

/* Every held call answered, the last held first. */
static void release_all(fixture *fx, void *arg)
{
    (void)arg;
    for (size_t i = MAX_HELD; i-- > 0;)
        if (fx->held[i].call != NULL)
            answer_held(fx, &fx->held[i]);
}

static void on_later_closed(uv_handle_t *h)
{
    free(h->data);
}

static void on_later(uv_timer_t *t)
{
    later *l = t->data;
    cr_assert_eq(rls_h2_reply(l->call, RLS_GRPC_OK, l->msg, l->len, NULL),
                 RLS_H2_OK);
    uv_close((uv_handle_t *)t, on_later_closed);
}

static void start_later(fixture *fx, rls_h2_call *call, const uint8_t *msg,
                        size_t len)
{
    later *l = calloc(1, sizeof *l);
    cr_assert_not_null(l);
    l->call = call;
    l->len = len < sizeof l->msg ? len : sizeof l->msg;
    memcpy(l->msg, msg, l->len);
    uv_timer_init(&fx->loop, &l->timer);
    l->timer.data = l;
    uv_timer_start(&l->timer, on_later, 1000, 0);
    rls_h2_call_set_data(call, l);
}

static bool path_is(const char *path, size_t len, const char *want)
{
    return len == strlen(want) && memcmp(path, want, len) == 0;
}

static void answer_fail(rls_h2_call *call, const uint8_t *msg, size_t len)
{
    char text[256];
    snprintf(text, sizeof text, "%.*s", (int)len, (const char *)msg);
    char *colon = strchr(text, ':');
    cr_assert_not_null(colon);
    cr_assert_eq(rls_h2_reply(call, (rls_grpc_status)atoi(text), NULL, 0,
                              colon + 1),
                 RLS_H2_OK);
}

static void answer_size(rls_h2_call *call, const uint8_t *msg, size_t len)
{
    char text[32];
    snprintf(text, sizeof text, "%.*s", (int)len, (const char *)msg);
    size_t n = (size_t)atol(text);
    uint8_t *big = calloc(1, n + 1);
    cr_assert_not_null(big);
    cr_assert_eq(rls_h2_reply(call, RLS_GRPC_OK, big, n, NULL), RLS_H2_OK);
    free(big);
}

static void on_call(void *arg, rls_h2_call *call, const char *path,
                    size_t path_len, const uint8_t *msg, size_t len,
                    uint64_t timeout_ms)
{
    fixture *fx = arg;
    atomic_fetch_add(&fx->calls, 1);
    if (path_is(path, path_len, "/t.T/Echo")) {
        cr_assert_eq(rls_h2_reply(call, RLS_GRPC_OK, msg, len, NULL),
                     RLS_H2_OK);
    } else if (path_is(path, path_len, "/t.T/Later")) {
        start_later(fx, call, msg, len);
    } else if (path_is(path, path_len, "/t.T/Fail")) {
        answer_fail(call, msg, len);
    } else if (path_is(path, path_len, "/t.T/Timeout")) {
        char text[32];
        int n = snprintf(text, sizeof text, "%llu",
                         (unsigned long long)timeout_ms);
        cr_assert_eq(rls_h2_reply(call, RLS_GRPC_OK, (uint8_t *)text,
                                  (size_t)n, NULL),
                     RLS_H2_OK);
    } else if (path_is(path, path_len, "/t.T/Size")) {
        answer_size(call, msg, len);
    } else if (path_is(path, path_len, "/t.T/Hold")) {
        hold(fx, call, msg, len);
    } else if (path_is(path, path_len, "/t.T/Gather")) {
        hold(fx, call, msg, len);
        if (atomic_load(&fx->n_held) == atomic_load(&fx->gather_n))
            release_all(fx, NULL);
    } else {
        cr_assert_eq(rls_h2_reply(call, RLS_GRPC_UNIMPLEMENTED, NULL, 0,
                                  "unknown method"),
                     RLS_H2_OK);
    }
}

static void on_cancel(void *arg, rls_h2_call *call)
{
    fixture *fx = arg;
    void *data = rls_h2_call_data(call);
    atomic_fetch_add(&fx->cancels, 1);
    if (data >= (void *)fx->held && data < (void *)(fx->held + MAX_HELD)) {
        held *h = data;
        cr_assert_eq(h->call, call);
        h->call = NULL;
        atomic_fetch_sub(&fx->n_held, 1);
    } else if (data != NULL) {
        later *l = data;
        uv_timer_stop(&l->timer);
        uv_close((uv_handle_t *)&l->timer, on_later_closed);
    }
}

static void on_wake(uv_async_t *a)
{
    fixture *fx = a->data;
    pthread_mutex_lock(&fx->lock);
    if (fx->job != NULL && !fx->job_done) {
        fx->job(fx, fx->job_arg);
        fx->job_done = true;
        pthread_cond_signal(&fx->cond);
    }
    pthread_mutex_unlock(&fx->lock);
}

static void *loop_main(void *arg)
{
    fixture *fx = arg;
    uv_run(&fx->loop, UV_RUN_DEFAULT);
    return NULL;
}

static long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000L + ts.tv_nsec / 1000000L;
}

static void ms_sleep(int ms)
{
    usleep((useconds_t)ms * 1000);
}

/* Runs fn on the loop's thread and waits for it to have run. */
static void on_loop(fixture *fx, job_fn *fn, void *arg)
{
    pthread_mutex_lock(&fx->lock);
    fx->job = fn;
    fx->job_arg = arg;
    fx->job_done = false;
    uv_async_send(&fx->wake);
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += WAIT_MS / 1000;
    int rc = 0;
    while (!fx->job_done && rc == 0)
        rc = pthread_cond_timedwait(&fx->cond, &fx->lock, &until);
    bool done = fx->job_done;
    fx->job = NULL;
    pthread_mutex_unlock(&fx->lock);
    cr_assert(done, "the loop did not run a job within %d ms", WAIT_MS);
}

static fixture *fx_start_on(const rls_h2_limits *limits, bool reuseport)
{
    /* As a host must (rls_h2.h): a write libuv finishes later is write(2). */
    signal(SIGPIPE, SIG_IGN);
    fixture *fx = calloc(1, sizeof *fx);
    cr_assert_not_null(fx);
    cr_assert_eq(uv_loop_init(&fx->loop), 0);
    uv_async_init(&fx->loop, &fx->wake, on_wake);
    fx->wake.data = fx;
    pthread_mutex_init(&fx->lock, NULL);
    pthread_cond_init(&fx->cond, NULL);
    rls_h2_handler h = {on_call, on_cancel, fx};
    char err[256];
    fx->srv = rls_h2_listen(&fx->loop, "127.0.0.1", 0, reuseport, limits, &h,
                            err, sizeof err);
    cr_assert_not_null(fx->srv, "%s", err);
    fx->port = rls_h2_server_port(fx->srv);
    cr_assert_neq(fx->port, 0);
    cr_assert_eq(pthread_create(&fx->thread, NULL, loop_main, fx), 0);
    return fx;
}

static fixture *fx_start(const rls_h2_limits *limits)
{
    return fx_start_on(limits, false);
}

static void on_server_closed(void *arg)
{
    fixture *fx = arg;
    atomic_store(&fx->closed, 1);
    uv_close((uv_handle_t *)&fx->wake, NULL);
}

static void close_job(fixture *fx, void *arg)
{
    (void)arg;
    rls_h2_server_close(fx->srv, on_server_closed, fx);
}

static void stats_job(fixture *fx, void *arg)
{
    rls_h2_server_stats(fx->srv, arg);
}

static rls_h2_stats fx_stats(fixture *fx)
{
    rls_h2_stats st;
    on_loop(fx, stats_job, &st);
    return st;
}

/* Waits until the server has n connections open (a client's close
 * reaches it a moment later). */
static void wait_connections(fixture *fx, uint32_t n)
{
    long until = now_ms() + WAIT_MS;
    rls_h2_stats st = fx_stats(fx);
    while (st.connections != n && now_ms() < until) {
        usleep(2000);
        st = fx_stats(fx);
    }
    cr_assert_eq(st.connections, n, "%u connections open, not %u within %d "
                 "ms", st.connections, n, WAIT_MS);
}

static void drain_job(fixture *fx, void *arg)
{
    (void)arg;
    rls_h2_server_drain(fx->srv);
}

/* Closes the server, ends the loop's thread, and checks that every handle
 * was closed (uv_loop_close fails on one left open). */
static void fx_stop(fixture *fx)
{
    on_loop(fx, close_job, NULL);
    pthread_join(fx->thread, NULL);
    cr_assert_eq(atomic_load(&fx->closed), 1);
    cr_assert_eq(uv_loop_close(&fx->loop), 0);
    pthread_mutex_destroy(&fx->lock);
    pthread_cond_destroy(&fx->cond);
    free(fx);
}

/* Waits until *v == want, failing the test after WAIT_MS. */
static void wait_for(atomic_int *v, int want, const char *what)
{
    long until = now_ms() + WAIT_MS;
    while (atomic_load(v) != want && now_ms() < until)
        usleep(2000);
    cr_assert_eq(atomic_load(v), want, "%s: %d, not %d within %d ms", what,
                 atomic_load(v), want, WAIT_MS);
}

/* ---- the gRPC client ---- */

/* Runs the client with args; its output in out. */
static void grpc_client(fixture *fx, char *out, size_t cap, const char *args)
{
    cr_assert_eq(access(CLIENT, R_OK), 0,
                 "%s not found: run the tests from the source tree's root",
                 CLIENT);
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "timeout 30 /usr/bin/python3 " CLIENT " 127.0.0.1:%u %s 2>&1",
             fx->port, args);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = '\0';
    int status = pclose(p);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0,
              "%s failed:\n%s", cmd, out);
}

/* The client's next line (strtok on out first, then on NULL). */
static char *next_line(char *out)
{
    char *line = strtok(out, "\n");
    cr_assert_not_null(line, "the client printed fewer lines");
    return line;
}

/* The text whose hex is in hex, into text. */
static void unhex(const char *hex, char *text, size_t cap)
{
    size_t n = 0;
    while (hex[0] != '\0' && hex[1] != '\0' && n + 1 < cap) {
        unsigned byte;
        cr_assert_eq(sscanf(hex, "%2x", &byte), 1);
        text[n++] = (char)byte;
        hex += 2;
    }
    text[n] = '\0';
}

/* ---- the raw client: frames by hand, headers by nghttp2's HPACK ---- */

typedef struct raw {
    int fd;
    nghttp2_hd_deflater *deflater;
    nghttp2_hd_inflater *inflater;
} raw;

typedef struct frame {
    uint8_t type, flags;
    int32_t id;
    uint32_t len;
    uint8_t payload[1 << 16];
} frame;

/* What came back on one stream. */
typedef struct result {
    char status[8];       /* :status */
    int grpc_status;      /* -1: none */
    char grpc_message[256];
    uint8_t data[4096];
    size_t len;
    int rst;              /* RST_STREAM's code, -1: none */
    bool ended;
} result;

static int raw_connect(uint16_t port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    cr_assert_geq(fd, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    struct timeval tv = {WAIT_MS / 1000, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    return fd;
}

static void raw_send(raw *r, const void *p, size_t n)
{
    const uint8_t *b = p;
    while (n > 0) {
        ssize_t k = send(r->fd, b, n, MSG_NOSIGNAL);
        cr_assert_gt(k, 0, "send: %s", strerror(errno));
        b += k;
        n -= (size_t)k;
    }
}

static void raw_frame(raw *r, uint8_t type, uint8_t flags, int32_t id,
                      const void *payload, size_t len)
{
    uint8_t hd[9] = {(uint8_t)(len >> 16), (uint8_t)(len >> 8), (uint8_t)len,
                     type, flags, (uint8_t)(id >> 24), (uint8_t)(id >> 16),
                     (uint8_t)(id >> 8), (uint8_t)id};
    raw_send(r, hd, 9);
    if (len > 0)
        raw_send(r, payload, len);
}

static void raw_open_fd(raw *r, int fd, bool preface)
{
    memset(r, 0, sizeof *r);
    r->fd = fd;
    cr_assert_eq(nghttp2_hd_deflate_new(&r->deflater, 4096), 0);
    cr_assert_eq(nghttp2_hd_inflate_new(&r->inflater), 0);
    if (preface) {
        raw_send(r, NGHTTP2_CLIENT_MAGIC, NGHTTP2_CLIENT_MAGIC_LEN);
        raw_frame(r, NGHTTP2_SETTINGS, 0, 0, NULL, 0);
    }
}

static void raw_open(raw *r, fixture *fx, bool preface)
{
    int fd = raw_connect(fx->port);
    cr_assert_geq(fd, 0, "connect: %s", strerror(errno));
    raw_open_fd(r, fd, preface);
}

static void raw_close(raw *r)
{
    if (r->fd >= 0)
        close(r->fd);
    r->fd = -1;
    nghttp2_hd_deflate_del(r->deflater);
    nghttp2_hd_inflate_del(r->inflater);
}

#define RAW_NV(n, v)                                                        \
    {                                                                       \
        (uint8_t *)(n), (uint8_t *)(v), strlen(n), strlen(v),               \
            NGHTTP2_NV_FLAG_NONE                                            \
    }

static void raw_headers(raw *r, int32_t id, const nghttp2_nv *nva, size_t n,
                        uint8_t flags)
{
    uint8_t block[4096];
    ssize_t len = nghttp2_hd_deflate_hd(r->deflater, block, sizeof block, nva,
                                        n);
    cr_assert_gt(len, 0);
    raw_frame(r, NGHTTP2_HEADERS, flags | NGHTTP2_FLAG_END_HEADERS, id, block,
              (size_t)len);
}

/* A gRPC request's headers: method and content-type as given. */
static void raw_request_headers(raw *r, int32_t id, const char *method,
                                const char *path, const char *type,
                                uint8_t flags)
{
    nghttp2_nv nva[] = {
        RAW_NV(":method", method), RAW_NV(":scheme", "http"),
        RAW_NV(":path", path),     RAW_NV(":authority", "test"),
        RAW_NV("te", "trailers"),  RAW_NV("content-type", type),
    };
    raw_headers(r, id, nva, sizeof nva / sizeof *nva, flags);
}

/* A whole unary call: headers, then one DATA frame with the message. */
static void raw_call(raw *r, int32_t id, const char *path, const char *msg)
{
    raw_request_headers(r, id, "POST", path, "application/grpc", 0);
    uint8_t body[5 + 256];
    size_t len = strlen(msg);
    rls_grpc_prefix(body, (uint32_t)len);
    memcpy(body + 5, msg, len);
    raw_frame(r, NGHTTP2_DATA, NGHTTP2_FLAG_END_STREAM, id, body, len + 5);
}

static uint32_t u32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8
           | p[3];
}

/* 1: read; 0: the connection ended (EOF, reset); -1: WAIT_MS passed. */
static int read_all(int fd, uint8_t *p, size_t n)
{
    while (n > 0) {
        ssize_t k = recv(fd, p, n, 0);
        if (k == 0 || (k < 0 && errno == ECONNRESET))
            return 0;
        if (k < 0)
            return -1;
        p += k;
        n -= (size_t)k;
    }
    return 1;
}

/* The next frame: 1, or read_all's 0 (ended) or -1 (silent). */
static int raw_read_frame(raw *r, frame *f)
{
    uint8_t hd[9];
    int rc = read_all(r->fd, hd, 9);
    if (rc != 1)
        return rc;
    f->len = (uint32_t)hd[0] << 16 | (uint32_t)hd[1] << 8 | hd[2];
    f->type = hd[3];
    f->flags = hd[4];
    f->id = (int32_t)(((uint32_t)hd[5] << 24 | (uint32_t)hd[6] << 16
                       | (uint32_t)hd[7] << 8 | hd[8])
                      & 0x7fffffffu);
    cr_assert_leq(f->len, sizeof f->payload);
    return read_all(r->fd, f->payload, f->len);
}

static void take_header(result *res, const nghttp2_nv *nv)
{
    char value[256];
    snprintf(value, sizeof value, "%.*s", (int)nv->valuelen,
             (const char *)nv->value);
    if (nv->namelen == 7 && memcmp(nv->name, ":status", 7) == 0)
        snprintf(res->status, sizeof res->status, "%.7s", value);
    else if (nv->namelen == 11 && memcmp(nv->name, "grpc-status", 11) == 0)
        res->grpc_status = atoi(value);
    else if (nv->namelen == 12 && memcmp(nv->name, "grpc-message", 12) == 0)
        snprintf(res->grpc_message, sizeof res->grpc_message, "%s", value);
}

/* A HEADERS frame's fields (every block goes through the inflater, whose
 * table is the connection's), into res when there is one. */
static void decode_headers(raw *r, const frame *f, result *res)
{
    const uint8_t *in = f->payload;
    size_t left = f->len;
    for (;;) {
        nghttp2_nv nv;
        int flags = 0;
        ssize_t n = nghttp2_hd_inflate_hd2(r->inflater, &nv, &flags, in,
                                           left, 1);
        cr_assert_geq(n, 0, "a HEADERS block nghttp2 cannot decode");
        in += n;
        left -= (size_t)n;
        if ((flags & NGHTTP2_HD_INFLATE_EMIT) && res != NULL)
            take_header(res, &nv);
        if (flags & NGHTTP2_HD_INFLATE_FINAL) {
            nghttp2_hd_inflate_end_headers(r->inflater);
            return;
        }
        if (n == 0 && left == 0)
            return;
    }
}

/* What the connection said besides the streams asked for. */
typedef struct conn_seen {
    bool goaway;
    int32_t goaway_last;
    uint32_t goaway_code;
    int stray;            /* HEADERS or DATA of other streams */
} conn_seen;

static void see_goaway(conn_seen *seen, const frame *f)
{
    seen->goaway = true;
    seen->goaway_last = (int32_t)(u32(f->payload) & 0x7fffffffu);
    seen->goaway_code = u32(f->payload + 4);
}

/* Reads frames until streams ids[0..n) have ended (END_STREAM or
 * RST_STREAM), each into res[i]; the connection's GOAWAY into seen.
 * False if the connection ended or went silent first. */
static bool raw_read_streams(raw *r, const int32_t *ids, result *res,
                             size_t n, conn_seen *seen)
{
    for (size_t i = 0; i < n; i++) {
        memset(&res[i], 0, sizeof res[i]);
        res[i].grpc_status = res[i].rst = -1;
    }
    static frame f;
    for (;;) {
        size_t open = 0;
        for (size_t i = 0; i < n; i++)
            open += !res[i].ended;
        if (open == 0)
            return true;
        if (raw_read_frame(r, &f) != 1)
            return false;
        result *to = NULL;
        for (size_t i = 0; i < n; i++)
            if (ids[i] == f.id)
                to = &res[i];
        if (f.type == NGHTTP2_HEADERS)
            decode_headers(r, &f, to);
        if (f.type == NGHTTP2_GOAWAY)
            see_goaway(seen, &f);
        if (to == NULL) {
            seen->stray += f.id != 0 && (f.type == NGHTTP2_HEADERS
                                         || f.type == NGHTTP2_DATA);
            continue;
        }
        if (f.type == NGHTTP2_DATA) {
            cr_assert_leq(to->len + f.len, sizeof to->data);
            memcpy(to->data + to->len, f.payload, f.len);
            to->len += f.len;
        }
        if (f.type == NGHTTP2_RST_STREAM) {
            to->rst = (int)u32(f.payload);
            to->ended = true;
        }
        if ((f.type == NGHTTP2_HEADERS || f.type == NGHTTP2_DATA)
            && (f.flags & NGHTTP2_FLAG_END_STREAM))
            to->ended = true;
    }
}

/* Reads until the server closes the connection: true if it did within
 * WAIT_MS; a GOAWAY on the way goes into seen. */
static bool raw_until_closed(raw *r, conn_seen *seen)
{
    static frame f;
    long until = now_ms() + WAIT_MS;
    while (now_ms() < until) {
        int rc = raw_read_frame(r, &f);
        if (rc != 1)
            return rc == 0;
        if (f.type == NGHTTP2_HEADERS)
            decode_headers(r, &f, NULL);
        if (f.type == NGHTTP2_GOAWAY)
            see_goaway(seen, &f);
    }
    return false;
}

/* The server says GOAWAY with code, naming last, and closes; r is closed
 * after. */
static void expect_goaway_and_close(raw *r, uint32_t code, int32_t last)
{
    conn_seen seen = {0};
    cr_assert(raw_until_closed(r, &seen), "the connection stayed open");
    cr_expect(seen.goaway, "no GOAWAY before the close");
    cr_expect_eq(seen.goaway_code, code);
    cr_expect_eq(seen.goaway_last, last);
    raw_close(r);
}

/* One call's whole answer, expected OK with msg echoed. */
static void expect_echo(const result *res, const char *msg)
{
    cr_assert(res->ended);
    cr_assert_str_eq(res->status, "200");
    cr_assert_eq(res->grpc_status, 0);
    cr_assert_eq(res->len, 5 + strlen(msg));
    cr_assert_eq(u32(res->data + 1), strlen(msg));
    cr_assert_eq(memcmp(res->data + 5, msg, strlen(msg)), 0);
}

/* A new connection still gets a call answered. */
static void expect_served(fixture *fx)
{
    raw r;
    raw_open(&r, fx, true);
    raw_call(&r, 1, "/t.T/Echo", "still here");
    int32_t id = 1;
    result res;
    conn_seen seen = {0};
    cr_assert(raw_read_streams(&r, &id, &res, 1, &seen),
              "a new connection was not served");
    expect_echo(&res, "still here");
    raw_close(&r);
}

static const rls_h2_limits test_limits = {
    .max_message = 256 * 1024,
    .max_concurrent_streams = 1024,
    .max_connections = 64,
    .write_timeout_ms = 300,
};

/* ---- 1. a real gRPC client ---- */

Test(rls_h2, echo_round_trips_through_a_grpc_client)
{
    fixture *fx = fx_start(&test_limits);
    char out[4096];
    grpc_client(fx, out, sizeof out,
                "/t.T/Echo x - /t.T/Echo x68656c6c6f - /t.T/Echo n100000 -"
                " /t.T/Later x6c61746572 -");
    cr_expect_str_eq(out, "0 0 same 0\n1 0 same 5\n2 0 same 100000\n"
                          "3 0 same 5\n");
    cr_expect_eq(fx_stats(fx).accepted, 1);
    fx_stop(fx);
}

Test(rls_h2, two_hundred_concurrent_calls_on_one_connection_any_order)
{
    fixture *fx = fx_start(&test_limits);
    /* Nothing is answered before all 200 are held: they are in flight at
     * once, and answered last first. */
    atomic_store(&fx->gather_n, 200);
    static char out[16384];
    grpc_client(fx, out, sizeof out, "--concurrent 200 /t.T/Gather x 20");
    char *line = out;
    for (int i = 0; i < 200; i++) {
        char want[32];
        int n = snprintf(want, sizeof want, "%d 0 same %d\n", i,
                         i < 10 ? 1 : i < 100 ? 2 : 3);
        cr_assert_eq(strncmp(line, want, (size_t)n), 0,
                     "call %d: %.40s (want %s)", i, line, want);
        line += n;
    }
    cr_expect_str_eq(line, "");
    rls_h2_stats st = fx_stats(fx);
    cr_expect_eq(st.accepted, 1, "the calls came on %llu connections",
                 (unsigned long long)st.accepted);
    cr_expect_eq(atomic_load(&fx->calls), 200);
    fx_stop(fx);
}

Test(rls_h2, status_and_percent_encoded_message_reach_the_client)
{
    fixture *fx = fx_start(&test_limits);
    /* "3:bad 100% \"é\"\n, %41": every kind of byte grpc-message escapes. */
    const char *text = "bad 100% \"\xc3\xa9\"\n, %41";
    char hex[256] = "x", args[1024];
    char spec[256];
    snprintf(spec, sizeof spec, "3:%s", text);
    for (size_t i = 0; spec[i] != '\0'; i++)
        sprintf(hex + 1 + 2 * i, "%02x", (unsigned char)spec[i]);
    snprintf(args, sizeof args, "/t.T/Fail %s - /t.T/Fail x383a - "
             "/t.T/Nope x00 -", hex);
    char out[4096];
    grpc_client(fx, out, sizeof out, args);
    char details[256], got[256];
    unsigned code;
    char *line = next_line(out);
    cr_assert_eq(sscanf(line, "0 %u %255s", &code, got), 2, "%s", line);
    cr_expect_eq(code, 3);
    unhex(got, details, sizeof details);
    cr_expect_str_eq(details, text);
    /* An error with no text: grpc-status alone, trailers-only. */
    cr_expect_str_eq(next_line(NULL), "1 8 -");
    line = next_line(NULL);
    cr_assert_eq(sscanf(line, "2 %u %255s", &code, got), 2, "%s", line);
    cr_expect_eq(code, 12);
    unhex(got, details, sizeof details);
    cr_expect_str_eq(details, "unknown method");
    fx_stop(fx);
}

Test(rls_h2, grpc_timeout_reaches_the_handler)
{
    fixture *fx = fx_start(&test_limits);
    char out[1024];
    grpc_client(fx, out, sizeof out,
                "/t.T/Timeout x 2.5 /t.T/Timeout x -");
    char got[64], text[32];
    cr_assert_eq(sscanf(out, "0 0 %63s", got), 1, "%s", out);
    unhex(got, text, sizeof text);
    long ms = atol(text);
    /* gRPC core may round a timeout up as it encodes it (its units
     * include tens of ms): 2.5 s has come as "2510m". */
    cr_expect(ms > 2000 && ms <= 2510, "grpc-timeout of 2.5 s came as %ld ms",
              ms);
    cr_expect_neq(strstr(out, "\n1 0 30\n"), NULL, "no timeout came as %s",
                  out);
    fx_stop(fx);
}

Test(rls_h2, a_message_over_the_cap_is_resource_exhausted)
{
    fixture *fx = fx_start(&test_limits);
    char out[4096];
    grpc_client(fx, out, sizeof out,
                "/t.T/Echo n262145 - /t.T/Echo n262144 - /t.T/Echo n1 -");
    char *line = next_line(out);
    unsigned code;
    cr_assert_eq(sscanf(line, "0 %u", &code), 1, "%s", line);
    cr_expect_eq(code, 8, "%s", line);
    /* Exactly the cap passes, and the connection goes on. */
    cr_expect_str_eq(next_line(NULL), "1 0 same 262144");
    cr_expect_str_eq(next_line(NULL), "2 0 same 1");
    cr_expect_eq(atomic_load(&fx->calls), 2);
    cr_expect_eq(fx_stats(fx).accepted, 1);
    fx_stop(fx);
}

/* ---- 2. raw bytes: what broken or hostile peers send ---- */

Test(rls_h2, garbage_instead_of_the_preface_closes_that_connection_only)
{
    fixture *fx = fx_start(&test_limits);
    raw bad;
    raw_open(&bad, fx, false);
    const char *http1 = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    raw_send(&bad, http1, strlen(http1));
    expect_goaway_and_close(&bad, NGHTTP2_PROTOCOL_ERROR, 0);
    expect_served(fx);
    cr_expect_eq(atomic_load(&fx->calls), 1);
    fx_stop(fx);
}

Test(rls_h2, a_malformed_frame_gets_goaway_and_the_close)
{
    fixture *fx = fx_start(&test_limits);
    /* SETTINGS of 5 bytes: not a multiple of 6, FRAME_SIZE_ERROR. */
    raw bad;
    raw_open(&bad, fx, true);
    raw_frame(&bad, NGHTTP2_SETTINGS, 0, 0, "\0\3\0\0\0", 5);
    expect_goaway_and_close(&bad, NGHTTP2_FRAME_SIZE_ERROR, 0);
    /* DATA on stream 0: PROTOCOL_ERROR. */
    raw_open(&bad, fx, true);
    raw_frame(&bad, NGHTTP2_DATA, 0, 0, "xx", 2);
    expect_goaway_and_close(&bad, NGHTTP2_PROTOCOL_ERROR, 0);
    expect_served(fx);
    fx_stop(fx);
}

Test(rls_h2, a_get_is_405_and_a_post_not_grpc_is_415)
{
    fixture *fx = fx_start(&test_limits);
    raw r;
    raw_open(&r, fx, true);
    raw_request_headers(&r, 1, "GET", "/t.T/Echo", "application/grpc",
                        NGHTTP2_FLAG_END_STREAM);
    raw_request_headers(&r, 3, "POST", "/t.T/Echo", "text/plain",
                        NGHTTP2_FLAG_END_STREAM);
    /* Not ended by the client: answered, then RST_STREAM NO_ERROR. */
    raw_request_headers(&r, 5, "PUT", "/t.T/Echo", "application/grpc", 0);
    raw_call(&r, 7, "/t.T/Echo", "after");
    int32_t ids[] = {1, 3, 5, 7};
    result res[4];
    conn_seen seen = {0};
    cr_assert(raw_read_streams(&r, ids, res, 4, &seen));
    cr_expect_str_eq(res[0].status, "405");
    cr_expect_eq(res[0].rst, -1);
    cr_expect_str_eq(res[1].status, "415");
    cr_expect_str_eq(res[2].status, "405");
    /* The RST_STREAM follows the HEADERS that ended the stream, maybe
     * after stream 7's answer. */
    int rst = res[2].rst;
    if (rst == -1) {
        result more;
        cr_assert(raw_read_streams(&r, &ids[2], &more, 1, &seen));
        rst = more.rst;
    }
    cr_expect_eq(rst, NGHTTP2_NO_ERROR);
    expect_echo(&res[3], "after");
    cr_expect_eq(atomic_load(&fx->calls), 1);
    raw_close(&r);
    fx_stop(fx);
}

Test(rls_h2, compressed_missing_and_second_messages_are_refused)
{
    fixture *fx = fx_start(&test_limits);
    raw r;
    raw_open(&r, fx, true);
    /* The compressed flag. */
    raw_request_headers(&r, 1, "POST", "/t.T/Echo", "application/grpc", 0);
    raw_frame(&r, NGHTTP2_DATA, NGHTTP2_FLAG_END_STREAM, 1, "\1\0\0\0\1x", 6);
    /* No message at all. */
    raw_request_headers(&r, 3, "POST", "/t.T/Echo", "application/grpc",
                        NGHTTP2_FLAG_END_STREAM);
    /* Two messages. */
    raw_request_headers(&r, 5, "POST", "/t.T/Echo", "application/grpc", 0);
    raw_frame(&r, NGHTTP2_DATA, NGHTTP2_FLAG_END_STREAM, 5,
              "\0\0\0\0\1a\0\0\0\0\1b", 12);
    /* A message cut short. */
    raw_request_headers(&r, 7, "POST", "/t.T/Echo", "application/grpc", 0);
    raw_frame(&r, NGHTTP2_DATA, NGHTTP2_FLAG_END_STREAM, 7, "\0\0\0\0\5ab", 7);
    int32_t ids[] = {1, 3, 5, 7};
    result res[4];
    conn_seen seen = {0};
    cr_assert(raw_read_streams(&r, ids, res, 4, &seen));
    cr_expect_eq(res[0].grpc_status, RLS_GRPC_UNIMPLEMENTED);
    cr_expect_eq(res[1].grpc_status, RLS_GRPC_INTERNAL);
    cr_expect_eq(res[2].grpc_status, RLS_GRPC_INTERNAL);
    cr_expect_eq(res[3].grpc_status, RLS_GRPC_INTERNAL);
    for (int i = 0; i < 4; i++) {
        /* Trailers-only: one HEADERS, no DATA. */
        cr_expect_str_eq(res[i].status, "200");
        cr_expect_eq(res[i].len, 0);
        cr_expect_neq(res[i].grpc_message[0], '\0');
    }
    cr_expect_eq(atomic_load(&fx->calls), 0);
    raw_close(&r);
    fx_stop(fx);
}

Test(rls_h2, a_reset_call_is_cancelled_and_never_answered)
{
    fixture *fx = fx_start(&test_limits);
    raw r;
    raw_open(&r, fx, true);
    raw_call(&r, 1, "/t.T/Later", "late");
    wait_for(&fx->calls, 1, "calls");
    uint8_t cancel[4] = {0, 0, 0, NGHTTP2_CANCEL};
    raw_frame(&r, NGHTTP2_RST_STREAM, 0, 1, cancel, 4);
    wait_for(&fx->cancels, 1, "cancels");
    /* Past the 1 s of Later's timer, which on_cancel stopped. */
    ms_sleep(1100);
    raw_call(&r, 3, "/t.T/Echo", "next");
    int32_t id = 3;
    result res;
    conn_seen seen = {0};
    cr_assert(raw_read_streams(&r, &id, &res, 1, &seen));
    expect_echo(&res, "next");
    /* Anything for stream 1 would have come before stream 3's answer. */
    cr_expect_eq(seen.stray, 0, "the cancelled call was answered");
    cr_expect_eq(fx_stats(fx).calls, 0);
    raw_close(&r);
    expect_served(fx);
    fx_stop(fx);
}

Test(rls_h2, a_connection_closed_with_calls_held_cancels_them)
{
    fixture *fx = fx_start(&test_limits);
    raw r;
    raw_open(&r, fx, true);
    raw_call(&r, 1, "/t.T/Hold", "a");
    raw_call(&r, 3, "/t.T/Hold", "b");
    raw_call(&r, 5, "/t.T/Later", "c");
    wait_for(&fx->calls, 3, "calls");
    raw_close(&r);
    wait_for(&fx->cancels, 3, "cancels");
    cr_expect_eq(atomic_load(&fx->n_held), 0);
    expect_served(fx);
    wait_connections(fx, 0);
    cr_expect_eq(fx_stats(fx).calls, 0);
    fx_stop(fx);
}

Test(rls_h2, streams_over_the_limit_are_refused)
{
    rls_h2_limits limits = test_limits;
    limits.max_concurrent_streams = 4;
    fixture *fx = fx_start(&limits);
    raw r;
    raw_open(&r, fx, true);
    for (int32_t id = 1; id <= 9; id += 2)
        raw_call(&r, id, "/t.T/Hold", "h");
    int32_t refused = 9;
    result res;
    conn_seen seen = {0};
    cr_assert(raw_read_streams(&r, &refused, &res, 1, &seen));
    cr_expect_eq(res.rst, NGHTTP2_REFUSED_STREAM);
    wait_for(&fx->n_held, 4, "held");
    on_loop(fx, release_all, NULL);
    int32_t ids[] = {1, 3, 5, 7};
    result ok[4];
    cr_assert(raw_read_streams(&r, ids, ok, 4, &seen));
    for (int i = 0; i < 4; i++)
        expect_echo(&ok[i], "h");
    cr_expect_eq(atomic_load(&fx->calls), 4);
    raw_close(&r);
    fx_stop(fx);
}

Test(rls_h2, connections_over_the_limit_are_closed_at_once)
{
    rls_h2_limits limits = test_limits;
    limits.max_connections = 2;
    fixture *fx = fx_start(&limits);
    raw a, b, c;
    raw_open(&a, fx, true);
    raw_open(&b, fx, true);
    /* Both are the server's before the third comes. */
    wait_connections(fx, 2);
    raw_open(&c, fx, false);
    conn_seen seen = {0};
    cr_assert(raw_until_closed(&c, &seen), "a third connection stayed open");
    raw_close(&c);
    raw_call(&a, 1, "/t.T/Echo", "a");
    raw_call(&b, 1, "/t.T/Echo", "b");
    int32_t id = 1;
    result res;
    cr_assert(raw_read_streams(&a, &id, &res, 1, &seen));
    expect_echo(&res, "a");
    cr_assert(raw_read_streams(&b, &id, &res, 1, &seen));
    expect_echo(&res, "b");
    rls_h2_stats st = fx_stats(fx);
    cr_expect_eq(st.accepted, 3);
    cr_expect_eq(st.refused, 1);
    raw_close(&a);
    raw_close(&b);
    fx_stop(fx);
}

Test(rls_h2, a_peer_that_never_reads_is_cut_off)
{
    fixture *fx = fx_start(&test_limits);
    /* A small receive buffer, set before connecting, and flow-control
     * windows opened wide: only the sockets' buffers hold answers back. */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    int small = 4096;
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
    struct sockaddr_in sa = {.sin_family = AF_INET,
                             .sin_port = htons(fx->port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    cr_assert_eq(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    raw r;
    raw_open_fd(&r, fd, false);
    raw_send(&r, NGHTTP2_CLIENT_MAGIC, NGHTTP2_CLIENT_MAGIC_LEN);
    uint8_t settings[6] = {0, NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE,
                           0x7f, 0xff, 0xff, 0xff};
    raw_frame(&r, NGHTTP2_SETTINGS, 0, 0, settings, 6);
    uint8_t window[4] = {0x7f, 0xff, 0x00, 0x00};
    raw_frame(&r, NGHTTP2_WINDOW_UPDATE, 0, 0, window, 4);
    /* 8 answers of 1 MiB: more than the sockets' buffers (the server's
     * send buffer grows to 4 MiB here) hold. */
    int32_t id = 1;
    for (; id < 16; id += 2)
        raw_call(&r, id, "/t.T/Size", "1048576");
    long until = now_ms() + WAIT_MS;
    while (fx_stats(fx).waiting == 0 && now_ms() < until)
        usleep(1000);
    cr_assert_eq(fx_stats(fx).waiting, 1, "no write waits for the peer");
    /* Its output waits: what it sends now is not read, so no more answers
     * pile up behind. */
    int before = atomic_load(&fx->calls);
    cr_expect_geq(before, 1);
    for (; id < 24; id += 2)
        raw_call(&r, id, "/t.T/Size", "1048576");
    ms_sleep(100);
    cr_expect_eq(atomic_load(&fx->calls), before,
                 "calls were read while the connection's output waited");
    /* Meanwhile others are served. */
    expect_served(fx);
    /* It is cut off (RST) after write_timeout_ms: POLLHUP and POLLERR
     * come without being asked for. */
    struct pollfd pfd = {fd, 0, 0};
    cr_assert_eq(poll(&pfd, 1, WAIT_MS), 1, "the connection stayed open");
    cr_expect(pfd.revents & (POLLHUP | POLLERR));
    wait_connections(fx, 0);
    rls_h2_stats st = fx_stats(fx);
    cr_expect_eq(st.stalled, 1);
    cr_expect_eq(st.calls, 0);
    cr_expect_eq(st.waiting, 0);
    raw_close(&r);
    fx_stop(fx);
}

/* Waits for the server's SETTINGS: the session exists. */
static void expect_settings(raw *r)
{
    static frame f;
    cr_assert_eq(raw_read_frame(r, &f), 1, "no SETTINGS from the server");
    cr_assert_eq(f.type, NGHTTP2_SETTINGS);
}

Test(rls_h2, idle_connections_hold_little_memory)
{
    enum { N = 200 };
    rls_h2_limits limits = test_limits;
    limits.max_connections = N;
    fixture *fx = fx_start(&limits);
    size_t base = fx_stats(fx).bytes;
    static raw r[N];
    for (int i = 0; i < N; i++)
        raw_open(&r[i], fx, false);
    wait_connections(fx, N);
    rls_h2_stats st = fx_stats(fx);
    size_t silent = (st.bytes - base) / N;
    /* Connected, nothing sent: the handle and the connection's state. */
    cr_expect_leq(silent, 1024, "%zu bytes a silent connection", silent);
    for (int i = 0; i < N; i++) {
        raw_send(&r[i], NGHTTP2_CLIENT_MAGIC, NGHTTP2_CLIENT_MAGIC_LEN);
        raw_frame(&r[i], NGHTTP2_SETTINGS, 0, 0, NULL, 0);
        expect_settings(&r[i]);
    }
    st = fx_stats(fx);
    cr_assert_eq(st.sessions, N);
    size_t idle = (st.bytes - base) / N;
    /* An idle HTTP/2 connection: nghttp2's session (its 16 KiB frame
     * buffer and HPACK tables, 25 KiB with nghttp2 1.52) and no buffer
     * of ours. */
    cr_expect_leq(idle, 28 * 1024, "%zu bytes an idle HTTP/2 connection",
                  idle);
    fprintf(stderr, "rls_h2: %zu bytes a silent connection, %zu an idle "
            "HTTP/2 one\n", silent, idle);
    for (int i = 0; i < N; i++)
        raw_close(&r[i]);
    fx_stop(fx);
}

/* A second server on the fixture's loop, on its port. */
typedef struct second {
    rls_h2_server *srv;
    char err[256];
    rls_h2_stats stats;
    atomic_int closed;
} second;

static void second_listen(fixture *fx, void *arg)
{
    second *b = arg;
    rls_h2_handler h = {on_call, on_cancel, fx};
    b->srv = rls_h2_listen(&fx->loop, "127.0.0.1", fx->port, true,
                           &test_limits, &h, b->err, sizeof b->err);
}

static void second_stats(fixture *fx, void *arg)
{
    (void)fx;
    second *b = arg;
    rls_h2_server_stats(b->srv, &b->stats);
}

static void second_closed(void *arg)
{
    second *b = arg;
    atomic_store(&b->closed, 1);
}

static void second_close(fixture *fx, void *arg)
{
    (void)fx;
    second *b = arg;
    rls_h2_server_close(b->srv, second_closed, b);
}

Test(rls_h2, two_servers_share_a_port_with_reuseport)
{
    fixture *fx = fx_start_on(&test_limits, true);
    static second b;
    on_loop(fx, second_listen, &b);
    cr_assert_not_null(b.srv, "%s", b.err);
    cr_expect_eq(rls_h2_server_port(b.srv), fx->port);
    /* The kernel spreads connections over both; each serves its own. */
    enum { N = 24 };
    for (int i = 0; i < N; i++)
        expect_served(fx);
    rls_h2_stats a = fx_stats(fx);
    on_loop(fx, second_stats, &b);
    cr_expect_eq(a.accepted + b.stats.accepted, N);
    cr_expect_gt(a.accepted, 0);
    cr_expect_gt(b.stats.accepted, 0);
    on_loop(fx, second_close, &b);
    wait_for(&b.closed, 1, "second server closed");
    fx_stop(fx);
}

Test(rls_h2, listen_errors_say_what_failed)
{
    fixture *fx = fx_start(&test_limits);
    uv_loop_t loop;
    cr_assert_eq(uv_loop_init(&loop), 0);
    rls_h2_handler h = {on_call, on_cancel, NULL};
    char err[256], want[64];
    /* The port is taken, by a listener without SO_REUSEPORT. */
    cr_expect_null(rls_h2_listen(&loop, "127.0.0.1", fx->port, true, NULL,
                                 &h, err, sizeof err));
    snprintf(want, sizeof want, "cannot listen on 127.0.0.1:%u: ", fx->port);
    cr_expect_eq(strncmp(err, want, strlen(want)), 0, "%s", err);
    cr_expect_neq(strstr(err, "in use"), NULL, "%s", err);
    /* An address of no interface here (TEST-NET-1). */
    cr_expect_null(rls_h2_listen(&loop, "192.0.2.1", 0, false, NULL, &h, err,
                                 sizeof err));
    cr_expect_str_eq(err, "cannot listen on 192.0.2.1:0: Cannot assign "
                          "requested address");
    /* A handler without on_cancel. */
    rls_h2_handler half = {on_call, NULL, NULL};
    cr_expect_null(rls_h2_listen(&loop, "127.0.0.1", 0, false, NULL, &half,
                                 err, sizeof err));
    cr_expect_neq(strstr(err, "on_cancel"), NULL, "%s", err);
    cr_expect_eq(uv_run(&loop, UV_RUN_DEFAULT), 0);
    cr_expect_eq(uv_loop_close(&loop), 0);
    fx_stop(fx);
}

/* ---- 3. drain ---- */

Test(rls_h2, a_drain_answers_held_calls_then_closes)
{
    fixture *fx = fx_start(&test_limits);
    raw r, idle;
    raw_open(&r, fx, true);
    raw_open(&idle, fx, true);
    expect_settings(&idle);
    raw_call(&r, 1, "/t.T/Hold", "held");
    wait_for(&fx->n_held, 1, "held");
    on_loop(fx, drain_job, NULL);
    /* A new connection is refused. */
    int fd = raw_connect(fx->port);
    cr_expect_lt(fd, 0, "a connection was accepted while draining");
    cr_expect_eq(errno, ECONNREFUSED);
    if (fd >= 0)
        close(fd);
    /* The idle connection: GOAWAY, then closed. */
    expect_goaway_and_close(&idle, NGHTTP2_NO_ERROR, 0);
    /* The held call is answered after the drain began, and delivered. */
    ms_sleep(50);
    on_loop(fx, release_all, NULL);
    int32_t id = 1;
    result res;
    conn_seen seen = {0};
    cr_assert(raw_read_streams(&r, &id, &res, 1, &seen));
    cr_expect(seen.goaway);
    cr_expect_eq(seen.goaway_code, NGHTTP2_NO_ERROR);
    cr_expect_eq(seen.goaway_last, 1);
    expect_echo(&res, "held");
    /* Then the connection is closed. */
    cr_assert(raw_until_closed(&r, &seen),
              "the drained connection stayed open");
    raw_close(&r);
    wait_connections(fx, 0);
    cr_expect_eq(atomic_load(&fx->cancels), 0);
    fx_stop(fx);
}

Test(rls_h2, closing_the_server_cancels_held_calls)
{
    fixture *fx = fx_start(&test_limits);
    raw r;
    raw_open(&r, fx, true);
    raw_call(&r, 1, "/t.T/Hold", "a");
    raw_call(&r, 3, "/t.T/Later", "b");
    wait_for(&fx->calls, 2, "calls");
    on_loop(fx, close_job, NULL);
    pthread_join(fx->thread, NULL);
    cr_expect_eq(atomic_load(&fx->cancels), 2);
    cr_expect_eq(atomic_load(&fx->closed), 1);
    cr_expect_eq(uv_loop_close(&fx->loop), 0);
    conn_seen seen = {0};
    cr_expect(raw_until_closed(&r, &seen));
    raw_close(&r);
    free(fx);
}

/* ---- 4. connection age (GRPC_MAX_CONNECTION_AGE, _GRACE) ---- */

/* After its age (1 s, give or take 10%), a connection gets a GOAWAY
 * naming its last call: an idle one is closed, one holding a call has it
 * answered, then is closed; new connections are served. */
Test(rls_h2, an_old_connection_gets_goaway_its_calls_answered)
{
    rls_h2_limits limits = test_limits;
    limits.max_connection_age_ms = 1000;
    limits.max_connection_age_grace_ms = 5000;
    fixture *fx = fx_start(&limits);
    long t0 = now_ms();
    raw r, idle;
    raw_open(&r, fx, true);
    raw_open(&idle, fx, true);
    expect_settings(&idle);
    raw_call(&r, 1, "/t.T/Hold", "held");
    wait_for(&fx->n_held, 1, "held");
    expect_goaway_and_close(&idle, NGHTTP2_NO_ERROR, 0);
    long aged = now_ms() - t0;
    cr_expect(aged >= 880 && aged <= 2500, "idle closed after %ld ms", aged);
    expect_served(fx);
    /* Every connection of t0 is past its age (1.1 s at most, looked at
     * every 100 ms) before the held call is answered. */
    long past = t0 + 1300 - now_ms();
    if (past > 0)
        ms_sleep((int)past);
    on_loop(fx, release_all, NULL);
    int32_t id = 1;
    result res;
    conn_seen seen = {0};
    cr_assert(raw_read_streams(&r, &id, &res, 1, &seen));
    cr_expect(seen.goaway, "no GOAWAY on the old connection");
    cr_expect_eq(seen.goaway_last, 1);
    expect_echo(&res, "held");
    cr_assert(raw_until_closed(&r, &seen), "the old connection stayed open");
    raw_close(&r);
    cr_expect_eq(atomic_load(&fx->cancels), 0);
    fx_stop(fx);
}

/* The grace over, an old connection is closed with its call unanswered
 * (cancelled): at about age + grace, not before. */
Test(rls_h2, an_old_connection_is_closed_after_the_grace)
{
    rls_h2_limits limits = test_limits;
    limits.max_connection_age_ms = 500;
    limits.max_connection_age_grace_ms = 1000;
    fixture *fx = fx_start(&limits);
    long t0 = now_ms();
    raw r;
    raw_open(&r, fx, true);
    raw_call(&r, 1, "/t.T/Hold", "never");
    wait_for(&fx->n_held, 1, "held");
    conn_seen seen = {0};
    cr_assert(raw_until_closed(&r, &seen), "still open after the grace");
    long closed = now_ms() - t0;
    raw_close(&r);
    cr_expect(seen.goaway);
    cr_expect(closed >= 1400 && closed <= 3500, "closed after %ld ms",
              closed);
    wait_for(&fx->cancels, 1, "the held call cancelled");
    fx_stop(fx);
}
