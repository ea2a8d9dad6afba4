/*
 * bench_peer.h: rate-limiter-flexible, run as a Node.js child process
 * (tests/bench/rlf_peer.js) against the same redis-server. `make bench`
 * installs it into build/bench/node and says where through the environment.
 */
#ifndef RL_BENCH_PEER_H
#define RL_BENCH_PEER_H

#include "bench_pipeline.h"

#include <stdbool.h>

/* Whether the peer is installed (RL_BENCH_PEER names its script). */
bool bench_peer_available(void);

/* The peer's version line, into buf. */
void bench_peer_version(char *buf, size_t cap);

/* depth requests in flight of `rules` consume() calls each, for seconds. */
bench_result bench_peer_run(const char *addr, int depth, int rules,
                            double seconds);

/* One point from each of n keys, twice (for server cost and memory). */
void bench_peer_fill(const char *addr, long n);

#endif
