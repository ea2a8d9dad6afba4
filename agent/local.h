/*
 * local.h: rules in `mode: local`, an in-process token bucket per (rule,
 * value) in each agent. No store, no aggregator: each gateway counts alone,
 * which is what a single gateway wants and what a fleet must not use for
 * per-client limits (ten gateways admit ten limits). Private to librl.
 *
 * Threads: rl_local_check runs on gateway threads; keys are spread over
 * shards, each with its own lock, held for a few arithmetic steps.
 */
#ifndef RL_AGENT_LOCAL_H
#define RL_AGENT_LOCAL_H

#include "bucket.h"
#include "config.h"
#include "ident.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#define RL_LOCAL_SHARDS 64

typedef struct rl_local_entry rl_local_entry;

typedef struct rl_local_shard {
    _Alignas(64) pthread_mutex_t lock;
    rl_local_entry **heads; /* chained hash, n_heads a power of two */
    size_t n_heads;
    size_t n_entries;
} rl_local_shard;

typedef struct rl_local {
    rl_local_shard shards[RL_LOCAL_SHARDS];
    size_t max_keys;
    atomic_size_t n_entries;
    atomic_uint_least64_t keys_refused; /* the cap was hit */
} rl_local;

void rl_local_init(rl_local *l, size_t max_keys);
void rl_local_fini(rl_local *l);

/* rl_local_check spends cost tokens from the bucket of (id, value) at
 * rate (the rule's own, or an override's: a bucket last spent at another
 * rate moves to this one with its tokens), if it holds them, on the
 * monotonic clock; a fixed_window rule's key counts cost hits in its
 * window of the wall clock instead (a refused one too, as in the store).
 * id is the rule's identity, which outlives reloads
 * (NULL: the rule itself keys the bucket). A key first seen when max_keys
 * full buckets are already tracked, or when memory runs out, is not
 * counted: *degraded is set and the rule's on_error decides. */
void rl_local_check(rl_local *l, const rl_rule *rule, rl_ident *id,
                    const rl_limit *rate,
                    const char *value, size_t value_len, uint32_t cost,
                    rl_bucket_reply *out, bool *degraded);

/* The same for a value whose rl_key_hash_value (keys.h) the caller has
 * already worked out (check.c hashes a value once for all its uses). */
void rl_local_check_hashed(rl_local *l, const rl_rule *rule, rl_ident *id,
                           const rl_limit *rate, const char *value,
                           size_t value_len, uint64_t value_hash,
                           uint32_t cost, rl_bucket_reply *out,
                           bool *degraded);

/* The same at a given time, in ms on any clock that does not go back (a
 * fixed window keeps to the wall clock). */
void rl_local_check_at(rl_local *l, const rl_rule *rule, rl_ident *id,
                       const rl_limit *rate, const char *value,
                       size_t value_len, uint32_t cost, uint64_t now_ms,
                       rl_bucket_reply *out, bool *degraded);

/* rl_local_settle takes a hold's difference delta from the bucket of
 * (id, value) at rate: past empty into debt, which the refill pays before
 * the bucket admits again; given back never above capacity. A fixed
 * window's key takes it in window (the one the hold's check counted in,
 * by rl_window_of), never below 0. */
void rl_local_settle(rl_local *l, const rl_rule *rule, rl_ident *id,
                     const rl_limit *rate, const char *value,
                     size_t value_len, int64_t delta, uint64_t window);

#endif
