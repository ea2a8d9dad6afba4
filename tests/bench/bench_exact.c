/*
 * bench_exact.c: what an exact check costs, side by side with what it is
 * measured against, in one run on one redis-server (the machines are shared
 * and noisy: only ratios within a run mean much). Run by `make bench`.
 *
 * For 1, 16 and 64 requests in flight, one rule and three rules each,
 * 10,000 keys per rule, 100 per minute:
 *   - rl_check_async, the requests in flight kept by resubmitting from the
 *     callback (one caller, like an event-loop gateway);
 *   - rl_check from as many threads as requests in flight;
 *   - the ceiling: rl's own function from a bare pipelined hiredis loop;
 *   - the seed's script verbatim (EVALSHA, hash bucket), same loop;
 *   - rate-limiter-flexible (Node.js, ioredis), same depth.
 * Then server time per call and bytes per key for each, and the seed's
 * rejected alternatives (bench_alternatives.c).
 */
#include "bench_agent.h"
#include "bench_alternatives.h"
#include "bench_peer.h"
#include "bench_pipeline.h"
#include "bench_redis.h"
#include "rl.h"
#include "scripts.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define RUNS 3
#define FILL_KEYS 100000
#define LATENCY_CAP (1 << 22)

enum { RL_ASYNC, RL_THREADS, CEILING, SEED, PEER, SYSTEMS };
static const char *const system_names[SYSTEMS] = {
    "rl_check_async (one caller)", "rl_check (one thread per request)",
    "ceiling: rl's function, pipelined hiredis",
    "seed's script, pipelined hiredis", "rate-limiter-flexible (ioredis)"};

static const int depths[] = {1, 16, 64};
#define DEPTHS 3
static const int rule_counts[] = {1, 3};

static bench_result results[SYSTEMS][2][DEPTHS][RUNS];
static bench_latency latency;
static const char *addr;
/* Seconds per figure per run: RL_BENCH_SECONDS, 2 by default. */
static double run_seconds = 2.0;

/* --- rl ------------------------------------------------------------------ */

static const char *const attr_names[BENCH_RULES_MAX] = {"api_key", "ip",
                                                        "tenant"};

static rl_agent *open_agent(const char *algorithm, rl_config **cfg)
{
    char yaml[1024];
    int n = snprintf(yaml, sizeof yaml,
                     "store: {url: \"redis://%s\", timeout_ms: 2000}\n"
                     "rules:\n", addr);
    static const char *const prefixes[] = {"rl:key:", "rl:ip:", "rl:tenant:"};
    for (int i = 0; i < BENCH_RULES_MAX; i++)
        n += snprintf(yaml + n, sizeof yaml - (size_t)n,
                      "  - {name: r%d, match: %s, key_prefix: \"%s\", "
                      "limit: 100, period: 1m, algorithm: %s}\n",
                      i, attr_names[i], prefixes[i], algorithm);
    return bench_open_agent(yaml, (size_t)n, cfg);
}

/* One request's attributes, random values, into the caller's storage. */
typedef struct request {
    char values[BENCH_RULES_MAX][16];
    rl_attr attrs[BENCH_RULES_MAX];
} request;

static void make_request(request *r, int rules, unsigned *seed)
{
    for (int i = 0; i < rules; i++) {
        int len = snprintf(r->values[i], sizeof r->values[i], "k%d",
                           rand_r(seed) % BENCH_KEYS);
        r->attrs[i] = (rl_attr){attr_names[i], r->values[i], (size_t)len};
    }
}

typedef struct rl_load {
    rl_agent *agent;
    int rules;
    double end;
    atomic_long done;
    atomic_long failed;
    atomic_int in_flight;
} rl_load;

typedef struct async_slot {
    rl_load *load;
    unsigned seed;
    double started;
} async_slot;

static void on_decision(const rl_decision *d, void *arg);

static void submit(async_slot *s)
{
    request r;
    make_request(&r, s->load->rules, &s->seed);
    s->started = bench_now_s();
    if (rl_check_async(s->load->agent, r.attrs, (size_t)s->load->rules, 1,
                       on_decision, s) != RL_OK) {
        atomic_fetch_add(&s->load->failed, 1);
        atomic_fetch_sub(&s->load->in_flight, 1);
    }
}

/* On the agent's I/O thread: count, then keep the depth. */
static void on_decision(const rl_decision *d, void *arg)
{
    async_slot *s = arg;
    double now = bench_now_s();
    if (d->degraded)
        atomic_fetch_add(&s->load->failed, 1);
    if (now < s->load->end) {
        bench_latency_add(&latency, (now - s->started) * 1e6);
        atomic_fetch_add(&s->load->done, 1);
        submit(s);
    } else {
        atomic_fetch_sub(&s->load->in_flight, 1);
    }
}

static void report_failed(rl_load *l)
{
    if (atomic_load(&l->failed) > 0)
        fprintf(stderr, "bench: %ld checks failed or degraded\n",
                atomic_load(&l->failed));
}

static bench_result finish(rl_load *l, double start)
{
    report_failed(l);
    return (bench_result){
        .rate = (double)atomic_load(&l->done) / (l->end - start),
        .p50_us = bench_latency_percentile(&latency, 50),
        .p99_us = bench_latency_percentile(&latency, 99),
        .errors = atomic_load(&l->failed)};
}

/* A run of run_seconds from now; returns its start. */
static double begin_run(rl_load *l, rl_agent *agent, int rules)
{
    *l = (rl_load){.agent = agent, .rules = rules};
    atomic_store(&latency.n, 0);
    double start = bench_now_s();
    l->end = start + run_seconds;
    return start;
}

static bench_result rl_async(rl_agent *agent, int depth, int rules)
{
    rl_load l;
    async_slot slots[64];
    double start = begin_run(&l, agent, rules);
    atomic_store(&l.in_flight, depth);
    for (int i = 0; i < depth; i++) {
        slots[i] = (async_slot){.load = &l, .seed = (unsigned)i + 1};
        submit(&slots[i]);
    }
    while (atomic_load(&l.in_flight) > 0)
        usleep(1000);
    return finish(&l, start);
}

static void *checker(void *arg)
{
    rl_load *l = arg;
    unsigned seed = (unsigned)(uintptr_t)&seed;
    for (;;) {
        request r;
        make_request(&r, l->rules, &seed);
        double t = bench_now_s();
        rl_decision d;
        if (rl_check(l->agent, r.attrs, (size_t)l->rules, 1, &d) != RL_OK
            || d.degraded)
            atomic_fetch_add(&l->failed, 1);
        double now = bench_now_s();
        if (now >= l->end)
            return NULL;
        bench_latency_add(&latency, (now - t) * 1e6);
        atomic_fetch_add_explicit(&l->done, 1, memory_order_relaxed);
    }
}

static bench_result rl_threads(rl_agent *agent, int depth, int rules)
{
    rl_load l;
    pthread_t t[64];
    double start = begin_run(&l, agent, rules);
    for (int i = 0; i < depth; i++)
        pthread_create(&t[i], NULL, checker, &l);
    for (int i = 0; i < depth; i++)
        pthread_join(t[i], NULL);
    return finish(&l, start);
}

/* --- the matrix ---------------------------------------------------------- */

static bench_result pipelined(const bench_script *s, int depth, int rules)
{
    bench_load load = {.depth = depth, .rules = rules,
                       .seconds = run_seconds, .period_ms = 60000};
    atomic_store(&latency.n, 0);
    bench_result r = bench_pipeline(addr, s, &load, &latency);
    if (r.errors > 0)
        fprintf(stderr, "bench: %ld errors from %s\n", r.errors, s->name);
    return r;
}

static void measure_matrix(redisContext *c, rl_agent *agent,
                           const bench_script *ceiling,
                           const bench_script *seed)
{
    /* Runs are interleaved, so that a noisy moment hits every system. */
    for (int run = 0; run < RUNS; run++) {
        for (int ri = 0; ri < 2; ri++) {
            for (int di = 0; di < DEPTHS; di++) {
                int d = depths[di], n = rule_counts[ri];
                bench_result *at[SYSTEMS];
                for (int sys = 0; sys < SYSTEMS; sys++)
                    at[sys] = &results[sys][ri][di][run];
                bench_run(c, "FLUSHALL");
                *at[RL_ASYNC] = rl_async(agent, d, n);
                bench_run(c, "FLUSHALL");
                *at[RL_THREADS] = rl_threads(agent, d, n);
                bench_run(c, "FLUSHALL");
                *at[CEILING] = pipelined(ceiling, d, n);
                bench_run(c, "FLUSHALL");
                *at[SEED] = pipelined(seed, d, n);
                bench_run(c, "FLUSHALL");
                if (bench_peer_available())
                    *at[PEER] = bench_peer_run(addr, d, n, run_seconds);
            }
        }
    }
}

/* --- output -------------------------------------------------------------- */

typedef double (*figure_fn)(const bench_result *);
static double rate_of(const bench_result *r) { return r->rate; }
static double p50_of(const bench_result *r) { return r->p50_us; }
static double p99_of(const bench_result *r) { return r->p99_us; }

static bench_summary summary(int sys, int ri, int di, figure_fn f)
{
    double v[RUNS];
    for (int run = 0; run < RUNS; run++)
        v[run] = f(&results[sys][ri][di][run]);
    return bench_summarize(v, RUNS);
}

/* a / b per run, summarized: the ratio within each run. */
static bench_summary ratio(int a, int b, int ri, int di, figure_fn f)
{
    double v[RUNS];
    for (int run = 0; run < RUNS; run++) {
        double den = f(&results[b][ri][di][run]);
        v[run] = den > 0 ? f(&results[a][ri][di][run]) / den : 0;
    }
    return bench_summarize(v, RUNS);
}

static int systems_shown(void)
{
    return bench_peer_available() ? SYSTEMS : PEER;
}

static void print_matrix(void)
{
    for (int ri = 0; ri < 2; ri++) {
        printf("\n### %d rule%s per request\n\n"
               "| client | in flight | requests/s min | median | max "
               "| p50 µs (median run) | p99 µs (median run) |\n"
               "|---|---|---|---|---|---|---|\n", rule_counts[ri],
               rule_counts[ri] > 1 ? "s" : "");
        for (int sys = 0; sys < systems_shown(); sys++) {
            for (int di = 0; di < DEPTHS; di++) {
                bench_summary r = summary(sys, ri, di, rate_of);
                printf("| %s | %d | %.0f | %.0f | %.0f | %.0f | %.0f |\n",
                       system_names[sys], depths[di], r.min, r.median, r.max,
                       summary(sys, ri, di, p50_of).median,
                       summary(sys, ri, di, p99_of).median);
            }
        }
    }
}

static void print_ratio_row(const char *what, int a, int b, figure_fn f)
{
    for (int ri = 0; ri < 2; ri++) {
        for (int di = 0; di < DEPTHS; di++) {
            bench_summary r = ratio(a, b, ri, di, f);
            printf("| %s | %d | %d | %.2f | %.2f | %.2f |\n", what,
                   rule_counts[ri], depths[di], r.min, r.median, r.max);
        }
    }
}

static void print_ratios(void)
{
    printf("\n### Ratios within each run\n\n"
           "| ratio | rules | in flight | min | median | max |\n"
           "|---|---|---|---|---|---|\n");
    print_ratio_row("rl_check_async / ceiling, requests/s", RL_ASYNC,
                    CEILING, rate_of);
    print_ratio_row("rl_check threads / ceiling, requests/s", RL_THREADS,
                    CEILING, rate_of);
    print_ratio_row("seed's script / ceiling, requests/s", SEED, CEILING,
                    rate_of);
    if (!bench_peer_available())
        return;
    print_ratio_row("rl_check_async / rate-limiter-flexible, requests/s",
                    RL_ASYNC, PEER, rate_of);
    print_ratio_row("rl_check_async / rate-limiter-flexible, p99", RL_ASYNC,
                    PEER, p99_of);
}

/* Plot data: one line per depth, medians, one rule. */
static void write_plot_data(void)
{
    const char *dir = getenv("RL_BENCH_OUT");
    char path[512];
    snprintf(path, sizeof path, "%s/exact.dat", dir != NULL ? dir : ".");
    FILE *f = fopen(path, "w");
    if (f == NULL)
        return;
    fprintf(f, "# in_flight, then per client (rl async, rl threads, "
               "ceiling, seed, rate-limiter-flexible): requests/s, p99 µs\n");
    for (int di = 0; di < DEPTHS; di++) {
        fprintf(f, "%d", depths[di]);
        for (int sys = 0; sys < SYSTEMS; sys++)
            fprintf(f, " %.0f %.0f", summary(sys, 0, di, rate_of).median,
                    summary(sys, 0, di, p99_of).median);
        fprintf(f, "\n");
    }
    fclose(f);
}

static void target(const char *what, double value, double limit, bool above)
{
    bool met = above ? value >= limit : value <= limit;
    printf("| %s | %.2f | %s %.2f | %s |\n", what, value, above ? "≥" : "≤",
           limit, met ? "met" : "**missed**");
}

/* --- server cost and memory ---------------------------------------------- */

typedef struct cost {
    double usec;
    long long key_bytes, per_key;
} cost;

#define SCRIPTS 4
/* Runs are interleaved like the matrix's; the server's own clock around a
 * call also counts the time another process had the CPU (and page faults
 * as a fill grows the heap), so the minimum of the runs is the closest to
 * the script's cost: five runs, as the median of three moved by 20 %
 * between two reports. */
#define COST_RUNS 5
static cost costs[SCRIPTS][COST_RUNS];
static const char *const cost_names[SCRIPTS] = {
    "rl bucket (FCALL), 100 per day: a whole-ms interval",
    "rl bucket (FCALL), 100 per 86,400,001 ms: a fractional interval",
    "seed's script (EVALSHA, hash)", "rate-limiter-flexible (EVALSHA)"};

/* FILL_KEYS new keys, each checked twice (once new, once existing). */
static cost measure_cost(redisContext *c, const bench_script *s,
                         long period_ms)
{
    bench_run(c, "FLUSHALL");
    bench_run(c, "CONFIG RESETSTAT");
    long long before = bench_info(c, "memory", "used_memory:");
    if (s != NULL) {
        bench_load load = {.depth = 64, .rules = 1, .requests = FILL_KEYS,
                           .period_ms = period_ms};
        bench_pipeline(addr, s, &load, NULL);
        bench_pipeline(addr, s, &load, NULL);
    } else {
        bench_peer_fill(addr, FILL_KEYS);
    }
    cost out = {.usec = bench_script_usec_per_call(c)};
    long long after = bench_info(c, "memory", "used_memory:");
    out.per_key = (after - before) / FILL_KEYS;
    char key[64];
    bench_key(key, sizeof key, 0, 1);
    redisReply *r = bench_command(c, "MEMORY USAGE %s", key);
    out.key_bytes = r->type == REDIS_REPLY_INTEGER ? r->integer : -1;
    freeReplyObject(r);
    bench_run(c, "FLUSHALL");
    return out;
}

static void print_costs(void)
{
    printf("\n### Server cost and memory (%d keys, each checked twice; "
           "%d runs)\n\n"
           "| script | server µs per call, min / median / max (INFO "
           "commandstats) | MEMORY "
           "USAGE of one key | used_memory per key |\n|---|---|---|---|\n",
           FILL_KEYS, COST_RUNS);
    for (int i = 0; i < SCRIPTS; i++) {
        if (i == 3 && !bench_peer_available())
            continue;
        double usec[COST_RUNS];
        for (int run = 0; run < COST_RUNS; run++)
            usec[run] = costs[i][run].usec;
        bench_summary u = bench_summarize(usec, COST_RUNS);
        printf("| %s | %.2f / %.2f / %.2f | %lld | %lld |\n", cost_names[i],
               u.min, u.median, u.max, costs[i][0].key_bytes,
               costs[i][0].per_key);
    }
}

/* rl's bucket (token_bucket and gcra alike) at a whole-ms interval / the
 * seed's script, server µs, the run with the lowest (least disturbed) of
 * each. */
static double cost_ratio(void)
{
    double rl[COST_RUNS], seed[COST_RUNS];
    for (int run = 0; run < COST_RUNS; run++) {
        rl[run] = costs[0][run].usec;
        seed[run] = costs[2][run].usec;
    }
    return bench_summarize(rl, COST_RUNS).min
           / bench_summarize(seed, COST_RUNS).min;
}

static void print_targets(void)
{
    printf("\n### Targets (medians of the per-run ratios; server cost: the lowest of the runs)\n\n"
           "| target | measured | wanted | |\n|---|---|---|---|\n");
    if (bench_peer_available()) {
        target("rl_check_async / rate-limiter-flexible, requests/s, 64 in "
               "flight, 1 rule", ratio(RL_ASYNC, PEER, 0, 2, rate_of).median,
               1.5, true);
        target("rl_check_async / rate-limiter-flexible, p99, 64 in flight, "
               "1 rule", ratio(RL_ASYNC, PEER, 0, 2, p99_of).median, 0.5,
               false);
    }
    target("rl_check_async / ceiling, requests/s, 64 in flight, 1 rule",
           ratio(RL_ASYNC, CEILING, 0, 2, rate_of).median, 0.9, true);
    target("rl bucket / seed's script, server µs per call",
           cost_ratio(), 0.5, false);
}

int main(void)
{
    addr = getenv("RL_TEST_REDIS");
    if (addr == NULL) {
        fprintf(stderr, "bench: run through `make bench`\n");
        return 1;
    }
    const char *secs = getenv("RL_BENCH_SECONDS");
    if (secs != NULL && atof(secs) > 0)
        run_seconds = atof(secs);
    latency.cap = LATENCY_CAP;
    latency.us = malloc(LATENCY_CAP * sizeof *latency.us);
    redisContext *c = bench_connect(addr);
    rl_config *cfg;
    rl_agent *agent = open_agent("token_bucket", &cfg);
    rl_async(agent, 16, 3); /* warm-up: connect, load the library */
    bench_script ceiling = {.command = "FCALL"}, seed;
    snprintf(ceiling.name, sizeof ceiling.name, "%s", RL_FUNCTION_BUCKET);
    bench_seed_script(c, &seed);
    measure_matrix(c, agent, &ceiling, &seed);
    for (int run = 0; run < COST_RUNS; run++) {
        costs[0][run] = measure_cost(c, &ceiling, 86400000);
        costs[1][run] = measure_cost(c, &ceiling, 86400001);
        costs[2][run] = measure_cost(c, &seed, 86400000);
        if (bench_peer_available())
            costs[3][run] = measure_cost(c, NULL, 0);
    }

    printf("## Exact path (%d runs of %.0f s per figure, %d keys per rule, "
           "100 per minute)\n", RUNS, run_seconds, BENCH_KEYS);
    print_matrix();
    print_ratios();
    print_costs();
    bench_alternatives(addr);
    print_targets();
    write_plot_data();
    rl_agent_close(agent);
    rl_config_free(cfg);
    redisFree(c);
    free(latency.us);
    return 0;
}
