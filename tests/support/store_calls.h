/*
 * store_calls.h: the calls an agent has sent its store, summed over its
 * nodes (rl_agent_shards), for the tests and the benchmarks alike: the
 * benchmarks link no test support.
 */
#ifndef RL_STORE_CALLS_H
#define RL_STORE_CALLS_H

#include "rl.h"

#include <stdint.h>

static inline uint64_t test_store_calls(rl_agent *a)
{
    rl_shard_counters s[64];
    size_t n = rl_agent_shards(a, s, 64);
    uint64_t calls = 0;
    for (size_t i = 0; i < n && i < 64; i++)
        calls += s[i].calls;
    return calls;
}

#endif
