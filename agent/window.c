/*
 * window.c: the agent's calls of a fixed window (window.h). INCRBY answers
 * the window's count with this hit in it; remaining, retry and reset
 * follow from it, the rate and the window's end, here rather than in
 * Redis.
 */
#include "window.h"

#include "resp.h"
#include "scripts.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

uint64_t rl_window_wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

void rl_window_answer(const rl_limit *rate, uint64_t count, int64_t cost,
                      uint64_t window, uint64_t now_ms, rl_bucket_reply *out)
{
    uint64_t end = (window + 1) * rate->period_ms;
    uint64_t reset = end > now_ms ? end - now_ms : 0;
    bool allowed = count <= rate->limit;
    *out = (rl_bucket_reply){.allowed = allowed,
                             .remaining = allowed ? rate->limit - count : 0,
                             .reset_ms = reset};
    if (!allowed)
        out->retry_ms = cost > 0 && (uint64_t)cost > rate->limit
                            ? -1
                            : (int64_t)(reset > 0 ? reset : 1);
}

/* The store's clock, or the wall clock it stands for until it is known. */
static uint64_t store_now(const rl_store *store)
{
    uint64_t now = rl_store_now_ms(store);
    return now != 0 ? now : rl_window_wall_ms();
}

/* key:window into out (RL_KEY_MAX + RL_WINDOW_SUFFIX_MAX bytes). */
static size_t window_key(char *out, const char *key, size_t key_len,
                         uint64_t window)
{
    memcpy(out, key, key_len);
    out[key_len] = ':';
    return key_len + 1 + rl_resp_decimal(out + key_len + 1,
                                         (long long)window);
}

static void on_count(void *arg, const redisReply *r, const char *error)
{
    rl_bucket_pending *p = arg;
    rl_bucket_reply out;
    if (r == NULL) {
        p->fn(p->arg, NULL, error);
    } else if (r->type != REDIS_REPLY_INTEGER || r->integer < p->cost) {
        p->fn(p->arg, NULL, "unexpected reply to a fixed window's INCRBY");
    } else {
        rl_window_answer(&p->rate, (uint64_t)r->integer, p->cost, p->window,
                         p->at_ms, &out);
        p->fn(p->arg, &out, NULL);
    }
}

/* A refused PEXPIRE (NOPERM) is logged by the node, once; one lost with
 * the connection fails its INCRBY too, which on_error decides. */
static void on_expire(void *arg, const redisReply *r, const char *error)
{
    (void)arg, (void)r, (void)error;
}

void rl_window_call_in(rl_store *store, rl_bucket_pending *p,
                       const rl_limit *rate, const char *key,
                       size_t key_len, int64_t cost, rl_bucket_fn fn,
                       void *arg)
{
    uint64_t now = store_now(store);
    *p = (rl_bucket_pending){.fn = fn, .arg = arg, .rate = *rate,
                             .cost = cost,
                             .window = rl_window_of(now, rate->period_ms),
                             .at_ms = now};
    char k[RL_KEY_MAX + RL_WINDOW_SUFFIX_MAX + 1];
    char cost_text[24], period[24];
    size_t len = window_key(k, key, key_len, p->window);
    size_t cost_len = rl_resp_decimal(cost_text, cost);
    size_t period_len = rl_resp_decimal(period, (long long)rate->period_ms);
    rl_store_run(store, RL_NODE_RAW_WRITE, 3,
                 (const char *[]){"INCRBY", k, cost_text},
                 (size_t[]){6, len, cost_len}, on_count, p);
    /* The count is what must reach the replicas before the answer (WAIT):
     * the expiry only tidies up. */
    rl_store_run(store, RL_NODE_RAW, 3,
                 (const char *[]){"PEXPIRE", k, period},
                 (size_t[]){7, len, period_len}, on_expire, NULL);
}

static void on_given_back(void *arg, const redisReply *r, const char *error)
{
    const rl_logger *log = arg;
    if (r == NULL)
        rl_log(log, RL_LOG_WARN, "refund_failed", "reason=\"%s\"", error);
}

void rl_window_give_back(rl_store *store, const char *key, size_t key_len,
                         uint64_t window, int64_t cost,
                         const rl_logger *log)
{
    char k[RL_KEY_MAX + RL_WINDOW_SUFFIX_MAX + 1], cost_text[24];
    size_t len = window_key(k, key, key_len, window);
    size_t cost_len = rl_resp_decimal(cost_text, cost);
    rl_store_run(store, RL_NODE_RAW_WRITE, 3,
                 (const char *[]){"DECRBY", k, cost_text},
                 (size_t[]){6, len, cost_len}, on_given_back, (void *)log);
}

void rl_window_add(rl_store *store, const char *key, size_t key_len,
                   uint64_t window, uint64_t period_ms, int64_t delta,
                   rl_store_fn fn, void *arg)
{
    char k[RL_KEY_MAX + RL_WINDOW_SUFFIX_MAX + 1], delta_text[24],
        period[24];
    size_t len = window_key(k, key, key_len, window);
    size_t delta_len = rl_resp_decimal(delta_text, delta);
    size_t period_len = rl_resp_decimal(period, (long long)period_ms);
    rl_store_run(store, RL_SCRIPT_WINDOW_ADD, 4,
                 (const char *[]){"1", k, delta_text, period},
                 (size_t[]){1, len, delta_len, period_len}, fn, arg);
}
