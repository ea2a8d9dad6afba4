/*
 * nng_handoff.h: making nng's hand-offs between threads visible to
 * ThreadSanitizer. Private to rl.
 */
#ifndef RL_COMMON_NNG_HANDOFF_H
#define RL_COMMON_NNG_HANDOFF_H

#if defined(__SANITIZE_THREAD__)
#define RL_NNG_HANDOFF_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define RL_NNG_HANDOFF_TSAN 1
#endif
#endif

#ifdef RL_NNG_HANDOFF_TSAN
#include <sanitizer/tsan_interface.h>
#endif

/* rl_nng_handoff(obj) marks a hand-off through nng on obj, the rl object
 * whose aio or callback it is (an agent's sync state, an ingest worker, the
 * metrics server). Call it just before starting an nng aio and first thing
 * in its callback (and after the last access in a callback that can be
 * stopped, and after stopping it): nng orders these itself, with
 * synchronisation TSan cannot see in an uninstrumented libnng, and this
 * shows TSan the same order, on obj only. Outside TSan builds it is
 * nothing: it adds no ordering nng does not already guarantee.
 *
 * It was one process-wide mutex, taken and released at once. That ordered
 * every nng-facing thread after every other for TSan, so a race in rl's
 * own code between two objects' threads went unreported whenever their
 * hand-offs happened in turn, which is nearly always. Shown with a
 * deliberate race on a plain int between the metrics pipe callback (after
 * its hand-off) and an ingest worker's receive() on the loop (before its
 * hand-off): `make tsan` passed synced::a_resent_report_is_counted_once
 * with the mutex and reports the race with per-object hand-offs. */
static inline void rl_nng_handoff(void *obj)
{
#ifdef RL_NNG_HANDOFF_TSAN
    __tsan_acquire(obj);
    __tsan_release(obj);
#else
    (void)obj;
#endif
}

#endif
