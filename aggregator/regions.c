/*
 * regions.c: see regions.h.
 */
#include "regions.h"

#include "demand.h"
#include "exchange.h"

#include <stdio.h>
#include <string.h>

int rl_regions_start(rl_aggregator *agg, char *err, size_t errlen)
{
    const rl_config *c = agg->boot_config;
    if (c->regions.n == 0)
        return 0;
    agg->demand = rl_demand_new(c->regions.n, c->aggregator.max_keys);
    if (agg->demand == NULL) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    return rl_exchange_start(agg, err, errlen);
}

void rl_regions_stop(rl_aggregator *agg)
{
    rl_exchange_stop(agg);
    rl_demand_free(agg->demand);
    agg->demand = NULL;
}

/* The requests an entry says its region was offered: admitted (a
 * give-back's estimate was admitted too) and refused. */
static void note(rl_aggregator *agg, const rl_rule *rule,
                 const rl_wire_entry *e, size_t r, uint64_t at_ms)
{
    uint64_t g = rl_wire_subwindow_ms(rule->period_ms);
    if (!rl_demand_note(agg->demand, rule->name, e->value.ptr, e->value.len,
                        r, at_ms / g, e->count + e->refused)
        && rl_demand_refused(agg->demand) == 1)
        rl_log(&agg->log, RL_LOG_WARN, "demand_keys_capped",
               "max_keys=%u reason=\"keys beyond it split their room "
               "evenly among the regions\"",
               agg->boot_config->aggregator.max_keys);
}

void rl_regions_local_count(rl_aggregator *agg, const rl_rule *rule,
                            const rl_wire_entry *e, uint64_t now_ms)
{
    if (agg->demand == NULL)
        return;
    rl_exchange_count(agg, rule, e, now_ms);
    note(agg, rule, e, agg->boot_config->regions.self,
         e->at_ms > 0 ? e->at_ms : now_ms);
}

void rl_regions_note_demand(rl_aggregator *agg, const rl_rule *rule,
                            const rl_wire_entry *e, size_t r)
{
    if (agg->demand != NULL)
        note(agg, rule, e, r, e->at_ms);
}

uint64_t rl_regions_share(rl_aggregator *agg, const rl_rule *rule,
                          const char *value, size_t value_len,
                          uint64_t now_ms, bool *cut)
{
    *cut = rl_exchange_cut(agg);
    if (agg->demand == NULL)
        return RL_WIRE_SHARE_WHOLE;
    uint64_t g = rl_wire_subwindow_ms(rule->period_ms);
    return rl_demand_share(agg->demand, rule->name, value, value_len,
                           agg->boot_config->regions.self, now_ms / g, *cut);
}

/* A demand key's rule's sub-window length, 0 once the rule is gone. */
static uint64_t g_of(void *arg, const char *name)
{
    rl_aggregator *agg = arg;
    const rl_rule *rule = rl_aggregator_rule(
        agg, (rl_wire_bytes){name, strlen(name)});
    return rule != NULL ? rl_wire_subwindow_ms(rule->period_ms) : 0;
}

void rl_regions_sweep(rl_aggregator *agg, uint64_t now_ms)
{
    if (agg->demand != NULL && now_ms > 0)
        rl_demand_sweep(agg->demand, now_ms, g_of, agg);
}
