/*
 * redis_server.h: one private redis-server for tests, on a free loopback
 * port in its own directory, stopped on request or when its parent dies.
 */
#ifndef RL_TEST_REDIS_SERVER_H
#define RL_TEST_REDIS_SERVER_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

typedef struct test_redis {
    pid_t pid;          /* 0 when not running */
    uint16_t port;
    uint16_t bus_port;  /* cluster bus, 0 when not a cluster node */
    char dir[PATH_MAX]; /* its working directory: redis.conf, redis.log */
    bool sentinel;      /* started with --sentinel */
} test_redis;

/* What to start: cluster mode, a sentinel (its `sentinel monitor` lines
 * in extra_conf), and extra redis.conf lines (or NULL). */
typedef struct test_redis_options {
    bool cluster;
    bool sentinel;
    const char *extra_conf;
} test_redis_options;

/* test_redis_start starts redis-server (or $RL_REDIS_SERVER) with a config
 * written under root: loopback only, no persistence, cluster mode if asked.
 * It retries on another port if the one picked was taken meanwhile, and
 * returns once PING answers. On failure returns -1 with a reason in err. */
int test_redis_start(test_redis *srv, const char *root,
                     const test_redis_options *opts, char *err,
                     size_t errlen);

/* test_redis_restart starts a stopped server again on the same port, with
 * the same config. Returns -1 with a reason if it does not come up. */
int test_redis_restart(test_redis *srv, char *err, size_t errlen);

/* test_redis_kill kills the server at once (SIGKILL), as a crash would. */
void test_redis_kill(test_redis *srv);

/* test_redis_pause stops the server in its tracks (SIGSTOP): its sockets
 * stay open and the kernel still accepts connections, but nothing answers,
 * as with a server that hangs or swaps. test_redis_resume lets it go on
 * (SIGCONT). A paused server still dies with the test process, and
 * test_redis_stop resumes it to stop it. */
void test_redis_pause(test_redis *srv);
void test_redis_resume(test_redis *srv);

/* test_redis_stop stops the server (SIGTERM, then SIGKILL after 5 s) and
 * waits for it. Safe on a server that is not running. */
void test_redis_stop(test_redis *srv);

/* test_free_port returns a loopback TCP port that was free a moment ago,
 * or 0. */
uint16_t test_free_port(void);

#endif
