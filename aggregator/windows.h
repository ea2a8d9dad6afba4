/*
 * windows.h: the aggregator's side of Redis: window keys, and the reports
 * applied by the window function (window_call.h), each once, those that
 * arrive while a call is at Redis gathered into the next call. Private to
 * rl-aggregator.
 */
#ifndef RL_AGGREGATOR_WINDOWS_H
#define RL_AGGREGATOR_WINDOWS_H

#include "config.h"
#include "store.h"
#include "window_call.h"
#include "wire.h"

#include <stdint.h>

/* One report entry after it was applied (see windows.c and wire.h). */
typedef struct rl_window_total {
    uint64_t window;   /* the sub-window w it was read in */
    uint64_t current;  /* recent: sub-windows w-N+1..w */
    uint64_t previous; /* oldest: sub-window w-N */
    uint64_t agents;   /* of its rule */
    size_t n_leaving;  /* the counts of w-N+1, w-N+2, ... (LEAVING) */
    uint64_t leaving[RL_WIRE_LEAVING_MAX];
} rl_window_total;

/* Called once per rl_windows_apply: duplicate says the report had been
 * applied before (and was not counted again); totals has one element per
 * report entry, presence_agents one per presence rule (its agent count).
 * On failure both are NULL and error says why. */
typedef void (*rl_windows_fn)(void *arg, bool duplicate,
                              const rl_window_total *totals,
                              const uint64_t *presence_agents,
                              const char *error);

/* A call holds Redis, single-threaded, from every other client: an exact
 * check waiting behind it has store.timeout_ms (50 ms by default) in all.
 * So a gathered call takes in the parts queued only while their entries,
 * at the cost per entry that recent calls measured by Redis's clock, fit
 * RL_WINDOWS_CALL_US; and on one server a report of more than
 * RL_WINDOWS_PIECE entries is applied in pieces of that many (by their
 * order in the report), each checked against a sequence key of its own,
 * rl:agg:piece:<k>:<agent>[/<stream>], so that a report whose call failed
 * part-way is applied again only by the pieces that failed. A piece of
 * fresh keys, the costliest entries (a new hash each), takes about
 * RL_WINDOWS_CALL_US (docs/performance.md). */
#define RL_WINDOWS_CALL_US 2000
#define RL_WINDOWS_PIECE 128

/* Reports being applied through one store. */
typedef struct rl_windows rl_windows;

/* A gathered call carries at most max_entries report entries (a single
 * report more if it is larger); a report keeps its agent live in its rules
 * for RL_WIRE_LIVE_INTERVALS sync intervals of interval_ms, and its
 * entries' totals carry what LEAVING needs at that interval. NULL without
 * memory. */
rl_windows *rl_windows_new(rl_store *store, size_t max_entries,
                           uint64_t interval_ms);
/* Once no report is being applied (or the store closed). */
void rl_windows_free(rl_windows *ws);

/* rl_windows_apply adds the counts of a decoded report into the
 * sub-windows its entries name, or of now_ms (Redis's clock) for those
 * that name none (windows.c), and the agent into the agent sets of its
 * entries' rules and of presence[0..n_presence); every entry is answered
 * with its key's totals read at now_ms. rules[i] is the synced rule of
 * entry i. */
void rl_windows_apply(rl_windows *ws, const rl_wire_msg *report,
                      const rl_rule *const *rules,
                      const rl_rule *const *presence, size_t n_presence,
                      uint64_t now_ms, rl_windows_fn fn, void *arg);

/* Called once per rl_windows_leave: agents has each rule's agent count
 * without the agent, or is NULL and error says why. */
typedef void (*rl_windows_leave_fn)(void *arg, const uint64_t *agents,
                                    const char *error);

/* rl_windows_leave takes the agent out of the live sets of rules[0..n)
 * at once (its GOODBYE), rather than live_ms after its last report. */
void rl_windows_leave(rl_windows *ws, rl_wire_bytes agent,
                      const rl_rule *const *rules, size_t n_rules,
                      uint64_t now_ms, rl_windows_leave_fn fn, void *arg);

#endif
