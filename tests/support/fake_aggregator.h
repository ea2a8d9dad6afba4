/*
 * fake_aggregator.h: an aggregator played by the test, in its process, so
 * that the test says what Redis's clock reads, what one key's totals hold
 * and when each message goes: it answers an agent's reports on a REP
 * socket and publishes TOTALS on a PUB socket, for one synced rule and one
 * key (the first the agent reports). Uses Criterion's assertions.
 */
#ifndef RL_TEST_FAKE_AGGREGATOR_H
#define RL_TEST_FAKE_AGGREGATOR_H

#include "wire.h"

#include <nng/nng.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

typedef struct fake_agg {
    nng_socket rep, pub;
    char reports[64], totals[64];
    atomic_int subscribers;
    const char *rule;
    uint64_t period_ms, agents; /* the rule's, and the fleet's size */
    int64_t clock_offset;  /* Redis's clock: test_now_ms() + this */
    uint64_t window;       /* the sub-window that clock is in */
    uint64_t recent, oldest; /* the key's totals in it (wire.h) */
    char value[RL_WIRE_VALUE_MAX];
    size_t value_len;      /* the key, as the agent's reports name it */
    /* A global rule's (scope: global): its TOTALS entries say the
     * region's share of the room (millionths) and whether a region is
     * cut off. */
    bool global;
    uint64_t share;
    bool cut;
} fake_agg;

/* A report received and not answered yet: while it is held the agent
 * sends no other on that link. */
typedef struct fake_held {
    nng_msg *msg;
    rl_wire_msg report;
    uint64_t count;        /* the key's count in it */
    uint64_t refused;      /* the refusals its entries say */
    size_t demand_entries; /* its entries of five fields (with refusals) */
} fake_held;

/* Listens on two free loopback ports; the clock starts in sub-window
 * first_window. The key may be set before (value), else it is the first
 * the agent reports. */
void fake_start(fake_agg *f, const char *rule, uint64_t period_ms,
                uint64_t agents, uint64_t first_window);

/* Only once the agent is closed: nng 1.5.2 can hang closing a socket a
 * message is arriving on (see rl_sync_stop). */
void fake_stop(fake_agg *f);

/* As if killed and started again: both sockets closed (the agent's
 * connections end), then listening again on the same addresses, the
 * totals' only if totals (else fake_listen_totals does it later). */
void fake_restart(fake_agg *f, bool totals);
void fake_listen_totals(fake_agg *f);

/* Waits (up to 5 s) until an agent has subscribed to the totals: TOTALS
 * published before are lost. */
void fake_wait_subscribed(fake_agg *f);

/* Redis's clock jumps to just inside sub-window w, where the key's totals
 * are recent and oldest. */
void fake_enter(fake_agg *f, uint64_t w, uint64_t recent, uint64_t oldest);

/* The agent's next report on this link (waits up to 3 s). */
fake_held fake_receive(fake_agg *f);

/* Applies the report's count in the current sub-window and acknowledges
 * it with the key's totals, as they are once it is applied. */
void fake_ack(fake_agg *f, fake_held *r);

/* Publishes the key's totals (with the share and cut of a global
 * rule's when f->global). */
void fake_publish(fake_agg *f);

/* Publishes TOTALS marked stale (the aggregator cannot reach Redis): the
 * agent count, no key. */
void fake_publish_stale(fake_agg *f);

/* Says, as an aggregator of this version does, that it reads the
 * sub-window of report entries (FEATURES); until then the fake is one
 * of an older version. */
void fake_publish_features(fake_agg *f);
/* Says it reads those of the RL_WIRE_FEATURE_* bits. */
void fake_publish_features_of(fake_agg *f, uint64_t features);

#endif
