/*
 * bench_holds.c: what a hold costs the request it holds for. The same
 * exact rule, on the same Redis, is checked at the same paced rate with
 * rl_check_async (a plain check) and with rl_check_hold, whose callback
 * ends the hold at once at another cost than its estimate, so that every
 * request also sends its commit to the store. The decision's latency
 * (from the call to its callback) must not grow: the commit goes out
 * after the decision, in a later batch of the I/O thread, never before
 * it. Also timed: rl_hold_end itself, on the callback's thread, which
 * must only queue. Then an in_flight rule's hold (a slot taken, then
 * given back) against an exact rule's, DEPTH holds kept in flight as fast
 * as they go: requests a second and store calls per request. Runs
 * alternate (plain, hold, plain, ...) so that a busy machine weighs on
 * both alike. Run by `make bench` under with-redis (RL_TEST_REDIS).
 *
 *   bench-holds [RATE]   (checks a second, 4,000 by default)
 */
#include "bench_agent.h"
#include "bench_report.h"
#include "bench_stats.h"
#include "rl.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define RUNS 5
#define KEYS 1000

typedef struct run_state run_state;

/* One request: when it was sent, for its decision's latency. */
typedef struct sent {
    run_state *run;
    double at;
} sent;

struct run_state {
    rl_agent *agent;
    bool hold;
    sent *sent;
    size_t n_sent;
    bench_latency decide_us; /* call to callback */
    bench_latency end_us;    /* rl_hold_end's own time */
    atomic_size_t decided, failed;
};

typedef struct result {
    double p50_us, p99_us, end_p50_us, end_p99_us;
    size_t failed;
} result;

static void count(run_state *r, const rl_decision *d, const sent *s)
{
    bench_latency_add(&r->decide_us, (bench_now_s() - s->at) * 1e6);
    if (d->degraded || !d->allowed)
        atomic_fetch_add(&r->failed, 1);
    atomic_fetch_add(&r->decided, 1);
}

static void on_plain(const rl_decision *d, void *arg)
{
    sent *s = arg;
    count(s->run, d, s);
}

/* Ends the hold at three times its estimate: a commit for the store. */
static void on_hold(const rl_decision *d, rl_hold *h, void *arg)
{
    sent *s = arg;
    count(s->run, d, s);
    if (h == NULL)
        return;
    double t = bench_now_s();
    if (rl_hold_end(h, 3) != RL_OK)
        atomic_fetch_add(&s->run->failed, 1);
    bench_latency_add(&s->run->end_us, (bench_now_s() - t) * 1e6);
}

static int submit(run_state *r, sent *s, size_t i)
{
    char value[16];
    int len = snprintf(value, sizeof value, "k%zu", i % KEYS);
    rl_attr attr = {"api_key", value, (size_t)len};
    s->run = r;
    s->at = bench_now_s();
    return r->hold ? rl_check_hold(r->agent, &attr, 1, 1, on_hold, s)
                   : rl_check_async(r->agent, &attr, 1, 1, on_plain, s);
}

/* Sends n requests at rate a second, then waits for their decisions. */
static void pace(run_state *r, double rate, size_t n)
{
    double start = bench_now_s();
    for (size_t i = 0; i < n; i++) {
        double due = start + (double)i / rate, now = bench_now_s();
        if (due > now)
            usleep((useconds_t)((due - now) * 1e6));
        if (submit(r, &r->sent[i], i) != RL_OK) {
            atomic_fetch_add(&r->failed, 1);
            atomic_fetch_add(&r->decided, 1);
        }
    }
    while (atomic_load(&r->decided) < n)
        usleep(1000);
}

static result one_run(rl_agent *agent, bool hold, double rate, double secs)
{
    size_t n = (size_t)(rate * secs);
    run_state r = {.agent = agent, .hold = hold, .n_sent = n};
    r.sent = calloc(n, sizeof *r.sent);
    r.decide_us = (bench_latency){calloc(n, sizeof(float)), n, 0};
    r.end_us = (bench_latency){calloc(n, sizeof(float)), n, 0};
    if (r.sent == NULL || r.decide_us.us == NULL || r.end_us.us == NULL) {
        fprintf(stderr, "bench-holds: out of memory\n");
        exit(1);
    }
    pace(&r, rate, n);
    result out = {
        .p50_us = bench_latency_percentile(&r.decide_us, 50),
        .p99_us = bench_latency_percentile(&r.decide_us, 99),
        .end_p50_us = bench_latency_percentile(&r.end_us, 50),
        .end_p99_us = bench_latency_percentile(&r.end_us, 99),
        .failed = atomic_load(&r.failed),
    };
    free(r.sent);
    free(r.decide_us.us);
    free(r.end_us.us);
    return out;
}

#define DEPTH 16

/* DEPTH holds at a time on one rule, each ended in its callback at its
 * estimate and followed by the next, until the run's end. */
typedef struct depth_run {
    rl_agent *agent;
    const char *attr;
    double end;
    atomic_size_t done, failed, next;
    atomic_int in_flight;
} depth_run;

static void depth_submit(depth_run *r);

static void on_depth(const rl_decision *d, rl_hold *h, void *arg)
{
    depth_run *r = arg;
    if (h == NULL || d->degraded || rl_hold_end(h, 1) != RL_OK)
        atomic_fetch_add(&r->failed, 1);
    atomic_fetch_add(&r->done, 1);
    if (bench_now_s() < r->end)
        depth_submit(r);
    else
        atomic_fetch_sub(&r->in_flight, 1);
}

static void depth_submit(depth_run *r)
{
    char value[16];
    size_t i = atomic_fetch_add(&r->next, 1);
    int len = snprintf(value, sizeof value, "k%zu", i % KEYS);
    rl_attr attr = {r->attr, value, (size_t)len};
    if (rl_check_hold(r->agent, &attr, 1, 1, on_depth, r) != RL_OK) {
        atomic_fetch_add(&r->failed, 1);
        atomic_fetch_sub(&r->in_flight, 1);
    }
}

typedef struct rate_result {
    double per_s, calls_per_request;
    size_t failed;
} rate_result;

static rate_result depth_once(rl_agent *agent, const char *attr, double secs)
{
    depth_run r = {.agent = agent, .attr = attr};
    uint64_t calls = test_store_calls(agent);
    double start = bench_now_s();
    r.end = start + secs;
    atomic_store(&r.in_flight, DEPTH);
    for (int i = 0; i < DEPTH; i++)
        depth_submit(&r);
    while (atomic_load(&r.in_flight) > 0)
        usleep(1000);
    double took = bench_now_s() - start;
    /* The releases and commits of the last holds leave after them. */
    usleep(100 * 1000);
    size_t done = atomic_load(&r.done);
    return (rate_result){
        .per_s = (double)done / took,
        .calls_per_request = (double)(test_store_calls(agent) - calls)
                             / (double)(done ? done : 1),
        .failed = atomic_load(&r.failed),
    };
}

static bench_summary of_rates(const rate_result *runs, size_t field)
{
    double v[RUNS];
    for (int k = 0; k < RUNS; k++)
        v[k] = *(const double *)((const char *)&runs[k] + field);
    return bench_summarize(v, RUNS);
}

static void in_flight_section(rl_agent *agent, double secs)
{
    rate_result exact[RUNS], slots[RUNS];
    depth_once(agent, "tenant", bench_quick() ? 0.1 : 0.5); /* warm up */
    for (int k = 0; k < RUNS; k++) {
        exact[k] = depth_once(agent, "api_key", secs);
        slots[k] = depth_once(agent, "tenant", secs);
    }
    printf("## in_flight: a slot against an exact rule's check\n\n"
           "The same agent, %d holds in flight as fast as they go for "
           "%.1f s over 1,000 keys, each ended at once at its estimate: "
           "*exact* holds a token of a bucket, *in_flight* a slot of a "
           "rule of 1,000,000,000 at once (taken in the check's call, "
           "given back after). Store calls per request count every call: "
           "the check's, and the releases, which leave together (min / "
           "median / max of %d runs).\n\n", DEPTH, secs, RUNS);
    printf("| rule | requests/s | store calls per request | failed |\n"
           "|---|---|---|---|\n");
    const char *names[2] = {"exact", "in_flight"};
    const rate_result *runs[2] = {exact, slots};
    bench_summary ps[2], cpr[2];
    for (int m = 0; m < 2; m++) {
        ps[m] = of_rates(runs[m], offsetof(rate_result, per_s));
        cpr[m] = of_rates(runs[m], offsetof(rate_result, calls_per_request));
        size_t failed = 0;
        for (int k = 0; k < RUNS; k++)
            failed += runs[m][k].failed;
        printf("| %s | %s / %s / %s | %.3f / %.3f / %.3f | %zu |\n",
               names[m], bench_int(ps[m].min), bench_int(ps[m].median),
               bench_int(ps[m].max), cpr[m].min, cpr[m].median, cpr[m].max,
               failed);
    }
    printf("\n");
    char rl_fig[256], other[256];
    snprintf(rl_fig, sizeof rl_fig, "in_flight: %s requests/s, %.3f store "
             "calls per request", bench_int(ps[1].median), cpr[1].median);
    snprintf(other, sizeof other, "exact hold: %s requests/s, %.3f calls",
             bench_int(ps[0].median), cpr[0].median);
    bench_figure("a slot taken and given back, 16 in flight", rl_fig, other);
    /* One call takes the slot, as an exact rule's takes its token; the
     * releases of a turn leave together, one call per shard. */
    bench_target("in_flight: store calls per request (take + release)",
                 cpr[1].median, "<=", 1.1, "calls");
}

static bench_summary of_runs(const result *runs, size_t field)
{
    double v[RUNS];
    for (int k = 0; k < RUNS; k++)
        v[k] = *(const double *)((const char *)&runs[k] + field);
    return bench_summarize(v, RUNS);
}

static void row(const char *what, const result *runs)
{
    bench_summary p50 = of_runs(runs, offsetof(result, p50_us));
    bench_summary p99 = of_runs(runs, offsetof(result, p99_us));
    size_t failed = 0;
    for (int k = 0; k < RUNS; k++)
        failed += runs[k].failed;
    printf("| %s | %.0f / %.0f / %.0f | %.0f / %.0f / %.0f | %zu |\n", what,
           p50.min, p50.median, p50.max, p99.min, p99.median, p99.max,
           failed);
}

int main(int argc, char **argv)
{
    double rate = argc > 1 ? atof(argv[1]) : 4000;
    const char *addr = getenv("RL_TEST_REDIS");
    if (addr == NULL || rate < 1 || rate > 1e6) {
        fprintf(stderr, "usage: with-redis -- bench-holds [RATE]\n");
        return 1;
    }
    const char *s = getenv("RL_BENCH_SECONDS");
    double secs = s != NULL ? atof(s) : bench_quick() ? 0.3 : 2.0;
    char yaml[512];
    int len = snprintf(yaml, sizeof yaml,
                       "store: {url: \"redis://%s\"}\n"
                       "rules:\n"
                       "  - {name: per-key, match: api_key, "
                       "limit: 1000000000, period: 1m, "
                       "key_prefix: \"bholds:\"}\n"
                       "  - {name: streams, match: tenant, "
                       "in_flight: 1000000000, key_prefix: \"bslots:\"}\n",
                       addr);
    rl_config *cfg;
    rl_agent *agent = bench_open_agent(yaml, (size_t)len, &cfg);
    one_run(agent, true, rate, bench_quick() ? 0.1 : 0.5); /* warm up */
    result plain[RUNS], held[RUNS];
    for (int k = 0; k < RUNS; k++) {
        plain[k] = one_run(agent, false, rate, secs);
        held[k] = one_run(agent, true, rate, secs);
    }
    in_flight_section(agent, secs);
    rl_agent_close(agent);
    rl_config_free(cfg);

    printf("## Holds: the commit off the request's path\n\n"
           "One agent, one exact rule, %s checks a second over 1,000 keys "
           "for %.1f s, %d runs each, alternating. *hold* checks with "
           "rl_check_hold and ends each hold in its callback at three "
           "times the estimate, so every request also commits; *plain* "
           "checks with rl_check_async. Decision latency, from the call "
           "to the callback, in microseconds (min / median / max of the "
           "runs).\n\n", bench_int(rate), secs, RUNS);
    printf("| check | p50 | p99 | failed |\n|---|---|---|---|\n");
    row("plain", plain);
    row("hold, ended at 3x", held);
    bench_summary end50 = of_runs(held, offsetof(result, end_p50_us));
    bench_summary end99 = of_runs(held, offsetof(result, end_p99_us));
    printf("\nrl_hold_end itself, on the callback's thread: p50 %.2f µs, "
           "p99 %.2f µs (medians of the runs).\n\n", end50.median,
           end99.median);

    bench_summary p99p = of_runs(plain, offsetof(result, p99_us));
    bench_summary p99h = of_runs(held, offsetof(result, p99_us));
    bench_summary p50p = of_runs(plain, offsetof(result, p50_us));
    bench_summary p50h = of_runs(held, offsetof(result, p50_us));
    char rl_fig[256], other[256];
    snprintf(rl_fig, sizeof rl_fig, "hold: p50 %.0f µs, p99 %.0f µs; "
             "rl_hold_end p99 %.2f µs", p50h.median, p99h.median,
             end99.median);
    snprintf(other, sizeof other, "plain check: p50 %.0f µs, p99 %.0f µs",
             p50p.median, p99p.median);
    bench_figure("decision latency with a commit per request", rl_fig,
                 other);
    bench_target("holds: decision p99 ÷ a plain check's p99",
                 p99h.median / p99p.median, "<=", 1.2, "x");
    bench_target("holds: rl_hold_end p99", end99.median, "<=", 20, "µs");
    return 0;
}
