/*
 * window.h: algorithm: fixed_window in the store. A key's count lives in
 * one Redis string per period, named by the window's number (Redis's
 * clock / period: windows start at multiples of the period since the
 * epoch, the same on every agent), counted with INCRBY and kept a period
 * past its last hit with PEXPIRE: two native commands in one write, no
 * script. A hit over the limit is counted, as envoyproxy/ratelimit counts
 * it; charge: refund and atomic give a refused request's hits back.
 * Private to librl; calls run on the I/O thread.
 */
#ifndef RL_AGENT_WINDOW_H
#define RL_AGENT_WINDOW_H

#include "bucket.h"

#include <stdint.h>

/* A window key's suffix: ':' and the window's number. */
#define RL_WINDOW_SUFFIX_MAX 21

/* The wall clock in ms since the epoch (windows before Redis's clock is
 * known: the hosts' skew apart). */
uint64_t rl_window_wall_ms(void);

/* The window that holds now_ms at period_ms. */
static inline uint64_t rl_window_of(uint64_t now_ms, uint64_t period_ms)
{
    return now_ms / period_ms;
}

/* rl_window_answer fills out for a window of rate whose count is count
 * after a hit of cost, at now_ms in window: remaining is what is left of
 * the limit, reset_ms the time to the window's end, and a refused hit
 * waits for that end (or never passes, cost over the limit). */
void rl_window_answer(const rl_limit *rate, uint64_t count, int64_t cost,
                      uint64_t window, uint64_t now_ms, rl_bucket_reply *out);

/* rl_window_call_in counts cost hits of key in the current window (by
 * the store's clock) and reports the answer to fn, exactly once; p (a
 * request's rule state) keeps the call, and afterwards p->window names the
 * window charged, for rl_window_give_back. */
void rl_window_call_in(rl_store *store, rl_bucket_pending *p,
                       const rl_limit *rate, const char *key,
                       size_t key_len, int64_t cost, rl_bucket_fn fn,
                       void *arg);

/* rl_window_give_back takes cost hits of key's window back (DECRBY), a
 * call nobody waits for. */
void rl_window_give_back(rl_store *store, const char *key, size_t key_len,
                         uint64_t window, int64_t cost,
                         const rl_logger *log);

/* rl_window_add adds a hold's difference delta to key's count in window
 * (the one its estimate was counted in), never below 0; fn(arg, ...)
 * gets the store's answer (the count) or why there is none. */
void rl_window_add(rl_store *store, const char *key, size_t key_len,
                   uint64_t window, uint64_t period_ms, int64_t delta,
                   rl_store_fn fn, void *arg);

#endif
