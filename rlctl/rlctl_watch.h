/*
 * rlctl_watch.h: `rlctl watch`. Private to rlctl.
 */
#ifndef RL_RLCTL_WATCH_H
#define RL_RLCTL_WATCH_H

#include "config.h"

#include <stdbool.h>

/* Redraws the top clients of every synced rule every interval_s seconds,
 * count times (0: until interrupted); returns an exit code. */
int rlctl_watch(const rl_config *cfg, unsigned long top,
                unsigned long interval_s, unsigned long count, bool json);

#endif
