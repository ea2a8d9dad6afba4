/*
 * address.h: where a Redis server is: "host:port" and redis:// URLs.
 * Private to librl.
 */
#ifndef RL_COMMON_ADDRESS_H
#define RL_COMMON_ADDRESS_H

#include <stdbool.h>
#include <stdint.h>

#define RL_HOST_MAX 256
#define RL_REDIS_DEFAULT_PORT 6379

typedef struct rl_endpoint {
    char host[RL_HOST_MAX]; /* a name, an IPv4 address or a bare IPv6 one */
    uint16_t port;
} rl_endpoint;

/* rl_endpoint_parse reads "host:port" or "[ipv6]:port" (port 1-65535) into
 * *out. Returns RL_EINVAL and leaves *out untouched when the text is not one,
 * RL_ETOOLONG when the host is longer than RL_HOST_MAX - 1 bytes. */
int rl_endpoint_parse(const char *text, rl_endpoint *out);

/* rl_redis_url_parse reads "redis://host[:port][/db]", or "rediss://..."
 * for TLS (*tls set), (port defaults to 6379, db to 0, db at most
 * 1,000,000). Credentials in the URL are refused
 * (RL_EINVAL): they belong in the config's username/password fields, where
 * they are not logged with the URL. */
int rl_redis_url_parse(const char *url, rl_endpoint *out, unsigned *db,
                       bool *tls);

#endif
