/*
 * node.h: a connection to one Redis server, on a libuv loop: connect,
 * authenticate, load a set of Lua scripts (as a function library on Redis
 * 7+, or for EVALSHA), run them pipelined, reconnect with backoff, and keep
 * an estimate of Redis's clock. common/store.c builds the store of a config
 * from nodes: one for a single server, one per primary for a cluster.
 * Private to rl; every function here runs on the loop's thread only.
 */
#ifndef RL_COMMON_NODE_H
#define RL_COMMON_NODE_H

#include "config.h"
#include "log.h"
#include "redis_tls.h"

#include <hiredis/hiredis.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <uv.h>

#define RL_STORE_SCRIPTS_MAX 8
/* rl_node_run's script for a plain command: argv[0] is the command. */
#define RL_NODE_RAW (-1)
/* The same for a command that writes a count (a fixed window's INCRBY):
 * with store.wait_replicas its answer waits for WAIT, as a script's. */
#define RL_NODE_RAW_WRITE (-2)

/* The scripts a node loads on every connection. functions[i] is the name
 * under which library registers script i; sources[i] is the same script
 * stand-alone, for SCRIPT LOAD and EVALSHA. */
typedef struct rl_script_set {
    const char *library;
    const char *const *functions;
    const char *const *sources;
    int n;
} rl_script_set;

/* Called exactly once for every rl_node_run: with the reply, or with reply
 * NULL and a reason when the node could not answer (unreachable, connection
 * lost, an error reply, closed). An error reply's text is the reason, as
 * Redis wrote it ("MOVED 3999 127.0.0.1:6381"). The reply is valid only
 * during the call. */
typedef void (*rl_node_fn)(void *arg, const redisReply *reply,
                           const char *error);

/* How a store's nodes count their batches: turn is advanced once per turn
 * of the loop (by the store); a node writing in a turn counts one batch,
 * and the first node to write in a turn counts the turn. Read from other
 * threads (stats), hence atomics. */
#define RL_SHARDS_MAX 64

/* One node's share of the batches, for stats read from other threads. */
typedef struct rl_shard_slot {
    char addr[64];                 /* host:port, set once under the lock */
    atomic_uint_least64_t batches;
    atomic_uint_least64_t commands;
} rl_shard_slot;

typedef struct rl_node_batches {
    uint64_t turn;
    uint64_t counted_turn;
    atomic_uint_least64_t batches;
    atomic_uint_least64_t turns;
    pthread_mutex_t lock;          /* over n_shards and slot addresses */
    rl_shard_slot shards[RL_SHARDS_MAX];
    int n_shards;
} rl_node_batches;

void rl_node_batches_init(rl_node_batches *b);
void rl_node_batches_fini(rl_node_batches *b);
/* The slot of ep (made on first use); -1 past RL_SHARDS_MAX nodes. */
int rl_node_batches_slot(rl_node_batches *b, const rl_endpoint *ep);


typedef struct rl_node rl_node;

/* rl_node_new starts connecting to ep on loop, with cfg's credentials,
 * database and timeouts, over TLS when tls is not NULL (made from
 * cfg->tls). scripts NULL: a node for plain commands only. cfg, tls,
 * scripts, batches (may be NULL) and log must outlive the node. NULL when
 * out of memory. */
rl_node *rl_node_new(uv_loop_t *loop, const rl_store_config *cfg,
                     rl_redis_tls *tls, const rl_endpoint *ep, const rl_script_set *scripts,
                     rl_node_batches *batches, const rl_logger *log);

/* rl_node_run runs script (or, with RL_NODE_RAW, the command argv[0]) with
 * argv (for a script: numkeys, the keys, the arguments; lens gives each
 * one's length) and calls fn with the answer; asking sends ASKING first on
 * the same connection. Calls made while the node is connecting wait for
 * it; calls made while it is known to be down fail at once. */
void rl_node_run(rl_node *n, int script, bool asking, int argc,
                 const char *const *argv, const size_t *lens, rl_node_fn fn,
                 void *arg);

/* Whether the node is connected with its scripts loaded. */
bool rl_node_up(const rl_node *n);

/* rl_node_now_ms estimates Redis's clock (TIME) in ms: read at every
 * connection and every few seconds since, advanced by the loop's monotonic
 * clock in between. 0 until it was first read. */
uint64_t rl_node_now_ms(const rl_node *n);

const rl_endpoint *rl_node_endpoint(const rl_node *n);
size_t rl_node_in_flight(const rl_node *n);

/* rl_node_close fails every call not yet answered, disconnects, and frees
 * the node once its libuv handles are closed (the loop must keep running
 * until then). */
void rl_node_close(rl_node *n);

#endif
