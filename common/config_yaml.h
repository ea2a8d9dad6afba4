/*
 * config_yaml.h: the config file as libcyaml reads it, before validation.
 * Every scalar stays a string here, numbers too: config.c parses them
 * strictly (libcyaml would take "5.5" as 5) and rejects them with a message
 * that says what would be accepted. Private to librl.
 */
#ifndef RL_COMMON_CONFIG_YAML_H
#define RL_COMMON_CONFIG_YAML_H

#include "rl.h"

#include <stddef.h>

/* One entry of a rule's overrides. Its `when` is read from the YAML
 * document by config.c (libcyaml cannot read a mapping whose keys are the
 * user's). */
typedef struct rl_raw_override {
    char **values;
    unsigned values_count;
    char *limit;         /* NULL when absent, as every field here */
    char *period;
    char *burst;
    char *unlimited;
    char *name;
    char *in_flight;
} rl_raw_override;

/* `match` (a string or a list) and `when` are not here: config.c reads
 * them from the YAML document. */
typedef struct rl_raw_rule {
    char *name;
    char *limit;
    char *period;
    char *mode;          /* optional fields are NULL when absent */
    char *algorithm;
    char *burst;
    char *key_prefix;
    char *on_error;
    char *fleet_size;
    char *hash_tag;
    char *shadow;
    char *overrides_file;
    char *in_flight;
    char *scope;
    rl_raw_override *overrides;
    unsigned overrides_count;
} rl_raw_rule;

typedef struct rl_raw_sentinel {
    char *master;
    char **addresses;
    unsigned addresses_count;
    char *username;
    char *password;
} rl_raw_sentinel;

typedef struct rl_raw_store_tls {
    char *ca;
    char *ca_dir;
    char *cert;
    char *key;
    char *server_name;
    char *verify;
} rl_raw_store_tls;

typedef struct rl_raw_store {
    rl_raw_sentinel *sentinel;
    rl_raw_store_tls *tls;
    char *url;
    char **cluster;
    unsigned cluster_count;
    char *username;
    char *password;
    char *password_file;
    char *password_env;
    char *timeout_ms;
    char *scripts;
    char *wait_replicas;
} rl_raw_store;

typedef struct rl_raw_tls {
    char *ca;
    char *cert;
    char *key;
    char *server_name;
    char *client_auth;
} rl_raw_tls;

typedef struct rl_raw_aggregator {
    char *reports;
    char *totals;
    char *sync_interval_ms;
    char *stale_after_ms;
    char *max_keys;
    char *max_agents;
    char *max_message_bytes;
    char *max_entries;
    char *metrics;
    rl_raw_tls *tls;
    rl_raw_store *store;
} rl_raw_aggregator;

/* One entry of `aggregators:`: where one aggregator listens. */
typedef struct rl_raw_aggregator_at {
    char *reports;
    char *totals;
    char *metrics;
} rl_raw_aggregator_at;

typedef struct rl_raw_local {
    char *max_keys;
} rl_raw_local;

typedef struct rl_raw_route {
    char *prefix;
    char *route;
} rl_raw_route;

typedef struct rl_raw_gateway {
    char *tenant_map;
    rl_raw_route *routes;
    unsigned routes_count;
    char *cost_header;
    char *cost_estimate;
} rl_raw_gateway;

typedef struct rl_raw_config {
    rl_raw_store *store;
    rl_raw_aggregator *aggregator;
    rl_raw_aggregator_at *aggregators;
    unsigned aggregators_count;
    rl_raw_local *local;
    rl_raw_gateway *gateway;
    char *log_level;
    char *region;
    char *max_value_bytes;
    char *hold_timeout_ms;
    char *charge;
    char *shadow;
    char *fleet_size;
    char *in_flight_lease_ms;
    char **attributes;
    unsigned attributes_count;
    rl_raw_rule *rules;
    unsigned rules_count;
} rl_raw_config;

/* rl_config_yaml_load parses len bytes of YAML against rl's schema. On
 * success *out is the raw config (NULL for an empty document), to be freed
 * with rl_config_yaml_free. On failure returns RL_ECONFIG or RL_ENOMEM with
 * err's message "NAME:LINE:COLUMN: PATH: problem" built from libcyaml's
 * report. */
int rl_config_yaml_load(const char *yaml, size_t len, const char *name,
                        rl_raw_config **out, rl_error *err);

void rl_config_yaml_free(rl_raw_config *raw);

/* rl_config_path_display turns a dotted locator path into the way messages
 * show it: "rules.0.limit" -> "rules[0].limit". */
void rl_config_path_display(const char *path, char *out, size_t cap);

#endif
