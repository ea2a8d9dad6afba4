/*
 * algorithm: fixed_window against a real redis-server: a count per key and
 * epoch-aligned window, INCRBY and PEXPIRE with no script, envoyproxy/
 * ratelimit's arithmetic (remaining = limit - count, reset at the window's
 * end, a refused hit counted), exact under contention, refunds that give
 * hits back, and the same windows in the agent for mode: local.
 */
#include "redis_server.h"
#include "test_agent.h"
#include "test_env.h"

#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

/* A check made between t0 and t1 (wall clock) said its window ends
 * reset_ms later: that end must be the first multiple of the period after
 * t0 (give or take the clocks' 20 ms), wherever in the window it came. */
static void expect_end_on_boundary(uint64_t t0, uint64_t t1, uint64_t reset,
                                   uint64_t period_ms)
{
    uint64_t lo = t0 + reset - 20, hi = t1 + reset + 20;
    uint64_t boundary = (hi / period_ms) * period_ms;
    cr_assert(boundary >= lo, "a check between %llu and %llu ends its "
              "window %llu ms later: no multiple of %llu ms there",
              (unsigned long long)t0, (unsigned long long)t1,
              (unsigned long long)reset, (unsigned long long)period_ms);
    cr_assert(boundary <= t0 + period_ms + 20, "the window ends at %llu, "
              "past the one that holds %llu", (unsigned long long)boundary,
              (unsigned long long)t0);
}

Test(fixed_window, twenty_count_down_then_refuse_until_the_window_ends)
{
    test_agent t;
    test_agent_open(&t, NULL, TEST_FCALL, NULL, NULL,
                    "  - {name: w, match: api_key, limit: 20, period: 1m, "
                    "algorithm: fixed_window}\n");
    test_away_from_window_edge(60000, 5000);
    for (int i = 0; i < 20; i++) {
        uint64_t t0 = test_wall_ms();
        rl_decision d = test_check(&t, "api_key=twenty", NULL);
        cr_assert(d.allowed, "check %d refused", i + 1);
        cr_assert_eq(d.remaining, (uint64_t)(19 - i));
        cr_assert_eq(d.limit, 20);
        expect_end_on_boundary(t0, test_wall_ms(), d.reset_ms, 60000);
    }
    rl_decision d = test_check(&t, "api_key=twenty", NULL);
    cr_assert(!d.allowed);
    cr_assert_eq(d.remaining, 0);
    cr_assert_eq(d.retry_after_ms, (int64_t)d.reset_ms,
                 "retry %lld ms, reset %llu", (long long)d.retry_after_ms,
                 (unsigned long long)d.reset_ms);
    /* Upstream's arithmetic: the refused hit is counted too. */
    cr_assert_eq(test_fixed_window_count(t.addr, "rl:key:twenty"), 21);
    char key[64];
    snprintf(key, sizeof key, "rl:key:twenty:%llu",
             (unsigned long long)(test_wall_ms() / 60000));
    long long ttl = test_redis_pttl(t.addr, key);
    cr_assert(ttl > 55000 && ttl <= 60000, "%s: PTTL %lld", key, ttl);
    test_agent_close(&t);
}

struct contender {
    test_agent *t;
    atomic_int allowed, errors;
};

static void *contend(void *arg)
{
    struct contender *c = arg;
    rl_attr attr = {"api_key", "fifty", 5};
    for (int i = 0; i < 20; i++) {
        rl_decision d;
        if (rl_check(c->t->agent, &attr, 1, 1, &d) != RL_OK || d.degraded)
            atomic_fetch_add(&c->errors, 1);
        else if (d.allowed)
            atomic_fetch_add(&c->allowed, 1);
    }
    return NULL;
}

Test(fixed_window, fifty_threads_admit_exactly_the_limit)
{
    test_agent t;
    test_agent_open(&t, NULL, TEST_FCALL, NULL, NULL,
                    "  - {name: w, match: api_key, limit: 100, period: 1h, "
                    "algorithm: fixed_window}\n");
    test_away_from_window_edge(3600000, 30000);
    struct contender c = {.t = &t};
    pthread_t threads[50];
    for (int i = 0; i < 50; i++)
        cr_assert_eq(pthread_create(&threads[i], NULL, contend, &c), 0);
    for (int i = 0; i < 50; i++)
        pthread_join(threads[i], NULL);
    cr_assert_eq(atomic_load(&c.errors), 0);
    cr_assert_eq(atomic_load(&c.allowed), 100, "1,000 admitted %d",
                 atomic_load(&c.allowed));
    cr_assert_eq(test_fixed_window_count(t.addr, "rl:key:fifty"), 1000);
    test_agent_close(&t);
}

/* Windows start at multiples of the period since the epoch, on every
 * agent: spent in one, the next second's window is whole again. */
Test(fixed_window, the_next_window_starts_at_the_periods_boundary)
{
    test_agent t;
    test_agent_open(&t, NULL, TEST_FCALL, NULL, NULL,
                    "  - {name: w, match: api_key, limit: 5, period: 1s, "
                    "algorithm: fixed_window}\n");
    /* Anywhere in a window, it ends on the next second. */
    for (int i = 0; i < 12; i++) {
        char attr[32];
        snprintf(attr, sizeof attr, "api_key=tick-%d", i);
        uint64_t t0 = test_wall_ms();
        rl_decision d = test_check(&t, attr, NULL);
        expect_end_on_boundary(t0, test_wall_ms(), d.reset_ms, 1000);
        test_sleep_ms(90);
    }
    test_away_from_window_edge(1000, 400);
    int allowed = 0;
    for (int i = 0; i < 8; i++)
        allowed += test_check(&t, "api_key=second", NULL).allowed;
    cr_assert_eq(allowed, 5);
    rl_decision d = test_check(&t, "api_key=second", NULL);
    cr_assert(!d.allowed);
    test_sleep_ms((unsigned)d.retry_after_ms + 30);
    allowed = 0;
    for (int i = 0; i < 8; i++)
        allowed += test_check(&t, "api_key=second", NULL).allowed;
    cr_assert_eq(allowed, 5, "the next window admitted %d", allowed);
    test_agent_close(&t);
}

/* A bucket of 3 and a window of 10 on one request, ten requests: with
 * charge: all the window counts every hit (10); with refund, only the
 * three admitted requests' (the refused ones are given back). With the
 * window refusing (2 of a bucket of 100), refund gives back the window's
 * own refused hits too, and the bucket's tokens of refused requests. */
static void bucket_and_window(const char *charge, const char *value,
                              long long window_want)
{
    test_agent t;
    test_agent_open(&t, NULL, TEST_FCALL, NULL, charge,
                    "  - {name: w, match: api_key, limit: 10, period: 1h, "
                    "algorithm: fixed_window, key_prefix: 'rl:fw:'}\n"
                    "  - {name: b, match: api_key, limit: 3, period: 1h}\n");
    test_away_from_window_edge(3600000, 30000);
    char attr[64], key[64];
    snprintf(attr, sizeof attr, "api_key=%s", value);
    int allowed = 0;
    for (int i = 0; i < 10; i++)
        allowed += test_check(&t, attr, NULL).allowed;
    cr_assert_eq(allowed, 3);
    snprintf(key, sizeof key, "rl:fw:%s", value);
    test_fixed_window_expect(t.addr, key, window_want);
    test_agent_close(&t);
}

Test(fixed_window, charge_all_counts_every_hit_refund_gives_them_back)
{
    bucket_and_window(NULL, "all", 10);
    bucket_and_window("refund", "refund", 3);
    bucket_and_window("atomic", "atomic", 3);
}

Test(fixed_window, a_refused_window_gives_its_own_hit_back_under_refund)
{
    test_agent t;
    test_agent_open(&t, NULL, TEST_FCALL, NULL, "refund",
                    "  - {name: w, match: api_key, limit: 2, period: 1h, "
                    "algorithm: fixed_window, key_prefix: 'rl:fw:'}\n"
                    "  - {name: b, match: api_key, limit: 100, period: 1h}\n");
    test_away_from_window_edge(3600000, 30000);
    int allowed = 0;
    for (int i = 0; i < 5; i++) {
        rl_decision d = test_check(&t, "api_key=own", NULL);
        allowed += d.allowed;
        if (!d.allowed)
            cr_assert_str_eq(d.rule, "w");
    }
    cr_assert_eq(allowed, 2);
    test_fixed_window_expect(t.addr, "rl:fw:own", 2);
    /* The bucket was given back the three refused requests' tokens. */
    rl_decision d = test_check(&t, "api_key=own", NULL);
    cr_assert(!d.allowed);
    test_fixed_window_expect(t.addr, "rl:fw:own", 2);
    test_agent_close(&t);
}

/* mode: local keeps the same windows in the agent: no key in Redis, and
 * the next window starts from nothing. */
Test(fixed_window, mode_local_counts_windows_in_the_agent)
{
    test_agent t;
    test_agent_open(&t, NULL, TEST_FCALL, NULL, NULL,
                    "  - {name: w, match: api_key, limit: 5, period: 1h, "
                    "algorithm: fixed_window, mode: local, "
                    "key_prefix: 'rl:fwl:'}\n"
                    "  - {name: s, match: user, limit: 2, period: 1s, "
                    "algorithm: fixed_window, mode: local, "
                    "key_prefix: 'rl:fws:'}\n");
    test_away_from_window_edge(3600000, 30000);
    for (int i = 0; i < 5; i++) {
        rl_decision d = test_check(&t, "api_key=here", NULL);
        cr_assert(d.allowed);
        cr_assert_eq(d.remaining, (uint64_t)(4 - i));
    }
    rl_decision d = test_check(&t, "api_key=here", NULL);
    cr_assert(!d.allowed);
    uint64_t reset = 3600000 - test_wall_ms() % 3600000;
    cr_assert(d.retry_after_ms + 100 >= (int64_t)reset
                  && d.retry_after_ms <= (int64_t)reset + 100,
              "retry %lld ms, the window ends in %llu",
              (long long)d.retry_after_ms, (unsigned long long)reset);
    cr_assert_eq(test_fixed_window_count(t.addr, "rl:fwl:here"), 0);

    test_away_from_window_edge(1000, 300);
    int allowed = 0;
    for (int i = 0; i < 4; i++)
        allowed += test_check(&t, "user=u", NULL).allowed;
    cr_assert_eq(allowed, 2);
    test_away_from_window_edge(1000, 1000);
    allowed = 0;
    for (int i = 0; i < 4; i++)
        allowed += test_check(&t, "user=u", NULL).allowed;
    cr_assert_eq(allowed, 2, "the next second's window admitted %d",
                 allowed);
    test_agent_close(&t);
}
