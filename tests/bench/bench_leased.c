/*
 * bench_leased.c: one hot key at the highest rate this machine offers
 * through one agent (several threads checking as fast as they can), once
 * with `mode: exact` and once with `mode: leased`, on the same Redis and
 * the same bucket (1,000,000 a second, burst 1,000,000): checks a second,
 * Redis calls per 1,000 checks, and what was admitted against what the
 * bucket held (its burst plus what refilled while the run lasted).
 * Overshoot is admitted beyond that, under-admission what the bucket held
 * that was not admitted although more was offered. Run by `make bench`
 * under with-redis (RL_TEST_REDIS).
 *
 *   bench-leased [THREADS]   (4 by default)
 */
#include "bench_agent.h"
#include "bench_report.h"
#include "bench_stats.h"
#include "rl.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RUNS 3
#define LIMIT 1000000.0 /* per second, and the burst */

typedef struct hammer {
    rl_agent *agent;
    const char *key;
    double until;
    atomic_uint_least64_t checks, allowed, failed;
} hammer;

static void *hammer_run(void *arg)
{
    hammer *h = arg;
    rl_attr attr = {"api_key", h->key, strlen(h->key)};
    uint64_t checks = 0, allowed = 0, failed = 0;
    while (bench_now_s() < h->until) {
        for (int i = 0; i < 64; i++) {
            rl_decision d;
            if (rl_check(h->agent, &attr, 1, 1, &d) != RL_OK || d.degraded)
                failed++;
            else
                allowed += d.allowed;
        }
        checks += 64;
    }
    atomic_fetch_add(&h->checks, checks);
    atomic_fetch_add(&h->allowed, allowed);
    atomic_fetch_add(&h->failed, failed);
    return NULL;
}

typedef struct run {
    double checks_per_s, calls_per_1000, admitted, held, overshoot, under;
    uint64_t failed;
} run;

static run one_run(const char *addr, const char *mode, int threads,
                   double seconds, int index)
{
    char yaml[512];
    int n = snprintf(yaml, sizeof yaml,
                     "store: {url: \"redis://%s\", timeout_ms: 1000}\n"
                     "rules:\n"
                     "  - {name: hot, match: api_key, limit: %.0f, "
                     "period: 1s, mode: %s}\n", addr, LIMIT, mode);
    rl_config *cfg;
    rl_agent *agent = bench_open_agent(yaml, (size_t)n, &cfg);
    char key[64];
    snprintf(key, sizeof key, "hot-%s-%d-%.0f", mode, index,
             bench_now_s() * 1e6);
    /* The connection and the scripts first, on another key. */
    rl_attr warm = {"api_key", "warm-up", 7};
    rl_decision d;
    rl_check(agent, &warm, 1, 1, &d);
    uint64_t calls_before = test_store_calls(agent);
    pthread_t t[64];
    double start = bench_now_s();
    hammer h = {.agent = agent, .key = key, .until = start + seconds};
    for (int i = 0; i < threads; i++)
        pthread_create(&t[i], NULL, hammer_run, &h);
    for (int i = 0; i < threads; i++)
        pthread_join(t[i], NULL);
    double elapsed = bench_now_s() - start;
    uint64_t calls = test_store_calls(agent) - calls_before;
    rl_agent_close(agent);
    rl_config_free(cfg);
    double checks = (double)atomic_load(&h.checks);
    double admitted = (double)atomic_load(&h.allowed);
    /* What the bucket held for the run: full at the start, refilling at
     * LIMIT a second from the first check to the last. */
    double held = LIMIT + LIMIT * elapsed;
    bool offered_beyond = checks > held;
    run r = {.checks_per_s = checks / elapsed,
             .calls_per_1000 = (double)calls * 1000 / checks,
             .admitted = admitted, .held = held,
             .overshoot = admitted > held ? admitted - held : 0,
             .under = offered_beyond && admitted < held
                          ? (held - admitted) / held : 0,
             .failed = atomic_load(&h.failed)};
    return r;
}

static const char *fmt(double v, const char *f)
{
    static char bufs[8][32];
    static int next;
    char *b = bufs[next++ % 8];
    snprintf(b, 32, f, v);
    return b;
}

int main(int argc, char **argv)
{
    int threads = argc > 1 ? atoi(argv[1]) : 4;
    const char *addr = getenv("RL_TEST_REDIS");
    if (addr == NULL || threads < 1 || threads > 64) {
        fprintf(stderr, "usage: with-redis -- bench-leased [THREADS]\n");
        return 1;
    }
    const char *s = getenv("RL_BENCH_SECONDS");
    double seconds = s != NULL ? atof(s) : bench_quick() ? 0.3 : 2.0;
    const char *modes[2] = {"exact", "leased"};
    run runs[2][RUNS];
    for (int k = 0; k < RUNS; k++)
        for (int m = 0; m < 2; m++)
            runs[m][k] = one_run(addr, modes[m], threads, seconds, k);
    printf("## One hot key: exact against leased\n\n"
           "One agent, %d threads checking one key as fast as they can for "
           "%.1f s, %d runs each; the rule is 1,000,000 a second with a "
           "burst of 1,000,000, on one redis-server. *Held* is what the "
           "bucket held for the run (its burst plus the refill); overshoot "
           "is admitted beyond it, under-admission the part of it not "
           "admitted while more was offered (min / median / max).\n\n",
           threads, seconds, RUNS);
    printf("| mode | checks/s | Redis calls per 1,000 checks | admitted | "
           "held | overshoot | under-admission | failed |\n"
           "|---|---|---|---|---|---|---|---|\n");
    bench_summary cps[2], cpk[2], over[2], under[2];
    for (int m = 0; m < 2; m++) {
        double v[RUNS];
        uint64_t failed = 0;
        double adm = 0, held = 0;
#define SUM(field, out)                                                     \
        for (int k = 0; k < RUNS; k++)                                     \
            v[k] = runs[m][k].field;                                       \
        out = bench_summarize(v, RUNS)
        SUM(checks_per_s, cps[m]);
        SUM(calls_per_1000, cpk[m]);
        SUM(overshoot, over[m]);
        SUM(under, under[m]);
        for (int k = 0; k < RUNS; k++) {
            failed += runs[m][k].failed;
            adm += runs[m][k].admitted;
            held += runs[m][k].held;
        }
        printf("| %s | %s / %s / %s | %s / %s / %s | %s | %s | %s | "
               "%s %% / %s %% / %s %% | %llu |\n", modes[m],
               bench_int(cps[m].min), bench_int(cps[m].median),
               bench_int(cps[m].max), fmt(cpk[m].min, "%.4f"),
               fmt(cpk[m].median, "%.4f"), fmt(cpk[m].max, "%.4f"),
               bench_int(adm / RUNS), bench_int(held / RUNS),
               bench_int(over[m].max), fmt(100 * under[m].min, "%.1f"),
               fmt(100 * under[m].median, "%.1f"),
               fmt(100 * under[m].max, "%.1f"), (unsigned long long)failed);
    }
    printf("\n");
    double ratio = cps[1].median / cps[0].median;
    char rl_fig[256], other[256];
    snprintf(rl_fig, sizeof rl_fig, "leased: %s checks/s, %s Redis calls "
             "per 1,000 checks, overshoot %s, under-admission %s %%",
             bench_int(cps[1].median), fmt(cpk[1].median, "%.4f"),
             bench_int(over[1].max), fmt(100 * under[1].median, "%.1f"));
    snprintf(other, sizeof other, "exact: %s checks/s, %s calls per 1,000 "
             "checks", bench_int(cps[0].median), fmt(cpk[0].median, "%.0f"));
    bench_figure("one hot key, one agent, as fast as it goes", rl_fig, other);
    bench_target("leased: Redis calls per 100 checks, one hot key",
                 cpk[1].median / 10, "<=", 1, "calls");
    bench_target("leased checks/s ÷ exact checks/s, one hot key", ratio,
                 ">=", 10, "x");
    bench_target("leased: overshoot beyond burst + refill (worst run)",
                 over[1].max, "<=", 0, "requests");
    return 0;
}
