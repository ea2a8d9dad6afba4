/*
 * regions.h: what a global rule's counts do in the aggregator beside
 * being applied: this region's go to the other regions (exchange.h), every
 * region's demand is noted (demand.h), and each key's TOTALS carry this
 * region's part of its room. Private to rl-aggregator.
 */
#ifndef RL_AGGREGATOR_REGIONS_H
#define RL_AGGREGATOR_REGIONS_H

#include "aggregator.h"

#include <stdbool.h>
#include <stdint.h>

/* The demand table, without regions nothing. 0, or -1 with a message. */
int rl_regions_start(rl_aggregator *agg, char *err, size_t errlen);
void rl_regions_stop(rl_aggregator *agg);

/* An entry of this region's agents, applied here (not a duplicate). */
void rl_regions_local_count(rl_aggregator *agg, const rl_rule *rule,
                            const rl_wire_entry *e, uint64_t now_ms);

/* An entry of region r's exchange, the first time this aggregator sees
 * it. */
void rl_regions_note_demand(rl_aggregator *agg, const rl_rule *rule,
                            const rl_wire_entry *e, size_t r);

/* The entries of region r's exchange that this region's Redis applied
 * (not a duplicate): each region's counts of a key, for rlctl, go to
 * <prefix><value>:r:<region>:<w> (in the key's slot on a cluster), one
 * string per sub-window that expires with the key's counts: a view, as
 * they are written after the counts, not with them. */
void rl_regions_applied(rl_aggregator *agg, size_t r,
                        const rl_wire_entry *entries, size_t n);

/* What a global key's TOTALS say to this region's agents: its part of
 * the room (millionths), whether a region is cut off (*cut), and *more,
 * to add to the recent count so that the agents also take off their room
 * each other region's part of what this region admitted that its totals
 * do not carry yet (rl_exchange_unheard): with every region so,
 * the parts given out add up to the room (docs/regions.md). */
uint64_t rl_regions_share(rl_aggregator *agg, const rl_rule *rule,
                          const char *value, size_t value_len,
                          uint64_t now_ms, bool *cut, uint64_t *more);

/* Every interval: keys idle for two periods are forgotten. */
void rl_regions_sweep(rl_aggregator *agg, uint64_t now_ms);

#endif
