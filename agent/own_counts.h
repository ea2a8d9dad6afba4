/*
 * own_counts.h: what one agent counted of a synced key, by sub-window of
 * Redis's clock (wire.h), for the last RL_OWN_WINDOWS sub-windows: the
 * I/O thread records the counts at each tick (and before each report)
 * into the sub-window of that moment, as the agent knows Redis's clock.
 * Two uses: a report names the sub-window each of its counts was made in
 * (held reports then weigh what they weighed when their requests were
 * admitted), and while no aggregator can give a key's totals the agent
 * enforces its share of the limit over a trailing period of these counts
 * (synced.c). Private to librl; I/O thread only.
 *
 * A third: a hold's give-back of an estimate already recorded is owed to
 * the sub-window the estimate was recorded in, and the next report takes
 * it off there (sync.c), while that sub-window is still kept.
 *
 * Counts are reported, acknowledged and held in the totals oldest first,
 * so "the counts after the first n" are always the newest: a split walks
 * back from the newest sub-window.
 */
#ifndef RL_AGENT_OWN_COUNTS_H
#define RL_AGENT_OWN_COUNTS_H

#include "wire.h"

#include <stddef.h>
#include <stdint.h>

/* A trailing period is RL_WIRE_SUBWINDOWS sub-windows and the oldest one
 * before them (wire.h): the span any count can still matter to. */
#define RL_OWN_WINDOWS (RL_WIRE_SUBWINDOWS + 1)

typedef struct rl_own_counts {
    uint64_t by_window[RL_OWN_WINDOWS]; /* by sub-window mod RL_OWN_WINDOWS */
    uint64_t newest;  /* the newest sub-window recorded; 0: none yet */
    uint64_t basis;   /* what numbers them (rl_own_record) */
    uint64_t counted; /* counted, as of the last record */
    /* By sub-window too: uv_hrtime of the last record into it (0: none),
     * and the give-backs owed to it, not yet reported. */
    uint64_t recorded_ns[RL_OWN_WINDOWS];
    uint64_t back[RL_OWN_WINDOWS];
    uint64_t left_ns; /* the last record into a sub-window the ring left */
} rl_own_counts;

/* One part of a split: count counts made in sub-window window. */
typedef struct rl_own_part {
    uint64_t window;
    uint64_t count;
} rl_own_part;

/* rl_own_record puts what was counted since the last record (counted
 * being the key's total now) in sub-window `window` (a window before the
 * newest, the clock's estimate having moved back, goes to the newest).
 * basis says what numbers the sub-windows: their length (a reload may
 * change the period) and the clock (the wall clock stands for Redis's
 * until the agent hears it, and the two can be hours apart). A new basis
 * starts over with every count so far in `window`: later rather than
 * lost, or sent in a sub-window no span holds; the give-backs owed, named
 * by the old basis, are dropped. Sub-windows that leave the ring drop
 * theirs: their estimates no longer count in any span. */
void rl_own_record(rl_own_counts *o, uint64_t window, uint64_t basis,
                   uint64_t counted);

/* rl_own_split writes the counts recorded after the first `upto`, newest
 * sub-window first, into parts (RL_OWN_WINDOWS + 1 of them at most; only
 * sub-windows holding some), and returns how many. Counts older than
 * every sub-window kept come last, in the sub-window just before them
 * (one no span holds any more). */
size_t rl_own_split(const rl_own_counts *o, uint64_t upto,
                    rl_own_part parts[RL_OWN_WINDOWS + 1]);

/* The last record, into the newest sub-window, began at ns (uv_hrtime,
 * taken before it read the counts). */
void rl_own_recorded_at(rl_own_counts *o, uint64_t ns);

/* The sub-window a count made at ns (uv_hrtime) was recorded in: the
 * first record's that began at or after ns; 0 when none kept did (not
 * recorded yet, or its sub-window has left the ring). */
uint64_t rl_own_window_of(const rl_own_counts *o, uint64_t ns);

/* Owes a give-back of n to sub-window `window`, still in the ring. */
void rl_own_give_back(rl_own_counts *o, uint64_t window, uint64_t n);

/* The give-backs owed, newest sub-window first, into parts; how many. */
size_t rl_own_backs(const rl_own_counts *o,
                    rl_own_part parts[RL_OWN_WINDOWS + 1]);

/* They are reported (or dropped): none owed. */
void rl_own_backs_clear(rl_own_counts *o);

/* The counts recorded in sub-windows lo..newest. */
uint64_t rl_own_since(const rl_own_counts *o, uint64_t lo);

/* Of those, the ones among the first `upto` counted. */
uint64_t rl_own_since_before(const rl_own_counts *o, uint64_t lo,
                             uint64_t upto);

#endif
