/*
 * histogram.h: latency histograms with rl's fixed bucket bounds (10 us to
 * 10 s, rl.h's RL_HISTOGRAM_BOUNDS), counted without a lock and read out
 * as rl.h's rl_histogram, in Prometheus's cumulative shape. The agent
 * times its exact checks with one; rl-aggregator its Redis writes and
 * broadcasts. Private to librl and the daemons.
 */
#ifndef RL_COMMON_HISTOGRAM_H
#define RL_COMMON_HISTOGRAM_H

#include "rl.h"

#include <stdatomic.h>
#include <stdint.h>

/* Observations per bucket (not cumulative: one add per observation), the
 * last past the top bound, and their sum in nanoseconds (2^64 ns is 584
 * years of latency). Relaxed atomic adds: any thread may observe, any may
 * read. */
typedef struct rl_histogram_counts {
    atomic_uint_least64_t in[RL_HISTOGRAM_BOUNDS + 1];
    atomic_uint_least64_t sum_ns;
} rl_histogram_counts;

void rl_histogram_counts_init(rl_histogram_counts *h);

/* Counts one observation of ns nanoseconds. */
void rl_histogram_observe(rl_histogram_counts *h, uint64_t ns);

/* Fills *out: each bucket read once, summed into the cumulative buckets
 * and the count, so that out is consistent even while others observe. */
void rl_histogram_read(const rl_histogram_counts *h, rl_histogram *out);

#endif
