/*
 * rls_metrics.c: rl-rls's Prometheus metrics (rls_metrics.h). The series
 * live in one open-addressing table of pointers, three times the cap in
 * slots so that probes stay short; a worker finds its series (or
 * publishes a new one) without a lock, and a scrape walks the slots.
 */
#include "rls_metrics.h"

#include "histogram.h"
#include "keys.h"
#include "log.h"
#include "nng_handoff.h"
#include "rls_http.h"

#include <nng/nng.h>
#include <nng/supplemental/http/http.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SLOTS 32768u /* a power of two, over 3 x RLS_METRICS_SERIES_MAX */

enum { HITS, OVER, NEAR, WITHIN, SHADOW, COUNTERS };

static const char *const counter_names[COUNTERS] = {
    "total_hits", "over_limit", "near_limit", "within_limit", "shadow_mode"};

static const char *const counter_help[COUNTERS] = {
    "Hits on the limit.", "Hits over the limit.",
    "Hits within the limit past NEAR_LIMIT_RATIO of it.",
    "Hits within the limit.", "Hits over a shadow_mode limit (let through)."};

struct rls_series {
    atomic_uint_least64_t n[COUNTERS];
    uint64_t hash;
    size_t len;
    char labels[];
};

struct rls_metrics {
    _Atomic(rls_series *) *slots;
    atomic_size_t n_series;    /* made, the overflow series not counted */
    atomic_bool warned;
    rls_series *overflow;
    atomic_uint_least64_t events[RLS_EV_N];
    atomic_uint_least64_t requests[RLS_METHOD_N];
    atomic_int_least64_t in_flight;
    rl_histogram_counts response_time[RLS_METHOD_N];
    const rl_logger *log;
    char url[300];             /* nng's, from PROMETHEUS_ADDR */
    char addr[208];
    char *path;
    nng_http_server *server;
};

static const char *const method_names[RLS_METHOD_N] = {"ShouldRateLimit",
                                                       "Check"};

static int url_of(const char *addr, char *url, size_t cap);

rls_metrics *rls_metrics_new(const rl_logger *log, const char *addr,
                             const char *path, char *err, size_t cap)
{
    char url[300];
    if (strlen(addr) > 200 || url_of(addr, url, sizeof url) != 0) {
        snprintf(err, cap, "PROMETHEUS_ADDR=\"%.200s\": not host:port "
                 "(\":9090\" for every address)", addr);
        return NULL;
    }
    if (path[0] != '/') {
        snprintf(err, cap, "PROMETHEUS_PATH=\"%.200s\": not a path "
                 "(\"/metrics\")", path);
        return NULL;
    }
    rls_metrics *m = calloc(1, sizeof *m);
    if (m != NULL) {
        m->slots = calloc(SLOTS, sizeof *m->slots);
        m->overflow = calloc(1, sizeof *m->overflow);
        m->path = strdup(path);
    }
    if (m == NULL || m->slots == NULL || m->overflow == NULL
        || m->path == NULL) {
        rls_metrics_free(m);
        snprintf(err, cap, "out of memory");
        return NULL;
    }
    snprintf(m->url, sizeof m->url, "%s", url);
    snprintf(m->addr, sizeof m->addr, "%s", addr);
    for (int i = 0; i < RLS_METHOD_N; i++)
        rl_histogram_counts_init(&m->response_time[i]);
    m->log = log;
    return m;
}

void rls_metrics_free(rls_metrics *m)
{
    if (m == NULL)
        return;
    if (m->server != NULL) {
        nng_http_server_stop(m->server);
        nng_http_server_release(m->server);
        rl_nng_handoff(m);
    }
    for (size_t i = 0; m->slots != NULL && i < SLOTS; i++)
        free(atomic_load(&m->slots[i]));
    free(m->slots);
    free(m->overflow);
    free(m->path);
    free(m);
}

/* --- Series ------------------------------------------------------------ */

static bool same(const rls_series *s, uint64_t h, const char *labels,
                 size_t len)
{
    return s->hash == h && s->len == len
           && memcmp(s->labels, labels, len) == 0;
}

static rls_series *overflow(rls_metrics *m)
{
    if (!atomic_exchange(&m->warned, true))
        rl_log(m->log, RL_LOG_WARN, "metrics_series_capped",
               "series=%d reason=\"more limits' label sets than the cap "
               "(detailed_metric or value_to_metric on request values?); "
               "new ones are counted under domain=\\\"\\\"\"",
               RLS_METRICS_SERIES_MAX);
    return m->overflow;
}

/* A new series, if the cap allows it; NULL for the overflow. */
static rls_series *make(rls_metrics *m, uint64_t h, const char *labels,
                        size_t len)
{
    if (atomic_fetch_add(&m->n_series, 1) >= RLS_METRICS_SERIES_MAX) {
        atomic_fetch_sub(&m->n_series, 1);
        return NULL;
    }
    rls_series *s = calloc(1, sizeof *s + len);
    if (s == NULL) {
        atomic_fetch_sub(&m->n_series, 1);
        return NULL;
    }
    s->hash = h;
    s->len = len;
    memcpy(s->labels, labels, len);
    return s;
}

rls_series *rls_metrics_series(rls_metrics *m, const char *labels,
                               size_t len)
{
    if (m == NULL)
        return NULL;
    if (len == 0)
        return m->overflow;
    uint64_t h = rl_key_hash_value(labels, len);
    rls_series *fresh = NULL;
    for (size_t i = h & (SLOTS - 1), probes = 0; probes < SLOTS;
         i = (i + 1) & (SLOTS - 1), probes++) {
        rls_series *s = atomic_load_explicit(&m->slots[i],
                                             memory_order_acquire);
        if (s == NULL) {
            if (fresh == NULL
                && (fresh = make(m, h, labels, len)) == NULL)
                return overflow(m);
            if (atomic_compare_exchange_strong_explicit(
                    &m->slots[i], &s, fresh, memory_order_acq_rel,
                    memory_order_acquire))
                return fresh;
            /* Another thread took the slot: s is its series. */
        }
        if (same(s, h, labels, len)) {
            if (fresh != NULL) {
                free(fresh);
                atomic_fetch_sub(&m->n_series, 1);
            }
            return s;
        }
    }
    /* Unreachable while SLOTS exceeds the cap. */
    free(fresh);
    return overflow(m);
}

void rls_series_count(rls_series *s, const rls_hits *h)
{
    if (s == NULL)
        return;
    const uint64_t add[COUNTERS] = {h->total, h->over, h->near, h->within,
                                    h->shadow};
    for (int i = 0; i < COUNTERS; i++) {
        if (add[i] > 0)
            atomic_fetch_add_explicit(&s->n[i], add[i],
                                      memory_order_relaxed);
    }
}

void rls_metrics_event(rls_metrics *m, rls_event e)
{
    if (m != NULL)
        atomic_fetch_add_explicit(&m->events[e], 1, memory_order_relaxed);
}

void rls_metrics_call_start(rls_metrics *m, rls_method method)
{
    if (m == NULL)
        return;
    atomic_fetch_add_explicit(&m->requests[method], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&m->in_flight, 1, memory_order_relaxed);
}

void rls_metrics_call_end(rls_metrics *m, rls_method method, uint64_t ns)
{
    if (m == NULL)
        return;
    atomic_fetch_sub_explicit(&m->in_flight, 1, memory_order_relaxed);
    rl_histogram_observe(&m->response_time[method], ns);
}

/* --- The page ---------------------------------------------------------- */

typedef struct page {
    char *s;
    size_t len, cap;
    bool failed;
} page;

static void put(page *p, const char *fmt, ...)
{
    if (p->failed)
        return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(p->s + p->len, p->cap - p->len, fmt, ap);
        va_end(ap);
        if (n < 0) {
            p->failed = true;
            return;
        }
        if ((size_t)n < p->cap - p->len) {
            p->len += (size_t)n;
            return;
        }
        size_t cap = p->cap * 2 > p->len + (size_t)n + 1
                         ? p->cap * 2
                         : p->len + (size_t)n + 1;
        char *s = realloc(p->s, cap);
        if (s == NULL) {
            p->failed = true;
            return;
        }
        p->s = s;
        p->cap = cap;
    }
}

/* A label's value as the format quotes it: \\, \" and \n escaped. */
static void put_value(page *p, const char *v, size_t len)
{
    size_t from = 0;
    for (size_t i = 0; i < len; i++) {
        const char *esc = v[i] == '\\' ? "\\\\" : v[i] == '"' ? "\\\""
                        : v[i] == '\n' ? "\\n" : NULL;
        if (esc != NULL) {
            put(p, "%.*s%s", (int)(i - from), v + from, esc);
            from = i + 1;
        }
    }
    put(p, "%.*s", (int)(len - from), v + from);
}

/* domain, key1 and key2 (if any) from a series' "domain.key1[.key2]";
 * the overflow series' "" is domain="", key1="". */
static void put_labels(page *p, const rls_series *s)
{
    static const char *const names[] = {"domain", "key1", "key2"};
    const char *at = s->labels, *end = s->labels + s->len;
    for (int i = 0; i < 3; i++) {
        const char *dot = memchr(at, '.', (size_t)(end - at));
        const char *stop = dot != NULL ? dot : end;
        put(p, "%s%s=\"", i > 0 ? "," : "", names[i]);
        put_value(p, at, (size_t)(stop - at));
        put(p, "\"");
        if (dot == NULL && i >= 1)
            break;
        at = dot != NULL ? dot + 1 : end;
    }
}

static void family(page *p, const char *name, const char *type,
                   const char *help)
{
    put(p, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void put_series(page *p, const rls_series *s, int counter,
                       bool *headed)
{
    uint64_t v = atomic_load_explicit(&s->n[counter], memory_order_relaxed);
    if (v == 0)
        return;
    if (!*headed) {
        put(p, "# HELP ratelimit_service_rate_limit_%s %s\n# TYPE "
            "ratelimit_service_rate_limit_%s counter\n",
            counter_names[counter], counter_help[counter],
            counter_names[counter]);
        *headed = true;
    }
    put(p, "ratelimit_service_rate_limit_%s{", counter_names[counter]);
    put_labels(p, s);
    put(p, "} %llu\n", (unsigned long long)v);
}

static void put_limits(page *p, rls_metrics *m)
{
    for (int c = 0; c < COUNTERS; c++) {
        bool headed = false;
        for (size_t i = 0; i < SLOTS; i++) {
            rls_series *s = atomic_load_explicit(&m->slots[i],
                                                 memory_order_acquire);
            if (s != NULL)
                put_series(p, s, c, &headed);
        }
        put_series(p, m->overflow, c, &headed);
    }
}

static uint64_t event(rls_metrics *m, rls_event e)
{
    return atomic_load_explicit(&m->events[e], memory_order_relaxed);
}

/* An upstream counter without labels (or with a fixed one), once not 0. */
static void put_upstream(page *p, const char *name, const char *label,
                         uint64_t v, const char *help)
{
    if (v == 0)
        return;
    family(p, name, "counter", help);
    put(p, "%s%s %llu\n", name, label, (unsigned long long)v);
}

/* A bound as a plain decimal, as rl's other pages write it. */
static void put_bound(page *p, double s)
{
    char buf[32];
    snprintf(buf, sizeof buf, "%.6f", s);
    char *end = buf + strlen(buf);
    while (end[-1] == '0')
        *--end = '\0';
    if (end[-1] == '.')
        end[-1] = '\0';
    put(p, "%s", buf);
}

static void put_response_times(page *p, rls_metrics *m)
{
    static const char name[] = "ratelimit_service_response_time_seconds";
    bool headed = false;
    for (int i = 0; i < RLS_METHOD_N; i++) {
        rl_histogram h;
        rl_histogram_read(&m->response_time[i], &h);
        if (h.count == 0)
            continue;
        if (!headed)
            family(p, name, "histogram", "gRPC calls' response times.");
        headed = true;
        for (int b = 0; b < RL_HISTOGRAM_BOUNDS; b++) {
            put(p, "%s_bucket{grpc_method=\"%s\",le=\"", name,
                method_names[i]);
            put_bound(p, h.le_s[b]);
            put(p, "\"} %llu\n", (unsigned long long)h.buckets[b]);
        }
        put(p, "%s_bucket{grpc_method=\"%s\",le=\"+Inf\"} %llu\n"
            "%s_sum{grpc_method=\"%s\"} %.9f\n"
            "%s_count{grpc_method=\"%s\"} %llu\n", name, method_names[i],
            (unsigned long long)h.count, name, method_names[i], h.sum_s,
            name, method_names[i], (unsigned long long)h.count);
    }
}

static void put_calls(page *p, rls_metrics *m)
{
    bool headed = false;
    for (int i = 0; i < RLS_METHOD_N; i++) {
        uint64_t v = atomic_load_explicit(&m->requests[i],
                                          memory_order_relaxed);
        if (v == 0)
            continue;
        if (!headed)
            family(p, "ratelimit_service_total_requests", "counter",
                   "gRPC calls received.");
        headed = true;
        put(p, "ratelimit_service_total_requests{grpc_method=\"%s\"} %llu\n",
            method_names[i], (unsigned long long)v);
    }
    put_response_times(p, m);
    put_upstream(p, "ratelimit_service_should_rate_limit_error",
                 "{err_type=\"service_error\"}",
                 event(m, RLS_EV_SERVICE_ERROR),
                 "Calls refused: no domain, no descriptor, no config.");
}

static void put_own(page *p, rls_metrics *m)
{
    family(p, "rl_rls_degraded_total", "counter",
           "Calls answered with a descriptor decided by its on_error: "
           "at the call's deadline, or for a check the store did not "
           "answer.");
    put(p, "rl_rls_degraded_total{reason=\"deadline\"} %llu\n"
        "rl_rls_degraded_total{reason=\"store\"} %llu\n",
        (unsigned long long)event(m, RLS_EV_DEGRADED_DEADLINE),
        (unsigned long long)event(m, RLS_EV_DEGRADED_STORE));
    family(p, "rl_rls_calls_in_flight", "gauge",
           "gRPC calls received and not answered yet.");
    put(p, "rl_rls_calls_in_flight %lld\n",
        (long long)atomic_load_explicit(&m->in_flight,
                                        memory_order_relaxed));
    family(p, "rl_rls_metric_series", "gauge",
           "Limits' label sets counted, of at most 10000 (the rest in "
           "domain=\"\").");
    put(p, "rl_rls_metric_series %zu\n", atomic_load(&m->n_series));
}

char *rls_metrics_text(rls_metrics *m, size_t *len)
{
    page p = {malloc(4096), 0, 4096, false};
    if (p.s == NULL)
        return NULL;
    put_limits(&p, m);
    put_upstream(&p, "ratelimit_service_config_load_success", "",
                 event(m, RLS_EV_CONFIG_LOAD_SUCCESS),
                 "Config loads that succeeded.");
    put_upstream(&p, "ratelimit_service_config_load_error", "",
                 event(m, RLS_EV_CONFIG_LOAD_ERROR),
                 "Config loads refused (the config before kept).");
    put_upstream(&p, "ratelimit_service_global_shadow_mode", "",
                 event(m, RLS_EV_GLOBAL_SHADOW_MODE),
                 "Calls over the limit answered OK by SHADOW_MODE.");
    put_calls(&p, m);
    put_own(&p, m);
    if (p.failed) {
        free(p.s);
        return NULL;
    }
    *len = p.len;
    return p.s;
}

/* --- Serving ----------------------------------------------------------- */

static void serve_page(nng_aio *aio)
{
    nng_http_handler *h = nng_aio_get_input(aio, 1);
    rls_metrics *m = nng_http_handler_get_data(h);
    rl_nng_handoff(m);
    size_t len = 0;
    char *text = rls_metrics_text(m, &len);
    /* After the last read of m: rls_metrics_free may follow a stop. */
    rl_nng_handoff(m);
    if (text == NULL) {
        nng_aio_finish(aio, NNG_ENOMEM);
        return;
    }
    rls_http_reply(aio, 200, NULL, "text/plain; version=0.0.4; charset=utf-8",
                   text, len, false);
    free(text);
}

/* Go's "host:port" (net.SplitHostPort): the host may be empty (every
 * address) or a bracketed IPv6 address; the port is a number. The nng
 * URL, or -1. */
static int url_of(const char *addr, char *url, size_t cap)
{
    const char *colon = strrchr(addr, ':');
    if (colon == NULL || colon[1] == '\0'
        || strspn(colon + 1, "0123456789") != strlen(colon + 1)
        || strlen(colon + 1) > 5 || atol(colon + 1) > 65535)
        return -1;
    size_t host_len = (size_t)(colon - addr);
    bool bracketed = host_len >= 2 && addr[0] == '['
                     && addr[host_len - 1] == ']';
    if (!bracketed && memchr(addr, ':', host_len) != NULL)
        return -1;
    if (memchr(addr, '[', host_len) != NULL && !bracketed)
        return -1;
    if (host_len == 0)
        snprintf(url, cap, "http://0.0.0.0%s", colon);
    else
        snprintf(url, cap, "http://%s", addr);
    return 0;
}

int rls_metrics_serve(rls_metrics *m, char *err, size_t cap)
{
    nng_url *u = NULL;
    nng_http_handler *h = NULL;
    rl_nng_handoff(m);
    int rv = nng_url_parse(&u, m->url);
    if (rv == 0)
        rv = nng_http_server_hold(&m->server, u);
    if (rv == 0)
        rv = nng_http_handler_alloc(&h, m->path, serve_page);
    if (rv == 0)
        rv = nng_http_handler_set_method(h, "GET");
    if (rv == 0)
        rv = nng_http_handler_set_data(h, m, NULL);
    if (rv == 0)
        rv = nng_http_server_add_handler(m->server, h);
    else if (h != NULL)
        nng_http_handler_free(h);
    if (rv == 0)
        rv = nng_http_server_start(m->server);
    nng_url_free(u);
    if (rv != 0) {
        snprintf(err, cap, "cannot serve metrics on PROMETHEUS_ADDR=%s: %s",
                 m->addr, nng_strerror(rv));
        return -1;
    }
    return 0;
}
