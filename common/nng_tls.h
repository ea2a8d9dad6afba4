/*
 * nng_tls.h: dialing and listening for rl's nng sockets: plain for tcp://
 * and ipc:// URLs, with the config's TLS settings (aggregator.tls) for
 * tls+tcp://. Private to rl.
 */
#ifndef RL_COMMON_NNG_TLS_H
#define RL_COMMON_NNG_TLS_H

#include "config.h"

#include <nng/nng.h>
#include <stdbool.h>

/* Dials url from s (in the background: a peer that is not up yet is
 * retried by nng). Returns 0, or -1 with a message. */
int rl_nng_dial(nng_socket s, const char *url, const rl_tls_config *tls,
                char *err, size_t errlen);

/* Listens on url. Returns 0, or -1 with a message. */
int rl_nng_listen(nng_socket s, const char *url, const rl_tls_config *tls,
                  char *err, size_t errlen);

#endif
