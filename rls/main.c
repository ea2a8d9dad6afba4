/*
 * main.c: rl-rls, a rate limit service for Envoy: envoyproxy/ratelimit's
 * gRPC API, config files and environment variables, with rl's checks
 * behind them. One event loop per core serves gRPC (rls_worker.c), each
 * with its own agent; the main thread watches the config, takes signals
 * and serves the HTTP endpoints' state.
 *
 * Signals: SIGHUP reloads the descriptors' config now (it is also
 * reloaded within a second of a file changing); a bad config is logged
 * and the old one kept. SIGHUP and a file's change also reload the gRPC
 * port's TLS files (a bad set logged, the old one kept). SIGTERM/SIGINT
 * fail /healthcheck and gRPC health, send GOAWAY, let the calls in flight
 * be answered (10 s at most), close the agents and exit 0.
 */
#include "rl.h"
#include "rls_http.h"
#include "rls_log.h"
#include "rls_metrics.h"
#include "rls_runtime.h"
#include "rls_service.h"
#include "rls_settings.h"
#include "rls_store.h"
#include "rls_tls.h"
#include "rls_worker.h"

#include "config.h"
#include "log.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>
#include <uv.h>

#define EXIT_USAGE 1
#define EXIT_CONFIG 3
#define EXIT_RUNTIME 4
#define WORKERS_MAX 256
#define DRAIN_MS 10000
#define WATCH_MS 1000
#define RL_YAML_MAX (4u << 20)

static const char usage[] =
    "usage: rl-rls [--config FILE] [--workers N]\n"
    "       rl-rls [--config FILE] --print-rl-config\n"
    "       rl-rls --version | --help\n"
    "\n"
    "A rate limit service for Envoy (envoy.service.ratelimit.v3), a drop-in\n"
    "for envoyproxy/ratelimit: the same gRPC API, config files and\n"
    "environment variables (RUNTIME_ROOT, REDIS_URL, GRPC_PORT, ...; see\n"
    "docs/envoy.md), rl's checks behind them.\n"
    "\n"
    "  --config FILE  rl's own settings (store, aggregators, deadlines) in\n"
    "                 rl's YAML, instead of the REDIS_* variables; no rules\n"
    "  --workers N    event loops (default: one per core)\n"
    "  --print-rl-config  print the rl config the agents run on (store,\n"
    "                 aggregators, rl-rls's rules) and exit: rl-aggregator's\n"
    "                 config for synced descriptors; REDIS_AUTH's password\n"
    "                 is not in it (password_env: " RLS_PASSWORD_ENV ")\n"
    "\n"
    "SIGHUP reloads the descriptors' config and the TLS files (a file's\n"
    "change does too);\n"
    "SIGTERM drains and exits.\n"
    "\n"
    "exit codes: 0 ok, 1 usage, 3 invalid config or variable, 4 cannot run\n";

typedef struct app {
    rls_settings settings;
    rl_logger log;
    rl_config *rl;
    bool synced;                  /* rl has an aggregator: the synced rules */
    rls_runtime runtime;
    rls_options options;
    rls_worker_config wc;
    rls_tls_ctx *tls;             /* GRPC_SERVER_USE_TLS=true */
    rls_worker *workers[WORKERS_MAX];
    int n_workers;
    rls_http_config hc;
    rls_http *http;
    rls_metrics *metrics;         /* USE_PROMETHEUS, else NULL */
    rls_holds *holds;             /* descriptors' rl: {hold} */
    atomic_bool draining;
    uv_loop_t *loop;
    uv_signal_t sigterm, sigint, sighup;
    uv_timer_t watch, drain;
    uint64_t drain_started;
} app;

static const char *env(const char *name, void *arg)
{
    (void)arg;
    return getenv(name);
}

static int parse_args(int argc, char **argv, const char **config,
                      int *workers, bool *print, bool *done)
{
    for (int i = 1; i < argc; i++) {
        bool has_value = i + 1 < argc;
        char *end;
        if (strcmp(argv[i], "--help") == 0) {
            fputs(usage, stdout);
            *done = true;
            return 0;
        } else if (strcmp(argv[i], "--version") == 0) {
            printf("rl-rls %s\n", rl_version());
            *done = true;
            return 0;
        } else if (strcmp(argv[i], "--print-rl-config") == 0) {
            *print = true;
        } else if (strcmp(argv[i], "--config") == 0 && has_value) {
            *config = argv[++i];
        } else if (strcmp(argv[i], "--workers") == 0 && has_value
                   && (*workers = (int)strtol(argv[i + 1], &end, 10)) >= 1
                   && *workers <= WORKERS_MAX && *end == '\0') {
            i++;
        } else {
            fprintf(stderr, "rl-rls: unexpected argument '%s'\n\n%s",
                    argv[i], usage);
            return EXIT_USAGE;
        }
    }
    return 0;
}

/* The --config file's text, or NULL with *rc set. */
static char *read_file(const char *path, int *rc)
{
    FILE *f = fopen(path, "r");
    char *text = f != NULL ? malloc(RL_YAML_MAX + 1) : NULL;
    size_t n = text != NULL ? fread(text, 1, RL_YAML_MAX + 1, f) : 0;
    if (f != NULL)
        fclose(f);
    if (text == NULL || n > RL_YAML_MAX) {
        fprintf(stderr, "rl-rls: cannot read --config %s%s\n", path,
                n > RL_YAML_MAX ? ": over 4 MiB" : "");
        free(text);
        *rc = EXIT_CONFIG;
        return NULL;
    }
    text[n] = '\0';
    return text;
}

/* Parses the rl config from file (NULL: the REDIS_* variables), the
 * synced rules in it or not; *yaml is its text, to free. */
static int parse_rl(app *a, const char *file, const char *path,
                    bool synced, char **yaml)
{
    char err[512];
    *yaml = rls_store_yaml(&a->settings, file, synced, err, sizeof err);
    if (*yaml == NULL) {
        fprintf(stderr, "rl-rls: %s\n", err);
        return EXIT_CONFIG;
    }
    rl_error e;
    if (rl_config_parse(*yaml, strlen(*yaml),
                        path != NULL ? path : "<REDIS_* variables>", &a->rl,
                        &e) != RL_OK) {
        fprintf(stderr, "rl-rls: %s\n", e.message);
        return EXIT_CONFIG;
    }
    return 0;
}

/* The synced rules go in only when the config names an aggregator to
 * count them (an agent with one dials its aggregators); then descriptors
 * may ask for mode: synced. print: the text goes to stdout. */
static int load_rl_config(app *a, const char *path, bool print)
{
    int rc = 0;
    char *file = path != NULL ? read_file(path, &rc) : NULL;
    if (rc != 0)
        return rc;
    if (path != NULL && a->settings.redis_timeout_given)
        rl_log(&a->log, RL_LOG_WARN, "setting_without_effect", "%s",
               "REDIS_TIMEOUT: with --config, a call waits for Redis for "
               "the config's store.timeout_ms");
    char *yaml;
    rc = parse_rl(a, file, path, false, &yaml);
    if (rc == 0 && a->rl->aggregator.given) {
        free(yaml);
        rl_config_free(a->rl);
        a->rl = NULL;
        a->synced = true;
        rc = parse_rl(a, file, path, true, &yaml);
    }
    if (rc == 0 && print)
        fputs(yaml, stdout);
    free(yaml);
    free(file);
    return rc;
}

/* LOG_LEVEL's names (logrus's, checked by the settings) as rl's levels:
 * trace is debug, warning warn, fatal and panic error. */
static rl_log_level log_level(const rls_settings *s)
{
    static const struct {
        const char *name;
        rl_log_level level;
    } levels[] = {{"trace", RL_LOG_DEBUG}, {"debug", RL_LOG_DEBUG},
                  {"info", RL_LOG_INFO}, {"warn", RL_LOG_WARN},
                  {"warning", RL_LOG_WARN}, {"error", RL_LOG_ERROR},
                  {"fatal", RL_LOG_ERROR}, {"panic", RL_LOG_ERROR}};
    for (size_t i = 0; i < sizeof levels / sizeof levels[0]; i++) {
        if (strcasecmp(s->log_level, levels[i].name) == 0)
            return levels[i].level;
    }
    return RL_LOG_WARN;
}

static int read_settings(app *a)
{
    char err[512], notes[4096];
    if (rls_settings_read(&a->settings, env, NULL, err, sizeof err, notes,
                          sizeof notes) != 0) {
        fprintf(stderr, "rl-rls: %s\n", err);
        return EXIT_CONFIG;
    }
    /* LOG_FORMAT is text or json (the settings checked it). */
    a->log = (rl_logger){strcasecmp(a->settings.log_format, "json") == 0
                             ? rls_log_json
                             : rl_log_to_stderr,
                         NULL, log_level(&a->settings)};
    for (char *line = notes; *line != '\0';) {
        size_t n = strcspn(line, "\n");
        rl_log(&a->log, RL_LOG_WARN, "setting_without_effect", "%.*s",
               (int)n, line);
        line += n + (line[n] == '\n');
    }
    return 0;
}

/* The gRPC port's TLS, built once for every worker. The client's
 * settings mean nothing without what they depend on (as upstream, which
 * ignores them): said at start, not silently ignored. */
static int load_tls(app *a)
{
    const rls_settings *s = &a->settings;
    if (!s->grpc_server_use_tls && (*s->grpc_server_tls_cert != '\0'
                                    || *s->grpc_client_tls_cacert != '\0'))
        rl_log(&a->log, RL_LOG_WARN, "setting_without_effect", "%s",
               "GRPC_SERVER_TLS_CERT, GRPC_CLIENT_TLS_CACERT: gRPC is "
               "served in cleartext without GRPC_SERVER_USE_TLS=true");
    else if (*s->grpc_client_tls_san != '\0'
             && *s->grpc_client_tls_cacert == '\0')
        rl_log(&a->log, RL_LOG_WARN, "setting_without_effect", "%s",
               "GRPC_CLIENT_TLS_SAN: no client certificate is asked for "
               "without GRPC_CLIENT_TLS_CACERT");
    if (!s->grpc_server_use_tls)
        return 0;
    rls_tls_config c = {s->grpc_server_tls_cert, s->grpc_server_tls_key,
                        s->grpc_client_tls_cacert, s->grpc_client_tls_san};
    char err[1024];
    if ((a->tls = rls_tls_ctx_new(&c, err, sizeof err)) == NULL) {
        fprintf(stderr, "rl-rls: %s\n", err);
        return EXIT_CONFIG;
    }
    return 0;
}

static void load_runtime(app *a, const char *why)
{
    char err[1024];
    if (rls_runtime_load(&a->runtime, err, sizeof err) != 0) {
        rls_metrics_event(a->metrics, RLS_EV_CONFIG_LOAD_ERROR);
        rl_log(&a->log, RL_LOG_ERROR, "config_refused",
               "why=%s reason=\"%s\" kept=%s", why, err,
               a->runtime.current != NULL ? "previous" : "none");
        return;
    }
    rls_metrics_event(a->metrics, RLS_EV_CONFIG_LOAD_SUCCESS);
    rl_log(&a->log, RL_LOG_INFO, "config_loaded", "why=%s domains=%zu "
           "files=%zu", why, a->runtime.current->cfg->n_domains,
           a->runtime.current->cfg->n_files);
}

/* --- Signals, the watch and the drain ---------------------------------- */

static void stop_workers(app *a)
{
    rls_http_set_workers(a->http, NULL, 0);
    for (int i = 0; i < a->n_workers; i++)
        rls_worker_stop(a->workers[i]);
    a->n_workers = 0;
    uv_close((uv_handle_t *)&a->watch, NULL);
    uv_close((uv_handle_t *)&a->drain, NULL);
    uv_unref((uv_handle_t *)&a->sigterm);
    uv_unref((uv_handle_t *)&a->sigint);
    uv_unref((uv_handle_t *)&a->sighup);
}

/* Every 20 ms of a drain: stops once no worker has a connection left,
 * or DRAIN_MS after the signal. */
static void on_drain_timer(uv_timer_t *t)
{
    app *a = t->data;
    bool drained = true;
    for (int i = 0; i < a->n_workers && drained; i++)
        drained = rls_worker_drained(a->workers[i]);
    if (drained || uv_now(a->loop) - a->drain_started >= DRAIN_MS)
        stop_workers(a);
}

static void on_stop(uv_signal_t *s, int signum)
{
    app *a = s->data;
    if (atomic_exchange(&a->draining, true))
        return;
    rl_log(&a->log, RL_LOG_INFO, "stopping", "signal=%d", signum);
    for (int i = 0; i < a->n_workers; i++)
        rls_worker_drain(a->workers[i]);
    a->drain_started = uv_now(a->loop);
    uv_timer_start(&a->drain, on_drain_timer, 20, 20);
}

/* The gRPC port's certificate, key and client CA read again (cert-manager
 * rotates them): new connections take them, a bad set is refused and the
 * one before kept. */
static void reload_tls(app *a, const char *why)
{
    char err[1024];
    if (rls_tls_ctx_reload(a->tls, err, sizeof err) != 0)
        rl_log(&a->log, RL_LOG_ERROR, "tls_refused",
               "why=%s reason=\"%s\" kept=previous", why, err);
    else
        rl_log(&a->log, RL_LOG_INFO, "tls_reloaded", "why=%s", why);
}

static void on_reload(uv_signal_t *s, int signum)
{
    (void)signum;
    app *a = s->data;
    load_runtime(a, "sighup");
    if (a->tls != NULL)
        reload_tls(a, "sighup");
}

static void on_watch(uv_timer_t *t)
{
    app *a = t->data;
    if (rls_runtime_changed(&a->runtime))
        load_runtime(a, "change");
    if (a->tls != NULL && rls_tls_ctx_changed(a->tls))
        reload_tls(a, "change");
}

static void start_handles(app *a)
{
    a->loop = uv_default_loop();
    uv_signal_init(a->loop, &a->sigterm);
    uv_signal_init(a->loop, &a->sigint);
    uv_signal_init(a->loop, &a->sighup);
    uv_timer_init(a->loop, &a->watch);
    uv_timer_init(a->loop, &a->drain);
    a->sigterm.data = a->sigint.data = a->sighup.data = a;
    a->watch.data = a->drain.data = a;
    uv_signal_start(&a->sigterm, on_stop, SIGTERM);
    uv_signal_start(&a->sigint, on_stop, SIGINT);
    uv_signal_start(&a->sighup, on_reload, SIGHUP);
    uv_timer_start(&a->watch, on_watch, WATCH_MS, WATCH_MS);
}

/* --- Start ------------------------------------------------------------- */

/* A Go duration of 0 is grpc-go's "never". */
static uint64_t age_ms(int64_t ms)
{
    return ms > 0 ? (uint64_t)ms : UINT64_MAX;
}

static int start_workers(app *a, int n)
{
    char err[512];
    const rls_settings *s = &a->settings;
    a->holds = rls_holds_new(RLS_HOLDS_MAX, a->rl->hold_timeout_ms, &a->log);
    if (a->holds == NULL) {
        fprintf(stderr, "rl-rls: out of memory\n");
        return EXIT_RUNTIME;
    }
    a->options = (rls_options){.rule = RLS_RULE, .rule_of = rls_rule_of,
                               .shadow_mode = s->shadow_mode,
                               .quota_mode = s->quota_mode,
                               .stop_increment_when_over =
                                   s->stop_cache_key_increment_when_overlimit,
                               .headers = s->limit_response_headers_enabled,
                               .limit_header = s->limit_limit_header,
                               .remaining_header = s->limit_remaining_header,
                               .reset_header = s->limit_reset_header,
                               .metrics = a->metrics,
                               .near_limit_ratio =
                                   (float)s->near_limit_ratio,
                               .holds = a->holds};
    a->wc = (rls_worker_config){.rl = a->rl, .runtime = &a->runtime,
                                .options = &a->options,
                                .host = s->grpc_host,
                                .port = (uint16_t)s->grpc_port,
                                .limits = {
                                    .max_connection_age_ms = age_ms(
                                        s->grpc_max_connection_age_ms),
                                    .max_connection_age_grace_ms = age_ms(
                                        s->grpc_max_connection_age_grace_ms)},
                                .log = a->log.fn,
                                .log_level = a->log.level,
                                .draining = &a->draining,
                                .metrics = a->metrics,
                                .tls = a->tls};
    for (int i = 0; i < n; i++) {
        if (rls_worker_start(&a->workers[i], &a->wc, err, sizeof err) != 0) {
            fprintf(stderr, "rl-rls: %s\n", err);
            return EXIT_RUNTIME;
        }
        a->n_workers++;
        /* The first worker's port (GRPC_PORT=0: any) is every other's. */
        a->wc.port = rls_worker_port(a->workers[0]);
    }
    return 0;
}

static int start_http(app *a)
{
    const rls_settings *s = &a->settings;
    a->hc = (rls_http_config){
        .host = s->host, .port = (uint16_t)s->port,
        .debug_host = s->debug_host, .debug_port = (uint16_t)s->debug_port,
        .runtime = &a->runtime, .draining = &a->draining,
        .need_config = s->healthy_with_at_least_one_config_loaded};
    char err[512];
    if (rls_http_start(&a->http, &a->hc, err, sizeof err) != 0) {
        fprintf(stderr, "rl-rls: %s\n", err);
        return EXIT_RUNTIME;
    }
    if (a->metrics != NULL
        && rls_metrics_serve(a->metrics, err, sizeof err) != 0) {
        fprintf(stderr, "rl-rls: %s\n", err);
        return EXIT_RUNTIME;
    }
    rls_http_set_workers(a->http, a->workers, (size_t)a->n_workers);
    return 0;
}

static int start(app *a, int workers)
{
    char err[1024];
    if (rls_runtime_init(&a->runtime, &a->settings, err, sizeof err) != 0) {
        fprintf(stderr, "rl-rls: %s\n", err);
        return EXIT_CONFIG;
    }
    a->runtime.synced = a->synced;
    if (a->settings.use_prometheus
        && (a->metrics = rls_metrics_new(&a->log, a->settings.prometheus_addr,
                                         a->settings.prometheus_path, err,
                                         sizeof err)) == NULL) {
        fprintf(stderr, "rl-rls: %s\n", err);
        return EXIT_CONFIG;
    }
    int loaded = rls_runtime_load(&a->runtime, err, sizeof err);
    rls_metrics_event(a->metrics, loaded == 0 ? RLS_EV_CONFIG_LOAD_SUCCESS
                                              : RLS_EV_CONFIG_LOAD_ERROR);
    if (loaded != 0) {
        if (!a->settings.force_start_without_initial_config) {
            fprintf(stderr, "rl-rls: %s\n", err);
            return EXIT_CONFIG;
        }
        rl_log(&a->log, RL_LOG_WARN, "config_refused", "why=start "
               "reason=\"%s\" kept=none", err);
    }
    int rc = start_workers(a, workers);
    if (rc == 0)
        rc = start_http(a);
    if (rc == 0)
        rl_log(&a->log, RL_LOG_INFO, "listening", "grpc=%s:%u http=%s:%lld "
               "debug=%s:%lld workers=%d", a->settings.grpc_host,
               a->wc.port, a->settings.host, (long long)a->settings.port,
               a->settings.debug_host, (long long)a->settings.debug_port,
               a->n_workers);
    return rc;
}

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN);
    const char *config = NULL;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int workers = cores > 0 && cores <= WORKERS_MAX ? (int)cores : 1;
    bool print = false, done = false;
    int rc = parse_args(argc, argv, &config, &workers, &print, &done);
    if (rc != 0 || done)
        return rc;
    /* Static: its signal handles stay registered until exit (see
     * rl-gateway's main). */
    static app a;
    if ((rc = read_settings(&a)) == 0
        && (rc = load_rl_config(&a, config, print)) == 0 && !print
        && (rc = load_tls(&a)) == 0) {
        start_handles(&a);
        rc = start(&a, workers);
        if (rc != 0)
            stop_workers(&a);
        uv_run(a.loop, UV_RUN_DEFAULT);
        rls_http_stop(a.http);
        rls_metrics_free(a.metrics);
        rls_holds_free(a.holds);
        rls_runtime_fini(&a.runtime);
        rl_log(&a.log, RL_LOG_INFO, "stopped", "%s", "");
    }
    rls_tls_ctx_free(a.tls);
    rl_config_free(a.rl);
    rls_settings_free(&a.settings);
    return rc;
}
