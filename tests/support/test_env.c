/*
 * test_env.c: helpers every integration test uses to reach the servers the
 * runner started for it.
 */
#include "test_env.h"

#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

const char *test_env(const char *name)
{
    const char *value = getenv(name);
    cr_assert(value != NULL && value[0] != '\0',
              "%s is not set: run the tests with `make test`, which starts "
              "the servers they need", name);
    return value;
}

redisContext *test_redis_connect(const char *addr)
{
    if (addr == NULL)
        addr = test_env("RL_TEST_REDIS");
    char host[64];
    unsigned port;
    cr_assert(sscanf(addr, "%63[^:]:%u", host, &port) == 2,
              "bad address '%s'", addr);
    struct timeval tv = {2, 0};
    redisContext *c = redisConnectWithTimeout(host, (int)port, tv);
    cr_assert(c != NULL && !c->err, "cannot connect to %s: %s", addr,
              c ? c->errstr : "out of memory");
    return c;
}

redisContext *test_redis_connect_holding(const char *store, const char *key)
{
    char seeds[1024];
    snprintf(seeds, sizeof seeds, "%s", store);
    char *save = NULL;
    for (char *addr = strtok_r(seeds, ",", &save); addr != NULL;
         addr = strtok_r(NULL, ",", &save)) {
        char *colon = strrchr(addr, ':');
        if (colon == NULL)
            continue;
        *colon = '\0';
        struct timeval tv = {2, 0};
        redisContext *c = redisConnectWithTimeout(addr, atoi(colon + 1), tv);
        redisReply *r = c != NULL && !c->err
                            ? redisCommand(c, "EXISTS %s", key)
                            : NULL;
        bool serves = r != NULL && r->type == REDIS_REPLY_INTEGER;
        freeReplyObject(r);
        if (serves)
            return c;
        redisFree(c);
    }
    return NULL;
}

redisReply *test_redis_command(redisContext *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = redisvCommand(c, fmt, ap);
    va_end(ap);
    cr_assert(r != NULL, "redis command '%s' failed: %s", fmt, c->errstr);
    return r;
}

/* A field of command's line of INFO commandstats, 0 if none. */
static double commandstat(const char *addr, const char *command,
                          const char *field)
{
    redisContext *c = test_redis_connect(addr);
    redisReply *r = test_redis_command(c, "INFO commandstats");
    cr_assert_eq(r->type, REDIS_REPLY_STRING, "INFO: %s", r->str);
    char name[64];
    snprintf(name, sizeof name, "cmdstat_%s:", command);
    const char *line = strstr(r->str, name), *at = NULL;
    if (line != NULL) {
        const char *end = strchr(line, '\r');
        snprintf(name, sizeof name, "%s=", field);
        at = strstr(line, name);
        if (at != NULL && end != NULL && at > end)
            at = NULL;
    }
    double value = at != NULL ? atof(at + strlen(name)) : 0;
    freeReplyObject(r);
    redisFree(c);
    return value;
}

long long test_redis_calls(const char *addr, const char *command)
{
    return (long long)commandstat(addr, command, "calls");
}

double test_redis_usec_per_call(const char *addr, const char *command)
{
    return commandstat(addr, command, "usec_per_call");
}

uint64_t test_redis_time_ms(redisContext *c)
{
    redisReply *r = test_redis_command(c, "TIME");
    cr_assert_eq(r->type, REDIS_REPLY_ARRAY, "TIME: %s", r->str);
    uint64_t ms = strtoull(r->element[0]->str, NULL, 10) * 1000
                  + strtoull(r->element[1]->str, NULL, 10) / 1000;
    freeReplyObject(r);
    return ms;
}

long long test_redis_pttl(const char *addr, const char *key)
{
    redisContext *c = test_redis_connect(addr);
    redisReply *r = test_redis_command(c, "PTTL %s", key);
    long long ms = r->integer;
    freeReplyObject(r);
    redisFree(c);
    return ms;
}

const char *test_write_config(const char *name, const char *yaml)
{
    static char path[8][600];
    static int next;
    char *p = path[next++ % 8];
    snprintf(p, 600, "%s/%s-%d.yaml", test_env("RL_TEST_TMPDIR"), name,
             (int)getpid());
    FILE *f = fopen(p, "w");
    cr_assert_not_null(f);
    fputs(yaml, f);
    fclose(f);
    return p;
}

const char *test_path(char *buf, size_t cap, const char *env_dir,
                      const char *file)
{
    snprintf(buf, cap, "%s/%s", test_env(env_dir), file);
    return buf;
}

int test_rlctl(char *out, size_t cap, const char *cfg, const char *fmt, ...)
{
    char args[1024], cmd[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    snprintf(cmd, sizeof cmd, "%s --config %s %s < /dev/null",
             test_env("RL_TEST_RLCTL"), cfg, args);
    return test_run(cmd, out, cap);
}

int test_run(const char *cmd, char *out, size_t cap)
{
    char full[2048];
    snprintf(full, sizeof full, "%s 2>&1", cmd);
    FILE *p = popen(full, "r");
    cr_assert_not_null(p, "cannot run %s", cmd);
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = '\0';
    int status = pclose(p);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

const char *test_store_config(const char *name, const char *rules)
{
    char yaml[2048];
    snprintf(yaml, sizeof yaml,
             "store: {url: \"redis://%s\", timeout_ms: 1000}\nrules:\n%s",
             test_env("RL_TEST_REDIS"), rules);
    return test_write_config(name, yaml);
}

int test_silent_store(uint16_t *port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof sa;
    cr_assert_eq(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    cr_assert_eq(listen(fd, 16), 0);
    cr_assert_eq(getsockname(fd, (struct sockaddr *)&sa, &len), 0);
    *port = ntohs(sa.sin_port);
    return fd;
}
