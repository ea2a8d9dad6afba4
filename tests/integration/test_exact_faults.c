/*
 * The exact path when things go wrong: Redis killed and restarted, scripts
 * flushed under load, bad input, shutdown while threads check, fork, and
 * authentication. Tests that kill or flush use a private redis-server, so
 * that no other test sees it.
 */
#include "config.h"
#include "redis_server.h"
#include "test_agent.h"
#include "test_env.h"
#include "test_proxy.h"

#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void private_redis(test_redis *srv, const char *extra_conf,
                          char *addr, size_t cap)
{
    char err[512];
    test_redis_options o = {.extra_conf = extra_conf};
    cr_assert_eq(test_redis_start(srv, test_env("RL_TEST_TMPDIR"), &o, err,
                                  sizeof err), 0, "%s", err);
    snprintf(addr, cap, "127.0.0.1:%u", srv->port);
}

static rl_decision timed_check(test_agent *t, const char *attr,
                               uint64_t *elapsed_us)
{
    uint64_t start = test_now_us();
    rl_decision d = test_check(t, attr, NULL);
    *elapsed_us = test_now_us() - start;
    return d;
}

#define FAULT_DEADLINE_MS 50

/* --- 6. Redis killed mid-run, then restarted. ---------------------------- */

/* While Redis is known to be down the agent does not wait for it: a check
 * is decided by on_error at once. A check that met the connection in the
 * moment between a reconnect attempt and its refusal waits that moment, so
 * not every one is under 1 ms; one that waited for its deadline would be
 * the short cut missing. */
TEST_BOTH_MODES(faults, redis_killed_then_restarted)
{
    test_redis srv;
    char addr[64];
    private_redis(&srv, NULL, addr, sizeof addr);
    test_agent t;
    test_agent_open(&t, addr, mode, "  timeout_ms: 50\n", NULL,
                    "  - {name: per-key, match: api_key, limit: 1000, "
                    "period: 1s, on_error: allow}\n"
                    "  - {name: per-ip, match: ip, limit: 1000, "
                    "period: 1s, on_error: deny}\n");
    uint64_t us;
    cr_assert(!timed_check(&t, "api_key=k", &us).degraded);

    test_sched_probe probe;
    test_sched_probe_start(&probe);
    test_redis_kill(&srv);
    uint64_t start = test_now_ms(), slowest = 0;
    int checks = 0, over_1ms = 0;
    while (test_now_ms() - start < 1000) {
        rl_decision d = timed_check(&t, "api_key=k", &us);
        cr_assert(d.degraded && d.allowed, "on_error allow not honored");
        slowest = us > slowest ? us : slowest;
        over_1ms += us > 1000;
        d = timed_check(&t, "ip=1.2.3.4", &us);
        cr_assert(d.degraded && !d.allowed, "on_error deny not honored");
        cr_assert_str_eq(d.rule, "per-ip");
        slowest = us > slowest ? us : slowest;
        over_1ms += us > 1000;
        checks += 2;
        test_sleep_ms(5);
    }
    uint64_t overslept = test_sched_probe_stop(&probe);
    fprintf(stderr, "faults: Redis down: %d checks, %d over 1 ms, slowest "
            "%llu us (deadline %d ms, the probe overslept %llu us)\n", checks,
            over_1ms, (unsigned long long)slowest, FAULT_DEADLINE_MS,
            (unsigned long long)overslept);
    cr_assert_gt(checks, 20);
    cr_assert_leq(slowest, test_deadline_latest_us(FAULT_DEADLINE_MS,
                                                   overslept),
                  "a check took %llu us", (unsigned long long)slowest);
    cr_assert_leq(over_1ms * 10, checks, "%d of %d checks took over 1 ms "
                  "while Redis was known to be down", over_1ms, checks);

    char err[512];
    cr_assert_eq(test_redis_restart(&srv, err, sizeof err), 0, "%s", err);
    uint64_t restarted = test_now_ms();
    while (timed_check(&t, "api_key=k", &us).degraded) {
        cr_assert_lt(test_now_ms() - restarted, 1000, "not back within 1 s");
        test_sleep_ms(5);
    }
    rl_decision d = test_check(&t, "ip=1.2.3.4", NULL);
    cr_assert(d.allowed && !d.degraded);
    test_agent_close(&t);
    test_redis_stop(&srv);
}

/* --- Redis alive but silent (SIGSTOP). --------------------------------- */

/* Four threads check while the agent's own Redis is paused for 1.5 s and
 * the main thread sends async checks: no check, blocking or async, is
 * decided later than its deadline plus the margin. The pause outlasts the
 * stall limit (1 s here), so the checks meet a connection with calls in
 * flight, the dropped one (known down), and a new one whose handshake
 * goes unanswered. */
#define PAUSE_MS 1500
#define PAUSE_CHECKERS 4
#define PAUSE_ASYNC 300

struct paused_load {
    rl_agent *agent;
    uint64_t until_us;
    atomic_uint_least64_t slowest_us;
    atomic_int checks, at_deadline, answered;
};

static void note_slowest(atomic_uint_least64_t *slowest, uint64_t us)
{
    uint64_t seen = atomic_load(slowest);
    while (us > seen && !atomic_compare_exchange_weak(slowest, &seen, us))
        ;
}

static void *check_while_paused(void *arg)
{
    struct paused_load *l = arg;
    rl_attr attr = {"api_key", "paused", 6};
    while (test_now_us() < l->until_us) {
        rl_decision d;
        uint64_t start = test_now_us();
        int rc = rl_check(l->agent, &attr, 1, 1, &d);
        uint64_t took = test_now_us() - start;
        note_slowest(&l->slowest_us, took);
        if (rc != RL_OK || !d.degraded)
            atomic_fetch_add(&l->answered, 1);
        if (took >= (FAULT_DEADLINE_MS - 1) * 1000)
            atomic_fetch_add(&l->at_deadline, 1);
        atomic_fetch_add(&l->checks, 1);
        /* Checks decided at once (known down) would spin: the point is
         * the deadline, not load on the I/O thread. */
        test_sleep_ms(1);
    }
    return NULL;
}

struct async_check {
    uint64_t sent_us;
    atomic_uint_least64_t took_us; /* 0 until its callback ran */
};

static void on_async_decided(const rl_decision *d, void *arg)
{
    struct async_check *c = arg;
    (void)d;
    atomic_store(&c->took_us, test_now_us() - c->sent_us + 1);
}

TEST_BOTH_MODES(faults, a_paused_redis_holds_no_check_past_its_deadline)
{
    test_redis srv;
    char addr[64];
    private_redis(&srv, NULL, addr, sizeof addr);
    test_agent t;
    test_agent_open(&t, addr, mode, "  timeout_ms: 50\n", NULL,
                    "  - {name: per-key, match: api_key, limit: 1000000, "
                    "period: 1s}\n");
    cr_assert(!test_check(&t, "api_key=paused", NULL).degraded);

    test_sched_probe probe;
    test_sched_probe_start(&probe);
    test_redis_pause(&srv);
    struct paused_load l = {.agent = t.agent,
                            .until_us = test_now_us() + PAUSE_MS * 1000};
    pthread_t threads[PAUSE_CHECKERS];
    for (int i = 0; i < PAUSE_CHECKERS; i++)
        cr_assert_eq(pthread_create(&threads[i], NULL, check_while_paused,
                                    &l), 0);
    static struct async_check async[PAUSE_ASYNC];
    rl_attr attr = {"api_key", "paused-async", 12};
    int sent = 0;
    while (test_now_us() < l.until_us && sent < PAUSE_ASYNC) {
        async[sent].sent_us = test_now_us();
        atomic_init(&async[sent].took_us, 0);
        cr_assert_eq(rl_check_async(t.agent, &attr, 1, 1, on_async_decided,
                                    &async[sent]), RL_OK);
        sent++;
        test_sleep_ms(5);
    }
    for (int i = 0; i < PAUSE_CHECKERS; i++)
        pthread_join(threads[i], NULL);
    test_sleep_ms(FAULT_DEADLINE_MS + 200); /* the last callbacks' time */
    uint64_t overslept = test_sched_probe_stop(&probe);
    uint64_t async_slowest = 0;
    int async_missing = 0;
    for (int i = 0; i < sent; i++) {
        uint64_t took = atomic_load(&async[i].took_us);
        async_missing += took == 0;
        async_slowest = took > async_slowest ? took : async_slowest;
    }
    test_redis_resume(&srv);
    uint64_t resumed = test_now_ms();
    while (test_check(&t, "api_key=paused", NULL).degraded) {
        cr_assert_lt(test_now_ms() - resumed, 2000, "not back within 2 s");
        test_sleep_ms(5);
    }
    test_agent_close(&t);
    test_redis_stop(&srv);
    uint64_t slowest = atomic_load(&l.slowest_us);
    uint64_t latest = test_deadline_latest_us(FAULT_DEADLINE_MS, overslept);
    fprintf(stderr, "faults: Redis paused %d ms: %d checks (%d at the "
            "deadline), slowest %llu us; %d async, slowest %llu us "
            "(deadline %d ms, the probe overslept %llu us)\n", PAUSE_MS,
            atomic_load(&l.checks), atomic_load(&l.at_deadline),
            (unsigned long long)slowest, sent,
            (unsigned long long)async_slowest, FAULT_DEADLINE_MS,
            (unsigned long long)overslept);
    cr_assert_eq(atomic_load(&l.answered), 0, "a paused Redis answered");
    cr_assert_eq(async_missing, 0, "%d of %d async checks were never "
                 "decided", async_missing, sent);
    cr_assert_leq(slowest, latest, "a check took %llu us",
                  (unsigned long long)slowest);
    cr_assert_leq(async_slowest, latest, "an async check was decided after "
                  "%llu us", (unsigned long long)async_slowest);
    /* Most checks met a connection with calls in flight: the deadline,
     * not a failure, decided them. */
    cr_assert_geq(atomic_load(&l.at_deadline),
                  PAUSE_CHECKERS * 1000 / FAULT_DEADLINE_MS / 2);
}

/* --- A connection that stops answering is replaced. -------------------- */

/* The agent reaches Redis through a proxy that makes the connection go
 * silent, open but dead, while new connections get through: a peer gone
 * without a FIN. With no reply for ten deadlines (2 s here) the agent
 * drops the connection and opens another; until then every check is
 * decided by its deadline. */
#define STALL_DEADLINE_MS 200

Test(faults, a_connection_that_stops_answering_is_replaced)
{
    test_redis srv;
    char addr[64];
    private_redis(&srv, NULL, addr, sizeof addr);
    uint16_t port;
    test_proxy *proxy = test_proxy_start(srv.port, &port);
    char via[64];
    snprintf(via, sizeof via, "127.0.0.1:%u", port);
    test_agent t;
    test_agent_open(&t, via, TEST_FCALL, "  timeout_ms: 200\n", NULL,
                    "  - {name: per-key, match: api_key, limit: 1000000, "
                    "period: 1s}\n");
    cr_assert(!test_check(&t, "api_key=stall", NULL).degraded);
    int connections = test_proxy_accepted(proxy);

    test_sched_probe probe;
    test_sched_probe_start(&probe);
    test_proxy_silence(proxy);
    uint64_t silenced = test_now_ms(), slowest = 0, back_after = 0;
    int degraded = 0;
    while (back_after == 0) {
        uint64_t us;
        rl_decision d = timed_check(&t, "api_key=stall", &us);
        slowest = us > slowest ? us : slowest;
        if (d.degraded)
            degraded++;
        else
            back_after = test_now_ms() - silenced;
        cr_assert_lt(test_now_ms() - silenced, 10 * STALL_DEADLINE_MS + 2000,
                     "the silent connection was never replaced");
        test_sleep_ms(5);
    }
    int replacements = test_proxy_accepted(proxy) - connections;
    uint64_t overslept = test_sched_probe_stop(&probe);
    test_agent_close(&t);
    test_proxy_stop(proxy);
    test_redis_stop(&srv);
    fprintf(stderr, "faults: connection silenced: %d checks degraded, "
            "slowest %llu us, answered again after %llu ms (ten deadlines: "
            "%d ms, the probe overslept %llu us)\n", degraded,
            (unsigned long long)slowest, (unsigned long long)back_after,
            10 * STALL_DEADLINE_MS, (unsigned long long)overslept);
    cr_assert_geq(back_after, 10 * STALL_DEADLINE_MS, "dropped after %llu "
                  "ms, before ten deadlines", (unsigned long long)back_after);
    /* The watchdog looks every 100 ms, then a 25 ms backoff and the
     * handshake: well before eleven and a half deadlines. */
    cr_assert_leq(back_after, 10 * STALL_DEADLINE_MS + 300, "answered again "
                  "only after %llu ms", (unsigned long long)back_after);
    cr_assert_eq(replacements, 1, "%d new connections", replacements);
    cr_assert_leq(slowest, test_deadline_latest_us(STALL_DEADLINE_MS,
                                                   overslept),
                  "a check took %llu us", (unsigned long long)slowest);
}

/* --- Scripts flushed while eight threads check: no check fails. -------- */

struct flusher_load {
    test_agent *t;
    atomic_bool stop;
    atomic_int degraded;
    atomic_int checks;
};

static void *keep_checking(void *arg)
{
    struct flusher_load *l = arg;
    char value[32];
    snprintf(value, sizeof value, "flush-%p", (void *)&value);
    rl_attr attr = {"api_key", value, strlen(value)};
    while (!atomic_load(&l->stop)) {
        rl_decision d;
        if (rl_check(l->t->agent, &attr, 1, 1, &d) != RL_OK || d.degraded)
            atomic_fetch_add(&l->degraded, 1);
        atomic_fetch_add(&l->checks, 1);
    }
    return NULL;
}

TEST_BOTH_MODES(faults, scripts_flushed_under_load_lose_no_check)
{
    test_redis srv;
    char addr[64];
    private_redis(&srv, NULL, addr, sizeof addr);
    struct flusher_load l = {0};
    test_agent t;
    /* A generous deadline: the point is that no call is lost, not speed
     * on a loaded test machine. */
    test_agent_open(&t, addr, mode, "  timeout_ms: 1000\n", NULL,
                    "  - {name: per-key, match: api_key, limit: 1000000, "
                    "period: 1s}\n");
    l.t = &t;
    pthread_t threads[8];
    for (int i = 0; i < 8; i++)
        cr_assert_eq(pthread_create(&threads[i], NULL, keep_checking, &l), 0);
    redisContext *c = test_redis_connect(addr);
    for (int i = 0; i < 10; i++) {
        test_sleep_ms(50);
        redisReply *r = test_redis_command(c, mode == TEST_FCALL
                                                  ? "FUNCTION FLUSH"
                                                  : "SCRIPT FLUSH");
        freeReplyObject(r);
    }
    test_sleep_ms(50);
    atomic_store(&l.stop, true);
    for (int i = 0; i < 8; i++)
        pthread_join(threads[i], NULL);
    redisFree(c);
    test_agent_close(&t);
    test_redis_stop(&srv);
    cr_assert_gt(atomic_load(&l.checks), 100);
    cr_assert_eq(atomic_load(&l.degraded), 0, "%d of %d checks failed",
                 atomic_load(&l.degraded), atomic_load(&l.checks));
}

/* --- 7. Bad input: defined results, and no call to Redis. -------------- */

static long long script_calls(const char *addr)
{
    return test_redis_calls(addr, "fcall") + test_redis_calls(addr, "evalsha");
}

TEST_BOTH_MODES(faults, bad_input_is_refused_before_redis)
{
    test_redis srv;
    char addr[64];
    private_redis(&srv, NULL, addr, sizeof addr);
    test_agent t;
    test_agent_open(&t, addr, mode, NULL, NULL,
                    "  - {name: per-key, match: api_key, limit: 10, "
                    "period: 1s}\n");
    /* One good check first, so that the scripts test_agent_open flushed
     * are back and every later call counts once. */
    cr_assert(!test_check(&t, "api_key=reload", NULL).degraded);
    long long before = script_calls(addr);
    char big[258];
    memset(big, 'k', sizeof big);
    rl_decision d;
    rl_attr too_long = {"api_key", big, 257};
    cr_assert_eq(rl_check(t.agent, &too_long, 1, 1, &d), RL_ETOOLONG);
    rl_attr nul = {"api_key", "a\0b", 3};
    cr_assert_eq(rl_check(t.agent, &nul, 1, 1, &d), RL_EINVAL);
    rl_attr empty = {"api_key", "", 0};
    cr_assert_eq(rl_check(t.agent, &empty, 1, 1, &d), RL_EINVAL);
    rl_attr ok = {"api_key", "fine", 4};
    cr_assert_eq(rl_check(t.agent, &ok, 1, 0, &d), RL_EINVAL);
    rl_attr twice[] = {{"api_key", "a", 1}, {"api_key", "b", 1}};
    cr_assert_eq(rl_check(t.agent, twice, 2, 1, &d), RL_EINVAL);
    cr_assert_eq(rl_check(t.agent, NULL, 1, 1, &d), RL_EINVAL);
    cr_assert_eq(rl_check(t.agent, &ok, RL_ATTRS_MAX + 1, 1, &d), RL_EINVAL);
    cr_assert_eq(rl_check(t.agent, &ok, 1, 1, NULL), RL_EINVAL);
    cr_assert_eq(rl_check(NULL, &ok, 1, 1, &d), RL_EINVAL);

    /* An attribute no rule matches is ignored: allowed, no round trip, no
     * headers. Its value is not even looked at. */
    rl_attr unknown[] = {{"x-unknown", big, 257}, {"tenant", "\0", 1}};
    memset(&d, 0xff, sizeof d);
    cr_assert_eq(rl_check(t.agent, unknown, 2, 1, &d), RL_OK);
    cr_assert(d.allowed && !d.degraded);
    cr_assert_str_empty(d.rule);
    char headers[64];
    cr_assert_eq(rl_format_headers(&d, headers, sizeof headers), 0);
    cr_assert_eq(script_calls(addr), before, "refused input reached Redis");

    /* 256 bytes is the longest value, and it is kept whole. */
    rl_attr longest = {"api_key", big, 256};
    cr_assert_eq(rl_check(t.agent, &longest, 1, 1, &d), RL_OK);
    cr_assert(d.allowed && !d.degraded);
    cr_assert_eq(script_calls(addr), before + 1);
    test_agent_close(&t);
    test_redis_stop(&srv);
}

/* --- The async API: exactly once, from the agent's thread. ------------- */

struct async_count {
    atomic_int calls;
    atomic_int allowed;
    atomic_int from_caller_thread;
    pthread_t caller;
};

static void on_decision(const rl_decision *d, void *arg)
{
    struct async_count *c = arg;
    if (pthread_equal(pthread_self(), c->caller))
        atomic_fetch_add(&c->from_caller_thread, 1);
    if (d->allowed && !d->degraded)
        atomic_fetch_add(&c->allowed, 1);
    atomic_fetch_add(&c->calls, 1);
}

TEST_BOTH_MODES(faults, async_callbacks_run_exactly_once)
{
    test_agent t;
    test_agent_open(&t, NULL, mode, NULL, NULL,
                    "  - {name: per-key, match: api_key, limit: 100, "
                    "period: 1d}\n");
    struct async_count c = {.caller = pthread_self()};
    char value[32];
    snprintf(value, sizeof value, "async-%d", mode);
    rl_attr attr = {"api_key", value, strlen(value)};
    for (int i = 0; i < 300; i++)
        cr_assert_eq(rl_check_async(t.agent, &attr, 1, 1, on_decision, &c),
                     RL_OK);
    /* A call that fails never calls back; one no rule applies to does. */
    cr_assert_eq(rl_check_async(t.agent, &attr, 1, 0, on_decision, &c),
                 RL_EINVAL);
    rl_attr none = {"nobody", "x", 1};
    cr_assert_eq(rl_check_async(t.agent, &none, 1, 1, on_decision, &c),
                 RL_OK);
    uint64_t start = test_now_ms();
    while (atomic_load(&c.calls) < 301 && test_now_ms() - start < 2000)
        test_sleep_ms(5);
    test_sleep_ms(50); /* room for a callback that should not come */
    cr_assert_eq(atomic_load(&c.calls), 301);
    cr_assert_eq(atomic_load(&c.allowed), 101, "100 tokens plus the request "
                 "no rule applied to");
    cr_assert_eq(atomic_load(&c.from_caller_thread), 0);
    test_agent_close(&t);
}

/* --- A callback that checks again: served with no wakeup from outside. - */

/* Sixteen chains, each checking again from its callback (an event-loop
 * gateway's way) until the chains have made `total` checks between them.
 * The I/O thread's own submissions take no eventfd wakeup (agent.c): if
 * they were not served, a chain would stop with nothing else to wake the
 * loop. */
struct chain {
    test_agent *t;
    rl_attr attr;
    int total;
    atomic_int started;
    atomic_int answered;
    atomic_int allowed;
    atomic_int refused; /* rl_check_async from a callback failed */
};

static void chain_next(const rl_decision *d, void *arg)
{
    struct chain *c = arg;
    if (d->allowed && !d->degraded)
        atomic_fetch_add(&c->allowed, 1);
    atomic_fetch_add(&c->answered, 1);
    if (atomic_fetch_add(&c->started, 1) >= c->total)
        return;
    int rc = rl_check_async(c->t->agent, &c->attr, 1, 1, chain_next, c);
    if (rc != RL_OK)
        atomic_fetch_add(&c->refused, 1);
}

TEST_BOTH_MODES(faults, a_callback_that_checks_again_is_served)
{
    test_agent t;
    test_agent_open(&t, NULL, mode, NULL, NULL,
                    "  - {name: per-key, match: api_key, limit: 100, "
                    "period: 1d}\n");
    char value[32];
    snprintf(value, sizeof value, "chain-%d", mode);
    struct chain c = {.t = &t, .attr = {"api_key", value, strlen(value)},
                      .total = 300};
    for (int i = 0; i < 16; i++) {
        atomic_fetch_add(&c.started, 1);
        cr_assert_eq(rl_check_async(t.agent, &c.attr, 1, 1, chain_next, &c),
                     RL_OK);
    }
    uint64_t start = test_now_ms();
    while (atomic_load(&c.answered) < c.total && test_now_ms() - start < 5000)
        test_sleep_ms(5);
    test_sleep_ms(50); /* room for a callback that should not come */
    cr_assert_eq(atomic_load(&c.answered), c.total);
    cr_assert_eq(atomic_load(&c.refused), 0);
    cr_assert_eq(atomic_load(&c.allowed), 100);
    test_agent_close(&t);
}

/* Closing while chains run: every check a callback makes from then on is
 * refused (RL_ECLOSED) or answered, none is lost, and close returns. */
static void chain_until_closed(const rl_decision *d, void *arg)
{
    struct chain *c = arg;
    (void)d;
    atomic_fetch_add(&c->answered, 1);
    int rc = rl_check_async(c->t->agent, &c->attr, 1, 1, chain_until_closed,
                            c);
    if (rc == RL_OK)
        atomic_fetch_add(&c->started, 1);
    else if (rc == RL_ECLOSED)
        atomic_fetch_add(&c->refused, 1);
}

TEST_BOTH_MODES(faults, chains_of_callbacks_end_at_the_close)
{
    test_agent t;
    test_agent_open(&t, NULL, mode, NULL, NULL,
                    "  - {name: per-key, match: api_key, limit: 100, "
                    "period: 1d}\n");
    char value[32];
    snprintf(value, sizeof value, "chain-close-%d", mode);
    struct chain c = {.t = &t, .attr = {"api_key", value, strlen(value)}};
    for (int i = 0; i < 16; i++) {
        atomic_fetch_add(&c.started, 1);
        cr_assert_eq(rl_check_async(t.agent, &c.attr, 1, 1,
                                    chain_until_closed, &c), RL_OK);
    }
    uint64_t start = test_now_ms();
    while (atomic_load(&c.answered) < 1000 && test_now_ms() - start < 5000)
        test_sleep_ms(5);
    cr_assert_geq(atomic_load(&c.answered), 1000, "the chains stalled");
    test_agent_close(&t);
    /* Every check accepted was answered; each chain ended at a refusal. */
    cr_assert_eq(atomic_load(&c.answered), atomic_load(&c.started));
    cr_assert_eq(atomic_load(&c.refused), 16);
}

/* --- 8. Sixteen threads check while the agent shuts down. -------------- */

struct shutdown_load {
    test_agent *t;
    atomic_int closed_seen;
    atomic_int other_errors;
};

static void *check_until_closed(void *arg)
{
    struct shutdown_load *l = arg;
    char value[32];
    snprintf(value, sizeof value, "shut-%p", (void *)&value);
    rl_attr attr = {"api_key", value, strlen(value)};
    for (;;) {
        rl_decision d;
        int rc = rl_check(l->t->agent, &attr, 1, 1, &d);
        if (rc == RL_ECLOSED) {
            atomic_fetch_add(&l->closed_seen, 1);
            return NULL;
        }
        if (rc != RL_OK)
            atomic_fetch_add(&l->other_errors, 1);
    }
}

TEST_BOTH_MODES(faults, shutdown_while_sixteen_threads_check)
{
    test_agent t;
    test_agent_open(&t, NULL, mode, NULL, NULL,
                    "  - {name: per-key, match: api_key, limit: 1000000, "
                    "period: 1s}\n");
    struct shutdown_load l = {.t = &t};
    pthread_t threads[16];
    for (int i = 0; i < 16; i++)
        cr_assert_eq(pthread_create(&threads[i], NULL, check_until_closed,
                                    &l), 0);
    test_sleep_ms(200);
    rl_agent_shutdown(t.agent);
    for (int i = 0; i < 16; i++)
        pthread_join(threads[i], NULL);
    rl_agent_shutdown(t.agent); /* again: nothing happens */
    test_agent_close(&t);
    cr_assert_eq(atomic_load(&l.closed_seen), 16);
    cr_assert_eq(atomic_load(&l.other_errors), 0);
}

/* --- fork(): the child gets an error, not a hang. ----------------------- */

Test(faults, a_forked_child_gets_eforked)
{
    test_agent t;
    test_agent_open(&t, NULL, TEST_FCALL, NULL, NULL,
                    "  - {name: per-key, match: api_key, limit: 10, "
                    "period: 1s}\n");
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        rl_attr attr = {"api_key", "child", 5};
        rl_decision d;
        int rc = rl_check(t.agent, &attr, 1, 1, &d);
        rl_agent_close(t.agent);
        _exit(rc == RL_EFORKED ? 0 : 1);
    }
    int status;
    waitpid(pid, &status, 0);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0,
              "the child did not get RL_EFORKED");
    cr_assert(!test_check(&t, "api_key=parent", NULL).degraded);
    test_agent_close(&t);
}

/* --- AUTH: a password, an ACL user, and a wrong password. --------------- */

static rl_decision check_with_store(const char *addr, const char *store_auth)
{
    char yaml[512];
    int n = snprintf(yaml, sizeof yaml,
                     "store:\n  url: redis://%s\n  timeout_ms: 500\n%s"
                     "rules:\n  - {name: per-key, match: api_key, "
                     "limit: 10, period: 1s}\n", addr, store_auth);
    rl_config *cfg;
    rl_agent *agent;
    rl_error err;
    cr_assert_eq(rl_config_parse(yaml, (size_t)n, "<auth>", &cfg, &err),
                 RL_OK, "%s", err.message);
    rl_options o = {.config = cfg};
    cr_assert_eq(rl_agent_open(&agent, &o, &err), RL_OK, "%s", err.message);
    rl_attr attr = {"api_key", "auth", 4};
    rl_decision d;
    cr_assert_eq(rl_check(agent, &attr, 1, 1, &d), RL_OK);
    rl_agent_close(agent);
    rl_config_free(cfg);
    return d;
}

Test(faults, authenticates_with_a_password_or_an_acl_user)
{
    test_redis srv;
    char addr[64];
    private_redis(&srv, "requirepass s3cret\n"
                        "user rl on >rlpass ~rl:* +@all", addr, sizeof addr);
    rl_decision d = check_with_store(addr, "  password: s3cret\n");
    cr_assert(d.allowed && !d.degraded, "password auth failed");
    d = check_with_store(addr, "  username: rl\n  password: rlpass\n");
    cr_assert(d.allowed && !d.degraded, "ACL user auth failed");
    d = check_with_store(addr, "  password: wrong\n");
    cr_assert(d.degraded, "a wrong password was not noticed");
    d = check_with_store(addr, "");
    cr_assert(d.degraded, "no password was not noticed");
    test_redis_stop(&srv);
}
