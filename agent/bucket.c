/*
 * bucket.c: the agent's calls of the bucket script. The script answers one
 * integer, how far the bucket is from full (negative when it rejected, see
 * scripts.c); remaining, retry and reset follow from it and the rule, here
 * rather than in Redis. Any other reply is an error for the rule, decided
 * by its on_error.
 */
#include "bucket.h"

#include "resp.h"
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
    /* On every check with a caller's rate: snprintf was 6 % of rl-rls's
     * instructions. */
    rl_resp_unsigned(args->burst, rate->burst);
    rl_resp_unsigned(args->limit, rate->limit);
    rl_resp_unsigned(args->period, rate->period_ms);
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
    /* A bucket in debt (a hold's excess, scripts.c) is missing more than
     * its capacity: nothing remains. */
    *out = (rl_bucket_reply){.allowed = allowed,
                             .remaining = missing < cap
                                              ? (cap - missing)
                                                    / rate->period_ms
                                              : 0,
                             .reset_ms = ceil_div(missing, rate->limit)};
    if (allowed)
        return;
    if (cost > 0 && (uint64_t)cost > rate->burst)
        out->retry_ms = -1; /* can never pass */
    else
        out->retry_ms = (int64_t)ceil_div(
            missing + (uint64_t)cost * rate->period_ms - cap, rate->limit);
}

typedef rl_bucket_pending pending;

/* An in_flight item's answer: the slots held after the call, or
 * -(held + 1) when none was free. */
static bool parse_slot(const pending *p, const redisReply *r,
                       rl_bucket_reply *out)
{
    uint64_t n = p->rate.limit;
    bool allowed = r->integer >= 0;
    long long held = allowed ? r->integer : -(r->integer + 1);
    if (allowed ? (unsigned long long)held > n
                : (unsigned long long)held < n)
        return false;
    *out = (rl_bucket_reply){.allowed = allowed,
                             .remaining = allowed ? n - (uint64_t)held : 0,
                             .retry_ms = allowed ? 0 : RL_IN_FLIGHT_RETRY_MS};
    return true;
}

static bool parse(const pending *p, const redisReply *r,
                  rl_bucket_reply *out)
{
    if (r->type != REDIS_REPLY_INTEGER)
        return false;
    if (p->slot)
        return parse_slot(p, r, out);
    const rl_limit *rate = &p->rate;
    uint64_t cap = rate->burst * rate->period_ms;
    bool allowed = r->integer >= 0;
    long long missing = allowed ? r->integer : -(r->integer + 1);
    /* Only a bucket in debt rejects past its capacity, even a hold's
     * check of room (cost 0). */
    if (allowed && (unsigned long long)missing > cap)
        return false;
    /* A rejection must be one: a cost that fits but did not fit now. */
    if (!allowed
        && (p->cost < 0 || (p->cost == 0 && (uint64_t)missing <= cap)))
        return false;
    if (!allowed && (uint64_t)p->cost <= rate->burst
        && (uint64_t)missing + (uint64_t)p->cost * rate->period_ms <= cap)
        return false;
    rl_bucket_answer(rate, (uint64_t)missing, allowed, p->cost, out);
    return true;
}

/* A multi call's answers are read item by item as the bucket's are. */
typedef struct multi_pending {
    rl_multi_fn fn;
    void *arg;
    int n;
    rl_multi_mode mode;
    bool *enforced;
    pending *items;
    rl_bucket_reply *out;
} multi_pending;

/* A list of one answer per item; with RL_MULTI_FIRST_REJECT it may stop
 * early, but only at an enforced rejection. */
static int parse_multi(const multi_pending *m, const redisReply *r)
{
    if (r->type != REDIS_REPLY_ARRAY || r->elements == 0
        || r->elements > (size_t)m->n)
        return -1;
    int got = (int)r->elements;
    for (int i = 0; i < got; i++) {
        if (!parse(&m->items[i], r->element[i], &m->out[i]))
            return -1;
    }
    if (got < m->n
        && (m->mode != RL_MULTI_FIRST_REJECT || m->out[got - 1].allowed
            || !m->enforced[got - 1]))
        return -1;
    return got;
}

static void on_multi_reply(void *arg, const redisReply *reply,
                           const char *error)
{
    multi_pending *m = arg;
    int got = reply != NULL ? parse_multi(m, reply) : -1;
    if (reply == NULL)
        m->fn(m->arg, NULL, 0, error);
    else if (got < 0)
        m->fn(m->arg, NULL, 0, "unexpected reply from the multi-bucket "
                               "function");
    else
        m->fn(m->arg, m->out, got, NULL);
    free(m);
}

static multi_pending *new_multi(rl_multi_mode mode,
                                const rl_bucket_item *items, int n,
                                int64_t cost, rl_multi_fn fn, void *arg)
{
    size_t un = (size_t)n;
    multi_pending *m = malloc(sizeof *m + un * (sizeof(pending)
                                                + sizeof(rl_bucket_reply)
                                                + sizeof(bool)));
    if (m == NULL)
        return NULL;
    *m = (multi_pending){fn, arg, n, mode, NULL, (pending *)(m + 1), NULL};
    m->out = (rl_bucket_reply *)(m->items + n);
    m->enforced = (bool *)(m->out + n);
    for (int i = 0; i < n; i++) {
        m->items[i] = (pending){.rate = items[i].args->rate, .cost = cost,
                                .slot = items[i].slot_id != NULL};
        m->enforced[i] = items[i].enforced;
    }
    return m;
}

/* Room for the arguments of a multi call of up to this many items on the
 * stack; more (a rare request) take a heap block. */
#define MULTI_ON_STACK 8
#define MULTI_ARGS(n) (2 + 5 * (n))

void rl_bucket_multi(rl_store *store, rl_multi_mode mode,
                     const rl_bucket_item *items, int n, int64_t cost,
                     rl_multi_fn fn, void *arg)
{
    multi_pending *m = new_multi(mode, items, n, cost, fn, arg);
    const char *stack_argv[MULTI_ARGS(MULTI_ON_STACK)];
    size_t stack_lens[MULTI_ARGS(MULTI_ON_STACK)];
    char stack_flags[MULTI_ON_STACK + 2];
    const char **argv = stack_argv;
    size_t *lens = stack_lens;
    char *flags = stack_flags;
    int argc = MULTI_ARGS(n);
    if (m != NULL && n > MULTI_ON_STACK) {
        argv = malloc((size_t)argc * (sizeof *argv + sizeof *lens)
                      + (size_t)n + 2);
        lens = (size_t *)(argv + argc);
        flags = (char *)(lens + argc);
    }
    if (m == NULL || argv == NULL) {
        free(m);
        fn(arg, NULL, 0, "out of memory");
        return;
    }
    char numkeys[24], cost_text[24];
    size_t numkeys_len = rl_resp_decimal(numkeys, n);
    size_t cost_len = rl_resp_decimal(cost_text, cost);
    flags[0] = (char)mode;
    for (int i = 0; i < n; i++)
        flags[i + 1] = (char)((items[i].slot_id != NULL ? '2' : '0')
                              + items[i].enforced);
    flags[n + 1] = '\0';
    argv[0] = numkeys;
    lens[0] = numkeys_len;
    argv[n + 1] = flags;
    lens[n + 1] = (size_t)n + 1;
    for (int i = 0; i < n; i++) {
        const rl_bucket_args *a = items[i].args;
        const char **at = argv + n + 2 + 4 * i;
        argv[1 + i] = items[i].key;
        lens[1 + i] = items[i].key_len;
        bool slot = items[i].slot_id != NULL;
        at[0] = slot ? items[i].slot_id : a->burst;
        at[1] = a->limit;
        at[2] = slot ? items[i].lease : a->period;
        at[3] = !slot ? cost_text : items[i].take ? "1" : "0";
        for (int k = 0; k < 3; k++)
            lens[n + 2 + 4 * i + k] = strlen(at[k]);
        lens[n + 2 + 4 * i + 3] = slot ? 1 : cost_len;
    }
    rl_store_run(store, RL_SCRIPT_MULTI, argc, argv, lens, on_multi_reply,
                 m);
    if (argv != stack_argv)
        free(argv);
}

static void on_reply(void *arg, const redisReply *reply, const char *error)
{
    pending p = *(pending *)arg;
    if (p.owned)
        free(arg);
    rl_bucket_reply out;
    if (reply == NULL)
        p.fn(p.arg, NULL, error);
    else if (!parse(&p, reply, &out))
        p.fn(p.arg, NULL, "unexpected reply from the bucket script");
    else
        p.fn(p.arg, &out, NULL);
}

static void call_in(rl_store *store, pending *p, const rl_bucket_args *args,
                    const char *key, size_t key_len)
{
    char cost_text[24];
    size_t cost_len = rl_resp_decimal(cost_text, p->cost);
    const char *argv[] = {"1", key, args->burst, args->limit, args->period,
                          cost_text};
    size_t lens[] = {1, key_len, strlen(args->burst), strlen(args->limit),
                     strlen(args->period), cost_len};
    rl_store_run(store, RL_SCRIPT_BUCKET, 6, argv, lens, on_reply, p);
}

void rl_bucket_call_in(rl_store *store, rl_bucket_pending *p,
                       const rl_bucket_args *args, const char *key,
                       size_t key_len, int64_t cost, rl_bucket_fn fn,
                       void *arg)
{
    *p = (pending){.fn = fn, .arg = arg, .rate = args->rate, .cost = cost};
    call_in(store, p, args, key, key_len);
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
    *p = (pending){.fn = fn, .arg = arg, .rate = args->rate, .cost = cost,
                   .owned = true};
    call_in(store, p, args, key, key_len);
}

void rl_bucket_commit(rl_store *store, const rl_bucket_args *args,
                      const char *key, size_t key_len, int64_t delta,
                      rl_store_fn fn, void *arg)
{
    char cost_text[24];
    size_t cost_len = rl_resp_decimal(cost_text, delta);
    const char *argv[] = {"1", key, args->burst, args->limit, args->period,
                          cost_text, "d"};
    size_t lens[] = {1, key_len, strlen(args->burst), strlen(args->limit),
                     strlen(args->period), cost_len, 1};
    rl_store_run(store, RL_SCRIPT_BUCKET, 7, argv, lens, fn, arg);
}
