/*
 * test_aggregator.c: rl-aggregator as its own process, the way it runs in
 * production, so that tests can kill and restart it.
 */
#include "test_aggregator.h"

#include "redis_server.h"
#include "test_env.h"

#include <criterion/criterion.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#define STOP_WAIT_MS 60000

/* The aggregator's log on the test's stderr: CI keeps only what a run
 * printed. */
static void show_log(const test_aggregator *agg)
{
    char cmd[700], out[8192];
    snprintf(cmd, sizeof cmd, "tail -n 40 %s", agg->log);
    test_run(cmd, out, sizeof out);
    fprintf(stderr, "--- last lines of %s ---\n%s---\n", agg->log, out);
}

static void wait_for_log(test_aggregator *agg, const char *event,
                         int timeout_ms)
{
    char cmd[700], out[64];
    snprintf(cmd, sizeof cmd, "grep -c '%s' %s", event, agg->log);
    for (int waited = 0; waited < timeout_ms; waited += 20) {
        int status;
        if (waitpid(agg->pid, &status, WNOHANG) != 0) {
            agg->pid = 0;
            show_log(agg);
            cr_assert_fail("rl-aggregator exited at start; see %s", agg->log);
        }
        test_run(cmd, out, sizeof out);
        if (atoi(out) > 0)
            return;
        usleep(20 * 1000);
    }
    show_log(agg);
    cr_assert_fail("rl-aggregator logged no %s within %d ms", event,
                   timeout_ms);
}

static void spawn(test_aggregator *agg)
{
    const char *bin = test_env("RL_TEST_AGGREGATOR");
    pid_t parent = getpid();
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(127);
        int fd = open(agg->log, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) {
            dup2(fd, STDERR_FILENO);
            close(fd);
        }
        execl(bin, bin, "--config", agg->config, "--log-level", "info",
              (char *)NULL);
        _exit(127);
    }
    agg->pid = pid;
}

void test_aggregator_start(test_aggregator *agg, const char *redis,
                           const char *rules_yaml, unsigned sync_interval_ms,
                           const test_aggregator *reuse_from)
{
    if (reuse_from != NULL) {
        *agg = *reuse_from;
    } else {
        memset(agg, 0, sizeof *agg);
        snprintf(agg->reports, sizeof agg->reports, "tcp://127.0.0.1:%u",
                 test_free_port());
        snprintf(agg->totals, sizeof agg->totals, "tcp://127.0.0.1:%u",
                 test_free_port());
        static int serial;
        snprintf(agg->config, sizeof agg->config, "%s/agg-%d-%d.yaml",
                 test_env("RL_TEST_TMPDIR"), (int)getpid(), ++serial);
        snprintf(agg->log, sizeof agg->log, "%s.log", agg->config);
        FILE *f = fopen(agg->config, "w");
        cr_assert_not_null(f);
        fprintf(f,
                "store: {url: \"redis://%s\"}\n"
                "aggregator:\n"
                "  reports: \"%s\"\n"
                "  totals: \"%s\"\n"
                "  sync_interval_ms: %u\n"
                "rules:\n%s",
                redis != NULL ? redis : test_env("RL_TEST_REDIS"),
                agg->reports, agg->totals,
                sync_interval_ms, rules_yaml);
        fclose(f);
    }
    spawn(agg);
    wait_for_log(agg, "event=listening", 30000);
}

void test_aggregator_stop(test_aggregator *agg)
{
    if (agg->pid <= 0)
        return;
    kill(agg->pid, SIGTERM);
    int status = 0;
    pid_t done = 0;
    /* A drain that never ends must fail the test with the aggregator's own
     * account, not leave the runner waiting. */
    for (int waited = 0; waited < STOP_WAIT_MS && done == 0; waited += 20) {
        done = waitpid(agg->pid, &status, WNOHANG);
        if (done == 0)
            usleep(20 * 1000);
    }
    if (done == 0) {
        show_log(agg);
        test_aggregator_kill(agg);
        cr_assert_fail("rl-aggregator did not stop within %d ms of SIGTERM",
                       STOP_WAIT_MS);
    }
    agg->pid = 0;
    if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0))
        show_log(agg);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0,
              "rl-aggregator did not exit cleanly on SIGTERM; see %s",
              agg->log);
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
    rl_error err;
    cr_assert_eq(rl_config_load(agg->config, config, &err), RL_OK, "%s",
                 err.message);
    rl_options o = {.config = *config};
    rl_agent *agent;
    cr_assert_eq(rl_agent_open(&agent, &o, &err), RL_OK, "%s", err.message);
    return agent;
}
