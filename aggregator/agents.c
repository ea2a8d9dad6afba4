/*
 * agents.c: the agents this aggregator hears from: id, address, the time
 * of the last report (Redis's clock), how many keys it carried, how many
 * reports so far. A table of at most aggregator.max_agents; an agent not
 * heard for AGENT_FORGET_MS gives its place up to a new one, and a new
 * agent that finds the table full of live ones is refused (and counted).
 * Loop thread only.
 */
#include "aggregator.h"

#include "keys.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define AGENT_FORGET_MS 60000

typedef struct rl_agent_seen {
    bool used;
    char id[RL_WIRE_ID_MAX + 1];
    char peer[160];
    uint64_t last_ms, keys, reports;
} rl_agent_seen;

struct rl_agents {
    rl_agent_seen *slots;  /* open addressing */
    size_t cap, used;
};

static size_t slot_of(const rl_agents *t, const char *id, size_t len)
{
    return rl_key_hash(0, id, len) & (t->cap - 1);
}

int rl_agents_init(rl_aggregator *agg)
{
    rl_agents *t = calloc(1, sizeof *t);
    size_t cap = 16;
    while (cap < 2 * (size_t)agg->boot_config->aggregator.max_agents)
        cap *= 2;
    if (t != NULL)
        t->slots = calloc(cap, sizeof *t->slots);
    if (t == NULL || t->slots == NULL) {
        free(t);
        return -1;
    }
    t->cap = cap;
    agg->agents = t;
    return 0;
}

void rl_agents_free(rl_aggregator *agg)
{
    if (agg->agents != NULL)
        free(agg->agents->slots);
    free(agg->agents);
    agg->agents = NULL;
}

/* Drops agents not heard for a while, rebuilding the table in place. */
static void forget_old(rl_agents *t, uint64_t now_ms)
{
    rl_agent_seen *old = t->slots;
    rl_agent_seen *fresh = calloc(t->cap, sizeof *fresh);
    if (fresh == NULL)
        return;
    t->used = 0;
    for (size_t i = 0; i < t->cap; i++) {
        if (!old[i].used || now_ms - old[i].last_ms > AGENT_FORGET_MS)
            continue;
        size_t j = slot_of(t, old[i].id, strlen(old[i].id));
        while (fresh[j].used)
            j = (j + 1) & (t->cap - 1);
        fresh[j] = old[i];
        t->used++;
    }
    free(old);
    t->slots = fresh;
}

int rl_agents_note(rl_aggregator *agg, const rl_wire_msg *m,
                   const char *peer, uint64_t now_ms)
{
    rl_agents *t = agg->agents;
    const char *id = m->agent_id.ptr;
    size_t len = m->agent_id.len;
    size_t j = slot_of(t, id, len);
    while (t->slots[j].used
           && !(strlen(t->slots[j].id) == len
                && memcmp(t->slots[j].id, id, len) == 0))
        j = (j + 1) & (t->cap - 1);
    rl_agent_seen *a = &t->slots[j];
    if (!a->used) {
        if (t->used >= agg->boot_config->aggregator.max_agents) {
            forget_old(t, now_ms);
            if (t->used >= agg->boot_config->aggregator.max_agents)
                return -1;
            return rl_agents_note(agg, m, peer, now_ms);
        }
        a->used = true;
        memcpy(a->id, id, len);
        a->id[len] = '\0';
        t->used++;
    }
    snprintf(a->peer, sizeof a->peer, "%s", peer);
    a->last_ms = now_ms;
    a->keys = m->n_entries;
    a->reports++;
    return 0;
}

size_t rl_agents_count(const rl_aggregator *agg)
{
    return agg->agents != NULL ? agg->agents->used : 0;
}

/* One line per agent: id, address, last report (Redis ms), keys in it,
 * ms since, reports; tab-separated (ids and addresses hold no tabs). */
void rl_agents_render(const rl_aggregator *agg, uint64_t now_ms,
                      void (*put)(void *, const char *, ...), void *arg)
{
    const rl_agents *t = agg->agents;
    for (size_t i = 0; t != NULL && i < t->cap; i++) {
        const rl_agent_seen *a = &t->slots[i];
        if (a->used)
            put(arg, "%s\t%s\t%llu\t%llu\t%llu\t%llu\n", a->id, a->peer,
                (unsigned long long)a->last_ms, (unsigned long long)a->keys,
                (unsigned long long)(now_ms > a->last_ms ? now_ms - a->last_ms
                                                         : 0),
                (unsigned long long)a->reports);
    }
}
