/*
 * exact.c: a check on the I/O thread. A request's exact rules go to the
 * store in one call per shard: the multi-bucket function (scripts.c) takes
 * every key of one cluster slot, so on one Redis a request is one call and
 * on a cluster one per slot it touches (a shared hash_tag puts them in
 * one). A rule alone in its slot is a plain bucket call. Leased rules the
 * caller's hand could not serve wait for their lease (leased.c), beside
 * the calls: they spend local tokens, never a call per request.
 *
 * charge: all and refund charge each rule as if alone; atomic charges the
 * rules of one call all or none, and gives back the tokens of the calls
 * that charged when another rejected (as refund does: when a request's
 * rules span slots, atomic is a refund between its calls). first_reject is
 * one call that stops at the first rejecting rule when every rule is exact
 * and in one slot; otherwise the rules go one at a time, in config order.
 * The request is decided when every call has answered or its deadline
 * passes, whichever is first; replies that come later are dropped. A
 * refund is a second call the caller does not wait for, on the same
 * connection, so any later call of this agent sees it.
 *
 * A fixed window (window.h) is a call of its own, never in a multi call:
 * a refund gives its hit back whether it allowed or not, since its count
 * took the hit either way.
 *
 * A request is served under the rules it was built with (req->gen): its
 * charge, its rules' bucket arguments and counters.
 *
 * Live requests are kept in deadline order; one timer fires at the first
 * deadline.
 */
#include "agent_impl.h"

#include "keys.h"
#include "window.h"

#include <stdlib.h>
#include <string.h>

static void live_insert(rl_agent *a, rl_request *req)
{
    rl_request *after = a->live_tail;
    while (after != NULL && after->deadline_ns > req->deadline_ns)
        after = after->live_prev;
    req->live_prev = after;
    req->live_next = after != NULL ? after->live_next : a->live_head;
    if (req->live_next != NULL)
        req->live_next->live_prev = req;
    else
        a->live_tail = req;
    if (after != NULL)
        after->live_next = req;
    else
        a->live_head = req;
}

static void live_remove(rl_agent *a, rl_request *req)
{
    if (req->live_prev != NULL)
        req->live_prev->live_next = req->live_next;
    else
        a->live_head = req->live_next;
    if (req->live_next != NULL)
        req->live_next->live_prev = req->live_prev;
    else
        a->live_tail = req->live_prev;
    req->live_prev = req->live_next = NULL;
}

/* The I/O thread lets go of a request once it is decided and every call it
 * made has been answered (a late reply still points to it). */
static void maybe_release(rl_request *req)
{
    if (req->finalized && req->outstanding == 0)
        rl_request_release(req);
}

static void on_refund_reply(void *arg, const rl_bucket_reply *reply,
                            const char *error)
{
    rl_agent *a = arg;
    if (reply == NULL)
        rl_log(&a->log, RL_LOG_WARN, "refund_failed", "reason=\"%s\"", error);
}

static bool is_window(const rl_rule *r)
{
    return r->algorithm == RL_ALGO_FIXED_WINDOW;
}

static void refund(rl_agent *a, rl_request *req)
{
    for (int i = 0; i < req->n_rules; i++) {
        const rl_rule_state *rs = &req->rules[i];
        if (rs->outcome == RL_OUTCOME_ANSWERED && is_window(rs->rule)
            && rs->rule->mode == RL_MODE_EXACT) {
            rl_window_give_back(a->store, req->keys + rs->key_offset,
                                rs->key_len, req->calls[i].window,
                                (int64_t)req->cost, &a->log);
            continue;
        }
        if (rs->outcome == RL_OUTCOME_ANSWERED && rs->reply.allowed
            && !rs->uncharged && rs->rule->mode == RL_MODE_EXACT)
            rl_bucket_call(a->store, rs->args, req->keys + rs->key_offset,
                          rs->key_len, -(int64_t)req->cost, on_refund_reply,
                          a);
    }
}

/* Whether the decision is the I/O thread's to make: an async request's
 * always; a blocking one's unless its caller gave up waiting and decided
 * alone (then the caller charged the fallback buckets, not this thread). */
static bool claim(rl_request *req)
{
    if (req->callback != NULL)
        return true;
    int expected = RL_OWNER_PENDING;
    return atomic_compare_exchange_strong(&req->owner, &expected,
                                          RL_OWNER_DECIDING);
}

static void deliver(rl_request *req, bool claimed)
{
    if (req->callback != NULL) {
        req->callback(&req->decision, req->callback_arg);
        return;
    }
    if (claimed) {
        /* Release: the decision is written before DONE (check.c reads it
         * after an acquire load of DONE). */
        atomic_store(&req->owner, RL_OWNER_DONE);
        sem_post(&req->done);
    }
}

/* An unanswered rule with on_error: local is decided by its fallback
 * bucket, once. */
static void fall_back(rl_agent *a, rl_request *req, rl_rule_state *rs)
{
    if (rs->outcome == RL_OUTCOME_FAILED && !rs->fallback
        && rs->rule->on_error == RL_ON_ERROR_LOCAL
        && (req->callback != NULL
            || atomic_load(&req->owner) != RL_OWNER_ABANDONED))
        rl_fallback_decide_key(a, req, rs);
}

/* Decides the request with what is known now; rules still pending count
 * as unanswered (on_error decides). */
/* The decision in the stats, and how long it took if it went to the
 * store (the deadline is timeout_ms after the request was built). */
static void count(rl_agent *a, const rl_request *req)
{
    rl_stats_count(&req->gen->stats, req->rules, req->n_rules,
                   &req->decision, req->gen->config->rules);
    for (int i = 0; i < req->n_rules; i++) {
        if (!rl_mode_stored(req->rules[i].rule->mode))
            continue;
        uint64_t started = req->deadline_ns
                           - (uint64_t)a->store_config.timeout_ms * 1000000;
        uint64_t now = uv_hrtime();
        rl_stats_latency(&a->stats, now > started ? now - started : 0);
        return;
    }
}

void rl_exact_release_slots(rl_agent *a, rl_request *req)
{
    for (int i = 0; i < req->n_rules; i++) {
        rl_rule_state *rs = &req->rules[i];
        if (!rs->slot_taken)
            continue;
        rs->slot_taken = false;
        rl_in_flight_release(&a->in_flight, req->keys + rs->key_offset,
                             rs->key_len);
    }
}

static void finalize(rl_agent *a, rl_request *req)
{
    bool claimed = claim(req);
    for (int i = 0; i < req->n_rules; i++) {
        if (req->rules[i].outcome == RL_OUTCOME_PENDING)
            req->rules[i].outcome = RL_OUTCOME_FAILED;
        if (claimed)
            fall_back(a, req, &req->rules[i]);
    }
    rl_decide(req->rules, req->n_rules, &req->decision);
    /* A request its caller gave up on was counted by the caller, as it
     * decided it. */
    if (claimed)
        count(a, req);
    rl_charge charge = req->gen->config->charge;
    if (!req->decision.allowed
        && (charge == RL_CHARGE_REFUND || charge == RL_CHARGE_ATOMIC)
        && a->store != NULL)
        refund(a, req);
    req->finalized = true;
    live_remove(a, req);
    deliver(req, claimed);
    maybe_release(req);
}

static void on_rule_reply(void *arg, const rl_bucket_reply *reply,
                          const char *error);
static void send_alone(rl_agent *a, rl_rule_state *rs);

static bool is_slot(const rl_rule_state *rs)
{
    return rs->rule->mode == RL_MODE_IN_FLIGHT;
}

static void send_rule(rl_agent *a, rl_rule_state *rs)
{
    rl_request *req = rs->req;
    if (is_slot(rs) && a->store != NULL) {
        send_alone(a, rs);
        return;
    }
    req->outstanding++;
    if (a->store == NULL) {
        on_rule_reply(rs, NULL, "no store");
        return;
    }
    if (rs->rule->mode == RL_MODE_LEASED) {
        /* Waits for the key's lease (leased.c), not a bucket call. */
        const rl_rule *r = rs->rule;
        size_t prefix = strlen(r->key_prefix);
        rl_leased_wait(&a->leased, r, req->gen->idents[r - req->gen->config
                                                              ->rules],
                       rs->rate != NULL ? rs->rate : &r->own,
                       req->keys + rs->key_offset, rs->key_len,
                       rs->key_len - prefix, req->cost, on_rule_reply, rs);
        return;
    }
    if (is_window(rs->rule)) {
        rl_window_call_in(a->store, &req->calls[rs - req->rules],
                          rs->rate != NULL ? rs->rate : &rs->rule->own,
                          req->keys + rs->key_offset, rs->key_len, req->cost,
                          on_rule_reply, rs);
        return;
    }
    rl_bucket_call_in(a->store, &req->calls[rs - req->rules], rs->args,
                      req->keys + rs->key_offset, rs->key_len, req->cost,
                      on_rule_reply, rs);
}

/* The next rule, from index from on, that still waits for the store. */
static int next_pending(const rl_request *req, int from)
{
    while (from < req->n_rules
           && req->rules[from].outcome != RL_OUTCOME_PENDING)
        from++;
    return from;
}

/* Marks the rules from index from on that were not checked. */
static void skip_rest(rl_request *req, int from)
{
    for (int i = from; i < req->n_rules; i++) {
        if (req->rules[i].outcome == RL_OUTCOME_PENDING)
            req->rules[i].outcome = RL_OUTCOME_SKIPPED;
    }
}

/* Whether charge: first_reject goes on past rs: while every rule so far
 * has let the request through; a shadow rule's rejection is not the
 * request's. The fallback decides now, as its answer says whether to go
 * on. A caller that gives up on this request later charges the buckets
 * again (less admitted, never more: a rare double count). */
static bool passes_in_order(rl_agent *a, rl_request *req, rl_rule_state *rs)
{
    fall_back(a, req, rs);
    return rs->shadow || (rs->outcome == RL_OUTCOME_ANSWERED
                              ? rs->reply.allowed
                              : rl_unanswered_allows(rs));
}

/* charge: first_reject, one rule at a time: sends the next one. */
static bool send_next_in_order(rl_agent *a, rl_request *req,
                               rl_rule_state *last)
{
    bool passed = passes_in_order(a, req, last);
    int next = next_pending(req, req->next_rule);
    if (!passed || next >= req->n_rules) {
        skip_rest(req, next);
        return false;
    }
    req->next_rule = next + 1;
    send_rule(a, &req->rules[next]);
    return true;
}

/* A rule's answer, or why it has none. */
static void record(rl_agent *a, rl_rule_state *rs,
                   const rl_bucket_reply *reply, const char *error)
{
    if (reply != NULL) {
        rs->outcome = RL_OUTCOME_ANSWERED;
        rs->reply = *reply;
        return;
    }
    rs->outcome = RL_OUTCOME_FAILED;
    /* A leased key over the cap is not the store's failure. */
    if (error != rl_leased_refused)
        atomic_fetch_add_explicit(&a->stats.store_errors, 1,
                                  memory_order_relaxed);
    rl_log(&a->log, RL_LOG_DEBUG, "rule_unanswered", "rule=%s reason=\"%s\"",
           rs->rule->name, error);
}

static void on_rule_reply(void *arg, const rl_bucket_reply *reply,
                          const char *error)
{
    rl_rule_state *rs = arg;
    rl_request *req = rs->req;
    rl_agent *a = req->agent;
    req->outstanding--;
    if (req->finalized) {
        maybe_release(req);
        return;
    }
    record(a, rs, reply, error);
    if (req->gen->config->charge == RL_CHARGE_FIRST_REJECT
        && send_next_in_order(a, req, rs))
        return;
    if (req->outstanding == 0)
        finalize(a, req);
}

/* --- One call per slot ------------------------------------------------ */

static rl_multi_mode multi_mode(rl_charge charge);

/* The rules of one multi call, by index into the request. */
typedef struct group {
    rl_request *req;
    rl_multi_mode mode;
    int n;
    int index[];
} group;

/* Whether an atomic call charged nothing: one of its enforced rules
 * rejected. */
static bool none_charged(const group *g, const rl_bucket_reply *replies,
                         int n)
{
    for (int k = 0; g->mode == RL_MULTI_ATOMIC && k < n; k++) {
        if (!replies[k].allowed && !g->req->rules[g->index[k]].shadow)
            return true;
    }
    return false;
}

/* A first_reject call that failed: its rules' fallbacks decide in order,
 * and the first that rejects stops the rest, as one call per rule would
 * (the rules after it were never checked: skipped, not failed). */
static void fail_in_order(rl_agent *a, rl_request *req, const group *g,
                          const char *error)
{
    int k = 0;
    while (k < g->n) {
        rl_rule_state *rs = &req->rules[g->index[k++]];
        record(a, rs, NULL, error);
        if (!passes_in_order(a, req, rs))
            break;
    }
    while (k < g->n)
        req->rules[g->index[k++]].outcome = RL_OUTCOME_SKIPPED;
}

/* The slots the call's in_flight items took: held by the request, or,
 * when it was decided without them (its deadline passed), let go. */
static void note_slots(rl_agent *a, rl_request *req, const group *g,
                       const rl_bucket_reply *replies, int n)
{
    bool uncharged = replies != NULL && none_charged(g, replies, n);
    for (int k = 0; k < g->n && req->takes_slots; k++) {
        rl_rule_state *rs = &req->rules[g->index[k]];
        if (!is_slot(rs))
            continue;
        const char *key = req->keys + rs->key_offset;
        bool took = replies != NULL && k < n && replies[k].allowed
                    && !uncharged;
        rl_in_flight_taken(&a->in_flight, key, rs->key_len, took);
        if (took && req->finalized)
            rl_in_flight_release(&a->in_flight, key, rs->key_len);
        else
            rs->slot_taken = took;
    }
}

static void on_group_reply(void *arg, const rl_bucket_reply *replies, int n,
                           const char *error)
{
    group *g = arg;
    rl_request *req = g->req;
    rl_agent *a = req->agent;
    req->outstanding--;
    note_slots(a, req, g, replies, n);
    if (req->finalized) {
        free(g);
        maybe_release(req);
        return;
    }
    if (replies == NULL && g->mode == RL_MULTI_FIRST_REJECT) {
        fail_in_order(a, req, g, error);
    } else {
        bool uncharged = replies != NULL && none_charged(g, replies, n);
        for (int k = 0; k < g->n; k++) {
            rl_rule_state *rs = &req->rules[g->index[k]];
            if (replies == NULL) {
                record(a, rs, NULL, error);
            } else if (k < n) {
                record(a, rs, &replies[k], NULL);
                rs->uncharged = uncharged && replies[k].allowed;
            } else {
                rs->outcome = RL_OUTCOME_SKIPPED;
            }
        }
    }
    free(g);
    if (req->outstanding == 0)
        finalize(a, req);
}

/* Items of a multi call on the stack up to this many rules. */
#define GROUP_ON_STACK 8

static void send_group(rl_agent *a, rl_request *req, rl_multi_mode mode,
                       group *g)
{
    rl_bucket_item stack[GROUP_ON_STACK] = {0};
    rl_bucket_item *items = g->n <= GROUP_ON_STACK
                                ? stack
                                : malloc((size_t)g->n * sizeof *items);
    req->outstanding++;
    g->req = req;
    g->mode = mode;
    if (items == NULL) {
        on_group_reply(g, NULL, 0, "out of memory");
        return;
    }
    for (int k = 0; k < g->n; k++) {
        const rl_rule_state *rs = &req->rules[g->index[k]];
        const char *key = req->keys + rs->key_offset;
        bool slot = is_slot(rs);
        items[k] = (rl_bucket_item){
            .args = rs->args, .key = key, .key_len = rs->key_len,
            .enforced = !rs->shadow,
            .slot_id = slot ? a->in_flight.id : NULL,
            .lease = a->in_flight.lease,
            .take = slot && req->takes_slots};
        if (items[k].take)
            rl_in_flight_taking(&a->in_flight, key, rs->key_len);
    }
    rl_bucket_multi(a->store, mode, items, g->n, req->cost, on_group_reply,
                    g);
    if (items != stack)
        free(items);
}

/* A pending rule that a multi call can take: an exact bucket or an
 * in_flight rule's slots. */
static bool pending_exact(const rl_rule_state *rs)
{
    return rs->outcome == RL_OUTCOME_PENDING
           && rl_mode_stored(rs->rule->mode) && !is_window(rs->rule);
}

/* The cluster slot of a rule's key; 0 for every key of one server, where
 * one call takes them all. */
static uint16_t slot_of(const rl_agent *a, const rl_rule_state *rs)
{
    if (!rl_store_is_cluster(a->store))
        return 0;
    return rl_key_slot(rs->req->keys + rs->key_offset, rs->key_len);
}

/* Gathers into g the pending exact rules from index first on that share
 * its slot (first's own included); returns how many. */
static int gather(const rl_agent *a, rl_request *req, int first, group *g)
{
    uint16_t slot = slot_of(a, &req->rules[first]);
    g->n = 0;
    for (int i = first; i < req->n_rules; i++) {
        rl_rule_state *rs = &req->rules[i];
        if (pending_exact(rs) && !rs->grouped && slot_of(a, rs) == slot) {
            rs->grouped = true;
            g->index[g->n++] = i;
        }
    }
    return g->n;
}

/* An in_flight rule alone in its slot: a multi call of one, as only the
 * multi function takes slots. */
static void send_alone(rl_agent *a, rl_rule_state *rs)
{
    rl_request *req = rs->req;
    group *g = malloc(sizeof *g + sizeof g->index[0]);
    if (g == NULL) {
        req->outstanding++;
        on_rule_reply(rs, NULL, "out of memory");
        return;
    }
    g->n = 1;
    g->index[0] = (int)(rs - req->rules);
    rs->grouped = true;
    send_group(a, req, multi_mode(req->gen->config->charge), g);
}

/* Sends every pending rule: exact buckets in one call per slot (a plain
 * bucket call for a rule alone in its slot), fixed windows in calls of
 * their own, leased ones to their leases. */
static void send_grouped(rl_agent *a, rl_request *req, rl_multi_mode mode)
{
    for (int i = 0; i < req->n_rules; i++) {
        rl_rule_state *rs = &req->rules[i];
        if (rs->outcome != RL_OUTCOME_PENDING || rs->grouped)
            continue;
        if (!pending_exact(rs) || a->store == NULL) {
            send_rule(a, rs);
            continue;
        }
        group *g = malloc(sizeof *g + (size_t)(req->n_rules - i)
                                          * sizeof g->index[0]);
        if (g == NULL || gather(a, req, i, g) == 1) {
            free(g);
            rs->grouped = true;
            send_rule(a, rs);
            continue;
        }
        send_group(a, req, mode, g);
    }
}

/* Whether one call can serve charge: first_reject: every rule left is
 * an exact bucket, and in one slot. */
static bool one_call(const rl_agent *a, const rl_request *req, int first)
{
    if (a->store == NULL)
        return false;
    uint16_t slot = slot_of(a, &req->rules[first]);
    for (int i = first; i < req->n_rules; i++) {
        const rl_rule_state *rs = &req->rules[i];
        if (rs->outcome != RL_OUTCOME_PENDING)
            continue;
        if (!pending_exact(rs) || slot_of(a, rs) != slot)
            return false;
    }
    return true;
}

static rl_multi_mode multi_mode(rl_charge charge)
{
    switch (charge) {
    case RL_CHARGE_ATOMIC:
        return RL_MULTI_ATOMIC;
    case RL_CHARGE_FIRST_REJECT:
        return RL_MULTI_FIRST_REJECT;
    default:
        return RL_MULTI_EACH;
    }
}

void rl_exact_start(rl_agent *a, rl_request *req)
{
    live_insert(a, req);
    int first = next_pending(req, 0);
    if (first >= req->n_rules) {
        finalize(a, req);
        return;
    }
    rl_charge charge = req->gen->config->charge;
    if (charge == RL_CHARGE_FIRST_REJECT && !one_call(a, req, first)) {
        req->next_rule = first + 1;
        send_rule(a, &req->rules[first]);
        return;
    }
    /* Mark every call as outstanding first: a call that fails at once
     * answers inside rl_bucket_call and must not finalize early. */
    req->outstanding++;
    send_grouped(a, req, multi_mode(charge));
    if (--req->outstanding == 0 && !req->finalized)
        finalize(a, req);
}

void rl_exact_expire(rl_agent *a, uint64_t now_ns)
{
    while (a->live_head != NULL && a->live_head->deadline_ns <= now_ns)
        finalize(a, a->live_head);
}

void rl_exact_finalize_all(rl_agent *a)
{
    while (a->live_head != NULL)
        finalize(a, a->live_head);
}

static void deadline_fired(uv_timer_t *t)
{
    rl_agent *a = t->data;
    /* Timers count whole ms from a cached loop time: accept up to half a
     * millisecond early rather than wait another turn. */
    rl_exact_expire(a, uv_hrtime() + 500000);
    rl_exact_arm_deadline(a);
}

void rl_exact_arm_deadline(rl_agent *a)
{
    if (a->live_head == NULL) {
        uv_timer_stop(&a->deadline_timer);
        return;
    }
    uv_update_time(&a->loop);
    uint64_t now = uv_hrtime();
    uint64_t due = a->live_head->deadline_ns;
    uint64_t wait_ms = due > now ? (due - now + 999999) / 1000000 : 0;
    uv_timer_start(&a->deadline_timer, deadline_fired, wait_ms, 0);
}
