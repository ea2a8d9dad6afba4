/*
 * rl-gateway end to end, over real HTTP on loopback: ten gateways sharing
 * one exact bucket, 429s with their headers and body, X-Forwarded-For only
 * when trusted, malformed requests, keep-alive and pipelining, proxying,
 * the tenant map, and degraded decisions when Redis is away.
 */
#include "redis_server.h"
#include "test_agent.h"
#include "test_aggregator.h"
#include "test_env.h"
#include "test_gateway.h"

#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* A key no other test (or earlier run) has used. */
static void unique(char *buf, size_t cap, const char *stem)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    snprintf(buf, cap, "%s_%d_%ld%09ld", stem, (int)getpid(),
             (long)ts.tv_sec, ts.tv_nsec);
}

#define GATEWAYS 10

Test(gateway, ten_gateways_share_one_exact_bucket)
{
    const char *cfg = test_store_config(
        "exact", "  - {name: per-key, match: api_key, limit: 100, "
                 "period: 1h}\n");
    test_gateway gw[GATEWAYS];
    int fds[GATEWAYS];
    for (int i = 0; i < GATEWAYS; i++) {
        test_gateway_start(&gw[i], cfg, NULL);
        fds[i] = test_http_connect(gw[i].port);
    }
    char key[96], raw[512];
    unique(key, sizeof key, "ak_e2e");
    snprintf(raw, sizeof raw, "GET /orders HTTP/1.1\r\nHost: t\r\n"
             "X-Api-Key: %s\r\n\r\n", key);
    int allowed = 0, rejected = 0;
    test_http_response r, last_429 = {0};
    for (int i = 0; i < 200; i++) {
        /* Round-robin, keep-alive: one connection per gateway. */
        test_http_exchange(fds[i % GATEWAYS], raw, &r, 1);
        cr_assert(r.status == 200 || r.status == 429, "status %d", r.status);
        if (r.status == 200) {
            allowed++;
        } else {
            rejected++;
            last_429 = r;
        }
    }
    cr_assert_eq(allowed, 100, "ten gateways let %d through", allowed);
    cr_assert_eq(rejected, 100);

    /* The 429: Retry-After whole seconds rounded up (one token per 36 s),
     * the RateLimit headers, and the body naming the rule. */
    test_expect_rate_limited(&last_429, "per-key", 100, 3600);
    for (int i = 0; i < GATEWAYS; i++) {
        close(fds[i]);
        test_gateway_stop(&gw[i]);
    }
}

static const char per_ip_local[] =
    "rules:\n"
    "  - {name: per-ip, match: ip, limit: 2, period: 1h, mode: local}\n";

Test(gateway, forwarded_for_is_ignored_unless_trusted)
{
    const char *cfg = test_write_config("xff", per_ip_local);
    test_gateway plain, trusting;
    test_gateway_start(&plain, cfg, NULL);
    test_gateway_start(&trusting, cfg, "--trust-forwarded-for", NULL);
    test_http_response r;
    /* Untrusted: every request is the peer, 127.0.0.1, whatever it says. */
    const char *hops[] = {"X-Forwarded-For: 203.0.113.1\r\n",
                          "X-Forwarded-For: 203.0.113.2\r\n",
                          "X-Forwarded-For: 203.0.113.3\r\n"};
    int statuses[3];
    for (int i = 0; i < 3; i++) {
        test_http_get(plain.port, "/", hops[i], &r);
        statuses[i] = r.status;
    }
    cr_assert_eq(statuses[0], 200);
    cr_assert_eq(statuses[1], 200);
    cr_assert_eq(statuses[2], 429, "a client chose its own ip");
    /* Trusted: each first hop is its own client... */
    for (int i = 0; i < 3; i++) {
        test_http_get(trusting.port, "/", hops[i], &r);
        cr_assert_eq(r.status, 200);
    }
    /* ...and it is the first hop that counts, not the proxies after it. */
    const char *chain = "X-Forwarded-For: 198.51.100.9, 10.0.0.1\r\n";
    const char *other = "X-Forwarded-For: 198.51.100.9 , 10.0.0.2\r\n";
    test_http_get(trusting.port, "/", chain, &r);
    cr_assert_eq(r.status, 200);
    test_http_get(trusting.port, "/", other, &r);
    cr_assert_eq(r.status, 200);
    test_http_get(trusting.port, "/", chain, &r);
    cr_assert_eq(r.status, 429);
    test_gateway_stop(&plain);
    test_gateway_stop(&trusting);
}

Test(gateway, malformed_requests_get_4xx_and_the_gateway_keeps_serving)
{
    const char *cfg = test_write_config("bad", per_ip_local);
    test_gateway gw;
    test_gateway_start(&gw, cfg, NULL);
    test_http_response r;
    int fd = test_http_connect(gw.port);
    test_http_exchange(fd, "GARBAGE\r\n\r\n", &r, 1);
    close(fd);
    cr_assert_eq(r.status, 400);
    cr_assert_str_eq(test_http_header(&r, "Connection"), "close");
    r.body[r.body_len] = '\0';
    cr_assert(strstr(r.body, "\"error\":\"bad_request\"") != NULL, "%s",
              r.body);
    /* Headers over 64 KiB: refused, not read on forever. */
    size_t big = 70 * 1024;
    char *raw = malloc(big + 128);
    int n = sprintf(raw, "GET / HTTP/1.1\r\nX-Big: ");
    memset(raw + n, 'a', big);
    strcpy(raw + n + big, "\r\n\r\n");
    fd = test_http_connect(gw.port);
    test_http_exchange(fd, raw, &r, 1);
    close(fd);
    free(raw);
    cr_assert_eq(r.status, 431);
    /* Still serving. */
    test_http_get(gw.port, "/", "", &r);
    cr_assert_eq(r.status, 200);
    test_gateway_stop(&gw);
}

Test(gateway, keep_alive_and_pipelined_requests_are_answered_in_order)
{
    const char *cfg = test_write_config("pipe", per_ip_local);
    test_gateway gw;
    test_gateway_start(&gw, cfg, NULL);
    int fd = test_http_connect(gw.port);
    test_http_response r[3];
    test_http_exchange(fd, "GET /a HTTP/1.1\r\nHost: t\r\n\r\n"
                           "GET /b HTTP/1.1\r\nHost: t\r\n\r\n"
                           "GET /c HTTP/1.1\r\nHost: t\r\n\r\n", r, 3);
    cr_assert_eq(r[0].status, 200);
    cr_assert_str_eq(test_http_header(&r[0], "RateLimit-Remaining"), "1");
    cr_assert_eq(r[1].status, 200);
    cr_assert_str_eq(test_http_header(&r[1], "RateLimit-Remaining"), "0");
    cr_assert_eq(r[2].status, 429);
    cr_assert_str_eq(test_http_header(&r[2], "Connection"), "keep-alive");
    close(fd);
    test_gateway_stop(&gw);
}

/* A one-connection-at-a-time upstream that answers every request with 201
 * and keeps the last request it saw. */
struct upstream {
    int listener;
    uint16_t port;
    pthread_t thread;
    unsigned delay_ms;  /* before answering */
    pthread_mutex_t lock; /* over what follows */
    int served;
    char last[4096];    /* the last request seen */
};

/* What the upstream last received (a copy), and how many it answered. */
static int upstream_seen(struct upstream *u, char *last, size_t cap)
{
    pthread_mutex_lock(&u->lock);
    snprintf(last, cap, "%s", u->last);
    int served = u->served;
    pthread_mutex_unlock(&u->lock);
    return served;
}

static void *serve(void *arg)
{
    struct upstream *u = arg;
    for (;;) {
        int fd = accept(u->listener, NULL, NULL);
        if (fd < 0)
            return NULL;
        char got[sizeof u->last];
        ssize_t n = recv(fd, got, sizeof got - 1, 0);
        got[n > 0 ? n : 0] = '\0';
        pthread_mutex_lock(&u->lock);
        memcpy(u->last, got, sizeof got);
        pthread_mutex_unlock(&u->lock);
        usleep(u->delay_ms * 1000);
        static const char resp[] = "HTTP/1.1 201 Created\r\n"
                                   "Content-Length: 5\r\nX-Upstream: yes\r\n"
                                   "Connection: close\r\n\r\nhello";
        send(fd, resp, sizeof resp - 1, MSG_NOSIGNAL);
        pthread_mutex_lock(&u->lock);
        u->served++;
        pthread_mutex_unlock(&u->lock);
        close(fd);
    }
}

static void upstream_start(struct upstream *u, unsigned delay_ms)
{
    memset(u, 0, sizeof *u);
    u->delay_ms = delay_ms;
    pthread_mutex_init(&u->lock, NULL);
    u->listener = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof sa;
    cr_assert_eq(bind(u->listener, (struct sockaddr *)&sa, sizeof sa), 0);
    cr_assert_eq(listen(u->listener, 16), 0);
    getsockname(u->listener, (struct sockaddr *)&sa, &len);
    u->port = ntohs(sa.sin_port);
    pthread_create(&u->thread, NULL, serve, u);
}

static void upstream_stop(struct upstream *u)
{
    shutdown(u->listener, SHUT_RDWR);
    close(u->listener);
    pthread_join(u->thread, NULL);
    pthread_mutex_destroy(&u->lock);
}

Test(gateway, allowed_requests_reach_the_upstream_rejected_ones_do_not)
{
    struct upstream up;
    upstream_start(&up, 0);
    const char *cfg = test_write_config(
        "proxy", "rules:\n  - {name: per-key, match: api_key, limit: 1, "
                 "period: 1h, mode: local}\n");
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%u", up.port);
    test_gateway gw;
    test_gateway_start(&gw, cfg, "--upstream", url, NULL);
    test_http_response r;
    test_http_get(gw.port, "/orders?id=7",
                  "Authorization: Bearer tok_1\r\nConnection: keep-alive\r\n",
                  &r);
    cr_assert_eq(r.status, 201);
    cr_assert_eq(r.body_len, 5);
    cr_assert_eq(memcmp(r.body, "hello", 5), 0);
    cr_assert_str_eq(test_http_header(&r, "X-Upstream"), "yes");
    cr_assert_str_eq(test_http_header(&r, "RateLimit-Remaining"), "0");
    char last[4096];
    upstream_seen(&up, last, sizeof last);
    cr_assert(strncmp(last, "GET /orders?id=7 HTTP/1.1\r\n", 27) == 0,
              "%s", last);
    cr_assert(strstr(last, "X-Forwarded-For: 127.0.0.1\r\n") != NULL,
              "%s", last);
    cr_assert(strstr(last, "Authorization: Bearer tok_1\r\n") != NULL);
    cr_assert(strstr(last, "keep-alive") == NULL,
              "a hop-by-hop header went upstream: %s", last);
    /* The same bearer token again: rejected here, never sent upstream. */
    test_http_get(gw.port, "/orders", "Authorization: Bearer tok_1\r\n", &r);
    cr_assert_eq(r.status, 429);
    cr_assert_eq(upstream_seen(&up, last, sizeof last), 1);
    test_gateway_stop(&gw);
    upstream_stop(&up);

    /* An upstream that is not there: 502, not a hang. */
    test_gateway_start(&gw, cfg, "--upstream", url, NULL);
    test_http_get(gw.port, "/", "X-Api-Key: other\r\n", &r);
    cr_assert_eq(r.status, 502);
    test_gateway_stop(&gw);
}

Test(gateway, tenants_come_from_the_header_or_the_map)
{
    char map_path[600];
    snprintf(map_path, sizeof map_path, "%s/tenants-%d.txt",
             test_env("RL_TEST_TMPDIR"), (int)getpid());
    FILE *f = fopen(map_path, "w");
    cr_assert_not_null(f);
    fputs("# api_key tenant\nak_one org_acme\nak_two  org_acme\n"
          "ak_three\torg_other\n", f);
    fclose(f);
    char yaml[1024];
    snprintf(yaml, sizeof yaml, "gateway: {tenant_map: %s}\nrules:\n"
             "  - {name: per-tenant, match: tenant, limit: 1, period: 1h, "
             "mode: local}\n", map_path);
    const char *cfg = test_write_config("tenants", yaml);
    test_gateway gw;
    test_gateway_start(&gw, cfg, NULL);
    test_http_response r;
    test_http_get(gw.port, "/", "X-Api-Key: ak_one\r\n", &r);
    cr_assert_eq(r.status, 200);
    test_http_get(gw.port, "/", "X-Api-Key: ak_two\r\n", &r);
    cr_assert_eq(r.status, 429, "two keys of one tenant got two limits");
    r.body[r.body_len] = '\0';
    cr_assert(strstr(r.body, "\"rule\":\"per-tenant\"") != NULL);
    test_http_get(gw.port, "/", "X-Api-Key: ak_three\r\n", &r);
    cr_assert_eq(r.status, 200);
    /* X-Tenant wins over the map. */
    test_http_get(gw.port, "/", "X-Api-Key: ak_one\r\nX-Tenant: org_new\r\n",
                  &r);
    cr_assert_eq(r.status, 200);
    test_gateway_stop(&gw);
}

static const char *unreachable_config(const char *name, const char *on_error)
{
    char yaml[512];
    snprintf(yaml, sizeof yaml,
             "store: {url: \"redis://127.0.0.1:1\", timeout_ms: 50}\n"
             "rules:\n  - {name: per-key, match: api_key, limit: 5, "
             "period: 1m, on_error: %s}\n", on_error);
    return test_write_config(name, yaml);
}

Test(gateway, store_errors_are_marked_and_never_5xx_unless_deny)
{
    test_gateway allow, deny;
    test_gateway_start(&allow, unreachable_config("allow", "allow"), NULL);
    test_gateway_start(&deny, unreachable_config("deny", "deny"), NULL);
    test_http_response r;
    test_http_get(allow.port, "/", "X-Api-Key: ak_x\r\n", &r);
    cr_assert_eq(r.status, 200);
    cr_assert_not_null(test_http_header(&r, "RateLimit-Degraded"));
    test_http_get(deny.port, "/", "X-Api-Key: ak_x\r\n", &r);
    cr_assert_eq(r.status, 503);
    cr_assert_not_null(test_http_header(&r, "RateLimit-Degraded"));
    cr_assert_not_null(test_http_header(&r, "Retry-After"));
    test_gateway_stop(&allow);
    test_gateway_stop(&deny);
}

Test(gateway, sigterm_answers_the_requests_in_flight_then_exits)
{
    struct upstream up;
    upstream_start(&up, 1500);
    const char *cfg = test_write_config("drain", per_ip_local);
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%u", up.port);
    test_gateway gw;
    test_gateway_start(&gw, cfg, "--upstream", url, NULL);
    int idle = test_http_connect(gw.port);
    int busy = test_http_connect(gw.port);
    static const char get[] = "GET /slow HTTP/1.1\r\nHost: t\r\n\r\n";
    cr_assert_eq(send(busy, get, sizeof get - 1, 0), (ssize_t)sizeof get - 1);
    /* The request is with the upstream when the signal comes. */
    char last[4096] = "";
    for (int i = 0; i < 200 && last[0] == '\0'; i++) {
        usleep(10 * 1000);
        upstream_seen(&up, last, sizeof last);
    }
    cr_assert_neq(last[0], '\0', "the request never reached upstream");
    kill(gw.pid, SIGTERM);
    test_http_response r;
    test_http_exchange(busy, "", &r, 1);
    cr_assert_eq(r.status, 201, "the request in flight was dropped");
    cr_assert_str_eq(test_http_header(&r, "Connection"), "close");
    /* The idle connection was closed, not left open. */
    char byte;
    cr_assert_eq(recv(idle, &byte, 1, 0), 0);
    close(idle);
    close(busy);
    test_gateway_stop(&gw);
    upstream_stop(&up);
}

Test(gateway, a_slow_check_does_not_hold_up_other_connections)
{
    uint16_t port;
    int store = test_silent_store(&port);
    char yaml[512];
    /* A 2 s deadline: the other request is answered long before it. */
    snprintf(yaml, sizeof yaml,
             "store: {url: \"redis://127.0.0.1:%u\", timeout_ms: 2000}\n"
             "rules:\n"
             "  - {name: per-key, match: api_key, limit: 5, period: 1m}\n"
             "  - {name: per-ip, match: ip, limit: 5, period: 1m, "
             "mode: local}\n", port);
    test_gateway gw;
    test_gateway_start(&gw, test_write_config("slow", yaml), NULL);
    int slow = test_http_connect(gw.port);
    static const char keyed[] = "GET / HTTP/1.1\r\nHost: t\r\n"
                                "X-Api-Key: ak_waits\r\n\r\n";
    test_sched_probe probe;
    test_sched_probe_start(&probe);
    uint64_t sent = test_now_us();
    cr_assert_eq(send(slow, keyed, sizeof keyed - 1, 0),
                 (ssize_t)sizeof keyed - 1);
    /* No API key: only the local rule applies, no store to wait for. */
    test_http_response r;
    test_http_get(gw.port, "/", "", &r);
    cr_assert_eq(r.status, 200);
    cr_assert_null(test_http_header(&r, "RateLimit-Degraded"));
    struct pollfd pfd = {slow, POLLIN, 0};
    cr_assert_eq(poll(&pfd, 1, 0), 0,
                 "the keyed request was answered before its store did");
    /* It is answered at its deadline, degraded, allowed by on_error. */
    test_http_exchange(slow, "", &r, 1);
    uint64_t took = test_now_us() - sent;
    uint64_t overslept = test_sched_probe_stop(&probe);
    fprintf(stderr, "gateway: a check on a silent store answered after "
            "%llu us (deadline 2 s, the probe overslept %llu us)\n",
            (unsigned long long)took, (unsigned long long)overslept);
    cr_assert(took >= 1999500 && took <= test_deadline_latest_us(2000,
                                                                 overslept),
              "answered after %llu us with a 2 s deadline",
              (unsigned long long)took);
    cr_assert_eq(r.status, 200);
    cr_assert_not_null(test_http_header(&r, "RateLimit-Degraded"));
    close(slow);
    test_gateway_stop(&gw);
    close(store);
}


Test(gateway, metrics_are_served_on_their_own_socket)
{
    const char *cfg = test_write_config("metrics", per_ip_local);
    char metrics[32];
    uint16_t port = test_free_port();
    snprintf(metrics, sizeof metrics, "127.0.0.1:%u", port);
    test_gateway gw;
    test_gateway_start(&gw, cfg, "--metrics", metrics, NULL);
    test_http_response r;
    for (int i = 0; i < 3; i++)
        test_http_get(gw.port, "/", "", &r); /* 200, 200, 429 */
    test_http_get(port, "/metrics", "", &r);
    cr_assert_eq(r.status, 200);
    cr_assert(strncmp(test_http_header(&r, "Content-Type"), "text/plain", 10)
              == 0);
    r.body[r.body_len] = '\0';
    char text[sizeof r.body + 2] = "\n";
    strcat(text, r.body);
    cr_assert_eq(test_prom_sample(text, "rl_requests_total{decision=\"allowed\"}"), 2,
                 "%s", text);
    cr_assert_eq(test_prom_sample(text, "rl_requests_total{decision=\"rejected\"}"), 1);
    cr_assert_eq(test_prom_sample(text, "rl_rule_checks_total{rule=\"per-ip\","
                        "verdict=\"rejected\"}"), 1);
    cr_assert_eq(test_prom_sample(text, "rl_gateway_responses_total{code=\"4xx\"}"), 1);
    cr_assert_eq(test_prom_sample(text, "rl_keys{mode=\"local\"}"), 1);
    /* A local rule's checks never wait for the store. */
    test_prom_histogram h;
    test_prom_histogram_read(text, "rl_exact_check_duration_seconds", &h);
    cr_assert_eq(h.count, 0, "%s", text);
    /* Every line is a comment or "name[{labels}] value". */
    for (char *line = strtok(r.body, "\n"); line; line = strtok(NULL, "\n")) {
        if (line[0] == '#')
            continue;
        char *space = strrchr(line, ' ');
        cr_assert_not_null(space, "bad line: %s", line);
        char *end;
        strtod(space + 1, &end);
        cr_assert(*end == '\0' && end != space + 1, "bad value: %s", line);
        cr_assert(strchr("abcdefghijklmnopqrstuvwxyz_", line[0]) != NULL,
                  "bad name: %s", line);
    }
    test_http_get(port, "/other", "", &r);
    cr_assert_eq(r.status, 404);
    /* The metrics socket does not rate-limit or count as a client. */
    test_http_get(port, "/metrics", "", &r);
    cr_assert_eq(r.status, 200);
    test_gateway_stop(&gw);
}

/* Whether the process ignores SIGPIPE (/proc's SigIgn mask). */
static bool ignores_sigpipe(pid_t pid)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f);
    unsigned long long mask = 0;
    while (fgets(line, sizeof line, f) != NULL)
        if (sscanf(line, "SigIgn: %llx", &mask) == 1)
            break;
    fclose(f);
    return (mask >> (SIGPIPE - 1)) & 1;
}

/* libuv writes with write(2): a client gone while its answer is written
 * raises SIGPIPE, which would end the gateway (and the aggregator, whose
 * peers are agents and Redis) with every client on it. */
Test(gateway, the_gateway_and_the_aggregator_ignore_sigpipe)
{
    const char *cfg = test_write_config("sigpipe", per_ip_local);
    test_gateway gw;
    test_gateway_start(&gw, cfg, NULL);
    cr_expect(ignores_sigpipe(gw.pid), "rl-gateway dies of SIGPIPE");
    test_gateway_stop(&gw);
    test_aggregator agg;
    test_aggregator_start(&agg, NULL,
                          "  - {name: sigpipe, match: tenant, limit: 10, "
                          "period: 1h, mode: synced}\n", 200, NULL);
    test_aggregator_wait_ready(&agg);
    cr_expect(ignores_sigpipe(agg.pid), "rl-aggregator dies of SIGPIPE");
    test_aggregator_stop(&agg);
}
