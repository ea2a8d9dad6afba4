/*
 * gen.c: making and freeing a generation of rules (see gen.h).
 */
#include "gen.h"

#include <stdlib.h>
#include <string.h>

int rl_gen_new(const rl_config *config, rl_config *owned, rl_ident **idents,
               rl_gen **out)
{
    *out = NULL;
    rl_gen *g = calloc(1, sizeof *g);
    if (g == NULL)
        return RL_ENOMEM;
    g->config = config;
    size_t n = config->n_rules;
    g->args = calloc(n > 0 ? n : 1, sizeof *g->args);
    g->idents = calloc(n > 0 ? n : 1, sizeof *g->idents);
    if (g->args == NULL || g->idents == NULL
        || rl_stats_init(&g->stats, n) != RL_OK)
        goto fail;
    bool other = false;
    for (size_t i = 0; i < n; i++) {
        const rl_rule *r = &config->rules[i];
        rl_bucket_args_init(&g->args[i], r);
        g->by_value |= g->args[i].by_value;
        other |= !g->args[i].plain && !g->args[i].by_value;
        if ((g->idents[i] = rl_idents_take(idents, r)) == NULL)
            goto fail;
        g->has_synced |= r->mode == RL_MODE_SYNCED;
        g->has_local |= r->mode == RL_MODE_LOCAL;
        g->has_exact |= rl_mode_stored(r->mode);
        g->has_fallback |= r->on_error == RL_ON_ERROR_LOCAL;
        g->has_leased |= r->mode == RL_MODE_LEASED;
        g->needs_sync |= r->mode == RL_MODE_SYNCED
                         || (r->on_error == RL_ON_ERROR_LOCAL
                             && r->fleet_size == 0)
                         || (r->mode == RL_MODE_LEASED
                             && config->aggregator.given);
    }
    g->by_value &= !other;
    atomic_init(&g->refs, 0);
    g->owned = owned;
    *out = g;
    return RL_OK;
fail:
    rl_gen_free(g);
    return RL_ENOMEM;
}

void rl_gen_free(rl_gen *g)
{
    if (g == NULL)
        return;
    for (size_t i = 0; g->idents != NULL && i < g->config->n_rules; i++) {
        if (g->idents[i] != NULL)
            rl_ident_unref(g->idents[i]);
    }
    if (g->stats.shared != NULL)
        rl_stats_fini(&g->stats);
    free(g->idents);
    free(g->args);
    rl_config_free(g->owned);
    free(g);
}

void rl_rule_counters_add(rl_rule_counters *into, const rl_rule_counters *c)
{
    into->checks += c->checks;
    into->allowed += c->allowed;
    into->rejected += c->rejected;
    into->degraded += c->degraded;
    into->shadow_rejected += c->shadow_rejected;
    into->fallback_allowed += c->fallback_allowed;
    into->fallback_rejected += c->fallback_rejected;
}

void rl_gen_add_stats(const rl_gen *g, rl_agent_counters *requests,
                      void (*each)(rl_ident *id, const rl_rule_counters *c,
                                   void *arg),
                      void *arg)
{
    size_t n = g->config->n_rules;
    rl_rule_counters *rules = calloc(n > 0 ? n : 1, sizeof *rules);
    rl_agent_counters c;
    memset(&c, 0, sizeof c);
    rl_stats_read(&g->stats, &c, rules, rules != NULL ? n : 0);
    requests->requests += c.requests;
    requests->allowed += c.allowed;
    requests->rejected += c.rejected;
    requests->degraded += c.degraded;
    for (size_t i = 0; rules != NULL && i < n; i++)
        each(g->idents[i], &rules[i], arg);
    free(rules);
}

static void keep_in_ident(rl_ident *id, const rl_rule_counters *c, void *arg)
{
    (void)arg;
    rl_rule_counters_add(&id->retired, c);
}

void rl_gen_fold_stats(rl_gen *g, rl_agent_counters *requests)
{
    rl_gen_add_stats(g, requests, keep_in_ident, NULL);
}
