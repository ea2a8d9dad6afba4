/*
 * test_live_agents.c: a rule's agent count is the agents live now (wire.h,
 * windows.c): a closed agent leaves it at once (GOODBYE), a killed one
 * within RL_WIRE_LIVE_INTERVALS intervals, a peer making ids up adds one
 * per connection (agents.c), and ids name their agent for an operator.
 */
#include "test_agent.h"
#include "test_aggregator.h"
#include "test_env.h"
#include "test_gateway.h"
#include "wire.h"

#include <criterion/criterion.h>
#include <nng/nng.h>
#include <nng/protocol/pubsub0/sub.h>
#include <nng/protocol/reqrep0/req.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define INTERVAL_MS 100

/* A value no other test (or earlier run) has used: the tests share one
 * Redis, and a tenant's counts live two periods. */
static void fresh_value(char *buf, size_t cap, const char *stem)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    snprintf(buf, cap, "%s_%d_%ld%09ld", stem, (int)getpid(),
             (long)ts.tv_sec, ts.tv_nsec);
}

static long admitted_of(rl_agent *a, const char *tenant, int offered)
{
    rl_attr attr = {"tenant", tenant, strlen(tenant)};
    long n = 0;
    for (int i = 0; i < offered; i++) {
        rl_decision d;
        cr_assert_eq(rl_check(a, &attr, 1, 1, &d), RL_OK);
        n += d.allowed;
    }
    return n;
}

/* The agent count of the first TOTALS of rule heard after after_ms (the
 * test's clock) that says one (0: not known), or 0 if none came within 3 s;
 * the agents subscribed to the rule heard the same message. */
static long totals_agents_after(nng_socket sub, const char *rule,
                                uint64_t after_ms)
{
    uint64_t until = test_now_ms() + 3000;
    while (test_now_ms() < until) {
        char *buf;
        size_t size;
        if (nng_recv(sub, &buf, &size, NNG_FLAG_ALLOC) != 0)
            continue;
        size_t topic = strlen(rule) + 1;
        rl_wire_msg t;
        const char *why;
        long agents = 0;
        if (size > topic && memcmp(buf, rule, topic) == 0
            && rl_wire_decode(buf + topic, size - topic, &t, &why) == 0) {
            agents = (long)t.agents;
            rl_wire_msg_free(&t);
        }
        nng_free(buf, size);
        if (agents > 0 && test_now_ms() >= after_ms)
            return agents;
    }
    return 0;
}

/* --- Restarts: each clean close leaves the count at once. ---------------
 * One gateway restarted four times (a clean close each, as at SIGTERM or
 * a reload of nginx's workers), then, as soon as the one agent live has
 * heard its rule's agent count, a fresh tenant offered twice the limit at
 * once: its share is the room over that count. Counting every id of the
 * last two periods gave 20 of 100 (five agents); without the goodbye, the
 * ids closed in the last RL_WIRE_LIVE_INTERVALS intervals still count. */

Test(live_agents, restarts_do_not_shrink_a_fresh_tenants_share)
{
    enum { LIMIT = 100, RESTARTS = 4 };
    test_aggregator agg;
    test_aggregator_start(&agg, NULL,
                          "  - {name: live-restart, match: tenant, "
                          "limit: 100, period: 1m, mode: synced}\n",
                          INTERVAL_MS, NULL);
    test_aggregator_wait_ready(&agg);
    nng_socket sub;
    cr_assert_eq(nng_sub0_open(&sub), 0);
    nng_socket_set(sub, NNG_OPT_SUB_SUBSCRIBE, "live-restart", 13);
    nng_socket_set_ms(sub, NNG_OPT_RECVTIMEO, 200);
    cr_assert_eq(nng_dial(sub, agg.totals, NULL, NNG_FLAG_NONBLOCK), 0);
    rl_config *cfg;
    for (int i = 0; i < RESTARTS; i++) {
        rl_agent *a = test_synced_agent(&agg, &cfg);
        /* Counted: its report is in a totals message. */
        cr_assert_gt(totals_agents_after(sub, "live-restart",
                                         test_now_ms() + 2 * INTERVAL_MS),
                     0);
        rl_agent_close(a);
        rl_config_free(cfg);
    }
    rl_agent *live = test_synced_agent(&agg, &cfg);
    /* Its presence reported (its first tick is within an interval) and
     * the count published back. */
    long heard = totals_agents_after(sub, "live-restart",
                                     test_now_ms() + 2 * INTERVAL_MS);
    test_sleep_ms(INTERVAL_MS / 5);
    char tenant[96];
    fresh_value(tenant, sizeof tenant, "org_restart");
    long admitted = admitted_of(live, tenant, 2 * LIMIT);
    fprintf(stderr, "live agents: after %d restarts, the rule counts %ld "
            "agents; a fresh tenant got %ld of %d at once\n", RESTARTS,
            heard, admitted, LIMIT);
    cr_expect_eq(heard, 1, "the closed agents still count");
    cr_expect_geq(admitted, LIMIT * 9 / 10);
    cr_expect_leq(admitted, LIMIT);
    rl_agent_close(live);
    rl_config_free(cfg);
    test_aggregator_stop(&agg);
    /* Only now: nng 1.5.2 can hang closing a socket a message is arriving
     * on (see rl_sync_stop). */
    nng_close(sub);
}

/* --- Raw reports: a probe that is itself one agent. ---------------------- */

static nng_socket dial(const test_aggregator *agg)
{
    nng_socket s;
    cr_assert_eq(nng_req0_open(&s), 0);
    cr_assert_eq(nng_dial(s, agg->reports, NULL, 0), 0);
    nng_socket_set_ms(s, NNG_OPT_SENDTIMEO, 5000);
    nng_socket_set_ms(s, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE);
    return s;
}

/* A presence report of rule under id with one entry of 0 (it asks for
 * the key's totals, the rule's agent count among them, and writes
 * nothing); the agent count it was answered with, or -1 if no answer came
 * within wait_ms. */
static long present(nng_socket s, const char *id, uint64_t seq,
                    const char *rule, int wait_ms)
{
    rl_wire_writer *w = rl_wire_writer_new();
    rl_wire_begin_report_presence(w, id, seq, 1);
    rl_wire_put_count(w, rule, "probe", 5, 0);
    rl_wire_put_presence(w, &rule, 1);
    size_t len;
    const void *data = rl_wire_writer_data(w, &len);
    cr_assert_eq(nng_send(s, (void *)data, len, 0), 0);
    rl_wire_writer_free(w);
    nng_socket_set_ms(s, NNG_OPT_RECVTIMEO, wait_ms);
    char *buf;
    size_t size;
    if (nng_recv(s, &buf, &size, NNG_FLAG_ALLOC) != 0)
        return -1;
    rl_wire_msg ack;
    const char *why;
    cr_assert_eq(rl_wire_decode(buf, size, &ack, &why), 0, "%s", why);
    nng_free(buf, size);
    cr_assert_eq(ack.type, RL_WIRE_ACK);
    cr_assert_eq(ack.n_entries, 1);
    long agents = (long)ack.entries[0].agents;
    rl_wire_msg_free(&ack);
    return agents;
}

/* --- A killed gateway leaves the count within the stated time. ----------
 * A probe reporting every interval and an rl-gateway process: two agents.
 * The gateway SIGKILLed says no goodbye; it leaves once it has not
 * reported for RL_WIRE_LIVE_INTERVALS intervals (500 ms here), where the
 * sets of period windows kept it for up to two periods (two minutes). */

Test(live_agents, a_killed_gateway_leaves_the_count_within_five_intervals)
{
    test_aggregator agg;
    test_aggregator_start(&agg, NULL,
                          "  - {name: live-kill, match: tenant, "
                          "limit: 100, period: 1m, mode: synced}\n",
                          INTERVAL_MS, NULL);
    test_aggregator_wait_ready(&agg);
    char id[64];
    fresh_value(id, sizeof id, "probe");
    nng_socket s = dial(&agg);
    test_gateway gw;
    test_gateway_start(&gw, agg.config, NULL);
    uint64_t seq = 1, until = test_now_ms() + 5000;
    long agents = 0;
    while (agents != 2 && test_now_ms() < until) {
        agents = present(s, id, seq++, "live-kill", 3000);
        test_sleep_ms(INTERVAL_MS);
    }
    cr_assert_eq(agents, 2, "the gateway never counted");
    kill(gw.pid, SIGKILL);
    waitpid(gw.pid, NULL, 0);
    gw.pid = 0;
    uint64_t killed = test_now_ms();
    until = killed + 3000;
    while (agents != 1 && test_now_ms() < until) {
        test_sleep_ms(INTERVAL_MS / 2);
        agents = present(s, id, seq++, "live-kill", 3000);
    }
    uint64_t took = test_now_ms() - killed;
    fprintf(stderr, "live agents: a killed gateway left the count in %llu "
            "ms (agents now %ld)\n", (unsigned long long)took, agents);
    cr_expect_eq(agents, 1, "the killed gateway still counts after 3 s");
    /* Five intervals, and room for a loaded machine. */
    cr_expect_leq(took, (RL_WIRE_LIVE_INTERVALS + 5) * INTERVAL_MS);
    nng_close(s);
    test_aggregator_stop(&agg);
}

/* --- A peer making ids up counts once per connection. -------------------
 * Fifty ids on one connection: the first is taken, the others refused and
 * counted (no answer: a REQ peer resends, and is refused again); the rule
 * counts one agent, not fifty, and everyone's share stays whole. */

Test(live_agents, a_peer_making_ids_up_counts_once_per_connection)
{
    enum { IDS = 50 };
    test_aggregator agg;
    test_aggregator_start(&agg, NULL,
                          "  - {name: live-stray, match: tenant, "
                          "limit: 100, period: 1m, mode: synced}\n",
                          INTERVAL_MS, NULL);
    test_aggregator_wait_ready(&agg);
    char stem[64], id[80];
    fresh_value(stem, sizeof stem, "stray");
    nng_socket s = dial(&agg);
    snprintf(id, sizeof id, "%s-0", stem);
    cr_assert_eq(present(s, id, 1, "live-stray", 3000), 1);
    int answered = 0;
    for (int i = 1; i < IDS; i++) {
        snprintf(id, sizeof id, "%s-%d", stem, i);
        answered += present(s, id, 1, "live-stray", 20) >= 0;
    }
    snprintf(id, sizeof id, "%s-0", stem);
    long agents = present(s, id, 2, "live-stray", 3000);
    fprintf(stderr, "live agents: %d ids on one connection: %d answered, "
            "the rule counts %ld agents\n", IDS, answered + 1, agents);
    cr_expect_eq(agents, 1);
    cr_expect_eq(answered, 0);
    /* The metrics page is rendered at each publish, every interval. */
    test_sleep_ms(3 * INTERVAL_MS);
    test_http_response r;
    test_http_get(agg.metrics, "/metrics", "", &r);
    r.body[r.body_len] = '\0';
    cr_expect_geq(test_prom_sample(r.body, "rl_agg_reports_rejected_total{"
                                           "reason=\"ids_per_connection\"}"),
                  IDS - 1, "%s", r.body);
    /* A connection of its own is one more agent. */
    nng_socket other = dial(&agg);
    snprintf(id, sizeof id, "%s-other", stem);
    cr_expect_eq(present(other, id, 1, "live-stray", 3000), 2);
    /* Nor can it take another connection's agent out of the count (each
     * share would grow): its goodbye for that id is answered, and does
     * nothing. */
    snprintf(id, sizeof id, "%s-0", stem);
    rl_wire_writer *w = rl_wire_writer_new();
    const char *rule = "live-stray";
    rl_wire_goodbye(w, id, &rule, 1);
    size_t len;
    const void *data = rl_wire_writer_data(w, &len);
    cr_assert_eq(nng_send(other, (void *)data, len, 0), 0);
    rl_wire_writer_free(w);
    char *buf;
    size_t size;
    nng_socket_set_ms(other, NNG_OPT_RECVTIMEO, 3000);
    cr_assert_eq(nng_recv(other, &buf, &size, NNG_FLAG_ALLOC), 0);
    nng_free(buf, size);
    snprintf(id, sizeof id, "%s-other", stem);
    cr_expect_eq(present(other, id, 2, "live-stray", 3000), 2,
                 "a goodbye from another connection was taken");
    nng_close(other);
    nng_close(s);
    test_aggregator_stop(&agg);
}

/* --- Ids an operator can read. ------------------------------------------
 * program@host/pid/start, no memory address, in rlctl agents' column. */

Test(live_agents, rlctl_agents_shows_readable_ids)
{
    test_aggregator agg;
    test_aggregator_start(&agg, NULL,
                          "  - {name: live-ids, match: tenant, "
                          "limit: 100, period: 1m, mode: synced}\n",
                          INTERVAL_MS, NULL);
    test_aggregator_wait_ready(&agg);
    rl_config *cfg;
    rl_agent *a = test_synced_agent(&agg, &cfg);
    test_sleep_ms(5 * INTERVAL_MS);
    char out[8192];
    cr_assert_eq(test_rlctl(out, sizeof out, agg.config, "agents"), 0, "%s",
                 out);
    char host[64] = "";
    gethostname(host, sizeof host - 1);
    host[strcspn(host, ".")] = '\0';
    char want[128];
    snprintf(want, sizeof want, "@%.24s/%d/", host, (int)getpid());
    const char *line = strstr(out, want);
    cr_assert(line != NULL, "no id naming host and pid (%s): %s", want, out);
    cr_assert_null(strstr(out, "0x"), "an address in an id: %s", out);
    /* The address column starts where its heading does: the id fits. */
    const char *head_end = strstr(out, "ADDRESS");
    const char *row = line;
    while (row > out && row[-1] != '\n')
        row--;
    const char *addr = strstr(row, "127.0.0.1:");
    cr_assert(head_end != NULL && addr != NULL, "%s", out);
    cr_expect_eq(addr - row, head_end - out, "the address column moved: %s",
                 out);
    rl_agent_close(a);
    rl_config_free(cfg);
    test_aggregator_stop(&agg);
}
