/*
 * rlctl against a live Redis (and the test cluster): bucket, reset, check,
 * totals, in human and --json output, and its exit codes for bad
 * arguments, unknown rules, an unreachable store and a wrong password.
 */
#include "redis_server.h"
#include "test_aggregator.h"
#include "test_env.h"
#include "test_gateway.h"
#include "wire.h"

#include <criterion/criterion.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char rules[] =
    "rules:\n"
    "  - {name: per-key, match: api_key, limit: 100, period: 1h}\n"
    "  - {name: tight, match: user, limit: 2, period: 1h}\n"
    "  - {name: per-tenant, match: tenant, limit: 1000, period: 1h, "
    "mode: synced}\n"
    "  - {name: per-ip, match: ip, limit: 5, period: 1s, mode: local}\n"
    "  - {name: windowed, match: win, limit: 5, period: 1h, "
    "algorithm: fixed_window}\n";

/* A config whose store line is given; returns its path (static). */
static const char *config(const char *store)
{
    static char path[600];
    static int serial;
    snprintf(path, sizeof path, "%s/rlctl-%d-%d.yaml",
             test_env("RL_TEST_TMPDIR"), (int)getpid(), ++serial);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fprintf(f, "store: %s\n%s", store, rules);
    fclose(f);
    return path;
}

static const char *redis_config(void)
{
    char store[128];
    /* A deadline a loaded (sanitized) machine keeps: a check past the
     * default 50 ms is let through by on_error and spends nothing. */
    snprintf(store, sizeof store, "{url: \"redis://%s\", timeout_ms: 2000}",
             test_env("RL_TEST_REDIS"));
    return config(store);
}

static void unique(char *buf, size_t cap, const char *stem)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    snprintf(buf, cap, "%s_%d_%ld", stem, (int)getpid(), (long)ts.tv_nsec);
}

Test(rlctl, check_spends_bucket_reads_and_reset_forgets)
{
    const char *cfg = redis_config();
    char key[64], out[8192];
    unique(key, sizeof key, "ak");
    for (int i = 0; i < 3; i++)
        cr_assert_eq(test_rlctl(out, sizeof out, cfg, "check --attr api_key=%s",
                           key), 0, "%s", out);
    cr_assert(strstr(out, "decision:    allowed (rule per-key)") != NULL,
              "%s", out);
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(test_rlctl(out, sizeof out, cfg, "bucket per-key %s", key), 0,
                     "%s", out);
        cr_assert(strstr(out, "tokens:      97 of 100") != NULL, "%s", out);
    }
    cr_assert_eq(test_rlctl(out, sizeof out, cfg, "--json bucket per-key %s", key),
                 0);
    cr_assert(strstr(out, "\"tokens\":97,") != NULL, "%s", out);
    cr_assert(strstr(out, "\"exists\":true") != NULL, "%s", out);

    /* reset asks; with stdin not a terminal and no --yes it refuses. */
    cr_assert_eq(test_rlctl(out, sizeof out, cfg, "reset per-key %s", key), 1);
    cr_assert(strstr(out, "pass --yes") != NULL, "%s", out);
    cr_assert_eq(test_rlctl(out, sizeof out, cfg, "reset per-key %s --yes", key),
                 0, "%s", out);
    cr_assert(strstr(out, "deleted 1 key") != NULL, "%s", out);
    cr_assert_eq(test_rlctl(out, sizeof out, cfg, "bucket per-key %s", key), 0);
    cr_assert(strstr(out, "tokens:      100 of 100") != NULL, "%s", out);
    cr_assert(strstr(out, "(none)") != NULL, "%s", out);
}

/* A fixed window's count is read from the window that holds now, and
 * reset deletes it. */
Test(rlctl, bucket_reads_a_fixed_windows_count_and_reset_forgets_it)
{
    const char *cfg = redis_config();
    char key[64], out[8192];
    unique(key, sizeof key, "w");
    for (int i = 0; i < 3; i++)
        cr_assert_eq(test_rlctl(out, sizeof out, cfg, "check --attr win=%s",
                                key), 0, "%s", out);
    cr_assert_eq(test_rlctl(out, sizeof out, cfg, "bucket windowed %s", key),
                 0, "%s", out);
    cr_assert(strstr(out, "count:       3 of 5 (fixed_window), 2 left")
              != NULL, "%s", out);
    cr_assert_eq(test_rlctl(out, sizeof out, cfg, "--json bucket windowed %s",
                            key), 0);
    cr_assert(strstr(out, "\"count\":3,\"remaining\":2,") != NULL, "%s", out);
    for (int i = 0; i < 2; i++)
        cr_assert_eq(test_rlctl(out, sizeof out, cfg, "check --attr win=%s",
                                key), 0, "%s", out);
    cr_assert_eq(test_rlctl(out, sizeof out, cfg, "check --dry-run --attr "
                            "win=%s", key), 4, "%s", out);
    cr_assert_eq(test_rlctl(out, sizeof out, cfg, "reset windowed %s --yes",
                            key), 0, "%s", out);
    cr_assert(strstr(out, "deleted 1 key") != NULL, "%s", out);
    cr_assert_eq(test_rlctl(out, sizeof out, cfg, "bucket windowed %s", key),
                 0);
    cr_assert(strstr(out, "count:       0 of 5") != NULL, "%s", out);
}

Test(rlctl, a_dry_run_spends_nothing_and_exit_4_means_rejected)
{
    const char *cfg = redis_config();
    char user[64], out[8192];
    unique(user, sizeof user, "u");
    for (int i = 0; i < 2; i++)
        cr_assert_eq(test_rlctl(out, sizeof out, cfg, "check --attr user=%s",
                           user), 0, "%s", out);
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(test_rlctl(out, sizeof out, cfg, "check --dry-run --attr "
                           "user=%s", user), 4, "%s", out);
        cr_assert(strstr(out, "would be rejected (rule tight)") != NULL,
                  "%s", out);
    }
    cr_assert_eq(test_rlctl(out, sizeof out, cfg, "--json check --attr user=%s",
                       user), 4, "%s", out);
    cr_assert(strstr(out, "\"allowed\":false,\"rule\":\"tight\"") != NULL,
              "%s", out);
    cr_assert(strstr(out, "\"verdict\":\"reject\"") != NULL, "%s", out);
    cr_assert_eq(test_rlctl(out, sizeof out, cfg, "bucket tight %s", user), 0);
    cr_assert(strstr(out, "tokens:      0 of 2") != NULL, "%s", out);
}

Test(rlctl, totals_lists_synced_clients_by_their_count)
{
    const char *cfg = redis_config();
    char a[64], b[64], out[8192];
    unique(a, sizeof a, "org_small");
    unique(b, sizeof b, "org_big");
    redisContext *c = test_redis_connect(NULL);
    /* Sub-windows of a twentieth of the hour: b's trailing period holds
     * 600 + 300 recent and 50 in the oldest; 5,000 a sub-window before
     * that is outside it. */
    unsigned long long w = test_redis_time_ms(c)
                           / (3600000 / RL_WIRE_SUBWINDOWS);
    freeReplyObject(test_redis_command(c, "HSET rl:tenant:%s:w %llu 7", a, w));
    freeReplyObject(test_redis_command(c, "HSET rl:tenant:%s:w %llu 600", b,
                                       w));
    freeReplyObject(test_redis_command(c, "HSET rl:tenant:%s:w %llu 300", b,
                                       w - 5));
    freeReplyObject(test_redis_command(c, "HSET rl:tenant:%s:w %llu 50", b,
                                       w - RL_WIRE_SUBWINDOWS));
    freeReplyObject(test_redis_command(c, "HSET rl:tenant:%s:w %llu 5000", b,
                                       w - RL_WIRE_SUBWINDOWS - 1));
    /* The aggregator's head and sums (windows.c) are not a sub-window. */
    char sums[64];
    snprintf(sums, sizeof sums, "%llu 300 50", w);
    freeReplyObject(test_redis_command(c, "HSET rl:tenant:%s:w m %s", b,
                                       sums));
    redisFree(c);
    cr_assert_eq(test_rlctl(out, sizeof out, cfg, "totals --rule per-tenant "
                       "--top 100000"), 0, "%s", out);
    char *big = strstr(out, b), *small = strstr(out, a);
    cr_assert(big != NULL && small != NULL && big < small,
              "not sorted by count: %s", out);
    unsigned long long recent, oldest, estimate;
    cr_assert_eq(sscanf(big + strlen(b), "%llu %llu %llu", &recent, &oldest,
                        &estimate), 3, "%s", out);
    cr_expect_eq(recent, 900, "%s", out);
    cr_expect_eq(oldest, 50, "%s", out);
    cr_expect_eq(estimate, 950, "%s", out);
    cr_assert_eq(test_rlctl(out, sizeof out, cfg, "--json totals --top 1"), 0);
    cr_assert(strstr(out, "\"rule\":\"per-tenant\"") != NULL, "%s", out);
    /* The top client holds at least the 900 written here (another test's
     * client of the same rule and window may hold more). */
    const char *cur = strstr(out, "\"current\":");
    cr_assert_not_null(cur, "%s", out);
    cr_assert_geq(atoll(cur + strlen("\"current\":")), 900, "%s", out);
    cr_assert_null(strstr(out, a), "--top 1 listed a second client");
}

Test(rlctl, bad_arguments_unknown_rules_and_local_rules_are_usage_errors)
{
    const char *cfg = redis_config();
    char out[8192];
    cr_assert_eq(test_rlctl(out, sizeof out, cfg, "bucket no-such-rule x"), 1);
    cr_assert(strstr(out, "no rule named \"no-such-rule\"") != NULL, "%s",
              out);
    cr_assert_eq(test_rlctl(out, sizeof out, cfg, "bucket per-key"), 1);
    cr_assert_eq(test_rlctl(out, sizeof out, cfg, "bucket per-ip 1.2.3.4"), 1);
    cr_assert(strstr(out, "is local") != NULL, "%s", out);
    cr_assert_eq(test_rlctl(out, sizeof out, cfg, "check"), 1);
    cr_assert_eq(test_rlctl(out, sizeof out, cfg, "check --attr nothing"), 1);
    cr_assert_eq(test_rlctl(out, sizeof out, cfg, "totals --top 0"), 1);
    cr_assert_eq(test_rlctl(out, sizeof out, cfg, "frobnicate"), 1);
    cr_assert_eq(test_rlctl(out, sizeof out, cfg, "--bogus"), 1);
    cr_assert_eq(test_rlctl(out, sizeof out, "/nonexistent.yaml", "bucket a b"),
                 3);
    static const char *const commands[] = {"config", "bucket", "reset",
                                           "check", "totals", "agents",
                                           "watch"};
    for (size_t i = 0; i < 7; i++) {
        cr_assert_eq(test_rlctl(out, sizeof out, cfg, "%s --help", commands[i]), 0);
        char want[64];
        snprintf(want, sizeof want, "] %s", commands[i]);
        cr_assert(strstr(out, want) != NULL, "%s --help: %s", commands[i],
                  out);
        cr_assert(strstr(out, "exit codes:") != NULL);
    }
    cr_assert_eq(test_rlctl(out, sizeof out, cfg, "--json config"), 0);
    cr_assert(strstr(out, "\"valid\":true") != NULL, "%s", out);
    cr_assert(strstr(out, "{\"name\":\"per-key\",\"match\":\"api_key\","
                     "\"limit\":100,\"period_ms\":3600000") != NULL, "%s",
              out);
}

Test(rlctl, an_unreachable_store_or_a_wrong_password_exits_2)
{
    char out[8192];
    const char *dead = config("{url: \"redis://127.0.0.1:1\"}");
    cr_assert_eq(test_rlctl(out, sizeof out, dead, "bucket per-key k"), 2);
    cr_assert(strstr(out, "cannot reach Redis at 127.0.0.1:1") != NULL, "%s",
              out);
    test_redis srv;
    char err[512];
    test_redis_options o = {.extra_conf = "requirepass s3cret-pw"};
    cr_assert_eq(test_redis_start(&srv, test_env("RL_TEST_TMPDIR"), &o, err,
                                  sizeof err), 0, "%s", err);
    char store[160];
    snprintf(store, sizeof store, "{url: \"redis://127.0.0.1:%u\", "
             "password: wrong-pw}", srv.port);
    const char *wrong = config(store);
    int rc = test_rlctl(out, sizeof out, wrong, "--json bucket per-key k");
    test_redis_stop(&srv);
    cr_assert_eq(rc, 2, "%s", out);
    cr_assert(strstr(out, "refused rlctl") != NULL, "%s", out);
    cr_assert(strstr(out, "check store.username, store.password") != NULL,
              "%s", out);
    cr_assert_null(strstr(out, "wrong-pw"), "the password was printed");
}

Test(rlctl, bucket_and_check_follow_a_clusters_slots)
{
    char items[600] = "", list[512], store[700], key[64], out[8192];
    snprintf(list, sizeof list, "%s", test_env("RL_TEST_CLUSTER"));
    for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) {
        strcat(items, items[0] ? ", " : "");
        strcat(items, tok);
    }
    /* A fresh agent's first check maps the cluster and loads the scripts:
     * the 50 ms default deadline is missed on a loaded machine, and then
     * on_error allows without spending. */
    snprintf(store, sizeof store, "{cluster: [%s], timeout_ms: 2000}", items);
    const char *cfg = config(store);
    for (int k = 0; k < 3; k++) {
        char stem[16];
        snprintf(stem, sizeof stem, "c%d", k);
        unique(key, sizeof key, stem);
        cr_assert_eq(test_rlctl(out, sizeof out, cfg, "check --attr api_key=%s",
                           key), 0, "%s", out);
        cr_assert_eq(test_rlctl(out, sizeof out, cfg, "bucket per-key %s", key), 0,
                     "%s", out);
        cr_assert(strstr(out, "tokens:      99 of 100") != NULL, "%s", out);
    }
}

/* --- agents, and the aggregator's cap on them. --------------------------- */

static void report_some(rl_agent *a, const char *tenant, int n)
{
    rl_attr t = {"tenant", tenant, strlen(tenant)};
    for (int i = 0; i < n; i++) {
        rl_decision d;
        cr_assert_eq(rl_check(a, &t, 1, 1, &d), RL_OK);
    }
}

Test(rlctl, agents_lists_the_agents_and_max_agents_turns_new_ones_away)
{
    /* An aggregator that keeps track of one agent at most. */
    test_aggregator tpl = TEST_AGGREGATOR_EXTRA("  max_agents: 1\n");
    test_aggregator agg;
    test_aggregator_start(&agg, NULL, "  - {name: per-tenant, match: tenant, "
                          "limit: 100000, period: 1m, mode: synced}\n", 200,
                          &tpl);
    rl_config *c1, *c2;
    rl_agent *first = test_synced_agent(&agg, &c1);
    report_some(first, "org_first", 3);
    usleep(800 * 1000);
    rl_agent *second = test_synced_agent(&agg, &c2);
    report_some(second, "org_second", 3);
    usleep(1200 * 1000);
    char out[8192];
    cr_assert_eq(test_rlctl(out, sizeof out, agg.config, "agents"), 0, "%s", out);
    cr_assert(strstr(out, "127.0.0.1:") != NULL, "%s", out);
    cr_assert(strstr(out, "AGENT") != NULL, "%s", out);
    cr_assert_eq(test_rlctl(out, sizeof out, agg.config, "--json agents"), 0);
    cr_assert(strstr(out, "{\"agents\":[{\"id\":") != NULL, "%s", out);
    cr_assert_null(strstr(out, "},{"), "two agents listed with a cap of "
                   "one: %s", out);
    test_http_response r;
    test_http_get(agg.metrics, "/metrics", "", &r);
    r.body[r.body_len] = '\0';
    cr_assert(strstr(r.body, "rl_agg_reports_rejected_total{reason="
                     "\"too_many_agents\"} 0") == NULL, "the second agent "
              "was not turned away: %s", r.body);
    rl_agent_close(first);
    rl_agent_close(second);
    rl_config_free(c1);
    rl_config_free(c2);
    test_aggregator_stop(&agg);

    /* Without aggregator.metrics there is nowhere to ask. */
    cr_assert_eq(test_rlctl(out, sizeof out, redis_config(), "agents"), 1);
    cr_assert(strstr(out, "aggregator.metrics") != NULL, "%s", out);
}

Test(rlctl, watch_shows_clients_against_their_limit)
{
    const char *cfg = redis_config();
    char over[64], under[64], out[16384];
    unique(over, sizeof over, "org_over");
    unique(under, sizeof under, "org_under");
    redisContext *c = test_redis_connect(NULL);
    unsigned long long w = test_redis_time_ms(c)
                           / (3600000 / RL_WIRE_SUBWINDOWS);
    freeReplyObject(test_redis_command(c, "HSET rl:tenant:%s:w %llu 1000",
                                       over, w));
    freeReplyObject(test_redis_command(c, "HSET rl:tenant:%s:w %llu 10", under,
                                       w));
    redisFree(c);
    cr_assert_eq(test_rlctl(out, sizeof out, cfg, "watch --count 2 --interval 1 "
                       "--top 100000"), 0, "%s", out);
    char *line = strstr(out, over);
    cr_assert_not_null(line, "%s", out);
    cr_assert(strncmp(strchr(line, '\n') - 7, "LIMITED", 7) == 0,
              "a client at its limit is not shown LIMITED: %s", out);
    line = strstr(out, under);
    cr_assert_not_null(line);
    cr_assert(strncmp(strchr(line, '\n') - 2, "ok", 2) == 0, "%s", out);
    cr_assert_eq(test_rlctl(out, sizeof out, cfg, "--json watch --count 1 --top "
                       "100000"), 0);
    cr_assert(strncmp(out, "{\"at_ms\":", 9) == 0, "%s", out);
    cr_assert(strstr(out, "\"state\":\"LIMITED\"") != NULL, "%s", out);
    cr_assert_eq(test_rlctl(out, sizeof out, cfg, "watch --interval 0"), 1);
}
