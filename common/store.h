/*
 * store.h: a connection to one Redis server, on a libuv loop: connect,
 * authenticate, load a set of Lua scripts (as a function library on Redis
 * 7+, or for EVALSHA), run them pipelined, reconnect with backoff, and keep
 * an estimate of Redis's clock. Used by the agent (bucket scripts) and the
 * aggregator (window counts). Private to rl; every function here runs on
 * the loop's thread only.
 */
#ifndef RL_COMMON_STORE_H
#define RL_COMMON_STORE_H

#include "config.h"
#include "log.h"

#include <hiredis/hiredis.h>
#include <stdint.h>
#include <uv.h>

#define RL_STORE_SCRIPTS_MAX 8

/* The scripts a store loads on every connection. functions[i] is the name
 * under which library registers script i; sources[i] is the same script
 * stand-alone, for SCRIPT LOAD and EVALSHA. */
typedef struct rl_script_set {
    const char *library;
    const char *const *functions;
    const char *const *sources;
    int n;
} rl_script_set;

/* Called exactly once for every rl_store_run: with the reply, or with
 * reply NULL and a reason when the store could not answer (unreachable,
 * connection lost, an error reply, the store closed). The reply is valid
 * only during the call. */
typedef void (*rl_store_fn)(void *arg, const redisReply *reply,
                            const char *error);

typedef struct rl_store rl_store;

/* rl_store_new starts connecting to the store of cfg (its first node) on
 * loop. cfg, scripts and log must outlive the store. NULL when out of
 * memory. */
rl_store *rl_store_new(uv_loop_t *loop, const rl_store_config *cfg,
                       const rl_script_set *scripts, const rl_logger *log);

/* rl_store_run runs script with argv (numkeys, the keys, the arguments;
 * lens gives each one's length) and calls fn with the answer. Calls made
 * while the store is connecting wait for it; calls made while it is known to
 * be down fail at once. */
void rl_store_run(rl_store *s, int script, int argc, const char *const *argv,
                  const size_t *lens, rl_store_fn fn, void *arg);

/* rl_store_up says whether the store is connected with its scripts loaded. */
bool rl_store_up(const rl_store *s);

/* rl_store_now_ms estimates Redis's clock (TIME) in ms: read at every
 * connection and every few seconds since, advanced by the loop's monotonic
 * clock in between. 0 until it was first read. */
uint64_t rl_store_now_ms(const rl_store *s);

/* rl_store_close fails every call not yet answered, disconnects, and frees
 * the store once its libuv handles are closed (the loop must keep running
 * until then). */
void rl_store_close(rl_store *s);

#endif
