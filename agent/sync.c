/*
 * sync.c: the agent's conversation with the aggregators, on its I/O
 * thread. Every sync_interval_ms (at the start of each interval of Redis's
 * clock, once the agent has heard it) the counts since the last report go
 * out as REPORTs on nng REQ sockets, one link per aggregator of the
 * config; an aggregator answers once they are in Redis. Until then a
 * report is kept, and sent again, the same bytes under the same sequence
 * number, until acknowledged: the aggregators apply a sequence number
 * once, so nothing is lost and nothing counted twice while an aggregator
 * is away. Counts made meanwhile wait for the next report (one counter per
 * key: memory stays bounded).
 *
 * Several aggregators share the keys: each key goes to the aggregator
 * that partition.c picks among those up, and each link's reports form a
 * stream of their own, numbered 1, 2, 3... (the stream number is the
 * link's index; the aggregators keep one sequence per agent and stream).
 * A link goes down when its report is not acknowledged within two
 * intervals or its socket loses its connection. Its unacknowledged report
 * is not dropped nor renumbered: an up link carries it, the same bytes,
 * before its own next report, and the stream's next report is built only
 * once it is acknowledged, wherever it went: one report per stream is
 * outstanding at most, and as every aggregator shares Redis, a report the
 * lost aggregator applied without answering is a duplicate to the next.
 * The next tick gives the down link's keys to the others. A down link
 * pings its aggregator every tick (a REPORT numbered 0, never applied);
 * the answer brings it up once its totals socket is connected too, and the
 * next tick gives its keys back.
 *
 * A key that is at its mark (rejecting) and has no new counts goes in the
 * report with a count of 0: its agents send nothing else, and the ack
 * brings its totals. An agent with rules that need a fleet size (synced,
 * or on_error: local) names them in every report of every stream and
 * reports every tick, counts or not (presence), so that the aggregators
 * count it in them (in sets shared in Redis: the counts are the fleet's).
 * At the close, after its last reports, it says goodbye (GOODBYE) to the
 * aggregators that read it, and leaves those counts at once.
 *
 * Totals come on one nng SUB socket per aggregator, subscribed to those
 * rules' topics; each TOTALS message sets its rule's agent count and, for
 * a synced rule, brings its keys' totals up to date and gives the keys
 * this agent reports to that aggregator a fresh share of what is left, as
 * every tick does (synced.c): an aggregator's snapshot says nothing of the
 * keys another one applies; a LEAVING message after it (the rules' other
 * topics) says what the sub-windows that leave before the next one hold.
 * nng's threads only queue what they received and wake the loop.
 *
 * A key whose aggregator gives no totals (none fresh, nor a report of
 * this agent's applied, for aggregator.stale_after_ms, or totals that say
 * it cannot reach Redis) is degraded: its rule's on_error decides, with
 * local from this agent's own share (synced.c). When that aggregator is
 * back the report held through the outage goes at once, and the key goes
 * back to shares with the first TOTALS that hold what it counted
 * meanwhile. Counts go out by the sub-window they were made in
 * (own_counts.h) to aggregators that said, in FEATURES, that they read it.
 *
 * A global rule's (scope: global) keys' entries also say what their checks
 * refused since the last report, their region's demand, to aggregators
 * that read it (FEATURES); its TOTALS entries say the region's part of
 * the room and whether a region is cut off (synced.c), logged per rule.
 *
 * The rules are those of the I/O thread's current generation
 * (rl_sync_set_rules, on a reload): topics follow them, and totals of a
 * rule no longer there are dropped. Keys of a rule reloaded away are still
 * reported until their counts are acknowledged: no count is lost.
 */
#include "sync.h"

#include "fallback.h"

#include "nng_tls.h"

#include "nng_handoff.h"
#include "nng_sub.h"
#include "partition.h"
#include "wire.h"

#include <nng/nng.h>
#include <nng/protocol/pubsub0/sub.h>
#include <nng/protocol/reqrep0/req.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct reported {
    rl_synced_entry *entry;
    uint64_t count;
    bool back;          /* a give-back's entry (count 0) */
} reported;

typedef enum req_state { REQ_IDLE, REQ_SENDING, REQ_WAITING } req_state;

struct agg_link;

/* One stream of reports, the one of the link of the same index: its
 * sequence and the report waiting for its ack, on whichever link carries
 * it. Loop thread only. */
typedef struct stream {
    uint64_t seq;
    rl_wire_writer *pending;    /* the report waiting for its ack */
    reported *in_report;
    size_t n_in_report;
    struct agg_link *carrier;       /* the link it is on now, or NULL */
    int sends;                  /* times the pending report went out */
    int stop_reports;           /* reports sent since rl_sync_stop */
} stream;

/* The conversation with one aggregator. */
typedef struct agg_link {
    struct rl_sync *s;
    size_t index;
    nng_socket req;
    rl_nng_sub sub;             /* its TOTALS (nng_sub.h: its close) */
    nng_aio *req_aio, *sub_aio;
    /* nng threads -> loop, under s->lock. */
    bool req_done;              /* the REQ aio finished: result below */
    int req_result;
    bool probe_done;            /* the probe finished: result below */
    int probe_result;
    int pipes;                  /* the REQ socket's connections */
    bool pipe_lost;             /* its last one closed */
    nng_msg **totals;           /* received TOTALS, in order */
    size_t n_totals, cap_totals;
    /* Loop thread only. */
    req_state state;
    bool up;
    stream *sending;            /* whose report is on the REQ; NULL: ping */
    bool owes_own;              /* carried another's report at the tick */
    stream own;
    rl_nng_probe *probe;        /* why the reports URL cannot be reached */
    bool probing;
    int probe_logged;           /* the reason last logged; 0 after an ack */
    int acks_unheard;           /* answers in a row with no totals socket */
    /* Its totals: when it last sent fresh ones, whether the last it sent
     * said it cannot reach Redis (stale), and when it last answered a
     * report from Redis (a heartbeat of an aggregator whose Redis is
     * stopped still says fresh until its connection is given up). */
    uint64_t fresh_ms;
    bool stale_heard;
    uint64_t applied_ms;
    uint64_t features;          /* its FEATURES (wire.h), once heard */
} agg_link;

struct rl_sync {
    rl_synced *synced;
    const rl_config *config;    /* the aggregator settings */
    const rl_config *rules;     /* the I/O thread's generation's rules */
    rl_ident *const *idents;    /* and their identities, by index */
    const char **presence;      /* names of its rules that need a fleet */
    size_t n_presence;
    const rl_logger *log;
    uv_loop_t *loop;
    agg_link *links;                /* one per aggregator of the config */
    size_t n_links;
    rl_wire_writer *ping;       /* scratch for pings */
    uv_async_t wakeup;
    uv_timer_t tick;
    pthread_mutex_t lock;       /* nng threads -> loop */
    bool started;               /* wakeup exists: nng threads may wake */
    bool closing;
    /* Loop thread only. */
    bool stopping;              /* rl_sync_stop was called */
    bool goodbye_said;          /* the GOODBYEs went out (or none could) */
    char agent_id[RL_WIRE_ID_MAX + 1];
    uint64_t refused_logged;    /* keys refused at the cap, as last logged */
    uint64_t ticked_interval;   /* Redis's clock's interval last ticked in */
    uint64_t woke_at;           /* Redis's clock at the last tick or edge */
    int open_handles;
};

static void close_sync(rl_sync *s);
static void finish_stopping(rl_sync *s);
static void recovered(rl_sync *s, rl_synced_entry *e, uint64_t loop_ms);

static uint64_t now_ms(const rl_sync *s)
{
    return uv_now(s->loop);
}

static uint32_t interval_ms(const rl_sync *s)
{
    return s->config->aggregator.sync_interval_ms;
}

/* nng threads: note and wake. */
static void on_req(void *arg)
{
    agg_link *l = arg;
    rl_nng_handoff(l);
    rl_sync *s = l->s;
    pthread_mutex_lock(&s->lock);
    l->req_done = true;
    l->req_result = nng_aio_result(l->req_aio);
    if (!s->closing)
        uv_async_send(&s->wakeup);
    pthread_mutex_unlock(&s->lock);
    rl_nng_handoff(l);
}

/* A connection to the aggregator came or went: losing the last one takes
 * the link down at once, rather than after two intervals. */
static void on_pipe(nng_pipe pipe, nng_pipe_ev ev, void *arg)
{
    agg_link *l = arg;
    rl_nng_handoff(l);
    rl_sync *s = l->s;
    (void)pipe;
    pthread_mutex_lock(&s->lock);
    if (ev == NNG_PIPE_EV_ADD_POST) {
        l->pipes++;
    } else if (l->pipes > 0 && --l->pipes == 0) {
        l->pipe_lost = true;
        /* Connections come and go before the start too, and at the
         * close: there is no loop to wake then. */
        if (s->started && !s->closing)
            uv_async_send(&s->wakeup);
    }
    pthread_mutex_unlock(&s->lock);
    rl_nng_handoff(l);
}

static void on_probe(void *arg, int result)
{
    agg_link *l = arg;
    rl_nng_handoff(l);
    rl_sync *s = l->s;
    pthread_mutex_lock(&s->lock);
    l->probe_done = true;
    l->probe_result = result;
    if (!s->closing)
        uv_async_send(&s->wakeup);
    pthread_mutex_unlock(&s->lock);
}

static void on_sub(void *arg)
{
    agg_link *l = arg;
    rl_nng_handoff(l);
    rl_sync *s = l->s;
    pthread_mutex_lock(&s->lock);
    int rv = nng_aio_result(l->sub_aio);
    if (rv == 0) {
        nng_msg *m = nng_aio_get_msg(l->sub_aio);
        if (l->n_totals == l->cap_totals) {
            size_t cap = l->cap_totals ? 2 * l->cap_totals : 16;
            nng_msg **grown = cap <= 4096
                                  ? realloc(l->totals, cap * sizeof *grown)
                                  : NULL;
            if (grown != NULL) {
                l->totals = grown;
                l->cap_totals = cap;
            }
        }
        if (l->n_totals < l->cap_totals)
            l->totals[l->n_totals++] = m;
        else
            nng_msg_free(m); /* the loop is far behind: the next will do */
    }
    bool again = !s->closing && rv != NNG_ECLOSED && rv != NNG_ECANCELED;
    if (!s->closing)
        uv_async_send(&s->wakeup);
    pthread_mutex_unlock(&s->lock);
    if (again) {
        rl_nng_handoff(l);
        nng_recv_aio(l->sub.sock, l->sub_aio);
    }
    rl_nng_handoff(l);
}

/* The refusals of a global rule's key the next report carries, when
 * every aggregator reads them (demand): those since its last report. They
 * go with a count's sub-window, so only once the key's counts are recorded
 * by Redis's clock; until then they wait. */
static uint64_t refusals_due(const rl_synced_entry *e, bool demand)
{
    if (!demand || e->ident->io_rule == NULL || !e->ident->io_rule->global
        || !rl_synced_by_redis(e) || e->own.newest == 0)
        return 0;
    return rl_synced_refused(e) - e->refusals_reported;
}

/* Whether an entry goes in the next report: it has new counts, or new
 * refusals (demand), or it is at its mark with none (its count of 0 asks
 * for fresh totals: a key whose agents all reject sends nothing else, and
 * would wait for totals that no count triggers). */
static bool to_report(const rl_synced_entry *e, bool demand)
{
    uint64_t counted = rl_synced_counted(e);
    rl_own_part backs[RL_OWN_WINDOWS + 1];
    if (rl_own_backs(&e->own, backs) > 0 || refusals_due(e, demand) > 0)
        return true;
    /* A refused key asks too: under on_error: deny it counts nothing, and
     * would never hear that its rule is taken again. */
    return counted > e->reported
           || (e->ident->io_rule != NULL
               && (e->refused
                   || counted >= atomic_load_explicit(&e->mark,
                                                      memory_order_relaxed)));
}

/* Gives every key to its aggregator among those up now (partition.c). */
static void assign_owners(rl_sync *s)
{
    bool up[RL_AGGREGATORS_MAX];
    for (size_t i = 0; i < s->n_links; i++)
        up[i] = s->links[i].up;
    rl_synced_table *t = atomic_load(&s->synced->table);
    for (size_t i = 0; i < t->cap; i++) {
        rl_synced_entry *e = atomic_load(&t->slots[i]);
        if (e == NULL)
            continue;
        if (!e->spread_known) {
            e->spread = rl_partition_key(e->ident->name, e->value,
                                         e->value_len);
            e->spread_known = true;
        }
        e->owner = (uint8_t)rl_partition_owner(e->spread, up, s->n_links);
    }
}

/* Whether every aggregator of the config reads what the bits of feature
 * say (FEATURES, wire.h): a report goes wherever its stream's link is
 * carried, and an aggregator that does not read a field refuses the whole
 * report. */
static bool all_read(const rl_sync *s, uint64_t feature)
{
    for (size_t i = 0; i < s->n_links; i++) {
        if (!(s->links[i].features & feature))
            return false;
    }
    return true;
}

/* Whether every aggregator of the config reads the sub-window of a
 * report's counts. */
static bool windows_read(const rl_sync *s)
{
    return all_read(s, RL_WIRE_FEATURE_WINDOWS);
}

/* Whether every aggregator of the config reads give-backs (negative
 * counts). */
static bool givebacks_read(const rl_sync *s)
{
    return all_read(s, RL_WIRE_FEATURE_GIVEBACK);
}

/* The give-backs a key's report entries take off their sub-windows
 * (newest first; none when the report names no sub-window). Only once
 * no other report holds the key's counts: the one whose estimate a
 * give-back takes back is then applied, or in this report, before it
 * (a give-back applied first would find nothing to take, and be lost to
 * the floor at 0). */
static size_t giveback_parts(const rl_synced_entry *e, bool windows,
                             rl_own_part *parts)
{
    if (!windows || e->ident->io_rule == NULL || !rl_synced_by_redis(e)
        || e->in_report > 0)
        return 0;
    return rl_own_backs(&e->own, parts);
}

/* The entries a key's unreported counts go out in: one per sub-window
 * they were made in (newest first) when the aggregators read it, else
 * one (window 0: counted where it arrives); at most `most`, the oldest
 * counts put with the oldest kept (later rather than lost). A key with
 * nothing new but at its mark gets one entry of 0, which asks for its
 * totals; one with refusals due (refused) gets it in its newest
 * sub-window, which they go with. */
static size_t report_parts(const rl_synced_entry *e, bool windows,
                           bool refused, size_t most, rl_own_part *parts)
{
    bool recorded = e->ident->io_rule != NULL;
    uint64_t counted = recorded ? e->own.counted : rl_synced_counted(e);
    /* Only sub-windows of Redis's clock: the wall clock that stands for it
     * before the agent hears it may be off by more than a period. */
    size_t n = windows && recorded && rl_synced_by_redis(e)
                   ? rl_own_split(&e->own, e->reported, parts)
                   : 0;
    if (n == 0) {
        parts[0] = (rl_own_part){refused ? e->own.newest : 0,
                                 counted > e->reported
                                     ? counted - e->reported : 0};
        return 1;
    }
    for (; n > most && n > 1; n--)
        parts[n - 2].count += parts[n - 1].count;
    return n;
}

/* Picks the keys of l's next report within both caps (entries, and bytes:
 * each entry's rule name, value and counts, with room for msgpack's
 * framing, after the presence names), their counts recorded by sub-window
 * first; the rest go in the next report. Returns its entries. */
static size_t pick_report(rl_sync *s, agg_link *l, bool windows,
                          bool givebacks, bool demand)
{
    rl_synced_table *t = atomic_load(&s->synced->table);
    const rl_aggregator_config *agg = &s->config->aggregator;
    uint64_t loop_ms = now_ms(s);
    rl_own_part parts[RL_OWN_WINDOWS + 1];
    size_t n = 0, bytes = 1024;
    for (size_t i = 0; i < s->n_presence; i++)
        bytes += strlen(s->presence[i]) + 8;
    for (size_t i = 0; i < t->cap && n < agg->max_entries; i++) {
        rl_synced_entry *e = atomic_load(&t->slots[i]);
        if (e == NULL || e->owner != l->index || !to_report(e, demand))
            continue;
        rl_synced_record(s->synced, e, loop_ms, 0);
        size_t k = report_parts(e, windows, refusals_due(e, demand) > 0,
                                agg->max_entries - n, parts);
        size_t b = givebacks ? giveback_parts(e, windows, parts) : 0;
        if (b > agg->max_entries - n - k)
            b = 0; /* the next report takes them */
        bytes += (k + b) * (strlen(e->ident->name) + e->value_len + 40);
        if (bytes > agg->max_message_bytes)
            break;
        e->report_parts = (uint8_t)k;
        e->report_backs = (uint8_t)b;
        n += k + b;
    }
    return n;
}

/* Puts the give-backs pick_report chose for e after its counts, from
 * entry k of the report on (answered as entries of no count), or, to
 * aggregators that do not read them, drops what it owes: the fleet keeps
 * counting those estimates. Returns the entries put. */
static size_t put_givebacks(stream *st, size_t k, rl_synced_entry *e,
                            bool givebacks)
{
    rl_own_part backs[RL_OWN_WINDOWS + 1];
    size_t b = e->report_backs;
    e->report_backs = 0;
    /* Not yet: they wait for a later report (a rule reloaded away has
     * none to wait for). */
    if (givebacks && b == 0 && e->ident->io_rule != NULL)
        return 0;
    rl_own_backs(&e->own, backs);
    for (size_t i = 0; i < b; i++) {
        rl_wire_put_giveback_at(st->pending, e->ident->name, e->value,
                                e->value_len, backs[i].count,
                                rl_synced_window_start(e, backs[i].window));
        st->in_report[k + i] = (reported){e, 0, true};
    }
    rl_own_backs_clear(&e->own);
    return b;
}

/* Builds the next report of l's stream from what l's keys counted since
 * the last. */
static bool build_report(rl_sync *s, agg_link *l)
{
    rl_synced_table *t = atomic_load(&s->synced->table);
    stream *st = &l->own;
    bool windows = windows_read(s);
    bool givebacks = windows && givebacks_read(s);
    bool demand = windows && all_read(s, RL_WIRE_FEATURE_DEMAND);
    size_t n = pick_report(s, l, windows, givebacks, demand);
    /* Stopping, presence alone is not sent (finish_stopping). */
    if (n == 0 && (s->n_presence == 0 || s->stopping))
        return false;
    st->in_report = calloc(n + 1, sizeof *st->in_report);
    if (st->in_report == NULL) {
        for (size_t i = 0; i < t->cap; i++) {
            rl_synced_entry *e = atomic_load(&t->slots[i]);
            if (e != NULL)
                e->report_parts = e->report_backs = 0;
        }
        return false;
    }
    rl_wire_writer_reset(st->pending);
    rl_wire_begin_report_stream(st->pending, s->agent_id, ++st->seq, n,
                                l->index);
    st->sends = 0;
    size_t k = 0;
    rl_own_part parts[RL_OWN_WINDOWS + 1];
    for (size_t i = 0; i < t->cap && k < n; i++) {
        rl_synced_entry *e = atomic_load(&t->slots[i]);
        if (e == NULL || e->report_parts == 0)
            continue;
        /* The picked keys, whatever was counted since: the message's
         * length is said. The table only changes on this thread. */
        uint64_t refused = refusals_due(e, demand);
        size_t np = report_parts(e, windows, refused > 0, e->report_parts,
                                 parts);
        e->report_parts = 0;
        /* A global rule's entries say what was refused too, with the
         * first (newest) sub-window's count. */
        bool global = demand && e->ident->io_rule != NULL
                      && e->ident->io_rule->global;
        e->refusals_reported += refused;
        for (size_t p = 0; p < np; p++) {
            uint64_t at = rl_synced_window_start(e, parts[p].window);
            if (parts[p].window > 0 && global)
                rl_wire_put_demand_at(st->pending, e->ident->name, e->value,
                                      e->value_len, parts[p].count, 0, at,
                                      p == 0 ? refused : 0);
            else if (parts[p].window > 0)
                rl_wire_put_count_at(st->pending, e->ident->name, e->value,
                                     e->value_len, parts[p].count, at);
            else
                rl_wire_put_count(st->pending, e->ident->name, e->value,
                                  e->value_len, parts[p].count);
            e->reported += parts[p].count;
            e->in_report += parts[p].count;
            st->in_report[k++] = (reported){e, parts[p].count, false};
        }
        k += put_givebacks(st, k, e, givebacks);
    }
    rl_wire_put_presence(st->pending, s->presence, s->n_presence);
    st->n_in_report = k;
    return true;
}

static bool has_pending(const stream *st)
{
    size_t len;
    rl_wire_writer_data(st->pending, &len);
    return len > 0;
}

/* Sends what w holds on l: st's pending report, or a message answered
 * like a ping (st NULL). */
static void send_message(agg_link *l, rl_wire_writer *w, stream *st)
{
    rl_sync *s = l->s;
    size_t len;
    const void *data = rl_wire_writer_data(w, &len);
    nng_msg *m;
    if (nng_msg_alloc(&m, 0) != 0)
        return;
    if (nng_msg_append(m, data, len) != 0) {
        nng_msg_free(m);
        return;
    }
    nng_aio_set_msg(l->req_aio, m);
    nng_aio_set_timeout(l->req_aio, 2 * interval_ms(s));
    l->state = REQ_SENDING;
    l->sending = st;
    if (st != NULL) {
        st->carrier = l;
        st->sends++;
    }
    rl_nng_handoff(l);
    nng_send_aio(l->req, l->req_aio);
}

/* Sends st's pending report on l, or a ping when st is NULL. */
static void send_on(agg_link *l, stream *st)
{
    rl_sync *s = l->s;
    if (st == NULL) {
        rl_wire_writer_reset(s->ping);
        rl_wire_begin_report(s->ping, s->agent_id, 0, 0);
    }
    send_message(l, st != NULL ? st->pending : s->ping, st);
}

static bool any_up(const rl_sync *s)
{
    for (size_t i = 0; i < s->n_links; i++) {
        if (s->links[i].up)
            return true;
    }
    return false;
}

/* A report of a down link's stream that no link carries. */
static stream *orphan(rl_sync *s)
{
    for (size_t i = 0; i < s->n_links; i++) {
        stream *st = &s->links[i].own;
        if (!s->links[i].up && st->carrier == NULL && has_pending(st))
            return st;
    }
    return NULL;
}

/* Gives an idle link its next report. An up link carries a down link's
 * report first, then its own (resent, or built, at a tick or when it owes
 * one: the stream's next report only once the last is acknowledged). A
 * down link pings; only when no link is up does it resend or build its
 * own report (its keys are its own then, as with one aggregator). nng's REQ holds a send until it
 * has a connection: with the aggregator away, the two-interval timeout
 * ends it. */
static void serve(agg_link *l, bool tick)
{
    rl_sync *s = l->s;
    if (l->state != REQ_IDLE)
        return;
    stream *own = &l->own;
    if (l->up) {
        stream *st = orphan(s);
        if (st != NULL) {
            l->owes_own = l->owes_own || tick;
            send_on(l, st);
            return;
        }
        if (!tick && !l->owes_own)
            return;
        l->owes_own = false;
        if (own->carrier == NULL
            && (has_pending(own) || build_report(s, l)))
            send_on(l, own);
        return;
    }
    if (!tick)
        return;
    /* With another link up, this one's report is theirs to carry (taken
     * here, it would wait two more intervals on a link that is away). */
    if (own->carrier == NULL && !any_up(s)
        && (has_pending(own) || build_report(s, l)))
        send_on(l, own);
    else
        send_on(l, NULL);
}

/* Up links first, so that a down link's report goes to one of them. */
static void serve_all(rl_sync *s, bool tick)
{
    for (size_t i = 0; i < s->n_links; i++) {
        if (s->links[i].up)
            serve(&s->links[i], tick);
    }
    for (size_t i = 0; i < s->n_links; i++) {
        if (!s->links[i].up)
            serve(&s->links[i], tick);
    }
}

static void link_down(agg_link *l, const char *why)
{
    if (!l->up)
        return;
    l->up = false;
    rl_log(l->s->log, RL_LOG_WARN, "aggregator_down", "index=%zu url=%s "
           "reason=\"%s\"", l->index,
           l->s->config->aggregator.endpoints[l->index].reports, why);
}

/* Whether a rule needs the fleet's size: a synced rule shares its limit
 * among the agents, a leased one sizes its leases by it, an on_error:
 * local one falls back to limit / agents. */
static bool needs_fleet(const rl_rule *r)
{
    return r->mode == RL_MODE_SYNCED || r->mode == RL_MODE_LEASED
           || r->on_error == RL_ON_ERROR_LOCAL;
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

/* A report that waited out an outage is in: what was counted since, held
 * back by it, goes now rather than at the next tick, so that the fleet's
 * next totals hold it (the keys degraded meanwhile go back to shares only
 * then). */
static void after_held(stream *st)
{
    agg_link *own = (agg_link *)((char *)st - offsetof(agg_link, own));
    if (st->sends > 1 && own->up)
        own->owes_own = true;
}

/* Whether the ack's entry i says its count was refused, not counted: its
 * aggregator has no such synced rule (a reload removed it there). An ack
 * answers every entry of the report, in order; an older aggregator drops
 * such entries from it instead, and says nothing this agent can act on. */
static bool refused(const stream *st, const rl_wire_msg *ack, size_t i)
{
    return ack->n_entries == st->n_in_report && ack->entries[i].window == 0;
}

/* Said once per rule until its counts are taken again: the rule is
 * decided by its on_error meanwhile (follow_totals). */
static void log_refused(rl_sync *s, agg_link *l, rl_synced_entry *e,
                        uint64_t count)
{
    rl_ident *id = e->ident;
    if (id->io_refused)
        return;
    id->io_refused = true;
    rl_log(s->log, RL_LOG_WARN, "synced_refused", "rule=%s url=%s "
           "refused=%llu on_error=%s reason=\"the aggregator has no synced "
           "rule of this name (a reload removed, renamed or changed it "
           "there): its counts are not counted, and this rule's on_error "
           "decides until the aggregator and this agent have the same "
           "rules\"", id->name, s->config->aggregator.endpoints[l->index].reports,
           (unsigned long long)count,
           id->io_rule != NULL ? rl_on_error_name(id->io_rule->on_error)
                               : "none (reloaded away here)");
}

static void acknowledged(rl_sync *s, agg_link *l, stream *st,
                         const rl_wire_msg *ack)
{
    after_held(st);
    for (size_t i = 0; i < st->n_in_report; i++) {
        rl_synced_entry *e = st->in_report[i].entry;
        /* A key's entries (one per sub-window) sit together: what it had
         * acknowledged before this ack is taken at its first. */
        if (i == 0 || st->in_report[i - 1].entry != e) {
            e->acked_prior = e->acked;
            e->acked_ms = ack->now_ms != 0 ? ack->now_ms : UINT64_MAX;
        }
        if (refused(st, ack, i)) {
            e->refused_counts += st->in_report[i].count;
            e->refused = true;
            log_refused(s, l, e, st->in_report[i].count);
        } else {
            e->acked += st->in_report[i].count;
            if (st->in_report[i].back && ack->now_ms != 0)
                e->back_ms = ack->now_ms;
        }
        e->in_report -= st->in_report[i].count;
    }
    free(st->in_report);
    st->in_report = NULL;
    st->n_in_report = 0;
    rl_wire_writer_reset(st->pending);
    uint64_t loop_ms = now_ms(s);
    for (size_t i = 0; i < ack->n_entries; i++) {
        const rl_wire_entry *t = &ack->entries[i];
        rl_ident *id = synced_ident(s, t->rule.ptr, t->rule.len);
        rl_synced_entry *e = id != NULL
                                 ? rl_synced_find(s->synced, id,
                                                  t->value.ptr, t->value.len)
                                 : NULL;
        if (e != NULL && t->window != 0) {
            e->refused = false;
            e->ident->io_refused = false;
            if (rl_synced_note_totals(s->synced, e, t->window, ack->now_ms,
                                      t->current, t->previous))
                e->foreign_ms = 0;
            else if (e->foreign_ms == 0)
                e->foreign_ms = loop_ms;
        }
        if (e != NULL) {
            e->partial = true;
            rl_synced_rebalance(s->synced, e, loop_ms, false);
        }
    }
}

/* Both sockets redial within an interval: reports answered this many
 * times in a row while the totals socket has no connection mean its
 * address cannot be reached, not a restart still under way. */
#define ACKS_UNHEARD_LOGGED 3

/* Whether the agent can hear the totals of l's aggregator, which has just
 * answered. Said once when it cannot, naming the totals address: the link
 * stays down (its keys with the others), or, up since the start, its keys
 * get no fresh shares, and the reports' side looks healthy. */
static bool totals_heard(agg_link *l)
{
    if (rl_nng_sub_connected(&l->sub)) {
        l->acks_unheard = 0;
        return true;
    }
    if (++l->acks_unheard == ACKS_UNHEARD_LOGGED) {
        const rl_aggregator_endpoint *e =
            &l->s->config->aggregator.endpoints[l->index];
        rl_log(l->s->log, RL_LOG_WARN, "aggregator_totals_unreachable",
               "index=%zu url=%s reports=%s hint=\"the aggregator answers "
               "reports but this agent cannot connect to its totals: check "
               "that rl-aggregator listens on this address (its totals "
               "entry) and that the agent can reach it\"", l->index,
               e->totals, e->reports);
    }
    return false;
}

/* Whether l's totals can be had: within aggregator.stale_after_ms it sent
 * fresh ones and applied a report of this agent's, and it did not say
 * since that it cannot reach Redis. The keys it gives totals of are
 * degraded otherwise. */
static bool link_stale(const agg_link *l, uint64_t loop_ms)
{
    uint64_t most = l->s->config->aggregator.stale_after_ms;
    return l->stale_heard || loop_ms - l->fresh_ms > most
           || loop_ms - l->applied_ms > most;
}

/* How long a key's totals may come numbered in another period before its
 * on_error decides: a reload that reaches one side first is followed by
 * the other's within moments, and meanwhile the key gets no fresh share
 * (its mark only comes down), which admits less, never more; past this,
 * the configs differ for good. */
#define FOREIGN_STALE_AFTERS 10

/* Whether a key's totals can be had: its aggregator's can, it takes the
 * key's counts (a refusal says it has no such rule), and it numbers them
 * in the rule's period here, or did lately. */
static bool key_stale(const rl_sync *s, const rl_synced_entry *e,
                      uint64_t loop_ms)
{
    uint64_t most = FOREIGN_STALE_AFTERS
                    * (uint64_t)s->config->aggregator.stale_after_ms;
    return link_stale(&s->links[e->owner], loop_ms) || e->refused
           || (e->foreign_ms != 0 && loop_ms - e->foreign_ms > most);
}

/* l gives fresh totals again: the report its stream held through the
 * outage goes now (a down link asks first whether it is up), not at the
 * next tick, so that the keys degraded meanwhile are back on shares
 * within the next totals. */
static void catch_up(agg_link *l)
{
    if (l->up) {
        l->owes_own = l->owes_own
                      || (has_pending(&l->own) && l->own.carrier == NULL);
    } else if (l->state == REQ_IDLE && !l->s->stopping) {
        send_on(l, NULL);
    }
}

static void on_ack(agg_link *l, nng_msg *m)
{
    rl_sync *s = l->s;
    stream *st = l->sending;
    rl_wire_msg ack;
    const char *why;
    if (rl_wire_decode(nng_msg_body(m), nng_msg_len(m), &ack, &why) != 0
        || ack.type != RL_WIRE_ACK
        || ack.seq != (st != NULL ? st->seq : 0)) {
        rl_log(s->log, RL_LOG_WARN, "sync_bad_ack", "reason=\"%s\"",
               why != NULL ? why : "not the ack of the pending report");
        return;
    }
    if (ack.status == RL_ACK_RETRY) {
        rl_log(s->log, RL_LOG_DEBUG, "sync_retry", "seq=%llu",
               (unsigned long long)ack.seq);
    } else {
        /* Answered, with Redis's clock: the aggregator is up, once this
         * agent hears its totals too (the two sockets redial on their
         * own): keys given back before then would get no totals. */
        bool heard = totals_heard(l);
        bool was_stale = link_stale(l, now_ms(s));
        l->applied_ms = now_ms(s);
        if (was_stale && !link_stale(l, now_ms(s)))
            catch_up(l);
        if (!l->up && heard) {
            rl_log(s->log, RL_LOG_INFO, "aggregator_up", "index=%zu url=%s",
                   l->index,
                   s->config->aggregator.endpoints[l->index].reports);
            l->up = true;
            if (!link_stale(l, now_ms(s)))
                catch_up(l);
        }
        l->probe_logged = 0;
        if (ack.now_ms != 0)
            rl_synced_set_time(s->synced, ack.now_ms, now_ms(s));
        if (st != NULL)
            acknowledged(s, l, st, &ack);
    }
    rl_wire_msg_free(&ack);
}

/* The REQ aio finished a send or a receive. */
static void req_finished(agg_link *l, int result)
{
    rl_sync *s = l->s;
    if (l->state == REQ_SENDING && result == 0) {
        l->state = REQ_WAITING;
        rl_nng_handoff(l);
        nng_recv_aio(l->req, l->req_aio);
        return;
    }
    if (l->state == REQ_SENDING) {
        nng_msg_free(nng_aio_get_msg(l->req_aio));
        /* No aggregator took the report in two intervals: find out why
         * (a TLS handshake gets at least a second). */
        if (result == NNG_ETIMEDOUT && l->probe != NULL && !s->stopping
            && !l->probing) {
            uint32_t wait = 2 * interval_ms(s);
            l->probing = true;
            rl_nng_handoff(l);
            rl_nng_probe_start(l->probe, wait > 1000 ? (int)wait : 1000);
        }
    } else if (result == 0) {
        nng_msg *m = nng_aio_get_msg(l->req_aio);
        on_ack(l, m);
        nng_msg_free(m);
    } else {
        rl_log(s->log, RL_LOG_DEBUG, "sync_no_ack", "index=%zu seq=%llu "
               "reason=\"%s\"", l->index,
               (unsigned long long)(l->sending ? l->sending->seq : 0),
               nng_strerror(result));
    }
    /* Cancelled: by the stop (the link is not at fault) or because the
     * link went down already. */
    if (result != 0 && result != NNG_ECANCELED)
        link_down(l, nng_strerror(result));
    if (l->sending != NULL)
        l->sending->carrier = NULL;
    l->sending = NULL;
    l->state = REQ_IDLE;
}

/* The agent count of a rule's TOTALS. While the rule is degraded, and for
 * a period after, a count below the one known is not taken: the live sets
 * it is read from lose every agent that has not reported for a few
 * intervals, as none could through the outage, and fill as the agents'
 * reports come back, the first few saying one or two agents (each agent
 * would take the whole room). A fleet that did shrink meanwhile errs low
 * for that period. */
static void take_agents(rl_ident *id, const rl_rule *rule, uint64_t agents,
                        uint64_t loop_ms)
{
    bool refilling = id->io_degraded_ms != 0
                     || (id->io_recovered_ms != 0
                         && loop_ms - id->io_recovered_ms < rule->period_ms);
    if (refilling && agents < atomic_load(&id->agents))
        return;
    atomic_store(&id->agents, agents);
}

/* What the aggregator of l reads (FEATURES, wire.h). */
static void on_features(agg_link *l, const char *body, size_t len)
{
    rl_wire_msg f;
    const char *why;
    if (rl_wire_decode(body, len, &f, &why) != 0) {
        rl_log(l->s->log, RL_LOG_WARN, "sync_bad_features", "reason=\"%s\"",
               why);
        return;
    }
    if (f.type == RL_WIRE_FEATURES)
        l->features = f.features;
    else
        rl_log(l->s->log, RL_LOG_WARN, "sync_bad_features",
               "reason=\"not a FEATURES message\"");
    rl_wire_msg_free(&f);
}

/* Fresh totals, or stale ones (the aggregator cannot reach Redis). */
static void totals_came(agg_link *l, bool stale, uint64_t loop_ms)
{
    bool was_stale = link_stale(l, loop_ms);
    l->stale_heard = stale;
    if (!stale)
        l->fresh_ms = loop_ms;
    if (was_stale && !stale)
        catch_up(l);
}

/* One line when a global rule's first key is cut off from a region (its
 * decisions are degraded: the region's last part of the room stands for
 * it), one when none is; keys is how many are now. */
static void say_cut(rl_sync *s, rl_ident *id, size_t keys)
{
    if (keys > 0 && !id->io_cut)
        rl_log(s->log, RL_LOG_WARN, "region_cut", "rule=%s keys=%zu "
               "reason=\"the aggregators have not heard a region for a "
               "while: each region keeps its last part of the limit, and "
               "this rule's decisions are marked degraded until they hear "
               "it again\"", id->name, keys);
    else if (keys == 0 && id->io_cut)
        rl_log(s->log, RL_LOG_INFO, "region_healed", "rule=%s", id->name);
    id->io_cut = keys > 0;
}

/* A message of the given type after its topic ("rule\0"), into *t; false
 * (logged) when it is not one. */
static bool decode_after_topic(rl_sync *s, const char *body, size_t len,
                               int type, rl_wire_msg *t)
{
    const char *nul = memchr(body, '\0', len < 80 ? len : 80);
    const char *why = "no topic";
    if (nul != NULL
        && rl_wire_decode(nul + 1, len - (size_t)(nul + 1 - body), t, &why)
               == 0) {
        if (t->type == type)
            return true;
        rl_wire_msg_free(t);
        why = "another message under the topic";
    }
    rl_log(s->log, RL_LOG_WARN, "sync_bad_totals", "reason=\"%s\"", why);
    return false;
}

/* LEAVING (wire.h), after its topic's first byte: noted for the keys
 * whose recent came in the TOTALS message it follows. */
static void on_leaving(agg_link *l, const char *body, size_t len)
{
    rl_sync *s = l->s;
    rl_wire_msg t;
    if (!decode_after_topic(s, body, len, RL_WIRE_LEAVING, &t))
        return;
    rl_ident *id = synced_ident(s, t.rule.ptr, t.rule.len);
    for (size_t i = 0; id != NULL && i < t.n_entries; i++) {
        const rl_wire_entry *x = &t.entries[i];
        rl_synced_entry *e = rl_synced_find(s->synced, id, x->value.ptr,
                                            x->value.len);
        /* A global key's totals are its owner's only (on_totals). */
        if (e != NULL && !(id->io_rule != NULL && id->io_rule->global
                           && e->owner != l->index))
            rl_synced_note_leaving(e, x->window, t.now_ms, x->leaving,
                                   x->n_leaving);
    }
    rl_wire_msg_free(&t);
}

/* Totals from link l's aggregator. Every key's totals are noted (an
 * agent that saw the aggregators up or down a moment apart from this one
 * may have sent it a key this one sends elsewhere), but only the keys
 * this agent reports to l get a fresh share: the message is a snapshot of
 * what l applied, and says nothing of this agent's acknowledged reports
 * to another aggregator. */
static void on_totals(agg_link *l, nng_msg *m)
{
    rl_sync *s = l->s;
    const char *body = nng_msg_body(m);
    size_t len = nng_msg_len(m);
    if (len >= RL_WIRE_FEATURES_TOPIC_LEN && body[0] == '\0') {
        on_features(l, body + RL_WIRE_FEATURES_TOPIC_LEN,
                    len - RL_WIRE_FEATURES_TOPIC_LEN);
        return;
    }
    if (len > 0 && body[0] == RL_WIRE_LEAVING_TOPIC) {
        on_leaving(l, body + 1, len - 1);
        return;
    }
    rl_wire_msg t;
    if (!decode_after_topic(s, body, len, RL_WIRE_TOTALS, &t))
        return;
    /* An agent count of 0 is one not known: an aggregator that has
     * applied nothing since it started (back from a crash, say) has read
     * none from Redis yet. Taken as the fleet's size, it would give every
     * agent the whole room (share_of divides by one). Stale totals carry
     * the last count known: an agent that starts while Redis is away
     * divides by it, not by one. */
    const rl_rule *rule = fleet_rule(s->rules, t.rule.ptr, t.rule.len);
    uint64_t loop_ms = now_ms(s);
    if (rule != NULL && t.agents > 0)
        take_agents(s->idents[rule - s->rules->rules], rule, t.agents,
                    loop_ms);
    rl_ident *id = synced_ident(s, t.rule.ptr, t.rule.len);
    totals_came(l, t.stale, loop_ms);
    if (id != NULL) {
        rl_synced_set_time(s->synced, t.now_ms, loop_ms);
        for (size_t i = 0; i < t.n_entries; i++) {
            rl_synced_entry *e = rl_synced_find(s->synced, id,
                                                t.entries[i].value.ptr,
                                                t.entries[i].value.len);
            if (e == NULL)
                continue;
            /* A global key's totals are its owner's: every aggregator of
             * the region applies the other regions' exchanges and
             * publishes the key, but only its owner has this region's
             * demand for it (its agents' reports); another's part says
             * this region asked nothing, and its count lacks what the
             * owner adds for the regions that have not heard this one. */
            if (id->io_rule != NULL && id->io_rule->global) {
                if (e->owner != l->index)
                    continue;
                rl_synced_note_region(e, t.entries[i].share,
                                      t.entries[i].cut);
            }
            /* Totals of another period (a reload on one side only) give
             * no fresh share: it would be worked out from totals that
             * hold none of the acknowledgements since. */
            if (rl_synced_note_totals(s->synced, e, t.entries[i].window,
                                      t.now_ms, t.entries[i].current,
                                      t.entries[i].previous)) {
                if (e->owner == l->index) {
                    e->partial = false;
                    e->foreign_ms = 0;
                }
            } else if (e->owner == l->index && e->foreign_ms == 0) {
                e->foreign_ms = loop_ms;
            }
        }
        /* A fresh share for each key whose totals are this snapshot's (or
         * an older one's), not an acknowledgement's (synced.c says why). */
        rl_synced_table *table = atomic_load(&s->synced->table);
        size_t cut = 0;
        for (size_t i = 0; i < table->cap; i++) {
            rl_synced_entry *e = atomic_load(&table->slots[i]);
            cut += e != NULL && e->ident == id && atomic_load(&e->cut);
            if (e != NULL && e->ident == id && e->owner == l->index) {
                e->snap_ms = t.now_ms;
                if (atomic_load(&e->degraded) && !key_stale(s, e, loop_ms)
                    && rl_synced_settled(e))
                    recovered(s, e, loop_ms);
                rl_synced_rebalance(s->synced, e, loop_ms, !e->partial);
            }
        }
        say_cut(s, id, cut);
    }
    rl_wire_msg_free(&t);
}

/* Logged once per reason, until a report is acknowledged again. */
static void probe_finished(agg_link *l, int result)
{
    rl_sync *s = l->s;
    l->probing = false;
    rl_nng_probe_reset(l->probe);
    if (result == 0 || result == l->probe_logged || s->stopping)
        return;
    l->probe_logged = result;
    bool tls = rl_nng_probe_tls_refused(result);
    rl_log(s->log, tls ? RL_LOG_ERROR : RL_LOG_WARN,
           "aggregator_unreachable", "url=%s "
           "reason=\"%s\" hint=\"%s\"",
           s->config->aggregator.endpoints[l->index].reports,
           nng_strerror(result), tls
               ? "TLS refused: check aggregator.tls (ca must have signed "
                 "the aggregator's certificate, server_name must be a name "
                 "in it, and with client_auth: required the aggregator's ca "
                 "must have signed this agent's cert)"
               : "check that rl-aggregator runs and listens on "
                 "aggregator.reports");
}

/* What nng's threads left for one link. */
typedef struct link_news {
    bool req_done, probe_done, pipe_lost;
    int req_result, probe_result;
    nng_msg **totals;
    size_t n_totals;
} link_news;

static link_news take_news(agg_link *l)
{
    link_news n = {l->req_done, l->probe_done, l->pipe_lost, l->req_result,
                   l->probe_result, l->totals, l->n_totals};
    l->req_done = l->probe_done = l->pipe_lost = false;
    l->totals = NULL;
    l->n_totals = l->cap_totals = 0;
    return n;
}

static bool all_idle(const rl_sync *s)
{
    for (size_t i = 0; i < s->n_links; i++) {
        if (s->links[i].state != REQ_IDLE)
            return false;
    }
    return true;
}

static void on_wakeup(uv_async_t *h)
{
    rl_sync *s = h->data;
    link_news news[RL_AGGREGATORS_MAX];
    pthread_mutex_lock(&s->lock);
    for (size_t i = 0; i < s->n_links; i++)
        news[i] = take_news(&s->links[i]);
    pthread_mutex_unlock(&s->lock);
    for (size_t i = 0; i < s->n_links; i++) {
        agg_link *l = &s->links[i];
        link_news *n = &news[i];
        if (n->req_done)
            req_finished(l, n->req_result);
        /* The report on it will not be answered: cancel it (its
         * completion, NNG_ECANCELED, frees it for another link). */
        if (n->pipe_lost && !s->stopping) {
            link_down(l, "connection lost");
            if (l->state != REQ_IDLE)
                nng_aio_cancel(l->req_aio);
        }
        if (n->probe_done)
            probe_finished(l, n->probe_result);
        for (size_t k = 0; k < n->n_totals; k++) {
            on_totals(l, n->totals[k]);
            nng_msg_free(n->totals[k]);
        }
        free(n->totals);
    }
    /* Stopping, and the reports that were in flight are over: the last
     * reports, then close (once, as this handle closes with the rest). */
    if (s->stopping) {
        if (all_idle(s))
            finish_stopping(s);
        return;
    }
    serve_all(s, false);
}

/* Until the next interval of Redis's clock, or a whole interval when that
 * clock is not known yet. */
static uint64_t until_next_tick(const rl_sync *s)
{
    uint64_t interval = interval_ms(s);
    uint64_t now = rl_synced_now(s->synced, now_ms(s));
    return now == 0 ? interval : interval - now % interval;
}

/* Until the next edge of a synced rule's sub-windows that falls inside an
 * interval, or 0 when none comes before the next tick. */
static uint64_t until_next_edge(const rl_sync *s)
{
    uint64_t now = rl_synced_now(s->synced, now_ms(s));
    uint64_t tick = until_next_tick(s), edge = 0;
    for (size_t i = 0; now != 0 && s->rules != NULL
                       && i < s->rules->n_rules; i++) {
        const rl_rule *r = &s->rules->rules[i];
        uint64_t g = rl_wire_subwindow_ms(r->period_ms);
        uint64_t to = g - now % g;
        if (r->mode == RL_MODE_SYNCED && to < tick && (edge == 0 || to < edge))
            edge = to;
    }
    return edge;
}

/* A key whose aggregator gives no totals is degraded (its on_error
 * decides, with local from this agent's own share); it goes back to
 * shares once what it counted meanwhile is in the fleet's totals. */
static void follow_totals(rl_sync *s, rl_synced_entry *e, uint64_t loop_ms)
{
    if (e->ident->io_rule == NULL)
        return;
    bool degraded = atomic_load(&e->degraded);
    if (key_stale(s, e, loop_ms)) {
        if (!degraded)
            rl_synced_degrade(e);
        e->degraded_counted = e->own.counted;
    } else if (degraded && rl_synced_settled(e)) {
        rl_synced_recover(e);
    }
    e->ident->io_degraded_counting += atomic_load(&e->degraded);
}

static bool all_stale(const rl_sync *s, uint64_t loop_ms)
{
    for (size_t i = 0; i < s->n_links; i++) {
        if (!link_stale(&s->links[i], loop_ms))
            return false;
    }
    return true;
}

/* Why the keys of a degraded rule get no totals, as one line says it. */
static void say_why_stale(const rl_sync *s, const rl_ident *id,
                          uint64_t loop_ms, char *buf, size_t cap)
{
    if (id->io_refused) {
        snprintf(buf, cap, "an aggregator refused its counts: it has no "
                 "synced rule of this name");
        return;
    }
    for (size_t i = 0; i < s->n_links; i++) {
        const agg_link *l = &s->links[i];
        const char *url = s->config->aggregator.endpoints[i].reports;
        if (l->stale_heard) {
            snprintf(buf, cap, "the aggregator at %s cannot reach Redis "
                     "(its totals say stale)", url);
            return;
        }
        if (link_stale(l, loop_ms)) {
            snprintf(buf, cap, "the aggregator at %s sent no fresh totals "
                     "for %llu ms and applied no report of this agent's for "
                     "%llu ms (aggregator.stale_after_ms: %u)", url,
                     (unsigned long long)(loop_ms - l->fresh_ms),
                     (unsigned long long)(loop_ms - l->applied_ms),
                     s->config->aggregator.stale_after_ms);
            return;
        }
    }
    snprintf(buf, cap, "no totals it can use: none came, or they come "
             "numbered in another period than this rule's (the "
             "aggregators' config and this agent's differ)");
}

static void log_recovered(rl_sync *s, const rl_rule *r, rl_ident *id,
                          uint64_t loop_ms)
{
    rl_log(s->log, RL_LOG_INFO, "synced_recovered", "rule=%s "
           "degraded_ms=%llu", r->name,
           (unsigned long long)(loop_ms - id->io_degraded_ms));
    id->io_degraded_ms = 0;
    id->io_recovered_ms = loop_ms > 0 ? loop_ms : 1;
}

/* A key of a degraded rule is back on shares: the rule is too once it was
 * its last (said at once, not at the next tick). */
static void recovered(rl_sync *s, rl_synced_entry *e, uint64_t loop_ms)
{
    rl_ident *id = e->ident;
    rl_synced_recover(e);
    if (id->io_degraded_keys > 0 && --id->io_degraded_keys == 0
        && id->io_degraded_ms != 0 && id->io_rule != NULL
        && !all_stale(s, loop_ms))
        log_recovered(s, id->io_rule, id, loop_ms);
}

/* One line when a synced rule goes degraded (some of its keys, or, with
 * none yet, every aggregator gives no totals), one when it is back. */
static void log_degraded_rules(rl_sync *s, uint64_t loop_ms)
{
    bool none = all_stale(s, loop_ms);
    for (size_t i = 0; s->rules != NULL && i < s->rules->n_rules; i++) {
        const rl_rule *r = &s->rules->rules[i];
        rl_ident *id = s->idents[i];
        if (r->mode != RL_MODE_SYNCED)
            continue;
        id->io_degraded_keys = id->io_degraded_counting;
        id->io_degraded_counting = 0;
        bool degraded = id->io_degraded_keys > 0 || none;
        if (degraded && id->io_degraded_ms == 0) {
            char why[RL_NNG_URL_MAX + 128];
            say_why_stale(s, id, loop_ms, why, sizeof why);
            rl_log(s->log, RL_LOG_WARN, "synced_degraded", "rule=%s "
                   "keys=%zu on_error=%s agents=%llu reason=\"%s\"",
                   r->name, id->io_degraded_keys,
                   rl_on_error_name(r->on_error),
                   (unsigned long long)rl_fallback_agents(r, id), why);
            id->io_degraded_ms = loop_ms > 0 ? loop_ms : 1;
        } else if (!degraded && id->io_degraded_ms != 0) {
            log_recovered(s, r, id, loop_ms);
        }
    }
}

/* Keys swept or reloaded out of a global rule leave its count of cut
 * keys: said at the tick that counted them. */
static void log_cut_rules(rl_sync *s)
{
    for (size_t i = 0; s->rules != NULL && i < s->rules->n_rules; i++) {
        rl_ident *id = s->idents[i];
        say_cut(s, id, id->io_cut_counting);
        id->io_cut_counting = 0;
    }
}

/* What a tick records was counted before the interval's edge it falls
 * on, a moment after it: in the sub-window that ended there, not the one
 * just begun (counted there, it would stay a sub-window longer in a
 * degraded share's span: a tenth fewer admitted per period at a 100 ms
 * interval of a 2 s period). A tick that is not just past an edge (the
 * clock's estimate moved) records at now. */
static uint64_t recorded_at(const rl_sync *s, uint64_t now)
{
    uint64_t late = now % interval_ms(s);
    return now != 0 && late < interval_ms(s) / 2 && now > late ? now - late - 1
                                                               : now;
}

static void on_wake(uv_timer_t *t);

/* The next wake: at the next tick, or before it at a synced rule's
 * sub-window edge (on_edge). */
static void schedule_wake(rl_sync *s)
{
    uint64_t edge = until_next_edge(s);
    uv_timer_start(&s->tick, on_wake, edge != 0 ? edge : until_next_tick(s),
                   0);
}

/* At a sub-window edge inside an interval, the keys of the rules whose
 * edge it is record their counts in the sub-window that just ended, and
 * take a share of the room the sub-window that left the span gave back
 * (the last totals' oldest): else counts made just after a tick would be
 * recorded at the next, a sub-window late, and the room given back at
 * the next tick, so that a request's room came back a period and an
 * interval after it (10/11 of the limit a period, and less as bursts
 * spill over, at 1 s intervals of 500 ms sub-windows). */
static void on_edge(rl_sync *s)
{
    uint64_t loop_ms = now_ms(s);
    uint64_t now = rl_synced_now(s->synced, loop_ms);
    rl_synced_table *table = atomic_load(&s->synced->table);
    for (size_t i = 0; now != 0 && i < table->cap; i++) {
        rl_synced_entry *e = atomic_load(&table->slots[i]);
        const rl_rule *r = e != NULL ? e->ident->io_rule : NULL;
        if (r == NULL)
            continue;
        uint64_t g = rl_wire_subwindow_ms(r->period_ms);
        if (now / g == s->woke_at / g)
            continue; /* no edge of this rule's since the last wake */
        /* Counted before the edge, unless the wake came late. */
        rl_synced_record(s->synced, e, loop_ms,
                         now % g < g / 2 ? now - now % g - 1 : now);
        rl_synced_edge(s->synced, e, loop_ms);
    }
    schedule_wake(s);
}

static void on_tick(rl_sync *s)
{
    uint64_t loop_ms = now_ms(s);
    rl_synced_table *table = atomic_load(&s->synced->table);
    uint64_t now = rl_synced_now(s->synced, loop_ms);
    uint64_t at = recorded_at(s, now);
    /* Owners first: a key's totals are its owner's. */
    assign_owners(s);
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
        rl_synced_record(s->synced, e, loop_ms, at);
        follow_totals(s, e, loop_ms);
        /* A fresh share at every tick, from a TOTALS snapshot (or from no
         * totals at all, a cold key's), not from an acknowledgement's; the
         * report follows. */
        rl_synced_rebalance(s->synced, e, loop_ms, now != 0 && !e->partial);
        if (e->ident->io_rule != NULL)
            e->ident->io_cut_counting += atomic_load(&e->cut);
    }
    log_degraded_rules(s, loop_ms);
    log_cut_rules(s);
    serve_all(s, true);
    rl_synced_sweep(s->synced, loop_ms);
    uint64_t refused = atomic_load(&s->synced->keys_refused);
    if (refused != s->refused_logged) {
        rl_log(s->log, RL_LOG_WARN, "synced_keys_capped", "refused=%llu "
               "max_keys=%zu", (unsigned long long)refused,
               s->synced->max_keys);
        s->refused_logged = refused;
    }
    schedule_wake(s);
}

/* A tick is the first wake in an interval (or every wake while Redis's
 * clock is not known); any other is a sub-window edge's inside one. */
static void on_wake(uv_timer_t *t)
{
    rl_sync *s = t->data;
    uint64_t now = rl_synced_now(s->synced, now_ms(s));
    uint64_t interval = now / interval_ms(s);
    if (now != 0 && interval == s->ticked_interval) {
        on_edge(s);
    } else {
        s->ticked_interval = interval;
        on_tick(s);
    }
    s->woke_at = now;
}

/* nng 1.5.2 redials after a random wait below a second by default, so an
 * aggregator that came back would wait that long for its keys, and its
 * subscribers for its totals. Below an interval instead (nng waits a random
 * time below the minimum, which doubles up to the maximum): a link is back
 * within two. */
static void redial_within(nng_socket sock, uint32_t interval)
{
    nng_duration most = interval > 10 ? (nng_duration)interval : 10;
    nng_socket_set_ms(sock, NNG_OPT_RECONNMINT, most / 2);
    nng_socket_set_ms(sock, NNG_OPT_RECONNMAXT, most);
}

static int open_link(rl_sync *s, agg_link *l, rl_error *err)
{
    const rl_aggregator_config *agg = &s->config->aggregator;
    const rl_aggregator_endpoint *at = &agg->endpoints[l->index];
    int rv;
    l->s = s;
    l->up = true;
    if ((l->own.pending = rl_wire_writer_new()) == NULL)
        return rl_error_set(err, RL_ENOMEM, "out of memory");
    if ((rv = nng_req0_open(&l->req)) != 0
        || (rv = nng_aio_alloc(&l->req_aio, on_req, l)) != 0
        || (rv = rl_nng_sub_open(&l->sub)) != 0
        || (rv = nng_aio_alloc(&l->sub_aio, on_sub, l)) != 0
        || (rv = nng_pipe_notify(l->req, NNG_PIPE_EV_ADD_POST, on_pipe, l))
               != 0
        || (rv = nng_pipe_notify(l->req, NNG_PIPE_EV_REM_POST, on_pipe, l))
               != 0)
        return rl_error_set(err, RL_ESYS, "cannot open nng sockets: %s",
                            nng_strerror(rv));
    nng_socket_set(l->sub.sock, NNG_OPT_SUB_SUBSCRIBE,
                   RL_WIRE_FEATURES_TOPIC, RL_WIRE_FEATURES_TOPIC_LEN);
    /* Our own resends (the same report until acknowledged) replace REQ's. */
    nng_socket_set_ms(l->req, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE);
    /* The pipe callbacks read the link from the dials on. */
    rl_nng_handoff(l);
    nng_socket_set_size(l->sub.sock, NNG_OPT_RECVMAXSZ,
                        agg->max_message_bytes);
    redial_within(l->req, interval_ms(s));
    redial_within(l->sub.sock, interval_ms(s));
    /* Non-blocking dials keep trying in the background: an aggregator that
     * is not up yet is not an error. */
    char why[512];
    if (rl_nng_dial(l->req, at->reports, &agg->tls, why, sizeof why) != 0
        || rl_nng_dial(l->sub.sock, at->totals, &agg->tls, why, sizeof why)
               != 0)
        return rl_error_set(err, RL_EINVAL, "cannot dial the aggregator: %s",
                            why);
    /* None for inproc://, which has no stream to probe: no diagnosis. */
    l->probe = rl_nng_probe_new(at->reports, &agg->tls, on_probe, l, why,
                                sizeof why);
    return RL_OK;
}

rl_sync *rl_sync_new(rl_synced *synced, const rl_config *config,
                     const char *agent_id, const rl_logger *log,
                     rl_error *err)
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
    snprintf(s->agent_id, sizeof s->agent_id, "%s", agent_id);
    /* At most RL_AGGREGATORS_MAX (the config's cap). */
    size_t n = config->aggregator.n_endpoints;
    s->ping = rl_wire_writer_new();
    s->links = calloc(n, sizeof *s->links);
    if (s->ping == NULL || s->links == NULL) {
        rl_error_set(err, RL_ENOMEM, "out of memory");
        rl_sync_free(s);
        return NULL;
    }
    s->n_links = n;
    for (size_t i = 0; i < n; i++) {
        s->links[i].index = i;
        if (open_link(s, &s->links[i], err) != RL_OK) {
            rl_sync_free(s);
            return NULL;
        }
    }
    return s;
}

/* Subscribes to the topics of from's rules that need a fleet size and
 * that to lacks (or unsubscribes, with opt), on every aggregator. */
static void follow(rl_sync *s, const rl_config *from, const rl_config *to,
                   const char *opt)
{
    for (size_t i = 0; from != NULL && i < from->n_rules; i++) {
        const rl_rule *r = &from->rules[i];
        if (!needs_fleet(r)
            || fleet_rule(to, r->name, strlen(r->name)) != NULL)
            continue;
        char topic[RL_NAME_MAX + 2], leaving[RL_NAME_MAX + 3];
        size_t n = rl_wire_topic(r->name, topic, sizeof topic);
        size_t n_leaving = rl_wire_leaving_topic(r->name, leaving,
                                                 sizeof leaving);
        for (size_t k = 0; k < s->n_links; k++) {
            nng_socket_set(s->links[k].sub.sock, opt, topic, n);
            nng_socket_set(s->links[k].sub.sock, opt, leaving, n_leaving);
        }
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
    pthread_mutex_lock(&s->lock);
    s->started = true;
    pthread_mutex_unlock(&s->lock);
    /* Stale only once a link has been silent for stale_after_ms from
     * the start. */
    for (size_t i = 0; i < s->n_links; i++)
        s->links[i].fresh_ms = s->links[i].applied_ms = uv_now(loop);
    schedule_wake(s);
    /* Only now: a receive that completes wakes the loop through s->wakeup,
     * which exists from here on. */
    for (size_t i = 0; i < s->n_links; i++) {
        rl_nng_handoff(&s->links[i]);
        nng_recv_aio(s->links[i].sub.sock, s->links[i].sub_aio);
    }
}

static void handle_closed(uv_handle_t *h)
{
    rl_sync *s = h->data;
    if (--s->open_handles == 0)
        rl_sync_free(s);
}

/* A request that finished after the loop's last look still holds its
 * message: an ack received, or a report nng did not take. */
static void drop_unseen_request(agg_link *l)
{
    rl_sync *s = l->s;
    nng_aio_stop(l->req_aio);
    nng_aio_stop(l->sub_aio);
    rl_nng_probe_free(l->probe);
    l->probe = NULL;
    rl_nng_handoff(l);
    pthread_mutex_lock(&s->lock);
    bool done = l->req_done;
    int result = l->req_result;
    l->req_done = false;
    pthread_mutex_unlock(&s->lock);
    if (done && ((l->state == REQ_WAITING && result == 0)
                 || (l->state == REQ_SENDING && result != 0)))
        nng_msg_free(nng_aio_get_msg(l->req_aio));
}

/* Stops the aios, closes the handles; the sockets close with the object,
 * in rl_sync_free, once the handles are closed. */
static void close_sync(rl_sync *s)
{
    pthread_mutex_lock(&s->lock);
    s->closing = true;
    pthread_mutex_unlock(&s->lock);
    for (size_t i = 0; i < s->n_links; i++)
        drop_unseen_request(&s->links[i]);
    uv_close((uv_handle_t *)&s->wakeup, handle_closed);
    uv_close((uv_handle_t *)&s->tick, handle_closed);
}

/* The link a stream's last report goes out on: its own while it is up (or
 * when none is), else an up one. */
static agg_link *stop_carrier(rl_sync *s, agg_link *own)
{
    if (own->up || !any_up(s))
        return own;
    for (size_t i = 0; i < s->n_links; i++) {
        if (s->links[i].up)
            return &s->links[i];
    }
    return own;
}

/* No totals are needed once stopping: the TOTALS sockets' connections end
 * at their next message, during the last reports, so that the close can
 * follow (nng_sub.h). All links at once: their aggregators publish at the
 * same moment of each interval. */
static void drain_totals(rl_sync *s)
{
    for (size_t i = 0; s->links != NULL && i < s->n_links; i++)
        rl_nng_sub_drain(&s->links[i].sub);
}

/* Once the last reports are in, a GOODBYE to every aggregator up that
 * reads it (FEATURES): the agent leaves its rules' agent counts at once,
 * so that the agents left get its share now, not RL_WIRE_LIVE_INTERVALS
 * later. The agent sets are shared in Redis, so one aggregator would do;
 * each is told, as any may be the one that is slow. Whether any went. */
static bool say_goodbye(rl_sync *s)
{
    if (s->goodbye_said)
        return false;
    s->goodbye_said = true;
    bool sent = false;
    rl_wire_writer_reset(s->ping);
    rl_wire_goodbye(s->ping, s->agent_id, s->presence, s->n_presence);
    for (size_t i = 0; s->n_presence > 0 && i < s->n_links; i++) {
        agg_link *l = &s->links[i];
        if (l->up && (l->features & RL_WIRE_FEATURE_GOODBYE)) {
            send_message(l, s->ping, NULL);
            sent = true;
        }
    }
    return sent;
}

/* At stop, what was counted since the last report goes out in one last
 * report per stream before the sync closes, after its ack or its timeout
 * (two intervals): a gateway that stops or reloads loses no count
 * (nginx's workers close their agents at every reload). Streams whose
 * link is down go out on an up link, one report per link at a time: this
 * runs again whenever every link is idle, until no stream has one to
 * send. */
static void finish_stopping(rl_sync *s)
{
    assign_owners(s);
    bool sent = false;
    for (size_t i = 0; i < s->n_links; i++) {
        stream *st = &s->links[i].own;
        agg_link *l = stop_carrier(s, &s->links[i]);
        /* A report of presence alone is not worth a wait: the agent is
         * leaving (its GOODBYE says so where it is heard), and with no
         * aggregator up every close (rlctl check's, each nginx worker's
         * at a reload) would wait its two intervals for nothing. */
        bool pending = has_pending(st) && st->n_in_report > 0;
        /* At most two: a report cancelled at the stop, then one with what
         * was counted since; none after a report sent at the stop went
         * unanswered (it is still pending), as no aggregator takes them. */
        bool unanswered = st->stop_reports > 0 && pending;
        if (l->state != REQ_IDLE || st->stop_reports >= 2 || unanswered
            || !(pending || build_report(s, &s->links[i])))
            continue;
        st->stop_reports++;
        send_on(l, st);
        sent = true;
    }
    if (!sent && all_idle(s) && !say_goodbye(s))
        close_sync(s);
}

void rl_sync_stop(rl_sync *s)
{
    s->stopping = true;
    uv_timer_stop(&s->tick);
    drain_totals(s);
    /* nng 1.5.2 (Debian 12's libnng1) can lose a TCP pipe's read when the
     * pipe is closed here while a message is arriving on it: the transport
     * re-arms the read on an aio the close has stopped, nng drops it
     * silently, and the protocol's receive on that pipe never completes.
     * nng_close() then waits for the pipe forever, and so would
     * rl_agent_close() (nng issue #1813, fixed upstream by nng PR #1824).
     * The ack of a report in flight is such a message, due right after
     * each tick: close once every exchange is over, acknowledged or timed
     * out (two intervals at most). A report nng has not handed to a pipe
     * yet is cancelled, as no ack can follow it; one already sent comes
     * back through on_wakeup, which waits for its ack. */
    for (size_t i = 0; i < s->n_links; i++) {
        /* The cancelled report stays pending: the last report resends it
         * (same number, applied once) with what was counted since, and
         * gives it two intervals, as any report: a report is briefly
         * SENDING after every tick, not only when no aggregator is up. */
        if (s->links[i].state == REQ_SENDING)
            nng_aio_cancel(s->links[i].req_aio);
    }
    if (all_idle(s))
        finish_stopping(s);
}

/* wait_ms: for the TOTALS pipes to end (nng_sub.h), at their next
 * message, which comes every interval. */
static void free_link(agg_link *l, int wait_ms)
{
    if (l->req_aio != NULL)
        nng_aio_free(l->req_aio);
    if (l->sub_aio != NULL)
        nng_aio_free(l->sub_aio);
    rl_nng_probe_free(l->probe);
    /* No pipe callback once the link is freed: the close ends the
     * connections, and nng runs their callbacks on its own threads, after
     * nng_close has returned too (seen under TSan). One already under way
     * when this unregisters is not waited for; nng has no way to. */
    if (nng_socket_id(l->req) > 0) {
        nng_pipe_notify(l->req, NNG_PIPE_EV_ADD_POST, NULL, NULL);
        nng_pipe_notify(l->req, NNG_PIPE_EV_REM_POST, NULL, NULL);
        nng_close(l->req);
    }
    rl_nng_sub_close(&l->sub, wait_ms);
    for (size_t i = 0; i < l->n_totals; i++)
        nng_msg_free(l->totals[i]);
    free(l->totals);
    free(l->own.in_report);
    rl_wire_writer_free(l->own.pending);
}

void rl_sync_free(rl_sync *s)
{
    if (s == NULL)
        return;
    /* Closing the sockets ends their connections: nothing to wake. */
    pthread_mutex_lock(&s->lock);
    s->closing = true;
    pthread_mutex_unlock(&s->lock);
    drain_totals(s);
    for (size_t i = 0; s->links != NULL && i < s->n_links; i++)
        free_link(&s->links[i], 2 * (int)interval_ms(s));
    free(s->links);
    free(s->presence);
    rl_wire_writer_free(s->ping);
    pthread_mutex_destroy(&s->lock);
    free(s);
}
