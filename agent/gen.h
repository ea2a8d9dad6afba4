/*
 * gen.h: a generation of an agent's rules: one config, what the agent
 * derives from it per rule (bucket arguments, identities) and the counters
 * of the checks made under it. A check loads the current generation once,
 * after entering (calls.h), and uses it to the end; a reload publishes a
 * new one and retires the old. Private to librl.
 *
 * A retired generation is freed once (1) every call that began before it
 * was retired has left (rl_calls_passed: the synced and local checks,
 * which hold no reference, are inside such a call) and (2) nothing holds
 * a reference: exact requests hold one until freed (they outlive their
 * call when async or abandoned), the I/O thread one for the generation it
 * serves.
 */
#ifndef RL_AGENT_GEN_H
#define RL_AGENT_GEN_H

#include "bucket.h"
#include "calls.h"
#include "config.h"
#include "ident.h"
#include "stats.h"

#include <stdatomic.h>
#include <stdbool.h>

typedef struct rl_gen {
    struct rl_gen *next;          /* retired, waiting to be freed */
    rl_config *owned;             /* NULL when the config is borrowed */
    const rl_config *config;
    rl_bucket_args *args;         /* one per rule, by rule index */
    rl_ident **idents;            /* likewise */
    rl_stats stats;               /* checks decided under it */
    bool has_synced, has_local, has_exact, has_leased;
    bool has_fallback;            /* a rule with on_error: local */
    /* A synced rule, or an on_error: local one without fleet_size: the
     * agent talks to the aggregators (for the latter, to learn the fleet's
     * size from the counts its presence reports make). */
    bool needs_sync;
    /* Every rule plain or by_value (bucket.h), one by_value at least:
     * checks go straight to check.c's path for such rules. */
    bool by_value;
    atomic_long refs;
    rl_calls_mark retired_at;     /* the calls begun when it was retired */
} rl_gen;

/* A generation of config (owned: freed with it, on RL_OK only), its
 * identities taken from the list at *idents. RL_ENOMEM, or RL_OK with
 * *out. Under the reload lock. */
int rl_gen_new(const rl_config *config, rl_config *owned, rl_ident **idents,
               rl_gen **out);

/* Frees it and drops its identities (the caller sweeps them). */
void rl_gen_free(rl_gen *g);

static inline void rl_gen_ref(rl_gen *g)
{
    atomic_fetch_add_explicit(&g->refs, 1, memory_order_relaxed);
}

/* Release: what the holder did happens before the free. Never frees. */
static inline void rl_gen_unref(rl_gen *g)
{
    atomic_fetch_sub_explicit(&g->refs, 1, memory_order_release);
}

/* Adds the generation's counters into the identities' retired ones and
 * the request counts into *requests. */
void rl_gen_fold_stats(rl_gen *g, rl_agent_counters *requests);

/* Adds g's request counts into requests and hands each rule's counters,
 * with the rule's identity, to each. */
void rl_gen_add_stats(const rl_gen *g, rl_agent_counters *requests,
                      void (*each)(rl_ident *id, const rl_rule_counters *c,
                                   void *arg),
                      void *arg);
void rl_rule_counters_add(rl_rule_counters *into, const rl_rule_counters *c);

#endif
