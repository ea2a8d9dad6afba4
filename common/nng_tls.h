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
#include <stddef.h>

/* Reads and parses tls's files as rl_nng_dial does for a tls+tcp:// URL
 * (the CA; the agent's certificate and key when it has them), then lets
 * them go. Returns 0, or -1 with a message naming the file. nng starts its
 * threads in the calling process (rl.h, rl_config_check). */
int rl_nng_tls_check(const rl_tls_config *tls, char *err, size_t errlen);

/* Dials url from s (in the background: a peer that is not up yet is
 * retried by nng). Returns 0, or -1 with a message. */
int rl_nng_dial(nng_socket s, const char *url, const rl_tls_config *tls,
                char *err, size_t errlen);

/* Listens on url. Returns 0, or -1 with a message. */
int rl_nng_listen(nng_socket s, const char *url, const rl_tls_config *tls,
                  char *err, size_t errlen);

/* Why dialing a URL fails. nng's dialer retries in the background and
 * keeps the reason to itself, so an aggregator whose certificate an agent
 * refuses would look like one that is down. A probe dials the URL once,
 * with the same TLS settings as rl_nng_dial, and waits for the peer's first
 * bytes (its SP header, which comes after the TLS handshake). */
typedef struct rl_nng_probe rl_nng_probe;

/* done(arg, result) is called on an nng thread once a started probe ends:
 * result 0 (the peer answered) or an nng error (NNG_ECRYPTO or
 * NNG_EPEERAUTH for a certificate refused, NNG_ECONNREFUSED, ...). Returns
 * NULL with a message, or for a URL nng cannot dial as a stream
 * (inproc://). */
rl_nng_probe *rl_nng_probe_new(const char *url, const rl_tls_config *tls,
                               void (*done)(void *arg, int result),
                               void *arg, char *err, size_t errlen);

/* Starts the probe, which gives up after timeout_ms. One at a time: start
 * it again only after done was called and rl_nng_probe_reset. */
void rl_nng_probe_start(rl_nng_probe *p, int timeout_ms);

/* Closes what the last probe opened. Not from done. */
void rl_nng_probe_reset(rl_nng_probe *p);

/* Stops a probe under way (done may run, with an error) and frees it.
 * NULL is a no-op. */
void rl_nng_probe_free(rl_nng_probe *p);

/* Whether a probe's result is a certificate refused, by either side: a
 * configuration to fix (logged as an error), not an outage. */
bool rl_nng_probe_tls_refused(int result);

#endif
