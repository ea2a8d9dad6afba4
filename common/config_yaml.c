/*
 * config_yaml.c: the config's schema for libcyaml, and the translation of
 * libcyaml's error report into one line a user can act on. libcyaml logs a
 * message and then a backtrace of where it was ("in mapping field 'limit'
 * (line: 4, column: 12)"); the log callback below collects both.
 */
#include "config_yaml.h"

#include "config.h"
#include "error.h"
#include "yaml_locate.h"

#include <cyaml/cyaml.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#define STR_FIELD(key, flags, type, member, max) \
    CYAML_FIELD_STRING_PTR(key, CYAML_FLAG_POINTER | (flags), type, member, 0, max)

static const cyaml_schema_value_t value_schema = {
    CYAML_VALUE_STRING(CYAML_FLAG_POINTER, char, 0, RL_VALUE_MAX),
};

static const cyaml_schema_value_t name_schema = {
    CYAML_VALUE_STRING(CYAML_FLAG_POINTER, char, 0, RL_NAME_MAX),
};

/* `when` is a mapping of attribute names the user picks: config.c walks
 * it in the YAML document. */
static const cyaml_schema_field_t override_fields[] = {
    CYAML_FIELD_IGNORE("when", CYAML_FLAG_OPTIONAL),
    CYAML_FIELD_SEQUENCE("values", CYAML_FLAG_POINTER | CYAML_FLAG_OPTIONAL,
                         rl_raw_override, values, &value_schema, 0,
                         RL_OVERRIDES_MAX),
    STR_FIELD("limit", CYAML_FLAG_OPTIONAL, rl_raw_override, limit, 32),
    STR_FIELD("period", CYAML_FLAG_OPTIONAL, rl_raw_override, period, 32),
    STR_FIELD("burst", CYAML_FLAG_OPTIONAL, rl_raw_override, burst, 32),
    STR_FIELD("unlimited", CYAML_FLAG_OPTIONAL, rl_raw_override, unlimited,
              32),
    STR_FIELD("name", CYAML_FLAG_OPTIONAL, rl_raw_override, name,
              RL_NAME_MAX),
    STR_FIELD("in_flight", CYAML_FLAG_OPTIONAL, rl_raw_override, in_flight,
              32),
    CYAML_FIELD_END,
};

static const cyaml_schema_value_t override_schema = {
    CYAML_VALUE_MAPPING(CYAML_FLAG_DEFAULT, rl_raw_override, override_fields),
};

/* `match` is a string or a list and `when` a mapping of the user's
 * attribute names: libcyaml has no type for either, so they are skipped
 * here and config.c reads them from the YAML document. */
static const cyaml_schema_field_t rule_fields[] = {
    STR_FIELD("name", 0, rl_raw_rule, name, RL_NAME_MAX),
    CYAML_FIELD_IGNORE("match", CYAML_FLAG_OPTIONAL),
    CYAML_FIELD_IGNORE("when", CYAML_FLAG_OPTIONAL),
    STR_FIELD("limit", CYAML_FLAG_OPTIONAL, rl_raw_rule, limit, 32),
    STR_FIELD("period", CYAML_FLAG_OPTIONAL, rl_raw_rule, period, 32),
    STR_FIELD("in_flight", CYAML_FLAG_OPTIONAL, rl_raw_rule, in_flight, 32),
    STR_FIELD("mode", CYAML_FLAG_OPTIONAL, rl_raw_rule, mode, 32),
    STR_FIELD("algorithm", CYAML_FLAG_OPTIONAL, rl_raw_rule, algorithm, 32),
    STR_FIELD("burst", CYAML_FLAG_OPTIONAL, rl_raw_rule, burst, 32),
    STR_FIELD("key_prefix", CYAML_FLAG_OPTIONAL, rl_raw_rule, key_prefix,
              RL_PREFIX_MAX),
    STR_FIELD("on_error", CYAML_FLAG_OPTIONAL, rl_raw_rule, on_error, 32),
    STR_FIELD("fleet_size", CYAML_FLAG_OPTIONAL, rl_raw_rule, fleet_size,
              32),
    STR_FIELD("hash_tag", CYAML_FLAG_OPTIONAL, rl_raw_rule, hash_tag,
              RL_NAME_MAX),
    STR_FIELD("shadow", CYAML_FLAG_OPTIONAL, rl_raw_rule, shadow, 32),
    STR_FIELD("scope", CYAML_FLAG_OPTIONAL, rl_raw_rule, scope, 32),
    STR_FIELD("overrides_file", CYAML_FLAG_OPTIONAL, rl_raw_rule,
              overrides_file, RL_PATH_MAX),
    CYAML_FIELD_SEQUENCE("overrides", CYAML_FLAG_POINTER | CYAML_FLAG_OPTIONAL,
                         rl_raw_rule, overrides, &override_schema, 0,
                         RL_OVERRIDES_MAX),
    CYAML_FIELD_END,
};

static const cyaml_schema_value_t rule_schema = {
    CYAML_VALUE_MAPPING(CYAML_FLAG_DEFAULT, rl_raw_rule, rule_fields),
};

static const cyaml_schema_value_t seed_schema = {
    CYAML_VALUE_STRING(CYAML_FLAG_POINTER, char, 1, RL_HOST_MAX + 8),
};

static const cyaml_schema_field_t sentinel_fields[] = {
    STR_FIELD("master", CYAML_FLAG_OPTIONAL, rl_raw_sentinel, master,
              RL_NAME_MAX),
    CYAML_FIELD_SEQUENCE("addresses", CYAML_FLAG_POINTER
                         | CYAML_FLAG_OPTIONAL, rl_raw_sentinel, addresses,
                         &seed_schema, 0, RL_SENTINELS_MAX),
    STR_FIELD("username", CYAML_FLAG_OPTIONAL, rl_raw_sentinel, username,
              RL_SECRET_MAX),
    STR_FIELD("password", CYAML_FLAG_OPTIONAL, rl_raw_sentinel, password,
              RL_SECRET_MAX),
    CYAML_FIELD_END,
};

static const cyaml_schema_field_t store_tls_fields[] = {
    STR_FIELD("ca", CYAML_FLAG_OPTIONAL, rl_raw_store_tls, ca, RL_PATH_MAX),
    STR_FIELD("ca_dir", CYAML_FLAG_OPTIONAL, rl_raw_store_tls, ca_dir,
              RL_PATH_MAX),
    STR_FIELD("cert", CYAML_FLAG_OPTIONAL, rl_raw_store_tls, cert,
              RL_PATH_MAX),
    STR_FIELD("key", CYAML_FLAG_OPTIONAL, rl_raw_store_tls, key, RL_PATH_MAX),
    STR_FIELD("server_name", CYAML_FLAG_OPTIONAL, rl_raw_store_tls,
              server_name, 255),
    STR_FIELD("verify", CYAML_FLAG_OPTIONAL, rl_raw_store_tls, verify, 32),
    CYAML_FIELD_END,
};

static const cyaml_schema_field_t store_fields[] = {
    CYAML_FIELD_MAPPING_PTR("sentinel", CYAML_FLAG_POINTER
                            | CYAML_FLAG_OPTIONAL, rl_raw_store, sentinel,
                            sentinel_fields),
    CYAML_FIELD_MAPPING_PTR("tls", CYAML_FLAG_POINTER | CYAML_FLAG_OPTIONAL,
                            rl_raw_store, tls, store_tls_fields),
    STR_FIELD("url", CYAML_FLAG_OPTIONAL, rl_raw_store, url, 1024),
    CYAML_FIELD_SEQUENCE("cluster", CYAML_FLAG_POINTER | CYAML_FLAG_OPTIONAL,
                         rl_raw_store, cluster, &seed_schema, 0, RL_SEEDS_MAX),
    STR_FIELD("username", CYAML_FLAG_OPTIONAL, rl_raw_store, username,
              RL_SECRET_MAX),
    STR_FIELD("password", CYAML_FLAG_OPTIONAL, rl_raw_store, password,
              RL_SECRET_MAX),
    STR_FIELD("password_file", CYAML_FLAG_OPTIONAL, rl_raw_store,
              password_file, RL_PATH_MAX),
    STR_FIELD("password_env", CYAML_FLAG_OPTIONAL, rl_raw_store,
              password_env, RL_NAME_MAX),
    STR_FIELD("timeout_ms", CYAML_FLAG_OPTIONAL, rl_raw_store, timeout_ms, 32),
    STR_FIELD("scripts", CYAML_FLAG_OPTIONAL, rl_raw_store, scripts, 32),
    STR_FIELD("wait_replicas", CYAML_FLAG_OPTIONAL, rl_raw_store,
              wait_replicas, 32),
    CYAML_FIELD_END,
};

static const cyaml_schema_field_t tls_fields[] = {
    STR_FIELD("ca", CYAML_FLAG_OPTIONAL, rl_raw_tls, ca, RL_PATH_MAX),
    STR_FIELD("cert", CYAML_FLAG_OPTIONAL, rl_raw_tls, cert, RL_PATH_MAX),
    STR_FIELD("key", CYAML_FLAG_OPTIONAL, rl_raw_tls, key, RL_PATH_MAX),
    STR_FIELD("server_name", CYAML_FLAG_OPTIONAL, rl_raw_tls, server_name,
              255),
    STR_FIELD("client_auth", CYAML_FLAG_OPTIONAL, rl_raw_tls, client_auth,
              32),
    CYAML_FIELD_END,
};

static const cyaml_schema_field_t aggregator_fields[] = {
    STR_FIELD("reports", CYAML_FLAG_OPTIONAL, rl_raw_aggregator, reports,
              RL_NNG_URL_MAX - 1),
    STR_FIELD("totals", CYAML_FLAG_OPTIONAL, rl_raw_aggregator, totals,
              RL_NNG_URL_MAX - 1),
    STR_FIELD("sync_interval_ms", CYAML_FLAG_OPTIONAL, rl_raw_aggregator,
              sync_interval_ms, 32),
    STR_FIELD("stale_after_ms", CYAML_FLAG_OPTIONAL, rl_raw_aggregator,
              stale_after_ms, 32),
    STR_FIELD("max_keys", CYAML_FLAG_OPTIONAL, rl_raw_aggregator, max_keys,
              32),
    STR_FIELD("max_agents", CYAML_FLAG_OPTIONAL, rl_raw_aggregator,
              max_agents, 32),
    STR_FIELD("max_message_bytes", CYAML_FLAG_OPTIONAL, rl_raw_aggregator,
              max_message_bytes, 32),
    STR_FIELD("max_entries", CYAML_FLAG_OPTIONAL, rl_raw_aggregator,
              max_entries, 32),
    STR_FIELD("metrics", CYAML_FLAG_OPTIONAL, rl_raw_aggregator, metrics,
              RL_HOST_MAX + 8),
    CYAML_FIELD_MAPPING_PTR("tls", CYAML_FLAG_POINTER | CYAML_FLAG_OPTIONAL,
                            rl_raw_aggregator, tls, tls_fields),
    CYAML_FIELD_MAPPING_PTR("store", CYAML_FLAG_POINTER | CYAML_FLAG_OPTIONAL,
                            rl_raw_aggregator, store, store_fields),
    CYAML_FIELD_END,
};

static const cyaml_schema_field_t aggregator_at_fields[] = {
    STR_FIELD("reports", 0, rl_raw_aggregator_at, reports,
              RL_NNG_URL_MAX - 1),
    STR_FIELD("totals", 0, rl_raw_aggregator_at, totals,
              RL_NNG_URL_MAX - 1),
    STR_FIELD("metrics", CYAML_FLAG_OPTIONAL, rl_raw_aggregator_at, metrics,
              RL_HOST_MAX + 8),
    CYAML_FIELD_END,
};

static const cyaml_schema_value_t aggregator_at_schema = {
    CYAML_VALUE_MAPPING(CYAML_FLAG_DEFAULT, rl_raw_aggregator_at,
                        aggregator_at_fields),
};

static const cyaml_schema_field_t local_fields[] = {
    STR_FIELD("max_keys", CYAML_FLAG_OPTIONAL, rl_raw_local, max_keys, 32),
    CYAML_FIELD_END,
};

static const cyaml_schema_field_t route_fields[] = {
    STR_FIELD("prefix", 0, rl_raw_route, prefix, RL_VALUE_MAX),
    STR_FIELD("route", 0, rl_raw_route, route, RL_VALUE_MAX),
    CYAML_FIELD_END,
};

static const cyaml_schema_value_t route_schema = {
    CYAML_VALUE_MAPPING(CYAML_FLAG_DEFAULT, rl_raw_route, route_fields),
};

static const cyaml_schema_field_t gateway_fields[] = {
    STR_FIELD("tenant_map", CYAML_FLAG_OPTIONAL, rl_raw_gateway, tenant_map,
              RL_PATH_MAX),
    CYAML_FIELD_SEQUENCE("routes", CYAML_FLAG_POINTER | CYAML_FLAG_OPTIONAL,
                         rl_raw_gateway, routes, &route_schema, 0,
                         RL_ROUTES_MAX),
    STR_FIELD("cost_header", CYAML_FLAG_OPTIONAL, rl_raw_gateway, cost_header,
              RL_NAME_MAX),
    STR_FIELD("cost_estimate", CYAML_FLAG_OPTIONAL, rl_raw_gateway,
              cost_estimate, 32),
    CYAML_FIELD_END,
};

static const cyaml_schema_field_t top_fields[] = {
    CYAML_FIELD_MAPPING_PTR("store", CYAML_FLAG_POINTER | CYAML_FLAG_OPTIONAL,
                            rl_raw_config, store, store_fields),
    CYAML_FIELD_MAPPING_PTR("aggregator",
                            CYAML_FLAG_POINTER | CYAML_FLAG_OPTIONAL,
                            rl_raw_config, aggregator, aggregator_fields),
    /* Bounded here only against a huge list; config.c refuses more than
     * RL_AGGREGATORS_MAX with a message that says so. */
    CYAML_FIELD_SEQUENCE("aggregators",
                         CYAML_FLAG_POINTER | CYAML_FLAG_OPTIONAL,
                         rl_raw_config, aggregators, &aggregator_at_schema,
                         0, 1024),
    CYAML_FIELD_MAPPING_PTR("local", CYAML_FLAG_POINTER | CYAML_FLAG_OPTIONAL,
                            rl_raw_config, local, local_fields),
    CYAML_FIELD_MAPPING_PTR("gateway",
                            CYAML_FLAG_POINTER | CYAML_FLAG_OPTIONAL,
                            rl_raw_config, gateway, gateway_fields),
    STR_FIELD("charge", CYAML_FLAG_OPTIONAL, rl_raw_config, charge, 32),
    STR_FIELD("shadow", CYAML_FLAG_OPTIONAL, rl_raw_config, shadow, 32),
    STR_FIELD("fleet_size", CYAML_FLAG_OPTIONAL, rl_raw_config, fleet_size,
              32),
    STR_FIELD("in_flight_lease_ms", CYAML_FLAG_OPTIONAL, rl_raw_config,
              in_flight_lease_ms, 32),
    CYAML_FIELD_SEQUENCE("attributes",
                         CYAML_FLAG_POINTER | CYAML_FLAG_OPTIONAL,
                         rl_raw_config, attributes, &name_schema, 0,
                         RL_ATTRS_MAX),
    STR_FIELD("log_level", CYAML_FLAG_OPTIONAL, rl_raw_config, log_level, 32),
    STR_FIELD("region", CYAML_FLAG_OPTIONAL, rl_raw_config, region,
              RL_REGION_NAME_MAX),
    /* A mapping of the user's region names: config_regions.c reads it
     * from the YAML document. */
    CYAML_FIELD_IGNORE("regions", CYAML_FLAG_OPTIONAL),
    STR_FIELD("max_value_bytes", CYAML_FLAG_OPTIONAL, rl_raw_config,
              max_value_bytes, 32),
    STR_FIELD("hold_timeout_ms", CYAML_FLAG_OPTIONAL, rl_raw_config,
              hold_timeout_ms, 32),
    CYAML_FIELD_SEQUENCE("rules", CYAML_FLAG_POINTER, rl_raw_config, rules,
                         &rule_schema, 0, RL_RULES_MAX),
    CYAML_FIELD_END,
};

static const cyaml_schema_value_t top_schema = {
    CYAML_VALUE_MAPPING(CYAML_FLAG_POINTER, rl_raw_config, top_fields),
};

/* What libcyaml said, collected from its log callback. Frames are innermost
 * first, as libcyaml logs them. */
#define MAX_FRAMES 16

struct frame {
    char field[RL_NAME_MAX + 1]; /* empty for a sequence entry or a mapping */
    long entry;                  /* 1-based sequence entry, or -1 */
    unsigned line, column;
};

struct report {
    char message[256];
    struct frame frames[MAX_FRAMES];
    int n_frames;
};

static void collect(cyaml_log_t level, void *ctx, const char *fmt,
                    va_list args)
{
    struct report *r = ctx;
    char text[256];
    if (level < CYAML_LOG_ERROR)
        return;
    vsnprintf(text, sizeof text, fmt, args);
    text[strcspn(text, "\n")] = '\0';

    struct frame f = {.entry = -1};
    unsigned long entry;
    if (sscanf(text, " in mapping field '%64[^']' (line: %u, column: %u)",
               f.field, &f.line, &f.column) == 3
        || sscanf(text, " in mapping (line: %u, column: %u)", &f.line,
                  &f.column) == 2) {
        /* a frame: kept below */
    } else if (sscanf(text, " in sequence entry '%lu' (line: %u, column: %u)",
                      &entry, &f.line, &f.column) == 3) {
        f.entry = (long)entry;
    } else {
        if (r->message[0] == '\0' && strstr(text, "Backtrace") == NULL) {
            const char *msg = strncmp(text, "Load: ", 6) == 0 ? text + 6 : text;
            snprintf(r->message, sizeof r->message, "%s", msg);
        }
        return;
    }
    if (r->n_frames < MAX_FRAMES)
        r->frames[r->n_frames++] = f;
}

/* Appends one step to a dotted path ("rules.0.limit"). */
static void path_add(char *path, size_t cap, const char *step)
{
    size_t len = strlen(path);
    snprintf(path + len, cap - len, "%s%s", len ? "." : "", step);
}

/* Writes the frames outermost first as a dotted path. libcyaml numbers a
 * sequence entry by how many it has started, so entry N is index N-1.
 * skip drops that many innermost field frames. */
static void frames_path(const struct report *r, int skip, char *path,
                        size_t cap)
{
    path[0] = '\0';
    int innermost = 0;
    for (; innermost < r->n_frames && skip > 0; innermost++) {
        if (r->frames[innermost].field[0] != '\0')
            skip--;
    }
    for (int i = r->n_frames - 1; i >= innermost; i--) {
        const struct frame *f = &r->frames[i];
        char step[32];
        if (f->entry > 0) {
            snprintf(step, sizeof step, "%ld", f->entry - 1);
            path_add(path, cap, step);
        } else if (f->field[0] != '\0') {
            path_add(path, cap, f->field);
        }
    }
}

/* "rules.0.limit" -> "rules[0].limit", for people. */
void rl_config_path_display(const char *path, char *out, size_t cap)
{
    size_t o = 0;
    for (const char *p = path; *p != '\0' && o + 2 < cap; p++) {
        bool index_start = p[0] == '.' && p[1] >= '0' && p[1] <= '9';
        if (index_start) {
            out[o++] = '[';
            for (p++; *p >= '0' && *p <= '9' && o + 2 < cap; p++)
                out[o++] = *p;
            out[o++] = ']';
            p--;
        } else {
            out[o++] = *p;
        }
    }
    out[o] = '\0';
}

/* libcyaml's words for YAML node kinds, and ours. */
static const char *kind_word(const char *kind)
{
    static const char *const words[][2] = {
        {"SCALAR", "plain value"}, {"SEQUENCE_START", "list"},
        {"MAPPING_START", "mapping"}, {"STRING", "plain value"},
        {"MAPPING", "mapping (key: value lines)"}, {"SEQUENCE", "list"},
        {"INT", "integer"},
    };
    for (size_t i = 0; i < sizeof words / sizeof words[0]; i++) {
        if (strcmp(kind, words[i][0]) == 0)
            return words[i][1];
    }
    return kind;
}

/* Rewords the libcyaml messages a user meets most often; any other message
 * is passed on as it is. */
static void plain_words(const char *message, char *out, size_t cap)
{
    char expected[32], got[32], value[200];
    unsigned max;
    if (sscanf(message, "Expecting %31s got event: %31s", expected, got) == 2
        && expected[strlen(expected) - 1] == ',') {
        expected[strlen(expected) - 1] = '\0';
        snprintf(out, cap, "expected a %s, got a %s", kind_word(expected),
                 kind_word(got));
    } else if (sscanf(message, "STRING length > %u", &max) == 1) {
        snprintf(out, cap, "longer than %u bytes", max);
    } else if (sscanf(message, "Mapping field already seen: %199s",
                      value) == 1) {
        snprintf(out, cap, "field '%s' is given twice", value);
    } else {
        snprintf(out, cap, "%s", message);
    }
}

static int report_error(const char *yaml, size_t len, const char *name,
                        const struct report *r, cyaml_err_t cerr,
                        rl_error *err)
{
    const char *message = r->message[0] ? r->message : cyaml_strerror(cerr);
    char path[256], shown[256], what[300];
    unsigned line = 0, column = 0;
    const char *key;

    if (strncmp(message, "libyaml: ", 9) == 0) {
        /* Not YAML at all: only the position means anything. */
        if (r->n_frames > 0) {
            line = r->frames[0].line;
            column = r->frames[0].column;
        }
        return rl_error_set(err, RL_ECONFIG, "%s:%u:%u: not valid YAML: %s",
                            name, line, column, message + 9);
    }
    if ((key = strstr(message, "Unexpected key: ")) != NULL) {
        frames_path(r, 0, path, sizeof path);
        key += strlen("Unexpected key: ");
        snprintf(what, sizeof what, "unknown field '%s'", key);
        path_add(path, sizeof path, key);
        rl_yaml_locate(yaml, len, path, true, &line, &column);
    } else if ((key = strstr(message, "Missing required mapping field: "))) {
        /* libcyaml's innermost frame is the last field it read, not the
         * missing one: point at the mapping that lacks it. */
        frames_path(r, 1, path, sizeof path);
        key += strlen("Missing required mapping field: ");
        snprintf(what, sizeof what, "missing required field '%s'", key);
        if (!rl_yaml_locate(yaml, len, path, false, &line, &column))
            line = column = 0;
        path_add(path, sizeof path, key);
    } else {
        frames_path(r, 0, path, sizeof path);
        plain_words(message, what, sizeof what);
        if (r->n_frames > 0) {
            line = r->frames[0].line;
            column = r->frames[0].column;
        }
    }
    rl_config_path_display(path[0] ? path : "top level", shown,
                           sizeof shown);
    if (line == 0)
        return rl_error_set(err, RL_ECONFIG, "%s: %s: %s", name, shown, what);
    return rl_error_set(err, RL_ECONFIG, "%s:%u:%u: %s: %s", name, line,
                        column, shown, what);
}

int rl_config_yaml_load(const char *yaml, size_t len, const char *name,
                        rl_raw_config **out, rl_error *err)
{
    struct report r = {.n_frames = 0};
    cyaml_config_t cfg = {
        .log_fn = collect,
        .log_ctx = &r,
        .mem_fn = cyaml_mem,
        .log_level = CYAML_LOG_ERROR,
        .flags = CYAML_CFG_DEFAULT,
    };
    rl_raw_config *raw = NULL;
    cyaml_err_t cerr = cyaml_load_data((const uint8_t *)yaml, len, &cfg,
                                       &top_schema, (cyaml_data_t **)&raw,
                                       NULL);
    if (cerr == CYAML_ERR_OOM)
        return rl_error_set(err, RL_ENOMEM, "%s: out of memory while parsing",
                            name);
    if (cerr != CYAML_OK)
        return report_error(yaml, len, name, &r, cerr, err);
    *out = raw;
    return RL_OK;
}

void rl_config_yaml_free(rl_raw_config *raw)
{
    cyaml_config_t cfg = {.mem_fn = cyaml_mem, .log_level = CYAML_LOG_ERROR};
    if (raw != NULL)
        cyaml_free(&cfg, &top_schema, raw, 0);
}
