/*
 * rls_service.h: ShouldRateLimit, from a request's bytes to a response's.
 * Each descriptor's limit is found as envoyproxy/ratelimit finds it (the
 * config's tree, or the descriptor's own limit), then checked through one
 * rl rule (rl_check_rule_async) at that limit's rate, keyed by the domain
 * and the descriptor's entries; statuses come in the request's order, with
 * upstream's overall code, shadow modes, replaces, unlimited and RateLimit
 * headers. No I/O of its own: the caller's transport hands the bytes in
 * and takes the answer.
 *
 * Threads: a call runs on the thread of its agent's loop (a host-loop
 * agent's), where its checks answer; nothing here locks.
 */
#ifndef RL_RLS_SERVICE_H
#define RL_RLS_SERVICE_H

#include "rl.h"
#include "rls_config.h"
#include "rls_grpc.h"
#include "rls_holds.h"
#include "rls_metrics.h"
#include "rls_pool.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A call's settings; they (and their strings) outlive the calls. */
typedef struct rls_options {
    const char *rule;             /* the rl rule descriptors are checked by */
    /* The rule for a limit whose rl extension asks for a token bucket,
     * on_error: deny or mode: local (NULL: rule for every limit). */
    const char *(*rule_of)(const rls_limit *limit);
    bool shadow_mode;             /* SHADOW_MODE: the overall code is OK */
    bool quota_mode;              /* QUOTA_MODE: every limit a quota */
    /* STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT: each limit is read, then
     * counted only if none of the request's would go over, or if it would
     * itself (upstream's two steps; docs/envoy.md). */
    bool stop_increment_when_over;
    bool headers;                 /* LIMIT_RESPONSE_HEADERS_ENABLED */
    const char *limit_header;     /* their names */
    const char *remaining_header;
    const char *reset_header;
    /* USE_PROMETHEUS's counters (NULL: none), and NEAR_LIMIT_RATIO. */
    rls_metrics *metrics;
    float near_limit_ratio;
    /* The instance's holds, for descriptors with rl: {hold} (NULL: such
     * a descriptor is checked as one without). */
    rls_holds *holds;
} rls_options;

/* A call's answer: status OK with a RateLimitResponse's bytes (len), or
 * an error status with its message (upstream's words). Both are valid
 * only during the call. */
typedef void (*rls_reply_fn)(void *arg, rls_grpc_status status,
                             const uint8_t *msg, size_t len,
                             const char *message);

typedef struct rls_call rls_call;

/* Descriptors of one request at most: each is a check and a status. */
#define RLS_DESCRIPTORS_MAX 1024

/* rls_should_rate_limit starts one call of a RateLimitRequest's bytes
 * under cfg (NULL: none loaded; read only before it returns) and o. fn
 * runs exactly once, perhaps before it returns (an error, no
 * limit to check), unless the call is cancelled first. Returns the call
 * while its checks are out, NULL once fn has run. The call's memory comes
 * from pool, the pool of the agent's loop (where the call is freed). */
rls_call *rls_should_rate_limit(rl_agent *agent, rls_pool *pool,
                                const rls_config *cfg, const rls_options *o,
                                const uint8_t *msg, size_t len,
                                rls_reply_fn fn, void *arg);

/* rls_call_cancel: fn will not run (the client went away); the call is
 * freed once its checks have answered. */
void rls_call_cancel(rls_call *c);

/* rls_call_expire answers the call now: its deadline (the client's
 * grpc-timeout) is near. Descriptors whose checks have not answered are
 * decided by their on_error (allow by default, as Envoy fails open: OK,
 * their limit named, remaining its whole rate), and the answer asks
 * Envoy to add
 * RLS_DEGRADED_HEADER to the upstream request. The checks that answer
 * later are dropped; the call frees itself then. */
void rls_call_expire(rls_call *c);

/* The header a degraded answer adds to the upstream request: a check
 * whose store did not answer in time, or a call past its deadline. */
#define RLS_DEGRADED_HEADER "x-rl-degraded"

/* The rl value a descriptor is counted under: the domain and each entry's
 * key and value (a share_threshold pattern's in place of the value where
 * shared[i] is set), each as <length>:<bytes>, joined by ':'. Longer than
 * RLS_VALUE_MAX, the first bytes and a hash of the whole. Returns the
 * length written into out (RLS_VALUE_MAX + 1 bytes). */
#define RLS_VALUE_MAX 256
size_t rls_descriptor_value(const char *domain, const rls_entry *entries,
                            size_t n, const char *const *shared, char *out);

#endif
