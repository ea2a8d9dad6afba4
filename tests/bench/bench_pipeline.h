/*
 * bench_pipeline.h: a minimal pipelined hiredis client, the yardstick the
 * exact path is measured against. It keeps a fixed number of requests in
 * flight on one connection; a request is one to three script calls, one
 * per rule, written back to back.
 */
#ifndef RL_BENCH_PIPELINE_H
#define RL_BENCH_PIPELINE_H

#include "bench_stats.h"

#include <hiredis/hiredis.h>

#define BENCH_KEYS 10000
#define BENCH_RULES_MAX 3

/* The key of rule r for value v, the same for every client measured. */
int bench_key(char *buf, size_t cap, int rule, long value);

/* What one request calls. */
typedef struct bench_script {
    const char *command; /* "FCALL" or "EVALSHA" */
    char name[64];       /* function name or SHA1 */
} bench_script;

/* Loads the seed's script verbatim (SCRIPT LOAD) and names its SHA1. */
void bench_seed_script(redisContext *c, bench_script *out);

typedef struct bench_load {
    int depth;           /* requests in flight */
    int rules;           /* calls per request */
    double seconds;      /* how long to run, or 0: ... */
    long requests;       /* ... this many requests, values 0, 1, 2... */
    long period_ms;      /* 100 tokens per period, cost 1 */
} bench_load;

typedef struct bench_result {
    double rate;         /* requests per second */
    double p50_us, p99_us;
    long errors;         /* replies that were errors */
} bench_result;

/* Runs the load on a new connection to addr; random values from
 * BENCH_KEYS when seconds > 0. lat collects latencies (may be NULL). */
bench_result bench_pipeline(const char *addr, const bench_script *s,
                            const bench_load *load, bench_latency *lat);

#endif
