/*
 * test_regions.h: several regions on one machine, each with its own
 * redis-server and rl-aggregator, the aggregators' exchanges between
 * regions carried by a proxy per pair and direction (test_proxy.h), so
 * that a test can delay a link or cut it.
 */
#ifndef RL_TEST_REGIONS_H
#define RL_TEST_REGIONS_H

#include "redis_server.h"
#include "test_aggregator.h"
#include "test_proxy.h"

#include <stddef.h>

#define TEST_REGIONS_MAX 3

typedef struct test_region {
    const char *name;            /* "eu", "us", "ap" */
    test_redis redis;
    char redis_addr[64];         /* host:port */
    test_aggregator agg;
    uint16_t peer_port;          /* where its aggregator takes exchanges */
    /* What carries this region's exchanges to region j (NULL for itself). */
    test_proxy *to[TEST_REGIONS_MAX];
    uint16_t to_port[TEST_REGIONS_MAX]; /* where each listens */
    char extra[2048];            /* its config's region lines */
} test_region;

typedef struct test_regions {
    test_region r[TEST_REGIONS_MAX];
    size_t n;
} test_regions;

/* One-way delays between regions, ms: delay[i][j] both ways between
 * regions i and j (the matrix is read as given; keep it symmetric). */
typedef unsigned test_region_delays[TEST_REGIONS_MAX][TEST_REGIONS_MAX];

/* Starts n regions (at most TEST_REGIONS_MAX) with the given rules and
 * sync interval; extra_aggregator goes into each config's aggregator:
 * block (indented lines, or ""); delays NULL for none. */
void test_regions_start(test_regions *rs, size_t n, const char *rules_yaml,
                        unsigned sync_interval_ms,
                        const char *extra_aggregator,
                        const test_region_delays *delays);

/* Cuts region i off from every other (both ways), or heals it. */
void test_region_cut(test_regions *rs, size_t i);
void test_region_heal(test_regions *rs, size_t i);

/* Stops every aggregator, proxy and Redis. */
void test_regions_stop(test_regions *rs);

/* An agent of region i (on its config), closed by the caller with
 * rl_agent_close, *config freed with rl_config_free. */
rl_agent *test_region_agent(const test_regions *rs, size_t i,
                            rl_config **config);

#endif
