/*
 * sync.h: reports to and totals from the aggregators, for an agent with
 * synced rules. Private to librl; runs on the agent's I/O thread.
 */
#ifndef RL_AGENT_SYNC_H
#define RL_AGENT_SYNC_H

#include "config.h"
#include "error.h"
#include "log.h"
#include "synced.h"

#include <uv.h>

typedef struct rl_sync rl_sync;

/* rl_sync_new opens the REQ and SUB sockets and starts dialing the
 * aggregator (in the background: it need not be up). NULL with err set on
 * failure (a malformed URL, say). */
rl_sync *rl_sync_new(rl_synced *synced, const rl_config *config,
                     const rl_logger *log, rl_error *err);

/* rl_sync_start begins reporting every interval on loop (its thread). */
void rl_sync_start(rl_sync *s, uv_loop_t *loop);

/* rl_sync_stop ends it: no report after this. A report already sent keeps
 * the sockets open until its ack or its timeout (two intervals); the object
 * frees itself once its handles close. */
void rl_sync_stop(rl_sync *s);

/* For a sync that was never started. */
void rl_sync_free(rl_sync *s);

#endif
