/*
 * hold.c: a hold's life (hold.h). The request is checked and charged its
 * estimate as any check is; an allowed one's hold keeps the request, and
 * its end charges every rule that took the estimate the difference
 * between the actual cost and it (end_rule). Ends run on the I/O thread:
 * rl_hold_end only queues the hold, under the agent's hold lock, and wakes
 * the thread, so the caller never waits for the store, and an exact
 * rule's difference leaves in the same write as that turn's checks.
 *
 * The agent ends a hold at its estimate when hold_timeout_ms passes
 * (hold_expired) or when it closes: every rule keeps the estimate it was
 * charged. A caller's rl_hold_end after that only frees the hold.
 */
#include "hold.h"

#include "agent_impl.h"
#include "window.h"

#include <sched.h>
#include <stdlib.h>
#include <string.h>

/* Who ended the hold (hold.h). */
enum { HOLD_OPEN, HOLD_ENDING, HOLD_AGENT_ENDED };

struct rl_hold {
    rl_hold *prev, *next; /* the open list; next: the ended queue */
    rl_agent *agent;
    rl_request *req;      /* a reference, while the agent holds the hold */
    rl_hold_fn fn;
    void *arg;
    uint64_t deadline_ns;
    uint32_t actual;      /* written by the caller before it queues */
    atomic_int state;
    atomic_int refs;      /* the caller's and the agent's */
};

void rl_holds_init(rl_holds *h)
{
    pthread_mutex_init(&h->lock, NULL);
}

void rl_holds_start(rl_holds *h, uv_loop_t *loop, uint32_t timeout_ms)
{
    h->timeout_ns = (uint64_t)timeout_ms * 1000000ULL;
    uv_timer_init(loop, &h->timer);
}

void rl_holds_fini(rl_holds *h)
{
    pthread_mutex_destroy(&h->lock);
}

rl_hold *rl_hold_new(rl_agent *agent, rl_hold_fn fn, void *arg)
{
    rl_hold *h = calloc(1, sizeof *h);
    if (h == NULL)
        return NULL;
    h->agent = agent;
    h->fn = fn;
    h->arg = arg;
    atomic_init(&h->state, HOLD_OPEN);
    atomic_init(&h->refs, 2);
    return h;
}

void rl_hold_discard(rl_hold *hold)
{
    free(hold);
}

void rl_hold_bind(rl_hold *hold, rl_request *req)
{
    hold->req = req;
}

static void release(rl_hold *h)
{
    if (atomic_fetch_sub(&h->refs, 1) == 1)
        free(h);
}

/* Whether a rule of an allowed request took the estimate: a bucket that
 * allowed (atomic's uncharged did not), a window that counted it (a
 * window counts a rejected hit too: a shadow rule's), a local, synced or
 * leased rule that allowed. A rule the store did not answer charged
 * nothing in the store (its fallback bucket, on_error: local, keeps the
 * estimate: a degraded request's difference is not taken). */
static bool took_estimate(const rl_rule_state *rs)
{
    /* An in_flight rule's charge is its slot, whoever decided it (the
     * store, or on_error: local's share). */
    if (rs->rule->mode == RL_MODE_IN_FLIGHT)
        return rs->slot_taken;
    if (rs->outcome != RL_OUTCOME_ANSWERED || rs->uncharged)
        return false;
    return rs->reply.allowed
           || rs->rule->algorithm == RL_ALGO_FIXED_WINDOW;
}

static void close_done(rl_agent *a);

/* A difference's call answered (or failed: logged). At the close, the
 * last one lets the close go on. */
static void on_committed(void *arg, const redisReply *r, const char *error)
{
    rl_agent *a = arg;
    if (r == NULL)
        rl_log(&a->log, RL_LOG_WARN, "hold_commit_failed",
               "reason=\"%s\"", error);
    if (--a->holds.commits == 0 && a->holds.then != NULL)
        close_done(a);
}

/* The identity of a rule of the request's generation. */
static rl_ident *ident(const rl_request *req, const rl_rule *rule)
{
    return req->gen->idents[rule - req->gen->config->rules];
}

/* A leased rule's difference, at the rate it was checked at (its args
 * are the rule's own, whatever override applied). */
static void leased_commit(rl_agent *a, const rl_rule_state *rs,
                          const rl_limit *rate, int64_t delta)
{
    rl_bucket_args args;
    rl_bucket_args_rate(&args, rs->rule, rate);
    a->holds.commits++;
    rl_bucket_commit(a->store, &args, rs->req->keys + rs->key_offset,
                     rs->key_len, delta, on_committed, a);
}

/* The end of one rule that took the estimate, by its mode: the one place
 * a rule's hold ends, whoever ends it (delta is 0 when the agent ends it
 * at its estimate). */
static void end_rule(rl_agent *a, const rl_hold *h, rl_rule_state *rs,
                     int64_t delta)
{
    rl_request *req = h->req;
    const char *key = req->keys + rs->key_offset;
    size_t prefix = strlen(rs->rule->key_prefix);
    const rl_limit *rate = rs->rate != NULL ? rs->rate : &rs->rule->own;
    switch (rs->rule->mode) {
    case RL_MODE_EXACT:
        if (delta == 0 || a->store == NULL)
            break;
        a->holds.commits++;
        if (rs->rule->algorithm == RL_ALGO_FIXED_WINDOW)
            rl_window_add(a->store, key, rs->key_len,
                          req->calls[rs - req->rules].window, rate->period_ms,
                          delta, on_committed, a);
        else
            rl_bucket_commit(a->store, rs->args, key, rs->key_len, delta,
                             on_committed, a);
        break;
    case RL_MODE_IN_FLIGHT:
        /* Its slot is let go whatever the cost: the request is over. */
        rs->slot_taken = false;
        rl_in_flight_release(&a->in_flight, key, rs->key_len);
        break;
    case RL_MODE_LEASED:
        /* Settled in the key's hand, with no call (leased.c); a key whose
         * hand is gone (idle, a reload, the close, the cap) has only the
         * bucket left: the difference goes there, in debt as an exact
         * rule's, which the next lease finds dry until it is paid. */
        if (delta != 0
            && !rl_leased_settle(&a->leased, ident(req, rs->rule), rate,
                                 key + prefix, rs->key_len - prefix, delta)
            && a->store != NULL)
            leased_commit(a, rs, rate, delta);
        break;
    case RL_MODE_LOCAL:
        if (delta != 0)
            rl_local_settle(&a->local, rs->rule, ident(req, rs->rule), rate,
                            key + prefix, rs->key_len - prefix, delta,
                            req->calls[rs - req->rules].window);
        break;
    case RL_MODE_SYNCED:
        if (delta != 0)
            rl_synced_settle(&a->synced, ident(req, rs->rule), key + prefix,
                             rs->key_len - prefix, delta, req->checked_ns);
        break;
    }
}

/* Ends h's rules at actual, on the I/O thread, and lets go of the
 * request. */
static void end(rl_agent *a, rl_hold *h, uint32_t actual)
{
    rl_request *req = h->req;
    int64_t delta = (int64_t)actual - (int64_t)req->cost;
    for (int i = 0; i < req->n_rules; i++) {
        if (took_estimate(&req->rules[i]))
            end_rule(a, h, &req->rules[i], delta);
    }
    h->req = NULL;
    rl_request_release(req);
    atomic_fetch_sub_explicit(&a->holds.open, 1, memory_order_relaxed);
    release(h);
}

/* The one place a rejected request's rules are undone: it holds nothing.
 * Its estimate stays charged as rl_check's would (charge says what a
 * rejection takes back, and exact.c has taken it); the in_flight slots
 * its allowing rules took are let go at once. */
static void undo_rejected(rl_agent *a, rl_request *req)
{
    rl_exact_release_slots(a, req);
}

static void unlink_open(rl_holds *hs, rl_hold *h)
{
    if (h->prev != NULL)
        h->prev->next = h->next;
    else
        hs->head = h->next;
    if (h->next != NULL)
        h->next->prev = h->prev;
    else
        hs->tail = h->prev;
    h->prev = h->next = NULL;
}

static void on_timer(uv_timer_t *t);

/* The timer at the first open hold's deadline, if any. */
static void arm(rl_holds *hs)
{
    pthread_mutex_lock(&hs->lock);
    uint64_t due = hs->head != NULL ? hs->head->deadline_ns : 0;
    pthread_mutex_unlock(&hs->lock);
    if (due == 0) {
        uv_timer_stop(&hs->timer);
        return;
    }
    uint64_t now = uv_hrtime();
    uv_timer_start(&hs->timer, on_timer,
                   due > now ? (due - now + 999999) / 1000000 : 0, 0);
}

void rl_hold_decided(const rl_decision *decision, void *arg)
{
    rl_hold *h = arg;
    rl_request *req = h->req;
    rl_agent *a = req->agent;
    if (!decision->allowed) {
        undo_rejected(a, req);
        h->fn(decision, NULL, h->arg);
        free(h);
        return;
    }
    atomic_fetch_add(&req->refs, 1);
    rl_holds *hs = &a->holds;
    h->deadline_ns = uv_hrtime() + hs->timeout_ns;
    pthread_mutex_lock(&hs->lock);
    h->prev = hs->tail;
    if (hs->tail != NULL)
        hs->tail->next = h;
    else
        hs->head = h;
    hs->tail = h;
    bool first = hs->head == h;
    pthread_mutex_unlock(&hs->lock);
    atomic_fetch_add_explicit(&hs->open, 1, memory_order_relaxed);
    if (first)
        arm(hs);
    h->fn(decision, h, h->arg);
}

int rl_hold_end(rl_hold *h, uint32_t actual)
{
    if (h == NULL)
        return RL_EINVAL;
    int expected = HOLD_OPEN;
    /* ENDING keeps the agent: its close waits for the hold to leave the
     * open list (rl_holds_close). */
    if (atomic_compare_exchange_strong(&h->state, &expected, HOLD_ENDING)) {
        rl_agent *a = h->agent;
        rl_holds *hs = &a->holds;
        h->actual = actual;
        pthread_mutex_lock(&hs->lock);
        unlink_open(hs, h);
        h->next = hs->ended;
        hs->ended = h;
        /* The wakeup handle is open until the holds are closed. */
        if (!hs->closed)
            uv_async_send(&a->wakeup);
        pthread_mutex_unlock(&hs->lock);
    }
    release(h);
    return RL_OK;
}

/* Takes the queue of holds their callers ended. */
static rl_hold *take_ended(rl_holds *hs)
{
    pthread_mutex_lock(&hs->lock);
    rl_hold *h = hs->ended;
    hs->ended = NULL;
    pthread_mutex_unlock(&hs->lock);
    return h;
}

static void end_queue(rl_agent *a, rl_hold *h)
{
    while (h != NULL) {
        rl_hold *next = h->next;
        atomic_fetch_add_explicit(&a->holds.ended_n, 1,
                                  memory_order_relaxed);
        end(a, h, h->actual);
        h = next;
    }
}

void rl_holds_serve(rl_agent *a)
{
    end_queue(a, take_ended(&a->holds));
}

/* Claims h for the agent, under the lock, unless its caller is ending it:
 * unlinked, onto *list. */
static void claim(rl_holds *hs, rl_hold *h, rl_hold **list)
{
    int expected = HOLD_OPEN;
    if (!atomic_compare_exchange_strong(&h->state, &expected,
                                        HOLD_AGENT_ENDED))
        return;
    unlink_open(hs, h);
    h->next = *list;
    *list = h;
}

/* Ends the claimed holds at their estimates. */
static void end_at_estimates(rl_agent *a, rl_hold *h, bool expired)
{
    while (h != NULL) {
        rl_hold *next = h->next;
        if (expired) {
            atomic_fetch_add_explicit(&a->holds.expired, 1,
                                      memory_order_relaxed);
            rl_log(&a->log, RL_LOG_WARN, "hold_expired",
                   "estimate=%u timeout_ms=%llu", h->req->cost,
                   (unsigned long long)(a->holds.timeout_ns / 1000000));
        }
        end(a, h, h->req->cost);
        h = next;
    }
}

static void on_timer(uv_timer_t *t)
{
    rl_agent *a = t->data;
    rl_holds *hs = &a->holds;
    rl_hold *expired = NULL;
    uint64_t now = uv_hrtime() + 500000; /* timers round to whole ms */
    pthread_mutex_lock(&hs->lock);
    rl_hold *h = hs->head;
    while (h != NULL && h->deadline_ns <= now) {
        rl_hold *next = h->next;
        claim(hs, h, &expired);
        h = next;
    }
    pthread_mutex_unlock(&hs->lock);
    end_at_estimates(a, expired, true);
    arm(hs);
}

/* The close goes on: every difference's call is answered, or the
 * store's timeout passed (those left fail as the store closes). */
static void close_done(rl_agent *a)
{
    void (*then)(void *) = a->holds.then;
    a->holds.then = NULL;
    uv_close((uv_handle_t *)&a->holds.timer, NULL);
    then(a);
}

static void on_close_timeout(uv_timer_t *t)
{
    close_done(t->data);
}

void rl_holds_close(rl_agent *a, void (*then)(void *agent))
{
    rl_holds *hs = &a->holds;
    rl_hold *open = NULL;
    pthread_mutex_lock(&hs->lock);
    hs->closed = true;
    for (rl_hold *h = hs->head; h != NULL;) {
        rl_hold *next = h->next;
        claim(hs, h, &open);
        h = next;
    }
    /* Those their callers are ending leave the list in a moment. */
    while (hs->head != NULL) {
        pthread_mutex_unlock(&hs->lock);
        sched_yield();
        pthread_mutex_lock(&hs->lock);
    }
    pthread_mutex_unlock(&hs->lock);
    end_queue(a, take_ended(hs));
    end_at_estimates(a, open, false);
    hs->then = then;
    if (hs->commits == 0) {
        close_done(a);
        return;
    }
    uv_timer_stop(&hs->timer);
    uv_timer_start(&hs->timer, on_close_timeout, a->store_config.timeout_ms,
                   0);
}
