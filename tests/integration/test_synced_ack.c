/*
 * An acknowledgement's totals only lower a synced key's mark; fresh shares
 * come from TOTALS snapshots and the agent's tick (agent/synced.c,
 * docs/design.md "Shares replace, they do not add"). An ack's totals may
 * miss the reports other agents made at the same moment: a share worked
 * out from them gives those agents' admissions out again.
 *
 * The aggregator here is a fake in this process (fake_aggregator.h), so
 * that the test says what Redis's clock reads and what the totals hold,
 * and when each message goes.
 * The fleet is the real agent (A) and a second one (B) that exists only in
 * the fake's counts. The story, with a limit of 100 and two agents:
 *
 *   - B admitted 60 long ago; they are the oldest sub-window of the span.
 *     TOTALS: room 40, a share of 20 each; A admits 20.
 *   - Redis's clock moves into the next sub-window: B's 60 leave the span.
 *     A reports its 20; the ack holds them, but not the 20 B admitted at
 *     the same moment, whose report is applied just after A's. From the
 *     ack the room would be 80, a fresh share 40: 20 more for A. The ack
 *     may only lower A's mark: A admits nothing.
 *   - The next TOTALS hold both agents' counts: room 60, a share of 30.
 *
 * What is held here is the rule (nothing between the ack and the next
 * TOTALS), not a fleet total: in this story a share taken from the ack
 * would come out of the next one, as what A admits since its last
 * acknowledged report always does.
 *
 * The rule's period is an hour (sub-windows of three minutes): the window
 * moves only when the fake's clock jumps.
 */
#include "fake_aggregator.h"
#include "partition.h"
#include "redis_server.h"
#include "test_agent.h"
#include "test_env.h"
#include "wire.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#define RULE "ackfresh"
#define TENANT "org_ackfresh"
#define LIMIT 100
#define PERIOD_MS 3600000ULL
#define INTERVAL_MS 1000
#define AGENTS 2
/* Where the fake's clock starts: any sub-window will do. */
#define FIRST_WINDOW 1000
/* A report is resent if no ack comes in two intervals: the test waits for
 * the agent less than that while holding one. */
#define HOLD_MS 1500

/* One aggregator as `aggregator:`, several as `aggregators:`; the agent's
 * lines go to log unless it is NULL. */
static void open_agent_logged(fake_agg *f, size_t n, test_agent *t,
                              test_log *log)
{
    char yaml[2048];
    int len = snprintf(yaml, sizeof yaml,
                       "store: {url: \"redis://%s\", timeout_ms: 2000}\n"
                       "aggregator:\n"
                       "  sync_interval_ms: %d\n"
                       /* The stories hold reports and totals longer than
                        * three intervals: no key goes degraded in them. */
                       "  stale_after_ms: 600000\n",
                       test_env("RL_TEST_REDIS"), INTERVAL_MS);
    if (n == 1)
        len += snprintf(yaml + len, sizeof yaml - (size_t)len,
                        "  reports: \"%s\"\n  totals: \"%s\"\n",
                        f[0].reports, f[0].totals);
    else
        len += snprintf(yaml + len, sizeof yaml - (size_t)len,
                        "aggregators:\n");
    for (size_t i = 0; n > 1 && i < n; i++)
        len += snprintf(yaml + len, sizeof yaml - (size_t)len,
                        "  - {reports: \"%s\", totals: \"%s\"}\n",
                        f[i].reports, f[i].totals);
    snprintf(yaml + len, sizeof yaml - (size_t)len,
             "rules:\n"
             "  - {name: " RULE ", match: tenant, limit: %d, "
             "period: %llums, mode: synced}\n",
             LIMIT, (unsigned long long)PERIOD_MS);
    memset(t, 0, sizeof *t);
    t->agent = test_agent_on(test_write_config("synced-ack", yaml),
                             &t->config, log);
    for (size_t i = 0; i < n; i++)
        fake_wait_subscribed(&f[i]);
}

static void open_agent(fake_agg *f, size_t n, test_agent *t)
{
    open_agent_logged(f, n, t, NULL);
}

static bool allowed_to(test_agent *t, const char *tenant)
{
    char attr[96];
    snprintf(attr, sizeof attr, "tenant=%s", tenant);
    return test_check(t, attr, NULL).allowed;
}

static bool allowed(test_agent *t)
{
    return allowed_to(t, TENANT);
}

/* What the agent admits now, before its first rejection. */
static long admitted_to(test_agent *t, const char *tenant)
{
    long n = 0;
    while (allowed_to(t, tenant))
        cr_assert_leq(++n, LIMIT, "the key was never rejected");
    return n;
}

static long admitted(test_agent *t)
{
    return admitted_to(t, TENANT);
}

/* What the agent admits once the TOTALS just published have reached it:
 * the key rejects until then, so its first admission says they have. */
static long admitted_after_totals_to(test_agent *t, const char *tenant)
{
    for (int waited = 0; waited < HOLD_MS; waited++) {
        if (allowed_to(t, tenant))
            return 1 + admitted_to(t, tenant);
        test_sleep_ms(1);
    }
    return 0;
}

static long admitted_after_totals(test_agent *t)
{
    return admitted_after_totals_to(t, TENANT);
}

/* An agent on one fake aggregator of a fleet of `agents`, its key spent:
 * its first report (presence only) acknowledged, which tells it Redis's
 * clock; then, before anything says how many agents there are, it takes
 * the whole limit (*cold), and once its report of it is acknowledged the
 * key is at its mark and reports a count of 0 (*asking, held). Its totals
 * are out of the span two periods on. */
static void open_spent(fake_agg *f, uint64_t agents, test_agent *t,
                       long *cold, fake_held *asking)
{
    fake_start(f, RULE, PERIOD_MS, agents, FIRST_WINDOW);
    open_agent(f, 1, t);
    fake_held r = fake_receive(f);
    fake_ack(f, &r);
    *cold = admitted(t);
    r = fake_receive(f);
    cr_assert_eq(r.count, (uint64_t)*cold);
    fake_ack(f, &r);
    *asking = fake_receive(f);
    cr_assert_eq(asking->count, 0);
}

Test(synced_ack, an_ack_gives_no_fresh_share_only_the_next_totals_do)
{
    fake_agg f = {0};
    test_agent t;
    long cold;
    fake_held asking;
    open_spent(&f, AGENTS, &t, &cold, &asking);
    /* Two periods on, B's 60 are the oldest sub-window. */
    uint64_t w = FIRST_WINDOW + 40;
    fake_enter(&f, w, 0, 60);
    fake_publish(&f);
    long share = admitted_after_totals(&t);
    fake_ack(&f, &asking);
    fake_held r = fake_receive(&f);
    cr_assert_eq(r.count, (uint64_t)share, "the report is not of the share");
    /* The next sub-window: B's 60 have left. A's report is applied before
     * B's, and B admitted its share too. */
    fake_enter(&f, w + 1, 0, 0);
    fake_ack(&f, &r);
    f.recent += (uint64_t)share;
    /* The next report comes after the ack is handled, and after a tick
     * (which gives no fresh share from an ack's totals either). */
    fake_held last = fake_receive(&f);
    long after_ack = 0;
    for (int i = 0; i < LIMIT; i++)
        after_ack += allowed(&t);
    fake_publish(&f);
    long after_totals = admitted_after_totals(&t);
    fake_ack(&f, &last);
    fprintf(stderr, "synced ack: %ld admitted cold, %ld from the first "
            "totals, %ld after the ack, %ld from the next totals\n", cold,
            share, after_ack, after_totals);
    cr_expect_eq(share, (LIMIT - 60) / AGENTS, "the first totals' share");
    cr_expect_eq(after_ack, 0, "a fresh share from the ack's totals");
    cr_expect_eq(after_totals, (LIMIT - 2 * share) / AGENTS,
                 "the share of the totals that hold both agents' counts");
    test_agent_close(&t);
    fake_stop(&f);
}

/* --- Give-backs (a hold's, after its estimate's report) ------------- */

/* An agent on a fake aggregator that reads `features`, holding an
 * estimate of 5 whose report is acknowledged; the hold then ends at 1.
 * Returns the sub-window the estimate was reported in (as its entry's at
 * says, by the rule's sub-windows). */
static uint64_t give_back_after_report(fake_agg *f, test_agent *t,
                                       uint64_t features)
{
    fake_start(f, RULE, PERIOD_MS, 1, FIRST_WINDOW);
    open_agent(f, 1, t);
    fake_publish_features_of(f, features);
    fake_held r = fake_receive(f);
    fake_ack(f, &r);
    rl_hold *h = test_hold_on(t->agent, "tenant", TENANT, 5, NULL);
    cr_assert_not_null(h);
    r = fake_receive(f);
    cr_assert_eq(r.count, 5, "the estimate is not in the report");
    cr_assert_eq(r.report.n_entries, 1);
    uint64_t at = r.report.entries[0].at_ms;
    cr_assert_gt(at, 0, "the estimate's report names no sub-window");
    fake_ack(f, &r);
    cr_assert_eq(rl_hold_end(h, 1), RL_OK);
    return at / rl_wire_subwindow_ms(PERIOD_MS);
}

/* The give-back entries of a report: their sum, and whether all are in
 * sub-window w. */
static uint64_t given_back(const fake_held *r, uint64_t w, bool *all_in_w)
{
    uint64_t back = 0;
    *all_in_w = true;
    for (size_t i = 0; i < r->report.n_entries; i++) {
        const rl_wire_entry *e = &r->report.entries[i];
        back += e->back;
        if (e->back > 0
            && e->at_ms / rl_wire_subwindow_ms(PERIOD_MS) != w)
            *all_in_w = false;
    }
    return back;
}

/* An aggregator that reads give-backs gets the hold's in the next
 * report, off the sub-window the estimate was reported in. */
Test(synced_ack, a_give_back_after_the_report_goes_to_its_sub_window)
{
    fake_agg f = {0};
    test_agent t;
    uint64_t w = give_back_after_report(&f, &t, RL_WIRE_FEATURE_WINDOWS
                                                    | RL_WIRE_FEATURE_GIVEBACK);
    fake_held r = fake_receive(&f);
    bool in_w;
    cr_assert_eq(given_back(&r, w, &in_w), 4, "the give-back is not 4");
    cr_assert(in_w, "the give-back names another sub-window");
    fake_ack(&f, &r);
    /* Once: the next report gives nothing back. */
    r = fake_receive(&f);
    cr_assert_eq(given_back(&r, w, &in_w), 0, "given back twice");
    fake_ack(&f, &r);
    test_agent_close(&t);
    fake_stop(&f);
}

/* An aggregator of the version before give-backs (it reads sub-windows,
 * not negative counts, and would refuse the whole report) never gets
 * one: the give-back is dropped. */
Test(synced_ack, no_give_back_goes_to_an_aggregator_that_does_not_read_them)
{
    fake_agg f = {0};
    test_agent t;
    uint64_t w = give_back_after_report(&f, &t, RL_WIRE_FEATURE_WINDOWS);
    for (int i = 0; i < 2; i++) {
        fake_held r = fake_receive(&f);
        bool in_w;
        cr_assert_eq(given_back(&r, w, &in_w), 0,
                     "a give-back went to an aggregator that does not "
                     "read them");
        fake_ack(&f, &r);
    }
    test_agent_close(&t);
    fake_stop(&f);
}

/* --- Several aggregators: a TOTALS message is a snapshot of what its
 * sender applied, so it gives a fresh share only to the keys this agent
 * reports there (docs/design.md, "Several aggregators"). Here the agent
 * has two aggregators, O and N, and a key of each (k_O goes to O, k_N to
 * N). O's totals give k_O a share of 20, which the agent admits and
 * reports to O; O's ack holds them. N's TOTALS, published after that ack,
 * hold k_O as N read it before the report reached O (N applied another
 * agent's count of it, agents briefly disagreeing on who is up): the 20
 * are not in them. Taken as a snapshot of k_O they would count the
 * acknowledged 20 as held and give them out again (10 of a room of 20).
 * k_O gets nothing until O's next TOTALS, whatever ticks come meanwhile
 * (the ack left it partial); k_N, in N's TOTALS just after, gets its
 * share. */

/* A tenant whose key goes to aggregator `owner` of two. */
static void tenant_of(size_t owner, char *out, size_t cap)
{
    const bool up[2] = {true, true};
    for (int i = 0;; i++) {
        snprintf(out, cap, "org_owner_%d", i);
        if (rl_partition_owner(rl_partition_key(RULE, out, strlen(out)), up,
                               2) == owner)
            return;
    }
}

/* The reports of a tick on both links, acknowledged (their counts
 * applied); returns the count of O's key in O's. */
static uint64_t ack_both(fake_agg *f)
{
    uint64_t count = 0;
    for (int i = 0; i < 2; i++) {
        fake_held r = fake_receive(&f[i]);
        if (i == 0)
            count = r.count;
        fake_ack(&f[i], &r);
    }
    return count;
}

Test(synced_ack, totals_give_fresh_shares_only_to_the_keys_their_sender_owns)
{
    enum { O = 0, N = 1 };
    fake_agg f[2];
    memset(f, 0, sizeof f);
    char k[2][32];
    for (int i = 0; i < 2; i++) {
        tenant_of((size_t)i, k[i], sizeof k[i]);
        f[i].value_len = strlen(k[i]);
        memcpy(f[i].value, k[i], f[i].value_len);
        fake_start(&f[i], RULE, PERIOD_MS, AGENTS, FIRST_WINDOW);
    }
    test_agent t;
    open_agent(f, 2, &t);
    ack_both(f); /* presence only: the acks tell the agent Redis's clock */
    /* Cold, each key takes the whole limit; its report goes to its owner. */
    cr_assert_eq(admitted_to(&t, k[O]), LIMIT);
    cr_assert_eq(admitted_to(&t, k[N]), LIMIT);
    ack_both(f);
    cr_assert_eq(f[O].recent, LIMIT, "k_O's count did not go to O");
    cr_assert_eq(f[N].recent, LIMIT, "k_N's count did not go to N");
    /* Held, as the next ones below: the agent's next report is built only
     * once the last ack is handled, so what comes next comes after it. */
    fake_held asking[2] = {fake_receive(&f[O]), fake_receive(&f[N])};
    /* Two periods on (one clock for both: they share Redis), O's totals
     * leave room for a share of 20 of k_O. */
    uint64_t w = FIRST_WINDOW + 40;
    fake_enter(&f[O], w, 0, 60);
    fake_enter(&f[N], w, 0, 0);
    f[N].clock_offset = f[O].clock_offset;
    fake_publish(&f[O]);
    long from_o = admitted_after_totals_to(&t, k[O]);
    for (int i = 0; i < 2; i++)
        fake_ack(&f[i], &asking[i]);
    /* The 20 reach O, which acknowledges them: k_O's totals are 80. */
    cr_assert_eq(ack_both(f), (uint64_t)from_o, "k_O's 20 did not go to O");
    fake_held next[2] = {fake_receive(&f[O]), fake_receive(&f[N])};
    /* N's TOTALS of k_O, without the 20, then of k_N. */
    fake_agg n_of_k_o = f[N];
    n_of_k_o.value_len = strlen(k[O]);
    memcpy(n_of_k_o.value, k[O], n_of_k_o.value_len);
    n_of_k_o.recent = 0;
    n_of_k_o.oldest = 60;
    fake_publish(&n_of_k_o);
    fake_publish(&f[N]);
    long from_n = admitted_after_totals_to(&t, k[N]);
    long k_o_after_n = 0;
    for (int i = 0; i < LIMIT; i++)
        k_o_after_n += allowed_to(&t, k[O]);
    fprintf(stderr, "synced owner: k_O %ld from O's totals, %ld after N's; "
            "k_N %ld from N's\n", from_o, k_o_after_n, from_n);
    cr_expect_eq(from_o, (LIMIT - 60) / AGENTS, "O's share of k_O");
    cr_expect_eq(from_n, LIMIT / AGENTS, "N's share of k_N");
    cr_expect_eq(k_o_after_n, 0, "k_O's acknowledged count given out again "
                 "from N's totals");
    for (int i = 0; i < 2; i++)
        fake_ack(&f[i], &next[i]);
    test_agent_close(&t);
    for (int i = 0; i < 2; i++)
        fake_stop(&f[i]);
}

/* --- A link that comes back takes its keys back only once the agent hears
 * its aggregator's totals: the agent's two sockets to it redial on their
 * own, and a key reported where its totals cannot be heard would get
 * none (docs/design.md, "Coming back"). Here N, the key's aggregator of
 * two, is killed and comes back answering reports (the agent's pings),
 * its totals address still closed: the key stays with O. Once N's totals
 * listen again, the key goes back to N. The agent says which address it
 * cannot reach, once that lasts past the redial, and says nothing when N
 * was only restarted (its totals listening at once).
 *
 * The key is at its mark, so that it is in every report of the link it
 * goes to (with a count of 0): which link has it shows at each tick,
 * whenever a request would have been counted. */

/* One tick: each fake's report, acknowledged; whether the key is in each,
 * and whether N's was a ping (numbered 0). */
static void tick_both(fake_agg *f, bool has_key[2], bool *n_pinged)
{
    for (int i = 0; i < 2; i++) {
        fake_held r = fake_receive(&f[i]);
        has_key[i] = r.report.n_entries > 0;
        if (i == 1)
            *n_pinged = r.report.seq == 0;
        fake_ack(&f[i], &r);
    }
}

/* The tick (of at most `ticks`) at which the key is back with N. */
static int ticks_to_n(fake_agg *f, int ticks)
{
    bool has_key[2], pinged;
    for (int i = 0; i < ticks; i++) {
        tick_both(f, has_key, &pinged);
        if (!pinged && has_key[1])
            return i;
    }
    return -1;
}

Test(synced_ack, a_link_comes_back_only_once_its_totals_are_heard)
{
    enum { O = 0, N = 1, TICKS_AWAY = 4, TICKS_BACK = 6 };
    static test_log log;
    test_log_init(&log);
    fake_agg f[2];
    memset(f, 0, sizeof f);
    char k[32];
    tenant_of(N, k, sizeof k);
    for (int i = 0; i < 2; i++) {
        f[i].value_len = strlen(k);
        memcpy(f[i].value, k, f[i].value_len);
        fake_start(&f[i], RULE, PERIOD_MS, AGENTS, FIRST_WINDOW);
    }
    test_agent t;
    open_agent_logged(f, 2, &t, &log);
    bool has_key[2], pinged;
    tick_both(f, has_key, &pinged); /* presence: Redis's clock */
    cr_assert_eq(admitted_to(&t, k), LIMIT);
    tick_both(f, has_key, &pinged);
    cr_assert(has_key[N] && !has_key[O],
              "the key did not go to N while it was up");
    /* N restarted, both its addresses listening at once: it has the key
     * back within a few ticks, and no line says its totals are away. */
    fake_restart(&f[N], true);
    int restarted_back = ticks_to_n(f, TICKS_BACK);
    cr_assert_geq(restarted_back, 0, "the key never went back to N after "
                  "a restart");
    test_log_lacks(&log, "event=aggregator_totals_unreachable",
                   "the agent's log after a restart");
    /* N killed and back, its totals address closed. The tick the kill
     * falls in may still send the key to N (its connection's loss not
     * yet seen, a report lost with it and carried later); from the next
     * one on, N only gets pings and the key goes to O. */
    fake_restart(&f[N], false);
    tick_both(f, has_key, &pinged);
    for (int i = 0; i < TICKS_AWAY; i++) {
        tick_both(f, has_key, &pinged);
        cr_assert(pinged, "tick %d: N got a report, not a ping, while "
                  "the agent could not hear its totals", i);
        cr_assert(has_key[O], "tick %d: the key did not go to O", i);
    }
    char url[80];
    snprintf(url, sizeof url, "url=%s ", f[N].totals);
    cr_assert(test_log_wait(&log, "event=aggregator_totals_unreachable", url,
                            0),
              "no line named N's totals address, %s", f[N].totals);
    /* Its totals listen again: the key goes back within a few ticks. */
    fake_listen_totals(&f[N]);
    fake_wait_subscribed(&f[N]);
    int back_at = ticks_to_n(f, TICKS_BACK);
    fprintf(stderr, "synced back: restarted, the key was back to N in %d "
            "ticks; killed, it stayed with O for %d ticks while N answered "
            "without totals; back to N %d ticks after its totals "
            "listened\n", restarted_back + 1, TICKS_AWAY, back_at + 1);
    cr_expect_geq(back_at, 0, "the key never went back to N");
    test_agent_close(&t);
    for (int i = 0; i < 2; i++)
        fake_stop(&f[i]);
}

/* --- An aggregator back from a crash has applied nothing yet, so it has
 * read no agent count from Redis: its first TOTALS say 0 agents, which
 * means "not known", not "none". Taken as the fleet's size, every agent
 * would divide the room by one and take all of it (the failover test saw
 * the fleet go past its limit when the restart fell while the key had
 * room). The agent keeps the count it knew. */
Test(synced_ack, an_agent_count_of_0_keeps_the_count_known)
{
    enum { FLEET = 4 };
    fake_agg f = {0};
    test_agent t;
    long cold;
    fake_held asking;
    open_spent(&f, FLEET, &t, &cold, &asking);
    /* Two periods on, the span is empty: a quarter of the limit each. */
    fake_enter(&f, FIRST_WINDOW + 40, 0, 0);
    fake_publish(&f);
    long known = admitted_after_totals(&t);
    fake_ack(&f, &asking);
    fake_held r = fake_receive(&f);
    cr_assert_eq(r.count, (uint64_t)known);
    fake_ack(&f, &r);
    /* The next report comes once the ack is handled: totals heard before
     * it would not hold the report for this agent (a share of 0 here, as
     * TSan's slower agent got once). The tick gives no fresh share from
     * the ack's totals. Then the same totals from an aggregator that
     * knows no agent count. */
    fake_held last = fake_receive(&f);
    f.agents = 0;
    fake_publish(&f);
    long unknown = admitted_after_totals(&t);
    fake_ack(&f, &last);
    fprintf(stderr, "synced agent count: %ld admitted cold, %ld of %d with "
            "%d agents, %ld of the %ld left when the count was 0\n", cold,
            known, LIMIT, FLEET, unknown, LIMIT - known);
    cr_expect_eq(known, LIMIT / FLEET, "the share of %d agents", FLEET);
    long room = LIMIT - known;
    cr_expect(unknown >= room / FLEET && unknown <= room / FLEET + 1,
              "%ld admitted of a room of %ld after a count of 0 (a share "
              "of %d agents: %ld or %ld)", unknown, room, FLEET,
              room / FLEET, room / FLEET + 1);
    test_agent_close(&t);
    fake_stop(&f);
}
