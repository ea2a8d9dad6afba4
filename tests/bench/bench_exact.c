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
 *   - rl's own function from a plain pipelined hiredis loop (one
 *     redisAppendCommand per call, the same depth): a simple client, not
 *     a bound;
 *   - the seed's script verbatim (EVALSHA, hash bucket), same loop;
 *   - rate-limiter-flexible (Node.js, ioredis), same depth.
 * Then rl_check_async at redis-benchmark's depth (256 calls outstanding)
 * against redis-benchmark on rl's function, and Redis's own capacity for
 * it on this machine (bench_capacity.c), with rl_check_async's CPU on
 * both sides beside it;
 * server time per call and bytes per key for each script, and the seed's
 * rejected alternatives (bench_alternatives.c). And the same checks over
 * TLS (rediss://) to the same server, whose TLS port is turned on for it
 * (CONFIG SET), against plain in the same runs, redis-benchmark --tls
 * beside them.
 */
#include "bench_agent.h"
#include "bench_alternatives.h"
#include "bench_capacity.h"
#include "bench_peer.h"
#include "bench_pipeline.h"
#include "bench_redis.h"
#include "bench_report.h"
#include "rl.h"
#include "scripts.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define RUNS 3
#define LATENCY_CAP (1 << 22)
/* Calls outstanding in `redis-benchmark -c 4 -P 64`: the targets that
 * compare rl with it do so at its depth. */
#define SAME_DEPTH 256

enum { RL_ASYNC, RL_THREADS, PLAIN, SEED, PEER, SYSTEMS };
static const char *const system_names[SYSTEMS] = {
    "rl_check_async (one caller)", "rl_check (one thread per request)",
    "rl's function, plain pipelined hiredis loop (not a bound)",
    "seed's script, plain pipelined hiredis loop",
    "rate-limiter-flexible (ioredis)"};

static const int depths[] = {1, 16, 64};
#define DEPTHS 3
static const int rule_counts[] = {1, 3};

static bench_result results[SYSTEMS][2][DEPTHS][RUNS];
static bench_latency latency;
static const char *addr;
static redisContext *ctl; /* FLUSHALL, INFO: never a load's connection */
/* Seconds per figure per run: RL_BENCH_SECONDS, 2 by default. */
static double run_seconds = 2.0;
/* Keys for the server cost and memory: fewer in a quick run. */
static long fill_keys = 100000;

/* --- rl ------------------------------------------------------------------ */

static const char *const attr_names[BENCH_RULES_MAX] = {"api_key", "ip",
                                                        "tenant"};

/* An agent with three rules on store (a YAML mapping). */
static rl_agent *open_agent_on(const char *store, const char *algorithm,
                               rl_config **cfg)
{
    char yaml[2048];
    int n = snprintf(yaml, sizeof yaml, "store: %s\nrules:\n", store);
    static const char *const prefixes[] = {"rl:key:", "rl:ip:", "rl:tenant:"};
    for (int i = 0; i < BENCH_RULES_MAX; i++)
        n += snprintf(yaml + n, sizeof yaml - (size_t)n,
                      "  - {name: r%d, match: %s, key_prefix: \"%s\", "
                      "limit: 100, period: 1m, algorithm: %s}\n",
                      i, attr_names[i], prefixes[i], algorithm);
    return bench_open_agent(yaml, (size_t)n, cfg);
}

static rl_agent *open_agent(const char *algorithm, rl_config **cfg)
{
    char store[256];
    snprintf(store, sizeof store, "{url: \"redis://%s\", timeout_ms: 2000}",
             addr);
    return open_agent_on(store, algorithm, cfg);
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

/* acc, when not NULL: the run's CPU on both sides (the agent's is the
 * whole process's: its I/O thread does the work). */
static bench_result rl_async(rl_agent *agent, int depth, int rules,
                             bench_account *acc)
{
    rl_load l;
    async_slot slots[SAME_DEPTH];
    bench_meter m;
    if (acc != NULL)
        bench_meter_start(&m, ctl, CLOCK_PROCESS_CPUTIME_ID);
    double start = begin_run(&l, agent, rules);
    atomic_store(&l.in_flight, depth);
    for (int i = 0; i < depth; i++) {
        slots[i] = (async_slot){.load = &l, .seed = (unsigned)i + 1};
        submit(&slots[i]);
    }
    while (atomic_load(&l.in_flight) > 0)
        usleep(1000);
    if (acc != NULL)
        *acc = bench_meter_stop(&m);
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

static void measure_matrix(rl_agent *agent, const bench_script *fn,
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
                bench_run(ctl, "FLUSHALL");
                *at[RL_ASYNC] = rl_async(agent, d, n, NULL);
                bench_run(ctl, "FLUSHALL");
                *at[RL_THREADS] = rl_threads(agent, d, n);
                bench_run(ctl, "FLUSHALL");
                *at[PLAIN] = pipelined(fn, d, n);
                bench_run(ctl, "FLUSHALL");
                *at[SEED] = pipelined(seed, d, n);
                bench_run(ctl, "FLUSHALL");
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
    print_ratio_row("rl_check_async / plain loop, requests/s", RL_ASYNC,
                    PLAIN, rate_of);
    print_ratio_row("rl_check threads / plain loop, requests/s", RL_THREADS,
                    PLAIN, rate_of);
    print_ratio_row("seed's script / plain loop, requests/s", SEED, PLAIN,
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
               "plain loop, seed, rate-limiter-flexible): requests/s, p99 µs\n");
    for (int di = 0; di < DEPTHS; di++) {
        fprintf(f, "%d", depths[di]);
        for (int sys = 0; sys < SYSTEMS; sys++)
            fprintf(f, " %.0f %.0f", summary(sys, 0, di, rate_of).median,
                    summary(sys, 0, di, p99_of).median);
        fprintf(f, "\n");
    }
    fclose(f);
}

/* --- Redis's capacity for rl's function: the bound ---------------------- */

static bench_account lean[RUNS], rl_cost[RUNS];
static double rl_rate[RUNS];
static double cores;

/* Interleaved: the lean client, then rl_check_async at 256 in flight
 * with one rule, each run on an empty server. */
static void measure_capacity(rl_agent *agent, const bench_script *fn)
{
    for (int run = 0; run < RUNS; run++) {
        bench_run(ctl, "FLUSHALL");
        lean[run] = bench_capacity_run(addr, ctl, fn, 60000, run_seconds);
        bench_run(ctl, "FLUSHALL");
        rl_rate[run] = rl_async(agent, SAME_DEPTH, 1, &rl_cost[run]).rate;
    }
    bench_run(ctl, "FLUSHALL");
}

/* Redis executing nothing but the function, one call after another. */
static double command_bound(int run) { return 1e6 / lean[run].server_usec; }

/* redis-server on a core of its own: one thread, reading, running and
 * answering the lean client's calls. */
static double server_bound(int run) { return 1e6 / lean[run].server_cpu_us; }

/* This machine, Redis and the cheapest client sharing its cores: no more
 * than a core's worth of Redis, nor than the cores divided by what a call
 * costs on both sides. */
static double machine_bound(int run)
{
    double both = 1e6 / (lean[run].server_cpu_us + lean[run].client_cpu_us);
    double b = server_bound(run);
    return cores * both < b ? cores * both : b;
}

typedef double (*run_fn)(int run);
static double lean_rate(int run) { return lean[run].rate; }
static double lean_usec(int run) { return lean[run].server_usec; }
static double lean_server_cpu(int run) { return lean[run].server_cpu_us; }
static double lean_client_cpu(int run) { return lean[run].client_cpu_us; }
static double rl_async_rate(int run) { return rl_rate[run]; }
static double rl_usec(int run) { return rl_cost[run].server_usec; }
static double rl_server_cpu(int run) { return rl_cost[run].server_cpu_us; }
static double rl_client_cpu(int run) { return rl_cost[run].client_cpu_us; }
static double rl_of_machine(int run) { return rl_rate[run] / machine_bound(run); }
static double rl_of_lean(int run) { return rl_rate[run] / lean[run].rate; }
static double rl_of_command(int run) { return rl_rate[run] / command_bound(run); }

/* What a call costs on both sides with the lean client, over rl's. */
static double cpu_efficiency(int run)
{
    return (lean[run].server_cpu_us + lean[run].client_cpu_us)
           / (rl_cost[run].server_cpu_us + rl_cost[run].client_cpu_us);
}

static bench_summary over_runs(run_fn f)
{
    double v[RUNS];
    for (int run = 0; run < RUNS; run++)
        v[run] = f(run);
    return bench_summarize(v, RUNS);
}

static const struct {
    const char *what;
    run_fn f;
    int decimals;
    const char *unit;
} capacity_rows[] = {
    {"lean client, achieved", lean_rate, 0, "calls/s"},
    {"lean client: inside FCALL (commandstats)", lean_usec, 2,
     "µs per call"},
    {"lean client: redis-server CPU", lean_server_cpu, 2, "µs per call"},
    {"lean client: its own CPU", lean_client_cpu, 2, "µs per call"},
    {"bound: the command alone (1 / µs inside FCALL)", command_bound, 0,
     "calls/s"},
    {"bound: redis-server on a core of its own (1 / its CPU per call)",
     server_bound, 0, "calls/s"},
    {"**bound on this machine**: min(a core of Redis, cores / (server + "
     "client CPU per call))", machine_bound, 0, "calls/s"},
    {"rl_check_async, 256 in flight, 1 rule", rl_async_rate, 0,
     "requests/s"},
    {"rl_check_async: inside FCALL (commandstats)", rl_usec, 2,
     "µs per call"},
    {"rl_check_async: redis-server CPU", rl_server_cpu, 2, "µs per call"},
    {"rl_check_async: the agent's CPU", rl_client_cpu, 2, "µs per check"},
    {"**rl_check_async / bound on this machine**", rl_of_machine, 2, "x"},
    {"rl_check_async / lean client, achieved", rl_of_lean, 2, "x"},
    {"rl_check_async / the command alone", rl_of_command, 2, "x"},
    {"CPU per call, server + client: lean / rl", cpu_efficiency, 2,
     "x (1.0 = as lean)"},
};

static void print_capacity(void)
{
    printf("\n### Redis's capacity for rl's function on this machine, and "
           "rl_check_async against it (%d runs of %.1f s, %.0f cores)\n\n"
           "The lean client formats every call before the run, writes 500 "
           "calls to a system call with 1,000 in flight and counts replies "
           "as lines; rl_check_async keeps 256 in flight, one rule. Server "
           "CPU is redis-server's (INFO cpu), the client's is its CPU clock "
           "(rl's: the whole benchmark process, the agent's I/O thread "
           "included).\n\n"
           "| figure | min | median | max | unit |\n|---|---|---|---|---|\n",
           RUNS, run_seconds, cores);
    for (size_t i = 0; i < sizeof capacity_rows / sizeof capacity_rows[0];
         i++) {
        bench_summary v = over_runs(capacity_rows[i].f);
        int d = capacity_rows[i].decimals;
        printf("| %s | %.*f | %.*f | %.*f | %s |\n", capacity_rows[i].what,
               d, v.min, d, v.median, d, v.max, capacity_rows[i].unit);
    }
}

/* --- server cost and memory ---------------------------------------------- */

typedef struct cost {
    double usec;
    long long key_bytes, per_key;
} cost;

#define SCRIPTS 4
/* Runs are interleaved like the matrix's. The server's own clock around a
 * call also counts the time another process had the CPU (and page faults
 * as a fill grows the heap): the figures move by ±20 % between runs here,
 * so five runs, and the ratio is taken within each run. `make profile`
 * counts instructions instead, which do not move. */
#define COST_RUNS 5
static cost costs[SCRIPTS][COST_RUNS];
static const char *const cost_names[SCRIPTS] = {
    "rl bucket (FCALL), 100 per day: a whole-ms interval",
    "rl bucket (FCALL), 100 per 86,400,001 ms: a fractional interval",
    "seed's script (EVALSHA, hash)", "rate-limiter-flexible (EVALSHA)"};

/* fill_keys new keys, each checked twice (once new, once existing). */
static cost measure_cost(const bench_script *s, long period_ms)
{
    bench_run(ctl, "FLUSHALL");
    bench_run(ctl, "CONFIG RESETSTAT");
    long long before = bench_info(ctl, "memory", "used_memory:");
    if (s != NULL) {
        bench_load load = {.depth = 64, .rules = 1, .requests = fill_keys,
                           .period_ms = period_ms};
        bench_pipeline(addr, s, &load, NULL);
        bench_pipeline(addr, s, &load, NULL);
    } else {
        bench_peer_fill(addr, fill_keys);
    }
    cost out = {.usec = bench_script_usec_per_call(ctl)};
    long long after = bench_info(ctl, "memory", "used_memory:");
    out.per_key = (after - before) / fill_keys;
    char key[64];
    bench_key(key, sizeof key, 0, 1);
    redisReply *r = bench_command(ctl, "MEMORY USAGE %s", key);
    out.key_bytes = r->type == REDIS_REPLY_INTEGER ? r->integer : -1;
    freeReplyObject(r);
    bench_run(ctl, "FLUSHALL");
    return out;
}

static bench_summary cost_summary(int script)
{
    double usec[COST_RUNS];
    for (int run = 0; run < COST_RUNS; run++)
        usec[run] = costs[script][run].usec;
    return bench_summarize(usec, COST_RUNS);
}

static void print_costs(void)
{
    printf("\n### Server cost and memory (%ld keys, each checked twice; "
           "%d runs)\n\n"
           "| script | server µs per call, min / median / max (INFO "
           "commandstats) | MEMORY "
           "USAGE of one key | used_memory per key |\n|---|---|---|---|\n",
           fill_keys, COST_RUNS);
    for (int i = 0; i < SCRIPTS; i++) {
        if (i == 3 && !bench_peer_available())
            continue;
        bench_summary u = cost_summary(i);
        printf("| %s | %.2f / %.2f / %.2f | %lld | %lld |\n", cost_names[i],
               u.min, u.median, u.max, costs[i][0].key_bytes,
               costs[i][0].per_key);
    }
}

/* rl's bucket (token_bucket and gcra alike) at a whole-ms interval / the
 * seed's script, server µs: the median of the ratios within each run. */
static double cost_ratio(void)
{
    double v[COST_RUNS];
    for (int run = 0; run < COST_RUNS; run++)
        v[run] = costs[0][run].usec / costs[2][run].usec;
    return bench_summarize(v, COST_RUNS).median;
}

/* --- one call per request (issue 18) ------------------------------------ */

/* Per run, at 256 in flight (redis-benchmark's depth), each after a
 * FLUSHALL so that no key is near its limit: redis-benchmark driving rl's
 * function itself (the reference a new user would try), rl_check_async
 * with one rule and with three (three rules are one call of the
 * multi-bucket function). */
typedef struct one_call_run {
    double rb_rate;            /* redis-benchmark, calls/s */
    double one_rate, three_rate;
    double one_usec;           /* server µs per call, one rule */
    double three_usec;         /* server µs per request, three rules */
    double three_calls;        /* function calls per three-rule request */
    /* CPU µs per one-rule request: the agent's process (the load's own
     * loop included) and redis-server's. Less moved by other tenants than
     * requests/s: the agent's own cost per call (the third target). */
    double one_agent_cpu, one_server_cpu;
} one_call_run;

static one_call_run one_call[RUNS];

/* What `redis-benchmark -q` says a command ran at: the number before its
 * last " requests per second". 0 when it did not run. tls: its options
 * for the TLS port (the same server), or "" for the plain one. */
static double redis_benchmark(long calls, const char *tls)
{
    const char *colon = strrchr(addr, ':');
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "redis-benchmark -h %.*s %s%s -c 4 -P 64 -r 10000 -n %ld -q "
             "FCALL %s 1 rl:key:__rand_int__ 100 100 60000 1 2>&1",
             (int)(colon - addr), addr, *tls != '\0' ? "" : "-p ",
             *tls != '\0' ? tls : colon + 1, calls, RL_FUNCTION_BUCKET);
    FILE *f = popen(cmd, "r");
    if (f == NULL)
        return 0;
    static char out[1 << 16];
    size_t len = fread(out, 1, sizeof out - 1, f);
    out[len] = '\0';
    pclose(f);
    double rate = 0;
    for (char *p = out; (p = strstr(p, " requests per second")) != NULL;
         p++) {
        char *start = p;
        while (start > out && start[-1] != ' ')
            start--;
        rate = atof(start);
    }
    if (rate == 0)
        fprintf(stderr, "bench: redis-benchmark gave no rate: %.200s\n", out);
    return rate;
}

static void measure_one_call(rl_agent *agent)
{
    long calls = (long)(300000 * run_seconds);
    for (int run = 0; run < RUNS; run++) {
        one_call_run *r = &one_call[run];
        bench_account one, three;
        bench_run(ctl, "FLUSHALL");
        r->rb_rate = redis_benchmark(calls < 30000 ? 30000 : calls, "");
        bench_run(ctl, "FLUSHALL");
        r->one_rate = rl_async(agent, SAME_DEPTH, 1, &one).rate;
        bench_run(ctl, "FLUSHALL");
        r->three_rate = rl_async(agent, SAME_DEPTH, 3, &three).rate;
        r->one_usec = one.server_usec;
        r->one_agent_cpu = one.client_cpu_us;
        r->one_server_cpu = one.server_cpu_us;
        /* three.calls over the requests done (counted to the run's end). */
        double requests = r->three_rate * run_seconds;
        r->three_calls = requests > 0 ? three.calls / requests : 0;
        r->three_usec = three.server_usec * r->three_calls;
    }
}

typedef double (*one_call_fn)(const one_call_run *r);
static double three_over_one(const one_call_run *r)
{
    return r->three_rate / r->one_rate;
}
static double usec_ratio(const one_call_run *r)
{
    return r->three_usec / r->one_usec;
}
static double rl_over_rb(const one_call_run *r)
{
    return r->one_rate / r->rb_rate;
}
static double one_rate(const one_call_run *r) { return r->one_rate; }
static double three_rate(const one_call_run *r) { return r->three_rate; }
static double rb_rate(const one_call_run *r) { return r->rb_rate; }

static bench_summary one_call_summary(one_call_fn f)
{
    double v[RUNS];
    for (int run = 0; run < RUNS; run++)
        v[run] = f(&one_call[run]);
    return bench_summarize(v, RUNS);
}

static void print_one_call(void)
{
    printf("\n### One call per request (256 in flight, redis-benchmark's "
           "depth; each figure after FLUSHALL)\n\n"
           "redis-benchmark: `redis-benchmark -c 4 -P 64 -r 10000 -n N -q "
           "FCALL %s 1 rl:key:__rand_int__ 100 100 60000 1`\n\n"
           "| run | redis-benchmark calls/s | rl 1 rule req/s | rl 3 rules "
           "req/s | 3 / 1 rule | rl 1 rule / redis-benchmark | server µs: "
           "1 rule per call | 3 rules per request | ratio | calls per "
           "3-rule request | CPU µs per 1-rule request: agent | "
           "redis-server |\n"
           "|---|---|---|---|---|---|---|---|---|---|---|---|\n",
           RL_FUNCTION_BUCKET);
    for (int run = 0; run < RUNS; run++) {
        const one_call_run *r = &one_call[run];
        printf("| %d | %s | %s | %s | %.2f | %.2f | %.2f | %.2f | %.2f | "
               "%.2f | %.2f | %.2f |\n", run + 1, bench_int(r->rb_rate),
               bench_int(r->one_rate), bench_int(r->three_rate),
               three_over_one(r), rl_over_rb(r), r->one_usec, r->three_usec,
               usec_ratio(r), r->three_calls, r->one_agent_cpu,
               r->one_server_cpu);
    }
}

static double usec_per_key(const one_call_run *r)
{
    return r->three_usec / 3;
}
static double agent_cpu(const one_call_run *r) { return r->one_agent_cpu; }
static double one_usec(const one_call_run *r) { return r->one_usec; }

/* Three rules cost Redis per key (its per-key work bounds them: issue 18's
 * note showed it with callgrind): a figure, not a target. */
static void report_one_call(void)
{
    char rl[256], others[256];
    double one = one_call_summary(one_rate).median;
    double three = one_call_summary(three_rate).median;
    double rb = one_call_summary(rb_rate).median;
    snprintf(rl, sizeof rl, "3 rules %s, 1 rule %s requests/s (%.2f×); "
             "server %.2f µs per key of a 3-rule request, %.2f per 1-rule "
             "call; the agent's CPU %.2f µs per check",
             bench_int(three), bench_int(one),
             one_call_summary(three_over_one).median,
             one_call_summary(usec_per_key).median,
             one_call_summary(one_usec).median,
             one_call_summary(agent_cpu).median);
    snprintf(others, sizeof others, "redis-benchmark on rl's function %s "
             "calls/s", bench_int(rb));
    bench_figure("one call per request, 256 in flight", rl, others);
    bench_target("`rl_check_async` one rule, 256 in flight / redis-benchmark "
                 "-c 4 -P 64 on rl's function",
                 one_call_summary(rl_over_rb).median, ">=", 0.9, "x");
}

/* --- the report's headline --------------------------------------------- */

static void figure_rates(const char *what, int ri, int di, figure_fn lat,
                         const char *lat_name, double lat_scale,
                         const char *lat_unit)
{
    char rl[256], others[512];
    int n = snprintf(rl, sizeof rl, "`rl_check_async` %s (%s %.*f %s)",
                     bench_int(summary(RL_ASYNC, ri, di, rate_of).median),
                     lat_name,
                     lat_scale > 1 ? 2 : 0,
                     summary(RL_ASYNC, ri, di, lat).median / lat_scale,
                     lat_unit);
    if (depths[di] > 1)
        snprintf(rl + n, sizeof rl - (size_t)n,
                 "; `rl_check`, %d threads, %s (%.*f %s)", depths[di],
                 bench_int(summary(RL_THREADS, ri, di, rate_of).median),
                 lat_scale > 1 ? 2 : 0,
                 summary(RL_THREADS, ri, di, lat).median / lat_scale,
                 lat_unit);
    n = 0;
    for (int sys = PLAIN; sys < systems_shown(); sys++) {
        static const char *const short_names[SYSTEMS] = {
            "", "", "plain hiredis loop", "seed's script",
            "rate-limiter-flexible"};
        n += snprintf(others + n, sizeof others - (size_t)n,
                      "%s%s %s (%.*f %s)", n > 0 ? "; " : "",
                      short_names[sys],
                      bench_int(summary(sys, ri, di, rate_of).median),
                      lat_scale > 1 ? 2 : 0,
                      summary(sys, ri, di, lat).median / lat_scale,
                      lat_unit);
    }
    bench_figure(what, rl, others);
}

static void report_figures(void)
{
    figure_rates("1 rule, 64 in flight, requests/s (p99)", 0, 2, p99_of,
                 "p99", 1000, "ms");
    figure_rates("1 rule, 1 in flight, requests/s (p50)", 0, 0, p50_of,
                 "p50", 1, "µs");
    figure_rates("3 rules, 64 in flight, requests/s (p99)", 1, 2, p99_of,
                 "p99", 1000, "ms");
    char rl[256], others[512];
    snprintf(rl, sizeof rl, "`rl_check_async`, 64 in flight: %s, %.2f× "
             "the bound", bench_int(over_runs(rl_async_rate).median),
             over_runs(rl_of_machine).median);
    snprintf(others, sizeof others, "bound on this machine %s calls/s "
             "(redis-server CPU %.2f µs per call with the lean client, "
             "which achieved %s; the command alone %.2f µs)",
             bench_int(over_runs(machine_bound).median),
             over_runs(lean_server_cpu).median,
             bench_int(over_runs(lean_rate).median),
             over_runs(lean_usec).median);
    bench_figure("Redis's capacity for rl's function, 1 rule", rl, others);
    snprintf(rl, sizeof rl, "rl: agent %.2f + redis-server %.2f",
             over_runs(rl_client_cpu).median,
             over_runs(rl_server_cpu).median);
    snprintf(others, sizeof others, "lean client: client %.2f + "
             "redis-server %.2f",
             over_runs(lean_client_cpu).median,
             over_runs(lean_server_cpu).median);
    bench_figure("CPU µs per call, client + server", rl, others);
    snprintf(rl, sizeof rl, "%.2f (whole-ms interval), %.2f (fractional)",
             cost_summary(0).median, cost_summary(1).median);
    int n = snprintf(others, sizeof others, "seed's script %.2f",
                     cost_summary(2).median);
    if (bench_peer_available())
        snprintf(others + n, sizeof others - (size_t)n,
                 "; rate-limiter-flexible %.2f", cost_summary(3).median);
    bench_figure("server µs per call (commandstats)", rl, others);
    snprintf(rl, sizeof rl, "%lld / %lld", costs[0][0].key_bytes,
             costs[0][0].per_key);
    n = snprintf(others, sizeof others, "seed's hash %lld / %lld",
                 costs[2][0].key_bytes, costs[2][0].per_key);
    if (bench_peer_available())
        snprintf(others + n, sizeof others - (size_t)n,
                 "; rate-limiter-flexible %lld / %lld",
                 costs[3][0].key_bytes, costs[3][0].per_key);
    bench_figure("bytes per key (`MEMORY USAGE`; `used_memory` / keys)", rl,
                 others);
}

/* --- TLS ---------------------------------------------------------------- */

static double tls_rate[RUNS], plain_rate[RUNS];
static double rb_tls_rate[RUNS], rb_plain_rate[RUNS];
static bool tls_measured;

/* A loopback port that was free a moment ago, or 0. */
static unsigned free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    unsigned port = 0;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0
        && getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    if (fd >= 0)
        close(fd);
    return port;
}

/* Turns on the server's TLS port (Redis 7 takes tls-port live) with a CA
 * and a certificate made by openssl in dir; returns the port, 0 when it
 * could not. */
static unsigned tls_port_on(const char *dir)
{
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "cd %s && (openssl req -x509 -newkey rsa:2048 "
             "-nodes -days 1 -subj /CN=bench-ca -keyout ca.key -out ca.pem "
             "&& printf 'subjectAltName=IP:127.0.0.1\\n' > ext && openssl "
             "req -newkey rsa:2048 -nodes -subj /CN=127.0.0.1 -keyout s.key "
             "-out s.csr && openssl x509 -req -in s.csr -CA ca.pem -CAkey "
             "ca.key -CAcreateserial -days 1 -extfile ext -out s.pem) "
             "> openssl.log 2>&1", dir);
    unsigned port = free_port();
    if (port == 0 || system(cmd) != 0)
        return 0;
    char set[1400];
    snprintf(set, sizeof set, "CONFIG SET tls-cert-file %s/s.pem tls-key-file "
             "%s/s.key tls-ca-cert-file %s/ca.pem tls-auth-clients no "
             "tls-port %u", dir, dir, dir, port);
    redisReply *r = redisCommand(ctl, set);
    bool ok = r != NULL && r->type == REDIS_REPLY_STATUS;
    if (!ok)
        fprintf(stderr, "bench: no TLS port: %s\n",
                r != NULL && r->str != NULL ? r->str : "no answer");
    freeReplyObject(r);
    return ok ? port : 0;
}

/* rl_check_async, one rule, 256 in flight: plain and over TLS in turn,
 * then redis-benchmark at the same depth, plain and --tls. */
static void measure_tls(rl_agent *plain)
{
    char dir[] = "/tmp/rl-bench-tls-XXXXXX";
    unsigned port = mkdtemp(dir) != NULL ? tls_port_on(dir) : 0;
    if (port == 0)
        return;
    char store[1024];
    snprintf(store, sizeof store, "{url: \"rediss://127.0.0.1:%u\", "
             "timeout_ms: 2000, tls: {ca: %s/ca.pem}}", port, dir);
    rl_config *cfg;
    rl_agent *tls = open_agent_on(store, "token_bucket", &cfg);
    rl_async(tls, 16, 1, NULL); /* warm-up: the handshake, the library */
    char rb_tls[1200];
    snprintf(rb_tls, sizeof rb_tls, "-p %u --tls --cacert %s/ca.pem", port,
             dir);
    long calls = (long)(300000 * run_seconds);
    calls = calls < 30000 ? 30000 : calls;
    for (int run = 0; run < RUNS; run++) {
        plain_rate[run] = rl_async(plain, SAME_DEPTH, 1, NULL).rate;
        tls_rate[run] = rl_async(tls, SAME_DEPTH, 1, NULL).rate;
        rb_plain_rate[run] = redis_benchmark(calls, "");
        rb_tls_rate[run] = redis_benchmark(calls, rb_tls);
    }
    tls_measured = true;
    rl_agent_close(tls);
    rl_config_free(cfg);
    freeReplyObject(redisCommand(ctl, "CONFIG SET tls-port 0"));
}

static void print_tls(void)
{
    if (!tls_measured)
        return;
    double ratios[RUNS], rb_ratios[RUNS];
    for (int run = 0; run < RUNS; run++) {
        ratios[run] = tls_rate[run] / plain_rate[run];
        rb_ratios[run] = rb_tls_rate[run] / rb_plain_rate[run];
    }
    bench_summary p = bench_summarize(plain_rate, RUNS),
                  t = bench_summarize(tls_rate, RUNS),
                  r = bench_summarize(ratios, RUNS),
                  bp = bench_summarize(rb_plain_rate, RUNS),
                  bt = bench_summarize(rb_tls_rate, RUNS),
                  br = bench_summarize(rb_ratios, RUNS);
    printf("\n### Over TLS (rediss://), one rule, 256 in flight\n\n"
           "redis-benchmark at the same depth beside it: `-c 4 -P 64`, "
           "plain and `--tls`, on rl's function.\n\n"
           "| | min | median | max |\n|---|---|---|---|\n"
           "| rl plain, requests/s | %.0f | %.0f | %.0f |\n"
           "| rl TLS, requests/s | %.0f | %.0f | %.0f |\n"
           "| rl TLS / plain | %.2f | %.2f | %.2f |\n"
           "| redis-benchmark plain, calls/s | %.0f | %.0f | %.0f |\n"
           "| redis-benchmark --tls, calls/s | %.0f | %.0f | %.0f |\n"
           "| redis-benchmark TLS / plain | %.2f | %.2f | %.2f |\n",
           p.min, p.median, p.max, t.min, t.median, t.max, r.min, r.median,
           r.max, bp.min, bp.median, bp.max, bt.min, bt.median, bt.max,
           br.min, br.median, br.max);
    char rl[128], others[128];
    snprintf(rl, sizeof rl, "TLS / plain %.2f×", r.median);
    snprintf(others, sizeof others, "redis-benchmark --tls / plain %.2f×",
             br.median);
    bench_figure("over TLS, 256 in flight, 1 rule", rl, others);
    bench_target("`rl_check_async` over TLS / plain, requests/s, 256 in "
                 "flight, 1 rule", r.median, ">=", 0.7, "x");
}

static void report_targets(void)
{
    if (bench_peer_available()) {
        bench_target("`rl_check_async` / rate-limiter-flexible, "
                     "requests/s, 64 in flight, 1 rule",
                     ratio(RL_ASYNC, PEER, 0, 2, rate_of).median, ">=", 1.5,
                     "x");
        bench_target("`rl_check_async` / rate-limiter-flexible, p99, 64 in "
                     "flight, 1 rule",
                     ratio(RL_ASYNC, PEER, 0, 2, p99_of).median, "<=", 0.5,
                     "x");
    }
    char machine[128];
    snprintf(machine, sizeof machine, "%.2f× of this machine's bound",
             over_runs(rl_of_machine).median);
    bench_figure("`rl_check_async` / Redis's capacity for rl's function, "
                 "256 in flight, 1 rule", machine,
                 "the lean client (bench_capacity.c)");
    bench_target("rl bucket / seed's script, server µs per call",
                 cost_ratio(), "<=", 0.5, "x");
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
    if (bench_quick())
        fill_keys = 10000;
    cores = (double)sysconf(_SC_NPROCESSORS_ONLN);
    latency.cap = LATENCY_CAP;
    latency.us = malloc(LATENCY_CAP * sizeof *latency.us);
    ctl = bench_connect(addr);
    rl_config *cfg;
    rl_agent *agent = open_agent("token_bucket", &cfg);
    rl_async(agent, 16, 3, NULL); /* warm-up: connect, load the library */
    /* RL_BENCH_ONLY=one_call: the issue-18 table alone (its three
     * targets), a minute instead of five, to compare a change. */
    const char *only = getenv("RL_BENCH_ONLY");
    if (only != NULL && strcmp(only, "one_call") == 0) {
        measure_one_call(agent);
        print_one_call();
        report_one_call();
        rl_agent_close(agent);
        rl_config_free(cfg);
        redisFree(ctl);
        free(latency.us);
        return 0;
    }
    /* RL_BENCH_ONLY=tls: the TLS table alone (its target). */
    if (only != NULL && strcmp(only, "tls") == 0) {
        measure_tls(agent);
        print_tls();
        rl_agent_close(agent);
        rl_config_free(cfg);
        redisFree(ctl);
        free(latency.us);
        return 0;
    }
    bench_script fn = {.command = "FCALL"}, seed;
    snprintf(fn.name, sizeof fn.name, "%s", RL_FUNCTION_BUCKET);
    bench_seed_script(ctl, &seed);
    measure_matrix(agent, &fn, &seed);
    measure_one_call(agent);
    measure_capacity(agent, &fn);
    measure_tls(agent);
    for (int run = 0; run < COST_RUNS; run++) {
        costs[0][run] = measure_cost(&fn, 86400000);
        costs[1][run] = measure_cost(&fn, 86400001);
        costs[2][run] = measure_cost(&seed, 86400000);
        if (bench_peer_available())
            costs[3][run] = measure_cost(NULL, 0);
    }

    printf("## Exact path (%d runs of %.1f s per figure, %d keys per rule, "
           "100 per minute)\n", RUNS, run_seconds, BENCH_KEYS);
    print_matrix();
    print_ratios();
    print_capacity();
    print_costs();
    print_one_call();
    print_tls();
    report_figures();
    report_one_call();
    bench_alternatives(addr);
    report_targets();
    write_plot_data();
    rl_agent_close(agent);
    rl_config_free(cfg);
    redisFree(ctl);
    free(latency.us);
    return 0;
}
