/*
 * A reload that changes an exact or leased rule's rate keeps the tokens
 * spent (issue 28): a spent client stays spent when the limit drops and
 * gets the difference, no more, when it rises. Each case in both modes and
 * through FCALL and EVALSHA. Periods of a minute and more: the refill
 * while a case runs (a token per 600 ms at the fastest) stays below one.
 */
#include "config.h"
#include "test_agent.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static void reload_to(test_agent *t, test_scripts scripts, const char *rule)
{
    char yaml[512];
    int n = snprintf(yaml, sizeof yaml,
                     "store: {url: \"redis://%s\", scripts: %s, "
                     "timeout_ms: 1000}\nrules:\n%s", t->addr,
                     scripts == TEST_FCALL ? "function" : "eval", rule);
    cr_assert_lt((size_t)n, sizeof yaml);
    rl_config *cfg;
    rl_error err;
    cr_assert_eq(rl_config_parse(yaml, (size_t)n, "<reload>", &cfg, &err),
                 RL_OK, "%s", err.message);
    cr_assert_eq(rl_agent_reload_config(t->agent, cfg, &err), RL_OK, "%s",
                 err.message);
}

static int admitted(test_agent *t, const char *value, int n)
{
    rl_attr attr = {"api_key", value, strlen(value)};
    int allowed = 0;
    for (int i = 0; i < n; i++) {
        rl_decision d;
        cr_assert_eq(rl_check(t->agent, &attr, 1, 1, &d), RL_OK);
        cr_assert(!d.degraded);
        allowed += d.allowed;
    }
    return allowed;
}

/* spend tokens at `from`, reload to `to`, then offer `offered`: the
 * bucket of `to` less what was spent is admitted, exactly. */
static void rate_change(test_scripts scripts, const char *mode,
                        const char *from, const char *to, int spend,
                        int offered, int want, const char *what)
{
    char value[64], rule_from[256], rule_to[256];
    snprintf(value, sizeof value, "rate-%s-%s-%d-%d", what, mode, scripts,
             (int)getpid());
    const char *fmt = "  - {name: per-key, match: api_key, %s, mode: %s}\n";
    snprintf(rule_from, sizeof rule_from, fmt, from, mode);
    snprintf(rule_to, sizeof rule_to, fmt, to, mode);
    test_agent t;
    test_agent_open(&t, NULL, scripts, NULL, NULL, rule_from);
    cr_assert_eq(admitted(&t, value, spend), spend);
    reload_to(&t, scripts, rule_to);
    int got = admitted(&t, value, offered);
    cr_assert_eq(got, want, "%s (%s): %d of %d admitted after the reload, "
                 "want %d", what, mode, got, offered, want);
    test_agent_close(&t);
}

/* Today's figure: 98 of 200 (the expiry of a spent minute read at an
 * hour's rate is 1.67 tokens short). */
static void lowered(test_scripts scripts, const char *mode)
{
    rate_change(scripts, mode, "limit: 100, period: 1m",
                "limit: 100, period: 1h", 100, 200, 0, "period-up");
    rate_change(scripts, mode, "limit: 100, period: 1m",
                "limit: 50, period: 1m", 60, 50, 0, "limit-down");
}

/* 10 a minute, all spent; at 20 a minute 10 more are due (a 10-token
 * bucket read at twice the rate looks spent twice over: 0). With a
 * fractional interval (7 a minute) the remainder is converted too. */
static void raised(test_scripts scripts, const char *mode)
{
    rate_change(scripts, mode, "limit: 10, period: 1m",
                "limit: 20, period: 1m", 10, 30, 10, "limit-up");
    rate_change(scripts, mode, "limit: 7, period: 1m",
                "limit: 14, period: 1m", 7, 20, 7, "fractional");
    rate_change(scripts, mode, "limit: 10, period: 1m",
                "limit: 10, period: 1m, burst: 15", 10, 20, 5, "burst-up");
}

TEST_BOTH_MODES(rate_change, exact_lowered_keeps_a_spent_client_spent)
{
    lowered(mode, "exact");
}

TEST_BOTH_MODES(rate_change, leased_lowered_keeps_a_spent_client_spent)
{
    lowered(mode, "leased");
}

TEST_BOTH_MODES(rate_change, exact_raised_gives_the_difference)
{
    raised(mode, "exact");
}

TEST_BOTH_MODES(rate_change, leased_raised_gives_the_difference)
{
    raised(mode, "leased");
}
