/*
 * graves.h: what a lock-free table retires (a whole table it replaced, or
 * an entry it dropped), kept until no check can still hold it: every
 * check that began before it was unpublished has left (calls.h). Checks
 * read a table without a lock, so a time-based delay alone would leave a
 * check that is descheduled long enough reading freed memory. Private to
 * librl; one thread (the I/O thread) buries and frees.
 */
#ifndef RL_AGENT_GRAVES_H
#define RL_AGENT_GRAVES_H

#include "calls.h"

#include <stdbool.h>

typedef struct rl_grave rl_grave;

typedef struct rl_graves {
    rl_grave *head;          /* newest first */
    rl_calls *calls;         /* the agent's */
} rl_graves;

/* Frees one buried thing: a table or an entry (the other is NULL). all:
 * the owner is going away (nothing more is carried anywhere). */
typedef void rl_grave_free_fn(void *owner, void *table, void *entry,
                              bool all);

void rl_graves_init(rl_graves *g, rl_calls *calls);

/* Buries a table or an entry (the other NULL) no longer reachable from
 * the live table once the next table swap is published. Out of memory:
 * leaked, rather than freed while a check may hold it. */
void rl_graves_add(rl_graves *g, void *table, void *entry);

/* After the sequentially consistent store that published the table
 * without them: notes the checks begun so far for what was buried since
 * the last mark. */
void rl_graves_mark(rl_graves *g);

/* Frees, through fn, what every check begun before its mark has left
 * (all: everything, at the owner's end). */
void rl_graves_free(rl_graves *g, bool all, rl_grave_free_fn *fn,
                    void *owner);

#endif
