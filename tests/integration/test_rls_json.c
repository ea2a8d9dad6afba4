/*
 * rl-rls's /json endpoint, black box, as upstream's: a RateLimitRequest in
 * proto3 JSON POSTed to HOST:PORT, the RateLimitResponse in proto3 JSON
 * back (200 OK, 429 OVER_LIMIT), counted with gRPC's calls; a body that is
 * not a request is a 400 that says why, one over 4 MiB a 413. A body may
 * come chunked (Transfer-Encoding: chunked, as curl -T - sends it); a
 * worker with RLS_WORKER_CALLS_MAX calls waiting answers 503.
 */
#include "test_agent.h"
#include "redis_server.h"
#include "test_env.h"
#include "test_gateway.h"
#include "test_process.h"
#include "test_rls.h"

#include <criterion/criterion.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

static const char limits[] =
    "domain: edge\n"
    "descriptors:\n"
    "  - key: user\n"
    "    rate_limit: {unit: hour, requests_per_unit: 2}\n";

static const char *rl_yaml(void)
{
    static char yaml[256];
    snprintf(yaml, sizeof yaml, "store: {url: \"redis://%s\", "
             "timeout_ms: 2000}\n", test_env("RL_TEST_REDIS"));
    return yaml;
}

/* POST /json with body, on a connection of its own. */
static void post_json(uint16_t port, const char *body,
                      test_http_response *out)
{
    static char raw[8192];
    snprintf(raw, sizeof raw, "POST /json HTTP/1.1\r\nHost: x\r\n"
             "Content-Type: application/json\r\nContent-Length: %zu\r\n"
             "\r\n%s", strlen(body), body);
    int fd = test_http_connect(port);
    test_http_exchange(fd, raw, out, 1);
    close(fd);
}

/* A call for user's value, in proto3 JSON (camelCase, hits as a string,
 * as protojson reads them). */
static const char *user_call(const char *domain, const char *user)
{
    static char body[512];
    snprintf(body, sizeof body, "{\"domain\": \"%s\", \"descriptors\": "
             "[{\"entries\": [{\"key\": \"user\", \"value\": \"%s\"}]}], "
             "\"hitsAddend\": \"1\"}", domain, user);
    return body;
}

static void expect_body_starts(const test_http_response *r, const char *want)
{
    cr_assert(strncmp(r->body, want, strlen(want)) == 0,
              "body %s, not %s...", r->body, want);
}

Test(rls_json, counts_down_then_429_with_upstreams_fields)
{
    test_rls r;
    test_rls_start(&r, limits, rl_yaml(), NULL);
    test_http_response resp;
    post_json(r.http_port, user_call("edge", "j1"), &resp);
    cr_assert_eq(resp.status, 200, "%d: %s", resp.status, resp.body);
    cr_assert_str_eq(test_http_header(&resp, "Content-Type"),
                     "application/json");
    expect_body_starts(&resp, "{\"overallCode\":\"OK\",\"statuses\":[{"
                       "\"code\":\"OK\",\"currentLimit\":{\"requestsPerUnit\""
                       ":2,\"unit\":\"HOUR\"},\"limitRemaining\":1,"
                       "\"durationUntilReset\":\"");
    int reset = atoi(strstr(resp.body, "Reset\":\"") + 8);
    cr_assert(reset >= 1 && reset <= 3600, "reset in %d s", reset);
    cr_assert(strstr(resp.body, "s\"}]}") != NULL, "%s", resp.body);
    post_json(r.http_port, user_call("edge", "j1"), &resp);
    cr_assert_eq(resp.status, 200, "%d: %s", resp.status, resp.body);
    /* Zero fields are left out, as protojson leaves them. */
    cr_assert(strstr(resp.body, "limitRemaining") == NULL, "%s", resp.body);
    post_json(r.http_port, user_call("edge", "j1"), &resp);
    cr_assert_eq(resp.status, 429, "%d: %s", resp.status, resp.body);
    expect_body_starts(&resp, "{\"overallCode\":\"OVER_LIMIT\",\"statuses\":"
                       "[{\"code\":\"OVER_LIMIT\",\"currentLimit\":{");
    post_json(r.http_port, user_call("elsewhere", "j1"), &resp);
    cr_assert_eq(resp.status, 200, "an unknown domain: %d", resp.status);
    cr_assert_str_eq(resp.body,
                     "{\"overallCode\":\"OK\",\"statuses\":[{\"code\":\"OK\""
                     "}]}");
    test_rls_stop(&r);
}

/* One call by JSON, one by gRPC: the third is over the limit of 2. */
Test(rls_json, counts_with_grpc_calls)
{
    test_rls r;
    test_rls_start(&r, limits, rl_yaml(), NULL);
    test_http_response resp;
    post_json(r.http_port, user_call("edge", "j2"), &resp);
    cr_assert_eq(resp.status, 200, "%d: %s", resp.status, resp.body);
    static char out[1024];
    test_rls_call(&r, out, sizeof out,
                  "{\"domain\": \"edge\", \"descriptors\": [{\"entries\": "
                  "[[\"user\", \"j2\"]]}]}", NULL);
    cr_assert(strncmp(out, "OK OK OK:0:2/HOUR", 17) == 0, "gRPC: %s", out);
    post_json(r.http_port, "{\"domain\": \"edge\", \"descriptors\": "
              "[{\"entries\": [{\"key\": \"user\", \"value\": \"j2\"}]}], "
              "\"hits_addend\": 1}", &resp);
    cr_assert_eq(resp.status, 429, "%d: %s", resp.status, resp.body);
    test_rls_stop(&r);
}

static void expect_bad_request(const test_http_response *r, const char *why)
{
    cr_assert_eq(r->status, 400, "%d: %s", r->status, r->body);
    cr_assert_str_eq(test_http_header(r, "Content-Type"),
                     "text/plain; charset=utf-8");
    char want[256];
    snprintf(want, sizeof want, "Bad Request: %s", why);
    expect_body_starts(r, want);
}

Test(rls_json, a_bad_body_is_400_saying_why_and_a_large_one_413)
{
    test_rls r;
    test_rls_start(&r, limits, rl_yaml(), NULL);
    test_http_response resp;
    post_json(r.http_port, "{\"domain\": ", &resp);
    expect_bad_request(&resp, "not JSON: ");
    post_json(r.http_port, "{\"domain\": \"edge\", \"descriptor\": []}",
              &resp);
    expect_bad_request(&resp, "unknown field \"descriptor\"");
    post_json(r.http_port, "{\"domain\": \"edge\", \"descriptors\": "
              "[{\"entries\": [{\"key\": 7}]}]}", &resp);
    expect_bad_request(&resp, "descriptors[0].entries[0].key: want a "
                              "string");
    post_json(r.http_port, user_call("", "j3"), &resp);
    expect_bad_request(&resp, "rate limit domain must not be empty");
    /* Over the cap: refused on its length, before a byte of it. */
    int fd = test_http_connect(r.http_port);
    test_http_exchange(fd, "POST /json HTTP/1.1\r\nHost: x\r\n"
                       "Content-Length: 5000000\r\n\r\n", &resp, 1);
    close(fd);
    cr_assert_eq(resp.status, 413, "%d: %s", resp.status, resp.body);
    expect_body_starts(&resp, "Request Entity Too Large: ");
    /* And the service still answers. */
    post_json(r.http_port, user_call("edge", "j3"), &resp);
    cr_assert_eq(resp.status, 200, "%d: %s", resp.status, resp.body);
    test_rls_stop(&r);
}

/* SIGTERM while a /json call waits for Redis: it is answered (by the
 * store's deadline, let through), and the process exits 0. */
Test(rls_json, sigterm_answers_the_call_in_flight)
{
    test_redis srv;
    char addr[64], yaml[256];
    test_agent_private_redis(&srv, addr, sizeof addr);
    snprintf(yaml, sizeof yaml, "store: {url: \"redis://%s\", "
             "timeout_ms: 1500}\n", addr);
    test_rls r;
    test_rls_start(&r, limits, yaml, NULL);
    test_http_response resp;
    post_json(r.http_port, user_call("edge", "j4"), &resp);
    cr_assert_eq(resp.status, 200, "%d: %s", resp.status, resp.body);
    test_redis_pause(&srv);
    pid_t caller = fork();
    cr_assert_geq(caller, 0);
    if (caller == 0) {
        post_json(r.http_port, user_call("edge", "j4"), &resp);
        _exit(resp.status == 200 ? 0 : 1);
    }
    test_sleep_ms(500);
    kill(r.pid, SIGTERM);
    int status;
    cr_assert_eq(waitpid(caller, &status, 0), caller);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0,
              "the call in flight was not answered 200");
    test_rls_stop(&r);
    test_redis_stop(&srv);
}

/* body in HTTP/1.1's chunked coding, cut in pieces of sizes (0 ends the
 * list; the rest in one last chunk), with an extension on the first chunk
 * and a trailer field after the last. */
static const char *chunked(const char *body, const size_t *sizes)
{
    static char out[8192];
    size_t n = 0, at = 0, len = strlen(body);
    for (size_t i = 0; at < len; i++) {
        size_t k = sizes[i] != 0 && sizes[i] < len - at ? sizes[i]
                                                         : len - at;
        n += (size_t)snprintf(out + n, sizeof out - n, "%zx%s\r\n%.*s\r\n",
                              k, i == 0 ? ";piece=first" : "", (int)k,
                              body + at);
        at += k;
    }
    snprintf(out + n, sizeof out - n, "0\r\nX-Checksum: none\r\n\r\n");
    return out;
}

static const char *chunked_post(const char *body, const size_t *sizes)
{
    static char raw[9000];
    snprintf(raw, sizeof raw, "POST /json HTTP/1.1\r\nHost: x\r\n"
             "Content-Type: application/json\r\n"
             "Transfer-Encoding: chunked\r\n\r\n%s", chunked(body, sizes));
    return raw;
}

/* The connection is closed by the server within 5 s. */
static void expect_closed(int fd)
{
    struct pollfd pfd = {fd, POLLIN, 0};
    cr_assert_eq(poll(&pfd, 1, 5000), 1, "the connection stays open");
    char c;
    cr_assert_leq(recv(fd, &c, 1, 0), 0, "more bytes after the answer");
}

/* The same answers, chunked or not; the body's end found exactly: the
 * request after it on the connection is answered too. */
Test(rls_json, a_chunked_body_answers_as_a_content_length_one)
{
    test_rls r;
    test_rls_start(&r, limits, rl_yaml(), NULL);
    static const size_t pieces[] = {7, 1, 30, 0};
    test_http_response resp[2];
    int fd = test_http_connect(r.http_port);
    char raw[9200];
    snprintf(raw, sizeof raw, "%sGET /healthcheck HTTP/1.1\r\nHost: x\r\n"
             "\r\n", chunked_post(user_call("edge", "j5"), pieces));
    test_http_exchange(fd, raw, resp, 2);
    cr_assert_eq(resp[0].status, 200, "%d: %s", resp[0].status,
                 resp[0].body);
    expect_body_starts(&resp[0], "{\"overallCode\":\"OK\",\"statuses\":[{"
                       "\"code\":\"OK\",\"currentLimit\":{\"requestsPerUnit\""
                       ":2,\"unit\":\"HOUR\"},\"limitRemaining\":1,");
    cr_assert_eq(resp[1].status, 200, "the next request: %d",
                 resp[1].status);
    cr_assert_str_eq(resp[1].body, "OK");
    post_json(r.http_port, user_call("edge", "j5"), resp);
    cr_assert_eq(resp[0].status, 200, "%d: %s", resp[0].status,
                 resp[0].body);
    cr_assert(strstr(resp[0].body, "limitRemaining") == NULL, "%s",
              resp[0].body);
    static const size_t one_by_one[] = {1, 1, 1, 1, 1, 1, 1, 1, 0};
    test_http_exchange(fd, chunked_post(user_call("edge", "j5"), one_by_one),
                       resp, 1);
    cr_assert_eq(resp[0].status, 429, "%d: %s", resp[0].status,
                 resp[0].body);
    close(fd);
    test_rls_stop(&r);
}

/* A chunked body's size is checked chunk by chunk against the 4 MiB cap:
 * one chunk over it, or the sum, is a 413 before its bytes are read. */
Test(rls_json, a_chunked_body_over_the_cap_is_413)
{
    test_rls r;
    test_rls_start(&r, limits, rl_yaml(), NULL);
    static const char head[] = "POST /json HTTP/1.1\r\nHost: x\r\n"
                               "Transfer-Encoding: chunked\r\n\r\n";
    test_http_response resp;
    char raw[200];
    snprintf(raw, sizeof raw, "%s400001\r\n", head);
    int fd = test_http_connect(r.http_port);
    test_http_exchange(fd, raw, &resp, 1);
    cr_assert_eq(resp.status, 413, "%d: %s", resp.status, resp.body);
    expect_body_starts(&resp, "Request Entity Too Large: ");
    expect_closed(fd);
    close(fd);
    /* 3 MiB read, then 2 MiB more announced. */
    fd = test_http_connect(r.http_port);
    snprintf(raw, sizeof raw, "%s300000\r\n", head);
    cr_assert_eq(send(fd, raw, strlen(raw), MSG_NOSIGNAL),
                 (ssize_t)strlen(raw));
    size_t big = 0x300000;
    char *spaces = malloc(big);
    cr_assert_not_null(spaces);
    memset(spaces, ' ', big);
    cr_assert_eq(send(fd, spaces, big, MSG_NOSIGNAL), (ssize_t)big);
    free(spaces);
    test_http_exchange(fd, "\r\n200000\r\n", &resp, 1);
    cr_assert_eq(resp.status, 413, "%d: %s", resp.status, resp.body);
    expect_closed(fd);
    close(fd);
    post_json(r.http_port, user_call("edge", "j6"), &resp);
    cr_assert_eq(resp.status, 200, "%d: %s", resp.status, resp.body);
    test_rls_stop(&r);
}

/* Malformed chunked coding, or a body framed two ways: 400 saying why,
 * and the connection closed (where the next request starts is not
 * known). */
Test(rls_json, a_malformed_chunked_body_is_400_and_closes)
{
    test_rls r;
    test_rls_start(&r, limits, rl_yaml(), NULL);
    static const struct {
        const char *framing, *body, *why;
    } cases[] = {
        {"Transfer-Encoding: chunked", "zz\r\n{}\r\n0\r\n\r\n",
         "a chunk size is not a hex number"},
        {"Transfer-Encoding: chunked", "2x\r\n{}\r\n0\r\n\r\n",
         "a chunk size is not a hex number"},
        {"Transfer-Encoding: chunked", "2\n{}\r\n0\r\n\r\n",
         "a chunk size line ends in LF, not CRLF"},
        {"Transfer-Encoding: chunked", "1\r\n{}\r\n0\r\n\r\n",
         "a chunk is longer than its size"},
        {"Transfer-Encoding: chunked\r\nContent-Length: 7",
         "2\r\n{}\r\n0\r\n\r\n", "both Content-Length and Transfer-Encoding"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char raw[300];
        snprintf(raw, sizeof raw, "POST /json HTTP/1.1\r\nHost: x\r\n%s\r\n"
                 "\r\n%s", cases[i].framing, cases[i].body);
        test_http_response resp;
        int fd = test_http_connect(r.http_port);
        test_http_exchange(fd, raw, &resp, 1);
        expect_bad_request(&resp, cases[i].why);
        expect_closed(fd);
        close(fd);
    }
    test_http_response resp;
    int fd = test_http_connect(r.http_port);
    test_http_exchange(fd, "POST /json HTTP/1.1\r\nHost: x\r\n"
                       "Transfer-Encoding: gzip\r\n\r\n", &resp, 1);
    cr_assert_eq(resp.status, 501, "%d: %s", resp.status, resp.body);
    close(fd);
    test_rls_stop(&r);
}

/* A chunked body that arrives in pieces, cut inside the size line, the
 * data and the CRLFs, with pauses between them. */
Test(rls_json_wire, a_chunked_body_split_across_writes_with_delays)
{
    test_rls r;
    test_rls_start(&r, limits, rl_yaml(), NULL);
    static const size_t pieces[] = {12, 40, 0};
    const char *raw = chunked_post(user_call("edge", "j7"), pieces);
    const char *body = strstr(raw, "\r\n\r\n") + 4;
    /* Cut points: after the headers, in the first size line, in its
     * extension, inside the data, between CR and LF, in the last chunk. */
    size_t cuts[] = {(size_t)(body - raw), 1, 4, 6, 0, 0, 0};
    size_t len = strlen(raw);
    size_t data = (size_t)(strstr(body, "\r\n") + 2 - raw);
    cuts[4] = data + 5 - (size_t)(body - raw);
    cuts[5] = data + 12 + 1 - (size_t)(body - raw);
    cuts[6] = len - 3 - (size_t)(body - raw);
    int fd = test_http_connect(r.http_port);
    size_t at = 0;
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        size_t to = i == 0 ? cuts[0] : (size_t)(body - raw) + cuts[i];
        cr_assert_eq(send(fd, raw + at, to - at, MSG_NOSIGNAL),
                     (ssize_t)(to - at));
        at = to;
        test_sleep_ms(150);
    }
    test_http_response resp;
    test_http_exchange(fd, raw + at, &resp, 1);
    cr_assert_eq(resp.status, 200, "%d: %s", resp.status, resp.body);
    expect_body_starts(&resp, "{\"overallCode\":\"OK\",\"statuses\":[{"
                       "\"code\":\"OK\",\"currentLimit\":{");
    close(fd);
    test_rls_stop(&r);
}

/* More /json calls than the workers' queues hold (RLS_WORKER_CALLS_MAX
 * each, of 2 workers), all waiting on a stopped Redis (the store's
 * deadline a minute): the ones over are answered at once with 503 and
 * Retry-After, /healthcheck still answers, and the ones taken are answered
 * once Redis is back. */
#define QUEUED (2 * 1024)
#define OVER 60

/* The 503s among the calls on fds, until OVER of them or 30 s: any
 * answer now must be one. */
static int collect_refusals(int *fds)
{
    int refused = 0;
    for (int waited = 0; refused < OVER && waited < 30000; waited += 100) {
        for (int i = 0; i < QUEUED + OVER; i++) {
            struct pollfd pfd = {fds[i], POLLIN, 0};
            if (fds[i] < 0 || poll(&pfd, 1, 0) != 1)
                continue;
            test_http_response resp;
            test_http_exchange(fds[i], "", &resp, 1);
            cr_assert_eq(resp.status, 503, "call %d: %d: %s", i,
                         resp.status, resp.body);
            cr_assert_str_eq(test_http_header(&resp, "Retry-After"), "1");
            expect_body_starts(&resp, "Service Unavailable: no worker "
                               "takes calls now");
            close(fds[i]);
            fds[i] = -1;
            refused++;
        }
        test_sleep_ms(100);
    }
    return refused;
}

Test(rls_json, a_full_worker_queue_is_503, .timeout = 120)
{
    test_redis srv;
    char addr[64], yaml[256];
    test_agent_private_redis(&srv, addr, sizeof addr);
    snprintf(yaml, sizeof yaml, "store: {url: \"redis://%s\", "
             "timeout_ms: 60000}\n", addr);
    test_rls r;
    test_rls_start(&r, limits, yaml, NULL);
    test_http_response resp;
    post_json(r.http_port, user_call("edge", "q0"), &resp);
    cr_assert_eq(resp.status, 200, "%d: %s", resp.status, resp.body);
    test_redis_pause(&srv);
    static int fds[QUEUED + OVER];
    char raw[1024];
    const char *body = user_call("edge", "q1");
    snprintf(raw, sizeof raw, "POST /json HTTP/1.1\r\nHost: x\r\n"
             "Content-Length: %zu\r\n\r\n%s", strlen(body), body);
    for (int i = 0; i < QUEUED + OVER; i++) {
        fds[i] = test_http_connect(r.http_port);
        cr_assert_eq(send(fds[i], raw, strlen(raw), MSG_NOSIGNAL),
                     (ssize_t)strlen(raw));
    }
    int refused = collect_refusals(fds);
    cr_assert_eq(refused, OVER, "%d calls refused, not %d", refused, OVER);
    test_http_get(r.http_port, "/healthcheck", "", &resp);
    cr_assert_eq(resp.status, 200, "/healthcheck: %d", resp.status);
    test_redis_resume(&srv);
    int answered = 0;
    for (int i = 0; i < QUEUED + OVER; i++) {
        if (fds[i] < 0)
            continue;
        test_http_exchange(fds[i], "", &resp, 1);
        answered += resp.status == 200 || resp.status == 429;
        close(fds[i]);
    }
    cr_assert_eq(answered, QUEUED, "%d of the queued calls answered",
                 answered);
    post_json(r.http_port, user_call("edge", "q2"), &resp);
    cr_assert_eq(resp.status, 200, "%d: %s", resp.status, resp.body);
    test_rls_stop(&r);
    test_redis_stop(&srv);
}
