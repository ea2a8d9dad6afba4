/*
 * test_regions.c: see test_regions.h.
 */
#include "test_regions.h"

#include "test_agent.h"
#include "test_env.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

static const char *const names[TEST_REGIONS_MAX] = {"eu", "us", "ap"};

/* Region i's config lines: its name, and every region's peers as i dials
 * them (its own directly, the others through i's proxies to them). */
static void write_extra(test_regions *rs, size_t i, const char *extra_agg)
{
    test_region *me = &rs->r[i];
    size_t n = (size_t)snprintf(me->extra, sizeof me->extra,
                                "%sregion: %s\nregions:\n", extra_agg,
                                me->name);
    for (size_t j = 0; j < rs->n; j++) {
        uint16_t port = j == i ? me->peer_port : 0;
        if (j != i)
            port = me->to_port[j];
        n += (size_t)snprintf(me->extra + n, sizeof me->extra - n,
                              "  %s: {peers: \"tcp://127.0.0.1:%u\"}\n",
                              rs->r[j].name, port);
        cr_assert_lt(n, sizeof me->extra);
    }
}

void test_regions_start(test_regions *rs, size_t n, const char *rules_yaml,
                        unsigned sync_interval_ms,
                        const char *extra_aggregator,
                        const test_region_delays *delays)
{
    cr_assert_leq(n, TEST_REGIONS_MAX);
    memset(rs, 0, sizeof *rs);
    rs->n = n;
    for (size_t i = 0; i < n; i++) {
        test_region *r = &rs->r[i];
        r->name = names[i];
        test_agent_private_redis(&r->redis, r->redis_addr,
                                 sizeof r->redis_addr);
        r->peer_port = test_free_port();
    }
    for (size_t i = 0; i < n; i++) {
        for (size_t j = 0; j < n; j++) {
            if (j != i)
                rs->r[i].to[j] = test_proxy_start_delayed(
                    rs->r[j].peer_port, &rs->r[i].to_port[j],
                    delays != NULL ? (*delays)[i][j] : 0);
        }
    }
    for (size_t i = 0; i < n; i++) {
        test_region *r = &rs->r[i];
        write_extra(rs, i, extra_aggregator);
        test_aggregator tpl = TEST_AGGREGATOR_EXTRA(r->extra);
        test_aggregator_start(&r->agg, r->redis_addr, rules_yaml,
                              sync_interval_ms, &tpl);
    }
}

void test_regions_stop(test_regions *rs)
{
    for (size_t i = 0; i < rs->n; i++)
        test_aggregator_stop(&rs->r[i].agg);
    for (size_t i = 0; i < rs->n; i++) {
        for (size_t j = 0; j < rs->n; j++) {
            if (rs->r[i].to[j] != NULL)
                test_proxy_stop(rs->r[i].to[j]);
            rs->r[i].to[j] = NULL;
        }
        test_redis_stop(&rs->r[i].redis);
    }
}

rl_agent *test_region_agent(const test_regions *rs, size_t i,
                            rl_config **config)
{
    return test_synced_agent(&rs->r[i].agg, config);
}

/* Both ways: i's exchanges to the others and theirs to i, with their
 * answers. */
void test_region_cut(test_regions *rs, size_t i)
{
    for (size_t j = 0; j < rs->n; j++) {
        if (j == i)
            continue;
        test_proxy_cut(rs->r[i].to[j]);
        test_proxy_cut(rs->r[j].to[i]);
    }
}

void test_region_heal(test_regions *rs, size_t i)
{
    for (size_t j = 0; j < rs->n; j++) {
        if (j == i)
            continue;
        test_proxy_heal(rs->r[i].to[j]);
        test_proxy_heal(rs->r[j].to[i]);
    }
}
