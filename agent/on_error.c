/*
 * on_error.c: rl_config_decide_on_error, a request decided from the config
 * alone, as a check decides it when neither the store nor an aggregator
 * answers: every rule that applies is unanswered and its on_error decides
 * (decision.c's words for it). For a host that has rules but no agent (one
 * that failed to open): it serves as the rules say it should without their
 * store, and charges nothing.
 */
#include "agent_impl.h"

#include "error.h"
#include "keys.h"
#include "rules.h"

#include <stdlib.h>

int rl_config_decide_on_error(const rl_config *config, const rl_attr *attrs,
                              size_t n, uint32_t cost, rl_decision *out)
{
    if (config == NULL || out == NULL)
        return RL_EINVAL;
    int rc = rl_check_validate(attrs, n, cost);
    if (rc != RL_OK)
        return rc;
    /* At most RL_RULES_MAX rules, one state each. */
    rl_rule_state *states = calloc(config->n_rules > 0 ? config->n_rules : 1,
                                   sizeof *states);
    if (states == NULL)
        return RL_ENOMEM;
    char buf[RL_VALUE_MAX + 1];
    int k = 0;
    for (size_t i = 0; i < config->n_rules; i++) {
        const rl_rule *r = &config->rules[i];
        const char *value;
        size_t len;
        bool applies;
        rc = rl_rule_value(r, attrs, n, config->max_value_bytes, buf,
                           sizeof buf, &value, &len, &applies);
        if (rc != RL_OK)
            break;
        if (!applies)
            continue;
        const rl_override *o = rl_rule_override(r, attrs, n, value, len);
        if (rl_rule_rate(r, o)->unlimited)
            continue;
        /* No fallback bucket: on_error: local's buckets live in an agent,
         * and a rule whose bucket cannot be had allows. */
        states[k++] = (rl_rule_state){.rule = r, .override = o,
                                      .rate = rl_rule_rate(r, o),
                                      .shadow = r->shadow,
                                      .outcome = RL_OUTCOME_FAILED};
    }
    if (rc == RL_OK)
        rl_decide(states, k, out);
    free(states);
    return rc;
}
