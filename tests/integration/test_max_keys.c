/*
 * aggregator.max_keys: an agent tracks at most that many synced keys. A key
 * beyond the cap is decided by its rule's on_error (degraded), counted in
 * rl_agent_stats' synced_keys_refused, and logged as
 * event=synced_keys_capped; the keys already tracked are decided as
 * before. Keys idle for two periods are forgotten, which makes room.
 */
#include "test_aggregator.h"
#include "test_agent.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static rl_decision check(rl_agent *a, const char *name, const char *value)
{
    rl_attr attr = {name, value, strlen(value)};
    rl_decision d;
    cr_assert_eq(rl_check(a, &attr, 1, 1, &d), RL_OK);
    return d;
}

static rl_agent_counters counters(rl_agent *a)
{
    rl_agent_counters c;
    cr_assert_eq(rl_agent_stats(a, &c, NULL, 0), RL_OK);
    return c;
}

/* The cap is 50 keys; the load is 110 keys, under the table's 128 slots
 * (two per key, rounded up to a power of two), so that an agent ignoring
 * the cap would track them all rather than run out of slots. */
#define CAP 50
#define OVER 60

Test(max_keys, keys_over_the_cap_are_decided_by_on_error_and_logged)
{
    test_aggregator agg;
    test_aggregator_start(&agg, NULL,
                          "  - {name: per-tenant, match: tenant, limit: 3, "
                          "period: 1m, mode: synced, on_error: deny}\n"
                          "  - {name: per-user, match: user, limit: 3, "
                          "period: 1m, mode: synced, on_error: allow}\n", 100,
                          &TEST_AGGREGATOR_EXTRA("  max_keys: 50\n"));
    static test_log log;
    test_log_init(&log);
    rl_config *cfg;
    rl_agent *a = test_agent_on(agg.config, &cfg, &log);
    char value[64];
    for (int i = 0; i < CAP; i++) {
        snprintf(value, sizeof value, "t%d-%d", i, (int)getpid());
        rl_decision d = check(a, "tenant", value);
        cr_assert(d.allowed && !d.degraded, "key %d of %d: %s", i + 1, CAP,
                  d.degraded ? "degraded" : "rejected");
    }
    cr_assert_eq(counters(a).synced_keys, CAP);
    cr_assert_eq(counters(a).synced_keys_refused, 0);
    /* Each key over the cap, twice: refused each time. */
    for (int i = CAP; i < CAP + OVER; i++) {
        snprintf(value, sizeof value, "t%d-%d", i, (int)getpid());
        for (int k = 0; k < 2; k++) {
            rl_decision d = check(a, "tenant", value);
            cr_assert(d.degraded && !d.allowed, "key %d, over the cap of %d, "
                      "was %s%s", i + 1, CAP, d.allowed ? "allowed" :
                      "rejected", d.degraded ? " (degraded)" : "");
        }
    }
    /* The cap is per agent, across rules; this rule's on_error allows. */
    rl_decision d = check(a, "user", "u-over-the-cap");
    cr_assert(d.degraded && d.allowed, "per-user's on_error: allow");
    const unsigned long long refused = 2 * OVER + 1;
    rl_agent_counters c = counters(a);
    cr_assert_eq(c.synced_keys, CAP);
    cr_assert_eq(c.synced_keys_refused, refused, "%llu refusals counted, "
                 "%llu made", (unsigned long long)c.synced_keys_refused,
                 refused);
    /* A tracked key is decided as before: its limit of 3, not degraded. */
    snprintf(value, sizeof value, "t0-%d", (int)getpid());
    for (int i = 1; i < 3; i++)
        cr_assert(check(a, "tenant", value).allowed);
    d = check(a, "tenant", value);
    cr_assert(!d.allowed && !d.degraded, "a tracked key's 4th request of 3 "
              "was %s", d.allowed ? "allowed" : "degraded");
    char line[64];
    snprintf(line, sizeof line, "refused=%llu max_keys=%d", refused, CAP);
    cr_assert(test_log_wait(&log, "event=synced_keys_capped", line, 5000),
              "no synced_keys_capped with %s:\n%s", line, log.text);
    rl_agent_close(a);
    rl_config_free(cfg);
    test_aggregator_stop(&agg);
}

Test(max_keys, idle_keys_make_room_after_two_periods)
{
    test_aggregator agg;
    test_aggregator_start(&agg, NULL,
                          "  - {name: per-tenant, match: tenant, limit: 100, "
                          "period: 1s, mode: synced, on_error: deny}\n", 100,
                          &TEST_AGGREGATOR_EXTRA("  max_keys: 5\n"));
    rl_config *cfg;
    rl_agent *a = test_agent_on(agg.config, &cfg, NULL);
    char value[64];
    for (int i = 0; i < 5; i++) {
        snprintf(value, sizeof value, "idle%d-%d", i, (int)getpid());
        cr_assert(!check(a, "tenant", value).degraded);
    }
    uint64_t last_count = test_now_ms();
    snprintf(value, sizeof value, "new-%d", (int)getpid());
    bool tracked = false;
    while (!tracked && test_now_ms() - last_count < 10000) {
        tracked = !check(a, "tenant", value).degraded;
        if (!tracked)
            test_sleep_ms(20);
    }
    uint64_t after = test_now_ms() - last_count;
    cr_assert(tracked, "the five idle keys were not forgotten in 10 s");
    /* Forgotten after two periods (2 s) without counts, not before (less
     * 50 ms: the agent's loop reads a cached clock). */
    cr_assert_geq(after, 1950, "a key was forgotten after %llu ms idle",
                  (unsigned long long)after);
    cr_assert_eq(counters(a).synced_keys, 1);
    rl_agent_close(a);
    rl_config_free(cfg);
    test_aggregator_stop(&agg);
}
