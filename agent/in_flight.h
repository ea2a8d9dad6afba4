/*
 * in_flight.h: the in_flight slots this agent holds (mode: in_flight,
 * issue 31). A key's slots live in one Redis hash, a field per agent
 * (scripts.c); a hold takes one in its request's multi call (exact.c),
 * and the agent keeps here how many of each key it holds, so that a
 * release and the renewal every lease/4 write that count back: one call
 * per cluster slot for every key due (up to 512 keys a call), sent in one
 * pipelined write per primary, in time linear in the keys due. Private
 * to librl; everything here runs on the I/O thread.
 */
#ifndef RL_AGENT_IN_FLIGHT_H
#define RL_AGENT_IN_FLIGHT_H

#include "log.h"
#include "store.h"

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

typedef struct rl_in_flight_key rl_in_flight_key;

typedef struct rl_in_flight {
    char id[96];              /* this agent's field in every hash */
    char lease[24];           /* in_flight_lease_ms, as text */
    uint32_t lease_ms;
    rl_store *store;          /* NULL until started */
    const rl_logger *log;
    rl_in_flight_key **table; /* by key hash, chained */
    size_t cap, n;
    rl_in_flight_key *due;    /* the keys the next flush writes */
    size_t n_due;
    uv_timer_t renew;         /* every lease / 4 */
    uv_idle_t flush;          /* the turn's releases, in one write */
    bool started;
    void (*closed)(void *arg); /* rl_in_flight_close's, once answered */
    void *closed_arg;
    int closing_calls;
} rl_in_flight;

/* Sets f up for an agent named id with lease_ms. RL_OK or RL_ENOMEM. */
int rl_in_flight_init(rl_in_flight *f, const char *id, uint32_t lease_ms);
/* Starts the renewals on loop, writing to store; once (a later call does
 * nothing). */
void rl_in_flight_start(rl_in_flight *f, rl_store *store, uv_loop_t *loop,
                        const rl_logger *log);

/* A take of a slot of key is sent: counted as held from now, so that a
 * write sent before its answer keeps it. */
void rl_in_flight_taking(rl_in_flight *f, const char *key, size_t len);
/* The take's answer: took says whether the store holds the slot now
 * (allowed and charged). A take that did not, or whose answer was lost,
 * is counted off and its key written again. */
void rl_in_flight_taken(rl_in_flight *f, const char *key, size_t len,
                        bool took);
/* A slot held is let go: written in this turn's batch. */
void rl_in_flight_release(rl_in_flight *f, const char *key, size_t len);

/* The slots this agent holds of key (for on_error: local's share). */
uint64_t rl_in_flight_held(const rl_in_flight *f, const char *key,
                           size_t len);

/* The close: every slot held is let go in one call per cluster slot;
 * done(arg) runs once they are answered (or failed), timeout_ms at
 * most. */
void rl_in_flight_close(rl_in_flight *f, uint32_t timeout_ms,
                        void (*done)(void *arg), void *arg);
/* Closes the handles (the loop must run on) and frees the table. */
void rl_in_flight_stop(rl_in_flight *f);
/* Frees the table of an agent whose loop never started it. */
void rl_in_flight_fini(rl_in_flight *f);

#endif
