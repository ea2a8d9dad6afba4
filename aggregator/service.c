/*
 * service.c: see service.h. The watchdog is pinged from a timer on the
 * aggregator's own loop, so a loop that is stuck stops the pings and
 * systemd restarts the service.
 */
#include "service.h"

#include <systemd/sd-daemon.h>

#define READY_POLL_MS 50

static void ready_poll(uv_timer_t *t)
{
    rl_service *svc = t->data;
    if (!rl_store_up(svc->store))
        return;
    uv_timer_stop(t);
    svc->ready = true;
    rl_log(svc->log, RL_LOG_INFO, "ready", "%s", "");
    sd_notify(0, "READY=1\nSTATUS=receiving reports");
}

static void watchdog_ping(uv_timer_t *t)
{
    (void)t;
    sd_notify(0, "WATCHDOG=1");
}

void rl_service_start(rl_service *svc, uv_loop_t *loop, const rl_store *store,
                      const rl_logger *log)
{
    *svc = (rl_service){.store = store, .log = log};
    uv_timer_init(loop, &svc->ready_timer);
    uv_timer_init(loop, &svc->watchdog_timer);
    svc->ready_timer.data = svc->watchdog_timer.data = svc;
    uv_timer_start(&svc->ready_timer, ready_poll, 0, READY_POLL_MS);
    uint64_t usec;
    if (sd_watchdog_enabled(0, &usec) > 0) {
        /* Twice per period, as sd_watchdog_enabled(3) advises. */
        uint64_t every_ms = usec / 2000 > 0 ? usec / 2000 : 1;
        uv_timer_start(&svc->watchdog_timer, watchdog_ping, 0, every_ms);
    }
}

void rl_service_reloading(rl_service *svc)
{
    (void)svc;
    sd_notify(0, "RELOADING=1");
}

void rl_service_reloaded(rl_service *svc)
{
    if (svc->ready)
        sd_notify(0, "READY=1");
}

void rl_service_stopping(rl_service *svc)
{
    (void)svc;
    sd_notify(0, "STOPPING=1");
}

void rl_service_close(rl_service *svc)
{
    uv_close((uv_handle_t *)&svc->ready_timer, NULL);
    uv_close((uv_handle_t *)&svc->watchdog_timer, NULL);
}
