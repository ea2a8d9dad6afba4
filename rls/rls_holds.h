/*
 * rls_holds.h: the holds of one rl-rls instance (rl's `hold` extension of
 * a descriptor, docs/envoy.md "Costs known at the stream's end"). Envoy
 * sends a descriptor twice for a request whose cost is known at its end:
 * on the request's path, then with apply_on_stream_done, the actual cost
 * in hits_addend. The protocol says neither which call is which nor which
 * request a call is of; the descriptor's id entry (x-request-id) does. The
 * first call with a key (the domain, the descriptor's counted entries and
 * the id) opens a hold, the next one ends it.
 *
 * One table for the instance, not one per worker loop: Envoy's two calls
 * come on the same connection only while that connection lasts (a GOAWAY,
 * MaxConnectionAge or a second connection of Envoy's pool puts the
 * stream-done call on another loop), and rl_hold_end may be called on any
 * thread, so the loop that ends a hold need not be the one whose agent
 * holds it.
 *
 * Bounded: at most max entries (holds open, and keys whose first call was
 * rejected or whose hold expired, kept for a stream-done call to find);
 * a key past it is refused (rls_holds_take's RLS_HOLDS_FULL), logged.
 * Each entry is kept timeout_ms (rl's hold_timeout_ms): a hold not ended
 * by then is ended at its estimate (the agent's own expiry charges the
 * same) and its key kept as long again, so that a late stream-done call
 * charges nothing more.
 *
 * Threads: every function may be called from any thread (one mutex).
 */
#ifndef RL_RLS_HOLDS_H
#define RL_RLS_HOLDS_H

#include "rl.h"

#include "log.h"

#include <stddef.h>
#include <stdint.h>

typedef struct rls_holds rls_holds;

/* A key's entry while its first call's check is out. */
typedef struct rls_hold_entry rls_hold_entry;

/* Entries an instance keeps at most by default. */
#define RLS_HOLDS_MAX 100000

/* rls_holds_new: a table of at most max entries kept timeout_ms each,
 * logging to log (which outlives it). NULL without memory. */
rls_holds *rls_holds_new(size_t max, uint64_t timeout_ms,
                         const rl_logger *log);

/* rls_holds_free ends the holds still open at their estimates (after
 * rl_agent_close that only frees them) and frees the table. Entries whose
 * check is still out must have been decided first. */
void rls_holds_free(rls_holds *t);

typedef enum rls_holds_taken {
    RLS_HOLDS_OPENED, /* a first call: *opened, to be decided once */
    RLS_HOLDS_ENDED,  /* a stream-done call: the hold is ended at actual
                       * (nothing charged if its first was rejected) */
    RLS_HOLDS_FULL,   /* no room for a new key: no hold (logged) */
} rls_holds_taken;

/* rls_holds_take looks key (len bytes, copied) up: absent, a new entry
 * whose first call's check the caller sends (rl_check_rule_hold) and
 * hands to rls_holds_decided; present, the call is the key's stream-done
 * call and its hold is ended at actual (or when its check answers, if it
 * has not yet). */
rls_holds_taken rls_holds_take(rls_holds *t, const char *key, size_t len,
                               uint32_t estimate, uint32_t actual,
                               rls_hold_entry **opened);

/* rls_holds_decided hands an opened entry its check's hold (NULL: the
 * call was rejected, or its check was never sent: it holds nothing, and
 * its stream-done call will charge nothing). Exactly once per opened
 * entry. */
void rls_holds_decided(rls_holds *t, rls_hold_entry *e, rl_hold *hold);

#endif
