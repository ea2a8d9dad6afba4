/*
 * store.sentinel (issue 29): a primary and a replica under three real
 * sentinels (redis-server --sentinel, down-after a second). Exact checks
 * run throughout a failover, asked for (SENTINEL FAILOVER) or forced (the
 * primary SIGKILLed): every check is answered within its deadline, the
 * checks are back on the new primary within 3 s of the switch, and the
 * old primary, a replica now, is sent nothing. rlctl finds the primary
 * the same way.
 */
#include "redis_server.h"
#include "test_agent.h"
#include "test_env.h"

#include <criterion/criterion.h>
#include <hiredis/hiredis.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MASTER "rlm"
#define DEADLINE_MS 200
#define SENTINELS 3

typedef struct setup {
    test_redis primary, replica, sentinels[SENTINELS];
    char config[600];
} setup;

static void start(test_redis *srv, const test_redis_options *o)
{
    char err[512];
    cr_assert_eq(test_redis_start(srv, test_env("RL_TEST_TMPDIR"), o, err,
                                  sizeof err), 0, "%s", err);
}

static char *info_of(uint16_t port, const char *section)
{
    char addr[32];
    snprintf(addr, sizeof addr, "127.0.0.1:%u", port);
    redisContext *c = test_redis_connect(addr);
    redisReply *r = test_redis_command(c, "INFO %s", section);
    char *text = strdup(r->type == REDIS_REPLY_STRING ? r->str : "");
    freeReplyObject(r);
    redisFree(c);
    return text;
}

/* How many entries a sentinel's SENTINEL <what> rlm lists. */
static size_t sentinel_count(uint16_t port, const char *what)
{
    char addr[32];
    snprintf(addr, sizeof addr, "127.0.0.1:%u", port);
    redisContext *c = test_redis_connect(addr);
    redisReply *r = test_redis_command(c, "SENTINEL %s " MASTER, what);
    size_t n = r->type == REDIS_REPLY_ARRAY ? r->elements : 0;
    freeReplyObject(r);
    redisFree(c);
    return n;
}

/* The port the sentinels name for the master (any that answers). */
static uint16_t named_port(const setup *s)
{
    for (int i = 0; i < SENTINELS; i++) {
        char addr[32];
        snprintf(addr, sizeof addr, "127.0.0.1:%u", s->sentinels[i].port);
        redisContext *c = test_redis_connect(addr);
        redisReply *r = test_redis_command(c, "SENTINEL "
                                           "get-master-addr-by-name "
                                           MASTER);
        uint16_t port = r->type == REDIS_REPLY_ARRAY && r->elements == 2
                            ? (uint16_t)atoi(r->element[1]->str)
                            : 0;
        freeReplyObject(r);
        redisFree(c);
        if (port != 0)
            return port;
    }
    return 0;
}

/* A primary, its replica in sync, three sentinels that know both and one
 * another; a config for an agent that finds the primary through them. */
static void setup_start(setup *s)
{
    static const char repl[] = "repl-diskless-sync-delay 0\n"
                               "repl-ping-replica-period 1\n";
    test_redis_options o = {.extra_conf = repl};
    start(&s->primary, &o);
    char conf[512];
    snprintf(conf, sizeof conf, "%sreplicaof 127.0.0.1 %u\n", repl,
             s->primary.port);
    o.extra_conf = conf;
    start(&s->replica, &o);
    bool synced = false;
    for (int waited = 0; waited < 10000 && !synced; waited += 50) {
        char *info = info_of(s->replica.port, "replication");
        synced = strstr(info, "master_link_status:up") != NULL;
        free(info);
        test_sleep_ms(50);
    }
    cr_assert(synced, "the replica never synced");
    snprintf(conf, sizeof conf,
             "sentinel monitor " MASTER " 127.0.0.1 %u 2\n"
             "sentinel down-after-milliseconds " MASTER " 1000\n"
             "sentinel failover-timeout " MASTER " 5000\n",
             s->primary.port);
    test_redis_options so = {.sentinel = true, .extra_conf = conf};
    for (int i = 0; i < SENTINELS; i++)
        start(&s->sentinels[i], &so);
    bool known = false;
    for (int waited = 0; waited < 20000 && !known; waited += 100) {
        known = true;
        for (int i = 0; i < SENTINELS && known; i++)
            known = sentinel_count(s->sentinels[i].port, "replicas") == 1
                    && sentinel_count(s->sentinels[i].port, "sentinels")
                           == SENTINELS - 1;
        test_sleep_ms(100);
    }
    cr_assert(known, "the sentinels never knew the replica and each other");
    snprintf(s->config, sizeof s->config, "%s/sentinel-%d-%u.yaml",
             test_env("RL_TEST_TMPDIR"), (int)getpid(), s->primary.port);
    FILE *f = fopen(s->config, "w");
    cr_assert_not_null(f);
    fprintf(f, "store:\n  timeout_ms: %d\n  sentinel:\n    master: " MASTER
            "\n    addresses: [\"127.0.0.1:%u\", \"127.0.0.1:%u\", "
            "\"127.0.0.1:%u\"]\nrules:\n  - {name: per-key, match: key, "
            "limit: 1000000000, period: 1s}\n", DEADLINE_MS,
            s->sentinels[0].port, s->sentinels[1].port,
            s->sentinels[2].port);
    fclose(f);
}

static void setup_stop(setup *s)
{
    for (int i = 0; i < SENTINELS; i++)
        test_redis_stop(&s->sentinels[i]);
    test_redis_stop(&s->replica);
    test_redis_stop(&s->primary);
}

/* Everything sent to a server as FCALL: answered, refused (READONLY)
 * or failed. */
static long long fcalls(uint16_t port)
{
    char *info = info_of(port, "commandstats");
    const char *line = strstr(info, "cmdstat_fcall:");
    long long n = 0;
    if (line != NULL) {
        const char *end = strchr(line, '\r');
        const char *fields[] = {"calls=", "rejected_calls=",
                                "failed_calls="};
        for (int i = 0; i < 3; i++) {
            const char *at = strstr(line, fields[i]);
            if (at != NULL && (end == NULL || at < end))
                n += atoll(at + strlen(fields[i]));
        }
    }
    free(info);
    return n;
}

/* Checks one after another, each noted with when it returned, how long
 * it took and whether it was degraded. */
#define CHECKS_MAX 200000

typedef struct checker {
    rl_agent *agent;
    atomic_bool stop;
    int n;
    uint64_t at_ms[CHECKS_MAX];
    uint32_t took_us[CHECKS_MAX];
    bool degraded[CHECKS_MAX];
} checker;

static void *run_checks(void *arg)
{
    checker *k = arg;
    rl_attr attr = {"key", "sentinel", 8};
    while (!atomic_load(&k->stop) && k->n < CHECKS_MAX) {
        uint64_t start = test_now_us();
        rl_decision d;
        bool ok = rl_check(k->agent, &attr, 1, 1, &d) == RL_OK;
        uint64_t end = test_now_us();
        k->at_ms[k->n] = end / 1000;
        k->took_us[k->n] = (uint32_t)(end - start);
        k->degraded[k->n] = !ok || d.degraded;
        k->n++;
        usleep(2000);
    }
    return NULL;
}

/* Runs checks through fault(s), which makes the primary change; returns
 * once the checks have run 4 s past the switch the sentinels announce. */
static void through_a_failover(setup *s, void (*fault)(setup *s),
                               const char *what)
{
    rl_config *cfg;
    rl_agent *agent = test_agent_on(s->config, &cfg, NULL);
    static checker k;
    memset(&k, 0, sizeof k);
    k.agent = agent;
    test_sched_probe probe;
    test_sched_probe_start(&probe);
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, run_checks, &k), 0);
    test_sleep_ms(1000);
    long long on_replica_before = fcalls(s->replica.port);
    fault(s);
    uint64_t switched = 0;
    for (int waited = 0; waited < 30000 && switched == 0; waited += 20) {
        if (named_port(s) == s->replica.port)
            switched = test_now_ms();
        else
            test_sleep_ms(20);
    }
    cr_assert_neq(switched, 0, "%s: the sentinels never switched", what);
    test_sleep_ms(3000);
    long long on_old = s->primary.pid > 0 ? fcalls(s->primary.port) : 0;
    test_sleep_ms(1000);
    atomic_store(&k.stop, true);
    pthread_join(th, NULL);
    uint64_t overslept = test_sched_probe_stop(&probe);
    uint64_t slowest = 0, last_degraded = 0;
    int after = 0;
    for (int i = 0; i < k.n; i++) {
        if (k.took_us[i] > slowest)
            slowest = k.took_us[i];
        if (k.degraded[i])
            last_degraded = k.at_ms[i];
        after += k.at_ms[i] > switched;
    }
    long long new_primary = fcalls(s->replica.port) - on_replica_before;
    fprintf(stderr, "sentinel: %s: %d checks, slowest %llu us; last "
            "degraded %lld ms after the switch; %lld calls on the new "
            "primary\n", what, k.n, (unsigned long long)slowest,
            last_degraded == 0 ? -1LL
                               : (long long)last_degraded - (long long)switched,
            new_primary);
    rl_agent_close(agent);
    rl_config_free(cfg);
    cr_assert_eq(on_replica_before, 0, "%s: the replica was sent %lld calls "
                 "before the failover", what, on_replica_before);
    cr_assert_leq(slowest, test_deadline_latest_us(DEADLINE_MS, overslept),
                  "%s: a check took %llu us", what,
                  (unsigned long long)slowest);
    cr_assert_gt(after, 100, "%s: %d checks after the switch", what, after);
    cr_assert(last_degraded < switched + 3000, "%s: a check was degraded "
              "%llu ms after the switch", what,
              (unsigned long long)(last_degraded - switched));
    cr_assert_gt(new_primary, 100, "%s: the new primary answered %lld calls",
                 what, new_primary);
    if (s->primary.pid > 0)
        cr_assert_eq(fcalls(s->primary.port), on_old, "%s: the old primary, "
                     "a replica now, was sent %lld calls", what,
                     fcalls(s->primary.port) - on_old);
}

static void ask_for_failover(setup *s)
{
    char addr[32];
    snprintf(addr, sizeof addr, "127.0.0.1:%u", s->sentinels[0].port);
    redisContext *c = test_redis_connect(addr);
    redisReply *r = test_redis_command(c, "SENTINEL FAILOVER " MASTER);
    cr_assert_eq(r->type, REDIS_REPLY_STATUS, "SENTINEL FAILOVER: %s",
                 r->type == REDIS_REPLY_ERROR ? r->str : "");
    freeReplyObject(r);
    redisFree(c);
}

static void kill_primary(setup *s)
{
    test_redis_kill(&s->primary);
}

Test(sentinel, checks_follow_a_failover_asked_for)
{
    static setup s;
    setup_start(&s);
    through_a_failover(&s, ask_for_failover, "SENTINEL FAILOVER");
    setup_stop(&s);
}

Test(sentinel, checks_follow_a_failover_after_the_primary_is_killed)
{
    static setup s;
    setup_start(&s);
    through_a_failover(&s, kill_primary, "primary SIGKILLed");
    setup_stop(&s);
}

/* rlctl asks the sentinels too, and says why when none names the
 * master. */
Test(sentinel, rlctl_finds_the_primary_through_the_sentinels)
{
    static setup s;
    setup_start(&s);
    char out[4096];
    cr_assert_eq(test_rlctl(out, sizeof out, s.config,
                            "bucket per-key rlctl-sentinel"), 0, "%s", out);
    FILE *f = fopen(s.config, "r");
    char text[1024];
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = '\0';
    char *name = strstr(text, "master: " MASTER);
    cr_assert_not_null(name);
    memcpy(name, "master: nom", 11);
    f = fopen(s.config, "w");
    fputs(text, f);
    fclose(f);
    cr_assert_eq(test_rlctl(out, sizeof out, s.config,
                            "bucket per-key rlctl-sentinel"), 2, "%s", out);
    cr_assert(strstr(out, "no sentinel named master 'nom'") != NULL, "%s",
              out);
    setup_stop(&s);
}
