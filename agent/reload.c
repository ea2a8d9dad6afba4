/*
 * reload.c: swapping an agent's rules while it checks. A reload builds a
 * new generation (gen.h) of the new config, makes what it needs that the
 * agent lacks (local buckets, synced counters and the aggregator link),
 * hands it to the I/O thread and waits for the I/O thread to take it up
 * (so that an exact request built under it meets a thread that knows its
 * rules, and synced keys whose rate changed get a fresh share), then
 * publishes it to checks with one atomic exchange. The generation it
 * replaces is retired: freed once every call that began before the
 * exchange has left and nothing holds a reference to it, at this reload or
 * a later one (or at close).
 *
 * What a kept rule keeps: its identity (ident.h), and with it its synced
 * and local entries; exact buckets are Redis keys named by key_prefix and
 * value, kept as they are. Removed rules stop at once for new checks;
 * their synced keys are still reported until acknowledged.
 *
 * Checks never wait for a reload: they take no lock it holds. A reload
 * waits for the I/O thread (at most RELOAD_IO_WAIT_MS) and, when more than
 * RETIRED_MAX generations are still held, for the oldest to be let go;
 * with a host's loop (rl_options.host_loop) it waits for neither.
 */
#include "agent_impl.h"

#include "error.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define RELOAD_IO_WAIT_MS 1000
/* Retired generations kept waiting at most; a reload past it waits. */
#define RETIRED_MAX 4
/* How long a reload gives the generation it retired to be let go before
 * leaving it to a later reload. */
#define RETIRE_WAIT_US 20000

static bool same_rate(const rl_rule *a, const rl_rule *b)
{
    return a->limit == b->limit && a->period_ms == b->period_ms
           && a->burst == b->burst;
}

/* An on_error: local rule without fleet_size divides by the aggregator's
 * count of its agents, which may never come (no aggregator runs): said
 * once per rule, when the agent first takes it up, as each agent then
 * falls back to the whole limit. */
void rl_agent_warn_fleet_unknown(rl_agent *a, const rl_gen *g)
{
    const rl_config *c = g->config;
    for (size_t i = 0; i < c->n_rules; i++) {
        const rl_rule *r = &c->rules[i];
        rl_ident *id = g->idents[i];
        /* A synced rule's shares need the agent count anyway: its
         * on_error: local (the default) is no news. */
        if (r->on_error != RL_ON_ERROR_LOCAL || r->fleet_size != 0
            || r->mode == RL_MODE_SYNCED || id->fleet_warned)
            continue;
        id->fleet_warned = true;
        rl_log(&a->log, RL_LOG_WARN, "fallback_fleet_unknown",
               "rule=%s reason=\"on_error: local without fleet_size: "
               "until an aggregator reports the rule's agents, each agent's "
               "fallback admits the whole limit\"", r->name);
    }
}

void rl_agent_io_apply(rl_agent *a, rl_gen *g, bool quiet)
{
    rl_gen *old = a->io_gen;
    const rl_config *c = g->config;
    for (size_t i = 0; i < c->n_rules; i++) {
        rl_ident *id = g->idents[i];
        id->io_changed = id->io_rule == NULL
                         || !same_rate(id->io_rule, &c->rules[i]);
    }
    if (old != NULL && old != g) {
        for (size_t i = 0; i < old->config->n_rules; i++)
            old->idents[i]->io_rule = NULL;
    }
    for (size_t i = 0; i < c->n_rules; i++)
        g->idents[i]->io_rule = &c->rules[i];
    if (!quiet)
        rl_agent_warn_fleet_unknown(a, g);
    if (!quiet && (g->has_exact || g->has_leased) && a->store == NULL) {
        a->store = rl_store_new(&a->loop, &a->store_config, a->redis_tls,
                                &rl_bucket_scripts, &a->store_counters,
                                &a->log);
        if (a->store == NULL)
            rl_log(&a->log, RL_LOG_ERROR, "agent_out_of_memory", "%s", "");
    }
    if (!quiet && a->store != NULL)
        rl_in_flight_start(&a->in_flight, a->store, &a->loop, &a->log);
    if (!quiet && a->has_leased) {
        rl_leased_start(&a->leased, a->store, &a->loop, &a->log);
        a->io_leased = true;
        /* Removed rules and changed rates give their tokens back. */
        if (old != NULL && old != g)
            rl_leased_reloaded(&a->leased);
    }
    /* Made by a reload's thread, under the queue lock. */
    pthread_mutex_lock(&a->queue_lock);
    rl_sync *sync = a->sync;
    pthread_mutex_unlock(&a->queue_lock);
    if (!quiet && sync != NULL) {
        rl_sync_set_rules(sync, c, g->idents);
        if (!rl_sync_started(sync))
            rl_sync_start(sync, &a->loop);
    }
    if (!quiet && a->has_synced && old != NULL && old != g) {
        /* A changed limit applies at once to the keys it had. */
        rl_synced_table *t = atomic_load(&a->synced.table);
        uint64_t now = uv_now(&a->loop);
        for (size_t i = 0; i < t->cap; i++) {
            rl_synced_entry *e = atomic_load(&t->slots[i]);
            if (e != NULL && e->ident->io_rule != NULL
                && e->ident->io_changed)
                rl_synced_rebalance(&a->synced, e, now, true);
        }
    }
    if (old != g) {
        a->io_gen = g;
        if (old != NULL)
            rl_gen_unref(old);
    }
}

int rl_agent_take_modes(rl_agent *a, rl_gen *g, rl_error *err)
{
    if (g->has_local && !a->has_local) {
        rl_local_init(&a->local, a->config->local_max_keys);
        a->has_local = true;
    }
    if (g->has_fallback && !a->has_fallback) {
        rl_local_init(&a->fallback, a->config->local_max_keys);
        a->has_fallback = true;
    }
    /* Leased keys count against local.max_keys too (each kind its own):
     * both are per-key state in this process. */
    if (g->has_leased && !a->has_leased) {
        if (rl_leased_init(&a->leased, a->config->local_max_keys,
                           &a->wakeup, &a->closing, &a->calls) != RL_OK)
            return rl_error_set(err, RL_ENOMEM, "out of memory");
        a->has_leased = true;
    }
    if (!g->needs_sync || a->has_synced)
        return RL_OK;
    /* The aggregator settings are those the agent was opened with. */
    if (rl_synced_init(&a->synced, a->config, &a->calls) != RL_OK)
        return rl_error_set(err, RL_ENOMEM, "out of memory");
    rl_sync *sync = rl_sync_new(&a->synced, a->config, a->id, &a->log,
                                err);
    if (sync == NULL) {
        rl_synced_fini(&a->synced);
        return err->code;
    }
    rl_sync_set_rules(sync, g->config, g->idents);
    /* The I/O thread starts it when it takes g up; once it has closed
     * the queue it never would. */
    pthread_mutex_lock(&a->queue_lock);
    bool closed = a->queue_closed || atomic_load(&a->closing);
    if (!closed)
        a->sync = sync;
    pthread_mutex_unlock(&a->queue_lock);
    if (closed) {
        rl_sync_free(sync);
        rl_synced_fini(&a->synced);
        return rl_error_set(err, RL_ECLOSED, "rl_agent_reload: the agent "
                            "is shut down");
    }
    a->has_synced = true;
    return RL_OK;
}

/* Frees the retired generations nothing uses any more, their counters
 * kept. */
static void reclaim(rl_agent *a)
{
    rl_gen **link = &a->retired;
    while (*link != NULL) {
        rl_gen *g = *link;
        if (atomic_load_explicit(&g->refs, memory_order_acquire) != 0
            || !rl_calls_passed(&a->calls, &g->retired_at)) {
            link = &g->next;
            continue;
        }
        *link = g->next;
        a->n_retired--;
        rl_gen_fold_stats(g, &a->retired_counts);
        rl_gen_free(g);
    }
    rl_idents_sweep(&a->idents, false);
}

/* Hands g to the I/O thread and waits until it serves it (or closes, or a
 * second passes, or the loop is a host's: then its requests still find it
 * first, on_wakeup). */
static int hand_to_io(rl_agent *a, rl_gen *g)
{
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    until.tv_sec += RELOAD_IO_WAIT_MS / 1000;
    pthread_mutex_lock(&a->queue_lock);
    if (a->queue_closed || atomic_load(&a->closing)) {
        pthread_mutex_unlock(&a->queue_lock);
        return RL_ECLOSED;
    }
    rl_gen_ref(g);
    rl_gen *skipped = a->io_next;
    a->io_next = g;
    uint64_t seq = ++a->io_posted;
    uv_async_send(&a->wakeup);
    if (skipped != NULL)
        rl_gen_unref(skipped);
    /* A host's loop takes it up when the host runs it next: the host may
     * be this very thread. */
    while (!a->host_loop && a->io_applied < seq && !a->queue_closed
           && pthread_cond_timedwait(&a->io_applied_cond, &a->queue_lock,
                                     &until) != ETIMEDOUT)
        ;
    pthread_mutex_unlock(&a->queue_lock);
    return RL_OK;
}

/* A key_prefix that stays while the keys under it change kind: an
 * in_flight rule's are hashes, other rules' strings, and each would
 * meet the other's (Redis's WRONGTYPE, a degraded answer) until they
 * expire. The default prefixes differ (config.c); only given ones can
 * meet so. */
static int check_key_kinds(const rl_config *old, const rl_config *cfg,
                           rl_error *err)
{
    for (size_t i = 0; i < cfg->n_rules; i++) {
        const rl_rule *r = &cfg->rules[i];
        for (size_t j = 0; j < old->n_rules; j++) {
            const rl_rule *o = &old->rules[j];
            if ((r->mode == RL_MODE_IN_FLIGHT)
                    != (o->mode == RL_MODE_IN_FLIGHT)
                && strcmp(r->key_prefix, o->key_prefix) == 0)
                return rl_error_set(
                    err, RL_ECONFIG, "rl_agent_reload: rule \"%s\" (%s) "
                    "would use key_prefix '%s' of rule \"%s\" (%s): the "
                    "in_flight slots and the buckets under it are keys of "
                    "two kinds, and each would meet the other's; give it "
                    "another key_prefix, or remove the rule and add it back "
                    "once its keys have expired", r->name,
                    rl_mode_name(r->mode), r->key_prefix, o->name,
                    rl_mode_name(o->mode));
        }
    }
    return RL_OK;
}

static int reload_locked(rl_agent *a, rl_config *cfg, rl_error *err)
{
    if (atomic_load(&a->closing))
        return rl_error_set(err, RL_ECLOSED, "rl_agent_reload: the agent is "
                            "shut down");
    int kinds = check_key_kinds(atomic_load(&a->gen)->config, cfg, err);
    if (kinds != RL_OK)
        return kinds;
    rl_gen *g;
    if (rl_gen_new(cfg, cfg, &a->idents, &g) != RL_OK) {
        rl_idents_sweep(&a->idents, false);
        return rl_error_set(err, RL_ENOMEM, "rl_agent_reload: out of "
                            "memory");
    }
    int rc = rl_agent_take_modes(a, g, err);
    if (rc == RL_OK && (rc = hand_to_io(a, g)) != RL_OK)
        rl_error_set(err, rc, "rl_agent_reload: the agent is shut down");
    if (rc != RL_OK) {
        g->owned = NULL; /* the caller's still */
        rl_gen_free(g);
        rl_idents_sweep(&a->idents, false);
        return rc;
    }
    rl_gen *old = atomic_exchange(&a->gen, g);
    rl_calls_mark_now(&a->calls, &old->retired_at);
    old->next = a->retired;
    a->retired = old;
    a->n_retired++;
    a->reloads++;
    reclaim(a);
    /* A host's loop lets the old rules go only when the host runs it, and
     * the host may be this very thread: no wait (they go at a later
     * reload's reclaim). */
    for (unsigned waited = 0;
         !a->host_loop
         && (a->n_retired > RETIRED_MAX
             || (a->retired == old && waited < RETIRE_WAIT_US));
         waited += 200) {
        usleep(200);
        reclaim(a);
    }
    return RL_OK;
}

int rl_agent_reload_config(rl_agent *a, rl_config *cfg, rl_error *err)
{
    rl_error local = {0};
    if (err == NULL)
        err = &local;
    if (a == NULL || cfg == NULL)
        return rl_error_set(err, RL_EINVAL, "rl_agent_reload: agent and "
                            "config must not be NULL");
    if (a->forks != rl_forks())
        return rl_error_set(err, RL_EFORKED, "rl_agent_reload: the agent "
                            "was opened in another process");
    pthread_mutex_lock(&a->reload_lock);
    int rc = reload_locked(a, cfg, err);
    pthread_mutex_unlock(&a->reload_lock);
    if (rc == RL_OK)
        rl_error_clear(err);
    return rc;
}

int rl_agent_reload(rl_agent *a, const char *path, rl_error *err)
{
    if (a == NULL || path == NULL)
        return rl_error_set(err, RL_EINVAL, "rl_agent_reload: agent and "
                            "config_path must not be NULL");
    rl_config *cfg;
    int rc = rl_config_load(path, &cfg, err);
    if (rc != RL_OK)
        return rc;
    rc = rl_agent_reload_config(a, cfg, err);
    if (rc != RL_OK)
        rl_config_free(cfg);
    return rc;
}

/* Where a generation's rule counters go: to the current rule with the
 * same identity, if any. */
struct into_current {
    const rl_gen *cur;
    rl_rule_counters *rules;
    size_t cap;
};

static void add_to_current(rl_ident *id, const rl_rule_counters *c,
                           void *arg)
{
    struct into_current *t = arg;
    for (size_t j = 0; j < t->cur->config->n_rules && j < t->cap; j++) {
        if (t->cur->idents[j] == id)
            rl_rule_counters_add(&t->rules[j], c);
    }
}

void rl_agent_rule_stats(rl_agent *a, rl_agent_counters *out,
                         rl_rule_counters *rules, size_t cap)
{
    const rl_gen *cur = atomic_load(&a->gen);
    out->requests = a->retired_counts.requests;
    out->allowed = a->retired_counts.allowed;
    out->rejected = a->retired_counts.rejected;
    out->degraded = a->retired_counts.degraded;
    out->n_rules = cur->config->n_rules;
    out->reloads = a->reloads;
    for (size_t i = 0; i < cur->config->n_rules && i < cap; i++) {
        rules[i] = cur->idents[i]->retired;
        rules[i].rule = cur->idents[i]->name;
    }
    struct into_current t = {cur, rules, cap};
    rl_gen_add_stats(cur, out, add_to_current, &t);
    for (const rl_gen *g = a->retired; g != NULL; g = g->next)
        rl_gen_add_stats(g, out, add_to_current, &t);
}
