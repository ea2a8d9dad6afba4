/*
 * config_diff.h: what a reload from one config to another changes, as
 * lines a person reads before (rlctl config --diff) or after (the
 * gateway's and the aggregator's reload logs) a SIGHUP. Rules are matched
 * by name; everything a reload would make a rule do differently gets a
 * line. Private to rl.
 *
 * The lines, each about one rule (NAME is the rule's name):
 *   rule NAME added: MATCH, RATE, MODE[, shadow]
 *   rule NAME removed
 *   rule NAME: FIELD OLD -> NEW      (limit, period, burst, mode, shadow,
 *                                     match, key_prefix, algorithm,
 *                                     on_error, fleet_size, when)
 *   rule NAME: override LABEL added: [when WHEN; ]RATE
 *   rule NAME: override LABEL removed
 *   rule NAME: override LABEL: OLD -> NEW   (its when or rate)
 *   rule NAME: overrides_file OLD (N values) -> NEW (M values)
 *   rule NAME: values N -> M (A added, R removed, C changed)
 *   rule NAME: value V added: RATE
 *   rule NAME: value V removed
 *   rule NAME: value V: RATE -> RATE
 * where RATE is "LIMIT per PERIOD[, burst B]" or "unlimited", LABEL is
 * rl_override_label's (a `when` override's; `values` overrides are
 * compared value by value) and at most RL_DIFF_VALUES_SHOWN value lines of
 * each kind are listed per rule, then "rule NAME: ... and K more values
 * added" (removed, changed).
 */
#ifndef RL_COMMON_CONFIG_DIFF_H
#define RL_COMMON_CONFIG_DIFF_H

#include "config.h"

#include <stddef.h>

#define RL_DIFF_VALUES_SHOWN 10

typedef struct rl_config_diff {
    char **lines;           /* n lines, NUL-terminated, no newline */
    size_t n, cap;
    size_t rules_added, rules_removed, rules_changed;
    size_t overrides_before, overrides_after; /* every rule's overrides */
} rl_config_diff;

/* rl_config_diff_make fills *out (caller storage) with what changes from
 * config a to config b; no line when nothing does. Returns RL_OK, or
 * RL_ENOMEM (out is then empty). Release with rl_config_diff_fini. */
int rl_config_diff_make(const rl_config *a, const rl_config *b,
                        rl_config_diff *out);
void rl_config_diff_fini(rl_config_diff *d);

/* The words the diff uses for a rate ("100 per 1m", "100 per 1m, burst
 * 200", "unlimited") and a `when` ("method: POST, path: {prefix: /v1/}",
 * "every request" when empty), for rlctl's listings too. */
void rl_config_diff_rate(const rl_limit *r, char *buf, size_t cap);
void rl_config_diff_when(const rl_when *w, char *buf, size_t cap);
/* Appends printf-style to buf (cap bytes, NUL-terminated); cut short
 * silently: the caller's line ends in "..." when it is. For the lines of a
 * diff and rlctl's explanations. */
void rl_config_diff_append(char *buf, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif
