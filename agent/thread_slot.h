/*
 * thread_slot.h: a small number for each thread that calls into librl,
 * unique among the process's live threads, so that hot counters can have a
 * single writer each and be counted without a locked instruction. Private
 * to librl.
 *
 * A thread takes its slot on first use and gives it back when it exits.
 * Threads beyond RL_THREAD_SLOTS live ones get RL_THREAD_SLOT_SHARED, whose
 * counters more than one thread writes: those take atomic adds.
 */
#ifndef RL_AGENT_THREAD_SLOT_H
#define RL_AGENT_THREAD_SLOT_H

#include <stdatomic.h>
#include <stdint.h>

/* 12: with the shared slot, 13 counters and a synced key's three other
 * hot fields fill two cache lines (synced.h). */
#define RL_THREAD_SLOTS 12
#define RL_THREAD_SLOT_SHARED RL_THREAD_SLOTS
#define RL_CACHE_LINE 64

/* This thread's slot, or RL_THREAD_SLOT_UNASKED before its first use.
 * Initial-exec: one load off the thread pointer, no call, on every check
 * (librl's own few bytes fit the static TLS glibc keeps for libraries
 * loaded later, with dlopen, too). */
#define RL_THREAD_SLOT_UNASKED (~0u)
extern _Thread_local unsigned rl_thread_slot_mine
    __attribute__((tls_model("initial-exec")));

unsigned rl_thread_slot_take(void);

/* How many slots (below RL_THREAD_SLOT_SHARED) were ever handed out: the
 * lowest free slot is handed out first, so slots from this number on have
 * never counted. It only grows, and grows before a new slot's first count,
 * so a sum over the slots below it (and the shared one) misses only counts
 * that race with it, as any sum of live counters does. Hot counters are
 * summed on every check, and most processes use a few slots. */
extern atomic_uint rl_thread_slots_used;

/* The calling thread's slot, 0 .. RL_THREAD_SLOT_SHARED. Thread-safe. */
static inline unsigned rl_thread_slot(void)
{
    unsigned slot = rl_thread_slot_mine;
    return slot != RL_THREAD_SLOT_UNASKED ? slot : rl_thread_slot_take();
}

/* Adds n to counters[slot]: a plain load and store when the slot is the
 * caller's own, an atomic add for the shared one. */
static inline void rl_slot_add(atomic_uint_least64_t *counters, unsigned slot,
                               uint64_t n)
{
    atomic_uint_least64_t *c = &counters[slot];
    if (slot != RL_THREAD_SLOT_SHARED)
        atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed)
                                     + n, memory_order_relaxed);
    else
        atomic_fetch_add_explicit(c, n, memory_order_relaxed);
}

#endif
