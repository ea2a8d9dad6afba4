/*
 * test_aggregator.c: rl-aggregator as its own process, the way it runs in
 * production, so that tests can kill and restart it.
 */
#include "test_aggregator.h"

#include "redis_server.h"
#include "test_agent.h"
#include "test_env.h"
#include "test_process.h"

#include <criterion/criterion.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#define WRAPPER_MAX 8

static void spawn(test_aggregator *agg)
{
    char *argv[WRAPPER_MAX + 8];
    size_t n = 0;
    for (const char *const *w = agg->wrapper; w != NULL && *w != NULL; w++) {
        cr_assert_lt(n, WRAPPER_MAX, "a wrapper of more than %d words",
                     WRAPPER_MAX);
        argv[n++] = (char *)*w;
    }
    char *own[] = {(char *)test_env("RL_TEST_AGGREGATOR"), "--config",
                   agg->config, "--log-level", "info", NULL, NULL, NULL};
    if (agg->index[0] != '\0') {
        own[5] = "--index";
        own[6] = agg->index;
    }
    memcpy(argv + n, own, sizeof own);
    agg->log_from = test_log_size(agg->log);
    agg->pid = test_spawn(argv, agg->log);
}

/* store: redis (host:port, or a cluster's seeds separated by commas), or
 * RL_TEST_REDIS when NULL. */
static void write_store(FILE *f, const char *redis)
{
    const char *store = redis != NULL ? redis : test_env("RL_TEST_REDIS");
    /* A YAML mapping is the store block itself; a comma-separated list is
     * a cluster's seeds. */
    if (store[0] == '{') {
        fprintf(f, "store: %s\n", store);
    } else if (strchr(store, ',') != NULL) {
        fprintf(f, "store: {cluster: [");
        for (const char *p = store; *p; p++)
            fputs(*p == ',' ? ", " : (char[]){*p, 0}, f);
        fprintf(f, "]}\n");
    } else {
        fprintf(f, "store: {url: \"redis://%s\"}\n", store);
    }
}

/* This run's line, not the last run's: a restart appends to the log. */
static void wait_listening(test_aggregator *agg)
{
    test_wait_for_log_from(&agg->pid, agg->log, agg->log_from,
                           "event=listening", 30000);
}

static int config_serial;

void test_aggregators_start(test_aggregator *aggs, size_t n,
                            const char *redis, const char *rules_yaml,
                            unsigned sync_interval_ms)
{
    test_aggregators_start_extra(aggs, n, redis, rules_yaml,
                                 sync_interval_ms, "");
}

void test_aggregators_start_extra(test_aggregator *aggs, size_t n,
                                  const char *redis, const char *rules_yaml,
                                  unsigned sync_interval_ms,
                                  const char *extra)
{
    char config[512];
    snprintf(config, sizeof config, "%s/aggs-%d-%d.yaml",
             test_env("RL_TEST_TMPDIR"), (int)getpid(), ++config_serial);
    FILE *f = fopen(config, "w");
    cr_assert_not_null(f);
    write_store(f, redis);
    fprintf(f, "aggregator:\n  sync_interval_ms: %u\n%saggregators:\n",
            sync_interval_ms, extra);
    for (size_t i = 0; i < n; i++) {
        test_aggregator *agg = &aggs[i];
        memset(agg, 0, sizeof *agg);
        agg->extra = extra;
        snprintf(agg->config, sizeof agg->config, "%s", config);
        snprintf(agg->index, sizeof agg->index, "%zu", i);
        snprintf(agg->reports, sizeof agg->reports, "tcp://127.0.0.1:%u",
                 test_free_port());
        snprintf(agg->totals, sizeof agg->totals, "tcp://127.0.0.1:%u",
                 test_free_port());
        agg->metrics = test_free_port();
        test_log_path(agg->log, sizeof agg->log, "aggregator");
        fprintf(f, "  - {reports: \"%s\", totals: \"%s\", "
                "metrics: \"127.0.0.1:%u\"}\n", agg->reports, agg->totals,
                agg->metrics);
    }
    fprintf(f, "rules:\n%s", rules_yaml);
    fclose(f);
    for (size_t i = 0; i < n; i++) {
        spawn(&aggs[i]);
        wait_listening(&aggs[i]);
    }
}

void test_aggregator_start(test_aggregator *agg, const char *redis,
                           const char *rules_yaml, unsigned sync_interval_ms,
                           const test_aggregator *reuse_from)
{
    if (reuse_from != NULL && reuse_from->pid >= 0) {
        *agg = *reuse_from;
    } else {
        test_aggregator tpl = reuse_from != NULL ? *reuse_from
                                                 : (test_aggregator){0};
        memset(agg, 0, sizeof *agg);
        agg->extra = tpl.extra != NULL ? tpl.extra : "";
        agg->wrapper = tpl.wrapper;
        snprintf(agg->reports, sizeof agg->reports, "tcp://127.0.0.1:%u",
                 test_free_port());
        snprintf(agg->totals, sizeof agg->totals, "tcp://127.0.0.1:%u",
                 test_free_port());
        agg->metrics = test_free_port();
        snprintf(agg->config, sizeof agg->config, "%s/agg-%d-%d.yaml",
                 test_env("RL_TEST_TMPDIR"), (int)getpid(), ++config_serial);
        test_log_path(agg->log, sizeof agg->log, "aggregator");
        FILE *f = fopen(agg->config, "w");
        cr_assert_not_null(f);
        write_store(f, redis);
        fprintf(f,
                "aggregator:\n"
                "  reports: \"%s\"\n"
                "  totals: \"%s\"\n"
                "  metrics: \"127.0.0.1:%u\"\n"
                "  sync_interval_ms: %u\n%s"
                "rules:\n%s",
                agg->reports, agg->totals, agg->metrics,
                sync_interval_ms, agg->extra, rules_yaml);
        fclose(f);
    }
    spawn(agg);
    wait_listening(agg);
}

void test_aggregator_wait_ready(test_aggregator *agg)
{
    test_wait_for_log_from(&agg->pid, agg->log, agg->log_from,
                           "event=store_ready", 10000);
}

void test_aggregator_stop(test_aggregator *agg)
{
    if (agg->pid <= 0)
        return;
    pid_t pid = agg->pid;
    agg->pid = 0;
    test_stop(pid, agg->log, 60000);
}

void test_aggregator_kill(test_aggregator *agg)
{
    if (agg->pid <= 0)
        return;
    kill(agg->pid, SIGKILL);
    waitpid(agg->pid, NULL, 0);
    agg->pid = 0;
}

rl_agent *test_synced_agent(const test_aggregator *agg, rl_config **config)
{
    return test_agent_on(agg->config, config, NULL);
}
