/*
 * main.c: rl-gateway, rl's reference HTTP gateway. Every request is checked
 * against the rules with librl (rl_check_async, or rl_check_hold: cost.c);
 * allowed requests go to the upstream (or get a small JSON 200), rejected
 * ones a 429.
 *
 * Signals: SIGTERM/SIGINT stop accepting, close idle connections, let the
 * requests in flight be answered (10 s at most), close the agent (which
 * sends its last synced counts) and exit 0. SIGHUP reloads the config and
 * its tenant map (reload.c): what changed is logged, an invalid config is
 * logged and the old one kept, no connection is dropped.
 */
#include "gateway.h"

#include "address.h"

#include <netdb.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXIT_USAGE 1
#define EXIT_CONFIG 3
#define EXIT_RUNTIME 4

static const char usage[] =
    "usage: rl-gateway --listen HOST:PORT --config FILE\n"
    "                  [--upstream http://HOST:PORT] [--trust-forwarded-for]\n"
    "                  [--metrics HOST:PORT] [--log-level LEVEL]\n"
    "       rl-gateway --version | --help\n"
    "\n"
    "An HTTP/1.1 gateway that rate-limits every request with rl's rules.\n"
    "\n"
    "  --listen HOST:PORT     where to accept clients ([v6addr]:port too)\n"
    "  --config FILE          the rules config\n"
    "  --upstream URL         send allowed requests there (http:// only);\n"
    "                         without it, allowed requests get a JSON 200\n"
    "  --trust-forwarded-for  take ip from the first X-Forwarded-For hop;\n"
    "                         only behind a proxy that sets that header\n"
    "  --metrics HOST:PORT    serve Prometheus text on GET /metrics there\n"
    "                         (give a loopback address unless scrapers\n"
    "                         elsewhere need it)\n"
    "  --log-level LEVEL      debug, info, warn or error (default: the\n"
    "                         config's log_level, info if unset)\n"
    "\n"
    "SIGHUP reloads the config and the tenant map (an invalid one is\n"
    "logged and the old one kept); SIGTERM drains and exits.\n"
    "\n"
    "exit codes: 0 ok, 1 usage, 3 invalid config, 4 cannot run (listen,\n"
    "upstream address, tenant map)\n";


typedef struct args {
    const char *listen, *config, *upstream, *metrics;
    bool trust_forwarded_for;
    rl_log_level level;
    bool level_given;
} args;


/* 0 to run, or the exit code (help and version exit 0 through *done). */
static int parse_args(int argc, char **argv, args *a, bool *done)
{
    *a = (args){.level = RL_LOG_INFO};
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        bool has_value = i + 1 < argc;
        if (strcmp(arg, "--help") == 0) {
            fputs(usage, stdout);
            *done = true;
            return 0;
        } else if (strcmp(arg, "--version") == 0) {
            printf("rl-gateway %s\n", rl_version());
            *done = true;
            return 0;
        } else if (strcmp(arg, "--trust-forwarded-for") == 0) {
            a->trust_forwarded_for = true;
        } else if (strcmp(arg, "--listen") == 0 && has_value) {
            a->listen = argv[++i];
        } else if (strcmp(arg, "--config") == 0 && has_value) {
            a->config = argv[++i];
        } else if (strcmp(arg, "--upstream") == 0 && has_value) {
            a->upstream = argv[++i];
        } else if (strcmp(arg, "--metrics") == 0 && has_value) {
            a->metrics = argv[++i];
        } else if (strcmp(arg, "--log-level") == 0 && has_value
                   && rl_log_level_parse(argv[i + 1], &a->level) == 0) {
            a->level_given = true;
            i++;
        } else {
            fprintf(stderr, "rl-gateway: unexpected argument '%s'\n\n%s", arg,
                    usage);
            return EXIT_USAGE;
        }
    }
    if (a->listen == NULL || a->config == NULL) {
        fprintf(stderr, "rl-gateway: --listen and --config are required\n\n"
                "%s", usage);
        return EXIT_USAGE;
    }
    return 0;
}

/* Resolves host:port into a socket address, once, at start. */
static int resolve(const rl_endpoint *ep, struct sockaddr_storage *out)
{
    char port[8];
    snprintf(port, sizeof port, "%u", ep->port);
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res;
    if (getaddrinfo(ep->host, port, &hints, &res) != 0)
        return -1;
    memcpy(out, res->ai_addr, res->ai_addrlen);
    freeaddrinfo(res);
    return 0;
}

static int set_upstream(gw_server *srv, const char *url)
{
    rl_endpoint ep;
    static const char scheme[] = "http://";
    char hostport[RL_HOST_MAX + 16];
    if (strncmp(url, scheme, sizeof scheme - 1) != 0
        || snprintf(hostport, sizeof hostport, "%s",
                    url + sizeof scheme - 1) >= (int)sizeof hostport) {
        fprintf(stderr, "rl-gateway: --upstream '%s' is not "
                "http://host:port\n", url);
        return EXIT_USAGE;
    }
    size_t len = strlen(hostport);
    if (len > 0 && hostport[len - 1] == '/')
        hostport[len - 1] = '\0';
    if (rl_endpoint_parse(hostport, &ep) != RL_OK) {
        fprintf(stderr, "rl-gateway: --upstream '%s' is not "
                "http://host:port (a path is not supported)\n", url);
        return EXIT_USAGE;
    }
    if (resolve(&ep, &srv->upstream) != 0) {
        fprintf(stderr, "rl-gateway: cannot resolve the upstream host "
                "'%s'\n", ep.host);
        return EXIT_RUNTIME;
    }
    snprintf(srv->upstream_host, sizeof srv->upstream_host, "%s", hostport);
    srv->has_upstream = true;
    return 0;
}

static int load_tenants(gw_server *srv)
{
    char err[512];
    if (gw_load_tenants(srv->config, srv->config_path, &srv->tenants, err,
                        sizeof err) != 0) {
        fprintf(stderr, "rl-gateway: %s\n", err);
        return EXIT_RUNTIME;
    }
    return 0;
}

static void on_connection(uv_stream_t *listener, int status)
{
    gw_server *srv = listener->data;
    if (status == 0 && !srv->draining)
        gw_conn_accept(srv, listener,
                       listener == (uv_stream_t *)&srv->metrics_listener);
}

static void on_decided(uv_async_t *h)
{
    gw_conn_take_decisions(h->data);
}

static void close_handle(uv_handle_t *h)
{
    if (!uv_is_closing(h))
        uv_close(h, NULL);
}

/* The last step of a drain: the loop runs out of handles and returns. */
static void stop_loop(gw_server *srv)
{
    /* The signal handlers stay installed (closing them would restore the
     * default action) but no longer keep the loop running: a second
     * SIGTERM while the agent closes must not cut its last report short. */
    uv_unref((uv_handle_t *)&srv->sigterm);
    uv_unref((uv_handle_t *)&srv->sigint);
    uv_unref((uv_handle_t *)&srv->sighup);
    close_handle((uv_handle_t *)&srv->drain_timer);
    close_handle((uv_handle_t *)&srv->shadow_timer);
    close_handle((uv_handle_t *)&srv->decided);
}

void gw_server_conn_gone(gw_server *srv)
{
    if (srv->draining && srv->n_conns == 0)
        stop_loop(srv);
}

static void on_drain_timeout(uv_timer_t *t)
{
    gw_server *srv = t->data;
    rl_log(&srv->log, RL_LOG_WARN, "drain_timeout", "open=%zu",
           srv->n_conns);
    gw_conn_close_all(srv);
}

static void on_stop_signal(uv_signal_t *s, int signum)
{
    gw_server *srv = s->data;
    if (srv->draining)
        return;
    srv->draining = true;
    rl_log(&srv->log, RL_LOG_INFO, "stopping", "signal=%d open=%zu", signum,
           srv->n_conns);
    close_handle((uv_handle_t *)&srv->listener);
    close_handle((uv_handle_t *)&srv->metrics_listener);
    gw_conn_close_idle(srv);
    uv_timer_start(&srv->drain_timer, on_drain_timeout, GW_DRAIN_TIMEOUT_MS,
                   0);
    gw_server_conn_gone(srv);
}

static void on_reload_signal(uv_signal_t *s, int signum)
{
    gw_server *srv = s->data;
    (void)signum;
    if (!srv->draining && srv->agent != NULL)
        gw_reload(srv);
}

static void on_shadow_timer(uv_timer_t *t)
{
    gw_shadow_flush(t->data, false);
}

static int listen_on(uv_tcp_t *listener, const char *option,
                     const char *text)
{
    rl_endpoint ep;
    struct sockaddr_storage sa;
    if (rl_endpoint_parse(text, &ep) != RL_OK) {
        fprintf(stderr, "rl-gateway: %s '%s' is not host:port\n", option,
                text);
        return EXIT_USAGE;
    }
    int rc = resolve(&ep, &sa) != 0 ? UV_EINVAL : 0;
    if (rc == 0)
        rc = uv_tcp_bind(listener, (struct sockaddr *)&sa, 0);
    if (rc == 0)
        rc = uv_listen((uv_stream_t *)listener, 511, on_connection);
    if (rc != 0) {
        fprintf(stderr, "rl-gateway: cannot listen on %s: %s\n", text,
                uv_strerror(rc));
        return EXIT_RUNTIME;
    }
    return 0;
}

static void init_handles(gw_server *srv)
{
    uv_tcp_init(srv->loop, &srv->listener);
    uv_tcp_init(srv->loop, &srv->metrics_listener);
    srv->listener.data = srv->metrics_listener.data = srv;
    uv_async_init(srv->loop, &srv->decided, on_decided);
    uv_timer_init(srv->loop, &srv->drain_timer);
    uv_timer_init(srv->loop, &srv->shadow_timer);
    uv_signal_init(srv->loop, &srv->sigterm);
    uv_signal_init(srv->loop, &srv->sigint);
    uv_signal_init(srv->loop, &srv->sighup);
    srv->decided.data = srv->drain_timer.data = srv;
    srv->shadow_timer.data = srv;
    srv->sigterm.data = srv->sigint.data = srv->sighup.data = srv;
    uv_signal_start(&srv->sigterm, on_stop_signal, SIGTERM);
    uv_signal_start(&srv->sigint, on_stop_signal, SIGINT);
    uv_signal_start(&srv->sighup, on_reload_signal, SIGHUP);
    /* The shadow log's held-back counts; never what keeps the loop up. */
    uv_timer_start(&srv->shadow_timer, on_shadow_timer, 1000, 1000);
    uv_unref((uv_handle_t *)&srv->shadow_timer);
}

static int open_agent(gw_server *srv)
{
    rl_options o = {.config = srv->boot_config, .log = rl_log_to_stderr,
                    .log_level = srv->log.level};
    rl_error err;
    if (rl_agent_open(&srv->agent, &o, &err) != RL_OK) {
        fprintf(stderr, "rl-gateway: %s\n", err.message);
        return EXIT_RUNTIME;
    }
    return 0;
}

static int run(gw_server *srv, const args *a)
{
    int rc = 0;
    init_handles(srv);
    if (a->upstream != NULL)
        rc = set_upstream(srv, a->upstream);
    if (rc == 0)
        rc = load_tenants(srv);
    if (rc == 0 && a->metrics != NULL)
        rc = listen_on(&srv->metrics_listener, "--metrics", a->metrics);
    if (rc == 0 && (rc = listen_on(&srv->listener, "--listen", a->listen)) == 0
        && (rc = open_agent(srv)) == 0) {
        rl_log(&srv->log, RL_LOG_INFO, "listening", "addr=%s upstream=%s "
               "rules=%zu", a->listen, a->upstream ? a->upstream : "none",
               srv->config->n_rules);
        uv_run(srv->loop, UV_RUN_DEFAULT);
        /* Decisions still owed arrive before the agent's thread ends. */
        rl_agent_close(srv->agent);
        gw_shadow_flush(srv, true);
        rl_log(&srv->log, RL_LOG_INFO, "stopped", "%s", "");
    } else {
        /* Start failed: close what was opened so the loop can end. */
        close_handle((uv_handle_t *)&srv->listener);
        close_handle((uv_handle_t *)&srv->metrics_listener);
        stop_loop(srv);
    }
    /* The signal handles stay open (unref'd) until the process exits:
     * closing one restores the default action, and a second SIGTERM in
     * that moment would end the process with a signal, not exit 0. */
    uv_run(srv->loop, UV_RUN_DEFAULT);
    return rc;
}

int main(int argc, char **argv)
{
    /* A peer gone while libuv writes to it is an error to handle (EPIPE),
     * not a reason to die: libuv leaves SIGPIPE to the program. */
    signal(SIGPIPE, SIG_IGN);
    args a;
    bool done = false;
    int rc = parse_args(argc, argv, &a, &done);
    if (rc != 0 || done)
        return rc;
    /* Static, not on main's stack: its signal handles stay registered
     * until the process ends (see run()), and libuv's signal handler walks
     * them whenever a signal comes, also during exit() after main has
     * returned and its frame has been reused. */
    static gw_server srv;
    srv = (gw_server){.loop = uv_default_loop(),
                      .log = {rl_log_to_stderr, NULL, a.level},
                      .trust_forwarded_for = a.trust_forwarded_for,
                      .config_path = a.config};
    rl_error err;
    if (rl_config_load(a.config, &srv.boot_config, &err) != RL_OK) {
        fprintf(stderr, "rl-gateway: %s\n", err.message);
        return EXIT_CONFIG;
    }
    srv.config = srv.boot_config;
    if (!a.level_given)
        srv.log.level = srv.config->log_level;
    gw_attrs_collect(&srv);
    pthread_mutex_init(&srv.decided_lock, NULL);
    rc = run(&srv, &a);
    gw_tenant_map_free(srv.tenants);
    gw_shadow_free(&srv);
    /* Reloaded configs were the agent's and went with it. */
    rl_config_free(srv.boot_config);
    pthread_mutex_destroy(&srv.decided_lock);
    return rc;
}
