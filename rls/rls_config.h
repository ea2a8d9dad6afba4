/*
 * rls_config.h: envoyproxy/ratelimit's configuration, as rl-rls reads it.
 * Domains of nested descriptors from YAML files, checked as upstream checks
 * them (the same keys, the same messages, so that a file upstream refuses
 * is refused here with the words its users know), and looked up as
 * upstream looks a request's descriptor up.
 *
 * A config is built once (rls_config_add, or rls_config_load_dir for
 * upstream's runtime layout) and then only read: lookups from any number
 * of threads need no lock.
 */
#ifndef RL_RLS_CONFIG_H
#define RL_RLS_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* RateLimitResponse.RateLimit.Unit's numbers (rls.proto). */
typedef enum rls_unit {
    RLS_UNIT_UNKNOWN = 0,
    RLS_UNIT_SECOND = 1,
    RLS_UNIT_MINUTE = 2,
    RLS_UNIT_HOUR = 3,
    RLS_UNIT_DAY = 4,
    RLS_UNIT_MONTH = 5,
    RLS_UNIT_YEAR = 6,
    RLS_UNIT_WEEK = 7,
} rls_unit;

/* A unit's window in seconds, as upstream counts it (a month is 30 days,
 * a year 365); 0 for UNKNOWN. */
uint64_t rls_unit_seconds(rls_unit unit);

/* The unit's name in upstream's YAML and in rls.proto ("MINUTE"). */
const char *rls_unit_name(rls_unit unit);

typedef struct rls_limit {
    uint32_t requests_per_unit; /* 0: every request is over */
    rls_unit unit;              /* UNKNOWN when unlimited */
    bool unlimited;
    bool shadow_mode;
    bool quota_mode;
    bool detailed_metric;
    char *name;                 /* "" when it has none */
    char **replaces;            /* names of limits this one replaces */
    size_t n_replaces;
    char *full_key;             /* "domain.key_value.key": its stats key */
    /* rl's extension of a descriptor (rl: {algorithm, burst, mode,
     * on_error}):
     * how its limit is counted. Upstream's arithmetic by default. */
    bool token_bucket;          /* algorithm: token_bucket (leased too) */
    uint32_t burst;             /* its bucket; 0: requests_per_unit */
    bool deny_on_error;         /* on_error: deny (default: allow) */
    bool allow_on_error;        /* on_error: allow said (synced's default
                                 * is local) */
    bool local;                 /* mode: local (each instance alone) */
    bool synced;                /* mode: synced (rl-aggregator's totals) */
    bool leased;                /* mode: leased (the bucket, in leases) */
    /* rl: {hold: {id, estimate}}: the cost is known at the stream's end
     * (rls_holds.h). The entries keyed hold_id are not counted: they name
     * the request whose first call opens a hold and whose next ends it. */
    char *hold_id;              /* NULL: no hold */
    uint32_t hold_estimate;     /* 0: the first call's hits */
    /* rl: {in_flight: N} (no rate_limit): at most N requests at once, a
     * slot held from a request's first call to its stream-done call;
     * requests_per_unit is N then, its unit a nominal SECOND. */
    uint32_t in_flight;
} rls_limit;

typedef struct rls_descriptor rls_descriptor;

/* One level of a domain's tree. */
typedef struct rls_level {
    rls_descriptor **sorted;    /* by key_value, for the exact lookups */
    rls_descriptor **in_order;  /* as the files give them */
    size_t n;
    rls_descriptor **wildcards; /* those whose value holds '*', in order */
    size_t n_wildcards;
} rls_level;

struct rls_descriptor {
    char *key_value;            /* "key" or "key_value" */
    size_t key_len;             /* the key's part of it */
    rls_limit *limit;           /* NULL: none at this level */
    bool value_to_metric;
    bool share_threshold;       /* matching values share one counter */
    rls_level children;
};

typedef struct rls_domain {
    char *name;
    rls_level top;
} rls_domain;

typedef struct rls_config {
    rls_domain *domains;        /* sorted by name once complete */
    size_t n_domains;
    bool merge;                 /* MERGE_DOMAIN_CONFIG */
    bool synced;                /* mode: synced can be served (rl-rls has
                                 * an aggregator): else it is refused */
    size_t n_files;
} rls_config;

/* Entries of one request descriptor that a lookup walks at most: Envoy's
 * actions make a few; a longer one finds no limit. */
#define RLS_ENTRIES_MAX 64

/* A request descriptor's entry (bytes: not NUL-terminated). */
typedef struct rls_entry {
    const char *key;
    size_t key_len;
    const char *value;
    size_t value_len;
} rls_entry;

/* What a lookup found: the limit that applies (NULL: none), and for each
 * entry matched by a share_threshold wildcard the pattern's value part
 * (the counter is the pattern's, not the value's), NULL elsewhere. For
 * upstream's stats key (rls_stat_key.h), each matched entry's part of it:
 * the descriptor's key_value, or NULL where value_to_metric names it by
 * the request's own value. */
typedef struct rls_match {
    const rls_limit *limit;
    const char *shared[RLS_ENTRIES_MAX];
    const char *named[RLS_ENTRIES_MAX];
} rls_match;

/* rls_config_new: an empty config; merge: a domain in several files has
 * their descriptors together (MERGE_DOMAIN_CONFIG), else it is an error;
 * synced: rl's extension may ask for mode: synced (rl-rls runs with an
 * aggregator), else a file asking for it is refused. NULL without
 * memory. */
rls_config *rls_config_new(bool merge, bool synced);

/* rls_config_add reads one file's text under name (upstream's runtime
 * key, e.g. "config.limits.yaml", which starts every error). 0, or -1
 * with upstream's message in err ("config.x.yaml: config error, unknown
 * key 'ratelimit'"); the config is then to be freed. */
int rls_config_add(rls_config *c, const char *name, const char *text,
                   size_t len, char *err, size_t cap);

/* rls_config_load_dir reads every file under dir, recursively, as
 * upstream's runtime loader does, naming each by its path below dir with
 * '/' made '.' and prefix before it ("config." with RUNTIME_WATCH_ROOT,
 * "" without); ignore_dotfiles skips files and directories whose name
 * starts with '.'. *out on 0; -1 with the message in err. */
int rls_config_load_dir(const char *dir, const char *prefix,
                        bool ignore_dotfiles, bool merge, bool synced,
                        rls_config **out, char *err, size_t cap);

void rls_config_free(rls_config *c);

/* The domain, or NULL (an unknown domain is no error: no limit). */
const rls_domain *rls_config_domain(const rls_config *c, const char *name,
                                    size_t len);

/* rls_config_lookup walks the domain's tree as upstream does: at each
 * level the entry's exact key_value, else the level's wildcards in order,
 * else the bare key; a limit applies only at the level of the last entry.
 * More than RLS_ENTRIES_MAX entries find no limit. */
void rls_config_lookup(const rls_domain *d, const rls_entry *entries,
                       size_t n, rls_match *out);

/* upstream's /rlconfig dump: one line per limit, "full_key: unit=MINUTE
 * requests_per_unit=20, shadow_mode: false". A string to free, or NULL. */
char *rls_config_dump(const rls_config *c);

#endif
