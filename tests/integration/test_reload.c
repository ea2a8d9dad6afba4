/*
 * Live reload (rl_agent_reload): real Redis, a real rl-aggregator process.
 * Rules are swapped while threads check; kept rules keep their buckets
 * (exact: the Redis key; synced and local: the agent's entries), removed
 * rules stop, a bad config changes nothing, and no synced count is lost.
 */
#include "agent_impl.h"
#include "redis_server.h"
#include "test_agent.h"
#include "test_aggregator.h"
#include "test_env.h"

#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* A config on the test Redis and agg's URLs (or ports nobody listens on)
 * with these rules. */
static rl_config *config_of(const test_aggregator *agg, const char *rules)
{
    char yaml[8192];
    snprintf(yaml, sizeof yaml,
             "store: {url: \"redis://%s\", timeout_ms: 2000}\n"
             "aggregator:\n"
             "  reports: \"%s\"\n"
             "  totals: \"%s\"\n"
             "  sync_interval_ms: 100\n"
             "rules:\n%s",
             test_env("RL_TEST_REDIS"),
             agg != NULL ? agg->reports : "tcp://127.0.0.1:9",
             agg != NULL ? agg->totals : "tcp://127.0.0.1:11", rules);
    rl_config *cfg;
    rl_error err;
    cr_assert_eq(rl_config_parse(yaml, strlen(yaml), "reload.yaml", &cfg,
                                 &err), RL_OK, "%s", err.message);
    return cfg;
}

static rl_agent *open_on(rl_config *cfg)
{
    rl_options o = {.config = cfg};
    rl_agent *a;
    rl_error err;
    cr_assert_eq(rl_agent_open(&a, &o, &err), RL_OK, "%s", err.message);
    return a;
}

static void reload_to(rl_agent *a, rl_config *cfg)
{
    rl_error err;
    cr_assert_eq(rl_agent_reload_config(a, cfg, &err), RL_OK, "%s",
                 err.message);
}

static rl_decision check1(rl_agent *a, const char *name, const char *value)
{
    rl_attr attr = {name, value, strlen(value)};
    rl_decision d;
    cr_assert_eq(rl_check(a, &attr, 1, 1, &d), RL_OK);
    return d;
}

/* A value no earlier run of the tests used (Redis keeps buckets). */
static const char *fresh(char *buf, size_t cap, const char *what)
{
    static int serial;
    snprintf(buf, cap, "%s-%d-%d-%llu", what, (int)getpid(), ++serial,
             (unsigned long long)test_now_us());
    return buf;
}

/* --- A changed limit applies at once, to the same bucket. --------------- */

Test(reload, changed_limit_applies_to_the_same_bucket)
{
    char k[64], i[64], t[64];
    fresh(k, sizeof k, "k");
    fresh(i, sizeof i, "i");
    fresh(t, sizeof t, "t");
    const char *five =
        "  - {name: per-key, match: api_key, limit: 5, period: 1m}\n"
        "  - {name: per-ip, match: ip, limit: 5, period: 1m, mode: local}\n"
        "  - {name: per-tenant, match: tenant, limit: 5, period: 1m, "
        "mode: synced}\n";
    rl_config *first = config_of(NULL, five);
    rl_agent *a = open_on(first);
    for (int n = 0; n < 5; n++) {
        cr_assert(check1(a, "api_key", k).allowed);
        cr_assert(check1(a, "ip", i).allowed);
    }
    for (int n = 0; n < 3; n++)
        cr_assert(check1(a, "tenant", t).allowed);
    cr_assert_not(check1(a, "api_key", k).allowed);
    cr_assert_not(check1(a, "ip", i).allowed);
    /* Exact: a bigger bucket, and the tokens spent stay spent: the five
     * of the difference (a new bucket would let ten through). Local: the
     * spent bucket's state is kept as it is. */
    reload_to(a, config_of(NULL,
        "  - {name: per-key, match: api_key, limit: 10, period: 1m}\n"
        "  - {name: per-ip, match: ip, limit: 10, period: 1m, mode: local}\n"
        "  - {name: per-tenant, match: tenant, limit: 3, period: 1m, "
        "mode: synced}\n"));
    for (int n = 0; n < 5; n++)
        cr_assert(check1(a, "api_key", k).allowed, "the reload kept the "
                  "old limit or lost the tokens spent (%d)", n);
    rl_decision d = check1(a, "api_key", k);
    cr_assert_not(d.allowed, "the reload forgot per-key's bucket");
    cr_assert_eq(d.limit, 10, "the old limit still applies");
    d = check1(a, "ip", i);
    cr_assert_not(d.allowed, "the reload forgot per-ip's bucket");
    cr_assert_eq(d.limit, 10);
    /* Synced: 3 counted, and the limit is 3 now. */
    d = check1(a, "tenant", t);
    cr_assert_not(d.allowed, "the reload forgot per-tenant's count (or "
                  "kept its old limit)");
    /* And up again: the new limit, at once. */
    reload_to(a, config_of(NULL,
        "  - {name: per-key, match: api_key, limit: 10, period: 1m}\n"
        "  - {name: per-ip, match: ip, limit: 10, period: 1m, mode: local}\n"
        "  - {name: per-tenant, match: tenant, limit: 4, period: 1m, "
        "mode: synced}\n"));
    cr_assert(check1(a, "tenant", t).allowed);
    cr_assert_not(check1(a, "tenant", t).allowed);
    /* A rule renamed is a new rule: a new local bucket. */
    reload_to(a, config_of(NULL,
        "  - {name: per-ip-2, match: ip, limit: 10, period: 1m, "
        "mode: local}\n"));
    cr_assert(check1(a, "ip", i).allowed);
    rl_agent_counters c;
    cr_assert_eq(rl_agent_stats(a, &c, NULL, 0), RL_OK);
    cr_assert_eq(c.reloads, 3);
    cr_assert_eq(c.n_rules, 1);
    rl_agent_close(a);
    rl_config_free(first);
}

/* --- Removed rules stop; a bad config changes nothing. ------------------ */

Test(reload, a_removed_rule_stops)
{
    char k[64], i[64];
    fresh(k, sizeof k, "k");
    fresh(i, sizeof i, "i");
    rl_config *first = config_of(NULL,
        "  - {name: per-key, match: api_key, limit: 1, period: 1m}\n"
        "  - {name: per-ip, match: ip, limit: 1, period: 1m, mode: local}\n");
    rl_agent *a = open_on(first);
    cr_assert(check1(a, "api_key", k).allowed);
    cr_assert(check1(a, "ip", i).allowed);
    cr_assert_not(check1(a, "api_key", k).allowed);
    cr_assert_not(check1(a, "ip", i).allowed);
    reload_to(a, config_of(NULL,
        "  - {name: other, match: tenant, limit: 1, period: 1m, "
        "mode: local}\n"));
    for (int n = 0; n < 3; n++) {
        rl_decision d = check1(a, "api_key", k);
        cr_assert(d.allowed && d.rule[0] == '\0', "per-key still applies");
        d = check1(a, "ip", i);
        cr_assert(d.allowed && d.rule[0] == '\0', "per-ip still applies");
    }
    rl_rule_counters r[4];
    rl_agent_counters c;
    cr_assert_eq(rl_agent_stats(a, &c, r, 4), RL_OK);
    cr_assert_eq(c.n_rules, 1);
    cr_assert_str_eq(r[0].rule, "other");
    rl_agent_close(a);
    rl_config_free(first);
}

Test(reload, a_bad_config_is_refused_and_the_old_rules_stay)
{
    char k[64], path[512];
    fresh(k, sizeof k, "k");
    rl_config *first = config_of(NULL,
        "  - {name: per-key, match: api_key, limit: 1, period: 1m}\n");
    rl_agent *a = open_on(first);
    cr_assert(check1(a, "api_key", k).allowed);
    snprintf(path, sizeof path, "%s/reload-bad-%d.yaml",
             test_env("RL_TEST_TMPDIR"), (int)getpid());
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fprintf(f, "store: {url: \"redis://%s\", timeout_ms: 2000}\nrules:\n"
               "  - {name: per-key, match: api_key, limit: 100, period: 1m}\n"
               "  - {name: broken, match: ip, limit: 0, period: 1m}\n",
            test_env("RL_TEST_REDIS"));
    fclose(f);
    rl_error at_open, at_reload;
    rl_config *none;
    cr_assert_eq(rl_config_load(path, &none, &at_open), RL_ECONFIG);
    cr_assert_eq(rl_agent_reload(a, path, &at_reload), RL_ECONFIG);
    cr_assert_str_eq(at_reload.message, at_open.message);
    cr_assert_eq(rl_agent_reload(a, "/nonexistent/rl.yaml", &at_reload),
                 RL_EIO);
    rl_decision d = check1(a, "api_key", k);
    cr_assert_not(d.allowed, "the refused config's limit applies");
    cr_assert_eq(d.limit, 1);
    rl_agent_counters c;
    cr_assert_eq(rl_agent_stats(a, &c, NULL, 0), RL_OK);
    cr_assert_eq(c.reloads, 0);
    cr_assert_eq(c.n_rules, 1);
    /* A good file after the bad one. */
    f = fopen(path, "w");
    fprintf(f, "store: {url: \"redis://%s\", timeout_ms: 2000}\nrules:\n"
               "  - {name: per-key, match: api_key, limit: 100, "
               "period: 1m}\n", test_env("RL_TEST_REDIS"));
    fclose(f);
    cr_assert_eq(rl_agent_reload(a, path, &at_reload), RL_OK, "%s",
                 at_reload.message);
    /* The same bucket, whose one token per 0.6 s is spent: the new rule
     * decides. */
    d = check1(a, "api_key", k);
    cr_assert_str_eq(d.rule, "per-key");
    cr_assert_eq(d.limit, 100);
    rl_agent_close(a);
    rl_config_free(first);
    unlink(path);
}

/* --- Modes the agent did not have at open. ------------------------------ */

static const char agg_rules[] =
    "  - {name: per-tenant, match: tenant, limit: 1000000000, period: 1m, "
    "mode: synced}\n"
    "  - {name: per-org, match: org, limit: 1000000000, period: 1m, "
    "mode: synced}\n";

Test(reload, adds_the_first_exact_and_synced_rules)
{
    test_aggregator agg;
    test_aggregator_start(&agg, NULL, agg_rules, 100, NULL);
    test_aggregator_wait_ready(&agg);
    char k[64], t[64], key[128];
    fresh(k, sizeof k, "k");
    fresh(t, sizeof t, "t");
    rl_config *first = config_of(&agg,
        "  - {name: per-ip, match: ip, limit: 10, period: 1m, mode: local}\n");
    rl_agent *a = open_on(first);
    cr_assert(check1(a, "ip", "1.2.3.4").allowed);
    reload_to(a, config_of(&agg,
        "  - {name: per-key, match: api_key, limit: 2, period: 1m}\n"
        "  - {name: per-tenant, match: tenant, limit: 1000000000, "
        "period: 1m, mode: synced}\n"));
    for (int n = 0; n < 2; n++) {
        rl_decision d = check1(a, "api_key", k);
        cr_assert(d.allowed && !d.degraded, "no store for a new exact rule");
    }
    rl_decision d = check1(a, "api_key", k);
    cr_assert(!d.allowed && !d.degraded);
    for (int n = 0; n < 25; n++)
        cr_assert(check1(a, "tenant", t).allowed);
    snprintf(key, sizeof key, "rl:tenant:%s", t);
    test_expect_window_total(key, 25, 5000);
    rl_agent_close(a);
    rl_config_free(first);
    test_aggregator_stop(&agg);
}

/* --- A synced rule reloaded away still reports what it counted. --------- */

Test(reload, a_removed_synced_rule_loses_no_count)
{
    test_aggregator agg;
    test_aggregator_start(&agg, NULL, agg_rules, 100, NULL);
    test_aggregator_wait_ready(&agg);
    char t[64], key[128];
    fresh(t, sizeof t, "t");
    rl_config *first = config_of(&agg, agg_rules);
    rl_agent *a = open_on(first);
    for (int n = 0; n < 40; n++)
        cr_assert(check1(a, "tenant", t).allowed);
    /* At once: the counts have not been reported yet. */
    reload_to(a, config_of(&agg,
        "  - {name: per-org, match: org, limit: 1000000000, period: 1m, "
        "mode: synced}\n"));
    cr_assert_eq(check1(a, "tenant", t).rule[0], '\0');
    snprintf(key, sizeof key, "rl:tenant:%s", t);
    test_expect_window_total(key, 40, 5000);
    rl_agent_close(a);
    rl_config_free(first);
    test_aggregator_stop(&agg);
}

/* --- Retired rules are freed once unused, not before. ------------------ */

static size_t retired(rl_agent *a)
{
    pthread_mutex_lock(&a->reload_lock);
    size_t n = a->n_retired;
    pthread_mutex_unlock(&a->reload_lock);
    return n;
}

static void on_decision(const rl_decision *d, void *arg)
{
    atomic_store((atomic_int *)arg, d->allowed && !d->degraded ? 1 : 2);
}

Test(reload, a_generation_in_use_is_kept_until_let_go)
{
    char k[64];
    fresh(k, sizeof k, "k");
    rl_config *first = config_of(NULL,
        "  - {name: per-key, match: api_key, limit: 100, period: 1m}\n");
    rl_agent *a = open_on(first);
    cr_assert(check1(a, "api_key", k).allowed);
    /* Redis holds every command for half a second: the check below waits
     * at the I/O thread, holding the rules it was built under. */
    redisContext *c = test_redis_connect(NULL);
    freeReplyObject(test_redis_command(c, "CLIENT PAUSE 500"));
    atomic_int answered = 0;
    rl_attr attr = {"api_key", k, strlen(k)};
    cr_assert_eq(rl_check_async(a, &attr, 1, 1, on_decision, &answered),
                 RL_OK);
    reload_to(a, config_of(NULL,
        "  - {name: per-key, match: api_key, limit: 50, period: 1m}\n"));
    cr_assert_eq(atomic_load(&answered), 0, "Redis was not paused");
    cr_assert_eq(retired(a), 1, "the first rules were freed while a check "
                 "built under them was in flight");
    uint64_t start = test_now_ms();
    while (atomic_load(&answered) == 0 && test_now_ms() - start < 3000)
        test_sleep_ms(10);
    cr_assert_eq(atomic_load(&answered), 1, "the check in flight failed");
    reload_to(a, config_of(NULL,
        "  - {name: per-key, match: api_key, limit: 40, period: 1m}\n"));
    cr_assert_eq(retired(a), 0, "retired rules were never freed");
    redisFree(c);
    rl_agent_close(a);
    rl_config_free(first);
}

Test(reload, identities_of_removed_rules_are_freed)
{
    rl_config *first = config_of(NULL,
        "  - {name: kept, match: ip, limit: 5, period: 1m, mode: local}\n");
    rl_agent *a = open_on(first);
    for (int n = 0; n < 50; n++) {
        char rules[256];
        snprintf(rules, sizeof rules,
                 "  - {name: kept, match: ip, limit: 5, period: 1m, "
                 "mode: local}\n"
                 "  - {name: gone-%d, match: tenant, limit: 5, period: 1m, "
                 "mode: local}\n", n);
        reload_to(a, config_of(NULL, rules));
    }
    pthread_mutex_lock(&a->reload_lock);
    size_t n = rl_idents_count(&a->idents);
    pthread_mutex_unlock(&a->reload_lock);
    cr_assert_leq(n, 3, "%zu identities kept for 2 rules", n);
    rl_agent_close(a);
    rl_config_free(first);
}

/* --- Under load: 8 threads check while the rules change 100 times. ------ */

#define THREADS 8
#define RELOADS 100

struct checker {
    rl_agent *agent;
    int index;
    atomic_bool *stop;
    long checks, allowed_tenant, failed, degraded;
    char key[64], tenant[64], ip[64];
};

/* No Criterion assertion off the main thread: counted, checked after. */
static void *check_until_stopped(void *arg)
{
    struct checker *c = arg;
    rl_attr attrs[3] = {{"api_key", c->key, strlen(c->key)},
                        {"tenant", c->tenant, strlen(c->tenant)},
                        {"ip", c->ip, strlen(c->ip)}};
    for (long n = 0; !atomic_load(c->stop); n++) {
        rl_decision d;
        /* Every fourth check goes to Redis too. */
        size_t first = n % 4 == 0 ? 0 : 1;
        int rc = rl_check(c->agent, attrs + first, 3 - first, 1, &d);
        if (rc != RL_OK || !d.allowed) {
            c->failed++;
            continue;
        }
        c->checks++;
        c->degraded += d.degraded;
        c->allowed_tenant++;
    }
    return NULL;
}

Test(reload, eight_threads_check_through_a_hundred_reloads)
{
    test_aggregator agg;
    test_aggregator_start(&agg, NULL, agg_rules, 100, NULL);
    test_aggregator_wait_ready(&agg);
    /* Two configs: the same three rules (at other limits, all far above
     * what the test spends), one rule only in A and one only in B. */
    const char *a_rules =
        "  - {name: per-key, match: api_key, limit: 100000000, period: 1m}\n"
        "  - {name: per-tenant, match: tenant, limit: 1000000000, "
        "period: 1m, mode: synced}\n"
        "  - {name: per-ip, match: ip, limit: 100000000, period: 1m, "
        "mode: local}\n"
        "  - {name: only-a, match: ip, limit: 100000000, period: 1m, "
        "mode: local, key_prefix: \"rl:only-a:\"}\n";
    const char *b_rules =
        "  - {name: per-ip, match: ip, limit: 200000000, period: 1m, "
        "mode: local}\n"
        "  - {name: per-key, match: api_key, limit: 200000000, period: 1m}\n"
        "  - {name: per-org, match: tenant, limit: 1000000000, "
        "period: 1m, mode: synced, key_prefix: \"rl:org:\"}\n"
        "  - {name: per-tenant, match: tenant, limit: 900000000, "
        "period: 1m, mode: synced}\n";
    rl_config *first = config_of(&agg, a_rules);
    rl_agent *a = open_on(first);
    atomic_bool stop = false;
    struct checker c[THREADS];
    pthread_t t[THREADS];
    char tenant[64];
    fresh(tenant, sizeof tenant, "t");
    for (int i = 0; i < THREADS; i++) {
        c[i] = (struct checker){.agent = a, .index = i, .stop = &stop};
        fresh(c[i].key, sizeof c[i].key, "k");
        snprintf(c[i].tenant, sizeof c[i].tenant, "%s", tenant);
        fresh(c[i].ip, sizeof c[i].ip, "i");
        pthread_create(&t[i], NULL, check_until_stopped, &c[i]);
    }
    for (int n = 0; n < RELOADS; n++) {
        reload_to(a, config_of(&agg, n % 2 == 0 ? b_rules : a_rules));
        test_sleep_ms(2);
    }
    atomic_store(&stop, true);
    long checks = 0, failed = 0, degraded = 0;
    for (int i = 0; i < THREADS; i++) {
        pthread_join(t[i], NULL);
        checks += c[i].checks;
        failed += c[i].failed;
        degraded += c[i].degraded;
    }
    cr_assert_eq(failed, 0, "%ld checks failed or were refused", failed);
    cr_assert_eq(degraded, 0, "%ld checks were degraded", degraded);
    cr_assert_gt(checks, 1000, "only %ld checks", checks);
    /* The counters of the rules in every config add up across the
     * reloads: per-tenant and per-ip saw every check. */
    rl_agent_counters s;
    rl_rule_counters r[4];
    cr_assert_eq(rl_agent_stats(a, &s, r, 4), RL_OK);
    cr_assert_eq(s.reloads, RELOADS);
    cr_assert_eq(s.requests, (uint64_t)checks);
    cr_assert_str_eq(r[1].rule, "per-tenant");
    cr_assert_eq(r[1].checks, (uint64_t)checks, "per-tenant counted %llu "
                 "of %ld", (unsigned long long)r[1].checks, checks);
    cr_assert_str_eq(r[2].rule, "per-ip");
    cr_assert_eq(r[2].checks, (uint64_t)checks);
    /* Every synced count reached Redis, across all the reloads. */
    char key[128];
    snprintf(key, sizeof key, "rl:tenant:%s", tenant);
    test_expect_window_total(key, checks, 10000);
    rl_agent_close(a);
    rl_config_free(first);
    test_aggregator_stop(&agg);
}
