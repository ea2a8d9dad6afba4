/*
 * bench_in_flight.c: what renewing an agent's in_flight slots costs on a
 * 3-primary Redis Cluster, by the number of keys held. One agent holds a
 * slot of each of KEYS keys (one tenant each, spread over the cluster's
 * hash slots) with a lease of 1 s, so it renews them every 250 ms; over a
 * window with nothing else to do, the process's CPU time, the calls and
 * the writes it sends are counted, per renewal. A pass linear in the keys
 * costs the same per key at 2,000 keys as at 20,000; one that scanned its
 * keys once per hash slot cost ten times more per key at 20,000. Run by
 * `make bench` under with-redis --cluster.
 *
 *   bench-in-flight [KEYS...]   (2000 20000 by default)
 */
#include "bench_agent.h"
#include "bench_report.h"
#include "bench_stats.h"
#include "keys.h"
#include "rl.h"

#include <semaphore.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define WINDOW_S 3.0
#define OUTSTANDING 256 /* holds asked for at once while taking them */

typedef struct taking {
    sem_t room;
    rl_hold **holds;
    size_t refused;
} taking;

typedef struct asked {
    taking *t;
    size_t i;
} asked;

static void on_hold(const rl_decision *d, rl_hold *h, void *arg)
{
    asked *a = arg;
    a->t->holds[a->i] = h;
    if (h == NULL || !d->allowed)
        a->t->refused++; /* the I/O thread's callbacks run one at a time */
    sem_post(&a->t->room);
}

/* The calls and writes (batches) the agent has sent. */
static void sent(rl_agent *a, uint64_t *calls, uint64_t *writes,
                 size_t *nodes)
{
    rl_shard_counters s[64];
    *nodes = rl_agent_shards(a, s, 64);
    *calls = *writes = 0;
    for (size_t i = 0; i < *nodes; i++) {
        *calls += s[i].calls;
        *writes += s[i].batches;
    }
}

static void value_of(char *out, size_t cap, size_t i)
{
    snprintf(out, cap, "tenant-%d-%zu", (int)getpid(), i);
}

/* The hash slots the keys are in. */
static size_t slots_of(size_t keys)
{
    static bool seen[16384];
    memset(seen, 0, sizeof seen);
    size_t n = 0;
    for (size_t i = 0; i < keys; i++) {
        char value[64], key[96];
        value_of(value, sizeof value, i);
        snprintf(key, sizeof key, "rl:tenant:%s", value);
        uint16_t slot = rl_key_slot(key, strlen(key));
        n += !seen[slot];
        seen[slot] = true;
    }
    return n;
}

static void run(const char *seeds, size_t keys)
{
    char yaml[1024];
    int len = snprintf(yaml, sizeof yaml,
                       "store: {cluster: [%s], timeout_ms: 2000}\n"
                       "in_flight_lease_ms: 1000\n"
                       "rules:\n  - {name: f, match: tenant, "
                       "in_flight: 10}\n", seeds);
    rl_config *cfg;
    rl_agent *a = bench_open_agent(yaml, (size_t)len, &cfg);
    taking t = {.holds = calloc(keys, sizeof *t.holds)};
    asked *asks = calloc(keys, sizeof *asks);
    char (*values)[64] = calloc(keys, sizeof *values);
    if (t.holds == NULL || asks == NULL || values == NULL) {
        fprintf(stderr, "bench: out of memory\n");
        exit(1);
    }
    sem_init(&t.room, 0, OUTSTANDING);
    for (size_t i = 0; i < keys; i++) {
        while (sem_wait(&t.room) != 0)
            ;
        value_of(values[i], sizeof values[i], i);
        asks[i] = (asked){&t, i};
        rl_attr attr = {"tenant", values[i], strlen(values[i])};
        if (rl_check_hold(a, &attr, 1, 1, on_hold, &asks[i]) != RL_OK) {
            fprintf(stderr, "bench: rl_check_hold failed\n");
            exit(1);
        }
    }
    for (int i = 0; i < OUTSTANDING; i++)
        while (sem_wait(&t.room) != 0)
            ;
    if (t.refused > 0) {
        fprintf(stderr, "bench: %zu of %zu holds refused\n", t.refused,
                keys);
        exit(1);
    }
    /* Counted once the last takes' answers and the store's second read of
     * the slot map (500 ms after its first) are past. */
    usleep(600 * 1000);
    uint64_t calls0, writes0, calls1, writes1;
    size_t nodes;
    sent(a, &calls0, &writes0, &nodes);
    double cpu0 = bench_cpu_s(CLOCK_PROCESS_CPUTIME_ID);
    usleep((useconds_t)(WINDOW_S * 1e6));
    double cpu = bench_cpu_s(CLOCK_PROCESS_CPUTIME_ID) - cpu0;
    sent(a, &calls1, &writes1, &nodes);
    uint64_t writes = writes1 - writes0, calls = calls1 - calls0;
    double renewals = (double)writes / (double)nodes;
    printf("| %s | %s | %.1f | %.0f | %.1f | %.2f | %.0f |\n",
           bench_int((double)keys), bench_int((double)slots_of(keys)),
           renewals, (double)calls / renewals, (double)writes / renewals,
           cpu / renewals * 1e3, cpu / renewals / (double)keys * 1e9);
    char what[128], rl[128];
    snprintf(what, sizeof what, "in_flight renewal of %s keys, 3-primary "
             "cluster", bench_int((double)keys));
    snprintf(rl, sizeof rl, "%.2f ms CPU, %.0f calls in %.0f writes",
             cpu / renewals * 1e3, (double)calls / renewals,
             (double)writes / renewals);
    bench_figure(what, rl, "");
    for (size_t i = 0; i < keys; i++)
        rl_hold_end(t.holds[i], 1);
    rl_agent_close(a);
    rl_config_free(cfg);
    sem_destroy(&t.room);
    free(values);
    free(asks);
    free(t.holds);
}

int main(int argc, char **argv)
{
    const char *seeds = getenv("RL_TEST_CLUSTER");
    if (seeds == NULL) {
        fprintf(stderr, "bench: run through `make bench`\n");
        return 1;
    }
    printf("## in_flight renewal on a 3-primary cluster (lease 1 s, a "
           "renewal every 250 ms, %.0f s counted)\n\n", WINDOW_S);
    printf("| keys held | hash slots | renewals | calls per renewal | "
           "writes per renewal | CPU ms per renewal | CPU ns per key |\n"
           "|---|---|---|---|---|---|---|\n");
    if (argc < 2) {
        run(seeds, 2000);
        run(seeds, 20000);
    }
    for (int i = 1; i < argc; i++)
        run(seeds, (size_t)strtoul(argv[i], NULL, 10));
    return 0;
}
