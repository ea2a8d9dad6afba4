/*
 * rl-aggregator's SIGHUP, end to end: a real redis-server, a real
 * rl-aggregator process and two real agents (librl) that reload the same
 * file with rl_agent_reload. The aggregator follows the agents' rules:
 * a synced rule added is summed and broadcast, one removed stops being
 * summed without holding back any other count, a changed limit applies
 * within the synced bound (docs/design.md: at most 2 x (limit + agents)
 * per window), shadow rules are summed and never reject, a bad file is
 * refused and logged with the old rules kept, and the log names each
 * change (aggregator/main.c's reload_change and reloaded lines).
 *
 * Rule names carry the test's pid: another run's agents in the
 * aggregator's agent sets (rl:agg:live:<rule>) would change every share.
 */
#include "config.h"
#include "nng_sub.h"
#include "test_agent.h"
#include "test_aggregator.h"
#include "test_env.h"
#include "test_process.h"
#include "wire.h"

#include <criterion/criterion.h>
#include <nng/nng.h>
#include <nng/protocol/pubsub0/sub.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define INTERVAL_MS 100
#define N_AGENTS 2
/* One window for the whole test: no window edge to reason about. */
#define PERIOD "1h"

typedef struct fleet {
    test_aggregator agg;
    rl_agent *agents[N_AGENTS];
    rl_config *configs[N_AGENTS];
} fleet;

/* The agents' logs (large: not on the stack). */
static test_log agent_logs[N_AGENTS];

/* The aggregator's config file, with the settings test_aggregator_start
 * wrote, more aggregator lines (indented) and these rules. */
static void write_config(const test_aggregator *agg, const char *extra,
                         const char *rules)
{
    FILE *f = fopen(agg->config, "w");
    cr_assert_not_null(f);
    fprintf(f,
            "store: {url: \"redis://%s\"}\n"
            "aggregator:\n"
            "  reports: \"%s\"\n"
            "  totals: \"%s\"\n"
            "  metrics: \"127.0.0.1:%u\"\n"
            "  sync_interval_ms: %u\n%s"
            "rules:\n%s",
            test_env("RL_TEST_REDIS"), agg->reports, agg->totals,
            agg->metrics, INTERVAL_MS, extra, rules);
    fclose(f);
}

static void write_rules(const test_aggregator *agg, const char *rules)
{
    write_config(agg, "", rules);
}

/* The fleet, its agents opened with more aggregator lines (extra), which
 * the aggregator, already started, does not read. */
static void fleet_start_with(fleet *f, const char *extra, const char *rules)
{
    memset(f, 0, sizeof *f);
    test_aggregator_start(&f->agg, NULL, rules, INTERVAL_MS, NULL);
    test_aggregator_wait_ready(&f->agg);
    write_config(&f->agg, extra, rules);
    for (int i = 0; i < N_AGENTS; i++) {
        test_log_init(&agent_logs[i]);
        f->agents[i] = test_agent_on(f->agg.config, &f->configs[i],
                                     &agent_logs[i]);
    }
}

static void fleet_start(fleet *f, const char *rules)
{
    fleet_start_with(f, "", rules);
}

static void fleet_stop(fleet *f)
{
    for (int i = 0; i < N_AGENTS; i++) {
        rl_agent_close(f->agents[i]);
        rl_config_free(f->configs[i]);
    }
    test_aggregator_stop(&f->agg);
}

/* Lines of the log holding needle. */
static int count_lines(const char *log, const char *needle)
{
    FILE *f = fopen(log, "r");
    cr_assert_not_null(f, "cannot read %s", log);
    char line[2048];
    int n = 0;
    while (fgets(line, sizeof line, f) != NULL)
        n += strstr(line, needle) != NULL;
    fclose(f);
    return n;
}

/* Whether the log has this exact line (without its newline). */
static bool has_line(const char *log, const char *want)
{
    FILE *f = fopen(log, "r");
    cr_assert_not_null(f, "cannot read %s", log);
    char line[2048];
    bool found = false;
    while (!found && fgets(line, sizeof line, f) != NULL) {
        line[strcspn(line, "\n")] = '\0';
        found = strcmp(line, want) == 0;
    }
    fclose(f);
    return found;
}

/* SIGHUP, and waits until the aggregator has logged the outcome: a
 * `reloaded` or a `reload_failed` line more than before. */
static void hup(test_aggregator *agg)
{
    int before = count_lines(agg->log, "event=reloaded ")
                 + count_lines(agg->log, "event=reload_failed ");
    cr_assert_eq(kill(agg->pid, SIGHUP), 0);
    uint64_t start = test_now_ms();
    while (count_lines(agg->log, "event=reloaded ")
               + count_lines(agg->log, "event=reload_failed ")
           == before) {
        if (test_now_ms() - start > 5000) {
            test_show_log(agg->log);
            cr_assert_fail("no reload logged 5 s after SIGHUP");
        }
        test_sleep_ms(20);
    }
}

/* The aggregator (SIGHUP) and then every agent reload the file. */
static void reload_all(fleet *f, const char *rules)
{
    write_rules(&f->agg, rules);
    hup(&f->agg);
    cr_assert_eq(count_lines(f->agg.log, "event=reload_failed"), 0,
                 "the aggregator refused a good config; see %s", f->agg.log);
    for (int i = 0; i < N_AGENTS; i++) {
        rl_error err;
        cr_assert_eq(rl_agent_reload(f->agents[i], f->agg.config, &err),
                     RL_OK, "%s", err.message);
    }
}

static long long redis_total(const char *prefix_value)
{
    return test_window_total(NULL, prefix_value);
}

/* Waits until Redis holds want for the key: the agents' counts all
 * arrived. */
static void expect_redis_total(const char *key, long long want,
                               unsigned timeout_ms)
{
    uint64_t start = test_now_ms();
    long long got;
    while ((got = redis_total(key)) != want) {
        cr_assert_lt(test_now_ms() - start, timeout_ms,
                     "Redis holds %lld for %s, the agents counted %lld", got,
                     key, want);
        test_sleep_ms(50);
    }
}

/* The same, and that it stays so for a while (nothing more arrives). */
static void expect_redis_total_stays(const char *key, long long want)
{
    expect_redis_total(key, want, 5000);
    test_sleep_ms(5 * INTERVAL_MS);
    cr_assert_eq(redis_total(key), want, "%s moved past %lld", key, want);
}

/* A value no other run used. */
static const char *fresh(char *buf, size_t cap, const char *what)
{
    static int serial;
    snprintf(buf, cap, "%s-%d-%d-%llu", what, (int)getpid(), ++serial,
             (unsigned long long)test_now_us());
    return buf;
}

static rl_decision check(rl_agent *agent, const char *attr,
                         const char *value)
{
    rl_attr a = {attr, value, strlen(value)};
    rl_decision d;
    cr_assert_eq(rl_check(agent, &a, 1, 1, &d), RL_OK);
    return d;
}

/* What an offer of load did. */
typedef struct offered {
    long checks, admitted[N_AGENTS], admitted_sum;
    long shadow_rejected;  /* decisions naming a shadow rejection */
    long degraded;         /* decisions on_error made */
} offered;

/* One check per agent every ms for ms milliseconds. */
static offered offer(fleet *f, const char *attr, const char *value,
                     unsigned ms)
{
    offered o = {0};
    uint64_t start = test_now_ms();
    for (uint64_t round = 1; test_now_ms() - start < ms; round++) {
        for (int i = 0; i < N_AGENTS; i++) {
            rl_decision d = check(f->agents[i], attr, value);
            o.checks++;
            o.admitted[i] += d.allowed;
            o.admitted_sum += d.allowed;
            o.shadow_rejected += d.shadow_rejected > 0;
            o.degraded += d.degraded;
        }
        uint64_t due = start + round, now = test_now_ms();
        if (due > now)
            test_sleep_ms((unsigned)(due - now));
    }
    return o;
}

/* A subscriber to the aggregator's totals for one rule. It is closed
 * with unsubscribe, while the aggregator publishes (nng_sub.h). */
static void subscribe(rl_nng_sub *s, const test_aggregator *agg,
                      const char *rule)
{
    cr_assert_eq(rl_nng_sub_open(s), 0);
    cr_assert_eq(nng_socket_set(s->sock, NNG_OPT_SUB_SUBSCRIBE, rule,
                                strlen(rule) + 1), 0);
    cr_assert_eq(nng_dial(s->sock, agg->totals, NULL, 0), 0);
    nng_socket_set_ms(s->sock, NNG_OPT_RECVTIMEO, 200);
}

/* The next publish ends its connection: at most an interval (two
 * seconds in the slowest test here). */
static void unsubscribe(rl_nng_sub *s)
{
    rl_nng_sub_close(s, 4000);
}

/* A TOTALS message, decoded: t points into m's body, so m lives as long. */
typedef struct totals {
    rl_wire_msg t;
    nng_msg *m;
} totals;

static void totals_free(totals *x)
{
    rl_wire_msg_free(&x->t);
    if (x->m != NULL)
        nng_msg_free(x->m);
    x->m = NULL;
}

/* The next TOTALS message on s, decoded (t.type 0 if none came in
 * timeout_ms). The caller frees it with totals_free. */
static totals next_totals(nng_socket s, unsigned timeout_ms)
{
    totals x = {0};
    uint64_t start = test_now_ms();
    while (test_now_ms() - start < timeout_ms) {
        if (nng_recvmsg(s, &x.m, 0) != 0)
            continue;
        const char *body = nng_msg_body(x.m);
        size_t len = nng_msg_len(x.m);
        const char *nul = memchr(body, '\0', len);
        const char *why;
        cr_assert_not_null(nul, "a totals message without a topic");
        cr_assert_eq(rl_wire_decode(nul + 1, len - (size_t)(nul + 1 - body),
                                    &x.t, &why), 0, "%s", why);
        cr_assert_eq(x.t.type, RL_WIRE_TOTALS);
        return x;
    }
    return x;
}

/* Waits for a totals message of the rule carrying value with current
 * total want: the aggregator summed the new rule's counts and broadcast
 * them. */
static void expect_broadcast(nng_socket s, const char *value, long long want)
{
    uint64_t start = test_now_ms();
    long long last = -1;
    while (test_now_ms() - start < 5000) {
        totals x = next_totals(s, 500);
        for (size_t i = 0; i < x.t.n_entries; i++) {
            const rl_wire_entry *e = &x.t.entries[i];
            if (e->value.len == strlen(value)
                && memcmp(e->value.ptr, value, e->value.len) == 0)
                last = (long long)e->current;
        }
        totals_free(&x);
        if (last == want)
            return;
    }
    cr_assert_fail("no totals message of %lld for %s (last seen %lld)", want,
                   value, last);
}

/* --- (1) A synced rule added by a reload is counted and broadcast. ------
 * Before the reload nothing applies to an org; after it, the two agents
 * offered 10 x the limit each are held, together, to between the limit
 * and the stated worst case 2 x (limit + agents), every admitted request
 * reaches Redis, and the totals go out on the PUB socket. */

Test(aggregator_reload, an_added_synced_rule_is_summed_and_broadcast)
{
    enum { LIMIT = 100 };
    char base[128], added[128], rules[512], org[96], key[160];
    snprintf(base, sizeof base,
             "  - {name: base-%d, match: tenant, limit: 1000000000, "
             "period: " PERIOD ", mode: synced}\n", (int)getpid());
    snprintf(added, sizeof added,
             "  - {name: added-%d, match: org, limit: %d, "
             "period: " PERIOD ", mode: synced}\n", (int)getpid(), LIMIT);
    fleet f;
    fleet_start(&f, base);
    fresh(org, sizeof org, "org");
    snprintf(key, sizeof key, "rl:org:%s", org);
    cr_assert_eq(check(f.agents[0], "org", org).rule[0], '\0',
                 "a rule applied to an org before the reload");

    char name[64];
    snprintf(name, sizeof name, "added-%d", (int)getpid());
    rl_nng_sub sub;
    subscribe(&sub, &f.agg, name);
    snprintf(rules, sizeof rules, "%s%s", base, added);
    reload_all(&f, rules);
    offered o = offer(&f, "org", org, 2000);
    fprintf(stderr, "aggregator reload: added rule, limit %d, offered %ld: "
            "admitted %ld (%ld, %ld)\n", LIMIT, o.checks, o.admitted_sum,
            o.admitted[0], o.admitted[1]);
    cr_expect_geq(o.admitted_sum, LIMIT);
    cr_expect_leq(o.admitted_sum, 2 * (LIMIT + N_AGENTS),
                  "over the synced bound 2 x (limit + agents)");
    for (int i = 0; i < N_AGENTS; i++)
        cr_expect_gt(o.admitted[i], 0, "agent %d admitted nothing", i);
    expect_redis_total_stays(key, o.admitted_sum);
    expect_broadcast(sub.sock, org, o.admitted_sum);
    unsubscribe(&sub);
    fleet_stop(&f);
    cr_assert_eq(count_lines(f.agg.log, "event=report_rejected"), 0,
                 "see %s", f.agg.log);
}

/* --- (2) A synced rule removed stops; no other count is lost. -----------
 * The aggregator reloads first: the agents, not reloaded yet, go on
 * counting the removed rule next to the kept one, in the same reports.
 * Those reports must still be applied for the kept rule (an agent resends
 * a refused report forever: every count behind it would be stuck), and
 * the removed rule's counts must not be added any more. */

Test(aggregator_reload, a_removed_synced_rule_stops_and_no_other_count_is_lost)
{
    char keep[128], gone[128], both[300], tenant[96], org[96];
    char tkey[160], okey[160];
    snprintf(keep, sizeof keep,
             "  - {name: keep-%d, match: tenant, limit: 1000000000, "
             "period: " PERIOD ", mode: synced}\n", (int)getpid());
    snprintf(gone, sizeof gone,
             "  - {name: gone-%d, match: org, limit: 1000000000, "
             "period: " PERIOD ", mode: synced}\n", (int)getpid());
    snprintf(both, sizeof both, "%s%s", keep, gone);
    fleet f;
    fleet_start(&f, both);
    fresh(tenant, sizeof tenant, "t");
    fresh(org, sizeof org, "o");
    snprintf(tkey, sizeof tkey, "rl:tenant:%s", tenant);
    snprintf(okey, sizeof okey, "rl:org:%s", org);
    long tenant_admitted = 0, org_counted = 0;
    rl_attr attrs[2] = {{"tenant", tenant, strlen(tenant)},
                        {"org", org, strlen(org)}};
    for (int n = 0; n < 30; n++) {
        rl_decision d;
        cr_assert_eq(rl_check(f.agents[n % N_AGENTS], attrs, 2, 1, &d),
                     RL_OK);
        cr_assert(d.allowed);
        tenant_admitted++;
        org_counted++;
    }
    expect_redis_total(okey, org_counted, 5000);

    write_rules(&f.agg, keep);
    hup(&f.agg);
    /* The agents still have both rules: their next reports carry both. */
    for (int n = 0; n < 40; n++) {
        rl_decision d;
        cr_assert_eq(rl_check(f.agents[n % N_AGENTS], attrs, 2, 1, &d),
                     RL_OK);
        cr_assert(d.allowed);
        tenant_admitted++;
    }
    expect_redis_total(tkey, tenant_admitted, 5000);
    /* A report of the removed rule's counts alone: answered, its counts
     * refused (the report refused whole, the agent would resend it
     * forever, its later counts behind it). */
    for (int n = 0; n < 10; n++)
        cr_assert(check(f.agents[0], "org", org).allowed);
    test_sleep_ms(3 * INTERVAL_MS);
    for (int i = 0; i < N_AGENTS; i++) {
        rl_error err;
        cr_assert_eq(rl_agent_reload(f.agents[i], f.agg.config, &err), RL_OK,
                     "%s", err.message);
    }
    for (int n = 0; n < 20; n++) {
        rl_decision d;
        cr_assert_eq(rl_check(f.agents[n % N_AGENTS], attrs, 2, 1, &d),
                     RL_OK);
        cr_assert(d.allowed);
        tenant_admitted++;
    }
    expect_redis_total_stays(tkey, tenant_admitted);
    /* Not one count of the removed rule was added after the reload. */
    expect_redis_total_stays(okey, org_counted);
    fleet_stop(&f);
    cr_assert_eq(count_lines(f.agg.log, "event=report_rejected"), 0,
                 "reports refused; see %s", f.agg.log);
    cr_assert_eq(count_lines(f.agg.log, "level=error"), 0, "see %s",
                 f.agg.log);
    cr_assert_gt(count_lines(f.agg.log, "event=counts_refused"), 0,
                 "see %s", f.agg.log);
    cr_assert_eq(count_lines(f.agg.log, "level=warn"),
                 count_lines(f.agg.log, "event=counts_refused"), "see %s",
                 f.agg.log);
}

/* --- (3) A changed limit applies within the synced bound. ---------------
 * 1,000 at first; a few requests; then 50. Offered 10 x the new limit per
 * agent for two seconds, the two agents admit in the window (the
 * requests before the reload included) at most 2 x (50 + 2) = 104: under
 * the old limit they would have admitted over 1,000. They admit at least
 * the limit, or, where a stall on a busy machine made a key degraded, the
 * 0.8 of it that on_error: local promises then. */

Test(aggregator_reload, a_changed_limit_applies_within_the_synced_bound)
{
    enum { OLD = 1000, NEW = 50, BEFORE = 10 };
    char rule[160], team[96], key[160];
    const char *fmt = "  - {name: lim-%d, match: team, limit: %d, "
                      "period: " PERIOD ", mode: synced}\n";
    snprintf(rule, sizeof rule, fmt, (int)getpid(), OLD);
    fleet f;
    fleet_start(&f, rule);
    fresh(team, sizeof team, "team");
    snprintf(key, sizeof key, "rl:team:%s", team);
    long admitted = 0;
    for (int n = 0; n < BEFORE; n++)
        admitted += check(f.agents[n % N_AGENTS], "team", team).allowed;
    cr_assert_eq(admitted, BEFORE);
    expect_redis_total(key, BEFORE, 5000);

    snprintf(rule, sizeof rule, fmt, (int)getpid(), NEW);
    reload_all(&f, rule);
    rl_decision d = check(f.agents[0], "team", team);
    cr_assert_eq(d.limit, NEW, "the agent decides with limit %llu",
                 (unsigned long long)d.limit);
    admitted += d.allowed;
    offered o = offer(&f, "team", team, 2000);
    admitted += o.admitted_sum;
    fprintf(stderr, "aggregator reload: limit %d -> %d, offered %ld after: "
            "admitted %ld in the window (%ld, %ld after), %ld degraded\n",
            OLD, NEW, o.checks, admitted, o.admitted[0], o.admitted[1],
            o.degraded);
    cr_expect_geq(admitted, o.degraded > 0 ? NEW * 8 / 10 : NEW,
                  "see %s", f.agg.log);
    cr_expect_leq(admitted, 2 * (NEW + N_AGENTS),
                  "over the synced bound 2 x (limit + agents)");
    expect_redis_total_stays(key, admitted);
    fleet_stop(&f);
}

/* --- (4) Shadow synced rules are summed and never reject. ---------------
 * A shadow rule added by a reload, offered far over its limit: every
 * request is let through, the would-be rejections are named, and Redis
 * holds exactly what the rule counted (what it would have let through:
 * charged as if enforced). Then the same rule enforced by another reload
 * rejects: it was the shadow that held it back, not the limit's absence. */

Test(aggregator_reload, a_shadow_synced_rule_is_summed_and_never_rejects)
{
    enum { LIMIT = 20 };
    char base[160], shadow[200], rules[400], org[96], key[160], name[64];
    snprintf(base, sizeof base,
             "  - {name: base-%d, match: tenant, limit: 1000000000, "
             "period: " PERIOD ", mode: synced}\n", (int)getpid());
    snprintf(name, sizeof name, "shadow-%d", (int)getpid());
    snprintf(shadow, sizeof shadow,
             "  - {name: %s, match: org, limit: %d, period: " PERIOD ", "
             "mode: synced, shadow: true}\n", name, LIMIT);
    fleet f;
    fleet_start(&f, base);
    fresh(org, sizeof org, "org");
    snprintf(key, sizeof key, "rl:org:%s", org);
    rl_nng_sub sub;
    subscribe(&sub, &f.agg, name);
    snprintf(rules, sizeof rules, "%s%s", base, shadow);
    reload_all(&f, rules);

    offered o = offer(&f, "org", org, 1000);
    long counted = o.checks - o.shadow_rejected;
    fprintf(stderr, "aggregator reload: shadow rule, limit %d, offered %ld: "
            "admitted %ld, would have admitted %ld\n", LIMIT, o.checks,
            o.admitted_sum, counted);
    cr_assert_eq(o.admitted_sum, o.checks, "a shadow rule rejected");
    cr_assert_gt(o.shadow_rejected, 0, "no would-be rejection named");
    cr_assert_geq(counted, LIMIT);
    cr_assert_leq(counted, 2 * (LIMIT + N_AGENTS));
    expect_redis_total_stays(key, counted);
    expect_broadcast(sub.sock, org, counted);
    unsubscribe(&sub);

    snprintf(shadow, sizeof shadow,
             "  - {name: %s, match: org, limit: %d, period: " PERIOD ", "
             "mode: synced}\n", name, LIMIT);
    snprintf(rules, sizeof rules, "%s%s", base, shadow);
    reload_all(&f, rules);
    char line[256];
    snprintf(line, sizeof line, "level=info event=reload_change "
             "change=\"rule %s: shadow true -> false\"", name);
    cr_assert(has_line(f.agg.log, line), "no line: %s", line);
    cr_assert_not(check(f.agents[0], "org", org).allowed,
                  "the rule enforced let a request over its limit through");
    fleet_stop(&f);
}

/* --- (5) An invalid file is refused, logged, and the old rules work. ---- */

Test(aggregator_reload, an_invalid_config_is_refused_and_the_old_rules_stay)
{
    char rule[200], bad[400], tenant[96], key[160];
    snprintf(rule, sizeof rule,
             "  - {name: stay-%d, match: tenant, limit: 1000000000, "
             "period: " PERIOD ", mode: synced}\n", (int)getpid());
    fleet f;
    fleet_start(&f, rule);
    fresh(tenant, sizeof tenant, "t");
    snprintf(key, sizeof key, "rl:tenant:%s", tenant);
    /* Valid YAML, a bad rule: an attribute in `when` nothing supplies. */
    snprintf(bad, sizeof bad,
             "%s  - {name: typo-%d, match: org, limit: 5, period: 1m, "
             "mode: synced, when: {metod: POST}}\n", rule, (int)getpid());
    write_rules(&f.agg, bad);
    hup(&f.agg);
    cr_assert_eq(count_lines(f.agg.log, "level=error event=reload_failed "
                             "reason=\""), 1, "see %s", f.agg.log);
    cr_assert_eq(count_lines(f.agg.log, "unknown attribute 'metod' in "
                             "when"), 1, "the reason is not the config "
                             "error; see %s", f.agg.log);
    cr_assert_eq(count_lines(f.agg.log, "\" kept=old"), 1, "see %s",
                 f.agg.log);
    cr_assert_eq(count_lines(f.agg.log, "event=reloaded"), 0);
    cr_assert_eq(count_lines(f.agg.log, "event=reload_change"), 0);
    /* The agents refuse the same file with the same message. */
    rl_error err;
    cr_assert_eq(rl_agent_reload(f.agents[0], f.agg.config, &err),
                 RL_ECONFIG);
    cr_assert_not_null(strstr(err.message, "unknown attribute 'metod'"),
                       "%s", err.message);

    offered o = offer(&f, "tenant", tenant, 300);
    cr_assert_eq(o.admitted_sum, o.checks);
    expect_redis_total_stays(key, o.admitted_sum);
    fleet_stop(&f);
    cr_assert_eq(count_lines(f.agg.log, "event=report_rejected"), 0,
                 "the old rule was dropped; see %s", f.agg.log);
}

/* --- (6) The log names every change, as aggregator/main.c writes it. ---- */

Test(aggregator_reload, the_log_names_each_change)
{
    int pid = (int)getpid();
    char before[800], after[800], line[300];
    snprintf(before, sizeof before,
             "  - {name: lim-%d, match: tenant, limit: 1000, period: 1m, "
             "mode: synced}\n"
             "  - {name: sh-%d, match: team, limit: 10, period: 1m, "
             "mode: synced}\n"
             "  - {name: gone-%d, match: org, limit: 10, period: 1m, "
             "mode: synced}\n"
             "  - {name: ex-%d, match: ip, limit: 10, period: 1s}\n",
             pid, pid, pid, pid);
    snprintf(after, sizeof after,
             "  - {name: lim-%d, match: tenant, limit: 500, period: 1m, "
             "mode: synced}\n"
             "  - {name: sh-%d, match: team, limit: 10, period: 1m, "
             "mode: synced, shadow: true}\n"
             "  - {name: ex-%d, match: ip, limit: 10, period: 1s}\n"
             "  - {name: new-%d, match: region, limit: 100, period: 1h, "
             "mode: synced, shadow: true}\n",
             pid, pid, pid, pid);
    test_aggregator agg;
    test_aggregator_start(&agg, NULL, before, INTERVAL_MS, NULL);
    write_rules(&agg, after);
    hup(&agg);
    const char *fmt[] = {
        "level=info event=reload_change change=\"rule lim-%d: limit 1000 "
        "-> 500\"",
        /* burst defaults to the limit: it changed too */
        "level=info event=reload_change change=\"rule lim-%d: burst 1000 "
        "-> 500\"",
        "level=info event=reload_change change=\"rule sh-%d: shadow false "
        "-> true\"",
        "level=info event=reload_change change=\"rule new-%d added: region, "
        "100 per 1h, synced, shadow\"",
        "level=info event=reload_change change=\"rule gone-%d removed\"",
    };
    for (size_t i = 0; i < sizeof fmt / sizeof fmt[0]; i++) {
        snprintf(line, sizeof line, fmt[i], pid);
        cr_assert(has_line(agg.log, line), "no line: %s; see %s", line,
                  agg.log);
    }
    cr_assert_eq(count_lines(agg.log, "event=reload_change"), 5,
                 "an unchanged rule was named; see %s", agg.log);
    cr_assert(has_line(agg.log, "level=info event=reloaded rules=4 synced=3 "
                                "added=1 removed=1 changed=2"),
              "see %s", agg.log);
    /* Nothing changed: a summary and no change line. */
    hup(&agg);
    cr_assert_eq(count_lines(agg.log, "event=reload_change"), 5);
    cr_assert(has_line(agg.log, "level=info event=reloaded rules=4 synced=3 "
                                "added=0 removed=0 changed=0"),
              "see %s", agg.log);
    test_aggregator_stop(&agg);
}

/* --- A reload keeps each kept rule's agent count in the totals. ---------
 * A totals message with no change for a rule still carries its agent
 * count, by which agents split the room (ceil(room / agents)); one saying
 * 0 would give every agent the whole room (docs/design.md, "Shares, not
 * the whole limit"). Agents report their presence every interval, which
 * would set the count again at once; so the agents close before the
 * reload, and the heartbeats after it carry only what the aggregator
 * knew before it: the count their goodbyes left but the last one's (which
 * leaves the count last known, as 0 would say not known). */

Test(aggregator_reload, the_agent_count_survives_a_reload)
{
    char rule[200], name[64], tenant[96], key[160];
    snprintf(name, sizeof name, "count-%d", (int)getpid());
    snprintf(rule, sizeof rule,
             "  - {name: %s, match: tenant, limit: 1000, period: " PERIOD
             ", mode: synced}\n", name);
    fleet f;
    fleet_start(&f, rule);
    fresh(tenant, sizeof tenant, "t");
    snprintf(key, sizeof key, "rl:tenant:%s", tenant);
    for (int i = 0; i < N_AGENTS; i++)
        cr_assert(check(f.agents[i], "tenant", tenant).allowed);
    expect_redis_total(key, N_AGENTS, 5000);
    rl_nng_sub sub;
    subscribe(&sub, &f.agg, name);
    /* Past the totals that carried the counts: heartbeats now. */
    totals x = next_totals(sub.sock, 2000);
    cr_assert_eq(x.t.type, RL_WIRE_TOTALS, "no totals for %s", name);
    totals_free(&x);
    for (int k = 0; k < 3; k++) {
        x = next_totals(sub.sock, 2000);
        cr_assert_eq(x.t.agents, N_AGENTS, "before the reload: %llu agents",
                     (unsigned long long)x.t.agents);
        totals_free(&x);
    }
    for (int i = 0; i < N_AGENTS; i++) {
        rl_agent_close(f.agents[i]);
        f.agents[i] = NULL;
    }
    /* The closing agents' last reports and goodbyes are in: within two
     * totals as a rule, a few more when a sanitizer slows the closes
     * (how soon a goodbye counts is live_agents' to test). */
    uint64_t known = N_AGENTS;
    for (int k = 0; k < 10 && known != 1; k++) {
        x = next_totals(sub.sock, 2000);
        known = x.t.agents;
        totals_free(&x);
    }
    cr_assert_eq(known, 1, "after the goodbyes: %llu agents",
                 (unsigned long long)known);
    write_rules(&f.agg, rule);
    hup(&f.agg);
    for (int k = 0; k < 3; k++) {
        x = next_totals(sub.sock, 2000);
        cr_assert_eq(x.t.type, RL_WIRE_TOTALS, "no totals after the reload");
        cr_assert_eq(x.t.agents, known, "totals %d after the reload say "
                     "%llu agents", k, (unsigned long long)x.t.agents);
        totals_free(&x);
    }
    unsubscribe(&sub);
    fleet_stop(&f);
}

/* --- Totals noted before a reload are published, not dropped. -----------
 * The aggregator keeps the totals it will publish by rule index in the
 * old config; a reload publishes them before switching tables. With a
 * long interval, an agent's report (sent at an interval's start) is noted
 * well before the next publish (in its middle): a SIGHUP right after the
 * report reached Redis comes before that publish, and the totals must
 * still go out. The other agents learn a key's totals only so. */

Test(aggregator_reload, totals_noted_before_a_reload_are_published)
{
    enum { SLOW_INTERVAL_MS = 2000, N = 25 };
    char rule[200], name[64], tenant[96], key[160];
    snprintf(name, sizeof name, "noted-%d", (int)getpid());
    snprintf(rule, sizeof rule,
             "  - {name: %s, match: tenant, limit: 1000000, period: " PERIOD
             ", mode: synced}\n", name);
    test_aggregator agg;
    test_aggregator_start(&agg, NULL, rule, SLOW_INTERVAL_MS, NULL);
    test_aggregator_wait_ready(&agg);
    rl_config *cfg;
    rl_agent *a = test_synced_agent(&agg, &cfg);
    fresh(tenant, sizeof tenant, "t");
    snprintf(key, sizeof key, "rl:tenant:%s", tenant);
    rl_nng_sub sub;
    subscribe(&sub, &agg, name);
    for (int n = 0; n < N; n++)
        cr_assert(check(a, "tenant", tenant).allowed);
    uint64_t start = test_now_ms();
    while (redis_total(key) != N) {
        cr_assert_lt(test_now_ms() - start, 5000, "no report in 5 s");
        test_sleep_ms(10);
    }
    /* The same file: a reload that changes nothing but the tables. */
    cr_assert_eq(kill(agg.pid, SIGHUP), 0);
    expect_broadcast(sub.sock, tenant, N);
    unsubscribe(&sub);
    test_wait_for_log(&agg.pid, agg.log, "event=reloaded ", 5000);
    rl_agent_close(a);
    rl_config_free(cfg);
    test_aggregator_stop(&agg);
}

/* --- aggregator.* is not reloaded (docs/operations.md). -----------------
 * A file that lowers max_entries to 1 is taken for its rules only: the agents keep their settings too, and go on
 * sending reports of several entries, which must still be applied. */

Test(aggregator_reload, aggregator_settings_are_not_reloaded)
{
    enum { TENANTS = 6 };
    char rule[200], tenants[TENANTS][96], key[640];
    snprintf(rule, sizeof rule,
             "  - {name: settings-%d, match: tenant, limit: 1000000, "
             "period: " PERIOD ", mode: synced}\n", (int)getpid());
    fleet f;
    fleet_start(&f, rule);
    write_config(&f.agg, "  max_entries: 1\n", rule);
    hup(&f.agg);
    cr_assert_eq(count_lines(f.agg.log, "event=reload_failed"), 0);
    for (int i = 0; i < TENANTS; i++) {
        fresh(tenants[i], sizeof tenants[i], "t");
        for (int n = 0; n <= i; n++)
            cr_assert(check(f.agents[0], "tenant", tenants[i]).allowed);
    }
    for (int i = 0; i < TENANTS; i++) {
        snprintf(key, sizeof key, "rl:tenant:%s", tenants[i]);
        expect_redis_total(key, i + 1, 3000);
    }
    fleet_stop(&f);
    cr_assert_eq(count_lines(f.agg.log, "event=report_rejected"), 0,
                 "see %s", f.agg.log);
}

/* === Synced rules through reloads, whatever side reloads first. ========
 * A rule of 100 per period, 50 of it spent; then its period, or its limit,
 * changes on the aggregator and on both agents, one side a moment (half a
 * second of load) before the other, and the load goes on. The sub-windows
 * both sides number by the period must be read in the period that
 * numbered them: the agents renumber the totals they hold, an agent takes
 * no totals of another period (nor gives shares from the ones it holds
 * while acknowledgements come), and the aggregator renumbers each hash in
 * Redis (window_call.c). Before, each side read the other's numbers in its
 * own period: the agents took fresh shares from totals that never moved
 * again, and admitted everything. */

/* SLACK: what the agents may admit over a bound, a tenth of the limit
 * (shares given as reports arrive late on a loaded machine; a sanitizer
 * build's run admitted 5). Before, the same runs admitted 100 to 650 over
 * the bounds. make tsan's aggregator, as CI runs it, admitted 12 and 13
 * over in the lower-limit case, aggregator first: the sanitizer builds
 * take a sixth of the limit. */
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
enum { SPENT = 50, GAP_MS = 500, SLACK = 16 };
#else
enum { SPENT = 50, GAP_MS = 500, SLACK = 10 };
#endif

typedef struct rule_change {
    const char *name;           /* the rule's, "%d" for the pid */
    const char *before, *after; /* rule lines, "%d" for the pid */
    bool agents_first;
    unsigned after_ms;          /* load once both have reloaded */
    /* Not 0: that load ends within_ms after the first of the 50 was
     * spent, while the 50 are still in every span it offers in. */
    unsigned within_ms;
    /* Then load again for later_ms from later_at_ms after the 50 were
     * spent (0: not). */
    unsigned later_at_ms, later_ms;
} rule_change;

typedef struct change_seen {
    long gap;    /* admitted while one side had reloaded */
    long after;  /* admitted after_ms once both had */
    long later;  /* and later */
} change_seen;

static void agents_reload(fleet *f)
{
    for (int i = 0; i < N_AGENTS; i++) {
        rl_error err;
        cr_assert_eq(rl_agent_reload(f->agents[i], f->agg.config, &err),
                     RL_OK, "%s", err.message);
    }
}

/* How long the load after both reloads may last: c->after_ms, cut to
 * end c->within_ms after spending (a loaded machine's reloads and waits
 * can take most of a period); at least 200 ms of it, or the test ran
 * late. */
static unsigned load_within(const rule_change *c, uint64_t spending)
{
    uint64_t now = test_now_ms(), end = spending + c->within_ms;
    if (c->within_ms == 0)
        return c->after_ms;
    cr_assert_gt(end, now + 200, "the test ran late: %llu ms after the 50",
                 (unsigned long long)(now - spending));
    return now + c->after_ms > end ? (unsigned)(end - now) : c->after_ms;
}

static change_seen change_rule(const rule_change *c, const char *what)
{
    char before[200], after[200], name[64], tenant[96], key[160];
    snprintf(before, sizeof before, c->before, (int)getpid());
    snprintf(after, sizeof after, c->after, (int)getpid());
    snprintf(name, sizeof name, c->name, (int)getpid());
    /* An aggregator slow to reload (a sanitizer's build on a loaded
     * machine) does not make the agents' keys degraded: what is tested is
     * the reload, not on_error. */
    fleet f;
    fleet_start_with(&f, "  stale_after_ms: 3000\n", before);
    rl_nng_sub sub;
    subscribe(&sub, &f.agg, name);
    fresh(tenant, sizeof tenant, "t");
    snprintf(key, sizeof key, "rl:tenant:%s", tenant);
    uint64_t spending = test_now_ms();
    for (int n = 0; n < SPENT; n++)
        cr_assert(check(f.agents[n % N_AGENTS], "tenant", tenant).allowed);
    uint64_t spent_at = test_now_ms();
    expect_redis_total(key, SPENT, 5000);
    /* The agents hear the totals of the 50 (the same message, and a
     * moment to take it, on a slow machine too). */
    expect_broadcast(sub.sock, tenant, SPENT);
    unsubscribe(&sub);
    test_sleep_ms(2 * INTERVAL_MS);
    write_rules(&f.agg, after);
    if (c->agents_first)
        agents_reload(&f);
    else
        hup(&f.agg);
    change_seen seen = {.gap = offer(&f, "tenant", tenant, GAP_MS)
                                   .admitted_sum};
    if (c->agents_first)
        hup(&f.agg);
    else
        agents_reload(&f);
    unsigned after_ms = load_within(c, spending);
    seen.after = offer(&f, "tenant", tenant, after_ms).admitted_sum;
    if (c->later_ms > 0) {
        uint64_t now = test_now_ms();
        cr_assert_lt(now, spent_at + c->later_at_ms, "the test ran late");
        test_sleep_ms((unsigned)(spent_at + c->later_at_ms - now));
        seen.later = offer(&f, "tenant", tenant, c->later_ms).admitted_sum;
    }
    fprintf(stderr, "synced reload: %s, %s first: %d spent, then %ld "
            "admitted in %d ms while one side had reloaded, %ld in %u ms "
            "after, %ld in %u ms from %u ms after the 50\n", what,
            c->agents_first ? "agents" : "aggregator", SPENT, seen.gap,
            GAP_MS, seen.after, after_ms, seen.later, c->later_ms,
            c->later_at_ms);
    fleet_stop(&f);
    cr_assert_eq(count_lines(f.agg.log, "event=reload_failed"), 0,
                 "see %s", f.agg.log);
    return seen;
}

/* 1 s -> 2 s: the 50 spent stay in the span until 2 s after, so at most
 * the 50 left are admitted until then (the load stops under 2 s after).
 * Once they have left (2.4 s after), room comes back: at least 40 in the
 * second after, where a limit stuck at no room gives none. */
static void longer_period(bool agents_first)
{
    rule_change c = {
        .name = "longer-%d",
        .before = "  - {name: longer-%d, match: tenant, limit: 100, "
                  "period: 1s, mode: synced}\n",
        .after = "  - {name: longer-%d, match: tenant, limit: 100, "
                 "period: 2s, mode: synced}\n",
        .agents_first = agents_first, .after_ms = 600,
        .later_at_ms = 2400, .later_ms = 1000};
    change_seen seen = change_rule(&c, "period 1 s -> 2 s");
    long total = seen.gap + seen.after;
    cr_expect_leq(total, 100 - SPENT + SLACK,
                  "%ld admitted over the 50 left in the span", total);
    cr_expect_geq(total, 100 - SPENT - 10, "the 50 left were not given");
    cr_expect_geq(seen.later, 40, "no room came back: %ld", seen.later);
}

Test(synced_reload, a_longer_period_keeps_the_count_agents_first)
{
    longer_period(true);
}

Test(synced_reload, a_longer_period_keeps_the_count_aggregator_first)
{
    longer_period(false);
}

/* 4 s -> 1 s: the 50 spent were made within the second before the gap, so
 * any span of the new period that holds them and the gap admits at most
 * 50 more in it; once they have left, 100 per second come back (at least
 * 150 in the 2.5 s after: not stuck), and no more than three spans'
 * limits, the shares' rounding and SLACK (a limit stuck at the old
 * period's counts admits thousands; make tsan, six tests at a time,
 * admitted 320: totals come late on a machine that loaded). */
static void shorter_period(bool agents_first)
{
    rule_change c = {
        .name = "shorter-%d",
        .before = "  - {name: shorter-%d, match: tenant, limit: 100, "
                  "period: 4s, mode: synced}\n",
        .after = "  - {name: shorter-%d, match: tenant, limit: 100, "
                 "period: 1s, mode: synced}\n",
        .agents_first = agents_first, .after_ms = 2500};
    change_seen seen = change_rule(&c, "period 4 s -> 1 s");
    cr_expect_leq(seen.gap, 100 - SPENT + SLACK,
                  "%ld admitted in the second of the 50 spent", seen.gap);
    cr_expect_geq(seen.after, 150, "the new period's limit was not given");
    cr_expect_leq(seen.after, 3 * (100 + 2 * N_AGENTS) + SLACK,
                  "%ld admitted in 2.5 s", seen.after);
}

Test(synced_reload, a_shorter_period_keeps_the_count_agents_first)
{
    shorter_period(true);
}

Test(synced_reload, a_shorter_period_keeps_the_count_aggregator_first)
{
    shorter_period(false);
}

/* 100 -> 60 per 4 s with 50 spent: 10 more at most while they are in the
 * span, once the agents have the new limit (before, theirs is 100, and
 * the aggregator's is never the one that decides). The load stops half a
 * second before the 50 could leave: the steps before it take about 2 s,
 * and under TSan beside other tests they took over 2 s (a period of 2 s
 * then let 43 in as the 50 left). */
static void lower_limit(bool agents_first)
{
    rule_change c = {
        .name = "lower-%d",
        .before = "  - {name: lower-%d, match: tenant, limit: 100, "
                  "period: 4s, mode: synced}\n",
        .after = "  - {name: lower-%d, match: tenant, limit: 60, "
                 "period: 4s, mode: synced}\n",
        .agents_first = agents_first, .after_ms = 800, .within_ms = 3500};
    change_seen seen = change_rule(&c, "limit 100 -> 60 per 4 s");
    long total = seen.gap + seen.after;
    cr_expect_leq(total, (agents_first ? 60 : 100) - SPENT + SLACK,
                  "%ld admitted", total);
}

Test(synced_reload, a_lower_limit_keeps_the_count_agents_first)
{
    lower_limit(true);
}

Test(synced_reload, a_lower_limit_keeps_the_count_aggregator_first)
{
    lower_limit(false);
}

/* A synced rule the aggregator no longer has (removed there, the agents
 * not reloaded yet): its counts are refused, not acknowledged as counted;
 * the agents log why and decide by on_error (deny here: nothing admitted
 * once the refusal is heard), and the kept rule's counts still arrive. */
Test(synced_reload, a_rule_removed_on_the_aggregator_is_refused_and_on_error_decides)
{
    char keep[160], gone[160], both[320], tenant[96], org[96], tkey[160];
    char okey[160];
    snprintf(keep, sizeof keep,
             "  - {name: kept-%d, match: tenant, limit: 1000000, "
             "period: 2s, mode: synced}\n", (int)getpid());
    snprintf(gone, sizeof gone,
             "  - {name: dropped-%d, match: org, limit: 100, period: 2s, "
             "mode: synced, on_error: deny}\n", (int)getpid());
    snprintf(both, sizeof both, "%s%s", keep, gone);
    fleet f;
    fleet_start(&f, both);
    fresh(tenant, sizeof tenant, "t");
    fresh(org, sizeof org, "o");
    snprintf(tkey, sizeof tkey, "rl:tenant:%s", tenant);
    snprintf(okey, sizeof okey, "rl:org:%s", org);
    for (int n = 0; n < 10; n++)
        cr_assert(check(f.agents[n % N_AGENTS], "org", org).allowed);
    expect_redis_total(okey, 10, 5000);
    write_rules(&f.agg, keep);
    hup(&f.agg);
    /* Counts the aggregator no longer takes. Whether a check is admitted
     * races the refusal, and under the sanitizers a stale link (a stall of
     * three intervals) denies it, which counts nothing to refuse: each
     * agent checks until it says its counts were refused. */
    for (int i = 0; i < N_AGENTS; i++) {
        bool said = false;
        for (int tries = 0; tries < 20 && !said; tries++) {
            check(f.agents[i], "org", org);
            said = test_log_wait(&agent_logs[i], "event=synced_refused",
                                 "on_error=deny", 250);
        }
        cr_assert(said, "agent %d did not say its counts were refused", i);
    }
    /* The next tick degrades the rule's keys. */
    test_sleep_ms(2 * INTERVAL_MS);
    long admitted = 0, degraded = 0, tenants = 0;
    for (int n = 0; n < 40; n++) {
        rl_decision d = check(f.agents[n % N_AGENTS], "org", org);
        admitted += d.allowed;
        degraded += d.degraded;
        tenants += check(f.agents[n % N_AGENTS], "tenant", tenant).allowed;
    }
    fprintf(stderr, "synced reload: rule removed on the aggregator, "
            "on_error deny: %ld of 40 admitted, %ld degraded\n", admitted,
            degraded);
    cr_expect_eq(admitted, 0, "the refused rule admitted %ld", admitted);
    cr_expect_eq(degraded, 40);
    expect_redis_total_stays(tkey, tenants);
    expect_redis_total_stays(okey, 10);
    /* The rule is said degraded once, with the reason of that moment:
     * the refusal's, or under load a link's stall or its keys' totals
     * stopping, if one came first (TSan, four tests at a time); the
     * refusal has its own line above. */
    char rule[64];
    snprintf(rule, sizeof rule, "rule=dropped-%d ", (int)getpid());
    for (int i = 0; i < N_AGENTS; i++)
        cr_assert(test_log_wait(&agent_logs[i], "event=synced_degraded",
                                rule, 100), "agent %d said nothing of %s:\n%s",
                  i, rule, agent_logs[i].text);
    fleet_stop(&f);
}
