/*
 * rlctl_config.c: see rlctl_config.h. A values override's values live in
 * the rule's hash map only: one pass over it counts them per override.
 */
#include "rlctl_config.h"

#include "config_diff.h"
#include "rlctl_json.h"
#include "rules.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct counting {
    const rl_rule *rule;
    size_t *per_override;    /* by index in rule->overrides */
} counting;

static bool count_value(const char *value, size_t len, const rl_override *o,
                        void *arg)
{
    counting *c = arg;
    (void)value;
    (void)len;
    size_t i = (size_t)(o - c->rule->overrides);
    if (i < c->rule->n_overrides)
        c->per_override[i]++;
    return true;
}

/* Values per override of r; NULL when out of memory (or none). */
static size_t *values_per_override(const rl_rule *r)
{
    size_t *per = calloc(r->n_overrides + 1, sizeof *per);
    if (per != NULL && r->values != NULL) {
        counting c = {r, per};
        rl_override_map_each(r->values, count_value, &c);
    }
    return per;
}

static bool is_shadow(const rl_config *cfg, const rl_rule *r)
{
    return cfg->shadow || r->shadow;
}

void rlctl_config_print_overrides(const rl_config *cfg)
{
    bool any = false;
    for (size_t i = 0; i < cfg->n_rules; i++) {
        const rl_rule *r = &cfg->rules[i];
        if (r->n_overrides == 0)
            continue;
        if (!any)
            printf("\noverrides (first match wins):\n%-20s %-20s %-34s %s\n",
                   "RULE", "OVERRIDE", "APPLIES TO", "RATE");
        any = true;
        size_t *per = values_per_override(r);
        char label[RL_OVERRIDE_NAME_MAX + 1], what[512], rate[96];
        for (size_t k = 0; k < r->n_overrides; k++) {
            const rl_override *o = &r->overrides[k];
            if (o->line != 0)
                continue; /* the file's lines: one row below */
            rl_override_label(r, o, label, sizeof label);
            if (o->when.n > 0) {
                char when[480];
                rl_config_diff_when(&o->when, when, sizeof when);
                snprintf(what, sizeof what, "when %s", when);
            } else {
                size_t nv = per != NULL ? per[k] : 0;
                snprintf(what, sizeof what, "%zu value%s", nv,
                         nv == 1 ? "" : "s");
            }
            rl_config_diff_rate(&o->rate, rate, sizeof rate);
            printf("%-20s %-20s %-34s %s\n", r->name, label, what, rate);
        }
        if (r->overrides_file[0] != '\0') {
            snprintf(what, sizeof what, "%zu value%s (one per line)",
                     r->n_file_overrides,
                     r->n_file_overrides == 1 ? "" : "s");
            printf("%-20s %-20s %-34s %s\n", r->name, r->overrides_file,
                   what, "per line");
        }
        free(per);
    }
    printf("\nshadow:      ");
    if (cfg->shadow) {
        printf("every rule (shadow: true)\n");
        return;
    }
    bool first = true;
    for (size_t i = 0; i < cfg->n_rules; i++) {
        if (!is_shadow(cfg, &cfg->rules[i]))
            continue;
        printf("%s%s", first ? "" : ", ", cfg->rules[i].name);
        first = false;
    }
    printf("%s\n", first ? "none" : "");
}

void rlctl_config_json_overrides(const rl_config *cfg, const rl_rule *r)
{
    printf(",\"shadow\":%s,\"overrides\":[",
           is_shadow(cfg, r) ? "true" : "false");
    size_t *per = values_per_override(r);
    char label[RL_OVERRIDE_NAME_MAX + 1], when[480];
    bool first = true;
    for (size_t k = 0; k < r->n_overrides; k++) {
        const rl_override *o = &r->overrides[k];
        if (o->line != 0)
            continue;
        rl_override_label(r, o, label, sizeof label);
        printf("%s{\"override\":", first ? "" : ",");
        rlctl_json_string(label);
        printf(",\"when\":");
        if (o->when.n > 0) {
            rl_config_diff_when(&o->when, when, sizeof when);
            rlctl_json_string(when);
        } else {
            printf("null");
        }
        printf(",\"values\":%zu,\"unlimited\":%s,\"limit\":%llu,"
               "\"period_ms\":%llu,\"burst\":%llu}",
               o->when.n == 0 && per != NULL ? per[k] : 0,
               o->rate.unlimited ? "true" : "false",
               (unsigned long long)o->rate.limit,
               (unsigned long long)o->rate.period_ms,
               (unsigned long long)o->rate.burst);
        first = false;
    }
    free(per);
    printf("],\"overrides_file\":");
    if (r->overrides_file[0] != '\0')
        rlctl_json_string(r->overrides_file);
    else
        printf("null");
    printf(",\"file_overrides\":%zu", r->n_file_overrides);
}

int rlctl_config_diff(const rl_config *cur, const char *cur_path,
                      const rl_config *next, const char *next_path,
                      bool json)
{
    rl_config_diff d;
    if (rl_config_diff_make(cur, next, &d) != RL_OK) {
        fprintf(stderr, "rlctl: out of memory\n");
        return -1;
    }
    if (json) {
        printf("{\"from\":");
        rlctl_json_string(cur_path);
        printf(",\"to\":");
        rlctl_json_string(next_path);
        printf(",\"changed\":%s,\"rules_added\":%zu,\"rules_removed\":%zu,"
               "\"rules_changed\":%zu,\"overrides_before\":%zu,"
               "\"overrides_after\":%zu,\"changes\":[",
               d.n > 0 ? "true" : "false", d.rules_added, d.rules_removed,
               d.rules_changed, d.overrides_before, d.overrides_after);
        for (size_t i = 0; i < d.n; i++) {
            printf("%s", i ? "," : "");
            rlctl_json_string(d.lines[i]);
        }
        printf("]}\n");
    } else {
        printf("diff:        %s -> %s\n", cur_path, next_path);
        for (size_t i = 0; i < d.n; i++)
            printf("%s\n", d.lines[i]);
        if (d.n == 0)
            printf("no change: a reload would keep every rule as it is\n");
        else
            printf("summary:     %zu rule%s added, %zu removed, %zu "
                   "changed; overrides %zu -> %zu\n", d.rules_added,
                   d.rules_added == 1 ? "" : "s", d.rules_removed,
                   d.rules_changed, d.overrides_before, d.overrides_after);
    }
    int changed = d.n > 0;
    rl_config_diff_fini(&d);
    return changed;
}
