/*
 * test_process.c: see test_process.h.
 */
#include "test_process.h"

#include "test_env.h"

#include <criterion/criterion.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

const char *test_log_path(char *buf, size_t cap, const char *what)
{
    static int serial;
    snprintf(buf, cap, "%s/%s-%d-%d.log", test_env("RL_TEST_LOGDIR"), what,
             (int)getpid(), ++serial);
    return buf;
}

pid_t test_spawn(char *const argv[], const char *log)
{
    const char *dir = test_env("RL_TEST_LOGDIR");
    size_t n = strlen(dir);
    cr_assert(strncmp(log, dir, n) == 0 && log[n] == '/',
              "%s is not in RL_TEST_LOGDIR (%s), where sanitizer reports "
              "are looked for: name it with test_log_path", log, dir);
    pid_t parent = getpid();
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(127);
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) {
            dup2(fd, STDERR_FILENO);
            close(fd);
        }
        execv(argv[0], argv);
        _exit(127);
    }
    return pid;
}

void test_show_log(const char *log)
{
    char cmd[700], out[8192];
    snprintf(cmd, sizeof cmd, "tail -n 40 %s", log);
    test_run(cmd, out, sizeof out);
    fprintf(stderr, "--- last lines of %s ---\n%s---\n", log, out);
}

void test_wait_for_log(pid_t *pid, const char *log, const char *what,
                       int timeout_ms)
{
    test_wait_for_log_from(pid, log, 0, what, timeout_ms);
}

long test_log_size(const char *log)
{
    struct stat st;
    return stat(log, &st) == 0 ? (long)st.st_size : 0;
}

void test_wait_for_log_from(pid_t *pid, const char *log, long from,
                            const char *what, int timeout_ms)
{
    test_wait_for_log_lines(pid, log, from, what, 1, timeout_ms);
}

void test_wait_for_log_lines(pid_t *pid, const char *log, long from,
                             const char *what, int lines, int timeout_ms)
{
    char cmd[700], out[64];
    snprintf(cmd, sizeof cmd, "tail -c +%ld %s | grep -c '%s'", from + 1,
             log, what);
    for (int waited = 0; waited < timeout_ms; waited += 20) {
        int status;
        if (waitpid(*pid, &status, WNOHANG) != 0) {
            *pid = 0;
            test_show_log(log);
            cr_assert_fail("the process exited at start; see %s", log);
        }
        test_run(cmd, out, sizeof out);
        if (atoi(out) >= lines)
            return;
        usleep(20 * 1000);
    }
    test_show_log(log);
    cr_assert_fail("fewer than %d lines with '%s' in %s within %d ms", lines,
                   what, log, timeout_ms);
}

/* Where a process that will not stop is stuck: every thread's stack, by
 * gdb (a minute at most), at the end of its log. */
static void append_stacks(pid_t pid, const char *log)
{
    char cmd[1024], out[256];
    snprintf(cmd, sizeof cmd, "timeout -k 5 60 gdb -batch -nx -p %d -ex "
             "'thread apply all bt' >> '%s' 2>&1", (int)pid, log);
    test_run(cmd, out, sizeof out);
}

void test_stop(pid_t pid, const char *log, int timeout_ms)
{
    kill(pid, SIGTERM);
    int status = 0;
    pid_t done = 0;
    for (int waited = 0; waited < timeout_ms && done == 0; waited += 20) {
        done = waitpid(pid, &status, WNOHANG);
        if (done == 0)
            usleep(20 * 1000);
    }
    if (done == 0) {
        append_stacks(pid, log);
        test_show_log(log);
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        cr_assert_fail("did not stop within %d ms of SIGTERM; see %s (its "
                       "threads' stacks at the end)", timeout_ms, log);
    }
    if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
        test_show_log(log);
        cr_assert_fail("did not exit cleanly on SIGTERM (%s %d); see %s",
                       WIFEXITED(status) ? "exit status" : "signal",
                       WIFEXITED(status) ? WEXITSTATUS(status)
                                         : WTERMSIG(status), log);
    }
}
