/*
 * The exact path against a real redis-server: the seed's claims (exactly
 * capacity admitted under contention, an expiry equal to the time to refill,
 * the three-rule table), the charge modes, refill, and what happens when
 * Redis goes away or loses its scripts. Every test runs through FCALL and
 * through EVALSHA, each after its scripts were flushed.
 */
#include "config.h"
#include "redis_server.h"
#include "test_agent.h"
#include "test_env.h"

#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

static const char *algorithm_name(int gcra)
{
    return gcra ? "gcra" : "token_bucket";
}

/* --- 1. Fifty threads on one 100-token bucket admit exactly 100. ------- */

struct contender {
    test_agent *t;
    const char *key;
    int rounds;
    atomic_int *allowed;
    atomic_int *errors;
};

static void *contend(void *arg)
{
    struct contender *c = arg;
    rl_attr attr = {"api_key", c->key, strlen(c->key)};
    for (int i = 0; i < c->rounds; i++) {
        rl_decision d;
        if (rl_check(c->t->agent, &attr, 1, 1, &d) != RL_OK || d.degraded)
            atomic_fetch_add(c->errors, 1);
        else if (d.allowed)
            atomic_fetch_add(c->allowed, 1);
    }
    return NULL;
}

/* Fifty threads, rounds checks each, on one bucket of 100 under rule. */
static void fifty_threads_on(test_scripts mode, const char *rule,
                             const char *key, int rounds)
{
    char rules[256];
    snprintf(rules, sizeof rules,
             "  - {name: per-key, match: api_key, limit: 100, %s}\n", rule);
    test_agent t;
    test_agent_open(&t, NULL, mode, NULL, NULL, rules);
    atomic_int allowed = 0, errors = 0;
    pthread_t threads[50];
    struct contender c = {&t, key, rounds, &allowed, &errors};
    for (int i = 0; i < 50; i++)
        cr_assert_eq(pthread_create(&threads[i], NULL, contend, &c), 0);
    for (int i = 0; i < 50; i++)
        pthread_join(threads[i], NULL);
    test_agent_close(&t);
    cr_assert_eq(atomic_load(&errors), 0, "%d checks failed or degraded",
                 atomic_load(&errors));
    cr_assert_eq(atomic_load(&allowed), 100, "%d attempts admitted %d",
                 50 * rounds, atomic_load(&allowed));
}

static void fifty_threads(test_scripts mode, int gcra)
{
    char rule[96], key[64];
    /* 100 a day: not one token comes back during the test. */
    snprintf(rule, sizeof rule, "period: 1d, algorithm: %s",
             algorithm_name(gcra));
    snprintf(key, sizeof key, "fifty-%s-%d", algorithm_name(gcra), mode);
    fifty_threads_on(mode, rule, key, 20);
}

TEST_BOTH_MODES(exact, fifty_threads_admit_exactly_capacity_token_bucket)
{
    fifty_threads(mode, 0);
}

TEST_BOTH_MODES(exact, fifty_threads_admit_exactly_capacity_gcra)
{
    fifty_threads(mode, 1);
}

/* A token every 1,000.01 ms: the key's expiry is rounded up to a whole ms
 * and its value holds the rounding. Were the value ignored, each check
 * would lose up to 1 ms of refill and the 100th check of a quick burst
 * would be rejected (99 x 99 units short, 98 ms of refill). */
TEST_BOTH_MODES(exact, a_fractional_interval_loses_nothing_to_rounding)
{
    char key[64];
    snprintf(key, sizeof key, "fraction-%d", mode);
    fifty_threads_on(mode, "period: 100001ms", key, 3);
}

/* --- 2. The key expires when the bucket would be full again. ----------- */

static void expiry_is_time_to_refill(test_scripts mode, int gcra)
{
    char rules[256], value[64], key[80];
    snprintf(rules, sizeof rules,
             "  - {name: per-key, match: api_key, limit: 100, period: 1m, "
             "algorithm: %s}\n", algorithm_name(gcra));
    snprintf(value, sizeof value, "ttl-%s-%d", algorithm_name(gcra), mode);
    snprintf(key, sizeof key, "rl:key:%s", value);
    char attr[96];
    snprintf(attr, sizeof attr, "api_key=%s", value);
    test_agent t;
    test_agent_open(&t, NULL, mode, NULL, NULL, rules);

    rl_decision d = test_check(&t, attr, NULL);
    cr_assert(d.allowed);
    cr_assert_eq(d.remaining, 99);
    cr_assert_eq(d.reset_ms, 600, "reset %llu ms",
                 (unsigned long long)d.reset_ms);
    /* 100 a minute: one token comes back every 600 ms. */
    long long ms = test_redis_pttl(t.addr, key);
    cr_assert(ms > 500 && ms <= 600, "PTTL %lld ms", ms);

    test_sleep_ms((unsigned)ms + 50);
    cr_assert_eq(test_redis_pttl(t.addr, key), -2,
                 "the key outlived its refill");
    d = test_check(&t, attr, NULL);
    cr_assert_eq(d.remaining, 99, "a missing key is not a full bucket");
    test_agent_close(&t);
}

TEST_BOTH_MODES(exact, one_request_leaves_a_600ms_key_token_bucket)
{
    expiry_is_time_to_refill(mode, 0);
}

TEST_BOTH_MODES(exact, one_request_leaves_a_600ms_key_gcra)
{
    expiry_is_time_to_refill(mode, 1);
}

/* rl 1 stored "LEVEL:TS" or "TAT [REM]" under the same expiry: the bucket
 * is read from the expiry, so an upgrade keeps every bucket's level. A key
 * without an expiry is not one of rl's: a full bucket, and then rl's. */
TEST_BOTH_MODES(exact, rl_1_states_are_read_by_their_expiry)
{
    test_agent t;
    test_agent_open(&t, NULL, mode, NULL, NULL,
                    "  - {name: per-key, match: api_key, limit: 100, "
                    "period: 1m}\n");
    redisContext *c = test_redis_connect(t.addr);
    /* An empty rl 1 token bucket: full again in a minute. */
    freeReplyObject(test_redis_command(
        c, "SET rl:key:old-tb-%d 0:1796067344897 PX 60000", mode));
    /* An rl 1 GCRA state one request short of full. */
    freeReplyObject(test_redis_command(
        c, "SET rl:key:old-gcra-%d 1796067344897 PX 600", mode));
    freeReplyObject(test_redis_command(c, "SET rl:key:foreign-%d x", mode));

    char attr[64];
    snprintf(attr, sizeof attr, "api_key=old-tb-%d", mode);
    rl_decision d = test_check(&t, attr, NULL);
    cr_assert(!d.allowed, "an empty rl 1 bucket admitted a request");
    cr_assert(d.retry_after_ms > 0 && d.retry_after_ms <= 600, "retry %lld ms",
              (long long)d.retry_after_ms);
    snprintf(attr, sizeof attr, "api_key=old-gcra-%d", mode);
    d = test_check(&t, attr, NULL);
    cr_assert(d.allowed);
    cr_assert_eq(d.remaining, 98);
    snprintf(attr, sizeof attr, "api_key=foreign-%d", mode);
    d = test_check(&t, attr, NULL);
    cr_assert(d.allowed);
    cr_assert_eq(d.remaining, 99);
    redisReply *r = test_redis_command(c, "PTTL rl:key:foreign-%d", mode);
    cr_assert(r->integer > 500 && r->integer <= 600, "PTTL %lld",
              r->integer);
    freeReplyObject(r);
    redisFree(c);
    test_agent_close(&t);
}

/* --- 3. The seed's table: three rules, four rows. ---------------------- */

static const char seed_rules[] =
    "  - {name: per-ip, match: ip, limit: 1, period: 2s}\n"
    "  - {name: per-key, match: api_key, limit: 1, period: 600ms}\n"
    "  - {name: per-tenant, match: tenant, limit: 1, period: 400ms}\n";

static void expect_header(const rl_decision *d, const char *line)
{
    char headers[512];
    cr_assert_gt(rl_format_headers(d, headers, sizeof headers), 0);
    cr_assert(strstr(headers, line) != NULL, "no '%s' in:\n%s", line,
              headers);
}

TEST_BOTH_MODES(exact, seed_table_of_three_rules)
{
    test_agent t;
    test_agent_open(&t, NULL, mode, NULL, NULL, seed_rules);
    char ip[4][32], key[4][32], tenant[4][32];
    for (int row = 0; row < 4; row++) {
        snprintf(ip[row], sizeof ip[row], "ip=10.%d.0.%d", mode, row);
        snprintf(key[row], sizeof key[row], "api_key=ak_%d_%d", mode, row);
        snprintf(tenant[row], sizeof tenant[row], "tenant=t_%d_%d", mode,
                 row);
    }
    /* Row 2: the key is spent; row 3: the address; row 4: all three. */
    test_check(&t, key[1], NULL);
    test_check(&t, ip[2], NULL);
    test_check(&t, ip[3], key[3], tenant[3], NULL);

    rl_decision d = test_check(&t, ip[0], key[0], tenant[0], NULL);
    cr_assert(d.allowed && !d.degraded);
    cr_assert_eq(d.retry_after_ms, 0);
    char headers[512];
    rl_format_headers(&d, headers, sizeof headers);
    cr_assert_null(strstr(headers, "Retry-After"), "%s", headers);

    d = test_check(&t, ip[1], key[1], tenant[1], NULL);
    cr_assert(!d.allowed);
    cr_assert_str_eq(d.rule, "per-key");
    cr_assert(d.retry_after_ms > 500 && d.retry_after_ms <= 600, "%lld",
              (long long)d.retry_after_ms);
    expect_header(&d, "Retry-After: 1\r\n");
    expect_header(&d, "RateLimit-Policy: \"per-key\";q=1;w=1\r\n");

    d = test_check(&t, ip[2], key[2], tenant[2], NULL);
    cr_assert(!d.allowed);
    cr_assert_str_eq(d.rule, "per-ip");
    expect_header(&d, "Retry-After: 2\r\n");
    expect_header(&d, "RateLimit-Policy: \"per-ip\";q=1;w=2\r\n");

    d = test_check(&t, ip[3], key[3], tenant[3], NULL);
    cr_assert(!d.allowed);
    cr_assert_str_eq(d.rule, "per-ip", "the longest retry decides");
    cr_assert(d.retry_after_ms > 1900 && d.retry_after_ms <= 2000);
    expect_header(&d, "Retry-After: 2\r\n");
    expect_header(&d, "RateLimit: \"per-ip\";r=0;t=2\r\n");
    test_agent_close(&t);
}

/* --- 4. Charge modes. --------------------------------------------------- */

static const char charge_rules[] =
    "  - {name: per-ip, match: ip, limit: 1, period: 1h}\n"
    "  - {name: per-key, match: api_key, limit: 10, period: 1h}\n"
    "  - {name: per-tenant, match: tenant, limit: 10, period: 1h}\n";

/* Rejects a request on its address, then reports what the key and tenant
 * buckets have left (after one more token each, to read them). */
static void charge_case(test_scripts mode, const char *charge,
                        uint64_t *key_left, uint64_t *tenant_left)
{
    test_agent t;
    test_agent_open(&t, NULL, mode, NULL, charge, charge_rules);
    char ip[48], key[48], tenant[48];
    snprintf(ip, sizeof ip, "ip=charge-%s-%d", charge, mode);
    snprintf(key, sizeof key, "api_key=charge-%s-%d", charge, mode);
    snprintf(tenant, sizeof tenant, "tenant=charge-%s-%d", charge, mode);
    test_check(&t, ip, NULL);
    rl_decision d = test_check(&t, ip, key, tenant, NULL);
    cr_assert(!d.allowed);
    cr_assert_str_eq(d.rule, "per-ip");
    *key_left = test_check(&t, key, NULL).remaining;
    *tenant_left = test_check(&t, tenant, NULL).remaining;
    test_agent_close(&t);
}

TEST_BOTH_MODES(exact, charge_all_drains_every_matching_rule)
{
    uint64_t key, tenant;
    charge_case(mode, "all", &key, &tenant);
    cr_assert_eq(key, 8);
    cr_assert_eq(tenant, 8);
}

TEST_BOTH_MODES(exact, charge_refund_gives_the_tokens_back)
{
    uint64_t key, tenant;
    charge_case(mode, "refund", &key, &tenant);
    cr_assert_eq(key, 9);
    cr_assert_eq(tenant, 9);
}

TEST_BOTH_MODES(exact, charge_first_reject_stops_at_the_rejecting_rule)
{
    uint64_t key, tenant;
    charge_case(mode, "first_reject", &key, &tenant);
    cr_assert_eq(key, 9);
    cr_assert_eq(tenant, 9);
}

/* --- 5. Refill: a burst of ten, then the steady rate. ------------------- */

static void refill(test_scripts mode, int gcra)
{
    char rules[256], attr[64];
    snprintf(rules, sizeof rules,
             "  - {name: per-key, match: api_key, limit: 10, period: 1s, "
             "burst: 10, algorithm: %s}\n", algorithm_name(gcra));
    snprintf(attr, sizeof attr, "api_key=refill-%s-%d", algorithm_name(gcra),
             mode);
    test_agent t;
    test_agent_open(&t, NULL, mode, NULL, NULL, rules);
    for (int i = 0; i < 10; i++)
        cr_assert(test_check(&t, attr, NULL).allowed, "burst token %d", i);
    rl_decision d = test_check(&t, attr, NULL);
    cr_assert(!d.allowed);
    /* One token every 100 ms, less what the burst took to spend. */
    cr_assert(d.retry_after_ms > 0 && d.retry_after_ms <= 100, "retry %lld",
              (long long)d.retry_after_ms);
    test_sleep_ms((unsigned)d.retry_after_ms + 3);
    cr_assert(test_check(&t, attr, NULL).allowed, "not refilled on time");

    /* Steady: asking every 10 ms for a second gets about ten through. */
    int allowed = 0;
    uint64_t start = test_now_ms();
    while (test_now_ms() - start < 1000) {
        allowed += test_check(&t, attr, NULL).allowed;
        test_sleep_ms(10);
    }
    cr_assert(allowed >= 9 && allowed <= 11, "%d in one second", allowed);
    test_agent_close(&t);
}

TEST_BOTH_MODES(exact, refills_at_the_configured_rate_token_bucket)
{
    refill(mode, 0);
}

TEST_BOTH_MODES(exact, refills_at_the_configured_rate_gcra)
{
    refill(mode, 1);
}

/* A cost the bucket can never hold is refused with retry -1, not waited
 * for, and its Retry-After is left out. */
TEST_BOTH_MODES(exact, cost_over_capacity_never_passes)
{
    test_agent t;
    test_agent_open(&t, NULL, mode, NULL, NULL,
                    "  - {name: per-key, match: api_key, limit: 5, "
                    "period: 1s}\n");
    char value[32];
    snprintf(value, sizeof value, "huge-%d", mode);
    rl_attr attr = {"api_key", value, strlen(value)};
    rl_decision d;
    cr_assert_eq(rl_check(t.agent, &attr, 1, 6, &d), RL_OK);
    cr_assert(!d.allowed);
    cr_assert_eq(d.retry_after_ms, -1);
    char headers[512];
    cr_assert_gt(rl_format_headers(&d, headers, sizeof headers), 0);
    cr_assert_null(strstr(headers, "Retry-After"), "%s", headers);
    cr_assert_eq(rl_check(t.agent, &attr, 1, 5, &d), RL_OK);
    cr_assert(d.allowed, "the bucket was charged by the refused request");
    test_agent_close(&t);
}

/* A cost takes that many tokens, and a rejected one waits for all of them:
 * 10 an hour, a token every 360 s, none back during the test. */
TEST_BOTH_MODES(exact, a_cost_takes_that_many_tokens)
{
    test_agent t;
    test_agent_open(&t, NULL, mode, NULL, NULL,
                    "  - {name: per-key, match: api_key, limit: 10, "
                    "period: 1h}\n");
    char value[32];
    snprintf(value, sizeof value, "cost-%d", mode);
    rl_attr attr = {"api_key", value, strlen(value)};
    rl_decision d;
    for (int left = 7; left >= 1; left -= 3) {
        cr_assert_eq(rl_check(t.agent, &attr, 1, 3, &d), RL_OK);
        cr_assert(d.allowed && !d.degraded);
        cr_assert_eq(d.remaining, (uint64_t)left, "%llu left, not %d",
                     (unsigned long long)d.remaining, left);
    }
    cr_assert_eq(rl_check(t.agent, &attr, 1, 3, &d), RL_OK);
    cr_assert(!d.allowed, "a cost of 3 passed with one token left");
    cr_assert(d.retry_after_ms > 720000 - 1000 && d.retry_after_ms <= 720000,
              "retry %lld ms, not the 720 s two more tokens take",
              (long long)d.retry_after_ms);
    cr_assert_eq(rl_check(t.agent, &attr, 1, 1, &d), RL_OK);
    cr_assert(d.allowed, "the rejected cost took the last token");
    cr_assert_eq(d.remaining, 0);
    test_agent_close(&t);
}

/* --- rl_check_nowait: at once, or RL_EAGAIN having charged nothing. ---- */

/* What an event loop does first (the nginx module): a request only a local
 * rule applies to is decided at once; one an exact rule applies to is
 * refused with RL_EAGAIN and no bucket, local or exact, loses a token. */
TEST_BOTH_MODES(exact, check_nowait_decides_only_what_needs_no_store)
{
    test_agent t;
    test_agent_open(&t, NULL, mode, NULL, NULL,
                    "  - {name: per-ip, match: ip, limit: 3, period: 1h, "
                    "mode: local}\n"
                    "  - {name: per-key, match: api_key, limit: 5, "
                    "period: 1h}\n");
    char key[32];
    snprintf(key, sizeof key, "nowait-%d", mode);
    rl_attr both[] = {{"ip", "10.9.8.7", 8}, {"api_key", key, strlen(key)}};
    rl_attr other = {"tenant", "t", 1};
    rl_decision d;
    cr_assert_eq(rl_check_nowait(t.agent, both, 1, 1, &d), RL_OK);
    cr_assert(d.allowed && !d.degraded);
    cr_assert_str_eq(d.rule, "per-ip");
    cr_assert_eq(d.remaining, 2);

    cr_assert_eq(rl_check_nowait(t.agent, both, 2, 1, &d), RL_EAGAIN);
    cr_assert_eq(rl_check_nowait(t.agent, &both[1], 1, 1, &d), RL_EAGAIN);
    cr_assert_eq(rl_check_nowait(t.agent, both, 1, 1, &d), RL_OK);
    cr_assert_eq(d.remaining, 1, "RL_EAGAIN charged the local rule");
    cr_assert_eq(rl_check(t.agent, &both[1], 1, 1, &d), RL_OK);
    cr_assert_eq(d.remaining, 4, "RL_EAGAIN charged the exact rule");

    /* no rule applies: allowed at once; bad calls fail as rl_check's */
    cr_assert_eq(rl_check_nowait(t.agent, &other, 1, 1, &d), RL_OK);
    cr_assert(d.allowed);
    cr_assert_str_eq(d.rule, "");
    cr_assert_eq(rl_check_nowait(t.agent, both, 1, 0, &d), RL_EINVAL);
    cr_assert_eq(rl_check_nowait(t.agent, both, 1, 1, NULL), RL_EINVAL);
    cr_assert_str_eq(rl_strerror(RL_EAGAIN),
                     "deciding would wait for the store");
    test_agent_close(&t);
}
