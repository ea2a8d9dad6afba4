/*
 * on_error: local without a store: the divisor (the aggregator's count,
 * then fleet_size, then 1), one agent's share of a rate and its rounding,
 * ten agents' shares over whole periods, and how a fallback answer
 * decides a request (degraded, the bucket's numbers, the rule's limit).
 * The fleet with Redis stopped is tests/integration/test_fallback.c.
 */
#include "agent_impl.h"
#include "config.h"
#include "fallback.h"

#include <criterion/criterion.h>
#include <string.h>

static rl_rule rule(const char *name, uint64_t limit, uint64_t period_ms,
                    uint64_t burst, rl_on_error on_error)
{
    rl_rule r = {.limit = limit, .period_ms = period_ms, .burst = burst,
                 .on_error = on_error};
    strcpy(r.name, name);
    return r;
}

Test(fallback, agents_are_the_aggregators_count_else_fleet_size_else_one)
{
    rl_rule r = rule("per-key", 100, 60000, 100, RL_ON_ERROR_LOCAL);
    rl_ident id = {0};
    atomic_init(&id.agents, 0);
    cr_assert_eq(rl_fallback_agents(&r, &id), 1, "no count, no fleet_size");
    cr_assert_eq(rl_fallback_agents(&r, NULL), 1);
    r.fleet_size = 10;
    cr_assert_eq(rl_fallback_agents(&r, &id), 10, "fleet_size when the "
                 "aggregator has not said");
    cr_assert_eq(rl_fallback_agents(&r, NULL), 10);
    /* The aggregator's count, once it has one, wins over fleet_size, in
     * both directions. */
    atomic_store(&id.agents, 7);
    cr_assert_eq(rl_fallback_agents(&r, &id), 7);
    atomic_store(&id.agents, 12);
    cr_assert_eq(rl_fallback_agents(&r, &id), 12);
    r.fleet_size = 0;
    cr_assert_eq(rl_fallback_agents(&r, &id), 12);
}

Test(fallback, a_share_refills_exactly_and_rounds_the_burst_up)
{
    rl_limit rate = {.limit = 100, .period_ms = 60000, .burst = 100};
    rl_limit share;
    /* 100 a minute among 3: 100 per 3 minutes, no third of a token lost;
     * a capacity of 33.3 tokens holds 34. */
    rl_fallback_rate(&rate, 3, &share);
    cr_assert_eq(share.limit, 100);
    cr_assert_eq(share.period_ms, 180000);
    cr_assert_eq(share.burst, 34);
    rl_fallback_rate(&rate, 10, &share);
    cr_assert_eq(share.limit, 100);
    cr_assert_eq(share.period_ms, 600000);
    cr_assert_eq(share.burst, 10);
    /* More agents than tokens: each still holds one. */
    rl_fallback_rate(&rate, 1000, &share);
    cr_assert_eq(share.burst, 1);
    cr_assert_eq(share.period_ms, 60000000);
    /* One agent (or none said): the rule's own rate. */
    rl_fallback_rate(&rate, 1, &share);
    cr_assert_eq(share.period_ms, 60000);
    cr_assert_eq(share.burst, 100);
    rl_fallback_rate(&rate, 0, &share);
    cr_assert_eq(share.period_ms, 60000);
    cr_assert_eq(share.burst, 100);
}

static bool spend_at(rl_local *l, const rl_rule *r, const rl_limit *share,
                     uint64_t now_ms, rl_bucket_reply *out)
{
    bool refused;
    rl_local_check_at(l, r, NULL, share, "ak_1", 4, 1, now_ms, out,
                      &refused);
    cr_assert(!refused);
    return out->allowed;
}

/* One agent's share of 100 a minute among 3: its 34 tokens, then one
 * every 1.8 s, and the reply speaks in that share's numbers. */
Test(fallback, one_share_admits_its_burst_then_its_rate)
{
    rl_rule r = rule("per-key", 100, 60000, 100, RL_ON_ERROR_LOCAL);
    rl_limit share;
    rl_fallback_rate(&r.own, 3, &share);
    rl_local l;
    rl_local_init(&l, 10);
    rl_bucket_reply out;
    int allowed = 0;
    for (int i = 0; i < 50; i++)
        allowed += spend_at(&l, &r, &share, 1000, &out);
    cr_assert_eq(allowed, 34);
    cr_assert(!out.allowed);
    cr_assert_eq(out.remaining, 0);
    cr_assert_eq(out.retry_ms, 1800, "retry %lld", (long long)out.retry_ms);
    cr_assert(!spend_at(&l, &r, &share, 2799, &out));
    cr_assert(spend_at(&l, &r, &share, 2800, &out));
    rl_local_fini(&l);
}

/* Ten agents each offered twice their share for 20 s (four periods of
 * 5 s) admit together the limit per period plus the burst, from full:
 * 200 x 4 + 200 = 1,000. Each agent alone at the whole limit would admit
 * all 1,600 offered. */
Test(fallback, ten_shares_admit_the_limit_over_whole_periods)
{
    rl_rule r = rule("per-key", 200, 5000, 200, RL_ON_ERROR_LOCAL);
    r.fleet_size = 10;
    rl_limit share;
    rl_fallback_rate(&r.own, rl_fallback_agents(&r, NULL), &share);
    rl_local agents[10];
    for (int a = 0; a < 10; a++)
        rl_local_init(&agents[a], 10);
    int admitted = 0, offered = 0;
    rl_bucket_reply out;
    /* 80 a second round-robin: agent i % 10 every 12.5 ms. */
    for (int i = 0; i < 1600; i++) {
        uint64_t now = 100000 + (uint64_t)i * 25 / 2;
        admitted += spend_at(&agents[i % 10], &r, &share, now, &out);
        offered++;
    }
    for (int a = 0; a < 10; a++)
        rl_local_fini(&agents[a]);
    cr_assert_eq(offered, 1600);
    cr_assert_geq(admitted, 990, "admitted %d", admitted);
    cr_assert_leq(admitted, 1000, "admitted %d", admitted);
}

static rl_rule_state unanswered(const rl_rule *r)
{
    return (rl_rule_state){.rule = r, .outcome = RL_OUTCOME_FAILED};
}

Test(fallback, a_fallback_answer_decides_degraded_with_its_numbers)
{
    rl_rule r = rule("per-key", 100, 60000, 100, RL_ON_ERROR_LOCAL);
    rl_rule_state s = unanswered(&r);
    s.fallback = true;
    s.reply = (rl_bucket_reply){.allowed = false, .remaining = 0,
                                .retry_ms = 1800, .reset_ms = 61200};
    rl_decision d;
    rl_decide(&s, 1, &d);
    cr_assert(!d.allowed);
    cr_assert(d.degraded);
    cr_assert_str_eq(d.rule, "per-key");
    cr_assert_eq(d.retry_after_ms, 1800);
    cr_assert_eq(d.remaining, 0);
    cr_assert_eq(d.limit, 100, "the rule's limit, not the share's");
    cr_assert_eq(d.period_ms, 60000);
    cr_assert(rl_unanswered_allows(&s) == false);

    s.reply = (rl_bucket_reply){.allowed = true, .remaining = 9,
                                .reset_ms = 1800};
    rl_decide(&s, 1, &d);
    cr_assert(d.allowed && d.degraded);
    cr_assert_eq(d.remaining, 9, "the share's tokens, not a full bucket");
    cr_assert(rl_unanswered_allows(&s));

    /* No bucket could be had (its cap): local allows, as allow does. */
    s.fallback = false;
    rl_decide(&s, 1, &d);
    cr_assert(d.allowed && d.degraded);
    cr_assert_eq(d.remaining, 100);
}

static int asked;

static bool empty_bucket(void *arg, const rl_rule_state *rs,
                         rl_bucket_reply *out)
{
    (void)arg;
    asked++;
    if (rs->rule->on_error != RL_ON_ERROR_LOCAL)
        return false;
    *out = (rl_bucket_reply){.allowed = false, .retry_ms = 700};
    return true;
}

/* A caller that gives up on the I/O thread asks the fallback for the
 * exact rules (their states are the I/O thread's); allow and deny rules
 * decide as before. */
Test(fallback, a_caller_that_gives_up_asks_the_fallback)
{
    rl_rule local = rule("per-key", 100, 60000, 100, RL_ON_ERROR_LOCAL);
    rl_rule open = rule("per-ip", 100, 60000, 100, RL_ON_ERROR_ALLOW);
    rl_rule_state s[] = {{.rule = &open, .outcome = RL_OUTCOME_PENDING},
                         {.rule = &local, .outcome = RL_OUTCOME_PENDING}};
    rl_decision d;
    asked = 0;
    rl_decide_unanswered(s, 2, empty_bucket, NULL, &d);
    cr_assert(!d.allowed && d.degraded && d.fallback);
    cr_assert_str_eq(d.rule, "per-key");
    cr_assert_eq(d.retry_after_ms, 700);
    cr_assert_eq(asked, 2);
    /* Without a fallback function: local allows. */
    rl_decide_unanswered(s, 2, NULL, NULL, &d);
    cr_assert(d.allowed && d.degraded);
}

Test(fallback, on_error_allow_and_deny_are_unchanged)
{
    rl_rule open = rule("open", 10, 1000, 10, RL_ON_ERROR_ALLOW);
    rl_rule shut = rule("shut", 10, 1000, 10, RL_ON_ERROR_DENY);
    rl_rule_state s = unanswered(&open);
    rl_decision d;
    rl_decide(&s, 1, &d);
    cr_assert(d.allowed && d.degraded);
    cr_assert_eq(d.remaining, 10);
    s = unanswered(&shut);
    rl_decide(&s, 1, &d);
    cr_assert(!d.allowed && d.degraded && !d.fallback);
    cr_assert_eq(d.retry_after_ms, 1000);
    cr_assert_eq(d.remaining, 0);
}
