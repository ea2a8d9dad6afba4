/*
 * broadcast.c: totals out. Every key whose totals changed during an
 * interval is remembered (the latest totals win) and, once per interval,
 * each rule that needs a fleet size (synced, or on_error: local) gets one
 * TOTALS message on the PUB socket, topic "rule\0", with its changed keys,
 * Redis's clock and the rule's agent count (from counts and from presence
 * reports). A rule with no changes still gets its message: it carries the
 * clock by which agents roll their windows over, and the agent count an
 * on_error: local fallback divides by. When Redis is away the message says
 * so (stale) and carries what was known. A rule whose sub-windows are
 * shorter than the interval gets a LEAVING message after each TOTALS one
 * (wire.h): the counts, read with its keys' totals, of the sub-windows
 * that leave before the next. Every interval too, Redis up or not, one
 * FEATURES message (topic RL_WIRE_FEATURES_TOPIC) says what this
 * aggregator reads.
 *
 * Memory is bounded: at most RL_WIRE_ENTRIES_MAX keys per rule per
 * interval; more are counted as dropped from that broadcast (the agents
 * get them in their acknowledgements anyway).
 */
#include "aggregator.h"

#include "regions.h"

#include <stdlib.h>
#include <string.h>

typedef struct noted {
    uint64_t hash;
    uint64_t window, current, previous;
    uint64_t leaving[RL_WIRE_LEAVING_MAX]; /* read with them */
    uint8_t n_leaving;
    uint16_t value_len;
    char value[RL_WIRE_VALUE_MAX];
} noted;

typedef struct rule_changes {
    noted *slots;        /* open addressing, cap slots */
    size_t cap, used;
    uint64_t agents;     /* the rule's latest agent count */
} rule_changes;

struct rl_broadcast {
    rule_changes *rules; /* by index in the config */
    size_t n_rules;
    uint64_t first_note_ms; /* loop time of the oldest unpublished total */
};

rl_broadcast *rl_broadcast_new(void)
{
    return calloc(1, sizeof(rl_broadcast));
}

void rl_broadcast_free(rl_broadcast *b)
{
    if (b == NULL)
        return;
    for (size_t i = 0; i < b->n_rules; i++)
        free(b->rules[i].slots);
    free(b->rules);
    free(b);
}

static uint64_t hash_bytes(const char *p, size_t len)
{
    uint64_t h = 1469598103934665603ULL; /* FNV-1a */
    for (size_t i = 0; i < len; i++)
        h = (h ^ (unsigned char)p[i]) * 1099511628211ULL;
    return h | 1; /* 0 marks an empty slot */
}

static rule_changes *changes_of(rl_aggregator *agg, const rl_rule *rule)
{
    rl_broadcast *b = agg->broadcast;
    if (b->rules == NULL) {
        b->rules = calloc(agg->config->n_rules, sizeof *b->rules);
        if (b->rules == NULL)
            return NULL;
        b->n_rules = agg->config->n_rules;
    }
    size_t i = (size_t)(rule - agg->config->rules);
    return i < b->n_rules ? &b->rules[i] : NULL;
}

static bool grow(rule_changes *c)
{
    size_t cap = c->cap ? c->cap * 2 : 64;
    noted *slots = calloc(cap, sizeof *slots);
    if (slots == NULL)
        return false;
    for (size_t i = 0; i < c->cap; i++) {
        if (c->slots[i].hash == 0)
            continue;
        size_t j = c->slots[i].hash & (cap - 1);
        while (slots[j].hash != 0)
            j = (j + 1) & (cap - 1);
        slots[j] = c->slots[i];
    }
    free(c->slots);
    c->slots = slots;
    c->cap = cap;
    return true;
}

void rl_broadcast_note(rl_aggregator *agg, const rl_rule *rule,
                       const char *value, size_t value_len,
                       const rl_window_total *t, bool given_back)
{
    uint64_t window = t->window, current = t->current, agents = t->agents;
    rule_changes *c = rule != NULL ? changes_of(agg, rule) : NULL;
    if (c == NULL || value_len > RL_WIRE_VALUE_MAX)
        return;
    if (agg->broadcast->first_note_ms == 0)
        agg->broadcast->first_note_ms = uv_now(agg->loop);
    /* 0: not known (another region's exchange answers so). */
    if (agents > 0)
        c->agents = agents;
    if (c->used * 2 >= c->cap) {
        if (c->used >= RL_WIRE_ENTRIES_MAX || !grow(c)) {
            agg->stats.broadcast_dropped++;
            return;
        }
    }
    uint64_t h = hash_bytes(value, value_len);
    size_t j = h & (c->cap - 1);
    while (c->slots[j].hash != 0
           && !(c->slots[j].hash == h && c->slots[j].value_len == value_len
                && memcmp(c->slots[j].value, value, value_len) == 0))
        j = (j + 1) & (c->cap - 1);
    noted *n = &c->slots[j];
    if (n->hash == 0) {
        c->used++;
        n->hash = h;
        n->value_len = (uint16_t)value_len;
        memcpy(n->value, value, value_len);
    } else if (n->window > window
               || (n->window == window && n->current > current
                   && !given_back)) {
        return; /* an older answer than the one kept */
    }
    n->window = window;
    n->current = current;
    n->previous = t->previous;
    n->n_leaving = (uint8_t)t->n_leaving;
    memcpy(n->leaving, t->leaving, sizeof n->leaving);
}

void rl_broadcast_agents(rl_aggregator *agg, const rl_rule *rule,
                         uint64_t agents)
{
    rule_changes *c = rule != NULL ? changes_of(agg, rule) : NULL;
    if (c != NULL)
        c->agents = agents;
}

void rl_broadcast_carry(rl_aggregator *agg, const rl_config *old,
                        const rl_broadcast *from)
{
    for (size_t i = 0; from != NULL && i < from->n_rules; i++) {
        const char *name = old->rules[i].name;
        const rl_rule *rule = rl_aggregator_fleet_rule(
            agg, (rl_wire_bytes){name, strlen(name)});
        rule_changes *c = rule != NULL ? changes_of(agg, rule) : NULL;
        if (c != NULL)
            c->agents = from->rules[i].agents;
    }
}

/* Publishes what w holds: 0, or nng's error. A subscriber too slow to
 * take it misses it (EAGAIN), as with any PUB socket. */
static int publish(rl_aggregator *agg, const rl_wire_writer *w)
{
    size_t len;
    const void *data = rl_wire_writer_data(w, &len);
    int rv = nng_send(agg->totals, (void *)data, len, NNG_FLAG_NONBLOCK);
    return rv == NNG_EAGAIN ? 0 : rv;
}

static void send_totals(rl_aggregator *agg, const rl_rule *rule,
                        rl_wire_writer *w)
{
    int rv = publish(agg, w);
    if (rv != 0)
        rl_log(&agg->log, RL_LOG_WARN, "totals_not_sent", "rule=%s "
               "reason=\"%s\"", rule->name, nng_strerror(rv));
    else
        agg->stats.totals_published++;
}

/* What this aggregator reads (wire.h, FEATURES), every interval whether
 * Redis is up or not: it does not depend on Redis, and an agent holding
 * counts through an outage behind the aggregator learns before Redis is
 * back that it may send them with their sub-windows. */
static void publish_features(rl_aggregator *agg, rl_wire_writer *w)
{
    rl_wire_writer_reset(w);
    rl_wire_begin_features(w, RL_WIRE_FEATURE_WINDOWS
                                  | RL_WIRE_FEATURE_GOODBYE
                                  | RL_WIRE_FEATURE_GIVEBACK
                                  | RL_WIRE_FEATURE_DEMAND);
    int rv = publish(agg, w);
    if (rv != 0)
        rl_log(&agg->log, RL_LOG_WARN, "features_not_sent",
               "reason=\"%s\"", nng_strerror(rv));
}

/* The noted keys from slot `from` on that fit in one message; *end is the
 * slot after the last of them. */
static size_t chunk(const rl_aggregator *agg, const rule_changes *c,
                    size_t from, size_t *end)
{
    size_t budget = agg->boot_config->aggregator.max_message_bytes - 1024;
    size_t count = 0, bytes = 0, j = from;
    for (; c != NULL && j < c->cap; j++) {
        const noted *n = &c->slots[j];
        if (n->hash == 0)
            continue;
        /* A value, three counts, a share and msgpack's framing; the
         * same bounds the LEAVING entry but for its counts. */
        size_t need = n->value_len + 64 + 9 * n->n_leaving;
        if (count > 0 && bytes + need > budget)
            break;
        bytes += need;
        count++;
    }
    *end = j;
    return count;
}

/* After a TOTALS message of slots from..end, the LEAVING message of those
 * of its keys whose totals name sub-windows after the oldest (wire.h),
 * within the cap too (chunk). */
static void publish_leaving(rl_aggregator *agg, const rl_rule *rule,
                            const rule_changes *c, size_t from, size_t end,
                            rl_wire_writer *w, uint64_t now)
{
    size_t count = 0;
    for (size_t i = from; i < end; i++)
        count += c->slots[i].hash != 0 && c->slots[i].n_leaving > 0;
    if (count == 0)
        return;
    rl_wire_writer_reset(w);
    rl_wire_begin_leaving(w, rule->name, now, count);
    for (size_t i = from; i < end; i++) {
        const noted *n = &c->slots[i];
        if (n->hash != 0 && n->n_leaving > 0)
            rl_wire_put_leaving(w, n->value, n->value_len, n->window,
                                n->leaving, n->n_leaving);
    }
    int rv = publish(agg, w);
    if (rv != 0)
        rl_log(&agg->log, RL_LOG_WARN, "totals_not_sent", "rule=%s "
               "reason=\"%s\"", rule->name, nng_strerror(rv));
}

/* Publishes a rule's changed keys, in as many messages as the message cap
 * needs (agents take each as it comes), or one empty heartbeat. */
static void publish_rule(rl_aggregator *agg, const rl_rule *rule,
                         rule_changes *c, rl_wire_writer *w, uint64_t now,
                         bool stale)
{
    size_t i = 0;
    bool sent = false;
    for (;;) {
        size_t from = i, end, count = chunk(agg, c, i, &end);
        if (count == 0 && sent)
            break;
        rl_wire_writer_reset(w);
        rl_wire_begin_totals(w, rule->name, now, stale, c ? c->agents : 0,
                             count);
        for (; i < end; i++) {
            const noted *n = &c->slots[i];
            if (n->hash == 0)
                continue;
            if (!rule->global) {
                rl_wire_put_total(w, n->value, n->value_len, n->window,
                                  n->current, n->previous, c->agents);
                continue;
            }
            bool cut;
            uint64_t more;
            uint64_t share = rl_regions_share(agg, rule, n->value,
                                              n->value_len, now, &cut,
                                              &more);
            uint64_t recent = more < RL_WIRE_COUNT_MAX - n->current
                                  ? n->current + more : RL_WIRE_COUNT_MAX;
            rl_wire_put_total_share(w, n->value, n->value_len, n->window,
                                    recent, n->previous, c->agents, share,
                                    cut);
        }
        send_totals(agg, rule, w);
        if (c != NULL)
            publish_leaving(agg, rule, c, from, end, w, now);
        sent = true;
        if (c == NULL || i >= c->cap)
            break;
    }
    if (c != NULL && c->cap > 0) {
        memset(c->slots, 0, c->cap * sizeof *c->slots);
        c->used = 0;
    }
}

void rl_broadcast_publish(rl_aggregator *agg)
{
    rl_wire_writer *w = rl_wire_writer_new();
    if (w == NULL)
        return;
    uint64_t now = rl_store_now_ms(agg->store);
    bool stale = !rl_store_up(agg->store);
    rl_broadcast *b = agg->broadcast;
    if (b->first_note_ms != 0)
        rl_metrics_broadcast_lag(agg, uv_now(agg->loop) - b->first_note_ms);
    b->first_note_ms = 0;
    publish_features(agg, w);
    for (size_t i = 0; i < agg->config->n_rules; i++) {
        const rl_rule *rule = &agg->config->rules[i];
        if (rl_rule_needs_fleet(rule) && now != 0)
            publish_rule(agg, rule, changes_of(agg, rule), w, now, stale);
    }
    rl_wire_writer_free(w);
}

size_t rl_broadcast_keys(const rl_aggregator *agg)
{
    const rl_broadcast *b = agg->broadcast;
    size_t n = 0;
    for (size_t i = 0; b != NULL && i < b->n_rules; i++)
        n += b->rules[i].used;
    return n;
}
