/*
 * rlctl_store.h: rlctl's blocking access to the store of a config: one
 * server, or a cluster (keys routed by slot from one CLUSTER SLOTS read),
 * authenticated as the config says. Private to rlctl.
 */
#ifndef RL_RLCTL_STORE_H
#define RL_RLCTL_STORE_H

#include "config.h"
#include "rlctl_conn.h"

#define RLCTL_PRIMARIES_MAX 64

typedef struct rlctl_store {
    const rl_store_config *cfg;
    rl_redis_tls *tls;                             /* store.tls, or NULL */
    rlctl_conn *primaries[RLCTL_PRIMARIES_MAX];   /* one server: [0] */
    rl_endpoint endpoints[RLCTL_PRIMARIES_MAX];
    int n;
    unsigned char slot_owner[16384];               /* cluster: index */
} rlctl_store;

/* Connects (and reads a cluster's slot map). On failure returns -1 with a
 * message that names the server and says what to check. */
int rlctl_store_open(rlctl_store *s, const rl_store_config *cfg, char *err,
                     size_t errlen);
void rlctl_store_close(rlctl_store *s);

/* The connection that serves key. */
rlctl_conn *rlctl_store_for_key(rlctl_store *s, const char *key,
                                size_t len);

/* Redis's clock in ms (TIME on the first primary); 0 on failure, with
 * the reason in err. */
unsigned long long rlctl_store_now_ms(rlctl_store *s, char *err,
                                      size_t errlen);

/* Why r, the reply to command on c, is not what was asked: the server's
 * own reason naming the command (a NOPERM from an ACL, say), else the
 * connection's. */
void rlctl_store_why(const rlctl_conn *c, const redisReply *r,
                     const char *command, char *err, size_t errlen);

#endif
