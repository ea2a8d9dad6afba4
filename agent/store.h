/*
 * store.h: the agent's connection to one Redis server, on the agent's I/O
 * thread: connect, authenticate, load the bucket scripts, send bucket calls
 * pipelined, reconnect with backoff. Private to librl; every function here
 * runs on the I/O thread only.
 */
#ifndef RL_AGENT_STORE_H
#define RL_AGENT_STORE_H

#include "config.h"
#include "log.h"

#include <stdint.h>
#include <uv.h>

/* A bucket script's answer. */
typedef struct rl_bucket_reply {
    bool allowed;
    uint64_t remaining; /* whole tokens left */
    int64_t retry_ms;   /* 0 when allowed, -1 when the cost can never pass */
    uint64_t reset_ms;  /* until the bucket is full */
} rl_bucket_reply;

/* The fixed arguments of a rule's calls, formatted once. */
typedef struct rl_bucket_args {
    rl_algorithm algorithm;
    char burst[24];
    char limit[24];
    char period[24];
} rl_bucket_args;

/* Called exactly once for every rl_store_call: with the reply, or with
 * reply NULL and a reason when the store could not answer (unreachable,
 * connection lost, an error reply, the store closed). */
typedef void (*rl_store_fn)(void *arg, const rl_bucket_reply *reply,
                            const char *error);

typedef struct rl_store rl_store;

/* rl_store_new starts connecting to the store of cfg (its first node) on
 * loop. Returns NULL when out of memory. */
rl_store *rl_store_new(uv_loop_t *loop, const rl_store_config *cfg,
                       const rl_logger *log);

/* rl_store_call runs a bucket script on key with cost (negative: a refund)
 * and calls fn with the answer. Calls made while the store is connecting
 * wait for it; calls made while it is known to be down fail at once. */
void rl_store_call(rl_store *s, const rl_bucket_args *args, const char *key,
                   size_t key_len, int64_t cost, rl_store_fn fn, void *arg);

/* rl_store_close fails every call not yet answered, disconnects, and frees
 * the store once its libuv handles are closed (the loop must keep running
 * until then). */
void rl_store_close(rl_store *s);

#endif
