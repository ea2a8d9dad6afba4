/*
 * leased.h: rules in `mode: leased`. The bucket is an exact rule's, in
 * Redis; an agent takes its tokens in leases (one call takes up to N) and
 * spends them on the caller's thread, so the fleet never admits more than
 * the bucket holds while Redis sees one call per lease. Private to librl.
 *
 * Threads: rl_leased_check runs on gateway threads, lock-free, with no
 * system call but one uv_async_send per lease (to ask for the next one);
 * everything else runs on the agent's I/O thread, which alone inserts,
 * removes and refills entries.
 */
#ifndef RL_AGENT_LEASED_H
#define RL_AGENT_LEASED_H

#include "bucket.h"
#include "config.h"
#include "graves.h"
#include "ident.h"
#include "keys.h"
#include "log.h"
#include "store.h"
#include "thread_slot.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

/* A lease is about this much of the agent's own traffic for the key: a
 * round trip (at most store.timeout_ms, 50 ms by default) fits twice into
 * the half left when the next one is asked for, and an agent never holds
 * more than a tenth of a second of what it spends. */
#define RL_LEASE_MS 100
/* A key with no check for this long gives its tokens back. */
#define RL_LEASE_IDLE_MS (3 * RL_LEASE_MS)

typedef struct rl_lease_waiter rl_lease_waiter;

/* One (rule, value). */
typedef struct rl_leased_entry {
    /* What a check reads and writes, on one line. */
    /* In hand, with the number of the lease last added (leased.c). */
    _Alignas(RL_CACHE_LINE) atomic_uint_least64_t tokens;
    atomic_uint_least64_t low;   /* ask for the next lease below this */
    atomic_uint_least64_t limit; /* the rate leased at: a check at another */
    atomic_uint_least64_t burst; /* goes to the I/O thread (0: none yet) */
    atomic_uint_least64_t period_ms;
    atomic_bool asked;           /* a check asked for the next lease */
    atomic_bool dry;             /* the bucket had no more: refuse here */
    /* uv_hrtime() until which the whole hand is still counted by the
     * bucket (leased.c): a check before it spends with one CAS. */
    atomic_uint_least64_t whole_until_ns;
    /* Written by the I/O thread at each lease, read for a decision. */
    /* In Redis after lease k, in slot k % 2, tagged with k (leased.c). */
    _Alignas(RL_CACHE_LINE) atomic_uint_least64_t remaining[2];
    atomic_uint_least64_t reset_ms;
    atomic_uint_least64_t avail; /* units in Redis after the last lease */
    atomic_uint_least64_t refused; /* costs refused here (dry), ever */
    /* The hand's count line: at uv_hrtime() t the bucket still counts at
     * most (zero_ns - t) / token_ns of its tokens (leased.c). */
    atomic_uint_least64_t zero_ns;
    atomic_uint_least64_t token_ns; /* ns a token takes to refill, rounded up */
    atomic_uint_least64_t expired;  /* tokens dropped off the line, ever */
    _Atomic(struct rl_leased_entry *) wanted_next; /* rl_leased.wanted */
    /* I/O thread only. */
    rl_bucket_args args;         /* the rate leased at, formatted */
    uint64_t taken;              /* tokens leased, ever */
    uint64_t debt;               /* holds' excess the hand could not pay:
                                  * the next lease pays it first */
    uint64_t used_snap;          /* used (taken - hand + refused) at ... */
    uint64_t snap_ns;            /* ... this uv_hrtime() */
    uint64_t target;             /* tokens a lease aims to leave in hand */
    uint64_t idle_since_ms;      /* loop ms used last changed */
    uint64_t idle_used;
    uint64_t dry_due_ms;         /* when dry: when to try again */
    uint64_t dry_refused;        /* refused when it went dry */
    bool in_flight;              /* a lease call is out */
    uint32_t epoch;              /* moves when the key's rate is set or
                                  * forgotten: a lease sent before is
                                  * given back when it comes */
    bool gone;                   /* out of the table, in a grave */
    bool dry_listed;             /* on rl_leased.dry_head */
    struct rl_leased_entry *dry_next;
    rl_lease_waiter *waiters, **waiters_tail;
    rl_ident *ident;
    uint64_t hash;
    uint16_t value_len;
    uint16_t key_len;            /* the Redis key: prefix and value */
    char key[];                  /* the value is its tail */
} rl_leased_entry;

typedef struct rl_leased_table {
    size_t cap;                         /* slots, a power of two */
    _Atomic(rl_leased_entry *) slots[];
} rl_leased_table;

typedef struct rl_leased {
    _Atomic(rl_leased_table *) table;
    /* Entries whose tokens ran low, pushed by checks (a Treiber stack),
     * taken by the I/O thread when woken. */
    _Atomic(rl_leased_entry *) wanted;
    uv_async_t *wakeup;                 /* the agent's */
    const atomic_bool *closing;         /* the agent's: no wakeup then */
    size_t max_keys;
    atomic_size_t n_entries;
    atomic_uint_least64_t keys_refused;
    /* Counters (the I/O thread writes them). */
    atomic_uint_least64_t leases, lease_tokens;
    atomic_uint_least64_t returns, returned_tokens;
    atomic_uint_least64_t expired_tokens; /* the bucket refilled them */
    /* I/O thread only. */
    rl_store *store;
    uv_loop_t *loop;
    const rl_logger *log;
    uint64_t refused_logged, logged_at_ms; /* keys_refused, as last logged */
    uv_timer_t tick;
    unsigned ticks;                     /* since the last sweep */
    bool started;
    rl_leased_entry *dry_head;          /* keys that are or were dry */
    size_t leases_out;                  /* lease calls not answered */
    size_t giving_back;                 /* give-back calls not answered */
    void (*given_back)(void *arg);      /* at close: all answered */
    void *given_back_arg;
    rl_graves graves;                   /* dropped, until no check holds
                                         * them */
} rl_leased;

/* The reason a waiting check gets when its key is over the cap. */
extern const char rl_leased_refused[];

/* calls: the agent's (calls.h), for what a rebuild drops (graves.h). */
int rl_leased_init(rl_leased *l, size_t max_keys, uv_async_t *wakeup,
                   const atomic_bool *closing, rl_calls *calls);
void rl_leased_fini(rl_leased *l);

/* rl_leased_check spends cost tokens in hand for (id, value) at rate, on
 * the caller's thread: true with *out filled in when it decided (allowed
 * from the hand, or refused because the bucket is known to be dry); false
 * when the check must wait for the I/O thread (a cold key, an empty hand
 * with the bucket not known dry, another rate). value_hash is the value's
 * rl_key_hash_value. */
bool rl_leased_check(rl_leased *l, rl_ident *id, const rl_limit *rate,
                     const char *value, size_t value_len,
                     uint64_t value_hash, uint32_t cost,
                     rl_bucket_reply *out);

/* I/O thread: the store to lease from, the loop and the agent's logger;
 * makes the tick that refills dry keys, gives idle ones back and logs
 * `leased_keys_capped` (at most once a second). */
void rl_leased_start(rl_leased *l, rl_store *store, uv_loop_t *loop,
                     const rl_logger *log);

/* I/O thread: a check rl_leased_check could not decide. fn(arg, ...) is
 * called exactly once: with the answer once a lease serves it (or shows
 * the bucket dry), or with reply NULL when the store failed, or with
 * error rl_leased_refused when the key is over the cap. key is the Redis
 * key (the rule's prefix, then value_len bytes of value). */
void rl_leased_wait(rl_leased *l, const rl_rule *rule, rl_ident *id,
                    const rl_limit *rate, const char *key, size_t key_len,
                    size_t value_len, uint32_t cost, rl_bucket_fn fn,
                    void *arg);

/* I/O thread: take the entries checks asked to refill. */
void rl_leased_drain(rl_leased *l);

/* I/O thread: a hold's difference delta (its actual cost less the
 * estimate it spent) for (id, value) at rate, settled in the key's hand
 * with no call: a give-back returns tokens to the hand (only those the
 * bucket still counts), an excess is taken from it and, past its tokens,
 * owed: the next lease takes the debt first, so the bucket is charged the
 * actual costs. false when the key has no hand at rate (given back idle,
 * on a reload or a change of rate, at the close, or never made over the
 * cap): the caller sends the difference to the bucket. */
bool rl_leased_settle(rl_leased *l, rl_ident *id, const rl_limit *rate,
                      const char *value, size_t value_len, int64_t delta);

/* I/O thread, after a reload was applied (idents' io_rule and io_changed
 * set): keys of rules removed or whose rate changed give their tokens
 * back at once. */
void rl_leased_reloaded(rl_leased *l);

/* I/O thread, at close: gives every key's tokens back (and those of
 * leases still in flight as they come), fails the checks still waiting;
 * done(arg) runs once, when every call is answered or timeout_ms has
 * passed. The store must stay open until then. */
void rl_leased_close(rl_leased *l, uint32_t timeout_ms,
                     void (*done)(void *arg), void *arg);

/* I/O thread, once the store is closed: frees what the tick held. */
void rl_leased_stop(rl_leased *l);

#endif
