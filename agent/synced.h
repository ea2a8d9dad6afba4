/*
 * synced.h: the agent's local counters for synced rules, and the decision
 * they make with no network call. Private to librl.
 *
 * Threads: rl_synced_check runs on gateway threads, lock-free once a key
 * has been seen; everything else runs on the agent's I/O thread.
 */
#ifndef RL_AGENT_SYNCED_H
#define RL_AGENT_SYNCED_H

#include "bucket.h"
#include "calls.h"
#include "graves.h"
#include "config.h"
#include "ident.h"
#include "keys.h"
#include "own_counts.h"
#include "thread_slot.h"
#include "wire.h"

#include <pthread.h>
#include <stddef.h>
#include <stdatomic.h>
#include <stdint.h>

/* One (rule, value): local counts, and the room the I/O thread last worked
 * out for it. */
typedef struct rl_synced_entry {
    /* I/O thread only. */
    uint64_t reported;   /* counted and put in a report */
    uint64_t acked;      /* counted and known applied */
    /* Whether the last TOTALS snapshot holds the last acknowledged report:
     * it does when that report's ack was built before the snapshot was
     * taken (both times are the aggregator's reading of Redis's clock).
     * A slow agent can hear a snapshot after an ack it predates. */
    uint64_t acked_prior; /* acked before the last ack */
    uint64_t acked_ms;    /* the last ack's Redis ms (UINT64_MAX: unknown) */
    uint64_t snap_ms;     /* the last TOTALS snapshot's Redis ms */
    uint64_t in_report;  /* in the reports waiting for their acks (after a
                          * failover, two streams' may hold it) */
    uint64_t spread;     /* rl_partition_key's, once known */
    bool spread_known;
    uint8_t owner;       /* the aggregator it is reported to, as the last
                          * tick (or stop) assigned it */
    uint64_t window;     /* the sub-window the totals below were read in */
    uint64_t totals_ms;  /* the Redis ms of the message that brought them */
    uint64_t back_ms;    /* the Redis ms of the ack of this agent's last
                          * give-back: totals read after it may be lower */
    uint64_t window_g;   /* its length in ms, the period's it is of */
    uint64_t current;    /* recent: fleet total of sub-windows w-N+1..w */
    uint64_t previous;   /* oldest: fleet total of sub-window w-N */
    uint64_t current_ms; /* the Redis ms of the message current came in */
    /* The counts of w-N+1, w-N+2, ... that current holds, read with it
     * (LEAVING, wire.h); none once another current is noted. */
    uint64_t leaving[RL_WIRE_LEAVING_MAX];
    uint8_t n_leaving;
    bool partial;        /* the totals below came with an ack since the
                          * last TOTALS: they may miss reports others
                          * made at the same moment */
    uint64_t mark_window; /* the sub-window whose estimate the mark was
                           * last worked out from (0: none, or degraded) */
    uint64_t last_counted; /* counted at the last tick, to see idleness */
    uint64_t recorded_ns; /* uv_hrtime just before the last record read
                           * the counts: a check after it is unrecorded */
    /* Counted, answered and not counted by the fleet: its aggregator has
     * no such synced rule (a reload removed it there); refused says the
     * last answer for the key was so. Degraded while it is. */
    uint64_t refused_counts;
    bool refused;
    /* Loop ms since which its aggregator's totals have come numbered in
     * another period than the rule's here (a reload reached one side
     * first); 0 once they are of its own. Degraded after ten
     * aggregator.stale_after_ms of it (sync.c). */
    uint64_t foreign_ms;
    rl_own_counts own;   /* this agent's counts by sub-window */
    /* Degraded (no aggregator gives the key's totals): the fleet's count
     * the last totals held, which this agent's share starts from, and
     * this agent's part in them (synced.c). */
    uint64_t seed_window;  /* the sub-window they were read in */
    uint64_t seed_used;    /* their estimate of the trailing period */
    uint64_t seed_own;     /* this agent's counts in it, as recorded */
    uint64_t seed_counted; /* what this agent counted that they hold */
    uint64_t degraded_counted; /* counted by the last degraded tick */
    uint8_t report_parts; /* in the report being built: its entries */
    uint8_t report_backs; /* and its give-backs' (after them) */
    uint64_t active_ms;  /* loop ms of the first tick that saw it, or that
                          * saw new counts */
    /* A global rule's (scope: global): the refusals put in reports so
     * far (its region's demand, with its counts), and this region's part
     * of the key's room as the last TOTALS said it, in millionths
     * (RL_SYNCED_SHARE_EQUAL before any: an equal part per region), read
     * by a check's retune too. */
    uint64_t refusals_reported;
    atomic_uint_least32_t region_share;
    /* Refused so far, ever, a global rule's: per thread slot as counts
     * are, written on a refusal only, never read by a check. Lines of
     * their own: refusing threads do not share them with the I/O
     * thread's fields. */
    _Alignas(RL_CACHE_LINE) atomic_uint_least64_t refusals[RL_THREAD_SLOTS
                                                           + 1];
    /* Counted so far, ever: one counter per thread slot, each written by
     * its slot's thread alone (the shared slot's by atomic adds). They sit
     * together, a check reads those in use; so do the fields a decision
     * needs, which the I/O thread writes once per totals. */
    _Alignas(RL_CACHE_LINE) atomic_uint_least64_t counts[RL_THREAD_SLOTS
                                                         + 1];
    atomic_uint_least64_t room;       /* fleet room at the mark, headers */
    atomic_uint_least64_t counted_at_mark;
    atomic_uint_least64_t reset_ms;   /* until the window ends */
    /* What finding the entry reads, with the mark, on one line: the key's
     * first bytes included. Written before the entry is published (the
     * mark and retry by the I/O thread, too). */
    _Alignas(RL_CACHE_LINE) atomic_uint_least64_t mark; /* admit while
                                                   counted + cost <= mark */
    atomic_uint_least64_t retry_ms;   /* when full: wait hint */
    /* The limit the key was last checked at (an override's or the rule's
     * own; synced overrides keep the rule's period): marks are worked out
     * from it, not from the rule's. */
    atomic_uint_least64_t limit;
    rl_ident *ident;     /* the rule's: stable across reloads */
    uint64_t hash;
    uint16_t value_len;
    /* No aggregator gives the key's totals: the rule's on_error decides,
     * with on_error: local from the mark, this agent's share. Written by
     * the I/O thread. */
    atomic_bool degraded;
    /* A global rule's key whose last TOTALS said a region is not heard:
     * its share still decides (that region keeps its last part), and the
     * decisions say degraded. Written by the I/O thread. */
    atomic_bool cut;
    char value[];
} rl_synced_entry;

_Static_assert(offsetof(rl_synced_entry, mark)
                   - offsetof(rl_synced_entry, counts) == 2 * RL_CACHE_LINE,
               "the counts and the decision's fields fill two lines");

/* A global rule's key's region_share before any TOTALS gave one: every
 * region takes an equal part of the room (each taking all of it would
 * admit the limit once per region at a cold start). */
#define RL_SYNCED_SHARE_EQUAL UINT32_MAX

typedef struct rl_synced_table {
    size_t cap;                         /* slots, a power of two */
    _Atomic(rl_synced_entry *) slots[];
} rl_synced_table;

typedef struct rl_synced {
    const rl_config *config;            /* the aggregator settings only */
    _Atomic(rl_synced_table *) table;
    pthread_mutex_t insert_lock;        /* first sightings and rebuilds */
    atomic_size_t n_entries;
    size_t max_keys;
    atomic_uint_least64_t keys_refused; /* the cap was hit */
    /* Server (Redis) time as of the last message, on the loop's clock. */
    uint64_t server_ms, server_at_loop_ms;
    uint64_t salt;      /* this agent's, for the share's rounding coin */
    /* Tables and entries retired by a rebuild, freed once no check can
     * hold them. */
    rl_graves graves;
} rl_synced;

/* calls: the agent's (calls.h): what rebuilds retire is freed only once
 * every check that might still read it has left. */
int rl_synced_init(rl_synced *s, const rl_config *config, rl_calls *calls);
void rl_synced_fini(rl_synced *s);

/* How a synced check was decided. */
typedef enum rl_synced_verdict {
    RL_SYNCED_SHARED,    /* from the fleet's totals: this agent's share */
    /* Degraded, on_error: local: from this agent's share of the limit
     * over a trailing period of its own counts (out is its answer). */
    RL_SYNCED_LOCAL,
    /* The rule's on_error decides: the key is over the cap (nothing
     * counted), or degraded with on_error allow (counted) or deny. */
    RL_SYNCED_ON_ERROR,
    /* From this agent's share, as RL_SYNCED_SHARED, of a global rule's
     * key while a region is cut off (synced_entry.cut): degraded. */
    RL_SYNCED_CUT,
} rl_synced_verdict;

/* rl_synced_check decides one synced rule for a value at rate (the rule's
 * own, or an override's), counting cost when it allows (and, for a global
 * rule, when it refuses, as refused: its region's demand); id is the
 * rule's identity (entries are found by it). A key last checked at another limit
 * moves its mark by the difference at once. Lock-free once the key exists;
 * the first sighting of a key takes a lock and allocates. Returns RL_OK
 * with *out and *verdict filled in (a full table makes the rule decide as
 * if the store were away: on_error), or RL_ENOMEM. */
int rl_synced_check(rl_synced *s, const rl_rule *rule, rl_ident *id,
                    const rl_limit *rate, const char *value,
                    size_t value_len, uint32_t cost, rl_bucket_reply *out,
                    rl_synced_verdict *verdict);
/* The same for a value whose rl_key_hash_value (keys.h) the caller has
 * already worked out (to look it up in the rule's overrides). */
int rl_synced_check_hashed(rl_synced *s, const rl_rule *rule, rl_ident *id,
                           const rl_limit *rate, const char *value,
                           size_t value_len, uint64_t value_hash,
                           uint32_t cost, rl_bucket_reply *out,
                           rl_synced_verdict *verdict);

/* Starts loading the table slot where the value whose rl_key_hash_value
 * is value_hash would be, for a check about to look up something else
 * first (its overrides): the two lookups wait for memory together. */
static inline void rl_synced_prefetch(rl_synced *s, const rl_ident *id,
                                      uint64_t value_hash)
{
    rl_synced_table *t = atomic_load_explicit(&s->table,
                                              memory_order_acquire);
    uint64_t h = rl_key_hash_salt(value_hash, (uintptr_t)id);
    __builtin_prefetch(&t->slots[h & (t->cap - 1)]);
}

/* I/O thread: Redis's clock as the aggregator last told it. */
void rl_synced_set_time(rl_synced *s, uint64_t server_ms, uint64_t loop_ms);
uint64_t rl_synced_now(const rl_synced *s, uint64_t loop_ms);

/* I/O thread: the counts of the sub-windows after the oldest that the
 * totals read in window hold (LEAVING, wire.h), from the message of
 * now_ms; kept only if the entry's recent came in that message's TOTALS,
 * so that each is taken off what holds it once it has left the span. */
void rl_synced_note_leaving(rl_synced_entry *e, uint64_t window,
                            uint64_t now_ms, const uint64_t *counts,
                            size_t n);

/* I/O thread: find an entry (no insert). */
rl_synced_entry *rl_synced_find(rl_synced *s, const rl_ident *id,
                                const char *value, size_t value_len);

/* I/O thread: new totals for an entry (wire.h: the sub-window they were
 * read in, recent, oldest, and now_ms, the clock of the message that
 * brought them; the newest sub-window wins, and within one the largest
 * counts: totals only grow, but for this agent's give-backs, which totals
 * read after their ack hold, and the newest such reading wins). False,
 * and nothing noted, when their
 * sub-window is not one of the rule's period here (synced.c). */
bool rl_synced_note_totals(rl_synced *s, rl_synced_entry *e, uint64_t window,
                           uint64_t now_ms, uint64_t current,
                           uint64_t previous);

/* I/O thread: work out a key's room again, by its rule as the I/O
 * thread's generation has it (nothing for a rule no longer there). With
 * fresh_share the key gets a new share of what is left (at each tick and
 * TOTALS message, unless its totals came with an acknowledgement since the
 * last TOTALS, and when a reload changed the rule),
 * which replaces the last: mark = acked + share; without, its mark can
 * only come down. */
void rl_synced_rebalance(rl_synced *s, rl_synced_entry *e, uint64_t loop_ms,
                         bool fresh_share);

/* I/O thread, at an edge of the key's sub-windows: the room that the
 * sub-windows the totals hold and that left the span since the mark was
 * worked out give back, this agent's share of it, added to the mark (a
 * degraded key's mark is worked out again). */
void rl_synced_edge(rl_synced *s, rl_synced_entry *e, uint64_t loop_ms);

/* I/O thread: records what the key counted since the last record in the
 * sub-window of at_ms, Redis's clock (0: now, or, before the agent has
 * heard that clock, the wall clock that stands for it); nothing for a
 * rule reloaded away (its counts go out in one entry). */
void rl_synced_record(rl_synced *s, rl_synced_entry *e, uint64_t loop_ms,
                      uint64_t at_ms);

/* I/O thread: whether the key's own counts are recorded by Redis's clock
 * (not yet the wall clock that stands for it), and the time in Redis's
 * clock at which one of their sub-windows starts. */
bool rl_synced_by_redis(const rl_synced_entry *e);
uint64_t rl_synced_window_start(const rl_synced_entry *e, uint64_t window);

/* I/O thread: the key's totals can no longer be had (degraded) or can
 * again. Degraded, its mark is this agent's share of the limit over a
 * trailing period of its own counts, starting from the totals it last
 * noted (rl_synced_rebalance), until rl_synced_recover: its next rebalance
 * gives it a share of the fleet's room again. */
void rl_synced_degrade(rl_synced_entry *e);
void rl_synced_recover(rl_synced_entry *e);

/* I/O thread: whether a degraded key may go back to shares: what it
 * counted while degraded is acknowledged, and the last TOTALS snapshot
 * holds that acknowledgement (the share would otherwise give out again
 * what it admitted meanwhile). */
bool rl_synced_settled(const rl_synced_entry *e);

/* The counts of an entry, summed over its thread slots. */
uint64_t rl_synced_counted(const rl_synced_entry *e);

/* A global rule's key's refusals so far, summed over its thread slots. */
uint64_t rl_synced_refused(const rl_synced_entry *e);

/* I/O thread: a global rule's key's last TOTALS said its region's part of
 * the room (millionths, wire.h) and whether a region is cut off. The next
 * rebalance gives shares of that part; cut marks the key's decisions
 * degraded. */
void rl_synced_note_region(rl_synced_entry *e, uint64_t share, bool cut);

/* I/O thread: drop keys idle for more than two of their periods, and free
 * what earlier rebuilds retired. */
void rl_synced_sweep(rl_synced *s, uint64_t loop_ms);

/* I/O thread: a hold's difference delta for (id, value), its estimate
 * counted by a check at checked_ns (uv_hrtime). An excess is counted as a
 * check's cost is, so the next report carries it and the fleet's count
 * holds the actual cost. A give-back (delta < 0) comes off the counts
 * while the estimate is still unrecorded (checked after the last record),
 * never below what is unrecorded: the next report carries the actual
 * cost, in the sub-window the estimate would have gone to, and this
 * agent's checks see it at once. The rest, of an estimate already
 * recorded, is owed to the sub-window it was recorded in (own_counts.h):
 * the next report takes it off there, if every aggregator reads
 * give-backs (sync.c), and the agent's room grows once the fleet's totals
 * hold it; else it is dropped and the fleet keeps counting the estimate,
 * admitting less (design.md). */
void rl_synced_settle(rl_synced *s, rl_ident *id, const char *value,
                      size_t value_len, int64_t delta, uint64_t checked_ns);

#endif
