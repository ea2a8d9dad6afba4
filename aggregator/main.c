/*
 * main.c: rl-aggregator, the daemon of the synced path. It receives the
 * agents' counts (nng REP), adds them into per-window keys in Redis, and
 * publishes per-client totals (nng PUB) every interval. It keeps no state
 * of its own beyond the current interval: several aggregators can share one
 * Redis and the same agents.
 *
 * Signals: SIGTERM/SIGINT stop taking reports, let the ones in flight reach
 * Redis and be acknowledged, publish once more and exit 0. SIGHUP reloads
 * the config; an invalid one is logged and the old one kept (the listen
 * URLs and the store are not changed by a reload). The synced rules follow
 * the new config: reports for a rule added are taken; counts for a rule
 * removed are dropped, not counted, and the rest of their report applied
 * (an agent not yet reloaded still sends them); shadow synced rules are
 * summed like any other (a shadow rule is enforced nowhere, but counted everywhere); what
 * changed is logged one line each, as rl-gateway does.
 */
#include "aggregator.h"
#include "exchange.h"
#include "regions.h"

#include "windows.h"

#include "config_diff.h"
#include "config_loader.h"

#include "nng_tls.h"

#include <nng/protocol/pubsub0/pub.h>
#include <stdatomic.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXIT_USAGE 1
#define EXIT_CONFIG 3
#define EXIT_RUNTIME 4

static const char usage[] =
    "usage: rl-aggregator --config FILE [--index N] [--log-level LEVEL]\n"
    "       rl-aggregator --check-config --config FILE [--index N]\n"
    "       rl-aggregator --version | --help\n"
    "\n"
    "Receives synced counts from rl agents on aggregator.reports, adds them\n"
    "up in Redis (store), and publishes totals on aggregator.totals every\n"
    "aggregator.sync_interval_ms.\n"
    "\n"
    "  --config FILE      the rules config (default /etc/rl/rl.yaml)\n"
    "  --index N          serve entry N (from 0) of the config's\n"
    "                     aggregators list; needed when it has several\n"
    "  --check-config     validate the config and exit\n"
    "  --log-level LEVEL  debug, info, warn or error (default: the config's\n"
    "                     log_level, info if unset)\n"
    "\n"
    "exit codes: 0 ok, 1 usage, 3 invalid config, 4 cannot run (sockets)\n";


const rl_rule *rl_aggregator_rule(const rl_aggregator *agg,
                                  rl_wire_bytes name)
{
    return rl_config_synced_rule(agg->config, name.ptr, name.len);
}

bool rl_rule_needs_fleet(const rl_rule *rule)
{
    return rule->mode == RL_MODE_SYNCED || rule->mode == RL_MODE_LEASED
           || rule->on_error == RL_ON_ERROR_LOCAL;
}

const rl_rule *rl_aggregator_fleet_rule(const rl_aggregator *agg,
                                        rl_wire_bytes name)
{
    for (size_t i = 0; i < agg->config->n_rules; i++) {
        const rl_rule *r = &agg->config->rules[i];
        if (rl_rule_needs_fleet(r) && strlen(r->name) == name.len
            && memcmp(r->name, name.ptr, name.len) == 0)
            return r;
    }
    return NULL;
}

static void on_wakeup(uv_async_t *h)
{
    rl_ingest_drain_ready(h->data);
    rl_exchange_drain(h->data);
}

/* Publishes five eighths into each interval of Redis's clock: agents
 * report at its start, so a totals message covers the reports just made;
 * and a little after the middle, so that when the interval is two
 * sub-windows (wire.h) the message comes after the sub-window boundary,
 * when the oldest sub-window it frees has left the span. Published at the
 * middle, it came a few ms before the boundary by some agents' clocks,
 * freed nothing, and room waited for the next tick: in a 10 s period
 * synced every second, bursts came back every 12 to 13 s instead of 11. */
static uint64_t publish_shift(uint64_t interval)
{
    return interval * 3 / 8; /* before each interval's end */
}

static uint64_t until_next_publish(const rl_aggregator *agg)
{
    /* aggregator.* is not reloaded: the agents keep theirs too. */
    uint64_t interval = agg->boot_config->aggregator.sync_interval_ms;
    uint64_t now = rl_store_now_ms(agg->store);
    if (now == 0)
        return interval;
    uint64_t phase = (now + publish_shift(interval)) % interval;
    return interval - phase;
}

/* The moment (Redis's clock) of the publish under way, however late the
 * loop runs it: five eighths into an interval, every region's by its own
 * clock. 0 while the clock is not known. */
static uint64_t publish_moment(const rl_aggregator *agg)
{
    uint64_t interval = agg->boot_config->aggregator.sync_interval_ms;
    uint64_t now = rl_store_now_ms(agg->store);
    uint64_t shift = publish_shift(interval);
    if (now + shift < interval)
        return 0;
    return (now + shift) / interval * interval - shift;
}

/* How long the stop waits for nng to close the sockets. */
#define NNG_CLOSE_WAIT_MS 5000

/* nng 1.5.2 (Debian 12's libnng1) can lose a pipe's send for good: its
 * tls+tcp transport writes a message's length and its body as two writes
 * (tls_do_send sends one iov at a time), and when the pipe closes between
 * them (an agent going away: its drain, nng_sub.h, ends its TOTALS
 * connection as the next message's header arrives) tlstran_pipe_send_cb
 * arms the body's write on an aio the close has stopped, which
 * nni_aio_begin refuses without completing anything. The PUB pipe's send
 * then never ends, nng's one reaper thread waits for it forever
 * (pipe_destroy, pub0_pipe_stop, nni_aio_stop), and every nng_close and
 * nng_http_server_stop after that waits for the reaper. So the sockets
 * are closed on a thread of their own, and the stop goes on without them
 * after NNG_CLOSE_WAIT_MS: the reports are all acknowledged by then, and
 * the process is about to exit. */
typedef struct nng_teardown {
    rl_aggregator *agg;
    atomic_bool done;
} nng_teardown;

static void *teardown_nng(void *arg)
{
    nng_teardown *t = arg;
    /* The reports socket first: its pipe callbacks count into the
     * metrics. */
    rl_ingest_stop(t->agg);
    rl_regions_stop(t->agg);
    rl_metrics_stop(t->agg);
    nng_close(t->agg->totals);
    atomic_store(&t->done, true);
    return NULL;
}

/* Whether nng closed within NNG_CLOSE_WAIT_MS. The wait polls a flag
 * rather than waiting on a condition variable: libfaketime (a test
 * preloads it) wraps pthread_cond_timedwait past ThreadSanitizer, which
 * then takes the mutex for still held. */
static bool close_nng(rl_aggregator *agg)
{
    /* Static: a thread left stuck holds on to it until the exit. */
    static nng_teardown t;
    t.agg = agg;
    atomic_init(&t.done, false);
    pthread_t thread;
    if (pthread_create(&thread, NULL, teardown_nng, &t) != 0) {
        teardown_nng(&t);
        return true;
    }
    for (int waited = 0; waited < NNG_CLOSE_WAIT_MS
                         && !atomic_load(&t.done); waited++)
        uv_sleep(1);
    bool done = atomic_load(&t.done);
    if (done)
        pthread_join(thread, NULL);
    else
        pthread_detach(thread);
    return done;
}

static void shutdown_now(rl_aggregator *agg)
{
    rl_broadcast_publish(agg);
    if (!close_nng(agg))
        rl_log(&agg->log, RL_LOG_WARN, "sockets_not_closed",
               "after_ms=%d reason=\"nng 1.5.2 lost a pipe's send (see "
               "close_nng in aggregator/main.c); exiting without them\"",
               NNG_CLOSE_WAIT_MS);
    uv_timer_stop(&agg->publish_timer);
    uv_close((uv_handle_t *)&agg->publish_timer, NULL);
    uv_close((uv_handle_t *)&agg->wakeup, NULL);
    uv_close((uv_handle_t *)&agg->sigterm, NULL);
    uv_close((uv_handle_t *)&agg->sigint, NULL);
    uv_close((uv_handle_t *)&agg->sighup, NULL);
    rl_service_close(&agg->service);
    rl_store_close(agg->store);
    agg->store = NULL;
    rl_agents_free(agg);
    rl_log(&agg->log, RL_LOG_INFO, "stopped", "applied=%llu duplicate=%llu "
           "retry=%llu rejected=%llu",
           (unsigned long long)agg->stats.reports_applied,
           (unsigned long long)agg->stats.reports_duplicate,
           (unsigned long long)agg->stats.reports_retry,
           (unsigned long long)agg->stats.reports_rejected);
}

static void on_publish(uv_timer_t *t)
{
    rl_aggregator *agg = t->data;
    /* The reports in Redis first, then what they counted of global
     * rules in the other regions. */
    if (agg->stopping && agg->in_flight == 0
        && rl_exchange_flushed(agg, agg->stopping_ms)) {
        shutdown_now(agg);
        return;
    }
    if (!agg->stopping) {
        rl_metrics_render(agg);
        rl_exchange_publishing(agg, publish_moment(agg));
        rl_broadcast_publish(agg);
        rl_exchange_send(agg);
        rl_regions_sweep(agg, rl_store_now_ms(agg->store));
        agg->interval++;
    }
    uv_timer_start(t, on_publish,
                   agg->stopping ? 10 : until_next_publish(agg), 0);
}

static void on_stop_signal(uv_signal_t *s, int signum)
{
    rl_aggregator *agg = s->data;
    if (agg->stopping)
        return;
    agg->stopping = true;
    agg->stopping_ms = uv_now(agg->loop);
    rl_log(&agg->log, RL_LOG_INFO, "stopping", "signal=%d in_flight=%d",
           signum, agg->in_flight);
    rl_service_stopping(&agg->service);
    uv_timer_start(&agg->publish_timer, on_publish, 0, 0);
}

bool rl_aggregator_retired(const rl_aggregator *agg, rl_wire_bytes name)
{
    for (size_t i = 0; i < agg->n_retired; i++) {
        if (strlen(agg->retired[i]) == name.len
            && memcmp(agg->retired[i], name.ptr, name.len) == 0)
            return true;
    }
    return false;
}

/* The retired names after a reload from old to fresh: old's synced rules
 * that fresh does not sync join them, fresh's synced rules leave them.
 * Returns -1 when out of memory (nothing changed then). */
static int retire(rl_aggregator *agg, const rl_config *old,
                  const rl_config *fresh)
{
    size_t cap = agg->n_retired + old->n_rules + 1;
    char **names = calloc(cap, sizeof *names);
    if (names == NULL)
        return -1;
    size_t n = 0;
    for (size_t i = 0; i < agg->n_retired; i++)
        names[n++] = agg->retired[i];
    for (size_t i = 0; i < old->n_rules; i++) {
        const rl_rule *r = &old->rules[i];
        rl_wire_bytes name = {r->name, strlen(r->name)};
        if (r->mode != RL_MODE_SYNCED || rl_aggregator_retired(agg, name)
            || rl_config_synced_rule(fresh, name.ptr, name.len) != NULL)
            continue;
        if ((names[n] = strdup(r->name)) == NULL) {
            for (size_t k = agg->n_retired; k < n; k++)
                free(names[k]);
            free(names);
            return -1;
        }
        n++;
    }
    size_t kept = 0;
    for (size_t i = 0; i < n; i++) {
        if (rl_config_synced_rule(fresh, names[i], strlen(names[i])) != NULL)
            free(names[i]);
        else
            names[kept++] = names[i];
    }
    free(agg->retired);
    agg->retired = names;
    agg->n_retired = kept;
    return 0;
}

static void free_retired(rl_aggregator *agg)
{
    for (size_t i = 0; i < agg->n_retired; i++)
        free(agg->retired[i]);
    free(agg->retired);
    agg->retired = NULL;
    agg->n_retired = 0;
}

static void on_reload(uv_signal_t *s, int signum)
{
    rl_aggregator *agg = s->data;
    rl_config *fresh;
    rl_error err;
    (void)signum;
    rl_service_reloading(&agg->service);
    if (rl_config_load(agg->config_path, &fresh, &err) != RL_OK) {
        rl_log(&agg->log, RL_LOG_ERROR, "reload_failed",
               "reason=\"%s\" kept=old", err.message);
        rl_service_reloaded(&agg->service);
        return;
    }
    rl_broadcast *broadcast = rl_broadcast_new();
    if (broadcast == NULL || retire(agg, agg->config, fresh) != 0) {
        rl_log(&agg->log, RL_LOG_ERROR, "reload_failed",
               "reason=\"out of memory\" kept=old");
        rl_broadcast_free(broadcast);
        rl_config_free(fresh);
        rl_service_reloaded(&agg->service);
        return;
    }
    rl_config_diff diff;
    bool have_diff = rl_config_diff_make(agg->config, fresh, &diff) == RL_OK;
    /* The totals noted so far are kept by rule index in the old config:
     * they go out now, under the rules they were counted for, rather than
     * be dropped with the old table. */
    if (!agg->stopping)
        rl_broadcast_publish(agg);
    /* The rules change; the store and the sockets keep the settings they
     * started with, from the first config, which stays loaded for them.
     * Reports in flight look their rule up again by name when Redis
     * answers (ingest.c), so none holds on to the old config. */
    rl_config *old = agg->config;
    rl_broadcast *old_broadcast = agg->broadcast;
    agg->config = fresh;
    agg->broadcast = broadcast;
    rl_broadcast_carry(agg, old, old_broadcast);
    rl_broadcast_free(old_broadcast);
    if (old != agg->boot_config)
        rl_config_free(old);
    size_t synced = 0;
    for (size_t i = 0; i < fresh->n_rules; i++)
        synced += fresh->rules[i].mode == RL_MODE_SYNCED;
    if (have_diff) {
        for (size_t i = 0; i < diff.n; i++)
            rl_log(&agg->log, RL_LOG_INFO, "reload_change", "change=\"%s\"",
                   diff.lines[i]);
        rl_log(&agg->log, RL_LOG_INFO, "reloaded", "rules=%zu synced=%zu "
               "added=%zu removed=%zu changed=%zu", fresh->n_rules, synced,
               diff.rules_added, diff.rules_removed, diff.rules_changed);
        rl_config_diff_fini(&diff);
    } else {
        rl_log(&agg->log, RL_LOG_INFO, "reloaded", "rules=%zu synced=%zu "
               "changes=unknown (out of memory)", fresh->n_rules, synced);
    }
    rl_service_reloaded(&agg->service);
}

static int start(rl_aggregator *agg)
{
    char err[512];
    const rl_store_config *store =
        rl_config_aggregator_store(agg->boot_config);
    if (store->tls.enabled
        && (agg->redis_tls = rl_redis_tls_new(
                &store->tls, store == &agg->boot_config->store
                                 ? "store.tls" : "aggregator.store.tls",
                err, sizeof err)) == NULL) {
        fprintf(stderr, "rl-aggregator: %s\n", err);
        return EXIT_CONFIG;
    }
    agg->store = rl_store_new(agg->loop, store, agg->redis_tls,
                              &rl_window_scripts, NULL, &agg->log);
    agg->windows = rl_windows_new(agg->store,
                                  agg->boot_config->aggregator.max_entries,
                                  agg->boot_config->aggregator
                                      .sync_interval_ms);
    agg->broadcast = rl_broadcast_new();
    if (agg->store == NULL || agg->windows == NULL
        || agg->broadcast == NULL) {
        fprintf(stderr, "rl-aggregator: out of memory\n");
        return EXIT_RUNTIME;
    }
    int rv = nng_pub0_open(&agg->totals);
    if (rv != 0 || rl_nng_listen(agg->totals, agg->endpoint->totals,
                                 &agg->config->aggregator.tls, err,
                                 sizeof err) != 0) {
        fprintf(stderr, "rl-aggregator: %s\n",
                rv != 0 ? nng_strerror(rv) : err);
        return EXIT_RUNTIME;
    }
    pthread_mutex_init(&agg->ready_lock, NULL);
    uv_async_init(agg->loop, &agg->wakeup, on_wakeup);
    agg->wakeup.data = agg;
    if (rl_agents_init(agg) != 0) {
        fprintf(stderr, "rl-aggregator: out of memory\n");
        return EXIT_RUNTIME;
    }
    if (rl_regions_start(agg, err, sizeof err) != 0
        || rl_ingest_start(agg, err, sizeof err) != 0
        || rl_metrics_start(agg, err, sizeof err) != 0) {
        fprintf(stderr, "rl-aggregator: %s\n", err);
        return EXIT_RUNTIME;
    }
    uv_timer_init(agg->loop, &agg->publish_timer);
    agg->publish_timer.data = agg;
    uv_timer_start(&agg->publish_timer, on_publish, until_next_publish(agg),
                   0);
    uv_signal_t *sigs[] = {&agg->sigterm, &agg->sigint, &agg->sighup};
    int nums[] = {SIGTERM, SIGINT, SIGHUP};
    for (int i = 0; i < 3; i++) {
        uv_signal_init(agg->loop, sigs[i]);
        sigs[i]->data = agg;
        uv_signal_start(sigs[i], i == 2 ? on_reload : on_stop_signal,
                        nums[i]);
    }
    rl_log(&agg->log, RL_LOG_INFO, "listening", "index=%zu reports=%s "
           "totals=%s store=%s:%u interval_ms=%u",
           (size_t)(agg->endpoint - agg->boot_config->aggregator.endpoints),
           agg->endpoint->reports, agg->endpoint->totals,
           store->nodes[0].host, store->nodes[0].port,
           agg->config->aggregator.sync_interval_ms);
    rl_service_start(&agg->service, agg->loop, agg->store, &agg->log);
    return 0;
}

/* The aggregators entry to serve: --index N, which a config with several
 * entries needs (each aggregator of the list runs with its own). */
static int choose_endpoint(rl_aggregator *agg, const char *path,
                           const char *index)
{
    const rl_aggregator_config *c = &agg->boot_config->aggregator;
    uint64_t n = 0;
    char why[256];
    if (index == NULL && c->n_endpoints > 1) {
        fprintf(stderr, "rl-aggregator: %s lists %zu aggregators: say which "
                "one this is with --index N (0 to %zu)\n", path,
                c->n_endpoints, c->n_endpoints - 1);
        return -1;
    }
    if (index != NULL
        && !rl_config_parse_u64(index, 0, c->n_endpoints - 1, &n, why,
                                sizeof why)) {
        fprintf(stderr, "rl-aggregator: --index: %s (%s lists %zu "
                "aggregator%s, numbered from 0)\n", why, path,
                c->n_endpoints, c->n_endpoints == 1 ? "" : "s");
        return -1;
    }
    agg->endpoint = &c->endpoints[n];
    return 0;
}

int main(int argc, char **argv)
{
    /* A peer gone while libuv writes to it is an error to handle (EPIPE),
     * not a reason to die: libuv leaves SIGPIPE to the program. */
    signal(SIGPIPE, SIG_IGN);
    const char *path = "/etc/rl/rl.yaml";
    bool check_only = false;
    rl_log_level level = RL_LOG_INFO;
    bool level_given = false;
    const char *index = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0) {
            fputs(usage, stdout);
            return 0;
        } else if (strcmp(argv[i], "--version") == 0) {
            printf("rl-aggregator %s\n", rl_version());
            return 0;
        } else if (strcmp(argv[i], "--check-config") == 0) {
            check_only = true;
        } else if (strcmp(argv[i], "--config") == 0 && i + 1 < argc) {
            path = argv[++i];
        } else if (strcmp(argv[i], "--index") == 0 && i + 1 < argc) {
            index = argv[++i];
        } else if (strcmp(argv[i], "--log-level") == 0 && i + 1 < argc
                   && rl_log_level_parse(argv[i + 1], &level) == 0) {
            level_given = true;
            i++;
        } else {
            fprintf(stderr, "rl-aggregator: unexpected argument '%s'\n\n%s",
                    argv[i], usage);
            return EXIT_USAGE;
        }
    }
    rl_aggregator agg = {.config_path = (char *)path,
                         .log = {rl_log_to_stderr, NULL, level},
                         .interval = 1};
    rl_error err;
    if (rl_config_load(path, &agg.boot_config, &err) != RL_OK) {
        fprintf(stderr, "rl-aggregator: %s\n", err.message);
        return EXIT_CONFIG;
    }
    agg.config = agg.boot_config;
    if (choose_endpoint(&agg, path, index) != 0) {
        rl_config_free(agg.boot_config);
        return EXIT_USAGE;
    }
    if (!level_given)
        agg.log.level = agg.config->log_level;
    if (check_only) {
        printf("%s: valid\n", path);
        rl_config_free(agg.boot_config);
        return 0;
    }
    uv_loop_t loop;
    uv_loop_init(&loop);
    agg.loop = &loop;
    int rc = start(&agg);
    if (rc == 0)
        uv_run(&loop, UV_RUN_DEFAULT);
    else if (agg.store != NULL)
        rl_store_close(agg.store);
    uv_run(&loop, UV_RUN_NOWAIT);
    uv_loop_close(&loop);
    rl_broadcast_free(agg.broadcast);
    rl_windows_free(agg.windows);
    rl_redis_tls_free(agg.redis_tls);
    free_retired(&agg);
    if (agg.config != agg.boot_config)
        rl_config_free(agg.config);
    rl_config_free(agg.boot_config);
    return rc;
}
