/*
 * An acknowledgement's totals only lower a synced key's mark; fresh shares
 * come from TOTALS snapshots and the agent's tick (agent/synced.c,
 * docs/design.md "Shares replace, they do not add"). An ack's totals may
 * miss the reports other agents made at the same moment: a share worked
 * out from them gives those agents' admissions out again.
 *
 * The aggregator here is a fake in this process, so that the test says
 * what Redis's clock reads and what the totals hold, and when each message
 * goes: it answers the agent's reports on REP and publishes TOTALS on PUB.
 * The fleet is the real agent (A) and a second one (B) that exists only in
 * the fake's counts. The story, with a limit of 100 and two agents:
 *
 *   - B admitted 60 long ago; they are the oldest sub-window of the span.
 *     TOTALS: room 40, a share of 20 each; A admits 20.
 *   - Redis's clock moves into the next sub-window: B's 60 leave the span.
 *     A reports its 20; the ack holds them, but not the 20 B admitted at
 *     the same moment, whose report is applied just after A's. From the
 *     ack the room would be 80, a fresh share 40: 20 more for A. The ack
 *     may only lower A's mark: A admits nothing.
 *   - The next TOTALS hold both agents' counts: room 60, a share of 30.
 *
 * What is held here is the rule (nothing between the ack and the next
 * TOTALS), not a fleet total: in this story a share taken from the ack
 * would come out of the next one, as what A admits since its last
 * acknowledged report always does.
 *
 * The rule's period is an hour (sub-windows of three minutes): the window
 * moves only when the fake's clock jumps.
 */
#include "redis_server.h"
#include "test_agent.h"
#include "test_env.h"
#include "wire.h"

#include <criterion/criterion.h>
#include <nng/nng.h>
#include <nng/protocol/pubsub0/pub.h>
#include <nng/protocol/reqrep0/rep.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#define RULE "ackfresh"
#define TENANT "org_ackfresh"
#define LIMIT 100
#define PERIOD_MS 3600000ULL
#define INTERVAL_MS 1000
#define AGENTS 2
/* Where the fake's clock starts: any sub-window will do. */
#define FIRST_WINDOW 1000
/* A report is resent if no ack comes in two intervals: the test waits for
 * the agent less than that while holding one. */
#define HOLD_MS 1500

typedef struct fake_agg {
    nng_socket rep, pub;
    char reports[64], totals[64];
    atomic_int subscribers;
    int64_t clock_offset;  /* Redis's clock: test_now_ms() + this */
    uint64_t window;       /* the sub-window that clock is in */
    uint64_t recent, oldest; /* the key's totals in it (wire.h) */
    char value[RL_WIRE_VALUE_MAX];
    size_t value_len;      /* the key, as the agent's reports name it */
} fake_agg;

/* A report received and not answered yet: while it is held the agent
 * sends no other. */
typedef struct held {
    nng_msg *msg;
    rl_wire_msg report;
    uint64_t count;        /* the key's count in it */
} held;

static uint64_t fake_now(const fake_agg *f)
{
    return (uint64_t)((int64_t)test_now_ms() + f->clock_offset);
}

/* Redis's clock jumps to just inside sub-window w, where the key's totals
 * are recent and oldest. */
static void fake_enter(fake_agg *f, uint64_t w, uint64_t recent,
                       uint64_t oldest)
{
    uint64_t at = w * rl_wire_subwindow_ms(PERIOD_MS) + 500;
    f->clock_offset = (int64_t)at - (int64_t)test_now_ms();
    f->window = w;
    f->recent = recent;
    f->oldest = oldest;
}

static void on_subscriber(nng_pipe p, nng_pipe_ev ev, void *arg)
{
    (void)p;
    (void)ev;
    fake_agg *f = arg;
    atomic_fetch_add(&f->subscribers, 1);
}

static void fake_listen(nng_socket s, char *url, size_t cap)
{
    snprintf(url, cap, "tcp://127.0.0.1:%u", test_free_port());
    int rv = nng_listen(s, url, NULL, 0);
    cr_assert_eq(rv, 0, "listen on %s: %s", url, nng_strerror(rv));
}

static void fake_start(fake_agg *f)
{
    memset(f, 0, sizeof *f);
    atomic_init(&f->subscribers, 0);
    cr_assert_eq(nng_rep0_open(&f->rep), 0);
    cr_assert_eq(nng_pub0_open(&f->pub), 0);
    nng_socket_set_ms(f->rep, NNG_OPT_RECVTIMEO, 3000);
    nng_pipe_notify(f->pub, NNG_PIPE_EV_ADD_POST, on_subscriber, f);
    fake_listen(f->rep, f->reports, sizeof f->reports);
    fake_listen(f->pub, f->totals, sizeof f->totals);
    fake_enter(f, FIRST_WINDOW, 0, 0);
}

/* Only once the agent is closed: nng 1.5.2 can hang closing a socket a
 * message is arriving on (see rl_sync_stop). */
static void fake_stop(fake_agg *f)
{
    nng_close(f->rep);
    nng_close(f->pub);
}

static void open_agent(fake_agg *f, test_agent *t)
{
    char yaml[1024];
    snprintf(yaml, sizeof yaml,
             "store: {url: \"redis://%s\", timeout_ms: 2000}\n"
             "aggregator:\n"
             "  reports: \"%s\"\n"
             "  totals: \"%s\"\n"
             "  sync_interval_ms: %d\n"
             "rules:\n"
             "  - {name: " RULE ", match: tenant, limit: %d, "
             "period: %llums, mode: synced}\n",
             test_env("RL_TEST_REDIS"), f->reports, f->totals, INTERVAL_MS,
             LIMIT, (unsigned long long)PERIOD_MS);
    memset(t, 0, sizeof *t);
    t->agent = test_agent_on(test_write_config("synced-ack", yaml),
                             &t->config, NULL);
    /* TOTALS published before the agent's SUB pipe is up are lost. */
    for (int waited = 0; atomic_load(&f->subscribers) == 0; waited += 10) {
        cr_assert_lt(waited, 5000, "the agent never subscribed to totals");
        test_sleep_ms(10);
    }
}

static bool is_key(const fake_agg *f, rl_wire_bytes value)
{
    return value.len == f->value_len
           && memcmp(value.ptr, f->value, value.len) == 0;
}

/* The agent's next report (the first names the key for the fake). */
static held fake_receive(fake_agg *f)
{
    held r = {0};
    int rv = nng_recvmsg(f->rep, &r.msg, 0);
    cr_assert_eq(rv, 0, "no report from the agent: %s", nng_strerror(rv));
    const char *why;
    cr_assert_eq(rl_wire_decode(nng_msg_body(r.msg), nng_msg_len(r.msg),
                                &r.report, &why), 0, "bad report: %s", why);
    cr_assert_eq(r.report.type, RL_WIRE_REPORT);
    for (size_t i = 0; i < r.report.n_entries; i++) {
        const rl_wire_entry *e = &r.report.entries[i];
        if (f->value_len == 0) {
            memcpy(f->value, e->value.ptr, e->value.len);
            f->value_len = e->value.len;
        }
        cr_assert(is_key(f, e->value), "a report of another key");
        r.count += e->count;
    }
    return r;
}

/* Applies the report's count in the current sub-window and acknowledges
 * it with the key's totals, as they are once it is applied. */
static void fake_ack(fake_agg *f, held *r)
{
    f->recent += r->count;
    rl_wire_writer *w = rl_wire_writer_new();
    rl_wire_begin_ack(w, r->report.seq, RL_ACK_APPLIED, fake_now(f),
                      r->report.n_entries);
    for (size_t i = 0; i < r->report.n_entries; i++)
        rl_wire_put_ack_total(w, RULE, f->value, f->value_len, f->window,
                              f->recent, f->oldest, AGENTS);
    size_t len;
    const void *data = rl_wire_writer_data(w, &len);
    nng_msg *reply;
    cr_assert_eq(nng_msg_alloc(&reply, 0), 0);
    cr_assert_eq(nng_msg_append(reply, data, len), 0);
    cr_assert_eq(nng_sendmsg(f->rep, reply, 0), 0);
    rl_wire_writer_free(w);
    rl_wire_msg_free(&r->report);
    nng_msg_free(r->msg);
    r->msg = NULL;
}

static void fake_publish(fake_agg *f)
{
    rl_wire_writer *w = rl_wire_writer_new();
    rl_wire_begin_totals(w, RULE, fake_now(f), false, AGENTS, 1);
    rl_wire_put_total(w, f->value, f->value_len, f->window, f->recent,
                      f->oldest, AGENTS);
    size_t len;
    const void *data = rl_wire_writer_data(w, &len);
    cr_assert_eq(nng_send(f->pub, (void *)data, len, 0), 0);
    rl_wire_writer_free(w);
}

static bool allowed(test_agent *t)
{
    return test_check(t, "tenant=" TENANT, NULL).allowed;
}

/* What the agent admits now, before its first rejection. */
static long admitted(test_agent *t)
{
    long n = 0;
    while (allowed(t))
        cr_assert_leq(++n, LIMIT, "the key was never rejected");
    return n;
}

/* What the agent admits once the TOTALS just published have reached it:
 * the key rejects until then, so its first admission says they have. */
static long admitted_after_totals(test_agent *t)
{
    for (int waited = 0; waited < HOLD_MS; waited++) {
        if (allowed(t))
            return 1 + admitted(t);
        test_sleep_ms(1);
    }
    return 0;
}

Test(synced_ack, an_ack_gives_no_fresh_share_only_the_next_totals_do)
{
    fake_agg f;
    fake_start(&f);
    test_agent t;
    open_agent(&f, &t);
    /* A report of presence only: its ack tells the agent Redis's clock. */
    held r = fake_receive(&f);
    fake_ack(&f, &r);
    /* Before anything says how many agents there are, the agent takes the
     * whole limit; once its report of it is acknowledged, the key is at
     * its mark and reports a count of 0. Its totals are out of the span
     * from here on. */
    long cold = admitted(&t);
    r = fake_receive(&f);
    cr_assert_eq(r.count, (uint64_t)cold);
    fake_ack(&f, &r);
    held asking = fake_receive(&f);
    cr_assert_eq(asking.count, 0);
    /* Two periods on, B's 60 are the oldest sub-window. */
    uint64_t w = FIRST_WINDOW + 40;
    fake_enter(&f, w, 0, 60);
    fake_publish(&f);
    long share = admitted_after_totals(&t);
    fake_ack(&f, &asking);
    r = fake_receive(&f);
    cr_assert_eq(r.count, (uint64_t)share, "the report is not of the share");
    /* The next sub-window: B's 60 have left. A's report is applied before
     * B's, and B admitted its share too. */
    fake_enter(&f, w + 1, 0, 0);
    fake_ack(&f, &r);
    f.recent += (uint64_t)share;
    /* The next report comes after the ack is handled, and after a tick
     * (which gives no fresh share from an ack's totals either). */
    held last = fake_receive(&f);
    long after_ack = 0;
    for (int i = 0; i < LIMIT; i++)
        after_ack += allowed(&t);
    fake_publish(&f);
    long after_totals = admitted_after_totals(&t);
    fake_ack(&f, &last);
    fprintf(stderr, "synced ack: %ld admitted cold, %ld from the first "
            "totals, %ld after the ack, %ld from the next totals\n", cold,
            share, after_ack, after_totals);
    cr_expect_eq(share, (LIMIT - 60) / AGENTS, "the first totals' share");
    cr_expect_eq(after_ack, 0, "a fresh share from the ack's totals");
    cr_expect_eq(after_totals, (LIMIT - 2 * share) / AGENTS,
                 "the share of the totals that hold both agents' counts");
    test_agent_close(&t);
    fake_stop(&f);
}
