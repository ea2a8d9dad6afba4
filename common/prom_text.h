/*
 * prom_text.h: Prometheus's text exposition format (version 0.0.4), as
 * rl-gateway's and rl-aggregator's metrics pages write it: a family's HELP
 * and TYPE lines, and a histogram's samples. Names follow Prometheus's
 * conventions (base units, counters end in _total), which the metrics
 * tests check with promtool. Private to the daemons.
 */
#ifndef RL_COMMON_PROM_TEXT_H
#define RL_COMMON_PROM_TEXT_H

#include "rl.h"

/* Appends printf-style text to out (a buffer of the caller's kind). */
typedef void rl_prom_put(void *out, const char *fmt, ...);

/* The # HELP and # TYPE lines of a family; its samples follow. */
void rl_prom_family(rl_prom_put *put, void *out, const char *name,
                    const char *type, const char *help);

/* A histogram family, whole: HELP, TYPE, name_bucket{le="..."} for each
 * bound and le="+Inf", name_sum (seconds) and name_count. */
void rl_prom_histogram(rl_prom_put *put, void *out, const char *name,
                       const char *help, const rl_histogram *h);

#endif
