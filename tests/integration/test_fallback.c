/*
 * on_error: local against a real redis-server that goes away: ten agents
 * (each its own I/O thread and connection) hold the fleet near the limit
 * while Redis is down, answer within the deadline, and go back to the
 * shared bucket when it returns; a silent Redis (SIGSTOP) falls back at
 * the deadline; the warning for a rule that says no fleet_size. Every test
 * uses a private redis-server, as it kills or stops it.
 */
#include "config.h"
#include "redis_server.h"
#include "test_agent.h"
#include "test_aggregator.h"
#include "test_env.h"
#include "test_gateway.h"

#include <criterion/criterion.h>
#include <semaphore.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define DEADLINE_MS 50

static void private_redis(test_redis *srv, char *addr, size_t cap)
{
    char err[512];
    test_redis_options o = {0};
    cr_assert_eq(test_redis_start(srv, test_env("RL_TEST_TMPDIR"), &o, err,
                                  sizeof err), 0, "%s", err);
    snprintf(addr, cap, "127.0.0.1:%u", srv->port);
}

static rl_decision timed_check(test_agent *t, const char *attr,
                               uint64_t *took_us)
{
    uint64_t start = test_now_us();
    rl_decision d = test_check(t, attr, NULL);
    *took_us = test_now_us() - start;
    return d;
}

/* Waits until a check of attr on t is answered by the store again. */
static rl_decision until_answered(test_agent *t, const char *attr)
{
    uint64_t since = test_now_ms(), us;
    rl_decision d;
    while ((d = timed_check(t, attr, &us)).degraded) {
        cr_assert_lt(test_now_ms() - since, 3000, "%s: still degraded 3 s "
                     "after Redis came back", attr);
        test_sleep_ms(10);
    }
    return d;
}

/* --- The test: ten agents, Redis down for 20 s, 2x the limit. -- */

#define AGENTS 10
#define LIMIT 200
#define PERIOD_S 5
#define OUTAGE_S 20
/* Twice the limit, round-robin over the agents. */
#define OFFERED (2 * LIMIT * OUTAGE_S / PERIOD_S)

/* Each agent's fallback bucket is the rule's share: 200 per 5 s among
 * fleet_size 10 is 20 per 5 s with a burst of 20, full when the outage
 * starts. Over 20 s, four whole periods, the fleet admits the limit per
 * period plus the burst: 200 x 4 + 200 = 1,000 of the 1,600 offered;
 * every agent alone at the whole limit would admit all 1,600, and
 * on_error: deny none. Held to +-20 %. */
Test(fallback, ten_agents_admit_the_limit_while_redis_is_down)
{
    test_redis srv;
    char addr[64];
    private_redis(&srv, addr, sizeof addr);
    static test_agent agents[AGENTS];
    for (int i = 0; i < AGENTS; i++)
        test_agent_open(&agents[i], addr, TEST_FCALL, "  timeout_ms: 50\n",
                        NULL,
                        "  - {name: per-key, match: api_key, limit: 200, "
                        "period: 5s, on_error: local, fleet_size: 10}\n"
                        "  - {name: per-ip, match: ip, limit: 1000, "
                        "period: 1s, on_error: deny}\n"
                        "  - {name: per-tenant, match: tenant, limit: 1, "
                        "period: 1h, on_error: allow}\n");
    uint64_t us;
    rl_decision d = timed_check(&agents[0], "api_key=k", &us);
    cr_assert(d.allowed && !d.degraded);

    test_sched_probe probe;
    test_sched_probe_start(&probe);
    test_redis_kill(&srv);
    uint64_t start = test_now_us(), slowest = 0, waited = 0;
    int admitted = 0;
    for (int i = 0; i < OFFERED; i++) {
        uint64_t due = start + (uint64_t)i * OUTAGE_S * 1000000 / OFFERED;
        uint64_t now = test_now_us();
        if (due > now)
            test_sleep_ms((unsigned)((due - now) / 1000));
        d = timed_check(&agents[i % AGENTS], "api_key=k", &us);
        cr_assert(d.degraded, "check %d was not degraded with Redis down",
                  i);
        cr_assert_str_eq(d.rule, "per-key");
        cr_assert_eq(d.limit, LIMIT, "the rule's limit, not the share's");
        admitted += d.allowed;
        slowest = us > slowest ? us : slowest;
        waited += us;
    }
    uint64_t span_ms = (test_now_us() - start) / 1000;
    /* on_error: deny and allow are what they were. */
    d = timed_check(&agents[3], "ip=1.2.3.4", &us);
    cr_assert(d.degraded && !d.allowed, "on_error: deny let one through");
    cr_assert_eq(d.retry_after_ms, 1000);
    d = timed_check(&agents[4], "tenant=t", &us);
    cr_assert(d.degraded && d.allowed, "on_error: allow rejected one");
    uint64_t overslept = test_sched_probe_stop(&probe);

    int expected = LIMIT * OUTAGE_S / PERIOD_S + LIMIT;
    fprintf(stderr, "fallback: Redis down %llu ms: %d of %d admitted by ten "
            "agents (expected %d, limit %d per %d s), slowest check %llu us, "
            "mean %llu us (deadline %d ms, the probe overslept %llu us)\n",
            (unsigned long long)span_ms, admitted, OFFERED, expected, LIMIT,
            PERIOD_S, (unsigned long long)slowest,
            (unsigned long long)(waited / OFFERED), DEADLINE_MS,
            (unsigned long long)overslept);
    cr_assert_geq(admitted * 10, expected * 8, "admitted %d, expected %d "
                  "- 20 %%", admitted, expected);
    cr_assert_leq(admitted * 10, expected * 12, "admitted %d, expected %d "
                  "+ 20 %%", admitted, expected);
    cr_assert_leq(slowest, test_deadline_latest_us(DEADLINE_MS, overslept),
                  "a check took %llu us with Redis down",
                  (unsigned long long)slowest);

    /* Each agent counted its fallback's decisions. */
    uint64_t fb_allowed = 0, fb_rejected = 0, fb_keys = 0;
    for (int i = 0; i < AGENTS; i++) {
        rl_agent_counters c;
        rl_rule_counters rules[3];
        cr_assert_eq(rl_agent_stats(agents[i].agent, &c, rules, 3), RL_OK);
        fb_allowed += rules[0].fallback_allowed;
        fb_rejected += rules[0].fallback_rejected;
        fb_keys += c.fallback_keys;
        cr_assert_eq(rules[1].fallback_allowed + rules[1].fallback_rejected,
                     0, "on_error: deny counted as a fallback");
    }
    cr_assert_eq(fb_allowed, (uint64_t)admitted);
    cr_assert_eq(fb_rejected, (uint64_t)(OFFERED - admitted));
    cr_assert_eq(fb_keys, AGENTS, "one fallback bucket per agent");

    /* Redis is back (empty: no persistence): every agent goes to the
     * shared bucket again, whose 200 tokens its remaining shows (a
     * fallback bucket holds 20 at most), and the key is charged. */
    char err[512];
    cr_assert_eq(test_redis_restart(&srv, err, sizeof err), 0, "%s", err);
    for (int i = 0; i < AGENTS; i++) {
        d = until_answered(&agents[i], "api_key=k");
        cr_assert(d.allowed);
    }
    uint64_t back = test_now_ms();
    for (int i = 0; i < 4 * AGENTS; i++) {
        d = timed_check(&agents[i % AGENTS], "api_key=k", &us);
        cr_assert(!d.degraded && d.allowed, "check %d after the return", i);
        cr_assert_gt(d.remaining, 20, "remaining %llu: not the shared "
                     "bucket", (unsigned long long)d.remaining);
    }
    /* 50 tokens of 200 per 5 s spent: the key lives until they refill
     * (25 ms each), 1,250 ms less what has passed since. */
    long long ms = test_redis_pttl(addr, "rl:key:k");
    uint64_t since = test_now_ms() - back;
    cr_assert_gt(ms, 1000 - (long long)since, "PTTL %lld ms after %llu ms: "
                 "the shared bucket was not charged", ms,
                 (unsigned long long)since);
    cr_assert_leq(ms, 1250);
    for (int i = 0; i < AGENTS; i++)
        test_agent_close(&agents[i]);
    test_redis_stop(&srv);
}

/* --- A silent Redis: the fallback decides at the deadline. ------------ */

/* SIGSTOP: the connection stays open and nothing answers, so each check
 * waits its deadline, then its fallback bucket decides: 100 per 10 s
 * among 10 is 10 tokens, refilling one a second. Fifteen checks inside
 * a second: the first ten pass, the rest wait about a second. */
TEST_BOTH_MODES(fallback, a_silent_redis_falls_back_at_the_deadline)
{
    test_redis srv;
    char addr[64];
    private_redis(&srv, addr, sizeof addr);
    test_agent t;
    test_agent_open(&t, addr, mode, "  timeout_ms: 50\n", NULL,
                    "  - {name: per-key, match: api_key, limit: 100, "
                    "period: 10s, on_error: local, fleet_size: 10}\n");
    uint64_t us, slowest = 0;
    cr_assert(!timed_check(&t, "api_key=quiet", &us).degraded);

    test_sched_probe probe;
    test_sched_probe_start(&probe);
    test_redis_pause(&srv);
    uint64_t start = test_now_ms();
    int admitted = 0;
    rl_decision d;
    for (int i = 0; i < 15; i++) {
        d = timed_check(&t, "api_key=quiet", &us);
        cr_assert(d.degraded, "check %d answered by a stopped Redis", i);
        slowest = us > slowest ? us : slowest;
        admitted += d.allowed;
    }
    uint64_t took = test_now_ms() - start;
    uint64_t overslept = test_sched_probe_stop(&probe);
    test_redis_resume(&srv);
    fprintf(stderr, "fallback: Redis stopped: %d of 15 admitted in %llu ms, "
            "slowest %llu us\n", admitted, (unsigned long long)took,
            (unsigned long long)slowest);
    /* A token refills every second: one more if the checks took that. */
    cr_assert_geq(admitted, 10);
    cr_assert_leq(admitted, 10 + (int)(took / 1000));
    cr_assert(!d.allowed);
    cr_assert_gt(d.retry_after_ms, 0);
    cr_assert_leq(d.retry_after_ms, 1000);
    cr_assert_leq(slowest, test_deadline_latest_us(DEADLINE_MS, overslept),
                  "a check took %llu us", (unsigned long long)slowest);
    d = until_answered(&t, "api_key=quiet");
    cr_assert_gt(d.remaining, 10, "remaining %llu: not the shared bucket",
                 (unsigned long long)d.remaining);
    test_agent_close(&t);
    test_redis_stop(&srv);
}

/* --- A rule that says no fleet_size. ---------------------------------- */

/* Without fleet_size, and no aggregator to count the agents, the agent
 * says so once per rule and falls back to the whole limit; a rule with
 * fleet_size draws no warning. */
Test(fallback, a_rule_without_fleet_size_is_warned_about_and_gets_all)
{
    test_redis srv;
    char addr[64];
    private_redis(&srv, addr, sizeof addr);
    char yaml[1024];
    int n = snprintf(yaml, sizeof yaml,
                     "store: {url: \"redis://%s\", timeout_ms: 50}\n"
                     "rules:\n"
                     "  - {name: unsized, match: api_key, limit: 30, "
                     "period: 1h, on_error: local}\n"
                     "  - {name: sized, match: ip, limit: 30, "
                     "period: 1h, on_error: local, fleet_size: 3}\n", addr);
    rl_config *cfg;
    rl_error err;
    cr_assert_eq(rl_config_parse(yaml, (size_t)n, "<test>", &cfg, &err),
                 RL_OK, "%s", err.message);
    static test_log log;
    test_log_init(&log);
    rl_options o = {.config = cfg, .log = test_log_capture, .log_arg = &log,
                    .log_level = RL_LOG_DEBUG};
    rl_agent *a;
    cr_assert_eq(rl_agent_open(&a, &o, &err), RL_OK, "%s", err.message);
    cr_assert(test_log_wait(&log, "event=fallback_fleet_unknown",
                            "rule=unsized", 1000));
    test_log_lacks(&log, "rule=sized", "the agent's log");
    test_redis_kill(&srv);
    int unsized = 0, sized = 0;
    for (int i = 0; i < 40; i++) {
        rl_decision d;
        rl_attr key = {"api_key", "k", 1}, ip = {"ip", "1.2.3.4", 7};
        cr_assert_eq(rl_check(a, &key, 1, 1, &d), RL_OK);
        cr_assert(d.degraded);
        unsized += d.allowed;
        cr_assert_eq(rl_check(a, &ip, 1, 1, &d), RL_OK);
        cr_assert(d.degraded);
        sized += d.allowed;
    }
    cr_assert_eq(unsized, 30, "the whole limit without a fleet size");
    cr_assert_eq(sized, 10, "a third of it among fleet_size 3");
    /* Once per rule: a reload that keeps it says nothing new. */
    rl_config *again;
    cr_assert_eq(rl_config_parse(yaml, (size_t)n, "<test>", &again, &err),
                 RL_OK, "%s", err.message);
    cr_assert_eq(rl_agent_reload_config(a, again, &err), RL_OK, "%s",
                 err.message);
    pthread_mutex_lock(&log.lock);
    const char *first = strstr(log.text, "fallback_fleet_unknown");
    bool twice = first != NULL
                 && strstr(first + 1, "fallback_fleet_unknown") != NULL;
    pthread_mutex_unlock(&log.lock);
    cr_assert(!twice, "warned twice about one rule");
    rl_agent_close(a);
    rl_config_free(cfg);
    test_redis_stop(&srv);
}

/* --- rlctl shows it. --------------------------------------------------- */

Test(fallback, rlctl_config_shows_on_error_local_and_fleet_size)
{
    char out[8192];
    const char *path = test_write_config(
        "fallback", "fleet_size: 8\n"
                    "rules:\n"
                    "  - {name: per-key, match: api_key, limit: 100, "
                    "period: 1m, on_error: local}\n"
                    "  - {name: per-ip, match: ip, limit: 100, period: 1m, "
                    "on_error: local, fleet_size: 3}\n"
                    "  - {name: per-route, match: route, limit: 100, "
                    "period: 1m}\n");
    const char *other = test_write_config(
        "fallback-b", "rules:\n"
                      "  - {name: per-key, match: api_key, limit: 100, "
                      "period: 1m, on_error: local, fleet_size: 12}\n"
                      "  - {name: per-ip, match: ip, limit: 100, period: 1m, "
                      "on_error: local, fleet_size: 3}\n"
                      "  - {name: per-route, match: route, limit: 100, "
                      "period: 1m}\n");
    cr_assert_eq(test_rlctl(out, sizeof out, path, "config"), 0, "%s", out);
    cr_assert(strstr(out, " ON_ERROR FLEET  KEY_PREFIX\n") != NULL, "%s",
              out);
    cr_assert(strstr(out, " local    8      rl:key:\n") != NULL,
              "the top-level fleet_size: %s", out);
    cr_assert(strstr(out, " local    3      rl:ip:\n") != NULL, "%s", out);
    cr_assert(strstr(out, " allow    8      rl:route:\n") != NULL,
              "every rule inherits the top-level fleet_size: %s", out);
    cr_assert_eq(test_rlctl(out, sizeof out, other, "config"), 0, "%s", out);
    cr_assert(strstr(out, " allow    -      rl:route:\n") != NULL, "%s",
              out);
    cr_assert_eq(test_rlctl(out, sizeof out, path, "--json config"), 0);
    cr_assert(strstr(out, "\"on_error\":\"local\",\"key_prefix\":\"rl:key:\","
                     "\"fleet_size\":8") != NULL, "%s", out);
    cr_assert_eq(test_rlctl(out, sizeof out, other, "--json config"), 0);
    cr_assert(strstr(out, "\"key_prefix\":\"rl:route:\",\"fleet_size\":null")
              != NULL, "%s", out);
    cr_assert_eq(test_rlctl(out, sizeof out, path, "config --diff %s", other),
                 5, "%s", out);
    cr_assert(strstr(out, "rule per-key: fleet_size 8 -> 12") != NULL, "%s",
              out);
    cr_assert(strstr(out, "rule per-route: fleet_size 8 -> 0") != NULL, "%s",
              out);
    cr_assert_null(strstr(out, "rule per-ip:"), "%s", out);
}

/* --- rl-gateway: the answers and the metrics. --------------------------- */

/* A store that is never there (nothing listens on port 1): rl-gateway's
 * rule of 4 an hour among fleet_size 2 falls back to 2 per agent. The
 * fallback's admissions are 200s marked degraded, its rejection a 429
 * (the share is spent: a limit, not an outage) with the fallback bucket's
 * Retry-After, and the metrics count them. */
Test(fallback, the_gateway_answers_from_the_fallback_and_counts_it)
{
    char metrics[32];
    const char *path = test_write_config(
        "fallback-gw", "store: {url: \"redis://127.0.0.1:1\", "
                       "timeout_ms: 50}\n"
                       "rules:\n"
                       "  - {name: per-ip, match: ip, limit: 4, period: 1h, "
                       "on_error: local, fleet_size: 2}\n");
    uint16_t port = test_free_port();
    snprintf(metrics, sizeof metrics, "127.0.0.1:%u", port);
    test_gateway gw;
    test_gateway_start(&gw, path, "--metrics", metrics, NULL);
    test_http_response r;
    int status[3];
    for (int i = 0; i < 3; i++) {
        test_http_get(gw.port, "/", "", &r);
        status[i] = r.status;
        cr_assert_not_null(test_http_header(&r, "RateLimit-Degraded"));
    }
    cr_assert_eq(status[0], 200);
    cr_assert_eq(status[1], 200);
    cr_assert_eq(status[2], 429);
    cr_assert(strstr(r.body, "\"rate_limited\"") != NULL, "%s", r.body);
    /* Half of 4 an hour: a token every 30 minutes. */
    cr_assert_str_eq(test_http_header(&r, "Retry-After"), "1800");
    cr_assert_str_eq(test_http_header(&r, "RateLimit-Limit"), "4");
    test_http_get(port, "/metrics", "", &r);
    cr_assert_eq(r.status, 200);
    r.body[r.body_len] = '\0';
    char text[sizeof r.body + 2] = "\n";
    strcat(text, r.body);
    cr_assert_eq(test_prom_sample(text, "rl_rule_fallback_total{rule=\"per-ip\","
                                  "verdict=\"allowed\"}"), 2, "%s", text);
    cr_assert_eq(test_prom_sample(text, "rl_rule_fallback_total{rule=\"per-ip\","
                                  "verdict=\"rejected\"}"), 1, "%s", text);
    cr_assert_eq(test_prom_sample(text, "rl_rule_degraded_total{rule="
                                  "\"per-ip\"}"), 3, "%s", text);
    cr_assert_eq(test_prom_sample(text, "rl_keys{mode=\"fallback\"}"), 1,
                 "%s", text);
    cr_assert_eq(test_prom_sample(text, "rl_keys_refused_total{mode="
                                  "\"fallback\"}"), 0, "%s", text);
    test_gateway_stop(&gw);
}

/* --- A synced key over aggregator.max_keys. ----------------------------- */

static rl_decision check_attrs(rl_agent *a, const rl_attr *attrs, size_t n)
{
    rl_decision d;
    cr_assert_eq(rl_check(a, attrs, n, 1, &d), RL_OK);
    return d;
}

/* max_keys: 1. The second key is refused by the synced table, so its
 * rule's on_error decides: local's bucket, 20 an hour among fleet_size 4,
 * holds 5. Alone on the request (the one-rule path) and beside a second
 * synced rule (the several-rules path), each counted once. No aggregator
 * runs: synced checks need none. */
Test(fallback, a_synced_key_over_the_cap_falls_back)
{
    char yaml[1024];
    int n = snprintf(yaml, sizeof yaml,
                     "aggregator: {reports: \"ipc:///tmp/rl-nowhere-%d-r\", "
                     "totals: \"ipc:///tmp/rl-nowhere-%d-t\", max_keys: 1}\n"
                     "rules:\n"
                     "  - {name: per-tenant, match: tenant, limit: 20, "
                     "period: 1h, mode: synced, on_error: local, "
                     "fleet_size: 4}\n"
                     "  - {name: per-user, match: user, limit: 1000, "
                     "period: 1h, mode: synced, on_error: allow}\n",
                     (int)getpid(), (int)getpid());
    rl_config *cfg;
    rl_error err;
    cr_assert_eq(rl_config_parse(yaml, (size_t)n, "<test>", &cfg, &err),
                 RL_OK, "%s", err.message);
    rl_options o = {.config = cfg};
    rl_agent *a;
    cr_assert_eq(rl_agent_open(&a, &o, &err), RL_OK, "%s", err.message);
    rl_attr first = {"tenant", "first", 5}, over = {"tenant", "over", 4};
    rl_decision d = check_attrs(a, &first, 1);
    cr_assert(d.allowed && !d.degraded);
    int admitted = 0;
    for (int i = 0; i < 4; i++) {
        d = check_attrs(a, &over, 1);
        cr_assert(d.degraded);
        cr_assert_str_eq(d.rule, "per-tenant");
        admitted += d.allowed;
    }
    cr_assert_eq(admitted, 4);
    cr_assert_eq(d.remaining, 1, "the fallback bucket's 5 less 4");
    /* With per-user too: per-user's own key is over the cap as well (and
     * allows), per-tenant's fallback has one token left, then none. */
    rl_attr both[] = {{"tenant", "over", 4}, {"user", "u", 1}};
    d = check_attrs(a, both, 2);
    cr_assert(d.allowed && d.degraded);
    d = check_attrs(a, both, 2);
    cr_assert(!d.allowed && d.degraded);
    cr_assert_str_eq(d.rule, "per-tenant");
    cr_assert_gt(d.retry_after_ms, 0);
    rl_agent_counters c;
    rl_rule_counters rules[2];
    cr_assert_eq(rl_agent_stats(a, &c, rules, 2), RL_OK);
    cr_assert_eq(rules[0].fallback_allowed, 5);
    cr_assert_eq(rules[0].fallback_rejected, 1);
    cr_assert_eq(rules[1].fallback_allowed + rules[1].fallback_rejected, 0);
    cr_assert_eq(c.fallback_keys, 1);
    rl_agent_close(a);
    rl_config_free(cfg);
}

/* --- charge: first_reject. ---------------------------------------------- */

/* Nothing listens on port 1: every call fails at once. With first_reject
 * the rules go in config order and stop at the first rejection; a fallback
 * rejection is one. per-key's share is 1 an hour (fleet_size 2 of 2): its
 * second request is rejected by the fallback and per-ip, after it, is not
 * charged. */
Test(fallback, a_fallback_rejection_stops_first_reject)
{
    const char *yaml = "store: {url: \"redis://127.0.0.1:1\", "
                       "timeout_ms: 50}\n"
                       "charge: first_reject\n"
                       "rules:\n"
                       "  - {name: per-key, match: api_key, limit: 2, "
                       "period: 1h, on_error: local, fleet_size: 2}\n"
                       "  - {name: per-ip, match: ip, limit: 100, "
                       "period: 1h, on_error: local, fleet_size: 2}\n";
    rl_config *cfg;
    rl_error err;
    cr_assert_eq(rl_config_parse(yaml, strlen(yaml), "<test>", &cfg, &err),
                 RL_OK, "%s", err.message);
    rl_options o = {.config = cfg};
    rl_agent *a;
    cr_assert_eq(rl_agent_open(&a, &o, &err), RL_OK, "%s", err.message);
    rl_attr attrs[] = {{"api_key", "k", 1}, {"ip", "1.2.3.4", 7}};
    rl_decision d;
    cr_assert_eq(rl_check(a, attrs, 2, 1, &d), RL_OK);
    cr_assert(d.allowed && d.degraded);
    cr_assert_eq(rl_check(a, attrs, 2, 1, &d), RL_OK);
    cr_assert(!d.allowed && d.degraded);
    cr_assert_str_eq(d.rule, "per-key");
    /* A token an hour, less the milliseconds since the first check. */
    cr_assert(d.retry_after_ms > 3590000 && d.retry_after_ms <= 3600000,
              "a token an hour: %lld", (long long)d.retry_after_ms);
    rl_agent_counters c;
    rl_rule_counters rules[2];
    cr_assert_eq(rl_agent_stats(a, &c, rules, 2), RL_OK);
    cr_assert_eq(rules[0].fallback_allowed, 1);
    cr_assert_eq(rules[0].fallback_rejected, 1);
    cr_assert_eq(rules[1].fallback_allowed, 1, "per-ip was charged after "
                 "per-key's fallback rejected");
    cr_assert_eq(rules[1].checks, 1);
    rl_agent_close(a);
    rl_config_free(cfg);
}

/* --- The aggregator's count, with no synced rule and no fleet_size. ----- */

/* Two agents whose only rule is an exact one with on_error: local and no
 * fleet_size still report their presence to the aggregator, and learn
 * from it that they are two: with the store away, each admits half of 4
 * an hour, not all of it. */
Test(fallback, the_aggregators_count_divides_a_rule_without_fleet_size)
{
    const char *rule = "  - {name: fleet-counted, match: api_key, limit: 4, "
                       "period: 1h, on_error: local}\n";
    test_aggregator agg;
    test_aggregator_start(&agg, NULL, rule, 100, NULL);
    test_aggregator_wait_ready(&agg);
    char yaml[1024];
    snprintf(yaml, sizeof yaml,
             "store: {url: \"redis://127.0.0.1:1\", timeout_ms: 50}\n"
             "aggregator: {reports: \"%s\", totals: \"%s\", "
             "sync_interval_ms: 100}\n"
             "rules:\n%s", agg.reports, agg.totals, rule);
    const char *path = test_write_config("fallback-counted", yaml);
    rl_config *cfg[2];
    rl_agent *a[2];
    for (int i = 0; i < 2; i++)
        a[i] = test_agent_on(path, &cfg[i], NULL);
    /* Presence goes out every 100 ms, the count comes back as often. */
    test_sleep_ms(1500);
    int allowed = 0;
    for (int i = 0; i < 5; i++) {
        rl_attr key = {"api_key", "k", 1};
        rl_decision d;
        cr_assert_eq(rl_check(a[0], &key, 1, 1, &d), RL_OK);
        cr_assert(d.degraded);
        allowed += d.allowed;
    }
    cr_assert_eq(allowed, 2, "half of the limit between two agents, as the "
                 "aggregator counted them (all of it alone): %d", allowed);
    for (int i = 0; i < 2; i++) {
        rl_agent_close(a[i]);
        rl_config_free(cfg[i]);
    }
    test_aggregator_stop(&agg);
}

/* --- A caller that gives up on a stuck I/O thread. ---------------------
 * rl_check waits for the I/O thread until the deadline (and a few ms of
 * grace); if the thread is stuck, the caller decides alone, its rules
 * unanswered: per-key's fallback bucket (10 an hour among fleet_size 2: 5)
 * decides, and the caller counts that decision, fallback included. The
 * I/O thread, when it comes back, finds the requests abandoned and counts
 * nothing: the counters say what the callers were told, once. The thread
 * is held here by an async check's callback that waits for the test. */

static sem_t stall_release;

static void stall(const rl_decision *d, void *arg)
{
    (void)d;
    (void)arg;
    while (sem_wait(&stall_release) != 0)
        ;
}

Test(fallback, a_caller_that_gives_up_decides_and_counts_once)
{
    test_agent t;
    test_agent_open(&t, NULL, TEST_FCALL, "  timeout_ms: 50\n", NULL,
                    "  - {name: per-key, match: api_key, limit: 10, "
                    "period: 1h, on_error: local, fleet_size: 2}\n");
    rl_agent_counters before;
    rl_rule_counters rb[1];
    cr_assert_eq(rl_agent_stats(t.agent, &before, rb, 1), RL_OK);
    cr_assert_eq(sem_init(&stall_release, 0, 0), 0);
    rl_attr held = {"api_key", "held", 4};
    cr_assert_eq(rl_check_async(t.agent, &held, 1, 1, stall, NULL), RL_OK);
    test_sleep_ms(100); /* its reply is in: the I/O thread is held */
    int admitted = 0;
    for (int i = 0; i < 6; i++) {
        rl_decision d = test_check(&t, "api_key=k", NULL);
        cr_assert(d.degraded && d.fallback, "check %d: not the fallback's",
                  i);
        admitted += d.allowed;
    }
    cr_assert_eq(admitted, 5, "the fallback bucket holds 5");
    sem_post(&stall_release);
    test_sleep_ms(100); /* the I/O thread finishes the abandoned checks */
    rl_agent_counters c;
    rl_rule_counters r[1];
    cr_assert_eq(rl_agent_stats(t.agent, &c, r, 1), RL_OK);
    cr_assert_eq(r[0].fallback_allowed - rb[0].fallback_allowed, 5);
    cr_assert_eq(r[0].fallback_rejected - rb[0].fallback_rejected, 1);
    cr_assert_eq(c.requests - before.requests, 7, "the held check and six");
    cr_assert_eq(c.allowed - before.allowed, 6);
    cr_assert_eq(c.rejected - before.rejected, 1);
    test_agent_close(&t);
    sem_destroy(&stall_release);
}
