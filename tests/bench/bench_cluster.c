/*
 * bench_cluster.c: exact checks with three rules per request on one
 * redis-server and on a 3-primary cluster on the same machine, in the same
 * run (only ratios mean much on a shared machine), and what
 * store.wait_replicas: 1 costs in latency. Run by `make bench` under
 * with-redis --cluster.
 */
#include "bench_agent.h"
#include "bench_report.h"
#include "bench_stats.h"
#include "rl.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define KEYS 10000
#define RUNS 3
#define THREADS 64
#define LATENCY_SAMPLES 2000

static double run_seconds = 2.0; /* 0.5 in a quick run */

static const char rules[] =
    "rules:\n"
    "  - {name: per-ip, match: ip, limit: 1000000, period: 1m}\n"
    "  - {name: per-key, match: api_key, limit: 1000000, period: 1m}\n"
    "  - {name: per-tenant, match: tenant, limit: 1000000, period: 1m}\n";

/* store: "url: ..." or "cluster: [...]", plus extra fields. */
static rl_agent *open_agent(const char *store, rl_config **cfg)
{
    char yaml[2048];
    int n = snprintf(yaml, sizeof yaml, "store: {%s, timeout_ms: 1000}\n%s",
                     store, rules);
    return bench_open_agent(yaml, (size_t)n, cfg);
}

/* One request's three attributes, each from its own 10,000 values. */
static int check(rl_agent *agent, unsigned *seed)
{
    char ip[24], key[24], tenant[24];
    int a = snprintf(ip, sizeof ip, "10.0.%d", rand_r(seed) % KEYS);
    int b = snprintf(key, sizeof key, "ak_%d", rand_r(seed) % KEYS);
    int c = snprintf(tenant, sizeof tenant, "org_%d", rand_r(seed) % KEYS);
    rl_attr attrs[] = {{"ip", ip, (size_t)a},
                       {"api_key", key, (size_t)b},
                       {"tenant", tenant, (size_t)c}};
    rl_decision d;
    return rl_check(agent, attrs, 3, 1, &d) == RL_OK && !d.degraded ? 0 : 1;
}

struct load {
    rl_agent *agent;
    atomic_bool stop;
    atomic_long checks, failed;
};

static void *checker(void *arg)
{
    struct load *l = arg;
    unsigned seed = (unsigned)(uintptr_t)&seed;
    long n = 0, failed = 0;
    while (!atomic_load_explicit(&l->stop, memory_order_relaxed)) {
        failed += check(l->agent, &seed);
        n++;
    }
    atomic_fetch_add(&l->checks, n);
    atomic_fetch_add(&l->failed, failed);
    return NULL;
}

static double rate(rl_agent *agent)
{
    struct load l = {.agent = agent};
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++)
        pthread_create(&t[i], NULL, checker, &l);
    double start = bench_now_s();
    struct timespec run = {(time_t)run_seconds,
                           (long)((run_seconds - (double)(time_t)run_seconds)
                                  * 1e9)};
    nanosleep(&run, NULL);
    atomic_store(&l.stop, true);
    for (int i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
    double elapsed = bench_now_s() - start;
    if (atomic_load(&l.failed) > 0)
        fprintf(stderr, "bench: %ld checks failed or degraded\n",
                atomic_load(&l.failed));
    return (double)atomic_load(&l.checks) / elapsed;
}

/* p50 and p99 of one thread's checks, in microseconds. */
static void latency(rl_agent *agent, double *p50, double *p99)
{
    static double us[LATENCY_SAMPLES];
    unsigned seed = 7;
    int failed = 0;
    for (int i = 0; i < LATENCY_SAMPLES; i++) {
        double t0 = bench_now_s();
        failed += check(agent, &seed);
        us[i] = (bench_now_s() - t0) * 1e6;
    }
    if (failed > 0)
        fprintf(stderr, "bench: %d checks failed or degraded\n", failed);
    qsort(us, LATENCY_SAMPLES, sizeof us[0], bench_cmp_double);
    *p50 = us[LATENCY_SAMPLES / 2];
    *p99 = us[LATENCY_SAMPLES * 99 / 100];
}

static void report(const char *what, const double *runs)
{
    bench_summary s = bench_summarize(runs, RUNS);
    printf("| %s | %.0f | %.0f | %.0f |\n", what, s.min, s.median, s.max);
}

int main(void)
{
    const char *single = getenv("RL_TEST_REDIS");
    const char *seeds = getenv("RL_TEST_CLUSTER");
    if (single == NULL || seeds == NULL) {
        fprintf(stderr, "bench: run through `make bench`\n");
        return 1;
    }
    char url[128], cluster[600] = "cluster: [", waited[700];
    if (bench_quick())
        run_seconds = 0.5;
    snprintf(url, sizeof url, "url: \"redis://%s\"", single);
    for (const char *p = seeds; *p; p++) {
        size_t len = strlen(cluster);
        if (*p == ',')
            snprintf(cluster + len, sizeof cluster - len, ", ");
        else
            snprintf(cluster + len, sizeof cluster - len, "%c", *p);
    }
    strcat(cluster, "]");
    snprintf(waited, sizeof waited, "%s, wait_replicas: 1", cluster);

    rl_config *cfg[3];
    rl_agent *one = open_agent(url, &cfg[0]);
    rl_agent *many = open_agent(cluster, &cfg[1]);
    rl_agent *wait = open_agent(waited, &cfg[2]);
    rate(one); /* warm-up: connect, read the map, load the scripts */
    rate(many);
    double r1[RUNS], r3[RUNS], ratio[RUNS], p50[3][RUNS], p99[3][RUNS];
    for (int i = 0; i < RUNS; i++) {
        r1[i] = rate(one);
        r3[i] = rate(many);
        ratio[i] = r3[i] / r1[i];
        latency(one, &p50[0][i], &p99[0][i]);
        latency(many, &p50[1][i], &p99[1][i]);
        latency(wait, &p50[2][i], &p99[2][i]);
    }
    printf("## Cluster (%d runs of %.1f s, %d threads, three rules per "
           "request, %d values each)\n\n", RUNS, run_seconds, THREADS, KEYS);
    printf("| checks per second | min | median | max |\n|---|---|---|---|\n");
    report("one redis-server", r1);
    report("3-primary cluster", r3);
    bench_summary q = bench_summarize(ratio, RUNS);
    printf("| cluster / one server (same run) | %.2f | %.2f | %.2f |\n",
           q.min, q.median, q.max);
    char rl[128];
    snprintf(rl, sizeof rl, "%s / %s checks/s (%.2f×)",
             bench_int(bench_summarize(r3, RUNS).median),
             bench_int(bench_summarize(r1, RUNS).median), q.median);
    bench_figure("three rules, 64 threads, 3-primary cluster / one server",
                 rl, "");
    printf("\n| one thread, microseconds | p50 (median of runs) | p99 "
           "(median of runs) |\n|---|---|---|\n");
    const char *names[] = {"one redis-server", "3-primary cluster",
                           "cluster, wait_replicas: 1"};
    for (int k = 0; k < 3; k++) {
        qsort(p50[k], RUNS, sizeof p50[k][0], bench_cmp_double);
        qsort(p99[k], RUNS, sizeof p99[k][0], bench_cmp_double);
        printf("| %s | %.0f | %.0f |\n", names[k], p50[k][RUNS / 2],
               p99[k][RUNS / 2]);
    }
    for (int k = 0; k < 3; k++) {
        rl_agent_close(k == 0 ? one : k == 1 ? many : wait);
        rl_config_free(cfg[k]);
    }
    return 0;
}
