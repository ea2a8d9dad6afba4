/*
 * with_redis.c: the test runner's runner. Starts a private redis-server
 * (and with --cluster a 3-primary/3-replica cluster) on free loopback ports,
 * runs a command with their addresses in its environment, then stops them,
 * whatever the command did: Criterion forks a process per test, so servers
 * are shared through the environment, not through state in the tests.
 *
 *   with-redis [--cluster] -- COMMAND [ARG...]
 *
 * Environment given to COMMAND:
 *   RL_TEST_REDIS    127.0.0.1:PORT of the standalone server
 *   RL_TEST_CLUSTER  comma-separated 127.0.0.1:PORT of every cluster node
 *   RL_TEST_TMPDIR   a private directory, removed afterwards
 * Exit status: COMMAND's, 128+N if it died of signal N, 125 if the servers
 * could not be started.
 */
#define _XOPEN_SOURCE 700
#include "redis_cluster.h"
#include "redis_server.h"

#include <errno.h>
#include <ftw.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define EXIT_SETUP 125

static volatile pid_t child_pid;

/* Passes a stop request on to the command; the servers are stopped once it
 * has exited, in main. */
static void forward(int sig)
{
    if (child_pid > 0)
        kill(child_pid, sig);
}

static int remove_entry(const char *path, const struct stat *st, int flag,
                        struct FTW *ftw)
{
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

static int run(char **argv)
{
    pid_t pid = fork();
    if (pid < 0) {
        perror("with-redis: fork");
        return EXIT_SETUP;
    }
    if (pid == 0) {
        execvp(argv[0], argv);
        fprintf(stderr, "with-redis: cannot run %s: %s\n", argv[0],
                strerror(errno));
        _exit(127);
    }
    child_pid = pid;
    int status;
    while (waitpid(pid, &status, 0) < 0) {
        if (errno != EINTR)
            return EXIT_SETUP;
    }
    child_pid = 0;
    return WIFEXITED(status) ? WEXITSTATUS(status)
                             : 128 + WTERMSIG(status);
}

static void export_cluster(const test_cluster *cl)
{
    char list[TEST_CLUSTER_NODES * 24] = "";
    for (int i = 0; i < TEST_CLUSTER_NODES; i++) {
        size_t n = strlen(list);
        snprintf(list + n, sizeof list - n, "%s127.0.0.1:%u", i ? "," : "",
                 cl->nodes[i].port);
    }
    setenv("RL_TEST_CLUSTER", list, 1);
}

int main(int argc, char **argv)
{
    bool want_cluster = false;
    int i = 1;
    for (; i < argc && strcmp(argv[i], "--") != 0; i++) {
        if (strcmp(argv[i], "--cluster") == 0) {
            want_cluster = true;
        } else {
            fprintf(stderr, "usage: with-redis [--cluster] -- COMMAND...\n");
            return EXIT_SETUP;
        }
    }
    if (i + 1 >= argc) {
        fprintf(stderr, "usage: with-redis [--cluster] -- COMMAND...\n");
        return EXIT_SETUP;
    }

    struct sigaction sa = {.sa_handler = forward};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);

    const char *tmp = getenv("TMPDIR");
    char root[PATH_MAX];
    snprintf(root, sizeof root, "%s/rl-test-XXXXXX", tmp ? tmp : "/tmp");
    if (mkdtemp(root) == NULL) {
        perror("with-redis: mkdtemp");
        return EXIT_SETUP;
    }

    char err[PATH_MAX + 256];
    test_redis single = {0};
    test_cluster cluster = {0};
    int rc = EXIT_SETUP;
    if (test_redis_start(&single, root, NULL, err, sizeof err) != 0) {
        fprintf(stderr, "with-redis: %s\n", err);
        goto done;
    }
    char addr[32];
    snprintf(addr, sizeof addr, "127.0.0.1:%u", single.port);
    setenv("RL_TEST_REDIS", addr, 1);
    if (want_cluster) {
        if (test_cluster_start(&cluster, root, err, sizeof err) != 0) {
            fprintf(stderr, "with-redis: %s\n", err);
            goto done;
        }
        export_cluster(&cluster);
    }
    setenv("RL_TEST_TMPDIR", root, 1);
    rc = run(argv + i + 1);
done:
    test_cluster_stop(&cluster);
    test_redis_stop(&single);
    if (rc == 0) {
        nftw(root, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
    } else {
        fprintf(stderr, "with-redis: kept the servers' logs in %s\n", root);
    }
    return rc;
}
