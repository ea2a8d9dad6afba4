/*
 * test_config_regions.c: `region`, `regions` and a rule's `scope`.
 */
#include "config.h"
#include "error.h"

#include <criterion/criterion.h>
#include <string.h>

static rl_config *load_ok(const char *yaml)
{
    rl_config *cfg = NULL;
    rl_error err;
    int rc = rl_config_parse(yaml, strlen(yaml), "<test>", &cfg, &err);
    cr_assert_eq(rc, RL_OK, "config refused: %s", err.message);
    return cfg;
}

static void expect_refused(const char *yaml, const char *message)
{
    rl_config *cfg = NULL;
    rl_error err;
    int rc = rl_config_parse(yaml, strlen(yaml), "<test>", &cfg, &err);
    cr_assert_eq(rc, RL_ECONFIG, "accepted: %s", yaml);
    cr_assert_null(cfg);
    cr_assert_str_eq(err.message, message);
}

#define GLOBAL_RULE \
    "rules:\n" \
    "  - {name: g, match: api_key, limit: 300, period: 10s, mode: synced, " \
    "scope: global}\n"

Test(config_regions, peers_are_a_list_or_urls_joined_by_commas)
{
    rl_config *cfg = load_ok(
        "region: us\n"
        "regions:\n"
        "  eu: {peers: \"tcp://127.0.0.1:1,tcp://127.0.0.1:2\"}\n"
        "  us: {peers: [tcp://127.0.0.1:3]}\n"
        "rules:\n"
        "  - {name: g, match: api_key, limit: 300, period: 10s, "
        "mode: synced, scope: global}\n"
        "  - {name: r, match: ip, limit: 300, period: 10s, mode: synced}\n");
    cr_assert_eq(cfg->regions.n, 2);
    cr_assert_eq(cfg->regions.self, 1);
    cr_assert_str_eq(cfg->regions.regions[0].name, "eu");
    cr_assert_eq(cfg->regions.regions[0].n_peers, 2);
    cr_assert_str_eq(cfg->regions.regions[0].peers[1], "tcp://127.0.0.1:2");
    cr_assert_str_eq(cfg->regions.regions[1].peers[0], "tcp://127.0.0.1:3");
    cr_assert(cfg->rules[0].global);
    cr_assert_not(cfg->rules[1].global);
    rl_config_free(cfg);
}

Test(config_regions, no_regions_is_one_region)
{
    rl_config *cfg = load_ok("rules:\n"
                             "  - {name: r, match: ip, limit: 3, period: 1s, "
                             "mode: synced, scope: region}\n");
    cr_assert_eq(cfg->regions.n, 0);
    cr_assert_not(cfg->rules[0].global);
    rl_config_free(cfg);
}

Test(config_regions, region_and_regions_go_together)
{
    expect_refused("regions:\n  eu: {peers: tcp://127.0.0.1:1}\n" GLOBAL_RULE,
                   "<test>:2:3: regions: set, but region is not: name the "
                   "region this config is of");
    expect_refused("region: eu\n" GLOBAL_RULE,
                   "<test>:1:9: region: set, but regions is not: list every "
                   "region with its peers");
    expect_refused("region: ap\nregions:\n  eu: {peers: tcp://127.0.0.1:1}\n"
                   GLOBAL_RULE,
                   "<test>:1:9: region: 'ap' is not one of regions");
}

Test(config_regions, a_global_rule_is_synced_and_needs_regions)
{
    expect_refused("region: eu\nregions:\n  eu: {peers: tcp://127.0.0.1:1}\n"
                   "rules:\n  - {name: g, match: api_key, limit: 3, "
                   "period: 10s, scope: global}\n",
                   "<test>:5:61: rules[0].scope (rule \"g\"): a rule of mode "
                   "exact stays in its region (each check waits on its "
                   "region's store, and a round trip between regions is too "
                   "slow for that): only a synced rule can be global");
    expect_refused(GLOBAL_RULE,
                   "<test>:2:77: rules[0].scope (rule \"g\"): global needs "
                   "the regions: give `region` (this config's) and `regions` "
                   "(every region's peers)");
    expect_refused("rules:\n  - {name: g, match: api_key, limit: 3, "
                   "period: 10s, mode: synced, scope: planet}\n",
                   "<test>:2:75: rules[0].scope (rule \"g\"): unknown value "
                   "'planet' (choose one of: region, global)");
}

Test(config_regions, a_region_has_one_peer_per_aggregator)
{
    expect_refused("region: eu\nregions:\n"
                   "  eu: {peers: \"tcp://127.0.0.1:1,tcp://127.0.0.1:2\"}\n"
                   GLOBAL_RULE,
                   "<test>:3:15: regions.eu.peers: 2 peers for 1 "
                   "aggregators: give this region one peer address per "
                   "aggregator, in the aggregators' order");
}

/* aggregator.tls serves tls+tcp:// peers alone (TLS between regions,
 * plain reports and totals in one), and such a peer needs it. */
Test(config_regions, tls_peers_take_aggregator_tls)
{
    rl_config *cfg = load_ok(
        "aggregator:\n  tls: {ca: ca.pem, cert: a.pem, key: a.key}\n"
        "region: eu\nregions:\n  eu: {peers: tls+tcp://127.0.0.1:1}\n"
        "  us: {peers: tls+tcp://127.0.0.1:2}\n" GLOBAL_RULE);
    cr_assert_str_eq(cfg->aggregator.tls.ca, "ca.pem");
    rl_config_free(cfg);
    expect_refused("region: eu\nregions:\n  eu: {peers: tcp://127.0.0.1:1}\n"
                   "  us: {peers: tls+tcp://127.0.0.1:2}\n" GLOBAL_RULE,
                   "<test>:4:15: regions.us.peers: a tls+tcp:// URL needs "
                   "aggregator.tls with at least ca, cert and key");
    expect_refused("aggregator:\n  tls: {ca: ca.pem, cert: a.pem, key: a.key}"
                   "\nregion: eu\nregions:\n  eu: {peers: tcp://127.0.0.1:1}"
                   "\n" GLOBAL_RULE,
                   "<test>:2:8: aggregator.tls: set, but none of reports, totals "
                   "and the regions' peers is a tls+tcp:// URL");
}

Test(config_regions, bad_regions_are_refused_with_where)
{
    expect_refused("region: eu\nregions:\n  eu: {peers: http://x}\n"
                   GLOBAL_RULE,
                   "<test>:3:15: regions.eu.peers: 'http://x' is not an nng "
                   "URL such as tcp://10.1.0.5:7303");
    expect_refused("region: EU\nregions:\n  EU: {peers: tcp://127.0.0.1:1}\n"
                   GLOBAL_RULE,
                   "<test>:3:3: regions: a region's name is 1 to 32 letters "
                   "a-z, digits, - and _");
    expect_refused("region: eu\nregions:\n"
                   "  eu: {peers: tcp://127.0.0.1:1, tls: x}\n" GLOBAL_RULE,
                   "<test>:3:34: regions.eu: unknown field (a region has "
                   "peers)");
    expect_refused("region: eu\nregions:\n  eu: {}\n" GLOBAL_RULE,
                   "<test>:3:7: regions.eu.peers: missing: where this "
                   "region's aggregators take the other regions' "
                   "exchanges");
    expect_refused("region: eu\nregions:\n"
                   "  eu: {peers: \"tcp://127.0.0.1:1,tcp://127.0.0.1:1\"}\n"
                   GLOBAL_RULE,
                   "<test>:3:15: regions.eu.peers: 'tcp://127.0.0.1:1' is "
                   "given twice");
}
