/*
 * aggregator.h: the rl-aggregator daemon's state. One libuv loop thread
 * owns all of it; nng's threads only hand finished receives and sends to
 * the loop through a locked queue and uv_async_send. Private to
 * rl-aggregator.
 */
#ifndef RL_AGGREGATOR_H
#define RL_AGGREGATOR_H

#include "config.h"
#include "service.h"
#include "log.h"
#include "store.h"
#include "windows.h"
#include "wire.h"

#include <nng/nng.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

/* Reports handled at once. */
#define RL_INGEST_WORKERS 32
/* Other regions' exchanges handled at once (one per sender at a time). */
#define RL_EXCHANGE_WORKERS 8

typedef struct rl_aggregator rl_aggregator;

/* One REP context: receive a report, apply it, acknowledge, again. */
typedef struct rl_ingest_worker {
    rl_aggregator *agg;
    struct rl_ingest_worker *next; /* the ready queue */
    nng_ctx ctx;
    nng_aio *aio;
    bool sending;
    int result;                    /* of the last aio, set by nng */
    nng_msg *msg;
    rl_wire_msg report;
    const rl_rule **presence; /* the report's known presence rules */
    size_t n_presence;
    /* The report's entries applied, when some are refused (a rule a
     * reload removed): each one's index in the report. NULL: all. */
    rl_wire_entry *kept;
    size_t *kept_of, n_kept;
    char peer[160];
    uint64_t sent_at_us;           /* to Redis, for the latency metric */
    bool exchange;                 /* on the peers socket: another
                                    * region's exchanges, not reports */
    size_t region;                 /* an exchange's: its region's index */
} rl_ingest_worker;

/* Why a report was refused. */
typedef enum rl_reject {
    RL_REJECT_MALFORMED,     /* not a report rl can read */
    RL_REJECT_UNKNOWN_RULE,  /* a count for a rule not synced here */
    RL_REJECT_OUT_OF_MEMORY,
    RL_REJECT_TOO_MANY_AGENTS, /* aggregator.max_agents live ones already */
    RL_REJECT_TOO_MANY_IDS,  /* a second agent id on one connection */
    RL_REJECTS,
} rl_reject;

/* Counters, for logs and metrics. */
typedef struct rl_aggregator_stats {
    uint64_t reports_applied;
    uint64_t reports_duplicate;
    uint64_t reports_retry;        /* Redis away: the agent resends */
    uint64_t reports_rejected;     /* malformed, unknown rules, ... */
    uint64_t rejected_by[RL_REJECTS]; /* by rl_reject reason */
    uint64_t entries_applied;
    uint64_t totals_published;
    uint64_t broadcast_dropped;    /* changed keys over the per-interval cap */
} rl_aggregator_stats;

typedef struct rl_broadcast rl_broadcast;
typedef struct rl_exchange rl_exchange;

/* Peers whose bad reports were logged this interval: one line per peer per
 * interval, however many they send. */
#define RL_COMPLAINT_PEERS 64
typedef struct rl_complaint {
    char peer[160];
    uint64_t interval;    /* when last logged */
    uint64_t suppressed;  /* not logged since */
} rl_complaint;

struct rl_aggregator {
    rl_config *boot_config;        /* store and sockets settings */
    rl_config *config;             /* the rules, replaced on SIGHUP */
    /* The entry of aggregator.endpoints this one serves (--index), in
     * boot_config. */
    const rl_aggregator_endpoint *endpoint;
    char *config_path;
    rl_logger log;
    uv_loop_t *loop;
    rl_redis_tls *redis_tls;       /* the store's TLS context, or NULL */
    rl_store *store;
    struct rl_windows *windows;    /* reports into the store */
    nng_socket reports;
    nng_socket totals;
    rl_ingest_worker workers[RL_INGEST_WORKERS];
    /* Regions (docs/regions.md): the other regions' exchanges come in on
     * peers, this region's counts go out through exchange, and demand
     * splits a global key's room among the regions. */
    nng_socket peers;
    rl_ingest_worker exchange_workers[RL_EXCHANGE_WORKERS];
    rl_exchange *exchange;         /* NULL without regions */
    struct rl_demand *demand;      /* NULL without regions */

    pthread_mutex_t ready_lock;    /* nng threads -> loop */
    rl_ingest_worker *ready;
    uv_async_t wakeup;

    uv_timer_t publish_timer;
    uv_signal_t sigterm, sigint, sighup;
    rl_service service;            /* systemd notifications */
    struct rl_metrics *metrics;    /* NULL unless aggregator.metrics */
    struct rl_agents *agents;      /* the agents heard from */
    rl_broadcast *broadcast;
    rl_aggregator_stats stats;
    bool stopping;
    uint64_t stopping_ms;          /* loop ms of the stop signal */
    int in_flight;                 /* reports waiting for Redis */
    uint64_t interval;             /* publish count: the log limiter's clock */
    rl_complaint complaints[RL_COMPLAINT_PEERS];
    /* Names of rules synced under an earlier config and not now: an agent
     * that counted them before its own reload still reports those counts,
     * and refusing its report whole would hold back every other count in
     * it, forever (it resends the same report until acknowledged). */
    char **retired;
    size_t n_retired;
};

/* agents.c: the agents heard from (at most aggregator.max_agents). */
typedef struct rl_agents rl_agents;
int rl_agents_init(rl_aggregator *agg);
void rl_agents_free(rl_aggregator *agg);
/* Records a report's agent, which came on connection pipe; 0, or
 * RL_AGENTS_FULL when it is new and the table is full of live agents, or
 * RL_AGENTS_PIPE_FULL when the connection speaks for another agent. */
#define RL_AGENTS_FULL (-1)
#define RL_AGENTS_PIPE_FULL (-2)
int rl_agents_note(rl_aggregator *agg, const rl_wire_msg *report,
                   const char *peer, uint32_t pipe, uint64_t now_ms);
/* The agent id said goodbye on pipe: forgotten, if it is the one that
 * connection speaks for (true); a goodbye from elsewhere is not its. */
bool rl_agents_leave(rl_aggregator *agg, rl_wire_bytes id, uint32_t pipe,
                     uint64_t now_ms);
size_t rl_agents_count(const rl_aggregator *agg);
void rl_agents_render(const rl_aggregator *agg, uint64_t now_ms,
                      void (*put)(void *, const char *, ...), void *arg);

/* metrics.c: Prometheus text on aggregator.metrics, rendered on the loop
 * (every publish) and served from nng's HTTP server. */
int rl_metrics_start(rl_aggregator *agg, char *err, size_t errlen);
void rl_metrics_render(rl_aggregator *agg);
/* A report's Redis write took us microseconds. */
void rl_metrics_redis_latency(rl_aggregator *agg, uint64_t us);
/* A broadcast went out ms after the oldest total in it was noted. */
void rl_metrics_broadcast_lag(rl_aggregator *agg, uint64_t ms);
void rl_metrics_stop(rl_aggregator *agg);

/* ingest.c */
int rl_ingest_start(rl_aggregator *agg, char *err, size_t errlen);
void rl_ingest_stop(rl_aggregator *agg);
void rl_ingest_drain_ready(rl_aggregator *agg);

/* broadcast.c */
rl_broadcast *rl_broadcast_new(void);
void rl_broadcast_free(rl_broadcast *b);
/* Remembers the latest totals of a key, to publish at the next interval:
 * within a sub-window the largest, as answers may come out of order, but
 * for those of a call that applied a give-back (given_back), which may be
 * lower and are the newest. */
void rl_broadcast_note(rl_aggregator *agg, const rl_rule *rule,
                       const char *value, size_t value_len,
                       const rl_window_total *t, bool given_back);
/* After a reload (agg->config is the new config, agg->broadcast new and
 * empty): each rule kept by name keeps the agent count from `from`, the
 * broadcast under `old`, so that the next heartbeat does not say 0 agents
 * (an agent would then take the whole room as its share). */
void rl_broadcast_carry(rl_aggregator *agg, const rl_config *old,
                        const rl_broadcast *from);
/* A rule's agent count, from a presence report. */
void rl_broadcast_agents(rl_aggregator *agg, const rl_rule *rule,
                         uint64_t agents);
/* Publishes every rule's changed keys (and a heartbeat for the others). */
void rl_broadcast_publish(rl_aggregator *agg);
/* Keys waiting for the next publish. */
size_t rl_broadcast_keys(const rl_aggregator *agg);

/* The synced rule named by bytes, or NULL. */
const rl_rule *rl_aggregator_rule(const rl_aggregator *agg,
                                  rl_wire_bytes name);
/* The rule named by bytes that needs a fleet size (synced, or on_error:
 * local), or NULL. */
const rl_rule *rl_aggregator_fleet_rule(const rl_aggregator *agg,
                                        rl_wire_bytes name);
/* Whether a rule needs a fleet size: its TOTALS carry the agent count. */
bool rl_rule_needs_fleet(const rl_rule *rule);
/* Whether name was a synced rule under an earlier config (and is not now). */
bool rl_aggregator_retired(const rl_aggregator *agg, rl_wire_bytes name);

#endif
