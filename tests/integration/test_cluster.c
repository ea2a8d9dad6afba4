/*
 * The exact path on a real 3-primary/3-replica Redis Cluster: exactness on
 * each primary, one batch per shard for a request's rules, resharding and
 * failover under load. Tests that change the cluster's shape start their
 * own cluster; the others use the runner's (RL_TEST_CLUSTER).
 */
#include "agent_impl.h"
#include "keys.h"
#include "redis_cluster.h"
#include "test_agent.h"
#include "test_env.h"

#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* --- The cluster's layout, as CLUSTER SLOTS tells it. ------------------ */

typedef struct shard {
    long start, end;  /* one slot range */
    char addr[64];    /* its primary, host:port */
    char id[48];
} shard;

typedef struct layout {
    shard shards[16];
    int n;
} layout;

static layout read_layout(const char *addr)
{
    layout l = {0};
    redisContext *c = test_redis_connect(addr);
    redisReply *r = test_redis_command(c, "CLUSTER SLOTS");
    cr_assert_eq(r->type, REDIS_REPLY_ARRAY);
    for (size_t i = 0; i < r->elements && l.n < 16; i++) {
        redisReply *e = r->element[i], *p = e->element[2];
        shard *s = &l.shards[l.n++];
        s->start = e->element[0]->integer;
        s->end = e->element[1]->integer;
        snprintf(s->addr, sizeof s->addr, "%s:%lld", p->element[0]->str,
                 p->element[1]->integer);
        snprintf(s->id, sizeof s->id, "%s",
                 p->elements > 2 ? p->element[2]->str : "");
    }
    freeReplyObject(r);
    redisFree(c);
    return l;
}

static int shard_of(const layout *l, uint16_t slot)
{
    for (int i = 0; i < l->n; i++) {
        if (slot >= l->shards[i].start && slot <= l->shards[i].end)
            return i;
    }
    return -1;
}

/* A value whose key (prefix + value) lands on the given primary (its
 * address: a primary may serve several ranges). */
static void value_on(const layout *l, const char *addr, const char *prefix,
                     const char *stem, char *out, size_t cap)
{
    char key[RL_KEY_MAX];
    for (int i = 0; i < 100000; i++) {
        snprintf(out, cap, "%s-%d-%d", stem, (int)getpid(), i);
        snprintf(key, sizeof key, "%s%s", prefix, out);
        int s = shard_of(l, rl_key_slot(key, strlen(key)));
        if (s >= 0 && strcmp(l->shards[s].addr, addr) == 0)
            return;
    }
    cr_assert_fail("no value of %s lands on %s", stem, addr);
}

/* The distinct primaries, in slot order. */
static int primaries(const layout *l, const char *out[16])
{
    int n = 0;
    for (int i = 0; i < l->n; i++) {
        bool seen = false;
        for (int j = 0; j < n; j++)
            seen |= strcmp(out[j], l->shards[i].addr) == 0;
        if (!seen)
            out[n++] = l->shards[i].addr;
    }
    return n;
}

static void first_node(const char *all, char *out, size_t cap)
{
    snprintf(out, cap, "%.*s", (int)strcspn(all, ","), all);
}

/* An agent on a cluster (seeds: a comma-separated list). */
static rl_agent *cluster_agent(const char *seeds, const char *rules,
                               unsigned timeout_ms, rl_config **cfg)
{
    char yaml[2048], list[512];
    snprintf(list, sizeof list, "%s", seeds);
    for (char *p = list; *p; p++)
        if (*p == ',')
            *p = ' ';
    char items[600] = "";
    for (char *tok = strtok(list, " "); tok; tok = strtok(NULL, " ")) {
        strcat(items, items[0] ? ", " : "");
        strcat(items, tok);
    }
    snprintf(yaml, sizeof yaml, "store: {cluster: [%s], timeout_ms: %u}\n"
             "rules:\n%s", items, timeout_ms, rules);
    rl_error err;
    cr_assert_eq(rl_config_parse(yaml, strlen(yaml), "cluster.yaml", cfg,
                                 &err), RL_OK, "%s", err.message);
    rl_options o = {.config = *cfg};
    rl_agent *a;
    cr_assert_eq(rl_agent_open(&a, &o, &err), RL_OK, "%s", err.message);
    return a;
}

static void close_agent(rl_agent *a, rl_config *cfg)
{
    rl_agent_close(a);
    rl_config_free(cfg);
}

/* --- 1. Exactly 100 of 1,000, with the bucket on each primary. --------- */

struct contender {
    rl_agent *agent;
    const char *value;
    atomic_int allowed, errors;
};

static void *contend(void *arg)
{
    struct contender *c = arg;
    rl_attr attr = {"api_key", c->value, strlen(c->value)};
    for (int i = 0; i < 20; i++) {
        rl_decision d;
        if (rl_check(c->agent, &attr, 1, 1, &d) != RL_OK || d.degraded)
            atomic_fetch_add(&c->errors, 1);
        else if (d.allowed)
            atomic_fetch_add(&c->allowed, 1);
    }
    return NULL;
}

Test(cluster, fifty_threads_admit_exactly_capacity_on_each_primary)
{
    const char *seeds = test_env("RL_TEST_CLUSTER");
    char first[64];
    first_node(seeds, first, sizeof first);
    layout l = read_layout(first);
    const char *prim[16];
    int n = primaries(&l, prim);
    cr_assert_eq(n, 3);
    rl_config *cfg;
    rl_agent *a = cluster_agent(seeds, "  - {name: per-key, match: api_key, "
                                "limit: 100, period: 1d}\n", 1000, &cfg);
    for (int p = 0; p < n; p++) {
        char value[64];
        value_on(&l, prim[p], "rl:key:", "fifty", value, sizeof value);
        struct contender c = {.agent = a, .value = value};
        pthread_t threads[50];
        for (int i = 0; i < 50; i++)
            pthread_create(&threads[i], NULL, contend, &c);
        for (int i = 0; i < 50; i++)
            pthread_join(threads[i], NULL);
        cr_assert_eq(atomic_load(&c.errors), 0, "%d checks failed on %s",
                     atomic_load(&c.errors), prim[p]);
        cr_assert_eq(atomic_load(&c.allowed), 100, "%s admitted %d",
                     prim[p], atomic_load(&c.allowed));
    }
    close_agent(a, cfg);
}

/* --- 2. Three rules on three shards: one batch each, in one turn. ------ */

static uint64_t load(atomic_uint_least64_t *v)
{
    return atomic_load_explicit(v, memory_order_relaxed);
}

Test(cluster, three_rules_on_three_shards_go_out_together)
{
    const char *seeds = test_env("RL_TEST_CLUSTER");
    char first[64];
    first_node(seeds, first, sizeof first);
    layout l = read_layout(first);
    const char *prim[16];
    cr_assert_eq(primaries(&l, prim), 3);
    char ip[64], key[64], tenant[64];
    value_on(&l, prim[0], "rl:ip:", "203.0.113", ip, sizeof ip);
    value_on(&l, prim[1], "rl:key:", "ak_abc123", key, sizeof key);
    value_on(&l, prim[2], "rl:tenant:", "org_acme", tenant, sizeof tenant);
    rl_config *cfg;
    rl_agent *a = cluster_agent(
        seeds,
        "  - {name: per-ip, match: ip, limit: 1000, period: 1m}\n"
        "  - {name: per-key, match: api_key, limit: 100, period: 1m}\n"
        "  - {name: per-tenant, match: tenant, limit: 10000, period: 1h}\n",
        1000, &cfg);
    rl_attr attrs[] = {{"ip", ip, strlen(ip)},
                       {"api_key", key, strlen(key)},
                       {"tenant", tenant, strlen(tenant)}};
    rl_decision d;
    /* Warm up: the map is read and every primary connected. */
    for (int i = 0; i < 3; i++)
        cr_assert_eq(rl_check(a, attrs, 3, 1, &d), RL_OK);
    usleep(1200 * 1000);
    rl_node_batches *b = &a->store_counters.batches;
    uint64_t batches = load(&b->batches), turns = load(&b->turns);
    for (int i = 0; i < 20; i++) {
        cr_assert_eq(rl_check(a, attrs, 3, 1, &d), RL_OK);
        cr_assert(d.allowed && !d.degraded);
    }
    uint64_t db = load(&b->batches) - batches, dt = load(&b->turns) - turns;
    cr_assert_eq(dt, 20, "20 requests went out in %llu turns",
                 (unsigned long long)dt);
    cr_assert_eq(db, 60, "20 requests on three shards made %llu batches",
                 (unsigned long long)db);
    close_agent(a, cfg);
}
