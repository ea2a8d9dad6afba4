/*
 * Leases sized by the aggregator's agent count (issue 28): a leased rule
 * hears the count for every on_error, and a burst from cold over ten
 * agents gets at least nine tenths of the bucket at once, never more.
 */
#include "config.h"
#include "test_agent.h"
#include "test_aggregator.h"
#include "test_env.h"

#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define AGENTS 10
#define EACH 30

static const char rule[] =
    "  - {name: per-key, match: api_key, limit: 100, period: 1m, "
    "mode: leased}\n";

struct burst {
    rl_agent *agent;
    const char *key;
    atomic_int *go;
    atomic_int *allowed;
};

static void *burst_run(void *arg)
{
    struct burst *b = arg;
    rl_attr attr = {"api_key", b->key, strlen(b->key)};
    while (!atomic_load(b->go))
        ;
    for (int i = 0; i < EACH; i++) {
        rl_decision d;
        cr_assert_eq(rl_check(b->agent, &attr, 1, 1, &d), RL_OK);
        cr_assert(!d.degraded);
        if (d.allowed)
            atomic_fetch_add(b->allowed, 1);
    }
    return NULL;
}

/* n agents on agg's URLs with rules, once they have heard their count:
 * every agent reports its presence each interval, and the totals that
 * carry the count follow within a few. */
static void open_fleet(const test_aggregator *agg, const char *rules,
                       rl_agent **agents, rl_config **configs, int n)
{
    for (int i = 0; i < n; i++) {
        char yaml[1024];
        int len = snprintf(yaml, sizeof yaml,
                           "store: {url: \"redis://%s\", timeout_ms: 2000}\n"
                           "aggregator: {reports: \"%s\", totals: \"%s\", "
                           "sync_interval_ms: 100}\nrules:\n%s",
                           test_env("RL_TEST_REDIS"), agg->reports,
                           agg->totals, rules);
        rl_error err;
        cr_assert_eq(rl_config_parse(yaml, (size_t)len, "<fleet>",
                                     &configs[i], &err), RL_OK, "%s",
                     err.message);
        rl_options o = {.config = configs[i]};
        cr_assert_eq(rl_agent_open(&agents[i], &o, &err), RL_OK, "%s",
                     err.message);
    }
    test_sleep_ms(1500);
}

/* Before issue 28 the count reached leased rules only with on_error:
 * local: each agent sized its hand as if alone, and 64 to 100 of the 300
 * were admitted at once (the rest sat in other agents' hands). */
Test(leased_fleet, a_cold_burst_over_ten_agents_gets_nine_tenths_at_once)
{
    test_aggregator agg = {.pid = -1, .extra = ""};
    test_aggregator_start(&agg, NULL, rule, 100, NULL);
    test_aggregator_wait_ready(&agg);
    rl_agent *agents[AGENTS];
    rl_config *configs[AGENTS];
    open_fleet(&agg, rule, agents, configs, AGENTS);
    char key[64];
    snprintf(key, sizeof key, "cold-%d-%llu", (int)getpid(),
             (unsigned long long)test_now_us());
    atomic_int go = 0, allowed = 0;
    pthread_t th[AGENTS];
    struct burst b[AGENTS];
    for (int i = 0; i < AGENTS; i++) {
        b[i] = (struct burst){agents[i], key, &go, &allowed};
        cr_assert_eq(pthread_create(&th[i], NULL, burst_run, &b[i]), 0);
    }
    uint64_t start = test_now_ms();
    atomic_store(&go, 1);
    for (int i = 0; i < AGENTS; i++)
        pthread_join(th[i], NULL);
    uint64_t ms = test_now_ms() - start;
    int n = atomic_load(&allowed);
    fprintf(stderr, "leased_fleet: cold burst: %d of %d admitted in %llu "
            "ms\n", n, AGENTS * EACH, (unsigned long long)ms);
    for (int i = 0; i < AGENTS; i++) {
        rl_agent_close(agents[i]);
        rl_config_free(configs[i]);
    }
    test_aggregator_stop(&agg);
    /* 100 a minute: under two tokens refill in a second. */
    cr_assert_leq(n, 100 + (int)((ms * 100 + 59999) / 60000), "%d of a "
                  "bucket of 100 admitted in %llu ms", n,
                  (unsigned long long)ms);
    cr_assert_geq(n, 90, "%d of a bucket of 100 admitted at once: the "
                  "rest sat in other agents' hands", n);
}

static bool allowed_at_cost(rl_agent *a, const char *key, uint64_t cost)
{
    rl_attr attr = {"api_key", key, strlen(key)};
    rl_decision d;
    cr_assert_eq(rl_check(a, &attr, 1, cost, &d), RL_OK);
    cr_assert(!d.degraded);
    return d.allowed;
}

static uint64_t tokens_taken(rl_agent *a)
{
    rl_agent_counters c;
    cr_assert_eq(rl_agent_stats(a, &c, NULL, 0), RL_OK);
    return c.lease_tokens_taken;
}

/* The agent count bounds a hand without fleet_size: of two agents the
 * aggregator counts, one holds at most half the bucket however fast it
 * takes tokens (40 at once, then 1 two milliseconds later: the second
 * lease asks for more than half of 100, leased::one_agent_cannot_hoard_
 * the_bucket), and the other gets all the rest. A leased rule that does
 * not hear the count leases as if alone: its hand is 59. */
Test(leased_fleet, the_agent_count_bounds_a_hand)
{
    enum { FIRST = 40 };
    static const char hoard_rule[] =
        "  - {name: per-key, match: api_key, limit: 100, period: 1d, "
        "mode: leased}\n";
    test_aggregator agg = {.pid = -1, .extra = ""};
    test_aggregator_start(&agg, NULL, hoard_rule, 100, NULL);
    test_aggregator_wait_ready(&agg);
    rl_agent *agents[2];
    rl_config *configs[2];
    open_fleet(&agg, hoard_rule, agents, configs, 2);
    char key[64];
    snprintf(key, sizeof key, "hoard-%d-%llu", (int)getpid(),
             (unsigned long long)test_now_us());
    uint64_t before = tokens_taken(agents[0]);
    cr_assert(allowed_at_cost(agents[0], key, FIRST));
    test_sleep_ms(2);
    cr_assert(allowed_at_cost(agents[0], key, 1));
    test_sleep_ms(50); /* a lease asked for is in */
    uint64_t hand = tokens_taken(agents[0]) - before - (FIRST + 1);
    int allowed = 0;
    for (int i = 0; i < 80; i++)
        allowed += allowed_at_cost(agents[1], key, 1);
    for (int i = 0; i < 2; i++) {
        rl_agent_close(agents[i]);
        rl_config_free(configs[i]);
    }
    test_aggregator_stop(&agg);
    cr_assert_leq(hand, 50, "one agent of two holds %llu of 100",
                  (unsigned long long)hand);
    cr_assert_eq((uint64_t)allowed, 100 - (FIRST + 1) - hand,
                 "the other agent got %d of the %llu left", allowed,
                 (unsigned long long)(100 - (FIRST + 1) - hand));
}
