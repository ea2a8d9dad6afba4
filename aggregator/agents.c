/*
 * agents.c: the agents this aggregator hears from: id, address, the
 * connection (nng pipe) it reports on, the time of the last report
 * (Redis's clock), how many keys it carried, how many reports so far. A
 * table of at most aggregator.max_agents; an agent not heard for
 * AGENT_FORGET_MS gives its place up to a new one, and a new agent that
 * finds the table full of live ones is refused (and counted). An agent
 * that says goodbye leaves it at once.
 *
 * A connection speaks for RL_PIPE_AGENTS agent at most: every agent has a
 * socket of its own to each aggregator, so a second id on one connection
 * is a peer making ids up, each of which would count as one more agent in
 * the fleet and shrink every agent's share. It is refused (and counted);
 * an id that comes back on a new connection (a reconnect) moves to it.
 * Loop thread only.
 */
#include "aggregator.h"

#include "keys.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define AGENT_FORGET_MS 60000
#define RL_PIPE_AGENTS 1

typedef struct rl_agent_seen {
    bool used;
    bool left;             /* said goodbye: dropped at once */
    char id[RL_WIRE_ID_MAX + 1];
    char peer[160];
    uint32_t pipe;
    uint64_t last_ms, keys, reports;
} rl_agent_seen;

/* How many of the table's agents report on one connection (0: a slot
 * whose agents moved or left, dropped at the next rebuild). */
typedef struct pipe_agents {
    uint32_t pipe;  /* nng pipe ids are never 0: 0 is an empty slot */
    uint32_t agents;
} pipe_agents;

struct rl_agents {
    rl_agent_seen *slots;  /* open addressing */
    pipe_agents *pipes;    /* open addressing, as many slots */
    size_t cap, used, pipes_used;
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
    if (t != NULL) {
        t->slots = calloc(cap, sizeof *t->slots);
        t->pipes = calloc(cap, sizeof *t->pipes);
    }
    if (t == NULL || t->slots == NULL || t->pipes == NULL) {
        if (t != NULL) {
            free(t->slots);
            free(t->pipes);
        }
        free(t);
        return -1;
    }
    t->cap = cap;
    agg->agents = t;
    return 0;
}

void rl_agents_free(rl_aggregator *agg)
{
    if (agg->agents != NULL) {
        free(agg->agents->slots);
        free(agg->agents->pipes);
    }
    free(agg->agents);
    agg->agents = NULL;
}

/* The slot of pipe, made if new. There is always an empty one: the pipes
 * with agents are at most the agents, under half the slots, and the table
 * is rebuilt from the agents before it is half full. */
static pipe_agents *pipe_slot(rl_agents *t, uint32_t pipe)
{
    size_t j = rl_key_hash(1, (const char *)&pipe, sizeof pipe)
               & (t->cap - 1);
    while (t->pipes[j].pipe != 0 && t->pipes[j].pipe != pipe)
        j = (j + 1) & (t->cap - 1);
    if (t->pipes[j].pipe == 0) {
        t->pipes[j].pipe = pipe;
        t->pipes_used++;
    }
    return &t->pipes[j];
}

static void count_pipes(rl_agents *t)
{
    memset(t->pipes, 0, t->cap * sizeof *t->pipes);
    t->pipes_used = 0;
    for (size_t i = 0; i < t->cap; i++) {
        if (t->slots[i].used)
            pipe_slot(t, t->slots[i].pipe)->agents++;
    }
}

/* Drops the agents not heard for a while and those that left, rebuilding
 * the table in place (and the pipes' counts from it). */
static void keep_recent(rl_agents *t, uint64_t now_ms)
{
    rl_agent_seen *old = t->slots;
    rl_agent_seen *fresh = calloc(t->cap, sizeof *fresh);
    if (fresh == NULL)
        return;
    t->used = 0;
    for (size_t i = 0; i < t->cap; i++) {
        if (!old[i].used || old[i].left
            || now_ms - old[i].last_ms > AGENT_FORGET_MS)
            continue;
        size_t j = slot_of(t, old[i].id, strlen(old[i].id));
        while (fresh[j].used)
            j = (j + 1) & (t->cap - 1);
        fresh[j] = old[i];
        t->used++;
    }
    free(old);
    t->slots = fresh;
    count_pipes(t);
}

static rl_agent_seen *find(rl_agents *t, rl_wire_bytes id)
{
    size_t j = slot_of(t, id.ptr, id.len);
    while (t->slots[j].used
           && !(strlen(t->slots[j].id) == id.len
                && memcmp(t->slots[j].id, id.ptr, id.len) == 0))
        j = (j + 1) & (t->cap - 1);
    return &t->slots[j];
}

int rl_agents_note(rl_aggregator *agg, const rl_wire_msg *m,
                   const char *peer, uint32_t pipe, uint64_t now_ms)
{
    rl_agents *t = agg->agents;
    rl_agent_seen *a = find(t, m->agent_id);
    if (!a->used || a->pipe != pipe) {
        if (2 * t->pipes_used >= t->cap)
            count_pipes(t);
        if (pipe_slot(t, pipe)->agents >= RL_PIPE_AGENTS)
            return RL_AGENTS_PIPE_FULL;
    }
    if (!a->used) {
        if (t->used >= agg->boot_config->aggregator.max_agents) {
            keep_recent(t, now_ms);
            if (t->used >= agg->boot_config->aggregator.max_agents)
                return RL_AGENTS_FULL;
            return rl_agents_note(agg, m, peer, pipe, now_ms);
        }
        a->used = true;
        memcpy(a->id, m->agent_id.ptr, m->agent_id.len);
        a->id[m->agent_id.len] = '\0';
        t->used++;
        pipe_slot(t, pipe)->agents++;
    } else if (a->pipe != pipe) {
        pipe_slot(t, a->pipe)->agents--;
        pipe_slot(t, pipe)->agents++;
    }
    a->pipe = pipe;
    snprintf(a->peer, sizeof a->peer, "%s", peer);
    a->last_ms = now_ms;
    a->keys = m->n_entries;
    a->reports++;
    return 0;
}

bool rl_agents_leave(rl_aggregator *agg, rl_wire_bytes id, uint32_t pipe,
                     uint64_t now_ms)
{
    rl_agents *t = agg->agents;
    rl_agent_seen *a = find(t, id);
    if (!a->used || a->pipe != pipe)
        return false;
    a->left = true;
    keep_recent(t, now_ms);
    return true;
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
