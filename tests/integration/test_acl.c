/*
 * Redis as operators lock it down (issue 29): the least-privilege users
 * docs/operations.md gives, created from the doc's own block, run every
 * path (the agent's exact and leased checks, the aggregator's synced
 * counts, rlctl); a refused command is logged once, naming it; and a
 * server that refuses functions gets the same bodies by EVALSHA, sharing
 * buckets exactly with agents that call functions.
 */
#include "redis_server.h"
#include "test_agent.h"
#include "test_aggregator.h"
#include "test_env.h"

#include <criterion/criterion.h>
#include <hiredis/hiredis.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define PASSWORD "acl-test-pw-7f3"

static const char rules[] =
    "  - {name: per-key, match: key, limit: 5, period: 1h}\n"
    "  - {name: per-lease, match: lkey, limit: 5, period: 1h, "
    "mode: leased}\n"
    "  - {name: per-window, match: wkey, limit: 5, period: 1h, "
    "algorithm: fixed_window}\n";
static const char synced_rule[] =
    "  - {name: per-tenant, match: tenant, limit: 5, period: 1m, "
    "mode: synced}\n";

/* Creates the users of docs/operations.md's ```redis block, each line
 * with more appended (a permission taken away, say), passwords
 * PASSWORD. */
static void create_users(const char *addr, const char *more)
{
    FILE *f = fopen("docs/operations.md", "r");
    cr_assert_not_null(f, "docs/operations.md (tests run from the root)");
    char line[2048];
    bool in_block = false;
    int users = 0;
    redisContext *c = test_redis_connect(addr);
    while (fgets(line, sizeof line, f) != NULL) {
        if (strncmp(line, "```redis", 8) == 0)
            in_block = true;
        else if (strncmp(line, "```", 3) == 0)
            in_block = false;
        if (!in_block || strncmp(line, "ACL SETUSER ", 12) != 0)
            continue;
        const char *argv[96];
        size_t lens[96];
        int argc = 0;
        line[strcspn(line, "\n")] = '\0';
        char with[2200];
        snprintf(with, sizeof with, "%s%s", line, more);
        for (char *w = strtok(with, " "); w != NULL && argc < 96;
             w = strtok(NULL, " ")) {
            if (w[0] == '>')
                w = ">" PASSWORD;
            argv[argc] = w;
            lens[argc++] = strlen(w);
        }
        redisReply *r = redisCommandArgv(c, argc, argv, lens);
        cr_assert(r != NULL && r->type == REDIS_REPLY_STATUS,
                  "%s: %s", line, r != NULL ? r->str : c->errstr);
        freeReplyObject(r);
        users++;
    }
    fclose(f);
    redisFree(c);
    cr_assert_eq(users, 3, "the doc's block names %d users, not 3", users);
}

/* A config for one program as user, reporting to agg if given. An
 * agent gets the synced rule only with an aggregator; rlctl (no agg)
 * with synced. */
static const char *write_config(const char *addr, const char *user,
                                const char *scripts,
                                const test_aggregator *agg, bool synced)
{
    static char paths[4][600];
    static int serial;
    char *path = paths[serial % 4];
    snprintf(path, 600, "%s/acl-%d-%d.yaml", test_env("RL_TEST_TMPDIR"),
             (int)getpid(), serial++);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fprintf(f, "store:\n  url: redis://%s\n  username: %s\n"
            "  password: %s\n  timeout_ms: 2000\n  scripts: %s\n",
            addr, user, PASSWORD, scripts);
    if (agg != NULL)
        fprintf(f, "aggregator:\n  reports: \"%s\"\n  totals: \"%s\"\n"
                "  sync_interval_ms: 100\n", agg->reports, agg->totals);
    fprintf(f, "rules:\n%s%s", rules, synced ? synced_rule : "");
    fclose(f);
    return path;
}

/* Checks of one attribute; how many were admitted, failing on any
 * degraded decision. */
static int offer(rl_agent *a, const char *name, const char *value, int n)
{
    rl_attr attr = {name, value, strlen(value)};
    int admitted = 0;
    for (int i = 0; i < n; i++) {
        rl_decision d;
        cr_assert_eq(rl_check(a, &attr, 1, 1, &d), RL_OK);
        cr_assert(!d.degraded, "%s=%s check %d degraded", name, value, i);
        admitted += d.allowed;
    }
    return admitted;
}

static bool file_has(const char *path, const char *text)
{
    char cmd[800], out[1 << 16];
    snprintf(cmd, sizeof cmd, "cat %s", path);
    cr_assert_eq(test_run(cmd, out, sizeof out), 0, "%s", out);
    return strstr(out, text) != NULL;
}

/* The agent, the aggregator and rlctl, each as its minimal user: every
 * path works, and nothing is refused. With INFO back in the handshake
 * (@dangerous), nothing would connect. */
static void minimal_users(const char *scripts)
{
    test_redis srv;
    char addr[64], extra[256];
    test_agent_private_redis(&srv, addr, sizeof addr);
    create_users(addr, "");
    snprintf(extra, sizeof extra, "  store:\n    url: redis://%s\n"
             "    username: rl-aggregator\n    password: " PASSWORD "\n",
             addr);
    test_aggregator agg;
    test_aggregator tpl = TEST_AGGREGATOR_EXTRA(extra);
    char all_rules[512];
    snprintf(all_rules, sizeof all_rules, "%s%s", rules, synced_rule);
    test_aggregator_start(&agg, addr, all_rules, 100, &tpl);
    test_aggregator_wait_ready(&agg);
    static test_log log;
    test_log_init(&log);
    rl_config *cfg;
    rl_agent *a = test_agent_on(write_config(addr, "rl-agent", scripts,
                                             &agg, true), &cfg, &log);
    cr_assert_eq(offer(a, "key", "acl-exact", 9), 5);
    cr_assert_eq(offer(a, "lkey", "acl-leased", 9), 5);
    cr_assert_eq(offer(a, "wkey", "acl-window", 9), 5);
    cr_assert_eq(offer(a, "tenant", "acl-synced", 3), 3);
    long long got = 0;
    for (int waited = 0; waited < 10000 && got != 3; waited += 50) {
        test_sleep_ms(50);
        got = test_window_total(addr, "rl:tenant:acl-synced");
    }
    cr_assert_eq(got, 3, "the aggregator, as rl-aggregator, wrote %lld of "
                 "3:\n%s", got, agg.log);
    test_log_lacks(&log, "event=store_command_refused", "the agent's log");
    test_log_lacks(&log, "event=store_handshake_failed", "the agent's log");
    cr_assert(!file_has(agg.log, "event=store_command_refused")
                  && !file_has(agg.log, "event=store_handshake_failed"),
              "the aggregator's log (%s) says a command was refused",
              agg.log);
    const char *ctl = write_config(addr, "rlctl", scripts, NULL, true);
    char out[4096];
    cr_assert_eq(test_rlctl(out, sizeof out, ctl, "bucket per-key acl-exact"),
                 0, "%s", out);
    cr_assert_eq(test_rlctl(out, sizeof out, ctl, "totals"), 0, "%s", out);
    cr_assert(strstr(out, "acl-synced") != NULL, "rlctl totals: %s", out);
    cr_assert_eq(test_rlctl(out, sizeof out, ctl,
                            "reset per-key acl-exact --yes"), 0, "%s", out);
    cr_assert_eq(offer(a, "key", "acl-exact", 9), 5, "after rlctl reset");
    rl_agent_close(a);
    rl_config_free(cfg);
    test_aggregator_stop(&agg);
    test_redis_stop(&srv);
}

Test(acl, the_minimal_users_run_every_path_by_functions)
{
    minimal_users("auto");
}

Test(acl, the_minimal_users_run_every_path_by_scripts)
{
    minimal_users("eval");
}

/* The agent's user without EVALSHA, the agent told to use scripts: every
 * check is refused, the refusal logged once however many checks meet it,
 * naming the command and passing Redis's NOPERM on; rlctl as a user
 * without SCAN prints the same. */
Test(acl, a_refused_command_is_logged_once_naming_it)
{
    test_redis srv;
    char addr[64];
    test_agent_private_redis(&srv, addr, sizeof addr);
    create_users(addr, " -evalsha -scan");
    static test_log log;
    test_log_init(&log);
    rl_config *cfg;
    rl_agent *a = test_agent_on(write_config(addr, "rl-agent", "eval", NULL,
                                             false),
                                &cfg, &log);
    rl_attr attr = {"key", "acl-refused", 11};
    for (int i = 0; i < 20; i++) {
        rl_decision d;
        cr_assert_eq(rl_check(a, &attr, 1, 1, &d), RL_OK);
        cr_assert(d.degraded, "check %d was not refused", i);
    }
    cr_assert(test_log_wait(&log, "event=store_command_refused",
                            "command=EVALSHA reason=\"NOPERM", 5000),
              "no refusal naming EVALSHA:\n%s", log.text);
    rl_agent_close(a);
    rl_config_free(cfg);
    pthread_mutex_lock(&log.lock);
    int lines = 0;
    for (const char *p = log.text;
         (p = strstr(p, "event=store_command_refused")) != NULL; p++)
        lines++;
    pthread_mutex_unlock(&log.lock);
    cr_assert_eq(lines, 1, "the refusal was logged %d times:\n%s", lines,
                 log.text);
    char out[4096];
    const char *ctl = write_config(addr, "rlctl", "auto", NULL, true);
    cr_assert_eq(test_rlctl(out, sizeof out, ctl, "totals"), 2, "%s", out);
    cr_assert(strstr(out, "Redis refused SCAN: NOPERM") != NULL,
              "rlctl totals: %s", out);
    test_redis_stop(&srv);
}

/* A user that may not load functions (FUNCTION LOAD refused at the
 * handshake) or not call them (FCALL refused on the first check): under
 * scripts: auto the agent loads the same bodies by SCRIPT LOAD and calls
 * EVALSHA, no check degraded, the switch logged once. */
static void functions_refused(const char *taken_away)
{
    test_redis srv;
    char addr[64];
    test_agent_private_redis(&srv, addr, sizeof addr);
    create_users(addr, taken_away);
    static test_log log;
    test_log_init(&log);
    rl_config *cfg;
    rl_agent *a = test_agent_on(write_config(addr, "rl-agent", "auto", NULL,
                                             false), &cfg, &log);
    cr_assert_eq(offer(a, "key", "acl-fallback", 9), 5);
    cr_assert_eq(offer(a, "lkey", "acl-fallback", 9), 5);
    cr_assert(test_log_wait(&log, "event=store_functions_refused",
                            "using=evalsha", 1000),
              "the switch to scripts was not logged:\n%s", log.text);
    cr_assert_gt(test_redis_calls(addr, "evalsha"), 0);
    rl_agent_close(a);
    rl_config_free(cfg);
    test_redis_stop(&srv);
}

Test(acl, function_load_refused_falls_back_to_scripts)
{
    functions_refused(" -function|load");
}

Test(acl, fcall_refused_falls_back_to_scripts)
{
    functions_refused(" -fcall");
}

/* One agent calling functions (the default user), one whose user may not
 * load them (EVALSHA): 25 threads each, 500 checks of one key whose
 * bucket holds 100. They share the bucket to the token. */
enum { THREADS = 50, PER_THREAD = 10, CAPACITY = 100 };

typedef struct sharer {
    rl_agent *agent;
    atomic_int *admitted, *degraded;
} sharer;

static void *share(void *arg)
{
    sharer *s = arg;
    rl_attr attr = {"key", "acl-shared", 10};
    for (int i = 0; i < PER_THREAD; i++) {
        rl_decision d;
        if (rl_check(s->agent, &attr, 1, 1, &d) != RL_OK || d.degraded)
            atomic_fetch_add(s->degraded, 1);
        else if (d.allowed)
            atomic_fetch_add(s->admitted, 1);
    }
    return NULL;
}

Test(acl, a_function_agent_and_a_script_agent_share_one_bucket_exactly)
{
    test_redis srv;
    char addr[64];
    test_agent_private_redis(&srv, addr, sizeof addr);
    create_users(addr, " -function|load");
    char path[600];
    snprintf(path, sizeof path, "%s/acl-default-%d.yaml",
             test_env("RL_TEST_TMPDIR"), (int)getpid());
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fprintf(f, "store: {url: \"redis://%s\", timeout_ms: 2000}\n"
            "rules:\n  - {name: per-key, match: key, limit: %d, "
            "period: 1h}\n", addr, CAPACITY);
    fclose(f);
    const char *scripted = write_config(addr, "rl-agent", "auto", NULL,
                                        false);
    rl_config *cfg[2];
    rl_agent *agents[2] = {test_agent_on(path, &cfg[0], NULL),
                           test_agent_on(scripted, &cfg[1], NULL)};
    atomic_int admitted = 0, degraded = 0;
    sharer s[2] = {{agents[0], &admitted, &degraded},
                   {agents[1], &admitted, &degraded}};
    pthread_t th[THREADS];
    for (int i = 0; i < THREADS; i++)
        pthread_create(&th[i], NULL, share, &s[i % 2]);
    for (int i = 0; i < THREADS; i++)
        pthread_join(th[i], NULL);
    cr_assert_eq(atomic_load(&degraded), 0);
    cr_assert_eq(atomic_load(&admitted), CAPACITY, "%d admitted of %d "
                 "offered, capacity %d", atomic_load(&admitted),
                 THREADS * PER_THREAD, CAPACITY);
    cr_assert_gt(test_redis_calls(addr, "fcall"), 0, "no agent called "
                 "functions");
    cr_assert_gt(test_redis_calls(addr, "evalsha"), 0, "no agent called "
                 "scripts");
    for (int i = 0; i < 2; i++) {
        rl_agent_close(agents[i]);
        rl_config_free(cfg[i]);
    }
    test_redis_stop(&srv);
}

/* A store URL that names a replica (a stale DNS name after a failover,
 * say): the handshake reads the role and refuses it, saying why, rather
 * than failing every write with READONLY. */
Test(acl, a_replica_is_refused_by_the_handshake)
{
    test_redis primary, replica;
    char primary_addr[64], replica_addr[64];
    test_agent_private_redis(&primary, primary_addr, sizeof primary_addr);
    test_agent_private_redis(&replica, replica_addr, sizeof replica_addr);
    redisContext *c = test_redis_connect(replica_addr);
    freeReplyObject(test_redis_command(c, "REPLICAOF 127.0.0.1 %u",
                                       primary.port));
    redisFree(c);
    char path[600];
    snprintf(path, sizeof path, "%s/acl-replica-%d.yaml",
             test_env("RL_TEST_TMPDIR"), (int)getpid());
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fprintf(f, "store: {url: \"redis://%s\", timeout_ms: 200}\nrules:\n%s",
            replica_addr, rules);
    fclose(f);
    static test_log log;
    test_log_init(&log);
    rl_config *cfg;
    rl_agent *a = test_agent_on(path, &cfg, &log);
    rl_attr attr = {"key", "acl-replica", 11};
    rl_decision d;
    cr_assert_eq(rl_check(a, &attr, 1, 1, &d), RL_OK);
    cr_assert(d.degraded, "a replica answered a check");
    cr_assert(test_log_wait(&log, "event=store_handshake_failed",
                            "is a replica", 5000),
              "the replica was not refused by name:\n%s", log.text);
    rl_agent_close(a);
    rl_config_free(cfg);
    test_redis_stop(&replica);
    test_redis_stop(&primary);
}
