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

/* One report entry after it was applied. */
typedef struct rl_window_total {
    uint64_t window;
    uint64_t current;
    uint64_t previous;
    uint64_t agents;   /* of its rule */
} rl_window_total;

/* Called once per rl_windows_apply: duplicate says the report had been
 * applied before (and was not counted again); totals has one element per
 * report entry. On failure totals is NULL and error says why. */
typedef void (*rl_windows_fn)(void *arg, bool duplicate,
                              const rl_window_total *totals,
                              const char *error);

/* rl_windows_apply adds the counts of a decoded report into the windows
 * of now_ms (Redis's clock). rules[i] is the synced rule of entry i. */
void rl_windows_apply(rl_store *store, const rl_wire_msg *report,
                      const rl_rule *const *rules, uint64_t now_ms,
                      rl_windows_fn fn, void *arg);

#endif
