/*
 * One call per request (issue 18) on one Redis: charge: atomic charges a
 * request's exact rules all or none, under contention too; three rules
 * are one function call; and an agent of rl 3 (its own library, rl_3)
 * shares buckets with this one. Every test runs through FCALL and EVALSHA.
 */
#include "redis_server.h"
#include "test_agent.h"
#include "test_env.h"

#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define DAY_MS 86400000LL

/* Three rules of different capacities, a day each: no token comes back
 * while a test runs, and each limit divides a day (the bucket is in the
 * expiry alone, so PTTL reads it to the token). */
static const char three_rules[] =
    "  - {name: per-ip, match: ip, limit: 30, period: 1d}\n"
    "  - {name: per-key, match: api_key, limit: 60, period: 1d}\n"
    "  - {name: per-tenant, match: tenant, limit: 100, period: 1d}\n";

/* Tokens spent from a bucket of limit a day: its PTTL over the time one
 * token takes to come back, rounded up (the expiry runs down meanwhile). */
static long long spent(const char *addr, const char *key, long long limit)
{
    long long ms = test_redis_pttl(addr, key);
    if (ms == -2)
        return 0;
    long long per_token = DAY_MS / limit;
    return (ms + per_token - 1) / per_token;
}

/* --- 1. A rejected request leaves the other rules' buckets untouched. -- */

TEST_BOTH_MODES(atomic, a_rejection_leaves_the_other_buckets_untouched)
{
    test_agent t;
    test_agent_open(&t, NULL, mode, NULL, "atomic",
                    "  - {name: per-ip, match: ip, limit: 1, period: 1h}\n"
                    "  - {name: per-key, match: api_key, limit: 10, "
                    "period: 1h}\n"
                    "  - {name: per-tenant, match: tenant, limit: 10, "
                    "period: 1h}\n");
    char ip[48], key[48], tenant[48], key_name[64], tenant_name[64];
    snprintf(ip, sizeof ip, "ip=untouched-%d", mode);
    snprintf(key, sizeof key, "api_key=untouched-%d", mode);
    snprintf(tenant, sizeof tenant, "tenant=untouched-%d", mode);
    snprintf(key_name, sizeof key_name, "rl:key:untouched-%d", mode);
    snprintf(tenant_name, sizeof tenant_name, "rl:tenant:untouched-%d",
             mode);
    cr_assert(test_check(&t, ip, key, tenant, NULL).allowed);
    long long key_before = test_redis_pttl(NULL, key_name);
    long long tenant_before = test_redis_pttl(NULL, tenant_name);
    /* One token of ten an hour is 360 s of expiry. */
    cr_assert(key_before > 359000 && key_before <= 360000, "PTTL %lld",
              key_before);
    rl_decision d = test_check(&t, ip, key, tenant, NULL);
    cr_assert(!d.allowed);
    cr_assert_str_eq(d.rule, "per-ip");
    long long key_after = test_redis_pttl(NULL, key_name);
    long long tenant_after = test_redis_pttl(NULL, tenant_name);
    /* Charged, the expiry would have grown by 360 s; untouched, it only
     * ran down. */
    cr_assert(key_after <= key_before && key_after > key_before - 5000,
              "per-key PTTL %lld before, %lld after", key_before, key_after);
    cr_assert(tenant_after <= tenant_before
                  && tenant_after > tenant_before - 5000,
              "per-tenant PTTL %lld before, %lld after", tenant_before,
              tenant_after);
    cr_assert_eq(test_check(&t, key, NULL).remaining, 8);
    cr_assert_eq(test_check(&t, tenant, NULL).remaining, 8);
    test_agent_close(&t);
}

/* A shadow rule's rejection is not the request's: the others are still
 * charged. */
TEST_BOTH_MODES(atomic, a_shadow_rejection_does_not_stop_the_charge)
{
    test_agent t;
    test_agent_open(&t, NULL, mode, NULL, "atomic",
                    "  - {name: per-ip, match: ip, limit: 1, period: 1h, "
                    "shadow: true}\n"
                    "  - {name: per-key, match: api_key, limit: 10, "
                    "period: 1h}\n");
    char ip[48], key[48];
    snprintf(ip, sizeof ip, "ip=shadowed-%d", mode);
    snprintf(key, sizeof key, "api_key=shadowed-%d", mode);
    test_check(&t, ip, key, NULL);
    rl_decision d = test_check(&t, ip, key, NULL);
    cr_assert(d.allowed);
    cr_assert_eq(d.shadow_rejected, 1);
    cr_assert_eq(test_check(&t, key, NULL).remaining, 7);
    test_agent_close(&t);
}

/* --- 2. Fifty threads: each rule admits exactly its capacity. ---------- */

struct contender {
    test_agent *t;
    rl_attr attrs[3];
    size_t n;
    atomic_int *allowed, *errors;
};

static void *contend(void *arg)
{
    struct contender *c = arg;
    for (int i = 0; i < 20; i++) {
        rl_decision d;
        if (rl_check(c->t->agent, c->attrs, c->n, 1, &d) != RL_OK
            || d.degraded)
            atomic_fetch_add(c->errors, 1);
        else if (d.allowed)
            atomic_fetch_add(c->allowed, 1);
    }
    return NULL;
}

/* 1,000 checks from fifty threads with the first n of the three
 * attributes; returns how many were admitted. */
static int fifty_threads(test_agent *t, const char *value, size_t n)
{
    atomic_int allowed = 0, errors = 0;
    struct contender c = {t, {{"tenant", value, strlen(value)},
                              {"api_key", value, strlen(value)},
                              {"ip", value, strlen(value)}},
                          n, &allowed, &errors};
    pthread_t threads[50];
    for (int i = 0; i < 50; i++)
        cr_assert_eq(pthread_create(&threads[i], NULL, contend, &c), 0);
    for (int i = 0; i < 50; i++)
        pthread_join(threads[i], NULL);
    cr_assert_eq(atomic_load(&errors), 0, "%d checks failed or degraded",
                 atomic_load(&errors));
    return atomic_load(&allowed);
}

/* The tokens spent from each of the three buckets of value. */
static void expect_spent(const char *value, long long ip, long long key,
                         long long tenant)
{
    char name[96];
    snprintf(name, sizeof name, "rl:ip:%s", value);
    cr_assert_eq(spent(NULL, name, 30), ip, "per-ip");
    snprintf(name, sizeof name, "rl:key:%s", value);
    cr_assert_eq(spent(NULL, name, 60), key, "per-key");
    snprintf(name, sizeof name, "rl:tenant:%s", value);
    cr_assert_eq(spent(NULL, name, 100), tenant, "per-tenant");
}

TEST_BOTH_MODES(atomic, fifty_threads_admit_each_rule_exactly_its_capacity)
{
    test_agent t;
    test_agent_open(&t, NULL, mode, NULL, "atomic", three_rules);
    char value[48];
    snprintf(value, sizeof value, "fifty-%d-%d", (int)getpid(), mode);
    /* All three rules: per-ip's 30, and not one token more from the
     * other two (charge: all would empty them). */
    cr_assert_eq(fifty_threads(&t, value, 3), 30);
    expect_spent(value, 30, 30, 30);
    /* Without the address: per-key's other 30. */
    cr_assert_eq(fifty_threads(&t, value, 2), 30);
    expect_spent(value, 30, 60, 60);
    /* The tenant alone: its last 40. */
    cr_assert_eq(fifty_threads(&t, value, 1), 40);
    expect_spent(value, 30, 60, 100);
    test_agent_close(&t);
}

/* --- 3. One function call per request. --------------------------------- */

static long long script_calls(const char *addr, test_scripts mode)
{
    return test_redis_calls(addr, mode == TEST_FCALL ? "fcall" : "evalsha");
}

static void one_call_per_request(test_scripts mode, const char *charge)
{
    test_redis srv;
    char addr[64];
    test_agent_private_redis(&srv, addr, sizeof addr);
    test_agent t;
    test_agent_open(&t, addr, mode, NULL, charge, three_rules);
    /* The scripts test_agent_open flushed are back after this one. */
    cr_assert(!test_check(&t, "ip=warm", NULL).degraded);
    long long before = script_calls(addr, mode);
    for (int i = 0; i < 100; i++) {
        rl_decision d = test_check(&t, "ip=calls", "api_key=calls",
                                   "tenant=calls", NULL);
        cr_assert(!d.degraded);
        cr_assert_eq(d.allowed, i < 30, "check %d", i);
    }
    long long calls = script_calls(addr, mode) - before;
    test_agent_close(&t);
    test_redis_stop(&srv);
    cr_assert_eq(calls, 100, "100 three-rule checks made %lld calls", calls);
}

TEST_BOTH_MODES(atomic, three_rules_are_one_call_under_charge_atomic)
{
    one_call_per_request(mode, "atomic");
}

TEST_BOTH_MODES(atomic, three_rules_are_one_call_under_charge_all)
{
    one_call_per_request(mode, "all");
}

TEST_BOTH_MODES(atomic, three_rules_are_one_call_under_first_reject)
{
    one_call_per_request(mode, "first_reject");
}

/* A token every 864,000.01 ms for each of three rules of one call: the
 * multi-bucket function writes each key's rounding as the bucket does
 * (exact::a_fractional_interval_loses_nothing_to_rounding), so a quick
 * burst admits the whole capacity and no more (no token comes back
 * meanwhile). Were the rounding lost, up to 1 ms of refill a charge, the
 * 100th request would be rejected unless the burst took as long. */
static void fractional_in_one_call(test_scripts mode, const char *charge)
{
    test_agent t;
    test_agent_open(&t, NULL, mode, NULL, charge,
                    "  - {name: per-ip, match: ip, limit: 100, "
                    "period: 86400001ms}\n"
                    "  - {name: per-key, match: api_key, limit: 100, "
                    "period: 86400001ms}\n"
                    "  - {name: per-tenant, match: tenant, limit: 100, "
                    "period: 86400001ms}\n");
    char ip[48], key[48], tenant[48];
    snprintf(ip, sizeof ip, "ip=fraction-%s-%d", charge, mode);
    snprintf(key, sizeof key, "api_key=fraction-%s-%d", charge, mode);
    snprintf(tenant, sizeof tenant, "tenant=fraction-%s-%d", charge, mode);
    for (int i = 0; i < 101; i++) {
        rl_decision d = test_check(&t, ip, key, tenant, NULL);
        cr_assert(!d.degraded);
        cr_assert_eq(d.allowed, i < 100, "request %d", i);
    }
    test_agent_close(&t);
}

TEST_BOTH_MODES(atomic, a_fractional_interval_loses_nothing_in_one_call)
{
    fractional_in_one_call(mode, "atomic");
}

TEST_BOTH_MODES(atomic, a_fractional_interval_loses_nothing_under_all)
{
    fractional_in_one_call(mode, "all");
}

/* --- 4. An rl 3 agent and this one share buckets. ---------------------- */

/* rl 3's library as it shipped: an rl 3 agent loads it on connecting. */
static void load_rl3(redisContext *c)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/upgrade/rl_3_library.lua",
             test_env("RL_TEST_CONFIGS"));
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "%s", path);
    static char text[8192];
    size_t len = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[len] = '\0';
    redisReply *r = test_redis_command(c, "FUNCTION LOAD REPLACE %s", text);
    cr_assert_eq(r->type, REDIS_REPLY_STRING, "%s", r->str);
    freeReplyObject(r);
}

TEST_BOTH_MODES(atomic, an_rl3_agent_shares_the_buckets)
{
    /* A Redis of its own: another test's FUNCTION FLUSH on the shared one
     * would drop rl 3's library mid-test. */
    test_redis srv;
    char addr[64];
    test_agent_private_redis(&srv, addr, sizeof addr);
    test_agent t;
    test_agent_open(&t, addr, mode, NULL, "atomic", three_rules);
    redisContext *c = test_redis_connect(addr);
    load_rl3(c);
    char value[48], key[96];
    snprintf(value, sizeof value, "upgrade-%d-%d", (int)getpid(), mode);
    snprintf(key, sizeof key, "rl:key:%s", value);
    rl_attr attrs[] = {{"api_key", value, strlen(value)},
                       {"tenant", value, strlen(value)}};
    int allowed = 0;
    /* Turn about: this agent (two rules in one call), then rl 3's call of
     * the same per-key bucket, 60 a day. */
    for (int i = 0; i < 50; i++) {
        rl_decision d;
        cr_assert_eq(rl_check(t.agent, attrs, 2, 1, &d), RL_OK);
        cr_assert(!d.degraded);
        allowed += d.allowed;
        redisReply *r = test_redis_command(
            c, "FCALL rl_3_bucket 1 %s 60 60 86400000 1", key);
        cr_assert_eq(r->type, REDIS_REPLY_INTEGER, "%s", r->str);
        allowed += r->integer >= 0;
        freeReplyObject(r);
    }
    redisFree(c);
    test_agent_close(&t);
    test_redis_stop(&srv);
    cr_assert_eq(allowed, 60, "100 calls of both versions admitted %d of 60",
                 allowed);
}
