/*
 * bench_synced.c: what a synced check costs on the hot path, against a
 * bare atomic increment on a hashed counter measured in the same binary
 * (the floor for "count this key"); and the aggregator's ingest rate in
 * (key, count) pairs per second against pipelined INCRBY on the same Redis.
 * Run by `make bench` under with-redis; rl-aggregator is started here.
 */
#include "bench_redis.h"
#include "bench_stats.h"
#include "rl.h"
#include "wire.h"

#include <hiredis/hiredis.h>
#include <nng/nng.h>
#include <nng/protocol/pubsub0/sub.h>
#include <nng/protocol/reqrep0/req.h>
#include <pthread.h>
#include <stdbool.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define KEYS 1000
#define CHECKS 2000000
#define RUNS 5

static char values[KEYS][16];
static size_t value_lens[KEYS];

/* The floor: hash the value, add to a counter. */
static _Alignas(64) atomic_uint_least64_t counters[4096];

/* arg: where in the keys this thread starts (threads share every key,
 * half a round apart rather than in step). */
static void *bare(void *arg)
{
    long from = (long)(intptr_t)arg;
    for (long i = from; i < from + CHECKS; i++) {
        const char *v = values[i % KEYS];
        uint64_t h = 1469598103934665603ULL;
        for (size_t j = 0; j < value_lens[i % KEYS]; j++)
            h = (h ^ (unsigned char)v[j]) * 1099511628211ULL;
        atomic_fetch_add_explicit(&counters[h % 4096], 1,
                                  memory_order_relaxed);
    }
    return NULL;
}

static rl_agent *agent;

static void *synced(void *arg)
{
    long from = (long)(intptr_t)arg, failed = 0;
    for (long i = from; i < from + CHECKS; i++) {
        rl_attr a = {"tenant", values[i % KEYS], value_lens[i % KEYS]};
        rl_decision d;
        if (rl_check(agent, &a, 1, 1, &d) != RL_OK || !d.allowed)
            failed++;
    }
    if (failed > 0)
        fprintf(stderr, "bench: %ld synced checks not allowed\n", failed);
    return NULL;
}

/* ns per call per thread, with threads running fn at once. */
static double ns_per_call(void *(*fn)(void *), int threads)
{
    pthread_t t[2];
    double start = bench_now_s();
    for (int i = 0; i < threads; i++)
        pthread_create(&t[i], NULL, fn, (void *)(intptr_t)(i * KEYS / 2));
    for (int i = 0; i < threads; i++)
        pthread_join(t[i], NULL);
    return (bench_now_s() - start) * 1e9 / CHECKS;
}

static void row(const char *what, const double *v, const char *unit)
{
    bench_summary s = bench_summarize(v, RUNS);
    printf("| %s | %.1f | %.1f | %.1f | %s |\n", what, s.min, s.median,
           s.max, unit);
}

static void hot_path(const char *config)
{
    rl_config *cfg;
    rl_error err;
    rl_options o = {0};
    if (rl_config_load(config, &cfg, &err) != RL_OK
        || (o.config = cfg, rl_agent_open(&agent, &o, &err)) != RL_OK) {
        fprintf(stderr, "bench: %s\n", err.message);
        exit(1);
    }
    double b1[RUNS], b2[RUNS], s1[RUNS], s2[RUNS], ratio[RUNS], scale[RUNS];
    double floor_scale[RUNS];
    synced(NULL); /* first sightings out of the way */
    for (int r = 0; r < RUNS; r++) {
        b1[r] = ns_per_call(bare, 1);
        b2[r] = ns_per_call(bare, 2);
        s1[r] = ns_per_call(synced, 1);
        s2[r] = ns_per_call(synced, 2);
        ratio[r] = s1[r] / b1[r];
        scale[r] = s2[r] / s1[r];
        floor_scale[r] = b2[r] / b1[r];
    }
    printf("## Synced path hot path (%d runs of %d checks per thread, %d "
           "keys)\n\n| figure | min | median | max | unit |\n"
           "|---|---|---|---|---|\n", RUNS, CHECKS, KEYS);
    row("rl_check, synced rule, 1 thread", s1, "ns per check");
    row("rl_check, synced rule, 2 threads", s2, "ns per check, each thread");
    row("floor: hash + atomic add, 1 thread", b1, "ns");
    row("floor: hash + atomic add, 2 threads", b2, "ns, each thread");
    row("synced check / floor, 1 thread", ratio, "x");
    row("synced check 2 threads / 1 thread", scale, "x (1.0 = scales)");
    row("floor 2 threads / 1 thread", floor_scale, "x");
    double median = bench_summarize(s1, RUNS).median;
    printf("\n| target | measured | wanted | |\n|---|---|---|---|\n"
           "| synced hot path, 1 thread | %.1f ns | < 25 ns | %s |\n",
           median, median < 25 ? "met" : "**missed**");
    rl_agent_close(agent);
    rl_config_free(cfg);
}

static pid_t start_aggregator(const char *bin, const char *config)
{
    pid_t pid = fork();
    if (pid == 0) {
        execl(bin, bin, "--config", config, "--log-level", "error",
              (char *)NULL);
        _exit(127);
    }
    usleep(500 * 1000);
    return pid;
}

#define PAIRS 1000
#define REPORTS 200

static double ingest_rate(const char *url)
{
    nng_socket s;
    nng_req0_open(&s);
    if (nng_dial(s, url, NULL, 0) != 0) {
        fprintf(stderr, "bench: cannot reach the aggregator\n");
        exit(1);
    }
    rl_wire_writer *w = rl_wire_writer_new();
    static unsigned run;
    char id[32];
    snprintf(id, sizeof id, "bench-%u-%d", ++run, (int)getpid());
    double start = bench_now_s();
    for (int r = 0; r < REPORTS; r++) {
        rl_wire_writer_reset(w);
        rl_wire_begin_report(w, id, (uint64_t)r + 1, PAIRS);
        for (int i = 0; i < PAIRS; i++)
            rl_wire_put_count(w, "per-tenant", values[i], value_lens[i], 1);
        size_t len;
        const void *data = rl_wire_writer_data(w, &len);
        char *buf;
        size_t size;
        if (nng_send(s, (void *)data, len, 0) != 0
            || nng_recv(s, &buf, &size, NNG_FLAG_ALLOC) != 0)
            exit(1);
        nng_free(buf, size);
    }
    double rate = (double)PAIRS * REPORTS / (bench_now_s() - start);
    rl_wire_writer_free(w);
    nng_close(s);
    return rate;
}

/* The reference: the same pairs as pipelined INCRBY, 1,000 per round trip. */
static double incrby_rate(const char *addr)
{
    redisContext *c = bench_connect(addr);
    double start = bench_now_s();
    for (int r = 0; r < REPORTS; r++) {
        for (int i = 0; i < PAIRS; i++)
            redisAppendCommand(c, "INCRBY bench:%s 1", values[i]);
        for (int i = 0; i < PAIRS; i++) {
            void *reply;
            if (redisGetReply(c, &reply) != REDIS_OK)
                exit(1);
            freeReplyObject(reply);
        }
    }
    double rate = (double)PAIRS * REPORTS / (bench_now_s() - start);
    redisFree(c);
    return rate;
}

#define LAG_SAMPLES 20

/* Whether a TOTALS message holds value with a count. */
static bool totals_hold(const char *buf, size_t len, const char *value)
{
    const char *nul = memchr(buf, '\0', len);
    rl_wire_msg m;
    const char *why;
    if (nul == NULL || rl_wire_decode(nul + 1, len - (size_t)(nul + 1 - buf),
                                      &m, &why) != 0)
        return false;
    bool found = false;
    for (size_t i = 0; i < m.n_entries && !found; i++)
        found = m.entries[i].value.len == strlen(value)
                && memcmp(m.entries[i].value.ptr, value,
                          m.entries[i].value.len) == 0
                && m.entries[i].current > 0;
    rl_wire_msg_free(&m);
    return found;
}

/* From a count in one agent to the totals another agent hears (this
 * program's SUB socket stands for the other agent). */
static void sync_lag(const char *config, const char *totals_url)
{
    rl_config *cfg;
    rl_error err;
    rl_options o = {0};
    if (rl_config_load(config, &cfg, &err) != RL_OK
        || (o.config = cfg, rl_agent_open(&agent, &o, &err)) != RL_OK)
        exit(1);
    nng_socket sub;
    nng_sub0_open(&sub);
    nng_socket_set(sub, NNG_OPT_SUB_SUBSCRIBE, "per-tenant", 11);
    nng_socket_set_ms(sub, NNG_OPT_RECVTIMEO, 5000);
    nng_dial(sub, totals_url, NULL, 0);
    double lag[LAG_SAMPLES];
    int n = 0;
    for (int i = 0; i < LAG_SAMPLES; i++) {
        char value[32];
        snprintf(value, sizeof value, "lag_%d_%d", i, (int)getpid());
        rl_attr a = {"tenant", value, strlen(value)};
        rl_decision d;
        double start = bench_now_s();
        rl_check(agent, &a, 1, 1, &d);
        for (;;) {
            char *buf;
            size_t size;
            if (nng_recv(sub, &buf, &size, NNG_FLAG_ALLOC) != 0)
                break;
            bool seen = totals_hold(buf, size, value);
            nng_free(buf, size);
            if (seen) {
                lag[n++] = (bench_now_s() - start) * 1000;
                break;
            }
        }
    }
    nng_close(sub);
    rl_agent_close(agent);
    rl_config_free(cfg);
    qsort(lag, (size_t)n, sizeof lag[0], bench_cmp_double);
    printf("\n## Sync lag (%d samples, sync_interval_ms 1000)\n\n"
           "| figure | p50 | p99 | unit |\n|---|---|---|---|\n"
           "| a count in one agent to the totals another hears | %.0f | %.0f "
           "| ms |\n", n, n ? lag[n / 2] : 0.0,
           n ? lag[(n * 99) / 100 < n ? (n * 99) / 100 : n - 1] : 0.0);
}

int main(int argc, char **argv)
{
    const char *addr = getenv("RL_TEST_REDIS");
    const char *tmp = getenv("RL_TEST_TMPDIR");
    if (addr == NULL || tmp == NULL || argc < 2) {
        fprintf(stderr, "bench: run through `make bench`\n");
        return 1;
    }
    for (int i = 0; i < KEYS; i++)
        value_lens[i] = (size_t)snprintf(values[i], sizeof values[i],
                                         "org_%d", i);
    char config[512];
    snprintf(config, sizeof config, "%s/bench-synced.yaml", tmp);
    FILE *f = fopen(config, "w");
    fprintf(f, "store: {url: \"redis://%s\"}\n"
               "aggregator: {reports: \"tcp://127.0.0.1:%d\", "
               "totals: \"tcp://127.0.0.1:%d\"}\n"
               "rules:\n  - {name: per-tenant, match: tenant, "
               "limit: 1000000000000, period: 1s, mode: synced}\n",
            addr, 20000 + getpid() % 20000, 40000 + getpid() % 20000);
    fclose(f);
    hot_path(config);

    pid_t agg = start_aggregator(argv[1], config);
    char url[64];
    snprintf(url, sizeof url, "tcp://127.0.0.1:%d", 20000 + getpid() % 20000);
    double in[RUNS], ref[RUNS], ratio[RUNS];
    for (int r = 0; r < RUNS; r++) {
        in[r] = ingest_rate(url);
        ref[r] = incrby_rate(addr);
        ratio[r] = in[r] / ref[r];
    }
    char totals_url[64];
    snprintf(totals_url, sizeof totals_url, "tcp://127.0.0.1:%d",
             40000 + getpid() % 20000);
    sync_lag(config, totals_url);
    kill(agg, SIGTERM);
    waitpid(agg, NULL, 0);
    printf("\n## Aggregator ingest (%d reports of %d pairs, %d runs)\n\n"
           "| figure | min | median | max | unit |\n|---|---|---|---|---|\n",
           REPORTS, PAIRS, RUNS);
    row("rl-aggregator ingest", in, "(key, count) pairs per second");
    row("reference: pipelined INCRBY, 1,000 per round trip", ref,
        "pairs per second");
    row("ingest / INCRBY", ratio, "x");
    return 0;
}
