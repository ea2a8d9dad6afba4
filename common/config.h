/*
 * config.h: the validated rules config, as every part of rl reads it. A
 * loaded config is immutable. Private to rl: the public side is the opaque
 * rl_config of rl.h.
 */
#ifndef RL_COMMON_CONFIG_H
#define RL_COMMON_CONFIG_H

#include "address.h"
#include "keys.h"
#include "rl.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define RL_NAME_MAX RL_RULE_NAME_MAX /* rule and attribute names, bytes */
#define RL_NNG_URL_MAX 256
#define RL_SECRET_MAX 512    /* store username and password */
#define RL_RULES_MAX 4096
#define RL_SEEDS_MAX 1024
#define RL_PATH_MAX 4096
/* Redis evaluates scripts with double-precision numbers, exact up to 2^53. */
#define RL_LIMIT_MAX ((1ULL << 53) - 1)

typedef enum rl_mode {
    RL_MODE_EXACT,  /* one shared bucket in Redis */
    RL_MODE_SYNCED, /* local counts, fleet totals through the aggregator */
    RL_MODE_LOCAL,  /* an in-process bucket per agent, nothing shared */
    RL_MODE_LEASED, /* the exact bucket, spent locally from leases of tokens */
    RL_MODE_IN_FLIGHT, /* at most N requests of a key at once (slots) */
} rl_mode;
typedef enum rl_algorithm {
    RL_ALGO_TOKEN_BUCKET,
    RL_ALGO_GCRA,         /* the same bucket */
    RL_ALGO_FIXED_WINDOW, /* a count per key and epoch-aligned period */
} rl_algorithm;
typedef enum rl_on_error {
    RL_ON_ERROR_ALLOW,
    RL_ON_ERROR_DENY,
    RL_ON_ERROR_LOCAL, /* a local bucket of limit / fleet size */
} rl_on_error;
typedef enum rl_scripts {
    RL_SCRIPTS_AUTO,     /* a function library on Redis 7+, scripts before */
    RL_SCRIPTS_FUNCTION, /* FUNCTION LOAD + FCALL */
    RL_SCRIPTS_EVAL,     /* SCRIPT LOAD + EVALSHA */
} rl_scripts;
typedef enum rl_charge {
    RL_CHARGE_ALL,          /* charge every matching rule (the seed's choice) */
    RL_CHARGE_FIRST_REJECT, /* stop charging at the first rejecting rule */
    RL_CHARGE_REFUND,       /* give the tokens back when the request is rejected */
    RL_CHARGE_ATOMIC,       /* charge every rule only if every rule allows */
} rl_charge;

/* Whether a rule's checks wait for the store's answer: exact and
 * in_flight rules (a leased rule's only when its hand cannot answer). */
static inline bool rl_mode_stored(rl_mode mode)
{
    return mode == RL_MODE_EXACT || mode == RL_MODE_IN_FLIGHT;
}

/* A rate: limit tokens per period_ms, a bucket of burst tokens. Kept as
 * integers, never as a float per second, so that "100 a minute" is exact.
 * An unlimited rate is never limited, never counted and makes no store
 * call (its numbers are 0). */
typedef struct rl_limit {
    uint64_t limit;      /* tokens added per period */
    uint64_t period_ms;
    uint64_t burst;      /* bucket capacity */
    bool unlimited;
} rl_limit;

#define RL_MATCH_MAX 8        /* attributes in one composite key */
#define RL_WHEN_MAX 16        /* conditions in one when */
#define RL_WHEN_VALUES_MAX 1024 /* values in one condition's list */
#define RL_OVERRIDES_MAX 1000000 /* overrides of one rule, file lines too */
#define RL_OVERRIDES_FILE_MAX (64u << 20) /* bytes of one overrides_file */
#define RL_ROUTES_MAX 4096    /* entries of gateway.routes */
#define RL_FLEET_MAX 100000   /* fleet_size, at most */
#define RL_STORE_TIMEOUT_MAX_MS 60000u /* store.timeout_ms, at most */
/* in_flight_lease_ms: its default and bounds. */
#define RL_IN_FLIGHT_LEASE_MS 10000
#define RL_IN_FLIGHT_LEASE_MIN 1000
#define RL_IN_FLIGHT_LEASE_MAX 600000
/* What a request an in_flight rule rejects is told to wait: a slot frees
 * when a request ends, which no one knows in advance. */
#define RL_IN_FLIGHT_RETRY_MS 1000

typedef enum rl_when_op {
    RL_WHEN_EQUAL,  /* attr: value */
    RL_WHEN_ANY,    /* attr: [a, b, c] */
    RL_WHEN_PREFIX, /* attr: {prefix: "/v1/"} */
} rl_when_op;

/* One condition on a request attribute. A request without the attribute
 * does not meet it. values[i] is NUL-terminated, lens[i] bytes. */
typedef struct rl_when_clause {
    char attr[RL_NAME_MAX + 1];
    rl_when_op op;
    char **values;
    size_t *lens;
    size_t n_values;  /* 1 for EQUAL and PREFIX */
} rl_when_clause;

/* Conditions that must all hold; n == 0 holds for every request. */
typedef struct rl_when {
    rl_when_clause *clauses;
    size_t n;
} rl_when;

/* One override of a rule's limit: `when` conditions (a `when` override), or
 * values of the rule's own key (a `values` override, inline or a line of
 * overrides_file). */
typedef struct rl_override {
    rl_limit rate;
    rl_when when;        /* n == 0 for a values override */
    uint32_t order;      /* first match wins: lower first. Inline overrides
                          * in list order, then the file's lines */
    uint32_t line;       /* overrides_file line; 0 for an inline override */
    char *name;          /* `name:` if given, else NULL (see
                          * rl_override_label) */
} rl_override;

/* value -> the values override naming it: a hash table, so that 100,000
 * values cost one lookup. Opaque; common/overrides.c. */
typedef struct rl_override_map rl_override_map;

/* One rule. limit, period_ms and burst are its own rate (the `own` view of
 * the same fields), which applies unless an override does. An in_flight
 * rule's N (and an override's M) is its limit and burst, over a nominal
 * period of a second that nothing refills by. */
typedef struct rl_rule {
    char name[RL_NAME_MAX + 1];
    /* The attributes its key is made of, in order: one, or several for a
     * composite key (every one must be present). match is them as written,
     * joined by ',' for display. */
    char match[RL_MATCH_MAX * (RL_NAME_MAX + 1)];
    char parts[RL_MATCH_MAX][RL_NAME_MAX + 1];
    size_t n_parts;
    int hash_tag;        /* index of the part used as cluster hash tag, or
                          * -1: the whole key hashes */
    /* hash_tag naming any other attribute (or a one-attribute rule's
     * own): its value, as "{<len>:<value>}:", goes between the prefix and
     * the value, so every key tagged with that value shares its slot.
     * "" when not set. Exact and leased rules only. */
    char tag_attr[RL_NAME_MAX + 1];
    char key_prefix[RL_PREFIX_MAX + 1];
    union {
        rl_limit own;
        struct {
            uint64_t limit;
            uint64_t period_ms;
            uint64_t burst;
            bool unlimited;
        };
    };
    rl_mode mode;
    rl_algorithm algorithm;
    rl_on_error on_error;
    uint32_t fleet_size; /* agents sharing the rule, for on_error: local
                          * when no aggregator has said; 0: not given */
    bool shadow;         /* counted and charged, never rejects */
    /* scope: global: one limit over every region (synced rules only);
     * false for the default, scope: region. */
    bool global;
    rl_when when;        /* the requests it applies to */
    /* Overrides in first-match order: the `when` ones (few, tried in
     * order), and every values override, found through values. */
    rl_override *overrides;
    size_t n_overrides;
    rl_override **when_overrides; /* into overrides, by order */
    size_t n_when_overrides;
    rl_override_map *values;      /* NULL when no values override */
    size_t n_values;              /* values mapped (file lines included) */
    char overrides_file[RL_PATH_MAX + 1]; /* as written; "" when none */
    size_t n_file_overrides;
} rl_rule;

_Static_assert(sizeof(rl_limit) == 4 * sizeof(uint64_t),
               "rl_rule's own rate and rl_limit share one layout");

/* store.sentinel: the primary named master, found by asking the
 * sentinels in turn; their own credentials, if any. */
#define RL_SENTINELS_MAX 16

typedef struct rl_sentinel_config {
    char *master;           /* NULL when the store is not found this way */
    rl_endpoint *addresses;
    size_t n_addresses;
    char *username;         /* the sentinels' own; NULL when not set */
    char *password;
} rl_sentinel_config;

/* How much of the server's certificate store.tls checks. */
typedef enum rl_tls_verify {
    RL_TLS_VERIFY_FULL,     /* the chain, and the host name or address */
    RL_TLS_VERIFY_CA,       /* the chain only */
    RL_TLS_VERIFY_NONE,     /* nothing (tests only) */
} rl_tls_verify;

/* TLS to Redis (rediss://, store.tls). Paths are PEM files, "" when not
 * set; with neither ca nor ca_dir the system's trust store is used. */
typedef struct rl_store_tls_config {
    bool enabled;
    char ca[RL_PATH_MAX + 1];
    char ca_dir[RL_PATH_MAX + 1];
    char cert[RL_PATH_MAX + 1];   /* a client certificate (mutual TLS) */
    char key[RL_PATH_MAX + 1];
    char server_name[256];        /* SNI and the name checked; "": host */
    rl_tls_verify verify;
} rl_store_tls_config;

typedef struct rl_store_config {
    bool cluster;           /* nodes are cluster seeds, not one server */
    /* With sentinel.master, nodes[0] is the first sentinel's address
     * until a sentinel names the primary (node.c). */
    rl_sentinel_config sentinel;
    rl_endpoint *nodes;
    size_t n_nodes;
    unsigned db;            /* always 0 for a cluster */
    char *username;         /* NULL when not set */
    char *password;         /* NULL when not set */
    uint32_t timeout_ms;    /* deadline of one check against the store */
    uint32_t wait_replicas; /* WAIT for this many replicas after a write */
    rl_scripts scripts;
    rl_store_tls_config tls; /* to every node and sentinel alike */
} rl_store_config;

/* TLS between agents and aggregators (tls+tcp:// URLs). Paths are PEM
 * files; "" when not set. */
typedef struct rl_tls_config {
    char ca[RL_PATH_MAX + 1];     /* who may be trusted */
    char cert[RL_PATH_MAX + 1];   /* our own certificate (chain) */
    char key[RL_PATH_MAX + 1];    /* and its private key */
    char server_name[256];        /* the name agents expect; "" for none */
    bool require_client_cert;     /* the aggregator asks agents for theirs */
} rl_tls_config;

/* Aggregators in one config, at most: an agent keeps a link to each. */
#define RL_AGGREGATORS_MAX 16

/* Where one aggregator listens. */
typedef struct rl_aggregator_endpoint {
    char reports[RL_NNG_URL_MAX]; /* where agents push their counts */
    char totals[RL_NNG_URL_MAX];  /* where agents hear the fleet's totals */
    bool has_metrics;             /* serve Prometheus text on metrics */
    rl_endpoint metrics;
} rl_aggregator_endpoint;

/* The aggregators (`aggregators:`, or the one of `aggregator:`) and the
 * settings they all share. */
typedef struct rl_aggregator_config {
    rl_aggregator_endpoint endpoints[RL_AGGREGATORS_MAX];
    size_t n_endpoints;           /* at least 1 */
    bool given;                   /* the config names one (else defaults) */
    uint32_t sync_interval_ms;
    /* Synced rules: no fresh totals for this long and an agent enforces
     * its share of a key's limit itself (degraded). */
    uint32_t stale_after_ms;
    uint32_t max_keys;            /* synced keys one agent tracks at most */
    uint32_t max_agents;          /* agents one aggregator keeps track of */
    uint32_t max_message_bytes;   /* a report or totals message, at most */
    uint32_t max_entries;         /* (key, count) pairs in one report */
    rl_tls_config tls;
    /* aggregator.store: the Redis the aggregators keep the synced counts
     * in, when not the shared store (rl_config_aggregator_store). */
    bool has_store;
    rl_store_config store;
} rl_aggregator_config;

/* What rl-gateway reads from the config besides the rules. */
/* One entry of gateway.routes: paths starting with prefix are the route
 * named name. */
typedef struct rl_route {
    char *prefix;
    char *name;
} rl_route;

typedef struct rl_gateway_config {
    char tenant_map[RL_PATH_MAX + 1]; /* api_key -> tenant [plan] file; ""
                                       * if none */
    rl_route *routes;                 /* longest prefix wins */
    size_t n_routes;
    /* The upstream response header whose value is the request's actual
     * cost, committed when the exchange ends; "" if none. */
    char cost_header[RL_NAME_MAX + 1];
    uint32_t cost_estimate;           /* what a request holds until then */
} rl_gateway_config;

/* hold_timeout_ms: ten minutes by default (an LLM response that long is
 * rare); at least a second (a hold is a request's life, not a round
 * trip), at most a day (an open hold is memory kept). */
#define RL_HOLD_TIMEOUT_DEFAULT_MS 600000u
#define RL_HOLD_TIMEOUT_MIN_MS 1000u
#define RL_HOLD_TIMEOUT_MAX_MS 86400000u

/* Regions: each runs its own Redis, aggregators and agents; a synced rule
 * of scope: global is one limit over all of them, kept by the regions'
 * aggregators exchanging their counts (docs/regions.md). */
#define RL_REGIONS_MAX 8
#define RL_REGION_NAME_MAX 32

typedef struct rl_region {
    char name[RL_REGION_NAME_MAX + 1];
    /* Where this region's aggregators take the other regions' exchanges:
     * entry i is the aggregator of --index i's. */
    char peers[RL_AGGREGATORS_MAX][RL_NNG_URL_MAX];
    size_t n_peers;
} rl_region;

typedef struct rl_regions_config {
    rl_region regions[RL_REGIONS_MAX]; /* as the config lists them */
    size_t n;          /* 0: no regions (every rule is regional) */
    size_t self;       /* `region`: this config's, an index into regions */
} rl_regions_config;

struct rl_config {
    rl_store_config store;
    rl_aggregator_config aggregator;
    rl_regions_config regions;
    uint32_t local_max_keys;      /* local buckets one agent keeps at most */
    rl_log_level log_level;       /* the daemons' level unless --log-level */
    uint32_t max_value_bytes;     /* an attribute value, at most */
    /* How long a hold (rl_check_hold) may stay open before the agent ends
     * it at its estimate: the agent's for life, as its store is. */
    uint32_t hold_timeout_ms;
    rl_gateway_config gateway;
    rl_charge charge;
    bool shadow;                  /* every rule in shadow */
    uint32_t fleet_size;          /* every rule's, unless it says; 0: none */
    /* How long an in_flight slot outlives the agent holding it; the
     * agent renews its slots every quarter of it. */
    uint32_t in_flight_lease_ms;
    char *attributes_extra[RL_ATTRS_MAX]; /* `attributes:` the host supplies */
    size_t n_attributes_extra;
    char dir[RL_PATH_MAX + 1];    /* the config file's directory ("" for an
                                   * in-memory config): overrides_file and
                                   * tenant_map are relative to it */
    rl_rule *rules;
    size_t n_rules;
};

/* rl_config_synced_rule finds the synced rule named by len bytes (a name
 * off the wire, not NUL-terminated), or NULL. */
const rl_rule *rl_config_synced_rule(const rl_config *cfg, const char *name,
                                     size_t len);

/* The Redis of the synced counts: aggregator.store if given, else the
 * shared store. */
const rl_store_config *rl_config_aggregator_store(const rl_config *cfg);

/* The config's words for its enums, for messages and listings. */
const char *rl_mode_name(rl_mode mode);
const char *rl_algorithm_name(rl_algorithm algorithm);
const char *rl_on_error_name(rl_on_error on_error);
const char *rl_charge_name(rl_charge charge);
const char *rl_scripts_name(rl_scripts scripts);

#endif
