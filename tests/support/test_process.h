/*
 * test_process.h: rl's programs (rl-aggregator, rl-gateway) run by tests as
 * their own processes, the way they run in production, with stderr in a
 * log file that a failing test prints.
 */
#ifndef RL_TEST_PROCESS_H
#define RL_TEST_PROCESS_H

#include <stddef.h>
#include <sys/types.h>

/* Starts argv[0] with argv, stderr appended to log; it dies with the test
 * (PR_SET_PDEATHSIG). The log must be in RL_TEST_LOGDIR (see
 * test_log_path), which run-tests.sh scans for sanitizer reports after the
 * run: a daemon's report fails the run even when no test notices. */
pid_t test_spawn(char *const argv[], const char *log);

/* A log path in RL_TEST_LOGDIR, unique to this process: what, pid and a
 * serial number ("aggregator-1234-2.log"). */
const char *test_log_path(char *buf, size_t cap, const char *what);

/* Waits until the log holds what (a grep pattern), or fails the test with
 * the log's last lines if the process exits or timeout_ms passes. *pid is
 * set to 0 if the process exited. */
void test_wait_for_log(pid_t *pid, const char *log, const char *what,
                       int timeout_ms);

/* The same in what the log gained after its first `from` bytes: a
 * process started again appends to the log of its last run. */
void test_wait_for_log_from(pid_t *pid, const char *log, long from,
                            const char *what, int timeout_ms);

/* The same until at least `lines` lines there hold what. */
void test_wait_for_log_lines(pid_t *pid, const char *log, long from,
                             const char *what, int lines, int timeout_ms);

/* The log's size in bytes, 0 if there is none yet. */
long test_log_size(const char *log);

/* SIGTERM, then waits up to timeout_ms for a clean exit (status 0); fails
 * the test with the log's last lines otherwise (a process still running is
 * killed). */
void test_stop(pid_t pid, const char *log, int timeout_ms);

/* Prints the last lines of a log on stderr: CI keeps only what a run
 * printed. */
void test_show_log(const char *log);

#endif
