/*
 * bench_stats.h: the clock and the ordering the benchmarks share.
 */
#ifndef RL_BENCH_STATS_H
#define RL_BENCH_STATS_H

#include <time.h>

/* Seconds on the monotonic clock. */
static inline double bench_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* For qsort over doubles, to take min / median / max of runs. */
static inline int bench_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

#endif
