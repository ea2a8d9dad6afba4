/*
 * stats.c: see stats.h.
 */
#include "stats.h"

#include "agent_impl.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

static size_t block_len(const rl_stats *s)
{
    return (1 + s->n_rules) * RL_COUNTS;
}

static atomic_uint_least64_t *new_block(const rl_stats *s)
{
    size_t bytes = (block_len(s) * sizeof(atomic_uint_least64_t)
                    + RL_CACHE_LINE - 1) / RL_CACHE_LINE * RL_CACHE_LINE;
    atomic_uint_least64_t *b = aligned_alloc(RL_CACHE_LINE, bytes);
    if (b != NULL) {
        for (size_t i = 0; i < block_len(s); i++)
            atomic_init(&b[i], 0);
    }
    return b;
}

int rl_stats_init(rl_stats *s, size_t n_rules)
{
    memset(s, 0, sizeof *s);
    s->n_rules = n_rules;
    for (int i = 0; i < RL_STATS_SLOTS; i++)
        atomic_init(&s->slots[i], NULL);
    rl_histogram_counts_init(&s->latency);
    s->shared = new_block(s);
    if (s->shared == NULL)
        return RL_ENOMEM;
    pthread_mutex_init(&s->lock, NULL);
    return RL_OK;
}

void rl_stats_fini(rl_stats *s)
{
    for (int i = 0; i < RL_STATS_SLOTS; i++)
        free(atomic_load(&s->slots[i]));
    free(s->shared);
    s->shared = NULL;
    pthread_mutex_destroy(&s->lock);
}

/* A thread's first count: its block is made. Apart, so that the common
 * path below stays small enough to inline into every check. */
static atomic_uint_least64_t *make_block(rl_stats *s, unsigned slot)
{
    pthread_mutex_lock(&s->lock);
    atomic_uint_least64_t *b = new_block(s);
    atomic_store_explicit(&s->slots[slot], b, memory_order_release);
    pthread_mutex_unlock(&s->lock);
    return b;
}

/* This thread's block, or NULL for the shared one. */
static inline atomic_uint_least64_t *own_block(rl_stats *s)
{
    unsigned slot = rl_thread_slot();
    if (slot == RL_THREAD_SLOT_SHARED)
        return NULL;
    atomic_uint_least64_t *b = atomic_load_explicit(&s->slots[slot],
                                                    memory_order_acquire);
    return b != NULL ? b : make_block(s, slot);
}

static void add(atomic_uint_least64_t *c)
{
    atomic_fetch_add_explicit(c, 1, memory_order_relaxed);
}

/* One counter of a block only this thread writes. */
static void bump(atomic_uint_least64_t *c)
{
    atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed)
                                 + 1, memory_order_relaxed);
}

/* Checks are allowed plus rejected, summed when read: one counter per row
 * on the common path. */
static inline void count_row(atomic_uint_least64_t *row, bool own,
                             bool allowed, bool degraded)
{
    atomic_uint_least64_t *c = &row[allowed ? RL_COUNT_ALLOWED
                                            : RL_COUNT_REJECTED];
    if (own)
        bump(c);
    else
        add(c);
    if (degraded)
        own ? bump(&row[RL_COUNT_DEGRADED]) : add(&row[RL_COUNT_DEGRADED]);
}

void rl_stats_count(rl_stats *s, const rl_rule_state *rules, int n,
                    const rl_decision *d, const rl_rule *cfg_rules)
{
    atomic_uint_least64_t *mine = own_block(s);
    bool own = mine != NULL;
    if (!own)
        mine = s->shared;
    count_row(mine, own, d->allowed, d->degraded);
    for (int i = 0; i < n; i++) {
        const rl_rule_state *rs = &rules[i];
        if (rs->outcome == RL_OUTCOME_SKIPPED)
            continue;
        bool failed = rs->outcome != RL_OUTCOME_ANSWERED;
        bool allowed = failed ? rl_unanswered_allows(rs) : rs->reply.allowed;
        size_t index = (size_t)(rs->rule - cfg_rules);
        atomic_uint_least64_t *row = mine + (1 + index) * RL_COUNTS;
        if (failed && rs->fallback) {
            atomic_uint_least64_t *c = &row[allowed
                                                ? RL_COUNT_FALLBACK_ALLOWED
                                                : RL_COUNT_FALLBACK_REJECTED];
            own ? bump(c) : add(c);
        }
        if (rs->shadow && !allowed) {
            own ? bump(&row[RL_COUNT_SHADOW_REJECTED])
                : add(&row[RL_COUNT_SHADOW_REJECTED]);
            allowed = true;
        }
        count_row(row, own, allowed, failed || rs->cut);
    }
}

void rl_stats_count_one(rl_stats *s, size_t rule_index, bool allowed)
{
    atomic_uint_least64_t *mine = own_block(s);
    bool own = mine != NULL;
    if (!own)
        mine = s->shared;
    count_row(mine, own, allowed, false);
    count_row(mine + (1 + rule_index) * RL_COUNTS, own, allowed, false);
}

void rl_stats_latency(rl_stats *s, uint64_t ns)
{
    rl_histogram_observe(&s->latency, ns);
}

static uint64_t sum(const rl_stats *s, size_t row, int what)
{
    size_t at = row * RL_COUNTS + (size_t)what;
    uint64_t total = atomic_load_explicit(&s->shared[at],
                                          memory_order_relaxed);
    for (int i = 0; i < RL_STATS_SLOTS; i++) {
        atomic_uint_least64_t *b = atomic_load_explicit(
            &((rl_stats *)s)->slots[i], memory_order_acquire);
        if (b != NULL)
            total += atomic_load_explicit(&b[at], memory_order_relaxed);
    }
    return total;
}

void rl_stats_read(const rl_stats *s, rl_agent_counters *out,
                   rl_rule_counters *rules, size_t cap)
{
    out->allowed = sum(s, 0, RL_COUNT_ALLOWED);
    out->rejected = sum(s, 0, RL_COUNT_REJECTED);
    out->requests = out->allowed + out->rejected;
    out->degraded = sum(s, 0, RL_COUNT_DEGRADED);
    out->store_errors = atomic_load_explicit(&s->store_errors,
                                             memory_order_relaxed);
    rl_histogram_read(&s->latency, &out->exact_check_seconds);
    out->n_rules = s->n_rules;
    for (size_t i = 0; i < s->n_rules && i < cap; i++) {
        rules[i].allowed = sum(s, 1 + i, RL_COUNT_ALLOWED);
        rules[i].rejected = sum(s, 1 + i, RL_COUNT_REJECTED);
        rules[i].checks = rules[i].allowed + rules[i].rejected;
        rules[i].degraded = sum(s, 1 + i, RL_COUNT_DEGRADED);
        rules[i].shadow_rejected = sum(s, 1 + i, RL_COUNT_SHADOW_REJECTED);
        rules[i].fallback_allowed = sum(s, 1 + i, RL_COUNT_FALLBACK_ALLOWED);
        rules[i].fallback_rejected = sum(s, 1 + i,
                                         RL_COUNT_FALLBACK_REJECTED);
    }
}
