/*
 * test_agent.h: an agent on a test Redis, from a few lines of rules, in
 * FCALL or EVALSHA mode, with its scripts flushed after warm-up so that
 * every test also runs through the reload path.
 */
#ifndef RL_TEST_AGENT_H
#define RL_TEST_AGENT_H

#include "rl.h"
#include "store_calls.h"

#include <pthread.h>
#include <semaphore.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

typedef struct test_agent {
    rl_agent *agent;
    rl_config *config;
    char addr[64];     /* host:port of its Redis */
} test_agent;

typedef enum test_scripts { TEST_FCALL, TEST_EVALSHA } test_scripts;

/* test_agent_open opens an agent on addr (NULL: RL_TEST_REDIS) with
 * `store.scripts` set by mode and extra store lines (timeout_ms defaults to
 * 1000 here unless they set it), and the given rules
 * YAML (a list under "rules:"). It makes one check so that the scripts are
 * loaded, then flushes them (SCRIPT FLUSH or FUNCTION FLUSH): the test's
 * own first calls meet NOSCRIPT or "function not found" and must recover. */
void test_agent_open(test_agent *t, const char *addr, test_scripts mode,
                     const char *store_extra, const char *charge,
                     const char *rules_yaml);

void test_agent_close(test_agent *t);

/* test_agent_private_redis starts a redis-server of the test's own (for
 * counts no other test may disturb: INFO commandstats) and writes its
 * host:port into addr; the test stops it with test_redis_stop. */
struct test_redis;
void test_agent_private_redis(struct test_redis *srv, char *addr,
                              size_t cap);

/* test_check runs rl_check with one or more "name=value" attributes
 * (NULL-terminated) and cost 1, asserting it returns RL_OK. */
rl_decision test_check(test_agent *t, ...);

/* Runs both script modes of a test: name_fcall and name_evalsha. */
#define TEST_BOTH_MODES(suite, name)                                      \
    static void suite##_##name(test_scripts mode);                         \
    Test(suite, name##_fcall) { suite##_##name(TEST_FCALL); }              \
    Test(suite, name##_evalsha) { suite##_##name(TEST_EVALSHA); }          \
    static void suite##_##name(test_scripts mode)

/* Every line an agent logs, kept for the test to read: open the agent with
 * rl_options .log = test_log_capture, .log_arg = a test_log (static: it
 * is large), .log_level = RL_LOG_DEBUG. */
typedef struct test_log {
    pthread_mutex_t lock;
    char text[1 << 16];
    size_t len;
    bool cut;          /* a line did not fit */
} test_log;

void test_log_init(test_log *l);
void test_log_capture(rl_log_level level, const char *line, void *arg);

/* Waits up to timeout_ms for a line holding what, and then (if not NULL)
 * on that line; true if one came. */
bool test_log_wait(test_log *l, const char *what, const char *then,
                   int timeout_ms);

/* Fails the test if any line holds text (where names the log). */
void test_log_lacks(test_log *l, const char *text, const char *where);

/* An agent on the config file at path, logging every line (debug up) into
 * log unless it is NULL. The caller closes it with rl_agent_close and
 * frees *config. */
rl_agent *test_agent_on(const char *path, rl_config **config, test_log *log);

/* How late a check may return in a test. rl's own part is at most
 * TEST_DEADLINE_MARGIN_MS past its deadline (store.timeout_ms): the I/O
 * thread's timer, or the caller's 5 ms of grace when that thread is late.
 * What the machine adds is measured while the test runs: a probe thread
 * sleeps 1 ms at a time and notes how much later than asked it woke up
 * (on two cores shared with a benchmark, 40 ms and more; under TSan beside
 * two busy loops, over 100 ms). A check goes through two such wake-ups,
 * the I/O thread's and its caller's, hence twice the probe's worst. On a
 * quiet machine the bound is the deadline plus the margin; a deadline that
 * is not kept misses by the stall limit (1 s and more). */
#define TEST_DEADLINE_MARGIN_MS 15

typedef struct test_sched_probe {
    pthread_t thread;
    atomic_bool stop;
    atomic_uint_least64_t worst_us;
} test_sched_probe;

void test_sched_probe_start(test_sched_probe *p);
/* Stops the probe; returns the longest it overslept, in microseconds. */
uint64_t test_sched_probe_stop(test_sched_probe *p);
/* The latest a check with this deadline may return, in microseconds after
 * it was called, given the probe's worst oversleep. */
uint64_t test_deadline_latest_us(unsigned deadline_ms, uint64_t overslept_us);

/* Milliseconds, microseconds on the monotonic clock. */
uint64_t test_now_ms(void);

/* The count in a fixed window key's windows (key:<window>), summed:
 * what the Redis at addr holds for it, whichever window a test ran in. */
long long test_fixed_window_count(const char *addr, const char *key);
/* Waits up to 2 s for that count to be want (what is charged after a
 * decision, a refund or a hold's end, goes out in a later call), and
 * asserts it is. */
void test_fixed_window_expect(const char *addr, const char *key,
                              long long want);

/* The sum of a synced key's window counts (keys prefix_value:w*) in the
 * Redis at addr (NULL: the shared test Redis). */
long long test_window_total(const char *addr, const char *prefix_value);

/* Waits until the shared test Redis holds want for the key, or fails the
 * test after timeout_ms. */
void test_expect_window_total(const char *prefix_value, long long want,
                              unsigned timeout_ms);
uint64_t test_now_us(void);
/* One hold's decision, waited for: test_on_held is the rl_hold_fn that
 * fills it in and posts done. */
typedef struct test_held {
    sem_t done;
    rl_decision decision;
    rl_hold *hold;
    bool null_when_rejected;
} test_held;
void test_on_held(const rl_decision *d, rl_hold *hold, void *arg);
/* rl_check_hold of one attribute, its decision waited for: the hold, or
 * NULL when refused (*d says why, when d is not NULL). */
rl_hold *test_hold_on(rl_agent *a, const char *name, const char *value,
                      uint32_t estimate, rl_decision *d);
/* One turn of a host's loop (rl_options.host_loop): waits for the agent's
 * descriptor at most its own timeout (or what is left until deadline, in
 * test_now_ms's ms; past it the test fails), then runs it. */
void test_host_turn(rl_agent *a, uint64_t deadline);
void test_sleep_ms(unsigned ms);
/* Milliseconds on the wall clock, which the test Redis's TIME (and so its
 * fixed windows) follows. */
uint64_t test_wall_ms(void);
/* Returns once at least need_ms are left before the next multiple of
 * period_ms on the wall clock, sleeping past that edge if they are not: a
 * test that counts in one fixed window (a minute, an hour) must not see
 * it end half-way. */
void test_away_from_window_edge(uint64_t period_ms, uint64_t need_ms);

#endif
