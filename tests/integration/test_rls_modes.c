/*
 * rl's extension's modes synced and leased through rl-rls, black box: two
 * instances of rl-rls (one worker loop each) counting one descriptor
 * together, through an rl-aggregator started on what
 * `rl-rls --print-rl-config` prints (synced), or leasing from one bucket
 * in Redis (leased); and the files refused, with their messages.
 */
#include "redis_server.h"
#include "test_agent.h"
#include "test_env.h"
#include "test_process.h"
#include "test_rls.h"

#include <criterion/criterion.h>
#include <hiredis/hiredis.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* rl's settings for rl-rls: the test Redis, and with agg (a free port
 * pair) an aggregator syncing every 50 ms, a twentieth of a second, for
 * a few keys: each rule's totals walk the agent's whole table of synced
 * keys (sized by max_keys), 21 rules 20 times a second, which starved a
 * worker loop under ThreadSanitizer with the default 100,000. */
static const char *rl_yaml(char *buf, size_t cap, bool agg)
{
    int n = snprintf(buf, cap, "store: {url: \"redis://%s\", "
                     "timeout_ms: 2000}\n", test_env("RL_TEST_REDIS"));
    if (agg)
        snprintf(buf + n, cap - (size_t)n,
                 "aggregator:\n"
                 "  reports: \"tcp://127.0.0.1:%u\"\n"
                 "  totals: \"tcp://127.0.0.1:%u\"\n"
                 "  sync_interval_ms: 50\n"
                 "  max_keys: 1000\n",
                 test_free_port(), test_free_port());
    return buf;
}

/* Runs rl-rls --config (yaml written to a file; NULL: none, the store
 * from the REDIS_* variables) --print-rl-config with the extra
 * environment variables in env, its stdout into out (a path); asserts
 * exit 0. */
static void print_rl_config(const char *yaml, const char *const *env,
                            const char *out)
{
    char config[300];
    snprintf(config, sizeof config, "%s/rls-modes-%d.yaml",
             test_env("RL_TEST_TMPDIR"), (int)getpid());
    if (yaml != NULL) {
        FILE *f = fopen(config, "w");
        cr_assert_not_null(f);
        fputs(yaml, f);
        fclose(f);
    }
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        int fd = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fd < 0 || dup2(fd, 1) < 0)
            _exit(126);
        for (size_t i = 0; env != NULL && env[i] != NULL; i++)
            putenv((char *)env[i]);
        if (yaml != NULL)
            execl(test_env("RL_TEST_RLS"), "rl-rls", "--config", config,
                  "--print-rl-config", (char *)NULL);
        else
            execl(test_env("RL_TEST_RLS"), "rl-rls", "--print-rl-config",
                  (char *)NULL);
        _exit(127);
    }
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0,
              "rl-rls --print-rl-config: status %d", status);
}

static char *slurp(const char *path)
{
    static char text[65536];
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "%s", path);
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = '\0';
    return text;
}

/* rl-aggregator on the config at path, its log in log; waits until it
 * listens. */
static pid_t start_aggregator(const char *path, char *log, size_t cap)
{
    test_log_path(log, cap, "aggregator");
    char *argv[] = {(char *)test_env("RL_TEST_AGGREGATOR"), "--config",
                    (char *)path, "--log-level", "info", NULL};
    pid_t pid = test_spawn(argv, log);
    test_wait_for_log(&pid, log, "event=listening", 30000);
    return pid;
}

/* rl-rls's settings with an aggregator into yaml (512 bytes), and that
 * aggregator started on the config rl-rls prints for it (its log in
 * log). */
static pid_t start_synced(char *yaml, char *log, size_t cap)
{
    char path[300];
    rl_yaml(yaml, 512, true);
    snprintf(path, sizeof path, "%s/rls-modes-agg-%d.yaml",
             test_env("RL_TEST_TMPDIR"), (int)getpid());
    print_rl_config(yaml, NULL, path);
    return start_aggregator(path, log, cap);
}

static int by_value(const void *a, const void *b)
{
    long long x = *(const long long *)a, y = *(const long long *)b;
    return (x > y) - (x < y);
}

/* The stamps (ms) of the lines of out that were admitted, sorted; their
 * count in *n, every answered line's in *answered. */
static long long *admitted_stamps(const char *out, int *n, int *answered)
{
    static long long stamps[8192];
    *n = *answered = 0;
    for (const char *p = out; *p != '\0';) {
        long long ms;
        char code[32];
        if (sscanf(p, "%lld OK %31s", &ms, code) == 2) {
            (*answered)++;
            if (strcmp(code, "OK") == 0 && *n < 8192)
                stamps[(*n)++] = ms;
        }
        p += strcspn(p, "\n");
        p += *p == '\n';
    }
    qsort(stamps, (size_t)*n, sizeof stamps[0], by_value);
    return stamps;
}

/* The most of the stamps in any span of span_ms. */
static int most_in_any_span(const long long *s, int n, long long span_ms)
{
    int most = 0;
    for (int i = 0, j = 0; i < n; i++) {
        while (s[i] - s[j] >= span_ms)
            j++;
        if (i - j + 1 > most)
            most = i - j + 1;
    }
    return most;
}

/* The keys of the test Redis matching pattern. */
static long long keys_like(const char *pattern)
{
    redisContext *c = test_redis_connect(NULL);
    redisReply *r = redisCommand(c, "KEYS %s", pattern);
    cr_assert(r != NULL && r->type == REDIS_REPLY_ARRAY);
    long long n = (long long)r->elements;
    freeReplyObject(r);
    redisFree(c);
    return n;
}

/* The descriptor's value was counted under rule's prefix and no other of
 * rl-rls's (exact rules' prefixes start "rls:" or "rls-tb"). */
static void counted_by(const char *rule, const char *value)
{
    char pattern[128];
    snprintf(pattern, sizeof pattern, "%s:*%s*", rule, value);
    cr_assert_gt(keys_like(pattern), 0, "no key %s", pattern);
    snprintf(pattern, sizeof pattern, "rls:*%s*", value);
    cr_assert_eq(keys_like(pattern), 0, "key %s", pattern);
    snprintf(pattern, sizeof pattern, "rls-tb:*%s*", value);
    cr_assert_eq(keys_like(pattern), 0, "key %s", pattern);
}

/* rl-rls's synced rules, one per unit and on_error. */
static const char *const synced_rules[] = {
    "second", "minute", "hour", "day", "month", "year", "week"};

/* --print-rl-config prints the store, the aggregator and every rule the
 * agents run on, the synced ones with an aggregator only; REDIS_AUTH's
 * password goes by its variable's name, never in the text, and
 * REDIS_TIMEOUT as the store's timeout_ms; and
 * rl-aggregator starts on it as printed. */
Test(rls_modes, print_rl_config_is_an_aggregators_config)
{
    char yaml[512], out[300], log[600];
    snprintf(out, sizeof out, "%s/rls-modes-printed-%d.yaml",
             test_env("RL_TEST_TMPDIR"), (int)getpid());
    static const char *const env[] = {"REDIS_AUTH=alice:hunter2-secret",
                                      "REDIS_SOCKET_TYPE=tcp",
                                      "REDIS_URL=127.0.0.1:6379",
                                      "REDIS_TIMEOUT=250ms", NULL};
    print_rl_config(NULL, env, out);
    const char *text = slurp(out);
    cr_assert(strstr(text, "\n  timeout_ms: 250\n") != NULL, "%s", text);
    cr_assert(strstr(text, "hunter2") == NULL, "%s", text);
    cr_assert(strstr(text, "password_env: RL_RLS_REDIS_PASSWORD\n") != NULL,
              "%s", text);
    cr_assert(strstr(text, "name: rls-leased\n") != NULL, "%s", text);
    cr_assert(strstr(text, "mode: synced") == NULL,
              "synced rules without an aggregator:\n%s", text);
    print_rl_config(rl_yaml(yaml, sizeof yaml, true), NULL, out);
    text = slurp(out);
    for (size_t i = 0; i < sizeof synced_rules / sizeof synced_rules[0];
         i++) {
        const char *suffix[] = {"", "-allow", "-deny"};
        for (int e = 0; e < 3; e++) {
            char want[64];
            snprintf(want, sizeof want, "name: rls-synced-%s%s\n",
                     synced_rules[i], suffix[e]);
            cr_assert(strstr(text, want) != NULL, "no %s in:\n%s", want,
                      text);
        }
    }
    pid_t agg = start_aggregator(out, log, sizeof log);
    test_stop(agg, log, 30000);
}

/* A synced descriptor of 100 a second, offered twice that for 4 s over
 * two instances (one agent each) that share it through the aggregator:
 * no span of a second admits more than the synced bound (5% over the
 * limit in docs/design.md's measures; 110 here, as the answers' stamps
 * are the client's), where two instances counting alone would admit
 * about 200; and most of the limit is admitted (an agent with no totals
 * yet takes half of it, knowing of two). */
Test(rls_modes, synced_descriptor_is_shared_by_the_instances)
{
    static const char limits[] =
        "domain: edge\n"
        "descriptors:\n"
        "  - key: tenant\n"
        "    rate_limit: {unit: second, requests_per_unit: 100}\n"
        "    rl: {mode: synced}\n";
    char yaml[512], log[600];
    pid_t agg = start_synced(yaml, log, sizeof log);
    test_rls a, b;
    test_rls_start_workers(&a, limits, yaml, NULL, 1);
    test_rls_start_workers(&b, limits, yaml, NULL, 1);
    /* Both agents' presence reports reach the aggregator: each knows of
     * two before the key's first request. */
    test_sleep_ms(1000);
    char call[512], value[64];
    snprintf(value, sizeof value, "t%d-%ld", (int)getpid(), (long)time(NULL));
    snprintf(call, sizeof call,
             "{\"domain\": \"edge\", \"clients\": 2, \"repeat\": 400, "
             "\"every_ms\": 10, \"stamp\": true, \"targets\": "
             "[\"127.0.0.1:%u\", \"127.0.0.1:%u\"], \"descriptors\": "
             "[{\"entries\": [[\"tenant\", \"%s\"]]}]}",
             a.grpc_port, b.grpc_port, value);
    static char out[1 << 17];
    test_rls_call(&a, out, sizeof out, call, NULL);
    int n, answered;
    const long long *s = admitted_stamps(out, &n, &answered);
    cr_assert_eq(answered, 800, "%d answered:\n%.2000s", answered, out);
    cr_assert_gt(n, 0);
    int most = most_in_any_span(s, n, 1000);
    double seconds = (double)(s[n - 1] - s[0]) / 1000.0;
    fprintf(stderr, "synced: %d admitted of 800 in %.1f s, at most %d in "
            "a second\n", n, seconds, most);
    cr_assert_leq(most, 110, "%d admitted in one second (limit 100)",
                  most);
    cr_assert_geq(n, 280, "only %d admitted of 800 in 4 s at 100/s", n);
    /* The aggregator's hash of the key, not an exact rule's window. */
    counted_by("rls-synced-second", value);
    test_rls_stop(&a);
    test_rls_stop(&b);
    test_stop(agg, log, 30000);
}

/* A leased descriptor of 100 a minute, 200 calls over two instances:
 * the bucket is Redis's, leased to both, so never more than it holds
 * (and what it refills meanwhile: one each 600 ms), and at least 90: a
 * lease is about 100 ms of an instance's traffic, little is left in a
 * hand when the bucket runs dry. */
Test(rls_modes, leased_descriptor_never_admits_more_than_the_bucket)
{
    static const char limits[] =
        "domain: edge\n"
        "descriptors:\n"
        "  - key: tenant\n"
        "    rate_limit: {unit: minute, requests_per_unit: 100}\n"
        "    rl: {mode: leased}\n";
    char yaml[512];
    rl_yaml(yaml, sizeof yaml, false);
    test_rls a, b;
    test_rls_start_workers(&a, limits, yaml, NULL, 1);
    test_rls_start_workers(&b, limits, yaml, NULL, 1);
    char call[512], value[64];
    snprintf(value, sizeof value, "t%d-%ld", (int)getpid(), (long)time(NULL));
    snprintf(call, sizeof call,
             "{\"domain\": \"edge\", \"clients\": 2, \"repeat\": 100, "
             "\"stamp\": true, \"targets\": [\"127.0.0.1:%u\", "
             "\"127.0.0.1:%u\"], \"descriptors\": [{\"entries\": "
             "[[\"tenant\", \"%s\"]]}]}",
             a.grpc_port, b.grpc_port, value);
    static char out[1 << 16];
    long t0 = (long)test_now_ms();
    test_rls_call(&a, out, sizeof out, call, NULL);
    long elapsed = (long)test_now_ms() - t0;
    int n, answered;
    admitted_stamps(out, &n, &answered);
    cr_assert_eq(answered, 200, "%d answered:\n%s", answered, out);
    fprintf(stderr, "leased: %d admitted of 200 in %ld ms\n", n, elapsed);
    cr_assert_leq(n, 100 + elapsed / 600, "%d admitted in %ld ms", n,
                  elapsed);
    cr_assert_geq(n, 90, "only %d admitted", n);
    counted_by("rls-leased", value);
    test_rls_stop(&a);
    test_rls_stop(&b);
}

/* A synced descriptor's hold: opened at the estimate (300), ended by the
 * stream-done call at the actual cost, after the agent has reported the
 * estimate (a sync every 50 ms, the end 300 ms later): the aggregator's
 * count ends at the actual costs' sum, 100 + 900, not at the estimates'
 * (600) nor with the give-back lost (1,200). */
Test(rls_modes, a_synced_descriptors_hold_counts_its_actual_cost)
{
    static const char limits[] =
        "domain: ai\n"
        "descriptors:\n"
        "  - key: tenant\n"
        "    descriptors:\n"
        "      - key: request_id\n"
        "        rate_limit: {unit: hour, requests_per_unit: 10000}\n"
        "        rl: {mode: synced, hold: {id: request_id, "
        "estimate: 300}}\n";
    char yaml[512], log[600];
    pid_t agg = start_synced(yaml, log, sizeof log);
    test_rls r;
    test_rls_start_workers(&r, limits, yaml, NULL, 1);
    char value[64], call[2][512], keys[128];
    snprintf(value, sizeof value, "h%d-%ld", (int)getpid(), (long)time(NULL));
    static const struct {
        const char *id;
        int hits;
    } steps[2][2] = {{{"a", 0}, {"b", 0}}, {{"a", 100}, {"b", 900}}};
    static char out[1 << 12];
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < 2; i++)
            snprintf(call[i], sizeof call[i],
                     "{\"domain\": \"ai\", \"descriptors\": [{\"entries\": "
                     "[[\"tenant\", \"%s\"], [\"request_id\", \"%s\"]], "
                     "\"hits_addend\": %d}]}", value, steps[pass][i].id,
                     steps[pass][i].hits);
        test_rls_call(&r, out, sizeof out, call[0], call[1], NULL);
        cr_assert(strncmp(out, "OK OK OK:", 9) == 0, "%s", out);
        if (pass == 0) {
            snprintf(keys, sizeof keys, "rls-synced-hour:*%s*", value);
            test_expect_window_total(keys, 600, 3000);
            test_sleep_ms(300);
        }
    }
    test_expect_window_total(keys, 1000, 3000);
    test_sleep_ms(300);
    cr_assert_eq(test_window_total(NULL, keys), 1000);
    test_rls_stop(&r);
    test_stop(agg, log, 30000);
}

/* Writes limits over r's file and waits for the reload's refusal, whose
 * reason must start with want. */
static void refused(test_rls *r, const char *ext, const char *want)
{
    char limits[512], line[1024];
    snprintf(limits, sizeof limits,
             "domain: edge\n"
             "descriptors:\n"
             "  - key: tenant\n"
             "    rate_limit: {unit: second, requests_per_unit: 100}\n"
             "    rl: %s\n", ext);
    long from = test_log_size(r->log);
    test_rls_write(r, "limits.yaml", limits);
    /* The log is grepped in single quotes: up to want's first one. */
    snprintf(line, sizeof line, "event=config_refused why=change "
             "reason=\"config.limits.yaml: %.*s", (int)strcspn(want, "'"),
             want);
    test_wait_for_log_from(&r->pid, r->log, from, line, 10000);
}

static const char ok_limits[] =
    "domain: edge\n"
    "descriptors:\n"
    "  - key: tenant\n"
    "    rate_limit: {unit: second, requests_per_unit: 100}\n";

/* What cannot be counted is refused with what to change: synced without
 * an aggregator (the message says what to add), synced with a fixed
 * window, leased with a fixed window. */
Test(rls_modes, modes_that_cannot_count_are_refused_with_a_message)
{
    char yaml[512];
    test_rls r;
    test_rls_start_workers(&r, ok_limits, rl_yaml(yaml, sizeof yaml, false),
                           NULL, 1);
    refused(&r, "{mode: synced}",
            "rl: mode: synced counts through rl-aggregator, and rl-rls has "
            "none: give rl-rls --config a file with an aggregator: (or "
            "aggregators:) section, and start rl-aggregator on what rl-rls "
            "--config FILE --print-rl-config prints");
    refused(&r, "{mode: leased, algorithm: fixed_window}",
            "rl: mode: leased spends a token bucket's tokens in leases, and "
            "a fixed window's count cannot be leased: leave algorithm out "
            "(or token_bucket)");
    test_rls_stop(&r);
    /* With an aggregator (it need not run for a config to load). */
    test_rls_start_workers(&r, ok_limits, rl_yaml(yaml, sizeof yaml, true),
                           NULL, 1);
    refused(&r, "{mode: synced, algorithm: fixed_window}",
            "rl: mode: synced counts the limit over any span of the unit "
            "(rl-aggregator's sliding windows), neither a fixed window nor "
            "a token bucket: leave algorithm out");
    test_rls_stop(&r);
}
