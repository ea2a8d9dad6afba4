/*
 * scripts.h: the bucket script that runs inside Redis, and the lease
 * script that takes many of its tokens at once (mode: leased), as a
 * function library (Redis 7+) and as plain scripts (EVALSHA). Private to
 * librl.
 */
#ifndef RL_AGENT_SCRIPTS_H
#define RL_AGENT_SCRIPTS_H

#include "config.h"

/* The library's name and its functions' names. The version is in the name
 * so that agents of two rl versions sharing a Redis never replace each
 * other's functions. */
#define RL_LIBRARY_NAME "rl_6"
#define RL_FUNCTION_BUCKET "rl_6_bucket"
#define RL_FUNCTION_LEASE "rl_6_lease"
#define RL_FUNCTION_MULTI "rl_6_multi"
#define RL_FUNCTION_WINDOW_ADD "rl_6_window_add"
#define RL_FUNCTION_SLOTS "rl_6_slots"

/* Their indexes in rl_bucket_scripts, for rl_store_run. */
enum { RL_SCRIPT_BUCKET, RL_SCRIPT_LEASE, RL_SCRIPT_MULTI,
       RL_SCRIPT_WINDOW_ADD, RL_SCRIPT_SLOTS };

/* The library's source for FUNCTION LOAD REPLACE. */
extern const char rl_library_source[];

#endif
