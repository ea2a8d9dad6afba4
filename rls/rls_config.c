/*
 * rls_config.c: envoyproxy/ratelimit's YAML, read in upstream's three
 * passes, so that a file with several faults is refused for the one
 * upstream names: every key against the list of known keys (anywhere in
 * the file but under metadata), then every value against its type, then
 * the descriptors' own rules (empty keys, duplicates, units, replaces,
 * share_threshold) as the tree is built. Messages are upstream's, after
 * the file's runtime key. Where upstream's order among faults of one pass
 * follows Go's map iteration (random), this one follows the file.
 */
#include "rls_config.h"

#include <dirent.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <yaml.h>

/* A file larger than this is refused: a config, not a data set. */
#define FILE_MAX (64u << 20)

/* --- Units ------------------------------------------------------------- */

static const char *const unit_names[] = {
    "UNKNOWN", "SECOND", "MINUTE", "HOUR", "DAY", "MONTH", "YEAR", "WEEK",
};

static const uint64_t unit_seconds[] = {
    0, 1, 60, 3600, 86400, 30 * 86400ULL, 365 * 86400ULL, 7 * 86400ULL,
};

uint64_t rls_unit_seconds(rls_unit unit)
{
    return (unsigned)unit < 8 ? unit_seconds[unit] : 0;
}

const char *rls_unit_name(rls_unit unit)
{
    return (unsigned)unit < 8 ? unit_names[unit] : "UNKNOWN";
}

/* Upstream matches the name case-insensitively against the enum. */
static rls_unit unit_of(const char *name)
{
    for (int u = 0; u < 8; u++) {
        if (strcasecmp(name, unit_names[u]) == 0)
            return (rls_unit)u;
    }
    return RLS_UNIT_UNKNOWN;
}

/* --- Errors ------------------------------------------------------------ */

typedef struct loading {
    const char *name;   /* the file's runtime key */
    yaml_document_t doc;
    char *err;
    size_t cap;
    bool failed;
    bool synced;        /* mode: synced can be served */
} loading;

__attribute__((format(printf, 2, 3)))
static void fail(loading *ld, const char *fmt, ...)
{
    if (ld->failed)
        return; /* the first fault is the one named */
    ld->failed = true;
    int n = snprintf(ld->err, ld->cap, "%s: ", ld->name);
    if (n < 0 || (size_t)n >= ld->cap)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ld->err + n, ld->cap - (size_t)n, fmt, ap);
    va_end(ap);
}

/* --- YAML scalars as upstream's decoder types them ---------------------- */

static yaml_node_t *node(loading *ld, int id)
{
    return yaml_document_get_node(&ld->doc, id);
}

static const char *text(const yaml_node_t *n)
{
    return (const char *)n->data.scalar.value;
}

static bool plain(const yaml_node_t *n)
{
    return n->type == YAML_SCALAR_NODE
           && n->data.scalar.style == YAML_PLAIN_SCALAR_STYLE
           && n->tag != NULL
           && strcmp((const char *)n->tag, YAML_STR_TAG) == 0;
}

static bool one_of(const char *s, const char *const *words)
{
    for (; *words != NULL; words++) {
        if (strcmp(s, *words) == 0)
            return true;
    }
    return false;
}

static bool is_null(const yaml_node_t *n)
{
    static const char *const words[] = {"", "~", "null", "Null", "NULL",
                                        NULL};
    return plain(n) && one_of(text(n), words);
}

/* YAML 1.1's booleans, which go-yaml v2 (upstream's decoder) takes. */
static int bool_of(const yaml_node_t *n)
{
    static const char *const yes[] = {"y", "Y", "yes", "Yes", "YES", "true",
                                      "True", "TRUE", "on", "On", "ON",
                                      NULL};
    static const char *const no[] = {"n", "N", "no", "No", "NO", "false",
                                     "False", "FALSE", "off", "Off", "OFF",
                                     NULL};
    if (!plain(n))
        return -1;
    if (one_of(text(n), yes))
        return 1;
    if (one_of(text(n), no))
        return 0;
    return -1;
}

/* A plain decimal integer (an optional sign, digits, '_' between). */
static bool is_int(const char *s)
{
    if (*s == '+' || *s == '-')
        s++;
    if (*s < '0' || *s > '9')
        return false;
    for (; *s != '\0'; s++) {
        if ((*s < '0' || *s > '9') && *s != '_')
            return false;
    }
    return true;
}

static bool is_float(const char *s)
{
    static const char *const special[] = {".inf", ".Inf", ".INF", "+.inf",
                                          "-.inf", ".nan", ".NaN", ".NAN",
                                          NULL};
    if (one_of(s, special))
        return true;
    char *end;
    errno = 0;
    strtod(s, &end);
    return *s != '\0' && *end == '\0' && strpbrk(s, ".eE") != NULL
           && strpbrk(s, "xX") == NULL;
}

/* The tag go-yaml gives a scalar: what its errors call it. */
static const char *scalar_tag(const yaml_node_t *n)
{
    if (!plain(n))
        return "!!str";
    if (is_null(n))
        return "!!null";
    if (bool_of(n) >= 0)
        return "!!bool";
    if (is_int(text(n)))
        return "!!int";
    if (is_float(text(n)))
        return "!!float";
    return "!!str";
}

static const char *kind_tag(const yaml_node_t *n)
{
    switch (n->type) {
    case YAML_SEQUENCE_NODE:
        return "!!seq";
    case YAML_MAPPING_NODE:
        return "!!map";
    default:
        return scalar_tag(n);
    }
}

static void type_fault(loading *ld, const yaml_node_t *n, const char *into)
{
    if (n->type == YAML_SCALAR_NODE)
        fail(ld, "error loading config file: yaml: unmarshal errors:\n"
             "  line %zu: cannot unmarshal %s `%s` into %s",
             n->start_mark.line + 1, scalar_tag(n), text(n), into);
    else
        fail(ld, "error loading config file: yaml: unmarshal errors:\n"
             "  line %zu: cannot unmarshal %s into %s",
             n->start_mark.line + 1, kind_tag(n), into);
}

/* --- Pass 1: the keys (upstream's validateYamlKeys) --------------------- */

static const char *const known_keys[] = {
    "domain", "key", "value", "descriptors", "rate_limit", "unit",
    "requests_per_unit", "unlimited", "shadow_mode", "quota_mode", "name",
    "replaces", "detailed_metric", "value_to_metric", "share_threshold",
    "metadata",
    /* rl's extension (docs/envoy.md): a file with it is rl-rls's own. */
    "rl", "algorithm", "burst", "mode", "on_error", "hold", "id",
    "estimate", "in_flight", NULL,
};

static void check_keys(loading *ld, yaml_node_t *map);

static void check_value(loading *ld, yaml_node_t *v)
{
    if (v->type == YAML_MAPPING_NODE) {
        check_keys(ld, v);
    } else if (v->type == YAML_SEQUENCE_NODE) {
        for (yaml_node_item_t *i = v->data.sequence.items.start;
             !ld->failed && i < v->data.sequence.items.top; i++) {
            yaml_node_t *e = node(ld, *i);
            if (e->type != YAML_MAPPING_NODE)
                fail(ld, "config error, yaml file contains list of type "
                     "other than map: %s",
                     e->type == YAML_SCALAR_NODE ? text(e) : "[...]");
            else
                check_keys(ld, e);
        }
    } else if (plain(v) && is_float(text(v))) {
        /* a float is no leaf type of upstream's: neither string, int
         * nor bool */
        fail(ld, "error checking config");
    }
}

static void check_keys(loading *ld, yaml_node_t *map)
{
    for (yaml_node_pair_t *p = map->data.mapping.pairs.start;
         !ld->failed && p < map->data.mapping.pairs.top; p++) {
        yaml_node_t *k = node(ld, p->key);
        if (k->type != YAML_SCALAR_NODE || strcmp(scalar_tag(k), "!!str")) {
            fail(ld, "config error, key is not of type string: %s",
                 k->type == YAML_SCALAR_NODE ? text(k) : "[...]");
        } else if (!one_of(text(k), known_keys)) {
            fail(ld, "config error, unknown key '%s'", text(k));
        } else if (strcmp(text(k), "metadata") != 0) {
            check_value(ld, node(ld, p->value));
        }
    }
}

/* --- Pass 2: the types (upstream's yaml.Unmarshal into its structs) ----- */

static yaml_node_t *field(loading *ld, yaml_node_t *map, const char *name)
{
    for (yaml_node_pair_t *p = map->data.mapping.pairs.start;
         p < map->data.mapping.pairs.top; p++) {
        yaml_node_t *k = node(ld, p->key);
        if (k->type == YAML_SCALAR_NODE && strcmp(text(k), name) == 0)
            return node(ld, p->value);
    }
    return NULL;
}

static void want_string(loading *ld, yaml_node_t *n)
{
    if (n != NULL && n->type != YAML_SCALAR_NODE)
        type_fault(ld, n, "string");
}

static void want_bool(loading *ld, yaml_node_t *n)
{
    if (n != NULL && !is_null(n) && bool_of(n) < 0)
        type_fault(ld, n, "bool");
}

static bool uint32_of(const yaml_node_t *n, uint32_t *out)
{
    if (!plain(n) || !is_int(text(n)) || text(n)[0] == '-')
        return false;
    unsigned long long v = 0;
    for (const char *s = text(n); *s != '\0'; s++) {
        if (*s >= '0' && *s <= '9')
            v = v * 10 + (unsigned)(*s - '0');
        if (v > UINT32_MAX)
            return false;
    }
    *out = (uint32_t)v;
    return true;
}

static void want_uint32(loading *ld, yaml_node_t *n)
{
    uint32_t unused;
    if (n != NULL && !is_null(n) && !uint32_of(n, &unused))
        type_fault(ld, n, "uint32");
}

static void want_list(loading *ld, yaml_node_t *n, const char *of)
{
    if (n != NULL && !is_null(n) && n->type != YAML_SEQUENCE_NODE)
        type_fault(ld, n, of);
}

static void type_descriptors(loading *ld, yaml_node_t *list);

static void type_rate_limit(loading *ld, yaml_node_t *rl)
{
    if (rl->type != YAML_MAPPING_NODE) {
        if (!is_null(rl))
            type_fault(ld, rl, "config.YamlRateLimit");
        return;
    }
    want_uint32(ld, field(ld, rl, "requests_per_unit"));
    want_string(ld, field(ld, rl, "unit"));
    want_bool(ld, field(ld, rl, "unlimited"));
    want_string(ld, field(ld, rl, "name"));
    yaml_node_t *rep = field(ld, rl, "replaces");
    want_list(ld, rep, "[]config.yamlReplaces");
    if (rep != NULL && rep->type == YAML_SEQUENCE_NODE) {
        for (yaml_node_item_t *i = rep->data.sequence.items.start;
             i < rep->data.sequence.items.top; i++)
            want_string(ld, field(ld, node(ld, *i), "name"));
    }
}

static void type_hold(loading *ld, yaml_node_t *hold)
{
    if (hold == NULL || is_null(hold))
        return;
    if (hold->type != YAML_MAPPING_NODE) {
        type_fault(ld, hold, "rl's hold (a map: id, estimate)");
        return;
    }
    want_string(ld, field(ld, hold, "id"));
    want_uint32(ld, field(ld, hold, "estimate"));
}

static void type_descriptor(loading *ld, yaml_node_t *d)
{
    want_string(ld, field(ld, d, "key"));
    want_string(ld, field(ld, d, "value"));
    static const char *const flags[] = {"shadow_mode", "quota_mode",
                                        "detailed_metric", "value_to_metric",
                                        "share_threshold", NULL};
    for (const char *const *f = flags; *f != NULL; f++)
        want_bool(ld, field(ld, d, *f));
    yaml_node_t *rl = field(ld, d, "rate_limit");
    if (rl != NULL)
        type_rate_limit(ld, rl);
    yaml_node_t *ext = field(ld, d, "rl");
    if (ext != NULL && ext->type != YAML_MAPPING_NODE && !is_null(ext))
        type_fault(ld, ext, "rl's descriptor extension (a map)");
    if (ext != NULL && ext->type == YAML_MAPPING_NODE) {
        want_string(ld, field(ld, ext, "algorithm"));
        want_string(ld, field(ld, ext, "mode"));
        want_string(ld, field(ld, ext, "on_error"));
        want_uint32(ld, field(ld, ext, "burst"));
        want_uint32(ld, field(ld, ext, "in_flight"));
        type_hold(ld, field(ld, ext, "hold"));
    }
    type_descriptors(ld, field(ld, d, "descriptors"));
}

static void type_descriptors(loading *ld, yaml_node_t *list)
{
    want_list(ld, list, "[]config.YamlDescriptor");
    if (list == NULL || list->type != YAML_SEQUENCE_NODE)
        return;
    for (yaml_node_item_t *i = list->data.sequence.items.start;
         !ld->failed && i < list->data.sequence.items.top; i++)
        type_descriptor(ld, node(ld, *i));
}

/* --- Pass 3: the tree --------------------------------------------------- */

/* A scalar's text, "" for an absent or null one. */
static const char *string_of(yaml_node_t *n)
{
    return n == NULL || is_null(n) ? "" : text(n);
}

static bool flag(loading *ld, yaml_node_t *map, const char *name)
{
    yaml_node_t *n = field(ld, map, name);
    return n != NULL && bool_of(n) == 1;
}

static char *join(const char *a, const char *sep, const char *b)
{
    size_t la = strlen(a), ls = strlen(sep), lb = strlen(b);
    char *s = malloc(la + ls + lb + 1);
    if (s != NULL) {
        memcpy(s, a, la);
        memcpy(s + la, sep, ls);
        memcpy(s + la + ls, b, lb + 1);
    }
    return s;
}

static void free_limit(rls_limit *l)
{
    if (l == NULL)
        return;
    free(l->name);
    for (size_t i = 0; i < l->n_replaces; i++)
        free(l->replaces[i]);
    free(l->replaces);
    free(l->full_key);
    free(l->hold_id);
    free(l);
}

static void free_level(rls_level *lv);

static void free_descriptor(rls_descriptor *d)
{
    if (d == NULL)
        return;
    free(d->key_value);
    free_limit(d->limit);
    free_level(&d->children);
    free(d);
}

static void free_level(rls_level *lv)
{
    for (size_t i = 0; i < lv->n; i++)
        free_descriptor(lv->in_order[i]);
    free(lv->in_order);
    free(lv->sorted);
    free(lv->wildcards);
    memset(lv, 0, sizeof *lv);
}

/* The composite keys of one level while it loads: upstream refuses a
 * second descriptor with the same one (a level may hold many thousand). */
typedef struct seen_keys {
    const char **slots;
    size_t cap;            /* a power of two, at least twice the keys */
} seen_keys;

static uint64_t hash_of(const char *s)
{
    uint64_t h = 1469598103934665603ULL; /* FNV-1a */
    for (; *s != '\0'; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ULL;
    return h;
}

/* false when kv was there already. */
static bool seen_add(seen_keys *k, const char *kv)
{
    size_t i = (size_t)hash_of(kv) & (k->cap - 1);
    for (; k->slots[i] != NULL; i = (i + 1) & (k->cap - 1)) {
        if (strcmp(k->slots[i], kv) == 0)
            return false;
    }
    k->slots[i] = kv;
    return true;
}

static bool seen_init(seen_keys *k, const rls_level *lv, size_t more)
{
    k->cap = 16;
    while (k->cap < 2 * (lv->n + more))
        k->cap *= 2;
    k->slots = calloc(k->cap, sizeof *k->slots);
    for (size_t i = 0; k->slots != NULL && i < lv->n; i++)
        seen_add(k, lv->in_order[i]->key_value);
    return k->slots != NULL;
}

static bool push(rls_descriptor ***list, size_t n, rls_descriptor *d)
{
    rls_descriptor **grown = realloc(*list, (n + 1) * sizeof *grown);
    if (grown == NULL)
        return false;
    grown[n] = d;
    *list = grown;
    return true;
}

/* What each mode can count, for rl_extension: synced needs an aggregator
 * and has neither algorithm nor burst; leased is a token bucket. */
static void rl_mode_checks(loading *ld, rls_limit *l, const char *algorithm,
                           const char *on_error, bool burst)
{
    if (l->synced && !ld->synced)
        fail(ld, "rl: mode: synced counts through rl-aggregator, and "
             "rl-rls has none: give rl-rls --config a file with an "
             "aggregator: (or aggregators:) section, and start "
             "rl-aggregator on what rl-rls --config FILE --print-rl-config "
             "prints (docs/envoy.md, Synced descriptors)");
    else if (l->synced && algorithm[0] != '\0')
        fail(ld, "rl: mode: synced counts the limit over any span of the "
             "unit (rl-aggregator's sliding windows), neither a fixed "
             "window nor a token bucket: leave algorithm out");
    else if (l->synced && burst)
        fail(ld, "rl: mode: synced has no burst (it admits "
             "requests_per_unit over any span of the unit): leave burst "
             "out");
    else if (l->leased && strcmp(algorithm, "fixed_window") == 0)
        fail(ld, "rl: mode: leased spends a token bucket's tokens in "
             "leases, and a fixed window's count cannot be leased: leave "
             "algorithm out (or token_bucket)");
    else if (l->local && on_error[0] != '\0')
        fail(ld, "rl: on_error has no effect with mode: local (each "
             "instance counts alone, with no store to wait for)");
    else if (l->synced && on_error[0] != '\0' && !l->deny_on_error
             && !l->allow_on_error && strcmp(on_error, "local") != 0)
        fail(ld, "rl: unknown on_error '%s' (local, allow or deny)",
             on_error);
    else if (!l->synced && on_error[0] != '\0' && !l->deny_on_error
             && !l->allow_on_error)
        fail(ld, "rl: unknown on_error '%s' (allow or deny)", on_error);
}

/* rl: {hold: {id, estimate}}: in every mode, librl settles the hold's
 * end as the mode counts (docs/design.md, holds). */
static void rl_hold(loading *ld, yaml_node_t *hold, rls_limit *l)
{
    if (hold == NULL || hold->type != YAML_MAPPING_NODE)
        return;
    const char *id = string_of(field(ld, hold, "id"));
    yaml_node_t *estimate = field(ld, hold, "estimate");
    if (estimate != NULL && !is_null(estimate))
        uint32_of(estimate, &l->hold_estimate);
    if (id[0] == '\0')
        fail(ld, "rl: hold needs the id's key: the descriptor entry that "
             "names the request (hold: {id: request_id}, with Envoy's "
             "request_headers action on x-request-id)");
    else if ((l->hold_id = strdup(id)) == NULL)
        fail(ld, "out of memory");
}

/* rl's extension of a descriptor: how its limit is counted. Only what
 * rl-rls does is accepted; every refusal says what would be. */
static void rl_extension(loading *ld, yaml_node_t *ext, rls_limit *l)
{
    if (ext == NULL || ext->type != YAML_MAPPING_NODE)
        return;
    const char *algorithm = string_of(field(ld, ext, "algorithm"));
    const char *mode = string_of(field(ld, ext, "mode"));
    const char *on_error = string_of(field(ld, ext, "on_error"));
    yaml_node_t *burst = field(ld, ext, "burst");
    l->deny_on_error = strcmp(on_error, "deny") == 0;
    l->allow_on_error = strcmp(on_error, "allow") == 0;
    l->local = strcmp(mode, "local") == 0;
    l->synced = strcmp(mode, "synced") == 0;
    l->leased = strcmp(mode, "leased") == 0;
    /* A leased limit is a token bucket's, whatever algorithm says. */
    l->token_bucket = strcmp(algorithm, "token_bucket") == 0 || l->leased;
    bool has_burst = burst != NULL && !is_null(burst);
    if (has_burst)
        uint32_of(burst, &l->burst);
    if (algorithm[0] != '\0' && strcmp(algorithm, "token_bucket") != 0
        && strcmp(algorithm, "fixed_window") != 0)
        fail(ld, "rl: unknown algorithm '%s' (fixed_window or "
             "token_bucket)", algorithm);
    else if (mode[0] != '\0' && !l->local && !l->synced && !l->leased
             && strcmp(mode, "exact") != 0)
        fail(ld, "rl: unknown mode '%s' (exact, local, synced or leased)",
             mode);
    rl_mode_checks(ld, l, algorithm, on_error, has_burst);
    if (l->burst != 0 && !l->token_bucket)
        fail(ld, "rl: burst is a token bucket's: give algorithm: "
             "token_bucket, or leave burst out");
    else if (l->burst != 0 && l->burst < l->requests_per_unit)
        fail(ld, "rl: burst %u is below requests_per_unit %u", l->burst,
             l->requests_per_unit);
    else if (l->unlimited)
        fail(ld, "rl: an unlimited limit counts nothing: leave rl out");
    else if (field(ld, ext, "in_flight") != NULL)
        fail(ld, "rl: in_flight: N counts requests at once, not a rate: "
             "leave rate_limit out");
    if (!ld->failed)
        rl_hold(ld, field(ld, ext, "hold"), l);
}

/* rl: {in_flight: N, hold: {id}} with no rate_limit: N requests at once,
 * each holding a slot until its stream-done call (its hold's end). */
static rls_limit *in_flight_limit_of(loading *ld, yaml_node_t *d,
                                     yaml_node_t *ext, const char *full_key)
{
    rls_limit *l = calloc(1, sizeof *l);
    if (l == NULL) {
        fail(ld, "out of memory");
        return NULL;
    }
    const char *on_error = string_of(field(ld, ext, "on_error"));
    l->deny_on_error = strcmp(on_error, "deny") == 0;
    l->allow_on_error = strcmp(on_error, "allow") == 0;
    l->shadow_mode = flag(ld, d, "shadow_mode");
    l->unit = RLS_UNIT_SECOND;
    l->name = strdup("");
    l->full_key = strdup(full_key);
    l->replaces = calloc(1, sizeof *l->replaces);
    if (l->name == NULL || l->full_key == NULL || l->replaces == NULL) {
        fail(ld, "out of memory");
        return l;
    }
    yaml_node_t *hold = field(ld, ext, "hold");
    if (!uint32_of(field(ld, ext, "in_flight"), &l->in_flight)
        || l->in_flight == 0)
        fail(ld, "rl: in_flight: N needs N of 1 or more (requests at once)");
    else if (field(ld, ext, "algorithm") != NULL
             || field(ld, ext, "burst") != NULL
             || field(ld, ext, "mode") != NULL)
        fail(ld, "rl: in_flight: N holds slots, with no algorithm, burst "
             "or mode: leave them out");
    else if (on_error[0] != '\0' && !l->deny_on_error && !l->allow_on_error)
        fail(ld, "rl: unknown on_error '%s' (allow or deny)", on_error);
    else if (hold == NULL || hold->type != YAML_MAPPING_NODE)
        fail(ld, "rl: in_flight: N holds a slot from a request's first call "
             "to its stream-done call: give hold: {id: request_id}");
    else if (field(ld, hold, "estimate") != NULL)
        fail(ld, "rl: in_flight: N holds one slot a request: leave "
             "hold.estimate out");
    else
        rl_hold(ld, hold, l);
    l->requests_per_unit = l->in_flight;
    return l;
}

/* The limit of a descriptor's rate_limit, with upstream's checks. */
static rls_limit *limit_of(loading *ld, yaml_node_t *d, yaml_node_t *rl,
                           const char *full_key)
{
    rls_limit *l = calloc(1, sizeof *l);
    if (l == NULL) {
        fail(ld, "out of memory");
        return NULL;
    }
    l->unlimited = flag(ld, rl, "unlimited");
    const char *unit = string_of(field(ld, rl, "unit"));
    rls_unit u = unit_of(unit);
    if (l->unlimited && u != RLS_UNIT_UNKNOWN)
        fail(ld, "should not specify rate limit unit when unlimited");
    else if (!l->unlimited && u == RLS_UNIT_UNKNOWN)
        fail(ld, "invalid rate limit unit '%s'", unit);
    l->unit = u;
    yaml_node_t *rpu = field(ld, rl, "requests_per_unit");
    if (rpu != NULL && !is_null(rpu))
        uint32_of(rpu, &l->requests_per_unit);
    l->shadow_mode = flag(ld, d, "shadow_mode");
    l->quota_mode = flag(ld, d, "quota_mode");
    l->detailed_metric = flag(ld, d, "detailed_metric");
    rl_extension(ld, field(ld, d, "rl"), l);
    l->name = strdup(string_of(field(ld, rl, "name")));
    l->full_key = strdup(full_key);
    if (l->name == NULL || l->full_key == NULL)
        fail(ld, "out of memory");
    yaml_node_t *rep = field(ld, rl, "replaces");
    size_t n = rep != NULL && rep->type == YAML_SEQUENCE_NODE
                   ? (size_t)(rep->data.sequence.items.top
                              - rep->data.sequence.items.start)
                   : 0;
    l->replaces = calloc(n + 1, sizeof *l->replaces);
    if (l->replaces == NULL)
        fail(ld, "out of memory");
    for (size_t i = 0; !ld->failed && i < n; i++) {
        yaml_node_t *e = node(ld, rep->data.sequence.items.start[i]);
        const char *name = string_of(field(ld, e, "name"));
        if (name[0] == '\0')
            fail(ld, "should not have an empty replaces entry");
        else if (strcmp(name, l->name) == 0)
            fail(ld, "replaces should not contain name of same "
                 "descriptor");
        else if ((l->replaces[i] = strdup(name)) == NULL)
            fail(ld, "out of memory");
        else
            l->n_replaces++;
    }
    return l;
}

static void load_descriptors(loading *ld, rls_level *lv, const char *parent,
                             yaml_node_t *list);

static void load_descriptor(loading *ld, rls_level *lv, seen_keys *seen,
                            const char *parent, yaml_node_t *dn)
{
    const char *key = string_of(field(ld, dn, "key"));
    const char *value = string_of(field(ld, dn, "value"));
    if (key[0] == '\0') {
        fail(ld, "descriptor has empty key");
        return;
    }
    rls_descriptor *d = calloc(1, sizeof *d);
    if (d == NULL || (d->key_value = value[0] != '\0'
                                         ? join(key, "_", value)
                                         : strdup(key))
                         == NULL) {
        free(d);
        fail(ld, "out of memory");
        return;
    }
    d->key_len = strlen(key);
    char *full = join(parent, "", d->key_value);
    if (full == NULL) {
        free_descriptor(d);
        fail(ld, "out of memory");
        return;
    }
    if (!seen_add(seen, d->key_value))
        fail(ld, "duplicate descriptor composite key '%s'", full);
    yaml_node_t *rl = field(ld, dn, "rate_limit");
    yaml_node_t *ext = field(ld, dn, "rl");
    if (!ld->failed && rl != NULL && rl->type == YAML_MAPPING_NODE)
        d->limit = limit_of(ld, dn, rl, full);
    else if (!ld->failed && ext != NULL && ext->type == YAML_MAPPING_NODE
             && field(ld, ext, "in_flight") != NULL)
        d->limit = in_flight_limit_of(ld, dn, ext, full);
    d->share_threshold = flag(ld, dn, "share_threshold");
    d->value_to_metric = flag(ld, dn, "value_to_metric");
    bool wild = strchr(d->key_value, '*') != NULL;
    if (!ld->failed && d->share_threshold && !wild)
        fail(ld, "share_threshold can only be used with wildcard values "
             "(containing '*'), but found key '%s'", d->key_value);
    char *next = join(full, ".", "");
    if (next == NULL)
        fail(ld, "out of memory");
    if (!ld->failed)
        load_descriptors(ld, &d->children, next, field(ld, dn, "descriptors"));
    free(next);
    free(full);
    if (ld->failed || !push(&lv->in_order, lv->n, d)) {
        free_descriptor(d);
        fail(ld, "out of memory");
        return;
    }
    lv->n++;
    if (wild && !push(&lv->wildcards, lv->n_wildcards++, d))
        fail(ld, "out of memory");
}

static void load_descriptors(loading *ld, rls_level *lv, const char *parent,
                             yaml_node_t *list)
{
    if (list == NULL || list->type != YAML_SEQUENCE_NODE)
        return;
    seen_keys seen;
    if (!seen_init(&seen, lv, (size_t)(list->data.sequence.items.top
                                       - list->data.sequence.items.start))) {
        fail(ld, "out of memory");
        return;
    }
    for (yaml_node_item_t *i = list->data.sequence.items.start;
         !ld->failed && i < list->data.sequence.items.top; i++)
        load_descriptor(ld, lv, &seen, parent, node(ld, *i));
    free(seen.slots);
}

/* --- Sorting for lookups ----------------------------------------------- */

static int by_key_value(const void *a, const void *b)
{
    const rls_descriptor *x = *(rls_descriptor *const *)a;
    const rls_descriptor *y = *(rls_descriptor *const *)b;
    return strcmp(x->key_value, y->key_value);
}

static int sort_level(rls_level *lv)
{
    free(lv->sorted);
    lv->sorted = malloc((lv->n + 1) * sizeof *lv->sorted);
    if (lv->sorted == NULL)
        return -1;
    if (lv->n == 0)
        return 0;
    memcpy(lv->sorted, lv->in_order, lv->n * sizeof *lv->sorted);
    qsort(lv->sorted, lv->n, sizeof *lv->sorted, by_key_value);
    for (size_t i = 0; i < lv->n; i++) {
        if (sort_level(&lv->in_order[i]->children) != 0)
            return -1;
    }
    return 0;
}

static int by_name(const void *a, const void *b)
{
    return strcmp(((const rls_domain *)a)->name,
                  ((const rls_domain *)b)->name);
}

/* Ready for lookups: every level sorted, the domains too. */
static int complete(rls_config *c)
{
    qsort(c->domains, c->n_domains, sizeof *c->domains, by_name);
    for (size_t i = 0; i < c->n_domains; i++) {
        if (sort_level(&c->domains[i].top) != 0)
            return -1;
    }
    return 0;
}

/* --- Files and domains ------------------------------------------------- */

rls_config *rls_config_new(bool merge, bool synced)
{
    rls_config *c = calloc(1, sizeof *c);
    if (c != NULL) {
        c->merge = merge;
        c->synced = synced;
    }
    return c;
}

static rls_domain *domain_named(rls_config *c, const char *name)
{
    for (size_t i = 0; i < c->n_domains; i++) {
        if (strcmp(c->domains[i].name, name) == 0)
            return &c->domains[i];
    }
    return NULL;
}

static rls_domain *new_domain(loading *ld, rls_config *c, const char *name)
{
    rls_domain *grown = realloc(c->domains,
                                (c->n_domains + 1) * sizeof *grown);
    if (grown == NULL) {
        fail(ld, "out of memory");
        return NULL;
    }
    c->domains = grown;
    rls_domain *d = &grown[c->n_domains];
    memset(d, 0, sizeof *d);
    if ((d->name = strdup(name)) == NULL) {
        fail(ld, "out of memory");
        return NULL;
    }
    c->n_domains++;
    return d;
}

static void load_root(loading *ld, rls_config *c, yaml_node_t *root)
{
    if (root != NULL && root->type != YAML_MAPPING_NODE && !is_null(root)) {
        type_fault(ld, root, "map[interface {}]interface {}");
        return;
    }
    if (root != NULL && root->type == YAML_MAPPING_NODE) {
        check_keys(ld, root);
        if (!ld->failed) {
            want_string(ld, field(ld, root, "domain"));
            type_descriptors(ld, field(ld, root, "descriptors"));
        }
    }
    if (ld->failed)
        return;
    const char *name = root != NULL && root->type == YAML_MAPPING_NODE
                           ? string_of(field(ld, root, "domain"))
                           : "";
    if (name[0] == '\0') {
        fail(ld, "config file cannot have empty domain");
        return;
    }
    rls_domain *d = domain_named(c, name);
    if (d != NULL && !c->merge) {
        fail(ld, "duplicate domain '%s' in config file", name);
        return;
    }
    if (d == NULL && (d = new_domain(ld, c, name)) == NULL)
        return;
    char *parent = join(name, ".", "");
    if (parent == NULL) {
        fail(ld, "out of memory");
        return;
    }
    load_descriptors(ld, &d->top, parent, field(ld, root, "descriptors"));
    free(parent);
}

int rls_config_add(rls_config *c, const char *name, const char *text_in,
                   size_t len, char *err, size_t cap)
{
    loading ld = {.name = name, .err = err, .cap = cap,
                  .synced = c->synced};
    yaml_parser_t p;
    if (!yaml_parser_initialize(&p)) {
        fail(&ld, "out of memory");
        return -1;
    }
    yaml_parser_set_input_string(&p, (const unsigned char *)text_in, len);
    if (!yaml_parser_load(&p, &ld.doc)) {
        fail(&ld, "error loading config file: yaml: line %zu: %s",
             p.problem_mark.line + 1,
             p.problem != NULL ? p.problem : "cannot be read");
        yaml_parser_delete(&p);
        return -1;
    }
    load_root(&ld, c, yaml_document_get_root_node(&ld.doc));
    yaml_document_delete(&ld.doc);
    yaml_parser_delete(&p);
    c->n_files++;
    if (!ld.failed && complete(c) != 0)
        fail(&ld, "out of memory");
    return ld.failed ? -1 : 0;
}

/* --- The runtime layout ------------------------------------------------ */

typedef struct walk {
    rls_config *config;
    const char *prefix;
    bool ignore_dotfiles;
    char *err;
    size_t cap;
} walk;

static char *read_file(const char *path, size_t *len, char *err,
                       size_t cap)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        snprintf(err, cap, "cannot read '%s': %s", path, strerror(errno));
        return NULL;
    }
    struct stat st;
    char *buf = NULL;
    if (fstat(fileno(f), &st) != 0 || (uint64_t)st.st_size > FILE_MAX)
        snprintf(err, cap, "'%s': not a config file under %u MiB", path,
                 FILE_MAX >> 20);
    else if ((buf = malloc((size_t)st.st_size + 1)) == NULL)
        snprintf(err, cap, "out of memory reading '%s'", path);
    else if ((*len = fread(buf, 1, (size_t)st.st_size, f))
             != (size_t)st.st_size) {
        snprintf(err, cap, "cannot read '%s': %s", path, strerror(errno));
        free(buf);
        buf = NULL;
    }
    fclose(f);
    return buf;
}

/* Names in a directory, sorted: the files load in a stated order. */
static int name_order(const struct dirent **a, const struct dirent **b)
{
    return strcmp((*a)->d_name, (*b)->d_name);
}

static int walk_dir(walk *w, const char *dir, const char *key)
{
    struct dirent **names;
    int n = scandir(dir, &names, NULL, name_order);
    if (n < 0) {
        snprintf(w->err, w->cap, "cannot read the directory '%s': %s", dir,
                 strerror(errno));
        return -1;
    }
    int rc = 0;
    for (int i = 0; i < n; i++) {
        const char *nm = names[i]->d_name;
        bool skip = strcmp(nm, ".") == 0 || strcmp(nm, "..") == 0
                    || (w->ignore_dotfiles && nm[0] == '.');
        char *path = skip || rc != 0 ? NULL : join(dir, "/", nm);
        char *sub = path == NULL ? NULL
                                 : (key[0] != '\0' ? join(key, ".", nm)
                                                   : strdup(nm));
        struct stat st;
        if (skip || rc != 0) {
            /* nothing */
        } else if (path == NULL || sub == NULL) {
            snprintf(w->err, w->cap, "out of memory");
            rc = -1;
        } else if (stat(path, &st) != 0) {
            snprintf(w->err, w->cap, "cannot read '%s': %s", path,
                     strerror(errno));
            rc = -1;
        } else if (S_ISDIR(st.st_mode)) {
            rc = walk_dir(w, path, sub);
        } else {
            size_t len = 0;
            char *buf = read_file(path, &len, w->err, w->cap);
            char *named = buf != NULL ? join(w->prefix, "", sub) : NULL;
            if (buf == NULL || named == NULL
                || rls_config_add(w->config, named, buf, len, w->err,
                                  w->cap) != 0)
                rc = -1;
            free(named);
            free(buf);
        }
        free(sub);
        free(path);
        free(names[i]);
    }
    free(names);
    return rc;
}

int rls_config_load_dir(const char *dir, const char *prefix,
                        bool ignore_dotfiles, bool merge, bool synced,
                        rls_config **out, char *err, size_t cap)
{
    *out = NULL;
    rls_config *c = rls_config_new(merge, synced);
    if (c == NULL) {
        snprintf(err, cap, "out of memory");
        return -1;
    }
    walk w = {c, prefix, ignore_dotfiles, err, cap};
    if (walk_dir(&w, dir, "") != 0) {
        rls_config_free(c);
        return -1;
    }
    *out = c;
    return 0;
}

void rls_config_free(rls_config *c)
{
    if (c == NULL)
        return;
    for (size_t i = 0; i < c->n_domains; i++) {
        free(c->domains[i].name);
        free_level(&c->domains[i].top);
    }
    free(c->domains);
    free(c);
}

/* --- Lookups ----------------------------------------------------------- */

const rls_domain *rls_config_domain(const rls_config *c, const char *name,
                                    size_t len)
{
    size_t lo = 0, hi = c->n_domains;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        const char *m = c->domains[mid].name;
        int cmp = strncmp(m, name, len);
        if (cmp == 0)
            cmp = m[len] == '\0' ? 0 : 1;
        if (cmp == 0)
            return &c->domains[mid];
        if (cmp < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

/* The request's composite "key_value" (or "key"), as bytes. */
typedef struct composite {
    const char *key;
    size_t key_len;
    const char *value; /* NULL: the bare key */
    size_t value_len;
} composite;

static size_t composite_len(const composite *k)
{
    return k->key_len + (k->value != NULL ? 1 + k->value_len : 0);
}

static char composite_at(const composite *k, size_t i)
{
    if (i < k->key_len)
        return k->key[i];
    return i == k->key_len ? '_' : k->value[i - k->key_len - 1];
}

static int compare(const char *stored, const composite *k)
{
    size_t n = composite_len(k);
    for (size_t i = 0; i < n; i++) {
        unsigned char a = (unsigned char)stored[i];
        unsigned char b = (unsigned char)composite_at(k, i);
        if (a == '\0' || a != b)
            return a < b ? -1 : 1;
    }
    return stored[n] == '\0' ? 0 : 1;
}

static rls_descriptor *exact(const rls_level *lv, const composite *k)
{
    size_t lo = 0, hi = lv->n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        int cmp = compare(lv->sorted[mid]->key_value, k);
        if (cmp == 0)
            return lv->sorted[mid];
        if (cmp < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

/* A pattern with '*'s (each any run of bytes, none included) against the
 * request's composite: its first piece a prefix, its last a suffix, the
 * ones between found in order, none overlapping. */
static bool wildcard_match(const char *pattern, const composite *k)
{
    size_t n = composite_len(k), at = 0;
    const char *star = strchr(pattern, '*');
    size_t first = (size_t)(star - pattern);
    if (first > n)
        return false;
    for (size_t i = 0; i < first; i++) {
        if (pattern[i] != composite_at(k, i))
            return false;
    }
    at = first;
    const char *last_star = strrchr(pattern, '*');
    const char *tail = last_star + 1;
    size_t tail_len = strlen(tail);
    if (n - at < tail_len)
        return false;
    size_t end = n - tail_len;
    for (size_t i = 0; i < tail_len; i++) {
        if (tail[i] != composite_at(k, end + i))
            return false;
    }
    /* The pieces between: each found, in order, within [at, end). */
    for (const char *p = star + 1; p <= last_star;) {
        const char *next = strchr(p, '*');
        size_t len = (size_t)(next - p);
        bool found = len == 0;
        for (size_t s = at; !found && s + len <= end; s++) {
            size_t i = 0;
            while (i < len && p[i] == composite_at(k, s + i))
                i++;
            if (i == len) {
                found = true;
                at = s + len;
            }
        }
        if (!found)
            return false;
        p = next + 1;
    }
    return true;
}

void rls_config_lookup(const rls_domain *d, const rls_entry *entries,
                       size_t n, rls_match *out)
{
    memset(out, 0, sizeof *out);
    if (d == NULL || n == 0 || n > RLS_ENTRIES_MAX)
        return;
    const rls_level *lv = &d->top;
    for (size_t i = 0; i < n; i++) {
        const rls_entry *e = &entries[i];
        composite k = {e->key, e->key_len, e->value, e->value_len};
        rls_descriptor *next = exact(lv, &k);
        for (size_t w = 0; next == NULL && w < lv->n_wildcards; w++) {
            if (wildcard_match(lv->wildcards[w]->key_value, &k)) {
                next = lv->wildcards[w];
                if (next->share_threshold)
                    out->shared[i] = next->key_value + next->key_len
                                     + (next->key_value[next->key_len]
                                        == '_');
            }
        }
        if (next == NULL) {
            composite bare = {e->key, e->key_len, NULL, 0};
            next = exact(lv, &bare);
        }
        if (next != NULL)
            out->named[i] = next->value_to_metric && !next->share_threshold
                                ? NULL
                                : next->key_value;
        if (next != NULL && next->limit != NULL && i == n - 1)
            out->limit = next->limit;
        if (next == NULL || next->children.n == 0)
            break;
        lv = &next->children;
    }
    if (out->limit == NULL)
        memset(out->shared, 0, sizeof out->shared);
}

/* --- The dump ---------------------------------------------------------- */

typedef struct dump_buf {
    char *s;
    size_t len, cap;
    bool failed;
} dump_buf;

__attribute__((format(printf, 2, 3)))
static void append(dump_buf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int need = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (need < 0 || b->failed) {
        b->failed = true;
        return;
    }
    if (b->len + (size_t)need + 1 > b->cap) {
        size_t cap = (b->len + (size_t)need + 1) * 2;
        char *grown = realloc(b->s, cap);
        if (grown == NULL) {
            b->failed = true;
            return;
        }
        b->s = grown;
        b->cap = cap;
    }
    va_start(ap, fmt);
    vsnprintf(b->s + b->len, b->cap - b->len, fmt, ap);
    va_end(ap);
    b->len += (size_t)need;
}

static void dump_level(dump_buf *b, const rls_level *lv)
{
    for (size_t i = 0; i < lv->n; i++) {
        const rls_limit *l = lv->in_order[i]->limit;
        if (l != NULL)
            append(b, "%s: unit=%s requests_per_unit=%u, shadow_mode: %s, "
                   "quota_mode: %s\n", l->full_key, rls_unit_name(l->unit),
                   l->requests_per_unit, l->shadow_mode ? "true" : "false",
                   l->quota_mode ? "true" : "false");
        dump_level(b, &lv->in_order[i]->children);
    }
}

char *rls_config_dump(const rls_config *c)
{
    dump_buf b = {.s = calloc(1, 1), .cap = 1};
    if (b.s == NULL)
        return NULL;
    for (size_t i = 0; i < c->n_domains; i++)
        dump_level(&b, &c->domains[i].top);
    if (b.failed) {
        free(b.s);
        return NULL;
    }
    return b.s;
}
