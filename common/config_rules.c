/*
 * config_rules.c: the parts of a rule beyond one attribute and one rate: a
 * composite `match`, `hash_tag`, `when`, `overrides` and `overrides_file`,
 * and the check that every attribute a `when` names is one some request
 * can carry. `match` (a string or a list) and `when` (a mapping of the
 * user's attribute names) are read from libyaml's document: libcyaml has
 * no type for either. A rule's overrides are built whole or not at all,
 * and a value is mapped to one override only.
 */
#include "config_loader.h"

#include "duration.h"
#include "error.h"
#include "rules.h"
#include "yaml_locate.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* Attributes rl-gateway supplies itself (see the gateway's docs). */
static const char *const builtin_attrs[] = {
    "ip", "api_key", "tenant", "plan", "method", "path", "host", "route",
    NULL,
};

static const char *scalar(const yaml_node_t *n)
{
    return (const char *)n->data.scalar.value;
}

static const char *kind_of(const yaml_node_t *n)
{
    switch (n->type) {
    case YAML_SEQUENCE_NODE: return "list";
    case YAML_MAPPING_NODE: return "mapping";
    default: return "plain value";
    }
}

static size_t seq_len(const yaml_node_t *n)
{
    return (size_t)(n->data.sequence.items.top - n->data.sequence.items.start);
}

static yaml_node_t *seq_item(yaml_document_t *doc, const yaml_node_t *n,
                             size_t i)
{
    return yaml_document_get_node(doc, n->data.sequence.items.start[i]);
}

/* libcyaml skips the fields it ignores without noticing one given twice,
 * and libyaml keeps both: refuse a second `key` in the mapping at path, as
 * libcyaml does for its own fields. */
static int given_once(struct loader *ld, const char *path, const char *key)
{
    char shown[192];
    yaml_node_t *map = rl_yaml_at(&ld->doc, NULL, path, false);
    if (map == NULL || map->type != YAML_MAPPING_NODE)
        return RL_OK;
    bool seen = false;
    for (yaml_node_pair_t *p = map->data.mapping.pairs.start;
         p < map->data.mapping.pairs.top; p++) {
        yaml_node_t *k = yaml_document_get_node(&ld->doc, p->key);
        if (k == NULL || k->type != YAML_SCALAR_NODE
            || strcmp(scalar(k), key) != 0)
            continue;
        if (seen) {
            snprintf(shown, sizeof shown, "%s.%s", path, key);
            return bad_node(ld, k, shown, "field '%s' is given twice", key);
        }
        seen = true;
    }
    return RL_OK;
}

/* Appends ".step" to a dotted path (cut short, never overflowed). */
static void path_join(char *out, size_t cap, const char *base,
                      const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void path_join(char *out, size_t cap, const char *base,
                      const char *fmt, ...)
{
    int n = snprintf(out, cap, "%s.", base);
    if (n < 0 || (size_t)n >= cap)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(out + n, cap - (size_t)n, fmt, ap);
    va_end(ap);
}

/* One attribute name of match: plain, at most RL_NAME_MAX bytes. */
static int check_attr_name(struct loader *ld, const yaml_node_t *node,
                           const char *path)
{
    if (node->type != YAML_SCALAR_NODE)
        return bad_node(ld, node, path, "expected an attribute name, got a "
                        "%s", kind_of(node));
    if (node->data.scalar.length > RL_NAME_MAX)
        return bad_node(ld, node, path, "longer than %d bytes", RL_NAME_MAX);
    if (!rl_config_plain_name(scalar(node), "_.-"))
        return bad_node(ld, node, path, "'%s' is not a valid attribute name "
                        "(use letters, digits and _ . -)", scalar(node));
    return RL_OK;
}

int rl_config_load_match(struct loader *ld, size_t i, const rl_raw_rule *raw,
                         rl_rule *rule)
{
    char path[96], item[112];
    snprintf(item, sizeof item, "rules.%zu", i);
    int rc0;
    if ((rc0 = given_once(ld, item, "match")) != RL_OK
        || (rc0 = given_once(ld, item, "when")) != RL_OK)
        return rc0;
    snprintf(path, sizeof path, "rules.%zu.match", i);
    yaml_node_t *node = rl_yaml_at(&ld->doc, NULL, path, false);
    if (node == NULL) {
        snprintf(item, sizeof item, "rules.%zu", i);
        return bad_node(ld, rl_yaml_at(&ld->doc, NULL, item, false), path,
                        "missing required field 'match'");
    }
    rule->n_parts = 0;
    if (node->type == YAML_SCALAR_NODE) {
        int rc = check_attr_name(ld, node, path);
        if (rc != RL_OK)
            return rc;
        snprintf(rule->parts[0], sizeof rule->parts[0], "%s", scalar(node));
        rule->n_parts = 1;
    } else if (node->type == YAML_SEQUENCE_NODE) {
        size_t n = seq_len(node);
        if (n == 0)
            return bad_node(ld, node, path, "the list is empty: name the "
                            "attribute (or attributes) the rule keys on");
        if (n > RL_MATCH_MAX)
            return bad_node(ld, node, path, "%zu attributes: a composite key "
                            "takes at most %d", n, RL_MATCH_MAX);
        for (size_t k = 0; k < n; k++) {
            yaml_node_t *part = seq_item(&ld->doc, node, k);
            path_join(item, sizeof item, path, "%zu", k);
            int rc = check_attr_name(ld, part, item);
            if (rc != RL_OK)
                return rc;
            for (size_t j = 0; j < k; j++) {
                if (strcmp(rule->parts[j], scalar(part)) == 0)
                    return bad_node(ld, part, item, "attribute '%s' is "
                                    "named twice: a key part repeated adds "
                                    "nothing but length", scalar(part));
            }
            snprintf(rule->parts[k], sizeof rule->parts[k], "%s",
                     scalar(part));
            rule->n_parts = k + 1;
        }
    } else {
        return bad_node(ld, node, path, "expected an attribute name or a "
                        "list of them, got a mapping");
    }
    size_t used = 0;
    for (size_t k = 0; k < rule->n_parts; k++)
        used += (size_t)snprintf(rule->match + used,
                                 sizeof rule->match - used, "%s%s",
                                 k ? "," : "", rule->parts[k]);

    rule->hash_tag = -1;
    rule->tag_attr[0] = '\0';
    if (raw->hash_tag == NULL)
        return RL_OK;
    snprintf(path, sizeof path, "rules.%zu.hash_tag", i);
    for (size_t k = 0; k < rule->n_parts && rule->n_parts >= 2; k++) {
        if (strcmp(rule->parts[k], raw->hash_tag) == 0) {
            rule->hash_tag = (int)k;
            return RL_OK;
        }
    }
    /* Any other attribute (or a one-attribute rule's own) co-locates the
     * rule's keys with every key tagged by the same value (issue 18). */
    if (!rl_config_plain_name(raw->hash_tag, "_.-"))
        return bad(ld, path, "'%s' is not a valid attribute name (use "
                   "letters, digits and _ . -)", raw->hash_tag);
    snprintf(rule->tag_attr, sizeof rule->tag_attr, "%s", raw->hash_tag);
    return RL_OK;
}

/* One value of a `when` condition: a plain, non-empty value a request
 * could carry. */
static int when_value(struct loader *ld, const rl_config *cfg,
                      const yaml_node_t *node, const char *path, bool prefix,
                      char **value, size_t *len)
{
    if (node->type != YAML_SCALAR_NODE)
        return bad_node(ld, node, path, "expected a value, got a %s",
                        kind_of(node));
    size_t n = node->data.scalar.length;
    if (n == 0 && !prefix)
        return bad_node(ld, node, path, "an empty value never matches: a "
                        "request's attributes are never empty");
    if (n > cfg->max_value_bytes)
        return bad_node(ld, node, path, "longer than max_value_bytes (%u): "
                        "no request value can match it",
                        cfg->max_value_bytes);
    if ((*value = strdup(scalar(node))) == NULL)
        return rl_config_oom(ld);
    *len = n;
    return RL_OK;
}

/* One condition: attr: value | [values] | {prefix: "..."}. */
static int load_clause(struct loader *ld, const rl_config *cfg,
                       const yaml_node_t *node, const char *path,
                       rl_when_clause *c)
{
    char item[160];
    size_t n = 1;
    yaml_node_t *value = (yaml_node_t *)node;
    c->op = RL_WHEN_EQUAL;
    if (node->type == YAML_SEQUENCE_NODE) {
        c->op = RL_WHEN_ANY;
        n = seq_len(node);
        if (n == 0)
            return bad_node(ld, node, path, "the list is empty, so nothing "
                            "would match: give at least one value");
        if (n > RL_WHEN_VALUES_MAX)
            return bad_node(ld, node, path, "%zu values: at most %d in one "
                            "condition (use an override's values, or an "
                            "overrides_file, for more)", n,
                            RL_WHEN_VALUES_MAX);
    } else if (node->type == YAML_MAPPING_NODE) {
        yaml_node_pair_t *pairs = node->data.mapping.pairs.start;
        size_t n_pairs = (size_t)(node->data.mapping.pairs.top - pairs);
        yaml_node_t *key = n_pairs > 0
                               ? yaml_document_get_node(&ld->doc,
                                                        pairs[0].key)
                               : NULL;
        if (n_pairs != 1 || key->type != YAML_SCALAR_NODE
            || strcmp(scalar(key), "prefix") != 0)
            return bad_node(ld, key != NULL ? key : node, path, "unknown "
                            "matcher '%s' (a condition is a value, a list "
                            "of values, or {prefix: \"...\"})",
                            key != NULL && key->type == YAML_SCALAR_NODE
                                ? scalar(key) : "");
        c->op = RL_WHEN_PREFIX;
        value = yaml_document_get_node(&ld->doc, pairs[0].value);
    }
    if ((c->values = calloc(n, sizeof *c->values)) == NULL
        || (c->lens = calloc(n, sizeof *c->lens)) == NULL)
        return rl_config_oom(ld);
    for (size_t i = 0; i < n; i++) {
        const yaml_node_t *v = value;
        if (c->op == RL_WHEN_ANY) {
            v = seq_item(&ld->doc, node, i);
            path_join(item, sizeof item, path, "%zu", i);
        } else {
            snprintf(item, sizeof item, "%s", path);
        }
        int rc = when_value(ld, cfg, v, item, c->op == RL_WHEN_PREFIX,
                            &c->values[i], &c->lens[i]);
        c->n_values = i + (rc == RL_OK);
        if (rc != RL_OK)
            return rc;
    }
    return RL_OK;
}

/* A `when` at path (dotted): a mapping of attribute -> condition. Absent
 * leaves w empty (every request). */
static int load_when(struct loader *ld, const rl_config *cfg,
                     const char *path, rl_when *w)
{
    char item[160];
    yaml_node_t *node = rl_yaml_at(&ld->doc, NULL, path, false);
    if (node == NULL)
        return RL_OK;
    if (node->type != YAML_MAPPING_NODE)
        return bad_node(ld, node, path, "expected a mapping of attribute: "
                        "value (or [values], or {prefix: \"...\"}), got a %s",
                        kind_of(node));
    yaml_node_pair_t *pairs = node->data.mapping.pairs.start;
    size_t n = (size_t)(node->data.mapping.pairs.top - pairs);
    if (n == 0)
        return bad_node(ld, node, path, "the mapping is empty, so it would "
                        "hold for every request: leave when out instead");
    if (n > RL_WHEN_MAX)
        return bad_node(ld, node, path, "%zu conditions: at most %d", n,
                        RL_WHEN_MAX);
    if ((w->clauses = calloc(n, sizeof *w->clauses)) == NULL)
        return rl_config_oom(ld);
    for (size_t i = 0; i < n; i++) {
        yaml_node_t *key = yaml_document_get_node(&ld->doc, pairs[i].key);
        yaml_node_t *value = yaml_document_get_node(&ld->doc,
                                                    pairs[i].value);
        if (key->type != YAML_SCALAR_NODE)
            return bad_node(ld, key, path, "expected an attribute name, got "
                            "a %s", kind_of(key));
        path_join(item, sizeof item, path, "%s", scalar(key));
        int rc = check_attr_name(ld, key, item);
        if (rc != RL_OK)
            return rc;
        for (size_t j = 0; j < i; j++) {
            if (strcmp(w->clauses[j].attr, scalar(key)) == 0)
                return bad_node(ld, key, item, "attribute '%s' is given "
                                "twice in this when", scalar(key));
        }
        rl_when_clause *c = &w->clauses[i];
        snprintf(c->attr, sizeof c->attr, "%s", scalar(key));
        w->n = i + 1;
        if ((rc = load_clause(ld, cfg, value, item, c)) != RL_OK)
            return rc;
    }
    return RL_OK;
}

/* An override's rate: its own limit (and period, burst) or unlimited.
 * path is the override's; field names the field at fault on a problem. */
static bool override_rate(const rl_rule *rule, const char *limit,
                          const char *period, const char *burst,
                          rl_limit *out, const char **field, char *why,
                          size_t cap)
{
    *out = (rl_limit){.period_ms = rule->period_ms};
    *field = "limit";
    if (!rl_config_parse_u64(limit, 1, RL_LIMIT_MAX, &out->limit, why, cap))
        return false;
    if (period != NULL) {
        *field = "period";
        if (rl_duration_parse(period, &out->period_ms) != RL_OK) {
            snprintf(why, cap, "'%s' is not a period: write a positive "
                     "count and a unit (ms, s, m, h, d), e.g. 500ms, 1s, 1m, "
                     "1h, 1d, at most 366d", period);
            return false;
        }
        /* The aggregator keeps one window per synced rule, of the rule's
         * period: a key counted in another could not be added up. */
        if (rule->mode == RL_MODE_SYNCED && out->period_ms != rule->period_ms) {
            snprintf(why, cap, "a synced rule's overrides keep its period "
                     "(%llu ms): the aggregator counts one window per rule; "
                     "change limit and burst only, or leave period out",
                     (unsigned long long)rule->period_ms);
            return false;
        }
    }
    out->burst = out->limit;
    if (burst != NULL) {
        *field = "burst";
        if (!rl_config_parse_u64(burst, 1, RL_LIMIT_MAX, &out->burst, why,
                                 cap))
            return false;
        if (rule->algorithm == RL_ALGO_FIXED_WINDOW
            && out->burst != out->limit) {
            snprintf(why, cap, "a fixed window admits limit per period and "
                     "has no burst (a token bucket's): leave burst out");
            return false;
        }
    }
    *field = burst != NULL ? "burst" : "limit";
    return rl_config_rate_countable(out, why, cap);
}

/* The first of an override's rate fields given (limit, period, burst),
 * or NULL. */
static const char *rate_field(const rl_raw_override *raw)
{
    return raw->limit ? "limit"
           : raw->period ? "period"
           : raw->burst ? "burst" : NULL;
}

/* An in_flight rule's override gives in_flight: M (or unlimited), and
 * only such a rule's does. */
static int in_flight_fields(struct loader *ld, const char *path,
                            const rl_raw_override *raw, const rl_rule *rule)
{
    char field[160];
    if (rule->mode != RL_MODE_IN_FLIGHT) {
        if (raw->in_flight == NULL)
            return RL_OK;
        path_join(field, sizeof field, path, "in_flight");
        return bad(ld, field, "in_flight overrides an in_flight rule's N, "
                   "and this rule is %s: give limit (and period, burst)",
                   rl_mode_name(rule->mode));
    }
    const char *extra = rate_field(raw);
    if (extra != NULL) {
        path_join(field, sizeof field, path, "%s", extra);
        return bad(ld, field, "an in_flight rule's override gives "
                   "in_flight: M (requests at once) or unlimited: true, and "
                   "no %s", extra);
    }
    bool unlimited = raw->unlimited != NULL
                     && strcmp(raw->unlimited, "true") == 0;
    if (raw->in_flight == NULL && !unlimited)
        return bad(ld, path, "an in_flight rule's override needs "
                   "in_flight: M (requests at once), or unlimited: true");
    return RL_OK;
}

/* An inline override's rate and kind. */
static int load_inline(struct loader *ld, const rl_config *cfg,
                       const char *path, const rl_raw_override *raw,
                       const rl_rule *rule, rl_override *o)
{
    char field[160], why[512];
    const char *at;
    bool unlimited = false;
    int rc = given_once(ld, path, "when");
    if (rc != RL_OK)
        return rc;
    path_join(field, sizeof field, path, "when");
    bool has_when = rl_yaml_at(&ld->doc, NULL, field, false) != NULL;
    if (has_when && raw->values != NULL)
        return bad(ld, path, "give when (conditions on the request) or "
                   "values (of the rule's key), not both: make two "
                   "overrides");
    if (!has_when && raw->values == NULL)
        return bad(ld, path, "an override needs when (conditions on the "
                   "request) or values (of the rule's key) to say what it "
                   "applies to");
    if (raw->values != NULL && rule->n_parts > 1) {
        path_join(field, sizeof field, path, "values");
        return bad(ld, field, "values name one attribute's values, and this "
                   "rule's key is composite (%s): use when instead",
                   rule->match);
    }
    if (raw->values != NULL && raw->values_count == 0) {
        path_join(field, sizeof field, path, "values");
        return bad(ld, field, "the list is empty: give at least one value");
    }
    path_join(field, sizeof field, path, "unlimited");
    rc = rl_config_parse_bool(ld, field, raw->unlimited, &unlimited);
    if (rc != RL_OK)
        return rc;
    if ((rc = in_flight_fields(ld, path, raw, rule)) != RL_OK)
        return rc;
    if (unlimited) {
        const char *extra = rate_field(raw);
        if (extra == NULL && raw->in_flight != NULL)
            extra = "in_flight";
        if (extra != NULL) {
            path_join(field, sizeof field, path, "%s", extra);
            return bad(ld, field, "an override is either unlimited: true or "
                       "has a limit, not both (and unlimited takes no "
                       "period or burst)");
        }
        o->rate = (rl_limit){.unlimited = true};
    } else if (rule->mode == RL_MODE_IN_FLIGHT) {
        path_join(field, sizeof field, path, "in_flight");
        if ((rc = rl_config_parse_int(ld, field, raw->in_flight, 1,
                                      RL_LIMIT_MAX, &o->rate.limit)) != RL_OK)
            return rc;
        o->rate.burst = o->rate.limit;
        o->rate.period_ms = rule->period_ms;
    } else if (raw->limit == NULL) {
        return bad(ld, path, "an override needs a limit (with period and "
                   "burst if they differ from the rule's), or unlimited: "
                   "true");
    } else if (!override_rate(rule, raw->limit, raw->period, raw->burst,
                              &o->rate, &at, why, sizeof why)) {
        path_join(field, sizeof field, path, "%s", at);
        return bad(ld, field, "%s", why);
    }
    if (raw->name != NULL) {
        path_join(field, sizeof field, path, "name");
        if (!rl_config_plain_name(raw->name, "_.:-"))
            return bad(ld, field, "'%s' is not a valid override name (use "
                       "letters, digits and _ . : -)", raw->name);
        for (const rl_override *p = rule->overrides; p < o; p++) {
            if (p->name != NULL && strcmp(p->name, raw->name) == 0)
                return bad(ld, field, "override name '%s' is given twice: "
                           "overrides[%u] has it already", raw->name,
                           p->order);
        }
        if ((o->name = strdup(raw->name)) == NULL)
            return rl_config_oom(ld);
    }
    path_join(field, sizeof field, path, "when");
    return load_when(ld, cfg, field, &o->when);
}

/* The lines of an overrides_file, read before the overrides array is
 * sized: rates and line numbers, and the values in one buffer. */
struct file_line {
    rl_limit rate;
    uint32_t line;
    uint32_t len;
    size_t off;
};

struct file_read {
    char path[RL_PATH_MAX * 2 + 2]; /* as opened, for messages */
    struct file_line *lines;
    size_t n, cap;
    char *bytes;
    size_t used, bytes_cap;
};

static void file_read_fini(struct file_read *f)
{
    free(f->lines);
    free(f->bytes);
}

/* "FILE:LINE: rules[I].overrides_file (rule "R"): what". */
__attribute__((format(printf, 5, 6)))
static int bad_line(struct loader *ld, size_t i, const struct file_read *f,
                    unsigned line, const char *fmt, ...)
{
    char what[640];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return rl_error_set(ld->err, RL_ECONFIG, "%s:%u: rules[%zu]."
                        "overrides_file (rule \"%s\"): %s", f->path, line, i,
                        ld->rule, what);
}

static bool file_append(struct file_read *f, const char *value, size_t len,
                        const rl_limit *rate, unsigned line)
{
    if (f->n == f->cap) {
        size_t cap = f->cap ? f->cap * 2 : 256;
        struct file_line *lines = realloc(f->lines, cap * sizeof *lines);
        if (lines == NULL)
            return false;
        f->lines = lines;
        f->cap = cap;
    }
    if (f->used + len > f->bytes_cap) {
        size_t cap = f->bytes_cap ? f->bytes_cap * 2 : 4096;
        while (cap < f->used + len)
            cap *= 2;
        char *bytes = realloc(f->bytes, cap);
        if (bytes == NULL)
            return false;
        f->bytes = bytes;
        f->bytes_cap = cap;
    }
    memcpy(f->bytes + f->used, value, len);
    f->lines[f->n++] = (struct file_line){.rate = *rate, .line = line,
                                          .len = (uint32_t)len,
                                          .off = f->used};
    f->used += len;
    return true;
}

/* Splits a line into at most max fields on blanks and tabs; a field that
 * starts with '#' starts a comment. Returns the number of fields, or
 * max + 1 when there are more. */
static size_t split_fields(char *line, char **fields, size_t max)
{
    size_t n = 0;
    char *p = line;
    for (;;) {
        p += strspn(p, " \t");
        if (*p == '\0' || *p == '#')
            return n;
        if (n == max)
            return max + 1;
        fields[n++] = p;
        p += strcspn(p, " \t");
        if (*p != '\0')
            *p++ = '\0';
    }
}

/* Reads one line's fields into f. */
static int read_line(struct loader *ld, size_t i, const rl_config *cfg,
                     const rl_rule *rule, struct file_read *f, char *line,
                     unsigned no)
{
    char why[512];
    char *fields[4];
    size_t k = split_fields(line, fields, 4);
    if (k == 0)
        return RL_OK;
    if (k < 3 || k > 4)
        return bad_line(ld, i, f, no, "expected 'value limit period [burst]' "
                        "separated by blanks or tabs, got %s%zu field%s",
                        k > 4 ? "more than " : "", k > 4 ? (size_t)4 : k,
                        k == 1 ? "" : "s");
    size_t len = strlen(fields[0]);
    if (len > cfg->max_value_bytes)
        return bad_line(ld, i, f, no, "the value is %zu bytes, over "
                        "max_value_bytes (%u): no request value can match "
                        "it", len, cfg->max_value_bytes);
    if (f->n == RL_OVERRIDES_MAX)
        return bad_line(ld, i, f, no, "more than %d overrides in one rule",
                        RL_OVERRIDES_MAX);
    rl_limit rate;
    const char *field;
    if (!override_rate(rule, fields[1], fields[2], k == 4 ? fields[3] : NULL,
                       &rate, &field, why, sizeof why))
        return bad_line(ld, i, f, no, "%s %s", field, why);
    if (!file_append(f, fields[0], len, &rate, no))
        return rl_config_oom(ld);
    return RL_OK;
}

/* Reads rule i's overrides_file: `value limit period [burst]` lines. The
 * file is bounded (RL_OVERRIDES_FILE_MAX bytes, RL_OVERRIDES_MAX lines),
 * so a wrong path cannot make the loader allocate without end. */
static int read_overrides_file(struct loader *ld, size_t i,
                               const rl_config *cfg, const rl_rule *rule,
                               struct file_read *f)
{
    char path[64];
    snprintf(path, sizeof path, "rules.%zu.overrides_file", i);
    const char *name = rule->overrides_file;
    if (name[0] == '\0')
        return bad(ld, path, "the path is empty; leave the field out for no "
                   "file");
    if (rule->n_parts > 1)
        return bad(ld, path, "an overrides_file maps values of one "
                   "attribute, and this rule's key is composite (%s): use "
                   "overrides with when instead", rule->match);
    if (name[0] == '/' || ld->dir[0] == '\0')
        snprintf(f->path, sizeof f->path, "%s", name);
    else
        snprintf(f->path, sizeof f->path, "%s/%s", ld->dir, name);
    FILE *in = fopen(f->path, "re");
    if (in == NULL)
        return bad(ld, path, "cannot read '%s': %s", f->path,
                   strerror(errno));
    int rc = RL_OK;
    char *text = NULL;
    struct stat st;
    if (fstat(fileno(in), &st) != 0 || !S_ISREG(st.st_mode)) {
        rc = bad(ld, path, "'%s' is not a regular file", f->path);
        goto done;
    }
    if (st.st_size > (off_t)RL_OVERRIDES_FILE_MAX) {
        rc = bad(ld, path, "'%s' is %lld bytes, over the %u-byte limit",
                 f->path, (long long)st.st_size, RL_OVERRIDES_FILE_MAX);
        goto done;
    }
    /* One byte more than the size, to notice a file that grew. */
    size_t cap = (size_t)st.st_size + 1;
    if ((text = malloc(cap + 1)) == NULL) {
        rc = rl_config_oom(ld);
        goto done;
    }
    size_t len = fread(text, 1, cap, in);
    if (ferror(in) || len == cap) {
        rc = bad(ld, path, "cannot read '%s': %s", f->path,
                 len == cap ? "it changed while being read"
                            : strerror(errno));
        goto done;
    }
    text[len] = '\0';
    unsigned no = 1;
    for (char *line = text; line < text + len && rc == RL_OK; no++) {
        char *end = memchr(line, '\n', (size_t)(text + len - line));
        if (end == NULL)
            end = text + len;
        bool nul = memchr(line, '\0', (size_t)(end - line)) != NULL;
        *end = '\0';
        if (end > line && end[-1] == '\r')
            end[-1] = '\0';
        rc = nul ? bad_line(ld, i, f, no, "the line holds a NUL byte")
                 : read_line(ld, i, cfg, rule, f, line, no);
        line = end + 1;
    }
done:
    free(text);
    fclose(in);
    return rc;
}

/* Maps value to o, or says where it was mapped already. */
static int map_value(struct loader *ld, rl_rule *rule, const char *value,
                     size_t len, const rl_override *o, const char *path,
                     size_t i, const struct file_read *f)
{
    const rl_override *was = NULL;
    int rc = rl_override_map_add(rule->values, value, len, o, &was);
    if (rc == RL_ENOMEM)
        return rl_config_oom(ld);
    if (rc == RL_OK)
        return RL_OK;
    char where[RL_PATH_MAX + 64];
    if (was == o)
        snprintf(where, sizeof where, "earlier in this list");
    else if (was->line == 0)
        snprintf(where, sizeof where, "in overrides[%u]", was->order);
    else
        snprintf(where, sizeof where, "on line %u of %s", was->line,
                 rule->overrides_file);
    if (o->line != 0)
        return bad_line(ld, i, f, o->line, "value '%.*s' is given twice: "
                        "also %s; one value takes one rate", (int)len, value,
                        where);
    return bad(ld, path, "value '%.*s' is given twice: also %s; one value "
               "takes one rate", (int)len, value, where);
}

int rl_config_load_overrides(struct loader *ld, size_t i,
                             const rl_raw_rule *raw, const rl_config *cfg,
                             rl_rule *rule)
{
    char path[160], item[192];
    struct file_read f = {.n = 0};
    int rc;
    snprintf(path, sizeof path, "rules.%zu.when", i);
    if ((rc = load_when(ld, cfg, path, &rule->when)) != RL_OK)
        return rc;
    if (raw->overrides_file != NULL) {
        snprintf(rule->overrides_file, sizeof rule->overrides_file, "%s",
                 raw->overrides_file);
        if ((rc = read_overrides_file(ld, i, cfg, rule, &f)) != RL_OK)
            goto done;
    }
    if (raw->overrides != NULL && raw->overrides_count == 0) {
        snprintf(path, sizeof path, "rules.%zu.overrides", i);
        rc = bad(ld, path, "the list is empty: leave overrides out for "
                 "none");
        goto done;
    }
    size_t n_inline = raw->overrides_count, n = n_inline + f.n;
    if (n == 0)
        goto done;
    if (n > RL_OVERRIDES_MAX) {
        snprintf(path, sizeof path, "rules.%zu.overrides", i);
        rc = bad(ld, path, "%zu overrides: at most %d in one rule", n,
                 RL_OVERRIDES_MAX);
        goto done;
    }
    if ((rule->overrides = calloc(n, sizeof *rule->overrides)) == NULL) {
        rc = rl_config_oom(ld);
        goto done;
    }
    size_t n_values = f.n, n_when = 0;
    for (size_t j = 0; j < n_inline; j++) {
        rl_override *o = &rule->overrides[j];
        o->order = (uint32_t)j;
        rule->n_overrides = j + 1;
        snprintf(path, sizeof path, "rules.%zu.overrides.%zu", i, j);
        if ((rc = load_inline(ld, cfg, path, &raw->overrides[j],
                              rule, o)) != RL_OK)
            goto done;
        n_values += raw->overrides[j].values_count;
        n_when += o->when.n > 0;
    }
    for (size_t k = 0; k < f.n; k++) {
        rl_override *o = &rule->overrides[n_inline + k];
        o->rate = f.lines[k].rate;
        o->order = (uint32_t)(n_inline + k);
        o->line = f.lines[k].line;
    }
    rule->n_overrides = n;
    rule->n_file_overrides = f.n;
    if (n_when > 0) {
        rule->when_overrides = calloc(n_when, sizeof *rule->when_overrides);
        if (rule->when_overrides == NULL) {
            rc = rl_config_oom(ld);
            goto done;
        }
        for (size_t j = 0; j < n_inline; j++) {
            if (rule->overrides[j].when.n > 0)
                rule->when_overrides[rule->n_when_overrides++] =
                    &rule->overrides[j];
        }
    }
    if (n_values == 0)
        goto done;
    if ((rc = rl_override_map_new(n_values, &rule->values)) != RL_OK) {
        rc = rl_config_oom(ld);
        goto done;
    }
    for (size_t j = 0; j < n_inline; j++) {
        const rl_raw_override *r = &raw->overrides[j];
        for (size_t v = 0; v < r->values_count; v++) {
            snprintf(item, sizeof item, "rules.%zu.overrides.%zu.values.%zu",
                     i, j, v);
            size_t len = strlen(r->values[v]);
            if (len == 0 || len > cfg->max_value_bytes) {
                rc = bad(ld, item, len == 0
                         ? "an empty value never matches: a request's "
                           "attributes are never empty"
                         : "longer than max_value_bytes (%u): no request "
                           "value can match it", cfg->max_value_bytes);
                goto done;
            }
            if ((rc = map_value(ld, rule, r->values[v], len,
                                &rule->overrides[j], item, i, &f)) != RL_OK)
                goto done;
        }
    }
    for (size_t k = 0; k < f.n; k++) {
        if ((rc = map_value(ld, rule, f.bytes + f.lines[k].off,
                            f.lines[k].len, &rule->overrides[n_inline + k],
                            NULL, i, &f)) != RL_OK)
            goto done;
    }
    rule->n_values = n_values;
done:
    file_read_fini(&f);
    return rc;
}

/* How far apart two names are (edits), to suggest the one meant. */
static size_t distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b), row[RL_NAME_MAX + 2];
    if (la > RL_NAME_MAX || lb > RL_NAME_MAX)
        return (size_t)-1;
    for (size_t j = 0; j <= lb; j++)
        row[j] = j;
    for (size_t i = 1; i <= la; i++) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t up = row[j];
            size_t best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best)
                best = up + 1;
            if (row[j - 1] + 1 < best)
                best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[lb];
}

/* Whether name is an attribute some request could carry (a built-in, a
 * part of some rule's key, or one of `attributes:`), and else the known
 * name nearest to it, if one is near. */
static const char *closest_known(const rl_config *cfg, const char *name,
                                 bool *known)
{
    const char *best = NULL;
    size_t best_d = 3; /* suggest only a near miss */
    *known = false;
#define CONSIDER(s)                                   \
    do {                                              \
        const char *s_ = (s);                         \
        size_t d_ = distance(name, s_);               \
        if (d_ == 0)                                  \
            *known = true;                            \
        if (d_ < best_d) {                            \
            best_d = d_;                              \
            best = s_;                                \
        }                                             \
    } while (0)
    for (size_t k = 0; builtin_attrs[k] != NULL; k++)
        CONSIDER(builtin_attrs[k]);
    for (size_t r = 0; r < cfg->n_rules; r++) {
        for (size_t k = 0; k < cfg->rules[r].n_parts; k++)
            CONSIDER(cfg->rules[r].parts[k]);
    }
    for (size_t k = 0; k < cfg->n_attributes_extra; k++)
        CONSIDER(cfg->attributes_extra[k]);
#undef CONSIDER
    return best;
}

static int check_when(struct loader *ld, const rl_config *cfg,
                      const rl_when *w, const char *path)
{
    char item[256], hint[RL_NAME_MAX + 32] = "";
    for (size_t c = 0; c < w->n; c++) {
        bool known;
        const char *near = closest_known(cfg, w->clauses[c].attr, &known);
        if (known)
            continue;
        if (near != NULL)
            snprintf(hint, sizeof hint, "did you mean '%s'? ", near);
        path_join(item, sizeof item, path, "%s", w->clauses[c].attr);
        return bad_key(ld, item, "unknown attribute '%s' in when (%sknown "
                       "are the gateway's ip, api_key, tenant, plan, method, "
                       "path, host, route and any attribute a rule matches; "
                       "list any other under the top-level attributes:)",
                       w->clauses[c].attr, hint);
    }
    return RL_OK;
}

int rl_config_check_attributes(struct loader *ld, const rl_config *cfg)
{
    char path[160];
    int rc = RL_OK;
    for (size_t r = 0; r < cfg->n_rules && rc == RL_OK; r++) {
        const rl_rule *rule = &cfg->rules[r];
        ld->rule = rule->name;
        snprintf(path, sizeof path, "rules.%zu.when", r);
        rc = check_when(ld, cfg, &rule->when, path);
        for (size_t j = 0; j < rule->n_when_overrides && rc == RL_OK; j++) {
            const rl_override *o = rule->when_overrides[j];
            snprintf(path, sizeof path, "rules.%zu.overrides.%u.when", r,
                     o->order);
            rc = check_when(ld, cfg, &o->when, path);
        }
    }
    ld->rule = NULL;
    return rc;
}

static void when_fini(rl_when *w)
{
    for (size_t c = 0; c < w->n; c++) {
        for (size_t v = 0; v < w->clauses[c].n_values; v++)
            free(w->clauses[c].values[v]);
        free(w->clauses[c].values);
        free(w->clauses[c].lens);
    }
    free(w->clauses);
    *w = (rl_when){0};
}

void rl_config_rule_fini(rl_rule *rule)
{
    when_fini(&rule->when);
    for (size_t j = 0; j < rule->n_overrides; j++) {
        when_fini(&rule->overrides[j].when);
        free(rule->overrides[j].name);
    }
    free(rule->overrides);
    free(rule->when_overrides);
    rl_override_map_free(rule->values);
    rule->overrides = NULL;
    rule->when_overrides = NULL;
    rule->values = NULL;
    rule->n_overrides = rule->n_when_overrides = rule->n_values = 0;
}
