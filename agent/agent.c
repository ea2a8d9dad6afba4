/*
 * agent.c: an agent's life: open (config, per-rule arguments, the I/O
 * thread), the submission queue into the I/O thread, shutdown and close.
 * The I/O thread owns the libuv loop, the store connection and every
 * request once submitted; gateway threads only take the queue's lock for
 * the moment it takes to link a request in. Reloads are in reload.c.
 */
#include "agent_impl.h"

#include "error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The end of the I/O thread's part of a close: the store, the sync and
 * the handles go, and the loop runs out. */
static void finish_close(void *arg)
{
    rl_agent *a = arg;
    rl_sync *sync = a->closing_sync;
    rl_store_close(a->store);
    a->store = NULL;
    if (a->io_leased)
        rl_leased_stop(&a->leased);
    if (sync != NULL && rl_sync_started(sync))
        rl_sync_stop(sync);
    else
        rl_sync_free(sync);
    rl_in_flight_stop(&a->in_flight);
    uv_close((uv_handle_t *)&a->wakeup, NULL);
    uv_close((uv_handle_t *)&a->own_wakeup, NULL);
    uv_close((uv_handle_t *)&a->deadline_timer, NULL);
}

/* The close, once the holds' calls are answered and the in_flight slots
 * let go: leased tokens go back before the store closes (within one
 * deadline). */
static void give_leases_back(void *arg)
{
    rl_agent *a = arg;
    if (a->io_leased)
        rl_leased_close(&a->leased, a->store_config.timeout_ms, finish_close,
                        a);
    else
        finish_close(a);
}

/* The close, once the holds' calls are answered: the in_flight slots go
 * back before the leases. */
static void let_slots_go(void *arg)
{
    rl_agent *a = arg;
    rl_in_flight_close(&a->in_flight, a->store_config.timeout_ms,
                       give_leases_back, a);
}

/* The agent whose I/O thread this is, on that thread; NULL elsewhere. */
static _Thread_local rl_agent *io_thread_of;

/* Runs on the I/O thread when woken: takes every queued request at once,
 * so that all of them are written to the store in one batch. */
static void serve(rl_agent *a)
{
    pthread_mutex_lock(&a->queue_lock);
    /* A new generation first: requests built under it may follow. */
    rl_gen *next_gen = a->io_next;
    uint64_t seq = a->io_posted;
    a->io_next = NULL;
    rl_request *req = a->queue_head;
    a->queue_head = NULL;
    a->queue_tail = &a->queue_head;
    bool closing = atomic_load(&a->closing);
    /* Once closing, a reload can no longer make a sync (reload.c). */
    rl_sync *sync = closing ? a->sync : NULL;
    if (closing) {
        a->queue_closed = true;
        a->sync = NULL;
    }
    pthread_mutex_unlock(&a->queue_lock);
    if (next_gen != NULL)
        rl_agent_io_apply(a, next_gen, closing);
    if (next_gen != NULL || closing) {
        pthread_mutex_lock(&a->queue_lock);
        a->io_applied = seq;
        pthread_cond_broadcast(&a->io_applied_cond);
        pthread_mutex_unlock(&a->queue_lock);
    }

    while (req != NULL) {
        rl_request *next = req->next;
        rl_exact_start(a, req);
        req = next;
    }
    rl_holds_serve(a);
    if (closing) {
        if (a->io_closing)
            return; /* woken again while leases go back */
        a->io_closing = true;
        rl_exact_finalize_all(a);
        a->closing_sync = sync;
        /* Before the leases go back and the store closes: a hold's
         * difference may be a call (within one deadline), and then the
         * slots this agent holds are let go, all of them in one call per
         * cluster slot (one deadline). */
        rl_holds_close(a, let_slots_go);
        return;
    }
    if (a->io_leased)
        rl_leased_drain(&a->leased);
    rl_exact_arm_deadline(a);
}

static void on_wakeup(uv_async_t *handle)
{
    serve(handle->data);
}

/* An idle handle runs before the loop's prepare handles, which write what
 * the store queued (node_uv.c), and while one is active the loop does not
 * block: the I/O thread's own requests leave in the next write. */
static void on_own_wakeup(uv_idle_t *handle)
{
    uv_idle_stop(handle);
    serve(handle->data);
}

/* On the thread that runs the agent's loop: its I/O thread, or the host's
 * that drives it. */
bool rl_agent_on_loop_thread(const rl_agent *a)
{
    return io_thread_of == a
           || (a->host_loop && pthread_equal(pthread_self(), a->host_thread));
}

/* What the I/O thread starts with, before it runs the loop. */
static void io_setup(rl_agent *a)
{
    /* Its own generation's modes: a reload may be adding others (the
     * I/O thread makes those when it takes the generation up). */
    if (a->io_gen->has_exact || a->io_gen->has_leased) {
        a->store = rl_store_new(&a->loop, &a->store_config, a->redis_tls,
                                &rl_bucket_scripts, &a->store_counters,
                                &a->log);
        if (a->store == NULL)
            rl_log(&a->log, RL_LOG_ERROR, "agent_out_of_memory", "%s", "");
    }
    if (a->has_leased) {
        rl_leased_start(&a->leased, a->store, &a->loop, &a->log);
        a->io_leased = true;
    }
    /* Renewals cost nothing while no slot is held: one timer per lease/4
     * with an empty table. */
    if (a->store != NULL)
        rl_in_flight_start(&a->in_flight, a->store, &a->loop, &a->log);
    if (a->io_gen->needs_sync)
        rl_sync_start(a->sync, &a->loop);
    rl_agent_warn_fleet_unknown(a, a->io_gen);
}

static void io_thread(void *arg)
{
    rl_agent *a = arg;
    io_thread_of = a;
    io_setup(a);
    uv_run(&a->loop, UV_RUN_DEFAULT);
}

static atomic_uint forks;
static pthread_once_t forks_once = PTHREAD_ONCE_INIT;

static void forked(void)
{
    atomic_fetch_add(&forks, 1);
}

static void watch_forks(void)
{
    pthread_atfork(NULL, NULL, forked);
}

unsigned rl_forks(void)
{
    return atomic_load_explicit(&forks, memory_order_relaxed);
}

int rl_agent_submit(rl_agent *a, rl_request *req)
{
    req->next = NULL;
    pthread_mutex_lock(&a->queue_lock);
    if (a->queue_closed || atomic_load(&a->closing)) {
        pthread_mutex_unlock(&a->queue_lock);
        return RL_ECLOSED;
    }
    *a->queue_tail = req;
    a->queue_tail = &req->next;
    /* Under the lock: the I/O thread closes the wakeup handles only after
     * closing the queue, so they are open here. uv_async_send coalesces
     * (many requests, one wakeup) but still costs the I/O thread two
     * system calls per turn (a write and a read of its eventfd) when it
     * submits from its own callbacks, as an event-loop gateway does. */
    if (rl_agent_on_loop_thread(a))
        uv_idle_start(&a->own_wakeup, on_own_wakeup);
    else
        uv_async_send(&a->wakeup);
    pthread_mutex_unlock(&a->queue_lock);
    return RL_OK;
}

static int take_config(rl_agent *a, const rl_options *o, rl_error *err)
{
    if (o->config != NULL) {
        a->config = o->config;
    } else if (o->config_path != NULL) {
        int rc = rl_config_load(o->config_path, &a->owned_config, err);
        if (rc != RL_OK)
            return rc;
        a->config = a->owned_config;
    } else {
        return rl_error_set(err, RL_EINVAL, "rl_agent_open: options need "
                            "config_path or config");
    }
    a->store_config = a->config->store;
    if (rl_in_flight_init(&a->in_flight, a->id,
                          a->config->in_flight_lease_ms) != RL_OK)
        return rl_error_set(err, RL_ENOMEM, "rl_agent_open: out of memory");
    if (o->timeout_ms != 0) {
        if (o->timeout_ms > RL_STORE_TIMEOUT_MAX_MS)
            return rl_error_set(err, RL_EINVAL, "rl_agent_open: timeout_ms "
                                "%u is over %u", o->timeout_ms,
                                RL_STORE_TIMEOUT_MAX_MS);
        a->store_config.timeout_ms = o->timeout_ms;
    }
    /* TLS files are read here, where a refusal still reaches the caller,
     * not on the I/O thread. */
    if (a->store_config.tls.enabled) {
        char why[RL_PATH_MAX + 200];
        a->redis_tls = rl_redis_tls_new(&a->store_config.tls, "store.tls",
                                        why, sizeof why);
        if (a->redis_tls == NULL)
            return rl_error_set(err, strstr(why, "cannot read") != NULL
                                         ? RL_EIO : RL_ECONFIG,
                                "%s", why);
    }
    /* The agent's own counters: exact latency and store errors. Checks
     * count in their generation's. */
    rl_gen *g;
    if (rl_stats_init(&a->stats, 0) != RL_OK
        || rl_gen_new(a->config, NULL, &a->idents, &g) != RL_OK)
        return rl_error_set(err, RL_ENOMEM, "rl_agent_open: out of memory");
    atomic_init(&a->gen, g);
    /* The I/O thread's, from the start. */
    rl_gen_ref(g);
    a->io_gen = g;
    rl_agent_io_apply(a, g, true);
    return RL_OK;
}

static void free_agent(rl_agent *a)
{
    /* Entries first: they hold their identities. */
    if (a->has_synced)
        rl_synced_fini(&a->synced);
    if (a->has_local)
        rl_local_fini(&a->local);
    if (a->has_fallback)
        rl_local_fini(&a->fallback);
    if (a->has_leased)
        rl_leased_fini(&a->leased);
    rl_in_flight_fini(&a->in_flight);
    rl_gen_free(atomic_load(&a->gen));
    while (a->retired != NULL) {
        rl_gen *g = a->retired;
        a->retired = g->next;
        rl_gen_free(g);
    }
    rl_idents_sweep(&a->idents, true);
    if (a->stats.shared != NULL)
        rl_stats_fini(&a->stats);
    rl_node_batches_fini(&a->store_counters.batches);
    pthread_mutex_destroy(&a->reload_lock);
    rl_holds_fini(&a->holds);
    pthread_cond_destroy(&a->io_applied_cond);
    rl_redis_tls_free(a->redis_tls);
    rl_config_free(a->owned_config);
    free(a);
}

static int start_io(rl_agent *a, rl_error *err)
{
    if (uv_loop_init(&a->loop) != 0)
        return rl_error_set(err, RL_ESYS, "rl_agent_open: cannot create an "
                            "event loop");
    uv_async_init(&a->loop, &a->wakeup, on_wakeup);
    uv_idle_init(&a->loop, &a->own_wakeup);
    uv_timer_init(&a->loop, &a->deadline_timer);
    rl_holds_start(&a->holds, &a->loop, a->config->hold_timeout_ms);
    a->wakeup.data = a->own_wakeup.data = a->deadline_timer.data = a;
    a->holds.timer.data = a;
    if (a->host_loop) {
        a->host_thread = pthread_self();
        io_setup(a);
        return RL_OK;
    }
    if (uv_thread_create(&a->thread, io_thread, a) != 0) {
        uv_close((uv_handle_t *)&a->wakeup, NULL);
        uv_close((uv_handle_t *)&a->own_wakeup, NULL);
        uv_close((uv_handle_t *)&a->deadline_timer, NULL);
        uv_close((uv_handle_t *)&a->holds.timer, NULL);
        uv_run(&a->loop, UV_RUN_DEFAULT);
        uv_loop_close(&a->loop);
        return rl_error_set(err, RL_ESYS, "rl_agent_open: cannot start the "
                            "I/O thread");
    }
    return RL_OK;
}

int rl_agent_open(rl_agent **out, const rl_options *o, rl_error *err)
{
    if (out == NULL || o == NULL) {
        if (out != NULL)
            *out = NULL;
        return rl_error_set(err, RL_EINVAL, "rl_agent_open: out and options "
                            "must not be NULL");
    }
    *out = NULL;
    if (o->host_loop != 0 && o->host_loop != 1)
        return rl_error_set(err, RL_EINVAL, "rl_agent_open: host_loop is 0 "
                            "or 1, not %d", o->host_loop);
    /* Aligned: its per-thread counters each keep a cache line. */
    rl_agent *a = aligned_alloc(RL_CACHE_LINE, (sizeof *a + RL_CACHE_LINE - 1)
                                                   / RL_CACHE_LINE
                                                   * RL_CACHE_LINE);
    if (a == NULL)
        return rl_error_set(err, RL_ENOMEM, "rl_agent_open: out of memory");
    memset(a, 0, sizeof *a);
    a->host_loop = o->host_loop;
    a->log = (rl_logger){.fn = o->log, .arg = o->log_arg,
                         .level = o->log_level};
    pthread_once(&forks_once, watch_forks);
    a->forks = rl_forks();
    rl_agent_id_make(a->id, sizeof a->id);
    rl_calls_setup();
    a->queue_tail = &a->queue_head;
    pthread_mutex_init(&a->queue_lock, NULL);
    pthread_mutex_init(&a->reload_lock, NULL);
    rl_holds_init(&a->holds);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&a->io_applied_cond, &ca);
    pthread_condattr_destroy(&ca);
    rl_node_batches_init(&a->store_counters.batches);
    rl_error local = {0};
    if (err == NULL)
        err = &local;
    int rc = take_config(a, o, err);
    if (rc == RL_OK)
        rc = rl_agent_take_modes(a, atomic_load(&a->gen), err);
    if (rc == RL_OK)
        rc = start_io(a, err);
    if (rc != RL_OK) {
        rl_sync_free(a->sync);
        pthread_mutex_destroy(&a->queue_lock);
        free_agent(a);
        return rc;
    }
    rl_error_clear(err);
    *out = a;
    return RL_OK;
}

void rl_agent_shutdown(rl_agent *a)
{
    if (a == NULL || atomic_exchange(&a->closing, true))
        return;
    pthread_mutex_lock(&a->queue_lock);
    if (!a->queue_closed && a->forks == rl_forks())
        uv_async_send(&a->wakeup);
    pthread_mutex_unlock(&a->queue_lock);
}

void rl_agent_close(rl_agent *a)
{
    if (a == NULL)
        return;
    if (a->forks != rl_forks()) {
        /* A forked child: the I/O thread and its loop live in the parent.
         * Free what is ours; the loop's copies of descriptors are left to
         * the child's exit. */
        free_agent(a);
        return;
    }
    rl_agent_shutdown(a);
    /* A reload under way ends (it sees closing) before the agent goes. */
    pthread_mutex_lock(&a->reload_lock);
    pthread_mutex_unlock(&a->reload_lock);
    /* Callers still inside rl_check* return promptly once shut down. */
    rl_calls_wait_idle(&a->calls);
    if (a->host_loop)
        uv_run(&a->loop, UV_RUN_DEFAULT); /* the close, to its end */
    else
        uv_thread_join(&a->thread);
    uv_loop_close(&a->loop);
    pthread_mutex_destroy(&a->queue_lock);
    free_agent(a);
}

/* The host-loop calls refuse another thread: the loop is not
 * thread-safe. */
static int host_loop_caller(const rl_agent *a)
{
    if (a == NULL || !a->host_loop)
        return RL_EINVAL;
    if (a->forks != rl_forks())
        return RL_EFORKED;
    return pthread_equal(pthread_self(), a->host_thread) ? RL_OK : RL_EINVAL;
}

int rl_agent_loop_fd(rl_agent *a)
{
    int rc = host_loop_caller(a);
    return rc == RL_OK ? uv_backend_fd(&a->loop) : rc;
}

int rl_agent_loop_timeout(rl_agent *a)
{
    if (host_loop_caller(a) != RL_OK)
        return -1;
    return uv_backend_timeout(&a->loop);
}

int rl_agent_run(rl_agent *a)
{
    int rc = host_loop_caller(a);
    /* From a callback of its own: the loop is running already. */
    if (rc != RL_OK || a->host_running)
        return rc;
    a->host_running = true;
    uv_run(&a->loop, UV_RUN_NOWAIT);
    a->host_running = false;
    return RL_OK;
}

int rl_agent_stats(rl_agent *a, rl_agent_counters *out, rl_rule_counters *rules,
                   size_t cap)
{
    if (a == NULL || out == NULL || (rules == NULL && cap > 0))
        return RL_EINVAL;
    memset(out, 0, sizeof *out);
    rl_stats_read(&a->stats, out, NULL, 0);
    pthread_mutex_lock(&a->reload_lock);
    rl_agent_rule_stats(a, out, rules, cap);
    const rl_node_batches *b = &a->store_counters.batches;
    out->store_batches = atomic_load_explicit(&b->batches,
                                              memory_order_relaxed);
    out->store_turns = atomic_load_explicit(&b->turns, memory_order_relaxed);
    if (a->has_synced) {
        out->synced_keys = atomic_load(&a->synced.n_entries);
        out->synced_keys_refused = atomic_load(&a->synced.keys_refused);
    }
    if (a->has_local) {
        out->local_keys = atomic_load(&a->local.n_entries);
        out->local_keys_refused = atomic_load(&a->local.keys_refused);
    }
    if (a->has_fallback) {
        out->fallback_keys = atomic_load(&a->fallback.n_entries);
        out->fallback_keys_refused = atomic_load(&a->fallback.keys_refused);
    }
    if (a->has_leased) {
        const rl_leased *l = &a->leased;
        out->leased_keys = atomic_load(&l->n_entries);
        out->leased_keys_refused = atomic_load(&l->keys_refused);
        out->leases_taken = atomic_load(&l->leases);
        out->lease_tokens_taken = atomic_load(&l->lease_tokens);
        out->leases_returned = atomic_load(&l->returns);
        out->lease_tokens_returned = atomic_load(&l->returned_tokens);
        out->lease_tokens_expired = atomic_load(&l->expired_tokens);
    }
    out->holds_open = atomic_load(&a->holds.open);
    out->holds_ended = atomic_load(&a->holds.ended_n);
    out->holds_expired = atomic_load(&a->holds.expired);
    pthread_mutex_unlock(&a->reload_lock);
    return RL_OK;
}

size_t rl_agent_shards(rl_agent *a, rl_shard_counters *out, size_t cap)
{
    if (a == NULL)
        return 0;
    rl_node_batches *b = &a->store_counters.batches;
    pthread_mutex_lock(&b->lock);
    size_t n = (size_t)b->n_shards;
    for (size_t i = 0; i < n && i < cap; i++) {
        snprintf(out[i].node, sizeof out[i].node, "%s", b->shards[i].addr);
        out[i].batches = atomic_load_explicit(&b->shards[i].batches,
                                              memory_order_relaxed);
        out[i].calls = atomic_load_explicit(&b->shards[i].commands,
                                            memory_order_relaxed);
    }
    pthread_mutex_unlock(&b->lock);
    return n;
}
