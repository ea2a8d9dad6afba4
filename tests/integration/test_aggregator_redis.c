/*
 * The aggregator's share of Redis (issue 28, item 7): a flood of fresh
 * synced keys must not turn exact checks on the same Redis off, and an
 * aggregator given a Redis of its own (aggregator.store) keeps its keys
 * there. Real rl-aggregator processes, real redis-servers of the tests'
 * own, agents in this process; the flood is sent as raw reports, as fast
 * as the aggregator acknowledges them.
 */
#include "redis_server.h"
#include "test_agent.h"
#include "test_aggregator.h"
#include "test_env.h"
#include "wire.h"

#include <criterion/criterion.h>
#include <hiredis/hiredis.h>
#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char synced_rule[] =
    "  - {name: per-tenant, match: tenant, limit: 1000000000, period: 10s, "
    "mode: synced}\n";

/* The sum of every sub-window count of the hashes matching pattern, read
 * in one script (a flood leaves a hundred thousand of them). */
static long long window_sum(const char *addr, const char *pattern)
{
    static const char script[] =
        "local sum, cursor = 0, '0'\n"
        "repeat\n"
        "  local r = redis.call('SCAN', cursor, 'MATCH', ARGV[1], 'COUNT',"
        " 1000)\n"
        "  cursor = r[1]\n"
        "  for _, k in ipairs(r[2]) do\n"
        "    local v = redis.call('HGETALL', k)\n"
        "    for i = 1, #v, 2 do\n"
        "      if v[i] ~= 'm' then sum = sum + tonumber(v[i + 1]) end\n"
        "    end\n"
        "  end\n"
        "until cursor == '0'\n"
        "return sum\n";
    redisContext *c = test_redis_connect(addr);
    redisReply *r = test_redis_command(c, "EVAL %s 0 %s", script, pattern);
    cr_assert_eq(r->type, REDIS_REPLY_INTEGER, "%s",
                 r->type == REDIS_REPLY_ERROR ? r->str : "");
    long long sum = r->integer;
    freeReplyObject(r);
    redisFree(c);
    return sum;
}

/* --- A flood of fresh synced keys beside exact checks. ------------------ */

/* One agent's flood: reports of ENTRIES fresh keys, count 1 each, the
 * next sent once the last is acknowledged (a "retry" resends it). No
 * Criterion assertion on its thread. */
#define FLOODERS 4
#define FLOOD_ENTRIES 4000

typedef struct flooder {
    const char *reports;
    int id;
    atomic_bool stop;
    long long counted; /* entries of acknowledged reports */
    long reports_acked, retries, lost_acks;
    const char *failed; /* why the thread stopped early, or NULL */
} flooder;

static void *flood(void *arg)
{
    flooder *f = arg;
    nng_socket s;
    if (nng_req0_open(&s) != 0 || nng_dial(s, f->reports, NULL, 0) != 0) {
        f->failed = "cannot dial the reports socket";
        return NULL;
    }
    nng_socket_set_ms(s, NNG_OPT_RECVTIMEO, 10000);
    nng_socket_set_ms(s, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE);
    char agent[32], value[48];
    snprintf(agent, sizeof agent, "flooder-%d", f->id);
    rl_wire_writer *w = rl_wire_writer_new();
    for (uint64_t seq = 1; !atomic_load(&f->stop) && f->failed == NULL;
         seq++) {
        rl_wire_writer_reset(w);
        rl_wire_begin_report(w, agent, seq, FLOOD_ENTRIES);
        for (int i = 0; i < FLOOD_ENTRIES; i++) {
            int n = snprintf(value, sizeof value, "f%d-%llu-%d", f->id,
                             (unsigned long long)seq, i);
            rl_wire_put_count(w, "per-tenant", value, (size_t)n, 1);
        }
        size_t len;
        const void *data = rl_wire_writer_data(w, &len);
        for (;;) {
            char *buf;
            size_t size;
            rl_wire_msg ack;
            const char *why;
            if (nng_send(s, (void *)data, len, 0) != 0
                || nng_recv(s, &buf, &size, NNG_FLAG_ALLOC) != 0) {
                f->lost_acks++;
                continue;
            }
            int bad = rl_wire_decode(buf, size, &ack, &why);
            nng_free(buf, size);
            if (bad != 0 || ack.type != RL_WIRE_ACK) {
                f->failed = "not an ack";
                break;
            }
            uint64_t status = ack.status;
            rl_wire_msg_free(&ack);
            if (status == RL_ACK_RETRY) {
                f->retries++;
                continue;
            }
            f->counted += FLOOD_ENTRIES;
            f->reports_acked++;
            break;
        }
    }
    rl_wire_writer_free(w);
    nng_close(s);
    return NULL;
}

/* Exact checks at 100 a second; how many were degraded (the store's
 * deadline passed: on_error decided) and the slowest. */
typedef struct checks {
    int n, degraded;
    uint64_t us[400];
} checks;

static int by_value(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static void check_exact(test_agent *t, int n, checks *out)
{
    *out = (checks){.n = n};
    char key[32];
    for (int i = 0; i < n; i++) {
        snprintf(key, sizeof key, "key=k%d", i % 50);
        uint64_t start = test_now_us();
        rl_decision d = test_check(t, key, NULL);
        out->us[i] = test_now_us() - start;
        out->degraded += d.degraded;
        test_sleep_ms(10);
    }
    qsort(out->us, (size_t)n, sizeof out->us[0], by_value);
}

static uint64_t p99_us(const checks *c)
{
    return c->us[c->n * 99 / 100];
}

/* Calls of the aggregator's function slower than the slowlog's threshold
 * (set by the test), and the slowest, in µs. */
static int slow_calls(const char *addr, long long *slowest_us)
{
    redisContext *c = test_redis_connect(addr);
    redisReply *r = test_redis_command(c, "SLOWLOG GET 1024");
    int n = 0;
    *slowest_us = 0;
    for (size_t i = 0; r->type == REDIS_REPLY_ARRAY && i < r->elements; i++) {
        redisReply *e = r->element[i];
        redisReply *argv = e->element[3];
        if (argv->elements < 2
            || strncmp(argv->element[1]->str, "rl_agg_", 7) != 0)
            continue;
        n++;
        if (e->element[2]->integer > *slowest_us)
            *slowest_us = e->element[2]->integer;
    }
    freeReplyObject(r);
    redisFree(c);
    return n;
}

/* Issue 28, item 7, scaled for CI: four agents each sending reports of
 * 4,000 fresh keys as fast as they are acknowledged (the synced side of
 * a flood of spoofed addresses), and exact checks at 100 a second on the
 * same Redis, deadline 50 ms. rl_agg_6 gathered up to 65,536 entries a
 * call, 16,000 here: calls of over 100 ms in Redis (slowlog), exact checks
 * waiting behind them past their deadline. The calls are now cut to about
 * 2 ms of Redis's time: the flood degrades no more checks than the quiet
 * second before it (a check or two of slack for a loaded machine, where
 * the old code degraded most of them), and every acknowledged count is in
 * Redis, once. */
Test(aggregator_redis, a_flood_of_fresh_synced_keys_leaves_exact_checks_on_time)
{
    test_redis srv;
    char addr[64];
    test_agent_private_redis(&srv, addr, sizeof addr);
    redisContext *c = test_redis_connect(addr);
    freeReplyObject(test_redis_command(c, "CONFIG SET "
                                       "slowlog-log-slower-than 10000"));
    freeReplyObject(test_redis_command(c, "CONFIG SET slowlog-max-len "
                                       "1024"));
    test_aggregator agg;
    test_aggregator_start(&agg, addr, synced_rule, 100, NULL);
    test_aggregator_wait_ready(&agg);
    test_agent t;
    /* By EVALSHA: FCALL's commandstats are then the aggregator's. */
    test_agent_open(&t, addr, TEST_EVALSHA, "  timeout_ms: 50\n", NULL,
                    "  - {name: per-key, match: key, limit: 1000000, "
                    "period: 1s}\n");
    checks before, during;
    check_exact(&t, 100, &before);
    flooder f[FLOODERS];
    pthread_t th[FLOODERS];
    for (int i = 0; i < FLOODERS; i++) {
        f[i] = (flooder){.reports = agg.reports, .id = i};
        pthread_create(&th[i], NULL, flood, &f[i]);
    }
    test_sleep_ms(300);
    check_exact(&t, 200, &during);
    long long counted = 0;
    long acked = 0, retries = 0, lost = 0;
    for (int i = 0; i < FLOODERS; i++) {
        atomic_store(&f[i].stop, true);
        pthread_join(th[i], NULL);
        cr_assert_null(f[i].failed, "flooder %d: %s", i, f[i].failed);
        counted += f[i].counted;
        acked += f[i].reports_acked;
        retries += f[i].retries;
        lost += f[i].lost_acks;
    }
    long long slowest;
    int slow = slow_calls(addr, &slowest);
    long long calls = test_redis_calls(addr, "fcall");
    double per_call = test_redis_usec_per_call(addr, "fcall");
    fprintf(stderr, "flood: %ld reports of %d fresh keys acked (%ld "
            "retries, %ld acks lost); exact checks degraded %d of %d before, "
            "%d of %d during; p99 %llu us before, %llu us during; aggregator "
            "calls %lld, %.0f us each (commandstats), over 10 ms: %d, "
            "slowest %lld us\n", acked, FLOOD_ENTRIES, retries, lost,
            before.degraded, before.n, during.degraded, during.n,
            (unsigned long long)p99_us(&before),
            (unsigned long long)p99_us(&during), calls, per_call, slow,
            slowest);
    /* The flood was one: the aggregator took a second's worth of reports
     * (a few thousand fresh keys a second would not need cutting). */
    cr_assert_geq(counted, 10 * FLOOD_ENTRIES, "only %lld entries counted",
                  counted);
    cr_expect_leq(during.degraded, before.degraded + 2,
                  "exact checks degraded during the flood: %d of %d (%d of "
                  "%d before); aggregator calls over 10 ms: %d, the slowest "
                  "%lld us", during.degraded, during.n, before.degraded,
                  before.n, slow, slowest);
    /* The calls' own time, RL_WINDOWS_CALL_US (2 ms) aimed at, with room
     * for a first call sized before any was measured. */
    cr_expect_leq(per_call, 4000, "the aggregator's calls took %.0f us each",
                  per_call);
    cr_assert_eq(window_sum(addr, "rl:tenant:f*"), counted,
                 "the synced counts in Redis are not what was acknowledged");
    test_agent_close(&t);
    redisFree(c);
    test_aggregator_stop(&agg);
    test_redis_stop(&srv);
}

/* --- aggregator.store: a Redis of the aggregators' own. ---------------- */

/* With aggregator.store, the synced counts, agent sets and sequence keys
 * go to that Redis, and none to the shared store the exact checks use;
 * rlctl totals reads them there. */
Test(aggregator_redis, aggregator_store_keeps_the_synced_keys_apart)
{
    test_redis shared, own;
    char shared_addr[64], own_addr[64], extra[128];
    test_agent_private_redis(&shared, shared_addr, sizeof shared_addr);
    test_agent_private_redis(&own, own_addr, sizeof own_addr);
    snprintf(extra, sizeof extra, "  store:\n    url: redis://%s\n",
             own_addr);
    test_aggregator agg;
    test_aggregator tpl = TEST_AGGREGATOR_EXTRA(extra);
    test_aggregator_start(&agg, shared_addr, synced_rule, 100, &tpl);
    test_aggregator_wait_ready(&agg);
    rl_config *cfg;
    rl_agent *agent = test_synced_agent(&agg, &cfg);
    rl_attr a = {"tenant", "org_own", 7};
    for (int i = 0; i < 5; i++) {
        rl_decision d;
        cr_assert_eq(rl_check(agent, &a, 1, 1, &d), RL_OK);
    }
    long long got = 0;
    for (int waited = 0; waited < 5000 && got != 5; waited += 50) {
        test_sleep_ms(50);
        got = test_window_total(own_addr, "rl:tenant:org_own");
    }
    cr_assert_eq(got, 5, "the aggregator's Redis holds %lld", got);
    redisContext *c = test_redis_connect(shared_addr);
    redisReply *r = test_redis_command(c, "DBSIZE");
    cr_assert_eq(r->integer, 0, "the shared Redis holds %lld keys",
                 r->integer);
    freeReplyObject(r);
    redisFree(c);
    char out[4096];
    cr_assert_eq(test_rlctl(out, sizeof out, agg.config, "totals"), 0, "%s",
                 out);
    cr_assert(strstr(out, "org_own") != NULL, "rlctl totals: %s", out);
    rl_agent_close(agent);
    rl_config_free(cfg);
    test_aggregator_stop(&agg);
    test_redis_stop(&own);
    test_redis_stop(&shared);
}
