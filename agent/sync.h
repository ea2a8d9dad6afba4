/*
 * sync.h: reports to and totals from the aggregators, for an agent with
 * synced rules. Private to librl; runs on the agent's I/O thread.
 */
#ifndef RL_AGENT_SYNC_H
#define RL_AGENT_SYNC_H

#include "config.h"
#include "error.h"
#include "ident.h"
#include "log.h"
#include "synced.h"

#include <uv.h>

typedef struct rl_sync rl_sync;

/* rl_sync_new opens a REQ and a SUB socket per aggregator of the config
 * and starts dialing them (in the background: they need not be up); its
 * reports name the agent agent_id (agent_id.h). NULL with err set on
 * failure (a malformed URL, say). */
rl_sync *rl_sync_new(rl_synced *synced, const rl_config *config,
                     const char *agent_id, const rl_logger *log,
                     rl_error *err);

/* rl_sync_set_rules makes rules (and their identities, by rule index) the
 * ones reported and subscribed to: topics of synced rules new in it are
 * subscribed, those of rules gone are dropped. Before rl_sync_start, or
 * on the loop's thread after; both must stay valid until the next call or
 * the close. */
void rl_sync_set_rules(rl_sync *s, const rl_config *rules,
                       rl_ident *const *idents);

/* Whether rl_sync_start ran. */
bool rl_sync_started(const rl_sync *s);

/* rl_sync_start begins reporting every interval on loop (its thread). */
void rl_sync_start(rl_sync *s, uv_loop_t *loop);

/* rl_sync_stop ends it: no report after this. A report already sent keeps
 * the sockets open until its ack or its timeout (two intervals); the object
 * frees itself once its handles close. */
void rl_sync_stop(rl_sync *s);

/* For a sync that was never started. */
void rl_sync_free(rl_sync *s);

#endif
