/*
 * test_rls.c: rl-rls run and called by tests (test_rls.h).
 */
#include "test_rls.h"

#include "redis_server.h"
#include "test_env.h"
#include "test_process.h"

#include <criterion/criterion.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static void write_file(const char *path, const char *text)
{
    char tmp[600];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    cr_assert_not_null(f, "cannot write %s", tmp);
    fputs(text, f);
    fclose(f);
    cr_assert_eq(rename(tmp, path), 0);
}

void test_rls_write(test_rls *r, const char *name, const char *text)
{
    char path[512];
    snprintf(path, sizeof path, "%s/rt/config/%s", r->root, name);
    write_file(path, text);
}

static void set_port(const char *name, uint16_t port)
{
    char v[8];
    snprintf(v, sizeof v, "%u", port);
    setenv(name, v, 1);
}

void test_rls_start(test_rls *r, const char *limits, const char *rl_yaml,
                    const char *const *env)
{
    test_rls_start_workers(r, limits, rl_yaml, env, 2);
}

void test_rls_start_workers(test_rls *r, const char *limits,
                            const char *rl_yaml, const char *const *env,
                            int n)
{
    memset(r, 0, sizeof *r);
    char dir[300];
    snprintf(r->root, sizeof r->root, "/tmp/rl-rls-%d-XXXXXX", (int)getpid());
    cr_assert_not_null(mkdtemp(r->root));
    snprintf(dir, sizeof dir, "%s/rt", r->root);
    mkdir(dir, 0755);
    snprintf(dir, sizeof dir, "%s/rt/config", r->root);
    mkdir(dir, 0755);
    test_rls_write(r, "limits.yaml", limits);
    r->grpc_port = test_free_port();
    r->http_port = test_free_port();
    r->debug_port = test_free_port();
    /* Each test runs in a process of its own: its environment is the
     * daemon's. */
    setenv("RUNTIME_ROOT", r->root, 1);
    setenv("RUNTIME_SUBDIRECTORY", "rt", 1);
    setenv("REDIS_SOCKET_TYPE", "tcp", 1);
    setenv("REDIS_URL", test_env("RL_TEST_REDIS"), 1);
    setenv("GRPC_HOST", "127.0.0.1", 1);
    setenv("HOST", "127.0.0.1", 1);
    setenv("DEBUG_HOST", "127.0.0.1", 1);
    set_port("GRPC_PORT", r->grpc_port);
    set_port("PORT", r->http_port);
    set_port("DEBUG_PORT", r->debug_port);
    setenv("LOG_LEVEL", "debug", 1);
    /* From the environment alone, the store's deadline a loaded machine
     * keeps (rl's own 50 ms is not always), as rl_yaml's timeout_ms. */
    if (rl_yaml == NULL)
        setenv("REDIS_TIMEOUT", "2s", 1);
    else
        unsetenv("REDIS_TIMEOUT");
    for (size_t i = 0; env != NULL && env[i] != NULL; i++)
        cr_assert_eq(putenv((char *)env[i]), 0);
    char config[320], workers[16];
    snprintf(workers, sizeof workers, "%d", n);
    char *argv[8] = {(char *)test_env("RL_TEST_RLS"), "--workers", workers};
    if (rl_yaml != NULL) {
        snprintf(config, sizeof config, "%s/rl.yaml", r->root);
        write_file(config, rl_yaml);
        argv[3] = "--config";
        argv[4] = config;
    }
    test_log_path(r->log, sizeof r->log, "rls");
    r->pid = test_spawn(argv, r->log);
    const char *format = getenv("LOG_FORMAT");
    test_wait_for_log(&r->pid, r->log,
                      format != NULL && strcmp(format, "json") == 0
                          ? "\"event\":\"listening\""
                          : "event=listening",
                      30000);
    /* Every worker's store connected: a call before that waits for it
     * within its deadline (connecting, the handshake and loading the
     * functions), and its answer says degraded when they take longer. */
    test_wait_for_log_lines(&r->pid, r->log, 0, "store_ready", n, 10000);
}

static void call_v(test_rls *r, const char *const *opts, char *out,
                   size_t cap, va_list ap)
{
    char target[32];
    snprintf(target, sizeof target, "127.0.0.1:%u", r->grpc_port);
    char *argv[64] = {"/usr/bin/python3", "tests/support/rls_call.py"};
    int n = 2;
    for (size_t i = 0; opts != NULL && opts[i] != NULL && n < 40; i++)
        argv[n++] = (char *)opts[i];
    argv[n++] = target;
    for (char *a; (a = va_arg(ap, char *)) != NULL && n < 63;)
        argv[n++] = a;
    int fds[2];
    cr_assert_eq(pipe(fds), 0);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        dup2(fds[1], 1);
        close(fds[0]);
        close(fds[1]);
        execv(argv[0], argv);
        _exit(127);
    }
    close(fds[1]);
    size_t len = 0;
    ssize_t got;
    while (len + 1 < cap && (got = read(fds[0], out + len, cap - 1 - len)) > 0)
        len += (size_t)got;
    out[len] = '\0';
    close(fds[0]);
    int status;
    waitpid(pid, &status, 0);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0,
              "rls_call.py failed (status %d):\n%s", status, out);
}

void test_rls_call(test_rls *r, char *out, size_t cap, ...)
{
    va_list ap;
    va_start(ap, cap);
    call_v(r, NULL, out, cap, ap);
    va_end(ap);
}

void test_rls_call_with(test_rls *r, const char *const *opts, char *out,
                        size_t cap, ...)
{
    va_list ap;
    va_start(ap, cap);
    call_v(r, opts, out, cap, ap);
    va_end(ap);
}

void test_rls_stop(test_rls *r)
{
    if (r->pid <= 0)
        return;
    pid_t pid = r->pid;
    r->pid = 0;
    test_stop(pid, r->log, 15000);
}
