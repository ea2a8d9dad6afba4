/*
 * bench_exact.c: what an exact check costs, against a ceiling measured in
 * the same run on the same redis-server (the machines are shared and noisy:
 * only ratios mean much). Run by `make bench` under with-redis.
 *
 *   - rl_check throughput with 1 and 64 threads, one rule, 10,000 keys;
 *   - the ceiling: the same function driven by a bare pipelined hiredis
 *     loop, 64 calls in flight;
 *   - server time per call (INFO commandstats) and MEMORY USAGE of one
 *     bucket key, for each algorithm.
 */
#include "bench_stats.h"
#include "rl.h"
#include "scripts.h"

#include <hiredis/hiredis.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define KEYS 10000
#define RUN_SECONDS 2.0
#define RUNS 3

static redisContext *connect_to(const char *addr)
{
    char host[64];
    int port;
    if (sscanf(addr, "%63[^:]:%d", host, &port) != 2)
        return NULL;
    redisContext *c = redisConnect(host, port);
    if (c == NULL || c->err) {
        fprintf(stderr, "bench: cannot connect to %s\n", addr);
        exit(1);
    }
    return c;
}

static void command(redisContext *c, const char *cmd)
{
    redisReply *r = redisCommand(c, cmd);
    if (r == NULL) {
        fprintf(stderr, "bench: %s failed\n", cmd);
        exit(1);
    }
    freeReplyObject(r);
}

struct load {
    rl_agent *agent;
    atomic_bool stop;
    atomic_long checks;
    atomic_long failed;
    unsigned seed;
};

static void *checker(void *arg)
{
    struct load *l = arg;
    unsigned seed = (unsigned)(uintptr_t)&seed;
    long n = 0, failed = 0;
    while (!atomic_load_explicit(&l->stop, memory_order_relaxed)) {
        char value[16];
        int len = snprintf(value, sizeof value, "k%d", rand_r(&seed) % KEYS);
        rl_attr a = {"api_key", value, (size_t)len};
        rl_decision d;
        if (rl_check(l->agent, &a, 1, 1, &d) != RL_OK || d.degraded)
            failed++;
        n++;
    }
    atomic_fetch_add(&l->checks, n);
    atomic_fetch_add(&l->failed, failed);
    return NULL;
}

static double agent_rate(rl_agent *agent, int threads)
{
    struct load l = {.agent = agent};
    pthread_t t[64];
    for (int i = 0; i < threads; i++)
        pthread_create(&t[i], NULL, checker, &l);
    double start = bench_now_s();
    struct timespec run = {(time_t)RUN_SECONDS, 0};
    nanosleep(&run, NULL);
    atomic_store(&l.stop, true);
    for (int i = 0; i < threads; i++)
        pthread_join(t[i], NULL);
    double elapsed = bench_now_s() - start;
    if (atomic_load(&l.failed) > 0)
        fprintf(stderr, "bench: %ld checks failed or degraded\n",
                atomic_load(&l.failed));
    return (double)atomic_load(&l.checks) / elapsed;
}

/* The ceiling: the library's function called straight from hiredis, 64
 * calls written before their replies are read. */
static double ceiling_rate(const char *addr)
{
    redisContext *c = connect_to(addr);
    unsigned seed = 1;
    long n = 0;
    double start = bench_now_s();
    while (bench_now_s() - start < RUN_SECONDS) {
        for (int i = 0; i < 64; i++)
            redisAppendCommand(c, "FCALL %s 1 rl:key:k%d 1000000 1000000 "
                               "60000 1", RL_FUNCTION_TOKEN_BUCKET,
                               rand_r(&seed) % KEYS);
        for (int i = 0; i < 64; i++) {
            void *r;
            if (redisGetReply(c, &r) != REDIS_OK)
                exit(1);
            freeReplyObject(r);
        }
        n += 64;
    }
    double rate = (double)n / (bench_now_s() - start);
    redisFree(c);
    return rate;
}

static void report(const char *what, double *runs)
{
    qsort(runs, RUNS, sizeof runs[0], bench_cmp_double);
    printf("| %s | %.0f | %.0f | %.0f |\n", what, runs[0], runs[RUNS / 2],
           runs[RUNS - 1]);
}

static rl_agent *open_agent(const char *addr, const char *algorithm,
                            const char *rate, rl_config **cfg)
{
    char yaml[512];
    int n = snprintf(yaml, sizeof yaml,
                     "store: {url: \"redis://%s\", timeout_ms: 1000}\n"
                     "rules:\n  - {name: per-key, match: api_key, "
                     "%s, algorithm: %s}\n",
                     addr, rate, algorithm);
    rl_error err;
    rl_agent *agent;
    rl_options o = {0};
    if (rl_config_parse(yaml, (size_t)n, "bench", cfg, &err) != RL_OK
        || (o.config = *cfg, rl_agent_open(&agent, &o, &err)) != RL_OK) {
        fprintf(stderr, "bench: %s\n", err.message);
        exit(1);
    }
    return agent;
}

static long long info_field(redisContext *c, const char *section,
                            const char *field)
{
    redisReply *r = redisCommand(c, "INFO %s", section);
    const char *p = r != NULL && r->str ? strstr(r->str, field) : NULL;
    long long v = 0;
    if (p != NULL) {
        p += strlen(field);
        v = atoll(p);
    }
    freeReplyObject(r);
    return v;
}

/* Server time per call and bytes per key, for one algorithm. The rate is
 * 100 a day so that every key outlives the measurement (a token comes back
 * every 864 s), even on a slow, loaded machine. */
static void server_cost(const char *addr, const char *algorithm)
{
    rl_config *cfg;
    rl_agent *agent = open_agent(addr, algorithm, "limit: 100, period: 1d",
                                 &cfg);
    redisContext *c = connect_to(addr);
    command(c, "FLUSHALL");
    command(c, "CONFIG RESETSTAT");
    for (int i = 0; i < KEYS; i++) {
        char value[16];
        int len = snprintf(value, sizeof value, "k%d", i);
        rl_attr a = {"api_key", value, (size_t)len};
        rl_decision d;
        rl_check(agent, &a, 1, 1, &d);
    }
    double usec = 0;
    redisReply *r = redisCommand(c, "INFO commandstats");
    const char *p = strstr(r->str, "cmdstat_fcall:");
    if (p != NULL && (p = strstr(p, "usec_per_call=")) != NULL)
        usec = atof(p + strlen("usec_per_call="));
    freeReplyObject(r);
    r = redisCommand(c, "MEMORY USAGE rl:key:k1");
    long long bytes = r != NULL && r->type == REDIS_REPLY_INTEGER
                          ? r->integer : -1;
    freeReplyObject(r);
    long long used = info_field(c, "memory", "used_memory:");
    command(c, "FLUSHALL");
    long long empty = info_field(c, "memory", "used_memory:");
    printf("| %s | %.2f | %lld | %.0f |\n", algorithm, usec, bytes,
           (double)(used - empty) / KEYS);
    redisFree(c);
    rl_agent_close(agent);
    rl_config_free(cfg);
}

int main(void)
{
    const char *addr = getenv("RL_TEST_REDIS");
    if (addr == NULL) {
        fprintf(stderr, "bench: run through `make bench`\n");
        return 1;
    }
    rl_config *cfg;
    /* A rate no check reaches: every check is allowed and writes. */
    rl_agent *agent = open_agent(addr, "token_bucket",
                                 "limit: 1000000, period: 1m", &cfg);
    agent_rate(agent, 1); /* warm-up: connect, load */
    double one[RUNS], many[RUNS], ceiling[RUNS], ratio[RUNS];
    for (int i = 0; i < RUNS; i++) {
        one[i] = agent_rate(agent, 1);
        many[i] = agent_rate(agent, 64);
        ceiling[i] = ceiling_rate(addr);
        ratio[i] = 100.0 * many[i] / ceiling[i];
    }
    rl_agent_close(agent);
    rl_config_free(cfg);

    printf("## Exact path (%d runs of %.0f s, one rule, %d keys)\n\n", RUNS,
           RUN_SECONDS, KEYS);
    printf("| checks per second | min | median | max |\n|---|---|---|---|\n");
    report("rl_check, 1 thread", one);
    report("rl_check, 64 threads", many);
    report("ceiling: pipelined hiredis FCALL, 64 in flight", ceiling);
    report("rl_check 64 threads as % of the ceiling", ratio);
    printf("\n| algorithm | server usec per call | MEMORY USAGE of one key "
           "(bytes) | used_memory per key over %d keys (bytes) |\n"
           "|---|---|---|---|\n", KEYS);
    server_cost(addr, "token_bucket");
    server_cost(addr, "gcra");
    return 0;
}
