/*
 * scripts.h: the bucket script that runs inside Redis, as a function
 * library (Redis 7+) and as a plain script (EVALSHA). Private to librl.
 */
#ifndef RL_AGENT_SCRIPTS_H
#define RL_AGENT_SCRIPTS_H

#include "config.h"

/* The library's name and its functions' names. The version is in the name
 * so that agents of two rl versions sharing a Redis never replace each
 * other's functions. */
#define RL_LIBRARY_NAME "rl_2"
#define RL_FUNCTION_BUCKET "rl_2_bucket"

/* The library's source for FUNCTION LOAD REPLACE. */
extern const char rl_library_source[];

#endif
