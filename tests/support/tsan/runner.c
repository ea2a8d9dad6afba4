/*
 * runner.c: runs the tests registered through the TSan stand-in for
 * Criterion (see criterion/criterion.h beside this file), each in a forked
 * process with a time limit, and ends with one "tsan: N passed, N failed"
 * line. Exit status 1 if any test failed or crashed.
 */
#include "criterion/criterion.h"

#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAX_TESTS 1024
#define TEST_TIMEOUT_S 300
#define MAX_JOBS 64

struct test {
    const char *suite, *name;
    void (*fn)(void);
};

static struct test tests[MAX_TESTS];
static size_t n_tests;
static bool expect_failed;

void tsan_test_register(const char *suite, const char *name, void (*fn)(void))
{
    if (n_tests == MAX_TESTS) {
        fprintf(stderr, "tsan runner: more than %d tests\n", MAX_TESTS);
        exit(2);
    }
    tests[n_tests++] = (struct test){suite, name, fn};
}

void tsan_test_check(bool ok, bool fatal, const char *file, int line,
                     const char *what, const char *fmt, ...)
{
    if (ok)
        return;
    char message[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof message, fmt, ap);
    va_end(ap);
    fprintf(stderr, "[----] %s:%d: %s%s%s\n", file, line, what,
            message[0] ? ": " : "", message);
    fflush(NULL);
    /* _exit: a test that stops half-way leaves libraries' threads running
     * (nng's among them), and exit()'s handlers could wait on them. */
    if (fatal)
        _exit(1);
    expect_failed = true;
}

/* A test's process: its result is the exit status. */
static pid_t start_one(const struct test *t)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        perror("tsan runner: fork");
        return -1;
    }
    if (pid == 0) {
        alarm(TEST_TIMEOUT_S);
        t->fn();
        fflush(NULL);
        _exit(expect_failed ? 1 : 0);
    }
    return pid;
}

static bool report(const struct test *t, int status)
{
    bool passed = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM)
        fprintf(stderr, "[----] %s::%s: still running after %d s\n",
                t->suite, t->name, TEST_TIMEOUT_S);
    else if (WIFSIGNALED(status))
        fprintf(stderr, "[----] %s::%s: crashed with signal %d\n", t->suite,
                t->name, WTERMSIG(status));
    printf("[%s] %s::%s\n", passed ? "PASS" : "FAIL", t->suite, t->name);
    fflush(stdout);
    return passed;
}

/* How many tests run at once: TSAN_JOBS, else one. Several at once
 * (TSAN_JOBS=2) halves the run here, but one such run saw
 * reload::eight_threads_check_through_a_hundred_reloads still running
 * after 300 s, never seen one at a time: until that is understood, CI
 * runs them one at a time. */
static long jobs(void)
{
    const char *env = getenv("TSAN_JOBS");
    long n = env != NULL ? atol(env) : 1;
    if (n < 1)
        n = 1;
    return n > MAX_JOBS ? MAX_JOBS : n;
}

int main(int argc, char **argv)
{
    const char *filter = argc > 1 ? argv[1] : NULL;
    size_t passed = 0, failed = 0, next = 0;
    long max = jobs(), running = 0;
    struct {
        pid_t pid;
        const struct test *t;
    } slots[MAX_JOBS] = {{0}};
    for (;;) {
        while (running < max && next < n_tests) {
            const struct test *t = &tests[next++];
            char full[512];
            snprintf(full, sizeof full, "%s::%s", t->suite, t->name);
            if (filter != NULL && strstr(full, filter) == NULL)
                continue;
            pid_t pid = start_one(t);
            if (pid < 0) {
                failed++;
                continue;
            }
            for (long i = 0; i < max; i++) {
                if (slots[i].pid == 0) {
                    slots[i].pid = pid;
                    slots[i].t = t;
                    break;
                }
            }
            running++;
        }
        if (running == 0)
            break;
        int status;
        pid_t done = waitpid(-1, &status, 0);
        if (done < 0) {
            perror("tsan runner: waitpid");
            return 1;
        }
        for (long i = 0; i < max; i++) {
            if (slots[i].pid != done)
                continue;
            if (report(slots[i].t, status))
                passed++;
            else
                failed++;
            slots[i].pid = 0;
            running--;
        }
    }
    printf("tsan: %zu passed, %zu failed\n", passed, failed);
    return failed == 0 && passed > 0 ? 0 : 1;
}
