/*
 * sentinel.h: the primary of a Redis Sentinel setup (store.sentinel),
 * found by asking the sentinels in turn, and word from them when it
 * moves. node.c asks before every connection, so a node follows a
 * failover by reconnecting. Private to rl; every function here runs on
 * the loop's thread only.
 */
#ifndef RL_COMMON_SENTINEL_H
#define RL_COMMON_SENTINEL_H

#include "config.h"
#include "log.h"
#include "redis_tls.h"

#include <uv.h>

typedef struct rl_sentinel rl_sentinel;

/* The primary's address, or primary NULL and why no sentinel named one. */
typedef void (*rl_sentinel_found_fn)(void *arg, const rl_endpoint *primary,
                                     const char *error);

/* A sentinel announced that the master moved (+switch-master). */
typedef void (*rl_sentinel_moved_fn)(void *arg);

/* rl_sentinel_new watches cfg->sentinel's master for moves (one
 * subscription, to one sentinel at a time) and calls moved on each. The
 * sentinels are spoken to over TLS when tls is not NULL, as the store is.
 * cfg, tls and log must outlive it. NULL when out of memory. */
rl_sentinel *rl_sentinel_new(uv_loop_t *loop, const rl_store_config *cfg,
                             rl_redis_tls *tls, const rl_logger *log, rl_sentinel_moved_fn moved,
                             void *arg);

/* Asks the sentinels, from the one that answered last, for the master's
 * address; each has RL_SENTINEL_ASK_MS to answer. fn is called once, on
 * the loop's thread, never from inside this call. One ask at a time: a
 * second replaces the first, whose fn is then not called. */
#define RL_SENTINEL_ASK_MS 500
void rl_sentinel_locate(rl_sentinel *s, rl_sentinel_found_fn fn, void *arg);

/* Stops asking and watching; no callback is called after it. */
void rl_sentinel_close(rl_sentinel *s);

#endif
