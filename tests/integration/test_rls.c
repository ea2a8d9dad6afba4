/*
 * rl-rls as Envoy's rate limit service, black box: its own process,
 * configured as envoyproxy/ratelimit is (the runtime layout, upstream's
 * variables), called with grpcio. Counting, statuses and errors over gRPC,
 * the store from REDIS_URL alone, reloads (a file's change, SIGHUP, a bad
 * file refused with upstream's words and the old config kept), ten
 * clients on their own connections held to the limit, health, and bytes
 * that are not HTTP/2 on the port.
 */
#include "test_agent.h"
#include "redis_server.h"
#include "test_env.h"
#include "test_gateway.h"
#include "test_process.h"
#include "test_rls.h"

#include <arpa/inet.h>
#include <criterion/criterion.h>
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
    "  - key: client\n"
    "    rate_limit: {unit: minute, requests_per_unit: 20}\n"
    "  - key: tenant\n"
    "    rate_limit: {unit: hour, requests_per_unit: 100}\n"
    "  - key: user\n"
    "    rate_limit: {unit: hour, requests_per_unit: 2}\n";

/* rl's own settings: the test Redis, with a deadline a loaded machine
 * keeps. */
static const char *rl_yaml(void)
{
    static char yaml[256];
    snprintf(yaml, sizeof yaml, "store: {url: \"redis://%s\", "
             "timeout_ms: 2000}\n", test_env("RL_TEST_REDIS"));
    return yaml;
}

/* The n-th line of out (from 0), into line. */
static void nth_line(const char *out, int n, char *line, size_t cap)
{
    const char *p = out;
    for (int i = 0; i < n && p != NULL; i++) {
        p = strchr(p, '\n');
        p = p != NULL ? p + 1 : NULL;
    }
    cr_assert(p != NULL && *p != '\0', "no line %d in:\n%s", n, out);
    size_t len = strcspn(p, "\n");
    snprintf(line, cap, "%.*s", (int)len, p);
}

static int count_lines_with(const char *out, const char *what)
{
    int n = 0;
    for (const char *p = out; (p = strstr(p, what)) != NULL; p++)
        n++;
    return n;
}

Test(rls, twenty_a_minute_count_down_then_over_the_limit)
{
    test_rls r;
    test_rls_start(&r, limits, rl_yaml(), NULL);
    static char out[16384];
    test_rls_call(&r, out, sizeof out,
                  "{\"domain\": \"edge\", \"repeat\": 21, \"descriptors\": "
                  "[{\"entries\": [[\"client\", \"c1\"]]}]}",
                  "{\"domain\": \"elsewhere\", \"descriptors\": "
                  "[{\"entries\": [[\"client\", \"c1\"]]}]}",
                  "{\"domain\": \"\", \"descriptors\": [{\"entries\": "
                  "[[\"client\", \"c1\"]]}]}",
                  "{\"domain\": \"edge\"}", "{\"health\": true}", NULL);
    char line[256], want[128];
    for (int i = 0; i < 21; i++) {
        nth_line(out, i, line, sizeof line);
        snprintf(want, sizeof want, i < 20 ? "OK OK OK:%d:20/MINUTE::"
                                           : "OK OVER_LIMIT OVER_LIMIT:0:"
                                             "20/MINUTE::", 19 - i);
        cr_assert(strncmp(line, want, strlen(want)) == 0,
                  "call %d: %s, not %s...", i + 1, line, want);
        int reset = atoi(strrchr(line, ':') + 1);
        cr_assert(reset >= 1 && reset <= 60, "reset in %d s", reset);
    }
    nth_line(out, 21, line, sizeof line);
    cr_assert_str_eq(line, "OK OK OK:0:-", "an unknown domain: %s", line);
    nth_line(out, 22, line, sizeof line);
    cr_assert_str_eq(line, "ERROR 2 rate limit domain must not be empty");
    nth_line(out, 23, line, sizeof line);
    cr_assert_str_eq(line,
                     "ERROR 2 rate limit descriptor list must not be empty");
    nth_line(out, 24, line, sizeof line);
    cr_assert_str_eq(line, "HEALTH SERVING");
    test_rls_stop(&r);
}

/* No --config: the store is upstream's REDIS_URL, alone. */
Test(rls, the_store_from_upstreams_variables)
{
    test_rls r;
    test_rls_start(&r, limits, NULL, NULL);
    static char out[4096];
    test_rls_call(&r, out, sizeof out,
                  "{\"domain\": \"edge\", \"repeat\": 3, \"descriptors\": "
                  "[{\"entries\": [[\"user\", \"u1\"]]}]}", NULL);
    cr_assert_eq(count_lines_with(out, "OK OK OK:"), 2, "%s", out);
    cr_assert_eq(count_lines_with(out, "OVER_LIMIT OVER_LIMIT:0:2/HOUR"), 1,
                 "%s", out);
    test_rls_stop(&r);
}

/* Calls until a line holds want, 5 s at most. */
static void call_until(test_rls *r, const char *call, const char *want)
{
    static char out[4096];
    for (int i = 0; i < 50; i++) {
        test_rls_call(r, out, sizeof out, call, NULL);
        if (strstr(out, want) != NULL)
            return;
        test_sleep_ms(100);
    }
    cr_assert_fail("never answered %s: %s", want, out);
}

Test(rls, reloads_on_a_change_and_sighup_keeping_the_old_when_bad)
{
    test_rls r;
    test_rls_start(&r, limits, rl_yaml(), NULL);
    const char *call = "{\"domain\": \"new\", \"descriptors\": "
                       "[{\"entries\": [[\"k\", \"v\"]]}]}";
    call_until(&r, call, "OK OK OK:0:-");
    test_rls_write(&r, "new.yaml", "domain: new\ndescriptors:\n  - key: k\n"
                   "    rate_limit: {unit: hour, requests_per_unit: 7}\n");
    call_until(&r, call, "7/HOUR");
    /* A bad file: refused in upstream's words, the config before kept. */
    long from = test_log_size(r.log);
    test_rls_write(&r, "bad.yaml", "domain: other\nratelimit: 1\n");
    test_wait_for_log_from(&r.pid, r.log, from,
                           "config_refused why=change reason=\"config.bad."
                           "yaml: config error, unknown key .ratelimit.\" "
                           "kept=previous", 5000);
    call_until(&r, call, "7/HOUR");
    /* Both gone, and a SIGHUP at once: no limit for new. */
    char path[512];
    snprintf(path, sizeof path, "%s/rt/config/bad.yaml", r.root);
    unlink(path);
    snprintf(path, sizeof path, "%s/rt/config/new.yaml", r.root);
    unlink(path);
    from = test_log_size(r.log);
    kill(r.pid, SIGHUP);
    test_wait_for_log_from(&r.pid, r.log, from,
                           "event=config_loaded why=sighup", 5000);
    call_until(&r, call, "OK OK OK:0:-");
    test_rls_stop(&r);
}

/* The seed's scenario through rl-rls: ten clients, each on a connection
 * of its own, 20 calls each on one tenant of 100 an hour. */
Test(rls, ten_clients_on_their_own_connections_get_exactly_the_limit)
{
    test_rls r;
    test_rls_start(&r, limits, rl_yaml(), NULL);
    static char out[65536];
    test_rls_call(&r, out, sizeof out,
                  "{\"domain\": \"edge\", \"repeat\": 20, \"clients\": 10, "
                  "\"descriptors\": [{\"entries\": [[\"tenant\", "
                  "\"t1\"]]}]}", NULL);
    int ok = count_lines_with(out, "OK OK OK:");
    int over = count_lines_with(out, "OK OVER_LIMIT");
    cr_assert_eq(ok + over, 200, "%d answered:\n%s", ok + over, out);
    cr_assert_eq(ok, 100, "%d of 200 admitted", ok);
    test_rls_stop(&r);
}

Test(rls, bytes_that_are_not_http2_never_stop_the_service)
{
    test_rls r;
    test_rls_start(&r, limits, rl_yaml(), NULL);
    for (int i = 0; i < 3; i++) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in sa = {.sin_family = AF_INET,
                                 .sin_port = htons(r.grpc_port)};
        sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        cr_assert_eq(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
        const char junk[] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n\x00\xff\x13";
        cr_assert_gt(write(fd, junk, sizeof junk), 0);
        char buf[256];
        /* The connection ends (a GOAWAY, then EOF), whatever it read. */
        while (read(fd, buf, sizeof buf) > 0)
            ;
        close(fd);
    }
    static char out[1024];
    test_rls_call(&r, out, sizeof out,
                  "{\"domain\": \"edge\", \"descriptors\": [{\"entries\": "
                  "[[\"client\", \"junk\"]]}]}", NULL);
    cr_assert(strncmp(out, "OK OK OK:19:", 12) == 0, "%s", out);
    test_rls_stop(&r);
}

/* What upstream's variables ask and rl-rls does not do is refused at
 * start, never ignored: exit 3, naming the variable. */
Test(rls, a_variable_it_cannot_honour_stops_the_start)
{
    const char *cases[][2] = {
        {"USE_PROMETHEUS=true", "USE_PROMETHEUS=true: rl-rls has no"},
        {"BACKEND_TYPE=memcache", "BACKEND_TYPE"},
        {"LOG_LEVEL=loud", "LOG_LEVEL"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char log[600];
        test_log_path(log, sizeof log, "rls-refused");
        setenv("RUNTIME_ROOT", "/nonexistent", 1);
        putenv((char *)cases[i][0]);
        char *argv[] = {(char *)test_env("RL_TEST_RLS"), NULL};
        pid_t pid = test_spawn(argv, log);
        int status;
        cr_assert_eq(waitpid(pid, &status, 0), pid);
        cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 3,
                  "%s: status %d", cases[i][0], status);
        FILE *f = fopen(log, "r");
        char text[1024] = "";
        size_t n = f != NULL ? fread(text, 1, sizeof text - 1, f) : 0;
        text[n] = '\0';
        if (f != NULL)
            fclose(f);
        cr_assert(strstr(text, cases[i][1]) != NULL, "%s: %s", cases[i][0],
                  text);
        char name[64];
        snprintf(name, sizeof name, "%.*s", (int)strcspn(cases[i][0], "="),
                 cases[i][0]);
        unsetenv(name);
    }
}

/* SIGTERM while a call waits for Redis: /healthcheck answers 500 at once
 * (a load balancer takes the instance out), the call is still answered
 * (by its deadline: Redis is stopped), and the process exits 0. */
Test(rls, sigterm_fails_the_healthcheck_and_answers_the_call_in_flight)
{
    test_redis srv;
    char addr[64], yaml[256];
    test_agent_private_redis(&srv, addr, sizeof addr);
    snprintf(yaml, sizeof yaml, "store: {url: \"redis://%s\", "
             "timeout_ms: 1500}\n", addr);
    test_rls r;
    test_rls_start(&r, limits, yaml, NULL);
    test_http_response resp;
    test_http_get(r.http_port, "/healthcheck", "", &resp);
    cr_assert_eq(resp.status, 200);
    static char out[1024];
    /* One call first: the agent's connection is up. */
    test_rls_call(&r, out, sizeof out,
                  "{\"domain\": \"edge\", \"descriptors\": [{\"entries\": "
                  "[[\"client\", \"held\"]]}]}", NULL);
    test_redis_pause(&srv);
    pid_t caller = fork();
    cr_assert_geq(caller, 0);
    if (caller == 0) {
        test_rls_call(&r, out, sizeof out,
                      "{\"domain\": \"edge\", \"descriptors\": [{\"entries\": "
                      "[[\"client\", \"held\"]]}]}", NULL);
        _exit(strncmp(out, "OK OK", 5) == 0 ? 0 : 1);
    }
    test_sleep_ms(500);
    kill(r.pid, SIGTERM);
    test_sleep_ms(100);
    test_http_get(r.http_port, "/healthcheck", "", &resp);
    cr_assert_eq(resp.status, 500, "healthcheck %d after SIGTERM",
                 resp.status);
    int status;
    cr_assert_eq(waitpid(caller, &status, 0), caller);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0,
              "the call in flight was not answered OK");
    test_rls_stop(&r);
    test_redis_stop(&srv);
}

/* A call's grpc-timeout is its deadline: with Redis paused and rl's own
 * deadline at 5 s, a call of 1 s is answered before its client gives up
 * (not DEADLINE_EXCEEDED), let through and marked degraded for the
 * upstream request. */
Test(rls, a_calls_grpc_timeout_is_its_deadline)
{
    test_redis srv;
    char addr[64], yaml[256];
    test_agent_private_redis(&srv, addr, sizeof addr);
    snprintf(yaml, sizeof yaml, "store: {url: \"redis://%s\", "
             "timeout_ms: 5000}\n", addr);
    test_rls r;
    test_rls_start(&r, limits, yaml, NULL);
    static char out[1024];
    test_rls_call(&r, out, sizeof out,
                  "{\"domain\": \"edge\", \"descriptors\": [{\"entries\": "
                  "[[\"client\", \"late\"]]}]}", NULL);
    cr_assert(strncmp(out, "OK OK OK:19:", 12) == 0, "%s", out);
    test_redis_pause(&srv);
    test_rls_call(&r, out, sizeof out,
                  "{\"domain\": \"edge\", \"timeout\": 1, \"descriptors\": "
                  "[{\"entries\": [[\"client\", \"late\"]]}]}", NULL);
    cr_assert(strncmp(out, "OK OK OK:20:20/MINUTE::", 23) == 0,
              "a call past its deadline: %s", out);
    cr_assert(strstr(out, "|| x-rl-degraded=true") != NULL, "%s", out);
    test_redis_resume(&srv);
    test_rls_stop(&r);
    test_redis_stop(&srv);
}

/* rl's extension: a descriptor counted by a token bucket (its burst at
 * once, where a fixed window of the same rate admits 2), and on_error:
 * deny deciding when the store does not answer, by rl's deadline (2 s)
 * and by the call's own (1 s). */
Test(rls, rls_extension_token_bucket_and_on_error_deny)
{
    static const char ext[] =
        "domain: edge\n"
        "descriptors:\n"
        "  - key: tb\n"
        "    rate_limit: {unit: hour, requests_per_unit: 2}\n"
        "    rl: {algorithm: token_bucket, burst: 5}\n"
        "  - key: strict\n"
        "    rate_limit: {unit: hour, requests_per_unit: 100}\n"
        "    rl: {on_error: deny}\n"
        "  - key: lax\n"
        "    rate_limit: {unit: hour, requests_per_unit: 100}\n";
    test_redis srv;
    char addr[64], yaml[256];
    test_agent_private_redis(&srv, addr, sizeof addr);
    snprintf(yaml, sizeof yaml, "store: {url: \"redis://%s\", "
             "timeout_ms: 2000}\n", addr);
    test_rls r;
    test_rls_start(&r, ext, yaml, NULL);
    static char out[4096];
    test_rls_call(&r, out, sizeof out,
                  "{\"domain\": \"edge\", \"repeat\": 7, \"descriptors\": "
                  "[{\"entries\": [[\"tb\", \"a\"]]}]}", NULL);
    cr_assert_eq(count_lines_with(out, "OK OK OK:"), 5, "%s", out);
    test_redis_pause(&srv);
    const char *calls[] = {
        "{\"domain\": \"edge\", \"descriptors\": [{\"entries\": "
        "[[\"strict\", \"a\"]]}, {\"entries\": [[\"lax\", \"a\"]]}]}",
        "{\"domain\": \"edge\", \"timeout\": 1, \"descriptors\": "
        "[{\"entries\": [[\"strict\", \"a\"]]}, {\"entries\": "
        "[[\"lax\", \"a\"]]}]}"};
    for (int i = 0; i < 2; i++) {
        test_rls_call(&r, out, sizeof out, calls[i], NULL);
        cr_assert(strncmp(out, "OK OVER_LIMIT OVER_LIMIT:", 25) == 0,
                  "deny and allow while Redis is silent: %s", out);
        cr_assert(strstr(out, ";OK:") != NULL, "%s", out);
        cr_assert(strstr(out, "|| x-rl-degraded=true") != NULL, "%s", out);
    }
    test_redis_resume(&srv);
    test_rls_stop(&r);
    test_redis_stop(&srv);
}
