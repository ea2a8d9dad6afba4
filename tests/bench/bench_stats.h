/*
 * bench_stats.h: the clock, the ordering and the summaries the benchmarks
 * share: min / median / max over runs, percentiles over latency samples.
 */
#ifndef RL_BENCH_STATS_H
#define RL_BENCH_STATS_H

#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

/* Seconds on the monotonic clock. */
static inline double bench_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Whether RL_BENCH_QUICK asks for a short run, to try the benchmarks out:
 * fewer and shorter runs, whose figures are not for quoting. */
static inline int bench_quick(void)
{
    const char *q = getenv("RL_BENCH_QUICK");
    return q != NULL && *q != '\0' && *q != '0';
}

/* CPU seconds of this thread (CLOCK_THREAD_CPUTIME_ID) or this process
 * (CLOCK_PROCESS_CPUTIME_ID), user and system. */
static inline double bench_cpu_s(clockid_t which)
{
    struct timespec ts;
    clock_gettime(which, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* For qsort over doubles, to take min / median / max of runs. */
static inline int bench_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static inline int bench_cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

typedef struct bench_summary {
    double min, median, max;
} bench_summary;

/* Of n runs; sorts a copy, v is left as it was. */
static inline bench_summary bench_summarize(const double *v, int n)
{
    double s[64];
    n = n < 64 ? n : 64;
    for (int i = 0; i < n; i++)
        s[i] = v[i];
    qsort(s, (size_t)n, sizeof s[0], bench_cmp_double);
    return (bench_summary){s[0], s[n / 2], s[n - 1]};
}

/* Latency samples in microseconds, written by any thread, read after the
 * writers have stopped. Samples past the capacity are dropped. */
typedef struct bench_latency {
    float *us;
    size_t cap;
    atomic_size_t n;
} bench_latency;

static inline void bench_latency_add(bench_latency *l, double us)
{
    size_t i = atomic_fetch_add_explicit(&l->n, 1, memory_order_relaxed);
    if (i < l->cap)
        l->us[i] = (float)us;
}

/* The p-th percentile (0..100); sorts the samples. */
static inline double bench_latency_percentile(bench_latency *l, double p)
{
    size_t n = atomic_load(&l->n);
    n = n < l->cap ? n : l->cap;
    if (n == 0)
        return 0;
    qsort(l->us, n, sizeof l->us[0], bench_cmp_float);
    size_t i = (size_t)(p / 100.0 * (double)n);
    return l->us[i < n ? i : n - 1];
}

#endif
