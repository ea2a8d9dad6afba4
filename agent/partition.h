/*
 * partition.h: which aggregator a synced key goes to, when an agent has
 * several. Private to librl.
 */
#ifndef RL_AGENT_PARTITION_H
#define RL_AGENT_PARTITION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* rl_partition_key hashes a key, its rule's name and its value (len
 * bytes), the same way in every agent and every version: agents must agree
 * on where a key goes. */
uint64_t rl_partition_key(const char *rule, const char *value, size_t len);

/* rl_partition_owner picks, among the n aggregators (n >= 1) for which
 * up[i] holds, the one that key (rl_partition_key's) goes to; among all n
 * when none is up. Thread-safe (pure). */
size_t rl_partition_owner(uint64_t key, const bool *up, size_t n);

#endif
