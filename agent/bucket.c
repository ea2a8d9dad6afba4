/*
 * bucket.c: the agent's calls of the bucket scripts: arguments in, the
 * four integers {allowed, remaining, retry_ms, reset_ms} out. Anything else
 * from Redis is an error for the rule, decided by its on_error.
 */
#include "bucket.h"

#include "scripts.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void rl_bucket_args_init(rl_bucket_args *args, const rl_rule *rule)
{
    args->algorithm = rule->algorithm;
    snprintf(args->burst, sizeof args->burst, "%llu",
             (unsigned long long)rule->burst);
    snprintf(args->limit, sizeof args->limit, "%llu",
             (unsigned long long)rule->limit);
    snprintf(args->period, sizeof args->period, "%llu",
             (unsigned long long)rule->period_ms);
}

typedef struct pending {
    rl_bucket_fn fn;
    void *arg;
} pending;

static bool parse(const redisReply *r, rl_bucket_reply *out)
{
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 4)
        return false;
    for (int i = 0; i < 4; i++) {
        if (r->element[i]->type != REDIS_REPLY_INTEGER)
            return false;
    }
    out->allowed = r->element[0]->integer == 1;
    out->remaining = (uint64_t)(r->element[1]->integer > 0
                                    ? r->element[1]->integer : 0);
    out->retry_ms = r->element[2]->integer;
    out->reset_ms = (uint64_t)(r->element[3]->integer > 0
                                   ? r->element[3]->integer : 0);
    return true;
}

static void on_reply(void *arg, const redisReply *reply, const char *error)
{
    pending p = *(pending *)arg;
    free(arg);
    rl_bucket_reply out;
    if (reply == NULL)
        p.fn(p.arg, NULL, error);
    else if (!parse(reply, &out))
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
    *p = (pending){fn, arg};
    char cost_text[24];
    snprintf(cost_text, sizeof cost_text, "%lld", (long long)cost);
    const char *argv[] = {"1", key, args->burst, args->limit, args->period,
                          cost_text};
    size_t lens[6];
    for (int i = 0; i < 6; i++)
        lens[i] = i == 1 ? key_len : strlen(argv[i]);
    rl_store_run(store, args->algorithm, 6, argv, lens, on_reply, p);
}
