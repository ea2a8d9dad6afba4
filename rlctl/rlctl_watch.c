/*
 * rlctl_watch.c: see rlctl_watch.h. Each refresh reads the synced rules'
 * clients (rlctl_totals_collect) and shows, per client, its sliding
 * estimate against the limit, the rate at which its count grew since the
 * last refresh, and LIMITED once the estimate has reached the limit (the
 * agents reject it then; the gateways' rl_rule_checks_total{verdict=
 * "rejected"} count those rejections). On a terminal the screen is
 * redrawn; otherwise, and with --json, refreshes are appended (one JSON
 * document per line).
 */
#include "rlctl_watch.h"

#include "rlctl_json.h"
#include "rlctl_store.h"
#include "rlctl_totals.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* The previous refresh's counts, to compute rates. */
typedef struct seen {
    char rule[RL_NAME_MAX + 1];
    char value[RL_VALUE_MAX + 1];
    unsigned long long current, window;
} seen;

static const seen *find(const seen *old, size_t n, const char *rule,
                        const char *value)
{
    for (size_t i = 0; i < n; i++) {
        if (strcmp(old[i].rule, rule) == 0
            && strcmp(old[i].value, value) == 0)
            return &old[i];
    }
    return NULL;
}

static double rate_of(const seen *before, const rlctl_row *row,
                      unsigned long long window, double elapsed_s)
{
    if (before == NULL || before->window != window || elapsed_s <= 0
        || row->current < before->current)
        return 0;
    return (double)(row->current - before->current) / elapsed_s;
}

/* A global rule's client: each region's part of its estimate. */
static void show_regions(const rl_rule *r, const rl_regions_config *rc,
                         const rlctl_row *row, bool json)
{
    if (!r->global || rc->n == 0)
        return;
    printf(json ? ",\"regions\":{" : " ");
    for (size_t g = 0; g < rc->n; g++) {
        if (json) {
            printf("%s", g ? "," : "");
            rlctl_json_string(rc->regions[g].name);
            printf(":%llu", row->regions[g]);
        } else {
            printf(" %s=%llu", rc->regions[g].name, row->regions[g]);
        }
    }
    printf(json ? "}" : "");
}

static void show_row(const rl_rule *r, const rl_regions_config *rc,
                     const rlctl_row *row, double rate, bool json,
                     bool first)
{
    double used = 100.0 * (double)row->estimate / (double)r->limit;
    const char *state = row->estimate >= r->limit ? "LIMITED" : "ok";
    if (json) {
        printf("%s{\"rule\":", first ? "" : ",");
        rlctl_json_string(r->name);
        printf(",\"value\":");
        rlctl_json_string(row->value);
        printf(",\"estimate\":%llu,\"limit\":%llu,\"rate_per_s\":%.1f,"
               "\"state\":\"%s\"", row->estimate,
               (unsigned long long)r->limit, rate, state);
        show_regions(r, rc, row, true);
        printf("}");
    } else {
        printf("%-16s %-32s %12llu %7.1f%% %10.1f/s  %s", r->name,
               row->value, row->estimate, used, rate, state);
        show_regions(r, rc, row, false);
        printf("\n");
    }
}

static int refresh(const rl_config *cfg, rlctl_store *s, unsigned long top,
                   bool json, seen **old, size_t *n_old, double elapsed_s)
{
    char err[512];
    unsigned long long now = rlctl_store_now_ms(s, err, sizeof err);
    if (now == 0) {
        fprintf(stderr, "rlctl: %s\n", err);
        return 2;
    }
    size_t cap = 0, n = 0;
    seen *next = NULL;
    bool first = true;
    if (json)
        printf("{\"at_ms\":%llu,\"clients\":[", now);
    else
        printf("%-16s %-32s %12s %8s %12s  %s\n", "RULE", "CLIENT",
               "ESTIMATE", "OF LIMIT", "RATE", "STATE");
    for (size_t i = 0; i < cfg->n_rules; i++) {
        const rl_rule *r = &cfg->rules[i];
        if (r->mode != RL_MODE_SYNCED)
            continue;
        rlctl_table t;
        if (rlctl_totals_collect(s, r, &cfg->regions, now, &t) != 0) {
            free(next);
            return 2;
        }
        /* Rates within one period window: recent counts only grow in it
         * but as sub-windows leave. */
        unsigned long long window = now / r->period_ms;
        for (size_t k = 0; k < t.n && k < top; k++) {
            const rlctl_row *row = &t.rows[k];
            show_row(r, &cfg->regions, row,
                     rate_of(find(*old, *n_old, r->name, row->value), row,
                             window, elapsed_s), json, first);
            first = false;
            if (n == cap) {
                cap = cap ? 2 * cap : 64;
                seen *grown = realloc(next, cap * sizeof *next);
                if (grown == NULL)
                    break;
                next = grown;
            }
            snprintf(next[n].rule, sizeof next[n].rule, "%s", r->name);
            snprintf(next[n].value, sizeof next[n].value, "%s", row->value);
            next[n].current = row->current;
            next[n++].window = window;
        }
        free(t.rows);
    }
    if (json)
        printf("]}\n");
    else if (first)
        printf("(no synced client has counts in this window)\n");
    fflush(stdout);
    free(*old);
    *old = next;
    *n_old = n;
    return 0;
}

int rlctl_watch(const rl_config *cfg, unsigned long top,
                unsigned long interval_s, unsigned long count, bool json)
{
    rlctl_store s;
    char err[512];
    if (rlctl_store_open(&s, rl_config_aggregator_store(cfg), err,
                         sizeof err) != 0) {
        fprintf(stderr, "rlctl: %s\n", err);
        return 2;
    }
    bool redraw = !json && isatty(STDOUT_FILENO);
    seen *old = NULL;
    size_t n_old = 0;
    int rc = 0;
    for (unsigned long i = 0; rc == 0 && (count == 0 || i < count); i++) {
        if (i > 0)
            sleep((unsigned)interval_s);
        if (redraw)
            printf("\033[H\033[2J");
        if (!json)
            printf("rl watch: every %lu s%s\n\n", interval_s,
                   redraw ? " (Ctrl-C to stop)" : "");
        rc = refresh(cfg, &s, top, json, &old, &n_old,
                     i > 0 ? (double)interval_s : 0);
        if (!json && !redraw)
            printf("\n");
    }
    free(old);
    rlctl_store_close(&s);
    return rc;
}
