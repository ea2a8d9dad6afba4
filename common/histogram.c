/*
 * histogram.c: see histogram.h. The bounds follow Prometheus's habit of
 * 1-2.5-5 steps; they cover a Redis round trip on loopback (tens of
 * microseconds) up to a store's deadline or a sync interval (seconds).
 */
#include "histogram.h"

static const uint64_t bounds_ns[RL_HISTOGRAM_BOUNDS] = {
    10000, 25000, 50000, 100000, 250000, 500000,
    1000000, 2500000, 5000000, 10000000, 25000000, 50000000,
    100000000, 250000000, 500000000,
    1000000000, 2500000000, 5000000000, 10000000000};

void rl_histogram_counts_init(rl_histogram_counts *h)
{
    for (int i = 0; i <= RL_HISTOGRAM_BOUNDS; i++)
        atomic_init(&h->in[i], 0);
    atomic_init(&h->sum_ns, 0);
}

void rl_histogram_observe(rl_histogram_counts *h, uint64_t ns)
{
    int b = 0;
    while (b < RL_HISTOGRAM_BOUNDS && ns > bounds_ns[b])
        b++;
    atomic_fetch_add_explicit(&h->in[b], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&h->sum_ns, ns, memory_order_relaxed);
}

void rl_histogram_read(const rl_histogram_counts *h, rl_histogram *out)
{
    uint64_t seen = 0;
    for (int i = 0; i < RL_HISTOGRAM_BOUNDS; i++) {
        seen += atomic_load_explicit(&h->in[i], memory_order_relaxed);
        out->le_s[i] = (double)bounds_ns[i] / 1e9;
        out->buckets[i] = seen;
    }
    out->count = seen + atomic_load_explicit(&h->in[RL_HISTOGRAM_BOUNDS],
                                             memory_order_relaxed);
    out->sum_s = (double)atomic_load_explicit(&h->sum_ns,
                                              memory_order_relaxed) / 1e9;
}
