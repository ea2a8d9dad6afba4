/*
 * rls_settings.h: envoyproxy/ratelimit's environment variables, as rl-rls
 * reads them. Every variable upstream reads is known here, in one of three
 * kinds: used (read strictly, with upstream's default), of no effect in
 * rl-rls (read strictly too, so that a typo is still refused, and named at
 * start: REDIS_POOL_SIZE, the statsd settings), or not supported (refused
 * at start when set to anything but upstream's default: memcache, xDS,
 * the per-second Redis). A value is never silently misread.
 */
#ifndef RL_RLS_SETTINGS_H
#define RL_RLS_SETTINGS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct rls_settings {
    /* Listeners. */
    char *host;                   /* HOST: /healthcheck, /json */
    int64_t port;                 /* PORT, 8080 */
    char *debug_host;             /* DEBUG_HOST: /rlconfig */
    int64_t debug_port;           /* DEBUG_PORT, 6070 */
    char *grpc_host;              /* GRPC_HOST */
    int64_t grpc_port;            /* GRPC_PORT, 8081 */
    int64_t grpc_max_connection_age_ms;
    int64_t grpc_max_connection_age_grace_ms;
    bool grpc_server_use_tls;
    char *grpc_server_tls_cert;
    char *grpc_server_tls_key;
    char *grpc_client_tls_cacert; /* set: client certificates required */
    char *grpc_client_tls_san;
    /* Logs and metrics. */
    char *log_level;              /* lower case: debug, info, warn, error */
    char *log_format;             /* text or json */
    bool use_prometheus;
    char *prometheus_addr;
    char *prometheus_path;
    /* The config files. */
    bool force_start_without_initial_config;
    char *runtime_root;
    char *runtime_subdirectory;
    char *runtime_appdirectory;
    bool runtime_ignoredotfiles;
    bool runtime_watch_root;
    bool merge_domain_config;
    bool healthy_with_at_least_one_config_loaded;
    /* Limits. */
    int64_t expiration_jitter_max_seconds;
    double near_limit_ratio;
    char *cache_key_prefix;
    bool stop_cache_key_increment_when_overlimit;
    bool shadow_mode;             /* SHADOW_MODE: every limit in shadow */
    bool quota_mode;              /* QUOTA_MODE */
    bool limit_response_headers_enabled;
    char *limit_limit_header;
    char *limit_remaining_header;
    char *limit_reset_header;
    /* Redis. */
    char *redis_socket_type;      /* tcp or unix */
    char *redis_type;             /* single, cluster or sentinel */
    char *redis_url;
    char *redis_auth;             /* "password" or "user:password" */
    char *redis_sentinel_auth;
    bool redis_tls;
    char *redis_tls_client_cert;
    char *redis_tls_client_key;
    char *redis_tls_cacert;
    bool redis_tls_skip_hostname_verification;
    int64_t redis_timeout_ms;     /* rl's store.timeout_ms, when given */
    bool redis_timeout_given;     /* unset: rl's own default, not 10 s */
} rls_settings;

/* Where the variables come from: getenv, or a test's table. NULL: unset. */
typedef const char *(*rls_env_fn)(const char *name, void *arg);

/* rls_settings_read fills s from the environment. 0, or -1 with err naming
 * the variable, its value and what would be accepted. notes gets one line
 * per variable set that has no effect in rl-rls (may be "" ). s is to be
 * freed with rls_settings_free either way. */
int rls_settings_read(rls_settings *s, rls_env_fn env, void *arg, char *err,
                      size_t cap, char *notes, size_t notes_cap);

void rls_settings_free(rls_settings *s);

/* Go's time.ParseDuration, to milliseconds (rounded down): "300ms",
 * "1h30m", "1.5s", "0". 0, or -1 for text it refuses. */
int rls_parse_duration_ms(const char *text, int64_t *ms);

#endif
