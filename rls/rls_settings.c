/*
 * rls_settings.c: one table of every variable envoyproxy/ratelimit reads
 * (its settings.go), each with upstream's default, its type as upstream
 * parses it (Go's strconv and time.ParseDuration, through envconfig), and
 * what rl-rls does with it.
 */
#include "rls_settings.h"

#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

typedef enum kind { STR, BOOL, INT, FLOAT, DURATION } kind;

typedef enum use {
    USED,        /* read into rls_settings */
    NO_EFFECT,   /* read strictly, named at start, no effect */
    UNSUPPORTED, /* refused unless at upstream's default */
} use;

#define NONE SIZE_MAX
#define AT(f) offsetof(rls_settings, f)

typedef struct var {
    const char *name;
    kind kind;
    const char *def;     /* upstream's default, as text */
    use use;
    size_t at;           /* the field, for USED */
    const char *choices; /* "a|b|c" (case-insensitive) for a STR, or NULL */
    const char *why;     /* for NO_EFFECT and UNSUPPORTED */
} var;

static const var vars[] = {
    {"HOST", STR, "0.0.0.0", USED, AT(host), NULL, NULL},
    {"PORT", INT, "8080", USED, AT(port), NULL, NULL},
    {"DEBUG_HOST", STR, "0.0.0.0", USED, AT(debug_host), NULL, NULL},
    {"DEBUG_PORT", INT, "6070", USED, AT(debug_port), NULL, NULL},
    {"GRPC_HOST", STR, "0.0.0.0", USED, AT(grpc_host), NULL, NULL},
    {"GRPC_PORT", INT, "8081", USED, AT(grpc_port), NULL, NULL},
    {"GRPC_UDS", STR, "", UNSUPPORTED, NONE, NULL,
     "a Unix socket for gRPC is not supported: use GRPC_HOST/GRPC_PORT"},
    {"GRPC_MAX_CONNECTION_AGE", DURATION, "24h", USED,
     AT(grpc_max_connection_age_ms), NULL, NULL},
    {"GRPC_MAX_CONNECTION_AGE_GRACE", DURATION, "1h", USED,
     AT(grpc_max_connection_age_grace_ms), NULL, NULL},
    {"GRPC_SERVER_USE_TLS", BOOL, "false", USED, AT(grpc_server_use_tls),
     NULL, NULL},
    {"GRPC_SERVER_TLS_CERT", STR, "", USED, AT(grpc_server_tls_cert), NULL,
     NULL},
    {"GRPC_SERVER_TLS_KEY", STR, "", USED, AT(grpc_server_tls_key), NULL,
     NULL},
    {"GRPC_CLIENT_TLS_CACERT", STR, "", USED, AT(grpc_client_tls_cacert),
     NULL, NULL},
    {"GRPC_CLIENT_TLS_SAN", STR, "", USED, AT(grpc_client_tls_san), NULL,
     NULL},
    {"LOG_LEVEL", STR, "WARN", USED, AT(log_level),
     "trace|debug|info|warn|warning|error|fatal|panic", NULL},
    {"LOG_FORMAT", STR, "text", USED, AT(log_format), "text|json", NULL},
    {"CONFIG_TYPE", STR, "FILE", UNSUPPORTED, NONE, NULL,
     "rl-rls reads its config from files (FILE); xDS is not supported"},
    {"FORCE_START_WITHOUT_INITIAL_CONFIG", BOOL, "false", USED,
     AT(force_start_without_initial_config), NULL, NULL},
    {"CONFIG_GRPC_XDS_NODE_ID", STR, "default", UNSUPPORTED, NONE, NULL,
     "xDS is not supported"},
    {"CONFIG_GRPC_XDS_NODE_METADATA", STR, "", UNSUPPORTED, NONE, NULL,
     "xDS is not supported"},
    {"CONFIG_GRPC_XDS_SERVER_URL", STR, "localhost:18000", UNSUPPORTED, NONE,
     NULL, "xDS is not supported"},
    {"CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", DURATION, "3s",
     UNSUPPORTED, NONE, NULL, "xDS is not supported"},
    {"CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", STR, "", UNSUPPORTED,
     NONE, NULL, "xDS is not supported"},
    {"CONFIG_GRPC_XDS_SERVER_USE_TLS", BOOL, "false", UNSUPPORTED, NONE,
     NULL, "xDS is not supported"},
    {"CONFIG_GRPC_XDS_CLIENT_TLS_CERT", STR, "", UNSUPPORTED, NONE, NULL,
     "xDS is not supported"},
    {"CONFIG_GRPC_XDS_CLIENT_TLS_KEY", STR, "", UNSUPPORTED, NONE, NULL,
     "xDS is not supported"},
    {"CONFIG_GRPC_XDS_SERVER_TLS_CACERT", STR, "", UNSUPPORTED, NONE, NULL,
     "xDS is not supported"},
    {"CONFIG_GRPC_XDS_SERVER_TLS_SAN", STR, "", UNSUPPORTED, NONE, NULL,
     "xDS is not supported"},
    {"XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", DURATION, "10s", UNSUPPORTED,
     NONE, NULL, "xDS is not supported"},
    {"XDS_CLIENT_BACKOFF_MAX_INTERVAL", DURATION, "60s", UNSUPPORTED, NONE,
     NULL, "xDS is not supported"},
    {"XDS_CLIENT_BACKOFF_RANDOM_FACTOR", FLOAT, "0.5", UNSUPPORTED, NONE,
     NULL, "xDS is not supported"},
    {"XDS_CLIENT_BACKOFF_JITTER", BOOL, "true", UNSUPPORTED, NONE, NULL,
     "xDS is not supported"},
    {"XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", INT, "0", UNSUPPORTED, NONE, NULL,
     "xDS is not supported"},
    {"USE_DOG_STATSD", BOOL, "false", NO_EFFECT, NONE, NULL,
     "rl-rls has no statsd output: its metrics are Prometheus's "
     "(USE_PROMETHEUS)"},
    {"USE_DOG_STATSD_MOGRIFIERS", STR, "", NO_EFFECT, NONE, NULL,
     "no statsd output"},
    {"USE_STATSD", BOOL, "true", NO_EFFECT, NONE, NULL,
     "rl-rls has no statsd output: its metrics are Prometheus's "
     "(USE_PROMETHEUS)"},
    {"STATSD_HOST", STR, "localhost", NO_EFFECT, NONE, NULL,
     "no statsd output"},
    {"STATSD_PORT", INT, "8125", NO_EFFECT, NONE, NULL, "no statsd output"},
    {"EXTRA_TAGS", STR, "", NO_EFFECT, NONE, NULL, "no statsd output"},
    {"STATS_FLUSH_INTERVAL", DURATION, "10s", NO_EFFECT, NONE, NULL,
     "no statsd output"},
    {"DISABLE_STATS", BOOL, "false", NO_EFFECT, NONE, NULL,
     "the metrics are served only when asked for (USE_PROMETHEUS)"},
    {"USE_PROMETHEUS", BOOL, "false", USED, AT(use_prometheus), NULL, NULL},
    {"PROMETHEUS_ADDR", STR, ":9090", USED, AT(prometheus_addr), NULL, NULL},
    {"PROMETHEUS_PATH", STR, "/metrics", USED, AT(prometheus_path), NULL,
     NULL},
    {"PROMETHEUS_MAPPER_YAML", STR, "", UNSUPPORTED, NONE, NULL,
     "the metrics keep upstream's default names; a mapper is not "
     "supported"},
    {"PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS", BOOL, "false", NO_EFFECT,
     NONE, NULL, "response times are histograms in seconds"},
    {"RUNTIME_ROOT", STR, "/srv/runtime_data/current", USED,
     AT(runtime_root), NULL, NULL},
    {"RUNTIME_SUBDIRECTORY", STR, "", USED, AT(runtime_subdirectory), NULL,
     NULL},
    {"RUNTIME_APPDIRECTORY", STR, "config", USED, AT(runtime_appdirectory),
     NULL, NULL},
    {"RUNTIME_IGNOREDOTFILES", BOOL, "false", USED,
     AT(runtime_ignoredotfiles), NULL, NULL},
    {"RUNTIME_WATCH_ROOT", BOOL, "true", USED, AT(runtime_watch_root), NULL,
     NULL},
    {"EXPIRATION_JITTER_MAX_SECONDS", INT, "300", USED,
     AT(expiration_jitter_max_seconds), NULL, NULL},
    {"LOCAL_CACHE_SIZE_IN_BYTES", INT, "0", NO_EFFECT, NONE, NULL,
     "over-limit answers need no cache: a key over its limit costs one "
     "Redis call, pipelined"},
    {"NEAR_LIMIT_RATIO", FLOAT, "0.8", USED, AT(near_limit_ratio), NULL,
     NULL},
    {"CACHE_KEY_PREFIX", STR, "", USED, AT(cache_key_prefix), NULL, NULL},
    {"BACKEND_TYPE", STR, "redis", UNSUPPORTED, NONE, NULL,
     "rl-rls keeps its counters in Redis; memcache is not supported"},
    {"STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", BOOL, "false", USED,
     AT(stop_cache_key_increment_when_overlimit), NULL, NULL},
    {"LIMIT_RESPONSE_HEADERS_ENABLED", BOOL, "false", USED,
     AT(limit_response_headers_enabled), NULL, NULL},
    {"LIMIT_LIMIT_HEADER", STR, "RateLimit-Limit", USED,
     AT(limit_limit_header), NULL, NULL},
    {"LIMIT_REMAINING_HEADER", STR, "RateLimit-Remaining", USED,
     AT(limit_remaining_header), NULL, NULL},
    {"LIMIT_RESET_HEADER", STR, "RateLimit-Reset", USED,
     AT(limit_reset_header), NULL, NULL},
    {"HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", BOOL, "false", USED,
     AT(healthy_with_at_least_one_config_loaded), NULL, NULL},
    {"REDIS_SOCKET_TYPE", STR, "unix", USED, AT(redis_socket_type),
     "tcp|unix", NULL},
    {"REDIS_TYPE", STR, "SINGLE", USED, AT(redis_type),
     "single|cluster|sentinel", NULL},
    {"REDIS_URL", STR, "/var/run/nutcracker/ratelimit.sock", USED,
     AT(redis_url), NULL, NULL},
    {"REDIS_POOL_SIZE", INT, "10", NO_EFFECT, NONE, NULL,
     "rl-rls pipelines every call on one connection per loop"},
    {"REDIS_AUTH", STR, "", USED, AT(redis_auth), NULL, NULL},
    {"REDIS_TLS", BOOL, "false", USED, AT(redis_tls), NULL, NULL},
    {"REDIS_TLS_CLIENT_CERT", STR, "", USED, AT(redis_tls_client_cert), NULL,
     NULL},
    {"REDIS_TLS_CLIENT_KEY", STR, "", USED, AT(redis_tls_client_key), NULL,
     NULL},
    {"REDIS_TLS_CACERT", STR, "", USED, AT(redis_tls_cacert), NULL, NULL},
    {"REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", BOOL, "false", USED,
     AT(redis_tls_skip_hostname_verification), NULL, NULL},
    {"REDIS_PIPELINE_WINDOW", DURATION, "0", NO_EFFECT, NONE, NULL,
     "rl-rls pipelines every call written in one turn of its loop"},
    {"REDIS_PIPELINE_LIMIT", INT, "0", NO_EFFECT, NONE, NULL,
     "rl-rls pipelines every call written in one turn of its loop"},
    {"REDIS_CLUSTER_PIPELINE_PARALLELISM", INT, "1", NO_EFFECT, NONE, NULL,
     "each cluster node has its own pipeline"},
    {"REDIS_PERSECOND", BOOL, "false", UNSUPPORTED, NONE, NULL,
     "a second Redis for per-second limits is not supported"},
    {"REDIS_PERSECOND_SOCKET_TYPE", STR, "unix", UNSUPPORTED, NONE, NULL,
     "a second Redis for per-second limits is not supported"},
    {"REDIS_PERSECOND_TYPE", STR, "SINGLE", UNSUPPORTED, NONE, NULL,
     "a second Redis for per-second limits is not supported"},
    {"REDIS_PERSECOND_URL", STR, "/var/run/nutcracker/ratelimitpersecond.sock",
     UNSUPPORTED, NONE, NULL,
     "a second Redis for per-second limits is not supported"},
    {"REDIS_PERSECOND_POOL_SIZE", INT, "10", NO_EFFECT, NONE, NULL,
     "no second Redis"},
    {"REDIS_PERSECOND_AUTH", STR, "", UNSUPPORTED, NONE, NULL,
     "a second Redis for per-second limits is not supported"},
    {"REDIS_PERSECOND_TLS", BOOL, "false", UNSUPPORTED, NONE, NULL,
     "a second Redis for per-second limits is not supported"},
    {"REDIS_SENTINEL_AUTH", STR, "", USED, AT(redis_sentinel_auth), NULL,
     NULL},
    {"REDIS_PERSECOND_SENTINEL_AUTH", STR, "", UNSUPPORTED, NONE, NULL,
     "a second Redis for per-second limits is not supported"},
    {"REDIS_PERSECOND_PIPELINE_WINDOW", DURATION, "0", NO_EFFECT, NONE, NULL,
     "no second Redis"},
    {"REDIS_PERSECOND_PIPELINE_LIMIT", INT, "0", NO_EFFECT, NONE, NULL,
     "no second Redis"},
    {"REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM", INT, "1", NO_EFFECT,
     NONE, NULL, "no second Redis"},
    {"REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", BOOL, "false", NO_EFFECT, NONE,
     NULL, "/healthcheck fails while no config is loaded or at a drain; "
     "Redis's state is in the metrics and the log"},
    {"REDIS_TIMEOUT", DURATION, "10s", USED, AT(redis_timeout_ms), NULL,
     NULL},
    {"REDIS_PERSECOND_TIMEOUT", DURATION, "10s", NO_EFFECT, NONE, NULL,
     "no second Redis"},
    {"REDIS_POOL_ON_EMPTY_BEHAVIOR", STR, "WAIT", NO_EFFECT, NONE, NULL,
     "there is no pool to run empty"},
    {"REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR", STR, "WAIT", NO_EFFECT, NONE,
     NULL, "no second Redis"},
    {"REDIS_STARTUP_INITIAL_INTERVAL", DURATION, "1s", NO_EFFECT, NONE, NULL,
     "rl-rls starts without Redis and reconnects with its own back-off"},
    {"REDIS_STARTUP_MAX_INTERVAL", DURATION, "30s", NO_EFFECT, NONE, NULL,
     "rl-rls starts without Redis and reconnects with its own back-off"},
    {"REDIS_STARTUP_MAX_ELAPSED_TIME", DURATION, "0", NO_EFFECT, NONE, NULL,
     "rl-rls starts without Redis and reconnects with its own back-off"},
    {"MEMCACHE_HOST_PORT", STR, "", UNSUPPORTED, NONE, NULL,
     "memcache is not supported"},
    {"MEMCACHE_MAX_IDLE_CONNS", INT, "2", NO_EFFECT, NONE, NULL,
     "no memcache"},
    {"MEMCACHE_SRV", STR, "", UNSUPPORTED, NONE, NULL,
     "memcache is not supported"},
    {"MEMCACHE_SRV_REFRESH", DURATION, "0", NO_EFFECT, NONE, NULL,
     "no memcache"},
    {"MEMCACHE_TLS", BOOL, "false", UNSUPPORTED, NONE, NULL,
     "memcache is not supported"},
    {"MEMCACHE_TLS_CLIENT_CERT", STR, "", NO_EFFECT, NONE, NULL,
     "no memcache"},
    {"MEMCACHE_TLS_CLIENT_KEY", STR, "", NO_EFFECT, NONE, NULL,
     "no memcache"},
    {"MEMCACHE_TLS_CACERT", STR, "", NO_EFFECT, NONE, NULL, "no memcache"},
    {"MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION", BOOL, "false", NO_EFFECT,
     NONE, NULL, "no memcache"},
    {"SHADOW_MODE", BOOL, "false", USED, AT(shadow_mode), NULL, NULL},
    {"QUOTA_MODE", BOOL, "false", USED, AT(quota_mode), NULL, NULL},
    {"RESPONSE_DYNAMIC_METADATA", BOOL, "false", UNSUPPORTED, NONE, NULL,
     "dynamic metadata in responses is not supported"},
    {"MERGE_DOMAIN_CONFIG", BOOL, "false", USED, AT(merge_domain_config),
     NULL, NULL},
    {"TRACING_ENABLED", BOOL, "false", UNSUPPORTED, NONE, NULL,
     "tracing is not supported"},
    {"TRACING_SERVICE_NAME", STR, "RateLimit", NO_EFFECT, NONE, NULL,
     "no tracing"},
    {"TRACING_SERVICE_NAMESPACE", STR, "", NO_EFFECT, NONE, NULL,
     "no tracing"},
    {"TRACING_SERVICE_INSTANCE_ID", STR, "", NO_EFFECT, NONE, NULL,
     "no tracing"},
    {"TRACING_EXPORTER_PROTOCOL", STR, "http", NO_EFFECT, NONE, NULL,
     "no tracing"},
    {"TRACING_SAMPLING_RATE", FLOAT, "1", NO_EFFECT, NONE, NULL,
     "no tracing"},
};

/* --- Go's parsers ------------------------------------------------------ */

/* strconv.ParseBool. */
static int parse_bool(const char *s, bool *out)
{
    static const char *const yes[] = {"1", "t", "T", "TRUE", "true", "True"};
    static const char *const no[] = {"0", "f", "F", "FALSE", "false",
                                     "False"};
    for (size_t i = 0; i < 6; i++) {
        if (strcmp(s, yes[i]) == 0) {
            *out = true;
            return 0;
        }
        if (strcmp(s, no[i]) == 0) {
            *out = false;
            return 0;
        }
    }
    return -1;
}

/* A decimal integer, as strconv.ParseInt takes one (an optional sign). */
static int parse_int(const char *s, int64_t *out)
{
    if (*s == '\0' || isspace((unsigned char)*s))
        return -1;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno != 0 || *end != '\0')
        return -1;
    *out = v;
    return 0;
}

static int parse_float(const char *s, double *out)
{
    if (*s == '\0' || isspace((unsigned char)*s))
        return -1;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno != 0 || *end != '\0' || isnan(v))
        return -1;
    *out = v;
    return 0;
}

static const struct {
    const char *unit;
    double ms;
} duration_units[] = {
    {"ns", 1e-6}, {"us", 1e-3}, {"\xc2\xb5s", 1e-3}, {"\xce\xbcs", 1e-3},
    {"ms", 1},    {"s", 1e3},   {"m", 60e3},         {"h", 3600e3},
};

int rls_parse_duration_ms(const char *s, int64_t *ms)
{
    bool negative = *s == '-';
    if (*s == '-' || *s == '+')
        s++;
    if (strcmp(s, "0") == 0) {
        *ms = 0;
        return 0;
    }
    if (*s == '\0')
        return -1;
    double total = 0;
    while (*s != '\0') {
        /* digits, and a fraction: "1", "1.5", ".5", "1." */
        double v = 0, scale = 1;
        int digits = 0;
        for (; isdigit((unsigned char)*s); s++, digits++)
            v = v * 10 + (*s - '0');
        if (*s == '.') {
            for (s++; isdigit((unsigned char)*s); s++, digits++)
                v += (*s - '0') * (scale /= 10);
        }
        if (digits == 0)
            return -1;
        size_t best = 0, len = 0;
        for (size_t i = 0; i < sizeof duration_units / sizeof *duration_units;
             i++) {
            size_t n = strlen(duration_units[i].unit);
            if (n > len && strncmp(s, duration_units[i].unit, n) == 0) {
                best = i;
                len = n;
            }
        }
        if (len == 0)
            return -1; /* Go: "missing unit in duration" */
        total += v * duration_units[best].ms;
        s += len;
    }
    if (total > 9.2e15)
        return -1;
    *ms = (int64_t)(negative ? -total : total);
    return 0;
}

/* --- Reading ----------------------------------------------------------- */

static bool is_choice(const char *value, const char *choices)
{
    size_t n = strlen(value);
    for (const char *c = choices; *c != '\0';) {
        const char *bar = strchr(c, '|');
        size_t len = bar != NULL ? (size_t)(bar - c) : strlen(c);
        if (len == n && strncasecmp(c, value, n) == 0)
            return true;
        c += len + (bar != NULL);
    }
    return false;
}

/* "a, b or c" from "a|b|c". */
static void say_choices(const char *choices, char *buf, size_t cap)
{
    size_t at = 0;
    int parts = 1;
    for (const char *c = choices; *c != '\0'; c++)
        parts += *c == '|';
    int part = 0;
    for (const char *c = choices; *c != '\0' && at + 8 < cap;) {
        const char *bar = strchr(c, '|');
        size_t len = bar != NULL ? (size_t)(bar - c) : strlen(c);
        const char *sep = part == 0 ? "" : part == parts - 1 ? " or " : ", ";
        at += (size_t)snprintf(buf + at, cap - at, "%s%.*s", sep, (int)len,
                               c);
        part++;
        c += len + (bar != NULL);
    }
}

static const char *kind_name(kind k)
{
    switch (k) {
    case BOOL:
        return "a boolean (true, false, 1, 0, t, f)";
    case INT:
        return "an integer";
    case FLOAT:
        return "a number";
    case DURATION:
        return "a duration (300ms, 10s, 1h30m)";
    default:
        return "a string";
    }
}

/* Parses value as v's type into the field at out (NULL: only checks). */
static int parse_as(const var *v, const char *value, void *out)
{
    bool b;
    int64_t i;
    double d;
    switch (v->kind) {
    case BOOL:
        if (parse_bool(value, &b) != 0)
            return -1;
        if (out != NULL)
            *(bool *)out = b;
        return 0;
    case INT:
        if (parse_int(value, &i) != 0)
            return -1;
        if (out != NULL)
            *(int64_t *)out = i;
        return 0;
    case FLOAT:
        if (parse_float(value, &d) != 0)
            return -1;
        if (out != NULL)
            *(double *)out = d;
        return 0;
    case DURATION:
        if (rls_parse_duration_ms(value, &i) != 0)
            return -1;
        if (out != NULL)
            *(int64_t *)out = i;
        return 0;
    default:
        if (v->choices != NULL && !is_choice(value, v->choices))
            return -1;
        if (out != NULL) {
            char *copy = strdup(value);
            if (copy == NULL)
                return -1;
            if (v->choices != NULL) {
                for (char *c = copy; *c != '\0'; c++)
                    *c = (char)tolower((unsigned char)*c);
            }
            free(*(char **)out);
            *(char **)out = copy;
        }
        return 0;
    }
}

/* Whether value means what upstream's default does. */
static bool is_default(const var *v, const char *value)
{
    bool a, b;
    int64_t x, y;
    double f, g;
    switch (v->kind) {
    case BOOL:
        return parse_bool(value, &a) == 0 && parse_bool(v->def, &b) == 0
               && a == b;
    case INT:
        return parse_int(value, &x) == 0 && parse_int(v->def, &y) == 0
               && x == y;
    case FLOAT:
        return parse_float(value, &f) == 0 && parse_float(v->def, &g) == 0
               && f == g;
    case DURATION:
        return rls_parse_duration_ms(value, &x) == 0
               && rls_parse_duration_ms(v->def, &y) == 0 && x == y;
    default:
        return strcasecmp(value, v->def) == 0;
    }
}

static int refuse(const var *v, const char *value, char *err, size_t cap)
{
    char choices[200] = "";
    if (v->kind == STR && v->choices != NULL)
        say_choices(v->choices, choices, sizeof choices);
    snprintf(err, cap, "%s=\"%s\": not %s", v->name, value,
             choices[0] != '\0' ? choices : kind_name(v->kind));
    return -1;
}

/* Ports as upstream's listeners take them. */
static int check_ports(const rls_settings *s, char *err, size_t cap)
{
    const struct {
        const char *name;
        int64_t port;
    } ports[] = {{"PORT", s->port},
                 {"DEBUG_PORT", s->debug_port},
                 {"GRPC_PORT", s->grpc_port}};
    for (size_t i = 0; i < 3; i++) {
        if (ports[i].port < 0 || ports[i].port > 65535) {
            snprintf(err, cap, "%s=\"%lld\": not a port (0 to 65535)",
                     ports[i].name, (long long)ports[i].port);
            return -1;
        }
    }
    if (s->near_limit_ratio < 0 || s->near_limit_ratio > 1) {
        snprintf(err, cap, "NEAR_LIMIT_RATIO=\"%g\": not between 0 and 1",
                 s->near_limit_ratio);
        return -1;
    }
    return 0;
}

static void note(char *notes, size_t cap, const var *v, const char *value)
{
    size_t at = strlen(notes);
    if (at < cap)
        snprintf(notes + at, cap - at, "%s=\"%s\": no effect in rl-rls (%s)\n",
                 v->name, value, v->why);
}

/* REDIS_TIMEOUT is how long a call waits for Redis, as rl's
 * store.timeout_ms is, whose bounds it takes. Unset, rl's own default
 * holds: upstream's 10 s is what let a dead Redis hold every call. */
static int read_redis_timeout(rls_settings *s, rls_env_fn env, void *arg,
                              char *err, size_t cap)
{
    const char *set = env("REDIS_TIMEOUT", arg);
    if (set == NULL)
        return 0;
    s->redis_timeout_given = true;
    if (s->redis_timeout_ms >= 1
        && s->redis_timeout_ms <= RL_STORE_TIMEOUT_MAX_MS)
        return 0;
    snprintf(err, cap, "REDIS_TIMEOUT=\"%s\": not between 1ms and %us "
             "(how long a call waits for Redis: rl's store.timeout_ms)", set,
             RL_STORE_TIMEOUT_MAX_MS / 1000);
    return -1;
}

int rls_settings_read(rls_settings *s, rls_env_fn env, void *arg, char *err,
                      size_t cap, char *notes, size_t notes_cap)
{
    memset(s, 0, sizeof *s);
    if (notes_cap > 0)
        notes[0] = '\0';
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++) {
        const var *v = &vars[i];
        const char *set = env(v->name, arg);
        const char *value = set != NULL ? set : v->def;
        void *field = v->use == USED ? (char *)s + v->at : NULL;
        if (parse_as(v, value, field) != 0)
            return refuse(v, value, err, cap);
        if (set == NULL || is_default(v, set))
            continue;
        if (v->use == UNSUPPORTED) {
            snprintf(err, cap, "%s=\"%s\": %s", v->name, set, v->why);
            return -1;
        }
        if (v->use == NO_EFFECT)
            note(notes, notes_cap, v, set);
    }
    if (read_redis_timeout(s, env, arg, err, cap) != 0)
        return -1;
    return check_ports(s, err, cap);
}

void rls_settings_free(rls_settings *s)
{
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++) {
        if (vars[i].use == USED && vars[i].kind == STR) {
            char **field = (char **)((char *)s + vars[i].at);
            free(*field);
            *field = NULL;
        }
    }
}
