/*
 * test_regions.h: several regions on one machine, each with its own
 * redis-server and one or more rl-aggregators, the aggregators' exchanges
 * between regions carried by a proxy per region and peer (test_proxy.h),
 * so that a test can delay a link or cut it. The proxies carry TCP, so
 * tls+tcp:// peers go through them as they are.
 */
#ifndef RL_TEST_REGIONS_H
#define RL_TEST_REGIONS_H

#include "redis_server.h"
#include "test_aggregator.h"
#include "test_proxy.h"

#include <stddef.h>

#define TEST_REGIONS_MAX 3
#define TEST_REGION_AGGREGATORS_MAX 2

typedef struct test_region {
    const char *name;            /* "eu", "us", "ap" */
    test_redis redis;
    char redis_addr[64];         /* host:port */
    size_t n_aggs;
    /* Its aggregators, by --index; agg is the first (a region of one). */
    union {
        test_aggregator aggs[TEST_REGION_AGGREGATORS_MAX];
        test_aggregator agg;
    };
    /* Where each of its aggregators takes exchanges. */
    union {
        uint16_t peer_ports[TEST_REGION_AGGREGATORS_MAX];
        uint16_t peer_port;
    };
    /* What carries this region's exchanges to region j's aggregator k,
     * to_agg[k][j] (NULL for itself), and where each listens: to[j] is
     * to_agg[0][j], to j's first. */
    union {
        test_proxy *to_agg[TEST_REGION_AGGREGATORS_MAX][TEST_REGIONS_MAX];
        test_proxy *to[TEST_REGIONS_MAX];
    };
    union {
        uint16_t to_agg_port[TEST_REGION_AGGREGATORS_MAX][TEST_REGIONS_MAX];
        uint16_t to_port[TEST_REGIONS_MAX];
    };
    char extra[2048];            /* its config's region lines */
} test_region;

typedef struct test_regions {
    test_region r[TEST_REGIONS_MAX];
    size_t n;
} test_regions;

/* One-way delays between regions, ms: delay[i][j] both ways between
 * regions i and j (the matrix is read as given; keep it symmetric). */
typedef unsigned test_region_delays[TEST_REGIONS_MAX][TEST_REGIONS_MAX];

typedef struct test_regions_opts {
    /* More aggregator: lines for every config (indented), or NULL. */
    const char *extra_aggregator;
    const test_region_delays *delays; /* NULL: none */
    size_t aggregators;  /* per region, up to the max; 0 is 1 */
    /* Non-NULL: peers are tls+tcp://, and each region's aggregators have
     * aggregator.tls {ca: tls_dir/ca.pem, cert and key: tls_dir/<its
     * name>.pem and .key, client_auth: required}; the test makes them
     * (test_certs.h). */
    const char *tls_dir;
} test_regions_opts;

/* Starts n regions (at most TEST_REGIONS_MAX) with the given rules and
 * sync interval, as opts says (NULL: one aggregator each, plain, no
 * delays). */
void test_regions_start_opts(test_regions *rs, size_t n,
                             const char *rules_yaml,
                             unsigned sync_interval_ms,
                             const test_regions_opts *opts);

/* The same with one aggregator per region; extra_aggregator goes into
 * each config's aggregator: block (indented lines, or ""); delays NULL
 * for none. */
void test_regions_start(test_regions *rs, size_t n, const char *rules_yaml,
                        unsigned sync_interval_ms,
                        const char *extra_aggregator,
                        const test_region_delays *delays);

/* Cuts region i off from every other (both ways), or heals it. */
void test_region_cut(test_regions *rs, size_t i);
void test_region_heal(test_regions *rs, size_t i);

/* Stops every aggregator, proxy and Redis. */
void test_regions_stop(test_regions *rs);

/* An agent of region i (on its config: it reports to all the region's
 * aggregators), closed by the caller with rl_agent_close, *config freed
 * with rl_config_free. */
rl_agent *test_region_agent(const test_regions *rs, size_t i,
                            rl_config **config);

#endif
