/*
 * mode: local, the in-process token bucket: its arithmetic at set times,
 * the key cap, exactness under threads, and an agent that decides local
 * rules with no store at all.
 */
#include "keys.h"
#include "local.h"
#include "rl.h"

#include <criterion/criterion.h>
#include <pthread.h>
#include <string.h>

static rl_rule rule(uint64_t limit, uint64_t period_ms, uint64_t burst)
{
    rl_rule r = {.limit = limit, .period_ms = period_ms, .burst = burst,
                 .mode = RL_MODE_LOCAL};
    strcpy(r.name, "local");
    return r;
}

static rl_bucket_reply spend_at(rl_local *l, const rl_rule *r,
                                const char *value, uint32_t cost,
                                uint64_t now_ms)
{
    rl_bucket_reply out;
    bool degraded;
    rl_local_check_at(l, r, NULL, &r->own, value, strlen(value), cost,
                      now_ms, &out, &degraded);
    cr_assert(!degraded, "a key under the cap was refused");
    return out;
}

Test(local, hundred_a_minute_admits_a_hundred_then_one_per_600_ms)
{
    rl_local l;
    rl_local_init(&l, 100);
    rl_rule r = rule(100, 60000, 100);
    int allowed = 0;
    for (int i = 0; i < 200; i++)
        allowed += spend_at(&l, &r, "ak_abc123", 1, 1000).allowed;
    cr_assert_eq(allowed, 100);
    rl_bucket_reply out = spend_at(&l, &r, "ak_abc123", 1, 1000);
    cr_assert(!out.allowed);
    cr_assert_eq(out.retry_ms, 600, "retry %lld", (long long)out.retry_ms);
    cr_assert_eq(out.remaining, 0);
    cr_assert_eq(out.reset_ms, 60000);
    /* 599 ms later: still no whole token; at 600 ms, one. */
    cr_assert(!spend_at(&l, &r, "ak_abc123", 1, 1599).allowed);
    out = spend_at(&l, &r, "ak_abc123", 1, 1600);
    cr_assert(out.allowed);
    cr_assert_eq(out.remaining, 0);
    /* Other keys and other rules have their own buckets. */
    cr_assert(spend_at(&l, &r, "ak_other", 1, 1600).allowed);
    rl_rule r2 = rule(100, 60000, 100);
    cr_assert(spend_at(&l, &r2, "ak_abc123", 1, 1600).allowed);
    rl_local_fini(&l);
}

Test(local, costs_bursts_and_a_cost_over_the_capacity)
{
    rl_local l;
    rl_local_init(&l, 100);
    rl_rule r = rule(10, 1000, 30); /* 10 a second, bursts of 30 */
    rl_bucket_reply out = spend_at(&l, &r, "k", 25, 0);
    cr_assert(out.allowed);
    cr_assert_eq(out.remaining, 5);
    cr_assert_eq(out.reset_ms, 2500);
    out = spend_at(&l, &r, "k", 10, 0);
    cr_assert(!out.allowed);
    cr_assert_eq(out.retry_ms, 500);
    out = spend_at(&l, &r, "k", 31, 0);
    cr_assert(!out.allowed);
    cr_assert_eq(out.retry_ms, -1, "a cost over the burst can never pass");
    /* Time going back (it cannot on CLOCK_MONOTONIC, but a caller's clock
     * might) refills nothing. */
    cr_assert(!spend_at(&l, &r, "k", 10, 0).allowed);
    /* Long idle: full, never more. */
    out = spend_at(&l, &r, "k", 1, 1000000000000ULL);
    cr_assert_eq(out.remaining, 29);
    rl_local_fini(&l);
}

Test(local, the_key_cap_refuses_new_keys_until_buckets_refill)
{
    rl_local l;
    rl_local_init(&l, 2);
    rl_rule r = rule(1, 1000, 1);
    spend_at(&l, &r, "a", 1, 0);
    spend_at(&l, &r, "b", 1, 0);
    rl_bucket_reply out;
    bool degraded;
    rl_local_check_at(&l, &r, NULL, &r.own, "c", 1, 1, 10, &out, &degraded);
    cr_assert(degraded, "a third key was tracked over a cap of two");
    cr_assert_eq(atomic_load(&l.keys_refused), 1);
    /* Once a and b have refilled they say nothing: a new key takes a
     * place. At the cap an insert sweeps its own shard, so the new key is
     * one that lands in a's (the shard is the hash, salted with the rule,
     * modulo the shards). */
    size_t a_shard = rl_key_hash((uintptr_t)&r, "a", 1) % RL_LOCAL_SHARDS;
    char v[16];
    for (int i = 0;; i++) {
        snprintf(v, sizeof v, "n%d", i);
        if (rl_key_hash((uintptr_t)&r, v, strlen(v)) % RL_LOCAL_SHARDS
            == a_shard)
            break;
    }
    rl_local_check_at(&l, &r, NULL, &r.own, v, strlen(v), 1, 1000, &out,
                      &degraded);
    cr_assert(!degraded, "full buckets were never dropped for a new key");
    cr_assert(out.allowed);
    cr_assert_leq(atomic_load(&l.n_entries), 2);
    rl_local_fini(&l);
}

/* Many threads on one key: the shard lock makes check-and-spend one step. */
struct hammer {
    rl_local *l;
    const rl_rule *r;
    int allowed;
};

static void *hammer(void *arg)
{
    struct hammer *h = arg;
    for (int i = 0; i < 1000; i++)
        h->allowed += spend_at(h->l, h->r, "hot", 1, 5).allowed;
    return NULL;
}

Test(local, eight_threads_on_one_key_get_exactly_the_burst)
{
    rl_local l;
    rl_local_init(&l, 100);
    rl_rule r = rule(500, 3600000, 500);
    pthread_t t[8];
    struct hammer h[8];
    for (int i = 0; i < 8; i++) {
        h[i] = (struct hammer){&l, &r, 0};
        pthread_create(&t[i], NULL, hammer, &h[i]);
    }
    int allowed = 0;
    for (int i = 0; i < 8; i++) {
        pthread_join(t[i], NULL);
        allowed += h[i].allowed;
    }
    cr_assert_eq(allowed, 500);
    rl_local_fini(&l);
}

/* A local-only config needs no Redis: the store below does not exist, and
 * no check is degraded or waits for it. Two agents count alone: the
 * seed's two limits for one client. */
Test(local, agents_decide_without_a_store_and_each_counts_alone)
{
    static const char yaml[] =
        "store: {url: \"redis://127.0.0.1:1\", timeout_ms: 1000}\n"
        "rules:\n"
        "  - {name: per-key, match: api_key, limit: 100, period: 1m, "
        "mode: local, on_error: deny}\n";
    rl_error err;
    rl_config *cfg;
    cr_assert_eq(rl_config_parse(yaml, sizeof yaml - 1, "local.yaml", &cfg,
                                 &err), RL_OK, "%s", err.message);
    rl_agent *agents[2];
    rl_options o = {.config = cfg};
    for (int i = 0; i < 2; i++)
        cr_assert_eq(rl_agent_open(&agents[i], &o, &err), RL_OK, "%s",
                     err.message);
    rl_attr attr = {"api_key", "ak_abc123", 9};
    int allowed = 0;
    for (int i = 0; i < 200; i++) {
        rl_decision d;
        cr_assert_eq(rl_check(agents[i % 2], &attr, 1, 1, &d), RL_OK);
        cr_assert(!d.degraded, "a local rule waited for a store");
        allowed += d.allowed;
        if (!d.allowed) {
            cr_assert_str_eq(d.rule, "per-key");
            cr_assert_gt(d.retry_after_ms, 0);
        }
    }
    cr_assert_eq(allowed, 200, "each agent has its own 100");
    rl_decision d;
    cr_assert_eq(rl_check(agents[0], &attr, 1, 1, &d), RL_OK);
    cr_assert(!d.allowed);
    for (int i = 0; i < 2; i++)
        rl_agent_close(agents[i]);
    rl_config_free(cfg);
}

Test(local, values_over_max_value_bytes_are_refused)
{
    static const char yaml[] =
        "max_value_bytes: 8\n"
        "rules:\n"
        "  - {name: per-key, match: api_key, limit: 100, period: 1m, "
        "mode: local}\n";
    rl_error err;
    rl_config *cfg;
    cr_assert_eq(rl_config_parse(yaml, sizeof yaml - 1, "cap.yaml", &cfg,
                                 &err), RL_OK, "%s", err.message);
    rl_options o = {.config = cfg};
    rl_agent *a;
    cr_assert_eq(rl_agent_open(&a, &o, &err), RL_OK, "%s", err.message);
    rl_decision d;
    rl_attr ok = {"api_key", "12345678", 8}, over = {"api_key", "123456789", 9};
    cr_assert_eq(rl_check(a, &ok, 1, 1, &d), RL_OK);
    cr_assert_eq(rl_check(a, &over, 1, 1, &d), RL_ETOOLONG);
    rl_agent_close(a);
    rl_config_free(cfg);
}
