/*
 * Combining rules into one decision, and the headers it becomes, without a
 * store: the seed's table row by row, on_error, and header rounding.
 */
#include "agent_impl.h"
#include "config.h"

#include <criterion/criterion.h>
#include <string.h>

static rl_rule rule(const char *name, uint64_t limit, uint64_t period_ms,
                    rl_on_error on_error)
{
    rl_rule r = {.limit = limit, .period_ms = period_ms, .burst = limit,
                 .on_error = on_error};
    strcpy(r.name, name);
    return r;
}

static rl_rule_state answered(const rl_rule *r, bool allowed,
                              uint64_t remaining, int64_t retry_ms)
{
    return (rl_rule_state){.rule = r, .outcome = RL_OUTCOME_ANSWERED,
                           .reply = {.allowed = allowed,
                                     .remaining = remaining,
                                     .retry_ms = retry_ms,
                                     .reset_ms = 1234}};
}

static void headers_of(const rl_decision *d, char *buf)
{
    cr_assert_gt(rl_format_headers(d, buf, 512), 0);
}

Test(decision, seed_table_row_by_row)
{
    rl_rule ip = rule("per-ip", 1000, 60000, RL_ON_ERROR_ALLOW);
    rl_rule key = rule("per-key", 100, 60000, RL_ON_ERROR_ALLOW);
    rl_rule tenant = rule("per-tenant", 10000, 3600000, RL_ON_ERROR_ALLOW);
    rl_decision d;
    char h[512];

    rl_rule_state all_allow[] = {answered(&ip, true, 900, 0),
                                 answered(&key, true, 40, 0),
                                 answered(&tenant, true, 9000, 0)};
    rl_decide(all_allow, 3, &d);
    cr_assert(d.allowed && !d.degraded);
    cr_assert_str_eq(d.rule, "per-key", "the tightest rule");
    cr_assert_eq(d.remaining, 40);
    headers_of(&d, h);
    cr_assert_null(strstr(h, "Retry-After"));

    rl_rule_state key_rejects[] = {answered(&ip, true, 900, 0),
                                   answered(&key, false, 0, 600),
                                   answered(&tenant, true, 9000, 0)};
    rl_decide(key_rejects, 3, &d);
    cr_assert(!d.allowed);
    cr_assert_str_eq(d.rule, "per-key");
    cr_assert_eq(d.retry_after_ms, 600);
    headers_of(&d, h);
    cr_assert_str_eq(h, "RateLimit-Limit: 100\r\n"
                        "RateLimit-Remaining: 0\r\n"
                        "RateLimit-Reset: 2\r\n"
                        "Retry-After: 1\r\n"
                        "RateLimit-Policy: \"per-key\";q=100;w=60\r\n"
                        "RateLimit: \"per-key\";r=0;t=2\r\n");

    rl_rule_state ip_rejects[] = {answered(&ip, false, 0, 2000),
                                  answered(&key, true, 40, 0),
                                  answered(&tenant, true, 9000, 0)};
    rl_decide(ip_rejects, 3, &d);
    cr_assert_str_eq(d.rule, "per-ip");
    headers_of(&d, h);
    cr_assert(strstr(h, "Retry-After: 2\r\n") != NULL, "%s", h);

    rl_rule_state all_reject[] = {answered(&ip, false, 0, 2000),
                                  answered(&key, false, 0, 600),
                                  answered(&tenant, false, 0, 400)};
    rl_decide(all_reject, 3, &d);
    cr_assert_str_eq(d.rule, "per-ip", "the longest retry decides");
    cr_assert_eq(d.retry_after_ms, 2000);
}

Test(decision, never_outlasts_any_retry)
{
    rl_rule a = rule("a", 5, 1000, RL_ON_ERROR_ALLOW);
    rl_rule b = rule("b", 5, 1000, RL_ON_ERROR_ALLOW);
    rl_rule_state s[] = {answered(&a, false, 0, 5000),
                         answered(&b, false, 0, -1)};
    rl_decision d;
    rl_decide(s, 2, &d);
    cr_assert_str_eq(d.rule, "b");
    cr_assert_eq(d.retry_after_ms, -1);
    char h[512];
    headers_of(&d, h);
    cr_assert_null(strstr(h, "Retry-After"), "%s", h);
}

Test(decision, unanswered_rules_follow_on_error)
{
    rl_rule open = rule("open", 10, 1000, RL_ON_ERROR_ALLOW);
    rl_rule shut = rule("shut", 10, 1000, RL_ON_ERROR_DENY);
    rl_rule_state s[] = {
        {.rule = &open, .outcome = RL_OUTCOME_FAILED},
        answered(&shut, true, 3, 0),
    };
    rl_decision d;
    rl_decide(s, 2, &d);
    cr_assert(d.allowed && d.degraded);
    cr_assert_str_eq(d.rule, "shut", "the answered rule is the tightest");

    rl_decide_unanswered(s, 2, NULL, NULL, &d);
    cr_assert(!d.allowed && d.degraded);
    cr_assert_str_eq(d.rule, "shut");
    cr_assert_eq(d.retry_after_ms, 1000);
}

Test(decision, skipped_rules_do_not_count)
{
    rl_rule a = rule("a", 10, 1000, RL_ON_ERROR_DENY);
    rl_rule b = rule("b", 10, 1000, RL_ON_ERROR_DENY);
    rl_rule_state s[] = {answered(&a, false, 0, 300),
                         {.rule = &b, .outcome = RL_OUTCOME_SKIPPED}};
    rl_decision d;
    rl_decide(s, 2, &d);
    cr_assert(!d.allowed && !d.degraded);
    cr_assert_str_eq(d.rule, "a");
}

Test(decision, headers_need_room_and_say_nothing_without_a_rule)
{
    rl_decision d = {.allowed = true};
    char h[512];
    cr_assert_eq(rl_format_headers(&d, h, sizeof h), 0);
    cr_assert_str_empty(h);
    strcpy(d.rule, "per-key");
    d.limit = 100;
    d.period_ms = 500;
    cr_assert_eq(rl_format_headers(&d, h, 20), RL_ETOOLONG);
    cr_assert_str_empty(h, "a cut header block was left in the buffer");
    cr_assert_gt(rl_format_headers(&d, h, sizeof h), 0);
    cr_assert(strstr(h, ";w=1\r\n") != NULL, "half a second rounds up: %s", h);
    cr_assert_eq(rl_format_headers(NULL, h, sizeof h), RL_EINVAL);
}

Test(decision, a_synced_verdict_stands_when_the_store_is_given_up_on)
{
    rl_rule local = rule("per-tenant", 10, 1000, RL_ON_ERROR_ALLOW);
    local.mode = RL_MODE_SYNCED;
    rl_rule remote = rule("per-key", 10, 1000, RL_ON_ERROR_ALLOW);
    rl_rule_state s[] = {answered(&local, false, 0, 700),
                         {.rule = &remote, .outcome = RL_OUTCOME_PENDING}};
    rl_decision d;
    rl_decide_unanswered(s, 2, NULL, NULL, &d);
    cr_assert(!d.allowed, "the synced rejection was lost");
    cr_assert(d.degraded);
    cr_assert_str_eq(d.rule, "per-tenant");
    cr_assert_eq(d.retry_after_ms, 700);
}

Test(decision, body_is_the_gateways_json_and_escapes_names)
{
    rl_decision d = {.allowed = true};
    char b[1024];
    cr_assert_eq(rl_format_body(&d, b, sizeof b), 17);
    cr_assert_str_eq(b, "{\"allowed\":true}\n");
    strcpy(d.rule, "per-key");
    d.remaining = 7;
    rl_format_body(&d, b, sizeof b);
    cr_assert_str_eq(b, "{\"allowed\":true,\"rule\":\"per-key\","
                        "\"remaining\":7}\n");
    d = (rl_decision){.limit = 100, .period_ms = 60000,
                      .retry_after_ms = 1001};
    strcpy(d.rule, "a\"b\\c\n");
    rl_format_body(&d, b, sizeof b);
    cr_assert_str_eq(b, "{\"error\":\"rate_limited\",\"rule\":"
                        "\"a\\\"b\\\\c\\u000a\",\"limit\":100,"
                        "\"period_ms\":60000,\"override\":\"default\","
                        "\"retry_after_s\":2}\n");
    d.degraded = true;
    d.retry_after_ms = -1;
    strcpy(d.override, "plan=gold");
    rl_format_body(&d, b, sizeof b);
    cr_assert(strstr(b, "\"rate_limiter_unavailable\"") != NULL, "%s", b);
    cr_assert(strstr(b, "\"override\":\"plan=gold\",\"retry_after_s\":null}")
              != NULL, "%s", b);
    d.fallback = true;
    rl_format_body(&d, b, sizeof b);
    cr_assert(strstr(b, "\"rate_limited\"") != NULL, "a fallback bucket's "
              "rejection is a limit reached: %s", b);
    cr_assert_eq(rl_format_body(&d, b, 20), RL_ETOOLONG);
    cr_assert_str_empty(b);
    cr_assert_eq(rl_format_body(NULL, b, sizeof b), RL_EINVAL);
}

Test(decision, longest_names_fit_the_documented_kilobyte)
{
    rl_decision d = {.retry_after_ms = -1, .limit = UINT64_MAX,
                     .period_ms = UINT64_MAX};
    memset(d.rule, '"', RL_RULE_NAME_MAX);
    memset(d.override, '\x01', RL_OVERRIDE_NAME_MAX);
    char b[1024];
    cr_assert_gt(rl_format_body(&d, b, sizeof b), 0);
}
