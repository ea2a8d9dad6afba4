/*
 * Regions (docs/regions.md): a synced rule of scope: global is one limit
 * over every region. Each region here is its own redis-server and
 * rl-aggregator; the aggregators' exchanges go through a proxy per pair
 * and direction, which a test can make drop answers.
 */
#include "duration.h"
#include "partition.h"
#include "rl.h"
#include "test_agent.h"
#include "test_certs.h"
#include "test_env.h"
#include "test_process.h"
#include "test_gateway.h"
#include "test_regions.h"

#include <criterion/criterion.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GLOBAL_RULE \
    "  - {name: g, match: api_key, limit: 1000, period: 10s, mode: synced, " \
    "scope: global, key_prefix: \"g:\"}\n"

static test_regions regions;

static void stop_regions(void)
{
    test_regions_stop(&regions);
}

TestSuite(regions, .fini = stop_regions);

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

/* n regions (a global rule, synced every 100 ms) and an agent in each. */
static void open_agents(size_t n, rl_agent *agent[], rl_config *cfg[])
{
    test_regions_start(&regions, n, GLOBAL_RULE, 100, "", NULL);
    for (size_t i = 0; i < n; i++)
        agent[i] = test_region_agent(&regions, i, &cfg[i]);
}

static void close_agents(size_t n, rl_agent *agent[], rl_config *cfg[])
{
    for (size_t i = 0; i < n; i++) {
        rl_agent_close(agent[i]);
        rl_config_free(cfg[i]);
    }
}

/* What each region's agents admitted of a global key reaches every
 * region's Redis, once: each region's count is the fleet's. */
Test(regions, each_regions_counts_reach_every_region_once)
{
    rl_config *cfg[3];
    rl_agent *agent[3];
    open_agents(3, agent, cfg);
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
    cr_assert_eq(test_rlctl(out, sizeof out, regions.r[2].agg.config,
                            "watch --count 1"), 0, "%s", out);
    cr_assert(strstr(out, "eu=40 us=25 ap=5") != NULL, "%s", out);
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
    close_agents(3, agent, cfg);
}

/* An exchange applied whose answer is lost is sent again, the same
 * number, and counted once: the sender gives up on a silent connection
 * after two intervals and dials again. */
Test(regions, a_resent_exchange_is_counted_once)
{
    test_regions_start(&regions, 2, GLOBAL_RULE, 100, "", NULL);
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

/* Returns once the exchange of every second has just gone out on p. */
static void after_an_exchange(test_proxy *p)
{
    uint64_t sent = test_proxy_from_clients(p), start = test_now_ms();
    while (test_proxy_from_clients(p) == sent) {
        cr_assert_lt(test_now_ms() - start, 3000, "no exchange in 3 s");
        test_sleep_ms(2);
    }
}

/* An aggregator that stops sends what its region counted to the others
 * first: an agent's last report, applied just before the stop, is not
 * lost to them. The stop comes once region eu's Redis holds the report,
 * which the agent sends at the start of an interval, before the exchange
 * of every second (at five eighths of it) has carried it: only then does
 * the stop's sending show. The agent's checks start just after an
 * exchange; one that carried the key all the same (seen under load, with
 * the stop's sending left out) leaves the stop nothing to send, and
 * another key is tried. The agent closes after the stop: its close waits
 * for the next totals, which come with the next exchange. */
Test(regions, a_stopping_aggregator_sends_its_last_counts)
{
    test_regions_start(&regions, 2, GLOBAL_RULE, 1000, "", NULL);
    test_proxy *eu_to_us = regions.r[0].to[1];
    rl_config *cfg;
    rl_agent *agent = test_region_agent(&regions, 0, &cfg);
    char key[32];
    bool stopped = false;
    for (int tries = 0; tries < 5 && !stopped; tries++) {
        snprintf(key, sizeof key, "last-%d", tries);
        test_proxy_watch_for(eu_to_us, key, strlen(key));
        after_an_exchange(eu_to_us);
        cr_assert_eq(admit(agent, key, 10), 10);
        expect_region_total(0, key, 10, 3000);
        stopped = !test_proxy_seen(eu_to_us);
        if (stopped)
            test_aggregator_stop(&regions.r[0].agg);
        else
            fprintf(stderr, "regions stopping: %s left before the stop\n",
                    key);
    }
    rl_agent_close(agent);
    rl_config_free(cfg);
    cr_assert(stopped, "an exchange of every second carried each of 5 keys "
              "before the stop could");
    expect_region_total(1, key, 10, 1000);
}

/* What a region admitted stays off its own room, at the other's part,
 * until the other's totals carry it: not only while it waits in the
 * outbox, but once sent and unanswered too. Here eu's exchange carrying
 * its last counts never reaches us, and us is cut off before eu dials
 * again: with the demand even, eu's agent gets half of the room less
 * all of what us has not heard (1000 - 600 - 200 = 200, half of it
 * 100), not half of the room as eu's Redis has it (200). Once the link
 * heals and us has applied it all, what us has heard is no longer taken
 * off: eu, offered 400 over a second while us is idle, gets nearly all
 * that is left of the limit (its part grows with its demand; about
 * 1000 - 700), not that less all it ever sent. */
Test(regions, counts_sent_and_unanswered_stay_off_the_room)
{
    rl_config *cfg[2];
    rl_agent *agent[2];
    open_agents(2, agent, cfg);
    for (size_t i = 0; i < 2; i++)
        cr_assert_eq(admit(agent[i], "unsent", 100), 100);
    for (size_t i = 0; i < 2; i++)
        expect_region_total(i, "unsent", 200, 3000);
    test_proxy_silence_from(regions.r[0].to[1], "unsent", 6, true);
    for (size_t i = 0; i < 2; i++)
        cr_assert_eq(admit(agent[i], "unsent", 200), 200);
    expect_region_total(0, "unsent", 600, 3000);
    uint64_t start = test_now_ms();
    while (!test_proxy_silenced(regions.r[0].to[1])) {
        cr_assert_lt(test_now_ms() - start, 3000, "eu's exchange with "
                     "its 200 never went out");
        test_sleep_ms(5);
    }
    test_region_cut(&regions, 1);
    /* Totals published after the exchange went out. */
    test_sleep_ms(300);
    long more = admit(agent[0], "unsent", 300);
    fprintf(stderr, "regions unanswered: eu admitted %ld more, its part "
            "of the room less what us has not heard 100\n", more);
    cr_assert_geq(more, 70, "eu admitted %ld more of a room of 100", more);
    cr_assert_leq(more, 130, "eu admitted %ld more: what us has not "
                  "heard was not taken off (100 with it, 200 without)",
                  more);
    test_region_heal(&regions, 1);
    expect_region_total(1, "unsent", 700 + (more - 100), 5000);
    /* Totals published after the last exchange was answered: those of
     * a key its agents report again (an idle key's stand). */
    test_sleep_ms(300);
    long after = 0;
    for (int i = 0; i < 40; i++, test_sleep_ms(25))
        after += admit(agent[0], "unsent", 10);
    long left = 1000 - 700 - (more - 100);
    fprintf(stderr, "regions unanswered: after the heal eu admitted %ld "
            "of the %ld left\n", after, left);
    cr_assert_geq(after, left * 8 / 10, "eu admitted %ld of the %ld left "
                  "after the heal: what us has since heard is still taken "
                  "off", after, left);
    cr_assert_leq(after, left + 5, "eu admitted %ld of the %ld left after "
                  "the heal", after, left);
    close_agents(2, agent, cfg);
}

/* Regions of two aggregators each: agents report each key to its owner
 * (rendezvous over the indexes, partition.c), and each aggregator
 * exchanges the keys it owns with every aggregator of the other region. */
#define MULTI_RULES \
    GLOBAL_RULE \
    "  - {name: tight, match: tenant, limit: 40, period: 2s, " \
    "mode: synced, scope: global, key_prefix: \"t:\"}\n"
#define MULTI_KEYS 4
#define MULTI_PERIOD 2000

/* The index of two aggregators that owns rule's key value. */
static size_t owner_of(const char *rule, const char *value)
{
    bool up[2] = {true, true};
    return rl_partition_owner(rl_partition_key(rule, value, strlen(value)),
                              up, 2);
}

/* n values of rule's keys, stem0, stem1, ..., with owner index k's
 * (every owner's when k is 2) in turn. */
static void values_owned(const char *rule, const char *stem, size_t k,
                         char values[][16], size_t n)
{
    size_t got = 0;
    for (unsigned i = 0; got < n && i < 1000; i++) {
        char value[16];
        snprintf(value, sizeof value, "%s%u", stem, i);
        size_t want = k < 2 ? k : got % 2;
        if (owner_of(rule, value) == want)
            memcpy(values[got++], value, sizeof value);
    }
    cr_assert_eq(got, n);
}

/* When each request of a key admitted, ms from the start, per region;
 * the least and most room each region's agent said it had after from_ms,
 * and its decisions marked degraded since. */
typedef struct admitted_at {
    uint64_t at[2][512];
    size_t n[2];
    uint64_t from_ms;
    uint64_t least[2], most[2];
    long degraded;       /* decisions marked degraded after from_ms */
    /* Not 0: the decisions after from_ms, and those whose remaining is
     * outside [band_lo, band_hi]. */
    uint64_t band_lo, band_hi;
    long decided[2], outside[2];
} admitted_at;

/* Every 10 ms for ms, one request of (name, value) on each region's
 * agent. */
static void offer_both(rl_agent *agent[2], const char *name,
                       const char *value, admitted_at *a, uint64_t start,
                       uint64_t ms)
{
    rl_attr attr = {name, value, strlen(value)};
    a->least[0] = a->least[1] = UINT64_MAX;
    for (uint64_t end = test_now_ms() + ms; test_now_ms() < end;) {
        for (size_t r = 0; r < 2; r++) {
            rl_decision d;
            cr_assert_eq(rl_check(agent[r], &attr, 1, 1, &d), RL_OK);
            uint64_t at = test_now_ms() - start;
            if (at >= a->from_ms && d.remaining < a->least[r])
                a->least[r] = d.remaining;
            if (at >= a->from_ms && d.remaining > a->most[r])
                a->most[r] = d.remaining;
            a->degraded += at >= a->from_ms && d.degraded;
            if (a->band_hi > 0 && at >= a->from_ms) {
                a->decided[r]++;
                a->outside[r] += d.remaining < a->band_lo
                                 || d.remaining > a->band_hi;
            }
            if (d.allowed) {
                cr_assert_lt(a->n[r], 512);
                a->at[r][a->n[r]++] = at;
            }
        }
        test_sleep_ms(10);
    }
}

/* The most both regions admitted in a span of one period that starts at
 * or after from. */
static long most_of_both(const admitted_at *a, uint64_t from)
{
    long most = 0;
    for (size_t r = 0; r < 2; r++) {
        for (size_t i = 0; i < a->n[r]; i++) {
            if (a->at[r][i] < from)
                continue;
            long in = 0;
            for (size_t q = 0; q < 2; q++)
                for (size_t k = 0; k < a->n[q]; k++)
                    in += a->at[q][k] >= a->at[r][i]
                          && a->at[q][k] < a->at[r][i] + MULTI_PERIOD;
            most = in > most ? in : most;
        }
    }
    return most;
}

static long of_region_in(const admitted_at *a, size_t r, uint64_t from)
{
    long n = 0;
    for (size_t i = 0; i < a->n[r]; i++)
        n += a->at[r][i] >= from && a->at[r][i] < from + MULTI_PERIOD;
    return n;
}

/* Two regions of two aggregators: each key's count reaches both Redis
 * once (whichever aggregator owns it, whichever of the other region's
 * takes its exchange), and stays so; a key offered in both regions at
 * five times its limit admits no more than the limit in any period (its
 * shares' rounding: one per agent), about half in each. */
Test(regions, two_aggregators_per_region_exchange_the_keys_they_own)
{
    test_regions_start_opts(&regions, 2, MULTI_RULES, 100,
                            &(test_regions_opts){.aggregators = 2});
    rl_config *cfg[2];
    rl_agent *agent[2];
    for (size_t i = 0; i < 2; i++)
        agent[i] = test_region_agent(&regions, i, &cfg[i]);
    char keys[MULTI_KEYS][16], even[1][16], both[1][16];
    values_owned("g", "m", 2, keys, MULTI_KEYS);
    /* The keys whose shares are watched: the second aggregator's. */
    values_owned("g", "even", 1, even, 1);
    values_owned("tight", "both", 1, both, 1);
    for (int k = 0; k < MULTI_KEYS; k++) {
        cr_assert_eq(admit(agent[0], keys[k], 10 + k), 10 + k);
        cr_assert_eq(admit(agent[1], keys[k], 20 + k), 20 + k);
    }
    for (size_t i = 0; i < 2; i++)
        for (int k = 0; k < MULTI_KEYS; k++)
            expect_region_total(i, keys[k], 30 + 2 * k, 3000);
    test_sleep_ms(500);
    for (size_t i = 0; i < 2; i++)
        for (int k = 0; k < MULTI_KEYS; k++)
            expect_region_total(i, keys[k], 30 + 2 * k, 0);
    /* A key both regions ask for evenly, far below its limit: each
     * region's agent works from about half the room, whichever of its
     * region's aggregators published the key's totals last. About: the
     * key is a second old, so a sub-window heard from one region and not
     * yet from the other moves the split for a moment (601 of 1000 seen
     * under TSan, and once 780, never under 357): none is under a
     * quarter of the room, nine in ten at least are within a quarter of
     * half. A room of 0 (a non-owner's totals) or the whole room is far
     * out. */
    static admitted_at a;
    memset(&a, 0, sizeof a);
    a.from_ms = 500;
    a.band_lo = 1000 / 4;
    a.band_hi = 1000 * 3 / 4;
    offer_both(agent, "api_key", even[0], &a, test_now_ms(), 1500);
    fprintf(stderr, "regions of two aggregators: room eu %llu to %llu (%ld "
            "of %ld outside 250 to 750), us %llu to %llu (%ld of %ld)\n",
            (unsigned long long)a.least[0], (unsigned long long)a.most[0],
            a.outside[0], a.decided[0], (unsigned long long)a.least[1],
            (unsigned long long)a.most[1], a.outside[1], a.decided[1]);
    /* Each aggregator hears the other region: none says it is cut (an
     * aggregator that does not hears it cut within 3.3 s, and its key's
     * decisions all say degraded from then on). A few may say so when
     * the agent's totals come a stale_after_ms late (300 ms here: 9 of
     * about 300 were seen once under TSan, on a loaded machine). */
    cr_assert_leq(a.degraded, 30, "%ld decisions said degraded",
                  a.degraded);
    for (size_t r = 0; r < 2; r++) {
        cr_assert_geq(a.decided[r], 20, "region %s decided %ld times",
                      regions.r[r].name, a.decided[r]);
        cr_assert_geq(a.least[r], 1000 / 4, "region %s's agent, with about "
                      "half of the room of 1000, said %llu", regions.r[r].name,
                      (unsigned long long)a.least[r]);
        cr_assert_leq(a.outside[r], a.decided[r] / 10, "region %s's agent, "
                      "with about half of the room of 1000, said %llu to "
                      "%llu: %ld of %ld outside 250 to 750",
                      regions.r[r].name, (unsigned long long)a.least[r],
                      (unsigned long long)a.most[r], a.outside[r],
                      a.decided[r]);
    }
    /* A key at five times its limit in both: within the limit in any
     * period after the first (a cold key's is its own promise). */
    memset(&a, 0, sizeof a);
    offer_both(agent, "tenant", both[0], &a, test_now_ms(), 2 * MULTI_PERIOD);
    long most = most_of_both(&a, MULTI_PERIOD);
    long eu = of_region_in(&a, 0, MULTI_PERIOD);
    long us = of_region_in(&a, 1, MULTI_PERIOD);
    fprintf(stderr, "regions of two aggregators: most in a period %ld of "
            "40; second period eu %ld us %ld\n", most, eu, us);
    cr_assert_leq(most, 40 + 2, "a span of one period admitted %ld of 40",
                  most);
    cr_assert_geq(eu + us, 40 * 8 / 10, "the second period admitted %ld "
                  "of 40", eu + us);
    cr_assert(eu >= 40 / 4 && us >= 40 / 4, "even demand, and eu admitted "
              "%ld, us %ld", eu, us);
    for (size_t i = 0; i < 2; i++) {
        rl_agent_close(agent[i]);
        rl_config_free(cfg[i]);
    }
}

/* Certificates for two regions' aggregators: eu's signed by ca, us's by
 * us_ca (ca, or another CA); both trust ca. */
static const char *region_certs(const char *us_ca)
{
    static char dir[600];
    test_certs_dir(dir, sizeof dir, "regions-tls");
    test_certs_ca(dir, "ca");
    if (strcmp(us_ca, "ca") != 0)
        test_certs_ca(dir, us_ca);
    test_certs_cert(dir, "ca", "eu");
    test_certs_cert(dir, us_ca, "us");
    return dir;
}

/* Two regions with tls+tcp:// peers, us's certificate signed by us_ca,
 * and an agent in each (into agent and cfg) that admits eu and us
 * requests of key. */
static void tls_regions_admit(const char *us_ca, rl_agent *agent[2],
                              rl_config *cfg[2], const char *key, int eu,
                              int us)
{
    test_regions_start_opts(&regions, 2, GLOBAL_RULE, 100,
                            &(test_regions_opts){
                                .tls_dir = region_certs(us_ca)});
    for (size_t i = 0; i < 2; i++)
        agent[i] = test_region_agent(&regions, i, &cfg[i]);
    cr_assert_eq(admit(agent[0], key, eu), eu);
    cr_assert_eq(admit(agent[1], key, us), us);
}

/* tls+tcp:// peers (mutual TLS, certificates of one CA), through the
 * proxies: each region's counts reach the other's Redis, once. */
Test(regions, exchanges_go_over_tls)
{
    rl_agent *agent[2];
    rl_config *cfg[2];
    tls_regions_admit("ca", agent, cfg, "over-tls", 30, 20);
    for (size_t i = 0; i < 2; i++)
        expect_region_total(i, "over-tls", 50, 3000);
    test_sleep_ms(500);
    for (size_t i = 0; i < 2; i++)
        expect_region_total(i, "over-tls", 50, 0);
    close_agents(2, agent, cfg);
}

/* us's aggregator has a certificate another CA signed: eu refuses it as
 * a server (eu's exchanges to us) and as a client (us's to eu). Neither
 * region's counts reach the other, and each says why. */
Test(regions, a_peer_another_ca_signed_is_refused)
{
    rl_agent *agent[2];
    rl_config *cfg[2];
    tls_regions_admit("other", agent, cfg, "refused", 30, 20);
    expect_region_total(0, "refused", 30, 3000);
    expect_region_total(1, "refused", 20, 3000);
    for (size_t i = 0; i < 2; i++)
        test_wait_for_log(&regions.r[i].agg.pid, regions.r[i].agg.log,
                          "event=exchange_peer_unreachable.*aggregator.tls",
                          5000);
    expect_region_total(0, "refused", 30, 0);
    expect_region_total(1, "refused", 20, 0);
    close_agents(2, agent, cfg);
}

/* The load tests' shape, PERIOD/INTERVAL as a rule writes durations: 300
 * per 4 s synced every 200 ms by default, to keep the suite fast, across
 * three regions whose links are 40, 80 and 150 ms one way.
 * RL_TEST_REGIONS_SHAPE=10s/1s runs the same tests at the shape
 * (make bench does: docs/performance.md), and 4s/400ms at its ratios (a
 * period of ten intervals, an interval of two sub-windows) at 2.5 times
 * its speed. There the last period after the demand moves admits 288 to
 * 296 (0.96 to 0.99 of the limit; 242 to 250 before LEAVING, 262 to 282
 * before an equal recent took its LEAVING, below the floor tested here in
 * some runs): admissions come in waves, and a period
 * holds no more than the limit less what the sub-window before it holds
 * (the estimate counts that one whole), a tenth of the limit at twice the
 * limit offered when a wave is in it (docs/regions.md).
 * At the default shape the six periods' edges fall between waves. Under
 * ThreadSanitizer
 * every time is twice as long (an agent's I/O thread must keep up with an
 * interval, test_synced_bounds.c; six agents and three aggregators do at
 * 400 ms on two cores beside two other builds' tests, load 4 to 5: most
 * in any span 300, steady periods 282 to 300, the cut region 28 a period
 * for a part of 30). */
#ifdef __SANITIZE_THREAD__
#define REGIONS_TIME_SCALE 2
#else
#define REGIONS_TIME_SCALE 1
#endif
#define LOAD_SHAPE_DEFAULT "4s/200ms"
/* The cut test's seven periods (and its start's three intervals, half a
 * period at most) within its timeout of 300 s, once scaled: the TSan
 * runner's is 300 s too. */
#define LOAD_PERIOD_MAX_MS 20000
#define LOAD_INTERVAL_MIN_MS 10 /* the config's least sync_interval_ms */
#define LOAD_LIMIT 300
#define LOAD_AGENTS 2 /* per region */
#define LOAD_RULES \
    "  - {name: g, match: api_key, limit: 300, period: %ums, mode: synced, " \
    "scope: global, key_prefix: \"g:\"}\n" \
    "  - {name: acct, match: ip, limit: 1000000, period: 1h, mode: synced, " \
    "scope: global, key_prefix: \"acct:\"}\n"

/* The shape's period and interval, ms, scaled (load_shape). */
static unsigned load_period_ms, load_interval_ms;

/* Reads RL_TEST_REGIONS_SHAPE (or the default) into load_period_ms and
 * load_interval_ms, or fails the test saying what it wants. */
static void load_shape(void)
{
    const char *shape = getenv("RL_TEST_REGIONS_SHAPE");
    if (shape == NULL || *shape == '\0')
        shape = LOAD_SHAPE_DEFAULT;
    char period[32];
    const char *slash = strchr(shape, '/');
    uint64_t p = 0, i = 0;
    bool ok = slash != NULL && (size_t)(slash - shape) < sizeof period;
    if (ok) {
        memcpy(period, shape, (size_t)(slash - shape));
        period[slash - shape] = '\0';
        ok = rl_duration_parse(period, &p) == RL_OK
             && rl_duration_parse(slash + 1, &i) == RL_OK
             && i >= LOAD_INTERVAL_MIN_MS && p >= 2 * i
             && p * REGIONS_TIME_SCALE <= LOAD_PERIOD_MAX_MS;
    }
    cr_assert(ok, "RL_TEST_REGIONS_SHAPE=%s: want PERIOD/INTERVAL as a "
              "rule's durations (10s/1s), the interval at least %dms, the "
              "period at least two intervals and at most %ds (the cut "
              "test's seven periods within its timeout)", shape,
              LOAD_INTERVAL_MIN_MS,
              LOAD_PERIOD_MAX_MS / REGIONS_TIME_SCALE / 1000);
    load_period_ms = (unsigned)p * REGIONS_TIME_SCALE;
    load_interval_ms = (unsigned)i * REGIONS_TIME_SCALE;
}

static const test_region_delays load_delays = {
    {0, 40, 150},
    {40, 0, 80},
    {150, 80, 0},
};

/* What each region's agents let through, ms after the start. */
typedef struct load {
    rl_agent *agents[3][LOAD_AGENTS];
    rl_config *configs[3][LOAD_AGENTS];
    uint64_t start_ms;
    uint64_t *at[3];
    size_t n[3], cap;
    long degraded[3];     /* decisions marked degraded */
    long acct[3];         /* the accounting key's admissions */
    double owed[3];
    unsigned turn[3];
} load;

static void load_open(load *l)
{
    memset(l, 0, sizeof *l);
    l->cap = 64 * LOAD_LIMIT;
    for (size_t r = 0; r < 3; r++) {
        l->at[r] = calloc(l->cap, sizeof *l->at[r]);
        cr_assert_not_null(l->at[r]);
        for (size_t a = 0; a < LOAD_AGENTS; a++)
            l->agents[r][a] = test_region_agent(&regions, r,
                                                &l->configs[r][a]);
    }
}

static void load_close(load *l)
{
    for (size_t r = 0; r < 3; r++) {
        for (size_t a = 0; a < LOAD_AGENTS; a++) {
            rl_agent_close(l->agents[r][a]);
            rl_config_free(l->configs[r][a]);
        }
        free(l->at[r]);
    }
}

/* One request of region r, on its agents in turn: the key "t", and the
 * accounting key (never refused) beside it. */
static void offer_one(load *l, size_t r)
{
    rl_agent *agent = l->agents[r][l->turn[r]++ % LOAD_AGENTS];
    rl_attr a = {"api_key", "t", 1};
    rl_decision d;
    cr_assert_eq(rl_check(agent, &a, 1, 1, &d), RL_OK);
    l->degraded[r] += d.degraded;
    if (d.allowed) {
        cr_assert_lt(l->n[r], l->cap);
        l->at[r][l->n[r]++] = test_now_ms() - l->start_ms;
    }
    rl_attr ip = {"ip", "acct", 4};
    cr_assert_eq(rl_check(agent, &ip, 1, 1, &d), RL_OK);
    cr_assert(d.allowed, "the accounting key was refused");
    l->acct[r]++;
}

/* Offers twice the limit for ms, split among the regions by share[]
 * (percent), each region's requests spread evenly over its agents. */
static void offer(load *l, const unsigned share[3], uint64_t ms)
{
    double per_ms = 2.0 * LOAD_LIMIT / load_period_ms;
    uint64_t end = test_now_ms() + ms, last = test_now_ms();
    while (test_now_ms() < end) {
        uint64_t now = test_now_ms();
        for (size_t r = 0; r < 3; r++) {
            l->owed[r] += (double)(now - last) * per_ms * share[r] / 100.0;
            for (; l->owed[r] >= 1; l->owed[r] -= 1)
                offer_one(l, r);
        }
        last = now;
        test_sleep_ms(1);
    }
}

static int by_time(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* The most the regions admitted together in any span of one period that
 * starts at or after from_ms. */
static long most_in_a_period(const load *l, uint64_t from_ms)
{
    size_t n = l->n[0] + l->n[1] + l->n[2], k = 0;
    uint64_t *all = calloc(n + 1, sizeof *all);
    cr_assert_not_null(all);
    for (size_t r = 0; r < 3; r++)
        for (size_t i = 0; i < l->n[r]; i++)
            all[k++] = l->at[r][i];
    qsort(all, n, sizeof *all, by_time);
    long most = 0;
    for (size_t i = 0, j = 0; i < n; i++) {
        if (all[i] < from_ms)
            continue;
        while (j < n && all[j] < all[i] + load_period_ms)
            j++;
        if ((long)(j - i) > most)
            most = (long)(j - i);
    }
    free(all);
    return most;
}

/* What region r admitted in [from, to) ms. */
static long admitted_in(const load *l, size_t r, uint64_t from, uint64_t to)
{
    long n = 0;
    for (size_t i = 0; i < l->n[r]; i++)
        n += l->at[r][i] >= from && l->at[r][i] < to;
    return n;
}

static long all_in(const load *l, uint64_t from, uint64_t to)
{
    return admitted_in(l, 0, from, to) + admitted_in(l, 1, from, to)
           + admitted_in(l, 2, from, to);
}

static void start_load(load *l)
{
    load_shape();
    char rules[512];
    snprintf(rules, sizeof rules, LOAD_RULES, load_period_ms);
    test_regions_start(&regions, 3, rules, load_interval_ms, "",
                       &load_delays);
    load_open(l);
    /* Each agent heard its aggregator (its first totals) before the
     * load: a fleet's cold start is its own promise (design.md). */
    test_sleep_ms(3 * load_interval_ms);
    l->start_ms = test_now_ms();
}

/* Twice the limit, 70/20/10 across the regions, then 10/20/70: no span of
 * one period over 1.05 of the limit, at least 0.9 of it in every period
 * of steady overload, and each region's part following its demand. */
Test(regions, three_regions_at_twice_the_limit_follow_their_demand,
     .timeout = 240)
{
    static load l;
    start_load(&l);
    static const unsigned first[3] = {70, 20, 10}, then[3] = {10, 20, 70};
    offer(&l, first, 3 * load_period_ms);
    offer(&l, then, 3 * load_period_ms);
    long most = most_in_a_period(&l, 0);
    long p[6];
    for (int k = 0; k < 6; k++)
        p[k] = all_in(&l, (uint64_t)k * load_period_ms,
                      (uint64_t)(k + 1) * load_period_ms);
    long eu = admitted_in(&l, 0, 2 * load_period_ms, 3 * load_period_ms);
    long ap = admitted_in(&l, 2, 5 * load_period_ms, 6 * load_period_ms);
    fprintf(stderr, "regions: most in a period %ld of %d; periods %ld %ld "
            "%ld %ld %ld %ld; eu's part of the third %ld, ap's of the "
            "sixth %ld\n", most, LOAD_LIMIT, p[0], p[1], p[2], p[3], p[4],
                p[5], eu, ap);
    for (int k = 0; k < 6; k++)
        fprintf(stderr, "regions: period %d: eu %ld us %ld ap %ld\n", k,
                admitted_in(&l, 0, (uint64_t)k * load_period_ms,
                            (uint64_t)(k + 1) * load_period_ms),
                admitted_in(&l, 1, (uint64_t)k * load_period_ms,
                            (uint64_t)(k + 1) * load_period_ms),
                admitted_in(&l, 2, (uint64_t)k * load_period_ms,
                            (uint64_t)(k + 1) * load_period_ms));
    load_close(&l);
    cr_assert_leq(most, LOAD_LIMIT * 105 / 100, "a span of one period "
                  "admitted %ld of %d", most, LOAD_LIMIT);
    /* Steady overload: the second and third periods of each split. */
    for (int k = 1; k < 6; k++) {
        if (k == 3)
            continue; /* the demand moving */
        cr_assert_geq(p[k], LOAD_LIMIT * 9 / 10, "period %d admitted %ld",
                      k, p[k]);
    }
    cr_assert_geq(eu * 100, p[2] * 60, "eu sends 70 %% and got %ld of %ld",
                  eu, p[2]);
    cr_assert_geq(ap * 100, p[5] * 60, "ap sends 70 %% and got %ld of %ld",
                  ap, p[5]);
}

/* ap cut off from eu and us for three periods, at twice the limit split
 * 70/20/10: the fleet stays within 1.1 of the limit, ap keeps its part
 * (not the whole limit) and the others theirs, ap's decisions say
 * degraded; after the heal, within the bound from two intervals on; and
 * every region's Redis ends with every admission once. */
Test(regions, a_region_cut_off_keeps_its_part,
     .timeout = 300)
{
    static load l;
    start_load(&l);
    static const unsigned split[3] = {70, 20, 10};
    offer(&l, split, 2 * load_period_ms);
    uint64_t cut = test_now_ms() - l.start_ms;
    test_region_cut(&regions, 2);
    long degraded_before = l.degraded[2];
    offer(&l, split, 3 * load_period_ms);
    long degraded_cut = l.degraded[2] - degraded_before;
    uint64_t healed = test_now_ms() - l.start_ms;
    test_region_heal(&regions, 2);
    offer(&l, split, load_period_ms);
    long degraded_mark = l.degraded[2];
    offer(&l, split, load_period_ms);
    long degraded_after = l.degraded[2] - degraded_mark;
    long most = most_in_a_period(&l, 0);
    long after = most_in_a_period(&l, healed + 2 * load_interval_ms);
    /* The second and third periods of the cut: the first is the one the
     * cut is found in. */
    uint64_t from = cut + load_period_ms, to = cut + 3 * load_period_ms;
    long ap = admitted_in(&l, 2, from, to) / 2;
    long others = (admitted_in(&l, 0, from, to)
                   + admitted_in(&l, 1, from, to)) / 2;
    fprintf(stderr, "regions cut: most in a period %ld, after the heal "
            "%ld; per period in the cut ap %ld, eu and us %ld; ap degraded "
            "%ld in the cut, %ld in the last period\n", most, after, ap,
            others, degraded_cut, degraded_after);
    /* Every admission of the accounting key, in every region's Redis. */
    long acct = l.acct[0] + l.acct[1] + l.acct[2];
    load_close(&l);
    for (size_t i = 0; i < 3; i++) {
        char name[32];
        snprintf(name, sizeof name, "acct:acct");
        uint64_t start = test_now_ms();
        long long got;
        while ((got = test_window_total(regions.r[i].redis_addr, name))
               != acct) {
            cr_assert_lt(test_now_ms() - start, 5000, "region %s's Redis "
                         "holds %lld of %ld admitted", regions.r[i].name,
                         got, acct);
            test_sleep_ms(50);
        }
    }
    cr_assert_leq(most, LOAD_LIMIT * 110 / 100, "a span of one period "
                  "admitted %ld of %d", most, LOAD_LIMIT);
    cr_assert_leq(after, LOAD_LIMIT * 105 / 100, "after the heal a span "
                  "admitted %ld of %d", after, LOAD_LIMIT);
    /* ap's part of what the fleet admits in the cut, as of the cut: a
     * part read from ap's own counts as they ran on while the cut was
     * being found shrank (16 to 24 a period to eu and us's 255 to 264,
     * 6 to 8.4 %); with it, 28 to 31 to 266 to 269 (9.5 to 10.4 %), and
     * at the shape, where the floor holds both below their
     * parts, 25 to 27 to 231 to 233. */
    cr_assert(ap <= LOAD_LIMIT / 5, "ap, cut off with a part of about a "
              "tenth, admitted %ld a period", ap);
    cr_assert_geq(ap * 1000, (ap + others) * 88, "ap, with a part of about "
                  "a tenth, admitted %ld a period to eu and us's %ld", ap,
                  others);
    cr_assert_geq(others, LOAD_LIMIT * 7 / 10, "eu and us, with about nine "
                  "tenths, admitted %ld a period", others);
    cr_assert_gt(degraded_cut, 0, "ap's decisions never said degraded");
    cr_assert_eq(degraded_after, 0, "ap's decisions still degraded a "
                 "period after the heal");
}
