/*
 * Synced rules under load well above their limit: how much gets through,
 * with both a floor and a ceiling, so that a rule that never rejects, shares
 * that ignore the agent count, an estimate that forgets a burst before the
 * window edge or a cold key's unbounded first interval all land outside. What is promised is
 * docs/design.md's "The synced path and rl-aggregator"; the figures below are
 * what the code gives now.
 */
#include "test_agent.h"
#include "test_aggregator.h"
#include "test_env.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#define MAX_AGENTS 4

typedef struct fleet {
    test_aggregator agg;
    rl_agent *agents[MAX_AGENTS];
    rl_config *configs[MAX_AGENTS];
    int n;
    uint64_t period_ms;
    unsigned round_ms; /* offer(): one check per agent every round_ms */
    uint64_t redis_at, mono_at; /* Redis's clock, read at mono_at */
} fleet;

/* An aggregator with one synced rule (its own name, so that no other test
 * adds to its agent count) and n agents on it. */
static void fleet_start(fleet *f, const char *name, long limit,
                        uint64_t period_ms, unsigned interval_ms, int n)
{
    char rule[200];
    snprintf(rule, sizeof rule, "  - {name: %s, match: tenant, limit: %ld, "
             "period: %llums, mode: synced}\n", name, limit,
             (unsigned long long)period_ms);
    memset(f, 0, sizeof *f);
    f->period_ms = period_ms;
    f->round_ms = 1;
    f->n = n;
    test_aggregator_start(&f->agg, NULL, rule, interval_ms, NULL);
    for (int i = 0; i < n; i++)
        f->agents[i] = test_synced_agent(&f->agg, &f->configs[i]);
    redisContext *c = test_redis_connect(NULL);
    f->redis_at = test_redis_time_ms(c);
    f->mono_at = test_now_ms();
    redisFree(c);
}

static void fleet_stop(fleet *f)
{
    for (int i = 0; i < f->n; i++) {
        rl_agent_close(f->agents[i]);
        rl_config_free(f->configs[i]);
    }
    test_aggregator_stop(&f->agg);
}

/* Redis's clock, as the aggregator numbers windows by it. */
static uint64_t redis_now(const fleet *f)
{
    return f->redis_at + (test_now_ms() - f->mono_at);
}

static void wait_until(const fleet *f, uint64_t redis_ms)
{
    uint64_t now = redis_now(f);
    if (redis_ms > now)
        test_sleep_ms((unsigned)(redis_ms - now));
}

/* The start of the next window, plus at fraction `into` of it. */
static uint64_t next_window_at(const fleet *f, double into)
{
    uint64_t w = redis_now(f) / f->period_ms + 1;
    return w * f->period_ms + (uint64_t)(into * (double)f->period_ms);
}

static bool allowed(rl_agent *agent, const char *tenant)
{
    rl_attr a = {"tenant", tenant, strlen(tenant)};
    rl_decision d;
    cr_assert_eq(rl_check(agent, &a, 1, 1, &d), RL_OK);
    return d.allowed;
}

/* Offers one check per agent every round_ms until `until` on Redis's clock,
 * adding what each agent let through to admitted[]; returns the sum. */
static long offer(fleet *f, const char *tenant, uint64_t until,
                  long admitted[])
{
    long sum = 0;
    uint64_t start = test_now_ms();
    for (uint64_t round = 1; redis_now(f) < until; round++) {
        for (int i = 0; i < f->n; i++) {
            bool ok = allowed(f->agents[i], tenant);
            admitted[i] += ok;
            sum += ok;
        }
        uint64_t due = start + round * f->round_ms, now = test_now_ms();
        if (due > now)
            test_sleep_ms((unsigned)(due - now));
    }
    return sum;
}

/* --- One agent, ten times its limit: held to it, window after window. ---
 * Alone, an agent's estimate misses nothing (its own counts not yet in the
 * totals are added to them), so each window lets through the limit: all of
 * it at once in the key's first window, then as the previous one fades. */

Test(synced, one_agent_offered_ten_times_the_limit_gets_the_limit)
{
    enum { LIMIT = 100, PERIOD = 1000, WINDOWS = 3 };
    fleet f;
    fleet_start(&f, "alone", LIMIT, PERIOD, 50, 1);
    uint64_t at = next_window_at(&f, 0);
    wait_until(&f, at);
    for (int w = 0; w < WINDOWS; w++) {
        long admitted[1] = {0};
        long n = offer(&f, "org_alone", at + (uint64_t)(w + 1) * PERIOD,
                       admitted);
        fprintf(stderr, "synced alone: window %d: offered 10 x %d, admitted "
                "%ld\n", w, LIMIT, n);
        /* A window's edge as the test sees it and as the agent does differ
         * by a few ms: a few requests either side. */
        cr_expect_geq(n, w == 0 ? LIMIT : LIMIT * 8 / 10, "window %d", w);
        cr_expect_leq(n, LIMIT * 11 / 10, "window %d", w);
    }
    fleet_stop(&f);
}

/* --- Four agents: each gets its share of the room, not all of it. -------
 * Each agent has admitted one request in the window before, so all four
 * are counted and the window starts with nearly the whole limit as room.
 * Each agent's share is about room / 4, and a new share replaces the last
 * (what an agent let through since its last report comes out of it), so the
 * window admits the limit within the stated 5 %, each agent about a
 * quarter. Shares of the whole room would admit about four limits; shares
 * added on top of what was let through, about twice the limit. */

/* As test_synced_accuracy.c: the bound assumes an agent's I/O thread keeps
 * up with an interval, which under ThreadSanitizer it does at four times
 * the time scale (at one, CI run ci13 admitted 106 of the bound 105), the
 * offered rounds stretched as much: with a check per agent every ms, the
 * offering thread alone took a core, and the agents' reports came late
 * enough for TOTALS to miss some (106, (24, 24, 29, 29), in CI and beside
 * other work here). At every scale each agent is offered 20 times its
 * share. */
#ifdef __SANITIZE_THREAD__
#define SHARES_TIME_SCALE 4
#else
#define SHARES_TIME_SCALE 1
#endif

Test(synced, four_agents_split_the_room)
{
    enum { LIMIT = 100, PERIOD = 2000 * SHARES_TIME_SCALE, N = 4 };
    fleet f;
    fleet_start(&f, "shares", LIMIT, PERIOD, 200 * SHARES_TIME_SCALE, N);
    f.round_ms = SHARES_TIME_SCALE;
    wait_until(&f, next_window_at(&f, 0.1));
    for (int i = 0; i < N; i++)
        cr_assert(allowed(f.agents[i], "org_shares"));
    uint64_t at = next_window_at(&f, 0);
    wait_until(&f, at);
    long admitted[N] = {0};
    long sum = offer(&f, "org_shares", at + PERIOD, admitted);
    fprintf(stderr, "synced shares: one window, 4 agents offered %d x %d "
            "each: admitted %ld (%ld, %ld, %ld, %ld)\n",
            PERIOD / SHARES_TIME_SCALE / LIMIT, LIMIT, sum,
            admitted[0], admitted[1], admitted[2], admitted[3]);
    /* The four requests of the window before are still inside the span. */
    cr_expect_geq(sum, LIMIT * 9 / 10 - N);
    cr_expect_leq(sum, LIMIT * 105 / 100);
    for (int i = 0; i < N; i++) {
        cr_expect_geq(admitted[i], LIMIT / N / 2, "agent %d", i);
        cr_expect_leq(admitted[i], LIMIT / N + LIMIT / 10, "agent %d", i);
    }
    fleet_stop(&f);
}

/* --- Across a window edge: a burst counts for a whole period. -----------
 * The whole limit spent at once half-way through a window: for a period
 * from then nothing more gets through, the window edge notwithstanding
 * (an estimate that weighs the window before by the part of it still
 * inside lets about x x limit through x into the next window: 28 and 53 of
 * 100 measured a quarter and a half in, before sub-windows). Once the burst
 * has left the span (a period, one sub-window and a tick later), the limit
 * is there again, whole. The edge as the test sees it and as the agent
 * does differ by a few ms. */

Test(synced, a_burst_counts_for_a_whole_period_across_the_edge)
{
    enum { LIMIT = 100, PERIOD = 2000 };
    fleet f;
    fleet_start(&f, "edge", LIMIT, PERIOD, 100, 1);
    uint64_t at = next_window_at(&f, 0.5);
    wait_until(&f, at);
    uint64_t edge = at + PERIOD / 2;
    long admitted[1] = {0};
    long before = offer(&f, "org_edge", edge, admitted);
    long inside = offer(&f, "org_edge", at + PERIOD - 50, admitted);
    long later = offer(&f, "org_edge", at + 2 * PERIOD - 50, admitted);
    fprintf(stderr, "synced edge: limit %d spent at once (%ld); %ld more "
            "until a period after it, across the window edge; %ld in the "
            "next period once it left the span\n", LIMIT, before, inside,
            later);
    cr_expect_geq(before, LIMIT);
    cr_expect_leq(before, LIMIT + LIMIT / 20);
    cr_expect_leq(inside, LIMIT / 20);
    cr_expect_geq(later, LIMIT * 9 / 10);
    cr_expect_leq(later, LIMIT + LIMIT / 20);
    fleet_stop(&f);
}

/* --- A cold key: before any totals, the limit split by the agent count. -- */

Test(synced, a_cold_key_is_split_by_the_known_agent_count)
{
    enum { LIMIT = 100, N = 4, INTERVAL = 800 };
    fleet f;
    fleet_start(&f, "cold", LIMIT, 3600000, INTERVAL, N);
    /* Each agent reports a warm key; the next totals say four agents. */
    for (int i = 0; i < N; i++)
        cr_assert(allowed(f.agents[i], "org_warm"));
    uint64_t now = redis_now(&f);
    uint64_t tick = now - now % INTERVAL + INTERVAL;
    /* Totals come five eighths into each interval of Redis's clock, and
     * each gives every key a fresh share: the burst starts a quarter
     * interval after the first to follow the reports (an agent's first
     * report goes out an interval after it opens), so none comes during
     * it. */
    uint64_t at = tick + INTERVAL + INTERVAL * 3 / 4;
    wait_until(&f, at);
    long admitted[N] = {0}, sum = 0;
    for (int k = 0; k < LIMIT; k++) {
        for (int i = 0; i < N; i++) {
            bool ok = allowed(f.agents[i], "org_cold");
            admitted[i] += ok;
            sum += ok;
        }
    }
    uint64_t took = redis_now(&f) - at;
    fprintf(stderr, "synced cold key: 4 agents offered %d each: admitted %ld "
            "(%ld, %ld, %ld, %ld) in %llu ms\n", LIMIT, sum, admitted[0],
            admitted[1], admitted[2], admitted[3], (unsigned long long)took);
    cr_assert_lt(took, INTERVAL / 2, "the burst outlasted the quiet time");
    for (int i = 0; i < N; i++)
        cr_expect_eq(admitted[i], (LIMIT + N - 1) / N, "agent %d", i);
    fleet_stop(&f);
}

/* An agent that has never heard an aggregator knows no agent count and no
 * totals: it enforces the whole limit alone, for as long as that lasts. */
Test(synced, an_agent_that_never_heard_an_aggregator_enforces_the_limit)
{
    enum { LIMIT = 100 };
    fleet f;
    fleet_start(&f, "unheard", LIMIT, 3600000, 50, 0);
    test_aggregator_kill(&f.agg);
    f.agents[0] = test_synced_agent(&f.agg, &f.configs[0]);
    f.n = 1;
    long admitted[1] = {0};
    long n = offer(&f, "org_unheard", redis_now(&f) + 500, admitted);
    fprintf(stderr, "synced unheard: offered ~500, admitted %ld\n", n);
    cr_expect_eq(n, LIMIT);
    fleet_stop(&f);
}
