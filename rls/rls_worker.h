/*
 * rls_worker.h: one of rl-rls's event loops, on a thread of its own: a
 * gRPC server (rls_h2) on the shared port (SO_REUSEPORT: the kernel
 * spreads connections over the loops) and a host-loop agent that this
 * loop drives, so that a call's checks go to Redis from this thread with
 * no hop between threads. It serves ShouldRateLimit (rls_service) and
 * grpc.health.v1.Health/Check, and the calls other threads hand it
 * (rls_worker_call: /json's).
 *
 * Threads: rls_worker_start, _drain and _stop are called from the main
 * thread; rls_worker_call from any; the worker's own callbacks run on its
 * thread.
 */
#ifndef RL_RLS_WORKER_H
#define RL_RLS_WORKER_H

#include "rl.h"
#include "rls_h2.h"
#include "rls_runtime.h"
#include "rls_service.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

typedef struct rls_worker_config {
    const rl_config *rl;          /* the agents' rules and store */
    rls_runtime *runtime;         /* the descriptors' config */
    const rls_options *options;
    const char *host;
    uint16_t port;                /* 0: any (the first worker's, then its) */
    rls_h2_limits limits;
    rl_log_fn log;
    rl_log_level log_level;
    atomic_bool *draining;        /* set: Health answers NOT_SERVING */
    rls_metrics *metrics;         /* USE_PROMETHEUS's, or NULL */
    rls_tls_ctx *tls;             /* NULL: h2c; else TLS only, the
                                   * context shared by every worker */
} rls_worker_config;

typedef struct rls_worker rls_worker;

/* rls_worker_start starts a worker on wc (which outlives it) and returns
 * once it listens: 0, or -1 with the reason in err. */
int rls_worker_start(rls_worker **out, const rls_worker_config *wc,
                     char *err, size_t cap);

/* The port its server listens on. */
uint16_t rls_worker_port(const rls_worker *w);

/* rls_worker_drain: GOAWAY to every connection, no new ones; calls in
 * flight are answered. */
void rls_worker_drain(rls_worker *w);

/* rls_worker_call hands a ShouldRateLimit call (a RateLimitRequest's
 * bytes, copied) to w's loop: fn runs there once with the answer, as
 * rls_should_rate_limit's, even if w stops first. Returns 0, or
 * -1 when RLS_WORKER_CALLS_MAX of these calls wait on w already or w has
 * stopped taking them: fn will not run. Not after rls_worker_stop. */
#define RLS_WORKER_CALLS_MAX 1024
int rls_worker_call(rls_worker *w, const uint8_t *msg, size_t len,
                    rls_reply_fn fn, void *arg);

/* Whether a drain is over: no connection left, no handed call waiting. */
bool rls_worker_drained(const rls_worker *w);

/* rls_worker_stop closes the server and the agent (its last calls
 * answered by on_error), ends the thread and frees the worker. */
void rls_worker_stop(rls_worker *w);

#endif
