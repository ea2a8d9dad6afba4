/*
 * window_args.h: the argument list of one store call, its strings kept in
 * one buffer sized by the caller before the first is added, so that the
 * pointers handed to the store stay valid. Private to rl-aggregator.
 */
#ifndef RL_AGGREGATOR_WINDOW_ARGS_H
#define RL_AGGREGATOR_WINDOW_ARGS_H

#include <stddef.h>
#include <stdint.h>

typedef struct rl_args {
    const char **argv;
    size_t *lens;
    char *text;
    size_t n, used, cap;
} rl_args;

/* Room for `slots` strings (pieces being joined count) of `cap` bytes in
 * all; -1 without memory (nothing to free then). */
int rl_args_init(rl_args *a, size_t slots, size_t cap);
void rl_args_fini(rl_args *a);

void rl_args_add(rl_args *a, const char *s, size_t len);
void rl_args_addf(rl_args *a, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* A number, without printf: a report's counts are most of a call. */
void rl_args_add_u64(rl_args *a, uint64_t v);
/* Joins the strings added since a->used was `start` (`pieces` of them)
 * into one. */
void rl_args_join(rl_args *a, size_t pieces, size_t start);

#endif
