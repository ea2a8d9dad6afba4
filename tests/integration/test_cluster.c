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
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>
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
static rl_agent *cluster_agent_with(const char *seeds, const char *extra,
                                    const char *rules, unsigned timeout_ms,
                                    rl_config **cfg)
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
    snprintf(yaml, sizeof yaml, "store: {cluster: [%s], timeout_ms: %u%s}\n"
             "rules:\n%s", items, timeout_ms, extra, rules);
    rl_error err;
    cr_assert_eq(rl_config_parse(yaml, strlen(yaml), "cluster.yaml", cfg,
                                 &err), RL_OK, "%s", err.message);
    rl_options o = {.config = *cfg};
    rl_agent *a;
    cr_assert_eq(rl_agent_open(&a, &o, &err), RL_OK, "%s", err.message);
    return a;
}

static rl_agent *cluster_agent(const char *seeds, const char *rules,
                               unsigned timeout_ms, rl_config **cfg)
{
    return cluster_agent_with(seeds, "", rules, timeout_ms, cfg);
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
    /* The same, shard by shard, through the public API. */
    rl_shard_counters shards[8];
    size_t n = rl_agent_shards(a, shards, 8);
    cr_assert_eq(n, 3, "%zu shards", n);
    for (size_t i = 0; i < n; i++) {
        bool primary = false;
        for (int p = 0; p < 3; p++)
            primary |= strcmp(shards[i].node, prim[p]) == 0;
        cr_assert(primary, "%s is not a primary", shards[i].node);
        cr_assert_geq(shards[i].batches, 23, "%s: %llu batches",
                      shards[i].node, (unsigned long long)shards[i].batches);
        cr_assert_geq(shards[i].calls, 23);
    }
    close_agent(a, cfg);
}

/* --- 3. charge: atomic (issue 18): a shared hash tag, and without. ---- */

/* The runner's cluster: its layout into *l, and its three primaries
 * (pointing into *l). */
static void three_primaries(const char *seeds, layout *l,
                            const char *prim[16])
{
    char first[64];
    first_node(seeds, first, sizeof first);
    *l = read_layout(first);
    cr_assert_eq(primaries(l, prim), 3);
}

/* Three rules co-located by the tenant's value, a day each. */
static const char tagged_rules[] =
    "  - {name: per-ip, match: ip, limit: 30, period: 1d, hash_tag: tenant}\n"
    "  - {name: per-key, match: api_key, limit: 60, period: 1d, "
    "hash_tag: tenant}\n"
    "  - {name: per-tenant, match: tenant, limit: 100, period: 1d, "
    "hash_tag: tenant}\n"
    "charge: atomic\n";

/* A tenant whose tag, "{<len>:<value>}", lands on the given primary. */
static void tenant_on(const layout *l, const char *addr, const char *stem,
                      char *out, size_t cap)
{
    char key[RL_KEY_MAX];
    for (int i = 0; i < 100000; i++) {
        snprintf(out, cap, "%s-%d-%d", stem, (int)getpid(), i);
        rl_key_build_tagged("rl:tenant:", out, strlen(out), out, strlen(out),
                            key, sizeof key, NULL);
        int s = shard_of(l, rl_key_slot(key, strlen(key)));
        if (s >= 0 && strcmp(l->shards[s].addr, addr) == 0)
            return;
    }
    cr_assert_fail("no tenant of %s lands on %s", stem, addr);
}

/* Tokens spent from the bucket of limit a day at key (PTTL on its
 * primary, rounded up: the expiry runs down meanwhile). */
static long long spent_on(const layout *l, const char *key, long long limit)
{
    int s = shard_of(l, rl_key_slot(key, strlen(key)));
    cr_assert_geq(s, 0);
    long long ms = test_redis_pttl(l->shards[s].addr, key);
    long long per_token = 86400000LL / limit;
    return ms == -2 ? 0 : (ms + per_token - 1) / per_token;
}

struct request_contender {
    rl_agent *agent;
    rl_attr attrs[3];
    atomic_int allowed, errors;
};

static void *contend_request(void *arg)
{
    struct request_contender *c = arg;
    for (int i = 0; i < 20; i++) {
        rl_decision d;
        if (rl_check(c->agent, c->attrs, 3, 1, &d) != RL_OK || d.degraded)
            atomic_fetch_add(&c->errors, 1);
        else if (d.allowed)
            atomic_fetch_add(&c->allowed, 1);
    }
    return NULL;
}

/* Fifty threads, 1,000 requests with the three attributes; returns how
 * many were admitted. */
static int fifty_requests(rl_agent *a, const char *ip, const char *key,
                          const char *tenant)
{
    struct request_contender c = {.agent = a,
                                  .attrs = {{"ip", ip, strlen(ip)},
                                            {"api_key", key, strlen(key)},
                                            {"tenant", tenant,
                                             strlen(tenant)}}};
    pthread_t threads[50];
    for (int i = 0; i < 50; i++)
        cr_assert_eq(pthread_create(&threads[i], NULL, contend_request, &c),
                     0);
    for (int i = 0; i < 50; i++)
        pthread_join(threads[i], NULL);
    cr_assert_eq(atomic_load(&c.errors), 0, "%d checks failed",
                 atomic_load(&c.errors));
    return atomic_load(&c.allowed);
}

static uint64_t shard_calls(rl_agent *a, const char *addr)
{
    rl_shard_counters shards[8];
    size_t n = rl_agent_shards(a, shards, 8);
    for (size_t i = 0; i < n; i++) {
        if (strcmp(shards[i].node, addr) == 0)
            return shards[i].calls;
    }
    return 0;
}

Test(cluster, atomic_with_a_shared_hash_tag_is_exact_on_each_primary)
{
    const char *seeds = test_env("RL_TEST_CLUSTER");
    const char *prim[16];
    layout l;
    three_primaries(seeds, &l, prim);
    rl_config *cfg;
    rl_agent *a = cluster_agent(seeds, tagged_rules, 1000, &cfg);
    for (int p = 0; p < 3; p++) {
        char tenant[64], key[RL_KEY_MAX];
        tenant_on(&l, prim[p], "org", tenant, sizeof tenant);
        rl_decision d;
        rl_attr warm = {"tenant", "warm", 4};
        rl_check(a, &warm, 1, 1, &d);
        uint64_t calls = shard_calls(a, prim[p]);
        cr_assert_eq(fifty_requests(a, tenant, tenant, tenant), 30,
                     "on %s", prim[p]);
        /* One call per request, all on this primary. */
        cr_assert_eq(shard_calls(a, prim[p]) - calls, 1000, "on %s",
                     prim[p]);
        const char *prefixes[] = {"rl:ip:", "rl:key:", "rl:tenant:"};
        const long long limits[] = {30, 60, 100};
        for (int r = 0; r < 3; r++) {
            rl_key_build_tagged(prefixes[r], tenant, strlen(tenant), tenant,
                                strlen(tenant), key, sizeof key, NULL);
            cr_assert_eq(spent_on(&l, key, limits[r]), 30, "%s on %s", key,
                         prim[p]);
        }
    }
    close_agent(a, cfg);
}

Test(cluster, atomic_across_shards_converges_by_refund)
{
    const char *seeds = test_env("RL_TEST_CLUSTER");
    const char *prim[16];
    layout l;
    three_primaries(seeds, &l, prim);
    char ip[64], key[64], tenant[64];
    value_on(&l, prim[0], "rl:ip:", "spread", ip, sizeof ip);
    value_on(&l, prim[1], "rl:key:", "spread", key, sizeof key);
    value_on(&l, prim[2], "rl:tenant:", "spread", tenant, sizeof tenant);
    rl_config *cfg;
    rl_agent *a = cluster_agent(
        seeds,
        "  - {name: per-ip, match: ip, limit: 30, period: 1d}\n"
        "  - {name: per-key, match: api_key, limit: 60, period: 1d}\n"
        "  - {name: per-tenant, match: tenant, limit: 100, period: 1d}\n"
        "charge: atomic\n",
        1000, &cfg);
    int allowed = fifty_requests(a, ip, key, tenant);
    cr_assert_leq(allowed, 30);
    /* Refunds are not waited for; a sequential tail sees them all. */
    usleep(200 * 1000);
    rl_attr attrs[] = {{"ip", ip, strlen(ip)},
                       {"api_key", key, strlen(key)},
                       {"tenant", tenant, strlen(tenant)}};
    for (int i = 0; i < 40; i++) {
        rl_decision d;
        cr_assert_eq(rl_check(a, attrs, 3, 1, &d), RL_OK);
        cr_assert(!d.degraded);
        allowed += d.allowed;
    }
    usleep(200 * 1000);
    close_agent(a, cfg);
    cr_assert_eq(allowed, 30, "admitted %d of per-ip's 30", allowed);
    char name[96];
    snprintf(name, sizeof name, "rl:ip:%s", ip);
    cr_assert_eq(spent_on(&l, name, 30), 30);
    snprintf(name, sizeof name, "rl:key:%s", key);
    cr_assert_eq(spent_on(&l, name, 60), 30, "per-key kept a rejected "
                 "request's token");
    snprintf(name, sizeof name, "rl:tenant:%s", tenant);
    cr_assert_eq(spent_on(&l, name, 100), 30, "per-tenant kept a rejected "
                 "request's token");
}

/* --- A private cluster, for the tests that change its shape. ----------- */

static void private_cluster(test_cluster *cl, const char *name, char *seeds,
                            size_t cap)
{
    char root[600], err[512];
    snprintf(root, sizeof root, "%s/%s-%d", test_env("RL_TEST_TMPDIR"),
             name, (int)getpid());
    cr_assert_eq(mkdir(root, 0755), 0, "mkdir %s", root);
    cr_assert_eq(test_cluster_start(cl, root, err, sizeof err), 0, "%s", err);
    seeds[0] = '\0';
    for (int i = 0; i < TEST_CLUSTER_NODES; i++) {
        char one[32];
        snprintf(one, sizeof one, "%s127.0.0.1:%u", i ? "," : "",
                 cl->nodes[i].port);
        strncat(seeds, one, cap - strlen(seeds) - 1);
    }
}

static redisReply *on_node(const char *addr, const char *fmt, ...)
{
    redisContext *c = test_redis_connect(addr);
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = redisvCommand(c, fmt, ap);
    va_end(ap);
    cr_assert_not_null(r, "%s: %s", addr, c->errstr);
    cr_assert_neq(r->type, REDIS_REPLY_ERROR, "%s: %s", addr, r->str);
    redisFree(c);
    return r;
}

static void node_id(const char *addr, char *out, size_t cap)
{
    redisReply *r = on_node(addr, "CLUSTER MYID");
    snprintf(out, cap, "%s", r->str);
    freeReplyObject(r);
}

/* Moves one slot from one primary to another, key by key, the way
 * redis-cli --cluster reshard does, with pauses so that checks meet the
 * slot half-moved (ASK) and moved (MOVED). */
static void move_slot(unsigned slot, const char *from, const char *to,
                      const char *others[], int n_others)
{
    char from_id[48], to_id[48], host[64];
    unsigned port;
    node_id(from, from_id, sizeof from_id);
    node_id(to, to_id, sizeof to_id);
    sscanf(to, "%63[^:]:%u", host, &port);
    freeReplyObject(on_node(to, "CLUSTER SETSLOT %u IMPORTING %s", slot,
                            from_id));
    freeReplyObject(on_node(from, "CLUSTER SETSLOT %u MIGRATING %s", slot,
                            to_id));
    usleep(100 * 1000);
    for (;;) {
        redisReply *keys = on_node(from, "CLUSTER GETKEYSINSLOT %u 10", slot);
        size_t n = keys->elements;
        for (size_t i = 0; i < n; i++) {
            freeReplyObject(on_node(from, "MIGRATE %s %u %b 0 5000", host,
                                    port, keys->element[i]->str,
                                    (size_t)keys->element[i]->len));
            usleep(50 * 1000);
        }
        freeReplyObject(keys);
        if (n == 0)
            break;
    }
    freeReplyObject(on_node(to, "CLUSTER SETSLOT %u NODE %s", slot, to_id));
    freeReplyObject(on_node(from, "CLUSTER SETSLOT %u NODE %s", slot, to_id));
    for (int i = 0; i < n_others; i++)
        freeReplyObject(on_node(others[i], "CLUSTER SETSLOT %u NODE %s",
                                slot, to_id));
}

#define VALUES 4
#define RESHARD_BURST "1000000000"

struct hammer {
    rl_agent *agent;
    char values[VALUES][64];
    atomic_bool stop;
    atomic_int allowed[VALUES];
    atomic_int checks, errors;
};

static void *hammer(void *arg)
{
    struct hammer *h = arg;
    for (int i = 0; !atomic_load(&h->stop); i++) {
        int v = i % VALUES;
        rl_attr attr = {"api_key", h->values[v], strlen(h->values[v])};
        rl_decision d;
        if (rl_check(h->agent, &attr, 1, 1, &d) != RL_OK || d.degraded)
            atomic_fetch_add(&h->errors, 1);
        else if (d.allowed)
            atomic_fetch_add(&h->allowed[v], 1);
        atomic_fetch_add(&h->checks, 1);
    }
    return NULL;
}

Test(cluster, resharding_under_load_loses_no_check_and_no_token)
{
    test_cluster cl;
    char seeds[512], first[64];
    private_cluster(&cl, "reshard", seeds, sizeof seeds);
    first_node(seeds, first, sizeof first);
    layout l = read_layout(first);
    const char *prim[16];
    cr_assert_eq(primaries(&l, prim), 3);
    rl_config *cfg;
    struct hammer h = {0};
    /* A bucket that never runs dry, so that every check takes a token,
     * those that meet ASK and MOVED too; one token comes back an hour,
     * none during the test. */
    h.agent = cluster_agent(seeds, "  - {name: per-key, match: api_key, "
                            "limit: 1, period: 1h, burst: " RESHARD_BURST
                            "}\n", 1000, &cfg);
    unsigned slots[VALUES];
    for (int v = 0; v < VALUES; v++) {
        char stem[16];
        snprintf(stem, sizeof stem, "move%d", v);
        value_on(&l, prim[0], "rl:key:", stem, h.values[v],
                 sizeof h.values[v]);
        char key[RL_KEY_MAX];
        snprintf(key, sizeof key, "rl:key:%s", h.values[v]);
        slots[v] = rl_key_slot(key, strlen(key));
    }
    pthread_t threads[8];
    for (int i = 0; i < 8; i++)
        pthread_create(&threads[i], NULL, hammer, &h);
    usleep(300 * 1000);
    for (int v = 0; v < VALUES; v++)
        move_slot(slots[v], prim[0], prim[1], &prim[2], 1);
    usleep(500 * 1000);
    atomic_store(&h.stop, true);
    for (int i = 0; i < 8; i++)
        pthread_join(threads[i], NULL);
    rl_store_counters *sc = &h.agent->store_counters;
    uint64_t moved = load(&sc->moved), asked = load(&sc->asked);
    /* What each bucket has left, read with one more check: every check
     * admitted took one token, and no other token went. */
    long long left[VALUES];
    for (int v = 0; v < VALUES; v++) {
        rl_attr attr = {"api_key", h.values[v], strlen(h.values[v])};
        rl_decision d;
        cr_assert_eq(rl_check(h.agent, &attr, 1, 1, &d), RL_OK);
        cr_assert(d.allowed && !d.degraded, "bucket %d after the moves: %s",
                  v, d.degraded ? "degraded" : "rejected");
        left[v] = (long long)d.remaining;
    }
    close_agent(h.agent, cfg);
    test_cluster_stop(&cl);
    fprintf(stderr, "cluster reshard: %d checks, %d slots moved, MOVED "
            "followed %llu, ASK followed %llu, failed or degraded %d, "
            "admitted %d/%d/%d/%d\n", atomic_load(&h.checks),
            VALUES, (unsigned long long)moved, (unsigned long long)asked,
            atomic_load(&h.errors), atomic_load(&h.allowed[0]),
            atomic_load(&h.allowed[1]), atomic_load(&h.allowed[2]),
            atomic_load(&h.allowed[3]));
    cr_assert_eq(atomic_load(&h.errors), 0, "%d of %d checks failed or were "
                 "degraded", atomic_load(&h.errors), atomic_load(&h.checks));
    for (int v = 0; v < VALUES; v++) {
        long long taken = atomic_load(&h.allowed[v]) + 1;
        cr_assert_eq(left[v], atoll(RESHARD_BURST) - taken, "bucket %d: %lld "
                     "checks admitted, %lld tokens gone", v, taken,
                     atoll(RESHARD_BURST) - left[v]);
    }
    cr_assert_gt(moved, 0, "no MOVED was followed");
    cr_assert_gt(asked, 0, "no ASK was followed");
}

/* --- 4. Failover under load. ------------------------------------------- */

struct steady {
    rl_agent *agent;
    const char *value;
    atomic_bool stop;
    atomic_int checks, degraded;
};

static void *steady(void *arg)
{
    struct steady *s = arg;
    rl_attr attr = {"api_key", s->value, strlen(s->value)};
    while (!atomic_load(&s->stop)) {
        rl_decision d;
        if (rl_check(s->agent, &attr, 1, 1, &d) != RL_OK || d.degraded)
            atomic_fetch_add(&s->degraded, 1);
        atomic_fetch_add(&s->checks, 1);
        usleep(2000);
    }
    return NULL;
}

Test(cluster, failover_is_survived_without_a_restart)
{
    test_cluster cl;
    char seeds[512], first[64];
    private_cluster(&cl, "failover", seeds, sizeof seeds);
    first_node(seeds, first, sizeof first);
    layout l = read_layout(first);
    const char *prim[16];
    cr_assert_eq(primaries(&l, prim), 3);
    char victim_value[64], other_value[64];
    value_on(&l, prim[0], "rl:key:", "victim", victim_value,
             sizeof victim_value);
    value_on(&l, prim[1], "rl:key:", "bystander", other_value,
             sizeof other_value);
    rl_config *cfg;
    rl_agent *a = cluster_agent(seeds, "  - {name: per-key, match: api_key, "
                                "limit: 100, period: 1h, on_error: allow}\n",
                                200, &cfg);
    rl_attr victim = {"api_key", victim_value, strlen(victim_value)};
    rl_decision d;
    for (int i = 0; i < 60; i++) {
        cr_assert_eq(rl_check(a, &victim, 1, 1, &d), RL_OK);
        cr_assert(d.allowed && !d.degraded);
    }
    uint64_t before = d.remaining; /* 40 */
    usleep(200 * 1000);            /* the replica has the writes */

    struct steady other = {.agent = a, .value = other_value};
    pthread_t thread;
    pthread_create(&thread, NULL, steady, &other);
    int victim_node = -1;
    for (int i = 0; i < TEST_CLUSTER_NODES; i++) {
        char addr[32];
        snprintf(addr, sizeof addr, "127.0.0.1:%u", cl.nodes[i].port);
        if (strcmp(addr, prim[0]) == 0)
            victim_node = i;
    }
    cr_assert_geq(victim_node, 0);
    test_sched_probe probe;
    test_sched_probe_start(&probe);
    test_redis_kill(&cl.nodes[victim_node]);
    uint64_t killed_at = test_now_ms(), slowest = 0;
    int degraded = 0;
    for (;;) {
        uint64_t t0 = test_now_us();
        cr_assert_eq(rl_check(a, &victim, 1, 1, &d), RL_OK);
        uint64_t took = test_now_us() - t0;
        slowest = took > slowest ? took : slowest;
        if (!d.degraded)
            break;
        cr_assert(d.allowed, "on_error: allow was not honoured");
        degraded++;
        cr_assert_lt(test_now_ms() - killed_at, 60000,
                     "the replica was never used");
        usleep(20 * 1000);
    }
    uint64_t recovered_ms = test_now_ms() - killed_at;
    uint64_t overslept = test_sched_probe_stop(&probe);
    atomic_store(&other.stop, true);
    pthread_join(thread, NULL);
    close_agent(a, cfg);
    test_cluster_stop(&cl);
    fprintf(stderr, "cluster failover: primary killed, %d checks on its "
            "shard degraded (slowest %llu us, deadline 200 ms, the probe "
            "overslept %llu us), answered again after %llu ms, remaining %llu "
            "(was %llu); other shard: %d checks, %d degraded\n", degraded,
            (unsigned long long)slowest, (unsigned long long)overslept,
            (unsigned long long)recovered_ms,
            (unsigned long long)d.remaining, (unsigned long long)before,
            atomic_load(&other.checks), atomic_load(&other.degraded));
    cr_assert_gt(degraded, 0, "the kill went unnoticed");
    cr_assert_leq(slowest, test_deadline_latest_us(200, overslept),
                  "a check took %llu us with a 200 ms deadline",
                  (unsigned long long)slowest);
    cr_assert(d.allowed);
    cr_assert_geq(d.remaining + 1, before, "the bucket came back emptier");
    cr_assert_eq(atomic_load(&other.degraded), 0, "another shard's checks "
                 "were degraded");
}

/* --- store.wait_replicas: WAIT after each write. ------------------------- */

static long long wait_calls(const char *addr)
{
    redisReply *r = on_node(addr, "INFO commandstats");
    const char *at = strstr(r->str, "cmdstat_wait:calls=");
    long long n = at != NULL ? atoll(at + strlen("cmdstat_wait:calls=")) : 0;
    freeReplyObject(r);
    return n;
}

/* A connection to addr that has sent MONITOR: it hears every command the
 * node runs from then on. */
static redisContext *monitor_node(const char *addr)
{
    redisContext *c = test_redis_connect(addr);
    redisReply *r = redisCommand(c, "MONITOR");
    cr_assert(r != NULL && r->type == REDIS_REPLY_STATUS, "%s: MONITOR: %s",
              addr, r != NULL ? r->str : c->errstr);
    freeReplyObject(r);
    return c;
}

/* The addresses on addr of this process's connections (node.c names them
 * rl:<program>:<pid>), each with its closing "]" as MONITOR prints it. */
static size_t own_clients(const char *addr, char (*out)[64], size_t cap)
{
    char suffix[32];
    snprintf(suffix, sizeof suffix, ":%ld", (long)getpid());
    redisReply *r = on_node(addr, "CLIENT LIST");
    size_t n = 0;
    for (char *line = strtok(r->str, "\n"); line != NULL;
         line = strtok(NULL, "\n")) {
        char client[48], name[64];
        if (sscanf(line, "%*s addr=%47s", client) != 1)
            continue;
        const char *at = strstr(line, " name=rl:");
        if (at == NULL || sscanf(at, " name=%63s", name) != 1)
            continue;
        size_t len = strlen(name);
        if (len >= strlen(suffix)
            && strcmp(name + len - strlen(suffix), suffix) == 0) {
            cr_assert_lt(n, cap, "more than %zu connections named %s on %s",
                         cap, name, addr);
            snprintf(out[n++], sizeof out[0], "%s]", client);
        }
    }
    freeReplyObject(r);
    return n;
}

/* The WAITs monitor heard from this process's connections: other tests'
 * agents send theirs to the same primaries, which INFO commandstats
 * counts together ("WAIT ran 29 times for 15 writes", four tests at a
 * time under TSan). Read up to an ECHO of a word of this process's. */
static long long own_waits(redisContext *monitor, const char *addr)
{
    char clients[16][64], end[48];
    size_t n = own_clients(addr, clients, 16);
    cr_assert_gt(n, 0, "no connection of this process on %s", addr);
    snprintf(end, sizeof end, "\"rl-test-monitor-end-%ld\"", (long)getpid());
    freeReplyObject(on_node(addr, "ECHO %b", end + 1, strlen(end) - 2));
    long long waits = 0;
    for (;;) {
        redisReply *r;
        cr_assert_eq(redisGetReply(monitor, (void **)&r), REDIS_OK,
                     "%s: MONITOR: %s", addr, monitor->errstr);
        bool done = r->type == REDIS_REPLY_STATUS && strstr(r->str, end);
        for (size_t i = 0; !done && i < n; i++)
            waits += r->type == REDIS_REPLY_STATUS
                     && strstr(r->str, clients[i]) != NULL
                     && strstr(r->str, "\"WAIT\"") != NULL;
        freeReplyObject(r);
        if (done)
            return waits;
    }
}

Test(cluster, wait_replicas_waits_for_a_replica_after_each_write)
{
    const char *seeds = test_env("RL_TEST_CLUSTER");
    char first[64], value[64];
    first_node(seeds, first, sizeof first);
    layout l = read_layout(first);
    const char *prim[16];
    cr_assert_eq(primaries(&l, prim), 3);
    value_on(&l, prim[0], "rl:key:", "waited", value, sizeof value);
    rl_config *cfg;
    rl_agent *a = cluster_agent_with(seeds, ", wait_replicas: 1",
                                     "  - {name: per-key, match: api_key, "
                                     "limit: 10, period: 1h}\n", 1000, &cfg);
    redisContext *monitor = monitor_node(prim[0]);
    rl_attr attr = {"api_key", value, strlen(value)};
    int allowed = 0;
    for (int i = 0; i < 15; i++) {
        rl_decision d;
        cr_assert_eq(rl_check(a, &attr, 1, 1, &d), RL_OK);
        cr_assert(!d.degraded, "a check waited past its deadline");
        allowed += d.allowed;
    }
    long long waited = own_waits(monitor, prim[0]);
    redisFree(monitor);
    close_agent(a, cfg);
    cr_assert_eq(allowed, 10);
    cr_assert_eq(waited, 15, "WAIT ran %lld times for 15 writes", waited);
}

/* A fixed window's INCRBY goes to the primary that serves its window key
 * (a plain command, routed by its key), is exact there, and waits for a
 * replica as a script's write does. */
Test(cluster, a_fixed_window_counts_on_its_keys_primary_and_waits)
{
    const char *seeds = test_env("RL_TEST_CLUSTER");
    char first[64];
    first_node(seeds, first, sizeof first);
    layout l = read_layout(first);
    rl_config *cfg;
    rl_agent *a = cluster_agent_with(seeds, ", wait_replicas: 1",
                                     "  - {name: w, match: api_key, "
                                     "limit: 100, period: 1h, "
                                     "algorithm: fixed_window}\n",
                                     1000, &cfg);
    const char *prim[16];
    cr_assert_eq(primaries(&l, prim), 3);
    uint64_t window = (uint64_t)time(NULL) / 3600;
    for (int p = 0, v = 0; p < 3; p++) {
        /* A value whose window key lands on this primary. */
        char value[32], key[64];
        const char *primary;
        do {
            snprintf(value, sizeof value, "window-%d", v++);
            snprintf(key, sizeof key, "rl:key:%s:%llu", value,
                     (unsigned long long)window);
            primary =
                l.shards[shard_of(&l, rl_key_slot(key, strlen(key)))].addr;
        } while (strcmp(primary, prim[p]) != 0);
        struct contender c = {.agent = a, .value = value};
        long long waits = wait_calls(primary);
        uint64_t moved = load(&a->store_counters.moved);
        pthread_t threads[50];
        for (int i = 0; i < 50; i++)
            pthread_create(&threads[i], NULL, contend, &c);
        for (int i = 0; i < 50; i++)
            pthread_join(threads[i], NULL);
        cr_assert_eq(atomic_load(&c.errors), 0, "%d checks failed",
                     atomic_load(&c.errors));
        cr_assert_eq(atomic_load(&c.allowed), 100, "%s admitted %d", value,
                     atomic_load(&c.allowed));
        redisReply *r = on_node(primary, "GET %s", key);
        cr_assert(r->type == REDIS_REPLY_STRING && atoll(r->str) == 1000,
                  "%s on %s holds %s", key, primary,
                  r->type == REDIS_REPLY_STRING ? r->str : "nothing");
        freeReplyObject(r);
        cr_assert_gt(wait_calls(primary), waits, "no WAIT on %s", primary);
        cr_assert_eq(load(&a->store_counters.moved), moved,
                     "a window's command went to another primary first");
    }
    close_agent(a, cfg);
}
