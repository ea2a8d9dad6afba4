/*
 * ident.h: a rule's identity in one agent: (name, key_prefix, mode). It
 * outlives the config that named it, so that a reload which keeps a rule
 * keeps its state: the synced and local tables' entries point to it (and
 * salt their hash with it), and it holds what the agent knows of the rule
 * across configs (the aggregator's agent count, the counters of configs
 * already retired). Private to librl.
 *
 * Life: an identity is referenced by every rule generation that has the
 * rule and by every table entry of the rule. It is freed by the reload (or
 * the close) that finds it referenced by nothing: nothing can take a new
 * reference then, as only a live generation's check makes entries.
 */
#ifndef RL_AGENT_IDENT_H
#define RL_AGENT_IDENT_H

#include "config.h"

#include <stdatomic.h>
#include <stdbool.h>

typedef struct rl_ident {
    struct rl_ident *next;        /* the agent's list, under its reload lock */
    char name[RL_NAME_MAX + 1];
    char key_prefix[RL_PREFIX_MAX + 1];
    rl_mode mode;
    atomic_long refs;
    /* Synced rules: agents reporting it, from the last totals; 0: not
     * yet. Written by the I/O thread, read by checks (and by on_error:
     * local's fallback, fallback.h). */
    atomic_uint_least64_t agents;
    /* The rule as the I/O thread's current generation has it; NULL when
     * that generation lacks it. I/O thread only. */
    const rl_rule *io_rule;
    bool io_changed;              /* its rate changed at the last apply */
    /* on_error: local without fleet_size was logged (I/O thread). */
    bool fleet_warned;
    /* A leased rule leased with no agent count known (I/O thread). */
    bool lease_fleet_warned;
    /* Synced rules, I/O thread: keys degraded (none of their aggregators
     * gives totals) as of the last tick, less those back on shares since;
     * the count the tick is making; since when the rule is degraded, as
     * logged (0: it is not). */
    size_t io_degraded_keys, io_degraded_counting;
    uint64_t io_degraded_ms;
    uint64_t io_recovered_ms;     /* when it last came back; 0: never */
    /* An aggregator refused its counts (it has no such synced rule), as
     * logged; false once they are taken again. */
    bool io_refused;
    /* Global rules, I/O thread: keys whose last TOTALS said a region is
     * cut off, as the tick is counting them; whether the rule is said to
     * be (region_cut logged, and region_healed not since). */
    size_t io_cut_counting;
    bool io_cut;
    /* Counters of generations already freed (under the reload lock). */
    rl_rule_counters retired;
} rl_ident;

static inline void rl_ident_ref(rl_ident *id)
{
    atomic_fetch_add_explicit(&id->refs, 1, memory_order_relaxed);
}

/* Never frees: rl_idents_sweep does, under the reload lock. */
static inline void rl_ident_unref(rl_ident *id)
{
    atomic_fetch_sub_explicit(&id->refs, 1, memory_order_release);
}

/* The identity of rule in the list at *head, made (and linked) if new;
 * with a reference for the caller. NULL when memory is out. Under the
 * reload lock. */
rl_ident *rl_idents_take(rl_ident **head, const rl_rule *rule);

/* Frees the identities nothing references any more. Under the reload
 * lock; all = true at close frees every one. */
void rl_idents_sweep(rl_ident **head, bool all);

/* How many identities the list holds (tests, stats). */
size_t rl_idents_count(rl_ident *const *head);

#endif
