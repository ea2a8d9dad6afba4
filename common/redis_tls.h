/*
 * redis_tls.h: TLS to Redis (rediss://, store.tls) with OpenSSL 3: one
 * client context per store config, made where the process can still say
 * no (rl_agent_open, the aggregator's start, rlctl), and a session kept
 * per server so that a reconnect resumes rather than redoes the handshake.
 * redis_conn.c runs each connection's TLS through memory BIOs, so that the
 * loop owns the socket. Private to rl.
 */
#ifndef RL_COMMON_REDIS_TLS_H
#define RL_COMMON_REDIS_TLS_H

#include "address.h"
#include "config.h"

#include <openssl/ssl.h>
#include <stddef.h>

typedef struct rl_redis_tls rl_redis_tls;

/* Reads cfg's CA, certificate and key into a client context (TLS 1.2 at
 * least). NULL on failure, with a message in err that names the field and
 * the file (e.g. "store.tls.key: cannot read '/etc/rl/k.key': Permission
 * denied"). where is the config's path to the block ("store.tls"). */
rl_redis_tls *rl_redis_tls_new(const rl_store_tls_config *cfg,
                               const char *where, char *err, size_t errlen);

/* A client session for a connection to ep (which must outlive it): the
 * name sent (SNI) and checked is cfg's server_name, else ep's host; the
 * last session with ep is offered for resumption. Reads from and writes
 * to memory BIOs. NULL when out of memory. Thread-safe. */
SSL *rl_redis_tls_client(rl_redis_tls *t, const rl_endpoint *ep);

/* Why an SSL call on ssl failed (its SSL_get_error was err): the
 * certificate the server showed and why it was refused, or the alert or
 * error OpenSSL reports ("tlsv13 alert certificate required" when the
 * server refused ours). */
void rl_redis_tls_why(const SSL *ssl, int err, char *out, size_t cap);

/* Whether a connection made with ssl resumed a session. */
int rl_redis_tls_resumed(const SSL *ssl);

void rl_redis_tls_free(rl_redis_tls *t);

#endif
