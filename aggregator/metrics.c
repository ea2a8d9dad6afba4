/*
 * metrics.c: rl-aggregator's Prometheus endpoint (aggregator.metrics, an
 * HTTP address: give a loopback one unless the scraper is elsewhere). The
 * counters live on the event loop; the loop renders them into text at
 * every publish (each sync interval) and nng's HTTP server hands out the
 * last text, so no counter is read from another thread.
 */
#include "aggregator.h"
#include "exchange.h"

#include "histogram.h"
#include "nng_handoff.h"
#include "prom_text.h"

#include <nng/supplemental/http/http.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct rl_metrics {
    nng_http_server *server;
    nng_http_handler *handler, *agents_handler;
    pthread_mutex_t lock;          /* over text and agents */
    char *text;
    size_t len;
    char *agents;                  /* /agents: one tab-separated line each */
    size_t agents_len;
    atomic_int connections;        /* on the reports socket, from nng */
    rl_histogram_counts redis_write;   /* per report */
    rl_histogram_counts broadcast_lag; /* per publish with totals in it */
} rl_metrics;

static void serve_text(nng_aio *aio, bool agents)
{
    nng_http_handler *h = nng_aio_get_input(aio, 1);
    rl_metrics *m = nng_http_handler_get_data(h);
    rl_nng_handoff(m);
    nng_http_res *res;
    if (nng_http_res_alloc(&res) != 0) {
        nng_aio_finish(aio, NNG_ENOMEM);
        return;
    }
    /* /agents is tab-separated lines, not the exposition format: a
     * scraper pointed at it by mistake should not parse it as metrics. */
    nng_http_res_set_header(res, "Content-Type",
                            agents ? "text/tab-separated-values"
                                   : "text/plain; version=0.0.4");
    pthread_mutex_lock(&m->lock);
    const char *body = agents ? m->agents : m->text;
    int rv = nng_http_res_copy_data(res, body != NULL ? body : "",
                                    agents ? m->agents_len : m->len);
    pthread_mutex_unlock(&m->lock);
    if (rv != 0) {
        nng_http_res_free(res);
        rl_nng_handoff(m);
        nng_aio_finish(aio, rv);
        return;
    }
    nng_aio_set_output(aio, 0, res);
    rl_nng_handoff(m); /* after the last access: the server may be stopped */
    nng_aio_finish(aio, 0);
}

static void serve_metrics(nng_aio *aio)
{
    serve_text(aio, false);
}

static void serve_agents(nng_aio *aio)
{
    serve_text(aio, true);
}

static void on_pipe(nng_pipe p, nng_pipe_ev ev, void *arg)
{
    rl_metrics *m = arg;
    (void)p;
    rl_nng_handoff(m);
    atomic_fetch_add(&m->connections, ev == NNG_PIPE_EV_ADD_POST ? 1 : -1);
    rl_nng_handoff(m);
}

int rl_metrics_start(rl_aggregator *agg, char *err, size_t errlen)
{
    const rl_aggregator_endpoint *c = agg->endpoint;
    if (!c->has_metrics)
        return 0;
    rl_metrics *m = calloc(1, sizeof *m);
    if (m == NULL) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    pthread_mutex_init(&m->lock, NULL);
    rl_histogram_counts_init(&m->redis_write);
    rl_histogram_counts_init(&m->broadcast_lag);
    agg->metrics = m;
    char url[RL_HOST_MAX + 32];
    snprintf(url, sizeof url, strchr(c->metrics.host, ':') ? "http://[%s]:%u"
                                                           : "http://%s:%u",
             c->metrics.host, c->metrics.port);
    nng_url *u = NULL;
    rl_nng_handoff(m); /* m is set up before nng's threads see it */
    int rv = nng_url_parse(&u, url);
    if (rv == 0)
        rv = nng_http_server_hold(&m->server, u);
    if (rv == 0)
        rv = nng_http_handler_alloc(&m->handler, "/metrics", serve_metrics);
    if (rv == 0)
        rv = nng_http_handler_set_data(m->handler, m, NULL);
    if (rv == 0)
        rv = nng_http_server_add_handler(m->server, m->handler);
    if (rv == 0)
        rv = nng_http_handler_alloc(&m->agents_handler, "/agents",
                                    serve_agents);
    if (rv == 0)
        rv = nng_http_handler_set_data(m->agents_handler, m, NULL);
    if (rv == 0)
        rv = nng_http_server_add_handler(m->server, m->agents_handler);
    if (rv == 0)
        rv = nng_http_server_start(m->server);
    nng_url_free(u);
    if (rv != 0) {
        snprintf(err, errlen, "cannot serve metrics on %s: %s", url,
                 nng_strerror(rv));
        return -1;
    }
    rl_nng_handoff(m);
    nng_pipe_notify(agg->reports, NNG_PIPE_EV_ADD_POST, on_pipe, m);
    nng_pipe_notify(agg->reports, NNG_PIPE_EV_REM_POST, on_pipe, m);
    rl_metrics_render(agg);
    rl_nng_handoff(m);
    return 0;
}

void rl_metrics_redis_latency(rl_aggregator *agg, uint64_t us)
{
    if (agg->metrics != NULL)
        rl_histogram_observe(&agg->metrics->redis_write, us * 1000);
}

void rl_metrics_broadcast_lag(rl_aggregator *agg, uint64_t ms)
{
    if (agg->metrics != NULL)
        rl_histogram_observe(&agg->metrics->broadcast_lag, ms * 1000000);
}

typedef struct text {
    char *data;
    size_t len, cap;
} text;

static void vput(text *t, const char *fmt, va_list args)
{
    for (;;) {
        va_list ap;
        va_copy(ap, args);
        int n = vsnprintf(t->data + t->len, t->cap - t->len, fmt, ap);
        va_end(ap);
        if (n < 0)
            return;
        if ((size_t)n < t->cap - t->len) {
            t->len += (size_t)n;
            return;
        }
        size_t cap = (t->cap + (size_t)n + 1) * 2;
        char *data = realloc(t->data, cap);
        if (data == NULL)
            return;
        t->data = data;
        t->cap = cap;
    }
}

static void put(text *t, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void put(text *t, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vput(t, fmt, ap);
    va_end(ap);
}

/* For rl_agents_render and prom_text.h. */
static void put_any(void *t, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vput(t, fmt, ap);
    va_end(ap);
}

static void family(text *t, const char *name, const char *type,
                   const char *help)
{
    rl_prom_family(put_any, t, name, type, help);
}

static void render_reports(text *t, const rl_aggregator *agg)
{
    const rl_aggregator_stats *s = &agg->stats;
    family(t, "rl_agg_reports_total", "counter",
           "Reports received, by what became of them.");
    put(t, "rl_agg_reports_total{result=\"applied\"} %llu\n"
        "rl_agg_reports_total{result=\"duplicate\"} %llu\n"
        "rl_agg_reports_total{result=\"retry\"} %llu\n"
        "rl_agg_reports_total{result=\"rejected\"} %llu\n",
        (unsigned long long)s->reports_applied,
        (unsigned long long)s->reports_duplicate,
        (unsigned long long)s->reports_retry,
        (unsigned long long)s->reports_rejected);
    family(t, "rl_agg_reports_rejected_total", "counter",
           "Reports refused, by reason.");
    static const char *const reasons[RL_REJECTS] = {
        "malformed", "unknown_rule", "out_of_memory", "too_many_agents",
        "ids_per_connection"};
    for (int i = 0; i < RL_REJECTS; i++)
        put(t, "rl_agg_reports_rejected_total{reason=\"%s\"} %llu\n",
            reasons[i], (unsigned long long)s->rejected_by[i]);
    family(t, "rl_agg_entries_applied_total", "counter",
           "(key, count) pairs added into Redis.");
    put(t, "rl_agg_entries_applied_total %llu\n",
        (unsigned long long)s->entries_applied);
    family(t, "rl_agg_redis_errors_total", "counter",
           "Reports Redis did not take (answered RETRY).");
    put(t, "rl_agg_redis_errors_total %llu\n",
        (unsigned long long)s->reports_retry);
}

static void render_state(text *t, const rl_aggregator *agg)
{
    const rl_metrics *m = agg->metrics;
    family(t, "rl_agg_agents_connected", "gauge",
           "Connections on the reports socket.");
    put(t, "rl_agg_agents_connected %d\n", atomic_load(&m->connections));
    family(t, "rl_agg_agents_known", "gauge",
           "Agents heard from in the last minute (at most max_agents).");
    put(t, "rl_agg_agents_known %zu\n", rl_agents_count(agg));
    family(t, "rl_agg_keys", "gauge",
           "Client keys with totals waiting for the next broadcast.");
    put(t, "rl_agg_keys %zu\n", rl_broadcast_keys(agg));
    family(t, "rl_agg_pending_reports", "gauge",
           "Reports sent to Redis and not answered yet.");
    put(t, "rl_agg_pending_reports %d\n", agg->in_flight);
    family(t, "rl_agg_totals_published_total", "counter",
           "Totals messages published.");
    put(t, "rl_agg_totals_published_total %llu\n",
        (unsigned long long)agg->stats.totals_published);
    rl_histogram read;
    rl_histogram_read(&m->redis_write, &read);
    rl_prom_histogram(put_any, t, "rl_agg_redis_write_seconds",
                      "Time from a report's send to Redis to its answer.",
                      &read);
    rl_histogram_read(&m->broadcast_lag, &read);
    rl_prom_histogram(put_any, t, "rl_agg_broadcast_lag_seconds",
                      "At each broadcast with totals in it: how long the "
                      "oldest of them had waited since its report was "
                      "applied.", &read);
}

void rl_metrics_render(rl_aggregator *agg)
{
    rl_metrics *m = agg->metrics;
    if (m == NULL)
        return;
    text t = {0}, a = {0};
    render_reports(&t, agg);
    render_state(&t, agg);
    rl_exchange_render(agg, put_any, &t);
    rl_agents_render(agg, rl_store_now_ms(agg->store), put_any, &a);
    pthread_mutex_lock(&m->lock);
    free(m->text);
    m->text = t.data;
    m->len = t.len;
    free(m->agents);
    m->agents = a.data;
    m->agents_len = a.len;
    pthread_mutex_unlock(&m->lock);
}

void rl_metrics_stop(rl_aggregator *agg)
{
    rl_metrics *m = agg->metrics;
    if (m == NULL)
        return;
    nng_http_server_stop(m->server);
    nng_http_server_release(m->server);
    rl_nng_handoff(m); /* after the last callback */
    free(m->text);
    free(m->agents);
    pthread_mutex_destroy(&m->lock);
    free(m);
    agg->metrics = NULL;
}
