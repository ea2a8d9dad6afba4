/*
 * gateway.h: rl-gateway, the reference HTTP gateway that links librl. One
 * libuv loop serves every connection; checks go to the agent with
 * rl_check_async and their decisions come back to the loop through an
 * async handle, so a slow check never holds up another connection.
 *
 * It reads the rules config through rl's private config.h (for the rules'
 * attribute names and gateway.tenant_map), as rl's own programs do; a
 * gateway of your own needs only rl.h (see the README).
 */
#ifndef RL_GATEWAY_H
#define RL_GATEWAY_H

#include "config.h"
#include "log.h"
#include "rl.h"

#include <http_parser.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <uv.h>

/* Bounds on what a client may send (anything larger is refused, never cut
 * short): the request line's target, headers and body. */
#define GW_URL_MAX 8192
#define GW_HEADERS_MAX 100
#define GW_HEADER_BYTES_MAX 65536
#define GW_BODY_MAX (1024 * 1024)
/* An upstream response is buffered whole before it is sent on. */
#define GW_UPSTREAM_BODY_MAX (8 * 1024 * 1024)
#define GW_UPSTREAM_TIMEOUT_MS 30000
#define GW_IDLE_TIMEOUT_MS 60000
#define GW_DRAIN_TIMEOUT_MS 10000

typedef struct gw_buf {
    char *data;
    size_t len, cap;
} gw_buf;

/* Appends; -1 if the buffer would grow past max bytes or memory is out. */
int gw_buf_append(gw_buf *b, const char *p, size_t n, size_t max);
int gw_buf_printf(gw_buf *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
int gw_buf_vprintf(gw_buf *b, const char *fmt, va_list args)
    __attribute__((format(printf, 2, 0)));
void gw_buf_free(gw_buf *b);

typedef struct gw_header {
    gw_buf name, value;
} gw_header;

/* One HTTP message as parsed: a request from a client, or an upstream's
 * response. */
typedef struct gw_message {
    gw_buf url;
    gw_header headers[GW_HEADERS_MAX];
    int n_headers;
    size_t header_bytes;
    bool in_value;          /* the parser is inside a header's value */
    gw_buf body;
    size_t body_max;
    bool skip_body;         /* a response to HEAD: no body follows */
    int method;             /* a request's enum http_method; -1 for a
                             * response */
    int error_status;       /* an HTTP status to refuse it with, or 0 */
    const char *error;      /* and why */
    bool complete;
} gw_message;

void gw_message_reset(gw_message *m);
/* Header callbacks for http_parser: parser->data is the gw_message. */
void gw_message_settings(http_parser_settings *s);
/* A header's value (case-insensitive name), NUL-terminated, or NULL. */
const char *gw_message_header(const gw_message *m, const char *name);

typedef struct gw_tenant_map gw_tenant_map;

typedef struct gw_server gw_server;
typedef struct gw_conn gw_conn;

/* Responses the gateway wrote, by status class, for /metrics. */
typedef struct gw_counts {
    uint64_t by_status[6];     /* 1xx..5xx, by status / 100 */
    uint64_t upstream_errors;  /* 502 and 504 */
} gw_counts;

/* Shadow rejections logged per rule: one line a second at most, carrying
 * how many were not logged since (shadow.c). */
typedef struct gw_shadow_entry {
    char rule[RL_RULE_NAME_MAX + 1];
    uint64_t last_ms;     /* loop time of its last line; 0: none yet */
    uint64_t suppressed;  /* rejections since, not logged */
} gw_shadow_entry;

typedef struct gw_shadow_log {
    gw_shadow_entry *entries;
    size_t n, cap;
    uint64_t unnamed_suppressed; /* past a decision's RL_SHADOW_NAMES_MAX */
    uint64_t unnamed_last_ms;
} gw_shadow_log;

struct gw_server {
    uv_loop_t *loop;
    uv_tcp_t listener;
    uv_tcp_t metrics_listener; /* --metrics: GET /metrics only */
    bool has_metrics;
    gw_counts counts;
    rl_agent *agent;
    /* The config the agent was opened with (borrowed by it, so kept until
     * exit), and the one in force: the last reloaded one, which the agent
     * owns (rl_agent_reload_config) and which stays readable until the
     * next reload. */
    rl_config *boot_config;
    rl_config *config;
    const char *config_path;
    rl_logger log;
    gw_tenant_map *tenants;
    uint64_t reloads, reloads_failed;
    gw_shadow_log shadow;
    bool trust_forwarded_for;
    bool has_upstream;
    struct sockaddr_storage upstream;
    char upstream_host[300];    /* Host: header for the upstream */
    /* The attributes the rules name (match parts, when, overrides' when,
     * `attributes:`) that come from headers: not the built-ins. */
    const char *attr_names[RL_ATTRS_MAX];
    size_t n_attr_names;

    /* Decisions from the agent's thread, handed to the loop. */
    uv_async_t decided;
    pthread_mutex_t decided_lock;
    gw_conn *decided_head;

    uv_signal_t sigterm, sigint, sighup;
    uv_timer_t drain_timer;
    uv_timer_t shadow_timer;    /* logs what the limiter held back */
    bool draining;
    gw_conn *conns;             /* every open connection */
    size_t n_conns;
};

/* conn.c: a client connection (metrics: one of the --metrics socket). */
void gw_conn_accept(gw_server *srv, uv_stream_t *listener, bool metrics);
/* Runs on the loop: the decisions the agent has delivered. */
void gw_conn_take_decisions(gw_server *srv);
/* Drain: closes the connections that hold no request. */
void gw_conn_close_idle(gw_server *srv);
void gw_conn_close_all(gw_server *srv);
/* main.c: a connection is gone (the drain ends with the last one). */
void gw_server_conn_gone(gw_server *srv);

/* attrs.c: the request's attributes for the rules. Values point into the
 * message, the tenant map, the config, peer_ip or out itself: they live as
 * long as those. A header that is present but empty counts as absent. */
typedef struct gw_attrs {
    rl_attr attrs[RL_ATTRS_MAX];
    size_t n;
    char ip[INET6_ADDRSTRLEN + 1];  /* the first X-Forwarded-For hop */
    char api_key[RL_VALUE_MAX + 1]; /* for the tenant map */
} gw_attrs;

void gw_attrs_of(const gw_server *srv, const gw_message *req,
                 const char *peer_ip, gw_attrs *out);
/* Whether name is an attribute the gateway supplies itself (ip, api_key,
 * tenant, plan, method, path, host, route), never from a header of that
 * name. */
bool gw_attr_builtin(const char *name);
/* Sets srv->attr_names from srv->config. */
void gw_attrs_collect(gw_server *srv);
/* The path of a request target: before '?' (and '#'); of an absolute-form
 * target, the part after the authority ("/" if none). */
void gw_attrs_path(const char *url, size_t url_len, const char **path,
                   size_t *len);
/* The route of a path: the name of the longest gateway.routes prefix it
 * starts with, else NULL. */
const char *gw_attrs_route(const rl_config *cfg, const char *path,
                           size_t len);

/* shadow.c: one log line per rule per second at most for the shadow
 * rejections in a decision; the timer logs what was held back. */
void gw_shadow_note(gw_server *srv, const rl_decision *d,
                    const char *peer_ip);
void gw_shadow_flush(gw_server *srv, bool all);
void gw_shadow_free(gw_server *srv);

/* reload.c: SIGHUP: the config and the tenant map again, through
 * rl_agent_reload_config; an invalid one is logged and the old one kept. */
int gw_load_tenants(const rl_config *cfg, const char *config_path,
                    gw_tenant_map **out, char *err, size_t errlen);
void gw_reload(gw_server *srv);

/* tenant_map.c: api_key -> tenant and plan, from a file of "api_key tenant
 * [plan]" lines. */
int gw_tenant_map_load(const char *path, gw_tenant_map **out, char *err,
                       size_t errlen);
/* The key's tenant and plan (NULL when its line has none); false (both
 * NULL) when the key is not in the map or map is NULL. */
bool gw_tenant_map_find(const gw_tenant_map *map, const char *api_key,
                        const char **tenant, const char **plan);
size_t gw_tenant_map_size(const gw_tenant_map *map);
void gw_tenant_map_free(gw_tenant_map *map);

/* respond.c: the gateway's own responses. */
void gw_respond_decision(gw_buf *out, const rl_decision *d, bool keep_alive,
                         bool head);
void gw_respond_error(gw_buf *out, int status, const char *error,
                      const char *reason, bool keep_alive);
/* metrics.c: the Prometheus text for GET /metrics. */
void gw_respond_metrics(gw_buf *out, gw_server *srv, const char *path,
                        bool keep_alive);

/* Headers that belong to one hop (and framing), not passed on. */
bool gw_is_hop_by_hop(const char *name);
/* An upstream's response, sent on with the decision's headers. */
void gw_respond_proxied(gw_buf *out, const gw_message *resp, int status,
                        const rl_decision *d, bool keep_alive);

/* upstream.c: forwards the connection's request; calls
 * gw_conn_upstream_done once, with the response or a status to refuse with
 * (502, 504). Returns the exchange, or NULL when it is over already. */
typedef struct gw_upstream gw_upstream;
gw_upstream *gw_upstream_forward(gw_conn *c);
/* Ends the exchange now, for why: gw_conn_upstream_done gets no response
 * (status 499). */
void gw_upstream_cancel(gw_upstream *u, const char *why);

/* cost.c: whether requests are checked with rl_check_hold (the config has
 * gateway.cost_header or an in_flight rule), and what each one holds. */
bool gw_holds(const gw_server *srv);
/* What a request's check has in force for its cost, kept by the request
 * to its end: a reload meanwhile applies to the requests checked after
 * it. header is gateway.cost_header ("" for none). */
typedef struct gw_cost {
    uint32_t estimate;
    char header[RL_NAME_MAX + 1];
} gw_cost;
void gw_cost_of(const gw_server *srv, gw_cost *out);
/* Ends hold: at the cost resp's cost->header gives, or at its estimate
 * (resp NULL, or no usable value: logged). */
void gw_cost_end(gw_server *srv, rl_hold *hold, const gw_cost *cost,
                 const gw_message *resp, const char *peer_ip);

/* conn.c, for upstream.c. */
typedef struct gw_conn_view {
    gw_server *srv;
    const gw_message *req;
    http_parser *parser;
    const char *peer_ip;
} gw_conn_view;
gw_conn_view gw_conn_view_of(gw_conn *c);
void gw_conn_upstream_done(gw_conn *c, const gw_message *resp, int status,
                           const char *error);

#endif
