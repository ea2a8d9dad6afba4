/*
 * rlctl_totals.h: `rlctl totals`: the clients of synced rules, by their
 * trailing-period estimate, read from the sub-window keys in the store.
 * Private to rlctl.
 */
#ifndef RL_RLCTL_TOTALS_H
#define RL_RLCTL_TOTALS_H

#include "config.h"
#include "rlctl_store.h"

#include <stdbool.h>

typedef struct rlctl_row {
    char value[RL_VALUE_MAX + 1];
    /* current: sub-windows w-N+1..w ("recent"); previous: w-N ("oldest");
     * estimate: their sum, as agents count it (wire.h). */
    unsigned long long current, previous, estimate;
    /* A global rule's (scope: global): each region's part of the
     * estimate, as this region's Redis has it (docs/regions.md). */
    unsigned long long regions[RL_REGIONS_MAX];
} rlctl_row;

/* A rule's clients, by estimate (largest first). */
typedef struct rlctl_table {
    rlctl_row *rows;
    size_t n, cap;
    size_t left_out;   /* clients past the read cap */
} rlctl_table;

/* Reads a synced rule's clients at Redis time now, and for a global rule
 * each region's part (regions: the config's); 0, or -1 (message printed)
 * when the store fails. The caller frees t->rows. */
int rlctl_totals_collect(rlctl_store *s, const rl_rule *r,
                         const rl_regions_config *regions,
                         unsigned long long now, rlctl_table *t);

/* Prints the top clients of rule (NULL: every synced rule); returns an
 * exit code (0, or 2 when the store fails). */
int rlctl_totals_print(const rl_config *cfg, rlctl_store *s,
                       unsigned long long now, const char *rule,
                       unsigned long top, bool json);

#endif
