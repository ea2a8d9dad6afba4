/*
 * shadow.c: the log lines of shadow rejections. A shadow rule that would
 * reject a client under load would otherwise write a line per request; so
 * each rule gets at most one line a second ("event=shadow_rejected
 * rule=R ... suppressed=N", N the rejections since its last line, not
 * logged), and a timer writes the count of what was held back once the
 * second is over, so no rejection goes unaccounted for in the log. The
 * count's line does not restart the second: under steady load a rule
 * writes its rejection line every second, and the count in between. Runs
 * on the loop thread only.
 */
#include "gateway.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SHADOW_LOG_INTERVAL_MS 1000

static gw_shadow_entry *entry_of(gw_shadow_log *log, const char *rule)
{
    for (size_t i = 0; i < log->n; i++) {
        if (strcmp(log->entries[i].rule, rule) == 0)
            return &log->entries[i];
    }
    if (log->n == RL_RULES_MAX)
        return NULL;
    if (log->n == log->cap) {
        size_t cap = log->cap ? log->cap * 2 : 16;
        gw_shadow_entry *e = realloc(log->entries, cap * sizeof *e);
        if (e == NULL)
            return NULL;
        log->entries = e;
        log->cap = cap;
    }
    gw_shadow_entry *e = &log->entries[log->n++];
    *e = (gw_shadow_entry){0};
    snprintf(e->rule, sizeof e->rule, "%s", rule);
    return e;
}

/* Whether a line may be written now; a held-back one is counted. */
static bool may_log(uint64_t now, uint64_t *last, uint64_t *suppressed,
                    uint64_t *held)
{
    if (*last != 0 && now - *last < SHADOW_LOG_INTERVAL_MS) {
        (*suppressed)++;
        return false;
    }
    *held = *suppressed;
    *suppressed = 0;
    *last = now;
    return true;
}

void gw_shadow_note(gw_server *srv, const rl_decision *d, const char *peer_ip)
{
    if (d->shadow_rejected == 0)
        return;
    /* uv_now is at least 1 ms after the loop starts only on a slow start:
     * +1 keeps 0 meaning "never logged". */
    uint64_t now = uv_now(srv->loop) + 1;
    unsigned named = d->shadow_rejected < RL_SHADOW_NAMES_MAX
                         ? d->shadow_rejected : RL_SHADOW_NAMES_MAX;
    for (unsigned i = 0; i < named; i++) {
        gw_shadow_entry *e = entry_of(&srv->shadow, d->shadow_rules[i]);
        uint64_t held;
        if (e == NULL || !may_log(now, &e->last_ms, &e->suppressed, &held))
            continue;
        rl_log(&srv->log, RL_LOG_INFO, "shadow_rejected", "rule=%s ip=%s "
               "allowed=%s suppressed=%llu", e->rule, peer_ip,
               d->allowed ? "true" : "false", (unsigned long long)held);
    }
    if (d->shadow_rejected > named) {
        uint64_t held;
        gw_shadow_log *log = &srv->shadow;
        for (unsigned i = named; i < d->shadow_rejected; i++) {
            if (may_log(now, &log->unnamed_last_ms, &log->unnamed_suppressed,
                        &held))
                rl_log(&srv->log, RL_LOG_INFO, "shadow_rejected",
                       "rule=(unnamed) ip=%s more_than=%d suppressed=%llu",
                       peer_ip, RL_SHADOW_NAMES_MAX,
                       (unsigned long long)held);
        }
    }
}

void gw_shadow_flush(gw_server *srv, bool all)
{
    uint64_t now = uv_now(srv->loop) + 1;
    for (size_t i = 0; i < srv->shadow.n; i++) {
        gw_shadow_entry *e = &srv->shadow.entries[i];
        if (e->suppressed == 0
            || (!all && now - e->last_ms < SHADOW_LOG_INTERVAL_MS))
            continue;
        rl_log(&srv->log, RL_LOG_INFO, "shadow_rejected_suppressed",
               "rule=%s count=%llu", e->rule,
               (unsigned long long)e->suppressed);
        e->suppressed = 0;
    }
    gw_shadow_log *log = &srv->shadow;
    if (log->unnamed_suppressed > 0
        && (all || now - log->unnamed_last_ms >= SHADOW_LOG_INTERVAL_MS)) {
        rl_log(&srv->log, RL_LOG_INFO, "shadow_rejected_suppressed",
               "rule=(unnamed) count=%llu",
               (unsigned long long)log->unnamed_suppressed);
        log->unnamed_suppressed = 0;
    }
}

void gw_shadow_free(gw_server *srv)
{
    free(srv->shadow.entries);
    srv->shadow = (gw_shadow_log){0};
}
