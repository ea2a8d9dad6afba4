/*
 * test_env.h: what the runner (with-redis) and the Makefile hand to tests
 * through the environment, with Criterion assertions when it is missing.
 */
#ifndef RL_TEST_ENV_H
#define RL_TEST_ENV_H

#include <hiredis/hiredis.h>
#include <stddef.h>
#include <stdint.h>

/* test_env returns the variable's value; the test fails when it is unset,
 * with a message saying to run the tests through make test. */
const char *test_env(const char *name);

/* test_redis_connect connects to the address in RL_TEST_REDIS (or any
 * "host:port" given). The test fails if that is not possible. */
redisContext *test_redis_connect(const char *addr);

/* test_redis_connect_holding connects to the server of store (host:port,
 * or a cluster's seeds separated by commas) that serves key: on a cluster
 * the primary of its slot (the other nodes answer MOVED). NULL if none
 * does. It asserts nothing, so that a test's threads may call it too. */
redisContext *test_redis_connect_holding(const char *store, const char *key);

/* test_redis_command runs one command and fails the test on a NULL reply
 * (a lost connection). The caller frees the reply. */
redisReply *test_redis_command(redisContext *c, const char *fmt, ...);

/* test_redis_calls is how many times the server at addr ran command
 * (lower case, as INFO commandstats names it: "fcall", "evalsha"), 0 if
 * never. */
long long test_redis_calls(const char *addr, const char *command);
/* And the µs each call took on average, by Redis's clock. */
double test_redis_usec_per_call(const char *addr, const char *command);

/* test_redis_time_ms is Redis's clock (TIME) in ms, on the connection c. */
uint64_t test_redis_time_ms(redisContext *c);

/* test_run runs a shell command, puts what it printed (stdout and stderr)
 * in out, and returns its exit status (-1 if it did not exit). */
int test_run(const char *cmd, char *out, size_t cap);

/* test_rlctl runs RL_TEST_RLCTL with --config cfg and the arguments
 * (printf-style), stdin closed, like test_run. */
int test_rlctl(char *out, size_t cap, const char *cfg, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* test_redis_pttl is PTTL key on the Redis at addr (NULL: RL_TEST_REDIS):
 * ms until it expires, -2 when there is no such key. */
long long test_redis_pttl(const char *addr, const char *key);

/* test_write_config writes yaml to NAME-PID.yaml in RL_TEST_TMPDIR and
 * returns its path, valid until the eighth call after. */
const char *test_write_config(const char *name, const char *yaml);

/* test_store_config writes a config of the given rules (YAML lines under
 * "rules:") on the shared test Redis (RL_TEST_REDIS), with a deadline of
 * a second, as test_write_config does, and returns its path. */
const char *test_store_config(const char *name, const char *rules);

/* test_silent_store listens on a free loopback port (written to port) and
 * never accepts: connections succeed (the kernel's backlog) and nothing is
 * ever answered, a "Redis" checks wait on until their deadline. The caller
 * closes the descriptor it returns. */
int test_silent_store(uint16_t *port);

/* test_path joins a directory from the environment and a file name. */
const char *test_path(char *buf, size_t cap, const char *env_dir,
                      const char *file);

#endif
