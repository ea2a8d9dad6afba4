/*
 * regions.c: see regions.h.
 */
#include "regions.h"

#include "demand.h"
#include "exchange.h"
#include "resp.h"

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
                        r, at_ms / g, e->count, e->refused)
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

static void on_viewed(void *arg, const redisReply *r, const char *error)
{
    rl_aggregator *agg = arg;
    if (r == NULL && agg->store != NULL)
        rl_log(&agg->log, RL_LOG_DEBUG, "region_view_not_written",
               "reason=\"%s\"", error);
}

void rl_regions_applied(rl_aggregator *agg, size_t r,
                        const rl_wire_entry *entries, size_t n)
{
    bool cluster = rl_store_is_cluster(agg->store);
    const char *region = agg->boot_config->regions.regions[r].name;
    for (size_t i = 0; i < n; i++) {
        const rl_wire_entry *e = &entries[i];
        /* By name: a reload while the exchange was at Redis frees the
         * rules it had. */
        const rl_rule *rule = rl_aggregator_rule(agg, e->rule);
        if (rule == NULL || e->count == e->back)
            continue;
        uint64_t g = rl_wire_subwindow_ms(rule->period_ms);
        char key[RL_PREFIX_MAX + RL_WIRE_VALUE_MAX + RL_REGION_NAME_MAX + 40];
        char delta[24], ttl[24];
        int len = snprintf(key, sizeof key, "%s%s%.*s%s:r:%s:%llu",
                           cluster ? "{" : "", rule->key_prefix,
                           (int)e->value.len, e->value.ptr,
                           cluster ? "}" : "", region,
                           (unsigned long long)(e->at_ms / g));
        size_t delta_len = rl_resp_decimal(delta, (long long)e->count
                                                      - (long long)e->back);
        size_t ttl_len = rl_resp_decimal(ttl,
                                         (long long)(2 * rule->period_ms));
        rl_store_run(agg->store, RL_NODE_RAW, 3,
                     (const char *[]){"INCRBY", key, delta},
                     (size_t[]){6, (size_t)len, delta_len}, on_viewed, agg);
        rl_store_run(agg->store, RL_NODE_RAW, 3,
                     (const char *[]){"PEXPIRE", key, ttl},
                     (size_t[]){7, (size_t)len, ttl_len}, on_viewed, agg);
    }
}

uint64_t rl_regions_share(rl_aggregator *agg, const rl_rule *rule,
                          const char *value, size_t value_len,
                          uint64_t now_ms, bool *cut, uint64_t *more)
{
    *cut = rl_exchange_cut(agg);
    *more = 0;
    if (agg->demand == NULL)
        return RL_WIRE_SHARE_WHOLE;
    const rl_regions_config *rc = &agg->boot_config->regions;
    uint64_t g = rl_wire_subwindow_ms(rule->period_ms);
    uint64_t since = rl_exchange_snapshot_ms(agg);
    /* Every region's demand as of the others' last exchanges, this
     * one's too: the others see theirs so, and parts worked out from one
     * moment's demand add up to the room. */
    uint64_t parts[RL_REGIONS_MAX];
    rl_demand_parts(agg->demand, rule->name, value, value_len,
                    (since > 0 ? since : now_ms) / g, *cut, parts);
    uint64_t share = parts[rc->self];
    if (share == 0)
        return 0;
    /* Region r gives out its part of the room as it sees it, and it does
     * not see what this region admitted that its totals do not carry yet:
     * r's part of that would be given out again. So this region's agents
     * take it off their room: the sum, over the others, of their part of
     * what each has not heard, which agents working out
     * share × (limit − recent − oldest) take off when recent carries that
     * sum over share more (rounded up). With every region so, the parts
     * given out add up to the room (docs/regions.md). */
    unsigned __int128 owed = 0;
    for (size_t r = 0; r < rc->n; r++)
        if (r != rc->self)
            owed += (unsigned __int128)parts[r]
                    * rl_exchange_unheard(agg, r, rule, value, value_len,
                                          now_ms);
    *more = (uint64_t)((owed + share - 1) / share);
    return share;
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
