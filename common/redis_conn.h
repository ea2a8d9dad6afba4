/*
 * redis_conn.h: one connection to a Redis server (or a sentinel) on a libuv
 * loop, with rl's own socket: the name resolved without blocking the loop,
 * commands written to an output buffer that goes out once per turn of the
 * loop (so that everything queued in one turn shares one write), replies
 * parsed by hiredis's redisReader and handed over in order. It knows
 * nothing of what the commands mean: node.c and sentinel.c pair replies
 * with what they sent. Private to rl; every function here runs on the
 * loop's thread only.
 */
#ifndef RL_COMMON_REDIS_CONN_H
#define RL_COMMON_REDIS_CONN_H

#include "address.h"
#include "redis_tls.h"

#include <hiredis/hiredis.h>
#include <stdbool.h>
#include <stddef.h>
#include <uv.h>

typedef struct rl_redis_conn rl_redis_conn;

/* What a connection tells its owner, on the loop's thread. */
typedef struct rl_redis_conn_events {
    /* The connection is up: commands written before now go out. */
    void (*connected)(void *arg);
    /* The next reply, in the order of the commands. The owner takes r:
     * it frees it with freeReplyObject, now or later. */
    void (*reply)(void *arg, redisReply *r);
    /* The connection failed or was lost (why says how: the socket's error,
     * the server closed it, a protocol error). Called once; nothing is
     * called after it. The owner still closes the connection. */
    void (*lost)(void *arg, const char *why);
} rl_redis_conn_events;

/* Starts connecting to ep, over TLS when tls is not NULL: the connection
 * is up (connected) once the handshake is done, and a refusal is lost
 * with its reason (redis_tls.h). tls, ev and arg must outlive the
 * connection. NULL when out of memory. */
rl_redis_conn *rl_redis_conn_open(uv_loop_t *loop, const rl_endpoint *ep,
                                  rl_redis_tls *tls,
                                  const rl_redis_conn_events *ev, void *arg);

/* Queues a command of argc arguments (lens gives each one's length). A
 * command queued before the connection is up waits for it. Returns 0, or
 * -1 when out of memory or when the connection was lost or closed. */
int rl_redis_conn_command(rl_redis_conn *c, int argc,
                          const char *const *argv, const size_t *lens);

/* The same, with NUL-terminated arguments ending with NULL. */
int rl_redis_conn_send(rl_redis_conn *c, const char *arg0, ...);

/* How the connection's TLS session began: "resumed" (from the last
 * connection's to the same server), "full" (a whole handshake), or "none"
 * (plain TCP). */
const char *rl_redis_conn_tls(const rl_redis_conn *c);

/* Whether the socket holds bytes (or an end, or an error) not yet read:
 * the loop reads them in its next poll. A stall is judged only when it
 * holds none: a loop held up (a host's long callback, a starved process)
 * has replies waiting that its timers run before. */
bool rl_redis_conn_input_waiting(const rl_redis_conn *c);

/* Closes the connection: no callback is called after this, not even from
 * inside one that is running. The memory goes once libuv lets go of its
 * handles (the loop must keep running until then). NULL is a no-op. */
void rl_redis_conn_close(rl_redis_conn *c);

#endif
