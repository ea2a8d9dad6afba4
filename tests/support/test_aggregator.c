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
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

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
    /* Up when it answers... a report socket accepts connections at once;
     * give it a moment to bind and reach Redis. */
    usleep(300 * 1000);
    int status;
    cr_assert_eq(waitpid(agg->pid, &status, WNOHANG), 0,
                 "rl-aggregator exited at start; see %s", agg->log);
}

void test_aggregator_stop(test_aggregator *agg)
{
    if (agg->pid <= 0)
        return;
    kill(agg->pid, SIGTERM);
    int status;
    waitpid(agg->pid, &status, 0);
    agg->pid = 0;
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
