/*
 * A global rule (scope: global) on the agent's side (agent/synced.c,
 * agent/sync.c, docs/regions.md): its share is of its region's part of
 * the room, the TOTALS entry's share (before any, an equal part per
 * region); its refusals go to the aggregators that read them, its
 * region's demand; and while a region is cut off its decisions say
 * degraded.
 *
 * The aggregator is a fake in this process (fake_aggregator.h): the test
 * says what the totals hold, what share they give the region, and when.
 * One agent, three regions (this config's eu and two others), a limit of
 * 300 per hour: sub-windows of three minutes, which move only when the
 * fake's clock jumps.
 */
#include "fake_aggregator.h"
#include "test_agent.h"
#include "test_env.h"
#include "wire.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#define RULE "regions"
#define TENANT "org_regions"
#define LIMIT 300
#define REGIONS 3
#define PERIOD_MS 3600000ULL
#define INTERVAL_MS 250
#define FIRST_WINDOW 1000
/* A report is resent if no ack comes in two intervals: the test holds one
 * less than that. */
#define HOLD_MS 375
/* What the aggregators of issue 32 read, but GOODBYE, which the fake
 * does not answer (an agent's close would wait for it). */
#define EVERY_FEATURE                                                      \
    (RL_WIRE_FEATURE_WINDOWS | RL_WIRE_FEATURE_GIVEBACK                    \
     | RL_WIRE_FEATURE_DEMAND)

/* An agent of region eu on the fake, with the rule global or regional,
 * logging into log unless it is NULL; the fake says it reads features.
 * Its first report (presence) is acknowledged: it knows Redis's clock. */
static void open_agent(fake_agg *f, test_agent *t, bool global,
                       uint64_t features, test_log *log)
{
    /* The key its totals are of, before the agent has reported it. */
    f->value_len = strlen(TENANT);
    memcpy(f->value, TENANT, f->value_len);
    fake_start(f, RULE, PERIOD_MS, 1, FIRST_WINDOW);
    f->global = global;
    f->share = RL_WIRE_SHARE_WHOLE;
    char yaml[2048];
    snprintf(yaml, sizeof yaml,
             "store: {url: \"redis://%s\", timeout_ms: 2000}\n"
             "aggregator:\n"
             "  sync_interval_ms: %d\n"
             "  stale_after_ms: 600000\n"
             "  reports: \"%s\"\n"
             "  totals: \"%s\"\n"
             "region: eu\n"
             "regions:\n"
             "  eu: {peers: \"tcp://127.0.0.1:1\"}\n"
             "  us: {peers: \"tcp://127.0.0.1:2\"}\n"
             "  ap: {peers: \"tcp://127.0.0.1:3\"}\n"
             "rules:\n"
             "  - {name: " RULE ", match: tenant, limit: %d, "
             "period: %llums, mode: synced, scope: %s}\n",
             test_env("RL_TEST_REDIS"), INTERVAL_MS, f->reports, f->totals,
             LIMIT, (unsigned long long)PERIOD_MS,
             global ? "global" : "region");
    memset(t, 0, sizeof *t);
    t->agent = test_agent_on(test_write_config("synced-regions", yaml),
                             &t->config, log);
    fake_wait_subscribed(f);
    fake_publish_features_of(f, features);
    fake_held r = fake_receive(f);
    fake_ack(f, &r);
}

static rl_decision check(test_agent *t)
{
    return test_check(t, "tenant=" TENANT, NULL);
}

/* What the agent admits now, before its first rejection. */
static long admitted(test_agent *t)
{
    long n = 0;
    while (check(t).allowed)
        cr_assert_leq(++n, LIMIT, "the key was never rejected");
    return n;
}

/* What the agent admits once the TOTALS just published have reached it:
 * the key rejects until then, so its first admission says they have. */
static long admitted_after_totals(test_agent *t)
{
    for (int waited = 0; waited < HOLD_MS; waited++) {
        if (check(t).allowed)
            return 1 + admitted(t);
        test_sleep_ms(1);
    }
    return 0;
}

/* What the fake heard of the key over some reports. */
typedef struct heard {
    uint64_t count, refused;
    size_t demand_entries;
} heard;

/* Acknowledges the agent's next reports until they hold count admitted
 * and refused refusals (at most five reports), then one more, which
 * must bring no refusal: a refusal is reported once. */
static heard hear(fake_agg *f, uint64_t count, uint64_t refused)
{
    heard h = {0};
    for (int i = 0; i < 5 && (h.count < count || h.refused < refused); i++) {
        fake_held r = fake_receive(f);
        h.count += r.count;
        h.refused += r.refused;
        h.demand_entries += r.demand_entries;
        fake_ack(f, &r);
    }
    fake_held r = fake_receive(f);
    h.refused += r.refused;
    fake_ack(f, &r);
    return h;
}

Test(synced_regions, a_global_keys_first_share_is_its_regions_equal_part)
{
    fake_agg f = {0};
    test_agent t;
    open_agent(&f, &t, true, EVERY_FEATURE, NULL);
    long cold = admitted(&t);
    fprintf(stderr, "synced regions: %ld admitted cold of %d over %d "
            "regions\n", cold, LIMIT, REGIONS);
    cr_expect_eq(cold, LIMIT / REGIONS,
                 "the first share is not the region's equal part");
    hear(&f, (uint64_t)cold, 0);
    test_agent_close(&t);
    fake_stop(&f);
}

/* What came of offering n checks to a fresh agent of a global or
 * regional rule, on a fake that reads features: how many the agent
 * refused, and what the fake heard once it had heard the admitted
 * (and, if it reads them, the refusals). */
typedef struct offered {
    uint64_t refused;
    heard heard;
} offered;

static offered offer(bool global, uint64_t features, int n, uint64_t admitted)
{
    fake_agg f = {0};
    test_agent t;
    open_agent(&f, &t, global, features, NULL);
    offered o = {0};
    for (int i = 0; i < n; i++)
        o.refused += !check(&t).allowed;
    o.heard = hear(&f, admitted,
                   features & RL_WIRE_FEATURE_DEMAND ? o.refused : 0);
    test_agent_close(&t);
    fake_stop(&f);
    return o;
}

/* Offered half as much again as its first share, the agent refuses the
 * rest; an aggregator that reads refusals hears every one of them, in
 * entries of five fields, once. */
Test(synced_regions, a_global_keys_refusals_reach_the_aggregator)
{
    offered o = offer(true, EVERY_FEATURE, LIMIT / REGIONS * 3 / 2,
                      LIMIT / REGIONS);
    fprintf(stderr, "synced regions: %llu refused, %llu heard in %zu "
            "entries of five fields\n", (unsigned long long)o.refused,
            (unsigned long long)o.heard.refused, o.heard.demand_entries);
    cr_assert_eq(o.refused, LIMIT / REGIONS / 2);
    cr_expect_eq(o.heard.count, LIMIT / REGIONS);
    cr_expect_eq(o.heard.refused, o.refused,
                 "the refusals heard are not those made");
    cr_expect_gt(o.heard.demand_entries, 0, "no entry of five fields");
}

/* An aggregator that does not say it reads refusals would refuse an entry
 * of five fields: it gets what an older agent sends. */
Test(synced_regions, no_refusals_go_to_an_aggregator_that_does_not_read_them)
{
    offered o = offer(true, EVERY_FEATURE & ~RL_WIRE_FEATURE_DEMAND,
                      LIMIT / REGIONS * 3 / 2, LIMIT / REGIONS);
    cr_assert_eq(o.refused, LIMIT / REGIONS / 2);
    cr_expect_eq(o.heard.count, LIMIT / REGIONS);
    cr_expect_eq(o.heard.demand_entries, 0, "entries of five fields");
    cr_expect_eq(o.heard.refused, 0);
}

/* A regional rule's region has the whole limit, and its refusals are
 * nobody's demand. */
Test(synced_regions, a_regional_rule_has_the_whole_limit_and_no_demand)
{
    offered o = offer(false, EVERY_FEATURE, LIMIT + 50, LIMIT);
    cr_expect_eq(o.refused, 50, "the regional rule's share is not the limit");
    cr_expect_eq(o.heard.count, LIMIT);
    cr_expect_eq(o.heard.demand_entries, 0, "a regional rule's entries of "
                 "five fields");
    cr_expect_eq(o.heard.refused, 0);
}

/* The key spent its first share (100); the totals then say 200 are
 * counted over all regions (room 100), and give this region 30 %, then
 * 70 % of it: the agent (the region's only one) admits 30, then 70. */
Test(synced_regions, a_global_keys_share_is_its_regions_part_of_the_room)
{
    fake_agg f = {0};
    test_agent t;
    open_agent(&f, &t, true, EVERY_FEATURE, NULL);
    long cold = admitted(&t);
    fake_held r = fake_receive(&f);
    cr_assert_eq(r.count, (uint64_t)cold);
    fake_ack(&f, &r);
    long parts[2];
    const uint64_t shares[2] = {300000, 700000};
    for (int i = 0; i < 2; i++) {
        /* Its count of 0 asks for totals; held while they come. */
        fake_held asking = fake_receive(&f);
        cr_assert_eq(asking.count, 0);
        fake_enter(&f, FIRST_WINDOW + 1 + (uint64_t)i, LIMIT - 100, 0);
        f.share = shares[i];
        fake_publish(&f);
        parts[i] = admitted_after_totals(&t);
        fake_ack(&f, &asking);
        r = fake_receive(&f);
        cr_assert_eq(r.count, (uint64_t)parts[i]);
        fake_ack(&f, &r);
    }
    fprintf(stderr, "synced regions: of a room of 100, %ld admitted at a "
            "share of 30 %%, %ld at 70 %%\n", parts[0], parts[1]);
    cr_expect_eq(parts[0], 30, "a share of 30 %% of a room of 100");
    cr_expect_eq(parts[1], 70, "a share of 70 %% of a room of 100");
    test_agent_close(&t);
    fake_stop(&f);
}

/* Checks until one's degraded is want (the TOTALS that say so reached
 * the agent), at most HOLD_MS; how many came out degraded meanwhile. */
static uint64_t check_until_degraded(test_agent *t, bool want)
{
    uint64_t degraded = 0;
    for (int waited = 0; waited < HOLD_MS; waited++) {
        rl_decision d = check(t);
        cr_assert(d.allowed, "the share ran out");
        cr_assert_not(d.fallback, "a cut region's share decided as fallback");
        degraded += d.degraded;
        if (d.degraded == want)
            return degraded;
        test_sleep_ms(1);
    }
    cr_assert_fail("no decision %s degraded", want ? "came" : "stopped being");
    return degraded;
}

static uint64_t degraded_counted(test_agent *t)
{
    rl_agent_counters c;
    rl_rule_counters rules[1];
    cr_assert_eq(rl_agent_stats(t->agent, &c, rules, 1), RL_OK);
    cr_assert_eq(c.degraded, rules[0].degraded);
    return c.degraded;
}

/* While the totals say a region is cut off, the share still decides and
 * the decisions say degraded; once they say it is heard again, they do
 * not. One line says each. */
Test(synced_regions, a_cut_region_marks_decisions_degraded_until_heard)
{
    static test_log log;
    test_log_init(&log);
    fake_agg f = {0};
    test_agent t;
    open_agent(&f, &t, true, EVERY_FEATURE, &log);
    cr_assert_not(check(&t).degraded, "degraded before any cut");
    f.cut = true;
    fake_publish(&f);
    uint64_t degraded = check_until_degraded(&t, true);
    for (int i = 0; i < 5; i++)
        degraded += check(&t).degraded;
    cr_expect_eq(degraded, 6, "a cut key's decisions not all degraded");
    cr_expect(test_log_wait(&log, "event=region_cut", "rule=" RULE, 1000),
              "no region_cut line");
    f.cut = false;
    fake_publish(&f);
    degraded += check_until_degraded(&t, false);
    for (int i = 0; i < 5; i++)
        cr_expect(!check(&t).degraded, "degraded once heard again");
    cr_expect(test_log_wait(&log, "event=region_healed", "rule=" RULE, 1000),
              "no region_healed line");
    cr_expect_eq(degraded_counted(&t), degraded,
                 "the degraded decisions are not counted as degraded");
    test_log_lacks(&log, "event=synced_degraded", "the agent's log");
    /* Its counts' report, answered: the close need not wait for it. */
    fake_held r = fake_receive(&f);
    fake_ack(&f, &r);
    test_agent_close(&t);
    fake_stop(&f);
}
