/*
 * bench_alone.c: the ten-agent test's load (one tenant, five times its
 * limit of 1,000 per 10 s, spread evenly over ten agents, one request
 * every 2 ms)
 * offered to ten agents that each count alone (mode: local, what every
 * gateway does without shared limiting): what they admit, measured rather
 * than assumed. `make bench` runs it beside the ten-agent test and puts the
 * two side by side. Needs no Redis.
 *
 *   bench-alone [WINDOWS]   (3 by default)
 */
#include "bench_agent.h"
#include "bench_stats.h"
#include "rl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define FLEET 10
#define LIMIT 1000
#define PERIOD_MS 10000
#define MAX_WINDOWS 10

static const char yaml[] =
    "rules:\n"
    "  - {name: per-tenant, match: tenant, limit: 1000, period: 10s, "
    "mode: local}\n";

static void sleep_until(double t)
{
    double left = t - bench_now_s();
    if (left <= 0)
        return;
    struct timespec ts = {(time_t)left, (long)((left - (double)(time_t)left)
                                               * 1e9)};
    nanosleep(&ts, NULL);
}

int main(int argc, char **argv)
{
    int windows = argc > 1 ? atoi(argv[1]) : 3;
    if (windows < 1 || windows > MAX_WINDOWS) {
        fprintf(stderr, "usage: bench-alone [WINDOWS, 1 to %d]\n",
                MAX_WINDOWS);
        return 1;
    }
    rl_agent *agents[FLEET];
    rl_config *cfgs[FLEET];
    for (int i = 0; i < FLEET; i++)
        agents[i] = bench_open_agent(yaml, sizeof yaml - 1, &cfgs[i]);
    long offered[MAX_WINDOWS] = {0}, admitted[MAX_WINDOWS] = {0};
    double start = bench_now_s();
    for (long i = 0;; i++) {
        int w = (int)((bench_now_s() - start) * 1000 / PERIOD_MS);
        if (w >= windows)
            break;
        rl_attr a = {"tenant", "org_fleet", strlen("org_fleet")};
        rl_decision d;
        if (rl_check(agents[i % FLEET], &a, 1, 1, &d) != RL_OK) {
            fprintf(stderr, "bench-alone: a check failed\n");
            return 1;
        }
        offered[w]++;
        admitted[w] += d.allowed;
        sleep_until(start + (double)(i + 1) * 0.002);
    }
    for (int w = 0; w < windows; w++)
        printf("alone: window %d: offered %ld, admitted %ld (limit %d per "
               "agent, %d agents)\n", w, offered[w], admitted[w], LIMIT,
               FLEET);
    for (int i = 0; i < FLEET; i++) {
        rl_agent_close(agents[i]);
        rl_config_free(cfgs[i]);
    }
    return 0;
}
