/*
 * bucket.c: the agent's calls of the bucket script. The script answers one
 * integer, how far the bucket is from full (negative when it rejected, see
 * scripts.c); remaining, retry and reset follow from it and the rule, here
 * rather than in Redis. Any other reply is an error for the rule, decided
 * by its on_error.
 */
#include "bucket.h"

#include "scripts.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void rl_bucket_args_rate(rl_bucket_args *args, const rl_rule *rule,
                         const rl_limit *rate)
{
    args->rule = rule;
    args->rate = *rate;
    args->plain = false;
    args->by_value = false;
    snprintf(args->burst, sizeof args->burst, "%llu",
             (unsigned long long)rate->burst);
    snprintf(args->limit, sizeof args->limit, "%llu",
             (unsigned long long)rate->limit);
    snprintf(args->period, sizeof args->period, "%llu",
             (unsigned long long)rate->period_ms);
}

void rl_bucket_args_init(rl_bucket_args *args, const rl_rule *rule)
{
    rl_bucket_args_rate(args, rule, &rule->own);
    args->plain = rule->n_parts <= 1 && rule->when.n == 0
                  && rule->n_overrides == 0 && rule->values == NULL
                  && !rule->shadow && !rule->unlimited;
    args->by_value = rule->n_parts <= 1 && rule->when.n == 0
                     && rule->n_when_overrides == 0 && rule->values != NULL
                     && !rule->shadow;
}

static uint64_t ceil_div(uint64_t a, uint64_t b)
{
    return a / b + (a % b != 0);
}

void rl_bucket_answer(const rl_limit *rate, uint64_t missing, bool allowed,
                      int64_t cost, rl_bucket_reply *out)
{
    uint64_t cap = rate->burst * rate->period_ms;
    *out = (rl_bucket_reply){.allowed = allowed,
                             .remaining = (cap - missing) / rate->period_ms,
                             .reset_ms = ceil_div(missing, rate->limit)};
    if (allowed)
        return;
    if (cost > 0 && (uint64_t)cost > rate->burst)
        out->retry_ms = -1; /* can never pass */
    else
        out->retry_ms = (int64_t)ceil_div(
            missing + (uint64_t)cost * rate->period_ms - cap, rate->limit);
}

/* The rate is copied: an override's args live in the request, which may be
 * gone when a late reply comes. */
typedef struct pending {
    rl_bucket_fn fn;
    void *arg;
    rl_limit rate;
    int64_t cost;
} pending;

static bool parse(const pending *p, const redisReply *r,
                  rl_bucket_reply *out)
{
    if (r->type != REDIS_REPLY_INTEGER)
        return false;
    const rl_limit *rate = &p->rate;
    uint64_t cap = rate->burst * rate->period_ms;
    bool allowed = r->integer >= 0;
    long long missing = allowed ? r->integer : -(r->integer + 1);
    if ((unsigned long long)missing > cap)
        return false;
    /* A rejection must be one: a cost that fits but did not fit now. */
    if (!allowed && p->cost <= 0)
        return false;
    if (!allowed && (uint64_t)p->cost <= rate->burst
        && (uint64_t)missing + (uint64_t)p->cost * rate->period_ms <= cap)
        return false;
    rl_bucket_answer(rate, (uint64_t)missing, allowed, p->cost, out);
    return true;
}

static void on_reply(void *arg, const redisReply *reply, const char *error)
{
    pending p = *(pending *)arg;
    free(arg);
    rl_bucket_reply out;
    if (reply == NULL)
        p.fn(p.arg, NULL, error);
    else if (!parse(&p, reply, &out))
        p.fn(p.arg, NULL, "unexpected reply from the bucket script");
    else
        p.fn(p.arg, &out, NULL);
}

void rl_bucket_call(rl_store *store, const rl_bucket_args *args,
                    const char *key, size_t key_len, int64_t cost,
                    rl_bucket_fn fn, void *arg)
{
    pending *p = malloc(sizeof *p);
    if (p == NULL) {
        fn(arg, NULL, "out of memory");
        return;
    }
    *p = (pending){fn, arg, args->rate, cost};
    char cost_text[24];
    snprintf(cost_text, sizeof cost_text, "%lld", (long long)cost);
    const char *argv[] = {"1", key, args->burst, args->limit, args->period,
                          cost_text};
    size_t lens[6];
    for (int i = 0; i < 6; i++)
        lens[i] = i == 1 ? key_len : strlen(argv[i]);
    rl_store_run(store, 0, 6, argv, lens, on_reply, p);
}
