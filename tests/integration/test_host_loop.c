/*
 * Host-loop mode (rl_options.host_loop): the agent's loop driven by the
 * thread that opened it, as an nginx worker drives it. The test's thread
 * is the host: it polls the agent's descriptor with the agent's timeout,
 * as a host's own loop would, and runs it. What is promised: no thread of
 * the agent's own, callbacks on the host's thread, a turn's checks in one
 * write, the deadlines kept by the host's timer alone, rl_check refused on
 * the loop thread and served on others, and a close that runs the loop to
 * its end (a synced count reported).
 */
#include "test_agent.h"
#include "test_aggregator.h"
#include "test_env.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* Threads of this process. */
static int thread_count(void)
{
    DIR *d = opendir("/proc/self/task");
    cr_assert_not_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

static rl_agent *open_host_agent(const char *config_path)
{
    rl_options o = {.config_path = config_path, .host_loop = 1};
    rl_agent *a;
    rl_error err;
    cr_assert_eq(rl_agent_open(&a, &o, &err), RL_OK, "%s", err.message);
    return a;
}

typedef struct answers {
    int n, allowed, degraded, off_thread;
    uint64_t limit; /* the last decision's */
    pthread_t host;
} answers;

static void answered(const rl_decision *d, void *arg)
{
    answers *w = arg;
    w->n++;
    w->allowed += d->allowed;
    w->degraded += d->degraded;
    w->off_thread += !pthread_equal(pthread_self(), w->host);
    w->limit = d->limit;
}

static void fresh(char *buf, size_t cap, const char *what)
{
    static int n;
    snprintf(buf, cap, "%s_%d_%d_%llu", what, (int)getpid(), ++n,
             (unsigned long long)test_now_ms());
}

/* Runs the host's loop until want answers came, within ms. */
static void run_until(rl_agent *a, const answers *w, int want, unsigned ms)
{
    uint64_t deadline = test_now_ms() + ms;
    while (w->n < want)
        test_host_turn(a, deadline);
}

/* --- The exact path, on the host's thread, exact. ---------------------- */

Test(host_loop, exact_checks_run_on_the_host_thread_in_one_write)
{
    enum { LIMIT = 10, OFFERED = 30 };
    const char *cfg = test_store_config("host-exact",
        "  - {name: per-key, match: api_key, limit: 10, period: 1h}\n");
    int before = thread_count();
    rl_agent *a = open_host_agent(cfg);
    cr_assert_eq(thread_count(), before, "the agent started a thread of "
                 "its own");
    char key[96];
    fresh(key, sizeof key, "ak_host");
    rl_attr attr = {"api_key", key, strlen(key)};
    answers w = {.host = pthread_self()};
    /* One turn of the host's loop: every check is made before it runs. */
    for (int i = 0; i < OFFERED; i++)
        cr_assert_eq(rl_check_async(a, &attr, 1, 1, answered, &w), RL_OK);
    cr_assert_eq(w.n, 0, "a decision came before the host ran the loop");
    run_until(a, &w, OFFERED, 5000);
    fprintf(stderr, "host loop: %d of %d admitted (limit %d), %d off the "
            "host's thread\n", w.allowed, OFFERED, LIMIT, w.off_thread);
    cr_expect_eq(w.off_thread, 0);
    cr_expect_eq(w.degraded, 0);
    cr_expect_eq(w.allowed, LIMIT);
    rl_agent_counters c;
    cr_assert_eq(rl_agent_stats(a, &c, NULL, 0), RL_OK);
    /* The thirty went out together: the agent's first calls wait for the
     * connection, then leave in one write. */
    cr_expect_eq(c.store_batches, 1, "%llu writes for one turn's checks",
                 (unsigned long long)c.store_batches);
    cr_assert_eq(thread_count(), before);
    rl_agent_close(a);
}

/* --- Deadlines come from the host's timer alone. ----------------------- */

Test(host_loop, a_silent_store_is_decided_at_the_deadline_by_the_host_timer)
{
    uint16_t port;
    int silent = test_silent_store(&port);
    char yaml[400];
    snprintf(yaml, sizeof yaml,
             "store: {url: \"redis://127.0.0.1:%u\", timeout_ms: 200}\n"
             "rules:\n"
             "  - {name: per-key, match: api_key, limit: 10, period: 1h}\n",
             port);
    rl_agent *a = open_host_agent(test_write_config("host-silent", yaml));
    rl_attr attr = {"api_key", "k", 1};
    answers w = {.host = pthread_self()};
    test_sched_probe probe;
    test_sched_probe_start(&probe);
    uint64_t start = test_now_us();
    cr_assert_eq(rl_check_async(a, &attr, 1, 1, answered, &w), RL_OK);
    run_until(a, &w, 1, 3000);
    uint64_t took = test_now_us() - start;
    uint64_t latest = test_deadline_latest_us(200,
                                              test_sched_probe_stop(&probe));
    fprintf(stderr, "host loop: a silent store decided in %llu us "
            "(deadline 200 ms, at most %llu us here)\n",
            (unsigned long long)took, (unsigned long long)latest);
    cr_expect_eq(w.degraded, 1);
    cr_expect_eq(w.allowed, 1, "on_error: allow, the default");
    cr_expect_geq(took, 195000);
    cr_expect_leq(took, latest);
    rl_agent_close(a);
    close(silent);
}

/* --- rl_check: refused on the loop thread, served on others. ----------- */

typedef struct blocking {
    rl_agent *agent;
    const char *key;
    int rc;
    rl_decision d;
    atomic_bool done;
} blocking;

static void *check_blocking(void *arg)
{
    blocking *b = arg;
    rl_attr attr = {"api_key", b->key, strlen(b->key)};
    b->rc = rl_check(b->agent, &attr, 1, 1, &b->d);
    atomic_store(&b->done, true);
    return NULL;
}

Test(host_loop, rl_check_is_eagain_on_the_loop_thread_and_served_elsewhere)
{
    const char *cfg = test_store_config("host-check",
        "  - {name: per-key, match: api_key, limit: 10, period: 1h}\n");
    rl_agent *a = open_host_agent(cfg);
    char key[96];
    fresh(key, sizeof key, "ak_block");
    rl_attr attr = {"api_key", key, strlen(key)};
    rl_decision d;
    cr_assert_eq(rl_check(a, &attr, 1, 1, &d), RL_EAGAIN);
    cr_assert_eq(rl_check_nowait(a, &attr, 1, 1, &d), RL_EAGAIN);

    blocking b = {.agent = a, .key = key};
    pthread_t th;
    pthread_create(&th, NULL, check_blocking, &b);
    uint64_t deadline = test_now_ms() + 5000;
    while (!atomic_load(&b.done))
        test_host_turn(a, deadline);
    pthread_join(th, NULL);
    cr_expect_eq(b.rc, RL_OK);
    cr_expect(b.d.allowed && !b.d.degraded);
    cr_expect_eq(b.d.remaining, 9);

    /* The loop is the host thread's alone. */
    cr_expect_eq(rl_agent_run(NULL), RL_EINVAL);
    rl_agent_close(a);
}

static void *run_elsewhere(void *arg)
{
    return (void *)(intptr_t)rl_agent_run(arg);
}

Test(host_loop, the_loop_is_refused_to_other_threads_and_to_thread_agents)
{
    const char *cfg = test_store_config("host-refused",
        "  - {name: per-key, match: api_key, limit: 10, period: 1h}\n");
    rl_agent *a = open_host_agent(cfg);
    pthread_t th;
    void *rc;
    pthread_create(&th, NULL, run_elsewhere, a);
    pthread_join(th, &rc);
    cr_expect_eq((int)(intptr_t)rc, RL_EINVAL);
    rl_agent_close(a);

    rl_options o = {.config_path = cfg};
    rl_error err;
    cr_assert_eq(rl_agent_open(&a, &o, &err), RL_OK, "%s", err.message);
    cr_expect_eq(rl_agent_loop_fd(a), RL_EINVAL);
    cr_expect_eq(rl_agent_run(a), RL_EINVAL);
    rl_agent_close(a);

    o.host_loop = 2;
    cr_expect_eq(rl_agent_open(&a, &o, &err), RL_EINVAL);
    cr_expect(strstr(err.message, "host_loop") != NULL, "%s", err.message);
}

/* --- Reloads on the loop thread. -------------------------------------- */

/* A reload waits for no loop the caller itself must run (the old rules go
 * when the loop runs). A host that reloads between turns of its loop:
 * each turn takes the new rules up and holds them, and a reload that
 * waited for the loop to let them go would stall the loop thread 20 ms
 * every time (2 s for a hundred); they take a few ms each. The next check
 * sees the last rules. */
Test(host_loop, reloads_on_the_loop_thread_never_wait_on_it)
{
    enum { RELOADS = 100 };
    char rules[160];
    const char *cfg = test_store_config("host-reload",
        "  - {name: per-key, match: api_key, limit: 10, period: 1h}\n");
    rl_agent *a = open_host_agent(cfg);
    uint64_t start = test_now_ms();
    /* A reload that waits on the loop never returns: SIGALRM ends it. */
    alarm(30);
    for (int i = 1; i <= RELOADS; i++) {
        snprintf(rules, sizeof rules, "  - {name: per-key, match: api_key, "
                 "limit: %d, period: 1h}\n", 10 + i);
        rl_error err;
        cr_assert_eq(rl_agent_reload(a, test_store_config("host-reload",
                                                          rules), &err),
                     RL_OK, "%s", err.message);
        cr_assert_eq(rl_agent_run(a), RL_OK);
    }
    alarm(0);
    uint64_t took = test_now_ms() - start;
    char key[96];
    fresh(key, sizeof key, "ak_reload");
    rl_attr attr = {"api_key", key, strlen(key)};
    answers w = {.host = pthread_self()};
    cr_assert_eq(rl_check_async(a, &attr, 1, 1, answered, &w), RL_OK);
    run_until(a, &w, 1, 5000);
    fprintf(stderr, "host loop: %d reloads on the loop thread in %llu ms\n",
            RELOADS, (unsigned long long)took);
    cr_expect_lt(took, RELOADS * 20, "the reloads waited on the loop");
    cr_expect_eq(w.allowed, 1);
    cr_expect_eq(w.limit, 10 + RELOADS, "the check ran under limit %llu",
                 (unsigned long long)w.limit);
    rl_agent_close(a);
}

/* --- The close runs the loop to its end. ------------------------------- */

Test(host_loop, a_close_reports_the_synced_counts_not_yet_sent)
{
    enum { CHECKS = 7 };
    test_aggregator agg;
    test_aggregator_start(&agg, NULL,
                          "  - {name: host-synced, match: tenant, "
                          "limit: 1000, period: 1h, mode: synced}\n",
                          200, NULL);
    test_aggregator_wait_ready(&agg);
    rl_agent *a = open_host_agent(agg.config);
    char tenant[96];
    fresh(tenant, sizeof tenant, "t_host");
    rl_attr attr = {"tenant", tenant, strlen(tenant)};
    for (int i = 0; i < CHECKS; i++) {
        rl_decision d;
        cr_assert_eq(rl_check_nowait(a, &attr, 1, 1, &d), RL_OK);
        cr_assert(d.allowed);
    }
    /* Not one turn of the loop before the close: it reports them. */
    rl_agent_close(a);
    char key[160];
    snprintf(key, sizeof key, "rl:tenant:%s", tenant);
    test_expect_window_total(key, CHECKS, 5000);
    test_aggregator_stop(&agg);
}
