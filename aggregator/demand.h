/*
 * demand.h: what each region asks of a global rule's keys, and the part of
 * a key's room that this region takes by it. A region's demand for a key
 * is the requests its agents were offered, admitted or refused, over the
 * trailing period (the sub-windows of the rule's span): the room is split
 * so, because what a region admits is only its share of the room, and a
 * split by what was admitted would keep every region at the share it
 * started with. Private to rl-aggregator.
 */
#ifndef RL_AGGREGATOR_DEMAND_H
#define RL_AGGREGATOR_DEMAND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct rl_demand rl_demand;

/* n_regions (at most RL_REGIONS_MAX); at most max_keys keys are tracked:
 * a key beyond them is not noted, and its room splits evenly. NULL
 * without memory. */
rl_demand *rl_demand_new(size_t n_regions, size_t max_keys);
void rl_demand_free(rl_demand *d);

/* Of the key (rule, value) in region r, in sub-window w of the rule's
 * sub-windows: admitted requests (a give-back's estimate among them) and
 * refused ones; offered is their sum. A sub-window over two spans
 * before the latest noted for that region is out of every span parts are
 * read in (at most a span behind it): not noted. Returns false when the key is new and the table is full. */
bool rl_demand_note(rl_demand *d, const char *rule, const char *value,
                    size_t value_len, size_t r, uint64_t w,
                    uint64_t admitted, uint64_t refused);

/* Every region's part of the key's room, in millionths
 * (RL_WIRE_SHARE_WHOLE), into parts[n_regions]: its demand over every
 * region's, each read in the span that ends at sub-window at, rounded
 * down (they never add up to more than the room); even parts when no
 * demand is known. While a region is cut off (cut), the parts the key
 * last had, which the other regions, cut off at the same moment, keep
 * too: so the parts still add up to the room, and no region takes the
 * whole limit. The same when at is over a span behind a region's latest
 * sub-window noted: the span is no longer held. */
void rl_demand_parts(rl_demand *d, const char *rule, const char *value,
                     size_t value_len, uint64_t at, bool cut,
                     uint64_t *parts);

/* Forgets the keys whose every region's last sub-window noted is before
 * w_of(rule) - 2 spans: idle for two periods. */
void rl_demand_sweep(rl_demand *d, uint64_t now_ms,
                     uint64_t (*g_of)(void *, const char *rule), void *arg);

/* Keys tracked, and keys not noted because the table was full. */
size_t rl_demand_keys(const rl_demand *d);
uint64_t rl_demand_refused(const rl_demand *d);

#endif
