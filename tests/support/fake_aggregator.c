/*
 * fake_aggregator.c: see fake_aggregator.h.
 */
#include "fake_aggregator.h"

#include "redis_server.h"
#include "test_agent.h"

#include <criterion/criterion.h>
#include <msgpack.h>
#include <nng/protocol/pubsub0/pub.h>
#include <nng/protocol/reqrep0/rep.h>
#include <stdio.h>
#include <string.h>

static uint64_t fake_now(const fake_agg *f)
{
    return (uint64_t)((int64_t)test_now_ms() + f->clock_offset);
}

void fake_enter(fake_agg *f, uint64_t w, uint64_t recent, uint64_t oldest)
{
    uint64_t at = w * rl_wire_subwindow_ms(f->period_ms) + 500;
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

static void open_sockets(fake_agg *f)
{
    cr_assert_eq(nng_rep0_open(&f->rep), 0);
    cr_assert_eq(nng_pub0_open(&f->pub), 0);
    nng_socket_set_ms(f->rep, NNG_OPT_RECVTIMEO, 3000);
    nng_pipe_notify(f->pub, NNG_PIPE_EV_ADD_POST, on_subscriber, f);
}

void fake_start(fake_agg *f, const char *rule, uint64_t period_ms,
                uint64_t agents, uint64_t first_window)
{
    char value[RL_WIRE_VALUE_MAX];
    size_t value_len = f->value_len;
    memcpy(value, f->value, value_len);
    memset(f, 0, sizeof *f);
    memcpy(f->value, value, value_len);
    f->value_len = value_len;
    f->rule = rule;
    f->period_ms = period_ms;
    f->agents = agents;
    atomic_init(&f->subscribers, 0);
    open_sockets(f);
    fake_listen(f->rep, f->reports, sizeof f->reports);
    fake_listen(f->pub, f->totals, sizeof f->totals);
    fake_enter(f, first_window, 0, 0);
}

void fake_stop(fake_agg *f)
{
    nng_close(f->rep);
    nng_close(f->pub);
}

static void listen_again(nng_socket s, const char *url)
{
    int rv = nng_listen(s, url, NULL, 0);
    cr_assert_eq(rv, 0, "listen again on %s: %s", url, nng_strerror(rv));
}

void fake_restart(fake_agg *f, bool totals)
{
    fake_stop(f);
    atomic_store(&f->subscribers, 0);
    open_sockets(f);
    listen_again(f->rep, f->reports);
    if (totals)
        fake_listen_totals(f);
}

void fake_listen_totals(fake_agg *f)
{
    listen_again(f->pub, f->totals);
}

void fake_wait_subscribed(fake_agg *f)
{
    for (int waited = 0; atomic_load(&f->subscribers) == 0; waited += 10) {
        cr_assert_lt(waited, 5000, "the agent never subscribed to %s",
                     f->totals);
        test_sleep_ms(10);
    }
}

static bool is_key(const fake_agg *f, rl_wire_bytes value)
{
    return value.len == f->value_len
           && memcmp(value.ptr, f->value, value.len) == 0;
}

/* How many of a REPORT's entries have five fields: the decoder does not
 * say how many an entry had, and a refused of 0 is one too. */
static size_t five_field_entries(const void *buf, size_t len)
{
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    size_t n = 0;
    if (msgpack_unpack_next(&u, buf, len, NULL) == MSGPACK_UNPACK_SUCCESS
        && u.data.type == MSGPACK_OBJECT_ARRAY && u.data.via.array.size > 4
        && u.data.via.array.ptr[4].type == MSGPACK_OBJECT_ARRAY) {
        const msgpack_object_array *entries = &u.data.via.array.ptr[4]
                                                   .via.array;
        for (uint32_t i = 0; i < entries->size; i++)
            n += entries->ptr[i].type == MSGPACK_OBJECT_ARRAY
                 && entries->ptr[i].via.array.size == 5;
    }
    msgpack_unpacked_destroy(&u);
    return n;
}

fake_held fake_receive(fake_agg *f)
{
    fake_held r = {0};
    int rv = nng_recvmsg(f->rep, &r.msg, 0);
    cr_assert_eq(rv, 0, "no report from the agent on %s: %s", f->reports,
                 nng_strerror(rv));
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
        r.refused += e->refused;
    }
    r.demand_entries = five_field_entries(nng_msg_body(r.msg),
                                          nng_msg_len(r.msg));
    return r;
}

void fake_ack(fake_agg *f, fake_held *r)
{
    f->recent += r->count;
    rl_wire_writer *w = rl_wire_writer_new();
    rl_wire_begin_ack(w, r->report.seq, RL_ACK_APPLIED, fake_now(f),
                      r->report.n_entries);
    for (size_t i = 0; i < r->report.n_entries; i++)
        rl_wire_put_ack_total(w, f->rule, f->value, f->value_len, f->window,
                              f->recent, f->oldest, f->agents);
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

/* stale: as an aggregator that cannot reach Redis says it, with the
 * agent count it knew and no key. */
static void publish(fake_agg *f, bool stale)
{
    rl_wire_writer *w = rl_wire_writer_new();
    rl_wire_begin_totals(w, f->rule, fake_now(f), stale, f->agents,
                         stale ? 0 : 1);
    if (!stale && f->global)
        rl_wire_put_total_share(w, f->value, f->value_len, f->window,
                                f->recent, f->oldest, f->agents, f->share,
                                f->cut);
    else if (!stale)
        rl_wire_put_total(w, f->value, f->value_len, f->window, f->recent,
                          f->oldest, f->agents);
    size_t len;
    const void *data = rl_wire_writer_data(w, &len);
    cr_assert_eq(nng_send(f->pub, (void *)data, len, 0), 0);
    rl_wire_writer_free(w);
}

void fake_publish(fake_agg *f)
{
    publish(f, false);
}

void fake_publish_stale(fake_agg *f)
{
    publish(f, true);
}

void fake_publish_features(fake_agg *f)
{
    fake_publish_features_of(f, RL_WIRE_FEATURE_WINDOWS);
}

void fake_publish_features_of(fake_agg *f, uint64_t features)
{
    rl_wire_writer *w = rl_wire_writer_new();
    rl_wire_begin_features(w, features);
    size_t len;
    const void *data = rl_wire_writer_data(w, &len);
    cr_assert_eq(nng_send(f->pub, (void *)data, len, 0), 0);
    rl_wire_writer_free(w);
}
