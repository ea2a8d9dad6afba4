/*
 * rl-rls's Prometheus page (USE_PROMETHEUS), black box: calls over gRPC
 * with grpcio, then the page read as Prometheus reads it, under
 * envoyproxy/ratelimit's names and labels (its default mapper's):
 * total_hits, over_limit, within_limit, near_limit (upstream's
 * arithmetic) and shadow_mode per limit, a value in the labels only where
 * detailed_metric or value_to_metric ask, the cap on series, and rl's own
 * count of answers decided by on_error.
 */
#include "redis_server.h"
#include "test_agent.h"
#include "test_env.h"
#include "test_gateway.h"
#include "test_process.h"
#include "test_rls.h"

#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <stdbool.h>
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
    "    rate_limit: {unit: hour, requests_per_unit: 10}\n"
    "  - key: user\n"
    "    rate_limit: {unit: hour, requests_per_unit: 10}\n"
    "  - key: path\n"
    "    detailed_metric: true\n"
    "    rate_limit: {unit: hour, requests_per_unit: 100}\n"
    "  - key: tenant\n"
    "    shadow_mode: true\n"
    "    rate_limit: {unit: hour, requests_per_unit: 2}\n"
    "  - key: app\n"
    "    value: web\n"
    "    descriptors:\n"
    "      - key: route\n"
    "        value_to_metric: true\n"
    "        rate_limit: {unit: hour, requests_per_unit: 100}\n"
    "      - key: zone\n"
    "        rate_limit: {unit: hour, requests_per_unit: 100}\n";

/* Starts rl-rls on a Redis of the test's own (timeout_ms: rl's deadline)
 * with USE_PROMETHEUS on a free port, into *metrics_port. */
static void start(test_rls *r, test_redis *srv, const char *yaml_limits,
                  int timeout_ms, uint16_t *metrics_port)
{
    char addr[64];
    static char yaml[256], prom[64];
    test_agent_private_redis(srv, addr, sizeof addr);
    snprintf(yaml, sizeof yaml, "store: {url: \"redis://%s\", "
             "timeout_ms: %d}\n", addr, timeout_ms);
    *metrics_port = test_free_port();
    snprintf(prom, sizeof prom, "PROMETHEUS_ADDR=127.0.0.1:%u",
             *metrics_port);
    const char *env[] = {"USE_PROMETHEUS=true", prom, NULL};
    test_rls_start(r, yaml_limits, yaml, env);
}

/* GET /metrics whole, whatever its size: the body (to free), from a
 * newline (test_prom_sample's form). */
static char *scrape(uint16_t port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    cr_assert_eq(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    const char req[] = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
    cr_assert_eq(write(fd, req, strlen(req)), (ssize_t)strlen(req));
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap + 1);
    long want = -1;
    const char *body = NULL;
    while (body == NULL || (long)(len - (size_t)(body - buf)) <= want) {
        if (len == cap) {
            size_t at = body != NULL ? (size_t)(body - buf) : 0;
            buf = realloc(buf, (cap *= 2) + 1);
            body = body != NULL ? buf + at : NULL;
        }
        ssize_t got = read(fd, buf + len, cap - len);
        cr_assert_gt(got, 0, "the page ended early");
        len += (size_t)got;
        buf[len] = '\0';
        const char *end = body == NULL ? strstr(buf, "\r\n\r\n") : NULL;
        if (end != NULL) {
            cr_assert(strncmp(buf, "HTTP/1.1 200", 12) == 0, "%s", buf);
            const char *cl = strstr(buf, "Content-Length:");
            cr_assert_not_null(cl);
            want = atol(cl + 15);
            body = end + 3; /* keeps the newline before the first line */
        }
    }
    close(fd);
    size_t n = (size_t)want + 1;
    char *out = malloc(n + 1);
    memcpy(out, body, n);
    out[n] = '\0';
    free(buf);
    return out;
}

static long long sample(const char *page, const char *series)
{
    return test_prom_sample(page, series);
}

/* promtool parses the page; its lint's only words are for upstream's
 * names, which keep no _total. */
static void assert_promtool_parses(const char *page)
{
    char path[600], cmd[800];
    static char out[8192];
    snprintf(path, sizeof path, "%s/rls-metrics-%d.txt",
             test_env("RL_TEST_TMPDIR"), (int)getpid());
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fputs(page + 1, f);
    fclose(f);
    snprintf(cmd, sizeof cmd, "promtool check metrics < %s 2>&1", path);
    test_run(cmd, out, sizeof out);
    unlink(path);
    for (char *line = out; *line != '\0';) {
        size_t n = strcspn(line, "\n");
        bool more = line[n] == '\n';
        line[n] = '\0';
        cr_assert(strstr(line, "should have \"_total\" suffix") != NULL
                  && strncmp(line, "rl_", 3) != 0,
                  "promtool: %.*s\n--- the page:%s", (int)n, line, page);
        line += n + more;
    }
}

#define LIMIT(counter, labels) \
    "ratelimit_service_rate_limit_" counter "{domain=\"edge\"," labels "}"

Test(rls_metrics, hits_over_within_near_and_shadow_per_limit)
{
    test_redis srv;
    test_rls r;
    uint16_t port;
    start(&r, &srv, limits, 2000, &port);
    static char out[65536];
    test_rls_call(&r, out, sizeof out,
                  /* 10 within (8 and 9 and 10 near), 2 over */
                  "{\"domain\": \"edge\", \"repeat\": 12, \"descriptors\": "
                  "[{\"entries\": [[\"client\", \"c1\"]]}]}",
                  /* 9 at once: the count crosses 8 by one */
                  "{\"domain\": \"edge\", \"descriptors\": [{\"entries\": "
                  "[[\"user\", \"u1\"]], \"hits_addend\": 9}]}",
                  /* shadow: the third is over, answered OK */
                  "{\"domain\": \"edge\", \"repeat\": 3, \"descriptors\": "
                  "[{\"entries\": [[\"tenant\", \"t1\"]]}]}",
                  "{\"domain\": \"\", \"descriptors\": [{\"entries\": "
                  "[[\"client\", \"c1\"]]}]}", NULL);
    cr_assert(strstr(out, "OK OK OK:0:2/HOUR") != NULL, "%s", out);
    char *page = scrape(port);
    cr_assert_eq(sample(page, LIMIT("total_hits", "key1=\"client\"")), 12,
                 "%s", page);
    cr_assert_eq(sample(page, LIMIT("over_limit", "key1=\"client\"")), 2);
    cr_assert_eq(sample(page, LIMIT("within_limit", "key1=\"client\"")), 10);
    cr_assert_eq(sample(page, LIMIT("near_limit", "key1=\"client\"")), 2);
    cr_assert_eq(sample(page, LIMIT("shadow_mode", "key1=\"client\"")), -1,
                 "a counter at 0 is not shown, as upstream's exporter");
    cr_assert_eq(sample(page, LIMIT("total_hits", "key1=\"user\"")), 9);
    cr_assert_eq(sample(page, LIMIT("near_limit", "key1=\"user\"")), 1);
    cr_assert_eq(sample(page, LIMIT("within_limit", "key1=\"user\"")), 9);
    cr_assert_eq(sample(page, LIMIT("total_hits", "key1=\"tenant\"")), 3);
    cr_assert_eq(sample(page, LIMIT("over_limit", "key1=\"tenant\"")), 1);
    cr_assert_eq(sample(page, LIMIT("shadow_mode", "key1=\"tenant\"")), 1);
    cr_assert_eq(sample(page, LIMIT("near_limit", "key1=\"tenant\"")), 1);
    cr_assert_eq(sample(page, "ratelimit_service_config_load_success"), 1);
    cr_assert_eq(sample(page, "ratelimit_service_total_requests"
                              "{grpc_method=\"ShouldRateLimit\"}"), 17);
    cr_assert_eq(sample(page, "ratelimit_service_should_rate_limit_error"
                              "{err_type=\"service_error\"}"), 1);
    cr_assert_eq(sample(page, "rl_rls_calls_in_flight"), 0);
    cr_assert_eq(sample(page, "ratelimit_service_response_time_seconds_count"
                              "{grpc_method=\"ShouldRateLimit\"}"), 17);
    assert_promtool_parses(page);
    free(page);
    test_rls_stop(&r);
    test_redis_stop(&srv);
}

Test(rls_metrics, values_in_labels_only_where_the_config_asks)
{
    test_redis srv;
    test_rls r;
    uint16_t port;
    start(&r, &srv, limits, 2000, &port);
    static char out[4096];
    test_rls_call(&r, out, sizeof out,
                  "{\"domain\": \"edge\", \"descriptors\": ["
                  "{\"entries\": [[\"client\", \"c9\"]]}, "
                  "{\"entries\": [[\"path\", \"/a\"]]}, "
                  "{\"entries\": [[\"path\", \"10.0.0.1:80\"]]}, "
                  "{\"entries\": [[\"app\", \"web\"], [\"route\", \"r1\"]]}, "
                  "{\"entries\": [[\"app\", \"web\"], [\"zone\", \"z1\"]]}, "
                  "{\"entries\": [[\"client\", \"c1\"]], "
                  "\"limit\": [5, \"HOUR\"]}]}", NULL);
    char *page = scrape(port);
    /* No detailed_metric: the config's key, not the value. */
    cr_assert_eq(sample(page, LIMIT("total_hits", "key1=\"client\"")), 1,
                 "%s", page);
    cr_assert_null(strstr(page, "client_c9"), "%s", page);
    /* detailed_metric: the value, made safe as upstream's statsd name
     * (':' as '_', an IPv4 address's dots as '_'). */
    cr_assert_eq(sample(page, LIMIT("total_hits", "key1=\"path_/a\"")), 1);
    cr_assert_eq(sample(page, LIMIT("total_hits",
                                    "key1=\"path_10_0_0_1_80\"")), 1);
    /* value_to_metric on route, not on zone: key2 per upstream's
     * mapper. */
    cr_assert_eq(sample(page, LIMIT("total_hits", "key1=\"app_web\","
                                    "key2=\"route_r1\"")), 1);
    cr_assert_eq(sample(page, LIMIT("total_hits", "key1=\"app_web\","
                                    "key2=\"zone\"")), 1);
    /* A descriptor's own limit is named by its values. */
    cr_assert_eq(sample(page, LIMIT("total_hits", "key1=\"client_c1\"")), 1);
    assert_promtool_parses(page);
    free(page);
    test_rls_stop(&r);
    test_redis_stop(&srv);
}

static int count_of(const char *text, const char *what)
{
    int n = 0;
    for (const char *p = text; (p = strstr(p, what)) != NULL; p++)
        n++;
    return n;
}

/* Occurrences of what in a log file. */
static int log_count(const char *log, const char *what)
{
    FILE *f = fopen(log, "r");
    cr_assert_not_null(f, "no log %s", log);
    static char text[1 << 20];
    size_t n = fread(text, 1, sizeof text - 1, f);
    text[n] = '\0';
    fclose(f);
    return count_of(text, what);
}

/* A call of 1000 descriptors, each a value of its own (id i0 + 0..999). */
static char *thousand_ids(int i0)
{
    size_t cap = 64 * 1000 + 128, at = 0;
    char *call = malloc(cap);
    at += (size_t)snprintf(call, cap, "{\"domain\": \"edge\", "
                           "\"descriptors\": [");
    for (int i = 0; i < 1000; i++)
        at += (size_t)snprintf(call + at, cap - at, "%s{\"entries\": "
                               "[[\"path\", \"id%d\"]]}", i > 0 ? ", " : "",
                               i0 + i);
    snprintf(call + at, cap - at, "]}");
    return call;
}

/* 11000 values under detailed_metric: 10000 series, the rest in one
 * overflow series, a warning logged once. */
Test(rls_metrics, request_values_never_make_more_series_than_the_cap)
{
    test_redis srv;
    test_rls r;
    uint16_t port;
    start(&r, &srv, limits, 5000, &port);
    static char out[1 << 20];
    char *calls[11];
    for (int i = 0; i < 11; i++)
        calls[i] = thousand_ids(i * 1000);
    test_rls_call(&r, out, sizeof out, calls[0], calls[1], calls[2],
                  calls[3], calls[4], calls[5], calls[6], calls[7],
                  calls[8], calls[9], calls[10], NULL);
    for (int i = 0; i < 11; i++)
        free(calls[i]);
    cr_assert_eq(count_of(out, "OK:99:100/HOUR"), 11000, "%.2000s",
                 out);
    char *page = scrape(port);
    cr_assert_eq(sample(page, "rl_rls_metric_series"), 10000);
    cr_assert_eq(count_of(page, "\nratelimit_service_rate_limit_total_hits{"),
                 10001);
    cr_assert_eq(sample(page, "ratelimit_service_rate_limit_total_hits"
                              "{domain=\"\",key1=\"\"}"), 1000);
    cr_assert_eq(sample(page, LIMIT("total_hits", "key1=\"path_id0\"")), 1);
    free(page);
    cr_assert_eq(log_count(r.log, "event=metrics_series_capped"), 1);
    test_rls_stop(&r);
    test_redis_stop(&srv);
}

/* rl's own: calls answered by on_error, at the call's deadline (its
 * grpc-timeout first) or rl's store deadline (first). */
Test(rls_metrics, answers_by_on_error_are_counted_by_reason)
{
    test_redis srv;
    test_rls r;
    uint16_t port;
    start(&r, &srv, limits, 2000, &port);
    static char out[4096];
    test_rls_call(&r, out, sizeof out,
                  "{\"domain\": \"edge\", \"descriptors\": [{\"entries\": "
                  "[[\"client\", \"c1\"]]}]}", NULL);
    test_redis_pause(&srv);
    test_rls_call(&r, out, sizeof out,
                  "{\"domain\": \"edge\", \"timeout\": 10, \"descriptors\": "
                  "[{\"entries\": [[\"client\", \"c1\"]]}]}",
                  "{\"domain\": \"edge\", \"timeout\": 1, "
                  "\"descriptors\": [{\"entries\": [[\"client\", "
                  "\"c1\"]]}]}", NULL);
    cr_assert_eq(count_of(out, "x-rl-degraded=true"), 2, "%s", out);
    test_redis_resume(&srv);
    char *page = scrape(port);
    cr_assert_eq(sample(page, "rl_rls_degraded_total{reason=\"store\"}"), 1,
                 "%s", page);
    cr_assert_eq(sample(page, "rl_rls_degraded_total{reason=\"deadline\"}"),
                 1);
    /* Let through by on_error: within the limit, never near. */
    cr_assert_eq(sample(page, LIMIT("within_limit", "key1=\"client\"")), 3);
    free(page);
    test_rls_stop(&r);
    test_redis_stop(&srv);
}

/* PROMETHEUS_ADDR that is no host:port stops the start: exit 3 naming
 * it. */
Test(rls_metrics, an_address_that_is_no_address_stops_the_start)
{
    char log[600];
    test_log_path(log, sizeof log, "rls-prom-refused");
    setenv("RUNTIME_ROOT", "/tmp", 1);
    setenv("RUNTIME_SUBDIRECTORY", "", 1);
    setenv("FORCE_START_WITHOUT_INITIAL_CONFIG", "true", 1);
    setenv("REDIS_SOCKET_TYPE", "tcp", 1);
    setenv("REDIS_URL", test_env("RL_TEST_REDIS"), 1);
    setenv("USE_PROMETHEUS", "true", 1);
    setenv("PROMETHEUS_ADDR", "localhost", 1);
    char *argv[] = {(char *)test_env("RL_TEST_RLS"), NULL};
    pid_t pid = test_spawn(argv, log);
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 3, "status %d",
              status);
    cr_assert_eq(log_count(log, "PROMETHEUS_ADDR=\"localhost\": not "
                           "host:port"), 1);
}
