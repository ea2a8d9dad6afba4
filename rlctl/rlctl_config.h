/*
 * rlctl_config.h: what `rlctl config` shows beyond the rules table: each
 * rule's overrides (values counted, an overrides_file as one line with its
 * count) and the shadow rules; and `rlctl config --diff NEW`, what a
 * reload to NEW would change (common/config_diff.h). Private to rlctl.
 */
#ifndef RL_RLCTL_CONFIG_H
#define RL_RLCTL_CONFIG_H

#include "config.h"

#include <stdbool.h>

/* The overrides table and the shadow line (text). */
void rlctl_config_print_overrides(const rl_config *cfg);
/* A rule's ,"shadow":B,"overrides":[...],"overrides_file":S,
 * "file_overrides":N fields (JSON, no braces). */
void rlctl_config_json_overrides(const rl_config *cfg, const rl_rule *r);

/* Prints the diff from cur (at cur_path) to next (at next_path); returns
 * true when a reload would change something. -1 (with a message on
 * stderr) when out of memory. */
int rlctl_config_diff(const rl_config *cur, const char *cur_path,
                      const rl_config *next, const char *next_path,
                      bool json);

#endif
