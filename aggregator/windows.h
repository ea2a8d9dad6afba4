/*
 * windows.h: the aggregator's side of Redis: window keys, and the script
 * that adds one report's counts in one atomic step, skipping a report it has
 * applied before. Private to rl-aggregator.
 */
#ifndef RL_AGGREGATOR_WINDOWS_H
#define RL_AGGREGATOR_WINDOWS_H

#include "config.h"
#include "store.h"
#include "wire.h"

#include <stdint.h>

extern const rl_script_set rl_window_scripts;

/* One report entry after it was applied (see windows.c and wire.h). */
typedef struct rl_window_total {
    uint64_t window;   /* the sub-window w it was read in */
    uint64_t current;  /* recent: sub-windows w-N+1..w */
    uint64_t previous; /* oldest: sub-window w-N */
    uint64_t agents;   /* of its rule */
} rl_window_total;

/* Called once per rl_windows_apply: duplicate says the report had been
 * applied before (and was not counted again); totals has one element per
 * report entry, presence_agents one per presence rule (its agent count).
 * On failure both are NULL and error says why. */
typedef void (*rl_windows_fn)(void *arg, bool duplicate,
                              const rl_window_total *totals,
                              const uint64_t *presence_agents,
                              const char *error);

/* rl_windows_apply adds the counts of a decoded report into the
 * sub-windows of now_ms (Redis's clock), and the agent into the agent sets
 * of its entries' rules and of presence[0..n_presence). rules[i] is the
 * synced rule of entry i. */
void rl_windows_apply(rl_store *store, const rl_wire_msg *report,
                      const rl_rule *const *rules,
                      const rl_rule *const *presence, size_t n_presence,
                      uint64_t now_ms, rl_windows_fn fn, void *arg);

#endif
