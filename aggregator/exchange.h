/*
 * exchange.h: a global rule's counts between regions (docs/regions.md).
 * What this aggregator applied of its region's agents' reports for global
 * rules goes, every interval, to every other region as one EXCHANGE (wire.h)
 * per region, to all that region's peers at once; the first to answer
 * applies it into that region's Redis, the others find it applied (one
 * sequence per sender, in Redis). The other regions' exchanges come in on
 * this aggregator's own peer address (ingest.c). Private to rl-aggregator.
 */
#ifndef RL_AGGREGATOR_EXCHANGE_H
#define RL_AGGREGATOR_EXCHANGE_H

#include "aggregator.h"

#include <stdbool.h>
#include <stdint.h>

/* Opens a REQ socket to every peer of every other region. 0, or -1 with a
 * message. Nothing to do without regions. */
int rl_exchange_start(rl_aggregator *agg, char *err, size_t errlen);
/* Closes the sockets (from the nng teardown thread) and frees. */
void rl_exchange_stop(rl_aggregator *agg);

/* A count of this region's agents, applied here: e of a global rule (its
 * at, or now_ms when it has none), into every other region's outbox. */
void rl_exchange_count(rl_aggregator *agg, const rl_rule *rule,
                       const rl_wire_entry *e, uint64_t now_ms);

/* Every interval: each other region gets the exchange it has not
 * acknowledged again, or the next one (empty: a heartbeat that says this
 * region is there). */
void rl_exchange_send(rl_aggregator *agg);

/* At a stop: true once every other region has acknowledged what this
 * one counted, or three intervals after since_ms (the stop) when one
 * does not answer (logged); until then sends what is left. */
bool rl_exchange_flushed(rl_aggregator *agg, uint64_t since_ms);

/* On the loop: the answers that came in. */
void rl_exchange_drain(rl_aggregator *agg);

/* The region an exchange names, by its index in the config, or -1 for
 * one not there (or this one). */
int rl_exchange_region(const rl_aggregator *agg, rl_wire_bytes name);

/* An exchange of sender (of region r) numbered seq arrived: r is heard
 * now. True the first time this aggregator sees that seq of that sender,
 * when its demand is to be noted (its counts go to Redis, which applies
 * each seq once, whoever got it first). */
bool rl_exchange_heard(rl_aggregator *agg, size_t r, rl_wire_bytes sender,
                       uint64_t seq);

/* Whether a region has not been heard for aggregator.stale_after_ms (or
 * ever, since this aggregator started): global keys keep the shares they
 * last had, and say so (cut). */
bool rl_exchange_cut(const rl_aggregator *agg);

/* An exchange of region r whose counts are now in this region's Redis
 * (applied, or found applied) says its agents' counts up to upto are. */
void rl_exchange_applied(rl_aggregator *agg, size_t r, uint64_t upto);

/* The snapshot: the latest moment (Redis's clock, ms) by which every other
 * region's counts are in this region's Redis, the earliest of their
 * exchanges' upto; 0 when a region's never were. This region's counts
 * after it are ones the others may not know of. */
uint64_t rl_exchange_snapshot_ms(const rl_aggregator *agg);

/* At each publish, before the totals; at_ms: the publish's moment (this
 * Redis's clock). The exchanges a region applied before that moment by
 * its own clock (its answer says when) are in the totals it publishes at
 * the same moment of its interval: its agents know of them from here on. */
void rl_exchange_publishing(rl_aggregator *agg, uint64_t at_ms);

/* What region r's agents have not heard of this region's counts of the
 * key (rule, value) in its span at now_ms: the counts applied here since
 * the last exchange r's totals carry (rl_exchange_publishing), whether
 * still in the outbox or sent, late reports too. */
uint64_t rl_exchange_unheard(const rl_aggregator *agg, size_t r,
                             const rl_rule *rule, const char *value,
                             size_t value_len, uint64_t now_ms);

/* Prometheus lines: per peer region, the time since it was last heard and
 * the age of the oldest count it has not acknowledged. */
void rl_exchange_render(const rl_aggregator *agg,
                        void (*put)(void *, const char *, ...), void *arg);

#endif
