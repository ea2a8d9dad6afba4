/*
 * rl-rls's reading of envoyproxy/ratelimit's environment variables:
 * upstream's defaults, Go's parsers, and no value silently misread.
 */
#include "rls_settings.h"

#include <criterion/criterion.h>
#include <string.h>

/* A test's environment: NULL-terminated name, value pairs. */
static const char *from(const char *name, void *arg)
{
    const char *const *env = arg;
    for (; env[0] != NULL; env += 2) {
        if (strcmp(env[0], name) == 0)
            return env[1];
    }
    return NULL;
}

static char err[512], notes[2048];

static int read_env(rls_settings *s, const char *const *env)
{
    err[0] = '\0';
    return rls_settings_read(s, from, (void *)env, err, sizeof err, notes,
                             sizeof notes);
}

Test(rls_settings, upstreams_defaults)
{
    static const char *const none[] = {NULL};
    rls_settings s;
    cr_assert_eq(read_env(&s, none), 0, "%s", err);
    cr_expect_eq(s.port, 8080);
    cr_expect_eq(s.grpc_port, 8081);
    cr_expect_eq(s.debug_port, 6070);
    cr_expect_str_eq(s.grpc_host, "0.0.0.0");
    cr_expect_str_eq(s.runtime_root, "/srv/runtime_data/current");
    cr_expect_str_eq(s.runtime_subdirectory, "");
    cr_expect_str_eq(s.runtime_appdirectory, "config");
    cr_expect(s.runtime_watch_root && !s.runtime_ignoredotfiles);
    cr_expect_str_eq(s.redis_socket_type, "unix");
    cr_expect_str_eq(s.redis_type, "single");
    cr_expect_str_eq(s.redis_url, "/var/run/nutcracker/ratelimit.sock");
    cr_expect_eq(s.redis_timeout_ms, 10000);
    cr_expect(!s.redis_timeout_given);
    cr_expect_eq(s.near_limit_ratio, 0.8);
    cr_expect_eq(s.expiration_jitter_max_seconds, 300);
    cr_expect_str_eq(s.log_level, "warn");
    cr_expect_str_eq(s.limit_remaining_header, "RateLimit-Remaining");
    cr_expect_eq(s.grpc_max_connection_age_ms, 24 * 3600 * 1000LL);
    cr_expect(!s.shadow_mode && !s.merge_domain_config && !s.use_prometheus);
    cr_expect_str_eq(notes, "");
    rls_settings_free(&s);
}

Test(rls_settings, values_as_go_parses_them)
{
    static const char *const env[] = {
        "REDIS_SOCKET_TYPE", "TCP", "REDIS_TYPE", "Sentinel",
        "REDIS_URL", "mymaster,127.0.0.1:26379", "GRPC_PORT", "9091",
        "SHADOW_MODE", "T", "MERGE_DOMAIN_CONFIG", "1",
        "RUNTIME_WATCH_ROOT", "False", "REDIS_TIMEOUT", "1.5s",
        "GRPC_MAX_CONNECTION_AGE", "1h30m", "NEAR_LIMIT_RATIO", "0.9",
        "LOG_LEVEL", "debug", "LIMIT_RESPONSE_HEADERS_ENABLED", "true",
        NULL};
    rls_settings s;
    cr_assert_eq(read_env(&s, env), 0, "%s", err);
    cr_expect_str_eq(s.redis_socket_type, "tcp");
    cr_expect_str_eq(s.redis_type, "sentinel");
    cr_expect_str_eq(s.redis_url, "mymaster,127.0.0.1:26379");
    cr_expect_eq(s.grpc_port, 9091);
    cr_expect(s.shadow_mode && s.merge_domain_config);
    cr_expect(!s.runtime_watch_root);
    cr_expect_eq(s.redis_timeout_ms, 1500);
    cr_expect(s.redis_timeout_given);
    cr_expect_eq(s.grpc_max_connection_age_ms, 5400000);
    cr_expect_eq(s.near_limit_ratio, 0.9);
    cr_expect(s.limit_response_headers_enabled);
    rls_settings_free(&s);
}

Test(rls_settings, durations_as_go_parses_them)
{
    static const struct {
        const char *text;
        int64_t ms;
    } ok[] = {{"0", 0},          {"300ms", 300}, {"10s", 10000},
              {"1h30m", 5400000}, {"1.5s", 1500}, {".5s", 500},
              {"2m3s", 123000},  {"1500us", 1},  {"1500\xc2\xb5s", 1},
              {"-1s", -1000}};
    for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
        int64_t ms = -42;
        cr_expect_eq(rls_parse_duration_ms(ok[i].text, &ms), 0, "%s",
                     ok[i].text);
        cr_expect_eq(ms, ok[i].ms, "%s: %lld", ok[i].text, (long long)ms);
    }
    static const char *const bad[] = {"", "10", "s", "1x", "1e3s", "0x10s",
                                      "1.s.", "one second"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        int64_t ms;
        cr_expect_neq(rls_parse_duration_ms(bad[i], &ms), 0, "'%s'", bad[i]);
    }
}

Test(rls_settings, a_bad_value_is_refused_with_what_would_do)
{
    static const struct {
        const char *name, *value, *message;
    } bad[] = {
        {"PORT", "80a", "PORT=\"80a\": not an integer"},
        {"GRPC_PORT", "70000", "GRPC_PORT=\"70000\": not a port (0 to 65535)"},
        {"SHADOW_MODE", "yes",
         "SHADOW_MODE=\"yes\": not a boolean (true, false, 1, 0, t, f)"},
        {"REDIS_TIMEOUT", "10",
         "REDIS_TIMEOUT=\"10\": not a duration (300ms, 10s, 1h30m)"},
        /* rl's store.timeout_ms's bounds, 1 ms to 60 s */
        {"REDIS_TIMEOUT", "0",
         "REDIS_TIMEOUT=\"0\": not between 1ms and 60s (how long a call "
         "waits for Redis: rl's store.timeout_ms)"},
        {"REDIS_TIMEOUT", "500us",
         "REDIS_TIMEOUT=\"500us\": not between 1ms and 60s (how long a call "
         "waits for Redis: rl's store.timeout_ms)"},
        {"REDIS_TIMEOUT", "60001ms",
         "REDIS_TIMEOUT=\"60001ms\": not between 1ms and 60s (how long a "
         "call waits for Redis: rl's store.timeout_ms)"},
        {"REDIS_TYPE", "replicated",
         "REDIS_TYPE=\"replicated\": not single, cluster or sentinel"},
        {"LOG_FORMAT", "xml", "LOG_FORMAT=\"xml\": not text or json"},
        {"NEAR_LIMIT_RATIO", "1.5",
         "NEAR_LIMIT_RATIO=\"1.5\": not between 0 and 1"},
        /* of no effect, still read strictly */
        {"REDIS_POOL_SIZE", "ten", "REDIS_POOL_SIZE=\"ten\": not an integer"},
        /* not supported */
        {"BACKEND_TYPE", "memcache",
         "BACKEND_TYPE=\"memcache\": rl-rls keeps its counters in Redis; "
         "memcache is not supported"},
        {"CONFIG_TYPE", "GRPC_XDS_SOTW",
         "CONFIG_TYPE=\"GRPC_XDS_SOTW\": rl-rls reads its config from files "
         "(FILE); xDS is not supported"},
        {"REDIS_PERSECOND", "true",
         "REDIS_PERSECOND=\"true\": a second Redis for per-second limits is "
         "not supported"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        const char *env[] = {bad[i].name, bad[i].value, NULL};
        rls_settings s;
        cr_expect_neq(read_env(&s, env), 0, "%s=%s accepted", bad[i].name,
                      bad[i].value);
        cr_expect_str_eq(err, bad[i].message);
        rls_settings_free(&s);
    }
}

Test(rls_settings, upstreams_defaults_set_by_hand_pass_and_no_effect_is_named)
{
    /* A deployment that spells out upstream's defaults is not refused, even
     * for what rl-rls does not support. */
    static const char *const env[] = {
        "BACKEND_TYPE", "REDIS", "CONFIG_TYPE", "FILE",
        "REDIS_PERSECOND", "false", "USE_STATSD", "true",
        "REDIS_POOL_SIZE", "20", "USE_STATSD", "false",
        "REDIS_TIMEOUT", "10s", NULL};
    rls_settings s;
    cr_assert_eq(read_env(&s, env), 0, "%s", err);
    /* Upstream's default set by hand is the operator's deadline all the
     * same: rl's own default holds only when it is unset. */
    cr_expect(s.redis_timeout_given && s.redis_timeout_ms == 10000);
    cr_expect_str_eq(notes, "REDIS_POOL_SIZE=\"20\": no effect in rl-rls "
                     "(rl-rls pipelines every call on one connection per "
                     "loop)\n");
    rls_settings_free(&s);
    static const char *const statsd[] = {"USE_STATSD", "false", NULL};
    cr_assert_eq(read_env(&s, statsd), 0, "%s", err);
    cr_expect(strstr(notes, "USE_STATSD=\"false\": no effect") != NULL, "%s",
              notes);
    rls_settings_free(&s);
}
