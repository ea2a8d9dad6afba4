/*
 * store.h: where rl keeps its counts: one Redis server, or a Redis Cluster
 * (store.cluster seeds). Calls are routed by their first key's hash slot to
 * the primary that serves it, through one connection per node
 * (common/node.c); the cluster's slot map comes from CLUSTER SLOTS, at
 * start and whenever a node answers MOVED or goes away. Private to rl;
 * every function here runs on the loop's thread only, except
 * rl_store_stats_read.
 */
#ifndef RL_COMMON_STORE_H
#define RL_COMMON_STORE_H

#include "node.h"

typedef rl_node_fn rl_store_fn;
typedef struct rl_store rl_store;

/* What a store has done, for tests and metrics. */
typedef struct rl_store_counters {
    rl_node_batches batches;        /* see node.h */
    atomic_uint_least64_t moved;    /* MOVED answers followed */
    atomic_uint_least64_t asked;    /* ASK answers followed */
    atomic_uint_least64_t retried;  /* TRYAGAIN / CLUSTERDOWN retries */
    atomic_uint_least64_t refreshes; /* slot maps read */
} rl_store_counters;

/* rl_store_new starts connecting to the store of cfg on loop, over TLS
 * when tls is not NULL (rl_redis_tls_new of cfg->tls, which the caller
 * makes where a refusal can still be returned, and owns). cfg, tls,
 * scripts, counters (may be NULL) and log must outlive the store. NULL
 * when out of memory. */
rl_store *rl_store_new(uv_loop_t *loop, const rl_store_config *cfg,
                       rl_redis_tls *tls, const rl_script_set *scripts,
                       rl_store_counters *counters, const rl_logger *log);

/* rl_store_run runs script with argv (numkeys, the keys, the arguments;
 * lens gives each one's length), or with RL_NODE_RAW(_WRITE) the command
 * argv[0] whose key is argv[1], on the node that serves the first key, and
 * calls fn exactly once with the answer. On a cluster every key of one call
 * must hash to the same slot (Redis refuses the call otherwise). MOVED and
 * ASK are followed, TRYAGAIN and CLUSTERDOWN retried for up to the store's
 * timeout_ms; a node known to be down fails the call at once. */
void rl_store_run(rl_store *s, int script, int argc, const char *const *argv,
                  const size_t *lens, rl_store_fn fn, void *arg);

/* Whether the store is a cluster (calls must keep to one slot). */
bool rl_store_is_cluster(const rl_store *s);

/* Whether every slot has a primary that is connected with its scripts
 * loaded (for one server: whether it is). */
bool rl_store_up(const rl_store *s);

/* Redis's clock in ms, estimated (see rl_node_now_ms); 0 until known. */
uint64_t rl_store_now_ms(const rl_store *s);

/* rl_store_close fails every call not yet answered and frees the store
 * once its handles are closed (the loop must keep running until then). */
void rl_store_close(rl_store *s);

#endif
