/*
 * redis_cluster.c: a real cluster for the cluster tests. The cluster is
 * created by redis-cli, as an operator would, and only handed to tests once
 * all slots are served and replication is up, so that no test races the
 * cluster's own start-up.
 */
#include "redis_cluster.h"

#include <errno.h>
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define CLUSTER_READY_TIMEOUT_MS 30000

static int run_create(const test_cluster *cl, const char *root)
{
    char addrs[TEST_CLUSTER_NODES][32], log[PATH_MAX];
    snprintf(log, sizeof log, "%s/cluster-create.log", root);
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) {
            dup2(fd, STDOUT_FILENO);
            dup2(fd, STDERR_FILENO);
            close(fd);
        }
        char *argv[TEST_CLUSTER_NODES + 8];
        int n = 0;
        argv[n++] = "redis-cli";
        argv[n++] = "--cluster";
        argv[n++] = "create";
        for (int i = 0; i < TEST_CLUSTER_NODES; i++) {
            snprintf(addrs[i], sizeof addrs[i], "127.0.0.1:%u",
                     cl->nodes[i].port);
            argv[n++] = addrs[i];
        }
        argv[n++] = "--cluster-replicas";
        argv[n++] = "1";
        argv[n++] = "--cluster-yes";
        argv[n] = NULL;
        execvp("redis-cli", argv);
        _exit(127);
    }
    int status;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -1;
}

static redisReply *ask(uint16_t port, const char *command)
{
    struct timeval tv = {0, 500000};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", port, tv);
    redisReply *r = NULL;
    if (c != NULL && !c->err)
        r = redisCommand(c, command);
    redisFree(c);
    return r;
}

static bool state_ok(uint16_t port)
{
    redisReply *r = ask(port, "CLUSTER INFO");
    bool ok = r != NULL && r->type == REDIS_REPLY_STRING
              && strstr(r->str, "cluster_state:ok") != NULL
              && strstr(r->str, "cluster_slots_ok:16384") != NULL;
    freeReplyObject(r);
    return ok;
}

/* Whether the node's CLUSTER SLOTS shows every range with its primary and
 * one replica: Redis leaves out a replica until it has synced, so this is
 * also the sign that replication is up. */
static bool slots_replicated(uint16_t port)
{
    redisReply *r = ask(port, "CLUSTER SLOTS");
    bool ok = r != NULL && r->type == REDIS_REPLY_ARRAY
              && r->elements == TEST_CLUSTER_PRIMARIES;
    for (size_t i = 0; ok && i < r->elements; i++)
        ok = r->element[i]->type == REDIS_REPLY_ARRAY
             && r->element[i]->elements == 4;
    freeReplyObject(r);
    return ok;
}

static bool cluster_ready(const test_cluster *cl)
{
    for (int i = 0; i < TEST_CLUSTER_NODES; i++) {
        if (!state_ok(cl->nodes[i].port)
            || !slots_replicated(cl->nodes[i].port))
            return false;
    }
    return true;
}

static int start_cluster(test_cluster *cl, const char *root,
                         const char *certs_dir, char *err, size_t errlen)
{
    memset(cl, 0, sizeof *cl);
    for (int i = 0; i < TEST_CLUSTER_NODES; i++) {
        char tls[2048] = "";
        if (certs_dir != NULL) {
            cl->tls_ports[i] = test_free_port();
            snprintf(tls, sizeof tls, "tls-port %u\ntls-cluster yes\n"
                     "tls-replication yes\ntls-cert-file %s/server.pem\n"
                     "tls-key-file %s/server.key\n"
                     "tls-ca-cert-file %s/ca.pem\ntls-auth-clients no\n",
                     cl->tls_ports[i], certs_dir, certs_dir, certs_dir);
        }
        const test_redis_options node = {.cluster = true,
                                         .extra_conf = tls};
        if (test_redis_start(&cl->nodes[i], root, &node, err, errlen) != 0)
            goto fail;
    }
    if (run_create(cl, root) != 0) {
        snprintf(err, errlen, "redis-cli --cluster create failed; see "
                 "%s/cluster-create.log", root);
        goto fail;
    }
    for (int waited = 0; waited < CLUSTER_READY_TIMEOUT_MS; waited += 50) {
        if (cluster_ready(cl))
            return 0;
        struct timespec ts = {0, 50 * 1000000L};
        nanosleep(&ts, NULL);
    }
    snprintf(err, errlen, "cluster not ready within %d ms; see the redis.log "
             "of each node under %s", CLUSTER_READY_TIMEOUT_MS, root);
fail:
    test_cluster_stop(cl);
    return -1;
}

int test_cluster_start(test_cluster *cl, const char *root, char *err,
                       size_t errlen)
{
    return start_cluster(cl, root, NULL, err, errlen);
}

int test_cluster_start_tls(test_cluster *cl, const char *root,
                           const char *certs_dir, char *err, size_t errlen)
{
    return start_cluster(cl, root, certs_dir, err, errlen);
}

void test_cluster_stop(test_cluster *cl)
{
    for (int i = 0; i < TEST_CLUSTER_NODES; i++)
        test_redis_stop(&cl->nodes[i]);
}
