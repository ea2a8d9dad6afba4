/*
 * fallback.h: `on_error: local`. When the store does not answer a rule
 * whose on_error is local (it is down, or the check's deadline passed, or
 * a synced key is over its cap), the agent decides that rule from a token
 * bucket of its own per (rule, value): the rule's rate divided by the
 * fleet's size, so that the fleet together admits about the limit rather
 * than everything (allow) or nothing (deny). The buckets are agent/local.c's,
 * in a table of their own. Private to librl.
 *
 * The divisor, agents: the aggregator's count of the agents enforcing the
 * rule (ident->agents) when it has said, else the rule's fleet_size, else
 * 1 (the whole limit in each agent). A fallback bucket refills limit
 * tokens per agents x period, exactly (no rounding: the bucket counts in
 * 1/(agents x period_ms) tokens), and holds burst / agents tokens rounded
 * up, at least 1.
 *
 * Threads: rl_fallback_* run on gateway threads and on the I/O thread; the
 * buckets take their shard's lock (local.h).
 */
#ifndef RL_AGENT_FALLBACK_H
#define RL_AGENT_FALLBACK_H

#include "bucket.h"
#include "config.h"
#include "ident.h"
#include "local.h"

#include <stdbool.h>
#include <stdint.h>

/* rl_fallback_agents: the divisor of rule's fallback (id may be NULL). */
uint64_t rl_fallback_agents(const rl_rule *rule, const rl_ident *id);

/* rl_fallback_rate: one agent's share of rate among agents (at least 1):
 * limit per agents x period, burst / agents rounded up. */
void rl_fallback_rate(const rl_limit *rate, uint64_t agents, rl_limit *out);

/* rl_fallback_spend spends cost tokens of (id, value)'s fallback bucket in
 * l at rule's share of rate. False when the bucket cannot be had (the
 * table holds local.max_keys buckets, or memory is out): the rule then
 * allows, as on_error: allow would. */
bool rl_fallback_spend(rl_local *l, const rl_rule *rule, rl_ident *id,
                       const rl_limit *rate, const char *value, size_t len,
                       uint32_t cost, rl_bucket_reply *out);

#endif
