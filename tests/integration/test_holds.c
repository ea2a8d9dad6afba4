/*
 * Holds (rl_check_hold, issue 31): a request charged an estimate, and the
 * difference to its actual cost when it ends. The fleet's charge is the
 * sum of the actual costs; a bucket goes into debt by an excess and the
 * next request waits it out; a give-back admits more; a hold never ended
 * is charged its estimate, and nothing more, after hold_timeout_ms; a
 * close ends the open holds at their estimates.
 */
#include "redis_server.h"
#include "test_agent.h"
#include "test_aggregator.h"
#include "test_env.h"

#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static rl_decision check_cost(rl_agent *a, const char *value, uint32_t cost)
{
    rl_attr attr = {"api_key", value, strlen(value)};
    rl_decision d;
    cr_assert_eq(rl_check(a, &attr, 1, cost, &d), RL_OK);
    return d;
}

/* Waits (up to 2 s) until the agent has ended n holds its callers
 * ended: a local, synced or leased rule's difference is settled then,
 * an exact rule's sent to the store. */
static void wait_ended(rl_agent *a, uint64_t n)
{
    rl_agent_counters c = {0};
    for (int i = 0; i < 200; i++) {
        cr_assert_eq(rl_agent_stats(a, &c, NULL, 0), RL_OK);
        if (c.holds_ended >= n)
            return;
        test_sleep_ms(10);
    }
    cr_assert_fail("%llu holds ended, not %llu",
                   (unsigned long long)c.holds_ended,
                   (unsigned long long)n);
}

/* A key no earlier run of the suite used (the test Redis is shared). */
static void fresh(char *out, size_t cap, const char *what)
{
    snprintf(out, cap, "%s-%llu", what,
             (unsigned long long)test_now_us());
}

/* --- Tokens: ten agents, the count is the sum of actual costs -------- */

#define AGENTS 10
#define OPEN_AT_ONCE 3   /* holds one agent keeps open */
#define TRIES 8          /* holds each agent asks for */
#define ESTIMATE 500
#define COST_MIN 100
#define COST_MAX 2000

typedef struct worker {
    rl_agent *agent;
    const char *value;
    unsigned seed;
    atomic_llong *actual_sum;
    atomic_int *in_flight, *peak;
    long long admitted;
    int refused;
} worker;

static void end_one(worker *w, rl_hold *h)
{
    uint32_t actual = COST_MIN
                      + (uint32_t)rand_r(&w->seed) % (COST_MAX - COST_MIN + 1);
    atomic_fetch_add(w->actual_sum, actual);
    atomic_fetch_sub(w->in_flight, 1);
    cr_assert_eq(rl_hold_end(h, actual), RL_OK);
}

static void *work(void *arg)
{
    worker *w = arg;
    rl_hold *open[OPEN_AT_ONCE];
    int n = 0;
    for (int i = 0; i < TRIES; i++) {
        rl_decision d;
        rl_hold *h = test_hold_on(w->agent, "api_key", w->value, ESTIMATE, &d);
        cr_assert(!d.degraded, "the store did not answer");
        if (h == NULL) {
            w->refused++;
            continue;
        }
        w->admitted++;
        int now = atomic_fetch_add(w->in_flight, 1) + 1;
        for (int p = atomic_load(w->peak); now > p
             && !atomic_compare_exchange_weak(w->peak, &p, now);)
            ;
        if (n == OPEN_AT_ONCE) {
            int k = (int)((unsigned)rand_r(&w->seed) % OPEN_AT_ONCE);
            end_one(w, open[k]);
            open[k] = h;
        } else {
            open[n++] = h;
        }
        test_sleep_ms(2);
    }
    while (n > 0)
        end_one(w, open[--n]);
    return NULL;
}

/* Ten agents share a window of 10,000 a minute; each request holds 500
 * and costs 100 to 2,000. The window counts the actual costs exactly
 * (charge: refund gives a refused request's estimate back), and what was
 * admitted beyond the limit is at most the holds open at once times the
 * largest excess. */
Test(holds, ten_agents_count_the_sum_of_actual_costs)
{
    test_agent agents[AGENTS];
    char value[64], key[96];
    fresh(value, sizeof value, "tokens");
    snprintf(key, sizeof key, "rl:key:%s", value);
    /* Room for the test in one window. */
    test_away_from_window_edge(60000, 15000);
    for (int i = 0; i < AGENTS; i++)
        test_agent_open(&agents[i], NULL, TEST_FCALL, NULL, "refund",
                        "  - {name: w, match: api_key, limit: 10000, "
                        "period: 1m, algorithm: fixed_window}\n");
    atomic_llong actual_sum = 0;
    atomic_int in_flight = 0, peak = 0;
    worker w[AGENTS];
    pthread_t threads[AGENTS];
    for (int i = 0; i < AGENTS; i++) {
        w[i] = (worker){agents[i].agent, value, 31u * (unsigned)i + 7,
                        &actual_sum, &in_flight, &peak, 0, 0};
        cr_assert_eq(pthread_create(&threads[i], NULL, work, &w[i]), 0);
    }
    long long admitted = 0;
    int refused = 0;
    for (int i = 0; i < AGENTS; i++) {
        pthread_join(threads[i], NULL);
        admitted += w[i].admitted;
        refused += w[i].refused;
    }
    long long want = atomic_load(&actual_sum);
    long long got = test_fixed_window_count(agents[0].addr, key);
    for (int i = 0; i < 200 && got != want; i++) {
        test_sleep_ms(10);
        got = test_fixed_window_count(agents[0].addr, key);
    }
    cr_assert_eq(got, want, "the window counts %lld, the actual costs sum "
                 "to %lld", got, want);
    cr_assert_gt(refused, 0, "the load never reached the limit");
    long long bound = 10000 + (long long)atomic_load(&peak)
                                  * (COST_MAX - ESTIMATE);
    cr_assert_leq(want, bound, "admitted %lld of cost, beyond the limit and "
                  "%d in flight x %d", want, atomic_load(&peak),
                  COST_MAX - ESTIMATE);
    rl_agent_counters c;
    cr_assert_eq(rl_agent_stats(agents[0].agent, &c, NULL, 0), RL_OK);
    cr_assert_eq(c.holds_open, 0);
    cr_assert_eq(c.holds_ended, (uint64_t)w[0].admitted);
    for (int i = 0; i < AGENTS; i++)
        test_agent_close(&agents[i]);
    (void)admitted;
}

/* --- Token bucket: debt and give-back ------------------------------- */

/* 10 a second, a token each 100 ms: a hold of 2 that cost 15 leaves the
 * bucket 5 tokens in debt, so the next request of 1 waits 600 ms (the
 * debt, then its own token), and still does after a refused read. */
TEST_BOTH_MODES(holds, a_bucket_in_debt_makes_the_next_request_wait)
{
    test_agent t;
    char value[64];
    fresh(value, sizeof value, "debt");
    test_agent_open(&t, NULL, mode, NULL, NULL,
                    "  - {name: b, match: api_key, limit: 10, period: 1s}\n");
    rl_hold *h = test_hold_on(t.agent, "api_key", value, 2, NULL);
    cr_assert_not_null(h);
    cr_assert_eq(rl_hold_end(h, 15), RL_OK);
    rl_decision d = check_cost(t.agent, value, 1);
    for (int i = 0; i < 100 && d.allowed; i++) {
        /* The commit is the I/O thread's next call: admitted meanwhile,
         * the check took a token of its own. */
        test_sleep_ms(5);
        d = check_cost(t.agent, value, 1);
    }
    cr_assert(!d.allowed, "the excess was never charged");
    cr_assert(d.retry_after_ms > 450 && d.retry_after_ms <= 700,
              "retry after %lld ms, not the 600 the debt makes",
              (long long)d.retry_after_ms);
    rl_decision again = check_cost(t.agent, value, 1);
    cr_assert(!again.allowed);
    cr_assert(again.retry_after_ms > 400,
              "a read forgot the debt: retry after %lld ms",
              (long long)again.retry_after_ms);
    test_sleep_ms((unsigned)again.retry_after_ms + 30);
    cr_assert(check_cost(t.agent, value, 1).allowed);
    test_agent_close(&t);
}

/* A hold of 10 spends a bucket of 10 an hour; ending it at 3 gives 7
 * back: a request of 7 passes, one more token does not. */
TEST_BOTH_MODES(holds, an_actual_below_the_estimate_gives_back)
{
    test_agent t;
    char value[64];
    fresh(value, sizeof value, "giveback");
    test_agent_open(&t, NULL, mode, NULL, NULL,
                    "  - {name: b, match: api_key, limit: 10, period: 1h}\n");
    rl_hold *h = test_hold_on(t.agent, "api_key", value, 10, NULL);
    cr_assert_not_null(h);
    cr_assert(!check_cost(t.agent, value, 1).allowed);
    cr_assert_eq(rl_hold_end(h, 3), RL_OK);
    rl_decision d = check_cost(t.agent, value, 7);
    for (int i = 0; i < 100 && !d.allowed; i++) {
        test_sleep_ms(5);
        d = check_cost(t.agent, value, 7);
    }
    cr_assert(d.allowed, "nothing was given back");
    cr_assert(!check_cost(t.agent, value, 1).allowed,
              "more than the difference was given back");
    test_agent_close(&t);
}

/* The same in a fixed window: 10 an hour, a hold of 10 ended at 3. */
Test(holds, a_window_takes_the_difference_back)
{
    test_agent t;
    char value[64], key[96];
    fresh(value, sizeof value, "window-back");
    snprintf(key, sizeof key, "rl:key:%s", value);
    test_agent_open(&t, NULL, TEST_FCALL, NULL, NULL,
                    "  - {name: w, match: api_key, limit: 10, period: 1h, "
                    "algorithm: fixed_window}\n");
    rl_hold *h = test_hold_on(t.agent, "api_key", value, 10, NULL);
    cr_assert_not_null(h);
    cr_assert_eq(rl_hold_end(h, 3), RL_OK);
    for (int i = 0; i < 200 && test_fixed_window_count(t.addr, key) != 3; i++)
        test_sleep_ms(10);
    cr_assert_eq(test_fixed_window_count(t.addr, key), 3);
    cr_assert(check_cost(t.agent, value, 7).allowed);
    test_agent_close(&t);
}

/* --- Expiry and close ------------------------------------------------ */

static test_log expiry_log;

/* An agent on the shared Redis with hold_timeout_ms 1000, logging into
 * log. */
static rl_agent *agent_with_timeout(rl_config **cfg, test_log *log,
                                    const char *rules)
{
    char yaml[1024];
    int n = snprintf(yaml, sizeof yaml,
                     "store:\n  url: redis://%s\n  timeout_ms: 1000\n"
                     "hold_timeout_ms: 1000\nrules:\n%s",
                     test_env("RL_TEST_REDIS"), rules);
    rl_error err;
    cr_assert_eq(rl_config_parse(yaml, (size_t)n, "<test>", cfg, &err),
                 RL_OK, "%s", err.message);
    test_log_init(log);
    rl_options o = {.config = *cfg, .log = test_log_capture, .log_arg = log,
                    .log_level = RL_LOG_DEBUG};
    rl_agent *a;
    cr_assert_eq(rl_agent_open(&a, &o, &err), RL_OK, "%s", err.message);
    return a;
}

/* A hold of 4 never ended: after hold_timeout_ms (1 s) the agent ends it
 * at 4, logged; the caller's end afterwards charges nothing. */
Test(holds, a_hold_never_ended_is_charged_its_estimate)
{
    rl_config *cfg;
    char value[64];
    fresh(value, sizeof value, "expiry");
    rl_agent *a = agent_with_timeout(&cfg, &expiry_log,
                                     "  - {name: b, match: api_key, "
                                     "limit: 10, period: 1h}\n");
    rl_hold *h = test_hold_on(a, "api_key", value, 4, NULL);
    cr_assert_not_null(h);
    cr_assert(test_log_wait(&expiry_log, "event=hold_expired", NULL, 3000),
              "no hold_expired line");
    rl_agent_counters c;
    cr_assert_eq(rl_agent_stats(a, &c, NULL, 0), RL_OK);
    cr_assert_eq(c.holds_expired, 1);
    cr_assert_eq(c.holds_open, 0);
    cr_assert_eq(rl_hold_end(h, 10), RL_OK);
    test_sleep_ms(50);
    cr_assert(check_cost(a, value, 6).allowed, "more than 4 was charged");
    cr_assert(!check_cost(a, value, 1).allowed, "less than 4 was charged");
    cr_assert_eq(rl_agent_stats(a, &c, NULL, 0), RL_OK);
    cr_assert_eq(c.holds_ended, 0);
    rl_agent_close(a);
    rl_config_free(cfg);
}

/* The config refuses a timeout out of its bounds, saying which. */
Test(holds, hold_timeout_ms_out_of_bounds_is_refused)
{
    const char *bad[] = {"999", "86400001"};
    for (int i = 0; i < 2; i++) {
        char yaml[256];
        int n = snprintf(yaml, sizeof yaml,
                         "store:\n  url: redis://127.0.0.1:1\n"
                         "hold_timeout_ms: %s\nrules:\n"
                         "  - {name: b, match: k, limit: 1, period: 1s}\n",
                         bad[i]);
        rl_config *cfg = NULL;
        rl_error err;
        cr_assert_neq(rl_config_parse(yaml, (size_t)n, "<test>", &cfg, &err),
                      RL_OK, "hold_timeout_ms %s was taken", bad[i]);
        cr_assert(strstr(err.message, "hold_timeout_ms") != NULL, "%s",
                  err.message);
    }
}

/* Closed with a hold open: the close ends it at 4; the caller's end
 * afterwards only frees it (ASan sees any use of the closed agent), and
 * a new agent finds 4 charged, not more. */
Test(holds, close_ends_open_holds_at_their_estimates)
{
    test_agent t;
    char value[64];
    fresh(value, sizeof value, "close");
    const char *rules = "  - {name: b, match: api_key, limit: 10, "
                        "period: 1h}\n";
    test_agent_open(&t, NULL, TEST_FCALL, NULL, NULL, rules);
    rl_hold *h = test_hold_on(t.agent, "api_key", value, 4, NULL);
    cr_assert_not_null(h);
    test_agent_close(&t);
    cr_assert_eq(rl_hold_end(h, 9), RL_OK);
    test_agent_open(&t, NULL, TEST_FCALL, NULL, NULL, rules);
    cr_assert(check_cost(t.agent, value, 6).allowed);
    cr_assert(!check_cost(t.agent, value, 1).allowed);
    test_agent_close(&t);
}

/* A refused request holds nothing: its callback gets NULL. */
Test(holds, a_refused_request_gets_no_hold)
{
    test_agent t;
    char value[64];
    fresh(value, sizeof value, "refused");
    test_agent_open(&t, NULL, TEST_FCALL, NULL, NULL,
                    "  - {name: b, match: api_key, limit: 2, period: 1h}\n");
    rl_decision d;
    rl_hold *h = test_hold_on(t.agent, "api_key", value, 2, &d);
    cr_assert(d.allowed);
    cr_assert_eq(rl_hold_end(h, 2), RL_OK);
    cr_assert_null(test_hold_on(t.agent, "api_key", value, 1, &d));
    cr_assert(!d.allowed);
    cr_assert_eq(rl_hold_end(NULL, 1), RL_EINVAL);
    test_agent_close(&t);
}

/* --- Leased, local and synced ---------------------------------------- */

/* A leased rule's difference reaches its bucket: 10 an hour, a hold of 2
 * that cost 9 leaves one token for every agent. */
Test(holds, a_leased_rule_is_charged_the_difference)
{
    test_agent t;
    char value[64];
    fresh(value, sizeof value, "leased");
    test_agent_open(&t, NULL, TEST_FCALL, NULL, NULL,
                    "  - {name: b, match: api_key, limit: 10, period: 1h, "
                    "mode: leased}\n");
    rl_hold *h = test_hold_on(t.agent, "api_key", value, 2, NULL);
    cr_assert_not_null(h);
    cr_assert_eq(rl_hold_end(h, 9), RL_OK);
    /* The close sends the difference and waits for its answer; the
     * agent's own hand goes back then too: a new agent sees what the
     * bucket holds. */
    test_agent_close(&t);
    test_agent_open(&t, NULL, TEST_FCALL, NULL, NULL,
                    "  - {name: b, match: api_key, limit: 10, period: 1h}\n");
    cr_assert(check_cost(t.agent, value, 1).allowed);
    cr_assert(!check_cost(t.agent, value, 1).allowed,
              "the difference was not charged");
    test_agent_close(&t);
}

#define LEASED_HOLDS 200

/* A leased rule's differences are settled in the key's hand, with no
 * call: over holds of 500 that cost 100 to 2,000, the agent's calls are
 * its leases, far fewer than the holds, and once the close has given the
 * hand back (and paid any debt) the bucket is charged the sum of the
 * actual costs. A million per 10,000 s refills 100 a second: the bucket's
 * PTTL is 10 ms a token short, less the time since the first charge. */
Test(holds, a_leased_rule_settles_in_the_hand_with_no_call)
{
    test_agent t;
    char value[64], key[96], addr[64];
    fresh(value, sizeof value, "leased-run");
    snprintf(key, sizeof key, "rl:key:%s", value);
    test_agent_open(&t, NULL, TEST_FCALL, NULL, NULL,
                    "  - {name: b, match: api_key, limit: 1000000, "
                    "period: 10000s, mode: leased}\n");
    snprintf(addr, sizeof addr, "%s", t.addr);
    uint64_t start_ms = test_wall_ms();
    uint64_t calls = test_store_calls(t.agent);
    long long sum = 0;
    for (int i = 0; i < LEASED_HOLDS; i++) {
        rl_decision d;
        rl_hold *h = test_hold_on(t.agent, "api_key", value, ESTIMATE, &d);
        cr_assert(d.allowed && !d.degraded, "hold %d refused", i);
        uint32_t actual = COST_MIN
                          + (uint32_t)(i * 733) % (COST_MAX - COST_MIN + 1);
        sum += actual;
        cr_assert_eq(rl_hold_end(h, actual), RL_OK);
    }
    wait_ended(t.agent, LEASED_HOLDS);
    rl_agent_counters c;
    cr_assert_eq(rl_agent_stats(t.agent, &c, NULL, 0), RL_OK);
    calls = test_store_calls(t.agent) - calls;
    /* A lease may still be out: sent, not yet counted as taken. */
    cr_assert(calls <= c.leases_taken + 1 && calls <= LEASED_HOLDS / 4,
              "%llu calls for %d holds and %llu leases: not the leases "
              "only", (unsigned long long)calls, LEASED_HOLDS,
              (unsigned long long)c.leases_taken);
    test_agent_close(&t);
    long long refilled = (long long)(test_wall_ms() - start_ms) / 10 + 1;
    long long charged = test_redis_pttl(addr, key) / 10;
    cr_assert(charged <= sum && charged >= sum - refilled,
              "the bucket is %lld short, the actual costs are %lld "
              "(%lld refilled meanwhile)", charged, sum, refilled);
}

/* A local bucket of 10 a second: a hold of 2 that cost 15 puts it 5
 * tokens in debt, which the next request waits out; another hold of 10
 * ended at 4 gives 6 back. */
Test(holds, a_local_rule_goes_into_debt_and_gives_back)
{
    test_agent t;
    test_agent_open(&t, NULL, TEST_FCALL, NULL, NULL,
                    "  - {name: b, match: api_key, limit: 10, period: 1s, "
                    "mode: local}\n"
                    "  - {name: h, match: plan, limit: 10, period: 1h, "
                    "mode: local}\n");
    rl_hold *h = test_hold_on(t.agent, "api_key", "debt", 2, NULL);
    cr_assert_not_null(h);
    cr_assert_eq(rl_hold_end(h, 15), RL_OK);
    wait_ended(t.agent, 1);
    rl_decision d = check_cost(t.agent, "debt", 1);
    cr_assert(!d.allowed);
    cr_assert(d.retry_after_ms > 450 && d.retry_after_ms <= 600,
              "retry after %lld ms, not about the 600 the debt makes",
              (long long)d.retry_after_ms);
    h = test_hold_on(t.agent, "plan", "back", 10, NULL);
    cr_assert_not_null(h);
    cr_assert_eq(rl_hold_end(h, 4), RL_OK);
    wait_ended(t.agent, 2);
    rl_attr plan = {"plan", "back", 4};
    rl_decision p;
    cr_assert_eq(rl_check_nowait(t.agent, &plan, 1, 6, &p), RL_OK);
    cr_assert(p.allowed, "nothing was given back");
    cr_assert_eq(rl_check_nowait(t.agent, &plan, 1, 1, &p), RL_OK);
    cr_assert(!p.allowed, "more than the difference was given back");
    test_agent_close(&t);
}

/* A hold whose callback keeps the I/O thread until the wall clock's
 * next second is 20 ms old: the decisions queued behind it come after a
 * window's end. */
static void on_held_late(const rl_decision *d, rl_hold *hold, void *arg)
{
    uint64_t until = (test_wall_ms() / 1000 + 1) * 1000 + 20;
    while (test_wall_ms() < until)
        test_sleep_ms(1);
    test_on_held(d, hold, arg);
}

/* A local window of 2 a second. A hold of 2 counts in the second it is
 * checked, 100 ms before its end; its decision comes in the next (the
 * I/O thread is kept). Ended at 0 after that second's own 2, its
 * give-back goes to the window that counted it, not to the next, which
 * still admits no third. */
Test(holds, a_local_window_gives_back_to_the_window_of_the_check)
{
    test_agent t;
    test_agent_open(&t, NULL, TEST_FCALL, NULL, NULL,
                    "  - {name: w, match: api_key, limit: 2, period: 1s, "
                    "algorithm: fixed_window, mode: local}\n");
    while (test_wall_ms() % 1000 < 850 || test_wall_ms() % 1000 >= 900)
        test_sleep_ms(1);
    test_held late = {0}, h = {0};
    sem_init(&late.done, 0, 0);
    sem_init(&h.done, 0, 0);
    rl_attr other = {"api_key", "late", 4}, attr = {"api_key", "edge", 4};
    cr_assert_eq(rl_check_hold(t.agent, &other, 1, 1, on_held_late, &late),
                 RL_OK);
    uint64_t checked = test_wall_ms();
    cr_assert_eq(rl_check_hold(t.agent, &attr, 1, 2, test_on_held, &h),
                 RL_OK);
    while (sem_wait(&h.done) != 0)
        ;
    while (sem_wait(&late.done) != 0)
        ;
    cr_assert_not_null(h.hold);
    cr_assert_not_null(late.hold);
    uint64_t decided = test_wall_ms();
    cr_assert_eq(decided / 1000, checked / 1000 + 1, "checked at %llu, "
                 "decided at %llu: not across one window's end",
                 (unsigned long long)checked, (unsigned long long)decided);
    for (int i = 0; i < 2; i++)
        cr_assert(check_cost(t.agent, "edge", 1).allowed);
    cr_assert_eq(rl_hold_end(h.hold, 0), RL_OK);
    cr_assert_eq(rl_hold_end(late.hold, 1), RL_OK);
    wait_ended(t.agent, 2);
    cr_assert(!check_cost(t.agent, "edge", 1).allowed, "the give-back went "
              "to the window after its check's");
    cr_assert_eq(test_wall_ms() / 1000, decided / 1000, "too slow: the test "
                 "ran into the next window");
    sem_destroy(&late.done);
    sem_destroy(&h.done);
    test_agent_close(&t);
}

/* One agent of a synced rule (yaml), through an aggregator that syncs
 * every interval_ms, and a tenant no earlier run used, with its key. */
typedef struct synced_world {
    test_aggregator agg;
    rl_config *cfg;
    rl_agent *a;
    char value[64], key[96];
} synced_world;

static void synced_open(synced_world *w, const char *rules,
                        unsigned interval_ms, const char *what)
{
    test_aggregator_start(&w->agg, NULL, rules, interval_ms, NULL);
    w->a = test_synced_agent(&w->agg, &w->cfg);
    fresh(w->value, sizeof w->value, what);
    snprintf(w->key, sizeof w->key, "rl:tenant:%s", w->value);
}

/* A synced rule of 1000 a minute. */
#define PER_TENANT "  - {name: per-tenant, match: tenant, limit: 1000, " \
                   "period: 1m, mode: synced}\n"

/* The agent's first share, once the aggregator has answered: a hold of
 * 1, ended at 1, is in Redis within timeout_ms. */
static void synced_first_share(synced_world *w, unsigned timeout_ms)
{
    rl_hold *h = test_hold_on(w->a, "tenant", w->value, 1, NULL);
    cr_assert_not_null(h);
    cr_assert_eq(rl_hold_end(h, 1), RL_OK);
    test_expect_window_total(w->key, 1, timeout_ms);
}

static void synced_close(synced_world *w)
{
    rl_agent_close(w->a);
    rl_config_free(w->cfg);
    test_aggregator_stop(&w->agg);
}

/* A synced rule's excess goes into the next report: the aggregator's
 * count ends at the actual cost. */
Test(holds, a_synced_rule_reports_the_difference)
{
    synced_world w;
    synced_open(&w, PER_TENANT, 100, "synced");
    rl_hold *h = test_hold_on(w.a, "tenant", w.value, 5, NULL);
    cr_assert_not_null(h);
    cr_assert_eq(rl_hold_end(h, 12), RL_OK);
    test_expect_window_total(w.key, 12, 5000);
    synced_close(&w);
}

/* Holds of an estimate of 500 whose actual costs fall below and above
 * it, each ended before the report that would carry its estimate: the
 * give-backs come off the unreported count, the agent admits at once
 * what they free, and the aggregator's count ends at the sum of the
 * actual costs, and stays there. A 1 s interval keeps the ticks away
 * from the moment a hold lasts. */
Test(holds, a_synced_rule_gives_back_before_its_report)
{
    synced_world w;
    synced_open(&w, PER_TENANT, 1000, "synced-back");
    synced_first_share(&w, 5000);
    const uint32_t actual[] = {120, 50, 30, 700};
    long long sum = 1;
    for (size_t i = 0; i < sizeof actual / sizeof actual[0]; i++) {
        rl_decision d;
        rl_hold *h = test_hold_on(w.a, "tenant", w.value, 500, &d);
        cr_assert_not_null(h, "hold %zu refused: the give-backs before "
                              "it were not taken", i);
        cr_assert_eq(rl_hold_end(h, actual[i]), RL_OK);
        wait_ended(w.a, i + 2);
        sum += actual[i];
    }
    test_expect_window_total(w.key, sum, 5000);
    test_sleep_ms(2200);
    cr_assert_eq(test_window_total(NULL, w.key), sum,
                 "the count moved off the sum of the actual costs");
    synced_close(&w);
}

static bool tenant_allowed(rl_agent *a, const char *value, uint32_t cost)
{
    rl_attr attr = {"tenant", value, strlen(value)};
    rl_decision d;
    cr_assert_eq(rl_check(a, &attr, 1, cost, &d), RL_OK);
    return d.allowed;
}

/* A hold whose estimate is reported before it ends: its give-back goes
 * in a later report, off the sub-window the estimate was counted in.
 * Redis's count ends at the actual cost, and the agent gets the room it
 * frees once the fleet's totals hold it (the TOTALS after the give-back's
 * ack, though lower than the sub-window's totals before), and not one
 * more. The rule is its own (the fleet's agents of a rule are counted in
 * Redis, which the suite shares): this agent is its only one. */
Test(holds, a_synced_rule_gives_back_after_its_report)
{
    synced_world w;
    synced_open(&w, "  - {name: gives-back, match: tenant, limit: 1000, "
                "period: 10s, mode: synced}\n", 100, "after-report");
    synced_first_share(&w, 3000);
    rl_hold *h = test_hold_on(w.a, "tenant", w.value, 900, NULL);
    cr_assert_not_null(h);
    test_expect_window_total(w.key, 901, 2000);
    test_sleep_ms(250); /* acknowledged, two intervals on */
    cr_assert_eq(rl_hold_end(h, 100), RL_OK);
    wait_ended(w.a, 2);
    test_expect_window_total(w.key, 101, 2000);
    /* 899 are left: the agent admits them once its totals say so. */
    uint64_t start = test_now_ms();
    while (!tenant_allowed(w.a, w.value, 899)) {
        cr_assert_lt(test_now_ms() - start, 1000,
                     "the room given back never came to the agent");
        test_sleep_ms(10);
    }
    cr_assert_not(tenant_allowed(w.a, w.value, 1),
                  "the give-back admitted more than it gave back");
    test_expect_window_total(w.key, 1000, 2000);
    synced_close(&w);
}

/* A give-back whose estimate's sub-window has left the trailing period
 * (a rule of 1 s: 21 sub-windows of 50 ms span 1.05 s) is dropped: that
 * estimate no longer counts, and the sub-window's field keeps it until
 * the hash expires. */
Test(holds, a_synced_give_back_after_its_sub_window_left_is_dropped)
{
    synced_world w;
    synced_open(&w, "  - {name: gives-back-late, match: tenant, "
                "limit: 1000, period: 1s, mode: synced}\n", 100, "left");
    rl_hold *h = test_hold_on(w.a, "tenant", w.value, 5, NULL);
    cr_assert_not_null(h);
    test_expect_window_total(w.key, 5, 3000);
    test_sleep_ms(1150);
    cr_assert_eq(rl_hold_end(h, 1), RL_OK);
    wait_ended(w.a, 1);
    test_sleep_ms(300); /* three reports */
    cr_assert_eq(test_window_total(NULL, w.key), 5,
                 "a give-back went to a sub-window that had left");
    synced_close(&w);
}

/* rl_check_rule_hold holds as rl_check_hold does, at the caller's rate
 * too; an estimate of 0 is a check of room, charged at the end. */
Test(holds, a_rule_hold_and_a_check_of_room_end_at_the_actual_cost)
{
    test_agent t;
    char value[64];
    fresh(value, sizeof value, "rule-hold");
    test_agent_open(&t, NULL, TEST_FCALL, NULL, NULL,
                    "  - {name: api_key, match: api_key, limit: 10, "
                    "period: 1h}\n");
    test_held h = {0};
    sem_init(&h.done, 0, 0);
    rl_rate rate = {.limit = 20, .period_ms = 7200000};
    cr_assert_eq(rl_check_rule_hold(t.agent, "api_key", value, strlen(value),
                                    &rate, 0, test_on_held, &h),
                 RL_OK);
    while (sem_wait(&h.done) != 0)
        ;
    sem_destroy(&h.done);
    cr_assert(h.decision.allowed);
    cr_assert_not_null(h.hold);
    cr_assert_eq(h.decision.remaining, 20, "a check of room charged %llu",
                 (unsigned long long)(20 - h.decision.remaining));
    cr_assert_eq(rl_hold_end(h.hold, 4), RL_OK);
    wait_ended(t.agent, 1);
    test_sleep_ms(50);
    cr_assert(check_cost(t.agent, value, 6).allowed);
    cr_assert(!check_cost(t.agent, value, 1).allowed,
              "the actual cost was not charged");
    rl_attr attr = {"api_key", value, strlen(value)};
    rl_decision d;
    cr_assert_eq(rl_check(t.agent, &attr, 1, 0, &d), RL_EINVAL,
                 "rl_check took a cost of 0");
    test_agent_close(&t);
}
