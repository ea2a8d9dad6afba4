/*
 * rlctl_explain.c: see rlctl_explain.h.
 */
#include "rlctl_explain.h"

#include "config_diff.h"
#include "rlctl_json.h"
#include "rules.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

void rlctl_explain_rule(const rl_config *cfg, const rl_rule *rule,
                        const rl_attr *attrs, size_t n, rlctl_explain *out)
{
    memset(out, 0, sizeof *out);
    out->rule = rule;
    out->shadow = cfg->shadow || rule->shadow;
    for (size_t i = 0; i < rule->n_parts && out->missing == NULL; i++) {
        if (rl_attr_find(attrs, n, rule->parts[i]) == NULL)
            out->missing = rule->parts[i];
    }
    char buf[RL_VALUE_MAX + 1];
    const char *value = NULL;
    size_t len = 0;
    bool applies = false;
    out->rc = rl_rule_value(rule, attrs, n, cfg->max_value_bytes, buf,
                            sizeof buf, &value, &len, &applies);
    out->applies = out->rc == RL_OK && applies;
    if (out->applies) {
        snprintf(out->value, sizeof out->value, "%.*s", (int)len, value);
        out->override = rl_rule_override(rule, attrs, n, value, len);
    }
    rl_override_label(rule, out->override, out->label, sizeof out->label);
    out->effective = *rule;
    out->effective.own = *rl_rule_rate(rule, out->override);
}

/* One clause as the config writes it, as config_diff does. */
static void clause_text(const rl_when_clause *c, char *buf, size_t cap)
{
    rl_when one = {(rl_when_clause *)c, 1};
    rl_config_diff_when(&one, buf, cap);
}

static void clauses(const rl_when *w, const rl_attr *attrs, size_t n,
                    char *buf, size_t cap)
{
    char text[512];
    for (size_t i = 0; i < w->n; i++) {
        const rl_when_clause *c = &w->clauses[i];
        clause_text(c, text, sizeof text);
        bool held = rl_when_clause_holds(c, attrs, n);
        rl_config_diff_append(buf, cap, "%swhen %s: %s", i ? "; " : "", text,
               held ? "held" : "not held");
        if (!held) {
            const rl_attr *a = rl_attr_find(attrs, n, c->attr);
            if (a != NULL)
                rl_config_diff_append(buf, cap, " (%s=%.*s)", c->attr,
                       (int)(a->value_len > 128 ? 128 : a->value_len),
                       a->value);
            else
                rl_config_diff_append(buf, cap, " (no %s)", c->attr);
        }
    }
}

void rlctl_explain_why(const rlctl_explain *e, const rl_attr *attrs,
                       size_t n, char *buf, size_t cap)
{
    buf[0] = '\0';
    const rl_rule *r = e->rule;
    if (e->missing != NULL) {
        rl_config_diff_append(buf, cap, "not applied: no %s in the request",
                              e->missing);
        return;
    }
    if (e->rc != RL_OK) {
        rl_config_diff_append(buf, cap, "refused: %s", rl_strerror(e->rc));
        return;
    }
    if (!e->applies) {
        rl_config_diff_append(buf, cap, "not applied: ");
        clauses(&r->when, attrs, n, buf, cap);
        return;
    }
    rl_config_diff_append(buf, cap, "applies");
    if (r->when.n > 0) {
        rl_config_diff_append(buf, cap, " (");
        clauses(&r->when, attrs, n, buf, cap);
        rl_config_diff_append(buf, cap, ")");
    }
    rl_config_diff_append(buf, cap, ", override %s", e->label);
    if (e->override != NULL && e->override->when.n > 0) {
        rl_config_diff_append(buf, cap, " (");
        clauses(&e->override->when, attrs, n, buf, cap);
        rl_config_diff_append(buf, cap, ")");
    }
    char rate[96];
    rl_config_diff_rate(rl_rule_rate(r, e->override), rate, sizeof rate);
    rl_config_diff_append(buf, cap, ": %s%s", rate,
                          e->shadow ? ", shadow" : "");
}

void rlctl_explain_json(const rlctl_explain *e, const rl_attr *attrs,
                        size_t n)
{
    printf("\"applies\":%s,\"missing\":", e->applies ? "true" : "false");
    if (e->missing != NULL)
        rlctl_json_string(e->missing);
    else
        printf("null");
    printf(",\"when\":[");
    char text[512];
    for (size_t i = 0; i < e->rule->when.n; i++) {
        const rl_when_clause *c = &e->rule->when.clauses[i];
        clause_text(c, text, sizeof text);
        printf("%s{\"clause\":", i ? "," : "");
        rlctl_json_string(text);
        printf(",\"held\":%s}",
               rl_when_clause_holds(c, attrs, n) ? "true" : "false");
    }
    printf("],\"override\":");
    rlctl_json_string(e->label);
    printf(",\"shadow\":%s", e->shadow ? "true" : "false");
}
