/*
 * rl_check_rule_async: one rule named by the caller, for a key value, at
 * the caller's rate, cost 0 included, against a real redis-server.
 */
#include "test_agent.h"
#include "test_env.h"

#include <criterion/criterion.h>
#include <semaphore.h>
#include <string.h>

typedef struct answer {
    sem_t done;
    rl_decision d;
} answer;

static void on_decision(const rl_decision *d, void *arg)
{
    answer *an = arg;
    an->d = *d;
    sem_post(&an->done);
}

/* One check of rule for value at rate (NULL: the rule's own). */
static rl_decision check_rule(test_agent *t, const char *rule,
                              const char *value, const rl_rate *rate,
                              uint32_t cost)
{
    answer an;
    sem_init(&an.done, 0, 0);
    int rc = rl_check_rule_async(t->agent, rule, value, strlen(value), rate,
                                 cost, on_decision, &an);
    cr_assert_eq(rc, RL_OK, "%s", rl_strerror(rc));
    sem_wait(&an.done);
    sem_destroy(&an.done);
    cr_assert(!an.d.degraded, "%s %s degraded", rule, value);
    return an.d;
}

static const char rules[] =
    "  - {name: w, match: k, limit: 100, period: 1h, "
    "algorithm: fixed_window, key_prefix: 'rl:cr:w:'}\n"
    "  - {name: b, match: k, limit: 100, period: 1h, "
    "key_prefix: 'rl:cr:b:'}\n"
    "  - {name: l, match: k, limit: 100, period: 1h, mode: local, "
    "key_prefix: 'rl:cr:l:'}\n"
    "  - {name: s, match: k, limit: 100, period: 1h, mode: synced, "
    "key_prefix: 'rl:cr:s:'}\n"
    "  - {name: ls, match: k, limit: 100, period: 1h, mode: leased, "
    "key_prefix: 'rl:cr:ls:'}\n";

/* A window's count is its key's whatever the rate: a limit of 3 spends
 * it, a limit of 5 then has 2 more, and cost 0 reads it without a hit. */
Test(check_rule, the_callers_rate_applies_to_the_keys_count)
{
    test_agent t;
    test_agent_open(&t, NULL, TEST_FCALL, NULL, NULL, rules);
    rl_rate three = {3, 3600000, 0}, five = {5, 3600000, 0};
    for (int i = 0; i < 3; i++) {
        rl_decision d = check_rule(&t, "w", "rate", &three, 1);
        cr_assert(d.allowed);
        cr_assert_eq(d.limit, 3);
        cr_assert_eq(d.remaining, (uint64_t)(2 - i));
    }
    cr_assert(!check_rule(&t, "w", "rate", &three, 1).allowed);
    /* The refused hit counted: 4 of 5. */
    rl_decision d = check_rule(&t, "w", "rate", &five, 0);
    cr_assert(d.allowed);
    cr_assert_eq(d.remaining, 1);
    cr_assert(check_rule(&t, "w", "rate", &five, 1).allowed);
    cr_assert(!check_rule(&t, "w", "rate", &five, 1).allowed);
    d = check_rule(&t, "w", "rate", NULL, 0);
    cr_assert(d.allowed);
    cr_assert_eq(d.limit, 100);
    cr_assert_eq(d.remaining, 94, "remaining %llu",
                 (unsigned long long)d.remaining);
    test_agent_close(&t);
}

Test(check_rule, a_bucket_and_a_local_rule_at_the_callers_rate)
{
    test_agent t;
    test_agent_open(&t, NULL, TEST_FCALL, NULL, NULL, rules);
    rl_rate two = {2, 3600000, 0};
    const char *names[] = {"b", "l"};
    for (int r = 0; r < 2; r++) {
        int allowed = 0;
        for (int i = 0; i < 5; i++)
            allowed += check_rule(&t, names[r], "tb", &two, 1).allowed;
        cr_assert_eq(allowed, 2, "rule %s admitted %d", names[r], allowed);
        rl_decision d = check_rule(&t, names[r], "tb", &two, 0);
        cr_assert(d.allowed, "cost 0 is always let through a bucket");
        cr_assert_eq(d.remaining, 0);
    }
    /* Only the rule named is checked: w's key was never touched. */
    cr_assert_eq(check_rule(&t, "w", "tb", NULL, 0).remaining, 100);
    test_agent_close(&t);
}

/* A synced rule counts the caller's limit, in the rule's period, as an
 * override's (its agent alone: no aggregator has told it of others); a
 * leased rule leases from the key's bucket at the caller's rate. Each
 * admits the caller's 3, not the rule's 100. */
Test(check_rule, a_synced_and_a_leased_rule_at_the_callers_rate)
{
    test_agent t;
    test_agent_open(&t, NULL, TEST_FCALL, NULL, NULL, rules);
    rl_rate three = {3, 3600000, 0};
    const char *names[] = {"s", "ls"};
    for (int r = 0; r < 2; r++) {
        int allowed = 0;
        for (int i = 0; i < 6; i++) {
            rl_decision d = check_rule(&t, names[r], "mode", &three, 1);
            allowed += d.allowed;
            cr_assert_eq(d.limit, 3, "rule %s: limit %llu", names[r],
                         (unsigned long long)d.limit);
        }
        cr_assert_eq(allowed, 3, "rule %s admitted %d", names[r], allowed);
    }
    /* The rule's own rate is another key's business: 100 of it. */
    cr_assert_eq(check_rule(&t, "s", "other", NULL, 1).remaining, 99);
    test_agent_close(&t);
}

Test(check_rule, what_cannot_be_checked_is_refused)
{
    test_agent t;
    test_agent_open(&t, NULL, TEST_FCALL, NULL, NULL, rules);
    answer an;
    rl_rate ok = {2, 1000, 0}, zero = {0, 1000, 0}, huge = {1, 1ULL << 52,
                                                            4};
    struct {
        const char *rule, *value;
        size_t len;
        const rl_rate *rate;
        int rc;
    } cases[] = {
        {"nope", "v", 1, NULL, RL_EINVAL},   /* no such rule */
        {"s", "v", 1, &ok, RL_EINVAL},       /* not a synced rule's period */
        {"w", "v", 1, &zero, RL_EINVAL},
        {"b", "v", 1, &huge, RL_EINVAL},     /* burst x period past 2^53 */
        {"w", "", 0, NULL, RL_EINVAL},
        {"w", "a\0b", 3, NULL, RL_EINVAL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        cr_assert_eq(rl_check_rule_async(t.agent, cases[i].rule,
                                         cases[i].value, cases[i].len,
                                         cases[i].rate, 1, on_decision, &an),
                     cases[i].rc, "case %zu", i);
    static char long_value[5000];
    memset(long_value, 'x', sizeof long_value - 1);
    cr_assert_eq(rl_check_rule_async(t.agent, "w", long_value,
                                     strlen(long_value), NULL, 1,
                                     on_decision, &an), RL_ETOOLONG);
    cr_assert_eq(rl_check_rule_async(t.agent, "w", "v", 1, NULL, 1, NULL,
                                     NULL), RL_EINVAL);
    /* A fixed window counts hits: any limit over any period, as Envoy's
     * descriptors give them (4,294,967,295 a year). */
    rl_rate year = {4294967295u, 365ULL * 24 * 3600 * 1000, 0};
    rl_decision d = check_rule(&t, "w", "a-year", &year, 1);
    cr_assert(d.allowed);
    cr_assert_eq(d.remaining, 4294967294u);
    cr_assert_eq(rl_check_rule_async(t.agent, "b", "a-year", 6, &year, 1,
                                     on_decision, &an), RL_EINVAL,
                 "a bucket of that size is past 2^53");
    /* A synced rule at its own rate is checked as any check would. */
    cr_assert(check_rule(&t, "s", "own", NULL, 1).allowed);
    test_agent_close(&t);
}
