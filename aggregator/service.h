/*
 * service.h: rl-aggregator under systemd (Type=notify): READY once the
 * sockets are bound and Redis has answered, RELOADING and STOPPING around
 * SIGHUP and SIGTERM, and WATCHDOG pings from the event loop while
 * WatchdogSec is set. Outside systemd (no NOTIFY_SOCKET) all of it does
 * nothing. Private to rl-aggregator.
 */
#ifndef RL_AGGREGATOR_SERVICE_H
#define RL_AGGREGATOR_SERVICE_H

#include "log.h"
#include "store.h"

#include <uv.h>

typedef struct rl_service {
    uv_timer_t ready_timer;    /* until the store answers */
    uv_timer_t watchdog_timer;
    const rl_store *store;
    const rl_logger *log;
    bool ready;
} rl_service;

/* Starts watching for readiness (and the watchdog, when systemd asks). */
void rl_service_start(rl_service *svc, uv_loop_t *loop, const rl_store *store,
                      const rl_logger *log);
void rl_service_reloading(rl_service *svc);
void rl_service_reloaded(rl_service *svc);
void rl_service_stopping(rl_service *svc);
/* Closes the timers (the loop must run once more). */
void rl_service_close(rl_service *svc);

#endif
