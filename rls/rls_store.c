/*
 * rls_store.c: rl-rls's rl config, as YAML text (rls_store.h). Values are
 * written double-quoted with YAML's escapes, so that no variable's value
 * can add a key.
 */
#include "rls_store.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

typedef struct text {
    char *s;
    size_t len, cap;
    bool failed;
} text;

static void add(text *t, const char *s, size_t n)
{
    if (t->failed)
        return;
    if (t->len + n + 1 > t->cap) {
        size_t cap = (t->len + n + 1) * 2;
        char *p = realloc(t->s, cap);
        if (p == NULL) {
            t->failed = true;
            return;
        }
        t->s = p;
        t->cap = cap;
    }
    memcpy(t->s + t->len, s, n);
    t->len += n;
    t->s[t->len] = '\0';
}

static void add_str(text *t, const char *s)
{
    add(t, s, strlen(s));
}

/* s as a double-quoted YAML scalar. */
static void add_quoted(text *t, const char *s, size_t n)
{
    add_str(t, "\"");
    for (size_t i = 0; i < n; i++) {
        char esc[8];
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\')
            snprintf(esc, sizeof esc, "\\%c", c);
        else if (c < 0x20 || c == 0x7f)
            snprintf(esc, sizeof esc, "\\x%02x", c);
        else
            snprintf(esc, sizeof esc, "%c", c);
        add_str(t, esc);
    }
    add_str(t, "\"");
}

/* REDIS_URL's comma-separated parts as a YAML list of quoted strings,
 * from part from on. */
static void add_list(text *t, const char *url, int from)
{
    add_str(t, "[");
    int k = 0;
    for (const char *p = url; *p != '\0'; k++) {
        size_t n = strcspn(p, ",");
        if (k >= from) {
            if (k > from)
                add_str(t, ", ");
            add_quoted(t, p, n);
        }
        p += n + (p[n] == ',');
    }
    add_str(t, "]");
}

/* REDIS_AUTH: "password" or "user:password". The password goes through
 * the environment, never the text. */
static int add_auth(text *t, const char *auth, const char *indent)
{
    if (auth[0] == '\0')
        return 0;
    const char *colon = strchr(auth, ':');
    const char *password = colon != NULL ? colon + 1 : auth;
    if (setenv(RLS_PASSWORD_ENV, password, 1) != 0)
        return -1;
    if (colon != NULL) {
        add_str(t, indent);
        add_str(t, "username: ");
        add_quoted(t, auth, (size_t)(colon - auth));
        add_str(t, "\n");
    }
    add_str(t, indent);
    add_str(t, "password_env: " RLS_PASSWORD_ENV "\n");
    return 0;
}

static void add_tls(text *t, const rls_settings *s)
{
    if (!s->redis_tls)
        return;
    add_str(t, "  tls:\n");
    const char *files[][2] = {{"ca", s->redis_tls_cacert},
                              {"cert", s->redis_tls_client_cert},
                              {"key", s->redis_tls_client_key}};
    for (int i = 0; i < 3; i++) {
        if (files[i][1][0] == '\0')
            continue;
        add_str(t, "    ");
        add_str(t, files[i][0]);
        add_str(t, ": ");
        add_quoted(t, files[i][1], strlen(files[i][1]));
        add_str(t, "\n");
    }
    add_str(t, s->redis_tls_skip_hostname_verification
                   ? "    verify: ca\n"
                   : "    verify: full\n");
}

static int add_store(text *t, const rls_settings *s, char *err, size_t cap)
{
    if (strcasecmp(s->redis_socket_type, "tcp") != 0) {
        snprintf(err, cap, "REDIS_SOCKET_TYPE '%s': rl-rls reaches Redis "
                 "over TCP; set REDIS_SOCKET_TYPE=tcp and REDIS_URL="
                 "host:port, or give rl's store in --config",
                 s->redis_socket_type);
        return -1;
    }
    add_str(t, "store:\n");
    if (strcasecmp(s->redis_type, "cluster") == 0) {
        add_str(t, "  cluster: ");
        add_list(t, s->redis_url, 0);
        add_str(t, "\n");
    } else if (strcasecmp(s->redis_type, "sentinel") == 0) {
        size_t name = strcspn(s->redis_url, ",");
        if (s->redis_url[name] == '\0') {
            snprintf(err, cap, "REDIS_URL '%s': with REDIS_TYPE=sentinel, "
                     "write the primary's name, then the sentinels: "
                     "mymaster,host1:26379,host2:26379", s->redis_url);
            return -1;
        }
        add_str(t, "  sentinel:\n    master: ");
        add_quoted(t, s->redis_url, name);
        add_str(t, "\n    addresses: ");
        add_list(t, s->redis_url, 1);
        add_str(t, "\n");
        if (s->redis_sentinel_auth[0] != '\0') {
            snprintf(err, cap, "REDIS_SENTINEL_AUTH is not supported from "
                     "the environment: give the sentinels' credentials in "
                     "--config (store.sentinel.username/password_file)");
            return -1;
        }
    } else {
        char url[1024];
        int n = snprintf(url, sizeof url, "%s://%s",
                         s->redis_tls ? "rediss" : "redis", s->redis_url);
        if (n < 0 || (size_t)n >= sizeof url) {
            snprintf(err, cap, "REDIS_URL is longer than %zu bytes",
                     sizeof url - 10);
            return -1;
        }
        add_str(t, "  url: ");
        add_quoted(t, url, (size_t)n);
        add_str(t, "\n");
    }
    if (add_auth(t, s->redis_auth, "  ") != 0) {
        snprintf(err, cap, "out of memory");
        return -1;
    }
    add_tls(t, s);
    if (s->redis_timeout_given) {
        char line[48];
        snprintf(line, sizeof line, "  timeout_ms: %lld\n",
                 (long long)s->redis_timeout_ms);
        add_str(t, line);
    }
    return 0;
}

/* Every way a descriptor can be counted: exact (in Redis) with either
 * algorithm and on_error, by each instance alone, leased from the exact
 * bucket, or as requests at once (in_flight). Synced rules are generated
 * (add_synced). */
static const struct {
    const char *name, *algorithm, *on_error, *mode;
} rules[] = {
    {RLS_RULE, "fixed_window", "allow", "exact"},
    {"rls-deny", "fixed_window", "deny", "exact"},
    {"rls-tb", "token_bucket", "allow", "exact"},
    {"rls-tb-deny", "token_bucket", "deny", "exact"},
    {"rls-local", "fixed_window", "allow", "local"},
    {"rls-local-tb", "token_bucket", "allow", "local"},
    {"rls-leased", "token_bucket", "allow", "leased"},
    {"rls-leased-deny", "token_bucket", "deny", "leased"},
    {"rls-in-flight", NULL, "allow", "in_flight"},
    {"rls-in-flight-deny", NULL, "deny", "in_flight"},
};

/* A synced rule per unit (rls_unit's order) and on_error (local, the
 * default, then allow and deny): the aggregator counts one window per
 * rule, of the rule's period, so a descriptor's unit picks its rule
 * (rl_check_rule_async takes the caller's limit, not its period). */
static const char *const synced_rules[8][3] = {
    {NULL, NULL, NULL},
    {"rls-synced-second", "rls-synced-second-allow",
     "rls-synced-second-deny"},
    {"rls-synced-minute", "rls-synced-minute-allow",
     "rls-synced-minute-deny"},
    {"rls-synced-hour", "rls-synced-hour-allow",
     "rls-synced-hour-deny"},
    {"rls-synced-day", "rls-synced-day-allow",
     "rls-synced-day-deny"},
    {"rls-synced-month", "rls-synced-month-allow",
     "rls-synced-month-deny"},
    {"rls-synced-year", "rls-synced-year-allow",
     "rls-synced-year-deny"},
    {"rls-synced-week", "rls-synced-week-allow",
     "rls-synced-week-deny"},
};
static const char *const synced_on_error[] = {"local", "allow", "deny"};

const char *rls_rule_of(const rls_limit *l)
{
    if (l->synced)
        return synced_rules[l->unit][l->deny_on_error    ? 2
                                     : l->allow_on_error ? 1
                                                         : 0];
    if (l->in_flight > 0)
        return rules[8 + l->deny_on_error].name;
    if (l->leased)
        return rules[6 + l->deny_on_error].name;
    if (l->local)
        return rules[4 + l->token_bucket].name;
    return rules[2 * l->token_bucket + l->deny_on_error].name;
}

static void add_rule(text *t, const char *key_prefix, const char *name,
                     const char *period, const char *algorithm,
                     const char *on_error, const char *mode)
{
    char prefix[300];
    snprintf(prefix, sizeof prefix, "%s%s:", key_prefix, name);
    add_str(t, "  - name: ");
    add_str(t, name);
    /* An in_flight rule's N, like the others' limit, is each call's. */
    if (strcmp(mode, "in_flight") == 0) {
        add_str(t, "\n    match: descriptor\n    in_flight: 1");
    } else {
        add_str(t, "\n    match: descriptor\n    limit: 1\n    period: ");
        add_str(t, period);
    }
    if (algorithm != NULL) {
        add_str(t, "\n    algorithm: ");
        add_str(t, algorithm);
    }
    add_str(t, "\n    on_error: ");
    add_str(t, on_error);
    add_str(t, "\n    mode: ");
    add_str(t, mode);
    add_str(t, "\n    key_prefix: ");
    add_quoted(t, prefix, strlen(prefix));
    add_str(t, "\n");
}

/* The rules, each under its own key prefix (no two nest: a synced name
 * goes on after its unit with '-', a prefix with ':'). */
static void add_rules(text *t, const char *key_prefix, bool synced)
{
    static const char *const periods[] = {NULL, "1s", "1m", "1h", "1d",
                                          "30d", "365d", "7d"};
    add_str(t, "rules:\n");
    for (size_t i = 0; i < sizeof rules / sizeof rules[0]; i++)
        add_rule(t, key_prefix, rules[i].name, "1s", rules[i].algorithm,
                 rules[i].on_error, rules[i].mode);
    for (int u = RLS_UNIT_SECOND; synced && u <= RLS_UNIT_WEEK; u++) {
        for (int e = 0; e < 3; e++)
            add_rule(t, key_prefix, synced_rules[u][e], periods[u], NULL,
                     synced_on_error[e], "synced");
    }
}

char *rls_store_yaml(const rls_settings *s, const char *rl_yaml, bool synced,
                     char *err, size_t cap)
{
    text t = {0};
    if (rl_yaml != NULL) {
        add_str(&t, rl_yaml);
        add_str(&t, "\n");
    } else if (add_store(&t, s, err, cap) != 0) {
        free(t.s);
        return NULL;
    }
    add_rules(&t, s->cache_key_prefix, synced);
    if (t.failed) {
        free(t.s);
        snprintf(err, cap, "out of memory");
        return NULL;
    }
    return t.s;
}
