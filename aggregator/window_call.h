/*
 * window_call.h: one call of the window function (rl_agg_8) for several
 * parts of reports at once, each checked against its own sequence key, the
 * counts of one key summed over the parts so that Redis adds them once.
 * Private to rl-aggregator; windows.c makes the parts.
 */
#ifndef RL_AGGREGATOR_WINDOW_CALL_H
#define RL_AGGREGATOR_WINDOW_CALL_H

#include "store.h"
#include "wire.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

extern const rl_script_set rl_window_scripts;
/* The scripts of rl_window_scripts, by index. */
#define RL_WINDOW_APPLY 0
#define RL_WINDOW_LEAVE 1

/* A rule's set of live agents, that a part adds its agent to, live until
 * until_ms (Redis's clock); answered with the rule's agent count at
 * now_ms. */
typedef struct rl_window_set {
    const char *key;
    size_t key_len;
    uint64_t now_ms, until_ms;
    uint64_t agents;  /* the answer */
    size_t slot;      /* its place in the call */
} rl_window_set;

/* A count for a client's hash of sub-windows, added to sub-window
 * count_window (at most window); answered with its totals read in
 * sub-window window, now's, and the counts of the n_leaving sub-windows
 * after the oldest (LEAVING, wire.h). */
typedef struct rl_window_count {
    const char *key;
    size_t key_len;
    uint64_t ttl_ms, window, count_window, count;
    uint64_t back;           /* a give-back: taken off count_window's */
    uint64_t g_ms;           /* the sub-windows' length: the rule's */
    size_t n_leaving;        /* at most RL_WIRE_LEAVING_MAX */
    uint64_t recent, oldest; /* the answer */
    uint64_t leaving[RL_WIRE_LEAVING_MAX];
    size_t slot;             /* its place in the call */
} rl_window_count;

#define RL_WINDOW_ERROR_MAX 256

/* What one part of a report asks of Redis: written only if its sequence
 * number is greater than the last applied under seq_key. */
typedef struct rl_window_part {
    const char *seq_key, *agent;
    size_t seq_key_len, agent_len;
    uint64_t seq;
    /* Known not to be new (the call found so, or seq is 0): it writes
     * nothing and is only answered. Set by the call. */
    bool duplicate;
    /* Set by the call when this part cannot be applied on its own terms
     * (one of its keys holds another type): the call applies the others
     * without it, and the part is answered with this. "" otherwise. */
    char error[RL_WINDOW_ERROR_MAX];
    size_t n_sets, n_counts;
    rl_window_set *sets;
    rl_window_count *counts;
    struct rl_window_part *next;   /* the parts of one call */
} rl_window_part;

/* Called once per rl_window_call: the answers are in the parts (and a
 * part's duplicate says whether it was applied before, its error whether
 * it failed alone), or error says why none is. redis_us is the time the
 * last call made took in Redis, by Redis's clock (0 when none answered),
 * and entries the counts it carried. */
typedef void (*rl_window_call_fn)(void *arg, rl_window_part *parts,
                                  uint64_t redis_us, size_t entries,
                                  const char *error);

/* rl_window_call applies the list of parts in one call (on a cluster their
 * keys must share a slot). The parts must stay valid until fn. */
void rl_window_call(rl_store *store, rl_window_part *parts,
                    rl_window_call_fn fn, void *arg);

#endif
