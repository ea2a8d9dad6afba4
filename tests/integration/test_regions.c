/*
 * Regions (docs/regions.md): a synced rule of scope: global is one limit
 * over every region. Each region here is its own redis-server and
 * rl-aggregator; the aggregators' exchanges go through a proxy per pair
 * and direction, which a test can make drop answers.
 */
#include "rl.h"
#include "test_agent.h"
#include "test_env.h"
#include "test_gateway.h"
#include "test_regions.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#define GLOBAL_RULE \
    "  - {name: g, match: api_key, limit: 1000, period: 10s, mode: synced, " \
    "scope: global, key_prefix: \"g:\"}\n"

static test_regions regions;

static void stop_regions(void)
{
    test_regions_stop(&regions);
}

/* Checks key n times on agent; how many it let through. */
static long admit(rl_agent *agent, const char *key, int n)
{
    rl_attr a = {"api_key", key, strlen(key)};
    long ok = 0;
    for (int i = 0; i < n; i++) {
        rl_decision d;
        cr_assert_eq(rl_check(agent, &a, 1, 1, &d), RL_OK);
        ok += d.allowed;
    }
    return ok;
}

/* Waits until region i's Redis holds want for the key (its window hash,
 * g:<key>:w), or fails after timeout_ms. */
static void expect_region_total(size_t i, const char *key, long long want,
                                unsigned timeout_ms)
{
    char name[128];
    snprintf(name, sizeof name, "g:%s", key);
    uint64_t start = test_now_ms();
    long long got;
    while ((got = test_window_total(regions.r[i].redis_addr, name))
           != want) {
        cr_assert_lt(test_now_ms() - start, timeout_ms, "region %s's Redis "
                     "holds %lld of %s, %lld were admitted",
                     regions.r[i].name, got, key, want);
        test_sleep_ms(20);
    }
}

/* What each region's agents admitted of a global key reaches every
 * region's Redis, once: each region's count is the fleet's. */
Test(regions, each_regions_counts_reach_every_region_once,
     .fini = stop_regions)
{
    test_regions_start(&regions, 3, GLOBAL_RULE, 100, "");
    rl_config *cfg[3];
    rl_agent *agent[3];
    for (size_t i = 0; i < 3; i++)
        agent[i] = test_region_agent(&regions, i, &cfg[i]);
    long admitted = admit(agent[0], "k", 40) + admit(agent[1], "k", 25)
                    + admit(agent[2], "k", 5);
    cr_assert_eq(admitted, 70);
    for (size_t i = 0; i < 3; i++)
        expect_region_total(i, "k", 70, 3000);
    /* Exchanges go on every interval: nothing is counted again. */
    test_sleep_ms(500);
    for (size_t i = 0; i < 3; i++)
        expect_region_total(i, "k", 70, 0);
    /* rlctl shows each region's part, from any region's Redis. */
    char out[4096];
    for (size_t i = 0; i < 3; i++) {
        cr_assert_eq(test_rlctl(out, sizeof out, regions.r[i].agg.config,
                                "totals --json"), 0, "%s", out);
        cr_assert(strstr(out, "\"estimate\":70,\"regions\":{\"eu\":40,"
                              "\"us\":25,\"ap\":5}") != NULL,
                  "region %zu: %s", i, out);
    }
    cr_assert_eq(test_rlctl(out, sizeof out, regions.r[1].agg.config,
                            "totals"), 0, "%s", out);
    cr_assert(strstr(out, "g (limit 1000, global): 1 client") != NULL, "%s",
              out);
    cr_assert(strstr(out, "EU         US         AP") != NULL, "%s", out);
    /* Each aggregator says when it last heard each other region. */
    test_http_response page;
    test_http_get(regions.r[0].agg.metrics, "/metrics", "", &page);
    cr_assert_eq(page.status, 200);
    for (size_t j = 1; j < 3; j++) {
        char line[128];
        snprintf(line, sizeof line,
                 "rl_agg_region_heard_seconds{region=\"%s\"} 0.",
                 regions.r[j].name);
        cr_assert(strstr(page.body, line) != NULL, "no %s in %s", line,
                  page.body);
    }
    cr_assert(strstr(page.body, "rl_agg_region_exchange_lag_seconds{"
                                "region=\"us\"}") != NULL);
    for (size_t i = 0; i < 3; i++) {
        rl_agent_close(agent[i]);
        rl_config_free(cfg[i]);
    }
}

/* An exchange applied whose answer is lost is sent again, the same
 * number, and counted once: the sender gives up on a silent connection
 * after two intervals and dials again. */
Test(regions, a_resent_exchange_is_counted_once, .fini = stop_regions)
{
    test_regions_start(&regions, 2, GLOBAL_RULE, 100, "");
    rl_config *cfg;
    rl_agent *agent = test_region_agent(&regions, 0, &cfg);
    /* eu's exchanges to us: from the one carrying this key on, its
     * answers are lost (us applies it). */
    test_proxy_silence_from(regions.r[0].to[1], "resent-key", 10, false);
    cr_assert_eq(admit(agent, "resent-key", 30), 30);
    expect_region_total(1, "resent-key", 30, 3000);
    uint64_t start = test_now_ms();
    while (!test_proxy_silenced(regions.r[0].to[1])
           || test_proxy_accepted(regions.r[0].to[1]) < 2) {
        cr_assert_lt(test_now_ms() - start, 3000, "eu never dialled us "
                     "again after the lost answer");
        test_sleep_ms(20);
    }
    /* The resend and the exchanges after it count nothing again. */
    cr_assert_eq(admit(agent, "resent-key", 5), 5);
    expect_region_total(1, "resent-key", 35, 3000);
    test_sleep_ms(500);
    expect_region_total(1, "resent-key", 35, 0);
    expect_region_total(0, "resent-key", 35, 0);
    rl_agent_close(agent);
    rl_config_free(cfg);
}

/* An aggregator that stops sends what its region counted to the others
 * first: an agent's last report, applied just before the stop, is not
 * lost to them (the next exchange was a second away). */
Test(regions, a_stopping_aggregator_sends_its_last_counts,
     .fini = stop_regions)
{
    test_regions_start(&regions, 2, GLOBAL_RULE, 1000, "");
    rl_config *cfg;
    rl_agent *agent = test_region_agent(&regions, 0, &cfg);
    cr_assert_eq(admit(agent, "last", 10), 10);
    rl_agent_close(agent);
    rl_config_free(cfg);
    test_aggregator_stop(&regions.r[0].agg);
    expect_region_total(1, "last", 10, 1000);
}
