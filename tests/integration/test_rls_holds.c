/*
 * rl's `hold` extension of a descriptor through rl-rls, black box, as
 * Envoy uses it for costs known at the stream's end (an LLM's tokens):
 * each request's descriptor is sent twice with its x-request-id as an
 * entry, on the request's path (hits_addend 0) and with
 * apply_on_stream_done (hits_addend the actual cost). Redis's count ends
 * at the sum of the actual costs; a rejected first call's stream-done
 * call charges nothing; a hold never ended is charged its estimate and a
 * late stream-done call nothing more; and what cannot hold is refused.
 */
#include "test_env.h"
#include "test_process.h"
#include "test_rls.h"

#include <criterion/criterion.h>
#include <hiredis/hiredis.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char limits[] =
    "domain: ai\n"
    "descriptors:\n"
    "  - key: tenant\n"
    "    descriptors:\n"
    "      - key: request_id\n"
    "        rate_limit: {unit: hour, requests_per_unit: 1000000}\n"
    "        rl: {hold: {id: request_id, estimate: 500}}\n"
    "  - key: team\n"
    "    descriptors:\n"
    "      - key: request_id\n"
    "        rate_limit: {unit: hour, requests_per_unit: 1000}\n"
    "        rl: {hold: {id: request_id, estimate: 600}}\n"
    "  - key: bucket\n"
    "    descriptors:\n"
    "      - key: request_id\n"
    "        rate_limit: {unit: hour, requests_per_unit: 1000}\n"
    "        rl: {algorithm: token_bucket,\n"
    "             hold: {id: request_id, estimate: 600}}\n"
    "  - key: user\n"
    "    descriptors:\n"
    "      - key: request_id\n"
    "        rl: {in_flight: 3, hold: {id: request_id}}\n"
    "  - key: leased\n"
    "    descriptors:\n"
    "      - key: request_id\n"
    "        rate_limit: {unit: hour, requests_per_unit: 1000}\n"
    "        rl: {mode: leased, hold: {id: request_id, estimate: 300}}\n"
    "  - key: local\n"
    "    descriptors:\n"
    "      - key: request_id\n"
    "        rate_limit: {unit: hour, requests_per_unit: 1000}\n"
    "        rl: {mode: local, hold: {id: request_id, estimate: 300}}\n";

/* rl's settings: the test Redis, and holds kept hold_ms. */
static const char *rl_yaml(char *buf, size_t cap, int hold_ms)
{
    snprintf(buf, cap, "store: {url: \"redis://%s\", timeout_ms: 2000}\n"
             "hold_timeout_ms: %d\n", test_env("RL_TEST_REDIS"), hold_ms);
    return buf;
}

/* A call's JSON into buf: the descriptor (key, value) with the request's
 * id, counting hits. */
static const char *call_of(char *buf, size_t cap, const char *key,
                           const char *value, const char *id, int hits)
{
    snprintf(buf, cap, "{\"domain\": \"ai\", \"descriptors\": "
             "[{\"entries\": [[\"%s\", \"%s\"], [\"request_id\", \"%s\"]], "
             "\"hits_addend\": %d}]}", key, value, id, hits);
    return buf;
}

/* Up to 8 calls (n), on one connection, one line each into out. */
static void calls(test_rls *r, char *out, size_t cap, char (*c)[256], int n)
{
    const char *p[8] = {NULL};
    for (int i = 0; i < n && i < 8; i++)
        p[i] = c[i];
    test_rls_call(r, out, cap, p[0], p[1], p[2], p[3], p[4], p[5], p[6],
                  p[7], NULL);
}

/* A stream-done call's answer: OK, no limit named. */
#define ENDED "OK OK OK:0:-\n"

/* Lines of out that start with want. */
static int lines_starting(const char *out, const char *want)
{
    int n = 0;
    for (const char *p = out; *p != '\0';) {
        n += strncmp(p, want, strlen(want)) == 0;
        p += strcspn(p, "\n");
        p += *p == '\n';
    }
    return n;
}

/* The n-th line of out (from 0) starts with want. */
static bool line_starts(const char *out, int n, const char *want)
{
    const char *p = out;
    for (int i = 0; i < n && p != NULL; i++) {
        p = strchr(p, '\n');
        p = p != NULL ? p + 1 : NULL;
    }
    return p != NULL && strncmp(p, want, strlen(want)) == 0;
}

/* The sum of the counts of the keys matching pattern, and their number
 * in *keys. */
static long long counted(const char *pattern, int *keys)
{
    redisContext *c = test_redis_connect(NULL);
    redisReply *r = redisCommand(c, "KEYS %s", pattern);
    cr_assert(r != NULL && r->type == REDIS_REPLY_ARRAY);
    long long sum = 0;
    for (size_t i = 0; i < r->elements; i++) {
        redisReply *v = redisCommand(c, "GET %s", r->element[i]->str);
        cr_assert(v != NULL && v->type == REDIS_REPLY_STRING);
        sum += atoll(v->str);
        freeReplyObject(v);
    }
    *keys = (int)r->elements;
    freeReplyObject(r);
    redisFree(c);
    return sum;
}

/* Polls until the keys matching pattern count want (the ends go to Redis
 * off the call's path), 3 s at most; returns the last sum. */
static long long counted_soon(const char *pattern, long long want,
                              int *keys)
{
    long long sum = 0;
    for (int i = 0; i < 300; i++) {
        if ((sum = counted(pattern, keys)) == want)
            break;
        usleep(10000);
    }
    return sum;
}

static void unique(char *buf, size_t cap, const char *what)
{
    snprintf(buf, cap, "%s%d-%ld", what, (int)getpid(), (long)time(NULL));
}

/* Pairs of calls, six holds open at once on one connection and ended in
 * another order on another (a stream-done call may land on another
 * worker loop: the table is the instance's), the actual costs drawn from
 * 100 to 2,000: Redis's count is their sum exactly, under one key (the
 * request id is no part of it). */
Test(rls_holds, the_count_is_the_sum_of_the_actual_costs)
{
    char yaml[256], tenant[64], pattern[128];
    test_rls r;
    test_rls_start(&r, limits, rl_yaml(yaml, sizeof yaml, 60000), NULL);
    unique(tenant, sizeof tenant, "t");
    srand((unsigned)getpid());
    static char out[1 << 14];
    long long sum = 0;
    static const int order[6] = {3, 1, 5, 0, 4, 2};
    for (int round = 0; round < 2; round++) {
        char open[6][256], end[6][256], id[6][96];
        for (int i = 0; i < 6; i++) {
            snprintf(id[i], sizeof id[i], "req-%d-%d-%s", round, i, tenant);
            call_of(open[i], 256, "tenant", tenant, id[i], 0);
        }
        calls(&r, out, sizeof out, open, 6);
        cr_assert_eq(lines_starting(out, "OK OK OK:"), 6, "%s", out);
        cr_assert_eq(lines_starting(out, ENDED), 0, "%s", out);
        for (int i = 0; i < 6; i++) {
            int actual = 100 + rand() % 1901;
            sum += actual;
            call_of(end[i], 256, "tenant", tenant, id[order[i]], actual);
        }
        calls(&r, out, sizeof out, end, 6);
        cr_assert_eq(lines_starting(out, ENDED), 6, "%s", out);
    }
    int keys;
    snprintf(pattern, sizeof pattern, "rls:*%s*", tenant);
    long long got = counted_soon(pattern, sum, &keys);
    cr_assert_eq(got, sum, "counted %lld, the actual costs sum to %lld",
                 got, sum);
    cr_assert_leq(keys, 2, "%d keys: the id is counted in the key", keys);
    snprintf(pattern, sizeof pattern, "*req-*%s*", tenant);
    counted(pattern, &keys);
    cr_assert_eq(keys, 0, "a key holds the request id");
    test_rls_stop(&r);
}

/* A first call over the limit holds nothing: its stream-done call is
 * answered OK and charges nothing; the one admitted beside it is
 * charged its actual cost. 1,000 an hour, estimates of 600. */
Test(rls_holds, a_rejected_first_call_is_not_charged_at_its_end)
{
    char yaml[256], team[64], pattern[128];
    test_rls r;
    test_rls_start(&r, limits, rl_yaml(yaml, sizeof yaml, 60000), NULL);
    unique(team, sizeof team, "team");
    static char out[1 << 12];
    char c[4][256];
    call_of(c[0], 256, "team", team, "a", 0);
    call_of(c[1], 256, "team", team, "b", 0);
    call_of(c[2], 256, "team", team, "b", 800);
    call_of(c[3], 256, "team", team, "a", 300);
    calls(&r, out, sizeof out, c, 4);
    cr_assert_eq(lines_starting(out, "OK OK OK:400:1000/HOUR"), 1, "%s",
                 out);
    cr_assert_eq(lines_starting(out, "OK OVER_LIMIT OVER_LIMIT:0:1000/HOUR"),
                 1, "%s", out);
    cr_assert_eq(lines_starting(out, ENDED), 2, "%s", out);
    /* a's 600, b's refused 600 (a fixed window counts what it refuses,
     * as upstream's INCRBY does), then a's end: 300 - 600. */
    int keys;
    snprintf(pattern, sizeof pattern, "rls:*%s*", team);
    long long got = counted_soon(pattern, 900, &keys);
    cr_assert_eq(got, 900, "counted %lld", got);
    test_rls_stop(&r);
}

/* A token bucket's hold gives back what the actual cost did not use:
 * 600 held of 1,000, 100 used, so the next request's 600 still fits. */
Test(rls_holds, a_token_bucket_gets_back_what_was_not_used)
{
    char yaml[256], bucket[64];
    test_rls r;
    test_rls_start(&r, limits, rl_yaml(yaml, sizeof yaml, 60000), NULL);
    unique(bucket, sizeof bucket, "b");
    static char out[1 << 12];
    char c[3][256];
    call_of(c[0], 256, "bucket", bucket, "a", 0);
    call_of(c[1], 256, "bucket", bucket, "a", 100);
    call_of(c[2], 256, "bucket", bucket, "b", 0);
    calls(&r, out, sizeof out, c, 3);
    cr_assert(line_starts(out, 0, "OK OK OK:400:1000/HOUR"), "%s", out);
    cr_assert(line_starts(out, 1, ENDED), "%s", out);
    cr_assert(line_starts(out, 2, "OK OK OK:300:1000/HOUR"), "%s", out);
    test_rls_stop(&r);
}

/* The same in the modes that count in the instance, settled with no call
 * (leased: in the hand of tokens it leased; local: in its own bucket):
 * 300 held of 1,000 and 100 used leave 600 after the next hold; its
 * excess (900 for 300) takes the rest, so the third is refused. Without
 * the give-back 400 would be left; without the excess, room for the
 * third. */
static void settles_in_the_instance(const char *mode)
{
    char yaml[256], value[64];
    test_rls r;
    test_rls_start(&r, limits, rl_yaml(yaml, sizeof yaml, 60000), NULL);
    unique(value, sizeof value, mode);
    static char out[1 << 12];
    char c[5][256];
    call_of(c[0], 256, mode, value, "a", 0);
    call_of(c[1], 256, mode, value, "a", 100);
    call_of(c[2], 256, mode, value, "b", 0);
    call_of(c[3], 256, mode, value, "b", 900);
    call_of(c[4], 256, mode, value, "c", 0);
    calls(&r, out, sizeof out, c, 5);
    cr_assert(line_starts(out, 0, "OK OK OK:700:1000/HOUR"), "%s: %s", mode,
              out);
    cr_assert(line_starts(out, 1, ENDED), "%s: %s", mode, out);
    cr_assert(line_starts(out, 2, "OK OK OK:600:1000/HOUR"), "%s: %s", mode,
              out);
    cr_assert(line_starts(out, 3, ENDED), "%s: %s", mode, out);
    cr_assert(line_starts(out, 4, "OK OVER_LIMIT"), "%s: %s", mode, out);
    test_rls_stop(&r);
}

Test(rls_holds, a_leased_descriptors_hold_settles_in_its_hand)
{
    settles_in_the_instance("leased");
}

Test(rls_holds, a_local_descriptors_hold_settles_in_its_bucket)
{
    settles_in_the_instance("local");
}

/* A hold never ended is charged its estimate; a stream-done call after
 * hold_timeout_ms (here 1 s) charges nothing more, and one before it
 * ends its hold. */
Test(rls_holds, an_unended_hold_is_charged_its_estimate)
{
    char yaml[256], tenant[64], pattern[128];
    test_rls r;
    test_rls_start(&r, limits, rl_yaml(yaml, sizeof yaml, 1000), NULL);
    unique(tenant, sizeof tenant, "u");
    static char out[1 << 12];
    char c[2][256];
    call_of(c[0], 256, "tenant", tenant, "late", 0);
    call_of(c[1], 256, "tenant", tenant, "timely", 0);
    calls(&r, out, sizeof out, c, 2);
    call_of(c[0], 256, "tenant", tenant, "timely", 1200);
    calls(&r, out, sizeof out, c, 1);
    usleep(1300 * 1000);
    call_of(c[0], 256, "tenant", tenant, "late", 1700);
    calls(&r, out, sizeof out, c, 1);
    cr_assert_eq(lines_starting(out, ENDED), 1, "%s", out);
    int keys;
    snprintf(pattern, sizeof pattern, "rls:*%s*", tenant);
    long long got = counted_soon(pattern, 500 + 1200, &keys);
    usleep(100 * 1000);
    got = counted(pattern, &keys);
    cr_assert_eq(got, 500 + 1200, "counted %lld: the estimate 500 and "
                 "the timely actual 1200", got);
    test_rls_stop(&r);
}

/* rl: {in_flight: 3, hold}: three requests at once, the fourth refused;
 * a stream-done call frees its request's slot for the next, and the
 * refused one's holds none. */
Test(rls_holds, in_flight_admits_n_at_once_and_stream_done_frees_a_slot)
{
    char yaml[256], user[64];
    test_rls r;
    test_rls_start(&r, limits, rl_yaml(yaml, sizeof yaml, 60000), NULL);
    unique(user, sizeof user, "user");
    static char out[1 << 12];
    char c[8][256];
    static const struct {
        const char *id;
        int hits;
        const char *want;
    } steps[] = {
        {"a", 0, "OK OK OK:2:3/SECOND"}, {"b", 0, "OK OK OK:1:3/SECOND"},
        {"c", 0, "OK OK OK:0:3/SECOND"},
        {"d", 0, "OK OVER_LIMIT OVER_LIMIT:0:3/SECOND"},
        {"a", 1500, ENDED},              {"e", 0, "OK OK OK:0:3/SECOND"},
        {"d", 900, ENDED},               {"f", 0, "OK OVER_LIMIT"},
    };
    for (int i = 0; i < 8; i++)
        call_of(c[i], 256, "user", user, steps[i].id, steps[i].hits);
    calls(&r, out, sizeof out, c, 8);
    for (int i = 0; i < 8; i++)
        cr_assert(line_starts(out, i, steps[i].want),
                  "call %d (%s): want %s in:\n%s", i, steps[i].id,
                  steps[i].want, out);
    test_rls_stop(&r);
}

/* Writes text over r's limits and has r reload it (SIGHUP: at once),
 * then waits for the refusal, whose reason must start with want. */
static void refused_file(test_rls *r, const char *text, const char *want)
{
    char line[1024];
    long from = test_log_size(r->log);
    test_rls_write(r, "limits.yaml", text);
    kill(r->pid, SIGHUP);
    /* The log is grepped in single quotes: up to want's first one. */
    snprintf(line, sizeof line, "event=config_refused why=sighup "
             "reason=\"config.limits.yaml: %.*s", (int)strcspn(want, "'"),
             want);
    test_wait_for_log_from(&r->pid, r->log, from, line, 10000);
}

/* refused_file with ext as a rated descriptor's rl. */
static void refused(test_rls *r, const char *ext, const char *want)
{
    char text[512];
    snprintf(text, sizeof text,
             "domain: ai\n"
             "descriptors:\n"
             "  - key: tenant\n"
             "    rate_limit: {unit: second, requests_per_unit: 100}\n"
             "    rl: %s\n", ext);
    refused_file(r, text, want);
}

/* A hold with no id, or of a wrong shape, is refused with what to
 * change. */
Test(rls_holds, holds_that_cannot_be_kept_are_refused_with_a_message)
{
    char yaml[256];
    test_rls r;
    test_rls_start(&r, limits, rl_yaml(yaml, sizeof yaml, 60000), NULL);
    refused(&r, "{hold: {estimate: 5}}",
            "rl: hold needs the id's key: the descriptor entry that names "
            "the request (hold: {id: request_id}, with Envoy's "
            "request_headers action on x-request-id)");
    refused(&r, "{hold: request_id}",
            "error loading config file: yaml: unmarshal errors:");
    refused(&r, "{in_flight: 3, hold: {id: request_id}}",
            "rl: in_flight: N counts requests at once, not a rate: leave "
            "rate_limit out");
    static const char no_rate[] =
        "domain: ai\n"
        "descriptors:\n"
        "  - key: user\n"
        "    rl: %s\n";
    static const struct {
        const char *ext, *want;
    } in_flight[] = {
        {"{in_flight: 3}", "rl: in_flight: N holds a slot from a "
         "request's first call to its stream-done call: give hold: {id: "
         "request_id}"},
        {"{in_flight: 0, hold: {id: request_id}}", "rl: in_flight: N needs "
         "N of 1 or more (requests at once)"},
        {"{in_flight: 3, mode: local, hold: {id: request_id}}", "rl: "
         "in_flight: N holds slots, with no algorithm, burst or mode: leave "
         "them out"},
        {"{in_flight: 3, hold: {id: request_id, estimate: 5}}", "rl: "
         "in_flight: N holds one slot a request: leave hold.estimate out"},
    };
    for (size_t i = 0; i < sizeof in_flight / sizeof in_flight[0]; i++) {
        char text[512];
        snprintf(text, sizeof text, no_rate, in_flight[i].ext);
        refused_file(&r, text, in_flight[i].want);
    }
    test_rls_stop(&r);
}
