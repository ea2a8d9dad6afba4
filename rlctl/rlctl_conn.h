/*
 * rlctl_conn.h: a blocking connection to one Redis server or sentinel for
 * rlctl, which runs one command and exits: rl's own connection
 * (common/redis_conn.c) on a loop of its own, run until each reply comes
 * or the deadline passes. Private to rlctl.
 */
#ifndef RL_RLCTL_CONN_H
#define RL_RLCTL_CONN_H

#include "address.h"
#include "redis_tls.h"

#include <hiredis/hiredis.h>

typedef struct rlctl_conn rlctl_conn;

/* Connects to ep (over TLS when tls is not NULL; it must outlive the
 * connection), waiting up to timeout_ms. NULL on failure, with why (a
 * certificate refused, say) in err. */
rlctl_conn *rlctl_conn_open(const rl_endpoint *ep, rl_redis_tls *tls,
                            unsigned timeout_ms, char *err, size_t errlen);

/* Sends a command of NUL-terminated arguments ending with NULL and waits
 * for its reply, which the caller frees with freeReplyObject. NULL when
 * none came (rlctl_conn_error says why); the connection is then closed
 * and every later command fails. */
redisReply *rlctl_command(rlctl_conn *c, const char *arg0, ...);

/* The same with argc arguments of the given lengths. */
redisReply *rlctl_command_argv(rlctl_conn *c, int argc, const char **argv,
                               const size_t *lens);

/* Why the last command had no reply. */
const char *rlctl_conn_error(const rlctl_conn *c);

void rlctl_conn_close(rlctl_conn *c);

#endif
