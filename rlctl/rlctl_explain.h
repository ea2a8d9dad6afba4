/*
 * rlctl_explain.h: why a rule does or does not apply to a request and at
 * which rate: the parts of its key present or not, each clause of its
 * `when` held or not, the override that set the rate (or "default"). It
 * asks common/rules.h, as the agent does, so rlctl says what the agent
 * does. Private to rlctl.
 */
#ifndef RL_RLCTL_EXPLAIN_H
#define RL_RLCTL_EXPLAIN_H

#include "config.h"

#include <stdbool.h>
#include <stddef.h>

typedef struct rlctl_explain {
    const rl_rule *rule;
    bool applies;
    int rc;                  /* RL_OK, or rl_rule_value's error */
    const char *missing;     /* a part of the key not in the request */
    char value[RL_VALUE_MAX + 1]; /* the key's value, NUL-terminated */
    const rl_override *override;  /* NULL: the rule's own rate */
    char label[RL_OVERRIDE_NAME_MAX + 1]; /* rl_override_label's */
    bool shadow;             /* never rejects */
    /* The rule with the rate that applies as its own, for rlctl_view. */
    rl_rule effective;
} rlctl_explain;

/* Fills *out for rule against the request's attributes. */
void rlctl_explain_rule(const rl_config *cfg, const rl_rule *rule,
                        const rl_attr *attrs, size_t n, rlctl_explain *out);

/* One line on why: "applies, override LABEL", "applies (when ...: held),
 * override ...", "not applied: no ATTR in the request", "not applied: when
 * method: POST: held; when path: /v1/login: not held (path=/v2)". */
void rlctl_explain_why(const rlctl_explain *e, const rl_attr *attrs,
                       size_t n, char *buf, size_t cap);

/* The same as JSON fields (no braces) on stdout:
 * "applies":B,"missing":S|null,"when":[{"clause":S,"held":B}...],
 * "override":S,"shadow":B */
void rlctl_explain_json(const rlctl_explain *e, const rl_attr *attrs,
                        size_t n);

#endif
