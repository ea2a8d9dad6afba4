/*
 * agent_id.h: the name an agent goes by for its life: in its reports to
 * the aggregators (rlctl agents) and as its field in every in_flight
 * hash it holds slots in (rlctl bucket). Private to librl.
 */
#ifndef RL_AGENT_AGENT_ID_H
#define RL_AGENT_AGENT_ID_H

#include <stddef.h>

/* At most this many bytes, without the NUL (the wire's RL_WIRE_ID_MAX
 * allows 64). */
#define RL_AGENT_ID_MAX 63

/* rl_agent_id_make writes a new agent's id, "PROG@HOST/PID/START" (see
 * agent_id.c), into out (cap bytes, RL_AGENT_ID_MAX + 1 suffice). Each
 * call in a process gives another. Thread-safe. */
void rl_agent_id_make(char *out, size_t cap);

#endif
