/*
 * Issue 15's rules against a real redis-server, a real Redis Cluster and a
 * real rl-aggregator: tiers by a `when` override, per-value overrides
 * inline and from a 100,000-line overrides_file, when/prefix scoping on
 * method and path, composite keys (unambiguous, and placed on the cluster
 * by the whole key or by its hash tag), unlimited values that never reach
 * the store, shadow rules, and synced and local rules under loads above
 * their limits.
 */
#include "agent_impl.h"
#include "keys.h"
#include "redis_server.h"
#include "test_agent.h"
#include "test_aggregator.h"
#include "test_env.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* One check of cost 1 with up to four name=value attributes. */
static rl_decision check_on(rl_agent *a, const char *kv1, const char *kv2,
                            const char *kv3, const char *kv4)
{
    const char *kvs[] = {kv1, kv2, kv3, kv4};
    rl_attr attrs[4];
    char names[4][64];
    size_t n = 0;
    for (int i = 0; i < 4 && kvs[i] != NULL; i++, n++) {
        const char *eq = strchr(kvs[i], '=');
        cr_assert_not_null(eq);
        snprintf(names[n], sizeof names[n], "%.*s", (int)(eq - kvs[i]),
                 kvs[i]);
        attrs[n] = (rl_attr){names[n], eq + 1, strlen(eq + 1)};
    }
    rl_decision d;
    int rc = rl_check(a, attrs, n, 1, &d);
    cr_assert_eq(rc, RL_OK, "rl_check: %s", rl_strerror(rc));
    return d;
}

/* Offers `offered` checks and returns how many were allowed; every one
 * answered (not degraded), by rule (or by no rule when rule is ""). */
static int offer(rl_agent *a, int offered, const char *rule, const char *kv1,
                 const char *kv2, const char *kv3)
{
    int allowed = 0;
    for (int i = 0; i < offered; i++) {
        rl_decision d = check_on(a, kv1, kv2, kv3, NULL);
        cr_assert(!d.degraded, "check %d of %s degraded", i, kv1);
        if (d.allowed)
            allowed++;
        else
            cr_assert_str_eq(d.rule, rule, "rejected by %s", d.rule);
    }
    return allowed;
}

static bool redis_has(const char *addr, const char *key)
{
    redisContext *c = test_redis_connect(addr);
    redisReply *r = test_redis_command(c, "EXISTS %b", key, strlen(key));
    bool has = r->integer == 1;
    freeReplyObject(r);
    redisFree(c);
    return has;
}

static void unique(char *out, size_t cap, const char *stem)
{
    static int n;
    snprintf(out, cap, "%s-%d-%d-%d", stem, (int)getpid(), n++, rand());
}

/* --- Tiers: a `when` override on the same bucket. --------------------- */

TEST_BOTH_MODES(rules, a_plan_override_sets_the_rate_of_the_same_bucket)
{
    test_agent t;
    test_agent_open(&t, NULL, mode, NULL, NULL,
                    "  - name: per-key\n"
                    "    match: api_key\n"
                    "    limit: 3\n"
                    "    period: 1h\n"
                    "    overrides:\n"
                    "      - {when: {plan: enterprise}, limit: 10, "
                    "name: enterprise}\n");
    char free_key[96], ent_key[96], kv[128], kv2[128];
    unique(free_key, sizeof free_key, "free");
    unique(ent_key, sizeof ent_key, "ent");

    snprintf(kv, sizeof kv, "api_key=%s", free_key);
    cr_assert_eq(offer(t.agent, 30, "per-key", kv, "plan=free", NULL), 3);
    rl_decision d = check_on(t.agent, kv, "plan=free", NULL, NULL);
    cr_assert_eq(d.limit, 3);
    cr_assert_str_eq(d.override, "", "the rule's own rate is unnamed");

    snprintf(kv2, sizeof kv2, "api_key=%s", ent_key);
    cr_assert_eq(offer(t.agent, 30, "per-key", kv2, "plan=enterprise", NULL),
                 10);
    d = check_on(t.agent, kv2, "plan=enterprise", NULL, NULL);
    cr_assert(!d.allowed);
    cr_assert_eq(d.limit, 10);
    cr_assert_eq(d.period_ms, 3600000);
    cr_assert_str_eq(d.override, "enterprise");
    char h[512];
    cr_assert_gt(rl_format_headers(&d, h, sizeof h), 0);
    cr_assert(strstr(h, "RateLimit-Policy: \"per-key\";q=10;w=3600\r\n")
              != NULL, "%s", h);
    cr_assert(strstr(h, "RateLimit-Limit: 10\r\n") != NULL, "%s", h);

    /* The free key's bucket, now at the enterprise rate: still the same
     * bucket, its 3 tokens spent kept, so the upgrade gives the difference
     * (7) and then refills at 10 an hour, one token in 6 min instead of
     * 20. */
    cr_assert_eq(offer(t.agent, 30, "per-key", kv, "plan=enterprise", NULL),
                 7);
    d = check_on(t.agent, kv, "plan=enterprise", NULL, NULL);
    cr_assert(!d.allowed);
    cr_assert_eq(d.limit, 10);
    cr_assert_str_eq(d.override, "enterprise");
    cr_assert(d.retry_after_ms > 350000 && d.retry_after_ms <= 360000,
              "retry %lld ms at the new rate", (long long)d.retry_after_ms);
    test_agent_close(&t);
}

/* --- Per-value overrides, inline and from a 100,000-line file. --------- */

#define FILE_LINES 100000

/* A temporary directory for a config and its overrides file. */
static void temp_dir(char *out, size_t cap, const char *stem)
{
    snprintf(out, cap, "%s/%s-%d", test_env("RL_TEST_TMPDIR"), stem,
             (int)getpid());
    mkdir(out, 0700);
}

/* The file: a comment on line 1, then ak_f<i> with limit 3 + i % 4. */
static void write_overrides(const char *dir, const char *name, int lines)
{
    char path[600];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fprintf(f, "# value limit period [burst]\n");
    for (int i = 0; i < lines; i++)
        fprintf(f, "ak_f%d\t%d 1h\n", i, 3 + i % 4);
    cr_assert_eq(fclose(f), 0);
}

static void write_config(const char *dir, const char *name, const char *body,
                         char *path, size_t cap)
{
    snprintf(path, cap, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fputs(body, f);
    cr_assert_eq(fclose(f), 0);
}

/* Lines of write_overrides' file apply, each at its rate and named by
 * its line: the first, one in the middle, the last. */
static void expect_file_lines_apply(rl_agent *a)
{
    int picks[] = {0, 54321, FILE_LINES - 1};
    for (int i = 0; i < 3; i++) {
        char kv[64], label[64];
        snprintf(kv, sizeof kv, "api_key=ak_f%d", picks[i]);
        int limit = 3 + picks[i] % 4;
        cr_assert_eq(offer(a, 20, "per-key", kv, NULL, NULL), limit, "%s",
                     kv);
        rl_decision d = check_on(a, kv, NULL, NULL, NULL);
        cr_assert_eq(d.limit, (uint64_t)limit);
        snprintf(label, sizeof label, "partners.tsv:%d", picks[i] + 2);
        cr_assert_str_eq(d.override, label);
    }
}

Test(rules, value_overrides_inline_and_from_a_100000_line_file)
{
    char dir[512], path[700], yaml[1024];
    temp_dir(dir, sizeof dir, "overrides");
    write_overrides(dir, "partners.tsv", FILE_LINES);
    snprintf(yaml, sizeof yaml,
             "store: {url: redis://%s, timeout_ms: 1000}\n"
             "rules:\n"
             "  - name: per-key\n"
             "    match: api_key\n"
             "    key_prefix: 'rl:ov%d:'\n"
             "    limit: 2\n"
             "    period: 1h\n"
             "    overrides:\n"
             "      - {values: [ak_partner1, ak_partner2], limit: 5}\n"
             "      - {values: [ak_internal_monitor], unlimited: true}\n"
             "    overrides_file: partners.tsv\n",
             test_env("RL_TEST_REDIS"), (int)getpid());
    write_config(dir, "rules.yaml", yaml, path, sizeof path);
    uint64_t start = test_now_us();
    rl_config *cfg;
    rl_agent *a = test_agent_on(path, &cfg, NULL);
    fprintf(stderr, "rules: a config with %d override lines loaded in "
            "%llu ms\n", FILE_LINES,
            (unsigned long long)(test_now_us() - start) / 1000);

    cr_assert_eq(offer(a, 20, "per-key", "api_key=ak_partner2", NULL, NULL),
                 5);
    rl_decision d = check_on(a, "api_key=ak_partner2", NULL, NULL, NULL);
    cr_assert_eq(d.limit, 5);
    cr_assert_str_eq(d.override, "overrides[0]");
    cr_assert_eq(offer(a, 20, "per-key", "api_key=ak_nobody", NULL, NULL),
                 2);
    d = check_on(a, "api_key=ak_nobody", NULL, NULL, NULL);
    cr_assert_eq(d.limit, 2);
    cr_assert_str_eq(d.override, "");

    expect_file_lines_apply(a);

    /* Never limited, never counted. */
    cr_assert_eq(offer(a, 50, "", "api_key=ak_internal_monitor", NULL, NULL),
                 50);
    d = check_on(a, "api_key=ak_internal_monitor", NULL, NULL, NULL);
    cr_assert_str_eq(d.rule, "", "an unlimited rule is not in the decision");
    char key[96];
    snprintf(key, sizeof key, "rl:ov%d:ak_internal_monitor", (int)getpid());
    cr_assert(!redis_has(test_env("RL_TEST_REDIS"), key));
    rl_agent_close(a);
    rl_config_free(cfg);
}

/* Synced and local rules with nothing but values overrides take a path of
 * their own (check.c: decide_locally_values, the value hashed once for the
 * map and the rule's table): the same answers as the general path, alone
 * and beside a plain rule. */
static void value_overrides_decided_here(const char *mode)
{
    char dir[512], path[700], yaml[1024], stem[64];
    snprintf(stem, sizeof stem, "values-%s", mode);
    temp_dir(dir, sizeof dir, stem);
    write_overrides(dir, "partners.tsv", FILE_LINES);
    bool synced = strcmp(mode, "synced") == 0;
    snprintf(yaml, sizeof yaml,
             "%s"
             "rules:\n"
             "  - name: per-key\n"
             "    match: api_key\n"
             "    key_prefix: 'rl:vk%s%d:'\n"
             "    limit: 2\n"
             "    period: 1h\n"
             "    mode: %s\n"
             "    overrides:\n"
             "      - {values: [ak_partner1, ak_partner2], limit: 5}\n"
             "      - {values: [ak_internal_monitor], unlimited: true}\n"
             "      - {values: [ak_gold], limit: 4, name: gold}\n"
             "    overrides_file: partners.tsv\n"
             "  - name: per-tenant\n"
             "    match: tenant\n"
             "    key_prefix: 'rl:vt%s%d:'\n"
             "    limit: 100\n"
             "    period: 1h\n"
             "    mode: %s\n",
             synced ? "store: {url: \"redis://127.0.0.1:1\"}\n"
                      "aggregator: {reports: \"tcp://127.0.0.1:1\", "
                      "totals: \"tcp://127.0.0.1:2\"}\n"
                    : "",
             mode, (int)getpid(), mode, mode, (int)getpid(), mode);
    write_config(dir, "rules.yaml", yaml, path, sizeof path);
    rl_config *cfg;
    rl_error err;
    cr_assert_eq(rl_config_load(path, &cfg, &err), RL_OK, "%s", err.message);
    rl_options o = {.config = cfg};
    rl_agent *a;
    cr_assert_eq(rl_agent_open(&a, &o, &err), RL_OK, "%s", err.message);

    cr_assert_eq(offer(a, 20, "per-key", "api_key=ak_partner2", NULL, NULL),
                 5, "%s", mode);
    rl_decision d = check_on(a, "api_key=ak_partner2", NULL, NULL, NULL);
    cr_assert(!d.allowed);
    cr_assert_eq(d.limit, 5);
    cr_assert_str_eq(d.override, "overrides[0]");
    cr_assert_eq(offer(a, 20, "per-key", "api_key=ak_gold", NULL, NULL), 4);
    d = check_on(a, "api_key=ak_gold", NULL, NULL, NULL);
    cr_assert_eq(d.limit, 4);
    cr_assert_str_eq(d.override, "gold");
    cr_assert_eq(offer(a, 20, "per-key", "api_key=ak_nobody", NULL, NULL),
                 2);
    d = check_on(a, "api_key=ak_nobody", NULL, NULL, NULL);
    cr_assert_eq(d.limit, 2);
    cr_assert_str_eq(d.override, "");
    expect_file_lines_apply(a);
    /* Unlimited: the rule does not apply, alone or beside another. */
    cr_assert_eq(offer(a, 30, "", "api_key=ak_internal_monitor", NULL, NULL),
                 30);
    d = check_on(a, "api_key=ak_internal_monitor", NULL, NULL, NULL);
    cr_assert_str_eq(d.rule, "");
    d = check_on(a, "api_key=ak_internal_monitor", "tenant=t2", NULL, NULL);
    cr_assert_str_eq(d.rule, "per-tenant");
    cr_assert_eq(d.limit, 100);
    cr_assert_str_eq(d.override, "");
    /* Two rules: the override's rate still bounds its key. */
    cr_assert_eq(offer(a, 20, "per-key", "api_key=ak_partner1", "tenant=t1",
                       NULL), 5);
    d = check_on(a, "api_key=ak_partner1", "tenant=t1", NULL, NULL);
    cr_assert_str_eq(d.rule, "per-key");
    cr_assert_eq(d.limit, 5);
    cr_assert_str_eq(d.override, "overrides[0]");
    rl_agent_close(a);
    rl_config_free(cfg);
}

Test(rules, value_overrides_on_synced_and_local_rules)
{
    value_overrides_decided_here("local");
    value_overrides_decided_here("synced");
}

/* --- Unlimited: no round trip, even with Redis paused. ------------------ */

Test(rules, unlimited_values_make_no_round_trip)
{
    test_redis srv;
    char err[256], addr[64];
    test_redis_options o = {0};
    cr_assert_eq(test_redis_start(&srv, test_env("RL_TEST_TMPDIR"), &o, err,
                                  sizeof err), 0, "%s", err);
    snprintf(addr, sizeof addr, "127.0.0.1:%u", srv.port);
    test_agent t;
    test_agent_open(&t, addr, TEST_FCALL, "  timeout_ms: 200\n", NULL,
                    "  - name: per-key\n"
                    "    match: api_key\n"
                    "    limit: 1000\n"
                    "    period: 1m\n"
                    "    overrides:\n"
                    "      - {values: [ak_monitor], unlimited: true}\n"
                    "  - name: per-ip\n"
                    "    match: ip\n"
                    "    limit: 1000\n"
                    "    period: 1m\n"
                    "    overrides:\n"
                    "      - {when: {api_key: ak_monitor}, unlimited: true}\n");
    cr_assert(!check_on(t.agent, "api_key=ak_other", NULL, NULL, NULL)
                   .degraded);
    uint64_t calls = test_store_calls(t.agent);
    cr_assert_gt(calls, 0);
    for (int i = 0; i < 100; i++) {
        rl_decision d = check_on(t.agent, "api_key=ak_monitor", "ip=10.0.0.1",
                                 NULL, NULL);
        cr_assert(d.allowed && !d.degraded);
        cr_assert_str_eq(d.rule, "");
    }
    cr_assert_eq(test_store_calls(t.agent), calls,
                 "unlimited checks called the store");

    /* Redis stops answering: an unlimited check does not wait for it. */
    test_redis_pause(&srv);
    uint64_t slowest = 0;
    for (int i = 0; i < 200; i++) {
        uint64_t start = test_now_us();
        rl_decision d = check_on(t.agent, "api_key=ak_monitor", "ip=10.0.0.1",
                                 NULL, NULL);
        uint64_t took = test_now_us() - start;
        slowest = took > slowest ? took : slowest;
        cr_assert(d.allowed && !d.degraded);
    }
    /* Far below the 200 ms deadline a store call would wait for. */
    cr_assert_lt(slowest, 50000, "an unlimited check took %llu us",
                 (unsigned long long)slowest);
    cr_assert(check_on(t.agent, "api_key=ak_other", NULL, NULL, NULL)
                  .degraded, "Redis is paused: a counted rule degrades");
    cr_assert_eq(test_store_calls(t.agent), calls + 1);
    test_redis_resume(&srv);
    test_agent_close(&t);
    test_redis_stop(&srv);
}

/* --- when: method and path, equal, any of, prefix. --------------------- */

TEST_BOTH_MODES(rules, when_scopes_rules_by_method_and_path)
{
    test_agent t;
    char ip[96], kv[128];
    unique(ip, sizeof ip, "198.51.100.7");
    snprintf(kv, sizeof kv, "ip=%s", ip);
    test_agent_open(&t, NULL, mode, NULL, NULL,
                    "  - name: login-per-ip\n"
                    "    match: ip\n"
                    "    when: {method: POST, path: /v1/login}\n"
                    "    limit: 2\n"
                    "    period: 1h\n"
                    "  - name: v1-writes\n"
                    "    match: ip\n"
                    "    key_prefix: 'rl:v1w:'\n"
                    "    when: {method: [PUT, PATCH, DELETE], "
                    "path: {prefix: /v1/}}\n"
                    "    limit: 4\n"
                    "    period: 1h\n");
    /* Only POST /v1/login counts against login-per-ip. */
    cr_assert_eq(offer(t.agent, 10, "login-per-ip", kv, "method=POST",
                       "path=/v1/login"), 2);
    rl_decision d = check_on(t.agent, kv, "method=GET", "path=/v1/login",
                             NULL);
    cr_assert(d.allowed);
    cr_assert_str_eq(d.rule, "", "GET is not in the when");
    d = check_on(t.agent, kv, "method=POST", "path=/v1/login/x", NULL);
    cr_assert(d.allowed && d.rule[0] == '\0', "an equal path is not a prefix");
    d = check_on(t.agent, kv, "path=/v1/login", NULL, NULL);
    cr_assert(d.allowed && d.rule[0] == '\0', "no method, no match");
    /* Any of three methods under the prefix share one bucket of 4. */
    const char *methods[] = {"method=PUT", "method=PATCH", "method=DELETE",
                             "method=PUT"};
    for (int i = 0; i < 4; i++) {
        d = check_on(t.agent, kv, methods[i], "path=/v1/items/9", NULL);
        cr_assert(d.allowed);
        cr_assert_str_eq(d.rule, "v1-writes");
    }
    d = check_on(t.agent, kv, "method=DELETE", "path=/v1/", NULL);
    cr_assert(!d.allowed);
    cr_assert_str_eq(d.rule, "v1-writes");
    d = check_on(t.agent, kv, "method=DELETE", "path=/v2/items/9", NULL);
    cr_assert(d.allowed && d.rule[0] == '\0', "/v2/ is outside the prefix");
    test_agent_close(&t);
}

/* --- Composite keys on one server. -------------------------------------- */

static const char composite_rules[] =
    "  - name: per-key-per-route\n"
    "    match: [api_key, route]\n"
    "    limit: 2\n"
    "    period: 1h\n";

TEST_BOTH_MODES(rules, composite_keys_are_unambiguous_and_need_every_part)
{
    test_agent t;
    test_agent_open(&t, NULL, mode, NULL, NULL, composite_rules);
    char a[96], a_b[128], kv1[160], kv2[160], key[256];
    unique(a, sizeof a, "ck");
    snprintf(a_b, sizeof a_b, "%s:b", a);
    /* ("A:b", "c") and ("A", "b:c") are two buckets. */
    snprintf(kv1, sizeof kv1, "api_key=%s", a_b);
    cr_assert_eq(offer(t.agent, 5, "per-key-per-route", kv1, "route=c",
                       NULL), 2);
    snprintf(kv2, sizeof kv2, "api_key=%s", a);
    cr_assert_eq(offer(t.agent, 5, "per-key-per-route", kv2, "route=b:c",
                       NULL), 2);
    snprintf(key, sizeof key, "rl:key_route:%zu:%s:1:c", strlen(a_b), a_b);
    cr_assert(redis_has(t.addr, key), "no key %s", key);
    snprintf(key, sizeof key, "rl:key_route:%zu:%s:3:b:c", strlen(a), a);
    cr_assert(redis_has(t.addr, key), "no key %s", key);
    /* Another route is another bucket; a part missing, no rule. */
    cr_assert_eq(offer(t.agent, 5, "per-key-per-route", kv2, "route=/v2",
                       NULL), 2);
    rl_decision d = check_on(t.agent, kv2, NULL, NULL, NULL);
    cr_assert(d.allowed && d.rule[0] == '\0', "applied without its route");
    d = check_on(t.agent, "route=c", NULL, NULL, NULL);
    cr_assert(d.allowed && d.rule[0] == '\0', "applied without its api_key");
    test_agent_close(&t);
}

/* --- Composite keys on the cluster: whole key, or hash tag. ------------ */

/* The primary serving slot, asked of the node at addr. */
static void owner_of(const char *addr, uint16_t slot, char *out, size_t cap)
{
    redisContext *c = test_redis_connect(addr);
    redisReply *r = test_redis_command(c, "CLUSTER SLOTS");
    out[0] = '\0';
    for (size_t i = 0; i < r->elements; i++) {
        redisReply *e = r->element[i], *p = e->element[2];
        if (slot >= e->element[0]->integer && slot <= e->element[1]->integer)
            snprintf(out, cap, "%s:%lld", p->element[0]->str,
                     p->element[1]->integer);
    }
    freeReplyObject(r);
    redisFree(c);
    cr_assert(out[0] != '\0', "no owner of slot %u", slot);
}

static uint16_t slot_asked(const char *addr, const char *key)
{
    redisContext *c = test_redis_connect(addr);
    redisReply *r = test_redis_command(c, "CLUSTER KEYSLOT %b", key,
                                       strlen(key));
    uint16_t slot = (uint16_t)r->integer;
    freeReplyObject(r);
    redisFree(c);
    return slot;
}

Test(rules, composite_keys_on_the_cluster_hash_whole_or_by_their_tag)
{
    const char *seeds = test_env("RL_TEST_CLUSTER");
    char first[64];
    snprintf(first, sizeof first, "%.*s", (int)strcspn(seeds, ","), seeds);
    char items[600] = "", list[512];
    snprintf(list, sizeof list, "%s", seeds);
    for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) {
        strcat(items, items[0] ? ", " : "");
        strcat(items, tok);
    }
    char yaml[2048];
    snprintf(yaml, sizeof yaml,
             "store: {cluster: [%s], timeout_ms: 1000}\n"
             "rules:\n"
             "  - {name: whole, match: [api_key, route], limit: 2, "
             "period: 1h}\n"
             "  - {name: tagged, match: [api_key, route], hash_tag: api_key, "
             "key_prefix: 'rl:kt:', limit: 3, period: 1h}\n", items);
    rl_error err;
    rl_config *cfg;
    cr_assert_eq(rl_config_parse(yaml, strlen(yaml), "cluster.yaml", &cfg,
                                 &err), RL_OK, "%s", err.message);
    rl_options o = {.config = cfg};
    rl_agent *a;
    cr_assert_eq(rl_agent_open(&a, &o, &err), RL_OK, "%s", err.message);

    char ak[96], kv[128];
    unique(ak, sizeof ak, "ak");
    snprintf(kv, sizeof kv, "api_key=%s", ak);
    char tag[128];
    snprintf(tag, sizeof tag, "%zu:%s", strlen(ak), ak);
    uint16_t tag_slot = rl_key_slot(tag, strlen(tag));
    const char *routes[] = {"/v1/a", "/v1/b", "/v2/c", "/orders"};
    uint16_t whole_slots[4];
    for (int r = 0; r < 4; r++) {
        char kr[64];
        snprintf(kr, sizeof kr, "route=%s", routes[r]);
        /* Exact on every shard: the tighter rule rejects the third. */
        cr_assert_eq(offer(a, 6, "whole", kv, kr, NULL), 2);
        char whole[256], tagged[256], owner[64];
        snprintf(whole, sizeof whole, "rl:key_route:%s:%zu:%s", tag,
                 strlen(routes[r]), routes[r]);
        snprintf(tagged, sizeof tagged, "rl:kt:{%s}:%zu:%s", tag,
                 strlen(routes[r]), routes[r]);
        whole_slots[r] = rl_key_slot(whole, strlen(whole));
        cr_assert_eq(slot_asked(first, whole), whole_slots[r]);
        cr_assert_eq(slot_asked(first, tagged), tag_slot,
                     "%s does not hash by its tag", tagged);
        owner_of(first, whole_slots[r], owner, sizeof owner);
        cr_assert(redis_has(owner, whole), "%s not on %s", whole, owner);
        owner_of(first, tag_slot, owner, sizeof owner);
        cr_assert(redis_has(owner, tagged), "%s not on %s", tagged, owner);
    }
    /* Without a tag the four routes spread over slots. */
    bool spread = false;
    for (int r = 1; r < 4; r++)
        spread |= whole_slots[r] != whole_slots[0];
    cr_assert(spread, "four whole keys on one slot");
    rl_agent_close(a);
    rl_config_free(cfg);
}

/* --- Shadow rules. ------------------------------------------------------ */

static uint64_t rule_counter(rl_agent *a, size_t index, int which)
{
    rl_agent_counters c;
    rl_rule_counters rules[8];
    cr_assert_eq(rl_agent_stats(a, &c, rules, 8), RL_OK);
    return which == 0 ? rules[index].shadow_rejected
                      : which == 1 ? rules[index].rejected
                                   : rules[index].allowed;
}

TEST_BOTH_MODES(rules, shadow_rules_are_charged_counted_and_named_never_reject)
{
    test_agent t;
    test_agent_open(&t, NULL, mode, NULL, NULL,
                    "  - {name: per-key, match: api_key, limit: 100, "
                    "period: 1h}\n"
                    "  - {name: per-ip, match: ip, limit: 2, period: 1h, "
                    "shadow: true}\n");
    char ip[96], kv[128], key[160];
    unique(ip, sizeof ip, "192.0.2.1");
    snprintf(kv, sizeof kv, "ip=%s", ip);
    char ak[96], kak[128];
    unique(ak, sizeof ak, "shadow-ak");
    snprintf(kak, sizeof kak, "api_key=%s", ak);
    /* The warm-up's shared value may have been rejected already. */
    uint64_t before = rule_counter(t.agent, 1, 0);
    for (int i = 0; i < 6; i++) {
        rl_decision d = check_on(t.agent, kak, kv, NULL, NULL);
        cr_assert(d.allowed, "a shadow rule rejected");
        cr_assert_str_eq(d.rule, "per-key", "a shadow rule decided");
        cr_assert_eq(d.remaining, (uint64_t)(99 - i));
        cr_assert_eq(d.shadow_rejected, i < 2 ? 0u : 1u, "check %d", i);
        if (i >= 2)
            cr_assert_str_eq(d.shadow_rules[0], "per-ip");
        char h[512];
        cr_assert_gt(rl_format_headers(&d, h, sizeof h), 0);
        cr_assert_null(strstr(h, "per-ip"), "%s", h);
    }
    cr_assert_eq(rule_counter(t.agent, 1, 0) - before, 4);
    cr_assert_eq(rule_counter(t.agent, 1, 1), 0);
    /* Charged as if enforced: its bucket is in Redis. */
    snprintf(key, sizeof key, "rl:ip:%s", ip);
    cr_assert(redis_has(t.addr, key));
    /* A request only the shadow rule applies to: no deciding rule. */
    rl_decision d = check_on(t.agent, kv, NULL, NULL, NULL);
    cr_assert(d.allowed);
    cr_assert_str_eq(d.rule, "");
    cr_assert_eq(d.shadow_rejected, 1);
    char h[512];
    cr_assert_eq(rl_format_headers(&d, h, sizeof h), 0, "%s", h);
    test_agent_close(&t);
}

/* charge: first_reject goes on past a shadow rejection (it is not the
 * request's), and the enforced rule after it is charged. */
Test(rules, a_shadow_rejection_does_not_stop_first_reject_charging)
{
    test_agent t;
    test_agent_open(&t, NULL, TEST_FCALL, NULL, "first_reject",
                    "  - {name: per-ip, match: ip, limit: 1, period: 1h, "
                    "shadow: true}\n"
                    "  - {name: per-key, match: api_key, limit: 3, "
                    "period: 1h}\n");
    char ip[96], kv[128], ak[96], kak[128];
    unique(ip, sizeof ip, "192.0.2.2");
    snprintf(kv, sizeof kv, "ip=%s", ip);
    unique(ak, sizeof ak, "fr-ak");
    snprintf(kak, sizeof kak, "api_key=%s", ak);
    for (int i = 0; i < 3; i++) {
        rl_decision d = check_on(t.agent, kv, kak, NULL, NULL);
        cr_assert(d.allowed, "check %d", i);
        cr_assert_str_eq(d.rule, "per-key");
        cr_assert_eq(d.remaining, (uint64_t)(2 - i), "per-key not charged");
    }
    rl_decision d = check_on(t.agent, kv, kak, NULL, NULL);
    cr_assert(!d.allowed);
    cr_assert_str_eq(d.rule, "per-key");
    cr_assert_eq(d.shadow_rejected, 1);
    test_agent_close(&t);
}

/* --- Synced: each key bounded by its own limit, with a real aggregator. -- */

Test(rules, synced_overrides_bound_each_key_by_its_rate)
{
    /* The test is about marks, not outages: under a sanitizer a start or
     * a pause can outlast three intervals, which would degrade the keys. */
    const test_aggregator tpl = {.pid = -1,
                                 .extra = "  stale_after_ms: 10000\n"};
    test_aggregator agg;
    test_aggregator_start(&agg, NULL,
                          "  - name: per-tenant\n"
                          "    match: tenant\n"
                          "    key_prefix: 'rl:sov:'\n"
                          "    limit: 20\n"
                          "    period: 1h\n"
                          "    mode: synced\n"
                          "    overrides:\n"
                          "      - {values: [big], limit: 60}\n"
                          "      - {when: {plan: enterprise}, limit: 40}\n"
                          "  - name: tenant-cap\n"
                          "    match: tenant\n"
                          "    key_prefix: 'rl:scap:'\n"
                          "    limit: 5\n"
                          "    period: 1h\n"
                          "    mode: synced\n"
                          "    shadow: true\n",
                          100, &tpl);
    test_aggregator_wait_ready(&agg);
    rl_config *cfg;
    rl_agent *a = test_synced_agent(&agg, &cfg);
    char big[96], small[96], up[96], kb[128], ks[128], ku[128];
    unique(big, sizeof big, "big");
    /* "big" itself is the listed value: use it, in a tenant of its own
     * run by the unique suffix on the others. */
    snprintf(kb, sizeof kb, "tenant=big");
    unique(small, sizeof small, "small");
    snprintf(ks, sizeof ks, "tenant=%s", small);
    unique(up, sizeof up, "up");
    snprintf(ku, sizeof ku, "tenant=%s", up);
    /* Five times each limit, spread over 1.5 s: totals come every 100 ms
     * and each key's mark is worked out from its own limit. On a loaded
     * machine totals come late and room with them: up to 3 s more, while
     * a key is short of its limit (going over it fails all the same). */
    int got_big = 0, got_small = 0, got_up = 0;
    for (int round = 0; round < 15 || ((got_small < 20 || got_up < 20)
                                       && round < 45); round++) {
        got_big += offer(a, 20, "per-tenant", kb, NULL, NULL);
        got_small += offer(a, 7, "per-tenant", ks, NULL, NULL);
        got_up += offer(a, 7, "per-tenant", ku, "plan=free", NULL);
        test_sleep_ms(100);
    }
    /* One agent, one thread: exactly the limit ("big" may hold counts of
     * an earlier run of this test in its hour: at most, then). */
    cr_assert_leq(got_big, 60, "big: %d", got_big);
    cr_assert_eq(got_small, 20, "small: %d of 105", got_small);
    cr_assert_eq(got_up, 20, "up: %d of 105", got_up);
    rl_decision d = check_on(a, ks, NULL, NULL, NULL);
    cr_assert(!d.allowed);
    cr_assert_eq(d.limit, 20);
    cr_assert_eq(d.shadow_rejected, 1, "tenant-cap would reject");
    cr_assert_str_eq(d.shadow_rules[0], "tenant-cap");
    /* The free tenant turns enterprise: the same key, 40 now, at once. */
    int more = offer(a, 40, "per-tenant", ku, "plan=enterprise", NULL);
    cr_assert_eq(more, 20, "a raised limit let %d more through", more);
    d = check_on(a, ku, "plan=enterprise", NULL, NULL);
    cr_assert_eq(d.limit, 40);
    cr_assert_str_eq(d.override, "overrides[1]");
    /* tenant-cap never rejected, but counted every would-be rejection. */
    cr_assert_gt(rule_counter(a, 1, 0), 100);
    cr_assert_eq(rule_counter(a, 1, 1), 0);
    rl_agent_close(a);
    rl_config_free(cfg);
    test_aggregator_stop(&agg);
}

/* --- Local: an override's rate, and a change of rate on one bucket. ----- */

Test(rules, local_overrides_apply_at_once_to_the_same_bucket)
{
    const char yaml[] =
        "rules:\n"
        "  - name: per-key\n"
        "    match: api_key\n"
        "    limit: 4\n"
        "    period: 1h\n"
        "    mode: local\n"
        "    overrides:\n"
        "      - {when: {plan: pro}, limit: 8, burst: 8}\n";
    rl_error err;
    rl_config *cfg;
    cr_assert_eq(rl_config_parse(yaml, strlen(yaml), "local.yaml", &cfg,
                                 &err), RL_OK, "%s", err.message);
    rl_options o = {.config = cfg};
    rl_agent *a;
    cr_assert_eq(rl_agent_open(&a, &o, &err), RL_OK, "%s", err.message);
    cr_assert_eq(offer(a, 20, "per-key", "api_key=k1", "plan=free", NULL), 4);
    cr_assert_eq(offer(a, 20, "per-key", "api_key=k2", "plan=pro", NULL), 8);
    /* k2 half used at 8 an hour: 2 of 4 left at the own rate... */
    rl_decision d = check_on(a, "api_key=k3", "plan=pro", NULL, NULL);
    for (int i = 0; i < 3; i++)
        d = check_on(a, "api_key=k3", "plan=pro", NULL, NULL);
    cr_assert_eq(d.remaining, 4);
    d = check_on(a, "api_key=k3", "plan=free", NULL, NULL);
    cr_assert(d.allowed);
    cr_assert_eq(d.limit, 4);
    /* Half full at 8 (4 of 8) is half full at 4 (2 of 4), less this one. */
    cr_assert_eq(d.remaining, 1, "remaining %llu",
                 (unsigned long long)d.remaining);
    /* k1, empty at 4 an hour, is still empty at 8: one token in 7.5 min. */
    d = check_on(a, "api_key=k1", "plan=pro", NULL, NULL);
    cr_assert(!d.allowed);
    cr_assert_eq(d.limit, 8);
    cr_assert(d.retry_after_ms > 440000 && d.retry_after_ms <= 450000,
              "retry %lld", (long long)d.retry_after_ms);
    rl_agent_close(a);
    rl_config_free(cfg);
}

/* --- A global shadow: every rule counted, none rejects. ----------------- */

Test(rules, a_global_shadow_puts_every_rule_in_shadow)
{
    const char yaml[] =
        "shadow: true\n"
        "rules:\n"
        "  - {name: per-key, match: api_key, limit: 2, period: 1h, "
        "mode: local}\n"
        "  - {name: per-ip, match: ip, limit: 3, period: 1h, mode: local}\n";
    rl_error err;
    rl_config *cfg;
    cr_assert_eq(rl_config_parse(yaml, strlen(yaml), "shadow.yaml", &cfg,
                                 &err), RL_OK, "%s", err.message);
    rl_options o = {.config = cfg};
    rl_agent *a;
    cr_assert_eq(rl_agent_open(&a, &o, &err), RL_OK, "%s", err.message);
    for (int i = 0; i < 6; i++) {
        rl_decision d = check_on(a, "api_key=k", "ip=10.1.1.1", NULL, NULL);
        cr_assert(d.allowed);
        cr_assert_str_eq(d.rule, "");
        cr_assert_eq(d.shadow_rejected, (unsigned)((i >= 2) + (i >= 3)),
                     "check %d", i);
        if (i >= 3) {
            cr_assert_str_eq(d.shadow_rules[0], "per-key");
            cr_assert_str_eq(d.shadow_rules[1], "per-ip");
        }
    }
    cr_assert_eq(rule_counter(a, 0, 0), 4);
    cr_assert_eq(rule_counter(a, 1, 0), 3);
    cr_assert_eq(rule_counter(a, 0, 1) + rule_counter(a, 1, 1), 0);
    rl_agent_close(a);
    rl_config_free(cfg);
}
