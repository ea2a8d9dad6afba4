/*
 * stats.h: the agent's counters, for rl_agent_stats. Counted on the
 * caller's thread slot (a thread writes its own cache lines, never another
 * thread's) and summed when read; the exact checks' latency histogram is
 * counted on the I/O thread. Private to librl.
 */
#ifndef RL_AGENT_STATS_H
#define RL_AGENT_STATS_H

#include "config.h"
#include "histogram.h"
#include "rl.h"
#include "thread_slot.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

typedef struct rl_rule_state rl_rule_state;

/* Threads with a slot count in blocks of their own; others share one. */
#define RL_STATS_SLOTS RL_THREAD_SLOTS

/* A shadow rule's would-be rejections count as allowed (it let them
 * through) and as shadow-rejected. A rule's on_error: local decisions
 * count as degraded and as fallback allowed or rejected. */
enum { RL_COUNT_ALLOWED, RL_COUNT_REJECTED, RL_COUNT_DEGRADED,
       RL_COUNT_SHADOW_REJECTED, RL_COUNT_FALLBACK_ALLOWED,
       RL_COUNT_FALLBACK_REJECTED, RL_COUNTS };

/* A block is [1 + n_rules][RL_COUNTS]: row 0 is the requests, then one
 * row per rule. A thread's own block is written by that thread alone (a
 * plain load and store, no locked instruction on the hot path); the shared
 * block takes atomic adds. Blocks are made on a thread's first count and
 * summed when read. */
typedef struct rl_stats {
    size_t n_rules;
    _Atomic(atomic_uint_least64_t *) slots[RL_STATS_SLOTS];
    atomic_uint_least64_t *shared;
    pthread_mutex_t lock;               /* making a block */
    rl_histogram_counts latency;
    atomic_uint_least64_t store_errors;
} rl_stats;

int rl_stats_init(rl_stats *s, size_t n_rules);
void rl_stats_fini(rl_stats *s);

/* Counts one decided request and each rule's part in it; cfg_rules is the
 * config's rule array (a state's rule is one of them). */
/* A request one rule applied to, and answered. */
void rl_stats_count_one(rl_stats *s, size_t rule_index, bool allowed);

void rl_stats_count(rl_stats *s, const rl_rule_state *rules, int n,
                    const rl_decision *d, const rl_rule *cfg_rules);

/* The I/O thread: an exact check took ns nanoseconds. */
void rl_stats_latency(rl_stats *s, uint64_t ns);

/* Sums the blocks into out (request counts) and rules[0..cap). */
void rl_stats_read(const rl_stats *s, rl_agent_counters *out,
                   rl_rule_counters *rules, size_t cap);

#endif
