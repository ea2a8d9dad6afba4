/*
 * rlctl_totals.h: `rlctl totals`: the clients of synced rules, by their
 * sliding-window estimate, read from the window keys in the store. Private
 * to rlctl.
 */
#ifndef RL_RLCTL_TOTALS_H
#define RL_RLCTL_TOTALS_H

#include "config.h"
#include "rlctl_store.h"

#include <stdbool.h>

/* Prints the top clients of rule (NULL: every synced rule); returns an
 * exit code (0, or 2 when the store fails). */
int rlctl_totals_print(const rl_config *cfg, rlctl_store *s,
                       unsigned long long now, const char *rule,
                       unsigned long top, bool json);

#endif
