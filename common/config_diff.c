/*
 * config_diff.c: the lines of config_diff.h. Rules are paired by name (a
 * renamed rule is one removed and one added, as the agent's reload sees
 * it: its buckets start afresh). Values overrides are compared value by
 * value through the rules' hash maps, so a 100,000-line overrides_file
 * costs two passes, not a join.
 */
#include "config_diff.h"

#include "duration.h"
#include "rules.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LINE_MAX_BYTES 1024

static int add_line(rl_config_diff *d, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static int add_line(rl_config_diff *d, const char *fmt, ...)
{
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 16;
        char **lines = realloc(d->lines, cap * sizeof *lines);
        if (lines == NULL)
            return RL_ENOMEM;
        d->lines = lines;
        d->cap = cap;
    }
    char buf[LINE_MAX_BYTES];
    va_list ap;
    va_start(ap, fmt);
    int len = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (len >= (int)sizeof buf)
        memcpy(buf + sizeof buf - 4, "...", 4);
    if ((d->lines[d->n] = strdup(buf)) == NULL)
        return RL_ENOMEM;
    d->n++;
    return RL_OK;
}

void rl_config_diff_rate(const rl_limit *r, char *buf, size_t cap)
{
    if (r->unlimited) {
        snprintf(buf, cap, "unlimited");
        return;
    }
    char period[24];
    rl_duration_format(r->period_ms, period, sizeof period);
    if (r->burst != r->limit)
        snprintf(buf, cap, "%llu per %s, burst %llu",
                 (unsigned long long)r->limit, period,
                 (unsigned long long)r->burst);
    else
        snprintf(buf, cap, "%llu per %s", (unsigned long long)r->limit,
                 period);
}

void rl_config_diff_append(char *buf, size_t cap, const char *fmt, ...)
{
    size_t used = strlen(buf);
    if (used + 1 >= cap)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + used, cap - used, fmt, ap);
    va_end(ap);
}

void rl_config_diff_when(const rl_when *w, char *buf, size_t cap)
{
    buf[0] = '\0';
    if (w->n == 0) {
        rl_config_diff_append(buf, cap, "every request");
        return;
    }
    for (size_t i = 0; i < w->n; i++) {
        const rl_when_clause *c = &w->clauses[i];
        rl_config_diff_append(buf, cap, "%s%s: ", i ? ", " : "", c->attr);
        if (c->op == RL_WHEN_PREFIX) {
            rl_config_diff_append(buf, cap, "{prefix: %s}", c->values[0]);
        } else if (c->op == RL_WHEN_EQUAL) {
            rl_config_diff_append(buf, cap, "%s", c->values[0]);
        } else {
            rl_config_diff_append(buf, cap, "[");
            for (size_t j = 0; j < c->n_values; j++)
                rl_config_diff_append(buf, cap, "%s%s", j ? ", " : "",
                                      c->values[j]);
            rl_config_diff_append(buf, cap, "]");
        }
    }
}

static bool same_rate(const rl_limit *a, const rl_limit *b)
{
    if (a->unlimited || b->unlimited)
        return a->unlimited == b->unlimited;
    return a->limit == b->limit && a->period_ms == b->period_ms
           && a->burst == b->burst;
}

static bool same_when(const rl_when *a, const rl_when *b)
{
    if (a->n != b->n)
        return false;
    for (size_t i = 0; i < a->n; i++) {
        const rl_when_clause *x = &a->clauses[i], *y = &b->clauses[i];
        if (strcmp(x->attr, y->attr) != 0 || x->op != y->op
            || x->n_values != y->n_values)
            return false;
        for (size_t j = 0; j < x->n_values; j++) {
            if (x->lens[j] != y->lens[j]
                || memcmp(x->values[j], y->values[j], x->lens[j]) != 0)
                return false;
        }
    }
    return true;
}

static const rl_rule *rule_named(const rl_config *cfg, const char *name)
{
    for (size_t i = 0; i < cfg->n_rules; i++) {
        if (strcmp(cfg->rules[i].name, name) == 0)
            return &cfg->rules[i];
    }
    return NULL;
}

static bool is_shadow(const rl_config *cfg, const rl_rule *r)
{
    return cfg->shadow || r->shadow;
}

/* A `when` override's label and how the diff shows it. */
static void describe_override(const rl_rule *r, const rl_override *o,
                              char *buf, size_t cap)
{
    char when[LINE_MAX_BYTES / 2], rate[96];
    rl_config_diff_when(&o->when, when, sizeof when);
    rl_config_diff_rate(&o->rate, rate, sizeof rate);
    (void)r;
    int n = snprintf(buf, cap, "when %s; %s", when, rate);
    if (n >= (int)cap && cap > 4)
        memcpy(buf + cap - 4, "...", 4); /* a cut is never silent */
}

static const rl_override *when_override_labelled(const rl_rule *r,
                                                 const char *label)
{
    char l[RL_OVERRIDE_NAME_MAX + 1];
    for (size_t i = 0; i < r->n_when_overrides; i++) {
        rl_override_label(r, r->when_overrides[i], l, sizeof l);
        if (strcmp(l, label) == 0)
            return r->when_overrides[i];
    }
    return NULL;
}

static int diff_when_overrides(rl_config_diff *d, const rl_rule *a,
                               const rl_rule *b)
{
    char label[RL_OVERRIDE_NAME_MAX + 1], x[LINE_MAX_BYTES / 2],
        y[LINE_MAX_BYTES / 2];
    int rc = RL_OK;
    for (size_t i = 0; i < b->n_when_overrides && rc == RL_OK; i++) {
        const rl_override *o = b->when_overrides[i];
        rl_override_label(b, o, label, sizeof label);
        const rl_override *old = when_override_labelled(a, label);
        describe_override(b, o, y, sizeof y);
        if (old == NULL) {
            rc = add_line(d, "rule %s: override %s added: %s", b->name,
                          label, y);
        } else if (!same_rate(&old->rate, &o->rate)
                   || !same_when(&old->when, &o->when)) {
            describe_override(a, old, x, sizeof x);
            rc = add_line(d, "rule %s: override %s: %s -> %s", b->name,
                          label, x, y);
        }
    }
    for (size_t i = 0; i < a->n_when_overrides && rc == RL_OK; i++) {
        rl_override_label(a, a->when_overrides[i], label, sizeof label);
        if (when_override_labelled(b, label) == NULL)
            rc = add_line(d, "rule %s: override %s removed", a->name, label);
    }
    return rc;
}

/* --- values overrides, value by value ------------------------------------ */

typedef enum { V_ADDED, V_REMOVED, V_CHANGED, V_KINDS } value_kind;
static const char *const kind_words[V_KINDS] = {"added", "removed",
                                                "changed"};

typedef struct values_walk {
    rl_config_diff *d;
    const rl_rule *self, *other; /* walking self's map, looking in other's */
    bool forward;                /* self is the new rule */
    size_t counts[V_KINDS];
    int rc;
} values_walk;

static bool shown(values_walk *w, value_kind k)
{
    return ++w->counts[k] <= RL_DIFF_VALUES_SHOWN;
}

static bool walk_value(const char *value, size_t len, const rl_override *o,
                       void *arg)
{
    values_walk *w = arg;
    const rl_override *twin = w->other->values != NULL
        ? rl_override_map_find(w->other->values, value, len) : NULL;
    char x[96], y[96];
    int n = len > 200 ? 200 : (int)len;
    if (!w->forward) {
        if (twin == NULL && shown(w, V_REMOVED))
            w->rc = add_line(w->d, "rule %s: value %.*s removed",
                             w->self->name, n, value);
        return w->rc == RL_OK;
    }
    rl_config_diff_rate(&o->rate, y, sizeof y);
    if (twin == NULL) {
        if (shown(w, V_ADDED))
            w->rc = add_line(w->d, "rule %s: value %.*s added: %s",
                             w->self->name, n, value, y);
    } else if (!same_rate(&twin->rate, &o->rate)) {
        rl_config_diff_rate(&twin->rate, x, sizeof x);
        if (shown(w, V_CHANGED))
            w->rc = add_line(w->d, "rule %s: value %.*s: %s -> %s",
                             w->self->name, n, value, x, y);
    }
    return w->rc == RL_OK;
}

static int by_text(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The summary goes before the value lines: the lines are collected into a
 * second diff and appended after it. */
static int diff_values(rl_config_diff *d, const rl_rule *a, const rl_rule *b)
{
    if (a->n_values == 0 && b->n_values == 0)
        return RL_OK;
    rl_config_diff lines = {0};
    values_walk w = {.d = &lines, .self = b, .other = a, .forward = true};
    if (b->values != NULL)
        rl_override_map_each(b->values, walk_value, &w);
    w.self = a;
    w.other = b;
    w.forward = false;
    if (w.rc == RL_OK && a->values != NULL)
        rl_override_map_each(a->values, walk_value, &w);
    int rc = w.rc;
    if (rc == RL_OK && (w.counts[V_ADDED] || w.counts[V_REMOVED]
                        || w.counts[V_CHANGED]))
        rc = add_line(d, "rule %s: values %zu -> %zu (%zu added, %zu "
                      "removed, %zu changed)", b->name, a->n_values,
                      b->n_values, w.counts[V_ADDED], w.counts[V_REMOVED],
                      w.counts[V_CHANGED]);
    /* The map's order is its hash's: sorted, the same change reads the
     * same every time (by value, as the lines start alike). */
    if (lines.n > 0)
        qsort(lines.lines, lines.n, sizeof *lines.lines, by_text);
    for (size_t i = 0; i < lines.n && rc == RL_OK; i++)
        rc = add_line(d, "%s", lines.lines[i]);
    for (int k = 0; k < V_KINDS && rc == RL_OK; k++) {
        if (w.counts[k] > RL_DIFF_VALUES_SHOWN)
            rc = add_line(d, "rule %s: ... and %zu more values %s", b->name,
                          w.counts[k] - RL_DIFF_VALUES_SHOWN, kind_words[k]);
    }
    rl_config_diff_fini(&lines);
    return rc;
}

/* --- one rule ------------------------------------------------------------ */

static int diff_u64(rl_config_diff *d, const rl_rule *b, const char *field,
                    uint64_t x, uint64_t y, bool duration)
{
    if (x == y)
        return RL_OK;
    if (!duration)
        return add_line(d, "rule %s: %s %llu -> %llu", b->name, field,
                        (unsigned long long)x, (unsigned long long)y);
    char px[24], py[24];
    rl_duration_format(x, px, sizeof px);
    rl_duration_format(y, py, sizeof py);
    return add_line(d, "rule %s: %s %s -> %s", b->name, field, px, py);
}

static int diff_word(rl_config_diff *d, const rl_rule *b, const char *field,
                     const char *x, const char *y)
{
    if (strcmp(x, y) == 0)
        return RL_OK;
    return add_line(d, "rule %s: %s %s -> %s", b->name, field, x, y);
}

static int diff_rule(rl_config_diff *d, const rl_config *ca,
                     const rl_rule *a, const rl_config *cb, const rl_rule *b)
{
    size_t before = d->n;
    char x[LINE_MAX_BYTES / 2], y[LINE_MAX_BYTES / 2];
    int rc = diff_word(d, b, "match", a->match, b->match);
    if (rc == RL_OK)
        rc = diff_word(d, b, "key_prefix", a->key_prefix, b->key_prefix);
    /* A co-location tag changes every key the rule makes (buckets start
     * full again under the new keys). */
    if (rc == RL_OK)
        rc = diff_word(d, b, "hash_tag", a->tag_attr[0] ? a->tag_attr : "-",
                       b->tag_attr[0] ? b->tag_attr : "-");
    if (rc == RL_OK && a->unlimited != b->unlimited)
        rc = add_line(d, "rule %s: unlimited %s -> %s", b->name,
                      a->unlimited ? "true" : "false",
                      b->unlimited ? "true" : "false");
    if (rc == RL_OK)
        rc = diff_u64(d, b, "limit", a->limit, b->limit, false);
    if (rc == RL_OK)
        rc = diff_u64(d, b, "period", a->period_ms, b->period_ms, true);
    if (rc == RL_OK)
        rc = diff_u64(d, b, "burst", a->burst, b->burst, false);
    if (rc == RL_OK)
        rc = diff_word(d, b, "mode", rl_mode_name(a->mode),
                       rl_mode_name(b->mode));
    if (rc == RL_OK)
        rc = diff_word(d, b, "algorithm", rl_algorithm_name(a->algorithm),
                       rl_algorithm_name(b->algorithm));
    if (rc == RL_OK)
        rc = diff_word(d, b, "on_error", rl_on_error_name(a->on_error),
                       rl_on_error_name(b->on_error));
    if (rc == RL_OK)
        rc = diff_u64(d, b, "fleet_size", a->fleet_size, b->fleet_size,
                      false);
    if (rc == RL_OK)
        rc = diff_word(d, b, "scope", a->global ? "global" : "region",
                       b->global ? "global" : "region");
    if (rc == RL_OK)
        rc = diff_word(d, b, "shadow", is_shadow(ca, a) ? "true" : "false",
                       is_shadow(cb, b) ? "true" : "false");
    if (rc == RL_OK && !same_when(&a->when, &b->when)) {
        rl_config_diff_when(&a->when, x, sizeof x);
        rl_config_diff_when(&b->when, y, sizeof y);
        rc = add_line(d, "rule %s: when %s -> %s", b->name, x, y);
    }
    if (rc == RL_OK)
        rc = diff_when_overrides(d, a, b);
    if (rc == RL_OK
        && (strcmp(a->overrides_file, b->overrides_file) != 0
            || a->n_file_overrides != b->n_file_overrides))
        rc = add_line(d, "rule %s: overrides_file %s (%zu values) -> %s "
                      "(%zu values)", b->name,
                      a->overrides_file[0] ? a->overrides_file : "none",
                      a->n_file_overrides,
                      b->overrides_file[0] ? b->overrides_file : "none",
                      b->n_file_overrides);
    if (rc == RL_OK)
        rc = diff_values(d, a, b);
    if (rc == RL_OK && d->n > before)
        d->rules_changed++;
    return rc;
}

static int rule_added(rl_config_diff *d, const rl_config *cb,
                      const rl_rule *b)
{
    char rate[96];
    rl_config_diff_rate(&b->own, rate, sizeof rate);
    d->rules_added++;
    return add_line(d, "rule %s added: %s, %s, %s%s", b->name, b->match,
                    rate, rl_mode_name(b->mode),
                    is_shadow(cb, b) ? ", shadow" : "");
}

int rl_config_diff_make(const rl_config *a, const rl_config *b,
                        rl_config_diff *out)
{
    *out = (rl_config_diff){0};
    int rc = RL_OK;
    for (size_t i = 0; i < a->n_rules; i++)
        out->overrides_before += a->rules[i].n_overrides;
    for (size_t i = 0; i < b->n_rules && rc == RL_OK; i++) {
        const rl_rule *rb = &b->rules[i];
        const rl_rule *ra = rule_named(a, rb->name);
        out->overrides_after += rb->n_overrides;
        rc = ra == NULL ? rule_added(out, b, rb)
                        : diff_rule(out, a, ra, b, rb);
    }
    for (size_t i = 0; i < a->n_rules && rc == RL_OK; i++) {
        if (rule_named(b, a->rules[i].name) == NULL) {
            out->rules_removed++;
            rc = add_line(out, "rule %s removed", a->rules[i].name);
        }
    }
    if (rc != RL_OK)
        rl_config_diff_fini(out);
    return rc;
}

void rl_config_diff_fini(rl_config_diff *d)
{
    for (size_t i = 0; i < d->n; i++)
        free(d->lines[i]);
    free(d->lines);
    *d = (rl_config_diff){0};
}
