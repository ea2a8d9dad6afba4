/*
 * calls.h: which threads are inside an agent's calls, so that
 * rl_agent_close can wait for them. Private to librl.
 *
 * Entering and leaving is on every check's path, so it costs no locked
 * instruction for a thread with a slot of its own: a plain store, then a
 * compiler barrier where the process-wide barrier (membarrier) is there to
 * pay for the ordering on the closing side instead.
 */
#ifndef RL_AGENT_CALLS_H
#define RL_AGENT_CALLS_H

#include "thread_slot.h"

#include <stdatomic.h>
#include <stdbool.h>

typedef struct rl_calls {
    struct {
        _Alignas(RL_CACHE_LINE) atomic_uint_least64_t n;
    } inside[RL_THREAD_SLOTS + 1];
} rl_calls;

/* Once per process, before any agent counts calls: asks the kernel for
 * the process-wide barrier. Thread-safe. */
void rl_calls_setup(void);

/* Counts the caller in, then reads *closing: false (and not counted) when
 * the agent is closing. */
bool rl_calls_enter(rl_calls *c, const atomic_bool *closing);

/* Counts the caller out; inline, as a call cost more than the store. */
static inline void rl_calls_leave(rl_calls *c)
{
    unsigned slot = rl_thread_slot();
    atomic_uint_least64_t *n = &c->inside[slot].n;
    if (slot != RL_THREAD_SLOT_SHARED)
        atomic_store_explicit(n, atomic_load_explicit(n, memory_order_relaxed)
                                     - 1, memory_order_release);
    else
        atomic_fetch_sub_explicit(n, 1, memory_order_release);
}

/* After *closing was set: waits until no thread is inside. */
void rl_calls_wait_idle(rl_calls *c);

#endif
