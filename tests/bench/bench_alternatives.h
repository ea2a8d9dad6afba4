/*
 * bench_alternatives.h: the seed's rejected ways to check a bucket, on one
 * hot key with 16 clients, against rl's function under the same race.
 */
#ifndef RL_BENCH_ALTERNATIVES_H
#define RL_BENCH_ALTERNATIVES_H

/* Prints a Markdown section: requests admitted from a bucket of 100 by
 * read-decide-write, by WATCH/MULTI/EXEC (and its retries per admitted
 * request), and by rl's token-bucket function. */
void bench_alternatives(const char *addr);

#endif
