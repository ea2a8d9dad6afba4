/*
 * rls_metrics.h: rl-rls's Prometheus metrics (USE_PROMETHEUS), under the
 * names envoyproxy/ratelimit's default mapper gives its statsd counters:
 * ratelimit_service_rate_limit_{total_hits,over_limit,near_limit,
 * within_limit,shadow_mode}{domain,key1[,key2]} per limit
 * (rls_stat_key.h), the config loads, the calls and their errors; and
 * rl's own (rl_rls_*): answers decided by on_error, calls in flight.
 * Served as text on PROMETHEUS_ADDR at PROMETHEUS_PATH by nng's HTTP
 * server, on its own threads.
 *
 * Series: one per label set, made at its first hit and kept; at most
 * RLS_METRICS_SERIES_MAX, past which a new label set is counted in one
 * overflow series (domain="", key1="": no domain is empty) and a warning
 * is logged once, so that request values (detailed_metric) never make
 * memory without bound. An upstream counter appears once it is not 0, as
 * upstream's exporter learns of it from its first non-zero flush.
 *
 * Threads: every function but _new, _free and _serve is thread-safe and
 * takes no lock: counters are relaxed atomics, a series
 * is published once into its slot (compare-and-swap) and never moved or
 * freed while the metrics live. A NULL rls_metrics or rls_series counts
 * nothing.
 */
#ifndef RL_RLS_METRICS_H
#define RL_RLS_METRICS_H

#include "log.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define RLS_METRICS_SERIES_MAX 10000

typedef struct rls_metrics rls_metrics;
typedef struct rls_series rls_series;

/* The hits one check adds to its limit's series. */
typedef struct rls_hits {
    uint64_t total, over, near, within, shadow;
} rls_hits;

/* Counts without labels, or with a fixed one. */
typedef enum rls_event {
    RLS_EV_CONFIG_LOAD_SUCCESS,
    RLS_EV_CONFIG_LOAD_ERROR,
    RLS_EV_SERVICE_ERROR,      /* a call refused in upstream's words */
    RLS_EV_GLOBAL_SHADOW_MODE, /* an OVER_LIMIT made OK by SHADOW_MODE */
    RLS_EV_DEGRADED_DEADLINE,  /* answered at its deadline, by on_error */
    RLS_EV_DEGRADED_STORE,     /* a check the store did not answer */
    RLS_EV_N
} rls_event;

/* The gRPC methods upstream counts (total_requests, response_time). */
typedef enum rls_method {
    RLS_METHOD_SHOULD_RATE_LIMIT,
    RLS_METHOD_HEALTH_CHECK,
    RLS_METHOD_N
} rls_method;

/* rls_metrics_new: empty metrics, to be served on addr (PROMETHEUS_ADDR:
 * "host:port", ":port" for every address, "[v6]:port") at path
 * (PROMETHEUS_PATH), logging the cap's warning to log (which outlives
 * them). NULL with the reason in err: an addr that is no address, a path
 * that is none, no memory. */
rls_metrics *rls_metrics_new(const rl_logger *log, const char *addr,
                             const char *path, char *err, size_t cap);

/* rls_metrics_free stops serving and frees everything: no thread may
 * count any more. NULL is a no-op. */
void rls_metrics_free(rls_metrics *m);

/* rls_metrics_series: the series of labels (rls_stat_labels' text, len
 * bytes), made at first use; past the cap, without memory, or for "",
 * the overflow series. */
rls_series *rls_metrics_series(rls_metrics *m, const char *labels,
                               size_t len);

void rls_series_count(rls_series *s, const rls_hits *h);

void rls_metrics_event(rls_metrics *m, rls_event e);

/* A call of method begins (in flight), and ends after ns. */
void rls_metrics_call_start(rls_metrics *m, rls_method method);
void rls_metrics_call_end(rls_metrics *m, rls_method method, uint64_t ns);

/* rls_metrics_text: the page, in Prometheus's text format 0.0.4. A string
 * to free (*len bytes), or NULL without memory. */
char *rls_metrics_text(rls_metrics *m, size_t *len);

/* rls_metrics_serve serves the page until rls_metrics_free: 0, or -1
 * with the reason in err. */
int rls_metrics_serve(rls_metrics *m, char *err, size_t cap);

#endif
