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
#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
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

/* REDIS_TIMEOUT is how long a call waits for Redis, as rl's
 * store.timeout_ms: with Redis paused, a call of 5 s is answered when
 * REDIS_TIMEOUT (1.5 s) has passed, let through and marked degraded, not
 * at rl's own 50 ms. The stamps are the client's: a health call's answer,
 * then the paused call's. */
Test(rls, redis_timeout_is_how_long_a_call_waits_for_redis)
{
    test_redis srv;
    char addr[64];
    static char url[96];
    test_agent_private_redis(&srv, addr, sizeof addr);
    snprintf(url, sizeof url, "REDIS_URL=%s", addr);
    const char *env[] = {url, "REDIS_TIMEOUT=1500ms", NULL};
    test_rls r;
    test_rls_start(&r, limits, NULL, env);
    static char out[1024];
    const char call[] = "{\"domain\": \"edge\", \"stamp\": true, "
                        "\"descriptors\": [{\"entries\": [[\"client\", "
                        "\"waits\"]]}]}";
    test_rls_call(&r, out, sizeof out, call, NULL);
    cr_assert(strstr(out, " OK OK OK:19:") != NULL, "%s", out);
    test_redis_pause(&srv);
    test_rls_call(&r, out, sizeof out, "{\"health\": true, \"stamp\": true}",
                  call, NULL);
    test_redis_resume(&srv);
    long long asked, answered;
    char second[256];
    cr_assert_eq(sscanf(out, "%lld HEALTH SERVING\n%lld %255[^\n]", &asked,
                        &answered, second), 3, "%s", out);
    cr_assert(strncmp(second, "OK OK OK:20:20/MINUTE::", 23) == 0
              && strstr(second, "|| x-rl-degraded=true") != NULL, "%s", out);
    cr_assert_geq(answered - asked, 1400, "answered after %lld ms:\n%s",
                  answered - asked, out);
    test_rls_stop(&r);
    test_redis_stop(&srv);
}

/* With --config, the config's store.timeout_ms is the deadline: a
 * REDIS_TIMEOUT beside it is said to have no effect. */
Test(rls, redis_timeout_beside_a_config_is_said_to_have_no_effect)
{
    const char *env[] = {"REDIS_TIMEOUT=1s", NULL};
    test_rls r;
    test_rls_start(&r, limits, rl_yaml(), env);
    test_wait_for_log(&r.pid, r.log, "event=setting_without_effect "
                      "REDIS_TIMEOUT: with --config", 5000);
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

/* Whether a TCP connection to 127.0.0.1:port is established (the
 * server's side of it, in /proc/net/tcp), waiting up to ms for one. */
static bool connected_to(uint16_t port, int ms)
{
    char want[16];
    snprintf(want, sizeof want, ":%04X", port);
    for (int waited = 0; waited < ms; waited += 50) {
        FILE *f = fopen("/proc/net/tcp", "r");
        char line[256];
        bool found = false;
        while (f != NULL && !found && fgets(line, sizeof line, f) != NULL) {
            char local[64], remote[64], state[8];
            found = sscanf(line, "%*s %63s %63s %7s", local, remote, state)
                        == 3
                    && strlen(local) == 13 && strcmp(local + 8, want) == 0
                    && strcmp(state, "01") == 0;
        }
        if (f != NULL)
            fclose(f);
        if (found)
            return true;
        test_sleep_ms(50);
    }
    return false;
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
             "timeout_ms: 5000}\n", addr);
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
    /* The caller's Python takes a second or more to start on a loaded
     * machine: SIGTERM once it is connected and its call sent (rl's
     * deadline, 5 s, and its own, 4.5 s, are far). */
    cr_assert(connected_to(r.grpc_port, 10000), "the caller never came");
    test_sleep_ms(300);
    kill(r.pid, SIGTERM);
    /* 100 ms, or a second for a sanitized build on a loaded machine. */
    for (int waited = 0; waited < 1000; waited += 100) {
        test_sleep_ms(100);
        test_http_get(r.http_port, "/healthcheck", "", &resp);
        if (resp.status == 500)
            break;
    }
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

/* rl's extension with mode: local: counted in the loop that serves the
 * connection, with no call to Redis, so that a stopped Redis changes
 * nothing for it (both algorithms; a mode ignored would be decided by
 * on_error, degraded). */
Test(rls, rls_extension_mode_local_counts_in_the_instance)
{
    static const char ext[] =
        "domain: edge\n"
        "descriptors:\n"
        "  - key: here\n"
        "    rate_limit: {unit: hour, requests_per_unit: 3}\n"
        "    rl: {mode: local}\n"
        "  - key: here_tb\n"
        "    rate_limit: {unit: hour, requests_per_unit: 2}\n"
        "    rl: {mode: local, algorithm: token_bucket, burst: 4}\n";
    test_redis srv;
    char addr[64], yaml[256];
    test_agent_private_redis(&srv, addr, sizeof addr);
    snprintf(yaml, sizeof yaml, "store: {url: \"redis://%s\", "
             "timeout_ms: 2000}\n", addr);
    test_rls r;
    test_rls_start(&r, ext, yaml, NULL);
    test_redis_pause(&srv);
    static char out[4096];
    test_rls_call(&r, out, sizeof out,
                  "{\"domain\": \"edge\", \"repeat\": 6, \"timeout\": 1, "
                  "\"descriptors\": [{\"entries\": [[\"here\", \"a\"]]}]}",
                  "{\"domain\": \"edge\", \"repeat\": 6, \"timeout\": 1, "
                  "\"descriptors\": [{\"entries\": [[\"here_tb\", \"a\"]]}]}",
                  NULL);
    cr_assert_eq(count_lines_with(out, "OK OK OK:"), 3 + 4, "%s", out);
    cr_assert_eq(count_lines_with(out, "OVER_LIMIT OVER_LIMIT:"), 3 + 2,
                 "%s", out);
    cr_assert(strstr(out, "x-rl-degraded") == NULL, "%s", out);
    test_redis_resume(&srv);
    test_rls_stop(&r);
    test_redis_stop(&srv);
}

/* The resident memory of pid, in KiB (VmRSS). */
static long rss_kib(pid_t pid)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "%s", path);
    long kib = -1;
    while (fgets(line, sizeof line, f) != NULL)
        if (sscanf(line, "VmRSS: %ld kB", &kib) == 1)
            break;
    fclose(f);
    return kib;
}

/* Opens n connections to port, each greeting as an HTTP/2 client does
 * (the preface and an empty SETTINGS frame), then saying nothing: what
 * a pool of idle Envoy connections is. */
static void open_idle(uint16_t port, int *fds, int n)
{
    static const char greeting[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
                                   "\x00\x00\x00\x04\x00\x00\x00\x00\x00";
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    for (int i = 0; i < n; i++) {
        fds[i] = socket(AF_INET, SOCK_STREAM, 0);
        cr_assert_geq(fds[i], 0, "socket %d: %s", i, strerror(errno));
        cr_assert_eq(connect(fds[i], (struct sockaddr *)&sa, sizeof sa), 0,
                     "connection %d: %s", i, strerror(errno));
        cr_assert_eq(write(fds[i], greeting, sizeof greeting - 1),
                     (ssize_t)(sizeof greeting - 1));
    }
}

/* 10,000 idle connections, each with its HTTP/2 session open: a call on
 * a new connection is still answered, and the idle ones cost the stated
 * memory at most (docs/envoy.md: about 15 KiB each). */
#define IDLE_CONNECTIONS 10000
/* 14.3 KiB measured (25.4 under ASan, 137 under TSan's shadow memory). */
#if defined(__SANITIZE_THREAD__)
#define IDLE_BYTES_MAX (192 * 1024)
#elif defined(__SANITIZE_ADDRESS__)
#define IDLE_BYTES_MAX (48 * 1024)
#else
#define IDLE_BYTES_MAX (24 * 1024)
#endif
Test(rls, ten_thousand_idle_connections_leave_calls_served)
{
    test_rls r;
    test_rls_start(&r, limits, rl_yaml(), NULL);
    static char out[1024];
    test_rls_call(&r, out, sizeof out,
                  "{\"domain\": \"edge\", \"descriptors\": [{\"entries\": "
                  "[[\"client\", \"idle-before\"]]}]}", NULL);
    long before = rss_kib(r.pid);
    static int fds[IDLE_CONNECTIONS];
    open_idle(r.grpc_port, fds, IDLE_CONNECTIONS);
    test_rls_call(&r, out, sizeof out,
                  "{\"domain\": \"edge\", \"descriptors\": [{\"entries\": "
                  "[[\"client\", \"idle\"]]}]}", NULL);
    cr_assert(strncmp(out, "OK OK OK:19:", 12) == 0, "%s", out);
    long after = rss_kib(r.pid);
    long each = (after - before) * 1024 / IDLE_CONNECTIONS;
    fprintf(stderr, "rls: %d idle connections: %ld bytes each (RSS %ld -> "
            "%ld KiB)\n", IDLE_CONNECTIONS, each, before, after);
    cr_assert_leq(each, IDLE_BYTES_MAX, "%ld bytes per idle connection", each);
    for (int i = 0; i < IDLE_CONNECTIONS; i++)
        close(fds[i]);
    test_rls_stop(&r);
}

/* LOG_FORMAT=json, LOG_LEVEL=debug: every line of rl-rls's log, from
 * start to stop, is one JSON object with logrus's fields, the start
 * among them. */
Test(rls, log_format_json_every_line_an_object)
{
    const char *env[] = {"LOG_FORMAT=json", NULL};
    test_rls r;
    test_rls_start(&r, limits, rl_yaml(), env);
    static char out[1024];
    test_rls_call(&r, out, sizeof out,
                  "{\"domain\": \"edge\", \"descriptors\": [{\"entries\": "
                  "[[\"client\", \"json \\\"log\\\"\"]]}]}", NULL);
    cr_assert(strncmp(out, "OK OK OK:19:", 12) == 0, "%s", out);
    test_rls_stop(&r);
    unsetenv("LOG_FORMAT");
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "/usr/bin/python3 -c 'import json, sys\n"
             "lines = open(sys.argv[1], encoding=\"utf-8\").read()"
             ".splitlines()\n"
             "objs = [json.loads(l) for l in lines]\n"
             "assert all(set(o) >= {\"level\", \"msg\", \"time\"} "
             "for o in objs)\n"
             "start = [o for o in objs if o[\"msg\"] == \"listening\"]\n"
             "assert start and start[0][\"level\"] == \"info\", objs\n"
             "assert start[0][\"workers\"] == \"2\"\n"
             "assert objs[-1][\"msg\"] == \"stopped\", objs[-1]\n"
             "' %s", r.log);
    int status = system(cmd);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0,
              "a line of %s is not the JSON expected", r.log);
}

/* GRPC_MAX_CONNECTION_AGE=1s reaches the gRPC listeners: an idle HTTP/2
 * connection is sent its GOAWAY and closed after about a second. */
Test(rls, grpc_max_connection_age_closes_an_idle_connection)
{
    const char *env[] = {"GRPC_MAX_CONNECTION_AGE=1s",
                         "GRPC_MAX_CONNECTION_AGE_GRACE=1s", NULL};
    test_rls r;
    test_rls_start(&r, limits, rl_yaml(), env);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET,
                             .sin_port = htons(r.grpc_port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    long t0 = (long)test_now_ms();
    cr_assert_eq(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    static const char hello[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
                                "\0\0\0\4\0\0\0\0\0";
    cr_assert_eq(write(fd, hello, sizeof hello - 1),
                 (ssize_t)(sizeof hello - 1));
    static uint8_t in[65536];
    size_t got = 0;
    for (ssize_t n; got < sizeof in
                    && (n = read(fd, in + got, sizeof in - got)) > 0;)
        got += (size_t)n;
    long closed = (long)test_now_ms() - t0;
    /* The frames it sent, by their 9-byte headers: a GOAWAY (type 7). */
    bool goaway = false;
    for (size_t at = 0; at + 9 <= got;
         at += 9 + ((size_t)in[at] << 16 | (size_t)in[at + 1] << 8
                    | in[at + 2]))
        goaway |= in[at + 3] == 7;
    close(fd);
    unsetenv("GRPC_MAX_CONNECTION_AGE");
    unsetenv("GRPC_MAX_CONNECTION_AGE_GRACE");
    cr_expect(goaway, "no GOAWAY before the close");
    cr_assert(closed >= 850 && closed <= 4000, "closed after %ld ms",
              closed);
    test_rls_stop(&r);
}

/* examples/kubernetes/rl-rls.yaml holds what docs/envoy.md says of it
 * (tests/support/check_k8s_example.py), and rl-rls starts on its
 * variables (but the test's Redis and runtime folder) and its ConfigMap's
 * file, and serves it. */
Test(rls, the_kubernetes_example_starts_and_serves)
{
    char dir[] = "/tmp/rl-k8s-XXXXXX", cmd[256];
    cr_assert_not_null(mkdtemp(dir));
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 "
             "tests/support/check_k8s_example.py %s", dir);
    FILE *p = popen(cmd, "r");
    static char vars[2048];
    size_t n = p != NULL ? fread(vars, 1, sizeof vars - 1, p) : 0;
    vars[n] = '\0';
    cr_assert(p != NULL && pclose(p) == 0, "the example: %s", vars);
    static char *env[32];
    int k = 0;
    for (char *v = strtok(vars, " \n"); v != NULL && k < 31;
         v = strtok(NULL, " \n")) {
        if (strncmp(v, "REDIS_URL=", 10) != 0
            && strncmp(v, "RUNTIME_ROOT=", 13) != 0
            && strncmp(v, "RUNTIME_SUBDIRECTORY=", 21) != 0)
            env[k++] = v;
    }
    env[k] = NULL;
    char path[300], limits_text[4096];
    snprintf(path, sizeof path, "%s/config.yaml", dir);
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f);
    limits_text[fread(limits_text, 1, sizeof limits_text - 1, f)] = '\0';
    fclose(f);
    test_rls r;
    test_rls_start(&r, limits_text, NULL, (const char *const *)env);
    static char out[1024];
    test_rls_call(&r, out, sizeof out,
                  "{\"domain\": \"edge\", \"descriptors\": [{\"entries\": "
                  "[[\"client\", \"k8s\"]]}]}", NULL);
    cr_assert(strncmp(out, "OK OK OK:99:100/MINUTE:", 23) == 0, "%s", out);
    test_rls_stop(&r);
    for (int i = 0; i < k; i++) {
        char name[64];
        snprintf(name, sizeof name, "%.*s", (int)strcspn(env[i], "="),
                 env[i]);
        unsetenv(name);
    }
}

/* The seed's scenario through rl-rls, per minute: ten clients, each on a
 * connection of its own, 200 calls interleaved on one descriptor of 100
 * a minute, counted by a token bucket (rl's extension) and by the
 * default fixed window. The window is exact: the calls are made inside
 * one minute (the test waits for a new one when fewer than 25 s are
 * left). The bucket is exact up to the tokens it refills while the calls
 * run (100 a minute: one each 600 ms), which the bound allows. */
Test(rls, the_seeds_ten_clients_per_minute_bucket_and_window)
{
    static const char seed[] =
        "domain: edge\n"
        "descriptors:\n"
        "  - key: bucket\n"
        "    rate_limit: {unit: minute, requests_per_unit: 100}\n"
        "    rl: {algorithm: token_bucket}\n"
        "  - key: window\n"
        "    rate_limit: {unit: minute, requests_per_unit: 100}\n";
    test_rls r;
    test_rls_start(&r, seed, rl_yaml(), NULL);
    static char out[65536];
    long t0 = (long)test_now_ms();
    test_rls_call(&r, out, sizeof out,
                  "{\"domain\": \"edge\", \"repeat\": 20, \"clients\": 10, "
                  "\"descriptors\": [{\"entries\": [[\"bucket\", "
                  "\"seed\"]]}]}", NULL);
    long elapsed = (long)test_now_ms() - t0;
    int ok = count_lines_with(out, "OK OK OK:");
    int over = count_lines_with(out, "OK OVER_LIMIT");
    cr_assert_eq(ok + over, 200, "%d answered:\n%s", ok + over, out);
    cr_assert(ok >= 100 && ok <= 100 + elapsed / 600,
              "bucket: %d of 200 admitted in %ld ms", ok, elapsed);
    test_away_from_window_edge(60000, 25000);
    test_rls_call(&r, out, sizeof out,
                  "{\"domain\": \"edge\", \"repeat\": 20, \"clients\": 10, "
                  "\"descriptors\": [{\"entries\": [[\"window\", "
                  "\"seed\"]]}]}", NULL);
    ok = count_lines_with(out, "OK OK OK:");
    over = count_lines_with(out, "OK OVER_LIMIT");
    cr_assert_eq(ok + over, 200, "%d answered:\n%s", ok + over, out);
    cr_assert_eq(ok, 100, "window: %d of 200 admitted", ok);
    test_rls_stop(&r);
}
