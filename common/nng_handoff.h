/*
 * nng_handoff.h: making nng's hand-offs between threads visible to
 * ThreadSanitizer. Private to rl.
 */
#ifndef RL_COMMON_NNG_HANDOFF_H
#define RL_COMMON_NNG_HANDOFF_H

/* rl_nng_handoff passes through one global lock. Call it just before
 * starting an nng aio and first thing in its callback (and after the last
 * access in a callback that can be stopped): nng orders these itself, with
 * synchronisation TSan cannot see in an uninstrumented libnng, and this
 * makes the same order visible. It costs a lock per message. */
void rl_nng_handoff(void);

#endif
