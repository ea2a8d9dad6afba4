/*
 * rl-gateway's gateway.cost_header end to end: a request holds its
 * estimate (rl_check_hold) while a slow upstream answers, and its
 * response's X-Cost is what is charged in the end. The upstream sleeps
 * as an LLM backend streams, and several requests are with it at once.
 */
#include "test_agent.h"
#include "test_env.h"
#include "test_gateway.h"
#include "test_process.h"
#include "test_upstream.h"

#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define UPSTREAM_SLEEP_MS 150

/* A key no other test (or earlier run) has used. */
static void unique(char *buf, size_t cap, const char *stem)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    snprintf(buf, cap, "%s_%d_%ld%09ld", stem, (int)getpid(),
             (long)ts.tv_sec, ts.tv_nsec);
}

/* A gateway in front of up whose exact fixed-window rule counts each
 * API key's costs, with an estimate of 50 held until X-Cost (holds that
 * outlive a second are ended by the agent, and say so in the log). */
static void start(test_gateway *gw, test_upstream *up)
{
    char yaml[1024], url[64];
    snprintf(yaml, sizeof yaml,
             "store: {url: \"redis://%s\", timeout_ms: 1000}\n"
             "hold_timeout_ms: 1000\n"
             "gateway: {cost_header: X-Cost, cost_estimate: 50}\n"
             "rules:\n"
             "  - {name: tokens, match: api_key, limit: 100000000, "
             "period: 1h, algorithm: fixed_window}\n",
             test_env("RL_TEST_REDIS"));
    test_upstream_start(up, UPSTREAM_SLEEP_MS);
    snprintf(url, sizeof url, "http://127.0.0.1:%u", up->port);
    test_gateway_start(gw, test_write_config("gw-cost", yaml), "--upstream",
                       url, NULL);
}

static void stop(test_gateway *gw, test_upstream *up)
{
    test_gateway_stop(gw);
    test_upstream_stop(up);
}

/* How many lines of the gateway's log hold text. */
static int log_count(const test_gateway *gw, const char *text)
{
    char cmd[800], out[32];
    snprintf(cmd, sizeof cmd, "grep -c '%s' %s", text, gw->log);
    test_run(cmd, out, sizeof out);
    return atoi(out);
}

/* Waits (500 ms at most) until up has the one request sent. */
static void wait_busy(test_upstream *up)
{
    for (int i = 0; i < 100 && test_upstream_busy(up) == 0; i++)
        test_sleep_ms(5);
    cr_assert_eq(test_upstream_busy(up), 1);
}

#define CLIENTS 5
#define EACH 6

Test(gateway_cost, the_count_is_the_sum_of_the_responses_x_cost)
{
    test_gateway gw;
    test_upstream up;
    start(&gw, &up);
    char key[96], counted[128];
    unique(key, sizeof key, "ak_cost");
    snprintf(counted, sizeof counted, "rl:key:%s", key);
    /* Five clients at once, each with six costs of its own. */
    char text[CLIENTS * EACH][16];
    const char *costs[CLIENTS * EACH];
    long long sum = 0;
    for (int i = 0; i < CLIENTS * EACH; i++) {
        snprintf(text[i], sizeof text[i], "%d", 100 + 37 * i);
        costs[i] = text[i];
        sum += 100 + 37 * i;
    }
    int ok = test_upstream_clients(gw.port, key, costs, CLIENTS, EACH);
    cr_assert_eq(ok, CLIENTS * EACH, "%d of %d requests were answered 200",
                 ok, CLIENTS * EACH);
    cr_assert_geq(test_upstream_most(&up), 2, "the requests never were "
                  "with the upstream at once");
    /* Not the estimates (50 each): the costs the responses gave. */
    test_fixed_window_expect(test_env("RL_TEST_REDIS"), counted, sum);
    cr_assert_eq(log_count(&gw, "cost_estimate_charged"), 0);
    stop(&gw, &up);
}

Test(gateway_cost, a_missing_or_bad_x_cost_charges_the_estimate)
{
    test_gateway gw;
    test_upstream up;
    start(&gw, &up);
    char key[96], counted[128];
    unique(key, sizeof key, "ak_cost_bad");
    snprintf(counted, sizeof counted, "rl:key:%s", key);
    static const char *const bad[] = {NULL, "", "abc", "-5", "12.5",
                                      "4294967296"};
    size_t n = sizeof bad / sizeof bad[0];
    for (size_t i = 0; i < n; i++)
        cr_assert_eq(test_upstream_call(gw.port, "/v1/chat", key, bad[i]),
                     200);
    /* None, and the largest cost there is: both are costs (the key is
     * over its limit after that one). */
    cr_assert_eq(test_upstream_call(gw.port, "/v1/chat", key, "0"), 200);
    cr_assert_eq(test_upstream_call(gw.port, "/v1/chat", key, "4294967295"),
                 200);
    test_fixed_window_expect(test_env("RL_TEST_REDIS"), counted,
                           50LL * (long long)n + 4294967295LL);
    cr_assert_eq(log_count(&gw, "event=cost_estimate_charged"), (int)n,
                 "one line per estimate charged");
    /* The upstream sends no X-Cost for an empty one. */
    cr_assert_eq(log_count(&gw, "reason=\"the response has no X-Cost "
                           "header\""), 2);
    cr_assert_eq(log_count(&gw, "reason=\"must be a whole number from 0 to "
                           "4294967295, got .4294967296."), 1);
    stop(&gw, &up);
}

/* The client goes away while the upstream has its request: the exchange
 * is cancelled, and the hold ended then, at its estimate (the upstream's
 * X-Cost, were it waited for, would be 999). Ended, not left to expire:
 * no hold_expired line once the hold timeout has passed. */
Test(gateway_cost, a_client_gone_mid_exchange_is_charged_its_estimate)
{
    test_gateway gw;
    test_upstream up;
    start(&gw, &up);
    char key[96], counted[128];
    unique(key, sizeof key, "ak_cost_gone");
    snprintf(counted, sizeof counted, "rl:key:%s", key);
    for (int i = 0; i < 3; i++)
        test_upstream_abandon(gw.port, "/v1/chat", key, "999",
                              UPSTREAM_SLEEP_MS / 3);
    test_fixed_window_expect(test_env("RL_TEST_REDIS"), counted, 3 * 50);
    test_sleep_ms(2200);
    cr_assert_eq(test_fixed_window_count(test_env("RL_TEST_REDIS"), counted),
                 3 * 50);
    cr_assert_eq(log_count(&gw, "event=client_gone"), 3);
    cr_assert_eq(log_count(&gw, "hold_expired"), 0,
                 "a hold was left to expire");
    stop(&gw, &up);
}

/* --- in_flight: a slot held for the upstream exchange. ----------------- */

#define SLOW_MS 400

static void start_in_flight(test_gateway *gw, test_upstream *up)
{
    char yaml[1024], url[64];
    snprintf(yaml, sizeof yaml,
             "store: {url: \"redis://%s\", timeout_ms: 1000}\n"
             "hold_timeout_ms: 1000\n"
             "rules:\n"
             "  - {name: at-once, match: api_key, in_flight: 2}\n",
             test_env("RL_TEST_REDIS"));
    test_upstream_start(up, SLOW_MS);
    snprintf(url, sizeof url, "http://127.0.0.1:%u", up->port);
    test_gateway_start(gw, test_write_config("gw-in-flight", yaml),
                       "--upstream", url, NULL);
}

/* Five requests of a key at once, three times over, with in_flight: 2:
 * never more than two with the upstream, the others refused. */
Test(gateway_cost, in_flight_admits_at_most_n_at_once_through_the_gateway)
{
    test_gateway gw;
    test_upstream up;
    start_in_flight(&gw, &up);
    char key[96];
    unique(key, sizeof key, "ak_in_flight");
    int ok = 0, refused = 0;
    for (int round = 0; round < 3; round++) {
        /* A slot goes back in a call after its response: let it land. */
        test_sleep_ms(100);
        test_upstream_burst(gw.port, key, 5, &ok, &refused);
    }
    cr_assert_leq(test_upstream_most(&up), 2, "%d requests of one key were "
                  "with the upstream at once", test_upstream_most(&up));
    cr_assert_geq(ok, 6, "only %d served: slots were not given back", ok);
    cr_assert_gt(refused, 0);
    stop(&gw, &up);
}

/* A client gone frees its slot then, not when the upstream would have
 * answered (400 ms) nor when the hold would expire (1 s). */
Test(gateway_cost, a_client_gone_frees_its_in_flight_slot)
{
    test_gateway gw;
    test_upstream up;
    start_in_flight(&gw, &up);
    char key[96];
    unique(key, sizeof key, "ak_in_flight_gone");
    test_upstream_abandon(gw.port, "/v1/chat", key, NULL, 50);
    test_upstream_abandon(gw.port, "/v1/chat", key, NULL, 50);
    test_upstream_expect_room(gw.port, key, 250);
    stop(&gw, &up);
}

/* The same when the client sent more (the start of a pipelined request)
 * while the upstream had its request, then went: seen then, not when the
 * upstream would answer (2 s), so its slot is free within 250 ms. */
Test(gateway_cost, a_client_gone_after_sending_more_frees_its_slot)
{
    char yaml[1024], url[64], key[96], slots[128];
    snprintf(yaml, sizeof yaml,
             "store: {url: \"redis://%s\", timeout_ms: 1000}\n"
             "rules:\n"
             "  - {name: at-once, match: api_key, in_flight: 1}\n",
             test_env("RL_TEST_REDIS"));
    test_upstream up;
    test_upstream_start(&up, 2000);
    snprintf(url, sizeof url, "http://127.0.0.1:%u", up.port);
    test_gateway gw;
    test_gateway_start(&gw, test_write_config("gw-gone-more", yaml),
                       "--upstream", url, NULL);
    unique(key, sizeof key, "ak_gone_more");
    snprintf(slots, sizeof slots, "rl:in_flight:key:%s", key);
    int fd = test_upstream_send(gw.port, "/v1/chat", key, NULL);
    wait_busy(&up);
    cr_assert_eq(write(fd, "GET /next", 9), 9);
    test_sleep_ms(20);
    close(fd);
    uint64_t gone = test_now_us();
    redisContext *c = test_redis_connect(NULL);
    bool held = true;
    while (held && test_now_us() - gone < 250000) {
        redisReply *r = test_redis_command(c, "EXISTS %s", slots);
        held = r->integer != 0;
        freeReplyObject(r);
        if (held)
            test_sleep_ms(5);
    }
    redisFree(c);
    cr_assert(!held, "the slot was still held %llu ms after the client went",
              (unsigned long long)(test_now_us() - gone) / 1000);
    cr_assert_eq(log_count(&gw, "event=client_gone"), 1);
    stop(&gw, &up);
}

/* The config of a gateway reloaded by its tests (name): an exact fixed
 * window per API key, and gateway, a "gateway:" line or "". Its path. */
static const char *reloadable_config(const char *name, const char *gateway)
{
    char yaml[1024];
    snprintf(yaml, sizeof yaml, "store: {url: \"redis://%s\", "
             "timeout_ms: 1000}\n%s"
             "rules:\n"
             "  - {name: tokens, match: api_key, limit: 100000000, "
             "period: 1h, algorithm: fixed_window}\n",
             test_env("RL_TEST_REDIS"), gateway);
    return test_write_config(name, yaml);
}

/* The gateway of reloadable_config(name, gateway) in front of up, which
 * sleeps sleep_ms. */
static void start_reloadable(test_gateway *gw, test_upstream *up,
                             unsigned sleep_ms, const char *name,
                             const char *gateway)
{
    char url[64];
    test_upstream_start(up, sleep_ms);
    snprintf(url, sizeof url, "http://127.0.0.1:%u", up->port);
    test_gateway_start(gw, reloadable_config(name, gateway), "--upstream",
                       url, NULL);
}

/* Rewrites the config with gateway and waits for the SIGHUP's reload. */
static void reload_with(test_gateway *gw, const char *name,
                        const char *gateway)
{
    reloadable_config(name, gateway);
    long from = test_log_size(gw->log);
    kill(gw->pid, SIGHUP);
    test_wait_for_log_from(&gw->pid, gw->log, from, "event=reloaded", 5000);
}

/* gateway.cost_header is read again on SIGHUP: requests checked after the
 * reload cost what their response says, those before it 1. */
Test(gateway_cost, sighup_takes_up_a_new_cost_header)
{
    char key[96], counted[128];
    const char *redis = test_env("RL_TEST_REDIS");
    test_upstream up;
    test_gateway gw;
    start_reloadable(&gw, &up, 0, "gw-cost-reload", "");
    unique(key, sizeof key, "ak_cost_reload");
    snprintf(counted, sizeof counted, "rl:key:%s", key);
    cr_assert_eq(test_upstream_call(gw.port, "/v1/chat", key, "700"), 200);
    test_fixed_window_expect(redis, counted, 1);
    reload_with(&gw, "gw-cost-reload", "gateway: {cost_header: X-Cost}\n");
    cr_assert_eq(test_upstream_call(gw.port, "/v1/chat", key, "700"), 200);
    test_fixed_window_expect(redis, counted, 1 + 700);
    stop(&gw, &up);
}

/* A request is charged by the cost_header in force at its check: a
 * reload that drops the header while the upstream has the request does
 * not make it charged its estimate (50) instead of its X-Cost (700). */
Test(gateway_cost, a_reload_mid_exchange_keeps_the_checks_cost_header)
{
    char key[96], counted[128];
    test_upstream up;
    test_gateway gw;
    start_reloadable(&gw, &up, 500, "gw-cost-reload-mid",
                     "gateway: {cost_header: X-Cost, cost_estimate: 50}\n");
    unique(key, sizeof key, "ak_cost_reload_mid");
    snprintf(counted, sizeof counted, "rl:key:%s", key);
    int fd = test_upstream_send(gw.port, "/v1/chat", key, "700");
    wait_busy(&up);
    reload_with(&gw, "gw-cost-reload-mid", "");
    cr_assert_eq(test_upstream_busy(&up), 1, "the reload came after the "
                 "exchange");
    cr_assert_eq(test_upstream_read_status(fd), 200);
    test_fixed_window_expect(test_env("RL_TEST_REDIS"), counted, 700);
    stop(&gw, &up);
}

/* configs/ai-gateway.example.yaml with the test's Redis and a tenant map
 * of its own (written beside it, naming keys for tenant): its path. */
static const char *example_config(const char *keys[2], const char *tenant)
{
    char path[512], map[600];
    test_path(path, sizeof path, "RL_TEST_EXAMPLES", "ai-gateway.example.yaml");
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "cannot read %s", path);
    static char yaml[8192];
    size_t n = fread(yaml, 1, sizeof yaml - 1, f);
    fclose(f);
    cr_assert_lt(n, sizeof yaml - 1, "the example outgrew the test's buffer");
    yaml[n] = '\0';
    snprintf(map, sizeof map, "%s/ai-tenants-%d.txt",
             test_env("RL_TEST_TMPDIR"), (int)getpid());
    f = fopen(map, "w");
    cr_assert_not_null(f);
    fprintf(f, "%s %s\n%s %s\n", keys[0], tenant, keys[1], tenant);
    fclose(f);
    /* The two lines a deployment changes: where Redis and the map are. */
    static const char *const from[2] = {"redis://127.0.0.1:6379/0",
                                        "tenants.txt"};
    char url[96], out[8192 + 1024];
    snprintf(url, sizeof url, "redis://%s", test_env("RL_TEST_REDIS"));
    const char *to[2] = {url, map};
    const char *in = yaml;
    size_t o = 0;
    for (int i = 0; i < 2; i++) {
        const char *at = strstr(in, from[i]);
        cr_assert_not_null(at, "the example has no \"%s\"", from[i]);
        o += (size_t)snprintf(out + o, sizeof out - o, "%.*s%s",
                              (int)(at - in), in, to[i]);
        in = at + strlen(from[i]);
    }
    snprintf(out + o, sizeof out - o, "%s", in);
    return test_write_config("ai-gateway", out);
}

/* The AI gateway example as shipped: a tenant's 25 slow requests at once
 * get 20 streams (its in_flight), the others 429; a key's tokens are the
 * responses' X-Cost, and a response over the key's 100,000 takes its
 * bucket into debt, which refuses the key's next request. */
Test(gateway_cost, the_ai_gateway_example_limits_tokens_and_streams)
{
    char a[96], b[96], tenant[96], counted[128];
    unique(a, sizeof a, "ak_ai_a");
    unique(b, sizeof b, "ak_ai_b");
    unique(tenant, sizeof tenant, "org_ai");
    const char *keys[2] = {a, b};
    const char *cfg = example_config(keys, tenant);
    test_upstream up;
    test_upstream_start(&up, 300);
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%u", up.port);
    test_gateway gw;
    test_gateway_start(&gw, cfg, "--upstream", url, NULL);

    int ok = 0, refused = 0;
    test_upstream_burst(gw.port, a, 25, &ok, &refused);
    cr_assert_leq(test_upstream_most(&up), 20, "%d of a tenant's requests "
                  "streamed at once", test_upstream_most(&up));
    cr_assert_eq(ok + refused, 25);
    cr_assert_geq(refused, 5, "only %d of 25 refused", refused);

    /* 30,000 + 30,000 + 50,000 tokens: 110,000 charged, 10,000 of them
     * debt, 66 s of refill at 100,000 a minute (less what refilled since). */
    static const char *const costs[] = {"30000", "30000", "50000"};
    cr_assert_eq(test_upstream_calls(gw.port, b, costs, 3), 3);
    snprintf(counted, sizeof counted, "rl:key:%s", b);
    /* The last response's 49,500 over its estimate is charged after the
     * response is relayed, in the agent's next batch: polled for. */
    long long pttl = test_redis_pttl(NULL, counted);
    for (int waited = 0; pttl <= 63000 && waited < 2000; waited += 10) {
        test_sleep_ms(10);
        pttl = test_redis_pttl(NULL, counted);
    }
    cr_assert(pttl > 63000 && pttl <= 66000, "the bucket refills in %lld "
              "ms, not the 66,000 of 110,000 tokens", pttl);
    cr_assert_eq(test_upstream_call(gw.port, "/v1/chat", b, "10"), 429,
                 "a key in debt was served");
    test_gateway_stop(&gw);
    test_upstream_stop(&up);
}
