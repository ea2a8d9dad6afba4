/*
 * Synced rules held to the limit over any span of one period, not only over
 * aligned windows: ten agents in this process (rl_agent, as a gateway links
 * it), a real rl-aggregator, a real Redis, a rule of 200 per 2 s synced
 * every 100 ms, requests spread round-robin over the agents. Every
 * admission's time is kept, and the largest number admitted in any span of
 * one period must be within 5 % of the limit (docs/design.md, "The synced
 * path and rl-aggregator"); in steady overload the fleet must still admit
 * at least 90 % of the limit per period on average.
 *
 * "From cold" means a key no agent has counted before; the agents have
 * each checked another key of the same rule first and then waited for the
 * aggregator's totals, so that they know how many they are (their presence
 * reports would tell them anyway; the bound assumes a known agent count).
 */
#include "test_agent.h"
#include "test_aggregator.h"
#include "test_env.h"
#include "test_fleet.h"
#include "wire.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define AGENTS 10
#define LIMIT 200
/* The bound assumes each agent's I/O thread handles a tick, its report's
 * ack and a TOTALS message well within one interval. Under ThreadSanitizer
 * (ten agents, an aggregator, all instrumented, on two cores) it does not
 * at 100 ms, so the ten-agent tests hold the same bounds at four times
 * the time scale there. */
#ifdef __SANITIZE_THREAD__
#define TIME_SCALE 4
#else
#define TIME_SCALE 1
#endif
#define PERIOD_MS (2000 * TIME_SCALE)
#define INTERVAL_MS (100 * TIME_SCALE)
/* The one-agent tests below keep their own times: one agent keeps up. */
#define ONE_AGENT_PERIOD_MS 2000

typedef test_fleet fleet;
typedef test_admissions admissions;

static bool allowed(rl_agent *agent, const char *tenant)
{
    return test_fleet_allowed(agent, tenant);
}

/* An aggregator with one synced rule of its own name (no other test adds
 * to its agent count), ten agents, each of which has counted a warm key
 * and heard the totals since. */
static void fleet_start_at(fleet *f, const char *name, long limit)
{
    char rule[200];
    snprintf(rule, sizeof rule, "  - {name: %s, match: tenant, limit: %ld, "
             "period: %dms, mode: synced}\n", name, limit, PERIOD_MS);
    test_fleet_start(f, AGENTS, NULL, rule, INTERVAL_MS, "org_warm", NULL,
                     NULL);
}

static void fleet_start(fleet *f, const char *name)
{
    fleet_start_at(f, name, LIMIT);
}

/* Admitted per period, on average, from `from` µs after the first
 * admission to the end of the run. */
static double per_period_from(const admissions *a, uint64_t start_us,
                              uint64_t from_ms, uint64_t to_ms)
{
    long n = 0;
    for (size_t i = 0; i < a->n; i++)
        n += a->at_us[i] >= start_us + from_ms * 1000
             && a->at_us[i] < start_us + to_ms * 1000;
    return (double)n * PERIOD_MS / (double)(to_ms - from_ms);
}

static void expect_within_the_bound(const char *what, const admissions *a)
{
    long worst = test_worst_span(a, PERIOD_MS);
    /* Over the bound: what was admitted per 100 ms, to see where. */
    if (worst > LIMIT * 105 / 100) {
        uint64_t t0 = a->at_us[0];
        long bucket[200] = {0};
        for (size_t i = 0; i < a->n; i++)
            if ((a->at_us[i] - t0) / 100000 < 200)
                bucket[(a->at_us[i] - t0) / 100000]++;
        for (int b = 0; b < 140; b++)
            fprintf(stderr, "%ld%c", bucket[b], b % 20 == 19 ? '\n' : ' ');
    }
    fprintf(stderr, "synced accuracy: %s: offered %ld, admitted %zu, worst "
            "span of one period %ld (limit %d, bound %d)\n", what,
            a->offered, a->n, worst, LIMIT, LIMIT * 105 / 100);
    cr_expect_leq(worst, LIMIT * 105 / 100, "%s: %ld in one period", what,
                  worst);
    /* A fleet that stopped early, or never started, is no success. */
    cr_expect_geq(worst, LIMIT * 9 / 10, "%s: %ld in one period", what,
                  worst);
}

/* Periods offered. The ten-times test: the cold one, one more, then the
 * steady ones averaged. Under ThreadSanitizer, where a period is 8 s and
 * these tests run alone, one period fewer from cold at twice the limit
 * and two steady ones instead of four at ten times: the same bounds over
 * 16 and 32 s, not 24 and 48 (ThreadSanitizer is there for the races; the
 * bounds hold whole in every build). */
#ifdef __SANITIZE_THREAD__
#define TWICE_PERIODS 2
#define TEN_TIMES_PERIODS 4
#else
#define TWICE_PERIODS 3
#define TEN_TIMES_PERIODS 6
#endif

Test(synced, twice_the_limit_from_cold_stays_within_5_percent_over_any_span)
{
    fleet f;
    fleet_start(&f, "acc2");
    admissions a = {0};
    test_fleet_offer(&f, "org_acc2", 2.0 * LIMIT * 1000 / PERIOD_MS,
                     TWICE_PERIODS * PERIOD_MS, &a);
    expect_within_the_bound("2x from cold", &a);
    test_admissions_free(&a);
    test_fleet_stop(&f);
}

Test(synced, ten_times_the_limit_stays_within_5_percent_and_gets_90_percent)
{
    enum { PERIODS = TEN_TIMES_PERIODS };
    fleet f;
    fleet_start(&f, "acc10");
    admissions a = {0};
    uint64_t start = test_now_us();
    test_fleet_offer(&f, "org_acc10", 10.0 * LIMIT * 1000 / PERIOD_MS,
                     PERIODS * PERIOD_MS, &a);
    expect_within_the_bound("10x from cold, then steady", &a);
    /* Steady: the periods after the first (the cold burst) and one more. */
    double avg = per_period_from(&a, start, 2 * PERIOD_MS,
                                 PERIODS * PERIOD_MS);
    fprintf(stderr, "synced accuracy: 10x steady: %.1f admitted per period "
            "on average (limit %d, floor %d)\n", avg, LIMIT, LIMIT * 9 / 10);
    cr_expect_geq(avg, LIMIT * 0.9);
    test_admissions_free(&a);
    test_fleet_stop(&f);
}

/* An interval of two sub-windows (a rule of 200 per 2 s synced every
 * 200 ms, the shape of 300 per 10 s synced every second): at least 0.95
 * of the limit a period in steady overload, within 1.05 over any span.
 * Counted only at ticks and given back only at ticks and totals (five
 * eighths into the interval then), a request's room came back a period
 * and an interval after it: 184.5 of 200 a period. Four agents at twice
 * the limit, one period from cold, then the steady ones averaged. */
Test(synced, an_interval_of_two_sub_windows_gets_95_percent)
{
    enum { AGENTS_HERE = 4, PERIODS = 5 };
    /* Four agents keep up with TSan at twice the time (alone). */
    const uint64_t scale = TIME_SCALE > 1 ? 2 : 1;
    const uint64_t period = 2000 * scale, interval = 200 * scale;
    char rule[200];
    snprintf(rule, sizeof rule, "  - {name: acc2g, match: tenant, limit: %d, "
             "period: %llums, mode: synced}\n", LIMIT,
             (unsigned long long)period);
    fleet f;
    test_fleet_start(&f, AGENTS_HERE, NULL, rule, (unsigned)interval,
                     "org_warm", NULL, NULL);
    admissions a = {0};
    uint64_t start = test_now_us();
    test_fleet_offer(&f, "org_acc2g", 2.0 * LIMIT * 1000 / (double)period,
                     PERIODS * period, &a);
    long worst = test_worst_span(&a, period);
    double avg = (double)test_admitted_between(&a, start + period * 1000,
                                               start + PERIODS * period
                                                           * 1000)
                 / (PERIODS - 1);
    fprintf(stderr, "synced accuracy: 2x, two sub-windows an interval: "
            "worst span of one period %ld (bound %d), %.1f admitted per "
            "period on average after the first (floor %d)\n", worst,
            LIMIT * 105 / 100, avg, LIMIT * 95 / 100);
    cr_expect_leq(worst, LIMIT * 105 / 100);
    cr_expect_geq(avg, LIMIT * 0.95);
    test_admissions_free(&a);
    test_fleet_stop(&f);
}

/* Redis's clock, read once, carried on by the monotonic clock. */
typedef struct redis_clock {
    uint64_t redis_at, mono_at;
} redis_clock;

static redis_clock redis_clock_read(void)
{
    redisContext *c = test_redis_connect(NULL);
    redis_clock k = {test_redis_time_ms(c), test_now_ms()};
    redisFree(c);
    return k;
}

static uint64_t redis_clock_now(const redis_clock *k)
{
    return k->redis_at + (test_now_ms() - k->mono_at);
}

/* One agent syncing every interval_ms, 100 per 2 s: the whole limit spent
 * at once burst_before_end_ms before a sub-window ends, then a request
 * every ms for 4 s. */
static void one_agent_burst_then_steady(const char *name, const char *tenant,
                                        unsigned interval_ms,
                                        uint64_t burst_before_end_ms,
                                        admissions *a)
{
    char rule[200];
    snprintf(rule, sizeof rule, "  - {name: %s, match: tenant, "
             "limit: 100, period: %dms, mode: synced}\n", name, ONE_AGENT_PERIOD_MS);
    test_aggregator agg;
    test_aggregator_start(&agg, NULL, rule, interval_ms, NULL);
    test_aggregator_wait_ready(&agg);
    rl_config *cfg;
    rl_agent *agent = test_synced_agent(&agg, &cfg);
    char warm[64];
    snprintf(warm, sizeof warm, "%s_warm", tenant);
    cr_assert(allowed(agent, warm));
    test_sleep_ms(300);
    uint64_t g = ONE_AGENT_PERIOD_MS / RL_WIRE_SUBWINDOWS;
    redis_clock k = redis_clock_read();
    uint64_t now = redis_clock_now(&k);
    uint64_t burst = (now / g + 2) * g - burst_before_end_ms;
    test_sleep_ms((unsigned)(burst - now));
    for (int i = 0; i < 150; i++) {
        a->offered++;
        if (allowed(agent, tenant))
            test_admissions_push(a, test_now_us());
    }
    uint64_t start = test_now_us();
    for (uint64_t due = start; due < start + 4000000; due += 1000) {
        uint64_t t = test_now_us();
        if (due > t)
            usleep((useconds_t)(due - t));
        a->offered++;
        if (allowed(agent, tenant))
            test_admissions_push(a, test_now_us());
    }
    rl_agent_close(agent);
    rl_config_free(cfg);
    test_aggregator_stop(&agg);
}

/* The oldest sub-window of the trailing period counts whole while the
 * clock is in the sub-window that follows the span: part of it is already
 * outside, but where in it its requests came is not known. Synced every
 * 20 ms, a burst 40 ms before a sub-window ends lands in that sub-window;
 * weighing it by the part still inside would let half the burst through
 * again before the burst is a period old. */
Test(synced, a_sub_window_counts_whole_until_it_has_left_the_span)
{
    admissions a = {0};
    one_agent_burst_then_steady("whole", "org_whole", 20, 40, &a);
    long worst = test_worst_span(&a, ONE_AGENT_PERIOD_MS);
    fprintf(stderr, "synced whole sub-window: one agent, sync 20 ms, the "
            "limit spent 40 ms before a sub-window ends, then 1 per ms: "
            "admitted %zu, worst span of one period %ld (limit 100)\n",
            a.n, worst);
    cr_expect_leq(worst, 105);
    cr_expect_geq(worst, 100);
    test_admissions_free(&a);
}

/* A key whose agents all reject sends no counts; its agents ask for its
 * totals (a count of 0), so its room comes back when its oldest requests
 * leave the span. Here half the limit is spent at once, the other half a
 * second later, and the first half must come back about two seconds after
 * it was spent, not when the second half leaves. */
Test(synced, a_blocked_key_gets_room_when_its_oldest_requests_leave)
{
    char rule[200];
    snprintf(rule, sizeof rule, "  - {name: blocked, match: tenant, "
             "limit: 100, period: %dms, mode: synced}\n", ONE_AGENT_PERIOD_MS);
    test_aggregator agg;
    test_aggregator_start(&agg, NULL, rule, 50, NULL);
    test_aggregator_wait_ready(&agg);
    rl_config *cfg;
    rl_agent *agent = test_synced_agent(&agg, &cfg);
    cr_assert(allowed(agent, "org_blocked_warm"));
    test_sleep_ms(300);
    long first = 0, second = 0, back = 0;
    for (int i = 0; i < 50; i++)
        first += allowed(agent, "org_blocked");
    uint64_t start = test_now_ms();
    test_sleep_ms(1000);
    for (int i = 0; i < 80; i++)
        second += allowed(agent, "org_blocked");
    /* Offered one per ms until 2.8 s after the first half; what comes
     * back after 2 s is the first half's room. */
    while (test_now_ms() < start + 2800) {
        bool ok = allowed(agent, "org_blocked");
        if (test_now_ms() >= start + 1900)
            back += ok;
        else
            cr_expect(!ok, "admitted %ld ms after the first half",
                      (long)(test_now_ms() - start));
        test_sleep_ms(1);
    }
    fprintf(stderr, "synced blocked key: 50 then %ld a second later; %ld "
            "back by 2.8 s\n", second, back);
    cr_expect_eq(first, 50);
    cr_expect_eq(second, 50);
    cr_expect_geq(back, 45);
    cr_expect_leq(back, 50);
    rl_agent_close(agent);
    rl_config_free(cfg);
    test_aggregator_stop(&agg);
}

/* A limit smaller than the agent count: each agent's share is
 * floor(room / agents) = 0 plus one for the agents whose rank for the key
 * is below the room, so the fleet lets through about the limit, neither
 * every agent one (ceil: 10 for a limit of 5) nor nobody (floor). Eight
 * keys of 5 per period, one period of ten times that offered on each, over
 * the ten agents: about 40 in all, 80 with ceil, 0 with floor. */
Test(synced, a_limit_below_the_agent_count_is_shared_not_multiplied)
{
    enum { SMALL = 5, KEYS = 8 };
    fleet f;
    fleet_start_at(&f, "small", SMALL);
    long admitted = 0;
    uint64_t start = test_now_us();
    for (long i = 0; test_now_us() < start + (PERIOD_MS - 200) * 1000ULL;
         i++) {
        char tenant[32];
        snprintf(tenant, sizeof tenant, "org_small_%ld", i % KEYS);
        admitted += allowed(f.agents[(i / KEYS) % AGENTS], tenant);
        usleep(500);
    }
    fprintf(stderr, "synced small limit: %d keys of %d per period over %d "
            "agents: admitted %ld in a period (ceil would give %d)\n", KEYS,
            SMALL, AGENTS, admitted, KEYS * AGENTS);
    cr_expect_leq(admitted, KEYS * SMALL * 3 / 2);
    cr_expect_geq(admitted, KEYS * SMALL / 2);
    test_fleet_stop(&f);
}

/* Synced every two sub-windows, room comes back at the edge inside the
 * interval where the sub-window that spent it leaves the span (21
 * sub-windows after it began), not at the next tick or totals: half the
 * limit spent in an interval's first sub-window, the other half four
 * sub-windows later, then a request every ms. Counted only at ticks, the
 * first half went to the interval's second sub-window and came back at
 * that one's edge, 22 sub-windows after the first began (LEAVING names
 * it; before it, with the totals after the tick, about 22.75). One agent
 * keeps up with TSan at 400 ms sub-windows. */
Test(synced, room_comes_back_at_a_sub_window_edge_inside_an_interval)
{
    const uint64_t g = 100 * TIME_SCALE, interval = 2 * g;
    char rule[200];
    snprintf(rule, sizeof rule, "  - {name: edge, match: tenant, limit: 100, "
             "period: %llums, mode: synced}\n",
             (unsigned long long)(RL_WIRE_SUBWINDOWS * g));
    test_aggregator agg;
    test_aggregator_start(&agg, NULL, rule, (unsigned)interval, NULL);
    test_aggregator_wait_ready(&agg);
    rl_config *cfg;
    rl_agent *agent = test_synced_agent(&agg, &cfg);
    cr_assert(allowed(agent, "org_edge_warm"));
    test_sleep_ms((unsigned)(3 * interval));
    redis_clock k = redis_clock_read();
    /* Just after a tick: an interval's first sub-window. */
    while (redis_clock_now(&k) % interval < g / 10
           || redis_clock_now(&k) % interval > g / 3)
        test_sleep_ms(1);
    uint64_t s = redis_clock_now(&k) / g * g;
    long first = 0, second = 0, early = 0;
    for (int i = 0; i < 50; i++)
        first += allowed(agent, "org_edge");
    test_sleep_ms((unsigned)(s + 4 * g + g / 10 - redis_clock_now(&k)));
    for (int i = 0; i < 50; i++)
        second += allowed(agent, "org_edge");
    uint64_t back = 0;
    while (back == 0 && redis_clock_now(&k) < s + 24 * g) {
        bool ok = allowed(agent, "org_edge");
        uint64_t at = redis_clock_now(&k) - s;
        if (ok && at < RL_WIRE_SUBWINDOWS * g + g - 5)
            early++;
        else if (ok)
            back = at;
        test_sleep_ms(1);
    }
    fprintf(stderr, "synced edge: 50 + %ld spent; room back %llu ms after "
            "the first half's sub-window began (21 sub-windows: %llu ms)\n",
            second, (unsigned long long)back,
            (unsigned long long)(21 * g));
    cr_expect_eq(first, 50);
    cr_expect_eq(second, 50);
    cr_expect_eq(early, 0, "%ld admitted before the first half's sub-window "
                 "left the span", early);
    /* Within half a sub-window of the edge: a count put in the next
     * sub-window gives its room back at that one's edge (LEAVING names
     * it), 22 sub-windows in, and with the clocks read a few ms apart a
     * bound of 22 let it through (2203 ms seen against 2200). */
    cr_expect(back >= 21 * g - 5 && back < 21 * g + g / 2,
              "room came back %llu ms "
              "after the first half's sub-window began, its edge is %llu",
              (unsigned long long)back, (unsigned long long)(21 * g));
    rl_agent_close(agent);
    rl_config_free(cfg);
    test_aggregator_stop(&agg);
}
