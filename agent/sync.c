/*
 * sync.c: the agent's conversation with the aggregators, on its I/O
 * thread. Every sync_interval_ms (at the start of each interval of Redis's
 * clock, once the agent has heard it) the counts since the last report go
 * out as one REPORT on an nng REQ socket; the aggregator answers once they
 * are in Redis. Until then the report is kept, and sent again, the same
 * bytes under the same sequence number, until acknowledged: the aggregator
 * applies a sequence number once, so nothing is lost and nothing counted
 * twice while an aggregator is away. Counts made meanwhile wait for the
 * next report (one counter per key: memory stays bounded).
 *
 * A key that is at its mark (rejecting) and has no new counts goes in the
 * report with a count of 0: its agents send nothing else, and the ack
 * brings its totals. An agent with rules that need a fleet size (synced,
 * or on_error: local) names them in every report and reports every tick,
 * counts or not (presence), so that the aggregator counts it in them.
 *
 * Totals come on an nng SUB socket subscribed to those rules' topics;
 * each TOTALS message sets its rule's agent count and, for a synced rule,
 * brings its keys' totals up to date and gives them a fresh share of what
 * is left, as every tick does (synced.c). nng's threads only queue what
 * they received and wake the loop.
 *
 * The rules are those of the I/O thread's current generation
 * (rl_sync_set_rules, on a reload): topics follow them, and totals of a
 * rule no longer there are dropped. Keys of a rule reloaded away are still
 * reported until their counts are acknowledged: no count is lost.
 */
#include "sync.h"

#include "nng_tls.h"

#include "nng_handoff.h"
#include "wire.h"

#include <nng/nng.h>
#include <nng/protocol/pubsub0/sub.h>
#include <nng/protocol/reqrep0/req.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct reported {
    rl_synced_entry *entry;
    uint64_t count;
} reported;

typedef enum req_state { REQ_IDLE, REQ_SENDING, REQ_WAITING } req_state;

struct rl_sync {
    rl_synced *synced;
    const rl_config *config;    /* the aggregator settings */
    const rl_config *rules;     /* the I/O thread's generation's rules */
    rl_ident *const *idents;    /* and their identities, by index */
    const char **presence;      /* names of its rules that need a fleet */
    size_t n_presence;
    const rl_logger *log;
    uv_loop_t *loop;
    nng_socket req, sub;
    nng_aio *req_aio, *sub_aio;
    uv_async_t wakeup;
    uv_timer_t tick;
    pthread_mutex_t lock;       /* nng threads -> loop */
    bool req_done;              /* the REQ aio finished: result below */
    int req_result;
    bool probe_done;            /* the probe finished: result below */
    int probe_result;
    nng_msg **totals;           /* received TOTALS, in order */
    size_t n_totals, cap_totals;
    bool closing;
    /* Loop thread only. */
    bool stopping;              /* rl_sync_stop was called */
    int stop_reports;           /* reports sent since rl_sync_stop */
    req_state state;
    char agent_id[40];
    uint64_t seq;
    rl_wire_writer *pending;    /* the report waiting for its ack */
    reported *in_report;
    size_t n_in_report;
    uint64_t refused_logged;    /* keys refused at the cap, as last logged */
    rl_nng_probe *probe;        /* why the reports URL cannot be reached */
    bool probing;
    int probe_logged;           /* the reason last logged; 0 after an ack */
    int open_handles;
};

static void close_sync(rl_sync *s);
static void finish_stopping(rl_sync *s);

static uint64_t now_ms(const rl_sync *s)
{
    return uv_now(s->loop);
}

/* nng threads: note and wake. */
static void on_req(void *arg)
{
    rl_sync *s = arg;
    rl_nng_handoff(s);
    pthread_mutex_lock(&s->lock);
    s->req_done = true;
    s->req_result = nng_aio_result(s->req_aio);
    if (!s->closing)
        uv_async_send(&s->wakeup);
    pthread_mutex_unlock(&s->lock);
    rl_nng_handoff(s);
}

static void on_probe(void *arg, int result)
{
    rl_sync *s = arg;
    pthread_mutex_lock(&s->lock);
    s->probe_done = true;
    s->probe_result = result;
    if (!s->closing)
        uv_async_send(&s->wakeup);
    pthread_mutex_unlock(&s->lock);
}

static void on_sub(void *arg)
{
    rl_sync *s = arg;
    rl_nng_handoff(s);
    pthread_mutex_lock(&s->lock);
    int rv = nng_aio_result(s->sub_aio);
    if (rv == 0) {
        nng_msg *m = nng_aio_get_msg(s->sub_aio);
        if (s->n_totals == s->cap_totals) {
            size_t cap = s->cap_totals ? 2 * s->cap_totals : 16;
            nng_msg **grown = cap <= 4096
                                  ? realloc(s->totals, cap * sizeof *grown)
                                  : NULL;
            if (grown != NULL) {
                s->totals = grown;
                s->cap_totals = cap;
            }
        }
        if (s->n_totals < s->cap_totals)
            s->totals[s->n_totals++] = m;
        else
            nng_msg_free(m); /* the loop is far behind: the next will do */
    }
    bool again = !s->closing && rv != NNG_ECLOSED && rv != NNG_ECANCELED;
    if (!s->closing)
        uv_async_send(&s->wakeup);
    pthread_mutex_unlock(&s->lock);
    if (again) {
        rl_nng_handoff(s);
        nng_recv_aio(s->sub, s->sub_aio);
    }
    rl_nng_handoff(s);
}

/* Whether an entry goes in the next report: it has new counts, or it is
 * at its mark with none (its count of 0 asks for fresh totals: a key whose
 * agents all reject sends nothing else, and would wait for totals that no
 * count triggers). */
static bool to_report(const rl_synced_entry *e)
{
    uint64_t counted = rl_synced_counted(e);
    return counted > e->reported
           || (e->ident->io_rule != NULL
               && counted >= atomic_load_explicit(&e->mark,
                                                  memory_order_relaxed));
}

/* Builds the next report from what was counted since the last. */
static bool build_report(rl_sync *s)
{
    rl_synced_table *t = atomic_load(&s->synced->table);
    const rl_aggregator_config *agg = &s->config->aggregator;
    /* Within both caps: entries, and bytes (each entry's rule name, value
     * and a count, with room for msgpack's framing, after the presence
     * names). The rest go in the next report. */
    size_t n = 0, bytes = 1024;
    for (size_t i = 0; i < s->n_presence; i++)
        bytes += strlen(s->presence[i]) + 8;
    for (size_t i = 0; i < t->cap && n < agg->max_entries; i++) {
        rl_synced_entry *e = atomic_load(&t->slots[i]);
        if (e == NULL || !to_report(e))
            continue;
        bytes += strlen(e->ident->name) + e->value_len + 32;
        if (bytes > agg->max_message_bytes)
            break;
        n++;
    }
    if (n == 0 && s->n_presence == 0)
        return false;
    s->in_report = calloc(n + 1, sizeof *s->in_report);
    if (s->in_report == NULL)
        return false;
    rl_wire_writer_reset(s->pending);
    rl_wire_begin_report_presence(s->pending, s->agent_id, ++s->seq, n);
    size_t k = 0;
    for (size_t i = 0; i < t->cap && k < n; i++) {
        rl_synced_entry *e = atomic_load(&t->slots[i]);
        if (e == NULL || !to_report(e))
            continue;
        uint64_t counted = rl_synced_counted(e);
        uint64_t delta = counted > e->reported ? counted - e->reported : 0;
        rl_wire_put_count(s->pending, e->ident->name, e->value, e->value_len,
                          delta);
        e->reported = counted;
        e->in_report = delta;
        s->in_report[k++] = (reported){e, delta};
    }
    /* k == n: the table only changes on this thread (the sweep). */
    rl_wire_put_presence(s->pending, s->presence, s->n_presence);
    s->n_in_report = k;
    return true;
}

static void send_pending(rl_sync *s)
{
    size_t len;
    const void *data = rl_wire_writer_data(s->pending, &len);
    nng_msg *m;
    if (nng_msg_alloc(&m, 0) != 0 || nng_msg_append(m, data, len) != 0)
        return;
    nng_aio_set_msg(s->req_aio, m);
    nng_aio_set_timeout(s->req_aio, 2 * s->config->aggregator.sync_interval_ms);
    s->state = REQ_SENDING;
    rl_nng_handoff(s);
    nng_send_aio(s->req, s->req_aio);
}

/* Whether a rule needs the fleet's size: a synced rule shares its limit
 * among the agents, an on_error: local one falls back to limit / agents. */
static bool needs_fleet(const rl_rule *r)
{
    return r->mode == RL_MODE_SYNCED || r->on_error == RL_ON_ERROR_LOCAL;
}

/* The rule of cfg named by len bytes that needs the fleet's size, or
 * NULL. */
static const rl_rule *fleet_rule(const rl_config *cfg, const char *name,
                                 size_t len)
{
    for (size_t i = 0; cfg != NULL && i < cfg->n_rules; i++) {
        const rl_rule *r = &cfg->rules[i];
        if (needs_fleet(r) && strlen(r->name) == len
            && memcmp(r->name, name, len) == 0)
            return r;
    }
    return NULL;
}

/* The identity of the synced rule named by len bytes off the wire in the
 * current rules, or NULL. */
static rl_ident *synced_ident(rl_sync *s, const char *name, size_t len)
{
    const rl_rule *rule = s->rules != NULL
                              ? rl_config_synced_rule(s->rules, name, len)
                              : NULL;
    return rule != NULL ? s->idents[rule - s->rules->rules] : NULL;
}

static void acknowledged(rl_sync *s, const rl_wire_msg *ack)
{
    for (size_t i = 0; i < s->n_in_report; i++) {
        rl_synced_entry *e = s->in_report[i].entry;
        e->acked_prior = e->acked;
        e->acked += s->in_report[i].count;
        e->acked_ms = ack->now_ms != 0 ? ack->now_ms : UINT64_MAX;
        e->in_report = 0;
    }
    free(s->in_report);
    s->in_report = NULL;
    s->n_in_report = 0;
    s->probe_logged = 0;
    uint64_t loop_ms = now_ms(s);
    if (ack->now_ms != 0)
        rl_synced_set_time(s->synced, ack->now_ms, loop_ms);
    for (size_t i = 0; i < ack->n_entries; i++) {
        const rl_wire_entry *t = &ack->entries[i];
        rl_ident *id = synced_ident(s, t->rule.ptr, t->rule.len);
        rl_synced_entry *e = id != NULL
                                 ? rl_synced_find(s->synced, id,
                                                  t->value.ptr, t->value.len)
                                 : NULL;
        if (e != NULL) {
            rl_synced_note_totals(e, t->window, t->current, t->previous);
            e->partial = true;
            rl_synced_rebalance(s->synced, e, loop_ms, false);
        }
    }
}

static void on_ack(rl_sync *s, nng_msg *m)
{
    rl_wire_msg ack;
    const char *why;
    if (rl_wire_decode(nng_msg_body(m), nng_msg_len(m), &ack, &why) != 0
        || ack.type != RL_WIRE_ACK || ack.seq != s->seq) {
        rl_log(s->log, RL_LOG_WARN, "sync_bad_ack", "reason=\"%s\"",
               why != NULL ? why : "not the ack of the pending report");
        return;
    }
    if (ack.status == RL_ACK_RETRY) {
        rl_log(s->log, RL_LOG_DEBUG, "sync_retry", "seq=%llu",
               (unsigned long long)ack.seq);
    } else {
        acknowledged(s, &ack);
        rl_wire_writer_reset(s->pending);
    }
    rl_wire_msg_free(&ack);
}

/* The REQ aio finished a send or a receive. */
static void req_finished(rl_sync *s, int result)
{
    if (s->state == REQ_SENDING && result == 0) {
        s->state = REQ_WAITING;
        rl_nng_handoff(s);
        nng_recv_aio(s->req, s->req_aio);
        return;
    }
    if (s->state == REQ_SENDING) {
        nng_msg_free(nng_aio_get_msg(s->req_aio));
        /* No aggregator took the report in two intervals: find out why
         * (a TLS handshake gets at least a second). */
        if (result == NNG_ETIMEDOUT && s->probe != NULL && !s->stopping
            && !s->probing) {
            uint32_t wait = 2 * s->config->aggregator.sync_interval_ms;
            s->probing = true;
            rl_nng_probe_start(s->probe, wait > 1000 ? (int)wait : 1000);
        }
    } else if (result == 0) {
        nng_msg *m = nng_aio_get_msg(s->req_aio);
        on_ack(s, m);
        nng_msg_free(m);
    } else {
        rl_log(s->log, RL_LOG_DEBUG, "sync_no_ack", "seq=%llu reason=\"%s\"",
               (unsigned long long)s->seq, nng_strerror(result));
    }
    s->state = REQ_IDLE;
}

static void on_totals(rl_sync *s, nng_msg *m)
{
    const char *body = nng_msg_body(m);
    size_t len = nng_msg_len(m);
    const char *nul = memchr(body, '\0', len < 80 ? len : 80);
    rl_wire_msg t;
    const char *why = "no topic";
    if (nul == NULL
        || rl_wire_decode(nul + 1, len - (size_t)(nul + 1 - body), &t, &why)
               != 0
        || t.type != RL_WIRE_TOTALS) {
        rl_log(s->log, RL_LOG_WARN, "sync_bad_totals", "reason=\"%s\"", why);
        return;
    }
    const rl_rule *rule = fleet_rule(s->rules, t.rule.ptr, t.rule.len);
    if (rule != NULL && !t.stale)
        atomic_store(&s->idents[rule - s->rules->rules]->agents, t.agents);
    rl_ident *id = synced_ident(s, t.rule.ptr, t.rule.len);
    uint64_t loop_ms = now_ms(s);
    if (id != NULL) {
        rl_synced_set_time(s->synced, t.now_ms, loop_ms);
        for (size_t i = 0; i < t.n_entries; i++) {
            rl_synced_entry *e = rl_synced_find(s->synced, id,
                                                t.entries[i].value.ptr,
                                                t.entries[i].value.len);
            if (e != NULL) {
                rl_synced_note_totals(e, t.entries[i].window,
                                      t.entries[i].current,
                                      t.entries[i].previous);
                e->partial = false;
            }
        }
        /* A fresh share for each key whose totals are this snapshot's (or
         * an older one's), not an acknowledgement's (synced.c says why). */
        rl_synced_table *table = atomic_load(&s->synced->table);
        for (size_t i = 0; i < table->cap; i++) {
            rl_synced_entry *e = atomic_load(&table->slots[i]);
            if (e != NULL && e->ident == id) {
                e->snap_ms = t.now_ms;
                rl_synced_rebalance(s->synced, e, loop_ms, !e->partial);
            }
        }
    }
    rl_wire_msg_free(&t);
}

/* Logged once per reason, until a report is acknowledged again. */
static void probe_finished(rl_sync *s, int result)
{
    s->probing = false;
    rl_nng_probe_reset(s->probe);
    if (result == 0 || result == s->probe_logged || s->stopping)
        return;
    s->probe_logged = result;
    /* A certificate refused is a configuration to fix, not an outage. */
    bool tls = result == NNG_EPEERAUTH || result == NNG_ECRYPTO;
    rl_log(s->log, tls ? RL_LOG_ERROR : RL_LOG_WARN,
           "aggregator_unreachable", "url=%s "
           "reason=\"%s\" hint=\"%s\"", s->config->aggregator.reports,
           nng_strerror(result), tls
               ? "TLS refused: check aggregator.tls (ca must have signed "
                 "the aggregator's certificate, server_name must be a name "
                 "in it, and with client_auth: required the aggregator's ca "
                 "must have signed this agent's cert)"
               : "check that rl-aggregator runs and listens on "
                 "aggregator.reports");
}

static void on_wakeup(uv_async_t *h)
{
    rl_sync *s = h->data;
    pthread_mutex_lock(&s->lock);
    bool req_done = s->req_done;
    int result = s->req_result;
    s->req_done = false;
    bool probe_done = s->probe_done;
    int probe_result = s->probe_result;
    s->probe_done = false;
    nng_msg **totals = s->totals;
    size_t n = s->n_totals;
    s->totals = NULL;
    s->n_totals = s->cap_totals = 0;
    pthread_mutex_unlock(&s->lock);
    if (req_done)
        req_finished(s, result);
    if (probe_done)
        probe_finished(s, probe_result);
    for (size_t i = 0; i < n; i++) {
        on_totals(s, totals[i]);
        nng_msg_free(totals[i]);
    }
    free(totals);
    /* Stopping, and the report that was in flight is over: the last
     * report, then close (once, as this handle closes with the rest). */
    if (s->stopping && s->state == REQ_IDLE)
        finish_stopping(s);
}

/* Until the next interval of Redis's clock, or a whole interval when that
 * clock is not known yet. */
static uint64_t until_next_tick(const rl_sync *s)
{
    uint64_t interval = s->config->aggregator.sync_interval_ms;
    uint64_t now = rl_synced_now(s->synced, now_ms(s));
    return now == 0 ? interval : interval - now % interval;
}

static void on_tick(uv_timer_t *t)
{
    rl_sync *s = t->data;
    uint64_t loop_ms = now_ms(s);
    rl_synced_table *table = atomic_load(&s->synced->table);
    uint64_t now = rl_synced_now(s->synced, loop_ms);
    for (size_t i = 0; i < table->cap; i++) {
        rl_synced_entry *e = atomic_load(&table->slots[i]);
        if (e == NULL)
            continue;
        uint64_t counted = rl_synced_counted(e);
        /* Idleness in time, not ticks: a tick comes early when the
         * estimate of Redis's clock moves, and twenty of them can be under
         * two seconds. */
        if (counted != e->last_counted || e->active_ms == 0)
            e->active_ms = loop_ms;
        e->last_counted = counted;
        /* A fresh share at every tick, from a TOTALS snapshot (or from no
         * totals at all, a cold key's), not from an acknowledgement's; the
         * report follows. */
        rl_synced_rebalance(s->synced, e, loop_ms, now != 0 && !e->partial);
    }
    if (s->state == REQ_IDLE) {
        size_t len;
        rl_wire_writer_data(s->pending, &len);
        bool have = len > 0 || build_report(s);
        if (have)
            send_pending(s);
    }
    rl_synced_sweep(s->synced, loop_ms);
    uint64_t refused = atomic_load(&s->synced->keys_refused);
    if (refused != s->refused_logged) {
        rl_log(s->log, RL_LOG_WARN, "synced_keys_capped", "refused=%llu "
               "max_keys=%zu", (unsigned long long)refused,
               s->synced->max_keys);
        s->refused_logged = refused;
    }
    uv_timer_start(&s->tick, on_tick, until_next_tick(s), 0);
}

static int open_sockets(rl_sync *s, rl_error *err)
{
    const rl_aggregator_config *agg = &s->config->aggregator;
    int rv;
    if ((rv = nng_req0_open(&s->req)) != 0
        || (rv = nng_aio_alloc(&s->req_aio, on_req, s)) != 0
        || (rv = nng_sub0_open(&s->sub)) != 0
        || (rv = nng_aio_alloc(&s->sub_aio, on_sub, s)) != 0)
        return rl_error_set(err, RL_ESYS, "cannot open nng sockets: %s",
                            nng_strerror(rv));
    /* Our own resends (the same report until acknowledged) replace REQ's. */
    nng_socket_set_ms(s->req, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE);
    nng_socket_set_size(s->sub, NNG_OPT_RECVMAXSZ,
                        s->config->aggregator.max_message_bytes);
    /* Non-blocking dials keep trying in the background: an aggregator that
     * is not up yet is not an error. */
    char why[512];
    if (rl_nng_dial(s->req, agg->reports, &agg->tls, why, sizeof why) != 0
        || rl_nng_dial(s->sub, agg->totals, &agg->tls, why, sizeof why) != 0)
        return rl_error_set(err, RL_EINVAL, "cannot dial the aggregator: %s",
                            why);
    /* None for inproc://, which has no stream to probe: no diagnosis. */
    s->probe = rl_nng_probe_new(agg->reports, &agg->tls, on_probe, s, why,
                                sizeof why);
    return RL_OK;
}

rl_sync *rl_sync_new(rl_synced *synced, const rl_config *config,
                     const rl_logger *log, rl_error *err)
{
    rl_sync *s = calloc(1, sizeof *s);
    if (s == NULL) {
        rl_error_set(err, RL_ENOMEM, "out of memory");
        return NULL;
    }
    s->synced = synced;
    s->config = config;
    s->log = log;
    pthread_mutex_init(&s->lock, NULL);
    s->pending = rl_wire_writer_new();
    /* Unique per agent instance: a restarted agent starts a new sequence. */
    snprintf(s->agent_id, sizeof s->agent_id, "%lx-%lx-%p",
             (unsigned long)getpid(), (unsigned long)uv_hrtime(), (void *)s);
    if (s->pending == NULL) {
        rl_error_set(err, RL_ENOMEM, "out of memory");
        rl_sync_free(s);
        return NULL;
    }
    if (open_sockets(s, err) != RL_OK) {
        rl_sync_free(s);
        return NULL;
    }
    return s;
}

/* Subscribes to the topics of from's rules that need a fleet size and
 * that to lacks (or unsubscribes, with opt). */
static void follow(rl_sync *s, const rl_config *from, const rl_config *to,
                   const char *opt)
{
    for (size_t i = 0; from != NULL && i < from->n_rules; i++) {
        const rl_rule *r = &from->rules[i];
        if (!needs_fleet(r)
            || fleet_rule(to, r->name, strlen(r->name)) != NULL)
            continue;
        char topic[RL_NAME_MAX + 2];
        size_t n = rl_wire_topic(r->name, topic, sizeof topic);
        nng_socket_set(s->sub, opt, topic, n);
    }
}

void rl_sync_set_rules(rl_sync *s, const rl_config *rules,
                       rl_ident *const *idents)
{
    follow(s, rules, s->rules, NNG_OPT_SUB_SUBSCRIBE);
    follow(s, s->rules, rules, NNG_OPT_SUB_UNSUBSCRIBE);
    s->rules = rules;
    s->idents = idents;
    /* The names point into rules, which outlive this generation's use. */
    size_t n = 0;
    for (size_t i = 0; rules != NULL && i < rules->n_rules; i++)
        n += needs_fleet(&rules->rules[i]);
    const char **names = n > 0 ? calloc(n, sizeof *names) : NULL;
    if (n > 0 && names == NULL)
        n = 0; /* no presence until the next reload: counts still go */
    free(s->presence);
    s->presence = names;
    s->n_presence = 0;
    for (size_t i = 0; rules != NULL && i < rules->n_rules
                       && s->n_presence < n; i++) {
        if (needs_fleet(&rules->rules[i]))
            names[s->n_presence++] = rules->rules[i].name;
    }
}

bool rl_sync_started(const rl_sync *s)
{
    return s->loop != NULL;
}

void rl_sync_start(rl_sync *s, uv_loop_t *loop)
{
    s->loop = loop;
    uv_async_init(loop, &s->wakeup, on_wakeup);
    uv_timer_init(loop, &s->tick);
    s->wakeup.data = s->tick.data = s;
    s->open_handles = 2;
    uv_timer_start(&s->tick, on_tick, until_next_tick(s), 0);
    /* Only now: a receive that completes wakes the loop through s->wakeup,
     * which exists from here on. */
    rl_nng_handoff(s);
    nng_recv_aio(s->sub, s->sub_aio);
}

static void handle_closed(uv_handle_t *h)
{
    rl_sync *s = h->data;
    if (--s->open_handles == 0)
        rl_sync_free(s);
}

/* Stops the aios, closes the handles; the sockets close with the object,
 * in rl_sync_free, once the handles are closed. */
static void close_sync(rl_sync *s)
{
    pthread_mutex_lock(&s->lock);
    s->closing = true;
    pthread_mutex_unlock(&s->lock);
    nng_aio_stop(s->req_aio);
    nng_aio_stop(s->sub_aio);
    rl_nng_probe_free(s->probe);
    s->probe = NULL;
    rl_nng_handoff(s);
    /* A request that finished after the loop's last look still holds its
     * message: an ack received, or a report nng did not take. */
    pthread_mutex_lock(&s->lock);
    bool done = s->req_done;
    int result = s->req_result;
    s->req_done = false;
    pthread_mutex_unlock(&s->lock);
    if (done && ((s->state == REQ_WAITING && result == 0)
                 || (s->state == REQ_SENDING && result != 0)))
        nng_msg_free(nng_aio_get_msg(s->req_aio));
    uv_close((uv_handle_t *)&s->wakeup, handle_closed);
    uv_close((uv_handle_t *)&s->tick, handle_closed);
}

/* At stop, what was counted since the last report goes out in one last
 * report before the sync closes, after its ack or its timeout (two
 * intervals): a gateway that stops or reloads loses no count (nginx's
 * workers close their agents at every reload). */
static void finish_stopping(rl_sync *s)
{
    size_t len;
    rl_wire_writer_data(s->pending, &len);
    /* At most two: a report cancelled at the stop, then one with what was
     * counted since; none after a report sent at the stop went unanswered
     * (it is still pending), as no aggregator takes them. */
    bool unanswered = s->stop_reports > 0 && len > 0;
    if (s->stop_reports < 2 && !unanswered && (len > 0 || build_report(s))) {
        s->stop_reports++;
        send_pending(s);
        return;
    }
    close_sync(s);
}

void rl_sync_stop(rl_sync *s)
{
    s->stopping = true;
    uv_timer_stop(&s->tick);
    /* nng 1.5.2 (Debian 12's libnng1) can lose a TCP pipe's read when the
     * pipe is closed here while a message is arriving on it: the transport
     * re-arms the read on an aio the close has stopped, nng drops it
     * silently, and the protocol's receive on that pipe never completes.
     * nng_close() then waits for the pipe forever, and so would
     * rl_agent_close() (nng issue #1813, fixed upstream by nng PR #1824).
     * The ack of a report in flight is such a message, due right after
     * each tick: close once the exchange is over, acknowledged or timed
     * out (two intervals at most). A report nng has not handed to a pipe
     * yet is cancelled, as no ack can follow it; one already sent comes
     * back through on_wakeup, which waits for its ack. */
    if (s->state == REQ_SENDING) {
        /* The cancelled report stays pending: the last report resends it
         * (same number, applied once) with what was counted since, and
         * gives it two intervals, as any report: a report is briefly
         * SENDING after every tick, not only when no aggregator is up. */
        nng_aio_cancel(s->req_aio);
    } else if (s->state == REQ_IDLE) {
        finish_stopping(s);
    }
}

void rl_sync_free(rl_sync *s)
{
    if (s == NULL)
        return;
    if (s->req_aio != NULL)
        nng_aio_free(s->req_aio);
    if (s->sub_aio != NULL)
        nng_aio_free(s->sub_aio);
    rl_nng_probe_free(s->probe);
    if (nng_socket_id(s->req) > 0)
        nng_close(s->req);
    if (nng_socket_id(s->sub) > 0)
        nng_close(s->sub);
    for (size_t i = 0; i < s->n_totals; i++)
        nng_msg_free(s->totals[i]);
    free(s->totals);
    free(s->in_report);
    free(s->presence);
    rl_wire_writer_free(s->pending);
    pthread_mutex_destroy(&s->lock);
    free(s);
}
