/*
 * hold.h: holds (rl_check_hold), a request's charge kept open until the
 * caller knows its actual cost. Private to librl.
 *
 * A hold keeps its request (agent_impl.h): each rule's key, bucket
 * arguments, rate and mode, and how each came out, which says whether it
 * charged the estimate. Its end charges each such rule the difference
 * (hold.c, one switch by rule mode), on the I/O thread.
 *
 * Who ends a hold: the caller (rl_hold_end), or the agent when its
 * hold_timeout_ms passes or the agent closes. One atomic state says which:
 * the caller moves it from OPEN to ENDING and hands the hold to the I/O
 * thread through a queue; the agent moves it from OPEN to AGENT_ENDED and
 * ends it at its estimate. Each side holds a reference; the last frees.
 */
#ifndef RL_AGENT_HOLD_H
#define RL_AGENT_HOLD_H

#include "rl.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

typedef struct rl_request rl_request;

/* The agent's holds. */
typedef struct rl_holds {
    pthread_mutex_t lock;
    rl_hold *head, *tail;  /* open, by deadline (one timeout: by age) */
    rl_hold *ended;        /* ended by their callers, for the I/O thread */
    bool closed;           /* the agent ended every open hold */
    uint64_t timeout_ns;
    uv_timer_t timer;      /* the I/O thread's: the first deadline; at
                            * the close, the calls' */
    size_t commits;        /* I/O thread: differences' calls unanswered */
    void (*then)(void *);  /* I/O thread: the close's next step */
    /* rl_agent_counters: open now, ended by callers, ended by expiry. */
    atomic_uint_least64_t open, ended_n, expired;
} rl_holds;

/* At open, with the agent's other locks. */
void rl_holds_init(rl_holds *h);
/* With the loop, before the I/O thread runs; the caller sets the timer's
 * data to the agent. */
void rl_holds_start(rl_holds *h, uv_loop_t *loop, uint32_t timeout_ms);
/* At free, after the loop has closed the timer (rl_holds_close). */
void rl_holds_fini(rl_holds *h);

/* A hold for a request about to be submitted, which calls fn with its
 * decision: NULL when out of memory. */
rl_hold *rl_hold_new(rl_agent *agent, rl_hold_fn fn, void *arg);
/* Frees a hold whose request was never submitted. */
void rl_hold_discard(rl_hold *hold);
/* Binds hold to its request, which takes rl_hold_decided as its
 * callback, with the hold as the argument. */
void rl_hold_bind(rl_hold *hold, rl_request *req);
/* The request's callback (rl_check_fn), on the I/O thread: an allowed
 * request's hold opens and goes to the caller; a rejected one's held
 * rules are undone (hold.c's undo_rejected) and the caller gets NULL. */
void rl_hold_decided(const rl_decision *decision, void *arg);

/* The I/O thread, each turn: ends the holds their callers ended. */
void rl_holds_serve(rl_agent *agent);
/* The I/O thread, at the close: ends every open hold at its estimate and
 * the ended ones at their actual costs; then(agent) runs once their calls
 * are answered, or after the store's timeout_ms (the store must stay open
 * until then). */
void rl_holds_close(rl_agent *agent, void (*then)(void *agent));

#endif
