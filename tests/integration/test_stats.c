/*
 * rl_agent_stats: requests and per-rule verdicts, exact-check latency (a
 * histogram in seconds), store batches, keys of local rules, and degraded
 * decisions when the store is away.
 */
#include "rl.h"
#include "redis_server.h"
#include "test_agent.h"
#include "test_env.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* How long Redis is paused under one of the checks, in ms. */
#define PAUSE_MS 100

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* n checks, none longer than longest_s seconds, all of them total_s: each
 * one in the buckets from the first bound at or above longest_s, and their
 * sum at most total_s, in seconds (not micro-, milli- or nanoseconds). */
static void assert_histogram(const rl_histogram *h, uint64_t n,
                             double longest_s, double total_s)
{
    cr_assert_eq(h->count, n);
    cr_assert(h->le_s[0] == 0.00001 && h->le_s[RL_HISTOGRAM_BOUNDS - 1] == 10,
              "bounds from 10 us to 10 s: %g to %g", h->le_s[0],
              h->le_s[RL_HISTOGRAM_BOUNDS - 1]);
    for (int i = 0; i < RL_HISTOGRAM_BOUNDS; i++) {
        uint64_t below = i > 0 ? h->buckets[i - 1] : 0;
        cr_assert(i == 0 || h->le_s[i] > h->le_s[i - 1], "bounds ascend");
        cr_assert(h->buckets[i] >= below && h->buckets[i] <= h->count,
                  "buckets are cumulative: le=%g holds %llu", h->le_s[i],
                  (unsigned long long)h->buckets[i]);
        if (h->le_s[i] >= longest_s)
            cr_assert_eq(h->buckets[i], n, "le=%g holds %llu of %llu, none "
                         "of them took over %g s", h->le_s[i],
                         (unsigned long long)h->buckets[i],
                         (unsigned long long)n, longest_s);
    }
    /* A Redis round trip takes more than a microsecond, even on
     * loopback. */
    cr_assert(h->sum_s > (double)n * 1e-6 && h->sum_s <= total_s, "sum %g s "
              "of %llu checks that took %g s", h->sum_s,
              (unsigned long long)n, total_s);
}

/* One of the checks took at least least_s seconds: it is in no bucket
 * below that, and the sum holds it. A histogram fed in a smaller unit
 * than the one it shows puts it a thousand times lower. */
static void assert_one_took(const rl_histogram *h, double least_s)
{
    for (int i = 0; i < RL_HISTOGRAM_BOUNDS && h->le_s[i] < least_s; i++)
        cr_assert_lt(h->buckets[i], h->count, "le=%g holds all %llu checks, "
                     "one of which took %g s at least", h->le_s[i],
                     (unsigned long long)h->count, least_s);
    cr_assert_geq(h->sum_s, least_s, "sum %g s, one check alone took %g s",
                  h->sum_s, least_s);
}

static rl_agent *open_agent(const char *store, rl_config **cfg)
{
    char yaml[1024];
    snprintf(yaml, sizeof yaml,
             "store: {%s}\n"
             "rules:\n"
             "  - {name: per-key, match: api_key, limit: 3, period: 1h}\n"
             "  - {name: per-user, match: user, limit: 100, period: 1h, "
             "on_error: deny}\n"
             "  - {name: per-ip, match: ip, limit: 1, period: 1h, "
             "mode: local}\n", store);
    rl_error err;
    cr_assert_eq(rl_config_parse(yaml, strlen(yaml), "stats.yaml", cfg,
                                 &err), RL_OK, "%s", err.message);
    rl_options o = {.config = *cfg};
    rl_agent *a;
    cr_assert_eq(rl_agent_open(&a, &o, &err), RL_OK, "%s", err.message);
    return a;
}

Test(stats, requests_rules_latency_and_batches_are_counted)
{
    /* A Redis of its own: one check waits out a pause of its clients. */
    test_redis srv;
    char store[128], key[64], addr[64];
    test_agent_private_redis(&srv, addr, sizeof addr);
    /* Time enough for the pause and Redis to notice its end. */
    snprintf(store, sizeof store, "url: \"redis://%s\", timeout_ms: 1000",
             addr);
    snprintf(key, sizeof key, "stats-%d-%ld", (int)getpid(),
             (long)time(NULL));
    rl_config *cfg;
    rl_agent *a = open_agent(store, &cfg);
    rl_attr attrs[] = {{"api_key", key, strlen(key)},
                       {"user", key, strlen(key)},
                       {"ip", "10.1.1.1", 8}};
    rl_decision d;
    double longest_s = 0, total_s = 0, pause_to_check_s = 0;
    redisContext *c = test_redis_connect(addr);
    /* Redis sees a pause's end at its next wake-up: with nothing else to
     * do, its cron's, every 10 ms at hz 100 (100 ms by default). */
    freeReplyObject(test_redis_command(c, "CONFIG SET hz 100"));
    for (int i = 0; i < 5; i++) {
        double started = now_s();
        /* The last check waits out a pause of Redis's clients: it takes
         * PAUSE_MS at least, less the time taken to start it. */
        if (i == 4) {
            freeReplyObject(test_redis_command(c, "CLIENT PAUSE %d ALL",
                                               PAUSE_MS));
            pause_to_check_s = now_s() - started;
        }
        cr_assert_eq(rl_check(a, attrs, 2, 1, &d), RL_OK);
        double took = now_s() - started;
        total_s += took;
        longest_s = took > longest_s ? took : longest_s;
    }
    redisFree(c);
    cr_assert_eq(rl_check(a, &attrs[2], 1, 1, &d), RL_OK);
    cr_assert_eq(rl_check(a, &attrs[2], 1, 1, &d), RL_OK);
    rl_agent_counters s;
    rl_rule_counters rules[3];
    cr_assert_eq(rl_agent_stats(a, &s, rules, 3), RL_OK);
    cr_assert_eq(s.requests, 7);
    cr_assert_eq(s.allowed, 4, "3 keyed + 1 ip allowed, got %llu",
                 (unsigned long long)s.allowed);
    cr_assert_eq(s.rejected, 3);
    cr_assert_eq(s.degraded, 0);
    cr_assert_eq(s.n_rules, 3);
    cr_assert_str_eq(rules[0].rule, "per-key");
    cr_assert_eq(rules[0].checks, 5);
    cr_assert_eq(rules[0].allowed, 3);
    cr_assert_eq(rules[0].rejected, 2);
    cr_assert_eq(rules[1].checks, 5);
    cr_assert_eq(rules[1].allowed, 5);
    cr_assert_eq(rules[2].checks, 2);
    cr_assert_eq(rules[2].rejected, 1);
    /* The two local-only checks never waited for the store. */
    assert_histogram(&s.exact_check_seconds, 5, longest_s, total_s);
    /* Started within half the pause of it, the check took a quarter of
     * it at least, even if its thread was held a while after starting. */
    cr_assert_lt(pause_to_check_s, PAUSE_MS / 2e3, "the paused check "
                 "started %g s after the pause", pause_to_check_s);
    assert_one_took(&s.exact_check_seconds, PAUSE_MS / 4e3);
    cr_assert_geq(s.store_batches, 5, "one batch per request at least");
    cr_assert_eq(s.local_keys, 1);
    cr_assert_eq(rl_agent_stats(NULL, &s, NULL, 0), RL_EINVAL);
    cr_assert_eq(rl_agent_stats(a, &s, NULL, 0), RL_OK);
    rl_agent_close(a);
    rl_config_free(cfg);
    test_redis_stop(&srv);
}

Test(stats, degraded_decisions_and_store_errors_are_counted)
{
    rl_config *cfg;
    rl_agent *a = open_agent("url: \"redis://127.0.0.1:1\", timeout_ms: 200",
                             &cfg);
    rl_attr attrs[] = {{"api_key", "k", 1}, {"user", "u", 1}};
    rl_decision d;
    for (int i = 0; i < 4; i++) {
        cr_assert_eq(rl_check(a, attrs, 2, 1, &d), RL_OK);
        cr_assert(d.degraded);
        cr_assert(!d.allowed, "per-user's on_error: deny");
    }
    rl_agent_counters s;
    rl_rule_counters rules[3];
    cr_assert_eq(rl_agent_stats(a, &s, rules, 3), RL_OK);
    cr_assert_eq(s.degraded, 4);
    cr_assert_eq(s.rejected, 4);
    cr_assert_eq(s.store_errors, 8, "two calls per request");
    cr_assert_eq(rules[0].degraded, 4);
    cr_assert_eq(rules[0].allowed, 4, "per-key's on_error: allow");
    cr_assert_eq(rules[1].degraded, 4);
    cr_assert_eq(rules[1].rejected, 4);
    rl_agent_close(a);
    rl_config_free(cfg);
}
