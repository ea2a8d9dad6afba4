/*
 * rls_http.h: rl-rls's HTTP endpoints, as upstream serves them: on
 * HOST:PORT, GET /healthcheck (200 "OK" while serving; 500 from SIGTERM
 * on, so that a load balancer drains the instance, and before a config
 * has loaded when HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED is set) and
 * /json (ShouldRateLimit in proto3 JSON, rls_json.h: 200 OK, 429
 * OVER_LIMIT, 400 for a body or a request upstream refuses, 413 over
 * RLS_HTTP_JSON_MAX bytes, 503 when the workers are stopped or full); on
 * DEBUG_HOST:DEBUG_PORT, GET /rlconfig (the loaded config, one line per
 * limit). Served by nng's HTTP server on its own threads, but for /json's
 * checks: a worker's loop (rls_worker_call) runs them.
 */
#ifndef RL_RLS_HTTP_H
#define RL_RLS_HTTP_H

#include "rls_runtime.h"
#include "rls_worker.h"

#include <nng/nng.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct rls_http rls_http;

typedef struct rls_http_config {
    const char *host;
    uint16_t port;
    const char *debug_host;
    uint16_t debug_port;
    rls_runtime *runtime;
    atomic_bool *draining;
    bool need_config;      /* HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED */
} rls_http_config;

/* rls_http_start serves both (c outlives the server): 0, or -1 with the
 * reason in err. */
int rls_http_start(rls_http **out, const rls_http_config *c, char *err,
                   size_t cap);
void rls_http_stop(rls_http *h);

/* rls_http_reply finishes an nng HTTP handler's aio with an answer:
 * status, its reason (the status line's words; NULL: nng's), the body
 * (copied) of Content-Type type; closing: the connection ends after it
 * (a body left unread). nng's error finishes the aio when the answer
 * cannot be made. */
void rls_http_reply(nng_aio *aio, uint16_t status, const char *reason,
                    const char *type, const char *body, size_t len,
                    bool closing);

/* rls_http_set_workers: /json's calls go to the n workers of w in turn
 * from now on; with n 0, none do (503). Returns once no call is being
 * handed to a worker set before. */
void rls_http_set_workers(rls_http *h, rls_worker *const *w, size_t n);

/* The bytes of a /json body at most: gRPC's message cap. */
#define RLS_HTTP_JSON_MAX RLS_H2_DEFAULT_MAX_MESSAGE

#endif
