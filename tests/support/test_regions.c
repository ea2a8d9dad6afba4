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

/* Region i's config lines: its aggregator: lines (TLS among them), its
 * name, and every region's peers as i dials them (its own directly, the
 * others through i's proxies to them), one per aggregator in --index
 * order. */
static void write_extra(test_regions *rs, size_t i,
                        const test_regions_opts *o)
{
    test_region *me = &rs->r[i];
    size_t cap = sizeof me->extra, n = 0;
    n += (size_t)snprintf(me->extra, cap, "%s",
                          o->extra_aggregator != NULL ? o->extra_aggregator
                                                      : "");
    if (o->tls_dir != NULL)
        n += (size_t)snprintf(me->extra + n, cap - n,
                              "  tls: {ca: %s/ca.pem, cert: %s/%s.pem, "
                              "key: %s/%s.key, client_auth: required}\n",
                              o->tls_dir, o->tls_dir, me->name, o->tls_dir,
                              me->name);
    n += (size_t)snprintf(me->extra + n, cap - n, "region: %s\nregions:\n",
                          me->name);
    const char *scheme = o->tls_dir != NULL ? "tls+tcp" : "tcp";
    for (size_t j = 0; j < rs->n; j++) {
        n += (size_t)snprintf(me->extra + n, cap - n, "  %s: {peers: \"",
                              rs->r[j].name);
        for (size_t k = 0; k < rs->r[j].n_aggs; k++) {
            uint16_t port = j == i ? me->peer_ports[k]
                                   : me->to_agg_port[k][j];
            n += (size_t)snprintf(me->extra + n, cap - n, "%s%s://"
                                  "127.0.0.1:%u", k > 0 ? "," : "", scheme,
                                  port);
        }
        n += (size_t)snprintf(me->extra + n, cap - n, "\"}\n");
        cr_assert_lt(n, cap);
    }
}

void test_regions_start_opts(test_regions *rs, size_t n,
                             const char *rules_yaml,
                             unsigned sync_interval_ms,
                             const test_regions_opts *opts)
{
    static const test_regions_opts plain;
    const test_regions_opts *o = opts != NULL ? opts : &plain;
    size_t aggs = o->aggregators > 0 ? o->aggregators : 1;
    cr_assert_leq(n, TEST_REGIONS_MAX);
    cr_assert_leq(aggs, TEST_REGION_AGGREGATORS_MAX);
    memset(rs, 0, sizeof *rs);
    rs->n = n;
    for (size_t i = 0; i < n; i++) {
        test_region *r = &rs->r[i];
        r->name = names[i];
        r->n_aggs = aggs;
        test_agent_private_redis(&r->redis, r->redis_addr,
                                 sizeof r->redis_addr);
        for (size_t k = 0; k < aggs; k++)
            r->peer_ports[k] = test_free_port();
    }
    for (size_t i = 0; i < n; i++) {
        for (size_t j = 0; j < n; j++) {
            for (size_t k = 0; k < aggs && j != i; k++)
                rs->r[i].to_agg[k][j] = test_proxy_start_delayed(
                    rs->r[j].peer_ports[k], &rs->r[i].to_agg_port[k][j],
                    o->delays != NULL ? (*o->delays)[i][j] : 0);
        }
    }
    for (size_t i = 0; i < n; i++) {
        test_region *r = &rs->r[i];
        write_extra(rs, i, o);
        if (aggs > 1) {
            test_aggregators_start_extra(r->aggs, aggs, r->redis_addr,
                                         rules_yaml, sync_interval_ms,
                                         r->extra);
            continue;
        }
        test_aggregator tpl = TEST_AGGREGATOR_EXTRA(r->extra);
        test_aggregator_start(&r->agg, r->redis_addr, rules_yaml,
                              sync_interval_ms, &tpl);
    }
}

void test_regions_start(test_regions *rs, size_t n, const char *rules_yaml,
                        unsigned sync_interval_ms,
                        const char *extra_aggregator,
                        const test_region_delays *delays)
{
    test_regions_start_opts(rs, n, rules_yaml, sync_interval_ms,
                            &(test_regions_opts){
                                .extra_aggregator = extra_aggregator,
                                .delays = delays});
}

void test_regions_stop(test_regions *rs)
{
    for (size_t i = 0; i < rs->n; i++)
        for (size_t k = 0; k < rs->r[i].n_aggs; k++)
            test_aggregator_stop(&rs->r[i].aggs[k]);
    for (size_t i = 0; i < rs->n; i++) {
        for (size_t k = 0; k < rs->r[i].n_aggs; k++) {
            for (size_t j = 0; j < rs->n; j++) {
                if (rs->r[i].to_agg[k][j] != NULL)
                    test_proxy_stop(rs->r[i].to_agg[k][j]);
                rs->r[i].to_agg[k][j] = NULL;
            }
        }
        test_redis_stop(&rs->r[i].redis);
    }
}

rl_agent *test_region_agent(const test_regions *rs, size_t i,
                            rl_config **config)
{
    return test_synced_agent(&rs->r[i].agg, config);
}

/* Both ways: i's exchanges to the others' aggregators and theirs to i's,
 * with their answers. */
void test_region_cut(test_regions *rs, size_t i)
{
    for (size_t j = 0; j < rs->n; j++) {
        for (size_t k = 0; k < rs->r[i].n_aggs && j != i; k++) {
            test_proxy_cut(rs->r[i].to_agg[k][j]);
            test_proxy_cut(rs->r[j].to_agg[k][i]);
        }
    }
}

void test_region_heal(test_regions *rs, size_t i)
{
    for (size_t j = 0; j < rs->n; j++) {
        for (size_t k = 0; k < rs->r[i].n_aggs && j != i; k++) {
            test_proxy_heal(rs->r[i].to_agg[k][j]);
            test_proxy_heal(rs->r[j].to_agg[k][i]);
        }
    }
}
