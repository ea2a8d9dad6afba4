/*
 * calls.h: which threads are inside an agent's calls, so that
 * rl_agent_close can wait for them, and so that a reload can tell when
 * every call that might still read the rules it replaced has left.
 * Private to librl.
 *
 * Entering and leaving is on every check's path, so it costs no locked
 * instruction for a thread with a slot of its own: a plain store, then a
 * compiler barrier where the process-wide barrier (membarrier) is there to
 * pay for the ordering on the closing side instead.
 *
 * Each slot counts enters and leaves (both only grow). A slot's calls
 * follow one another (one thread owns it at a time), so once its leaves
 * reach the enters it had at some moment, every call begun before that
 * moment has left. The shared slot's threads overlap: there, only a moment
 * where leaves equal enters says so.
 */
#ifndef RL_AGENT_CALLS_H
#define RL_AGENT_CALLS_H

#include "thread_slot.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

typedef struct rl_calls {
    struct {
        _Alignas(RL_CACHE_LINE) atomic_uint_least64_t enters;
        atomic_uint_least64_t leaves;
    } inside[RL_THREAD_SLOTS + 1];
} rl_calls;

/* The enters of each slot at one moment (rl_calls_mark). */
typedef struct rl_calls_mark {
    uint64_t enters[RL_THREAD_SLOTS + 1];
} rl_calls_mark;

/* Once per process, before any agent counts calls: asks the kernel for
 * the process-wide barrier. Thread-safe. */
void rl_calls_setup(void);

/* Counts the caller in, then reads *closing: false (and not counted) when
 * the agent is closing. Whatever the caller loads after it (the agent's
 * rules) is covered by rl_calls_mark. */
bool rl_calls_enter(rl_calls *c, const atomic_bool *closing);

/* Counts the caller out; inline, as a call cost more than the store. */
static inline void rl_calls_leave(rl_calls *c)
{
    unsigned slot = rl_thread_slot();
    atomic_uint_least64_t *n = &c->inside[slot].leaves;
    if (slot != RL_THREAD_SLOT_SHARED)
        atomic_store_explicit(n, atomic_load_explicit(n, memory_order_relaxed)
                                     + 1, memory_order_release);
    else
        atomic_fetch_add_explicit(n, 1, memory_order_release);
}

/* After *closing was set: waits until no thread is inside. */
void rl_calls_wait_idle(rl_calls *c);

/* After a sequentially consistent store of something calls read after
 * entering (a new rule generation): notes the calls begun so far. A call
 * that read the old value is among them. */
void rl_calls_mark_now(rl_calls *c, rl_calls_mark *m);

/* Whether every call counted in m has left (the shared slot: whether it is
 * idle now). Once true for a mark, true for good. */
bool rl_calls_passed(rl_calls *c, const rl_calls_mark *m);

#endif
