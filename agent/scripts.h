/*
 * scripts.h: the bucket scripts that run inside Redis, as a function
 * library (Redis 7+) and as plain scripts (EVALSHA). Private to librl.
 */
#ifndef RL_AGENT_SCRIPTS_H
#define RL_AGENT_SCRIPTS_H

#include "config.h"

/* The library's name and its functions' names. The version is in the name
 * so that agents of two rl versions sharing a Redis never replace each
 * other's functions. */
#define RL_LIBRARY_NAME "rl_1"
#define RL_FUNCTION_TOKEN_BUCKET "rl_1_token_bucket"
#define RL_FUNCTION_GCRA "rl_1_gcra"

/* The library's source for FUNCTION LOAD REPLACE. */
extern const char rl_library_source[];

/* rl_script_source returns the stand-alone script (for SCRIPT LOAD and
 * EVALSHA) of an algorithm. */
const char *rl_script_source(rl_algorithm algorithm);

#endif
