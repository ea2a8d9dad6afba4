/*
 * bench_pipeline.c: the yardstick client. Replies come back in the order
 * requests were written, so the requests in flight are a FIFO ring of start
 * times; a new request is appended as soon as the oldest one is answered,
 * and hiredis writes whatever was appended when it next needs to read, so
 * requests leave in batches without the loop asking for it.
 */
#include "bench_pipeline.h"

#include "bench_redis.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

static const char *const prefixes[BENCH_RULES_MAX] = {"rl:key:", "rl:ip:",
                                                      "rl:tenant:"};

int bench_key(char *buf, size_t cap, int rule, long value)
{
    return snprintf(buf, cap, "%sk%ld", prefixes[rule], value);
}

/* The seed document's script, as the seed gives it. */
static const char seed_script[] =
    "local capacity = tonumber(ARGV[1])\n"
    "local per_ms = tonumber(ARGV[2]) / tonumber(ARGV[3])\n"
    "local cost = tonumber(ARGV[4])\n"
    "local t = redis.call('TIME')\n"
    "local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n"
    "local state = redis.call('HMGET', KEYS[1], 'tokens', 'ts')\n"
    "local tokens = tonumber(state[1]) or capacity\n"
    "local ts = tonumber(state[2]) or now\n"
    "tokens = math.min(capacity, tokens + math.max(0, now - ts) * per_ms)\n"
    "local allowed, retry_ms = 0, 0\n"
    "if tokens >= cost then\n"
    "tokens, allowed = tokens - cost, 1\n"
    "else\n"
    "retry_ms = math.ceil((cost - tokens) / per_ms)\n"
    "end\n"
    "redis.call('HSET', KEYS[1], 'tokens', tokens, 'ts', now)\n"
    "redis.call('PEXPIRE', KEYS[1], math.ceil((capacity - tokens) / per_ms))\n"
    "return {allowed, math.floor(tokens), retry_ms}\n";

void bench_seed_script(redisContext *c, bench_script *out)
{
    redisReply *r = bench_command(c, "SCRIPT LOAD %s", seed_script);
    out->command = "EVALSHA";
    snprintf(out->name, sizeof out->name, "%s", r->str);
    freeReplyObject(r);
}

static void append_request(redisContext *c, const bench_script *s,
                           const bench_load *load, long value,
                           unsigned *seed)
{
    for (int rule = 0; rule < load->rules; rule++) {
        long v = load->seconds > 0 ? rand_r(seed) % BENCH_KEYS : value;
        char key[64];
        bench_key(key, sizeof key, rule, v);
        redisAppendCommand(c, "%s %s 1 %s 100 100 %ld 1", s->command,
                           s->name, key, load->period_ms);
    }
}

/* Reads one request's replies; counts the errors among them. */
static void read_request(redisContext *c, int rules, long *errors)
{
    for (int i = 0; i < rules; i++) {
        redisReply *r;
        if (redisGetReply(c, (void **)&r) != REDIS_OK) {
            fprintf(stderr, "bench: connection lost: %s\n", c->errstr);
            exit(1);
        }
        if (r->type == REDIS_REPLY_ERROR && (*errors)++ == 0)
            fprintf(stderr, "bench: %s\n", r->str);
        freeReplyObject(r);
    }
}

bench_result bench_pipeline(const char *addr, const bench_script *s,
                            const bench_load *load, bench_latency *lat)
{
    redisContext *c = bench_connect(addr);
    double *started = calloc((size_t)load->depth, sizeof *started);
    unsigned seed = 7;
    long sent = 0, done = 0, errors = 0;
    double start = bench_now_s(), end = start + load->seconds;
    bool more = true;
    for (; sent < load->depth && (load->seconds > 0 || sent < load->requests);
         sent++) {
        started[sent] = bench_now_s();
        append_request(c, s, load, sent, &seed);
    }
    while (done < sent) {
        read_request(c, load->rules, &errors);
        double now = bench_now_s();
        if (lat != NULL && more)
            bench_latency_add(lat, (now - started[done % load->depth]) * 1e6);
        done++;
        more = load->seconds > 0 ? now < end : sent < load->requests;
        if (more) {
            started[sent % load->depth] = now;
            append_request(c, s, load, sent++, &seed);
        }
    }
    double elapsed = bench_now_s() - start;
    free(started);
    redisFree(c);
    bench_result res = {.rate = (double)done / elapsed, .errors = errors};
    if (lat != NULL) {
        res.p50_us = bench_latency_percentile(lat, 50);
        res.p99_us = bench_latency_percentile(lat, 99);
    }
    return res;
}
