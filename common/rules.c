/*
 * rules.c: what a rule makes of a request (see rules.h): whether it
 * applies, the value it keys on, and the override whose rate applies.
 * Called on every check for every rule, so nothing here allocates, and an
 * override is one hash lookup plus the rule's few `when` overrides.
 */
#include "rules.h"

#include "keys.h"

#include <stdio.h>
#include <string.h>

const rl_attr *rl_attr_find(const rl_attr *attrs, size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++) {
        if (strcmp(attrs[i].name, name) == 0)
            return &attrs[i];
    }
    return NULL;
}

bool rl_when_clause_holds(const rl_when_clause *c, const rl_attr *attrs,
                          size_t n)
{
    const rl_attr *a = rl_attr_find(attrs, n, c->attr);
    if (a == NULL)
        return false;
    switch (c->op) {
    case RL_WHEN_PREFIX:
        return a->value_len >= c->lens[0]
               && memcmp(a->value, c->values[0], c->lens[0]) == 0;
    case RL_WHEN_EQUAL:
    case RL_WHEN_ANY:
        for (size_t i = 0; i < c->n_values; i++) {
            if (a->value_len == c->lens[i]
                && memcmp(a->value, c->values[i], c->lens[i]) == 0)
                return true;
        }
        return false;
    }
    return false;
}

bool rl_when_holds(const rl_when *w, const rl_attr *attrs, size_t n)
{
    for (size_t i = 0; i < w->n; i++) {
        if (!rl_when_clause_holds(&w->clauses[i], attrs, n))
            return false;
    }
    return true;
}

/* An attribute value a key may carry: not empty, no NUL, not too long. */
static int check_value(const rl_attr *a, uint32_t max_value_bytes)
{
    if (a->value_len > max_value_bytes)
        return RL_ETOOLONG;
    if (a->value_len == 0 || rl_key_has_nul(a->value, a->value_len))
        return RL_EINVAL;
    return RL_OK;
}

/* Appends "<len>:<bytes>" (in braces when tagged) at buf + *at. */
static int encode_part(const rl_attr *a, bool tagged, bool first, char *buf,
                       size_t cap, size_t *at)
{
    char head[24];
    int n = snprintf(head, sizeof head, "%s%s%zu:", first ? "" : ":",
                     tagged ? "{" : "", a->value_len);
    size_t need = (size_t)n + a->value_len + (tagged ? 1 : 0);
    if (*at + need > RL_VALUE_MAX)
        return RL_ETOOLONG;
    if (*at + need + 1 > cap)
        return RL_ETOOLONG;
    memcpy(buf + *at, head, (size_t)n);
    memcpy(buf + *at + n, a->value, a->value_len);
    *at += (size_t)n + a->value_len;
    if (tagged)
        buf[(*at)++] = '}';
    buf[*at] = '\0';
    return RL_OK;
}

int rl_rule_value(const rl_rule *rule, const rl_attr *attrs, size_t n,
                  uint32_t max_value_bytes, char *buf, size_t cap,
                  const char **value, size_t *len, bool *applies)
{
    const rl_attr *parts[RL_MATCH_MAX];
    *applies = false;
    for (size_t i = 0; i < rule->n_parts; i++) {
        if ((parts[i] = rl_attr_find(attrs, n, rule->parts[i])) == NULL)
            return RL_OK;
    }
    if (!rl_when_holds(&rule->when, attrs, n))
        return RL_OK;
    for (size_t i = 0; i < rule->n_parts; i++) {
        int rc = check_value(parts[i], max_value_bytes);
        if (rc != RL_OK)
            return rc;
    }
    if (rule->n_parts == 1) {
        *value = parts[0]->value;
        *len = parts[0]->value_len;
        *applies = true;
        return RL_OK;
    }
    /* The tagged part goes first, so that its '{' is the key's first one
     * whatever bytes the other parts hold: Redis Cluster hashes on the
     * first {...} of a key. The order is the rule's, fixed, so the
     * encoding stays one-to-one. */
    size_t at = 0;
    bool first = true;
    if (rule->hash_tag >= 0) {
        int rc = encode_part(parts[rule->hash_tag], true, true, buf, cap,
                             &at);
        if (rc != RL_OK)
            return rc;
        first = false;
    }
    for (size_t i = 0; i < rule->n_parts; i++) {
        if ((int)i == rule->hash_tag)
            continue;
        int rc = encode_part(parts[i], false, first, buf, cap, &at);
        if (rc != RL_OK)
            return rc;
        first = false;
    }
    *value = buf;
    *len = at;
    *applies = true;
    return RL_OK;
}

const rl_override *rl_rule_override(const rl_rule *rule, const rl_attr *attrs,
                                    size_t n, const char *value, size_t len)
{
    const rl_override *v = rl_override_map_find(rule->values, value, len);
    /* The `when` overrides before v in order get the first say. */
    for (size_t i = 0; i < rule->n_when_overrides; i++) {
        const rl_override *o = rule->when_overrides[i];
        if (v != NULL && o->order > v->order)
            break;
        if (rl_when_holds(&o->when, attrs, n))
            return o;
    }
    return v;
}

void rl_override_label(const rl_rule *rule, const rl_override *o, char *buf,
                       size_t cap)
{
    int n;
    if (cap == 0)
        return;
    if (o == NULL)
        n = snprintf(buf, cap, "default");
    else if (o->name != NULL)
        n = snprintf(buf, cap, "%s", o->name);
    else if (o->line == 0)
        n = snprintf(buf, cap, "overrides[%u]", o->order);
    else
        n = snprintf(buf, cap, "%s:%u", rule->overrides_file, o->line);
    if (n >= 0 && (size_t)n >= cap && cap >= 4)
        memcpy(buf + cap - 4, "...", 4);
}
