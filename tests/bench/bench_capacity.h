/*
 * bench_capacity.h: Redis's own capacity for a script on this machine (the
 * bound the exact path is judged against), and the meter that accounts a
 * load's CPU on both sides of the connection: redis-server's from INFO cpu,
 * the client's from its CPU clock.
 */
#ifndef RL_BENCH_CAPACITY_H
#define RL_BENCH_CAPACITY_H

#include "bench_pipeline.h"

#include <hiredis/hiredis.h>
#include <time.h>

/* What a load cost, per script call. */
typedef struct bench_account {
    double calls;         /* script calls the server ran (commandstats) */
    double rate;          /* of them per second of wall clock */
    double server_usec;   /* inside the script command (commandstats) */
    double server_cpu_us; /* redis-server's whole CPU: reading, parsing,
                           * the command, writing the reply */
    double client_cpu_us; /* the client's CPU (its clock's) */
} bench_account;

typedef struct bench_meter {
    redisContext *ctl;    /* not the load's own connection */
    clockid_t clock;      /* the client's CPU clock */
    double start, cpu, server_cpu;
} bench_meter;

/* bench_meter_start resets the server's command statistics and notes the
 * clocks; bench_meter_stop reads them again. clock is
 * CLOCK_THREAD_CPUTIME_ID for a client on the calling thread,
 * CLOCK_PROCESS_CPUTIME_ID for one with threads of its own (librl). */
void bench_meter_start(bench_meter *m, redisContext *ctl, clockid_t clock);
bench_account bench_meter_stop(const bench_meter *m);

/* bench_capacity_run calls s as cheaply as a client can, for seconds (or
 * until every one of BENCH_KEYS keys has been called 90 times, under its
 * limit of 100 per period, so that every call is allowed, as in the runs it
 * is compared with): every command formatted before the run, written in
 * batches with two in flight, replies counted as lines instead of parsed.
 * Redis is then busy with the calls rather than waiting for them. */
bench_account bench_capacity_run(const char *addr, redisContext *ctl,
                                  const bench_script *s, long period_ms,
                                  double seconds);

#endif
