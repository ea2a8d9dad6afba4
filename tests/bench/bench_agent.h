/*
 * bench_agent.h: an agent from a config the benchmark wrote. A config that
 * does not load ends the benchmark.
 */
#ifndef RL_BENCH_AGENT_H
#define RL_BENCH_AGENT_H

#include "rl.h"
#include "store_calls.h"

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

#endif
