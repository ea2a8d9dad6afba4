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
    for (int i = 0; i < AGENTS; i++) {
        char yaml[1024];
        int n = snprintf(yaml, sizeof yaml,
                         "store: {url: \"redis://%s\", timeout_ms: 2000}\n"
                         "aggregator: {reports: \"%s\", totals: \"%s\", "
                         "sync_interval_ms: 100}\nrules:\n%s",
                         test_env("RL_TEST_REDIS"), agg.reports, agg.totals,
                         rule);
        rl_error err;
        cr_assert_eq(rl_config_parse(yaml, (size_t)n, "<fleet>", &configs[i],
                                     &err), RL_OK, "%s", err.message);
        rl_options o = {.config = configs[i]};
        cr_assert_eq(rl_agent_open(&agents[i], &o, &err), RL_OK, "%s",
                     err.message);
    }
    /* Every agent reports its presence each interval; the totals that
     * carry the count of ten follow within a few. */
    test_sleep_ms(1500);
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
