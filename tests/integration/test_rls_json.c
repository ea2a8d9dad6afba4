/*
 * rl-rls's /json endpoint, black box, as upstream's: a RateLimitRequest in
 * proto3 JSON POSTed to HOST:PORT, the RateLimitResponse in proto3 JSON
 * back (200 OK, 429 OVER_LIMIT), counted with gRPC's calls; a body that is
 * not a request is a 400 that says why, one over 4 MiB a 413.
 */
#include "test_agent.h"
#include "redis_server.h"
#include "test_env.h"
#include "test_gateway.h"
#include "test_process.h"
#include "test_rls.h"

#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
