/*
 * test_fleet.h: a fleet of agents in the test's process (rl_agent, as a
 * gateway links it) on one real rl-aggregator, requests offered to them
 * round-robin at a rate, and what they admitted, with the times.
 */
#ifndef RL_TEST_FLEET_H
#define RL_TEST_FLEET_H

#include "rl.h"
#include "test_agent.h"
#include "test_aggregator.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TEST_FLEET_MAX 10

typedef struct test_fleet {
    test_aggregator agg;
    size_t n;
    rl_agent *agents[TEST_FLEET_MAX];
    rl_config *configs[TEST_FLEET_MAX];
} test_fleet;

/* The times of the checks offered, admitted and refused, in order. */
typedef struct test_admissions {
    uint64_t *at_us;
    size_t n, cap;
    uint64_t *refused_us;
    size_t n_refused, cap_refused;
    long offered;
} test_admissions;

/* test_fleet_start starts an aggregator (store: redis, or the shared test
 * Redis when NULL) with the rules and sync interval given, and n agents on
 * its config (logging into logs[i] unless logs is NULL), each of which
 * then checks warm_tenant once; waits eight intervals, so that they have
 * heard the totals and know how many they are. aggregator_extra: more
 * aggregator: lines for the config they all read (or NULL). */
void test_fleet_start(test_fleet *f, size_t n, const char *redis,
                      const char *rules_yaml, unsigned interval_ms,
                      const char *warm_tenant, test_log *logs,
                      const char *aggregator_extra);
void test_fleet_stop(test_fleet *f);

/* One check of cost 1 for tenant (attribute "tenant"). */
bool test_fleet_allowed(rl_agent *agent, const char *tenant);

/* Offers `rate` checks per second, round-robin over the agents, for ms;
 * keeps each check's time. */
void test_fleet_offer(test_fleet *f, const char *tenant, double rate,
                      uint64_t ms, test_admissions *out);

/* One tenant's load, for several offered at once. */
typedef struct test_offer {
    const char *tenant;
    double rate;             /* checks per second */
    test_admissions *out;
} test_offer;

/* The offers at once, each at its rate, for ms. */
void test_fleet_offer_all(test_fleet *f, const test_offer *offers, size_t n,
                          uint64_t ms);

void test_admissions_push(test_admissions *a, uint64_t at_us);
void test_admissions_free(test_admissions *a);

/* The most admitted in any span of period_ms. */
long test_worst_span(const test_admissions *a, uint64_t period_ms);
/* Admitted, refused in [from_us, to_us). */
long test_admitted_between(const test_admissions *a, uint64_t from_us,
                           uint64_t to_us);
long test_refused_between(const test_admissions *a, uint64_t from_us,
                          uint64_t to_us);

#endif
