/*
 * runner.c: runs the tests registered through the TSan stand-in for
 * Criterion (see criterion/criterion.h beside this file), each in a forked
 * process with a time limit, and ends with one "tsan: N passed, N failed"
 * line. Exit status 1 if any test failed or crashed.
 */
#define _GNU_SOURCE /* FNM_EXTMATCH */
#include "criterion/criterion.h"

#include <ctype.h>
#include <fnmatch.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
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

#define MAX_SUITES 64
static struct {
    const char *suite;
    struct tsan_suite_options o;
} suites[MAX_SUITES];
static size_t n_suites;
static void (*running_fini)(void); /* the running test's suite's */

void tsan_suite_register(const char *suite, struct tsan_suite_options o)
{
    if (n_suites == MAX_SUITES) {
        fprintf(stderr, "tsan runner: more than %d suites\n", MAX_SUITES);
        exit(2);
    }
    suites[n_suites].suite = suite;
    suites[n_suites++].o = o;
}

static void (*fini_of(const char *suite))(void)
{
    for (size_t i = 0; i < n_suites; i++)
        if (strcmp(suites[i].suite, suite) == 0)
            return suites[i].o.fini;
    return NULL;
}

static void run_fini(void)
{
    void (*fini)(void) = running_fini;
    running_fini = NULL; /* a failed assertion in fini ends it */
    if (fini != NULL)
        fini();
}

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
    if (fatal) {
        run_fini();
        _exit(1);
    }
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
        running_fini = fini_of(t->suite);
        t->fn();
        run_fini();
        fflush(NULL);
        _exit(expect_failed ? 1 : 0);
    }
    return pid;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static bool report(const struct test *t, int status, double seconds)
{
    bool passed = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM)
        fprintf(stderr, "[----] %s::%s: still running after %d s\n",
                t->suite, t->name, TEST_TIMEOUT_S);
    else if (WIFSIGNALED(status))
        fprintf(stderr, "[----] %s::%s: crashed with signal %d\n", t->suite,
                t->name, WTERMSIG(status));
    printf("[%s] %s::%s (%.1f s)\n", passed ? "PASS" : "FAIL", t->suite,
           t->name, seconds);
    fflush(stdout);
    return passed;
}

/* How many tests run at once: RL_TEST_JOBS (make's TEST_JOBS), else
 * JOBS_DEFAULT. The tests in tests/run-alone.txt never share the machine:
 * they run first, one at a time, and the others after them, that many at
 * a time. Two at a time with that list passed all 250 tests twice on a
 * shared 2-core machine, in 234 s and 233 s against 397 s one at a time
 * (TEST_JOBS=1). */
#define JOBS_DEFAULT 2
static long jobs(void)
{
    const char *env = getenv("RL_TEST_JOBS");
    if (env == NULL || *env == '\0')
        return JOBS_DEFAULT;
    char *end;
    long n = strtol(env, &end, 10);
    if (*end != '\0' || n < 1) {
        fprintf(stderr, "tsan runner: RL_TEST_JOBS must be a positive "
                "number, not '%s'\n", env);
        exit(2);
    }
    return n > MAX_JOBS ? MAX_JOBS : n;
}

/* The tests that never share the machine (tests/run-alone.txt, named by
 * RL_TEST_ALONE): "suite/name" globs, read once. */
#define MAX_ALONE 128
static char *alone[MAX_ALONE];
static size_t n_alone;

static bool read_alone(void)
{
    const char *path = getenv("RL_TEST_ALONE");
    FILE *f = path != NULL ? fopen(path, "r") : NULL;
    if (f == NULL) {
        fprintf(stderr, "tsan runner: cannot read RL_TEST_ALONE (%s)\n",
                path != NULL ? path : "unset");
        return false;
    }
    char line[512];
    bool ok = true;
    while (ok && fgets(line, sizeof line, f) != NULL) {
        line[strcspn(line, "#")] = '\0';
        size_t n = strlen(line);
        while (n > 0 && isspace((unsigned char)line[n - 1]))
            line[--n] = '\0';
        if (n == 0)
            continue;
        ok = n_alone < MAX_ALONE
             && (alone[n_alone++] = strdup(line)) != NULL;
        if (!ok)
            fprintf(stderr, "tsan runner: %s: over %d patterns\n", path,
                    MAX_ALONE);
    }
    fclose(f);
    return ok;
}

static bool runs_alone(const struct test *t)
{
    char full[512];
    snprintf(full, sizeof full, "%s/%s", t->suite, t->name);
    for (size_t i = 0; i < n_alone; i++)
        if (fnmatch(alone[i], full, FNM_EXTMATCH) == 0)
            return true;
    return false;
}

static bool selected(const struct test *t, const char *filter)
{
    char full[512];
    snprintf(full, sizeof full, "%s::%s", t->suite, t->name);
    return filter == NULL || strstr(full, filter) != NULL;
}

/* Runs the selected tests whose runs_alone() is `alone_ones`, up to `max`
 * at once, counting them in *passed and *failed. */
static bool run_tests(const char *filter, bool alone_ones, long max,
                      size_t *passed, size_t *failed)
{
    size_t next = 0;
    long running = 0;
    struct {
        pid_t pid;
        const struct test *t;
        double started;
    } slots[MAX_JOBS] = {{0}};
    for (;;) {
        while (running < max && next < n_tests) {
            const struct test *t = &tests[next++];
            if (!selected(t, filter) || runs_alone(t) != alone_ones)
                continue;
            pid_t pid = start_one(t);
            if (pid < 0) {
                (*failed)++;
                continue;
            }
            for (long i = 0; i < max; i++) {
                if (slots[i].pid == 0) {
                    slots[i].pid = pid;
                    slots[i].t = t;
                    slots[i].started = now_s();
                    break;
                }
            }
            running++;
        }
        if (running == 0)
            return true;
        int status;
        pid_t done = waitpid(-1, &status, 0);
        if (done < 0) {
            perror("tsan runner: waitpid");
            return false;
        }
        for (long i = 0; i < max; i++) {
            if (slots[i].pid != done)
                continue;
            if (report(slots[i].t, status, now_s() - slots[i].started))
                (*passed)++;
            else
                (*failed)++;
            slots[i].pid = 0;
            running--;
        }
    }
}

int main(int argc, char **argv)
{
    const char *filter = argc > 1 ? argv[1] : NULL;
    size_t passed = 0, failed = 0;
    long at_once = jobs();
    if (!read_alone())
        return 1;
    if (!run_tests(filter, true, 1, &passed, &failed)
        || !run_tests(filter, false, at_once, &passed, &failed))
        return 1;
    printf("tsan: %zu passed, %zu failed\n", passed, failed);
    return failed == 0 && passed > 0 ? 0 : 1;
}
