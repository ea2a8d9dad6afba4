/*
 * bench_alternatives.c: 16 clients, each on its own connection, race for
 * one bucket of 100 tokens (refilling 100 a day, so nothing comes back
 * during a round); each makes 50 attempts. Read-decide-write is the seed's
 * HMGET, decide, HSET as three separate steps: every client that reads
 * before another's write lands spends the same token. WATCH/MULTI/EXEC is
 * exact, and pays in transactions that fail and start again.
 */
#include "bench_alternatives.h"

#include "bench_pipeline.h"
#include "bench_redis.h"
#include "bench_report.h"
#include "bench_stats.h"
#include "scripts.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <time.h>

#define CLIENTS 16
#define ATTEMPTS 50
#define ROUNDS 5
#define CAPACITY 100.0
#define PER_MS (100.0 / 86400000.0)
#define HOT_KEY "bench:hot"

typedef enum { READ_DECIDE_WRITE, WATCH_MULTI_EXEC, RL_FUNCTION } method;

typedef struct race {
    const char *addr;
    method how;
    pthread_barrier_t go;
    atomic_long admitted;
    atomic_long retries;
} race;

static double wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec * 1000 + (double)ts.tv_nsec / 1e6;
}

/* HMGET, then the seed's refill arithmetic on the client's clock. Returns
 * the tokens now in the bucket. */
static double read_bucket(redisContext *c, double now)
{
    redisReply *r = bench_command(c, "HMGET " HOT_KEY " tokens ts");
    double tokens = CAPACITY, ts = now;
    if (r->element[0]->type == REDIS_REPLY_STRING)
        tokens = atof(r->element[0]->str);
    if (r->element[1]->type == REDIS_REPLY_STRING)
        ts = atof(r->element[1]->str);
    freeReplyObject(r);
    double refilled = tokens + (now > ts ? now - ts : 0) * PER_MS;
    return refilled < CAPACITY ? refilled : CAPACITY;
}

static bool attempt_unsafe(redisContext *c)
{
    double now = wall_ms(), tokens = read_bucket(c, now);
    bool ok = tokens >= 1;
    freeReplyObject(bench_command(c, "HSET " HOT_KEY " tokens %f ts %f",
                                  ok ? tokens - 1 : tokens, now));
    return ok;
}

/* Until the transaction goes through or the bucket is seen empty. */
static bool attempt_watched(redisContext *c, atomic_long *retries)
{
    for (;;) {
        bench_run(c, "WATCH " HOT_KEY);
        double now = wall_ms(), tokens = read_bucket(c, now);
        if (tokens < 1) {
            bench_run(c, "UNWATCH");
            return false;
        }
        bench_run(c, "MULTI");
        freeReplyObject(bench_command(c, "HSET " HOT_KEY " tokens %f ts %f",
                                      tokens - 1, now));
        redisReply *r = bench_command(c, "EXEC");
        bool applied = r->type == REDIS_REPLY_ARRAY;
        freeReplyObject(r);
        if (applied)
            return true;
        atomic_fetch_add(retries, 1);
    }
}

static bool attempt_function(redisContext *c)
{
    redisReply *r = bench_command(c, "FCALL %s 1 " HOT_KEY " 100 100 "
                                  "86400000 1", RL_FUNCTION_BUCKET);
    bool ok = r->type == REDIS_REPLY_INTEGER && r->integer >= 0;
    freeReplyObject(r);
    return ok;
}

static void *client(void *arg)
{
    race *r = arg;
    redisContext *c = bench_connect(r->addr);
    pthread_barrier_wait(&r->go);
    for (int i = 0; i < ATTEMPTS; i++) {
        bool ok = r->how == READ_DECIDE_WRITE ? attempt_unsafe(c)
                  : r->how == WATCH_MULTI_EXEC
                      ? attempt_watched(c, &r->retries)
                      : attempt_function(c);
        atomic_fetch_add(&r->admitted, ok);
    }
    redisFree(c);
    return NULL;
}

static void run_race(const char *addr, method how, double *admitted,
                     double *retries)
{
    redisContext *c = bench_connect(addr);
    bench_run(c, "DEL " HOT_KEY);
    redisFree(c);
    race r = {.addr = addr, .how = how};
    pthread_barrier_init(&r.go, NULL, CLIENTS);
    pthread_t t[CLIENTS];
    for (int i = 0; i < CLIENTS; i++)
        pthread_create(&t[i], NULL, client, &r);
    for (int i = 0; i < CLIENTS; i++)
        pthread_join(t[i], NULL);
    pthread_barrier_destroy(&r.go);
    *admitted = (double)atomic_load(&r.admitted);
    *retries = *admitted > 0 ? (double)atomic_load(&r.retries) / *admitted
                             : 0;
}

static void row(const char *what, const double *v, const char *unit)
{
    bench_summary s = bench_summarize(v, ROUNDS);
    printf("| %s | %.2f | %.2f | %.2f | %s |\n", what, s.min, s.median,
           s.max, unit);
}

void bench_alternatives(const char *addr)
{
    double unsafe[ROUNDS], watched[ROUNDS], retries[ROUNDS], exact[ROUNDS];
    double ignored;
    for (int i = 0; i < ROUNDS; i++) {
        run_race(addr, READ_DECIDE_WRITE, &unsafe[i], &ignored);
        run_race(addr, WATCH_MULTI_EXEC, &watched[i], &retries[i]);
        run_race(addr, RL_FUNCTION, &exact[i], &ignored);
    }
    printf("\n### The seed's rejected alternatives (%d clients, one bucket "
           "of 100, %d attempts each, %d rounds)\n\n"
           "| method | min | median | max | unit |\n|---|---|---|---|---|\n",
           CLIENTS, ATTEMPTS, ROUNDS);
    row("read-decide-write, separate commands", unsafe, "admitted");
    row("WATCH/MULTI/EXEC", watched, "admitted");
    row("WATCH/MULTI/EXEC", retries, "retries per admitted request");
    row("rl's bucket function (reference)", exact, "admitted");
    char rl[64], others[256];
    snprintf(rl, sizeof rl, "rl's function: %.0f admitted",
             bench_summarize(exact, ROUNDS).median);
    snprintf(others, sizeof others, "read-decide-write: %.0f admitted; "
             "WATCH/MULTI/EXEC: %.0f, with %.1f retries per admitted request",
             bench_summarize(unsafe, ROUNDS).median,
             bench_summarize(watched, ROUNDS).median,
             bench_summarize(retries, ROUNDS).median);
    bench_figure("one bucket of 100, 16 clients × 50 attempts (median of 5 "
                 "rounds)", rl, others);
}
