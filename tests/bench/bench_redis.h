/*
 * bench_redis.h: what the exact-path benchmarks do to their redis-server
 * besides checking: connect, run a command, read INFO. A failure here ends
 * the benchmark (a figure from a half-working setup would be wrong).
 */
#ifndef RL_BENCH_REDIS_H
#define RL_BENCH_REDIS_H

#include <hiredis/hiredis.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A blocking connection to "host:port". */
static inline redisContext *bench_connect(const char *addr)
{
    char host[64];
    int port;
    redisContext *c = NULL;
    if (sscanf(addr, "%63[^:]:%d", host, &port) == 2)
        c = redisConnect(host, port);
    if (c == NULL || c->err) {
        fprintf(stderr, "bench: cannot connect to %s\n", addr);
        exit(1);
    }
    return c;
}

/* Runs a command that must not fail; returns its reply. */
static inline redisReply *bench_command(redisContext *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static inline redisReply *bench_command(redisContext *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = redisvCommand(c, fmt, ap);
    va_end(ap);
    if (r == NULL || r->type == REDIS_REPLY_ERROR) {
        fprintf(stderr, "bench: %s: %s\n", fmt,
                r != NULL ? r->str : c->errstr);
        exit(1);
    }
    return r;
}

/* A command with no reply to read; cmd is a literal, split on spaces. */
#define bench_run(c, cmd) freeReplyObject(bench_command((c), cmd))

/* A number from INFO section, e.g. ("memory", "used_memory:"). */
static inline long long bench_info(redisContext *c, const char *section,
                                   const char *field)
{
    redisReply *r = bench_command(c, "INFO %s", section);
    const char *p = strstr(r->str, field);
    long long v = p != NULL ? atoll(p + strlen(field)) : -1;
    freeReplyObject(r);
    return v;
}

/* The CPU seconds redis-server has used since it started, all its threads,
 * user and system (INFO cpu; microsecond resolution). */
static inline double bench_server_cpu_s(redisContext *c)
{
    static const char *const fields[] = {"used_cpu_user:", "used_cpu_sys:"};
    redisReply *r = bench_command(c, "INFO cpu");
    double s = 0;
    for (int i = 0; i < 2; i++) {
        const char *p = strstr(r->str, fields[i]);
        s += p != NULL ? atof(p + strlen(fields[i])) : 0;
    }
    freeReplyObject(r);
    return s;
}

/* The scripting commands (FCALL, EVALSHA, EVAL) since the last CONFIG
 * RESETSTAT, from INFO commandstats: how many calls, and the server
 * microseconds spent inside them (the command alone: not reading the
 * request nor writing the reply). */
static inline void bench_script_stats(redisContext *c, double *calls,
                                      double *usec)
{
    static const char *const names[] = {"cmdstat_fcall:", "cmdstat_evalsha:",
                                        "cmdstat_eval:"};
    redisReply *r = bench_command(c, "INFO commandstats");
    *calls = *usec = 0;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        const char *p = strstr(r->str, names[i]);
        if (p == NULL)
            continue;
        const char *cp = strstr(p, "calls="), *up = strstr(p, "usec=");
        if (cp != NULL && up != NULL) {
            *calls += atof(cp + strlen("calls="));
            *usec += atof(up + strlen("usec="));
        }
    }
    freeReplyObject(r);
}

/* Server microseconds per scripting call since the last CONFIG RESETSTAT. */
static inline double bench_script_usec_per_call(redisContext *c)
{
    double calls, usec;
    bench_script_stats(c, &calls, &usec);
    return calls > 0 ? usec / calls : 0;
}

#endif
