/*
 * test_rls.h: rl-rls as its own process, configured as an Envoy user
 * configures envoyproxy/ratelimit (the runtime layout, upstream's
 * environment variables), and called with a real gRPC client
 * (tests/support/rls_call.py, grpcio).
 */
#ifndef RL_TEST_RLS_H
#define RL_TEST_RLS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

typedef struct test_rls {
    pid_t pid;
    uint16_t grpc_port, http_port, debug_port;
    char root[256];       /* RUNTIME_ROOT; files go in root/rt/config */
    char log[600];
} test_rls;

/* Starts build/bin/rl-rls with limits (YAML) as config/limits.yaml, the
 * environment variables in env (NULL-terminated "NAME=value" strings,
 * after the test's own: the runtime layout, loopback ports, the test
 * Redis by REDIS_URL, REDIS_TIMEOUT=2s without rl_yaml) and, if rl_yaml
 * is not NULL, a --config file of that text; waits until it listens and
 * every worker's store is ready. */
void test_rls_start(test_rls *r, const char *limits, const char *rl_yaml,
                    const char *const *env);

/* test_rls_start with --workers n (test_rls_start's: 2). */
void test_rls_start_workers(test_rls *r, const char *limits,
                            const char *rl_yaml, const char *const *env,
                            int n);

/* Writes name (a path under root/rt/config) with text, atomically (a
 * rename), as a deploy would. */
void test_rls_write(test_rls *r, const char *name, const char *text);

/* Runs rls_call.py against it with the calls (JSON, NULL-terminated) and
 * returns its output's lines in out (cap bytes). */
void test_rls_call(test_rls *r, char *out, size_t cap, ...);

/* The same with rls_call.py's options first (NULL-terminated: "--ca",
 * path, ... for TLS). */
void test_rls_call_with(test_rls *r, const char *const *opts, char *out,
                        size_t cap, ...);

/* SIGTERM, and asserts a clean exit within 15 s. */
void test_rls_stop(test_rls *r);

#endif
