/*
 * The synced path end to end: real agents, a real rl-aggregator process,
 * real nng sockets on loopback, a real redis-server.
 */
#include "config.h"
#include "no_network.h"
#include "redis_server.h"
#include "test_agent.h"
#include "test_aggregator.h"
#include "test_env.h"
#include "test_process.h"
#include "wire.h"

#include <criterion/criterion.h>
#include <nng/nng.h>
#include <nng/protocol/pubsub0/sub.h>
#include <nng/protocol/reqrep0/req.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <signal.h>
#include <string.h>
#include <sys/time.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <unistd.h>
#include <uv.h>

static uint64_t uv_hrtime_us(void)
{
    return uv_hrtime() / 1000;
}

static uint64_t redis_time_ms(void)
{
    redisContext *c = test_redis_connect(NULL);
    uint64_t ms = test_redis_time_ms(c);
    redisFree(c);
    return ms;
}

static bool check_tenant(rl_agent *agent, const char *tenant)
{
    rl_attr a = {"tenant", tenant, strlen(tenant)};
    rl_decision d;
    cr_assert_eq(rl_check(agent, &a, 1, 1, &d), RL_OK);
    return d.allowed;
}

/* --- Counts reach Redis, exactly, with the aggregator away for 5 s. ------ */

struct steady {
    rl_agent *agent;
    const char *tenant;
    atomic_bool stop;
    atomic_long allowed;
    atomic_long failed;         /* checks that did not return RL_OK */
    atomic_long slowest_us;
    int guard;                  /* test_forbid_network's answer */
};

/* Checks until told to stop, on a thread that may make no network call
 * (no Criterion assertion here: a failed one would report over a
 * socket). */
static void *check_steadily(void *arg)
{
    struct steady *s = arg;
    s->guard = test_forbid_network();
    rl_attr a = {"tenant", s->tenant, strlen(s->tenant)};
    while (!atomic_load(&s->stop)) {
        uint64_t start = uv_hrtime_us();
        rl_decision d;
        int rc = rl_check(s->agent, &a, 1, 1, &d);
        long took = (long)(uv_hrtime_us() - start);
        if (took > atomic_load(&s->slowest_us))
            atomic_store(&s->slowest_us, took);
        if (rc != RL_OK)
            atomic_fetch_add(&s->failed, 1);
        else if (d.allowed)
            atomic_fetch_add(&s->allowed, 1);
        test_sleep_ms(2);
    }
    return NULL;
}

/* Joins a check_steadily thread: every check returned RL_OK, and no
 * thread so far made a network call. */
static void join_steady(pthread_t t, struct steady *s)
{
    pthread_join(t, NULL);
    cr_assert_eq(s->guard, 0, "cannot install the seccomp filter: %s",
                 strerror(s->guard));
    cr_assert_eq(atomic_load(&s->failed), 0, "checks failed");
    long first, calls = test_network_calls(&first);
    cr_assert_eq(calls, 0, "synced checks made %ld network system calls "
                 "(the first: number %ld)", calls, first);
}

Test(synced, aggregator_away_for_five_seconds_loses_no_count)
{
    test_aggregator agg;
    test_aggregator_start(&agg, NULL,
                          "  - {name: per-tenant, match: tenant, "
                          "limit: 1000000000, period: 1m, mode: synced}\n",
                          200, NULL);
    rl_config *cfg[3];
    struct steady s[3];
    pthread_t t[3];
    for (int i = 0; i < 3; i++) {
        s[i] = (struct steady){.agent = test_synced_agent(&agg, &cfg[i]),
                               .tenant = "org_away"};
        pthread_create(&t[i], NULL, check_steadily, &s[i]);
    }
    test_sleep_ms(1000);
    test_aggregator_kill(&agg);
    test_sleep_ms(5000);
    test_aggregator_start(&agg, NULL, NULL, 200, &agg);
    test_sleep_ms(1000);
    long allowed = 0, slowest = 0;
    for (int i = 0; i < 3; i++) {
        atomic_store(&s[i].stop, true);
        join_steady(t[i], &s[i]);
        allowed += atomic_load(&s[i].allowed);
        if (atomic_load(&s[i].slowest_us) > slowest)
            slowest = atomic_load(&s[i].slowest_us);
    }
    cr_assert_gt(allowed, 1000);
    /* Nor does the hot path wait for the thread that talks: the
     * aggregator's absence does not show in how long a check takes. */
    cr_assert_lt(slowest, 50000, "a synced check took %ld us", slowest);
    test_expect_window_total("rl:tenant:org_away", allowed, 5000);
    for (int i = 0; i < 3; i++) {
        rl_agent_close(s[i].agent);
        rl_config_free(cfg[i]);
    }
    test_aggregator_stop(&agg);
}

/* --- Raw reports, as a buggy or hostile peer could send them. ----------- */

static nng_socket dial_reports(const test_aggregator *agg)
{
    nng_socket s;
    cr_assert_eq(nng_req0_open(&s), 0);
    cr_assert_eq(nng_dial(s, agg->reports, NULL, 0), 0);
    nng_socket_set_ms(s, NNG_OPT_RECVTIMEO, 3000);
    nng_socket_set_ms(s, NNG_OPT_SENDTIMEO, 5000);
    nng_socket_set_ms(s, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE);
    return s;
}

/* Sends bytes as a request; returns the decoded ack, or type 0 if none
 * came within the timeout. */
static rl_wire_msg request(nng_socket s, const void *data, size_t len,
                           int timeout_ms)
{
    rl_wire_msg m = {0};
    nng_socket_set_ms(s, NNG_OPT_RECVTIMEO, timeout_ms);
    int rv = nng_send(s, (void *)data, len, 0);
    cr_assert_eq(rv, 0, "send: %s", nng_strerror(rv));
    char *buf;
    size_t size;
    if (nng_recv(s, &buf, &size, NNG_FLAG_ALLOC) != 0)
        return m;
    const char *why;
    cr_assert_eq(rl_wire_decode(buf, size, &m, &why), 0, "bad ack: %s", why);
    nng_free(buf, size);
    return m;
}

static rl_wire_msg report_within(nng_socket s, const char *agent,
                                 uint64_t seq, const char *rule,
                                 const char *value, uint64_t n,
                                 int timeout_ms)
{
    rl_wire_writer *w = rl_wire_writer_new();
    rl_wire_begin_report(w, agent, seq, 1);
    rl_wire_put_count(w, rule, value, strlen(value), n);
    size_t len;
    const void *data = rl_wire_writer_data(w, &len);
    rl_wire_msg ack = request(s, data, len, timeout_ms);
    rl_wire_writer_free(w);
    return ack;
}

static rl_wire_msg report(nng_socket s, const char *agent, uint64_t seq,
                          const char *rule, const char *value, uint64_t n)
{
    return report_within(s, agent, seq, rule, value, n, 3000);
}

/* Entries per piece of a long report (aggregator/windows.h). */
#define RL_WINDOWS_PIECE_TESTED 128

static const char tenant_rule[] =
    "  - {name: per-tenant, match: tenant, limit: 1000, period: 10s, "
    "mode: synced}\n";

Test(synced, a_resent_report_is_counted_once)
{
    test_aggregator agg;
    test_aggregator_start(&agg, NULL, tenant_rule, 1000, NULL);
    test_aggregator_wait_ready(&agg);
    nng_socket s = dial_reports(&agg);
    rl_wire_msg ack = report(s, "resender", 1, "per-tenant", "org_resent", 7);
    cr_assert_eq(ack.type, RL_WIRE_ACK, "no ack");
    cr_assert_eq(ack.status, RL_ACK_APPLIED);
    cr_assert_eq(ack.entries[0].current, 7);
    rl_wire_msg_free(&ack);
    /* The ack was "lost": the agent sends the same report again. */
    ack = report(s, "resender", 1, "per-tenant", "org_resent", 7);
    cr_assert_eq(ack.status, RL_ACK_DUPLICATE);
    cr_assert_eq(ack.entries[0].current, 7, "counted twice");
    rl_wire_msg_free(&ack);
    ack = report(s, "resender", 2, "per-tenant", "org_resent", 3);
    cr_assert_eq(ack.status, RL_ACK_APPLIED);
    cr_assert_eq(ack.entries[0].current, 10);
    rl_wire_msg_free(&ack);
    cr_assert_eq(test_window_total(NULL, "rl:tenant:org_resent"), 10);
    nng_close(s);
    test_aggregator_stop(&agg);
}

/* --- Reports gathered into one call (windows.c, window_call.c). ---------- */

#define HOUR_MS 3600000

/* Sends a report of n counts without waiting for its ack; windows, when
 * not NULL, are the sub-windows of hour_rule the counts were made in (0:
 * an entry of three fields, as an older agent sends), sent as the time
 * they start at. */
static void send_counts(nng_socket s, const char *agent, uint64_t seq,
                        const char *const *values, const uint64_t *counts,
                        const uint64_t *windows, size_t n)
{
    rl_wire_writer *w = rl_wire_writer_new();
    rl_wire_begin_report(w, agent, seq, n);
    for (size_t i = 0; i < n; i++) {
        if (windows != NULL && windows[i] > 0)
            rl_wire_put_count_at(w, "per-tenant", values[i],
                                 strlen(values[i]), counts[i],
                                 windows[i]
                                     * rl_wire_subwindow_ms(HOUR_MS));
        else
            rl_wire_put_count(w, "per-tenant", values[i], strlen(values[i]),
                              counts[i]);
    }
    size_t len;
    const void *data = rl_wire_writer_data(w, &len);
    int rv = nng_send(s, (void *)data, len, 0);
    cr_assert_eq(rv, 0, "send: %s", nng_strerror(rv));
    rl_wire_writer_free(w);
}

static rl_wire_msg receive_ack(nng_socket s)
{
    rl_wire_msg m = {0};
    char *buf;
    size_t size;
    const char *why;
    cr_assert_eq(nng_recv(s, &buf, &size, NNG_FLAG_ALLOC), 0, "no ack");
    cr_assert_eq(rl_wire_decode(buf, size, &m, &why), 0, "bad ack: %s", why);
    nng_free(buf, size);
    cr_assert_eq(m.type, RL_WIRE_ACK);
    return m;
}

/* Holds the Redis at addr for seconds from another connection (DEBUG SLEEP),
 * so that reports sent meanwhile queue behind the call at Redis; returns
 * the connection, to be passed to end_sleep. */
static redisContext *start_sleep(const char *addr, double seconds)
{
    redisContext *sleeper = test_redis_connect(addr);
    cr_assert_eq(redisAppendCommand(sleeper, "DEBUG SLEEP %.3f", seconds),
                 REDIS_OK);
    int written = 0;
    while (!written)
        cr_assert_eq(redisBufferWrite(sleeper, &written), REDIS_OK);
    return sleeper;
}

static void end_sleep(redisContext *sleeper)
{
    redisReply *slept;
    cr_assert_eq(redisGetReply(sleeper, (void **)&slept), REDIS_OK);
    freeReplyObject(slept);
    redisFree(sleeper);
}

/* While a call is at Redis (held there by DEBUG SLEEP), reports from four
 * agents queue and then go as one call, each key once with the sum of the
 * fresh reports' counts. Among them a report applied before (its ack
 * "lost") and one sent twice while queued: each is counted once and
 * answered as a duplicate with the same totals as the rest. */
Test(synced, reports_that_arrive_together_are_gathered_and_counted_once)
{
    /* A Redis of its own: its function calls are counted. */
    test_redis srv;
    char addr[64];
    test_agent_private_redis(&srv, addr, sizeof addr);
    test_aggregator agg;
    test_aggregator_start(&agg, addr, tenant_rule, 1000, NULL);
    test_aggregator_wait_ready(&agg);
    nng_socket first = dial_reports(&agg);
    rl_wire_msg ack = report(first, "gather-a", 1, "per-tenant", "org_g",
                             1000);
    cr_assert_eq(ack.status, RL_ACK_APPLIED);
    rl_wire_msg_free(&ack);
    redisContext *c = test_redis_connect(addr);
    long long calls_before = test_redis_calls(addr, "fcall");
    redisContext *sleeper = start_sleep(addr, 0.6);
    test_sleep_ms(50);
    /* This one goes at once, and waits at Redis... */
    nng_socket at_redis = dial_reports(&agg);
    const char *g[] = {"org_g"}, *gb[] = {"org_g", "org_b"};
    send_counts(at_redis, "gather-x", 1, g, (uint64_t[]){1}, NULL, 1);
    test_sleep_ms(150);
    /* ...while these queue behind it. */
    enum { QUEUED = 5 };
    nng_socket s[QUEUED];
    for (int i = 0; i < QUEUED; i++)
        s[i] = dial_reports(&agg);
    send_counts(s[0], "gather-b", 1, gb, (uint64_t[]){10, 2}, NULL, 2);
    send_counts(s[1], "gather-b", 1, gb, (uint64_t[]){10, 2}, NULL, 2);
    send_counts(s[2], "gather-c", 1, g, (uint64_t[]){100}, NULL, 1);
    send_counts(s[3], "gather-a", 1, g, (uint64_t[]){1000}, NULL, 1);
    send_counts(s[4], "gather-d", 1, g, (uint64_t[]){10000}, NULL, 1);
    ack = receive_ack(at_redis);
    cr_assert_eq(ack.status, RL_ACK_APPLIED);
    cr_assert_eq(ack.entries[0].current, 1001);
    rl_wire_msg_free(&ack);
    const uint64_t want[QUEUED] = {RL_ACK_APPLIED, RL_ACK_DUPLICATE,
                                   RL_ACK_APPLIED, RL_ACK_DUPLICATE,
                                   RL_ACK_APPLIED};
    int applied_b = 0;
    for (int i = 0; i < QUEUED; i++) {
        ack = receive_ack(s[i]);
        /* Which copy of gather-b's report came first is nng's to say. */
        if (i < 2)
            applied_b += ack.status == RL_ACK_APPLIED;
        else
            cr_expect_eq(ack.status, want[i], "report %d: status %llu", i,
                         (unsigned long long)ack.status);
        cr_expect_eq(ack.entries[0].current, 11111, "report %d: %llu", i,
                     (unsigned long long)ack.entries[0].current);
        if (i < 2)
            cr_expect_eq(ack.entries[1].current, 2);
        rl_wire_msg_free(&ack);
        nng_close(s[i]);
    }
    cr_expect_eq(applied_b, 1, "gather-b's report applied %d times",
                 applied_b);
    cr_assert_eq(test_window_total(addr, "rl:tenant:org_g"), 11111);
    cr_assert_eq(test_window_total(addr, "rl:tenant:org_b"), 2);
    /* The one at Redis, then the five gathered: found to hold duplicates,
     * then made again without their counts. One call per report would be
     * six. */
    long long calls = test_redis_calls(addr, "fcall") - calls_before;
    cr_expect_leq(calls, 3, "%lld calls for 6 reports", calls);
    end_sleep(sleeper);
    redisFree(c);
    nng_close(at_redis);
    nng_close(first);
    test_aggregator_stop(&agg);
    test_redis_stop(&srv);
}

/* Issue 28, 8c. A key of another type (here a string where org_t2's hash
 * of sub-windows goes) made the function fail part-way: rl_agg_6 had
 * written the sequence keys and org_t1's count, so the resend, once the
 * key was gone, was a duplicate and org_t2's and org_t3's counts were
 * lost. Now nothing is written; the report gathered with it (queued
 * behind a call held at Redis) is applied all the same; and the resend
 * counts everything, once. */
Test(synced, a_key_of_another_type_fails_its_report_alone_and_loses_no_count)
{
    test_redis srv;
    char addr[64];
    test_agent_private_redis(&srv, addr, sizeof addr);
    test_aggregator agg;
    test_aggregator_start(&agg, addr, tenant_rule, 1000, NULL);
    test_aggregator_wait_ready(&agg);
    redisContext *c = test_redis_connect(addr);
    freeReplyObject(test_redis_command(c, "SET rl:tenant:org_t2:w text"));
    const char *t[] = {"org_t1", "org_t2", "org_t3"}, *ok[] = {"org_t4"};
    const uint64_t counts[] = {1, 2, 3};
    nng_socket first = dial_reports(&agg), typed = dial_reports(&agg),
               other = dial_reports(&agg);
    redisContext *sleeper = start_sleep(addr, 0.5);
    test_sleep_ms(50);
    send_counts(first, "typed-first", 1, ok, (uint64_t[]){5}, NULL, 1);
    test_sleep_ms(150);
    send_counts(typed, "typed", 1, t, counts, NULL, 3);
    send_counts(other, "typed-other", 1, ok, (uint64_t[]){7}, NULL, 1);
    rl_wire_msg ack = receive_ack(first);
    cr_assert_eq(ack.status, RL_ACK_APPLIED);
    rl_wire_msg_free(&ack);
    ack = receive_ack(typed);
    cr_assert_eq(ack.status, RL_ACK_RETRY, "status %llu",
                 (unsigned long long)ack.status);
    rl_wire_msg_free(&ack);
    ack = receive_ack(other);
    cr_assert_eq(ack.status, RL_ACK_APPLIED, "the report gathered with it: "
                 "status %llu", (unsigned long long)ack.status);
    cr_assert_eq(ack.entries[0].current, 12);
    rl_wire_msg_free(&ack);
    end_sleep(sleeper);
    cr_assert_eq(test_window_total(addr, "rl:tenant:org_t1"), 0,
                 "written by a call that failed");
    /* The operator removes the key; the agent's resend is applied. */
    freeReplyObject(test_redis_command(c, "DEL rl:tenant:org_t2:w"));
    send_counts(typed, "typed", 1, t, counts, NULL, 3);
    ack = receive_ack(typed);
    cr_assert_eq(ack.status, RL_ACK_APPLIED, "the resend: status %llu",
                 (unsigned long long)ack.status);
    rl_wire_msg_free(&ack);
    for (int i = 0; i < 3; i++) {
        char key[32];
        snprintf(key, sizeof key, "rl:tenant:%s", t[i]);
        cr_expect_eq(test_window_total(addr, key), (long long)counts[i],
                     "%s", t[i]);
    }
    redisFree(c);
    nng_close(first);
    nng_close(typed);
    nng_close(other);
    test_aggregator_stop(&agg);
    test_redis_stop(&srv);
}

/* The next LEAVING message (wire.h) the SUB socket s hears. */
static rl_wire_msg receive_leaving(nng_socket s)
{
    for (;;) {
        char *buf;
        size_t size;
        cr_assert_eq(nng_recv(s, &buf, &size, NNG_FLAG_ALLOC), 0,
                     "no LEAVING message");
        const char *nul = memchr(buf, '\0', size);
        if (size > 0 && buf[0] == RL_WIRE_LEAVING_TOPIC && nul != NULL) {
            rl_wire_msg m;
            const char *why;
            size_t skip = (size_t)(nul + 1 - buf);
            cr_assert_eq(rl_wire_decode(buf + skip, size - skip, &m, &why),
                         0, "bad LEAVING: %s", why);
            nng_free(buf, size);
            return m;
        }
        nng_free(buf, size);
    }
}

/* A rule of 2 s (sub-windows of 100 ms) synced every 250 ms: an interval
 * holds two edges and a half, so after each TOTALS message its keys' counts
 * of the three sub-windows after the oldest come in LEAVING, read with the
 * totals: those the agents free at the edges they leave at. Counts of 1, 2,
 * 4, ... in consecutive sub-windows tell which were named. */
Test(synced, leaving_names_the_sub_windows_after_the_oldest)
{
    enum { PIECES = 8 };
    test_redis srv;
    char addr[64];
    test_agent_private_redis(&srv, addr, sizeof addr);
    test_aggregator agg;
    test_aggregator_start(&agg, addr,
                          "  - {name: leave, match: tenant, limit: 1000, "
                          "period: 2s, mode: synced}\n", 250, NULL);
    test_aggregator_wait_ready(&agg);
    nng_socket sub;
    cr_assert_eq(nng_sub0_open(&sub), 0);
    char topic[16];
    size_t tlen = rl_wire_leaving_topic("leave", topic, sizeof topic);
    cr_assert_eq(nng_socket_set(sub, NNG_OPT_SUB_SUBSCRIBE, topic, tlen), 0);
    nng_socket_set_ms(sub, NNG_OPT_RECVTIMEO, 3000);
    cr_assert_eq(nng_dial(sub, agg.totals, NULL, 0), 0);
    nng_socket s = dial_reports(&agg);
    redisContext *c = test_redis_connect(addr);
    uint64_t g = rl_wire_subwindow_ms(2000);
    /* The first count in the sub-window after now's oldest: the first
     * LEAVING names, and, read a little later, the oldest or gone. */
    uint64_t first = test_redis_time_ms(c) / g - RL_WIRE_SUBWINDOWS + 1;
    rl_wire_writer *w = rl_wire_writer_new();
    rl_wire_begin_report(w, "leaving-agent", 1, PIECES);
    for (uint64_t j = 0; j < PIECES; j++)
        rl_wire_put_count_at(w, "leave", "org_l", 5, 1ULL << j,
                             (first + j) * g + g / 2);
    size_t len;
    const void *data = rl_wire_writer_data(w, &len);
    rl_wire_msg ack = request(s, data, len, 3000);
    cr_assert_eq(ack.type, RL_WIRE_ACK);
    cr_assert_eq(ack.status, RL_ACK_APPLIED);
    uint64_t read_in = ack.entries[PIECES - 1].window;
    rl_wire_msg_free(&ack);
    rl_wire_msg m = receive_leaving(sub);
    cr_assert_eq(m.n_entries, 1);
    cr_assert_eq(m.rule.len, 5);
    cr_assert_eq(m.entries[0].window, read_in,
                 "the totals' sub-window, the report's last answer's");
    cr_assert_eq(m.entries[0].n_leaving, rl_wire_leaving_count(2000, 250));
    cr_assert_eq(m.entries[0].n_leaving, 3);
    for (size_t i = 0; i < m.entries[0].n_leaving; i++) {
        /* Sub-window read_in - N + 1 + i, counted 2^(its place). */
        uint64_t sw = read_in - RL_WIRE_SUBWINDOWS + 1 + i;
        uint64_t want = sw >= first && sw < first + PIECES
                            ? 1ULL << (sw - first) : 0;
        cr_expect_eq(m.entries[0].leaving[i], want,
                     "sub-window %zu after the oldest: %llu, not %llu", i + 1,
                     (unsigned long long)m.entries[0].leaving[i],
                     (unsigned long long)want);
    }
    rl_wire_msg_free(&m);
    rl_wire_writer_free(w);
    redisFree(c);
    nng_close(s);
    nng_close(sub);
    test_aggregator_stop(&agg);
    test_redis_stop(&srv);
}

/* A report of more entries than a piece (windows.h) is applied in pieces,
 * each under its own sequence key, in calls that each take a few of them.
 * One piece fails (a key of another type in its middle): the report is
 * answered "retry" and the other pieces are applied; the resend, once the
 * key is gone, applies that piece only. Every key then holds its count
 * exactly: nothing lost, nothing twice. */
Test(synced, a_long_report_is_applied_in_pieces_each_once)
{
    enum { N = 1000, BAD = 700 };
    test_redis srv;
    char addr[64];
    test_agent_private_redis(&srv, addr, sizeof addr);
    test_aggregator agg;
    test_aggregator_start(&agg, addr, tenant_rule, 1000, NULL);
    test_aggregator_wait_ready(&agg);
    redisContext *c = test_redis_connect(addr);
    static char names[N][24];
    const char *values[N];
    uint64_t counts[N];
    for (int i = 0; i < N; i++) {
        snprintf(names[i], sizeof names[i], "org_p%d", i);
        values[i] = names[i];
        counts[i] = (uint64_t)i + 1;
    }
    freeReplyObject(test_redis_command(c, "SET rl:tenant:org_p%d:w text",
                                       BAD));
    long long calls_before = test_redis_calls(addr, "fcall");
    nng_socket s = dial_reports(&agg);
    send_counts(s, "pieces", 1, values, counts, NULL, N);
    rl_wire_msg ack = receive_ack(s);
    cr_assert_eq(ack.status, RL_ACK_RETRY, "status %llu",
                 (unsigned long long)ack.status);
    rl_wire_msg_free(&ack);
    long long calls = test_redis_calls(addr, "fcall") - calls_before;
    cr_expect_geq(calls, 2, "%lld calls for a report of %d entries", calls,
                  N);
    int piece = BAD / RL_WINDOWS_PIECE_TESTED;
    for (int i = 0; i < N; i += 37) {
        char key[48];
        snprintf(key, sizeof key, "rl:tenant:%.23s", names[i]);
        if (i / RL_WINDOWS_PIECE_TESTED != piece)
            cr_expect_eq(test_window_total(addr, key), (long long)counts[i],
                         "%s, before the resend", names[i]);
        else if (i != BAD)
            cr_expect_eq(test_window_total(addr, key), 0,
                         "%s, in the piece that failed", names[i]);
    }
    freeReplyObject(test_redis_command(c, "DEL rl:tenant:org_p%d:w", BAD));
    send_counts(s, "pieces", 1, values, counts, NULL, N);
    ack = receive_ack(s);
    cr_assert_eq(ack.status, RL_ACK_APPLIED, "the resend: status %llu",
                 (unsigned long long)ack.status);
    cr_expect_eq(ack.entries[BAD].current, BAD + 1);
    rl_wire_msg_free(&ack);
    long long sum = 0;
    for (int i = 0; i < N; i++) {
        char key[48];
        snprintf(key, sizeof key, "rl:tenant:%.23s", names[i]);
        long long got = test_window_total(addr, key);
        cr_expect_eq(got, (long long)counts[i], "%s", names[i]);
        sum += got;
    }
    cr_assert_eq(sum, (long long)N * (N + 1) / 2);
    /* And once more: every piece a duplicate. */
    send_counts(s, "pieces", 1, values, counts, NULL, N);
    ack = receive_ack(s);
    cr_assert_eq(ack.status, RL_ACK_DUPLICATE);
    rl_wire_msg_free(&ack);
    cr_assert_eq(test_window_total(addr, "rl:tenant:org_p999"), N);
    redisFree(c);
    nng_close(s);
    test_aggregator_stop(&agg);
    test_redis_stop(&srv);
}

/* One count for the hash of org_late_sums, made in sub-window at (at most
 * w), straight through the aggregator's function (window_call.c), as an
 * aggregator whose clock says w would send it, a report alone in its
 * call; the answer into recent and oldest. Returns whether the report was
 * a duplicate: then the function writes nothing and says so, and, as the
 * aggregator does, the report is sent again marked as one, to be
 * answered. */
static bool apply_at(redisContext *c, const char *hash, uint64_t seq,
                     uint64_t w, uint64_t at, long long count,
                     long long *recent, long long *oldest)
{
    char seq_s[24], w_s[24], at_s[24], count_s[24], n_s[8], seq_key[96];
    /* Each hash's reports their own sequence. */
    snprintf(seq_key, sizeof seq_key, "%s:seq", hash);
    snprintf(seq_s, sizeof seq_s, "%llu", (unsigned long long)seq);
    snprintf(w_s, sizeof w_s, "%llu", (unsigned long long)w);
    snprintf(at_s, sizeof at_s, "%llu", (unsigned long long)at);
    snprintf(count_s, sizeof count_s, "%lld", count);
    snprintf(n_s, sizeof n_s, "%d", RL_WIRE_SUBWINDOWS);
    /* The rule's period is 30 s (a ttl of two): sub-windows of 1.5 s. */
    const char *argv[] = {"FCALL", "rl_agg_8_apply", "3",
                          seq_key, "rl:agg:live:late", hash, "1", "1", n_s, seq_s,
                          "late-sums", "0", "1", "1", "1", "60000", "1",
                          "60000", w_s, at_s, "1", "1500", "0", count_s};
    enum { ARGC = sizeof argv / sizeof argv[0], KNOWN_DUPLICATE = 11 };
    redisReply *r = redisCommandArgv(c, ARGC, argv, NULL);
    cr_assert(r != NULL && r->type == REDIS_REPLY_ARRAY && r->elements >= 2,
              "%s", r != NULL && r->type == REDIS_REPLY_ERROR ? r->str : "");
    bool duplicate = r->element[0]->integer == 1;
    if (duplicate) {
        cr_assert_eq(r->elements, 2);
        cr_assert_eq(r->element[1]->integer, 1, "not the one part");
        freeReplyObject(r);
        argv[KNOWN_DUPLICATE] = "1";
        argv[ARGC - 1] = "0"; /* a duplicate's counts are left out */
        r = redisCommandArgv(c, ARGC, argv, NULL);
        cr_assert(r != NULL && r->type == REDIS_REPLY_ARRAY);
        cr_assert_eq(r->element[0]->integer, 0);
    }
    /* The answer ends with the µs the call took in Redis, after the
     * counts after the oldest, none asked. */
    cr_assert_eq(r->elements, 6);
    cr_assert_eq(r->element[4]->type, REDIS_REPLY_ARRAY);
    cr_assert_eq(r->element[4]->elements, 0);
    *recent = r->element[2]->integer;
    *oldest = r->element[3]->integer;
    freeReplyObject(r);
    return duplicate;
}

/* A hash of sub-windows as Redis holds it: its fields named by a number,
 * and its head and sums (m, "h r o g"). */
typedef struct window_hash {
    unsigned long long field[64][2]; /* sub-window, count */
    size_t n;
    bool has_m;
    unsigned long long head, r, o;
} window_hash;

static void read_window_hash(redisContext *c, const char *key,
                             window_hash *out)
{
    redisReply *h = test_redis_command(c, "HGETALL %s", key);
    cr_assert_eq(h->type, REDIS_REPLY_ARRAY, "HGETALL %s: %s", key, h->str);
    *out = (window_hash){.n = 0};
    for (size_t f = 0; f + 1 < h->elements; f += 2) {
        if (strcmp(h->element[f]->str, "m") == 0) {
            out->has_m = true;
            cr_assert_eq(sscanf(h->element[f + 1]->str, "%llu %llu %llu",
                                &out->head, &out->r, &out->o), 3);
        } else {
            cr_assert_lt(out->n, 64, "%s: too many fields", key);
            out->field[out->n][0] = strtoull(h->element[f]->str, NULL, 10);
            out->field[out->n++][1] = strtoull(h->element[f + 1]->str,
                                               NULL, 10);
        }
    }
    freeReplyObject(h);
}

/* The count of sub-window w in the hash, 0 if it has no such field. */
static unsigned long long window_count(const window_hash *h, uint64_t w)
{
    for (size_t i = 0; i < h->n; i++) {
        if (h->field[i][0] == w)
            return h->field[i][1];
    }
    return 0;
}

/* The hash's m ("h r o") says the same as its fields: r is the sum of
 * h-N+1..h-1, o the count of h-N. Returns h. */
static uint64_t expect_sums_match_fields(redisContext *c, const char *key)
{
    window_hash h;
    read_window_hash(c, key, &h);
    cr_assert(h.has_m, "%s has no m", key);
    unsigned long long want_r = 0, want_o = window_count(&h, h.head
                                                         - RL_WIRE_SUBWINDOWS);
    for (uint64_t w = h.head - RL_WIRE_SUBWINDOWS + 1; w < h.head; w++)
        want_r += window_count(&h, w);
    cr_expect_eq(h.r, want_r, "head %llu: r %llu, the fields %llu", h.head,
                 h.r, want_r);
    cr_expect_eq(h.o, want_o, "head %llu: o %llu, the fields %llu", h.head,
                 h.o, want_o);
    return h.head;
}

/* An entry in the head's sub-window is answered from the sums kept in m
 * (windows.c), not from the fields: they must stay equal to the fields
 * when the head moves by one, jumps, and when a count comes for a
 * sub-window before the head (an aggregator whose clock lags), or for
 * one before the aggregator's (a count its report says was made there),
 * before the head, at it or after it. Such a count also gives the hash
 * its expiry again. */
Test(synced, the_sums_beside_the_sub_windows_stay_equal_to_them)
{
    enum { N = RL_WIRE_SUBWINDOWS, W = 1000 };
    static const char key[] = "rl:tenant:org_late_sums:w";
    test_aggregator agg;
    test_aggregator_start(&agg, NULL, tenant_rule, 1000, NULL);
    test_aggregator_wait_ready(&agg);
    nng_socket s = dial_reports(&agg);
    rl_wire_msg ack = report(s, "late-loader", 1, "per-tenant", "org_x", 1);
    cr_assert_eq(ack.status, RL_ACK_APPLIED, "the function is not loaded");
    rl_wire_msg_free(&ack);
    nng_close(s);
    redisContext *c = test_redis_connect(NULL);
    freeReplyObject(test_redis_command(c, "DEL %s %s:seq", key, key));
    /* w: the aggregator's sub-window; at: the count's. */
    static const struct {
        uint64_t w, at, count;
        long long recent, oldest;
        uint64_t head;
    } steps[] = {
        {W, W, 5, 5, 0, W},                     /* a new hash */
        {W + 1, W + 1, 3, 8, 0, W + 1},         /* the head moves by one */
        {W, W, 2, 7, 0, W + 1},                 /* late by one: into r */
        {W + 1, W + 1, 1, 11, 0, W + 1},        /* from the sums */
        {W + N + 1, W + N + 1, 1, 1, 4, W + N + 1}, /* the head jumps */
        {W + N, W + N, 2, 6, 7, W + N + 1},     /* late by one again */
        {W + N + 1, W + N + 1, 0, 3, 4, W + N + 1}, /* a count of 0 asks */
        {W + N + 2, W + N + 2, 1, 4, 0, W + N + 2}, /* by one, from the sums */
        {W + 2, W + 2, 3, 7, 0, W + N + 2},     /* late by N: into o */
        {W + N + 2, W + N + 2, 1, 5, 3, W + N + 2},
        /* Counts made before the aggregator's sub-window: */
        {W + 22, W + 19, 4, 9, 3, W + 22},      /* at the head: into r */
        {W + 22, W + 2, 1, 9, 4, W + 22},       /* N before it: into o */
        {W + 23, W + 21, 2, 11, 0, W + 23},     /* by one, from the fields */
        {W + 26, W + 24, 5, 16, 0, W + 26},     /* a jump past the count */
        {W + 26, W + 6, 1, 16, 1, W + 26},      /* the oldest */
        {W + 27, W + 27, 1, 17, 0, W + 27},     /* by one, from the sums */
        {W + 25, W + 24, 2, 19, 0, W + 27},     /* lagging, and made late */
    };
    enum { STEPS = sizeof steps / sizeof steps[0] };
    for (size_t i = 0; i < STEPS; i++) {
        long long recent, oldest;
        if (steps[i].at < steps[i].w)
            freeReplyObject(test_redis_command(c, "PERSIST %s", key));
        cr_assert_not(apply_at(c, key, i + 1, steps[i].w, steps[i].at,
                               steps[i].count, &recent, &oldest),
                      "step %zu a duplicate", i);
        cr_expect_eq(recent, steps[i].recent, "step %zu: recent %lld", i,
                     recent);
        cr_expect_eq(oldest, steps[i].oldest, "step %zu: oldest %lld", i,
                     oldest);
        cr_assert_eq(expect_sums_match_fields(c, key), steps[i].head,
                     "step %zu: head", i);
        if (steps[i].at < steps[i].w) {
            long long ttl = test_redis_pttl(NULL, key);
            cr_expect(ttl > 0 && ttl <= 60000, "step %zu: PTTL %lld", i,
                      ttl);
        }
    }
    /* Sent again, the last is a duplicate with the same answer. */
    long long recent, oldest;
    cr_assert(apply_at(c, key, STEPS, steps[STEPS - 1].w, steps[STEPS - 1].at,
                       steps[STEPS - 1].count, &recent, &oldest));
    cr_expect_eq(recent, steps[STEPS - 1].recent);
    cr_expect_eq(oldest, steps[STEPS - 1].oldest);
    expect_sums_match_fields(c, key);
    redisFree(c);
    test_aggregator_stop(&agg);
}

/* A give-back (a negative count, wire.h) comes off its sub-window's
 * field, at the head or before it, never below 0, and the sums beside
 * the fields stay equal to them. */
Test(synced, a_give_back_comes_off_its_sub_window_never_below_zero)
{
    enum { W = 1000 };
    static const char key[] = "rl:tenant:org_give_back:w";
    test_aggregator agg;
    test_aggregator_start(&agg, NULL, tenant_rule, 1000, NULL);
    test_aggregator_wait_ready(&agg);
    redisContext *c = test_redis_connect(NULL);
    freeReplyObject(test_redis_command(c, "DEL %s %s:seq", key, key));
    /* w: the aggregator's sub-window; at: the count's. */
    static const struct {
        uint64_t w, at;
        long long count, recent;
        unsigned long long left_at_w, left_at_next; /* the fields after */
    } steps[] = {
        {W, W, 5, 5, 5, 0},
        {W + 1, W + 1, 3, 8, 5, 3},
        {W + 1, W, -2, 6, 3, 3},     /* before the head: off r */
        {W + 1, W + 1, -10, 3, 3, 0}, /* at the head, floored */
        {W + 1, W, -4, 0, 0, 0},     /* before it, floored */
        {W + 1, W + 1, 2, 2, 0, 2},
    };
    enum { STEPS = sizeof steps / sizeof steps[0] };
    for (size_t i = 0; i < STEPS; i++) {
        long long recent, oldest;
        cr_assert_not(apply_at(c, key, i + 1, steps[i].w, steps[i].at,
                               steps[i].count, &recent, &oldest),
                      "step %zu a duplicate", i);
        cr_expect_eq(recent, steps[i].recent, "step %zu: recent %lld", i,
                     recent);
        cr_expect_eq(oldest, 0, "step %zu: oldest %lld", i, oldest);
        cr_assert_eq(expect_sums_match_fields(c, key), W + 1 - (i == 0),
                     "step %zu: head", i);
        window_hash h;
        read_window_hash(c, key, &h);
        cr_expect_eq(window_count(&h, W), steps[i].left_at_w,
                     "step %zu: sub-window %d holds %llu", i, W,
                     window_count(&h, W));
        cr_expect_eq(window_count(&h, W + 1), steps[i].left_at_next,
                     "step %zu: sub-window %d holds %llu", i, W + 1,
                     window_count(&h, W + 1));
    }
    redisFree(c);
    test_aggregator_stop(&agg);
}

/* A key whose agents all reject sends no counts: its agents ask for its
 * totals with a count of 0, which the aggregator answers, applies once by
 * its sequence number, and never stores. */
Test(synced, a_count_of_zero_asks_for_the_totals_and_writes_nothing)
{
    test_aggregator agg;
    test_aggregator_start(&agg, NULL, tenant_rule, 1000, NULL);
    test_aggregator_wait_ready(&agg);
    nng_socket s = dial_reports(&agg);
    rl_wire_msg ack = report(s, "zero", 1, "per-tenant", "org_zero", 4);
    cr_assert_eq(ack.status, RL_ACK_APPLIED);
    rl_wire_msg_free(&ack);
    ack = report(s, "zero", 2, "per-tenant", "org_zero", 0);
    cr_assert_eq(ack.status, RL_ACK_APPLIED);
    cr_assert_eq(ack.n_entries, 1);
    cr_assert_eq(ack.entries[0].current + ack.entries[0].previous, 4);
    rl_wire_msg_free(&ack);
    ack = report(s, "zero", 2, "per-tenant", "org_zero", 0);
    cr_assert_eq(ack.status, RL_ACK_DUPLICATE);
    cr_assert_eq(ack.entries[0].current + ack.entries[0].previous, 4);
    rl_wire_msg_free(&ack);
    /* A key nobody counted: answered with nothing, and no key made. */
    ack = report(s, "zero", 3, "per-tenant", "org_zero_never", 0);
    cr_assert_eq(ack.status, RL_ACK_APPLIED);
    cr_assert_eq(ack.entries[0].current, 0);
    cr_assert_eq(ack.entries[0].previous, 0);
    rl_wire_msg_free(&ack);
    redisContext *c = test_redis_connect(NULL);
    redisReply *keys = test_redis_command(c, "KEYS rl:tenant:org_zero*");
    cr_assert_eq(keys->elements, 1, "%zu keys for one client's counts",
                 keys->elements);
    freeReplyObject(keys);
    redisFree(c);
    cr_assert_eq(test_window_total(NULL, "rl:tenant:org_zero"), 4);
    nng_close(s);
    test_aggregator_stop(&agg);
}

/* --- Counts in the sub-windows they were made in (wire.h, windows.c). --- */

/* A rule whose sub-windows are three minutes long: a test's reports all
 * fall in one, and its hashes live two hours (its period, HOUR_MS, is
 * above). */
static const char hour_rule[] =
    "  - {name: per-tenant, match: tenant, limit: 1000000, period: 1h, "
    "mode: synced}\n";

/* Redis's sub-window of hour_rule, once its clock is two seconds or more
 * from either end of it, so that the aggregator's reading of the clock is
 * in it too. */
static uint64_t hour_subwindow(void)
{
    enum { EDGE_MS = 2000 };
    uint64_t g = rl_wire_subwindow_ms(HOUR_MS), into = redis_time_ms() % g;
    if (into < EDGE_MS)
        test_sleep_ms((unsigned)(EDGE_MS - into));
    else if (into > g - EDGE_MS)
        test_sleep_ms((unsigned)(g - into + EDGE_MS));
    return redis_time_ms() / g;
}

/* The hash of value's counts on store (NULL: the runner's Redis), braced
 * on a cluster, and a connection to the server that holds it. */
static redisContext *connect_hash(const char *store, const char *value,
                                  char *key, size_t cap)
{
    bool cluster = store != NULL && strchr(store, ',') != NULL;
    snprintf(key, cap, cluster ? "{rl:tenant:%s}:w" : "rl:tenant:%s:w",
             value);
    if (store == NULL)
        store = test_env("RL_TEST_REDIS");
    redisContext *c = test_redis_connect_holding(store, key);
    cr_assert_not_null(c, "no server of %s serves %s", store, key);
    return c;
}

/* One report carries a key's counts made in four sub-windows, as an agent
 * sends what it held through an outage: each lands in its own, the one of
 * an agent whose clock is ahead in now's, and the one made before every
 * span in none. Every entry is answered with totals read now, the one
 * read last with all the report's counts; a count made now is then
 * answered from the sums, which match the fields. */
static void counts_keep_their_sub_windows(const char *store,
                                          const char *value)
{
    enum { N = RL_WIRE_SUBWINDOWS };
    test_aggregator agg;
    test_aggregator_start(&agg, store, hour_rule, 1000, NULL);
    test_aggregator_wait_ready(&agg);
    char key[128];
    redisContext *c = connect_hash(store, value, key, sizeof key);
    nng_socket s = dial_reports(&agg);
    uint64_t w = hour_subwindow();
    const char *values[] = {value, value, value, value, value};
    send_counts(s, "at-1", 1, values, (uint64_t[]){3, 4, 5, 6, 7},
                (uint64_t[]){w - 3, w - N, w - N - 1, w + 2, 0}, 5);
    rl_wire_msg ack = receive_ack(s);
    cr_assert_eq(ack.status, RL_ACK_APPLIED);
    cr_assert_eq(ack.n_entries, 5);
    uint64_t most = 0, its_oldest = 0;
    for (size_t i = 0; i < ack.n_entries; i++) {
        cr_expect_eq(ack.entries[i].window, w, "entry %zu read in %llu, "
                     "now is %llu", i,
                     (unsigned long long)ack.entries[i].window,
                     (unsigned long long)w);
        if (ack.entries[i].current > most) {
            most = ack.entries[i].current;
            its_oldest = ack.entries[i].previous;
        }
    }
    cr_expect_eq(most, 3 + 6 + 7, "recent %llu", (unsigned long long)most);
    cr_expect_eq(its_oldest, 4);
    rl_wire_msg_free(&ack);
    window_hash h;
    read_window_hash(c, key, &h);
    cr_expect_eq(h.n, 3, "%zu sub-windows written", h.n);
    cr_expect_eq(window_count(&h, w - 3), 3);
    cr_expect_eq(window_count(&h, w - N), 4);
    cr_expect_eq(window_count(&h, w), 6 + 7);
    cr_expect_eq(expect_sums_match_fields(c, key), w);

    send_counts(s, "at-1", 2, values, (uint64_t[]){1}, NULL, 1);
    ack = receive_ack(s);
    cr_assert_eq(ack.status, RL_ACK_APPLIED);
    cr_expect_eq(ack.entries[0].window, w);
    read_window_hash(c, key, &h);
    unsigned long long recent = 0;
    for (uint64_t k = w - N + 1; k <= w; k++)
        recent += window_count(&h, k);
    cr_expect_eq(recent, 3 + 6 + 7 + 1);
    cr_expect_eq(ack.entries[0].current, recent);
    cr_expect_eq(ack.entries[0].previous, 4);
    rl_wire_msg_free(&ack);
    expect_sums_match_fields(c, key);
    redisFree(c);
    nng_close(s);
    test_aggregator_stop(&agg);
}

Test(synced, a_count_goes_to_the_sub_window_its_entry_names)
{
    counts_keep_their_sub_windows(NULL, "org_at");
}

Test(synced, a_count_goes_to_the_sub_window_its_entry_names_on_a_cluster)
{
    counts_keep_their_sub_windows(test_env("RL_TEST_CLUSTER"),
                                  "org_at_cluster");
}

/* Starts agg on hour_rule and sends it one count of value made `back`
 * sub-windows before now's, which goes in *w, as the agent named value
 * (its first report); returns the ack. */
static rl_wire_msg one_count_made_before(test_aggregator *agg,
                                         const char *value, uint64_t count,
                                         uint64_t back, uint64_t *w)
{
    test_aggregator_start(agg, NULL, hour_rule, 1000, NULL);
    test_aggregator_wait_ready(agg);
    nng_socket s = dial_reports(agg);
    *w = hour_subwindow();
    send_counts(s, value, 1, (const char *[]){value},
                (uint64_t[]){count}, (uint64_t[]){*w - back}, 1);
    rl_wire_msg ack = receive_ack(s);
    nng_close(s);
    cr_assert_eq(ack.status, RL_ACK_APPLIED);
    cr_assert_eq(ack.n_entries, 1);
    cr_expect_eq(ack.entries[0].window, *w);
    return ack;
}

/* A count made more than N sub-windows ago is in no span read from now
 * on, not even as its oldest: it writes nothing, and its entry is still
 * answered. */
Test(synced, a_count_out_of_every_span_writes_nothing)
{
    test_aggregator agg;
    uint64_t w;
    rl_wire_msg ack = one_count_made_before(&agg, "org_at_gone", 9,
                                            RL_WIRE_SUBWINDOWS + 1, &w);
    cr_expect_eq(ack.entries[0].current, 0);
    cr_expect_eq(ack.entries[0].previous, 0);
    rl_wire_msg_free(&ack);
    cr_expect_eq(test_redis_pttl(NULL, "rl:tenant:org_at_gone:w"), -2,
                 "a hash was written");
    test_aggregator_stop(&agg);
}

/* A hash that only a count made earlier wrote expires two periods later,
 * as any: it is not left in Redis for good. */
Test(synced, a_hash_only_an_old_count_made_expires)
{
    test_aggregator agg;
    uint64_t w;
    rl_wire_msg ack = one_count_made_before(&agg, "org_at_ttl", 2, 5, &w);
    rl_wire_msg_free(&ack);
    redisContext *c = test_redis_connect(NULL);
    window_hash h;
    read_window_hash(c, "rl:tenant:org_at_ttl:w", &h);
    redisFree(c);
    cr_expect_eq(h.n, 1);
    cr_expect_eq(window_count(&h, w - 5), 2);
    long long ttl = test_redis_pttl(NULL, "rl:tenant:org_at_ttl:w");
    cr_expect(ttl > 0 && ttl <= 2LL * HOUR_MS, "PTTL %lld", ttl);
    test_aggregator_stop(&agg);
}

/* A subscriber to agg's FEATURES topic (wire.h), connected on return. */
static nng_socket features_subscriber(const test_aggregator *agg)
{
    nng_socket sub;
    cr_assert_eq(nng_sub0_open(&sub), 0);
    nng_socket_set(sub, NNG_OPT_SUB_SUBSCRIBE, RL_WIRE_FEATURES_TOPIC,
                   RL_WIRE_FEATURES_TOPIC_LEN);
    nng_socket_set_ms(sub, NNG_OPT_RECVTIMEO, 20);
    int rv = nng_dial(sub, agg->totals, NULL, 0);
    cr_assert_eq(rv, 0, "dial %s: %s", agg->totals, nng_strerror(rv));
    return sub;
}

/* Whether a FEATURES message saying the aggregator reads entries'
 * sub-windows comes within timeout_ms (what came before is dropped). */
static bool features_heard(nng_socket sub, unsigned timeout_ms)
{
    char *buf;
    size_t size;
    while (nng_recv(sub, &buf, &size, NNG_FLAG_ALLOC | NNG_FLAG_NONBLOCK)
           == 0)
        nng_free(buf, size);
    uint64_t until = test_now_ms() + timeout_ms;
    bool heard = false;
    while (!heard && test_now_ms() < until) {
        if (nng_recv(sub, &buf, &size, NNG_FLAG_ALLOC) != 0)
            continue;
        rl_wire_msg m;
        const char *why;
        cr_assert(size > RL_WIRE_FEATURES_TOPIC_LEN
                  && memcmp(buf, RL_WIRE_FEATURES_TOPIC,
                            RL_WIRE_FEATURES_TOPIC_LEN) == 0);
        cr_assert_eq(rl_wire_decode(buf + RL_WIRE_FEATURES_TOPIC_LEN,
                                    size - RL_WIRE_FEATURES_TOPIC_LEN, &m,
                                    &why), 0, "%s", why);
        cr_assert_eq(m.type, RL_WIRE_FEATURES);
        heard = (m.features & RL_WIRE_FEATURE_WINDOWS) != 0;
        rl_wire_msg_free(&m);
        nng_free(buf, size);
    }
    return heard;
}

/* Every interval the aggregator says it reads REPORT entries' sub-windows
 * (FEATURES, under a topic of one NUL byte), whether it can reach Redis
 * or not: an agent holding counts through an outage behind it learns
 * so. */
Test(synced, the_aggregator_says_each_interval_that_it_reads_sub_windows)
{
    enum { INTERVAL_MS = 200 };
    test_redis srv;
    char addr[64], err[512];
    cr_assert_eq(test_redis_start(&srv, test_env("RL_TEST_TMPDIR"), NULL, err,
                                  sizeof err), 0, "%s", err);
    snprintf(addr, sizeof addr, "127.0.0.1:%u", srv.port);
    test_aggregator agg;
    test_aggregator_start(&agg, addr, tenant_rule, INTERVAL_MS, NULL);
    test_aggregator_wait_ready(&agg);
    nng_socket sub = features_subscriber(&agg);
    cr_expect(features_heard(sub, 2 * INTERVAL_MS), "Redis up");
    test_redis_kill(&srv);
    test_wait_for_log(&agg.pid, agg.log, "event=store_disconnected", 5000);
    cr_expect(features_heard(sub, 2 * INTERVAL_MS), "Redis gone");
    test_aggregator_stop(&agg);
    /* Closed with nothing more to come (nng 1.5.2, see rl_sync_stop). */
    nng_close(sub);
    /* Started with no Redis to reach, it knows no clock and publishes no
     * totals: it still says what it reads. */
    test_aggregator_start(&agg, NULL, NULL, 0, &agg);
    sub = features_subscriber(&agg);
    cr_expect(features_heard(sub, 2 * INTERVAL_MS), "Redis never reached");
    test_aggregator_stop(&agg);
    nng_close(sub);
    test_redis_stop(&srv);
}

/* The value's count is in one sub-window, a field of its hash
 * rl:tenant:<value>:w, and that sub-window is within first..last. The
 * hash's one other field is m, its head and sums (windows.c), in
 * tenant_rule's sub-windows of 500 ms: the head is that sub-window and
 * the sums hold nothing, or (an agent's count made just before a
 * sub-window's end, applied just after it) the head is a sub-window or two
 * later and the recent sum holds the count. */
static void expect_one_window(const char *value, uint64_t first,
                              uint64_t last, long long count)
{
    redisContext *c = test_redis_connect(NULL);
    redisReply *h = test_redis_command(c, "HGETALL rl:tenant:%s:w", value);
    cr_assert_eq(h->elements, 4, "%s: %zu fields", value, h->elements / 2);
    size_t sub = strcmp(h->element[0]->str, "m") == 0 ? 2 : 0;
    const char *window = h->element[sub]->str;
    const char *m = h->element[2 - sub + 1]->str;
    uint64_t w = strtoull(window, NULL, 10);
    unsigned long long head, recent, oldest, g;
    cr_assert_eq(sscanf(m, "%llu %llu %llu %llu", &head, &recent, &oldest,
                        &g), 4, "%s: m is '%s'", value, m);
    cr_expect(g == 500 && oldest == 0
                  && ((head == w && recent == 0)
                      || (head > w && head <= w + 2
                          && recent == (unsigned long long)count)),
              "%s: m is '%s', the count %lld in %s", value, m, count,
              window);
    cr_assert(w >= first && w <= last, "%s counted in sub-window "
              "%llu; by Redis's clock it is %llu..%llu", value,
              (unsigned long long)w, (unsigned long long)first,
              (unsigned long long)last);
    cr_assert_eq(atoll(h->element[sub + 1]->str), count, "%s holds %s",
                 value, h->element[sub + 1]->str);
    freeReplyObject(h);
    redisFree(c);
}

/* The aggregator's own clock is 5 h 3.7 s ahead (libfaketime, preloaded,
 * shifts what clock_gettime and time answer it): the windows it writes and
 * answers with must still be Redis's. */
Test(synced, windows_are_numbered_by_redis_clock)
{
    char asan[512];
    const char *old = getenv("ASAN_OPTIONS");
    /* ASan wants its runtime first among the libraries; libfaketime is
     * preloaded before it. */
    snprintf(asan, sizeof asan, "ASAN_OPTIONS=%s%sverify_asan_link_order=0",
             old != NULL ? old : "", old != NULL ? ":" : "");
    const char *const faketime[] = {
        "/usr/bin/env", "LD_PRELOAD=/usr/$LIB/faketime/libfaketime.so.1",
        "FAKETIME=+18003.7", asan, NULL};
    test_aggregator tpl = TEST_AGGREGATOR_WRAPPED(faketime);
    test_aggregator agg;
    test_aggregator_start(&agg, NULL, tenant_rule, 100, &tpl);
    char cmd[128], out[64];
    snprintf(cmd, sizeof cmd, "grep -c libfaketime /proc/%d/maps",
             (int)agg.pid);
    test_run(cmd, out, sizeof out);
    cr_assert_gt(atoi(out), 0, "libfaketime is not loaded in the aggregator "
                 "(apt-get install faketime)");
    test_aggregator_wait_ready(&agg);

    /* The aggregator's reading of Redis's clock may be a little behind or
     * ahead of the test's: a second either way (a shift is 18,003.7 s).
     * Counts go in sub-windows of a twentieth of the rule's 10 s. */
    enum { SKEW_MS = 1000, TENANT_PERIOD_MS = 10000 / RL_WIRE_SUBWINDOWS };
    nng_socket s = dial_reports(&agg);
    uint64_t before = redis_time_ms() - SKEW_MS;
    rl_wire_msg ack = report(s, "clock", 1, "per-tenant", "org_clock", 1);
    uint64_t after = redis_time_ms() + SKEW_MS;
    cr_assert_eq(ack.status, RL_ACK_APPLIED);
    cr_assert(ack.now_ms >= before && ack.now_ms <= after,
              "the ack says %llu ms, Redis %llu..%llu",
              (unsigned long long)ack.now_ms, (unsigned long long)before,
              (unsigned long long)after);
    cr_assert(ack.entries[0].window >= before / TENANT_PERIOD_MS
                  && ack.entries[0].window <= after / TENANT_PERIOD_MS,
              "window %llu, Redis says %llu..%llu",
              (unsigned long long)ack.entries[0].window,
              (unsigned long long)before / TENANT_PERIOD_MS,
              (unsigned long long)after / TENANT_PERIOD_MS);
    expect_one_window("org_clock", before / TENANT_PERIOD_MS,
                      after / TENANT_PERIOD_MS, 1);
    rl_wire_msg_free(&ack);
    nng_close(s);

    /* An agent's counts, through the aggregator, land in Redis's window. */
    rl_config *cfg;
    rl_agent *a = test_synced_agent(&agg, &cfg);
    before = redis_time_ms() - SKEW_MS;
    for (int i = 0; i < 3; i++)
        cr_assert(check_tenant(a, "org_clock_agent"));
    test_expect_window_total("rl:tenant:org_clock_agent", 3, 5000);
    after = redis_time_ms() + SKEW_MS;
    expect_one_window("org_clock_agent", before / TENANT_PERIOD_MS,
                      after / TENANT_PERIOD_MS, 3);
    rl_agent_close(a);
    rl_config_free(cfg);
    test_aggregator_stop(&agg);
}

/* Speaks nng's TCP framing (the SP header of a REQ peer, then a message's
 * 8-byte length) on a plain socket, announcing a message over the cap, and
 * asserts the aggregator closes the connection. Plain sockets keep the
 * test's side free of nng's own buffering of a huge send. */
static void send_oversized(const char *url)
{
    unsigned port = 0;
    cr_assert_eq(sscanf(url, "tcp://127.0.0.1:%u", &port), 1, "%s", url);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET,
                             .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    struct timeval tv = {5, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    cr_assert_eq(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    static const unsigned char header[8] = {0, 'S', 'P', 0, 0, 48, 0, 0};
    unsigned char peer[8];
    cr_assert_eq(send(fd, header, 8, MSG_NOSIGNAL), 8);
    cr_assert_eq(recv(fd, peer, 8, MSG_WAITALL), 8, "no SP header back");
    uint64_t len = (uint64_t)RL_WIRE_MESSAGE_MAX + 16;
    unsigned char size[8];
    for (int i = 0; i < 8; i++)
        size[i] = (unsigned char)(len >> (56 - 8 * i));
    cr_assert_eq(send(fd, size, 8, MSG_NOSIGNAL), 8);
    static char chunk[65536];
    for (int i = 0; i < 4; i++)
        if (send(fd, chunk, sizeof chunk, MSG_NOSIGNAL) < 0)
            break;
    char byte;
    ssize_t got = recv(fd, &byte, 1, 0);
    cr_assert_leq(got, 0, "the connection was not cut");
    close(fd);
}

Test(synced, bad_input_does_not_stop_the_aggregator)
{
    test_aggregator agg;
    test_aggregator_start(&agg, NULL, tenant_rule, 1000, NULL);
    test_aggregator_wait_ready(&agg);
    nng_socket s = dial_reports(&agg);
    uint64_t first_bad_ms = test_now_ms();
    static const unsigned char garbage[] = {0xde, 0xad, 0xbe, 0xef};
    static const unsigned char version[] = {0x95, 0x07, 0x01, 0xa1, 'a',
                                            0x01, 0x90};
    static const unsigned char bomb[] = {0x95, 0x01, 0x01, 0xa1, 'a', 0x01,
                                         0xdd, 0xff, 0xff, 0xff, 0xff};
    const struct { const void *p; size_t n; } bad[] = {
        {garbage, sizeof garbage}, {version, sizeof version},
        {bomb, sizeof bomb}};
    for (size_t i = 0; i < 3; i++) {
        rl_wire_msg m = request(s, bad[i].p, bad[i].n, 300);
        cr_assert_eq(m.type, 0, "bad message %zu was answered", i);
    }
    /* A count over 2^53, a value over 256 bytes, an unknown rule. */
    rl_wire_msg m = report_within(s, "bad", 1, "no-such-rule", "x", 1, 300);
    cr_assert_eq(m.type, 0);
    char long_value[300];
    memset(long_value, 'v', sizeof long_value - 1);
    long_value[sizeof long_value - 1] = '\0';
    m = report_within(s, "bad", 2, "per-tenant", long_value, 1, 300);
    cr_assert_eq(m.type, 0);
    m = report_within(s, "bad", 3, "per-tenant", "x", 1ULL << 60, 300);
    cr_assert_eq(m.type, 0);
    nng_close(s);
    /* A message over the 4 MiB cap: the connection is cut. */
    send_oversized(agg.reports);
    /* Once per interval (1 s) at most: as many lines as the intervals the
     * bad messages spanned, which a slow (sanitized) run makes more. */
    uint64_t spanned = (test_now_ms() - first_bad_ms + 999) / 1000 + 1;

    /* Still serving the good agents. */
    s = dial_reports(&agg);
    rl_wire_msg ack = report(s, "good", 1, "per-tenant", "org_good", 5);
    cr_assert_eq(ack.type, RL_WIRE_ACK, "the aggregator stopped serving");
    cr_assert_eq(ack.status, RL_ACK_APPLIED);
    rl_wire_msg_free(&ack);
    nng_close(s);
    test_aggregator_stop(&agg);
    /* Each was counted; one peer's flood is logged once per interval. */
    char cmd[700], out[8192];
    snprintf(cmd, sizeof cmd, "grep -c 'report_rejected peer=127.0.0.1' %s",
             agg.log);
    test_run(cmd, out, sizeof out);
    cr_assert_geq(atoi(out), 1, "rejections were not logged");
    cr_assert_leq((uint64_t)atoi(out), spanned,
                  "a flood was logged line by line: %d lines in %llu "
                  "intervals", atoi(out), (unsigned long long)spanned);
    snprintf(cmd, sizeof cmd, "grep -c 'event=stopped.* rejected=6$' %s",
             agg.log);
    test_run(cmd, out, sizeof out);
    cr_assert_eq(atoi(out), 1, "six bad reports were not all counted");
}

/* --- Ten agents, one tenant, five times the limit, four windows. --------- */

#define FLEET 10
#define LIMIT 1000
#define PERIOD_MS 10000
/* Four, not three: the fleet admits in bursts a period and the sync's lag
 * apart, and one window in the run may catch little of one (375 of the
 * limit seen in make test); three windows then averaged 0.67 against the
 * floor of 0.66 in CI. */
#define WINDOWS 4

/* Requests spread evenly over the agents, at five times the limit: 5,000
 * per 10 s, one every 2 ms, so that a fleet that let too much through
 * would cross the stated bound. Each admission is counted in the window
 * Redis's clock puts it in. */
static void run_fleet(rl_agent **agents, uint64_t first_window,
                      long admitted[WINDOWS], long offered[WINDOWS])
{
    uint64_t redis_at_start = redis_time_ms();
    uint64_t mono_at_start = test_now_ms();
    for (long i = 0;; i++) {
        uint64_t now = redis_at_start + (test_now_ms() - mono_at_start);
        uint64_t w = now / PERIOD_MS;
        if (w >= first_window + WINDOWS)
            break;
        bool ok = check_tenant(agents[i % FLEET], "org_fleet");
        if (w >= first_window) {
            offered[w - first_window]++;
            admitted[w - first_window] += ok;
        }
        /* Keep to one request per 2 ms on average. */
        uint64_t due = mono_at_start + (uint64_t)(i + 1) * 2;
        uint64_t at = test_now_ms();
        if (due > at)
            test_sleep_ms((unsigned)(due - at));
    }
}

/* The floor is the sync's timing as much as the code's. A report's counts
 * are placed in the sub-window the report is applied in, up to one
 * interval after they were admitted, so their room comes back up to an
 * interval and a sub-window late: at a sync of a tenth of the period that
 * is a cycle of about 1.15 to 1.25 periods per limit, and three windows
 * measured 0.73 to 0.98 of the limit on average. Under
 * ThreadSanitizer (ten agents and an aggregator instrumented, a cluster,
 * two cores) reports and totals come late enough that room comes back
 * seconds late; there the test holds the fleet to "not starved" (half the
 * limit) and the bound above unchanged. */
#ifdef __SANITIZE_THREAD__
#define FLOOR_PERCENT 50
#else
#define FLOOR_PERCENT 66
#endif

/* store: NULL for the runner's Redis, or a cluster's seeds. */
static void ten_agents(const char *store, const char *label)
{
    test_aggregator agg;
    char rule[160];
    snprintf(rule, sizeof rule, "  - {name: per-tenant, match: tenant, "
             "limit: %d, period: %dms, mode: synced}\n", LIMIT, PERIOD_MS);
    test_aggregator_start(&agg, store, rule, 1000, NULL);
    rl_agent *agents[FLEET];
    rl_config *cfgs[FLEET];
    for (int i = 0; i < FLEET; i++)
        agents[i] = test_synced_agent(&agg, &cfgs[i]);
    /* The agents' presence reports make the fleet's size known to each
     * within two intervals; then warm up for a window, so that the windows
     * measured come after the first burst (the steady state), then measure
     * four whole windows. */
    test_sleep_ms(2500);
    uint64_t first = redis_time_ms() / PERIOD_MS + 2;
    long admitted[WINDOWS] = {0}, offered[WINDOWS] = {0};
    run_fleet(agents, first, admitted, offered);
    /* The stated bound (docs/design.md): any span of one period, so every
     * window too, within 5 % of the limit. In overload the fleet admits in
     * bursts as room comes back, a period and the sync's lag after it was
     * used, so a window may catch less than the limit; over the four,
     * the average must stay above two thirds at this sync of a tenth of
     * the period (FLOOR_PERCENT; synced_accuracy's sync of a twentieth
     * holds it to 90 %). What
     * gateways counting alone admit is measured by make bench
     * (bench-alone). */
    long bound = LIMIT * 105 / 100, sum = 0;
    for (int w = 0; w < WINDOWS; w++) {
        fprintf(stderr, "synced fleet%s: window %d: offered %ld, admitted "
                "%ld (limit %d, stated bound %ld)\n", label, w, offered[w],
                admitted[w], LIMIT, bound);
        cr_expect_leq(admitted[w], bound);
        sum += admitted[w];
    }
    long least = WINDOWS * LIMIT * FLOOR_PERCENT / 100;
    fprintf(stderr, "synced fleet%s: %ld admitted in %d windows (floor %ld)\n",
            label, sum, WINDOWS, least);
    cr_expect_geq(sum, least, "%ld admitted in %d windows", sum, WINDOWS);
    for (int i = 0; i < FLEET; i++) {
        rl_agent_close(agents[i]);
        rl_config_free(cfgs[i]);
    }
    test_aggregator_stop(&agg);
    /* Every report reached the store: none was sent back for a retry. */
    char cmd[700], out[64];
    snprintf(cmd, sizeof cmd, "grep -c 'event=report_not_applied' %s",
             agg.log);
    test_run(cmd, out, sizeof out);
    cr_expect_eq(atoi(out), 0, "reports were not applied; see %s", agg.log);
}

Test(synced, ten_agents_stay_within_the_bound)
{
    ten_agents(NULL, "");
}

Test(synced, ten_agents_stay_within_the_bound_on_a_cluster)
{
    ten_agents(test_env("RL_TEST_CLUSTER"), " (cluster)");
}

/* --- Two aggregators on one Redis: the same totals as one. --------------- */

Test(synced, two_aggregators_share_one_redis)
{
    static const char rule[] =
        "  - {name: per-tenant, match: tenant, limit: 1000000000, "
        "period: 1m, mode: synced}\n";
    test_aggregator one, two;
    test_aggregator_start(&one, NULL, rule, 200, NULL);
    test_aggregator_start(&two, NULL, rule, 200, NULL);
    rl_config *cfg[2];
    rl_agent *a = test_synced_agent(&one, &cfg[0]);
    rl_agent *b = test_synced_agent(&two, &cfg[1]);
    long counted = 0;
    for (int i = 0; i < 300; i++) {
        counted += check_tenant(a, "org_two");
        counted += check_tenant(b, "org_two");
    }
    cr_assert_eq(counted, 600);
    test_expect_window_total("rl:tenant:org_two", 600, 5000);
    /* Either aggregator answers with the fleet's total. */
    for (int k = 0; k < 2; k++) {
        nng_socket s = dial_reports(k == 0 ? &one : &two);
        rl_wire_msg ack = report(s, k == 0 ? "probe-1" : "probe-2", 1,
                                 "per-tenant", "org_two", 1);
        cr_assert_eq(ack.status, RL_ACK_APPLIED);
        cr_assert_eq(ack.entries[0].current + ack.entries[0].previous,
                     600 + (uint64_t)k + 1);
        rl_wire_msg_free(&ack);
        nng_close(s);
    }
    rl_agent_close(a);
    rl_agent_close(b);
    rl_config_free(cfg[0]);
    rl_config_free(cfg[1]);
    test_aggregator_stop(&one);
    test_aggregator_stop(&two);
}

/* --- Redis stops answering behind the aggregator: nothing is lost. ------- */

Test(synced, redis_stopped_behind_the_aggregator_loses_no_count)
{
    test_redis srv;
    char err[512], addr[64];
    cr_assert_eq(test_redis_start(&srv, test_env("RL_TEST_TMPDIR"), NULL, err,
                                  sizeof err), 0, "%s", err);
    snprintf(addr, sizeof addr, "127.0.0.1:%u", srv.port);
    test_aggregator agg;
    test_aggregator_start(&agg, addr,
                          "  - {name: per-tenant, match: tenant, "
                          "limit: 1000000000, period: 1m, mode: synced}\n",
                          200, NULL);
    rl_config *cfg;
    struct steady s = {.agent = test_synced_agent(&agg, &cfg),
                       .tenant = "org_stall"};
    pthread_t t;
    pthread_create(&t, NULL, check_steadily, &s);
    test_sleep_ms(800);
    /* A stopped server keeps its connections open and answers nothing. */
    kill(srv.pid, SIGSTOP);
    test_sleep_ms(3000);
    kill(srv.pid, SIGCONT);
    test_sleep_ms(800);
    atomic_store(&s.stop, true);
    join_steady(t, &s);
    long allowed = atomic_load(&s.allowed);
    cr_assert_lt(atomic_load(&s.slowest_us), 50000, "a check waited");
    uint64_t start = test_now_ms();
    while (test_window_total(addr, "rl:tenant:org_stall") != allowed) {
        cr_assert_lt(test_now_ms() - start, 10000, "Redis holds %lld, the "
                     "agent counted %ld",
                     test_window_total(addr, "rl:tenant:org_stall"), allowed);
        test_sleep_ms(100);
    }
    rl_agent_close(s.agent);
    rl_config_free(cfg);
    test_aggregator_stop(&agg);
    test_redis_stop(&srv);
}

/* --- SIGHUP: a good config is taken, a bad one is not. ------------------- */

static void rewrite(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fputs(text, f);
    fclose(f);
}

Test(synced, sighup_reloads_rules_and_keeps_them_when_the_file_is_bad)
{
    test_aggregator agg;
    test_aggregator_start(&agg, NULL, tenant_rule, 1000, NULL);
    test_aggregator_wait_ready(&agg);
    nng_socket s = dial_reports(&agg);
    rl_wire_msg m = report_within(s, "hup", 1, "per-region", "eu", 1, 300);
    cr_assert_eq(m.type, 0, "a rule the config does not have was taken");

    char text[1024];
    snprintf(text, sizeof text,
             "store: {url: \"redis://%s\"}\n"
             "aggregator: {reports: \"%s\", totals: \"%s\"}\n"
             "rules:\n%s"
             "  - {name: per-region, match: region, limit: 5, period: 1m, "
             "mode: synced}\n",
             test_env("RL_TEST_REDIS"), agg.reports, agg.totals, tenant_rule);
    rewrite(agg.config, text);
    kill(agg.pid, SIGHUP);
    test_sleep_ms(300);
    m = report(s, "hup", 2, "per-region", "eu", 1);
    cr_assert_eq(m.type, RL_WIRE_ACK, "the new rule was not taken");
    cr_assert_eq(m.status, RL_ACK_APPLIED);
    rl_wire_msg_free(&m);

    rewrite(agg.config, "rules: [\n");
    kill(agg.pid, SIGHUP);
    test_sleep_ms(300);
    m = report(s, "hup", 3, "per-region", "eu", 1);
    cr_assert_eq(m.type, RL_WIRE_ACK, "a bad file replaced the rules");
    rl_wire_msg_free(&m);
    nng_close(s);
    test_aggregator_stop(&agg);
    char cmd[700], out[4096];
    snprintf(cmd, sizeof cmd, "grep -c 'event=reload_failed' %s", agg.log);
    test_run(cmd, out, sizeof out);
    cr_assert_eq(atoi(out), 1, "the bad reload was not logged");
}

/* --- Caps: reports and totals stay under the message cap. ---------------- */

/* Tenant i's value: a stem, the number, padded to 249 bytes. */
static void long_value(char *out, int i)
{
    memset(out, 'v', 249);
    out[249] = '\0';
    out[snprintf(out, 250, "caps%d_%04d", (int)getpid(), i)] = 'v';
}

Test(synced, many_long_keys_fit_under_a_small_message_cap)
{
    test_aggregator tpl = TEST_AGGREGATOR_EXTRA("  max_message_bytes: "
                                                "65536\n  max_entries: 100\n");
    test_aggregator agg;
    test_aggregator_start(&agg, NULL, "  - {name: per-tenant, match: tenant, "
                          "limit: 1000000, period: 1m, mode: synced}\n", 200,
                          &tpl);
    rl_config *cfg;
    rl_agent *a = test_synced_agent(&agg, &cfg);
    /* 600 tenants of 250 bytes: 150 KB of values, several reports of at
     * most 100 entries and 64 KiB each. */
    char value[256], key[300];
    for (int i = 0; i < 600; i++) {
        long_value(value, i);
        check_tenant(a, value);
    }
    int ends[] = {0, 599};
    for (int k = 0; k < 2; k++) {
        long_value(value, ends[k]);
        snprintf(key, sizeof key, "rl:tenant:%s", value);
        test_expect_window_total(key, 1, 10000);
    }
    rl_agent_close(a);
    rl_config_free(cfg);
    test_aggregator_stop(&agg);
    char cmd[700], out[64];
    snprintf(cmd, sizeof cmd, "grep -c 'event=report_rejected' %s", agg.log);
    test_run(cmd, out, sizeof out);
    cr_assert_eq(atoi(out), 0, "reports over a cap were sent; see %s",
                 agg.log);
}

/* Waits for a TOTALS message of rule saying `agents` agents; returns
 * whether one came within timeout_ms. */
static bool totals_say_agents(nng_socket sub, const char *rule,
                              uint64_t agents, unsigned timeout_ms)
{
    uint64_t until = test_now_ms() + timeout_ms;
    uint64_t last = 0;
    while (test_now_ms() < until) {
        char *buf;
        size_t size;
        if (nng_recv(sub, &buf, &size, NNG_FLAG_ALLOC) != 0)
            continue;
        const char *nul = memchr(buf, '\0', size);
        rl_wire_msg m;
        const char *why;
        bool ok = nul != NULL
                  && rl_wire_decode(nul + 1, size - (size_t)(nul + 1 - buf),
                                    &m, &why) == 0;
        if (ok) {
            if (m.rule.len == strlen(rule)
                && memcmp(m.rule.ptr, rule, m.rule.len) == 0)
                last = m.agents;
            rl_wire_msg_free(&m);
        }
        nng_free(buf, size);
        if (last == agents)
            return true;
    }
    fprintf(stderr, "totals of %s: last said %llu agents\n", rule,
            (unsigned long long)last);
    return false;
}

/* Agents that check nothing still tell the aggregator they are there, for
 * every rule that needs the fleet's size (a synced rule, and a rule whose
 * fallback is on_error: local), and the aggregator publishes each such
 * rule's agent count every interval. */
Test(synced, presence_reports_make_the_fleet_size_known_without_traffic)
{
    test_aggregator agg;
    test_aggregator_start(&agg, NULL,
                          "  - {name: present-synced, match: tenant, "
                          "limit: 100, period: 10s, mode: synced}\n"
                          "  - {name: present-fallback, match: user, "
                          "limit: 100, period: 10s, mode: exact, "
                          "on_error: local}\n", 100, NULL);
    test_aggregator_wait_ready(&agg);
    nng_socket sub;
    cr_assert_eq(nng_sub0_open(&sub), 0);
    nng_socket_set(sub, NNG_OPT_SUB_SUBSCRIBE, "present-", 8);
    nng_socket_set_ms(sub, NNG_OPT_RECVTIMEO, 200);
    cr_assert_eq(nng_dial(sub, agg.totals, NULL, NNG_FLAG_NONBLOCK), 0);
    rl_config *cfg[3];
    rl_agent *a[3];
    for (int i = 0; i < 3; i++)
        a[i] = test_synced_agent(&agg, &cfg[i]);
    cr_expect(totals_say_agents(sub, "present-fallback", 3, 3000));
    cr_expect(totals_say_agents(sub, "present-synced", 3, 3000));
    for (int i = 0; i < 3; i++) {
        rl_agent_close(a[i]);
        rl_config_free(cfg[i]);
    }
    test_aggregator_stop(&agg);
    /* Only now, with nothing more to come: nng 1.5.2 can hang closing a
     * socket a message is arriving on (see rl_sync_stop). */
    nng_close(sub);
}
