/*
 * redis_server.c: private redis-servers for tests. A server is a child of
 * the runner with PR_SET_PDEATHSIG, so that it dies with the runner even if
 * the runner itself is killed: no test ever leaves a server behind.
 */
#include "redis_server.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define START_ATTEMPTS 10
#define READY_TIMEOUT_MS 10000

/* Whether port can be bound on loopback now. */
static bool bindable(uint16_t port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return false;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bool ok = bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0;
    close(fd);
    return ok;
}

/* Ports are drawn below the kernel's ephemeral range
 * (net.ipv4.ip_local_port_range), where bind(0) would take them: a port
 * from there can become the source port of any outgoing connection on the
 * machine between the pick and the daemon's bind ("Address in use" for an
 * aggregator in CI run ci16, with hundreds of connections open around
 * it). */
#define PORTS_LOW 10000

static unsigned ephemeral_low(void)
{
    unsigned low = 32768, high;
    FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
    if (f != NULL) {
        if (fscanf(f, "%u %u", &low, &high) != 2)
            low = 32768;
        fclose(f);
    }
    return low;
}

/* A loopback port that could be bound just now; 0 if none was found.
 * The caller holds the lock that guards seed. */
static uint16_t loopback_free_port(unsigned *seed)
{
    unsigned low = ephemeral_low();
    if (low <= PORTS_LOW + 1000 || low > 65535)
        return 0;
    unsigned draw = (unsigned)rand_r(seed) % (low - PORTS_LOW);
    uint16_t port = (uint16_t)(PORTS_LOW + draw);
    return bindable(port) ? port : 0;
}

/* Two draws can give the same port (nothing is bound to it in between),
 * and a caller asking for two ports at once (an
 * aggregator's reports and totals) needs two: a port handed out recently
 * in this process is not handed out again. */
#define RECENT_PORTS 64

uint16_t test_free_port(void)
{
    static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    static uint16_t recent[RECENT_PORTS];
    static unsigned next, seed;
    static pid_t seeded_in;
    pthread_mutex_lock(&lock);
    /* Each test runs in a process of its own, forked with this state:
     * each draws its own ports. */
    if (seeded_in != getpid()) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        seed = (unsigned)getpid() * 2654435761u ^ (unsigned)ts.tv_nsec;
        seeded_in = getpid();
    }
    uint16_t port = 0;
    for (int attempt = 0; attempt < 100 && port == 0; attempt++) {
        port = loopback_free_port(&seed);
        for (int i = 0; i < RECENT_PORTS && port != 0; i++) {
            if (recent[i] == port)
                port = 0;
        }
    }
    recent[next++ % RECENT_PORTS] = port;
    pthread_mutex_unlock(&lock);
    return port;
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

static int write_config(const test_redis *srv, const test_redis_options *o)
{
    char path[PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/redis.conf", srv->dir);
    FILE *f = fopen(path, "w");
    if (f == NULL)
        return -1;
    fprintf(f,
            "port %u\n"
            "bind 127.0.0.1\n"
            "daemonize no\n"
            "save \"\"\n"
            "appendonly no\n"
            "dir %s\n"
            "logfile %s/redis.log\n"
            "enable-debug-command local\n",
            srv->port, srv->dir, srv->dir);
    if (o->extra_conf != NULL)
        fprintf(f, "%s\n", o->extra_conf);
    if (o->cluster)
        fprintf(f,
                "cluster-enabled yes\n"
                "cluster-config-file nodes.conf\n"
                "cluster-port %u\n"
                "cluster-node-timeout 2000\n"
                /* One shard's failover must not stop the others (the
                 * docs/design.md recommends the same). */
                "cluster-require-full-coverage no\n"
                /* A replica is listed in CLUSTER SLOTS, which the runner
                 * waits for, once its offset is not 0: without these a
                 * replica syncs after 5 s (the diskless delay) and its
                 * offset moves with the first ping, 10 s in. The
                 * cluster is ready in 3 s instead of 11. */
                "repl-diskless-sync-delay 0\n"
                "repl-ping-replica-period 1\n",
                srv->bus_port);
    return fclose(f) == 0 ? 0 : -1;
}

/* Everything the child needs is prepared before fork(): the tests fork
 * from processes that already run threads, where only async-signal-safe
 * calls are allowed between fork and exec. */
static pid_t spawn(const test_redis *srv)
{
    char conf[PATH_MAX + 16], out[PATH_MAX + 16];
    snprintf(conf, sizeof conf, "%s/redis.conf", srv->dir);
    snprintf(out, sizeof out, "%s/stdout.log", srv->dir);
    const char *bin = getenv("RL_REDIS_SERVER");
    bin = bin != NULL ? bin : "redis-server";
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid != 0)
        return pid;
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent)
        _exit(127); /* the runner died before prctl took effect */
    int fd = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
        dup2(fd, STDOUT_FILENO);
        dup2(fd, STDERR_FILENO);
        close(fd);
    }
    if (srv->sentinel)
        execlp(bin, bin, conf, "--sentinel", (char *)NULL);
    else
        execlp(bin, bin, conf, (char *)NULL);
    _exit(127);
}

static bool answers_ping(uint16_t port)
{
    struct timeval tv = {0, 200000};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", port, tv);
    bool ok = false;
    if (c != NULL && !c->err) {
        /* Any answer will do: a server with a password answers NOAUTH. */
        redisReply *r = redisCommand(c, "PING");
        ok = r != NULL && (r->type == REDIS_REPLY_STATUS
                           || r->type == REDIS_REPLY_ERROR);
        freeReplyObject(r);
    }
    redisFree(c);
    return ok;
}

/* 1 ready, 0 exited early (port taken, most likely), -1 timed out. */
static int wait_ready(test_redis *srv)
{
    for (int waited = 0; waited < READY_TIMEOUT_MS; waited += 20) {
        int status;
        if (waitpid(srv->pid, &status, WNOHANG) == srv->pid) {
            srv->pid = 0;
            return 0;
        }
        if (answers_ping(srv->port))
            return 1;
        sleep_ms(20);
    }
    return -1;
}

/* Starts the server in srv->dir and waits for it: 0 ready, 1 exited at
 * start, -1 failed. */
static int launch(test_redis *srv, char *err, size_t errlen)
{
    srv->pid = spawn(srv);
    if (srv->pid < 0) {
        srv->pid = 0;
        snprintf(err, errlen, "fork: %s", strerror(errno));
        return -1;
    }
    int ready = wait_ready(srv);
    if (ready < 0) {
        test_redis_stop(srv);
        snprintf(err, errlen, "redis-server on port %u did not answer PING "
                 "within %d ms; see %s/redis.log", srv->port,
                 READY_TIMEOUT_MS, srv->dir);
        return -1;
    }
    if (ready == 0)
        snprintf(err, errlen, "redis-server exited at start; see "
                 "%s/redis.log and %s/stdout.log", srv->dir, srv->dir);
    return ready == 1 ? 0 : 1;
}

static int try_start(test_redis *srv, const char *root,
                     const test_redis_options *o, char *err, size_t errlen)
{
    srv->port = test_free_port();
    srv->sentinel = o->sentinel;
    srv->bus_port = o->cluster ? test_free_port() : 0;
    if (srv->port == 0 || (o->cluster && srv->bus_port == 0)) {
        snprintf(err, errlen, "no free loopback port: %s", strerror(errno));
        return -1;
    }
    snprintf(srv->dir, sizeof srv->dir, "%s/redis-%u", root, srv->port);
    if (mkdir(srv->dir, 0700) != 0 && errno != EEXIST) {
        snprintf(err, errlen, "mkdir %s: %s", srv->dir, strerror(errno));
        return -1;
    }
    if (write_config(srv, o) != 0) {
        snprintf(err, errlen, "cannot write %s/redis.conf", srv->dir);
        return -1;
    }
    return launch(srv, err, errlen);
}

int test_redis_start(test_redis *srv, const char *root,
                     const test_redis_options *opts, char *err,
                     size_t errlen)
{
    static const test_redis_options none = {0};
    memset(srv, 0, sizeof *srv);
    for (int attempt = 0; attempt < START_ATTEMPTS; attempt++) {
        int rc = try_start(srv, root, opts != NULL ? opts : &none, err,
                           errlen);
        if (rc <= 0)
            return rc;
        /* Exited at start: another process took the port; pick again. */
    }
    return -1;
}

void test_redis_stop(test_redis *srv)
{
    if (srv->pid <= 0)
        return;
    kill(srv->pid, SIGTERM);
    kill(srv->pid, SIGCONT); /* a paused server would not see the SIGTERM */
    for (int waited = 0; waited < 5000; waited += 10) {
        if (waitpid(srv->pid, NULL, WNOHANG) == srv->pid) {
            srv->pid = 0;
            return;
        }
        sleep_ms(10);
    }
    kill(srv->pid, SIGKILL);
    waitpid(srv->pid, NULL, 0);
    srv->pid = 0;
}

int test_redis_restart(test_redis *srv, char *err, size_t errlen)
{
    for (int attempt = 0; attempt < START_ATTEMPTS; attempt++) {
        int rc = launch(srv, err, errlen);
        if (rc <= 0)
            return rc;
        /* The port may still be held by the old process's socket. */
        sleep_ms(100);
    }
    return -1;
}

void test_redis_kill(test_redis *srv)
{
    if (srv->pid <= 0)
        return;
    kill(srv->pid, SIGKILL);
    waitpid(srv->pid, NULL, 0);
    srv->pid = 0;
}

void test_redis_pause(test_redis *srv)
{
    if (srv->pid > 0)
        kill(srv->pid, SIGSTOP);
}

void test_redis_resume(test_redis *srv)
{
    if (srv->pid > 0)
        kill(srv->pid, SIGCONT);
}
