/*
 * bench_agent.h: an agent from a config the benchmark wrote. A config that
 * does not load ends the benchmark.
 */
#ifndef RL_BENCH_AGENT_H
#define RL_BENCH_AGENT_H

#include "rl.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static inline rl_agent *bench_open_agent(const char *yaml, size_t len,
                                         rl_config **cfg)
{
    rl_error err;
    rl_agent *agent;
    rl_options o = {0};
    if (rl_config_parse(yaml, len, "bench", cfg, &err) != RL_OK
        || (o.config = *cfg, rl_agent_open(&agent, &o, &err)) != RL_OK) {
        fprintf(stderr, "bench: %s\n", err.message);
        exit(1);
    }
    return agent;
}

/* Calls the agent has sent to its store nodes, over all of them. */
static inline uint64_t bench_store_calls(rl_agent *a)
{
    rl_shard_counters s[64];
    size_t n = rl_agent_shards(a, s, 64);
    uint64_t calls = 0;
    for (size_t i = 0; i < n && i < 64; i++)
        calls += s[i].calls;
    return calls;
}

#endif
