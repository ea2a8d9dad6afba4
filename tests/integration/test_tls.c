/*
 * The synced path over TLS (tls+tcp://) with certificates made here with
 * openssl: an agent with a certificate the CA signed gets its counts into
 * Redis through the aggregator; with client_auth: required, an agent whose
 * certificate another CA signed is turned away, and the rest keep working.
 */
#include "rl.h"
#include "redis_server.h"
#include "test_env.h"
#include "test_process.h"

#include <criterion/criterion.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char dir[600];

static void sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static void sh(const char *fmt, ...)
{
    char cmd[4096], out[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    cr_assert_eq(test_run(cmd, out, sizeof out), 0, "%s\n%s", cmd, out);
}

/* A CA (name), and a certificate it signs for 127.0.0.1/localhost. */
static void make_ca(const char *name)
{
    sh("cd %s && openssl req -x509 -newkey rsa:2048 -nodes -days 2 "
       "-subj /CN=%s -keyout %s.key -out %s.pem 2>&1", dir, name, name, name);
}

static void make_cert(const char *ca, const char *name)
{
    sh("cd %s && printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\\n' "
       "> %s.ext && openssl req -newkey rsa:2048 -nodes -subj /CN=localhost "
       "-keyout %s.key -out %s.csr 2>&1 && openssl x509 -req -in %s.csr "
       "-CA %s.pem -CAkey %s.key -CAcreateserial -days 2 -extfile %s.ext "
       "-out %s.pem 2>&1", dir, name, name, name, name, ca, ca, name, name);
}

static const char *write_config(const char *name, const char *redis,
                                const char *reports, const char *totals,
                                const char *cert, const char *extra)
{
    static char path[4][700];
    static int next;
    char *p = path[next++ % 4];
    snprintf(p, 700, "%s/%s.yaml", dir, name);
    FILE *f = fopen(p, "w");
    cr_assert_not_null(f);
    fprintf(f, "store: {url: \"redis://%s\"}\n"
            "aggregator:\n"
            "  reports: \"%s\"\n  totals: \"%s\"\n  sync_interval_ms: 200\n"
            "  tls: {ca: %s/ca.pem, cert: %s/%s.pem, key: %s/%s.key%s}\n"
            "rules:\n  - {name: per-tenant, match: tenant, limit: 1000000, "
            "period: 1m, mode: synced}\n", redis, reports, totals, dir, dir,
            cert, dir, cert, extra);
    fclose(f);
    return p;
}

static long long total(const char *value)
{
    redisContext *c = test_redis_connect(NULL);
    redisReply *keys = test_redis_command(c, "KEYS rl:tenant:%s:w*", value);
    long long sum = 0;
    for (size_t i = 0; i < keys->elements; i++) {
        redisReply *v = test_redis_command(c, "GET %s",
                                           keys->element[i]->str);
        sum += v->type == REDIS_REPLY_STRING ? atoll(v->str) : 0;
        freeReplyObject(v);
    }
    freeReplyObject(keys);
    redisFree(c);
    return sum;
}

static rl_agent *agent_on(const char *config, rl_config **cfg)
{
    rl_error err;
    cr_assert_eq(rl_config_load(config, cfg, &err), RL_OK, "%s", err.message);
    rl_options o = {.config = *cfg};
    rl_agent *a;
    cr_assert_eq(rl_agent_open(&a, &o, &err), RL_OK, "%s", err.message);
    return a;
}

static void count(rl_agent *a, const char *tenant, int n)
{
    rl_attr attr = {"tenant", tenant, strlen(tenant)};
    for (int i = 0; i < n; i++) {
        rl_decision d;
        cr_assert_eq(rl_check(a, &attr, 1, 1, &d), RL_OK);
    }
}

Test(tls, the_synced_path_runs_over_mutual_tls)
{
    snprintf(dir, sizeof dir, "%s/tls-%d", test_env("RL_TEST_TMPDIR"),
             (int)getpid());
    cr_assert_eq(mkdir(dir, 0700), 0);
    make_ca("ca");
    make_ca("other");
    make_cert("ca", "server");
    make_cert("ca", "agent");
    make_cert("other", "stranger");
    char reports[64], totals[64];
    snprintf(reports, sizeof reports, "tls+tcp://127.0.0.1:%u",
             test_free_port());
    snprintf(totals, sizeof totals, "tls+tcp://127.0.0.1:%u",
             test_free_port());
    const char *redis = test_env("RL_TEST_REDIS");
    const char *agg_cfg = write_config("aggregator", redis, reports, totals,
                                       "server", ", client_auth: required");
    char log[700];
    test_log_path(log, sizeof log, "aggregator");
    char *argv[] = {(char *)test_env("RL_TEST_AGGREGATOR"), "--config",
                    (char *)agg_cfg, NULL};
    pid_t pid = test_spawn(argv, log);
    test_wait_for_log(&pid, log, "event=listening", 30000);

    rl_config *good_cfg, *bad_cfg;
    rl_agent *good = agent_on(write_config("agent", redis, reports, totals,
                                           "agent", ", server_name: "
                                           "localhost"), &good_cfg);
    rl_agent *bad = agent_on(write_config("stranger", redis, reports,
                                          totals, "stranger", ""),
                             &bad_cfg);
    char tenant[64], other[64];
    snprintf(tenant, sizeof tenant, "org_tls_%d", (int)getpid());
    snprintf(other, sizeof other, "org_stranger_%d", (int)getpid());
    count(good, tenant, 25);
    count(bad, other, 25);
    long long got = 0;
    for (int i = 0; i < 100 && (got = total(tenant)) != 25; i++)
        usleep(100 * 1000);
    cr_assert_eq(got, 25, "over TLS, Redis holds %lld of 25", got);
    usleep(1000 * 1000);
    cr_assert_eq(total(other), 0, "an agent the CA did not sign was heard");
    rl_agent_close(good);
    rl_agent_close(bad);
    rl_config_free(good_cfg);
    rl_config_free(bad_cfg);
    test_stop(pid, log, 30000);
}
