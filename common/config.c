/*
 * config.c: turns the YAML that libcyaml read into a validated rl_config.
 * Every rejection names the document, the line where it can be found, the
 * field and the rule, and says what would be accepted. A config either loads
 * whole or not at all: no field is ever defaulted over a value that was
 * written but wrong.
 */
#include "config.h"

#include "config_loader.h"
#include "config_yaml.h"
#include "duration.h"
#include "error.h"
#include "rules.h"
#include "wire.h"
#include "yaml_locate.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml.h>

#define RL_CONFIG_FILE_MAX (4u << 20)

#define DEFAULT_STORE_HOST "127.0.0.1"
#define DEFAULT_TIMEOUT_MS 50
#define DEFAULT_REPORTS_URL "tcp://127.0.0.1:7301"
#define DEFAULT_TOTALS_URL "tcp://127.0.0.1:7302"
#define DEFAULT_SYNC_INTERVAL_MS 1000
#define DEFAULT_MAX_KEYS 100000
#define DEFAULT_MAX_AGENTS 10000

static const char *const log_level_names[] = {"debug", "info", "warn",
                                              "error", NULL};
static const char *const mode_names[] = {"exact", "synced", "local",
                                         "leased", "in_flight", NULL};
static const char *const algorithm_names[] = {"token_bucket", "gcra",
                                              "fixed_window", NULL};
static const char *const on_error_names[] = {"allow", "deny", "local",
                                             NULL};
static const char *const charge_names[] = {"all", "first_reject", "refund",
                                           "atomic", NULL};
static const char *const scripts_names[] = {"auto", "function", "eval", NULL};
static const char *const verify_names[] = {"full", "ca", "none", NULL};

const char *rl_mode_name(rl_mode m) { return mode_names[m]; }
const char *rl_algorithm_name(rl_algorithm a) { return algorithm_names[a]; }
const char *rl_on_error_name(rl_on_error o) { return on_error_names[o]; }
const char *rl_charge_name(rl_charge c) { return charge_names[c]; }
const char *rl_scripts_name(rl_scripts s) { return scripts_names[s]; }

/* Reports a problem at the node at path (or at node, when given) and
 * returns RL_ECONFIG: see config_loader.h. */
int rl_config_vbad(struct loader *ld, const yaml_node_t *node,
                   const char *path, bool at_key, const char *fmt,
                   va_list ap)
{
    char what[768], shown[256], where[64] = "", rule[RL_NAME_MAX + 16] = "";
    vsnprintf(what, sizeof what, fmt, ap);
    if (node == NULL && ld->have_doc)
        node = rl_yaml_at(&ld->doc, NULL, path, at_key);
    if (node != NULL)
        snprintf(where, sizeof where, ":%u:%u",
                 (unsigned)node->start_mark.line + 1,
                 (unsigned)node->start_mark.column + 1);
    if (ld->rule != NULL)
        snprintf(rule, sizeof rule, " (rule \"%s\")", ld->rule);
    rl_config_path_display(path, shown, sizeof shown);
    return rl_error_set(ld->err, RL_ECONFIG, "%s%s: %s%s: %s", ld->name, where,
                        shown, rule, what);
}

const rl_rule *rl_config_synced_rule(const rl_config *cfg, const char *name,
                                     size_t len)
{
    for (size_t i = 0; i < cfg->n_rules; i++) {
        const rl_rule *r = &cfg->rules[i];
        if (r->mode == RL_MODE_SYNCED && strlen(r->name) == len
            && memcmp(r->name, name, len) == 0)
            return r;
    }
    return NULL;
}

bool rl_config_has_in_flight(const rl_config *cfg)
{
    for (size_t i = 0; cfg != NULL && i < cfg->n_rules; i++) {
        if (cfg->rules[i].mode == RL_MODE_IN_FLIGHT)
            return true;
    }
    return false;
}

static int out_of_memory(struct loader *ld)
{
    return rl_error_set(ld->err, RL_ENOMEM, "%s: out of memory", ld->name);
}

/* Looks text up among names; an absent text leaves the default. */
static int choose(struct loader *ld, const char *path, const char *text,
                  const char *const *names, int *out)
{
    if (text == NULL)
        return RL_OK;
    for (int i = 0; names[i] != NULL; i++) {
        if (strcmp(text, names[i]) == 0) {
            *out = i;
            return RL_OK;
        }
    }
    char choices[128] = "";
    for (int i = 0; names[i] != NULL; i++) {
        size_t n = strlen(choices);
        snprintf(choices + n, sizeof choices - n, "%s%s", i ? ", " : "",
                 names[i]);
    }
    return bad(ld, path, "unknown value '%s' (choose one of: %s)", text,
               choices);
}

/* Reads a decimal integer from min to max: digits only, so that "5.5",
 * "0x10" and "-1" are errors rather than 5, 16 and a wrapped number. On a
 * bad number writes why into why (cap bytes) and returns false. */
bool rl_config_parse_u64(const char *text, uint64_t min, uint64_t max,
                         uint64_t *out, char *why, size_t cap)
{
    uint64_t n = 0;
    const char *p = text;
    for (; *p >= '0' && *p <= '9' && n <= max; p++)
        n = n * 10 + (uint64_t)(*p - '0');
    if (p == text || *p != '\0' || n < min || n > max) {
        snprintf(why, cap, "must be a whole number from %llu to %llu, got "
                 "'%s'", (unsigned long long)min, (unsigned long long)max,
                 text);
        return false;
    }
    *out = n;
    return true;
}

static int parse_int(struct loader *ld, const char *path, const char *text,
                     uint64_t min, uint64_t max, uint64_t *out)
{
    char why[512];
    if (!rl_config_parse_u64(text, min, max, out, why, sizeof why))
        return bad(ld, path, "%s", why);
    return RL_OK;
}

/* true or false, nothing else: "yes" and "on" are YAML 1.1 spellings a
 * reader may not expect to be booleans. */
int rl_config_parse_bool(struct loader *ld, const char *path,
                         const char *text, bool *out)
{
    if (text == NULL)
        return RL_OK;
    if (strcmp(text, "true") == 0 || strcmp(text, "false") == 0) {
        *out = text[0] == 't';
        return RL_OK;
    }
    return bad(ld, path, "must be true or false, got '%s'", text);
}

/* Names appear in response headers and JSON bodies; keep them plain. */
static bool is_plain_name(const char *s, const char *extra)
{
    if (*s == '\0')
        return false;
    for (; *s != '\0'; s++) {
        bool ok = (*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z')
                  || (*s >= '0' && *s <= '9') || strchr(extra, *s) != NULL;
        if (!ok)
            return false;
    }
    return true;
}

/* config_rules.c reads with the same words. */
int rl_config_parse_int(struct loader *ld, const char *path,
                        const char *text, uint64_t min, uint64_t max,
                        uint64_t *out)
{
    return parse_int(ld, path, text, min, max, out);
}

bool rl_config_plain_name(const char *s, const char *extra)
{
    return is_plain_name(s, extra);
}

int rl_config_oom(struct loader *ld)
{
    return out_of_memory(ld);
}

static bool is_printable_word(const char *s)
{
    if (*s == '\0')
        return false;
    for (; *s != '\0'; s++) {
        unsigned char c = (unsigned char)*s;
        if (c <= ' ' || c == 0x7f)
            return false;
    }
    return true;
}

/* The seed's keys: rl:ip:..., rl:key:..., rl:tenant:...; a composite
 * key's prefix names its parts: rl:key_route:...; an in_flight rule's
 * are rl:in_flight:key:... Returns false when that is longer than a key
 * prefix may be. */
static bool default_prefix(const rl_rule *rule, char *out, size_t cap)
{
    /* An in_flight rule's keys are hashes, a bucket's strings: apart, a
     * reload that turns a rule from one to the other never finds the
     * other's key (Redis's WRONGTYPE until it expired). */
    size_t n = (size_t)snprintf(out, cap, "%s",
                                rule->mode == RL_MODE_IN_FLIGHT
                                    ? "rl:in_flight:" : "rl:");
    for (size_t i = 0; i < rule->n_parts && n < cap; i++) {
        const char *part = rule->parts[i];
        const char *short_name = strcmp(part, "api_key") == 0 ? "key" : part;
        n += (size_t)snprintf(out + n, cap - n, "%s%s", i ? "_" : "",
                              short_name);
    }
    if (n < cap)
        n += (size_t)snprintf(out + n, cap - n, ":");
    return n < cap;
}

/* The scripts count in 1/period_ms tokens so that refills are whole
 * numbers; Redis's doubles keep them exact up to 2^53. */
bool rl_config_rate_countable(const rl_limit *rate, char *why, size_t cap)
{
    if (rate->unlimited || rate->burst <= RL_LIMIT_MAX / rate->period_ms)
        return true;
    snprintf(why, cap, "burst %llu (the bucket's capacity, limit unless set) "
             "over a period of %llu ms is more than rl can count exactly: "
             "burst x period in ms must stay below 2^53; shorten the period "
             "or lower the burst", (unsigned long long)rate->burst,
             (unsigned long long)rate->period_ms);
    return false;
}

#define FIELD(f) (snprintf(path, sizeof path, "rules.%zu.%s", i, f), path)
/* in_flight: N holds slots, not tokens: a rate, a bucket or a window
 * would mean nothing for it. */
static int load_in_flight(struct loader *ld, size_t i,
                          const rl_raw_rule *raw, rl_rule *rule)
{
    char path[64];
    const char *extra = raw->limit ? "limit"
                        : raw->period ? "period"
                        : raw->burst ? "burst"
                        : raw->algorithm ? "algorithm" : NULL;
    if (extra != NULL)
        return bad(ld, FIELD(extra), "an in_flight rule admits at most N "
                   "requests at once and has no %s: give in_flight alone, "
                   "or make a second rule for a rate", extra);
    int rc = parse_int(ld, FIELD("in_flight"), raw->in_flight, 1,
                       RL_LIMIT_MAX, &rule->limit);
    if (rc != RL_OK)
        return rc;
    if (raw->mode != NULL && strcmp(raw->mode, "in_flight") != 0)
        return bad(ld, FIELD("mode"), "in_flight: N is a mode of its own "
                   "(slots held in the store): leave mode out, or write "
                   "mode: in_flight");
    if (raw->overrides_file != NULL)
        return bad(ld, FIELD("overrides_file"), "an overrides_file's lines "
                   "are rates: give an in_flight rule's overrides inline "
                   "(values: [...], in_flight: M)");
    rule->burst = rule->limit;
    rule->period_ms = 1000;
    rule->mode = RL_MODE_IN_FLIGHT;
    rule->algorithm = RL_ALGO_TOKEN_BUCKET;
    return RL_OK;
}

/* The rule's own rate, mode and algorithm. */
static int load_rate(struct loader *ld, size_t i, const rl_raw_rule *raw,
                     rl_rule *rule)
{
    char path[64], why[512];
    int rc, choice;
    if (raw->in_flight != NULL)
        return load_in_flight(ld, i, raw, rule);
    if (raw->mode != NULL && strcmp(raw->mode, "in_flight") == 0)
        return bad(ld, FIELD("mode"), "mode: in_flight needs in_flight: N, "
                   "the requests admitted at once, in place of limit and "
                   "period");
    if (raw->limit == NULL || raw->period == NULL) {
        snprintf(path, sizeof path, "rules.%zu", i);
        return bad(ld, path, "missing required field '%s': give limit and "
                   "period, or in_flight: N for requests at once",
                   raw->limit == NULL ? "limit" : "period");
    }
    if ((rc = parse_int(ld, FIELD("limit"), raw->limit, 1, RL_LIMIT_MAX,
                        &rule->limit)) != RL_OK)
        return rc;

    if (rl_duration_parse(raw->period, &rule->period_ms) != RL_OK)
        return bad(ld, FIELD("period"), "'%s' is not a period: write a "
                   "positive count and a unit (ms, s, m, h, d), e.g. 500ms, "
                   "1s, 1m, 1h, 1d, at most 366d", raw->period);

    rule->burst = rule->limit;
    if (raw->burst != NULL
        && (rc = parse_int(ld, FIELD("burst"), raw->burst, 1, RL_LIMIT_MAX,
                           &rule->burst)) != RL_OK)
        return rc;
    if (!rl_config_rate_countable(&rule->own, why, sizeof why))
        return bad(ld, FIELD(raw->burst ? "burst" : "limit"), "%s", why);

    choice = RL_MODE_EXACT;
    if ((rc = choose(ld, FIELD("mode"), raw->mode, mode_names, &choice)))
        return rc;
    rule->mode = (rl_mode)choice;
    choice = RL_ALGO_TOKEN_BUCKET;
    if ((rc = choose(ld, FIELD("algorithm"), raw->algorithm, algorithm_names,
                     &choice)))
        return rc;
    rule->algorithm = (rl_algorithm)choice;
    /* A window is counted by the store (exact) or in the agent (local):
     * synced and leased rules keep their buckets' arithmetic. */
    if (rule->algorithm == RL_ALGO_FIXED_WINDOW
        && (rule->mode == RL_MODE_SYNCED || rule->mode == RL_MODE_LEASED))
        return bad(ld, FIELD("algorithm"), "fixed_window is for mode: exact "
                   "or local; a %s rule counts with a token bucket (leave "
                   "algorithm out)", rl_mode_name(rule->mode));
    if (rule->algorithm == RL_ALGO_FIXED_WINDOW && raw->burst != NULL
        && rule->burst != rule->limit)
        return bad(ld, FIELD("burst"), "a fixed window admits limit per "
                   "period and has no burst (a token bucket's): leave burst "
                   "out");
    return RL_OK;
}

/* scope: global is one limit over every region, kept by exchanging
 * counts between the regions' aggregators every interval: only a synced
 * rule's counts are exchanged so, as an exact or leased rule needs a store
 * round trip per check, too slow across regions. */
static int load_scope(struct loader *ld, size_t i, const rl_raw_rule *raw,
                      const rl_config *cfg, rl_rule *rule)
{
    static const char *const scope_names[] = {"region", "global", NULL};
    char path[64];
    int choice = 0, rc;
    snprintf(path, sizeof path, "rules.%zu.scope", i);
    if ((rc = choose(ld, path, raw->scope, scope_names, &choice)) != RL_OK)
        return rc;
    rule->global = choice == 1;
    if (!rule->global)
        return RL_OK;
    if (rule->mode != RL_MODE_SYNCED)
        return bad(ld, path, "a rule of mode %s stays in its region (each "
                   "check waits on its region's store, and a round trip "
                   "between regions is too slow for that): only a synced "
                   "rule can be global", rl_mode_name(rule->mode));
    if (cfg->regions.n == 0)
        return bad(ld, path, "global needs the regions: give `region` (this "
                   "config's) and `regions` (every region's peers)");
    return RL_OK;
}

static int load_rule(struct loader *ld, size_t i, const rl_raw_rule *raw,
                     const rl_config *cfg, rl_rule *rule)
{
    char path[64];
    int rc, choice;

    ld->rule = NULL;
    rule->hash_tag = -1;
    if (!is_plain_name(raw->name, "_.:-"))
        return bad(ld, FIELD("name"), "'%s' is not a valid rule name (use "
                   "letters, digits and _ . : -)", raw->name);
    snprintf(rule->name, sizeof rule->name, "%s", raw->name);
    ld->rule = rule->name;

    if ((rc = rl_config_load_match(ld, i, raw, rule)) != RL_OK)
        return rc;

    if ((rc = load_rate(ld, i, raw, rule)) != RL_OK)
        return rc;
    /* A synced rule whose aggregator is away keeps this agent's share of
     * its limit: neither everything nor nothing. */
    choice = rule->mode == RL_MODE_SYNCED ? RL_ON_ERROR_LOCAL
                                          : RL_ON_ERROR_ALLOW;
    if ((rc = choose(ld, FIELD("on_error"), raw->on_error, on_error_names,
                     &choice)))
        return rc;
    rule->on_error = (rl_on_error)choice;
    /* A local rule's bucket is in the agent: no store to wait for, and
     * its fallback would be a second bucket beside the first. Its keys
     * over local.max_keys take allow or deny. */
    if (rule->on_error == RL_ON_ERROR_LOCAL && rule->mode == RL_MODE_LOCAL)
        return bad(ld, FIELD("on_error"), "local falls back to a bucket in "
                   "the agent when the store does not answer, and a mode: "
                   "local rule never asks the store: use allow or deny (for "
                   "keys over local.max_keys)");
    rule->fleet_size = cfg->fleet_size;
    if (raw->fleet_size != NULL) {
        uint64_t n;
        if ((rc = parse_int(ld, FIELD("fleet_size"), raw->fleet_size, 1,
                            RL_FLEET_MAX, &n)) != RL_OK)
            return rc;
        rule->fleet_size = (uint32_t)n;
    }

    if (raw->key_prefix == NULL) {
        if (!default_prefix(rule, rule->key_prefix, sizeof rule->key_prefix))
            return bad(ld, FIELD("match"), "the default key prefix (rl:, "
                       "in_flight: for an in_flight rule, and the "
                       "attributes' names) would be over %d bytes: give "
                       "the rule a shorter key_prefix", RL_PREFIX_MAX);
    } else if (!is_printable_word(raw->key_prefix)) {
        return bad(ld, FIELD("key_prefix"), "'%s' is not a valid key prefix "
                   "(no spaces or control characters, not empty)",
                   raw->key_prefix);
    } else {
        snprintf(rule->key_prefix, sizeof rule->key_prefix, "%s",
                 raw->key_prefix);
    }
    /* Redis Cluster hashes on what lies between a key's first '{' and the
     * '}' after it: with a hash tag, that must be the tagged part. */
    if ((rule->hash_tag >= 0 || rule->tag_attr[0] != '\0')
        && strchr(rule->key_prefix, '{') != NULL)
        return bad(ld, FIELD("key_prefix"), "'%s' holds a '{': with "
                   "hash_tag, the key's first '{' must open the tag; take "
                   "the '{' out", rule->key_prefix);
    /* A tag puts a Redis key in a slot; a synced or local rule's counts
     * are not one key an agent calls. */
    if (rule->tag_attr[0] != '\0' && rule->mode != RL_MODE_EXACT
        && rule->mode != RL_MODE_LEASED && rule->mode != RL_MODE_IN_FLIGHT)
        return bad(ld, FIELD("hash_tag"), "'%s' would co-locate the rule's "
                   "Redis keys by that attribute's value, and a %s rule has "
                   "no key an agent calls: use mode exact or leased, or drop "
                   "hash_tag", rule->tag_attr, rl_mode_name(rule->mode));

    if ((rc = load_scope(ld, i, raw, cfg, rule)) != RL_OK)
        return rc;
    rule->shadow = cfg->shadow;
    if ((rc = rl_config_parse_bool(ld, FIELD("shadow"), raw->shadow,
                                   &rule->shadow)) != RL_OK)
        return rc;
    /* The global switch wins over a rule's own shadow: false, so that
     * "every rule in shadow" holds whatever the rules say. */
    rule->shadow = rule->shadow || cfg->shadow;
#undef FIELD
    return rl_config_load_overrides(ld, i, raw, cfg, rule);
}

/* Two rules with one name could not be told apart in headers; two rules with
 * one key prefix would share buckets with different rates, and so would two
 * whose prefixes nest: with 'api:' and 'api:v2:', the first rule's value
 * 'v2:x' is the second's key for 'x', so one rule's client could spend
 * another rule's bucket. Prefixes where neither begins the other differ
 * within both, and so do all their keys. */
static bool prefixes_nest(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    return strncmp(a, b, la < lb ? la : lb) == 0;
}

static int check_rules_distinct(struct loader *ld, const rl_config *cfg)
{
    char path[64];
    for (size_t i = 0; i < cfg->n_rules; i++) {
        for (size_t j = 0; j < i; j++) {
            const rl_rule *a = &cfg->rules[j], *b = &cfg->rules[i];
            ld->rule = b->name;
            if (strcmp(a->name, b->name) == 0) {
                snprintf(path, sizeof path, "rules.%zu.name", i);
                return bad(ld, path, "duplicate rule name: rules[%zu] has "
                           "it already", j);
            }
            if (strcmp(a->key_prefix, b->key_prefix) == 0) {
                snprintf(path, sizeof path, "rules.%zu", i);
                return bad(ld, path, "key prefix '%s' is also used by rule "
                           "\"%s\": the two would share buckets; give one of "
                           "them its own key_prefix", b->key_prefix, a->name);
            }
            if (prefixes_nest(a->key_prefix, b->key_prefix)) {
                snprintf(path, sizeof path, "rules.%zu", i);
                return bad(ld, path, "key prefix '%s' and rule \"%s\"'s '%s' "
                           "nest: a value of the shorter one's rule can spell "
                           "a key of the longer one's, sharing its bucket; "
                           "give them prefixes where neither begins the other",
                           b->key_prefix, a->name, a->key_prefix);
            }
        }
    }
    return RL_OK;
}

static int load_rules(struct loader *ld, const rl_raw_config *raw,
                      rl_config *cfg)
{
    if (raw->rules_count == 0)
        return bad(ld, "rules", "the rules list is empty: give at least one "
                   "rule (name, match, limit, period)");
    cfg->rules = calloc(raw->rules_count, sizeof *cfg->rules);
    if (cfg->rules == NULL)
        return out_of_memory(ld);
    cfg->n_rules = raw->rules_count;
    for (size_t i = 0; i < cfg->n_rules; i++) {
        int rc = load_rule(ld, i, &raw->rules[i], cfg, &cfg->rules[i]);
        if (rc != RL_OK)
            return rc;
    }
    int rc = check_rules_distinct(ld, cfg);
    if (rc == RL_OK)
        rc = rl_config_check_attributes(ld, cfg);
    ld->rule = NULL;
    return rc;
}

static int copy_secret(struct loader *ld, const char *text, char **out)
{
    if (text == NULL)
        return RL_OK;
    *out = strdup(text);
    if (*out == NULL)
        return out_of_memory(ld);
    return RL_OK;
}

/* Where a store field was written: store.<field>, or
 * aggregator.store.<field> for the aggregator's own. */
static const char *store_field(char *buf, size_t cap, const char *where,
                               const char *field)
{
    snprintf(buf, cap, "%s.%s", where, field);
    return buf;
}

#define AT(field) store_field(sp, sizeof sp, where, field)

/* A password read from a file: one line, its newline dropped. The file is
 * read once, at load; its text is never logged. */
static int password_from_file(struct loader *ld, const char *where,
                              const char *path, char **out)
{
    char sp[64];
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return bad(ld, AT("password_file"), "cannot read '%s': %s", path,
                   strerror(errno));
    char text[RL_SECRET_MAX + 2];
    size_t n = fread(text, 1, sizeof text - 1, f);
    bool more = fgetc(f) != EOF;
    fclose(f);
    text[n] = '\0';
    if (n > 0 && text[n - 1] == '\n')
        text[--n] = '\0';
    if (n > 0 && text[n - 1] == '\r')
        text[--n] = '\0';
    if (more || n > RL_SECRET_MAX || strchr(text, '\n') != NULL)
        return bad(ld, AT("password_file"), "'%s' must hold one line of "
                   "at most %d bytes", path, RL_SECRET_MAX);
    if (n == 0 || memchr(text, '\0', n) != NULL)
        return bad(ld, AT("password_file"), "'%s' is empty", path);
    return copy_secret(ld, text, out);
}

/* store.password, or store.password_file, or store.password_env: one of
 * them at most, so that it is clear where the secret comes from. */
static int load_password(struct loader *ld, const char *where,
                         const rl_raw_store *raw, rl_store_config *store)
{
    char sp[64];
    int given = (raw->password != NULL) + (raw->password_file != NULL)
                + (raw->password_env != NULL);
    if (given > 1)
        return bad(ld, AT("password"), "give one of password, "
                   "password_file and password_env");
    if (raw->password_file != NULL)
        return password_from_file(ld, where, raw->password_file,
                                  &store->password);
    if (raw->password_env != NULL) {
        const char *value = getenv(raw->password_env);
        if (value == NULL || value[0] == '\0')
            return bad(ld, AT("password_env"), "the environment variable "
                       "%s is not set", raw->password_env);
        if (strlen(value) > RL_SECRET_MAX)
            return bad(ld, AT("password_env"), "%s is over %d bytes",
                       raw->password_env, RL_SECRET_MAX);
        return copy_secret(ld, value, &store->password);
    }
    return copy_secret(ld, raw->password, &store->password);
}

/* "user:password@host" where an address goes: refused without echoing
 * the text, as config errors end up in logs (a reload's, the journal). */
static int credentials_refused(struct loader *ld, const char *where,
                               const char *path)
{
    return bad(ld, path, "credentials are not accepted here (and not shown, "
               "to keep them out of logs): give them in %s.username and "
               "%s.password, password_file or password_env", where, where);
}

static int load_seeds(struct loader *ld, const char *where,
                      const rl_raw_store *raw, rl_store_config *store)
{
    char sp[64];
    char path[64];
    if (raw->cluster_count == 0)
        return bad(ld, AT("cluster"), "the cluster list is empty: give at "
                   "least one node as host:port");
    store->nodes = calloc(raw->cluster_count, sizeof *store->nodes);
    if (store->nodes == NULL)
        return out_of_memory(ld);
    store->n_nodes = raw->cluster_count;
    store->cluster = true;
    for (size_t i = 0; i < store->n_nodes; i++) {
        snprintf(path, sizeof path, "%s.cluster.%zu", where, i);
        if (strchr(raw->cluster[i], '@') != NULL)
            return credentials_refused(ld, where, path);
        if (rl_endpoint_parse(raw->cluster[i], &store->nodes[i]) != RL_OK)
            return bad(ld, path, "'%s' is not host:port (IPv6 as "
                       "[addr]:port)", raw->cluster[i]);
    }
    return RL_OK;
}

/* store.sentinel: a master's name (as the sentinels' config has it) and
 * the sentinels' host:port. nodes[0] starts as the first sentinel, for
 * the lines that name the store before a sentinel has answered. */
static int load_sentinel(struct loader *ld, const char *where,
                         const rl_raw_sentinel *raw, rl_store_config *store)
{
    char sp[64], path[64];
    int rc;
    if (raw->master == NULL)
        return bad(ld, AT("sentinel"), "give master: the master's name as "
                   "the sentinels know it");
    if (raw->master[0] == '\0' || strpbrk(raw->master, " \t\r\n") != NULL)
        return bad(ld, AT("sentinel.master"), "'%s' is not a master's name "
                   "(one word, as the sentinels know it)", raw->master);
    if (raw->addresses_count == 0)
        return bad(ld, AT("sentinel"), "give addresses: at least one "
                   "sentinel as host:port");
    store->sentinel.addresses = calloc(raw->addresses_count,
                                       sizeof *store->sentinel.addresses);
    store->nodes = calloc(1, sizeof *store->nodes);
    if (store->sentinel.addresses == NULL || store->nodes == NULL)
        return out_of_memory(ld);
    store->sentinel.n_addresses = raw->addresses_count;
    for (size_t i = 0; i < raw->addresses_count; i++) {
        snprintf(path, sizeof path, "%s.sentinel.addresses.%zu", where, i);
        if (strchr(raw->addresses[i], '@') != NULL)
            return credentials_refused(ld, where, path);
        if (rl_endpoint_parse(raw->addresses[i],
                              &store->sentinel.addresses[i]) != RL_OK)
            return bad(ld, path, "'%s' is not host:port (IPv6 as "
                       "[addr]:port)", raw->addresses[i]);
    }
    store->nodes[0] = store->sentinel.addresses[0];
    store->n_nodes = 1;
    if (raw->username != NULL && raw->password == NULL)
        return bad(ld, AT("sentinel.username"), "a username needs a "
                   "password (%s.sentinel.password)", where);
    if ((rc = copy_secret(ld, raw->master, &store->sentinel.master))
            != RL_OK
        || (rc = copy_secret(ld, raw->username, &store->sentinel.username))
               != RL_OK)
        return rc;
    return copy_secret(ld, raw->password, &store->sentinel.password);
}

/* store.tls: TLS to every node and sentinel of the store. A rediss:// URL
 * alone takes the defaults (the system's trust store, verify: full); a
 * plain redis:// URL with a tls block is a contradiction, said so. */
static int load_store_tls(struct loader *ld, const char *where,
                          const rl_raw_store *raw, rl_store_config *store)
{
    const rl_raw_store_tls *t = raw->tls;
    rl_store_tls_config *c = &store->tls;
    c->verify = RL_TLS_VERIFY_FULL;
    if (t == NULL)
        return RL_OK;
    char sp[64];
    if (raw->url != NULL && !c->enabled)
        return bad(ld, AT("tls"), "set, but %s.url is redis://: write "
                   "rediss:// for TLS", where);
    c->enabled = true;
    snprintf(c->ca, sizeof c->ca, "%s", t->ca != NULL ? t->ca : "");
    snprintf(c->ca_dir, sizeof c->ca_dir, "%s",
             t->ca_dir != NULL ? t->ca_dir : "");
    snprintf(c->cert, sizeof c->cert, "%s", t->cert != NULL ? t->cert : "");
    snprintf(c->key, sizeof c->key, "%s", t->key != NULL ? t->key : "");
    snprintf(c->server_name, sizeof c->server_name, "%s",
             t->server_name != NULL ? t->server_name : "");
    int choice = RL_TLS_VERIFY_FULL;
    int rc = choose(ld, AT("tls.verify"), t->verify, verify_names, &choice);
    if (rc != RL_OK)
        return rc;
    c->verify = (rl_tls_verify)choice;
    if (c->ca[0] != '\0' && c->ca_dir[0] != '\0')
        return bad(ld, AT("tls"), "give ca or ca_dir, not both");
    if ((c->cert[0] == '\0') != (c->key[0] == '\0'))
        return bad(ld, AT("tls"), "cert and key go together: give both or "
                   "neither");
    return RL_OK;
}

/* The store block at where ("store", or "aggregator.store"). */
static int load_store(struct loader *ld, const char *where,
                      const rl_raw_store *raw, rl_store_config *store)
{
    char sp[64];
    int rc;
    store->timeout_ms = DEFAULT_TIMEOUT_MS;
    if (raw != NULL && raw->url != NULL && raw->cluster != NULL)
        return bad(ld, AT("cluster"), "give either %s.url or %s.cluster, "
                   "not both", where, where);
    if (raw != NULL && raw->sentinel != NULL
        && (raw->url != NULL || raw->cluster != NULL))
        return bad(ld, AT("sentinel"), "give one of %s.url, %s.cluster and "
                   "%s.sentinel", where, where, where);
    if (raw != NULL && raw->sentinel != NULL) {
        if ((rc = load_sentinel(ld, where, raw->sentinel, store)) != RL_OK)
            return rc;
    } else if (raw != NULL && raw->cluster != NULL) {
        if ((rc = load_seeds(ld, where, raw, store)) != RL_OK)
            return rc;
    } else {
        store->nodes = calloc(1, sizeof *store->nodes);
        if (store->nodes == NULL)
            return out_of_memory(ld);
        store->n_nodes = 1;
        snprintf(store->nodes[0].host, RL_HOST_MAX, DEFAULT_STORE_HOST);
        store->nodes[0].port = RL_REDIS_DEFAULT_PORT;
        if (raw != NULL && raw->url != NULL
            && strchr(raw->url, '@') != NULL)
            return credentials_refused(ld, where, AT("url"));
        if (raw != NULL && raw->url != NULL
            && rl_redis_url_parse(raw->url, &store->nodes[0], &store->db,
                                  &store->tls.enabled))
            return bad(ld, AT("url"), "'%s' is not redis://host[:port][/db]"
                       " or rediss://... (credentials go in store.username "
                       "and store.password)", raw->url);
    }
    if (raw == NULL)
        return RL_OK;
    if ((rc = load_store_tls(ld, where, raw, store)) != RL_OK)
        return rc;
    uint64_t n;
    if (raw->timeout_ms != NULL) {
        if ((rc = parse_int(ld, AT("timeout_ms"), raw->timeout_ms, 1,
                            RL_STORE_TIMEOUT_MAX_MS, &n)) != RL_OK)
            return rc;
        store->timeout_ms = (uint32_t)n;
    }
    if (raw->wait_replicas != NULL) {
        if ((rc = parse_int(ld, AT("wait_replicas"), raw->wait_replicas, 0,
                            16, &n)) != RL_OK)
            return rc;
        store->wait_replicas = (uint32_t)n;
    }
    int choice = RL_SCRIPTS_AUTO;
    if ((rc = choose(ld, AT("scripts"), raw->scripts, scripts_names,
                     &choice)) != RL_OK)
        return rc;
    store->scripts = (rl_scripts)choice;
    if (raw->username != NULL && raw->password == NULL
        && raw->password_file == NULL && raw->password_env == NULL)
        return bad(ld, AT("username"), "a username needs a password "
                   "(store.password, password_file or password_env)");
    if ((rc = copy_secret(ld, raw->username, &store->username)) != RL_OK)
        return rc;
    return load_password(ld, where, raw, store);
}

bool rl_config_nng_url(const char *url)
{
    static const char *const schemes[] = {"tcp://", "tcp4://", "tcp6://",
                                          "ipc://", "inproc://", "ws://",
                                          "tls+tcp://", NULL};
    for (int i = 0; schemes[i] != NULL; i++) {
        size_t n = strlen(schemes[i]);
        if (strncmp(url, schemes[i], n) == 0 && url[n] != '\0')
            return is_printable_word(url);
    }
    return false;
}

static int load_nng_url(struct loader *ld, const char *path, const char *text,
                        const char *fallback, char *out)
{
    if (text != NULL && !rl_config_nng_url(text))
        return bad(ld, path, "'%s' is not an nng URL such as "
                   "tcp://127.0.0.1:7301 or ipc:///run/rl/reports", text);
    snprintf(out, RL_NNG_URL_MAX, "%s", text != NULL ? text : fallback);
    return RL_OK;
}

/* Where an endpoint's field was written: aggregator.<field> for the one
 * of `aggregator:`, aggregators.<i>.<field> for an entry of the list. */
static const char *endpoint_path(char *buf, size_t cap, bool listed,
                                 size_t i, const char *field)
{
    if (listed)
        snprintf(buf, cap, "aggregators.%zu.%s", i, field);
    else
        snprintf(buf, cap, "aggregator.%s", field);
    return buf;
}

static bool is_tls_url(const char *url)
{
    return strncmp(url, "tls+tcp://", 10) == 0;
}

/* The first endpoint URL that is tls+tcp://, as its path into buf, or
 * NULL when none is. */
static const char *tls_url_path(const rl_aggregator_config *agg, bool listed,
                                char *buf, size_t cap)
{
    for (size_t i = 0; i < agg->n_endpoints; i++) {
        const rl_aggregator_endpoint *e = &agg->endpoints[i];
        if (is_tls_url(e->reports) || is_tls_url(e->totals))
            return endpoint_path(buf, cap, listed, i, is_tls_url(e->reports)
                                                          ? "reports"
                                                          : "totals");
    }
    return NULL;
}

static int load_tls(struct loader *ld, const rl_raw_tls *raw,
                    rl_aggregator_config *agg, bool listed)
{
    static const char *const auth_names[] = {"none", "required", NULL};
    rl_tls_config *t = &agg->tls;
    char path[64];
    const char *tls_url = tls_url_path(agg, listed, path, sizeof path);
    if (raw == NULL) {
        if (tls_url != NULL)
            return bad(ld, tls_url, "a tls+tcp:// URL needs aggregator.tls "
                       "with at least ca, cert and key");
        return RL_OK;
    }
    snprintf(t->ca, sizeof t->ca, "%s", raw->ca ? raw->ca : "");
    snprintf(t->cert, sizeof t->cert, "%s", raw->cert ? raw->cert : "");
    snprintf(t->key, sizeof t->key, "%s", raw->key ? raw->key : "");
    snprintf(t->server_name, sizeof t->server_name, "%s",
             raw->server_name ? raw->server_name : "");
    int choice = 0;
    int rc = choose(ld, "aggregator.tls.client_auth", raw->client_auth,
                    auth_names, &choice);
    if (rc != RL_OK)
        return rc;
    t->require_client_cert = choice == 1;
    if ((t->cert[0] == '\0') != (t->key[0] == '\0'))
        return bad(ld, "aggregator.tls", "cert and key go together: give "
                   "both or neither");
    if (t->ca[0] == '\0' || t->cert[0] == '\0')
        return bad(ld, "aggregator.tls", "give ca (to verify the other "
                   "side), cert and key (the aggregator's own; agents "
                   "present theirs when client_auth is required)");
    return RL_OK;
}

/* aggregator.tls is for the tls+tcp:// URLs among reports, totals and the
 * regions' peers (those loaded after it): each such URL needs it, and set
 * with none of them it would be a TLS deploy that is not one. */
static int check_tls_used(struct loader *ld, const rl_config *cfg)
{
    char path[96];
    bool set = cfg->aggregator.tls.ca[0] != '\0';
    bool used = tls_url_path(&cfg->aggregator, false, path, sizeof path)
                != NULL;
    for (size_t r = 0; r < cfg->regions.n; r++) {
        const rl_region *region = &cfg->regions.regions[r];
        for (size_t k = 0; k < region->n_peers; k++) {
            if (!is_tls_url(region->peers[k]))
                continue;
            if (!set) {
                snprintf(path, sizeof path, "regions.%s.peers",
                         region->name);
                return bad(ld, path, "a tls+tcp:// URL needs "
                           "aggregator.tls with at least ca, cert and key");
            }
            used = true;
        }
    }
    if (set && !used)
        return bad(ld, "aggregator.tls", "set, but none of reports, totals "
                   "and the regions' peers is a tls+tcp:// URL");
    return RL_OK;
}

/* One aggregator's addresses; raw fields not given take the defaults (only
 * `aggregator:`'s can be left out). */
static int load_endpoint(struct loader *ld, const rl_raw_aggregator_at *raw,
                         bool listed, size_t i, rl_aggregator_endpoint *e)
{
    char path[64];
    int rc;
    if ((rc = load_nng_url(ld, endpoint_path(path, sizeof path, listed, i,
                                             "reports"),
                           raw->reports, DEFAULT_REPORTS_URL, e->reports))
            != RL_OK
        || (rc = load_nng_url(ld, endpoint_path(path, sizeof path, listed, i,
                                                "totals"),
                              raw->totals, DEFAULT_TOTALS_URL, e->totals))
               != RL_OK)
        return rc;
    if (strcmp(e->reports, e->totals) == 0)
        return bad(ld, path, "reports and totals need two different URLs, "
                   "both are '%s'", e->reports);
    if (raw->metrics != NULL) {
        if (rl_endpoint_parse(raw->metrics, &e->metrics) != RL_OK)
            return bad(ld, endpoint_path(path, sizeof path, listed, i,
                                         "metrics"),
                       "'%s' is not host:port (an HTTP address such as "
                       "127.0.0.1:9464)", raw->metrics);
        e->has_metrics = true;
    }
    return RL_OK;
}

/* Whether url is one of the first n endpoints' listen URLs. */
static bool url_taken(const rl_aggregator_config *agg, size_t n,
                      const char *url)
{
    for (size_t k = 0; k < n; k++) {
        if (strcmp(agg->endpoints[k].reports, url) == 0
            || strcmp(agg->endpoints[k].totals, url) == 0)
            return true;
    }
    return false;
}

/* The aggregators' addresses: the list `aggregators:`, or the one
 * aggregator of `aggregator:` (a list of one), never both. */
static int load_endpoints(struct loader *ld, const rl_raw_config *raw,
                          rl_aggregator_config *agg, bool *listed)
{
    static const rl_raw_aggregator none = {0};
    const rl_raw_aggregator *one = raw->aggregator ? raw->aggregator : &none;
    *listed = raw->aggregators_count > 0;
    agg->given = *listed || raw->aggregator != NULL;
    if (!*listed) {
        rl_raw_aggregator_at at = {one->reports, one->totals, one->metrics};
        agg->n_endpoints = 1;
        return load_endpoint(ld, &at, false, 0, &agg->endpoints[0]);
    }
    if (one->reports != NULL || one->totals != NULL || one->metrics != NULL)
        return bad(ld, "aggregators", "aggregators are given twice: in "
                   "aggregator (reports, totals, metrics) and in "
                   "aggregators; list every aggregator under aggregators "
                   "and keep only the shared settings (sync_interval_ms, "
                   "tls, max_*) in aggregator");
    if (raw->aggregators_count > RL_AGGREGATORS_MAX)
        return bad(ld, "aggregators", "%u aggregators, at most %d are "
                   "supported", raw->aggregators_count, RL_AGGREGATORS_MAX);
    char path[64];
    for (size_t i = 0; i < raw->aggregators_count; i++) {
        rl_aggregator_endpoint *e = &agg->endpoints[i];
        int rc = load_endpoint(ld, &raw->aggregators[i], true, i, e);
        if (rc != RL_OK)
            return rc;
        if (url_taken(agg, i, e->reports) || url_taken(agg, i, e->totals))
            return bad(ld, endpoint_path(path, sizeof path, true, i,
                                         "reports"),
                       "aggregators.%zu listens where an aggregator before "
                       "it does: each needs its own reports and totals URLs",
                       i);
        agg->n_endpoints = i + 1;
    }
    return RL_OK;
}

static int load_aggregator(struct loader *ld, const rl_raw_config *top,
                           rl_aggregator_config *agg)
{
    static const rl_raw_aggregator none = {0};
    const rl_raw_aggregator *raw = top->aggregator;
    bool listed;
    int rc;
    if (raw == NULL)
        raw = &none;
    if ((rc = load_endpoints(ld, top, agg, &listed)) != RL_OK)
        return rc;
    agg->sync_interval_ms = DEFAULT_SYNC_INTERVAL_MS;
    uint64_t n;
    if (raw->sync_interval_ms != NULL) {
        if ((rc = parse_int(ld, "aggregator.sync_interval_ms",
                            raw->sync_interval_ms, 10, 60000, &n)) != RL_OK)
            return rc;
        agg->sync_interval_ms = (uint32_t)n;
    }
    /* Three intervals: one late TOTALS message is not an outage, and a
     * link is taken down within two. */
    agg->stale_after_ms = 3 * agg->sync_interval_ms;
    if (raw->stale_after_ms != NULL) {
        if ((rc = parse_int(ld, "aggregator.stale_after_ms",
                            raw->stale_after_ms, 1, 3600000, &n)) != RL_OK)
            return rc;
        if (n < 2ULL * agg->sync_interval_ms)
            return bad(ld, "aggregator.stale_after_ms", "%llu is less than "
                       "twice sync_interval_ms (%u): totals come once an "
                       "interval, so keys would go degraded whenever one "
                       "came late", (unsigned long long)n,
                       2 * agg->sync_interval_ms);
        agg->stale_after_ms = (uint32_t)n;
    }
    agg->max_keys = DEFAULT_MAX_KEYS;
    if (raw->max_keys != NULL) {
        if ((rc = parse_int(ld, "aggregator.max_keys", raw->max_keys, 1,
                            1000000, &n)) != RL_OK)
            return rc;
        agg->max_keys = (uint32_t)n;
    }
    agg->max_message_bytes = RL_WIRE_MESSAGE_MAX;
    if (raw->max_message_bytes != NULL) {
        if ((rc = parse_int(ld, "aggregator.max_message_bytes",
                            raw->max_message_bytes, 65536,
                            RL_WIRE_MESSAGE_MAX, &n)) != RL_OK)
            return rc;
        agg->max_message_bytes = (uint32_t)n;
    }
    agg->max_entries = RL_WIRE_ENTRIES_MAX;
    if (raw->max_entries != NULL) {
        if ((rc = parse_int(ld, "aggregator.max_entries", raw->max_entries, 1,
                            RL_WIRE_ENTRIES_MAX, &n)) != RL_OK)
            return rc;
        agg->max_entries = (uint32_t)n;
    }
    agg->max_agents = DEFAULT_MAX_AGENTS;
    if (raw->max_agents != NULL) {
        if ((rc = parse_int(ld, "aggregator.max_agents", raw->max_agents, 1,
                            1000000, &n)) != RL_OK)
            return rc;
        agg->max_agents = (uint32_t)n;
    }
    /* The aggregator's own Redis, or the shared one: apart, a flood of
     * synced keys never holds up an exact check. */
    if (raw->store != NULL) {
        agg->has_store = true;
        if ((rc = load_store(ld, "aggregator.store", raw->store,
                             &agg->store)) != RL_OK)
            return rc;
    }
    return load_tls(ld, raw->tls, agg, listed);
}

static int load_local(struct loader *ld, const rl_raw_local *raw,
                      rl_config *cfg)
{
    cfg->local_max_keys = DEFAULT_MAX_KEYS;
    if (raw == NULL || raw->max_keys == NULL)
        return RL_OK;
    uint64_t n;
    int rc = parse_int(ld, "local.max_keys", raw->max_keys, 1, 10000000, &n);
    if (rc == RL_OK)
        cfg->local_max_keys = (uint32_t)n;
    return rc;
}

/* Longest prefix first, so that the first route whose prefix a path
 * starts with is the longest. Among prefixes of one length at most one can
 * start a given path (duplicates are refused): their order is the text's,
 * only so that it does not depend on qsort. */
static int route_longer(const void *a, const void *b)
{
    const rl_route *x = a, *y = b;
    size_t lx = strlen(x->prefix), ly = strlen(y->prefix);
    if (lx != ly)
        return lx > ly ? -1 : 1;
    return strcmp(x->prefix, y->prefix);
}

static int load_routes(struct loader *ld, const rl_raw_gateway *raw,
                       rl_gateway_config *gw)
{
    char path[64];
    gw->routes = calloc(raw->routes_count, sizeof *gw->routes);
    if (gw->routes == NULL && raw->routes_count > 0)
        return out_of_memory(ld);
    for (size_t i = 0; i < raw->routes_count; i++) {
        const rl_raw_route *r = &raw->routes[i];
        snprintf(path, sizeof path, "gateway.routes.%zu.prefix", i);
        if (r->prefix[0] != '/' || !is_printable_word(r->prefix))
            return bad(ld, path, "'%s' is not a path prefix: it starts with "
                       "'/' and holds no spaces", r->prefix);
        for (size_t j = 0; j < i; j++) {
            if (strcmp(raw->routes[j].prefix, r->prefix) == 0)
                return bad(ld, path, "prefix '%s' is given twice: "
                           "gateway.routes[%zu] has it already", r->prefix, j);
        }
        snprintf(path, sizeof path, "gateway.routes.%zu.route", i);
        if (!is_printable_word(r->route))
            return bad(ld, path, "'%s' is not a valid route name (no spaces "
                       "or control characters, not empty)", r->route);
        gw->routes[i].prefix = strdup(r->prefix);
        gw->routes[i].name = strdup(r->route);
        gw->n_routes = i + 1;
        if (gw->routes[i].prefix == NULL || gw->routes[i].name == NULL)
            return out_of_memory(ld);
    }
    qsort(gw->routes, gw->n_routes, sizeof *gw->routes, route_longer);
    return RL_OK;
}

/* gateway.cost_header and gateway.cost_estimate: an estimate of 0 is a
 * check of room, the actual cost charged at the end. */
static int load_cost(struct loader *ld, const rl_raw_gateway *raw,
                     rl_gateway_config *gw)
{
    if (raw->cost_header != NULL) {
        /* RFC 9110's token: the characters a header name may hold. */
        if (!is_plain_name(raw->cost_header, "!#$%&'*+-.^_`|~"))
            return bad(ld, "gateway.cost_header", "'%s' is not a header "
                       "name (letters, digits and !#$%%&'*+-.^_`|~, not "
                       "empty)", raw->cost_header);
        snprintf(gw->cost_header, sizeof gw->cost_header, "%s",
                 raw->cost_header);
    }
    if (raw->cost_estimate == NULL)
        return RL_OK;
    if (raw->cost_header == NULL)
        return bad(ld, "gateway.cost_estimate", "is what a request holds "
                   "until gateway.cost_header's value is known: set "
                   "cost_header too, or leave cost_estimate out (each "
                   "request costs 1)");
    uint64_t n;
    int rc = parse_int(ld, "gateway.cost_estimate", raw->cost_estimate, 0,
                       UINT32_MAX, &n);
    if (rc == RL_OK)
        gw->cost_estimate = (uint32_t)n;
    return rc;
}

static int load_gateway(struct loader *ld, const rl_raw_gateway *raw,
                        rl_gateway_config *gw)
{
    gw->cost_estimate = 1;
    if (raw == NULL)
        return RL_OK;
    int rc;
    if (raw->routes != NULL && (rc = load_routes(ld, raw, gw)) != RL_OK)
        return rc;
    if ((rc = load_cost(ld, raw, gw)) != RL_OK)
        return rc;
    if (raw->tenant_map == NULL)
        return RL_OK;
    if (raw->tenant_map[0] == '\0')
        return bad(ld, "gateway.tenant_map", "the path is empty; leave the "
                   "field out for no map");
    snprintf(gw->tenant_map, sizeof gw->tenant_map, "%s", raw->tenant_map);
    return RL_OK;
}

/* Attributes the host supplies that no rule matches but a `when` may
 * name (headers the gateway passes on). */
static int load_attributes(struct loader *ld, const rl_raw_config *raw,
                           rl_config *cfg)
{
    char path[64];
    for (size_t i = 0; i < raw->attributes_count; i++) {
        snprintf(path, sizeof path, "attributes.%zu", i);
        if (!is_plain_name(raw->attributes[i], "_.-"))
            return bad(ld, path, "'%s' is not a valid attribute name (use "
                       "letters, digits and _ . -)", raw->attributes[i]);
        cfg->attributes_extra[i] = strdup(raw->attributes[i]);
        if (cfg->attributes_extra[i] == NULL)
            return out_of_memory(ld);
        cfg->n_attributes_extra = i + 1;
    }
    return RL_OK;
}

static int load_config(struct loader *ld, const rl_raw_config *raw,
                       rl_config *cfg)
{
    int rc, choice = RL_CHARGE_ALL;
    if ((rc = load_store(ld, "store", raw->store, &cfg->store)) != RL_OK
        || (rc = load_aggregator(ld, raw, &cfg->aggregator))
               != RL_OK
        || (rc = rl_config_load_regions(ld, raw, cfg)) != RL_OK
        || (rc = check_tls_used(ld, cfg)) != RL_OK
        || (rc = load_local(ld, raw->local, cfg)) != RL_OK
        || (rc = load_gateway(ld, raw->gateway, &cfg->gateway)) != RL_OK
        || (rc = choose(ld, "charge", raw->charge, charge_names, &choice))
               != RL_OK)
        return rc;
    cfg->charge = (rl_charge)choice;
    if ((rc = rl_config_parse_bool(ld, "shadow", raw->shadow, &cfg->shadow))
            != RL_OK
        || (rc = load_attributes(ld, raw, cfg)) != RL_OK)
        return rc;
    if (raw->fleet_size != NULL) {
        uint64_t n;
        if ((rc = parse_int(ld, "fleet_size", raw->fleet_size, 1,
                            RL_FLEET_MAX, &n)) != RL_OK)
            return rc;
        cfg->fleet_size = (uint32_t)n;
    }
    cfg->in_flight_lease_ms = RL_IN_FLIGHT_LEASE_MS;
    if (raw->in_flight_lease_ms != NULL) {
        uint64_t n;
        if ((rc = parse_int(ld, "in_flight_lease_ms", raw->in_flight_lease_ms,
                            RL_IN_FLIGHT_LEASE_MIN, RL_IN_FLIGHT_LEASE_MAX,
                            &n)) != RL_OK)
            return rc;
        cfg->in_flight_lease_ms = (uint32_t)n;
    }
    choice = RL_LOG_INFO;
    if ((rc = choose(ld, "log_level", raw->log_level, log_level_names,
                     &choice)) != RL_OK)
        return rc;
    cfg->log_level = (rl_log_level)choice;
    cfg->max_value_bytes = RL_VALUE_MAX;
    if (raw->max_value_bytes != NULL) {
        uint64_t n;
        if ((rc = parse_int(ld, "max_value_bytes", raw->max_value_bytes, 1,
                            RL_VALUE_MAX, &n)) != RL_OK)
            return rc;
        cfg->max_value_bytes = (uint32_t)n;
    }
    cfg->hold_timeout_ms = RL_HOLD_TIMEOUT_DEFAULT_MS;
    if (raw->hold_timeout_ms != NULL) {
        uint64_t n;
        if ((rc = parse_int(ld, "hold_timeout_ms", raw->hold_timeout_ms,
                            RL_HOLD_TIMEOUT_MIN_MS, RL_HOLD_TIMEOUT_MAX_MS,
                            &n)) != RL_OK)
            return rc;
        cfg->hold_timeout_ms = (uint32_t)n;
    }
    return load_rules(ld, raw, cfg);
}

/* Parses a config whose relative file names (overrides_file) are
 * relative to dir ("" for the working directory). */
static int parse_in(const char *yaml, size_t len, const char *name,
                    const char *dir, rl_config **out, rl_error *err)
{
    if (out == NULL)
        return rl_error_set(err, RL_EINVAL, "rl_config_parse: out is NULL");
    *out = NULL;
    if (yaml == NULL || name == NULL)
        return rl_error_set(err, RL_EINVAL, "rl_config_parse: yaml and name "
                            "must not be NULL");
    rl_raw_config *raw = NULL;
    int rc = rl_config_yaml_load(yaml, len, name, &raw, err);
    if (rc != RL_OK)
        return rc;
    if (raw == NULL)
        return rl_error_set(err, RL_ECONFIG, "%s: the config is empty: it "
                            "needs at least a rules list", name);
    unsigned line, column;
    if (rl_yaml_find_nul(yaml, len, &line, &column)) {
        rl_config_yaml_free(raw);
        return rl_error_set(err, RL_ECONFIG, "%s:%u:%u: this value holds a "
                            "NUL byte, which no rl field can carry", name,
                            line, column);
    }
    struct loader ld = {.yaml = yaml, .len = len, .name = name, .dir = dir,
                        .err = err};
    /* libcyaml read it, so libyaml does too: the document is for match,
     * when and the overrides' when, and for the lines of messages. */
    ld.have_doc = rl_yaml_doc_load(yaml, len, &ld.doc);
    rl_config *cfg = NULL;
    if (!ld.have_doc) {
        rc = rl_error_set(err, RL_ENOMEM, "%s: out of memory while parsing",
                          name);
        goto fail;
    }
    cfg = calloc(1, sizeof *cfg);
    if (cfg == NULL) {
        rc = rl_error_set(err, RL_ENOMEM, "%s: out of memory", name);
        goto fail;
    }
    snprintf(cfg->dir, sizeof cfg->dir, "%s", dir);
    if ((rc = load_config(&ld, raw, cfg)) != RL_OK)
        goto fail;
    rl_config_yaml_free(raw);
    if (ld.have_doc)
        yaml_document_delete(&ld.doc);
    rl_error_clear(err);
    *out = cfg;
    return RL_OK;
fail:
    rl_config_yaml_free(raw);
    if (ld.have_doc)
        yaml_document_delete(&ld.doc);
    rl_config_free(cfg);
    return rc;
}

int rl_config_parse(const char *yaml, size_t len, const char *name,
                    rl_config **out, rl_error *err)
{
    return parse_in(yaml, len, name, "", out, err);
}

/* Reads a whole file of at most RL_CONFIG_FILE_MAX bytes. */
static int read_file(const char *path, char **text, size_t *len,
                     rl_error *err)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return rl_error_set(err, RL_EIO, "%s: cannot open config: %s", path,
                            strerror(errno));
    struct stat st;
    int rc = RL_OK;
    char *buf = NULL;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        rc = rl_error_set(err, RL_EIO, "%s: not a regular file", path);
        goto done;
    }
    if (st.st_size > (off_t)RL_CONFIG_FILE_MAX) {
        rc = rl_error_set(err, RL_EIO, "%s: config is %lld bytes, over the "
                          "%u-byte limit", path, (long long)st.st_size,
                          RL_CONFIG_FILE_MAX);
        goto done;
    }
    /* One byte more than the size, to notice a file that grew. */
    size_t cap = (size_t)st.st_size + 1, n = 0;
    if ((buf = malloc(cap)) == NULL) {
        rc = rl_error_set(err, RL_ENOMEM, "%s: out of memory", path);
        goto done;
    }
    for (ssize_t got; n < cap; n += (size_t)got) {
        got = read(fd, buf + n, cap - n);
        if (got == 0)
            break;
        if (got < 0 && errno == EINTR) {
            got = 0;
            continue;
        }
        if (got < 0) {
            rc = rl_error_set(err, RL_EIO, "%s: cannot read config: %s", path,
                              strerror(errno));
            goto done;
        }
    }
    if (n == cap) {
        rc = rl_error_set(err, RL_EIO, "%s: changed while being read", path);
        goto done;
    }
    *text = buf;
    *len = n;
    buf = NULL;
done:
    free(buf);
    close(fd);
    return rc;
}

int rl_config_load(const char *path, rl_config **out, rl_error *err)
{
    if (out == NULL || path == NULL) {
        if (out != NULL)
            *out = NULL;
        return rl_error_set(err, RL_EINVAL, "rl_config_load: path and out "
                            "must not be NULL");
    }
    *out = NULL;
    char *text = NULL;
    size_t len = 0;
    int rc = read_file(path, &text, &len, err);
    if (rc != RL_OK)
        return rc;
    /* Files the config names are relative to its directory. */
    char dir[RL_PATH_MAX + 1] = "";
    const char *slash = strrchr(path, '/');
    if (slash != NULL)
        snprintf(dir, sizeof dir, "%.*s", (int)(slash == path ? 1
                                                 : slash - path), path);
    rc = parse_in(text, len, path, dir, out, err);
    free(text);
    return rc;
}

/* Frees a secret without leaving it in freed memory. */
static void free_secret(char *secret)
{
    if (secret == NULL)
        return;
    explicit_bzero(secret, strlen(secret));
    free(secret);
}

static void store_fini(rl_store_config *store)
{
    free(store->sentinel.master);
    free(store->sentinel.addresses);
    free(store->sentinel.username);
    free_secret(store->sentinel.password);
    free(store->nodes);
    free(store->username);
    free_secret(store->password);
}

void rl_config_free(rl_config *cfg)
{
    if (cfg == NULL)
        return;
    for (size_t i = 0; i < cfg->n_rules; i++)
        rl_config_rule_fini(&cfg->rules[i]);
    free(cfg->rules);
    for (size_t i = 0; i < cfg->n_attributes_extra; i++)
        free(cfg->attributes_extra[i]);
    for (size_t i = 0; i < cfg->gateway.n_routes; i++) {
        free(cfg->gateway.routes[i].prefix);
        free(cfg->gateway.routes[i].name);
    }
    free(cfg->gateway.routes);
    store_fini(&cfg->store);
    store_fini(&cfg->aggregator.store);
    free(cfg);
}

const rl_store_config *rl_config_aggregator_store(const rl_config *cfg)
{
    return cfg->aggregator.has_store ? &cfg->aggregator.store : &cfg->store;
}
