/*
 * rlctl_agents.h: `rlctl agents`. Private to rlctl.
 */
#ifndef RL_RLCTL_AGENTS_H
#define RL_RLCTL_AGENTS_H

#include "config.h"

#include <stdbool.h>

/* Prints the agents; returns an exit code (0, 1 no metrics address in the
 * config, 2 aggregator unreachable). */
int rlctl_agents_print(const rl_config *cfg, bool json);

#endif
