/*
 * bench_rule_async.c: rl_check_rule_async's rate on one key of a token
 * bucket rule with a caller's rate, DEPTH checks kept in flight from the
 * callbacks (one caller, as an event-loop service): what rl-rls's token
 * bucket descriptors are measured against (tests/bench/bench_rls.sh),
 * the same rule as rl-rls makes (rls_store.c: rls-tb) at the same rate,
 * on the same Redis.
 *
 *   bench-rule-async REDIS_ADDR SECONDS DEPTH LIMIT PERIOD_MS
 *
 * Prints the checks per second.
 */
#include "bench_agent.h"
#include "rl.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_DEPTH 1024

typedef struct load {
    rl_agent *agent;
    rl_rate rate;
    double end;
    atomic_long done;
    atomic_long failed;
    atomic_int in_flight;
} load;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* The value rl-rls counts the bench's descriptor under (domain bench,
 * entry t=v), for a key of the same length. */
static const char value[] = "5:bench:1:t:1:v";

static void on_decision(const rl_decision *d, void *arg);

static void submit(load *l)
{
    if (rl_check_rule_async(l->agent, "rls-tb", value, sizeof value - 1,
                            &l->rate, 1, on_decision, l)
        != RL_OK) {
        atomic_fetch_add(&l->failed, 1);
        atomic_fetch_sub(&l->in_flight, 1);
    }
}

/* On the agent's I/O thread: count, then keep the depth. */
static void on_decision(const rl_decision *d, void *arg)
{
    load *l = arg;
    if (d->degraded || !d->allowed)
        atomic_fetch_add(&l->failed, 1);
    if (now_s() < l->end) {
        atomic_fetch_add(&l->done, 1);
        submit(l);
    } else {
        atomic_fetch_sub(&l->in_flight, 1);
    }
}

int main(int argc, char **argv)
{
    if (argc != 6) {
        fprintf(stderr, "usage: bench-rule-async REDIS_ADDR SECONDS DEPTH "
                        "LIMIT PERIOD_MS\n");
        return 2;
    }
    int depth = atoi(argv[3]);
    if (depth < 1 || depth > MAX_DEPTH) {
        fprintf(stderr, "bench-rule-async: DEPTH from 1 to %d\n", MAX_DEPTH);
        return 2;
    }
    char yaml[512];
    int len = snprintf(yaml, sizeof yaml,
                       "store: {url: \"redis://%s\"}\n"
                       "rules:\n"
                       "  - {name: rls-tb, match: descriptor, limit: 1, "
                       "period: 1s, algorithm: token_bucket, "
                       "key_prefix: \"rbench-tb:\"}\n", argv[1]);
    rl_config *cfg;
    load l = {.rate = {.limit = strtoull(argv[4], NULL, 10),
                       .period_ms = strtoull(argv[5], NULL, 10)}};
    l.rate.burst = l.rate.limit;
    l.agent = bench_open_agent(yaml, (size_t)len, &cfg);
    /* A second at depth 1 first: the connection and the function are
     * up before the run. */
    l.end = now_s() + 1;
    atomic_store(&l.in_flight, 1);
    submit(&l);
    while (atomic_load(&l.in_flight) > 0)
        usleep(1000);
    double start = now_s();
    l.end = start + atof(argv[2]);
    atomic_store(&l.done, 0);
    atomic_store(&l.in_flight, depth);
    for (int i = 0; i < depth; i++)
        submit(&l);
    while (atomic_load(&l.in_flight) > 0)
        usleep(1000);
    if (atomic_load(&l.failed) > 0)
        fprintf(stderr, "bench-rule-async: %ld checks failed, degraded or "
                "refused\n", atomic_load(&l.failed));
    printf("%.0f\n", (double)atomic_load(&l.done) / (l.end - start));
    rl_agent_close(l.agent);
    rl_config_free(cfg);
    return atomic_load(&l.failed) > 0;
}
