/*
 * ingest.c: reports in, acknowledgements out. The reports socket is nng
 * REP with RL_INGEST_WORKERS contexts, so that many agents are served at
 * once and every report gets its own answer. A worker's aio completes on an
 * nng thread, which only queues the worker and wakes the loop; decoding,
 * Redis and the reply all happen on the loop thread.
 *
 * What comes off the wire is never trusted: size is capped by the socket
 * (RL_WIRE_MESSAGE_MAX), the decoder checks every field, and a report
 * naming a rule this aggregator does not have as synced is refused whole,
 * unless a reload removed that rule: then its counts are refused, not
 * counted, and the rest of the report applied. The ack answers a refused
 * entry with window 0 (no sub-window has that number): the agent logs it
 * and lets the rule's on_error decide, instead of taking the count as
 * the fleet's (an agent that predates this reads it as totals older than
 * any it holds, and goes on as it did when such counts were dropped).
 * A refused report gets no answer (its peer's REQ resends it later, and is
 * refused again); it is counted and logged with the peer's address, at most
 * once per peer per interval.
 */
#include "aggregator.h"

#include "nng_tls.h"

#include "exchange.h"
#include "nng_handoff.h"
#include "regions.h"
#include "windows.h"

#include <arpa/inet.h>
#include <nng/protocol/reqrep0/rep.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void on_aio(void *arg)
{
    rl_ingest_worker *w = arg;
    rl_nng_handoff(w);
    rl_aggregator *agg = w->agg;
    w->result = nng_aio_result(w->aio);
    pthread_mutex_lock(&agg->ready_lock);
    w->next = agg->ready;
    agg->ready = w;
    uv_async_send(&agg->wakeup);
    pthread_mutex_unlock(&agg->ready_lock);
    rl_nng_handoff(w);
}

static void receive(rl_ingest_worker *w)
{
    w->sending = false;
    rl_nng_handoff(w);
    nng_ctx_recv(w->ctx, w->aio);
}

static void peer_of(nng_msg *msg, char *buf, size_t cap)
{
    nng_sockaddr sa;
    nng_pipe pipe = nng_msg_get_pipe(msg);
    snprintf(buf, cap, "unknown");
    if (nng_pipe_get_addr(pipe, NNG_OPT_REMADDR, &sa) != 0)
        return;
    char ip[INET6_ADDRSTRLEN];
    if (sa.s_family == NNG_AF_INET) {
        inet_ntop(AF_INET, &sa.s_in.sa_addr, ip, sizeof ip);
        snprintf(buf, cap, "%s:%u", ip, ntohs(sa.s_in.sa_port));
    } else if (sa.s_family == NNG_AF_INET6) {
        inet_ntop(AF_INET6, sa.s_in6.sa_addr, ip, sizeof ip);
        snprintf(buf, cap, "[%s]:%u", ip, ntohs(sa.s_in6.sa_port));
    } else if (sa.s_family == NNG_AF_IPC) {
        snprintf(buf, cap, "ipc:%s", sa.s_ipc.sa_path);
    }
}

/* Whether to log a complaint about peer now: once per peer per interval.
 * The table is small; a new peer takes the slot logged longest ago. */
static bool complain(rl_aggregator *agg, const char *peer, uint64_t *before)
{
    rl_complaint *slot = &agg->complaints[0];
    for (int i = 0; i < RL_COMPLAINT_PEERS; i++) {
        rl_complaint *c = &agg->complaints[i];
        if (strcmp(c->peer, peer) == 0) {
            slot = c;
            break;
        }
        if (c->interval < slot->interval)
            slot = c;
    }
    if (strcmp(slot->peer, peer) != 0) {
        snprintf(slot->peer, sizeof slot->peer, "%s", peer);
        slot->suppressed = 0;
    } else if (slot->interval == agg->interval) {
        slot->suppressed++;
        return false;
    }
    *before = slot->suppressed;
    slot->interval = agg->interval;
    slot->suppressed = 0;
    return true;
}

/* A refused report: counted, logged (at most once per peer per interval,
 * with how many were not logged), dropped, and the worker listens again. */
static void refuse(rl_ingest_worker *w, rl_reject reason, const char *why)
{
    rl_aggregator *agg = w->agg;
    uint64_t unlogged;
    agg->stats.reports_rejected++;
    agg->stats.rejected_by[reason]++;
    if (complain(agg, w->peer, &unlogged))
        rl_log(&agg->log, RL_LOG_WARN, "report_rejected",
               "peer=%s reason=\"%s\" unlogged_before=%llu", w->peer, why,
               (unsigned long long)unlogged);
    rl_wire_msg_free(&w->report);
    free(w->kept);
    free(w->kept_of);
    w->kept = NULL;
    w->kept_of = NULL;
    nng_msg_free(w->msg);
    w->msg = NULL;
    receive(w);
}

static void send_ack(rl_ingest_worker *w, uint64_t status,
                     const rl_window_total *totals)
{
    rl_aggregator *agg = w->agg;
    rl_wire_writer *out = rl_wire_writer_new();
    nng_msg *reply = NULL;
    if (out != NULL) {
        const rl_wire_msg *m = &w->report;
        size_t n = totals != NULL ? m->n_entries : 0;
        rl_wire_begin_ack(out, m->seq, status, rl_store_now_ms(agg->store),
                          n);
        /* The rule's name, made a string again only where it changes
         * (a report's entries are mostly of one rule). */
        char rule[RL_WIRE_NAME_MAX + 1] = "";
        size_t rule_len = 0;
        for (size_t i = 0; i < n; i++) {
            const rl_wire_entry *e = &m->entries[i];
            if (e->rule.len != rule_len
                || memcmp(rule, e->rule.ptr, rule_len) != 0) {
                rule_len = e->rule.len < RL_WIRE_NAME_MAX ? e->rule.len
                                                          : RL_WIRE_NAME_MAX;
                memcpy(rule, e->rule.ptr, rule_len);
                rule[rule_len] = '\0';
            }
            rl_wire_put_ack_total(out, rule, e->value.ptr, e->value.len,
                                  totals[i].window, totals[i].current,
                                  totals[i].previous, totals[i].agents);
        }
        size_t len;
        const void *data = rl_wire_writer_data(out, &len);
        if (nng_msg_alloc(&reply, 0) == 0
            && nng_msg_append(reply, data, len) != 0) {
            nng_msg_free(reply);
            reply = NULL;
        }
        rl_wire_writer_free(out);
    }
    rl_wire_msg_free(&w->report);
    free(w->kept);
    free(w->kept_of);
    w->kept = NULL;
    w->kept_of = NULL;
    if (reply == NULL) {
        rl_log(&agg->log, RL_LOG_ERROR, "ack_failed", "peer=%s "
               "reason=\"out of memory\"", w->peer);
        receive(w);
        return;
    }
    w->sending = true;
    nng_aio_set_msg(w->aio, reply);
    rl_nng_handoff(w);
    nng_ctx_send(w->ctx, w->aio);
}

static void on_applied(void *arg, bool duplicate,
                       const rl_window_total *totals,
                       const uint64_t *presence_agents, const char *error)
{
    rl_ingest_worker *w = arg;
    rl_aggregator *agg = w->agg;
    agg->in_flight--;
    rl_metrics_redis_latency(agg, uv_hrtime() / 1000 - w->sent_at_us);
    if (totals == NULL) {
        agg->stats.reports_retry++;
        rl_log(&agg->log, RL_LOG_WARN, "report_not_applied",
               "peer=%s reason=\"%s\"", w->peer, error);
        send_ack(w, RL_ACK_RETRY, NULL);
        free(w->presence);
        w->presence = NULL;
        return;
    }
    const rl_wire_msg *m = &w->report;
    size_t n = w->kept != NULL ? w->n_kept : m->n_entries;
    const rl_wire_entry *entries = w->kept != NULL ? w->kept : m->entries;
    if (duplicate) {
        agg->stats.reports_duplicate++;
    } else {
        agg->stats.reports_applied++;
        agg->stats.entries_applied += n;
    }
    uint64_t now = rl_store_now_ms(agg->store);
    for (size_t i = 0; i < n; i++) {
        const rl_rule *rule = rl_aggregator_rule(agg, entries[i].rule);
        rl_broadcast_note(agg, rule, entries[i].value.ptr,
                          entries[i].value.len, &totals[i],
                          !duplicate && entries[i].back > 0);
        /* This region's counts of a global rule go to the others, once:
         * a duplicate went when it was applied. */
        if (!duplicate && !w->exchange && rule != NULL && rule->global)
            rl_regions_local_count(agg, rule, &entries[i], now);
    }
    if (w->exchange) {
        if (!duplicate)
            rl_regions_applied(agg, w->region, entries, n);
        rl_exchange_applied(agg, w->region, m->now_ms);
        /* Another region's aggregator: an ACK of no entries says its
         * exchange is in this region's Redis. */
        send_ack(w, duplicate ? RL_ACK_DUPLICATE : RL_ACK_APPLIED, NULL);
        return;
    }
    for (size_t i = 0; i < w->n_presence; i++)
        rl_broadcast_agents(agg, w->presence[i], presence_agents[i]);
    free(w->presence);
    w->presence = NULL;
    rl_window_total *all = NULL;
    if (w->kept != NULL) {
        /* Refused entries stay zero: window 0. */
        all = calloc(m->n_entries + 1, sizeof *all);
        if (all == NULL) {
            send_ack(w, RL_ACK_RETRY, NULL);
            return;
        }
        for (size_t i = 0; i < n; i++)
            all[w->kept_of[i]] = totals[i];
    }
    send_ack(w, duplicate ? RL_ACK_DUPLICATE : RL_ACK_APPLIED,
             all != NULL ? all : totals);
    free(all);
}

/* The report's entries less those of rules a reload removed here, which
 * are refused (said in the ack) and logged; -1 without memory. */
static int keep_known(rl_ingest_worker *w, const rl_rule **rules,
                      size_t refused)
{
    const rl_wire_msg *m = &w->report;
    w->kept = calloc(m->n_entries + 1, sizeof *w->kept);
    w->kept_of = calloc(m->n_entries + 1, sizeof *w->kept_of);
    if (w->kept == NULL || w->kept_of == NULL)
        return -1;
    const rl_wire_entry *first = NULL;
    size_t n = 0;
    for (size_t i = 0; i < m->n_entries; i++) {
        const rl_rule *rule = rl_aggregator_rule(w->agg, m->entries[i].rule);
        if (rule == NULL) {
            first = first != NULL ? first : &m->entries[i];
            continue;
        }
        w->kept[n] = m->entries[i];
        w->kept_of[n] = i;
        rules[n++] = rule;
    }
    w->n_kept = n;
    uint64_t unlogged;
    if (complain(w->agg, w->peer, &unlogged))
        rl_log(&w->agg->log, RL_LOG_WARN, "counts_refused",
               "peer=%s rule=%.*s entries=%zu unlogged_before=%llu "
               "reason=\"a synced rule a reload removed here: its counts are "
               "not counted, the agent's on_error decides\"", w->peer,
               (int)first->rule.len, first->rule.ptr, refused,
               (unsigned long long)unlogged);
    return 0;
}

/* The rules named as present that this aggregator knows as needing a
 * fleet size, into w->presence; others (a reload on one side only) are
 * passed over. */
static bool take_presence(rl_ingest_worker *w)
{
    const rl_wire_msg *m = &w->report;
    w->presence = calloc(m->n_presence + 1, sizeof *w->presence);
    if (w->presence == NULL)
        return false;
    w->n_presence = 0;
    for (size_t i = 0; i < m->n_presence; i++) {
        const rl_rule *rule = rl_aggregator_fleet_rule(w->agg,
                                                       m->presence[i]);
        if (rule != NULL)
            w->presence[w->n_presence++] = rule;
    }
    return true;
}

static void on_left(void *arg, const uint64_t *agents, const char *error)
{
    rl_ingest_worker *w = arg;
    rl_aggregator *agg = w->agg;
    agg->in_flight--;
    if (agents == NULL)
        rl_log(&agg->log, RL_LOG_WARN, "goodbye_not_applied",
               "peer=%s reason=\"%s\"", w->peer, error);
    /* The last agent's leaving leaves the count last known: 0 on the wire
     * says not known (wire.h), and no agent is left to take it. */
    for (size_t i = 0; agents != NULL && i < w->n_presence; i++) {
        if (agents[i] > 0)
            rl_broadcast_agents(agg, w->presence[i], agents[i]);
    }
    free(w->presence);
    w->presence = NULL;
    send_ack(w, agents != NULL ? RL_ACK_APPLIED : RL_ACK_RETRY, NULL);
}

/* An agent closing leaves its rules' agent counts at once. Only the agent
 * a connection speaks for can leave through it (agents.c): a peer cannot
 * take others out of the count, which would grow every share. */
static void handle_goodbye(rl_ingest_worker *w, uint32_t pipe)
{
    rl_aggregator *agg = w->agg;
    uint64_t at = rl_store_now_ms(agg->store);
    if (!rl_agents_leave(agg, w->report.agent_id, pipe, at)) {
        send_ack(w, RL_ACK_DUPLICATE, NULL);
        return;
    }
    rl_log(&agg->log, RL_LOG_INFO, "agent_left", "agent=%.*s peer=%s",
           (int)w->report.agent_id.len, w->report.agent_id.ptr, w->peer);
    if (!take_presence(w)) {
        refuse(w, RL_REJECT_OUT_OF_MEMORY, "out of memory");
        return;
    }
    agg->in_flight++;
    rl_windows_leave(agg->windows, w->report.agent_id, w->presence,
                     w->n_presence, at, on_left, w);
}

/* Another region's exchange: its counts go into this region's Redis,
 * each (sender, seq) once, its demand to this aggregator's table the
 * first time it sees that seq (every peer of a region gets every
 * exchange). Entries of rules not global here (a reload on one side) are
 * passed over: the sender would send them again forever. */
static void handle_exchange(rl_ingest_worker *w)
{
    rl_aggregator *agg = w->agg;
    const rl_wire_msg *m = &w->report;
    if (m->type != RL_WIRE_EXCHANGE) {
        refuse(w, RL_REJECT_MALFORMED, "not an exchange");
        return;
    }
    int r = rl_exchange_region(agg, m->region);
    if (r < 0) {
        refuse(w, RL_REJECT_UNKNOWN_RULE, "an exchange from a region that "
               "is not in regions");
        return;
    }
    const rl_rule **rules = calloc(m->n_entries + 1, sizeof *rules);
    w->kept = calloc(m->n_entries + 1, sizeof *w->kept);
    w->kept_of = calloc(m->n_entries + 1, sizeof *w->kept_of);
    if (rules == NULL || w->kept == NULL || w->kept_of == NULL) {
        free(rules);
        refuse(w, RL_REJECT_OUT_OF_MEMORY, "out of memory");
        return;
    }
    bool fresh = rl_exchange_heard(agg, (size_t)r, m->agent_id, m->seq);
    size_t n = 0;
    for (size_t i = 0; i < m->n_entries; i++) {
        const rl_rule *rule = rl_aggregator_rule(agg, m->entries[i].rule);
        if (rule == NULL || !rule->global)
            continue;
        if (fresh)
            rl_regions_note_demand(agg, rule, &m->entries[i], (size_t)r);
        w->kept[n] = m->entries[i];
        w->kept_of[n] = i;
        rules[n++] = rule;
    }
    w->n_kept = n;
    uint64_t now = rl_store_now_ms(agg->store);
    if (n == 0 || now == 0) {
        free(rules);
        /* A heartbeat (or nothing global here) writes nothing; without
         * Redis's clock, the sender sends it again. */
        if (now != 0)
            rl_exchange_applied(agg, (size_t)r, m->now_ms);
        send_ack(w, now == 0 ? RL_ACK_RETRY : RL_ACK_APPLIED, NULL);
        return;
    }
    rl_wire_msg applied = *m;
    applied.entries = w->kept;
    applied.n_entries = n;
    agg->in_flight++;
    w->sent_at_us = uv_hrtime() / 1000;
    w->region = (size_t)r;
    rl_windows_apply(agg->windows, &applied, rules, NULL, 0, now, on_applied,
                     w);
    free(rules);
}

static void handle_report(rl_ingest_worker *w)
{
    rl_aggregator *agg = w->agg;
    const char *why = NULL;
    uint32_t pipe = (uint32_t)nng_pipe_id(nng_msg_get_pipe(w->msg));
    peer_of(w->msg, w->peer, sizeof w->peer);
    if (rl_wire_decode(nng_msg_body(w->msg), nng_msg_len(w->msg), &w->report,
                       &why) != 0) {
        refuse(w, RL_REJECT_MALFORMED, why);
        return;
    }
    if (w->exchange) {
        handle_exchange(w);
        return;
    }
    if (w->report.type == RL_WIRE_GOODBYE) {
        handle_goodbye(w, pipe);
        return;
    }
    if (w->report.type != RL_WIRE_REPORT) {
        refuse(w, RL_REJECT_MALFORMED, "not a report");
        return;
    }
    if (w->report.n_entries > agg->boot_config->aggregator.max_entries) {
        refuse(w, RL_REJECT_MALFORMED, "more entries than "
               "aggregator.max_entries");
        return;
    }
    const rl_wire_msg *m = &w->report;
    const rl_rule **rules = calloc(m->n_entries + 1, sizeof *rules);
    if (rules == NULL) {
        refuse(w, RL_REJECT_OUT_OF_MEMORY, "out of memory");
        return;
    }
    /* Counts for a rule a reload removed are refused, the rest applied:
     * the agent that counted them may not have reloaded yet. */
    size_t refused = 0;
    for (size_t i = 0; i < m->n_entries; i++) {
        const rl_rule *rule = rl_aggregator_rule(agg, m->entries[i].rule);
        if (rule == NULL && rl_aggregator_retired(agg, m->entries[i].rule)) {
            refused++;
            continue;
        }
        if (rule == NULL) {
            free(rules);
            refuse(w, RL_REJECT_UNKNOWN_RULE,
                   "a count for a rule that is not a synced rule here");
            return;
        }
        rules[i] = rule;
    }
    if (refused > 0 && keep_known(w, rules, refused) != 0) {
        free(rules);
        refuse(w, RL_REJECT_OUT_OF_MEMORY, "out of memory");
        return;
    }
    rl_wire_msg applied = *m;
    if (w->kept != NULL) {
        applied.entries = w->kept;
        applied.n_entries = w->n_kept;
    }
    if (!take_presence(w)) {
        free(rules);
        refuse(w, RL_REJECT_OUT_OF_MEMORY, "out of memory");
        return;
    }
    /* The decoded report points into the message: keep it until acked. */
    uint64_t now = rl_store_now_ms(agg->store);
    /* A ping (seq 0, windows.c) asks whether this aggregator is up: its
     * agent does not report here (yet). */
    int noted = m->seq > 0 ? rl_agents_note(agg, m, w->peer, pipe, now) : 0;
    if (noted != 0) {
        free(rules);
        free(w->presence);
        w->presence = NULL;
        if (noted == RL_AGENTS_PIPE_FULL)
            refuse(w, RL_REJECT_TOO_MANY_IDS, "a second agent id on one "
                   "connection");
        else
            refuse(w, RL_REJECT_TOO_MANY_AGENTS, "a new agent, and "
                   "aggregator.max_agents live ones are known already");
        return;
    }
    agg->in_flight++;
    w->sent_at_us = uv_hrtime() / 1000;
    /* A ping is answered once this aggregator can apply reports: on a
     * cluster it touches no key, and a restarted aggregator still
     * connecting to the shards would take keys back it cannot apply. */
    if (m->seq == 0 && !rl_store_up(agg->store)) {
        free(rules);
        on_applied(w, false, NULL, NULL, "Redis is not reachable yet");
        return;
    }
    if (now == 0) {
        free(rules);
        on_applied(w, false, NULL, NULL, "Redis's clock is not known yet");
        return;
    }
    rl_windows_apply(agg->windows, &applied, rules, w->presence,
                     w->n_presence, now, on_applied, w);
    free(rules);
}

static void handle(rl_ingest_worker *w)
{
    if (w->sending) {
        /* The ack went out (or the peer left): free what is ours. */
        if (w->result != 0)
            nng_msg_free(nng_aio_get_msg(w->aio));
        nng_msg_free(w->msg);
        w->msg = NULL;
        receive(w);
        return;
    }
    if (w->result != 0) {
        if (w->result != NNG_ECLOSED && w->result != NNG_ECANCELED)
            receive(w);
        return;
    }
    w->msg = nng_aio_get_msg(w->aio);
    if (w->agg->stopping) {
        nng_msg_free(w->msg);
        w->msg = NULL;
        return;
    }
    handle_report(w);
}

void rl_ingest_drain_ready(rl_aggregator *agg)
{
    pthread_mutex_lock(&agg->ready_lock);
    rl_ingest_worker *w = agg->ready;
    agg->ready = NULL;
    pthread_mutex_unlock(&agg->ready_lock);
    while (w != NULL) {
        rl_ingest_worker *next = w->next;
        handle(w);
        w = next;
    }
}

static int start_workers(rl_aggregator *agg, nng_socket sock,
                         rl_ingest_worker *workers, int n, char *err,
                         size_t errlen)
{
    for (int i = 0; i < n; i++) {
        rl_ingest_worker *w = &workers[i];
        int rv;
        w->agg = agg;
        w->exchange = workers == agg->exchange_workers;
        if ((rv = nng_ctx_open(&w->ctx, sock)) != 0
            || (rv = nng_aio_alloc(&w->aio, on_aio, w)) != 0) {
            snprintf(err, errlen, "cannot set up report workers: %s",
                     nng_strerror(rv));
            return -1;
        }
        receive(w);
    }
    return 0;
}

/* The other regions' exchanges, on this aggregator's own peer address
 * (its region's peers, at its index), with aggregator.tls as reports. */
static int start_peers(rl_aggregator *agg, char *err, size_t errlen)
{
    const rl_regions_config *rc = &agg->boot_config->regions;
    if (rc->n == 0)
        return 0;
    const rl_aggregator_config *c = &agg->boot_config->aggregator;
    size_t index = (size_t)(agg->endpoint - c->endpoints);
    const char *url = rc->regions[rc->self].peers[index];
    int rv = nng_rep0_open(&agg->peers);
    if (rv == 0)
        rv = nng_socket_set_size(agg->peers, NNG_OPT_RECVMAXSZ,
                                 c->max_message_bytes);
    if (rv != 0) {
        snprintf(err, errlen, "cannot open the peers socket: %s",
                 nng_strerror(rv));
        return -1;
    }
    if (rl_nng_listen(agg->peers, url, &c->tls, err, errlen) != 0)
        return -1;
    return start_workers(agg, agg->peers, agg->exchange_workers,
                         RL_EXCHANGE_WORKERS, err, errlen);
}

int rl_ingest_start(rl_aggregator *agg, char *err, size_t errlen)
{
    const rl_aggregator_config *c = &agg->config->aggregator;
    int rv = nng_rep0_open(&agg->reports);
    if (rv == 0)
        rv = nng_socket_set_size(agg->reports, NNG_OPT_RECVMAXSZ,
                                 c->max_message_bytes);
    if (rv != 0) {
        snprintf(err, errlen, "cannot open the reports socket: %s",
                 nng_strerror(rv));
        return -1;
    }
    if (rl_nng_listen(agg->reports, agg->endpoint->reports, &c->tls, err,
                      errlen) != 0)
        return -1;
    if (start_workers(agg, agg->reports, agg->workers, RL_INGEST_WORKERS,
                      err, errlen) != 0)
        return -1;
    return start_peers(agg, err, errlen);
}

static void stop_workers(nng_socket sock, rl_ingest_worker *workers, int n)
{
    for (int i = 0; i < n; i++) {
        rl_ingest_worker *w = &workers[i];
        if (w->aio != NULL)
            nng_aio_stop(w->aio);
        rl_nng_handoff(w);
    }
    if (nng_socket_id(sock) > 0)
        nng_close(sock);
    for (int i = 0; i < n; i++) {
        rl_ingest_worker *w = &workers[i];
        nng_msg_free(w->msg);
        rl_wire_msg_free(&w->report);
        free(w->kept);
        free(w->kept_of);
        w->kept = NULL;
        w->kept_of = NULL;
        free(w->presence);
        w->presence = NULL;
        if (w->aio != NULL)
            nng_aio_free(w->aio);
        w->aio = NULL;
    }
}

void rl_ingest_stop(rl_aggregator *agg)
{
    stop_workers(agg->reports, agg->workers, RL_INGEST_WORKERS);
    stop_workers(agg->peers, agg->exchange_workers, RL_EXCHANGE_WORKERS);
    /* Callbacks stopped above may still have queued workers. */
    pthread_mutex_lock(&agg->ready_lock);
    agg->ready = NULL;
    pthread_mutex_unlock(&agg->ready_lock);
}
