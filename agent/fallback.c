/*
 * fallback.c: on_error: local's share of a rule, and its buckets (see
 * fallback.h). The share keeps the rate as two integers, as every rate in
 * rl: limit tokens per (agents x period) is limit / agents per period with
 * no fraction lost, so ten agents' buckets refill the limit exactly; only
 * the capacity is rounded, up, so that a bucket holds at least one token
 * (a cost of 1 can always pass when the bucket is full).
 */
#include "agent_impl.h"

#include <string.h>

uint64_t rl_fallback_agents(const rl_rule *rule, const rl_ident *id)
{
    /* The aggregator's count is what the fleet is now; fleet_size is what
     * the operator said it would be. */
    uint64_t agents = id != NULL ? atomic_load_explicit(&id->agents,
                                                        memory_order_relaxed)
                                 : 0;
    if (agents == 0)
        agents = rule->fleet_size;
    return agents > 0 ? agents : 1;
}

void rl_fallback_rate(const rl_limit *rate, uint64_t agents, rl_limit *out)
{
    if (agents == 0)
        agents = 1;
    /* period_ms x agents: at most 366 days x RL_FLEET_MAX in ms, about
     * 3.2e15, and burst x period stays below 2^64 with the burst divided
     * (local.c counts in uint64_t; the 2^53 bound is Redis's doubles). */
    *out = (rl_limit){.limit = rate->limit,
                      .period_ms = rate->period_ms * agents,
                      .burst = (rate->burst + agents - 1) / agents};
}

bool rl_fallback_spend(rl_local *l, const rl_rule *rule, rl_ident *id,
                       const rl_limit *rate, const char *value, size_t len,
                       uint32_t cost, rl_bucket_reply *out)
{
    rl_limit share;
    rl_fallback_rate(rate, rl_fallback_agents(rule, id), &share);
    bool refused;
    rl_local_check(l, rule, id, &share, value, len, cost, out, &refused);
    return !refused;
}

/* A rule of generation g: its identity (the aggregator's count, and the
 * key of its buckets across reloads). */
static rl_ident *ident_of(const rl_gen *g, const rl_rule *rule)
{
    return g->idents[rule - g->config->rules];
}

static const rl_limit *rate_of(const rl_rule_state *rs)
{
    return rs->rate != NULL ? rs->rate : &rs->rule->own;
}

void rl_fallback_decide(rl_agent *a, const rl_gen *g, rl_rule_state *rs,
                        const char *value, size_t len, uint32_t cost)
{
    if (rs->rule->on_error != RL_ON_ERROR_LOCAL || !a->has_fallback)
        return;
    rl_bucket_reply reply;
    if (!rl_fallback_spend(&a->fallback, rs->rule, ident_of(g, rs->rule),
                           rate_of(rs), value, len, cost, &reply))
        return;
    rs->reply = reply;
    rs->fallback = true;
}

/* The value a request's rule is keyed on: its key past the prefix. */
static void value_of(const rl_request *req, const rl_rule_state *rs,
                     const char **value, size_t *len)
{
    size_t prefix = strlen(rs->rule->key_prefix);
    *value = req->keys + rs->key_offset + prefix;
    *len = rs->key_len - prefix;
}

/* An in_flight rule's share is ceil(N / agents) requests at once of this
 * agent's, counted where its slots are (in_flight.h): a hold admitted
 * here holds its slot there, written to the store by the next renewal
 * once it answers, and released as any other. */
static void decide_slot(rl_agent *a, rl_request *req, rl_rule_state *rs)
{
    uint64_t agents = rl_fallback_agents(rs->rule, ident_of(req->gen,
                                                            rs->rule));
    uint64_t n = rate_of(rs)->limit;
    uint64_t share = (n + agents - 1) / agents;
    const char *key = req->keys + rs->key_offset;
    uint64_t held = rl_in_flight_held(&a->in_flight, key, rs->key_len);
    bool allowed = held + 1 <= share;
    if (allowed && req->takes_slots) {
        rl_in_flight_taking(&a->in_flight, key, rs->key_len);
        rl_in_flight_taken(&a->in_flight, key, rs->key_len, true);
        rs->slot_taken = true;
        held++;
    }
    rs->reply = (rl_bucket_reply){
        .allowed = allowed,
        .remaining = share > held ? share - held : 0,
        .retry_ms = allowed ? 0 : RL_IN_FLIGHT_RETRY_MS};
    rs->fallback = true;
}

void rl_fallback_decide_key(rl_agent *a, rl_request *req, rl_rule_state *rs)
{
    if (rs->rule->mode == RL_MODE_IN_FLIGHT) {
        if (rs->rule->on_error == RL_ON_ERROR_LOCAL)
            decide_slot(a, req, rs);
        return;
    }
    const char *value;
    size_t len;
    value_of(req, rs, &value, &len);
    rl_fallback_decide(a, req->gen, rs, value, len, req->cost);
}

bool rl_fallback_answer(void *arg, const rl_rule_state *rs,
                        rl_bucket_reply *out)
{
    const rl_request *req = arg;
    rl_agent *a = req->agent;
    /* An in_flight rule's share is counted on the I/O thread, which this
     * caller gave up on: it allows, as a rule without a bucket does. */
    if (rs->rule->on_error != RL_ON_ERROR_LOCAL || !a->has_fallback
        || rs->rule->mode == RL_MODE_IN_FLIGHT)
        return false;
    const char *value;
    size_t len;
    value_of(req, rs, &value, &len);
    return rl_fallback_spend(&a->fallback, rs->rule,
                             ident_of(req->gen, rs->rule), rate_of(rs),
                             value, len, req->cost, out);
}
