/*
 * The rules config: the seed's example loads with exact values, defaults are
 * what the README says, and every bad file is refused with a message that
 * names the file, the line and the culprit.
 */
#include "config.h"
#include "rl.h"
#include "rules.h"
#include "test_env.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static rl_config *load_ok(const char *yaml)
{
    rl_config *cfg = NULL;
    rl_error err;
    int rc = rl_config_parse(yaml, strlen(yaml), "<test>", &cfg, &err);
    cr_assert_eq(rc, RL_OK, "config refused: %s", err.message);
    cr_assert_eq(err.code, RL_OK);
    cr_assert_str_empty(err.message);
    return cfg;
}

static void expect_refused(const char *yaml, const char *message)
{
    rl_config *cfg = (rl_config *)1;
    rl_error err;
    int rc = rl_config_parse(yaml, strlen(yaml), "<test>", &cfg, &err);
    cr_assert_eq(rc, RL_ECONFIG, "accepted: %s", yaml);
    cr_assert_null(cfg);
    cr_assert_eq(err.code, RL_ECONFIG);
    cr_assert_str_eq(err.message, message);
}

Test(config, example_holds_the_seeds_three_rules)
{
    char path[512];
    rl_config *cfg = NULL;
    rl_error err;
    test_path(path, sizeof path, "RL_TEST_EXAMPLES", "rules.example.yaml");
    cr_assert_eq(rl_config_load(path, &cfg, &err), RL_OK, "%s", err.message);
    cr_assert_eq(cfg->n_rules, 3);

    const rl_rule *ip = &cfg->rules[0], *key = &cfg->rules[1],
                  *tenant = &cfg->rules[2];
    cr_assert_str_eq(ip->name, "per-ip");
    cr_assert_str_eq(ip->match, "ip");
    cr_assert_eq(ip->limit, 1000);
    cr_assert_eq(ip->period_ms, 60000);
    cr_assert_eq(ip->burst, 1000);
    cr_assert_eq(ip->mode, RL_MODE_EXACT);
    cr_assert_str_eq(ip->key_prefix, "rl:ip:");

    cr_assert_str_eq(key->match, "api_key");
    cr_assert_eq(key->limit, 100);
    cr_assert_eq(key->period_ms, 60000);
    cr_assert_str_eq(key->key_prefix, "rl:key:");
    cr_assert_eq(key->on_error, RL_ON_ERROR_ALLOW);

    cr_assert_eq(tenant->limit, 10000);
    cr_assert_eq(tenant->period_ms, 3600000);
    cr_assert_eq(tenant->mode, RL_MODE_SYNCED);
    cr_assert_str_eq(tenant->key_prefix, "rl:tenant:");

    cr_assert_eq(cfg->store.cluster, false);
    cr_assert_str_eq(cfg->store.nodes[0].host, "127.0.0.1");
    cr_assert_eq(cfg->store.nodes[0].port, 6379);
    cr_assert_eq(cfg->store.timeout_ms, 50);
    cr_assert_eq(cfg->aggregator.sync_interval_ms, 1000);
    cr_assert_eq(cfg->aggregator.stale_after_ms, 3000);
    cr_assert_eq(tenant->on_error, RL_ON_ERROR_LOCAL);
    cr_assert_eq(cfg->charge, RL_CHARGE_ALL);
    cr_assert_eq(cfg->local_max_keys, 100000);
    cr_assert_eq(cfg->log_level, RL_LOG_INFO);
    cr_assert_str_eq(cfg->gateway.tenant_map, "");
    rl_config_free(cfg);
}

/* The example's commented-out block of newer features is a config of its
 * own once uncommented: it must stay one that loads. */
Test(config, the_examples_commented_out_in_the_example_load)
{
    char path[512], line[512];
    test_path(path, sizeof path, "RL_TEST_EXAMPLES", "rules.example.yaml");
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f);
    char *yaml = calloc(1, 65536);
    size_t len = 0;
    bool in = false;
    int lines = 0;
    while (fgets(line, sizeof line, f) != NULL) {
        if (strstr(line, "---8<--- examples") != NULL) {
            in = true;
        } else if (strstr(line, "--->8--- examples") != NULL) {
            in = false;
        } else if (in) {
            cr_assert(line[0] == '#', "%s", line);
            const char *text = line[1] == ' ' ? line + 2 : line + 1;
            len += (size_t)snprintf(yaml + len, 65536 - len, "%s", text);
            lines++;
        }
    }
    fclose(f);
    cr_assert_gt(lines, 40);
    rl_config *cfg = load_ok(yaml);
    cr_assert_eq(cfg->n_rules, 4);
    cr_assert_eq(cfg->rules[0].n_overrides, 3);
    cr_assert_str_eq(cfg->rules[2].key_prefix, "rl:key_route:");
    cr_assert(cfg->rules[3].shadow);
    cr_assert_eq(cfg->gateway.n_routes, 2);
    rl_config_free(cfg);
    free(yaml);
}

Test(config, local_rules_and_the_gateway_section)
{
    rl_config *cfg = load_ok("local: {max_keys: 5000}\n"
                             "gateway: {tenant_map: tenants.txt}\n"
                             "rules:\n"
                             "  - {name: r, match: ip, limit: 7, "
                             "period: 1s, mode: local}\n");
    cr_assert_eq(cfg->rules[0].mode, RL_MODE_LOCAL);
    cr_assert_eq(cfg->local_max_keys, 5000);
    cr_assert_str_eq(cfg->gateway.tenant_map, "tenants.txt");
    rl_config_free(cfg);
}

/* gateway.cost_header: a header name (a token); cost_estimate: what a
 * request holds until the header's value, 0 to 2^32 - 1, only with it. */
Test(config, the_gateway_cost_header_and_its_estimate)
{
    static const char rule[] = "rules:\n  - {name: r, match: ip, limit: 7, "
                               "period: 1s}\n";
    char yaml[512];
    rl_config *cfg = load_ok(rule);
    cr_assert_str_eq(cfg->gateway.cost_header, "");
    cr_assert_eq(cfg->gateway.cost_estimate, 1);
    rl_config_free(cfg);

    snprintf(yaml, sizeof yaml, "gateway: {cost_header: X-Cost, "
             "cost_estimate: 0}\n%s", rule);
    cfg = load_ok(yaml);
    cr_assert_str_eq(cfg->gateway.cost_header, "X-Cost");
    cr_assert_eq(cfg->gateway.cost_estimate, 0);
    rl_config_free(cfg);
    snprintf(yaml, sizeof yaml, "gateway: {cost_header: x-cost, "
             "cost_estimate: 4294967295}\n%s", rule);
    cfg = load_ok(yaml);
    cr_assert_eq(cfg->gateway.cost_estimate, UINT32_MAX);
    rl_config_free(cfg);

    snprintf(yaml, sizeof yaml, "gateway: {cost_header: \"X Cost\"}\n%s",
             rule);
    expect_refused(yaml, "<test>:1:24: gateway.cost_header: 'X Cost' is "
                   "not a header name (letters, digits and "
                   "!#$%&'*+-.^_`|~, not empty)");
    snprintf(yaml, sizeof yaml, "gateway: {cost_header: \"X:Cost\"}\n%s",
             rule);
    expect_refused(yaml, "<test>:1:24: gateway.cost_header: 'X:Cost' is "
                   "not a header name (letters, digits and "
                   "!#$%&'*+-.^_`|~, not empty)");
    snprintf(yaml, sizeof yaml, "gateway: {cost_header: X-Cost, "
             "cost_estimate: 4294967296}\n%s", rule);
    expect_refused(yaml, "<test>:1:47: gateway.cost_estimate: must be a "
                   "whole number from 0 to 4294967295, got '4294967296'");
    snprintf(yaml, sizeof yaml, "gateway: {cost_header: X-Cost, "
             "cost_estimate: -1}\n%s", rule);
    expect_refused(yaml, "<test>:1:47: gateway.cost_estimate: must be a "
                   "whole number from 0 to 4294967295, got '-1'");
    snprintf(yaml, sizeof yaml, "gateway: {cost_estimate: 5}\n%s", rule);
    expect_refused(yaml, "<test>:1:26: gateway.cost_estimate: is what a "
                   "request holds until gateway.cost_header's value is "
                   "known: set cost_header too, or leave cost_estimate "
                   "out (each request costs 1)");
}

/* rl_config_has_in_flight: what tells a host to check with holds. */
Test(config, a_host_learns_whether_a_rule_is_in_flight)
{
    rl_config *cfg = load_ok("rules:\n  - {name: r, match: ip, limit: 7, "
                             "period: 1s}\n");
    cr_assert_not(rl_config_has_in_flight(cfg));
    rl_config_free(cfg);
    cfg = load_ok("rules:\n  - {name: r, match: ip, limit: 7, period: 1s}\n"
                  "  - {name: c, match: tenant, in_flight: 3}\n");
    cr_assert(rl_config_has_in_flight(cfg));
    rl_config_free(cfg);
    cr_assert_not(rl_config_has_in_flight(NULL));
}

Test(config, omitted_fields_take_the_documented_defaults)
{
    rl_config *cfg = load_ok("rules:\n"
                             "  - {name: r, match: customer, limit: 7, "
                             "period: 500ms}\n");
    const rl_rule *r = &cfg->rules[0];
    cr_assert_eq(r->limit, 7);
    cr_assert_eq(r->period_ms, 500);
    cr_assert_eq(r->burst, 7);
    cr_assert_eq(r->mode, RL_MODE_EXACT);
    cr_assert_eq(r->algorithm, RL_ALGO_TOKEN_BUCKET);
    cr_assert_eq(r->on_error, RL_ON_ERROR_ALLOW);
    cr_assert_str_eq(r->key_prefix, "rl:customer:");
    cr_assert_eq(cfg->store.n_nodes, 1);
    cr_assert_str_eq(cfg->store.nodes[0].host, "127.0.0.1");
    cr_assert_eq(cfg->store.nodes[0].port, 6379);
    cr_assert_eq(cfg->store.db, 0);
    cr_assert_null(cfg->store.username);
    cr_assert_null(cfg->store.password);
    cr_assert_eq(cfg->store.timeout_ms, 50);
    cr_assert_eq(cfg->store.scripts, RL_SCRIPTS_AUTO);
    cr_assert_str_eq(cfg->aggregator.endpoints[0].reports, "tcp://127.0.0.1:7301");
    cr_assert_str_eq(cfg->aggregator.endpoints[0].totals, "tcp://127.0.0.1:7302");
    cr_assert_eq(cfg->aggregator.sync_interval_ms, 1000);
    cr_assert_eq(cfg->charge, RL_CHARGE_ALL);
    rl_config_free(cfg);
}

/* fleet_size is on_error: local's divisor when no aggregator has said:
 * a rule's own, else the top level's, else 0 (none: 1). on_error: local
 * is read on exact and synced rules. */
Test(config, fleet_size_is_the_rules_own_else_the_top_levels)
{
    rl_config *cfg = load_ok(
        "fleet_size: 8\n"
        "rules:\n"
        "  - {name: a, match: api_key, limit: 10, period: 1m, "
        "on_error: local}\n"
        "  - {name: b, match: ip, limit: 10, period: 1m, on_error: local, "
        "fleet_size: 3}\n"
        "  - {name: c, match: tenant, limit: 10, period: 1m, mode: synced, "
        "on_error: local, fleet_size: 100000}\n");
    cr_assert_eq(cfg->fleet_size, 8);
    cr_assert_eq(cfg->rules[0].fleet_size, 8);
    cr_assert_eq(cfg->rules[0].on_error, RL_ON_ERROR_LOCAL);
    cr_assert_eq(cfg->rules[1].fleet_size, 3);
    cr_assert_eq(cfg->rules[2].fleet_size, 100000);
    cr_assert_eq(cfg->rules[2].on_error, RL_ON_ERROR_LOCAL);
    rl_config_free(cfg);
    cfg = load_ok("rules:\n"
                  "  - {name: a, match: api_key, limit: 10, period: 1m}\n");
    cr_assert_eq(cfg->fleet_size, 0);
    cr_assert_eq(cfg->rules[0].fleet_size, 0);
    rl_config_free(cfg);
}

/* aggregator.store: a Redis of the aggregators' own, with the store
 * block's fields; without it, the shared store. */
Test(config, aggregator_store_is_its_own_or_the_shared_one)
{
    static const char rules[] =
        "rules:\n"
        "  - {name: per-tenant, match: tenant, limit: 10, period: 1m, "
        "mode: synced}\n";
    rl_config *cfg = load_ok(rules);
    cr_assert_eq(rl_config_aggregator_store(cfg), &cfg->store);
    rl_config_free(cfg);
    char yaml[512];
    snprintf(yaml, sizeof yaml,
             "store:\n  url: redis://shared:6379\n"
             "aggregator:\n  store:\n    url: redis://counts:6390/2\n"
             "    password: other\n    timeout_ms: 200\n%s", rules);
    cfg = load_ok(yaml);
    const rl_store_config *own = rl_config_aggregator_store(cfg);
    cr_assert_str_eq(own->nodes[0].host, "counts");
    cr_assert_eq(own->nodes[0].port, 6390);
    cr_assert_eq(own->db, 2);
    cr_assert_str_eq(own->password, "other");
    cr_assert_eq(own->timeout_ms, 200);
    cr_assert_str_eq(cfg->store.nodes[0].host, "shared");
    cr_assert_null(cfg->store.password);
    rl_config_free(cfg);
}

/* store.sentinel: the master's name, the sentinels, their own
 * credentials; nodes[0] is the first sentinel until one names the
 * primary. */
Test(config, a_store_found_through_sentinels)
{
    rl_config *cfg = load_ok(
        "store:\n"
        "  username: rl-agent\n  password: data-pw\n"
        "  sentinel:\n    master: mymaster\n"
        "    addresses: [\"10.0.0.1:26379\", \"[::1]:26380\"]\n"
        "    username: watcher\n    password: sentinel-pw\n"
        "rules:\n  - {name: per-key, match: api_key, limit: 10, "
        "period: 1m}\n");
    const rl_sentinel_config *sc = &cfg->store.sentinel;
    cr_assert_str_eq(sc->master, "mymaster");
    cr_assert_eq(sc->n_addresses, 2);
    cr_assert_str_eq(sc->addresses[1].host, "::1");
    cr_assert_eq(sc->addresses[1].port, 26380);
    cr_assert_str_eq(sc->username, "watcher");
    cr_assert_str_eq(sc->password, "sentinel-pw");
    cr_assert_str_eq(cfg->store.password, "data-pw");
    cr_assert(!cfg->store.cluster);
    cr_assert_str_eq(cfg->store.nodes[0].host, "10.0.0.1");
    rl_config_free(cfg);
}

/* rediss:// turns TLS on with the defaults (the system's trust store,
 * verify: full); store.tls sets the rest, for every node of a cluster. */
Test(config, a_store_over_tls)
{
    rl_config *cfg = load_ok(
        "store:\n  url: rediss://cache.example.net:6380/2\n"
        "rules:\n  - {name: per-key, match: api_key, limit: 10, "
        "period: 1m}\n");
    cr_assert(cfg->store.tls.enabled);
    cr_assert_eq(cfg->store.tls.verify, RL_TLS_VERIFY_FULL);
    cr_assert_str_eq(cfg->store.tls.ca, "");
    cr_assert_str_eq(cfg->store.nodes[0].host, "cache.example.net");
    cr_assert_eq(cfg->store.nodes[0].port, 6380);
    cr_assert_eq(cfg->store.db, 2);
    rl_config_free(cfg);
    cfg = load_ok(
        "store:\n  cluster: [\"10.0.0.1:6379\"]\n"
        "  tls: {ca_dir: /etc/ssl/certs, cert: c.pem, key: c.key, "
        "server_name: redis.example.net, verify: ca}\n"
        "rules:\n  - {name: per-key, match: api_key, limit: 10, "
        "period: 1m}\n");
    const rl_store_tls_config *t = &cfg->store.tls;
    cr_assert(t->enabled);
    cr_assert_str_eq(t->ca_dir, "/etc/ssl/certs");
    cr_assert_str_eq(t->cert, "c.pem");
    cr_assert_str_eq(t->key, "c.key");
    cr_assert_str_eq(t->server_name, "redis.example.net");
    cr_assert_eq(t->verify, RL_TLS_VERIFY_CA);
    rl_config_free(cfg);
    cfg = load_ok("store:\n  url: redis://127.0.0.1:6379\nrules:\n  - "
                  "{name: per-key, match: api_key, limit: 10, period: 1m}\n");
    cr_assert(!cfg->store.tls.enabled);
    rl_config_free(cfg);
}

Test(config, every_field_can_be_set)
{
    rl_config *cfg = load_ok(
        "store:\n"
        "  url: redis://redis.internal:6380/3\n"
        "  username: rl\n"
        "  password: s3cret\n"
        "  timeout_ms: 20\n"
        "  scripts: eval\n"
        "  wait_replicas: 1\n"
        "aggregator:\n"
        "  reports: ipc:///run/rl/reports\n"
        "  totals: tcp://[::1]:9000\n"
        "  sync_interval_ms: 250\n"
        "  metrics: 127.0.0.1:9464\n"
        "charge: refund\n"
        "log_level: warn\n"
        "rules:\n"
        "  - name: per-key\n"
        "    match: api_key\n"
        "    limit: 100\n"
        "    period: 1m\n"
        "    burst: 20\n"
        "    mode: synced\n"
        "    algorithm: gcra\n"
        "    on_error: deny\n"
        "    key_prefix: \"{acme}:key:\"\n");
    const rl_rule *r = &cfg->rules[0];
    cr_assert_eq(r->burst, 20);
    cr_assert_eq(r->mode, RL_MODE_SYNCED);
    cr_assert_eq(r->algorithm, RL_ALGO_GCRA);
    cr_assert_eq(r->on_error, RL_ON_ERROR_DENY);
    cr_assert_str_eq(r->key_prefix, "{acme}:key:");
    cr_assert_str_eq(cfg->store.nodes[0].host, "redis.internal");
    cr_assert_eq(cfg->store.nodes[0].port, 6380);
    cr_assert_eq(cfg->store.db, 3);
    cr_assert_str_eq(cfg->store.username, "rl");
    cr_assert_str_eq(cfg->store.password, "s3cret");
    cr_assert_eq(cfg->store.timeout_ms, 20);
    cr_assert_eq(cfg->store.scripts, RL_SCRIPTS_EVAL);
    cr_assert_eq(cfg->store.wait_replicas, 1);
    cr_assert_str_eq(cfg->aggregator.endpoints[0].reports, "ipc:///run/rl/reports");
    cr_assert_str_eq(cfg->aggregator.endpoints[0].totals, "tcp://[::1]:9000");
    cr_assert_eq(cfg->aggregator.sync_interval_ms, 250);
    cr_assert_eq(cfg->aggregator.stale_after_ms, 750);
    cr_assert(cfg->aggregator.endpoints[0].has_metrics);
    cr_assert_eq(cfg->log_level, RL_LOG_WARN);
    cr_assert_eq(cfg->aggregator.endpoints[0].metrics.port, 9464);
    cr_assert_eq(cfg->charge, RL_CHARGE_REFUND);
    rl_config_free(cfg);
}

Test(config, aggregators_list_their_endpoints_and_share_the_rest)
{
    rl_config *cfg = load_ok(
        "aggregator:\n"
        "  sync_interval_ms: 500\n"
        "  max_entries: 1000\n"
        "aggregators:\n"
        "  - reports: tcp://10.0.0.1:7301\n"
        "    totals: tcp://10.0.0.1:7302\n"
        "    metrics: 10.0.0.1:9464\n"
        "  - reports: tcp://10.0.0.2:7301\n"
        "    totals: tcp://10.0.0.2:7302\n"
        "  - {reports: \"ipc:///run/rl/r3\", totals: \"ipc:///run/rl/t3\"}\n"
        "rules:\n"
        "  - {name: per-key, match: api_key, limit: 100, period: 1m}\n");
    const rl_aggregator_config *a = &cfg->aggregator;
    cr_assert_eq(a->n_endpoints, 3);
    cr_assert_str_eq(a->endpoints[0].reports, "tcp://10.0.0.1:7301");
    cr_assert_str_eq(a->endpoints[0].totals, "tcp://10.0.0.1:7302");
    cr_assert(a->endpoints[0].has_metrics);
    cr_assert_eq(a->endpoints[0].metrics.port, 9464);
    cr_assert_str_eq(a->endpoints[1].totals, "tcp://10.0.0.2:7302");
    cr_assert_not(a->endpoints[1].has_metrics);
    cr_assert_str_eq(a->endpoints[2].reports, "ipc:///run/rl/r3");
    cr_assert_eq(a->sync_interval_ms, 500);
    cr_assert_eq(a->max_entries, 1000);
    rl_config_free(cfg);
    /* Today's single aggregator is a list of one. */
    cfg = load_ok("rules:\n"
                  "  - {name: per-key, match: api_key, limit: 100, "
                  "period: 1m}\n");
    cr_assert_eq(cfg->aggregator.n_endpoints, 1);
    cr_assert_str_eq(cfg->aggregator.endpoints[0].reports,
                     "tcp://127.0.0.1:7301");
    rl_config_free(cfg);
}

Test(config, aggregators_are_bounded_and_need_their_own_addresses)
{
    char yaml[8192] = "aggregators:\n";
    for (int i = 0; i <= RL_AGGREGATORS_MAX; i++) {
        size_t n = strlen(yaml);
        snprintf(yaml + n, sizeof yaml - n, "  - {reports: \"tcp://h%d:1\", "
                 "totals: \"tcp://h%d:2\"}\n", i, i);
    }
    strcat(yaml, "rules:\n  - {name: k, match: a, limit: 1, period: 1s}\n");
    expect_refused(yaml, "<test>:2:3: aggregators: 17 aggregators, at most "
                         "16 are supported");
    expect_refused("aggregators:\n"
                   "  - {reports: \"tcp://h:1\", totals: \"tcp://h:2\"}\n"
                   "  - {reports: \"tcp://h:3\", totals: \"tcp://h:2\"}\n"
                   "rules:\n  - {name: k, match: a, limit: 1, period: 1s}\n",
                   "<test>:3:15: aggregators[1].reports: aggregators.1 "
                   "listens where an aggregator before it does: each needs "
                   "its own reports and totals URLs");
    expect_refused("aggregators:\n"
                   "  - {reports: \"tcp://h:1\"}\n"
                   "rules:\n  - {name: k, match: a, limit: 1, period: 1s}\n",
                   "<test>:2:5: aggregators[0].totals: missing required "
                   "field 'totals'");
}

Test(config, cluster_seeds_take_names_ipv4_and_ipv6)
{
    rl_config *cfg = load_ok("store:\n"
                             "  cluster: [10.0.0.1:7000, \"[::1]:7001\", "
                             "redis-2.internal:7002]\n"
                             "rules:\n"
                             "  - {name: r, match: ip, limit: 1, period: 1s}\n");
    cr_assert(cfg->store.cluster);
    cr_assert_eq(cfg->store.n_nodes, 3);
    cr_assert_str_eq(cfg->store.nodes[0].host, "10.0.0.1");
    cr_assert_eq(cfg->store.nodes[0].port, 7000);
    cr_assert_str_eq(cfg->store.nodes[1].host, "::1");
    cr_assert_eq(cfg->store.nodes[1].port, 7001);
    cr_assert_str_eq(cfg->store.nodes[2].host, "redis-2.internal");
    cr_assert_eq(cfg->store.nodes[2].port, 7002);
    rl_config_free(cfg);
}

Test(config, rates_stay_two_integers)
{
    /* 100 a minute is not 1.6666 a second: nothing is rounded. */
    rl_config *cfg = load_ok("rules:\n"
                             "  - {name: a, match: ip, limit: 100, period: 1m}\n"
                             "  - {name: b, match: api_key, limit: 9007199254740991, "
                             "period: 1ms}\n"
                             "  - {name: c, match: tenant, limit: 1, "
                             "period: 366d}\n");
    cr_assert_eq(cfg->rules[0].limit, 100);
    cr_assert_eq(cfg->rules[0].period_ms, 60000);
    cr_assert_eq(cfg->rules[1].limit, 9007199254740991ULL);
    cr_assert_eq(cfg->rules[1].period_ms, 1);
    cr_assert_eq(cfg->rules[2].period_ms, 366ULL * 86400000);
    rl_config_free(cfg);
}

Test(config, limits_past_two_to_the_53_are_refused)
{
    expect_refused("rules:\n"
                   "  - {name: a, match: ip, limit: 9007199254740992, "
                   "period: 1m}\n",
                   "<test>:2:33: rules[0].limit (rule \"a\"): must be a whole "
                   "number from 1 to 9007199254740991, got "
                   "'9007199254740992'");
}

Test(config, inline_rules_report_lines_too)
{
    expect_refused("rules:\n"
                   "  - {name: a, match: ip, limit: 1, period: 1m}\n"
                   "  - {name: b, match: \"a b\", limit: 1, period: 1m}\n",
                   "<test>:3:22: rules[1].match (rule \"b\"): 'a b' is not a "
                   "valid attribute name (use letters, digits and _ . -)");
}

Test(config, tiers_overrides_when_composite_and_shadow_load)
{
    char path[512];
    rl_config *cfg = NULL;
    rl_error err;
    snprintf(path, sizeof path, "%s/tiers.yaml", test_env("RL_TEST_CONFIGS"));
    cr_assert_eq(rl_config_load(path, &cfg, &err), RL_OK, "%s", err.message);
    cr_assert_eq(cfg->n_rules, 4);
    cr_assert_str_eq(cfg->dir, test_env("RL_TEST_CONFIGS"));
    cr_assert_eq(cfg->n_attributes_extra, 1);
    cr_assert_str_eq(cfg->attributes_extra[0], "x-client");
    /* Longest prefix first. */
    cr_assert_eq(cfg->gateway.n_routes, 2);
    cr_assert_str_eq(cfg->gateway.routes[0].prefix, "/v1/users");
    cr_assert_str_eq(cfg->gateway.routes[0].name, "users");
    cr_assert_str_eq(cfg->gateway.routes[1].prefix, "/v1");

    const rl_rule *key = &cfg->rules[0];
    cr_assert_eq(key->n_parts, 1);
    cr_assert_eq(key->hash_tag, -1);
    cr_assert_eq(key->n_overrides, 5);
    cr_assert_eq(key->n_file_overrides, 2);
    cr_assert_eq(key->n_when_overrides, 1);
    cr_assert_eq(key->n_values, 5);
    cr_assert_str_eq(key->overrides_file, "partners.tsv");
    const rl_override *o = key->when_overrides[0];
    cr_assert_eq(o, &key->overrides[0]);
    cr_assert_eq(o->rate.limit, 10000);
    cr_assert_eq(o->rate.period_ms, 60000);
    cr_assert_eq(o->rate.burst, 10000);
    cr_assert_eq(o->when.n, 1);
    cr_assert_str_eq(o->when.clauses[0].attr, "plan");
    cr_assert_eq(o->when.clauses[0].op, RL_WHEN_EQUAL);
    cr_assert_str_eq(o->when.clauses[0].values[0], "enterprise");
    o = rl_override_map_find(key->values, "ak_partner2", 11);
    cr_assert_eq(o, &key->overrides[1]);
    cr_assert_str_eq(o->name, "partners");
    cr_assert_eq(o->rate.limit, 1000);
    o = rl_override_map_find(key->values, "ak_internal_monitor", 19);
    cr_assert_eq(o, &key->overrides[2]);
    cr_assert(o->rate.unlimited);
    o = rl_override_map_find(key->values, "ak_file1", 8);
    cr_assert_eq(o, &key->overrides[3]);
    cr_assert_eq(o->line, 2);
    cr_assert_eq(o->order, 3);
    cr_assert_eq(o->rate.limit, 500);
    cr_assert_eq(o->rate.burst, 500);
    o = rl_override_map_find(key->values, "ak_file2", 8);
    cr_assert_eq(o->line, 4);
    cr_assert_eq(o->rate.limit, 50);
    cr_assert_eq(o->rate.period_ms, 10000);
    cr_assert_eq(o->rate.burst, 80);
    cr_assert_null(rl_override_map_find(key->values, "ak_other", 8));
    char label[RL_OVERRIDE_NAME_MAX + 1];
    rl_override_label(key, &key->overrides[2], label, sizeof label);
    cr_assert_str_eq(label, "overrides[2]");
    rl_override_label(key, &key->overrides[1], label, sizeof label);
    cr_assert_str_eq(label, "partners");
    rl_override_label(key, &key->overrides[4], label, sizeof label);
    cr_assert_str_eq(label, "partners.tsv:4");
    rl_override_label(key, NULL, label, sizeof label);
    cr_assert_str_eq(label, "default");

    const rl_rule *login = &cfg->rules[1];
    cr_assert_eq(login->when.n, 2);
    cr_assert_str_eq(login->when.clauses[1].attr, "path");
    cr_assert_str_eq(login->when.clauses[1].values[0], "/v1/login");
    cr_assert_null(login->values);
    cr_assert_eq(login->n_overrides, 0);

    const rl_rule *route = &cfg->rules[2];
    cr_assert_eq(route->n_parts, 2);
    cr_assert_str_eq(route->parts[0], "api_key");
    cr_assert_str_eq(route->parts[1], "route");
    cr_assert_str_eq(route->match, "api_key,route");
    cr_assert_eq(route->hash_tag, 0);
    cr_assert_str_eq(route->key_prefix, "rl:key_route:");
    cr_assert_not(route->shadow);

    const rl_rule *cap = &cfg->rules[3];
    cr_assert(cap->shadow);
    cr_assert_eq(cap->when.clauses[0].op, RL_WHEN_PREFIX);
    cr_assert_str_eq(cap->when.clauses[0].values[0], "/v1/");
    cr_assert_eq(cap->when.clauses[1].op, RL_WHEN_ANY);
    cr_assert_eq(cap->when.clauses[1].n_values, 2);
    cr_assert_str_eq(cap->when.clauses[1].values[1], "web");
    cr_assert_eq(cap->overrides[0].rate.burst, 6000);
    rl_config_free(cfg);
}

Test(config, global_shadow_puts_every_rule_in_shadow)
{
    rl_config *cfg = load_ok("shadow: true\n"
                             "rules:\n"
                             "  - {name: a, match: ip, limit: 1, period: 1s}\n"
                             "  - {name: b, match: api_key, limit: 1, "
                             "period: 1s, shadow: false}\n");
    cr_assert(cfg->shadow);
    cr_assert(cfg->rules[0].shadow);
    cr_assert(cfg->rules[1].shadow);
    rl_config_free(cfg);
    cfg = load_ok("rules:\n"
                  "  - {name: a, match: ip, limit: 1, period: 1s}\n");
    cr_assert_not(cfg->shadow);
    cr_assert_not(cfg->rules[0].shadow);
    rl_config_free(cfg);
}

Test(config, an_inline_config_reads_its_overrides_file_from_the_cwd)
{
    char dir[] = "/tmp/rl-config-XXXXXX", old[4096];
    cr_assert_not_null(mkdtemp(dir));
    cr_assert_not_null(getcwd(old, sizeof old));
    cr_assert_eq(chdir(dir), 0);
    FILE *f = fopen("o.tsv", "w");
    fputs("v1 7 1s\n", f);
    fclose(f);
    rl_config *cfg = load_ok("rules:\n"
                             "  - {name: a, match: ip, limit: 1, period: 1s, "
                             "overrides_file: o.tsv}\n");
    cr_assert_str_eq(cfg->dir, "");
    const rl_override *o = rl_override_map_find(cfg->rules[0].values, "v1", 2);
    cr_assert_not_null(o);
    cr_assert_eq(o->rate.limit, 7);
    rl_config_free(cfg);
    unlink("o.tsv");
    cr_assert_eq(chdir(old), 0);
    rmdir(dir);
}

Test(config, a_composite_key_prefix_joins_short_names)
{
    rl_config *cfg = load_ok("rules:\n"
                             "  - {name: a, match: [tenant, api_key, ip], "
                             "limit: 1, period: 1s}\n"
                             "  - {name: b, match: [ip], limit: 1, "
                             "period: 1s, key_prefix: 'b:'}\n");
    cr_assert_str_eq(cfg->rules[0].key_prefix, "rl:tenant_key_ip:");
    cr_assert_str_eq(cfg->rules[0].match, "tenant,api_key,ip");
    cr_assert_eq(cfg->rules[1].n_parts, 1);
    cr_assert_str_eq(cfg->rules[1].match, "ip");
    rl_config_free(cfg);
}

Test(config, an_unknown_when_attribute_suggests_the_near_one)
{
    expect_refused("rules:\n"
                   "  - name: a\n"
                   "    match: ip\n"
                   "    limit: 1\n"
                   "    period: 1s\n"
                   "    when: {metod: POST}\n",
                   "<test>:6:12: rules[0].when.metod (rule \"a\"): unknown "
                   "attribute 'metod' in when (did you mean 'method'? known "
                   "are the gateway's ip, api_key, tenant, plan, method, "
                   "path, host, route and any attribute a rule matches; list "
                   "any other under the top-level attributes:)");
    /* Named by a rule's match, or listed: known. */
    rl_config_free(load_ok("attributes: [x-team]\n"
                           "rules:\n"
                           "  - {name: a, match: ip, limit: 1, period: 1s, "
                           "when: {x-team: red, customer: [a]}}\n"
                           "  - {name: b, match: customer, limit: 1, "
                           "period: 1s}\n"));
}

/* A temp dir holding rules.yaml (one rule, overrides_file o.tsv). */
static void overrides_dir(char *dir, char *config, size_t cap)
{
    cr_assert_not_null(mkdtemp(dir));
    snprintf(config, cap, "%s/rules.yaml", dir);
    FILE *f = fopen(config, "w");
    cr_assert_not_null(f);
    fputs("rules:\n"
          "  - {name: per-key, match: api_key, limit: 100, period: 1m, "
          "overrides_file: o.tsv}\n", f);
    fclose(f);
}

Test(config, a_hundred_thousand_line_overrides_file_loads)
{
    char dir[] = "/tmp/rl-overrides-XXXXXX", config[64], tsv[64];
    overrides_dir(dir, config, sizeof config);
    snprintf(tsv, sizeof tsv, "%s/o.tsv", dir);
    FILE *f = fopen(tsv, "w");
    for (int i = 0; i < 100000; i++)
        fprintf(f, "ak_%08d\t%d\t1m\n", i, 1000 + i);
    fclose(f);
    rl_config *cfg = NULL;
    rl_error err;
    cr_assert_eq(rl_config_load(config, &cfg, &err), RL_OK, "%s",
                 err.message);
    const rl_rule *r = &cfg->rules[0];
    cr_assert_eq(r->n_values, 100000);
    cr_assert_eq(r->n_overrides, 100000);
    cr_assert_eq(r->n_file_overrides, 100000);
    const rl_override *o = rl_override_map_find(r->values, "ak_00099999", 11);
    cr_assert_not_null(o);
    cr_assert_eq(o->rate.limit, 100999);
    cr_assert_eq(o->line, 100000);
    cr_assert_null(rl_override_map_find(r->values, "ak_00100000", 11));
    /* What the docs quote: the map, and the overrides it points into. */
    size_t map = rl_override_map_bytes(r->values);
    size_t all = map + r->n_overrides * sizeof *r->overrides;
    fprintf(stderr, "config: 100,000 file overrides: map %zu bytes, with "
            "the overrides %zu bytes\n", map, all);
    cr_assert_lt(all, (size_t)16 << 20);
    rl_config_free(cfg);
    unlink(tsv);
    unlink(config);
    rmdir(dir);
}

Test(config, an_overrides_file_over_the_byte_cap_is_refused_unread)
{
    char dir[] = "/tmp/rl-overrides-XXXXXX", config[64], tsv[64],
         expected[RL_ERROR_MAX];
    overrides_dir(dir, config, sizeof config);
    snprintf(tsv, sizeof tsv, "%s/o.tsv", dir);
    FILE *f = fopen(tsv, "w");
    cr_assert_eq(ftruncate(fileno(f), (off_t)RL_OVERRIDES_FILE_MAX + 1), 0);
    fclose(f);
    rl_config *cfg = (rl_config *)1;
    rl_error err;
    cr_assert_eq(rl_config_load(config, &cfg, &err), RL_ECONFIG);
    cr_assert_null(cfg);
    snprintf(expected, sizeof expected, "%s:2:77: rules[0].overrides_file "
             "(rule \"per-key\"): '%s' is %u bytes, over the %u-byte limit",
             config, tsv, RL_OVERRIDES_FILE_MAX + 1, RL_OVERRIDES_FILE_MAX);
    cr_assert_str_eq(err.message, expected);
    unlink(tsv);
    unlink(config);
    rmdir(dir);
}

struct bad_file {
    const char *file;
    /* after the path; or, starting with "../", a message about a file the
     * config names, after the bad folder's path */
    const char *message;
};

static const struct bad_file bad_files[] = {
    {"burst-times-period-too-large.yaml", ":5:12: rules[0].limit (rule \"per-tenant\"): burst 1000000000 (the bucket's capacity, limit unless set) over a period of 31536000000 ms is more than rl can count exactly: burst x period in ms must stay below 2^53; shorten the period or lower the burst"},
    {"unknown-scripts.yaml", ":3:12: store.scripts: unknown value 'lua' (choose one of: auto, function, eval)"},
    {"aggregator-same-urls.yaml", ":4:11: aggregator.totals: reports and totals need two different URLs, both are 'tcp://127.0.0.1:7301'"},
    {"aggregators-and-aggregator-endpoints.yaml", ":6:3: aggregators: aggregators are given twice: in aggregator (reports, totals, metrics) and in aggregators; list every aggregator under aggregators and keep only the shared settings (sync_interval_ms, tls, max_*) in aggregator"},
    {"aggregator-url.yaml", ":3:12: aggregator.reports: '127.0.0.1:7301' is not an nng URL such as tcp://127.0.0.1:7301 or ipc:///run/rl/reports"},
    {"burst-zero.yaml", ":7:12: rules[0].burst (rule \"per-key\"): must be a whole number from 1 to 9007199254740991, got '0'"},
    {"cluster-seed-no-port.yaml", ":5:7: store.cluster[1]: '127.0.0.1' is not host:port (IPv6 as [addr]:port)"},
    {"credentials-in-url.yaml", ":3:8: store.url: credentials are not accepted here (and not shown, to keep them out of logs): give them in store.username and store.password, password_file or password_env"},
    {"credentials-in-cluster-seed.yaml", ":3:29: store.cluster[1]: credentials are not accepted here (and not shown, to keep them out of logs): give them in store.username and store.password, password_file or password_env"},
    {"duplicate-field.yaml", ":6:13: rules[0].limit: field 'limit' is given twice"},
    {"duplicate-rule-name.yaml", ":7:11: rules[1].name (rule \"per-key\"): duplicate rule name: rules[0] has it already"},
    {"empty-file.yaml", ": the config is empty: it needs at least a rules list"},
    {"empty-rules.yaml", ":2:8: rules: the rules list is empty: give at least one rule (name, match, limit, period)"},
    {"key-prefix-with-space.yaml", ":7:17: rules[0].key_prefix (rule \"per-key\"): 'rl key:' is not a valid key prefix (no spaces or control characters, not empty)"},
    {"limit-fraction.yaml", ":5:12: rules[0].limit (rule \"per-key\"): must be a whole number from 1 to 9007199254740991, got '5.5'"},
    {"limit-negative.yaml", ":5:12: rules[0].limit (rule \"per-key\"): must be a whole number from 1 to 9007199254740991, got '-5'"},
    {"limit-not-integer.yaml", ":5:12: rules[0].limit (rule \"per-key\"): must be a whole number from 1 to 9007199254740991, got 'hundred'"},
    {"limit-zero.yaml", ":5:12: rules[0].limit (rule \"per-key\"): must be a whole number from 1 to 9007199254740991, got '0'"},
    {"match-repeated-attribute.yaml", ":4:29: rules[0].match[2] (rule \"per-key-route\"): attribute 'api_key' is named twice: a key part repeated adds nothing but length"},
    {"missing-limit.yaml", ":3:5: rules[0] (rule \"per-key\"): missing required field 'limit': give limit and period, or in_flight: N for requests at once"},
    {"missing-rules.yaml", ":2:1: rules: missing required field 'rules'"},
    {"name-too-long.yaml", ":3:11: rules[0].name: longer than 64 bytes"},
    {"name-with-space.yaml", ":3:11: rules[0].name: 'per key' is not a valid rule name (use letters, digits and _ . : -)"},
    {"not-yaml.yaml", ":2:8: not valid YAML: did not find expected node content"},
    {"nul-in-value.yaml", ":3:11: this value holds a NUL byte, which no rl field can carry"},
    {"period-no-unit.yaml", ":6:13: rules[0].period (rule \"per-key\"): '60' is not a period: write a positive count and a unit (ms, s, m, h, d), e.g. 500ms, 1s, 1m, 1h, 1d, at most 366d"},
    {"period-unparseable.yaml", ":6:13: rules[0].period (rule \"per-key\"): '1 minute' is not a period: write a positive count and a unit (ms, s, m, h, d), e.g. 500ms, 1s, 1m, 1h, 1d, at most 366d"},
    {"period-zero.yaml", ":6:13: rules[0].period (rule \"per-key\"): '0s' is not a period: write a positive count and a unit (ms, s, m, h, d), e.g. 500ms, 1s, 1m, 1h, 1d, at most 366d"},
    {"rules-not-a-list.yaml", ":2:8: rules: expected a list, got a plain value"},
    {"shared-key-prefix.yaml", ":7:5: rules[1] (rule \"per-ip-hour\"): key prefix 'rl:ip:' is also used by rule \"per-ip-minute\": the two would share buckets; give one of them its own key_prefix"},
    {"nested-key-prefix.yaml", ":8:5: rules[1] (rule \"per-key-v2\"): key prefix 'api:v2:' and rule \"per-key\"'s 'api:' nest: a value of the shorter one's rule can spell a key of the longer one's, sharing its bucket; give them prefixes where neither begins the other"},
    {"store-url-scheme.yaml", ":3:8: store.url: 'http://127.0.0.1:6379' is not redis://host[:port][/db] or rediss://... (credentials go in store.username and store.password)"},
    {"store-tls-plain-url.yaml", ":5:5: store.tls: set, but store.url is redis://: write rediss:// for TLS"},
    {"store-tls-ca-and-ca-dir.yaml", ":5:5: store.tls: give ca or ca_dir, not both"},
    {"store-tls-cert-without-key.yaml", ":5:5: store.tls: cert and key go together: give both or neither"},
    {"store-tls-unknown-verify.yaml", ":5:13: store.tls.verify: unknown value 'chain' (choose one of: full, ca, none)"},
    {"stale-after-below-interval.yaml", ":4:19: aggregator.stale_after_ms: 1500 is less than twice sync_interval_ms (2000): totals come once an interval, so keys would go degraded whenever one came late"},
    {"sync-interval-too-small.yaml", ":3:21: aggregator.sync_interval_ms: must be a whole number from 10 to 60000, got '5'"},
    {"timeout-zero.yaml", ":3:15: store.timeout_ms: must be a whole number from 1 to 60000, got '0'"},
    {"aggregator-store-timeout-zero.yaml", ":5:17: aggregator.store.timeout_ms: must be a whole number from 1 to 60000, got '0'"},
    {"sentinel-and-url.yaml", ":5:5: store.sentinel: give one of store.url, store.cluster and store.sentinel"},
    {"sentinel-without-master.yaml", ":4:5: store.sentinel: give master: the master's name as the sentinels know it"},
    {"sentinel-address-not-host-port.yaml", ":5:36: store.sentinel.addresses[1]: 'sentinel-b' is not host:port (IPv6 as [addr]:port)"},
    {"top-level-list.yaml", ": top level: expected a mapping (key: value lines), got a list"},
    {"unknown-algorithm.yaml", ":7:16: rules[0].algorithm (rule \"per-key\"): unknown value 'leaky_bucket' (choose one of: token_bucket, gcra, fixed_window)"},
    {"unknown-charge.yaml", ":2:9: charge: unknown value 'some' (choose one of: all, first_reject, refund, atomic)"},
    {"unknown-field.yaml", ":7:5: rules[0].limt: unknown field 'limt'"},
    {"unknown-mode.yaml", ":7:11: rules[0].mode (rule \"per-key\"): unknown value 'fast' (choose one of: exact, synced, local, leased, in_flight)"},
    {"tls-without-section.yaml", ":3:12: aggregator.reports: a tls+tcp:// URL needs aggregator.tls with at least ca, cert and key"},
    {"metrics-no-port.yaml", ":2:23: aggregator.metrics: 'localhost' is not host:port (an HTTP address such as 127.0.0.1:9464)"},
    {"local-max-keys-zero.yaml", ":2:19: local.max_keys: must be a whole number from 1 to 10000000, got '0'"},
    {"tenant-map-empty.yaml", ":2:23: gateway.tenant_map: the path is empty; leave the field out for no map"},
    {"unknown-on-error.yaml", ":7:15: rules[0].on_error (rule \"per-key\"): unknown value 'retry' (choose one of: allow, deny, local)"},
    {"fleet-size-zero.yaml", ":8:17: rules[0].fleet_size (rule \"per-key\"): must be a whole number from 1 to 100000, got '0'"},
    {"fleet-size-negative.yaml", ":2:13: fleet_size: must be a whole number from 1 to 100000, got '-3'"},
    {"fleet-size-too-large.yaml", ":8:17: rules[0].fleet_size (rule \"per-key\"): must be a whole number from 1 to 100000, got '100001'"},
    {"fleet-size-not-a-number.yaml", ":8:17: rules[0].fleet_size (rule \"per-key\"): must be a whole number from 1 to 100000, got 'ten'"},
    {"on-error-local-on-local-rule.yaml", ":8:15: rules[0].on_error (rule \"per-ip\"): local falls back to a bucket in the agent when the store does not answer, and a mode: local rule never asks the store: use allow or deny (for keys over local.max_keys)"},
    {"unknown-section.yaml", ":2:1: stores: unknown field 'stores'"},
    {"url-and-cluster.yaml", ":4:12: store.cluster: give either store.url or store.cluster, not both"},
    {"username-without-password.yaml", ":3:13: store.username: a username needs a password (store.password, password_file or password_env)"},
    {"match-given-twice.yaml", ":5:5: rules[0].match (rule \"per-ip\"): field 'match' is given twice"},
    {"hash-tag-brace-in-key-prefix.yaml", ":6:17: rules[0].key_prefix (rule \"per-key-route\"): 'rl:{kr}:' holds a '{': with hash_tag, the key's first '{' must open the tag; take the '{' out"},
    {"when-attribute-twice.yaml", ":5:25: rules[0].when.method (rule \"per-ip\"): attribute 'method' is given twice in this when"},
    {"hash-tag-on-synced-rule.yaml", ":6:15: rules[0].hash_tag (rule \"per-key-route\"): 'tenant' would co-locate the rule's Redis keys by that attribute's value, and a synced rule has no key an agent calls: use mode exact or leased, or drop hash_tag"},
    {"hash-tag-bad-attribute.yaml", ":5:15: rules[0].hash_tag (rule \"per-key\"): 'tenant id' is not a valid attribute name (use letters, digits and _ . -)"},
    {"match-empty-list.yaml", ":4:12: rules[0].match (rule \"nothing\"): the list is empty: name the attribute (or attributes) the rule keys on"},
    {"match-missing.yaml", ":3:5: rules[0].match (rule \"per-what\"): missing required field 'match'"},
    {"match-too-many-attributes.yaml", ":4:12: rules[0].match (rule \"wide\"): 9 attributes: a composite key takes at most 8"},
    {"override-burst-times-period-too-large.yaml", ":9:16: rules[0].overrides[0].limit (rule \"per-tenant\"): burst 1000000000 (the bucket's capacity, limit unless set) over a period of 31536000000 ms is more than rl can count exactly: burst x period in ms must stay below 2^53; shorten the period or lower the burst"},
    {"override-limit-and-unlimited.yaml", ":10:16: rules[0].overrides[0].limit (rule \"per-key\"): an override is either unlimited: true or has a limit, not both (and unlimited takes no period or burst)"},
    {"override-neither-when-nor-values.yaml", ":8:9: rules[0].overrides[0] (rule \"per-key\"): an override needs when (conditions on the request) or values (of the rule's key) to say what it applies to"},
    {"override-synced-period.yaml", ":11:17: rules[0].overrides[0].period (rule \"per-tenant\"): a synced rule's overrides keep its period (60000 ms): the aggregator counts one window per rule; change limit and burst only, or leave period out"},
    {"override-unknown-field.yaml", ":9:9: rules[0].overrides[0].limt: unknown field 'limt'"},
    {"override-value-twice.yaml", ":10:31: rules[0].overrides[1].values[1] (rule \"per-key\"): value 'ak_partner2' is given twice: also in overrides[0]; one value takes one rate"},
    {"override-values-on-composite.yaml", ":8:17: rules[0].overrides[0].values (rule \"per-key-route\"): values name one attribute's values, and this rule's key is composite (api_key,route): use when instead"},
    {"override-when-and-values.yaml", ":8:9: rules[0].overrides[0] (rule \"per-key\"): give when (conditions on the request) or values (of the rule's key), not both: make two overrides"},
    {"override-without-limit.yaml", ":8:9: rules[0].overrides[0] (rule \"per-key\"): an override needs a limit (with period and burst if they differ from the rule's), or unlimited: true"},
    {"overrides-file-bad-line.yaml", "../overrides/bad-limit.tsv:4: rules[0].overrides_file (rule \"per-key\"): limit must be a whole number from 1 to 9007199254740991, got 'lots'"},
    {"overrides-file-missing.yaml", ":7:21: rules[0].overrides_file (rule \"per-key\"): cannot read 'tests/configs/bad/no-such-file.tsv': No such file or directory"},
    {"overrides-file-too-few-fields.yaml", "../overrides/two-fields.tsv:1: rules[0].overrides_file (rule \"per-key\"): expected 'value limit period [burst]' separated by blanks or tabs, got 2 fields"},
    {"overrides-file-value-also-inline.yaml", "../overrides/partner1.tsv:1: rules[0].overrides_file (rule \"per-key\"): value 'ak_partner1' is given twice: also in overrides[0]; one value takes one rate"},
    {"overrides-file-value-twice.yaml", "../overrides/value-twice.tsv:5: rules[0].overrides_file (rule \"per-key\"): value 'ak_a' is given twice: also on line 1 of ../overrides/value-twice.tsv; one value takes one rate"},
    {"route-prefix-not-a-path.yaml", ":4:16: gateway.routes[0].prefix: 'v1/users' is not a path prefix: it starts with '/' and holds no spaces"},
    {"route-prefix-twice.yaml", ":5:16: gateway.routes[1].prefix: prefix '/v1/users' is given twice: gateway.routes[0] has it already"},
    {"shadow-not-a-boolean.yaml", ":7:13: rules[0].shadow (rule \"per-key\"): must be true or false, got 'maybe'"},
    {"when-empty-list.yaml", ":5:20: rules[0].when.method (rule \"login-per-ip\"): the list is empty, so nothing would match: give at least one value"},
    {"when-is-a-list.yaml", ":5:11: rules[0].when (rule \"login-per-ip\"): expected a mapping of attribute: value (or [values], or {prefix: \"...\"}), got a list"},
    {"when-unknown-attribute.yaml", ":5:12: rules[0].when.metod (rule \"login-per-ip\"): unknown attribute 'metod' in when (did you mean 'method'? known are the gateway's ip, api_key, tenant, plan, method, path, host, route and any attribute a rule matches; list any other under the top-level attributes:)"},
    {"when-unknown-matcher.yaml", ":6:14: rules[0].when.path (rule \"login-per-ip\"): unknown matcher 'suffix' (a condition is a value, a list of values, or {prefix: \"...\"})"},
};

Test(config, every_bad_file_is_refused_naming_the_culprit)
{
    cr_assert_geq(sizeof bad_files / sizeof bad_files[0], 15);
    for (size_t i = 0; i < sizeof bad_files / sizeof bad_files[0]; i++) {
        char path[512], expected[RL_ERROR_MAX];
        rl_config *cfg = (rl_config *)1;
        rl_error err;
        snprintf(path, sizeof path, "%s/bad/%s", test_env("RL_TEST_CONFIGS"),
                 bad_files[i].file);
        if (strncmp(bad_files[i].message, "../", 3) == 0)
            snprintf(expected, sizeof expected, "%s/bad/%s",
                     test_env("RL_TEST_CONFIGS"), bad_files[i].message);
        else
            snprintf(expected, sizeof expected, "%s%s", path,
                     bad_files[i].message);
        int rc = rl_config_load(path, &cfg, &err);
        cr_expect_eq(rc, RL_ECONFIG, "%s: loaded (rc %d)", path, rc);
        cr_expect_null(cfg, "%s: out not cleared", path);
        cr_expect_str_eq(err.message, expected);
    }
}

Test(config, every_file_in_the_bad_folder_is_in_the_table)
{
    char cmd[600];
    snprintf(cmd, sizeof cmd, "ls %s/bad", test_env("RL_TEST_CONFIGS"));
    FILE *ls = popen(cmd, "r");
    cr_assert_not_null(ls);
    char name[256];
    size_t listed = 0;
    while (fgets(name, sizeof name, ls) != NULL) {
        name[strcspn(name, "\n")] = '\0';
        bool found = false;
        for (size_t i = 0; i < sizeof bad_files / sizeof bad_files[0]; i++)
            found = found || strcmp(bad_files[i].file, name) == 0;
        cr_expect(found, "%s has no expected message in the table", name);
        listed++;
    }
    pclose(ls);
    cr_assert_eq(listed, sizeof bad_files / sizeof bad_files[0]);
}

Test(config, unreadable_files_are_io_errors)
{
    rl_config *cfg = (rl_config *)1;
    rl_error err;
    cr_assert_eq(rl_config_load("/nonexistent/rl.yaml", &cfg, &err), RL_EIO);
    cr_assert_null(cfg);
    cr_assert_str_eq(err.message, "/nonexistent/rl.yaml: cannot open config: "
                     "No such file or directory");
    cr_assert_eq(rl_config_load("/tmp", &cfg, &err), RL_EIO);
    cr_assert_str_eq(err.message, "/tmp: not a regular file");
}

Test(config, files_over_four_mebibytes_are_refused)
{
    char path[] = "/tmp/rl-big-XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    cr_assert_eq(ftruncate(fd, (4 << 20) + 1), 0);
    close(fd);
    rl_config *cfg;
    rl_error err;
    int rc = rl_config_load(path, &cfg, &err);
    unlink(path);
    cr_assert_eq(rc, RL_EIO);
    cr_assert(strstr(err.message, "config is 4194305 bytes, over the "
                     "4194304-byte limit") != NULL, "%s", err.message);
}

Test(config, null_arguments_are_invalid_not_crashes)
{
    rl_config *cfg;
    rl_error err;
    cr_assert_eq(rl_config_load(NULL, &cfg, &err), RL_EINVAL);
    cr_assert_null(cfg);
    cr_assert_eq(rl_config_load("x", NULL, NULL), RL_EINVAL);
    cr_assert_eq(rl_config_parse(NULL, 0, "x", &cfg, &err), RL_EINVAL);
    cr_assert_eq(rl_config_parse("a", 1, NULL, &cfg, NULL), RL_EINVAL);
    rl_config_free(NULL);
}

static int run_rlctl(const char *config, char *out, size_t cap)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s --config %s config",
             test_env("RL_TEST_RLCTL"), config);
    return test_run(cmd, out, cap);
}

Test(config, rlctl_exits_nonzero_naming_the_culprit)
{
    char out[4096], path[512];
    test_path(path, sizeof path, "RL_TEST_CONFIGS", "bad/limit-zero.yaml");
    cr_assert_eq(run_rlctl(path, out, sizeof out), 3);
    cr_assert(strstr(out, "limit-zero.yaml:5:12: rules[0].limit (rule "
                     "\"per-key\")") != NULL, "%s", out);
    test_path(path, sizeof path, "RL_TEST_EXAMPLES", "rules.example.yaml");
    cr_assert_eq(run_rlctl(path, out, sizeof out), 0);
    cr_assert(strstr(out, "per-key") != NULL, "%s", out);
}

#include <pthread.h>

static void *load_example(void *arg)
{
    const char *path = arg;
    for (int i = 0; i < 20; i++) {
        rl_config *cfg;
        rl_error err;
        if (rl_config_load(path, &cfg, &err) != RL_OK)
            return (void *)1;
        rl_config_free(cfg);
        if (rl_config_parse("rules: []\n", 10, "x", &cfg, &err) != RL_ECONFIG)
            return (void *)1;
    }
    return NULL;
}

Test(config, loads_from_many_threads_at_once)
{
    char path[512];
    test_path(path, sizeof path, "RL_TEST_EXAMPLES", "rules.example.yaml");
    pthread_t threads[8];
    for (int i = 0; i < 8; i++)
        cr_assert_eq(pthread_create(&threads[i], NULL, load_example, path), 0);
    for (int i = 0; i < 8; i++) {
        void *failed;
        pthread_join(threads[i], &failed);
        cr_assert_null(failed, "thread %d could not load the config", i);
    }
}

Test(config, a_password_comes_from_a_file_or_the_environment)
{
    char path[] = "/tmp/rl-password-XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    cr_assert_eq(write(fd, "s3cret from a file\n", 19), 19);
    close(fd);
    char yaml[512];
    snprintf(yaml, sizeof yaml, "store: {password_file: %s}\nrules:\n"
             "  - {name: r, match: ip, limit: 1, period: 1s}\n", path);
    rl_config *cfg = load_ok(yaml);
    cr_assert_str_eq(cfg->store.password, "s3cret from a file");
    rl_config_free(cfg);

    setenv("RL_TEST_SECRET", "s3cret from env", 1);
    cfg = load_ok("store: {username: rl, password_env: RL_TEST_SECRET}\n"
                  "rules:\n  - {name: r, match: ip, limit: 1, period: 1s}\n");
    cr_assert_str_eq(cfg->store.password, "s3cret from env");
    cr_assert_str_eq(cfg->store.username, "rl");
    rl_config_free(cfg);
    unsetenv("RL_TEST_SECRET");

    expect_refused("store: {password_env: RL_TEST_SECRET}\nrules:\n"
                   "  - {name: r, match: ip, limit: 1, period: 1s}\n",
                   "<test>:1:23: store.password_env: the environment "
                   "variable RL_TEST_SECRET is not set");
    snprintf(yaml, sizeof yaml, "store: {password: x, password_file: %s}\n"
             "rules:\n  - {name: r, match: ip, limit: 1, period: 1s}\n",
             path);
    expect_refused(yaml, "<test>:1:19: store.password: give one of "
                   "password, password_file and password_env");
    unlink(path);
    snprintf(yaml, sizeof yaml, "store: {password_file: %s}\nrules:\n"
             "  - {name: r, match: ip, limit: 1, period: 1s}\n", path);
    char message[256];
    snprintf(message, sizeof message, "<test>:1:24: store.password_file: "
             "cannot read '%s': No such file or directory", path);
    expect_refused(yaml, message);
}

Test(config, fixed_window_is_for_exact_and_local_rules_without_burst)
{
    rl_config *cfg = load_ok("rules:\n"
                             "  - {name: a, match: k, limit: 5, period: 1m, "
                             "algorithm: fixed_window}\n"
                             "  - {name: b, match: k, limit: 5, period: 1m, "
                             "algorithm: fixed_window, mode: local, key_prefix: x}\n");
    cr_assert_eq(cfg->rules[0].algorithm, RL_ALGO_FIXED_WINDOW);
    rl_config_free(cfg);
    expect_refused("rules:\n"
                   "  - {name: a, match: k, limit: 5, period: 1m, "
                   "algorithm: fixed_window, mode: synced}\n",
                   "<test>:2:58: rules[0].algorithm (rule \"a\"): fixed_window is "
                   "for mode: "
                   "exact or local; a synced rule counts with a token bucket "
                   "(leave algorithm out)");
    expect_refused("rules:\n"
                   "  - {name: a, match: k, limit: 5, period: 1m, burst: 9, "
                   "algorithm: fixed_window}\n",
                   "<test>:2:54: rules[0].burst (rule \"a\"): a fixed window "
                   "admits limit "
                   "per period and has no burst (a token bucket's): leave "
                   "burst out");
}
